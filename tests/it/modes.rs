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
