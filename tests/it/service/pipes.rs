//! `icestage serve` running pipes: files that arrive while it runs land
//! once, through SIGKILLs before and after the commit and with two
//! replicas; S3 event notifications from moto's SQS; `pipe.loaded` and
//! `pipe.failed` webhooks.

use super::webhooks::receiver;
use super::*;
use crate::pipes::{csv, folder_uri};

async fn count(ctx: &datafusion::prelude::SessionContext, table: &str) -> (i64, i64) {
    let sql = format!("SELECT count(*), count(DISTINCT id) FROM {table}");
    let batches = match run(ctx, &sql).await {
        Ok(batches) => batches,
        // Not created yet.
        Err(_) => return (0, 0),
    };
    let at = |column: usize| {
        datafusion::arrow::util::display::array_value_to_string(batches[0].column(column), 0)
            .unwrap()
            .parse()
            .unwrap()
    };
    (at(0), at(1))
}

/// Waits up to a minute for `table` to hold `rows` rows.
async fn wait_rows(ctx: &datafusion::prelude::SessionContext, table: &str, rows: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = count(ctx, table).await;
        if now.0 >= rows {
            assert_eq!(now, (rows, rows), "{table}: rows and distinct ids");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{table} holds {now:?}, not {rows} rows"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_arriving_while_serve_runs_land_once_through_kills_and_two_replicas() {
    let landing = tempfile::tempdir().unwrap();
    let dir = landing.path();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(
        &ctx,
        &format!(
            "CREATE PIPE events WITH (interval = '1s', lease = '3s') AS COPY INTO raw.events FROM '{}' \
             WITH (format = 'csv')",
            folder_uri(dir)
        ),
    )
    .await
    .unwrap();
    let (hook, received) = receiver(0).await;
    let config = write_config(
        &warehouse,
        &format!("[service.webhook]\nurl = \"{hook}\"\nsecret = \"whsec\"\ninterval = \"300ms\"\n"),
    );
    std::fs::write(dir.join("000.csv"), csv(0, 3)).unwrap();

    // Killed after its copy log entry, before the commit: nothing landed.
    let first = Service::start_with(&config, &[("ICESTAGE_FAILPOINT", "copy.before-commit")]);
    assert!(first.reached_failpoint("copy.before-commit"));
    first.kill();
    assert_eq!(count(&ctx, "raw.events").await, (0, 0));
    // The next runner takes over once the lease ran out, and is killed
    // after its commit, before it recorded anything.
    let second = Service::start_with(&config, &[("ICESTAGE_FAILPOINT", "copy.after-commit")]);
    assert!(second.reached_failpoint("copy.after-commit"));
    second.kill();
    assert_eq!(count(&ctx, "raw.events").await, (3, 3));

    // Two replicas from here on, and files arriving while they run.
    let replicas = [Service::start(&config), Service::start(&config)];
    for n in 1..=10 {
        std::fs::write(dir.join(format!("{n:03}.csv")), csv(n * 3, 3)).unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    std::fs::write(dir.join("bad.csv"), "not,the,columns\n1,2,3\n").unwrap();
    wait_rows(&ctx, "raw.events", 33).await;
    // Several more intervals: nothing lands twice.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(count(&ctx, "raw.events").await, (33, 33));
    let status = run(&ctx, "SELECT * FROM pipe_status('events')")
        .await
        .unwrap();
    assert_eq!(crate::common::value(&status, "pending_files"), "0");
    assert_eq!(crate::common::value(&status, "files_failed"), "1");
    assert!(crate::common::value(&status, "failures").contains("bad.csv"));
    assert_eq!(crate::common::value(&status, "last_error"), "");
    // Both replicas ran the pipe at some point, or one did it all: either
    // way they printed what they loaded.
    let loaded_lines: usize = replicas
        .iter()
        .map(|r| {
            r.stderr
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("pipe events: loaded"))
                .count()
        })
        .sum();
    assert!(loaded_lines >= 1);

    // The webhooks: loads and the failure, signed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kinds: Vec<String> = received
            .lock()
            .unwrap()
            .acknowledged
            .iter()
            .map(|(_, body)| serde_json::from_str::<Value>(body).unwrap()["type"].to_string())
            .collect();
        if kinds.iter().any(|k| k.contains("pipe.loaded"))
            && kinds.iter().any(|k| k.contains("pipe.failed"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "webhooks seen: {kinds:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delivered = received.lock().unwrap().acknowledged.clone();
    let (_, failed) = delivered
        .iter()
        .find(|(_, body)| body.contains("pipe.failed"))
        .unwrap();
    let failed: Value = serde_json::from_str(failed).unwrap();
    assert_eq!(failed["data"]["pipe"], "events", "{failed}");
    assert_eq!(failed["data"]["files_failed"], 1, "{failed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_finds_new_files_from_s3_event_notifications() {
    let moto = Moto::start();
    let queue = python_script(
        "ingest_fixtures.py",
        &["notify", &moto.endpoint, "landing", "landing-events"],
    )
    .trim()
    .to_string();
    let put = |key: &str, text: &str| {
        python_script(
            "ingest_fixtures.py",
            &["put", &moto.endpoint, "landing", key, text],
        );
    };
    put("in/000.csv", &csv(0, 3));
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    // Listing only once an hour: after the first run, new files are found
    // from the notifications alone.
    run(
        &ctx,
        &format!(
            "CREATE PIPE s3events WITH (interval = '1s', notification_queue = '{queue}', list_interval = '1h') \
             AS COPY INTO raw.s3events FROM 's3://landing/in/' \
             WITH (format = 'csv', endpoint = '{}', region = 'us-east-1')",
            moto.endpoint
        ),
    )
    .await
    .unwrap();
    let config = write_config(&warehouse, "");
    let _service = Service::start_with(
        &config,
        &[
            ("AWS_ACCESS_KEY_ID", "AKIASERVICEIDENTITY"),
            ("AWS_SECRET_ACCESS_KEY", "service-secret-never-printed"),
            ("AWS_REGION", "us-east-1"),
        ],
    );
    wait_rows(&ctx, "raw.s3events", 3).await;
    for n in 1..=4 {
        put(&format!("in/{n:03}.csv"), &csv(n * 3, 3));
    }
    // Outside the prefix: announced, not loaded.
    put("elsewhere/x.csv", &csv(100, 3));
    wait_rows(&ctx, "raw.s3events", 15).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(count(&ctx, "raw.s3events").await, (15, 15));
    // Every notification was consumed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let depth = python_script(
            "ingest_fixtures.py",
            &["queue-depth", &moto.endpoint, &queue],
        );
        if depth.trim() == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "{depth} messages left");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let discovery = scalar(&ctx, "SELECT discovery FROM pipes()").await;
    assert!(discovery.starts_with("notifications from"), "{discovery}");
}
