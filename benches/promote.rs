//! Criterion benchmark of `PROMOTE UPLOAD` on the embedded catalog: the
//! zero-copy path, whose cost follows the number of staged files, not rows.
//! Each iteration promotes a fresh upload of the same rows (set up untimed).
//!
//! The comparison with the reference PyIceberg flow at 1M-10M rows is
//! `benches/compare_promote.py` (see the README).
#![expect(
    missing_docs,
    reason = "criterion_group! declares an undocumented pub fn"
)]

mod support;

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use datafusion::prelude::SessionContext;
use icestage::IcestageConfig;
use support::run;

fn text(batches: &[datafusion::arrow::array::RecordBatch], column: &str) -> String {
    let batch = &batches[0];
    let index = batch.schema().index_of(column).unwrap();
    datafusion::arrow::util::display::array_value_to_string(batch.column(index), 0).unwrap()
}

/// A new upload with `rows` rows in its staging table; its id.
async fn staged_upload(ctx: &SessionContext, rows: u64) -> String {
    let upload = run(ctx, "CREATE UPLOAD FOR payments.transactions").await;
    let staging = text(&upload, "staging_table");
    run(
        ctx,
        &format!(
            "INSERT INTO {staging} SELECT 'txn_' || value, 'acct_' || (value % 1000), \
             value, 'usd', to_timestamp_seconds(1782864000 + value) \
             FROM generate_series(1, {rows})"
        ),
    )
    .await;
    text(&upload, "upload_id")
}

fn promote(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ctx = runtime.block_on(async {
        let ctx = SessionContext::new();
        icestage::register(&ctx, IcestageConfig::embedded(dir.path()).unwrap())
            .await
            .unwrap();
        run(&ctx, "CREATE SCHEMA payments").await;
        run(
            &ctx,
            "CREATE TABLE payments.transactions (transaction_id VARCHAR NOT NULL, \
             account_id VARCHAR NOT NULL, amount_cents BIGINT NOT NULL, \
             currency VARCHAR NOT NULL, created_at TIMESTAMP WITH TIME ZONE NOT NULL)",
        )
        .await;
        ctx
    });
    let mut group = c.benchmark_group("promote_upload");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for rows in [10_000u64, 200_000] {
        group.bench_with_input(BenchmarkId::from_parameter(rows), &rows, |b, &rows| {
            // Setting up an upload is not timed: each iteration times one
            // PROMOTE UPLOAD only.
            b.iter_custom(|iterations| {
                let mut promoting = Duration::ZERO;
                for _ in 0..iterations {
                    let id = runtime.block_on(staged_upload(&ctx, rows));
                    let start = Instant::now();
                    let result = runtime.block_on(run(&ctx, &format!("PROMOTE UPLOAD '{id}'")));
                    promoting += start.elapsed();
                    assert_eq!(text(&result, "path"), "zero_copy");
                }
                promoting
            });
        });
    }
    group.finish();
}

criterion_group!(benches, promote);
criterion_main!(benches);
