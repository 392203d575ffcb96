//! A mutation fuzzer for the parsers of client bytes (`icestage::fuzz`),
//! on stable Rust: it starts from the seeds in `fuzz/corpus/<target>/`,
//! mutates them (bit flips, boundary bytes, truncation, deleted and
//! repeated ranges, inserted Avro lengths, splices of two seeds), keeps
//! every input that a target accepted as a new seed, and runs each input
//! under `catch_unwind`. A panic is a finding: the input is written to
//! `fuzz/findings/<target>/<hash>.bin` and the run exits 1 at the end.
//! A finding, once fixed, moves to `fuzz/regressions/<target>/`, which the
//! test suite replays (`tests/it/fuzz.rs`).
//!
//! Not coverage-guided: it finds what random mutation of real files finds.
//!
//! ```text
//! cargo run --example fuzz -- <target|all> <seconds> [seed]
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use icestage::fuzz::{TARGETS, Target};

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// An Avro zig-zag varint of `value`.
fn varint(value: i64) -> Vec<u8> {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    let mut out = vec![];
    loop {
        let byte = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(8) {
            0 if len > 0 => {
                let at = rng.below(len);
                data[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                data[at] = [0u8, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 if len > 0 => {
                let at = rng.below(len);
                data[at] = rng.next() as u8;
            }
            3 if len > 0 => data.truncate(rng.below(len)),
            4 if len > 1 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(64)).min(len);
                data.drain(start..end);
            }
            5 if len > 1 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(64)).min(len);
                let copy = data[start..end].to_vec();
                let at = rng.below(len);
                data.splice(at..at, copy);
            }
            6 => {
                let lengths = [-1i64, 0, 1, 127, 1 << 20, i64::from(i32::MAX), i64::MAX];
                let at = rng.below(len + 1);
                data.splice(at..at, varint(lengths[rng.below(lengths.len())]));
            }
            7 if !pool.is_empty() => {
                let other = &pool[rng.below(pool.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
}

fn seeds(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|f| std::fs::read(f).ok()).collect()
}

fn hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(bytes)[..8])
}

/// Runs `target` for `budget`; the number of findings.
fn run(root: &Path, name: &str, target: Target, budget: Duration, seed: u64) -> usize {
    let mut pool = seeds(&root.join("corpus").join(name));
    if pool.is_empty() {
        pool.push(vec![]);
    }
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    let (mut runs, mut accepted, mut findings) = (0u64, 0u64, 0usize);
    while started.elapsed() < budget {
        let mut input = pool[rng.below(pool.len())].clone();
        mutate(&mut rng, &mut input, &pool);
        runs += 1;
        match std::panic::catch_unwind(|| target(&input)) {
            Ok(Ok(())) => {
                accepted += 1;
                // Accepted inputs are kept: they reach deeper next time.
                if pool.len() < 4096 {
                    pool.push(input);
                }
            }
            Ok(Err(_)) => {}
            Err(panic) => {
                findings += 1;
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let dir = root.join("findings").join(name);
                let _ = std::fs::create_dir_all(&dir);
                let file = dir.join(format!("{}.bin", hash(&input)));
                let _ = std::fs::write(&file, &input);
                eprintln!(
                    "{name}: PANIC ({message}); input saved to {}",
                    file.display()
                );
            }
        }
    }
    println!(
        "{name}: {runs} inputs in {:.0?} ({accepted} accepted, {findings} panicked), seed {seed}",
        started.elapsed()
    );
    findings
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: fuzz <target|all> <seconds> [seed]; targets: ";
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    let (Some(which), Some(seconds)) = (args.first(), args.get(1).and_then(|s| s.parse().ok()))
    else {
        eprintln!("{usage}{}", names.join(", "));
        std::process::exit(2);
    };
    let seed = args.get(2).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let chosen: Vec<_> = TARGETS
        .iter()
        .filter(|(n, _)| which == "all" || which == n)
        .collect();
    if chosen.is_empty() {
        eprintln!("no target '{which}'; {usage}{}", names.join(", "));
        std::process::exit(2);
    }
    // Panics are counted and saved, not printed one by one.
    std::panic::set_hook(Box::new(|_| {}));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let findings: usize = chosen
        .iter()
        .map(|(name, target)| run(&root, name, *target, Duration::from_secs(seconds), seed))
        .sum();
    if findings > 0 {
        eprintln!("{findings} finding(s): see fuzz/findings/");
        std::process::exit(1);
    }
}
