//! PyIceberg, a real third-party client, on icestage's staging tables: it
//! loads the catalog from the connection properties CREATE UPLOAD returns,
//! appends, evolves or tampers with the staging table; icestage promotes or
//! refuses; PyIceberg reads the target back.

use std::collections::BTreeMap;

use crate::common::{Warehouse, create_upload, python_script, run, scalar};

const TARGET: &str = "CREATE TABLE payments.transactions (
    transaction_id VARCHAR NOT NULL,
    account_id     VARCHAR NOT NULL,
    amount_cents   BIGINT  NOT NULL,
    currency       VARCHAR NOT NULL,
    created_at     TIMESTAMP WITH TIME ZONE NOT NULL
) PARTITIONED BY (day(created_at))";

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim().lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_appends_to_staging_and_reads_the_promoted_rows() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA payments").await.unwrap();
    run(&ctx, TARGET).await.unwrap();

    // Evolve the target with PyIceberg first, so its field ids are no longer
    // 1..n: a staging table made with create_table would get other ids.
    let target_ids: BTreeMap<String, i64> = serde_json::from_value(json(&python_script(
        "pyiceberg_client.py",
        &["evolve", &warehouse.connection(), "payments.transactions"],
    )))
    .unwrap();
    assert_eq!(target_ids["note"], 6);
    assert!(!target_ids.contains_key("currency"));

    let upload = create_upload(&ctx, "payments.transactions").await;
    let staging_ids: BTreeMap<String, i64> = serde_json::from_value(json(&python_script(
        "pyiceberg_client.py",
        &["field-ids", &upload.connection, &upload.staging_table],
    )))
    .unwrap();
    assert_eq!(
        staging_ids, target_ids,
        "the staging table keeps the target's field ids"
    );

    python_script(
        "pyiceberg_client.py",
        &["append", &upload.connection, &upload.staging_table, "25"],
    );
    let staged = scalar(
        &ctx,
        &format!("SELECT rows FROM upload_status('{}')", upload.id),
    )
    .await;
    assert_eq!(staged, "25");

    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&promoted, "rows"), "25");
    assert_eq!(crate::common::value(&promoted, "path"), "zero_copy");

    let read = json(&python_script(
        "pyiceberg_client.py",
        &[
            "read",
            &upload.connection,
            "payments.transactions",
            &upload.id,
        ],
    ));
    assert_eq!(read["rows"], 25);
    assert_eq!(read["ids"][0], "txn_000");
    assert_eq!(read["evidence_snapshots"].as_array().unwrap().len(), 1);

    // Another session (as a fresh process would) sees the promotion.
    let other = warehouse.session().await;
    let state = scalar(
        &other,
        &format!("SELECT state FROM upload_status('{}')", upload.id),
    )
    .await;
    assert_eq!(state, "promoted");
    let count = scalar(&other, "SELECT count(*) FROM payments.transactions").await;
    assert_eq!(count, "25");
}

/// One more transaction, as the values of an INSERT.
const T9: &str = "('t9', 'acct_9', 900, 'usd', TIMESTAMP '2026-07-02 00:00:00Z')";

/// `payments.transactions` in `warehouse`, created by PyIceberg as a format
/// `version` table partitioned by `account_id`, holding three rows, then
/// with its partition field removed; PyIceberg's answer (its spec).
fn repartitioned(warehouse: &Warehouse, version: &str) -> serde_json::Value {
    json(&python_script(
        "pyiceberg_client.py",
        &[
            "create-repartitioned",
            &warehouse.connection(),
            "payments.transactions",
            "3",
            version,
        ],
    ))
}

/// A table whose partition field was removed (by PyIceberg) has a new
/// default spec without fields, spec 1 here: rows icestage writes into it
/// (an INSERT into the staging table, then the promotion) are files of that
/// spec. They were written as spec 0's, which the commit refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_whose_partition_field_was_removed_takes_uploads() {
    let warehouse = Warehouse::new();
    let repartitioned = repartitioned(&warehouse, "2");
    assert_eq!(
        (&repartitioned["spec_id"], &repartitioned["spec"]),
        (&serde_json::json!(1), &serde_json::json!([])),
        "{repartitioned}"
    );
    let ctx = warehouse.session().await;
    let upload = create_upload(&ctx, "payments.transactions").await;
    run(
        &ctx,
        &format!("INSERT INTO {} VALUES {T9}", upload.staging_table),
    )
    .await
    .unwrap();
    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(crate::common::value(&promoted, "rows"), "1");
    let read = json(&python_script(
        "pyiceberg_client.py",
        &[
            "read-table",
            &warehouse.connection(),
            "payments.transactions",
        ],
    ));
    assert_eq!(read["rows"], 4, "{read}");
}

/// A format v1 table keeps a removed partition field as a `void` field
/// under its old name, its column's here, which the transactions of
/// icestage's own commits cannot rebuild: an INSERT is refused saying what
/// to do (rename the field), nothing changes, and once the field is renamed
/// it lands, as a file of the renamed spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_void_field_named_like_its_column_is_refused_with_what_to_do() {
    let warehouse = Warehouse::new();
    let repartitioned = repartitioned(&warehouse, "1");
    assert_eq!(
        repartitioned["spec"],
        serde_json::json!([["account_id", "void"]]),
        "{repartitioned}"
    );
    let ctx = warehouse.session().await;
    let insert = format!("INSERT INTO payments.transactions VALUES {T9}");
    let refused = run(&ctx, &insert).await.unwrap_err().to_string();
    assert!(
        refused.contains("payments.transactions: its partition spec 1 (account_id (void))")
            && refused.contains("rename_field"),
        "{refused}"
    );
    let count = "SELECT count(*) FROM payments.transactions";
    assert_eq!(scalar(&ctx, count).await, "3");
    python_script(
        "pyiceberg_client.py",
        &[
            "rename-partition-field",
            &warehouse.connection(),
            "payments.transactions",
            "account_id",
            "account_id_1000",
        ],
    );
    run(&ctx, &insert).await.unwrap();
    assert_eq!(scalar(&ctx, count).await, "4");
}

/// Opens an upload for a new table `s.t (id INT NOT NULL, amount INT NOT NULL)`
/// holding one row, lets PyIceberg run `command` on the staging
/// table's `amount` column, and returns the upload id and the error of its
/// promotion.
async fn refused_after(
    ctx: &datafusion::prelude::SessionContext,
    command: &str,
) -> (String, String) {
    run(ctx, "CREATE SCHEMA s").await.unwrap();
    run(
        ctx,
        "CREATE TABLE s.t (id INT NOT NULL, amount INT NOT NULL)",
    )
    .await
    .unwrap();
    run(ctx, "INSERT INTO s.t VALUES (1, 10)").await.unwrap();
    let upload = create_upload(ctx, "s.t").await;
    python_script(
        "pyiceberg_client.py",
        &[command, &upload.connection, &upload.staging_table, "amount"],
    );
    let error = run(ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .expect_err("the promotion must be refused")
        .to_string();
    (upload.id, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_retypes_the_staging_table_is_refused() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (id, error) = refused_after(&ctx, "retype").await;
    assert!(
        error.contains(
            "schema drift: column 'amount' is int in the target but long in the staging table"
        ),
        "{error}"
    );
    let state = scalar(&ctx, &format!("SELECT state FROM upload_status('{id}')")).await;
    assert_eq!(state, "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nulls_in_a_required_column_are_refused_and_the_target_is_untouched() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (id, error) = refused_after(&ctx, "rogue-nulls").await;
    assert!(
        error.contains("column 'amount' is required but 1 staged row(s) hold NULL in it"),
        "{error}"
    );
    assert!(error.contains("the target is unchanged"), "{error}");
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "1");
    let message = scalar(&ctx, &format!("SELECT message FROM upload_status('{id}')")).await;
    assert!(message.contains("hold NULL"), "{message}");
}

/// Another writer (PyIceberg) deletes one promoted upload's rows, which
/// removes its file from the table; `EXPIRE SNAPSHOTS` then deletes that
/// file, which no remaining snapshot reads (it lies under the staging
/// table's location, where the promotion registered it), and no other. A
/// table with `gc.enabled = false` is refused (Iceberg expires nothing of
/// it), naming the property, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_snapshots_deletes_the_data_files_no_snapshot_reads() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    let parquet = || -> std::collections::BTreeSet<String> {
        crate::common::files_under(warehouse.path())
            .into_iter()
            .map(|path| path.display().to_string())
            .filter(|path| path.ends_with(".parquet"))
            .collect()
    };
    for (table, properties, deletes) in [
        ("s.t", "", true),
        ("s.kept", " TBLPROPERTIES ('gc.enabled' = 'false')", false),
    ] {
        run(
            &ctx,
            &format!(
                "CREATE TABLE {table} (id BIGINT NOT NULL, upload VARCHAR NOT NULL){properties}"
            ),
        )
        .await
        .unwrap();
        let mut uploads = vec![];
        for n in 0..3 {
            let upload = create_upload(&ctx, table).await;
            run(
                &ctx,
                &format!(
                    "INSERT INTO {} VALUES ({n}, '{id}'), ({}, '{id}')",
                    upload.staging_table,
                    n + 10,
                    id = upload.id
                ),
            )
            .await
            .unwrap();
            run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
                .await
                .unwrap();
            uploads.push(upload);
        }
        // A writer that places files itself put one of the second upload's
        // rows outside the warehouse.
        let elsewhere = tempfile::tempdir().unwrap();
        let outside = elsewhere.path().join("placed.parquet");
        python_script(
            "pyiceberg_client.py",
            &[
                "add-file",
                &warehouse.connection(),
                table,
                &format!("file://{}", outside.display()),
                &format!(r#"{{"id": 100, "upload": "{}"}}"#, uploads[1].id),
            ],
        );
        let before = parquet();
        // The files the promotion of the second upload registered.
        let folder = uploads[1].staging_table.replace('.', "/");
        let its: Vec<&String> = before.iter().filter(|p| p.contains(&folder)).collect();
        assert!(!its.is_empty(), "{folder} in {before:?}");
        let deleted = json(&python_script(
            "pyiceberg_client.py",
            &[
                "delete",
                &warehouse.connection(),
                table,
                &format!("upload = '{}'", uploads[1].id),
            ],
        ));
        assert!(
            deleted["operation"] == "delete" || deleted["operation"] == "overwrite",
            "{deleted}"
        );
        assert_eq!(
            parquet(),
            before,
            "a delete keeps the files for older snapshots"
        );

        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let snapshots = format!("SELECT count(*) FROM {table}$snapshots");
        let before_snapshots = scalar(&ctx, &snapshots).await;
        let expire = format!("EXPIRE SNAPSHOTS {table} WITH (older_than = '1ms', retain_last = 1)");
        let message = if deletes {
            let expired = run(&ctx, &expire).await.unwrap();
            let message = crate::common::value(&expired, "message");
            assert_eq!(
                crate::common::value(&expired, "data_files_deleted"),
                its.len().to_string(),
                "{message}"
            );
            let after = parquet();
            let gone: Vec<&String> = before.difference(&after).collect();
            assert_eq!(gone, its, "{message}");
            // Not read any more, but not the table's to delete.
            assert!(outside.exists(), "{message}");
            assert!(message.contains("1 more lie outside"), "{message}");
            message
        } else {
            // Iceberg expires nothing of a table whose files may be shared.
            let refused = run(&ctx, &expire).await.unwrap_err().user_message();
            assert!(
                refused.contains(&format!("EXPIRE SNAPSHOTS {table}"))
                    && refused.contains("gc.enabled = false")
                    && refused.contains("nothing was changed"),
                "{refused}"
            );
            assert_eq!(scalar(&ctx, &snapshots).await, before_snapshots);
            assert_eq!(parquet(), before);
            refused
        };
        assert_eq!(
            scalar(
                &ctx,
                &format!("SELECT count(*) || ',' || sum(id) FROM {table}")
            )
            .await,
            "4,24",
            "{message}"
        );
    }
}
