//! Downloads with real parts: a filler killed mid-way, PyIceberg reading a
//! ready download, and the example script.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{
    Warehouse, files_under, python_script, repo, run, scalar, shell_csv, stdout_of_success, value,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_abandoned_by_a_killed_process_is_marked_failed() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(&ctx, "CREATE TABLE s.t (id BIGINT NOT NULL)")
        .await
        .unwrap();
    run(&ctx, "INSERT INTO s.t VALUES (1), (2)").await.unwrap();

    // A process that starts a download and stops while filling it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_icestage"))
        .args([
            "--warehouse",
            warehouse.path().to_str().unwrap(),
            "-q",
            "-c",
        ])
        .arg(
            "CREATE DOWNLOAD WITH (lease = '2s') AS SELECT id FROM s.t \\gset\n\\echo :download_id",
        )
        .env("ICESTAGE_FAILPOINT", "download.fill")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let (mut id, mut stopped) = (None, false);
    let deadline = Instant::now() + Duration::from_secs(60);
    while id.is_none() || !stopped {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the filler starts and stops at its failpoint");
        if line == "failpoint download.fill reached" {
            stopped = true;
        } else if line.len() == 32 {
            id = Some(line);
        }
    }
    let id = id.unwrap();
    let status = format!("SELECT state FROM download_status('{id}')");

    // While the process lives its heartbeat keeps the download pending,
    // longer than the lease.
    let watch = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch {
        assert_eq!(scalar(&ctx, &status).await, "pending");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let other = warehouse.session().await;
        let state = scalar(&other, &status).await;
        if state == "failed" {
            let message = scalar(
                &other,
                &format!("SELECT message FROM download_status('{id}')"),
            )
            .await;
            assert!(
                message.starts_with("the process filling this download stopped"),
                "{message}"
            );
            break;
        }
        assert_eq!(state, "pending");
        assert!(
            Instant::now() < deadline,
            "the abandoned download was never marked failed"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_reads_a_ready_download() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(&ctx, "CREATE TABLE s.t (id BIGINT NOT NULL, name VARCHAR)")
        .await
        .unwrap();
    run(&ctx, "INSERT INTO s.t VALUES (1, 'a'), (2, 'b'), (3, NULL)")
        .await
        .unwrap();
    let created = run(
        &ctx,
        "CREATE DOWNLOAD WITH (wait = true) AS SELECT id, name FROM s.t WHERE id > 1",
    )
    .await
    .unwrap();
    assert_eq!(value(&created, "state"), "ready");
    let id = value(&created, "download_id");
    let vended = run(&ctx, &format!("SELECT * FROM vend_credentials('{id}')"))
        .await
        .unwrap();
    let read = python_script(
        "pyiceberg_client.py",
        &[
            "read-table",
            &value(&vended, "connection"),
            &value(&created, "download_table"),
        ],
    );
    assert!(read.contains("\"rows\": 2"), "{read}");
    assert!(read.contains("\"columns\": [\"id\", \"name\"]"), "{read}");
    assert!(read.contains("{\"id\": 3, \"name\": null}"), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_reads_only_the_files_its_filter_can_match() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE s.p (id BIGINT NOT NULL, region VARCHAR) PARTITIONED BY (region)",
    )
    .await
    .unwrap();
    run(
        &ctx,
        "INSERT INTO s.p VALUES (1, 'eu'), (2, 'eu'), (3, 'us')",
    )
    .await
    .unwrap();
    run(&ctx, "INSERT INTO s.p VALUES (40, 'us'), (50, 'us')")
        .await
        .unwrap();
    // The files a filter rules out are never opened: gone from storage,
    // a download that needs none of them is unaffected.
    let eu: Vec<_> = files_under(warehouse.path())
        .into_iter()
        .filter(|p| {
            p.to_string_lossy().contains("region=eu")
                && p.extension().is_some_and(|e| e == "parquet")
        })
        .collect();
    assert!(!eu.is_empty());
    for file in &eu {
        std::fs::remove_file(file).unwrap();
    }
    let created = run(
        &ctx,
        "CREATE DOWNLOAD WITH (wait = true) AS SELECT id FROM s.p WHERE region = 'us' AND id > 3",
    )
    .await
    .unwrap();
    assert_eq!(value(&created, "state"), "ready");
    let table = value(&created, "download_table");
    assert_eq!(
        scalar(
            &ctx,
            &format!("SELECT string_agg(CAST(id AS VARCHAR), ',' ORDER BY id) FROM {table}")
        )
        .await,
        "40,50"
    );
    // A filter that needs them fails, naming what it could not read.
    let failed = run(
        &ctx,
        "CREATE DOWNLOAD WITH (wait = true) AS SELECT id FROM s.p WHERE id < 3",
    )
    .await;
    let failed = match failed {
        Ok(batches) => value(&batches, "state"),
        Err(e) => e.to_string(),
    };
    assert_ne!(failed, "ready");
}

#[test]
fn the_download_example_runs_on_the_embedded_default() {
    let warehouse = Warehouse::new();
    let shell = |file: &str| {
        shell_csv("--warehouse", warehouse.path())
            .current_dir(repo())
            .args(["-f", file])
            .output()
            .unwrap()
    };
    assert!(shell("sql/examples/upload_flow.sql").status.success());
    let stdout = stdout_of_success(&shell("sql/examples/download_flow.sql"));
    assert!(stdout.contains("state,rows,files\nready,2,"), "{stdout}");
    assert!(
        stdout.contains("mode,table_name\nread,downloads.download_"),
        "{stdout}"
    );
    assert!(
        stdout.contains("txn_001,acct_123,1299,2026-07-01T12:00:00Z\ntxn_002,acct_456,4200,"),
        "{stdout}"
    );
}
