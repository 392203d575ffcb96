//! Prefix ingestion: `read_s3_prefix`, `infer_s3_schema`, `list_s3`,
//! `cross_account_setup` and `COPY INTO`, on local folders and on moto's S3.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use tempfile::TempDir;

use crate::aws::Moto;
use crate::common::{Warehouse, python_script, run, scalar, shell_csv, stdout_of_success, value};

/// The fixtures of `tests/python/ingest_fixtures.py`, plus Snappy and Avro
/// files written here.
fn fixtures() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    python_script(
        "ingest_fixtures.py",
        &["write", dir.path().to_str().unwrap()],
    );
    let csv = std::fs::read(dir.path().join("csv/events-1.csv")).unwrap();
    let mut framed = vec![];
    snap::write::FrameEncoder::new(&mut framed)
        .write_all(&csv)
        .unwrap();
    std::fs::write(dir.path().join("compressed/events.csv.snappy"), framed).unwrap();
    // Hadoop's block format: uncompressed length, then length-prefixed chunks.
    let chunk = snap::raw::Encoder::new().compress_vec(&csv).unwrap();
    let mut hadoop = (csv.len() as u32).to_be_bytes().to_vec();
    hadoop.extend((chunk.len() as u32).to_be_bytes());
    hadoop.extend(chunk);
    std::fs::create_dir_all(dir.path().join("hadoop")).unwrap();
    std::fs::write(dir.path().join("hadoop/part-00000.csv.snappy"), hadoop).unwrap();
    write_avro(&dir.path().join("avro/events.avro"));
    dir
}

fn write_avro(path: &Path) {
    use apache_avro::types::Record;
    let schema = apache_avro::Schema::parse_str(
        r#"{"type": "record", "name": "event", "fields": [
            {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}"#,
    )
    .unwrap();
    let mut writer = apache_avro::Writer::new(&schema, Vec::new());
    for (id, name) in [(1i64, "alpha"), (2, "beta"), (3, "gamma")] {
        let mut record = Record::new(writer.schema()).unwrap();
        record.put("id", id);
        record.put("name", name);
        writer.append(record).unwrap();
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, writer.into_inner().unwrap()).unwrap();
}

fn uri(dir: &TempDir, folder: &str) -> String {
    format!("file://{}/{folder}/", dir.path().display())
}

async fn error(ctx: &SessionContext, sql: &str) -> String {
    run(ctx, sql).await.expect_err(sql).user_message()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ambiguous_prefix_guard_refuses_to_guess() {
    let files = fixtures();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let csv = uri(&files, "csv");
    assert_eq!(
        error(&ctx, &format!("SELECT * FROM read_s3_prefix('{csv}')")).await,
        format!(
            "prefix '{csv}' holds 2 candidate files (events-1.csv, events-2.csv): pin files => \
             '<key>[,<key>...]' or set all_files => true"
        )
    );
    let pinned = format!("SELECT sum(id) FROM read_s3_prefix('{csv}', files => 'events-2.csv')");
    assert_eq!(scalar(&ctx, &pinned).await, "15");
    let pinned_array = format!(
        "SELECT count(*) FROM read_s3_prefix('{csv}', files => ['events-1.csv', 'events-2.csv'])"
    );
    assert_eq!(scalar(&ctx, &pinned_array).await, "6");
    let all = format!("SELECT count(*) FROM read_s3_prefix('{csv}', all_files => true)");
    assert_eq!(scalar(&ctx, &all).await, "6");
    assert!(
        error(
            &ctx,
            &format!("SELECT * FROM read_s3_prefix('{csv}', files => 'events-3.csv')")
        )
        .await
        .starts_with("pinned file 'events-3.csv' is not under")
    );
    let mixed = uri(&files, "mixed");
    assert!(
        error(
            &ctx,
            &format!("SELECT * FROM read_s3_prefix('{mixed}', all_files => true)")
        )
        .await
        .contains("do not name one format (a.csv (csv), b.ndjson (json))")
    );
    let empty = uri(&files, "empty");
    assert!(
        error(&ctx, &format!("SELECT * FROM read_s3_prefix('{empty}')"))
            .await
            .contains("holds no files (only markers or empty files)")
    );
    // Named options reach the function: a wrong format fails rather than being ignored.
    let wrong = format!(
        "SELECT * FROM read_s3_prefix('{csv}', files => 'events-1.csv', format => 'parquet')"
    );
    assert!(
        error(&ctx, &wrong)
            .await
            .contains("cannot infer a schema from the parquet files")
    );
    assert!(
        error(
            &ctx,
            &format!("SELECT * FROM read_s3_prefix('{csv}', fromat => 'csv')")
        )
        .await
        .starts_with(
            "read_s3_prefix has no option 'fromat': valid options are format, files, all_files"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_and_compressions_read_the_same_rows() {
    let files = fixtures();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let compressed = uri(&files, "compressed");
    for name in [
        "events.csv.gz",
        "events.csv.bz2",
        "events.csv.xz",
        "events.csv.zst",
        "events.csv.snappy",
        "events.ndjson.gz",
    ] {
        let sql = format!(
            "SELECT count(*) || ':' || sum(id) FROM read_s3_prefix('{compressed}', files => '{name}')"
        );
        assert_eq!(scalar(&ctx, &sql).await, "3:6", "{name}");
    }
    let hadoop = format!(
        "SELECT sum(id) FROM read_s3_prefix('{}')",
        uri(&files, "hadoop")
    );
    assert_eq!(scalar(&ctx, &hadoop).await, "6");
    let json = format!(
        "SELECT name FROM read_s3_prefix('{}') WHERE id = 2",
        uri(&files, "json")
    );
    assert_eq!(scalar(&ctx, &json).await, "beta");
    let avro = format!(
        "SELECT name FROM read_s3_prefix('{}') WHERE id = 3",
        uri(&files, "avro")
    );
    assert_eq!(scalar(&ctx, &avro).await, "gamma");
    let parquet = format!(
        "SELECT count(*) FROM read_s3_prefix('{}')",
        uri(&files, "parquet")
    );
    assert_eq!(scalar(&ctx, &parquet).await, "300000");
    // A given schema instead of inference.
    let typed = format!(
        "SELECT arrow_typeof(id) FROM read_s3_prefix('{}', files => 'events-1.csv', \
         schema => 'id INT, name VARCHAR, amount DOUBLE, day DATE') LIMIT 1",
        uri(&files, "csv")
    );
    assert_eq!(scalar(&ctx, &typed).await, "Int32");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_are_inferred_cheaply_and_in_the_shared_vocabulary() {
    let files = fixtures();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let csv = run(
        &ctx,
        &format!(
            "SELECT column_name, type FROM infer_s3_schema('{}', files => 'events-1.csv')",
            uri(&files, "csv")
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        pretty_format_batches(&csv).unwrap().to_string(),
        "+-------------+---------+\n\
         | column_name | type    |\n\
         +-------------+---------+\n\
         | id          | integer |\n\
         | name        | string  |\n\
         | amount      | float   |\n\
         | day         | date    |\n\
         +-------------+---------+"
    );
    // Parquet's schema comes from the footer, read with range requests.
    let parquet = run(
        &ctx,
        &format!(
            "SELECT * FROM infer_s3_schema('{}')",
            uri(&files, "parquet")
        ),
    )
    .await
    .unwrap();
    let read: f64 = value(&parquet, "bytes_read").parse().unwrap();
    let total: f64 = value(&parquet, "total_bytes").parse().unwrap();
    assert!(total > 10_000_000.0, "{total}");
    assert!(
        read / total < 0.05,
        "read {read} of {total} bytes to infer the schema"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_loads_nothing_leaves_no_table_behind() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let source = tempfile::tempdir().unwrap();
    std::fs::write(source.path().join("a.csv"), "id,name\n1,a\n").unwrap();
    std::fs::write(source.path().join("b.csv"), "id,name\nnot-a-number,b\n").unwrap();
    let from = format!("file://{}/", source.path().display());
    let copy = format!("COPY INTO raw.broken FROM '{from}' WITH (all_files = true)");
    let failed = error(&ctx, &copy).await;
    assert!(failed.contains("b.csv"), "{failed}");
    let gone = error(&ctx, "SELECT count(*) FROM raw.broken").await;
    assert!(
        gone.contains("raw.broken") || gone.contains("broken"),
        "{gone}"
    );
    // Once the file is mended, the same statement creates and loads it.
    std::fs::write(source.path().join("b.csv"), "id,name\n2,b\n").unwrap();
    let loaded = run(&ctx, &copy).await.unwrap();
    assert_eq!(value(&loaded, "table_created"), "true");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.broken").await, "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_into_loads_each_file_once() {
    let files = fixtures();
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let source = tempfile::tempdir().unwrap();
    std::fs::copy(
        files.path().join("csv/events-1.csv"),
        source.path().join("events-1.csv"),
    )
    .unwrap();
    let from = format!("file://{}/", source.path().display());
    let copy = format!("COPY INTO raw.events FROM '{from}' WITH (all_files = true)");

    let first = run(&ctx, &copy).await.unwrap();
    assert_eq!(value(&first, "table_created"), "true");
    assert_eq!(value(&first, "files_loaded"), "1");
    std::fs::copy(
        files.path().join("csv/events-2.csv"),
        source.path().join("events-2.csv"),
    )
    .unwrap();
    let second = run(&ctx, &copy).await.unwrap();
    assert_eq!(
        (
            value(&second, "files_loaded"),
            value(&second, "files_skipped")
        ),
        ("1".into(), "1".into())
    );
    let third = run(&ctx, &copy).await.unwrap();
    assert_eq!(value(&third, "files_loaded"), "0");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.events").await, "6");

    // A file changed in place is reported, not loaded twice, unless forced.
    let mut changed = std::fs::OpenOptions::new()
        .append(true)
        .open(source.path().join("events-1.csv"))
        .unwrap();
    writeln!(changed, "7,delta,1.0,2026-07-04").unwrap();
    drop(changed);
    let fourth = run(&ctx, &copy).await.unwrap();
    assert_eq!(value(&fourth, "files_changed"), "1");
    assert!(value(&fourth, "message").contains("use WITH (force = true) to reload"));
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM raw.events").await, "6");
    let forced = run(
        &ctx,
        &format!("COPY INTO raw.events FROM '{from}' WITH (all_files = true, force = true)"),
    )
    .await
    .unwrap();
    assert_eq!(value(&forced, "rows"), "7");
    // Another session reads the same file log from the catalog.
    let other = warehouse.session().await;
    let fifth = run(&other, &copy).await.unwrap();
    assert_eq!(value(&fifth, "files_loaded"), "0");
    assert_eq!(
        scalar(&other, "SELECT count(*) FROM raw.events").await,
        "13"
    );

    // The guard applies to COPY INTO as well.
    let guarded = error(&ctx, &format!("COPY INTO raw.events FROM '{from}'")).await;
    assert!(
        guarded.contains("holds 2 candidate files (events-1.csv, events-2.csv)"),
        "{guarded}"
    );
    // CREATE TABLE ... AS SELECT works on the function too.
    let ctas = format!(
        "CREATE TABLE raw.copy AS SELECT * FROM read_s3_prefix('{}', files => 'events-1.csv')",
        uri(&files, "csv")
    );
    run(&ctx, &ctas).await.unwrap();
    assert_eq!(scalar(&ctx, "SELECT sum(id) FROM raw.copy").await, "6");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_prefixes_with_explicit_keys_and_an_assumed_role() {
    let moto = Moto::start();
    let files = fixtures();
    python_script(
        "ingest_fixtures.py",
        &[
            "upload",
            &moto.endpoint,
            "landing",
            files.path().to_str().unwrap(),
        ],
    );
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let keys = format!(
        "endpoint => '{}', access_key_id => 'AKIAREADER', secret_access_key => 'reader-secret'",
        moto.endpoint
    );
    let read = format!(
        "SELECT count(*) FROM read_s3_prefix('s3a://landing/csv/', all_files => true, {keys})"
    );
    assert_eq!(scalar(&ctx, &read).await, "6");
    // The reader's own keys assume the data owner's role (with its external id).
    let role = format!(
        "SELECT sum(id) FROM read_s3_prefix('s3://landing/compressed/', files => 'events.csv.gz', {keys}, \
         role_arn => 'arn:aws:iam::123456789012:role/data-owner-reader', external_id => 'icestage-7f3a')"
    );
    assert_eq!(scalar(&ctx, &role).await, "6");

    // Browsing before configuring.
    let buckets = run(
        &ctx,
        &format!("SELECT kind, uri FROM list_s3('s3://', {keys})"),
    )
    .await
    .unwrap();
    assert_eq!(value(&buckets, "uri"), "s3://landing/");
    let top = run(
        &ctx,
        &format!("SELECT kind, uri FROM list_s3('s3://landing/', {keys}) ORDER BY uri"),
    )
    .await
    .unwrap();
    let listed = pretty_format_batches(&top).unwrap().to_string();
    assert!(listed.contains("| prefix | s3://landing/csv/ "), "{listed}");
    let inside = run(
        &ctx,
        &format!("SELECT kind, uri, size FROM list_s3('s3://landing/csv/', {keys}) ORDER BY uri"),
    )
    .await
    .unwrap();
    assert_eq!(value(&inside, "uri"), "s3://landing/csv/_SUCCESS");
    let missing = error(
        &ctx,
        &format!("SELECT * FROM read_s3_prefix('s3://nowhere/in/', {keys})"),
    )
    .await;
    assert!(
        missing.starts_with(
            "bucket 'nowhere' does not exist or is not visible to access key AKIAREADER"
        ),
        "{missing}"
    );

    // COPY INTO from S3, then the Parquet footer read over HTTP ranges.
    let copy = format!(
        "COPY INTO raw.landing FROM 's3://landing/json/' WITH (endpoint = '{}', access_key_id = 'AKIAREADER', \
         secret_access_key = 'reader-secret')",
        moto.endpoint
    );
    let copied = run(&ctx, &copy).await.unwrap();
    assert_eq!(value(&copied, "rows"), "3");
    let explained = run(&ctx, &format!("EXPLAIN {copy}")).await.unwrap();
    let explained = pretty_format_batches(&explained).unwrap().to_string();
    assert!(
        explained.contains("secret_access_key=***") && !explained.contains("reader-secret"),
        "{explained}"
    );
    let parquet = run(
        &ctx,
        &format!("SELECT * FROM infer_s3_schema('s3://landing/parquet/', {keys})"),
    )
    .await
    .unwrap();
    let read: f64 = value(&parquet, "bytes_read").parse().unwrap();
    let total: f64 = value(&parquet, "total_bytes").parse().unwrap();
    assert!(read / total < 0.05, "read {read} of {total} bytes over S3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_account_setup_prints_the_owners_policies() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let rows = run(
        &ctx,
        "SELECT document, json FROM cross_account_setup('s3://owner-data/exports/', \
         reader_account => '111122223333', external_id => 'icestage-7f3a', owner_account => '444455556666')",
    )
    .await
    .unwrap();
    let text = pretty_format_batches(&rows).unwrap().to_string();
    for expected in [
        "\"AWS\": \"arn:aws:iam::111122223333:root\"",
        "\"sts:ExternalId\": \"icestage-7f3a\"",
        "\"Resource\": \"arn:aws:s3:::owner-data/exports/*\"",
        "\"AWS\": \"arn:aws:iam::444455556666:role/icestage-reader\"",
        "\"role_arn\": \"arn:aws:iam::444455556666:role/icestage-reader\"",
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
    let bad = error(
        &ctx,
        "SELECT * FROM cross_account_setup('s3://b/p/', reader_account => '12', external_id => 'x')",
    )
    .await;
    assert_eq!(
        bad,
        "reader_account '12' is not an AWS account id: it is 12 digits"
    );
}

#[test]
fn no_progress_is_printed_when_stderr_is_not_a_terminal() {
    let files = fixtures();
    let warehouse = Warehouse::new();
    let output = shell_csv("--warehouse", warehouse.path())
        .arg("-c")
        .arg(format!(
            "COPY INTO raw.events FROM '{}' WITH (all_files = true)",
            uri(&files, "csv")
        ))
        .output()
        .unwrap();
    stdout_of_success(&output);
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
}

#[test]
fn a_terminal_sees_a_progress_bar_of_files_and_bytes() {
    let files = fixtures();
    let warehouse = Warehouse::new();
    // `script` runs the shell on a pseudo-terminal and copies what it draws.
    let command = format!(
        "{} --warehouse {} -q --format csv -c \"COPY INTO raw.big FROM '{}'\"",
        env!("CARGO_BIN_EXE_icestage"),
        warehouse.path().display(),
        uri(&files, "parquet")
    );
    let output = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("util-linux script, to run the shell on a terminal");
    let drawn = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{drawn}");
    assert!(drawn.contains("1/1 files"), "{drawn}");
    assert!(drawn.contains("MiB/16"), "{drawn}");
}

/// Parquet sources are read through the page guard: files written with
/// every codec and both data page versions read as written, and a page
/// whose GZIP stream inflates about a thousand times past its header is
/// refused before it is decoded, by `read_s3_prefix` and `COPY INTO` alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_pages_are_checked_before_they_are_decoded() {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let ids: Vec<i64> = (1..=5000).collect();
    let names: Vec<Option<String>> = ids
        .iter()
        .map(|i| (i % 3 != 0).then(|| format!("n{}", i % 17)))
        .collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(names)),
        ],
    )
    .unwrap();
    let codecs = [
        Compression::GZIP(Default::default()),
        Compression::BROTLI(Default::default()),
        Compression::LZ4,
        Compression::LZ4_RAW,
        Compression::ZSTD(Default::default()),
        Compression::SNAPPY,
        Compression::UNCOMPRESSED,
    ];
    let good = dir.path().join("good");
    std::fs::create_dir_all(&good).unwrap();
    for (index, codec) in codecs.iter().enumerate() {
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let properties = WriterProperties::builder()
                .set_compression(*codec)
                .set_writer_version(version)
                .set_data_page_row_count_limit(1000)
                .build();
            let file =
                std::fs::File::create(good.join(format!("{index}-{version:?}.parquet"))).unwrap();
            let mut writer =
                ArrowWriter::try_new(file, Arc::clone(&schema), Some(properties)).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
        }
    }
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let good = format!("file://{}/", good.display());
    assert_eq!(
        scalar(
            &ctx,
            &format!(
                "SELECT count(*) || ':' || sum(id) || ':' || count(name) \
                 FROM read_s3_prefix('{good}', all_files => true)"
            )
        )
        .await,
        format!("{}:{}:{}", 14 * 5000, 14 * 12_502_500, 14 * 3334)
    );

    let bomb = dir.path().join("bomb");
    std::fs::create_dir_all(&bomb).unwrap();
    let file = bomb.join("events.parquet");
    python_script(
        "hostile_client.py",
        &["page-bomb-file", file.to_str().unwrap()],
    );
    let bomb = format!("file://{}/", bomb.display());
    for sql in [
        format!("SELECT sum(amount) FROM read_s3_prefix('{bomb}')"),
        format!("COPY INTO raw.bombed FROM '{bomb}'"),
    ] {
        let message = error(&ctx, &sql).await;
        assert!(
            message.contains("column 'amount': the page at byte")
                && message.contains("inflates past the")
                && message.contains("(GZIP)"),
            "{sql}: {message}"
        );
    }
    assert!(
        run(&ctx, "SELECT * FROM raw.bombed").await.is_err(),
        "a refused COPY INTO created its table"
    );
}
