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
    let [flag, catalog] = warehouse.shell_args();
    let mut command = shell_csv(flag, catalog);
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

pub(crate) async fn target_with_upload(warehouse: &Warehouse, rows: usize) -> String {
    target_with_upload_for(warehouse, rows, "").await
}

/// [`target_with_upload`], the upload opened `WITH (...)` = `with`.
async fn target_with_upload_for(warehouse: &Warehouse, rows: usize, with: &str) -> String {
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA IF NOT EXISTS s").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE IF NOT EXISTS s.t (id BIGINT NOT NULL, upload VARCHAR NOT NULL)",
    )
    .await
    .unwrap();
    let upload = create_upload(&ctx, &format!("s.t {with}")).await;
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
pub(crate) async fn landed(warehouse: &Warehouse, id: &str) -> (String, String) {
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
    two_processes_promoting_one_upload(Warehouse::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_promoting_one_upload_on_postgres_commit_it_once() {
    two_processes_promoting_one_upload(Warehouse::postgres().await).await;
}

async fn two_processes_promoting_one_upload(warehouse: Warehouse) {
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
    // A short claim lease: the run after the kill waits for the dead
    // promotion's claim to lapse before it takes over.
    kill_sql_at(
        warehouse,
        &format!("SET icestage.promotion_lease = '2s'; PROMOTE UPLOAD '{id}'"),
        failpoint,
    );
}

/// Runs `sql` in a shell process that is SIGKILLed at `failpoint`.
pub(crate) fn kill_sql_at(warehouse: &Warehouse, sql: &str, failpoint: &str) {
    let mut command = icestage(warehouse, sql);
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
                    "the statement never reached {failpoint}: {:?}",
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

/// `PROMOTE UPLOAD` and `ABORT UPLOAD` of one upload, started together in two
/// processes: exactly one wins, every trial. When the promotion wins, its
/// rows are in the target once and every file they live in still exists;
/// when the abort wins, the target has none of them. The suite runs a few
/// trials; `ICESTAGE_RACE_TRIALS=200 cargo test --test it promote_and_abort`
/// runs the long version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_and_abort_racing_never_both_win() {
    promote_and_abort_race(Warehouse::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_and_abort_racing_on_postgres_never_both_win() {
    promote_and_abort_race(Warehouse::postgres().await).await;
}

async fn promote_and_abort_race(warehouse: Warehouse) {
    let trials: usize = std::env::var("ICESTAGE_RACE_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let (mut promoted, mut aborted) = (0, 0);
    let mut expected_rows = 0usize;
    for trial in 0..trials {
        let id = target_with_upload(&warehouse, 5).await;
        let children = [
            spawn(icestage(&warehouse, &format!("PROMOTE UPLOAD '{id}'"))),
            spawn(icestage(&warehouse, &format!("ABORT UPLOAD '{id}'"))),
        ];
        let [promote, abort] = children.map(|c| c.wait_with_output().unwrap());
        let won = (promote.status.success(), abort.status.success());
        assert!(
            won.0 != won.1,
            "trial {trial}: exactly one must win\npromote: {}\nabort: {}",
            text(&promote),
            text(&abort)
        );
        let (rows, snapshots) = landed(&warehouse, &id).await;
        if won.0 {
            promoted += 1;
            expected_rows += 5;
            assert_eq!(
                (rows.as_str(), snapshots.as_str()),
                ("5", "1"),
                "trial {trial}"
            );
        } else {
            aborted += 1;
            assert_eq!(
                (rows.as_str(), snapshots.as_str()),
                ("0", "0"),
                "trial {trial}"
            );
        }
        // The whole target reads back: no promoted file was deleted.
        let ctx = warehouse.session().await;
        assert_eq!(
            scalar(&ctx, "SELECT count(*) FROM s.t").await,
            expected_rows.to_string(),
            "trial {trial}"
        );
        let state = scalar(&ctx, &format!("SELECT state FROM upload_status('{id}')")).await;
        assert_eq!(
            state,
            if won.0 { "promoted" } else { "aborted" },
            "trial {trial}"
        );
    }
    eprintln!("{trials} trials: promote won {promoted}, abort won {aborted}");
}

/// `EXPIRE SNAPSHOTS` keeps what exactly once rests on: the snapshot of a
/// promotion killed after its commit stays until the promotion finishes,
/// and a copy killed after its commit is marked committed in the copy log
/// before its snapshot goes, so neither lands twice when run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_snapshots_keeps_the_exactly_once_evidence() {
    let warehouse = Warehouse::new();
    let unfinished = target_with_upload(&warehouse, 5).await;
    kill_at(&warehouse, &unfinished, "promote.after-commit");
    let ctx = warehouse.session().await;
    for _ in 0..2 {
        let done = target_with_upload(&warehouse, 3).await;
        run(&ctx, &format!("PROMOTE UPLOAD '{done}'"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = run(
        &ctx,
        "EXPIRE SNAPSHOTS s.t WITH (older_than = '10ms', retain_last = 1)",
    )
    .await
    .unwrap();
    assert_eq!(
        (
            crate::common::value(&expired, "snapshots_protected"),
            crate::common::value(&expired, "snapshots_kept"),
        ),
        ("1".to_string(), "2".to_string()),
        "{}",
        crate::common::value(&expired, "message")
    );
    let again = icestage(
        &warehouse,
        &format!("SELECT state, rows FROM promote_upload('{unfinished}')"),
    )
    .output()
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "state,rows\npromoted,5\n",
        "{}",
        text(&again)
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "11");
    // Now finished, its snapshot may go too.
    let expired = run(&ctx, "EXPIRE SNAPSHOTS s.t WITH (older_than = '1ms')")
        .await
        .unwrap();
    assert_eq!(crate::common::value(&expired, "snapshots_protected"), "0");
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM s.t$snapshots").await,
        "1"
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "11");

    // A copy killed after its commit, before its log says so.
    let landing = tempfile::tempdir().unwrap();
    std::fs::write(landing.path().join("a.csv"), "id,name\n1,a\n2,b\n").unwrap();
    let copy = format!(
        "COPY INTO raw.c FROM 'file://{}/' WITH (all_files = true)",
        landing.path().display()
    );
    kill_sql_at(&warehouse, &copy, "copy.after-commit");
    std::fs::write(landing.path().join("b.csv"), "id,name\n3,c\n").unwrap();
    run(&ctx, &copy).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = run(&ctx, "EXPIRE SNAPSHOTS raw.c WITH (older_than = '10ms')")
        .await
        .unwrap();
    assert_eq!(crate::common::value(&expired, "snapshots_expired"), "1");
    let batches = run(&ctx, &copy).await.unwrap();
    assert_eq!(crate::common::value(&batches, "files_loaded"), "0");
    assert_eq!(crate::common::value(&batches, "files_skipped"), "2");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.c").await, "3");
}

/// `REWRITE MANIFESTS` merges a target's one-manifest-per-promotion into
/// one, changing no row; promotions before it are still answered as
/// promoted, and promotions after it append on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewriting_manifests_changes_no_row_and_keeps_the_evidence() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let mut ids = vec![];
    for _ in 0..4 {
        let id = target_with_upload(&warehouse, 3).await;
        run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
        ids.push(id);
    }
    let before = scalar(&ctx, "SELECT sum(id), count(*) FROM s.t").await;
    let rewritten = run(&ctx, "REWRITE MANIFESTS s.t").await.unwrap();
    assert_eq!(
        (
            crate::common::value(&rewritten, "manifests_before"),
            crate::common::value(&rewritten, "manifests_after"),
            crate::common::value(&rewritten, "data_files"),
        ),
        ("4".to_string(), "1".to_string(), "4".to_string())
    );
    assert_eq!(
        scalar(&ctx, "SELECT sum(id), count(*) FROM s.t").await,
        before
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "12");
    // Promoted before the rewrite: still answered, nothing lands again.
    let again = run(&ctx, &format!("PROMOTE UPLOAD '{}'", ids[0]))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&again, "state"), "promoted");
    let late = target_with_upload(&warehouse, 2).await;
    run(&ctx, &format!("PROMOTE UPLOAD '{late}'"))
        .await
        .unwrap();
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "14");
    for id in ids.iter().chain([&late]) {
        assert_eq!(landed(&warehouse, id).await.1, "1");
    }
    let twice = run(&ctx, "REWRITE MANIFESTS s.t").await.unwrap();
    assert_eq!(crate::common::value(&twice, "manifests_after"), "1");
    // Expiring the snapshots before the last rewrite deletes the manifests
    // only they listed: the merged one is all that is left.
    tokio::time::sleep(Duration::from_millis(20)).await;
    run(&ctx, "EXPIRE SNAPSHOTS s.t WITH (older_than = '10ms')")
        .await
        .unwrap();
    let manifests = manifest_files(warehouse.path());
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "14");
    let once_more = run(&ctx, "REWRITE MANIFESTS s.t").await.unwrap();
    assert!(
        crate::common::value(&once_more, "message")
            .contains("as few data manifests as its entries need already")
    );
}

/// A target merges its manifests as Iceberg's commit properties say: once
/// `commit.manifest.min-count-to-merge` commits have landed since the last
/// merge, in the background, in `replace` snapshots that change no row;
/// promotions are still answered as promoted and land once. `INSERT INTO`
/// merges the same way; a table with `commit.manifest-merge.enabled =
/// false` keeps one manifest per commit; a count that is not one is
/// refused when the table is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_merges_its_manifests_as_its_properties_say() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    for (table, properties) in [
        ("s.t", "'commit.manifest.min-count-to-merge' = '4'"),
        ("s.u", "'commit.manifest.min-count-to-merge' = '2'"),
        (
            "s.off",
            "'commit.manifest-merge.enabled' = 'false', 'commit.manifest.min-count-to-merge' = '2'",
        ),
        ("s.busy", "'commit.manifest.min-count-to-merge' = '1'"),
    ] {
        run(
            &ctx,
            &format!(
                "CREATE TABLE {table} (id BIGINT NOT NULL, upload VARCHAR NOT NULL) \
                 TBLPROPERTIES ({properties})"
            ),
        )
        .await
        .unwrap();
    }
    for n in 0..5 {
        for table in ["s.u", "s.off"] {
            run(&ctx, &format!("INSERT INTO {table} VALUES ({n}, 'x')"))
                .await
                .unwrap();
        }
    }
    let mut ids = vec![];
    for _ in 0..9 {
        let id = target_with_upload(&warehouse, 3).await;
        run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
        ids.push(id);
    }
    // The merges run after the commits are answered: wait for them to land.
    // Fewer manifests than commits since the last merge is what the
    // properties ask for (level 1, and under 4 appended since).
    let shape = |table: &'static str| {
        let ctx = &ctx;
        async move {
            scalar(
                ctx,
                &format!(
                    "SELECT (SELECT count(*) FROM {table}$manifests) || ' manifests, ' || \
                     (SELECT count(*) FROM {table}$snapshots WHERE operation = 'replace') || ' merges'"
                ),
            )
            .await
        }
    };
    let manifests = |shape: &str| -> u32 { shape.split(' ').next().unwrap().parse().unwrap() };
    let mut merged = (String::new(), String::new());
    for _ in 0..100 {
        merged = (shape("s.t").await, shape("s.u").await);
        if manifests(&merged.0) <= 4 && manifests(&merged.1) <= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        manifests(&merged.0) <= 4
            && manifests(&merged.1) <= 2
            && !merged.0.ends_with(" 0 merges")
            && !merged.1.ends_with(" 0 merges"),
        "after 9 promotions, s.t: {}; after 5 inserts, s.u: {}",
        merged.0,
        merged.1
    );
    // Rows as they were; every promotion answered and landed once.
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "27");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.u").await, "5");
    for id in &ids {
        assert_eq!(
            landed(&warehouse, id).await,
            ("3".to_string(), "1".to_string())
        );
    }
    let again = run(&ctx, &format!("PROMOTE UPLOAD '{}'", ids[0]))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&again, "state"), "promoted");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "27");
    // Written alongside, with merging off: one manifest per commit.
    assert_eq!(shape("s.off").await, "5 manifests, 0 merges");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.off").await, "5");

    // A table merged after every commit (s.busy): the maintenance
    // statements run right after each one take turns with the background
    // merge instead of failing as a conflict.
    for n in 0..8 {
        run(&ctx, &format!("INSERT INTO s.busy VALUES ({n}, 'x')"))
            .await
            .unwrap();
        run(&ctx, "REWRITE MANIFESTS s.busy").await.unwrap();
        run(
            &ctx,
            "EXPIRE SNAPSHOTS s.busy WITH (older_than = '1ms', retain_last = 2)",
        )
        .await
        .unwrap();
    }
    assert_eq!(
        scalar(&ctx, "SELECT count(*) || ',' || sum(id) FROM s.busy").await,
        "8,28"
    );

    let refused = run(
        &ctx,
        "CREATE TABLE s.w (id BIGINT) TBLPROPERTIES ('commit.manifest.min-count-to-merge' = 'often')",
    )
    .await
    .unwrap_err()
    .user_message();
    assert!(
        refused.contains("'commit.manifest.min-count-to-merge' = 'often'")
            && refused.contains("whole number"),
        "{refused}"
    );
}

/// A client completed in time, and the promotion died with its process
/// after claiming the upload: once the upload's ttl has passed, the
/// promotion can still be run again (for an hour) and lands once; an
/// upload never completed cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_started_before_expiry_can_finish_after_it() {
    let warehouse = Warehouse::new();
    let started = target_with_upload_for(&warehouse, 4, "WITH (ttl = '4s')").await;
    let idle = target_with_upload_for(&warehouse, 2, "WITH (ttl = '4s')").await;
    kill_at(&warehouse, &started, "promote.after-validation");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ctx = warehouse.session().await;
    // EXPIRE STAGING leaves it, and removes the idle one.
    run(&ctx, "EXPIRE STAGING").await.unwrap();
    let state = scalar(
        &ctx,
        &format!("SELECT state FROM upload_status('{started}')"),
    )
    .await;
    assert_eq!(state, "promoting");
    // Its claim lapsed with its process: the status says how to finish it.
    let message = scalar(
        &ctx,
        &format!("SELECT message FROM upload_status('{started}')"),
    )
    .await;
    assert!(
        message.contains("its promotion stopped before it finished")
            && message.contains(&format!("PROMOTE UPLOAD '{started}'")),
        "{message}"
    );
    let again = run(&ctx, &format!("PROMOTE UPLOAD '{started}'"))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&again, "state"), "promoted");
    assert_eq!(
        landed(&warehouse, &started).await,
        ("4".to_string(), "1".to_string())
    );
    let refused = run(&ctx, &format!("PROMOTE UPLOAD '{idle}'"))
        .await
        .unwrap_err()
        .user_message();
    assert!(refused.contains("expired"), "{refused}");
}

/// The manifests (not manifest lists) in the metadata folder of `s.t`.
fn manifest_files(dir: &std::path::Path) -> Vec<String> {
    crate::common::files_under(dir)
        .into_iter()
        .filter(|path| path.to_string_lossy().contains("/s/t/metadata/"))
        .map(|path| path.file_name().unwrap().to_string_lossy().to_string())
        .filter(|name| name.ends_with(".avro") && !name.starts_with("snap-"))
        .collect()
}
