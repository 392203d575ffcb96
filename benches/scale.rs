//! Per-upload cost as uploads accumulate (`./scripts/bench-scale.sh`): one
//! target on the embedded catalog; each upload is opened, gets 2 rows,
//! is promoted, and its status read, in rounds of 100. Prints each round's
//! time per upload (and each step's share), the warehouse's size and files,
//! and the ratio of the last round to the second.
//!
//! `--uploads N` (default 1,000; a multiple of 100). `--maintain` also runs,
//! after each round (untimed in ms/upload, shown apart), what a user's
//! maintenance job would: `EXPIRE SNAPSHOTS` (keeping 10) and
//! `REWRITE MANIFESTS` on the target. `--rewrite` ends with `REWRITE DATA
//! FILES` on the target and times a full scan of it before and after (the
//! median of five each, in the same run), with its data files counted.

mod support;

use std::time::{Duration, Instant};

use datafusion::prelude::SessionContext;
use icestage::{IcestageConfig, Operations, PromoteOptions, UploadOptions, UploadState};
use support::run;

const ROUND: usize = 100;

/// Bytes and files under `dir`.
fn size(dir: &std::path::Path) -> (u64, u64) {
    let mut total = (0, 0);
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        if meta.is_dir() {
            let (bytes, files) = size(&entry.path());
            total = (total.0 + bytes, total.1 + files);
        } else {
            total = (total.0 + meta.len(), total.1 + 1);
        }
    }
    total
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let uploads: usize = args
        .iter()
        .position(|a| a == "--uploads")
        .and_then(|i| args.get(i + 1))
        .map_or(1000, |n| n.parse().expect("--uploads N"));
    let maintain = args.iter().any(|a| a == "--maintain");
    let rewrite = args.iter().any(|a| a == "--rewrite");
    assert!(
        uploads >= 2 * ROUND && uploads.is_multiple_of(ROUND),
        "--uploads: a multiple of {ROUND}, at least {}",
        2 * ROUND
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let warehouse = tempfile::tempdir().unwrap();
        let ctx = SessionContext::new();
        icestage::register(&ctx, IcestageConfig::embedded(warehouse.path()).unwrap())
            .await
            .unwrap();
        let ops = Operations::new(&ctx).unwrap();
        run(&ctx, "CREATE SCHEMA shop").await;
        run(
            &ctx,
            "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)",
        )
        .await;
        println!(
            "{uploads} uploads into one target, embedded catalog{}; per round of {ROUND}:",
            if maintain { ", target maintained after each round" } else { "" }
        );
        println!(
            "{:>6} {:>10} {:>8} {:>8} {:>8} {:>8} {:>11} {:>8} {:>12}",
            "round",
            "ms/upload",
            "create",
            "insert",
            "promote",
            "status",
            "warehouse",
            "files",
            "bytes/upload",
        );
        println!(
            "  (then: maintenance ms; ms to list every upload, every tenth round; ms to list the \
             open ones and those ended since the round began, what the webhook dispatcher reads \
             per round)"
        );
        let mut per_round = vec![];
        let mut last_size = 0u64;
        for round in 0..uploads / ROUND {
            let mut steps = [Duration::ZERO; 4];
            let started = Instant::now();
            let round_began = chrono::Utc::now();
            for n in 0..ROUND {
                let id = (round * ROUND + n) as i64;
                let t = Instant::now();
                let upload = ops
                    .create_upload("shop.orders", UploadOptions::default())
                    .await
                    .unwrap();
                steps[0] += t.elapsed();
                let t = Instant::now();
                run(
                    &ctx,
                    &format!(
                        "INSERT INTO {} VALUES ({}, 100), ({}, 200)",
                        upload.staging_table,
                        2 * id,
                        2 * id + 1
                    ),
                )
                .await;
                steps[1] += t.elapsed();
                let t = Instant::now();
                let promoted = ops
                    .promote_upload(&upload.upload_id, PromoteOptions::default())
                    .await
                    .unwrap();
                assert_eq!(promoted.state, UploadState::Promoted);
                steps[2] += t.elapsed();
                let t = Instant::now();
                let status = ops.upload_status(&upload.upload_id).await.unwrap();
                assert_eq!(status.state, UploadState::Promoted);
                steps[3] += t.elapsed();
            }
            let ms = started.elapsed().as_secs_f64() * 1000.0 / ROUND as f64;
            per_round.push(ms);
            let maintained = Instant::now();
            if maintain {
                run(
                    &ctx,
                    "EXPIRE SNAPSHOTS shop.orders WITH (older_than = '1ms', retain_last = 10)",
                )
                .await;
                run(&ctx, "REWRITE MANIFESTS shop.orders").await;
            }
            let maintenance_ms = maintained.elapsed().as_secs_f64() * 1000.0;
            // Listing every upload reads the whole log (what it asks for):
            // every tenth round, and the last.
            let all_ms = if round % 10 == 9 || round + 1 == uploads / ROUND {
                let listed = Instant::now();
                let every = ops.uploads().await.unwrap();
                assert_eq!(every.len(), (round + 1) * ROUND);
                format!("{:.0}", listed.elapsed().as_secs_f64() * 1000.0)
            } else {
                "-".to_string()
            };
            let listed = Instant::now();
            let changed = ops.uploads_since(round_began).await.unwrap();
            let since_ms = listed.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(changed.len(), ROUND);
            let (bytes, files) = size(warehouse.path());
            let per = |d: Duration| d.as_secs_f64() * 1000.0 / ROUND as f64;
            println!(
                "{:>6} {ms:>10.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9.1}MB {files:>8} {:>12} {maintenance_ms:>9.0} {all_ms:>8} {since_ms:>8.0}",
                round + 1,
                per(steps[0]),
                per(steps[1]),
                per(steps[2]),
                per(steps[3]),
                bytes as f64 / 1e6,
                (bytes as i64 - last_size as i64) / ROUND as i64,
            );
            last_size = bytes;
        }
        println!(
            "last round / second round: {:.2}",
            per_round[per_round.len() - 1] / per_round[1]
        );
        if rewrite {
            rewrite_and_scan(&ctx, &ops, uploads).await;
        }
    });
}

/// The median of five timed full scans of the target, in ms.
async fn scan_ms(ctx: &SessionContext, uploads: usize) -> f64 {
    let mut times = vec![];
    for _ in 0..5 {
        let t = Instant::now();
        let batches = ctx
            .sql("SELECT count(*), sum(id + cents) FROM shop.orders")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        let rows = datafusion::arrow::util::display::array_value_to_string(batches[0].column(0), 0)
            .unwrap();
        assert_eq!(rows, (2 * uploads).to_string());
    }
    times.sort_by(f64::total_cmp);
    times[2]
}

/// `REWRITE DATA FILES` on the target, with a full scan timed before and
/// after.
async fn rewrite_and_scan(ctx: &SessionContext, ops: &Operations, uploads: usize) {
    let before = scan_ms(ctx, uploads).await;
    let t = Instant::now();
    let packed = ops
        .rewrite_data_files("shop.orders", icestage::RewriteDataOptions::default())
        .await
        .unwrap();
    let rewrite_s = t.elapsed().as_secs_f64();
    let after = scan_ms(ctx, uploads).await;
    println!(
        "REWRITE DATA FILES: {} data files -> {} in {rewrite_s:.1} s; full scan (median of 5) \
         {before:.0} ms -> {after:.0} ms: {:.1}x faster",
        packed.data_files_before,
        packed.data_files_after,
        before / after
    );
}
