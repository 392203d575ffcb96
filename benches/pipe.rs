//! Pipes against `COPY INTO` on the same files (`./scripts/bench-pipe.sh`):
//! 1,000 small CSV files (10 rows each) on a local folder, the embedded
//! catalog, release build.
//!
//! * `COPY INTO`: one statement over the 1,000 files already written (the
//!   baseline).
//! * pipe, burst: the 1,000 files written at once, then one `RUN PIPE`
//!   (what a runner's round does: lease, listing, the copy, the record).
//! * pipe, trickle: the runner running, files written at a steady rate;
//!   per file, the time from its write to its rows being visible (the lag).
//!
//! Visibility is read from the target's current snapshot (`total-records`):
//! files are written in key order, so a run that sees one sees all before
//! it. Everything runs in this one process on the machine's cores.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::prelude::SessionContext;
use iceberg::TableIdent;
use icestage::{IcestageConfig, Operations};
use support::run;

const FILES: usize = 1000;
const ROWS_PER_FILE: usize = 10;

fn write_file(dir: &std::path::Path, n: usize) {
    let mut text = String::from("file_no,id,name\n");
    for row in 0..ROWS_PER_FILE {
        let id = n * ROWS_PER_FILE + row;
        text.push_str(&format!("{n},{id},name-{id}\n"));
    }
    std::fs::write(dir.join(format!("{n:05}.csv")), text).unwrap();
}

/// Rows of `table` in its current snapshot (0 before the first).
async fn visible_rows(catalog: &Arc<dyn iceberg::Catalog>, table: &str) -> usize {
    let ident = TableIdent::from_strs(table.split('.')).unwrap();
    let Ok(table) = catalog.load_table(&ident).await else {
        return 0;
    };
    table
        .metadata()
        .current_snapshot()
        .and_then(|s| {
            s.summary()
                .additional_properties
                .get("total-records")
                .cloned()
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The loop of `icestage serve`'s pipe runner: every second, the due pipes.
fn start_runner(ops: Operations) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for (name, run) in ops.run_due_pipes().await.unwrap() {
                if let Err(e) = run {
                    panic!("pipe {name}: {e}");
                }
            }
        }
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let warehouse = tempfile::tempdir().unwrap();
        let ctx = SessionContext::new();
        let icestage = icestage::register(&ctx, IcestageConfig::embedded(warehouse.path()).unwrap())
            .await
            .unwrap();
        let catalog = Arc::clone(icestage.default_catalog().catalog());
        let ops = Operations::new(&ctx).unwrap();
        run(&ctx, "CREATE SCHEMA bench").await;
        let folders: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let uri = |n: usize| format!("file://{}/", folders[n].path().display());
        let expected = FILES * ROWS_PER_FILE;

        // COPY INTO, the baseline.
        for n in 0..FILES {
            write_file(folders[0].path(), n);
        }
        let started = Instant::now();
        run(
            &ctx,
            &format!("COPY INTO bench.copied FROM '{}' WITH (all_files = true)", uri(0)),
        )
        .await;
        let copy_secs = started.elapsed().as_secs_f64();
        assert_eq!(visible_rows(&catalog, "bench.copied").await, expected);

        // Pipe, burst.
        for n in 0..FILES {
            write_file(folders[1].path(), n);
        }
        run(
            &ctx,
            &format!(
                "CREATE PIPE burst WITH (interval = '1s') AS COPY INTO bench.burst FROM '{}' \
                 WITH (format = 'csv')",
                uri(1)
            ),
        )
        .await;
        let started = Instant::now();
        run(&ctx, "RUN PIPE burst").await;
        let burst_secs = started.elapsed().as_secs_f64();
        assert_eq!(visible_rows(&catalog, "bench.burst").await, expected);
        run(&ctx, "ALTER PIPE burst PAUSE").await;

        // Pipe, trickle: 100 files a second.
        run(
            &ctx,
            &format!(
                "CREATE PIPE trickle WITH (interval = '1s') AS COPY INTO bench.trickle FROM '{}' \
                 WITH (format = 'csv')",
                uri(2)
            ),
        )
        .await;
        let runner = start_runner(ops.clone());
        let dir = folders[2].path().to_path_buf();
        let writer = tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let mut written = Vec::with_capacity(FILES);
            for n in 0..FILES {
                let due = Duration::from_millis(10 * n as u64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                write_file(&dir, n);
                written.push(Instant::now());
            }
            written
        });
        let mut visible_at = vec![None; FILES];
        let trickle_start = Instant::now();
        loop {
            let rows = visible_rows(&catalog, "bench.trickle").await;
            let now = Instant::now();
            for slot in visible_at.iter_mut().take(rows / ROWS_PER_FILE) {
                slot.get_or_insert(now);
            }
            if rows >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let trickle_secs = trickle_start.elapsed().as_secs_f64();
        runner.abort();
        let written = writer.await.unwrap();
        let mut lags: Vec<f64> = written
            .iter()
            .zip(&visible_at)
            .map(|(w, v)| v.unwrap().duration_since(*w).as_secs_f64())
            .collect();
        lags.sort_by(f64::total_cmp);

        println!("{FILES} CSV files x {ROWS_PER_FILE} rows, embedded catalog, local folder");
        println!(
            "COPY INTO (baseline)     {copy_secs:6.2} s   {:7.1} files/s",
            FILES as f64 / copy_secs
        );
        println!(
            "pipe, one RUN PIPE       {burst_secs:6.2} s   {:7.1} files/s   ratio to COPY INTO {:.2}",
            FILES as f64 / burst_secs,
            burst_secs / copy_secs
        );
        println!(
            "pipe, trickle 100 files/s, interval 1s: all visible after {trickle_secs:.2} s; \
             lag p50 {:.2} s, p90 {:.2} s, max {:.2} s",
            percentile(&lags, 0.5),
            percentile(&lags, 0.9),
            lags[lags.len() - 1]
        );
    });
}
