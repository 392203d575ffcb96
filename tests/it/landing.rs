//! Landing folders as they really are: columns in any order, new columns,
//! malformed rows, several feeds in one folder, partition values in the
//! path. `COPY INTO`'s `match_by_column_name`, `schema_evolution`,
//! `on_error = 'continue'` with `copy_rejects`, `validation_mode`,
//! `pattern`, `hive_partitioning`, `include_metadata` and `purge`, on local
//! folders and on moto's S3, and a pipe through a drifting feed.

use std::path::Path;

use datafusion::arrow::util::display::array_value_to_string;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;

use crate::aws::Moto;
use crate::common::{Warehouse, files_under, python_script, run, scalar, value};

async fn error(ctx: &SessionContext, sql: &str) -> String {
    run(ctx, sql).await.expect_err(sql).user_message()
}

async fn table(ctx: &SessionContext, sql: &str) -> String {
    pretty_format_batches(&run(ctx, sql).await.unwrap())
        .unwrap()
        .to_string()
}

/// The rows of `sql`'s result, each as its values joined by `|` (NULL
/// as nothing).
async fn rows(ctx: &SessionContext, sql: &str) -> Vec<String> {
    let batches = run(ctx, sql).await.unwrap();
    let mut rows = vec![];
    for batch in &batches {
        for row in 0..batch.num_rows() {
            let values: Vec<String> = batch
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, row).unwrap())
                .collect();
            rows.push(values.join("|"));
        }
    }
    rows
}

fn write(dir: &Path, key: &str, text: &str) {
    let path = dir.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn folder(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

/// The same three rows in three files, each with its columns in another
/// order.
fn three_orders(dir: &Path) {
    write(dir, "a.csv", "id,name,amount\n1,ann,1.5\n");
    write(dir, "b.csv", "name,amount,id\nbob,2.5,2\n");
    write(dir, "c.csv", "amount,id,name\n3.5,3,cy\n");
}

const EXPECTED_ORDERS: &str = "\
+----+------+--------+
| id | name | amount |
+----+------+--------+
| 1  | ann  | 1.5    |
| 2  | bob  | 2.5    |
| 3  | cy   | 3.5    |
+----+------+--------+";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_in_any_order_load_by_name_locally_and_on_s3() {
    let landing = tempfile::tempdir().unwrap();
    three_orders(landing.path());
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA raw").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE raw.orders (id BIGINT NOT NULL, name VARCHAR, amount DOUBLE)",
    )
    .await
    .unwrap();
    let copied = run(
        &ctx,
        &format!(
            "COPY INTO raw.orders FROM '{}' WITH (all_files = true)",
            folder(landing.path())
        ),
    )
    .await
    .unwrap();
    assert_eq!(value(&copied, "rows"), "3");
    assert_eq!(
        table(&ctx, "SELECT id, name, amount FROM raw.orders ORDER BY id").await,
        EXPECTED_ORDERS
    );
    // Read as one table, the files' columns put together by name; a file
    // without a column reads NULL there.
    write(landing.path(), "extra/f.csv", "name,id\nfay,6\n");
    assert_eq!(
        rows(
            &ctx,
            &format!(
                "SELECT id, name, amount FROM read_s3_prefix('{}', all_files => true, \
                 union_by_name => true, pattern => '[a-z]+[.]csv|extra/.*') ORDER BY id",
                folder(landing.path())
            )
        )
        .await,
        ["1|ann|1.5", "2|bob|2.5", "3|cy|3.5", "6|fay|"]
    );
    std::fs::remove_dir_all(landing.path().join("extra")).unwrap();

    // On S3 too, and names that differ in case only when asked.
    let moto = Moto::start();
    python_script(
        "ingest_fixtures.py",
        &[
            "upload",
            &moto.endpoint,
            "drift",
            landing.path().to_str().unwrap(),
        ],
    );
    let shouting = tempfile::tempdir().unwrap();
    write(shouting.path(), "d.csv", "ID,NAME,AMOUNT\n4,dee,4.5\n");
    python_script(
        "ingest_fixtures.py",
        &[
            "upload",
            &moto.endpoint,
            "shouting",
            shouting.path().to_str().unwrap(),
        ],
    );
    let keys = format!(
        "endpoint = '{}', access_key_id = 'AKIAREADER', secret_access_key = 'reader-secret'",
        moto.endpoint
    );
    run(
        &ctx,
        "CREATE TABLE raw.s3_orders (id BIGINT NOT NULL, name VARCHAR, amount DOUBLE)",
    )
    .await
    .unwrap();
    run(
        &ctx,
        &format!("COPY INTO raw.s3_orders FROM 's3://drift/' WITH (all_files = true, {keys})"),
    )
    .await
    .unwrap();
    assert_eq!(
        table(
            &ctx,
            "SELECT id, name, amount FROM raw.s3_orders ORDER BY id"
        )
        .await,
        EXPECTED_ORDERS
    );
    let by_case = error(
        &ctx,
        &format!("COPY INTO raw.s3_orders FROM 's3://shouting/' WITH ({keys})"),
    )
    .await;
    assert!(
        by_case
            .contains("s3://shouting/d.csv: the file has no column id that raw.s3_orders requires")
            && by_case.contains("match_by_column_name = 'case_insensitive'"),
        "{by_case}"
    );
    run(
        &ctx,
        &format!(
            "COPY INTO raw.s3_orders FROM 's3://shouting/' WITH (match_by_column_name = \
             'case_insensitive', {keys})"
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        scalar(&ctx, "SELECT name FROM raw.s3_orders WHERE id = 4").await,
        "dee"
    );

    // Without a header, columns go by position.
    let headless = tempfile::tempdir().unwrap();
    write(headless.path(), "e.csv", "5,eve,5.5\n");
    run(
        &ctx,
        &format!(
            "COPY INTO raw.orders FROM '{}' WITH (header = false)",
            folder(headless.path())
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        scalar(
            &ctx,
            "SELECT name || ':' || CAST(amount AS VARCHAR) FROM raw.orders WHERE id = 5"
        )
        .await,
        "eve:5.5"
    );
    let typo = error(
        &ctx,
        &format!(
            "COPY INTO raw.orders FROM '{}' WITH (match_by_column_name = 'by_name')",
            folder(headless.path())
        ),
    )
    .await;
    assert!(
        typo.contains("match_by_column_name = 'by_name' is not a choice: use 'case_sensitive'"),
        "{typo}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_column_fails_is_added_or_is_rescued() {
    let first = tempfile::tempdir().unwrap();
    write(first.path(), "day-1.csv", "id,name\n1,ann\n2,bob\n");
    let later = tempfile::tempdir().unwrap();
    write(
        later.path(),
        "day-2.csv",
        "id,name,region\n3,cy,eu\n4,dee,us\n",
    );
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    for target in ["raw.failing", "raw.adding", "raw.rescuing"] {
        run(
            &ctx,
            &format!("COPY INTO {target} FROM '{}'", folder(first.path())),
        )
        .await
        .unwrap();
    }
    let later_uri = folder(later.path());

    let failed = error(&ctx, &format!("COPY INTO raw.failing FROM '{later_uri}'")).await;
    assert!(
        failed.contains(
            "day-2.csv: the file has column(s) region that raw.failing lacks: set \
                         schema_evolution = 'add_columns'"
        ),
        "{failed}"
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.failing").await, "2");

    let added = run(
        &ctx,
        &format!("COPY INTO raw.adding FROM '{later_uri}' WITH (schema_evolution = 'add_columns')"),
    )
    .await
    .unwrap();
    assert_eq!(value(&added, "rows"), "2");
    assert_eq!(
        rows(&ctx, "SELECT id, region FROM raw.adding ORDER BY id").await,
        ["1|", "2|", "3|eu", "4|us"]
    );
    // One commit: the snapshot that holds the rows is the first on the
    // new schema, and PyIceberg reads the new column.
    assert_eq!(
        scalar(
            &ctx,
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'adding' \
             AND column_name = 'region' AND is_nullable = 'YES'"
        )
        .await,
        "1"
    );
    let read = python_script(
        "pyiceberg_client.py",
        &["read-table", &warehouse.connection(), "raw.adding"],
    );
    let read: serde_json::Value = serde_json::from_str(read.trim()).unwrap();
    assert_eq!(
        read["columns"],
        serde_json::json!(["id", "name", "region"]),
        "{read}"
    );
    assert_eq!(read["rows"], 4, "{read}");

    let rescued = run(
        &ctx,
        &format!("COPY INTO raw.rescuing FROM '{later_uri}' WITH (schema_evolution = 'rescue')"),
    )
    .await
    .unwrap();
    assert_eq!(value(&rescued, "rows"), "2");
    assert_eq!(
        rows(
            &ctx,
            "SELECT id, _rescued_data FROM raw.rescuing ORDER BY id"
        )
        .await,
        ["1|", "2|", "3|{\"region\":\"eu\"}", "4|{\"region\":\"us\"}"]
    );
    // A table whose _rescued_data is not text cannot rescue.
    run(
        &ctx,
        "CREATE TABLE raw.odd (id BIGINT, _rescued_data BIGINT)",
    )
    .await
    .unwrap();
    let wrong = error(
        &ctx,
        &format!("COPY INTO raw.odd FROM '{later_uri}' WITH (schema_evolution = 'rescue')"),
    )
    .await;
    assert!(
        wrong.contains("but raw.odd has a _rescued_data of type long: rename that column"),
        "{wrong}"
    );
    // A value that does not parse as its column's type is rescued too.
    let odd = tempfile::tempdir().unwrap();
    write(odd.path(), "day-3.csv", "id,name\n5,eve\nsix,fay\n");
    let odd_copy = run(
        &ctx,
        &format!(
            "COPY INTO raw.rescuing FROM '{}' WITH (schema_evolution = 'rescue', on_error = 'continue')",
            folder(odd.path())
        ),
    )
    .await
    .unwrap();
    // `id` is NOT NULL in no table made by COPY INTO: the row lands with
    // its id rescued.
    assert_eq!(
        value(&odd_copy, "rows"),
        "2",
        "{}",
        pretty_format_batches(&odd_copy).unwrap()
    );
    assert_eq!(
        scalar(
            &ctx,
            "SELECT _rescued_data FROM raw.rescuing WHERE name = 'fay'"
        )
        .await,
        "{\"id\":\"six\"}"
    );
}

/// A 100,000-row CSV with three malformed rows: a value that is not a
/// number (line 1001), a row with a field missing (line 50001), a NULL in
/// the required column (line 99001).
fn with_three_bad_rows(dir: &Path) {
    let mut text = String::from("id,name,amount\n");
    for row in 1..=100_000 {
        let line = row + 1;
        match line {
            1001 => text.push_str("x1000,bad-id,1.0\n"),
            50001 => text.push_str("50000,short-row\n"),
            99001 => text.push_str(",no-id,3.0\n"),
            _ => text.push_str(&format!("{row},name-{row},{}.25\n", row % 100)),
        }
    }
    write(dir, "big.csv", &text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_rows_are_rejected_alone_and_validation_commits_nothing() {
    let landing = tempfile::tempdir().unwrap();
    with_three_bad_rows(landing.path());
    let uri = folder(landing.path());
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA raw").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE raw.big (id BIGINT NOT NULL, name VARCHAR, amount DOUBLE)",
    )
    .await
    .unwrap();
    let snapshots = "SELECT count(*) FROM raw.big";

    // The default: the file fails, named, and nothing loads.
    let aborted = error(&ctx, &format!("COPY INTO raw.big FROM '{uri}'")).await;
    assert!(
        aborted.contains("big.csv") && aborted.contains("nothing was loaded"),
        "{aborted}"
    );
    assert_eq!(scalar(&ctx, snapshots).await, "0");

    // Validation reads as a load would, answers the three, commits nothing.
    let validated = run(
        &ctx,
        &format!("COPY INTO raw.big FROM '{uri}' WITH (validation_mode = 'return_errors')"),
    )
    .await
    .unwrap();
    let mut lines: Vec<i64> = validated
        .iter()
        .flat_map(|b| {
            let lines = b.column_by_name("line").unwrap();
            (0..b.num_rows())
                .map(|r| {
                    array_value_to_string(lines, r)
                        .unwrap()
                        .parse()
                        .unwrap_or(-1)
                })
                .collect::<Vec<i64>>()
        })
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [1001, 50001, 99001],
        "{}",
        pretty_format_batches(&validated).unwrap()
    );
    let shown = pretty_format_batches(&validated).unwrap().to_string();
    assert!(
        shown.contains("'x1000' is not a valid Int64")
            && shown.contains("expected 3 field(s), found 2")
            && shown.contains("NULL in the required column id")
            && shown.contains("50000,short-row"),
        "{shown}"
    );
    let first_rows = run(
        &ctx,
        &format!("COPY INTO raw.big FROM '{uri}' WITH (validation_mode = 'return_2_rows')"),
    )
    .await
    .unwrap();
    assert_eq!(first_rows.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    let preview = pretty_format_batches(&first_rows).unwrap().to_string();
    assert!(
        preview.contains(r#"{"id":1,"name":"name-1","amount":1.25}"#),
        "{preview}"
    );
    assert_eq!(scalar(&ctx, snapshots).await, "0");
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM copy_rejects('raw.big')").await,
        "0"
    );
    let typo = error(
        &ctx,
        &format!("COPY INTO raw.big FROM '{uri}' WITH (validation_mode = 'return_erors')"),
    )
    .await;
    assert!(
        typo.contains("validation_mode = 'return_erors' is not a choice: use 'return_errors'"),
        "{typo}"
    );

    // `continue`: every good row loads, the three are recorded.
    let copied = run(
        &ctx,
        &format!("COPY INTO raw.big FROM '{uri}' WITH (on_error = 'continue')"),
    )
    .await
    .unwrap();
    assert_eq!(value(&copied, "rows"), "99997");
    assert_eq!(value(&copied, "rows_rejected"), "3");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.big").await, "99997");
    assert_eq!(
        rows(
            &ctx,
            "SELECT line, \"column\", error FROM copy_rejects('raw.big') ORDER BY line"
        )
        .await,
        [
            "1001|id|'x1000' is not a valid Int64",
            "50001||expected 3 field(s), found 2",
            "99001|id|NULL in the required column id",
        ]
    );
    // Loaded once: the same file is skipped next time.
    let again = run(
        &ctx,
        &format!("COPY INTO raw.big FROM '{uri}' WITH (on_error = 'continue')"),
    )
    .await
    .unwrap();
    assert_eq!(value(&again, "files_skipped"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patterns_hive_paths_and_metadata_columns() {
    let landing = tempfile::tempdir().unwrap();
    let dir = landing.path();
    write(
        dir,
        "dt=2026-07-01/region=eu/part-0.csv",
        "id,amount\n1,10\n2,20\n",
    );
    write(
        dir,
        "dt=2026-07-02/region=us/part-0.csv",
        "id,amount\n3,30\n",
    );
    write(
        dir,
        "dt=__HIVE_DEFAULT_PARTITION__/region=eu/part-9.csv",
        "id,amount\n5,50\n",
    );
    write(dir, "other-feed/x.ndjson", "{\"other\": 1}\n");
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let uri = folder(dir);

    // Only the matching keys are candidates; the guard counts those only.
    let guarded = error(
        &ctx,
        &format!("COPY INTO raw.sales FROM '{uri}' WITH (pattern = '.*[.]csv')"),
    )
    .await;
    assert!(guarded.contains("holds 3 candidate files"), "{guarded}");
    let bad = error(
        &ctx,
        &format!("COPY INTO raw.sales FROM '{uri}' WITH (pattern = '([.csv')"),
    )
    .await;
    assert!(
        bad.starts_with("pattern = '([.csv' is not a regular expression"),
        "{bad}"
    );
    let listed = scalar(
        &ctx,
        &format!(
            "SELECT count(*) FROM read_s3_prefix('{uri}', all_files => true, pattern => 'dt=2026-07-02/.*')"
        ),
    )
    .await;
    assert_eq!(listed, "1");

    // The target partitioned by the path's columns.
    run(&ctx, "CREATE SCHEMA IF NOT EXISTS raw").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE raw.sales (id BIGINT, amount BIGINT, dt DATE, region VARCHAR, \
         _source_file VARCHAR, _source_row BIGINT, _source_modified TIMESTAMP WITH TIME ZONE) PARTITIONED BY (dt)",
    )
    .await
    .unwrap();
    let copied = run(
        &ctx,
        &format!(
            "COPY INTO raw.sales FROM '{uri}' WITH (pattern = '.*[.]csv', all_files = true, \
             hive_partitioning = true, include_metadata = true)"
        ),
    )
    .await
    .unwrap();
    assert_eq!(value(&copied, "rows"), "4");
    // `_source_row` is the line a CSV row starts on (the header is line 1).
    let lines_and_paths = [
        "1|2026-07-01|eu|2|dt=2026-07-01/region=eu/part-0.csv",
        "2|2026-07-01|eu|3|dt=2026-07-01/region=eu/part-0.csv",
        "3|2026-07-02|us|2|dt=2026-07-02/region=us/part-0.csv",
        "5||eu|2|dt=__HIVE_DEFAULT_PARTITION__/region=eu/part-9.csv",
    ];
    assert_eq!(
        rows(
            &ctx,
            "SELECT id, CAST(dt AS VARCHAR), region, _source_row, \
             regexp_replace(_source_file, '^.*/(dt=)', '${1}') \
             FROM raw.sales ORDER BY id"
        )
        .await,
        lines_and_paths
    );
    // read_s3_prefix adds the same columns with the same values.
    assert_eq!(
        rows(
            &ctx,
            &format!(
                "SELECT id, CAST(dt AS VARCHAR), region, _source_row, \
                 regexp_replace(_source_file, '^.*/(dt=)', '${{1}}') \
                 FROM read_s3_prefix('{uri}', all_files => true, pattern => '.*[.]csv', \
                 hive_partitioning => true, include_metadata => true) ORDER BY id"
            )
        )
        .await,
        lines_and_paths
    );
    assert_eq!(
        scalar(
            &ctx,
            &format!(
                "SELECT arrow_typeof(dt) || ' ' || arrow_typeof(_source_modified) \
                 FROM read_s3_prefix('{uri}', all_files => true, pattern => '.*[.]csv', \
                 hive_partitioning => true, include_metadata => true) LIMIT 1"
            )
        )
        .await,
        "Date32 Timestamp(µs, \"+00:00\")"
    );
    // A column the files hold is not shadowed by the path's.
    write(dir, "clash/dt=2026-07-03/part-0.csv", "id,dt\n7,x\n");
    let clash = error(
        &ctx,
        &format!(
            "SELECT * FROM read_s3_prefix('{}', all_files => true, hive_partitioning => true)",
            folder(&dir.join("clash"))
        ),
    )
    .await;
    assert!(
        clash.contains("the column dt is both in the files and one read_s3_prefix adds"),
        "{clash}"
    );
    assert_eq!(
        scalar(&ctx, "SELECT arrow_typeof(dt) FROM raw.sales LIMIT 1").await,
        "Date32"
    );
    assert_eq!(
        scalar(
            &ctx,
            "SELECT count(*) FROM raw.sales WHERE _source_modified IS NULL"
        )
        .await,
        "0"
    );
    // The rows landed in their partitions: data files under each day.
    let written: Vec<String> = files_under(warehouse.path())
        .iter()
        .map(|p| p.display().to_string())
        .filter(|p| p.contains("sales") && p.ends_with(".parquet"))
        .collect();
    for day in ["dt=2026-07-01", "dt=2026-07-02", "dt=null"] {
        assert!(
            written.iter().any(|p| p.contains(day)),
            "{day}: {written:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_exactly_the_files_this_copy_loaded() {
    let moto = Moto::start();
    let landing = tempfile::tempdir().unwrap();
    let dir = landing.path();
    write(dir, "a.csv", "id,name\n1,ann\n");
    write(dir, "b.csv", "id,name\n2,bob\n");
    write(dir, "c.csv", "id,name\n3,cy\n");
    write(dir, "broken.csv", "id,name\n1,2,3,4\n");
    python_script(
        "ingest_fixtures.py",
        &["upload", &moto.endpoint, "purged", dir.to_str().unwrap()],
    );
    let keys = format!(
        "endpoint = '{}', access_key_id = 'AKIAREADER', secret_access_key = 'reader-secret'",
        moto.endpoint
    );
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    // a.csv is loaded first, without purge.
    run(
        &ctx,
        &format!("COPY INTO raw.people FROM 's3://purged/' WITH (files = 'a.csv', {keys})"),
    )
    .await
    .unwrap();
    let purged = run(
        &ctx,
        &format!(
            "COPY INTO raw.people FROM 's3://purged/' WITH (all_files = true, purge = true, \
             on_error = 'skip_file', {keys})"
        ),
    )
    .await
    .unwrap();
    assert_eq!(value(&purged, "files_loaded"), "2");
    assert_eq!(value(&purged, "files_purged"), "2");
    let left = table(
        &ctx,
        &format!(
            "SELECT uri FROM list_s3('s3://purged/', {}) ORDER BY uri",
            keys.replace(" = ", " => ")
        ),
    )
    .await;
    assert!(
        left.contains("s3://purged/a.csv")
            && left.contains("s3://purged/broken.csv")
            && !left.contains("s3://purged/b.csv")
            && !left.contains("s3://purged/c.csv"),
        "{left}"
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.people").await, "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_keeps_loading_through_a_drifting_feed() {
    let landing = tempfile::tempdir().unwrap();
    let dir = landing.path();
    write(dir, "001.csv", "id,name\n1,ann\n2,bob\n");
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(
        &ctx,
        &format!(
            "CREATE PIPE feed AS COPY INTO raw.feed FROM '{}' WITH (on_error = 'continue', \
             schema_evolution = 'add_columns')",
            folder(dir)
        ),
    )
    .await
    .unwrap();
    let refused = error(
        &ctx,
        &format!(
            "CREATE PIPE strict AS COPY INTO raw.strict FROM '{}' WITH (on_error = 'abort_statement')",
            folder(dir)
        ),
    )
    .await;
    assert!(refused.contains("not 'abort_statement'"), "{refused}");
    let checking = error(
        &ctx,
        &format!(
            "CREATE PIPE checking AS COPY INTO raw.checking FROM '{}' WITH (validation_mode = 'return_errors')",
            folder(dir)
        ),
    )
    .await;
    assert!(
        checking.contains("CREATE PIPE takes no COPY INTO option 'validation_mode'"),
        "{checking}"
    );
    let loaded = |batches: &[datafusion::arrow::array::RecordBatch]| value(batches, "rows");
    assert_eq!(loaded(&run(&ctx, "RUN PIPE feed").await.unwrap()), "2");
    // Columns reordered, a new column, a malformed row.
    write(
        dir,
        "002.csv",
        "name,id,channel\ncy,3,web\ndee,four,app\neve,5,shop\n",
    );
    assert_eq!(loaded(&run(&ctx, "RUN PIPE feed").await.unwrap()), "2");
    write(dir, "003.csv", "channel,id\nmail,6\n");
    assert_eq!(loaded(&run(&ctx, "RUN PIPE feed").await.unwrap()), "1");
    assert_eq!(
        rows(&ctx, "SELECT id, name, channel FROM raw.feed ORDER BY id").await,
        ["1|ann|", "2|bob|", "3|cy|web", "5|eve|shop", "6||mail"]
    );
    assert_eq!(
        scalar(&ctx, "SELECT line FROM copy_rejects('raw.feed')").await,
        "3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rows_among_the_first_and_in_json_lines_are_rejected_alone() {
    let landing = tempfile::tempdir().unwrap();
    let dir = landing.path();
    // A row with a field too many among the rows a schema is inferred from.
    write(dir, "csv/early.csv", "id,name\n1,a\n2,b,extra\n3,c\n");
    write(
        dir,
        "json/events.ndjson",
        "{\"id\": 1, \"kind\": \"a\"}\n{\"id\": \"two\", \"kind\": \"b\"}\nnot json\n{\"id\": 4}\n",
    );
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA raw").await.unwrap();
    run(&ctx, "CREATE TABLE raw.small (id BIGINT, name VARCHAR)")
        .await
        .unwrap();
    run(&ctx, "CREATE TABLE raw.events (id BIGINT, kind VARCHAR)")
        .await
        .unwrap();
    let csv = run(
        &ctx,
        &format!(
            "COPY INTO raw.small FROM '{}' WITH (on_error = 'continue')",
            folder(&dir.join("csv"))
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (value(&csv, "rows"), value(&csv, "rows_rejected")),
        ("2".to_string(), "1".to_string())
    );
    let json = run(
        &ctx,
        &format!(
            "COPY INTO raw.events FROM '{}' WITH (on_error = 'continue')",
            folder(&dir.join("json"))
        ),
    )
    .await
    .unwrap();
    assert_eq!(value(&json, "rows"), "2");
    assert_eq!(
        rows(&ctx, "SELECT id, kind FROM raw.events ORDER BY id").await,
        ["1|a", "4|"]
    );
    let rejected = rows(
        &ctx,
        "SELECT line, \"column\", substr(error, 1, 17) FROM copy_rejects('raw.events') ORDER BY line",
    )
    .await;
    assert_eq!(
        rejected,
        ["2|id|'two' is not a va", "3||not a JSON object"],
        "{rejected:?}"
    );
    assert_eq!(
        rows(&ctx, "SELECT line, error FROM copy_rejects('raw.small')").await,
        ["3|expected 2 field(s), found 3"]
    );

    // Lines are counted as a CSV reader counts them: a quoted field may
    // span lines, blank lines hold no row.
    write(dir, "lined/a.csv", "id,name\n1,\"two\nlines\"\n\n3,c\n");
    run(
        &ctx,
        "CREATE TABLE raw.lined (id BIGINT NOT NULL, name VARCHAR)",
    )
    .await
    .unwrap();
    run(
        &ctx,
        &format!(
            "COPY INTO raw.lined FROM '{}' WITH (on_error = 'continue', include_metadata = true, \
             schema_evolution = 'add_columns')",
            folder(&dir.join("lined"))
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        rows(&ctx, "SELECT id, _source_row FROM raw.lined ORDER BY id").await,
        ["1|2", "3|5"]
    );
}
