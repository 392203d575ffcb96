//! Exactly-once promotion with real processes: concurrent promotions of one
//! upload, many uploads into one target at once, and promotions killed
//! (SIGKILL) at each step and run again. The kills use the failpoints
//! compiled into debug builds (`ICESTAGE_FAILPOINT`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{Warehouse, create_upload, run, scalar, shell_csv};

fn icestage(warehouse: &Warehouse, sql: &str) -> Command {
    let mut command = shell_csv("--warehouse", warehouse.path());
    command.args(["-c", sql]);
    command
}

fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start icestage")
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

async fn target_with_upload(warehouse: &Warehouse, rows: usize) -> String {
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA IF NOT EXISTS s").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE IF NOT EXISTS s.t (id BIGINT NOT NULL, upload VARCHAR NOT NULL)",
    )
    .await
    .unwrap();
    let upload = create_upload(&ctx, "s.t").await;
    let values: Vec<String> = (0..rows)
        .map(|i| format!("({i}, '{}')", upload.id))
        .collect();
    run(
        &ctx,
        &format!(
            "INSERT INTO {} VALUES {}",
            upload.staging_table,
            values.join(", ")
        ),
    )
    .await
    .unwrap();
    upload.id
}

/// Rows of upload `id` in the target, and target snapshots carrying its id.
async fn landed(warehouse: &Warehouse, id: &str) -> (String, String) {
    let ctx = warehouse.session().await;
    let rows = scalar(
        &ctx,
        &format!("SELECT count(*) FROM s.t WHERE upload = '{id}'"),
    )
    .await;
    let snapshots = scalar(
        &ctx,
        &format!("SELECT count(*) FROM s.t$snapshots WHERE summary['upload-id'] = '{id}'"),
    )
    .await;
    (rows, snapshots)
}

async fn staging_tables(warehouse: &Warehouse) -> String {
    let ctx = warehouse.session().await;
    scalar(
        &ctx,
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'staging'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_promoting_one_upload_commit_it_once() {
    let warehouse = Warehouse::new();
    let id = target_with_upload(&warehouse, 50).await;
    let sql = format!("SELECT state FROM promote_upload('{id}')");
    let children: Vec<Child> = (0..2).map(|_| spawn(icestage(&warehouse, &sql))).collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", text(&output));
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "state\npromoted\n",
            "{}",
            text(&output)
        );
    }
    assert_eq!(
        landed(&warehouse, &id).await,
        ("50".to_string(), "1".to_string())
    );
    assert_eq!(staging_tables(&warehouse).await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_uploads_promoted_at_once_into_one_target_all_land_once() {
    let warehouse = Warehouse::new();
    let mut ids = vec![];
    for i in 0..6 {
        ids.push(target_with_upload(&warehouse, 10 + i).await);
    }
    let children: Vec<Child> = ids
        .iter()
        .map(|id| spawn(icestage(&warehouse, &format!("PROMOTE UPLOAD '{id}'"))))
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", text(&output));
    }
    for (i, id) in ids.iter().enumerate() {
        let expected = (10 + i).to_string();
        assert_eq!(
            landed(&warehouse, id).await,
            (expected, "1".to_string()),
            "upload {i}"
        );
    }
    let ctx = warehouse.session().await;
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "75");
    assert_eq!(staging_tables(&warehouse).await, "0");
}

/// Starts a promotion that stops at `failpoint`, waits until it is there
/// (with a deadline) and kills it with SIGKILL.
fn kill_at(warehouse: &Warehouse, id: &str, failpoint: &str) {
    let mut command = icestage(warehouse, &format!("PROMOTE UPLOAD '{id}'"));
    command.env("ICESTAGE_FAILPOINT", failpoint);
    let mut child = spawn(command);
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let expected = format!("failpoint {failpoint} reached");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == expected => break,
            Ok(_) => continue,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the promotion never reached {failpoint}: {:?}",
                    child.wait()
                );
            }
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_killed_at_any_step_lands_once_when_run_again() {
    for failpoint in [
        "promote.after-validation",
        "promote.after-commit",
        "promote.before-drop",
    ] {
        let warehouse = Warehouse::new();
        let id = target_with_upload(&warehouse, 20).await;
        kill_at(&warehouse, &id, failpoint);
        let (rows, _) = landed(&warehouse, &id).await;
        let committed = failpoint != "promote.after-validation";
        assert_eq!(
            rows,
            if committed { "20" } else { "0" },
            "{failpoint}: rows after the kill"
        );

        let again = icestage(
            &warehouse,
            &format!("SELECT state, rows FROM promote_upload('{id}')"),
        )
        .output()
        .unwrap();
        assert!(again.status.success(), "{failpoint}: {}", text(&again));
        assert_eq!(
            String::from_utf8_lossy(&again.stdout),
            "state,rows\npromoted,20\n",
            "{failpoint}"
        );
        assert_eq!(
            landed(&warehouse, &id).await,
            ("20".to_string(), "1".to_string()),
            "{failpoint}: exactly once"
        );
        assert_eq!(
            staging_tables(&warehouse).await,
            "0",
            "{failpoint}: staging left behind"
        );
        let ctx = warehouse.session().await;
        let state = scalar(&ctx, &format!("SELECT state FROM upload_status('{id}')")).await;
        assert_eq!(state, "promoted", "{failpoint}");
    }
}
