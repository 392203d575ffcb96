//! A target's files kept in shape: `REWRITE DATA FILES` (small files
//! bin-packed, no row changed, promotions committed around it) and `REMOVE
//! ORPHAN FILES` (exactly the unreferenced old files under the table's
//! location, nothing else).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::common::{Warehouse, files_under, python_script, refusal, run, scalar, setup, value};
use crate::exactly_once::{landed, target_with_upload};

/// Rows and the sum of their ids, as one value.
async fn rows_and_sum(ctx: &datafusion::prelude::SessionContext, table: &str) -> String {
    scalar(
        ctx,
        &format!("SELECT concat(count(*), ' rows, sum ', sum(id)) FROM {table}"),
    )
    .await
}

/// The Parquet files below `dir` whose path contains one of `parts`.
fn parquet_files(dir: &Path, parts: &[&str]) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| {
            let text = p.to_string_lossy();
            text.ends_with(".parquet") && parts.iter().any(|part| text.contains(part))
        })
        .collect()
}

/// A target fed by six promotions (six small files) is packed into one
/// file in a `replace` snapshot: the same rows for icestage, PyIceberg and
/// DuckDB; promotions before it are still answered as promoted, and later
/// ones land on top. Expiring the snapshots before it deletes the small
/// files, wherever the promotions had left them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewriting_data_files_packs_small_files_and_changes_no_row() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let mut ids = vec![];
    for _ in 0..6 {
        let id = target_with_upload(&warehouse, 3).await;
        run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
        ids.push(id);
    }
    let before = rows_and_sum(&ctx, "s.t").await;
    assert_eq!(before, "18 rows, sum 18");

    let rewritten = run(&ctx, "REWRITE DATA FILES s.t").await.unwrap();
    let field = |name| value(&rewritten, name);
    assert_eq!(
        [
            field("data_files_before"),
            field("files_rewritten"),
            field("files_added"),
            field("data_files_after"),
            field("partitions_rewritten"),
            field("rows_rewritten"),
        ],
        ["6", "6", "1", "1", "1", "18"].map(String::from),
        "{}",
        field("message")
    );
    assert_eq!(rows_and_sum(&ctx, "s.t").await, before);
    assert_eq!(
        scalar(
            &ctx,
            "SELECT operation FROM s.t$snapshots ORDER BY committed_at DESC LIMIT 1"
        )
        .await,
        "replace"
    );

    // Third-party readers see the same rows.
    let pyiceberg: serde_json::Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &["read-table", &warehouse.connection(), "s.t"],
    ))
    .unwrap();
    assert_eq!(pyiceberg["rows"], 18);
    let duckdb: serde_json::Value = serde_json::from_str(&python_script(
        "duckdb_scan.py",
        &[&warehouse.connection(), "s", "t", "id"],
    ))
    .unwrap();
    assert_eq!(
        (duckdb["rows"].as_i64(), duckdb["sum"].as_i64()),
        (Some(18), Some(18))
    );

    // The evidence stays: promoted before the rewrite, answered as such.
    let again = run(&ctx, &format!("PROMOTE UPLOAD '{}'", ids[0]))
        .await
        .unwrap();
    assert_eq!(value(&again, "state"), "promoted");
    for id in &ids {
        assert_eq!(
            landed(&warehouse, id).await,
            ("3".to_string(), "1".to_string())
        );
    }

    // Once the snapshots before the rewrite expire, the small files go:
    // the six promoted ones lay under the staging folder.
    let small = parquet_files(warehouse.path(), &["/staging/", "/s/t/"]);
    assert_eq!(small.len(), 7, "{small:?}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    run(&ctx, "EXPIRE SNAPSHOTS s.t WITH (older_than = '10ms')")
        .await
        .unwrap();
    let left = parquet_files(warehouse.path(), &["/staging/", "/s/t/"]);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(rows_and_sum(&ctx, "s.t").await, before);

    // A later promotion lands on top; one file alone is not rewritten.
    let late = target_with_upload(&warehouse, 2).await;
    run(&ctx, &format!("PROMOTE UPLOAD '{late}'"))
        .await
        .unwrap();
    assert_eq!(rows_and_sum(&ctx, "s.t").await, "20 rows, sum 19");
    let packed = run(&ctx, "REWRITE DATA FILES s.t").await.unwrap();
    assert_eq!(value(&packed, "data_files_after"), "1");
    let nothing = run(&ctx, "REWRITE DATA FILES s.t").await.unwrap();
    assert_eq!(value(&nothing, "snapshot_id"), "");
    assert!(
        value(&nothing, "message").contains("nothing to rewrite"),
        "{}",
        value(&nothing, "message")
    );
    assert_eq!(rows_and_sum(&ctx, "s.t").await, "20 rows, sum 19");
}

/// `where` rewrites only the partitions (files) it may match;
/// `min_input_files` leaves partitions with fewer small files; bad options
/// are refused by name, with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewriting_data_files_takes_a_predicate_and_refuses_bad_options() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.p (id BIGINT NOT NULL, day VARCHAR NOT NULL) PARTITIONED BY (day)",
        ],
    )
    .await;
    for n in 0..3 {
        run(
            &ctx,
            &format!("INSERT INTO s.p VALUES ({n}, 'a'), ({}, 'b')", n + 10),
        )
        .await
        .unwrap();
    }
    let before = rows_and_sum(&ctx, "s.p").await;

    for (with, expected) in [
        ("target_file_size = 'huge'", "'huge' is not a size"),
        ("colour = 'red'", "has no option 'colour'"),
        ("min_input_files = 1", "min_input_files = '1'"),
        ("where = 'nosuch > 1'", "where = 'nosuch > 1'"),
    ] {
        let error = refusal(&ctx, &format!("REWRITE DATA FILES s.p WITH ({with})")).await;
        assert!(error.contains(expected), "{with}: {error}");
    }
    let untouched = run(&ctx, "REWRITE DATA FILES s.p WITH (min_input_files = 4)")
        .await
        .unwrap();
    assert_eq!(value(&untouched, "files_rewritten"), "0");

    let one_day = run(&ctx, "REWRITE DATA FILES s.p WITH (where = 'day = ''a''')")
        .await
        .unwrap();
    assert_eq!(
        [
            value(&one_day, "data_files_before"),
            value(&one_day, "files_rewritten"),
            value(&one_day, "partitions_rewritten"),
            value(&one_day, "data_files_after"),
        ],
        ["6", "3", "1", "4"].map(String::from),
        "{}",
        value(&one_day, "message")
    );
    assert_eq!(rows_and_sum(&ctx, "s.p").await, before);
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM s.p WHERE day = 'a'").await,
        "3"
    );
    let rest = run(&ctx, "REWRITE DATA FILES s.p").await.unwrap();
    assert_eq!(value(&rest, "files_rewritten"), "3");
    assert_eq!(value(&rest, "data_files_after"), "2");
    assert_eq!(rows_and_sum(&ctx, "s.p").await, before);
}

/// Promotions that commit while the target's files are rewritten are
/// neither lost nor doubled: the rewrite is put on top of them, and every
/// upload still lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotions_during_a_data_rewrite_land_once() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    for _ in 0..4 {
        let id = target_with_upload(&warehouse, 3).await;
        run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    }
    let mut pending = vec![];
    for _ in 0..10 {
        pending.push(target_with_upload(&warehouse, 3).await);
    }
    let promoter = {
        let ids = pending.clone();
        let ctx = warehouse.session().await;
        tokio::spawn(async move {
            for id in ids {
                run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
            }
        })
    };
    let mut packed = 0;
    while !promoter.is_finished() || packed == 0 {
        match run(&ctx, "REWRITE DATA FILES s.t").await {
            Ok(batches) if value(&batches, "snapshot_id").is_empty() => {}
            Ok(_) => packed += 1,
            Err(e) => assert!(
                e.to_string().contains("run REWRITE DATA FILES again"),
                "{e}"
            ),
        }
        if packed > 0 && promoter.is_finished() {
            break;
        }
    }
    promoter.await.unwrap();
    assert!(packed >= 1);
    assert_eq!(rows_and_sum(&ctx, "s.t").await, "42 rows, sum 42");
    for id in &pending {
        assert_eq!(
            landed(&warehouse, id).await,
            ("3".to_string(), "1".to_string())
        );
    }
}

/// A table that sets `icestage.rewrite-data-files.after-commits` gets its
/// small files rewritten in the background after that many appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_property_rewrites_small_files_after_appends() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE s.a (id BIGINT NOT NULL) \
         TBLPROPERTIES ('icestage.rewrite-data-files.after-commits' = '4')",
    )
    .await
    .unwrap();
    for n in 0..5 {
        run(&ctx, &format!("INSERT INTO s.a VALUES ({n})"))
            .await
            .unwrap();
    }
    let mut replaced = String::new();
    for _ in 0..100 {
        replaced = scalar(
            &ctx,
            "SELECT count(*) FROM s.a$snapshots WHERE operation = 'replace'",
        )
        .await;
        if replaced != "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(replaced, "1");
    assert_eq!(rows_and_sum(&ctx, "s.a").await, "5 rows, sum 10");
}

/// Sets a file's last-written time `ago` in the past.
fn age(path: &Path, ago: Duration) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - ago)
        .unwrap();
}

/// `REMOVE ORPHAN FILES` deletes exactly the old unreferenced files under
/// the table's location: not a referenced one however old (the files an
/// older snapshot still reads included), not a fresh orphan, not a file
/// outside the location, not a file of a table whose folder name starts
/// with the same letters. A dry run deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_orphans_deletes_exactly_the_old_unreferenced_files() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    for _ in 0..3 {
        let id = target_with_upload(&warehouse, 3).await;
        run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    }
    // Files in the table's own folder that, once rewritten, only older
    // snapshots read.
    for n in 0..2 {
        run(
            &ctx,
            &format!("INSERT INTO s.t VALUES ({}, 'direct')", 100 + n),
        )
        .await
        .unwrap();
    }
    run(&ctx, "CREATE TABLE s.tt (id BIGINT)").await.unwrap();
    run(&ctx, "INSERT INTO s.tt VALUES (1)").await.unwrap();
    // The snapshots before this one keep reading the small files.
    run(&ctx, "REWRITE DATA FILES s.t").await.unwrap();
    let before = rows_and_sum(&ctx, "s.t").await;

    let root = warehouse.path().canonicalize().unwrap();
    let table = root.join("s").join("t");
    let week = Duration::from_secs(7 * 86_400);
    for file in files_under(&root) {
        age(&file, week);
    }
    let plant = |path: PathBuf, ago: Duration| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"orphan").unwrap();
        age(&path, ago);
        path
    };
    let orphans = [
        plant(table.join("data").join("killed-copy-00001.parquet"), week),
        plant(table.join("metadata").join("cut-short-m0.avro"), week),
        plant(table.join("data").join("day=x").join("lost.parquet"), week),
    ];
    let fresh = plant(table.join("data").join("in-flight.parquet"), Duration::ZERO);
    let outside = plant(root.join("s").join("elsewhere.parquet"), week);
    let neighbour = plant(
        root.join("s").join("tt").join("data").join("stray.parquet"),
        week,
    );
    let referenced = files_under(&table).len() - orphans.len() - 1;

    let refused = refusal(&ctx, "REMOVE ORPHAN FILES s.t WITH (older_than = '10m')").await;
    assert!(refused.contains("shorter than an hour"), "{refused}");

    let dry = run(&ctx, "REMOVE ORPHAN FILES s.t WITH (dry_run = true)")
        .await
        .unwrap();
    assert_eq!(
        [
            value(&dry, "orphans_found"),
            value(&dry, "orphans_deleted"),
            value(&dry, "files_too_recent"),
            value(&dry, "files_referenced"),
        ],
        [
            "3".to_string(),
            "0".to_string(),
            "1".to_string(),
            referenced.to_string()
        ],
        "{}",
        value(&dry, "message")
    );
    assert!(orphans.iter().all(|o| o.exists()));

    let swept = run(&ctx, "REMOVE ORPHAN FILES s.t").await.unwrap();
    assert_eq!(
        value(&swept, "orphans_deleted"),
        "3",
        "{}",
        value(&swept, "message")
    );
    assert!(orphans.iter().all(|o| !o.exists()));
    for kept in [&fresh, &outside, &neighbour] {
        assert!(kept.exists(), "{} was deleted", kept.display());
    }
    assert_eq!(files_under(&table).len(), referenced + 1);
    assert_eq!(rows_and_sum(&ctx, "s.t").await, before);
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.tt").await, "1");
    // The inserted files only older snapshots read are still there.
    let direct = parquet_files(&table, &["/data/"]);
    assert_eq!(
        direct.len(),
        4,
        "two inserted, one packed, the fresh orphan: {direct:?}"
    );
    let pyiceberg: serde_json::Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &["read-table", &warehouse.connection(), "s.t"],
    ))
    .unwrap();
    assert_eq!(pyiceberg["rows"], 11);
    let again = run(&ctx, "REMOVE ORPHAN FILES s.t").await.unwrap();
    assert_eq!(value(&again, "orphans_found"), "0");
}
