//! Pipes, as statements on the embedded catalog over local folders:
//! `CREATE PIPE`, `RUN PIPE`, `ALTER PIPE`, `DROP PIPE`, `pipes()`,
//! `pipe_status()`; exactly once per file when copies race. The service
//! running pipes (and S3 notifications) is in `service::pipes`.

use std::path::Path;

use datafusion::prelude::SessionContext;

use crate::common::{Warehouse, run, scalar, value};

/// `<n>` CSV rows with ids `first..first + n`.
pub fn csv(first: i64, n: i64) -> String {
    let mut text = "id,name\n".to_string();
    for id in first..first + n {
        text.push_str(&format!("{id},name-{id}\n"));
    }
    text
}

pub fn folder_uri(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

async fn error(ctx: &SessionContext, sql: &str) -> String {
    run(ctx, sql).await.expect_err(sql).user_message()
}

/// The named columns of `RUN PIPE <name>`'s row.
async fn run_pipe(ctx: &SessionContext, name: &str) -> (String, String, String, String) {
    let batches = run(ctx, &format!("RUN PIPE {name}")).await.unwrap();
    (
        value(&batches, "files_loaded"),
        value(&batches, "files_skipped"),
        value(&batches, "files_failed"),
        value(&batches, "rows"),
    )
}

async fn status(ctx: &SessionContext, name: &str, column: &str) -> String {
    scalar(ctx, &format!("SELECT {column} FROM pipe_status('{name}')")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_loads_each_file_once_and_a_bad_file_does_not_stop_the_others() {
    let landing = tempfile::tempdir().unwrap();
    let dir = landing.path();
    std::fs::write(dir.join("a.csv"), csv(1, 3)).unwrap();
    std::fs::write(dir.join("b.csv"), csv(4, 3)).unwrap();
    std::fs::write(dir.join("_SUCCESS"), "").unwrap();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let created = run(
        &ctx,
        &format!(
            "CREATE PIPE events WITH (interval = '5s') AS COPY INTO raw.events FROM '{}'",
            folder_uri(dir)
        ),
    )
    .await
    .unwrap();
    // The format was read from the names, and the two files wait.
    assert_eq!(value(&created, "state"), "running");
    assert_eq!(value(&created, "pending_files"), "2");
    assert_eq!(value(&created, "interval"), "5s");

    // The first run creates the table and loads both; the second finds
    // nothing new.
    assert_eq!(
        run_pipe(&ctx, "events").await,
        ("2".into(), "0".into(), "0".into(), "6".into())
    );
    assert_eq!(
        run_pipe(&ctx, "events").await,
        ("0".into(), "2".into(), "0".into(), "0".into())
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.events").await, "6");
    assert_eq!(status(&ctx, "events", "pending_files").await, "0");
    assert_eq!(status(&ctx, "events", "lag_seconds").await, "");

    // A file whose columns do not fit fails alone; the next file loads.
    std::fs::write(dir.join("c-bad.csv"), "other,columns\n1,2\n").unwrap();
    std::fs::write(dir.join("d.csv"), csv(7, 2)).unwrap();
    assert_eq!(status(&ctx, "events", "pending_files").await, "2");
    assert_eq!(
        run_pipe(&ctx, "events").await,
        ("1".into(), "2".into(), "1".into(), "2".into())
    );
    assert_eq!(status(&ctx, "events", "files_failed").await, "1");
    let failures = status(&ctx, "events", "failures").await;
    assert!(
        failures.contains("c-bad.csv") && failures.contains("other"),
        "{failures}"
    );
    // It stays failed (and is not read again) until it changes, and it
    // does not count as pending.
    assert_eq!(
        run_pipe(&ctx, "events").await,
        ("0".into(), "3".into(), "0".into(), "0".into())
    );
    assert_eq!(status(&ctx, "events", "files_failed").await, "1");
    assert_eq!(status(&ctx, "events", "pending_files").await, "0");
    // Fixed in place, it loads, and the failure is resolved.
    std::fs::write(dir.join("c-bad.csv"), csv(9, 4)).unwrap();
    assert_eq!(
        run_pipe(&ctx, "events").await,
        ("1".into(), "3".into(), "0".into(), "4".into())
    );
    assert_eq!(status(&ctx, "events", "files_failed").await, "0");
    assert_eq!(status(&ctx, "events", "failures").await, "");

    let totals = run(
        &ctx,
        "SELECT files_loaded, rows_loaded, last_error FROM pipes()",
    )
    .await
    .unwrap();
    assert_eq!(value(&totals, "files_loaded"), "4");
    assert_eq!(value(&totals, "rows_loaded"), "12");
    assert_eq!(value(&totals, "last_error"), "");
    assert_eq!(
        scalar(&ctx, "SELECT count(DISTINCT id) FROM raw.events").await,
        "12"
    );

    // Lag: a file waiting shows how long it has waited.
    std::fs::write(dir.join("e.csv"), csv(13, 1)).unwrap();
    let lag: i64 = status(&ctx, "events", "lag_seconds").await.parse().unwrap();
    assert!((0..60).contains(&lag), "{lag}");

    // Pause and resume; RUN PIPE still loads a paused pipe.
    run(&ctx, "ALTER PIPE events PAUSE").await.unwrap();
    assert_eq!(scalar(&ctx, "SELECT state FROM pipes()").await, "paused");
    assert_eq!(run_pipe(&ctx, "events").await.0, "1");
    run(&ctx, "ALTER PIPE events RESUME").await.unwrap();
    assert_eq!(status(&ctx, "events", "state").await, "running");

    // Dropping the pipe keeps what it loaded.
    run(&ctx, "DROP PIPE events").await.unwrap();
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM pipes()").await, "0");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.events").await, "13");
    run(&ctx, "DROP PIPE IF EXISTS events").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipe_statements_refuse_what_they_cannot_do_and_say_what_to_do() {
    let landing = tempfile::tempdir().unwrap();
    let uri = folder_uri(landing.path());
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let create = |with: &str, copy_with: &str| {
        format!("CREATE PIPE p {with} AS COPY INTO raw.t FROM '{uri}' {copy_with}")
    };
    assert!(
        error(
            &ctx,
            &create(
                "",
                "WITH (format = 'csv', secret_access_key = 'x', access_key_id = 'y')"
            )
        )
        .await
        .contains("secrets do not belong"),
    );
    assert!(
        error(&ctx, &create("", "WITH (format = 'csv', files = 'a.csv')"))
            .await
            .contains("watches the whole prefix")
    );
    // An empty prefix says nothing of its format.
    assert!(
        error(&ctx, &create("", ""))
            .await
            .contains("holds no files yet, so the pipe cannot tell their format")
    );
    assert!(
        error(
            &ctx,
            &create("WITH (interval = '0s')", "WITH (format = 'csv')")
        )
        .await
        .contains("zero")
    );
    assert_eq!(
        error(
            &ctx,
            &create("WITH (interval = '2d')", "WITH (format = 'csv')")
        )
        .await,
        "pipe option interval = '2d' is out of range: give 1s to 86400s"
    );
    assert!(
        error(
            &ctx,
            &create("WITH (notification_queue = 'q')", "WITH (format = 'csv')")
        )
        .await
        .contains("not a queue URL")
    );
    assert!(
        error(
            &ctx,
            &create(
                "WITH (notification_queue = 'https://sqs/q')",
                "WITH (format = 'csv')"
            )
        )
        .await
        .contains("needs an s3:// prefix")
    );
    assert!(
        error(
            &ctx,
            &create("WITH (speed = 'fast')", "WITH (format = 'csv')")
        )
        .await
        .contains("CREATE PIPE has no option 'speed'")
    );
    assert!(
        error(
            &ctx,
            &format!("CREATE PIPE \"Bad-Name\" AS COPY INTO raw.t FROM '{uri}'")
        )
        .await
        .contains("is not a pipe name")
    );

    run(&ctx, &create("", "WITH (format = 'csv')"))
        .await
        .unwrap();
    assert!(
        error(&ctx, &create("", "WITH (format = 'csv')"))
            .await
            .contains("pipe p exists: DROP PIPE p first, or use CREATE PIPE IF NOT EXISTS")
    );
    run(
        &ctx,
        &format!("CREATE PIPE IF NOT EXISTS p AS COPY INTO raw.t FROM '{uri}'"),
    )
    .await
    .unwrap();
    assert!(
        error(&ctx, "RUN PIPE nope")
            .await
            .starts_with("pipe nope does not exist: list pipes with SELECT * FROM pipes()")
    );
    assert!(
        error(&ctx, "DROP PIPE nope")
            .await
            .contains("does not exist")
    );
    assert!(
        error(&ctx, "ALTER PIPE p STOP")
            .await
            .contains("the statement is ALTER PIPE <name> PAUSE | RESUME")
    );
    // Nothing under the prefix is no error for a pipe.
    assert_eq!(run_pipe(&ctx, "p").await.0, "0");
}

/// Two `COPY INTO`s of the same new files at once (two sessions, as two
/// processes would be): every file lands once, whichever wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_copies_of_the_same_files_load_each_once() {
    let landing = tempfile::tempdir().unwrap();
    let uri = folder_uri(landing.path());
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA raw").await.unwrap();
    run(&ctx, "CREATE TABLE raw.t (id BIGINT, name VARCHAR)")
        .await
        .unwrap();
    let sql = format!("COPY INTO raw.t FROM '{uri}' WITH (all_files = true)");
    let mut refusals = 0;
    for round in 0..4i64 {
        for n in 0..4 {
            let first = (round * 4 + n) * 10;
            std::fs::write(
                landing.path().join(format!("{round}-{n}.csv")),
                csv(first, 10),
            )
            .unwrap();
        }
        let (one, two) = (warehouse.session().await, warehouse.session().await);
        let (a, b) = tokio::join!(run(&one, &sql), run(&two, &sql));
        let loaded: i64 = [&a, &b]
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|batches| value(batches, "files_loaded").parse::<i64>().unwrap())
            .sum();
        for refused in [&a, &b].iter().filter_map(|r| r.as_ref().err()) {
            refusals += 1;
            assert!(
                refused
                    .user_message()
                    .contains("committed nothing: run it again"),
                "{refused}"
            );
        }
        assert_eq!(loaded, 4, "round {round}: {a:?} {b:?}");
        let expected = ((round + 1) * 40).to_string();
        assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.t").await, expected);
        assert_eq!(
            scalar(&ctx, "SELECT count(DISTINCT id) FROM raw.t").await,
            expected
        );
    }
    eprintln!("racing copies: {refusals} of 4 rounds had a copy refused at its commit");
}

/// Every run changes the pipe's properties (its lease, its last run); the
/// metadata files of the versions before the last ten are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_keeps_a_bounded_metadata_folder() {
    let landing = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(
        &ctx,
        &format!(
            "CREATE PIPE quiet AS COPY INTO raw.t FROM '{}' WITH (format = 'csv')",
            folder_uri(landing.path())
        ),
    )
    .await
    .unwrap();
    for _ in 0..20 {
        run_pipe(&ctx, "quiet").await;
    }
    let metadata_files = crate::common::files_under(warehouse.path())
        .into_iter()
        .filter(|p| {
            p.to_string_lossy().contains("pipe_quiet")
                && p.to_string_lossy().ends_with(".metadata.json")
        })
        .count();
    // 41 versions were written: the last ten of the log and the current one
    // remain.
    assert!((2..=11).contains(&metadata_files), "{metadata_files}");
    assert_eq!(status(&ctx, "quiet", "state").await, "running");
}
