//! Promotion modes: `upsert` replaces the target's rows by key and inserts
//! the rest, `replace_partitions` replaces the partitions an upload
//! touches; both verified as appends are, readable by PyIceberg and
//! DuckDB, exactly once under races with appends and with each other.

use datafusion::prelude::SessionContext;

use crate::common::{Warehouse, create_upload, python_script, refusal, run, scalar, setup, value};

/// Opens an upload for `target` holding `rows` (SQL tuples); its id.
async fn upload_of(ctx: &SessionContext, target: &str, rows: &str) -> String {
    let upload = create_upload(ctx, target).await;
    run(
        ctx,
        &format!("INSERT INTO {} VALUES {rows}", upload.staging_table),
    )
    .await
    .unwrap();
    upload.id
}

/// The rows of `table` as `id:v` text, ordered by id.
async fn rows_of(ctx: &SessionContext, table: &str, value: &str) -> String {
    scalar(
        ctx,
        &format!(
            "SELECT coalesce(string_agg(concat(id, ':', {value}), ' ' ORDER BY id), '') FROM {table}"
        ),
    )
    .await
}

fn counts(batches: &[datafusion::arrow::array::RecordBatch]) -> [String; 3] {
    [
        value(batches, "rows_inserted"),
        value(batches, "rows_updated"),
        value(batches, "rows_deleted"),
    ]
}

/// An upsert by a UNIQUE rule's key: a dry run says what it would do, the
/// promotion replaces the rows of the keys it holds and inserts the rest,
/// in one `overwrite` snapshot that PyIceberg and DuckDB read as icestage
/// does; promoting it again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_replaces_rows_by_key_and_inserts_the_rest() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(&ctx, "CREATE TABLE s.k (id BIGINT NOT NULL, v VARCHAR)")
        .await
        .unwrap();
    run(&ctx, "ALTER TABLE s.k ADD CONSTRAINT pk UNIQUE (id)")
        .await
        .unwrap();
    run(
        &ctx,
        "INSERT INTO s.k VALUES (1, 'old'), (2, 'old'), (3, 'old')",
    )
    .await
    .unwrap();
    run(&ctx, "INSERT INTO s.k VALUES (4, 'old'), (5, 'old')")
        .await
        .unwrap();

    // Appending a key the target holds breaks the rule, as before.
    let clash = upload_of(&ctx, "s.k", "(2, 'x')").await;
    let refused = refusal(&ctx, &format!("PROMOTE UPLOAD '{clash}'")).await;
    assert!(refused.contains("rule 'pk' UNIQUE (id)"), "{refused}");
    assert!(
        scalar(
            &ctx,
            &format!("SELECT message FROM upload_findings('{clash}') LIMIT 1")
        )
        .await
        .contains("already in the target")
    );

    let id = upload_of(&ctx, "s.k", "(2, 'new'), (4, 'new'), (9, 'new')").await;
    let dry = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (mode = 'upsert', dry_run = true)"),
    )
    .await
    .unwrap();
    assert_eq!(counts(&dry), ["1", "2", "0"], "{}", value(&dry, "message"));
    assert_eq!(
        rows_of(&ctx, "s.k", "v").await,
        "1:old 2:old 3:old 4:old 5:old"
    );

    let promoted = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (mode = 'upsert', tag = true)"),
    )
    .await
    .unwrap();
    assert_eq!(value(&promoted, "mode"), "upsert");
    assert_eq!(
        counts(&promoted),
        ["1", "2", "0"],
        "{}",
        value(&promoted, "message")
    );
    let expected = "1:old 2:new 3:old 4:new 5:old 9:new";
    assert_eq!(rows_of(&ctx, "s.k", "v").await, expected);
    assert_eq!(
        scalar(
            &ctx,
            "SELECT operation FROM s.k$snapshots ORDER BY committed_at DESC LIMIT 1"
        )
        .await,
        "overwrite"
    );
    let again = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (mode = 'upsert', tag = true)"),
    )
    .await
    .unwrap();
    assert_eq!(value(&again, "state"), "promoted");
    assert!(value(&again, "message").contains("already promoted"));
    assert_eq!(rows_of(&ctx, "s.k", "v").await, expected);

    let pyiceberg: serde_json::Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &["read-table", &warehouse.connection(), "s.k"],
    ))
    .unwrap();
    assert_eq!(pyiceberg["rows"], 6);
    let news = pyiceberg["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["v"] == "new")
        .count();
    assert_eq!(news, 3);
    // The tag names the snapshot the promotion committed; PyIceberg reads it.
    let tagged: serde_json::Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &[
            "tagged",
            &warehouse.connection(),
            "s.k",
            &format!("upload-{id}"),
        ],
    ))
    .unwrap();
    assert_eq!(
        tagged["snapshot_id"].to_string(),
        value(&promoted, "snapshot_id")
    );
    assert_eq!(tagged["rows"], 6);
    let duckdb: serde_json::Value = serde_json::from_str(&python_script(
        "duckdb_scan.py",
        &[&warehouse.connection(), "s", "k", "id"],
    ))
    .unwrap();
    assert_eq!(
        (duckdb["rows"].as_i64(), duckdb["sum"].as_i64()),
        (Some(6), Some(24))
    );
}

/// An upsert's key: a key repeated in the upload is a finding; a target
/// without a key needs `key = ...`; a key that names no column, a mode
/// that does not exist and `key` with another mode are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_key_is_unique_in_the_upload_and_named_when_the_target_has_none() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.n (id BIGINT NOT NULL, v VARCHAR)",
            "INSERT INTO s.n VALUES (1, 'old'), (2, 'old')",
        ],
    )
    .await;
    let id = upload_of(&ctx, "s.n", "(1, 'a'), (1, 'b'), (3, 'c')").await;
    for (with, expected) in [
        ("mode = 'upsert'", "has none: name it with key"),
        ("mode = 'upsert', key = 'nosuch'", "names column 'nosuch'"),
        ("mode = 'merge'", "mode = 'merge' is not a promotion mode"),
        ("mode = 'append', key = 'id'", "takes none"),
    ] {
        let error = refusal(&ctx, &format!("PROMOTE UPLOAD '{id}' WITH ({with})")).await;
        assert!(error.contains(expected), "{with}: {error}");
    }
    // Refused before anything was claimed: the upload is still open.
    let status = run(&ctx, &format!("SELECT * FROM upload_status('{id}')"))
        .await
        .unwrap();
    assert_eq!(value(&status, "state"), "open");

    let twice = refusal(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (mode = 'upsert', key = '(id)')"),
    )
    .await;
    assert!(twice.contains("rule 'upsert_key' UNIQUE (id)"), "{twice}");
    let finding = scalar(
        &ctx,
        &format!("SELECT concat(rule, ': ', message) FROM upload_findings('{id}') LIMIT 1"),
    )
    .await;
    assert!(
        finding.starts_with("upsert_key: ")
            && finding.contains("appears more than once in the upload"),
        "{finding}"
    );
    assert_eq!(rows_of(&ctx, "s.n", "v").await, "1:old 2:old");
}

/// `replace_partitions`: every partition the upload touches holds exactly
/// its rows afterwards, the others are untouched; a target without
/// partitions is refused with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_partitions_replaces_exactly_the_partitions_an_upload_touches() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.r (id BIGINT NOT NULL, day VARCHAR NOT NULL) PARTITIONED BY (day)",
            "INSERT INTO s.r VALUES (1, 'a'), (2, 'a'), (3, 'b'), (4, 'c')",
            "INSERT INTO s.r VALUES (5, 'a')",
        ],
    )
    .await;
    let id = upload_of(&ctx, "s.r", "(10, 'a'), (11, 'c'), (12, 'c')").await;
    let dry = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (mode = 'replace_partitions', dry_run = true)"),
    )
    .await
    .unwrap();
    assert_eq!(counts(&dry), ["3", "0", "4"], "{}", value(&dry, "message"));
    let replaced = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (mode = 'replace_partitions')"),
    )
    .await
    .unwrap();
    assert_eq!(counts(&replaced), ["3", "0", "4"]);
    assert_eq!(rows_of(&ctx, "s.r", "day").await, "3:b 10:a 11:c 12:c");
    let pyiceberg: serde_json::Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &["read-table", &warehouse.connection(), "s.r"],
    ))
    .unwrap();
    assert_eq!(pyiceberg["rows"], 4);

    run(&ctx, "CREATE TABLE s.flat (id BIGINT NOT NULL)")
        .await
        .unwrap();
    let flat = upload_of(&ctx, "s.flat", "(1)").await;
    let refused = refusal(
        &ctx,
        &format!("PROMOTE UPLOAD '{flat}' WITH (mode = 'replace_partitions')"),
    )
    .await;
    assert!(
        refused.contains("has no partitions") && refused.contains("mode = 'append'"),
        "{refused}"
    );
    run(&ctx, &format!("PROMOTE UPLOAD '{flat}'"))
        .await
        .unwrap();
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.flat").await, "1");
}

/// Trials of the race tests below.
const TRIALS: i64 = 200;

/// One trial: `promote` from two sessions and `append` from a third, at
/// once; exactly one promotion commits, the other answers `already
/// promoted`.
async fn race(sessions: [&SessionContext; 3], promote: &str, append: &str, trial: i64) {
    let [one, two, three] = sessions;
    let (first, second, appended) =
        tokio::join!(run(one, promote), run(two, promote), run(three, append));
    appended.unwrap();
    let messages = [first.unwrap(), second.unwrap()].map(|b| value(&b, "message"));
    let committed = messages
        .iter()
        .filter(|m| m.starts_with("committed"))
        .count();
    let already = messages
        .iter()
        .filter(|m| m.starts_with("already promoted"))
        .count();
    assert_eq!((committed, already), (1, 1), "trial {trial}: {messages:?}");
}

/// Upserts racing an append from another session and a second promotion
/// of the same upload, `TRIALS` times: every trial's upsert lands once
/// (its keys hold its values, each key once), every appended row stays,
/// and of the two promotions one commits and the other answers
/// `already promoted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_racing_appends_and_each_other_land_once() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (other, third) = (warehouse.session().await, warehouse.session().await);
    let keys: Vec<String> = (0..10).map(|k| format!("({k}, -1)")).collect();
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.u (id BIGINT NOT NULL, v BIGINT NOT NULL)",
            &format!("INSERT INTO s.u VALUES {}", keys.join(", ")),
        ],
    )
    .await;
    let mut latest = [-1i64; 10];
    for trial in 0..TRIALS {
        let (a, b) = ((trial % 10) as usize, ((trial + 3) % 10) as usize);
        let id = upload_of(&ctx, "s.u", &format!("({a}, {trial}), ({b}, {trial})")).await;
        let promote = format!("PROMOTE UPLOAD '{id}' WITH (mode = 'upsert', key = 'id')");
        let append = format!("INSERT INTO s.u VALUES ({}, {trial})", 1000 + trial);
        race([&ctx, &other, &third], &promote, &append, trial).await;
        latest[a] = trial;
        latest[b] = trial;
    }
    let expected: Vec<String> = (0..10)
        .map(|k| format!("{k}:{}", latest[k]))
        .chain((0..TRIALS).map(|t| format!("{}:{t}", 1000 + t)))
        .collect();
    assert_eq!(rows_of(&ctx, "s.u", "v").await, expected.join(" "));
    assert_eq!(
        scalar(
            &ctx,
            "SELECT count(*) FROM s.u$snapshots WHERE summary['icestage.promote-mode'] = 'upsert'"
        )
        .await,
        TRIALS.to_string()
    );
}

/// Partition replacements racing an append to another partition and a
/// second promotion of the same upload, `TRIALS` times: the replaced
/// partition holds exactly the last trial's row, every appended row of the
/// other partition stays, each upload lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_replacements_racing_appends_and_each_other_land_once() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (other, third) = (warehouse.session().await, warehouse.session().await);
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.p (id BIGINT NOT NULL, day VARCHAR NOT NULL) PARTITIONED BY (day)",
            "INSERT INTO s.p VALUES (0, 'a'), (0, 'b')",
        ],
    )
    .await;
    for trial in 1..=TRIALS {
        let id = upload_of(&ctx, "s.p", &format!("({trial}, 'a'), ({}, 'a')", -trial)).await;
        let promote = format!("PROMOTE UPLOAD '{id}' WITH (mode = 'replace_partitions')");
        let append = format!("INSERT INTO s.p VALUES ({trial}, 'b')");
        race([&ctx, &other, &third], &promote, &append, trial).await;
        assert_eq!(
            scalar(&ctx, "SELECT count(*) FROM s.p WHERE day = 'a'").await,
            "2",
            "trial {trial}"
        );
    }
    assert_eq!(
        rows_of(&ctx, "(SELECT * FROM s.p WHERE day = 'a') AS a", "day").await,
        format!("{}:a {TRIALS}:a", -TRIALS)
    );
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM s.p WHERE day = 'b'").await,
        (TRIALS + 1).to_string()
    );
    assert_eq!(
        scalar(&ctx, "SELECT sum(id) FROM s.p WHERE day = 'b'").await,
        (TRIALS * (TRIALS + 1) / 2).to_string()
    );
}

/// `PUBLISH UPLOAD`'s answer: `how`, then the message.
async fn publish(ctx: &SessionContext, id: &str) -> (String, String) {
    let published = run(ctx, &format!("PUBLISH UPLOAD '{id}'")).await.unwrap();
    assert_eq!(value(&published, "state"), "published");
    (value(&published, "how"), value(&published, "message"))
}

/// Write-audit-publish: a promotion `WITH (to_branch = ...)` lands on an
/// audit branch that engines read by name while `main` is unchanged;
/// `PUBLISH UPLOAD` re-applies it on a `main` that moved meanwhile (or
/// fast-forwards one that did not), checks the rules again against `main`
/// and refuses what `main` gained since, and answers once published; a
/// snapshot expiry keeps what is still to publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_promotion_is_published_once_and_checked_again() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.a (id BIGINT NOT NULL, v VARCHAR)",
            "ALTER TABLE s.a ADD CONSTRAINT pk UNIQUE (id)",
            "INSERT INTO s.a VALUES (1, 'main')",
        ],
    )
    .await;

    let a = upload_of(&ctx, "s.a", "(2, 'a'), (3, 'a')").await;
    let promote = format!("PROMOTE UPLOAD '{a}' WITH (to_branch = 'audit')");
    let promoted = run(&ctx, &promote).await.unwrap();
    assert_eq!(value(&promoted, "branch"), "audit");
    assert!(
        value(&promoted, "message").contains("on branch 'audit'"),
        "{}",
        value(&promoted, "message")
    );
    assert_eq!(
        rows_of(&ctx, "s.a", "v").await,
        "1:main",
        "main is unchanged"
    );
    let branch: serde_json::Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &["tagged", &warehouse.connection(), "s.a", "audit"],
    ))
    .unwrap();
    assert_eq!(branch["rows"], 3, "PyIceberg reads the branch by name");
    assert_eq!(
        branch["snapshot_id"].to_string(),
        value(&promoted, "snapshot_id")
    );
    let again = run(&ctx, &promote).await.unwrap();
    assert!(value(&again, "message").contains("already promoted"));
    assert_eq!(value(&again, "branch"), "audit");

    // Another promotion reaches main, and a second upload joins the branch
    // with a key main gains meanwhile.
    let b = upload_of(&ctx, "s.a", "(4, 'b')").await;
    run(&ctx, &format!("PROMOTE UPLOAD '{b}'")).await.unwrap();
    let c = upload_of(&ctx, "s.a", "(5, 'c')").await;
    run(
        &ctx,
        &format!("PROMOTE UPLOAD '{c}' WITH (to_branch = 'audit')"),
    )
    .await
    .unwrap();
    let d = upload_of(&ctx, "s.a", "(5, 'd')").await;
    run(&ctx, &format!("PROMOTE UPLOAD '{d}'")).await.unwrap();

    // An expiry keeps the snapshots still to publish.
    run(
        &ctx,
        "EXPIRE SNAPSHOTS s.a WITH (older_than = '1ms', retain_last = 1)",
    )
    .await
    .unwrap();

    let (how, message) = publish(&ctx, &a).await;
    assert_eq!(how, "reapplied", "{message}");
    assert_eq!(
        rows_of(&ctx, "s.a", "v").await,
        "1:main 2:a 3:a 4:b 5:d",
        "main's rows stay, the branch's are added once"
    );
    let (how, message) = publish(&ctx, &a).await;
    assert_eq!(how, "none");
    assert!(message.starts_with("already published"), "{message}");
    assert_eq!(
        scalar(&ctx, &format!("SELECT state FROM upload_status('{a}')")).await,
        "published"
    );
    let late = run(&ctx, &promote).await.unwrap();
    assert!(value(&late, "message").contains("already promoted"));

    // Checked again against main as it is now: key 5 reached main since.
    let refused = refusal(&ctx, &format!("PUBLISH UPLOAD '{c}'")).await;
    assert!(
        refused.contains("rule 'pk' UNIQUE (id)") && refused.contains("main is unchanged"),
        "{refused}"
    );
    assert_eq!(rows_of(&ctx, "s.a", "v").await, "1:main 2:a 3:a 4:b 5:d");
    assert!(
        scalar(
            &ctx,
            &format!("SELECT message FROM upload_findings('{c}') LIMIT 1")
        )
        .await
        .contains("already in the target")
    );

    // main has not moved since this branch promotion: a fast-forward.
    let e = upload_of(&ctx, "s.a", "(6, 'e')").await;
    let on_branch = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{e}' WITH (to_branch = 'review')"),
    )
    .await
    .unwrap();
    let (how, message) = publish(&ctx, &e).await;
    assert_eq!(how, "fast_forward", "{message}");
    assert_eq!(
        scalar(
            &ctx,
            "SELECT snapshot_id FROM s.a$snapshots ORDER BY committed_at DESC LIMIT 1"
        )
        .await,
        value(&on_branch, "snapshot_id")
    );
    let duckdb: serde_json::Value = serde_json::from_str(&python_script(
        "duckdb_scan.py",
        &[&warehouse.connection(), "s", "a", "id"],
    ))
    .unwrap();
    assert_eq!(
        (duckdb["rows"].as_i64(), duckdb["sum"].as_i64()),
        (Some(6), Some(21)),
        "DuckDB reads main as icestage does"
    );

    // What is refused, by name.
    let f = upload_of(&ctx, "s.a", "(7, 'f')").await;
    for (options, expected) in [
        ("to_branch = 'main'", "names s.a's main branch"),
        ("to_branch = 'no spaces'", "is not a branch name"),
        (
            "to_branch = 'audit', mode = 'upsert'",
            "does not combine with it",
        ),
    ] {
        let refused = refusal(&ctx, &format!("PROMOTE UPLOAD '{f}' WITH ({options})")).await;
        assert!(refused.contains(expected), "{options}: {refused}");
    }
    let refused = refusal(&ctx, &format!("PUBLISH UPLOAD '{f}'")).await;
    assert!(refused.contains("promote it first"), "{refused}");
}

/// Publications racing each other and promotions that reach `main`,
/// `PUBLISH_TRIALS` times: of two PUBLISH of one upload, one publishes
/// and the other answers `already published`, and every row lands on
/// `main` exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publications_racing_promotions_to_main_land_once() {
    const PUBLISH_TRIALS: i64 = 50;
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (other, third) = (warehouse.session().await, warehouse.session().await);
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.r (id BIGINT NOT NULL, v BIGINT NOT NULL)",
            "ALTER TABLE s.r ADD CONSTRAINT pk UNIQUE (id)",
        ],
    )
    .await;
    for trial in 0..PUBLISH_TRIALS {
        let audited = upload_of(&ctx, "s.r", &format!("({trial}, 1)")).await;
        run(
            &ctx,
            &format!("PROMOTE UPLOAD '{audited}' WITH (to_branch = 'audit')"),
        )
        .await
        .unwrap();
        let direct = upload_of(&third, "s.r", &format!("({}, 2)", 1000 + trial)).await;
        let publish = format!("PUBLISH UPLOAD '{audited}'");
        let promote = format!("PROMOTE UPLOAD '{direct}'");
        let (first, second, promoted) = tokio::join!(
            run(&ctx, &publish),
            run(&other, &publish),
            run(&third, &promote)
        );
        promoted.unwrap();
        let hows = [first.unwrap(), second.unwrap()].map(|b| value(&b, "how"));
        let published = hows.iter().filter(|h| *h != "none").count();
        assert_eq!(published, 1, "trial {trial}: {hows:?}");
    }
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM s.r").await,
        (2 * PUBLISH_TRIALS).to_string()
    );
    assert_eq!(
        scalar(&ctx, "SELECT count(DISTINCT id) FROM s.r").await,
        (2 * PUBLISH_TRIALS).to_string()
    );
    assert_eq!(
        scalar(&ctx, "SELECT sum(v) FROM s.r").await,
        (3 * PUBLISH_TRIALS).to_string()
    );
}
