//! Replays every input the fuzz harness ever found (`fuzz/regressions/
//! <target>/`) and the seeds (`fuzz/corpus/<target>/`) through the same
//! entry points: none may panic. A regression is refused (an `Err`), a seed
//! accepted.

use crate::common::repo;

fn inputs(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = repo().join("fuzz").join(kind).join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .map(|f| (f.display().to_string(), std::fs::read(&f).unwrap()))
        .collect()
}

#[test]
fn fuzz_findings_stay_fixed_and_seeds_parse() {
    let mut replayed = 0;
    for (target, run) in icestage::fuzz::TARGETS {
        for (file, bytes) in inputs("regressions", target) {
            let answer = std::panic::catch_unwind(|| run(&bytes));
            assert!(
                matches!(answer, Ok(Err(_))),
                "{target}: {file} panicked or was accepted: {answer:?}"
            );
            replayed += 1;
        }
        let seeds = inputs("corpus", target);
        assert!(!seeds.is_empty(), "{target} has no seed under fuzz/corpus");
        for (file, bytes) in seeds {
            assert_eq!(run(&bytes), Ok(()), "{target}: seed {file} is refused");
        }
    }
    assert!(
        replayed >= 3,
        "the known findings are missing from fuzz/regressions"
    );
}
