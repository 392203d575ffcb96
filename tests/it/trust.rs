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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tables_file_is_neither_promoted_nor_deleted() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let upload = target(&ctx).await;
    // A data file of another table, which the client must not reach.
    run(
        &ctx,
        "CREATE TABLE s.secret (id INT NOT NULL, amount INT NOT NULL)",
    )
    .await
    .unwrap();
    run(&ctx, "INSERT INTO s.secret VALUES (7, 700)")
        .await
        .unwrap();
    let data = warehouse.path().join("s").join("secret").join("data");
    let secret = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "parquet"))
        .expect("a data file of s.secret");
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
