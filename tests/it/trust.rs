//! The staging table is untrusted input. A hostile PyIceberg client that
//! holds only what CREATE UPLOAD hands out lies in the metadata it writes
//! (null counts, bounds, paths, properties, the location) or changes the
//! bytes under it; promotion must refuse, name what it found, and leave the
//! target unchanged and readable.

use datafusion::prelude::SessionContext;

use crate::common::{Upload, Warehouse, create_upload, python_script, run, scalar};

/// `s.t (id INT NOT NULL, amount INT NOT NULL)` with one row and the rule
/// `CHECK (amount > 0)`; returns an upload for it.
async fn target(ctx: &SessionContext) -> Upload {
    run(ctx, "CREATE SCHEMA s").await.unwrap();
    run(
        ctx,
        "CREATE TABLE s.t (id INT NOT NULL, amount INT NOT NULL)",
    )
    .await
    .unwrap();
    run(ctx, "INSERT INTO s.t VALUES (1, 10)").await.unwrap();
    run(
        ctx,
        "ALTER TABLE s.t ADD CONSTRAINT positive CHECK (amount > 0)",
    )
    .await
    .unwrap();
    create_upload(ctx, "s.t").await
}

fn hostile(upload: &Upload, args: &[&str]) -> String {
    let mut all = vec![
        args[0],
        upload.connection.as_str(),
        upload.staging_table.as_str(),
    ];
    all.extend(&args[1..]);
    python_script("hostile_client.py", &all)
}

async fn promote_error(ctx: &SessionContext, upload: &Upload) -> String {
    run(ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .expect_err("the promotion must be refused")
        .to_string()
}

/// The target still holds exactly its one row, and every row reads back.
async fn target_untouched(ctx: &SessionContext) {
    assert_eq!(
        scalar(ctx, "SELECT count(*) || ':' || sum(amount) FROM s.t").await,
        "1:10"
    );
    assert_eq!(
        scalar(ctx, "SELECT count(*) FROM s.t$snapshots").await,
        "1",
        "a failed promotion committed a snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_hidden_behind_a_zero_null_count_is_found_in_the_bytes() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    hostile(&upload, &["lying-nulls", "amount"]);
    let error = promote_error(&ctx, &upload).await;
    assert!(
        error.contains("column 'amount' is required but 1 staged row(s) hold NULL in it"),
        "{error}"
    );
    target_untouched(&ctx).await;
    let state = scalar(
        &ctx,
        &format!("SELECT state FROM upload_status('{}')", upload.id),
    )
    .await;
    assert_eq!(state, "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_violation_hidden_behind_false_bounds_is_found_in_the_bytes() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    hostile(&upload, &["lying-bounds", "amount", "-5", "100", "200"]);
    let error = promote_error(&ctx, &upload).await;
    assert!(
        error.contains("rule 'positive' CHECK (amount > 0) fails for 1 row(s)"),
        "{error}"
    );
    target_untouched(&ctx).await;
    let values = scalar(
        &ctx,
        &format!(
            "SELECT values FROM upload_findings('{}') WHERE rule = 'positive'",
            upload.id
        ),
    )
    .await;
    assert_eq!(values, r#"{"amount":"-5"}"#);
}

/// `s.secret`, another table holding one row (7, 700): its data file.
async fn secret_file(ctx: &SessionContext, warehouse: &Warehouse) -> std::path::PathBuf {
    run(
        ctx,
        "CREATE TABLE s.secret (id INT NOT NULL, amount INT NOT NULL)",
    )
    .await
    .unwrap();
    run(ctx, "INSERT INTO s.secret VALUES (7, 700)")
        .await
        .unwrap();
    let data = warehouse.path().join("s").join("secret").join("data");
    std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "parquet"))
        .expect("a data file of s.secret")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tables_file_is_neither_promoted_nor_deleted() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    // A data file of another table, which the client must not reach.
    let secret = secret_file(&ctx, &warehouse).await;
    let secret_file = secret.display().to_string();
    let secret = secret.as_path();

    hostile(&upload, &["foreign-file", &secret_file]);
    let error = promote_error(&ctx, &upload).await;
    assert!(error.contains("which is outside its location"), "{error}");
    assert!(error.contains(&secret_file), "{error}");
    target_untouched(&ctx).await;

    // Discarding the upload deletes what lies under the staging table only.
    run(&ctx, &format!("ABORT UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert!(secret.exists(), "ABORT deleted another table's file");
    assert_eq!(
        scalar(&ctx, "SELECT sum(amount) FROM s.secret").await,
        "700"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_replaced_after_the_commit_are_what_is_verified() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;

    // Cut short: refused, with the file named.
    let upload = target(&ctx).await;
    let file = hostile(&upload, &["replace-bytes", "truncate"]);
    let error = promote_error(&ctx, &upload).await;
    assert!(error.contains("is not a readable Parquet file"), "{error}");
    let file: serde_json::Value = serde_json::from_str(file.trim()).unwrap();
    assert!(error.contains(file["file"].as_str().unwrap()), "{error}");
    target_untouched(&ctx).await;

    // A valid file with more rows than the manifest says: the target gets
    // the rows the bytes hold, with metrics from them, and reads back.
    let other = Warehouse::new();
    let ctx = other.session().await;
    let upload = target(&ctx).await;
    hostile(&upload, &["replace-bytes", "more-rows"]);
    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&promoted, "rows"), "7");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "8");
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM s.t WHERE amount = 100").await,
        "7"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_target_property_fails_the_upload_and_says_so() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    run(
        &ctx,
        "CREATE TABLE s.other (id INT NOT NULL, amount INT NOT NULL)",
    )
    .await
    .unwrap();
    hostile(&upload, &["set-property", "icestage.target", "s.other"]);
    let error = promote_error(&ctx, &upload).await;
    assert!(
        error.contains("were changed after CREATE UPLOAD"),
        "{error}"
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.other").await, "0");
    target_untouched(&ctx).await;
    // EXPIRE STAGING does not believe a tampered expiry.
    hostile(
        &upload,
        &[
            "set-property",
            "icestage.expires-at",
            "2999-01-01T00:00:00+00:00",
        ],
    );
    assert_eq!(scalar(&ctx, "EXPIRE STAGING").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_staging_location_is_refused() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    let elsewhere = format!(
        "file://{}/s/t",
        warehouse.path().canonicalize().unwrap().display()
    );
    hostile(&upload, &["relocate", &elsewhere]);
    let error = promote_error(&ctx, &upload).await;
    assert!(
        error.contains("the staging table's location was changed"),
        "{error}"
    );
    target_untouched(&ctx).await;
}

/// `s.n`: `id INT NOT NULL`, a required struct `s` (required `a`,
/// optional `b`) and an optional list `l` of required elements, created
/// with the Iceberg API (SQL DDL has no nested NOT NULL).
async fn nested_target(warehouse: &Warehouse) {
    use iceberg::spec::{ListType, NestedField, PrimitiveType, Schema, StructType, Type};
    use iceberg::{NamespaceIdent, TableCreation};
    let int = || Type::Primitive(PrimitiveType::Int);
    let catalog = icestage::IcebergCatalog::open(&warehouse.config().catalogs[0])
        .await
        .unwrap();
    let namespace = NamespaceIdent::new("s".to_string());
    catalog
        .catalog()
        .create_namespace(&namespace, Default::default())
        .await
        .unwrap();
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", int()).into(),
            NestedField::required(
                2,
                "s",
                Type::Struct(StructType::new(vec![
                    NestedField::required(3, "a", int()).into(),
                    NestedField::optional(4, "b", int()).into(),
                ])),
            )
            .into(),
            NestedField::optional(
                5,
                "l",
                Type::List(ListType::new(
                    NestedField::list_element(6, int(), true).into(),
                )),
            )
            .into(),
        ])
        .build()
        .unwrap();
    let creation = TableCreation::builder()
        .name("n".to_string())
        .schema(schema)
        .build();
    catalog
        .catalog()
        .create_table(&namespace, creation)
        .await
        .unwrap();
}

/// Required-ness holds at every depth, from the decoded values, whatever
/// the staged file's own schema claims: a NULL struct, a NULL field of a
/// struct and a NULL list element are each refused by name; optional
/// fields still take NULLs, and the target reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_fields_are_checked_at_every_depth() {
    let warehouse = Warehouse::new();
    nested_target(&warehouse).await;
    let ctx = warehouse.session().await;
    for (rows, refusal) in [
        (
            r#"[{"id": 1, "s": null, "l": null}]"#,
            "field 's' is required but 1 staged value(s) hold NULL",
        ),
        (
            r#"[{"id": 2, "s": {"a": null, "b": 5}, "l": [1]}, {"id": 3, "s": {"a": null, "b": null}, "l": null}]"#,
            "field 's.a' is required but 2 staged value(s) hold NULL",
        ),
        (
            r#"[{"id": 4, "s": {"a": 1, "b": null}, "l": [1, null, 3]}]"#,
            "field 'l.element' is required but 1 staged value(s) hold NULL",
        ),
    ] {
        let upload = create_upload(&ctx, "s.n").await;
        hostile(&upload, &["nested-nulls", rows]);
        let error = promote_error(&ctx, &upload).await;
        assert!(error.contains(refusal), "{rows}: {error}");
        assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.n").await, "0");
    }
    // NULLs where the target allows them: promoted, and every row reads.
    let upload = create_upload(&ctx, "s.n").await;
    hostile(
        &upload,
        &[
            "nested-nulls",
            r#"[{"id": 5, "s": {"a": 1, "b": null}, "l": null}, {"id": 6, "s": {"a": 2, "b": 3}, "l": [4]}]"#,
        ],
    );
    run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(
        scalar(&ctx, "SELECT sum(s['a']) || ':' || count(l) FROM s.n").await,
        "3:1"
    );
}

/// Every later reader (rules, scans, the rewrite path) reads a staged file
/// at the size its manifest claims, so a claim that differs from the
/// stored size (the two-footer trick) is refused, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_size_that_is_not_the_stored_one_is_refused() {
    for delta in ["-1", "100"] {
        let warehouse = Warehouse::new();
        let ctx = warehouse.session().await;
        let upload = target(&ctx).await;
        let file = hostile(&upload, &["claimed-size", delta]);
        let file: serde_json::Value = serde_json::from_str(file.trim()).unwrap();
        let error = promote_error(&ctx, &upload).await;
        assert!(
            error.contains(&format!(
                "staged file {} claims {} bytes but holds",
                file["file"].as_str().unwrap(),
                file["claimed"]
            )),
            "{error}"
        );
        target_untouched(&ctx).await;
    }
}

/// A symbolic link under the staging table's folder names whatever it
/// points at: it is outside, is neither promoted nor followed by the
/// clean-up, and the file it points at stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_under_the_staging_folder_is_outside_it() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    let secret = secret_file(&ctx, &warehouse).await;
    let linked = hostile(&upload, &["linked-file", &secret.display().to_string()]);
    let linked: serde_json::Value = serde_json::from_str(linked.trim()).unwrap();
    let error = promote_error(&ctx, &upload).await;
    assert!(error.contains("which is outside its location"), "{error}");
    assert!(error.contains(linked["file"].as_str().unwrap()), "{error}");
    target_untouched(&ctx).await;
    run(&ctx, &format!("ABORT UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert!(secret.exists(), "the clean-up followed the link");
    assert_eq!(
        scalar(&ctx, "SELECT sum(amount) FROM s.secret").await,
        "700"
    );
}

/// The exactly-once evidence is bound to the upload: a snapshot another
/// writer adds to the target claiming `upload-id=<id>` is ignored (and
/// said), and the upload's rows still land, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_evidence_does_not_drop_an_uploads_rows() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    run(
        &ctx,
        &format!(
            "INSERT INTO {} VALUES (2, 20), (3, 30)",
            upload.staging_table
        ),
    )
    .await
    .unwrap();
    hostile(&upload, &["forge-evidence", "s.t", &upload.id]);
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "2");
    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&promoted, "rows"), "2");
    let message = crate::common::value(&promoted, "message");
    assert!(
        message.contains("ignored 1 snapshot(s) of s.t that claim upload-id="),
        "{message}"
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "4");
    // Run again: the real evidence answers, nothing more lands.
    let again = run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert!(
        crate::common::value(&again, "message").contains("already promoted"),
        "{}",
        crate::common::value(&again, "message")
    );
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "4");
}

/// A client that can write its staging table's folder rewrites the current
/// metadata file in place (a log entry naming an outside file, properties
/// asking for old files to be deleted). The process that committed that
/// version keeps its own parse and never reads the rewrite; any other (a
/// replica, a restarted service) reads the file, finds it is not what was
/// committed, and refuses the upload as tampered. The outside file stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_rewritten_in_place_is_found_out() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    run(
        &ctx,
        &format!("INSERT INTO {} VALUES (2, 20)", upload.staging_table),
    )
    .await
    .unwrap();
    let outside = warehouse.path().join("outside.txt");
    std::fs::write(&outside, "keep me").unwrap();
    hostile(
        &upload,
        &["rewrite-metadata", &format!("file://{}", outside.display())],
    );
    let replica = warehouse.session().await;
    let error = promote_error(&replica, &upload).await;
    assert!(error.contains("a client rewrote it in place"), "{error}");
    assert!(outside.exists(), "a file outside the table was deleted");
    target_untouched(&replica).await;
}

/// The staging table's current metadata file on the local warehouse.
fn current_metadata(warehouse: &Warehouse, upload: &Upload) -> std::path::PathBuf {
    let mut metadata: Vec<_> = crate::common::files_under(warehouse.path())
        .into_iter()
        .filter(|p| {
            let path = p.display().to_string();
            path.contains(&upload.id) && path.ends_with(".metadata.json")
        })
        .collect();
    metadata.sort();
    metadata.pop().expect("the staging table's metadata")
}

/// The current metadata file of the staging table replaced in place by
/// 300 KiB of gzip that inflate to 300 MiB: a replica inflates it only up
/// to `limits.metadata_inflated_bytes`, says so, and the target is
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_compressed_in_place_is_inflated_within_its_bound() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    let current = current_metadata(&warehouse, &upload);
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c 314572800 /dev/zero | gzip -c > '{}'",
            current.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    let replica = warehouse.session().await;
    let error = promote_error(&replica, &upload).await;
    assert!(
        error.contains("decompresses to more than the 256 MiB")
            && error.contains("limits.metadata_inflated_bytes"),
        "{error}"
    );
    target_untouched(&replica).await;
}

/// The current metadata file of the staging table grown in place past
/// `limits.metadata_bytes` (a client that can write the local warehouse):
/// a replica refuses to parse it, says which bound, and the target is
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_grown_in_place_is_not_parsed() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    let current = current_metadata(&warehouse, &upload);
    // Sparse: 65 MiB that take no disk.
    std::fs::OpenOptions::new()
        .write(true)
        .open(current)
        .unwrap()
        .set_len(65 << 20)
        .unwrap();
    let replica = warehouse.session().await;
    let error = promote_error(&replica, &upload).await;
    assert!(
        error.contains("holds 68157440 bytes, more than the 64 MiB")
            && error.contains("limits.metadata_bytes"),
        "{error}"
    );
    target_untouched(&replica).await;
}

/// A staged page whose GZIP stream inflates about a thousand times past the
/// size its header declares (the stored size and the footer unchanged) is
/// refused before the decoder sees it, naming the column and the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_inflates_past_its_header_is_refused_before_decoding() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    let file = hostile(&upload, &["page-bomb"]);
    let file: serde_json::Value = serde_json::from_str(file.trim()).unwrap();
    let error = promote_error(&ctx, &upload).await;
    assert!(
        error.contains(file["file"].as_str().unwrap())
            && error.contains("column 'amount': the page at byte")
            && error.contains("inflates past the")
            && error.contains("(GZIP)"),
        "{error}"
    );
    target_untouched(&ctx).await;
}
