//! icestage embedded in an application's own DataFusion session: the table
//! functions work through DataFusion's stock parser (`SessionContext::sql`).

use datafusion::prelude::SessionContext;

use crate::common::{Warehouse, value};

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<datafusion::arrow::array::RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_function_twins_need_only_datafusions_parser() {
    let warehouse = Warehouse::new();
    let ctx = SessionContext::new();
    icestage::register(&ctx, warehouse.config()).await.unwrap();

    collect(&ctx, "CREATE SCHEMA s").await;
    // DataFusion's own CREATE TABLE cannot make an Iceberg table: icestage's does.
    icestage::sql(&ctx, "CREATE TABLE s.t (id BIGINT NOT NULL, name VARCHAR)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();

    let created = collect(&ctx, "SELECT * FROM create_upload('s.t', '1h')").await;
    let id = value(&created, "upload_id");
    let staging = value(&created, "staging_table");
    collect(
        &ctx,
        &format!("INSERT INTO {staging} VALUES (1, 'one'), (2, NULL)"),
    )
    .await;

    let promoted = collect(
        &ctx,
        &format!("SELECT state, rows FROM promote_upload('{id}')"),
    )
    .await;
    assert_eq!(value(&promoted, "state"), "promoted");
    assert_eq!(value(&promoted, "rows"), "2");

    let status = collect(&ctx, &format!("SELECT state FROM upload_status('{id}')")).await;
    assert_eq!(value(&status, "state"), "promoted");
    let count = collect(&ctx, "SELECT count(*) AS n FROM s.t").await;
    assert_eq!(value(&count, "n"), "2");

    // The stock parser refuses icestage's statements with its own error;
    // the table functions are the way in.
    assert!(ctx.sql(&format!("PROMOTE UPLOAD '{id}'")).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_icestage_gets_a_clear_error() {
    let ctx = SessionContext::new();
    let error = icestage::sql(&ctx, "EXPIRE STAGING")
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "configuration error: this DataFusion session has no icestage catalogs: \
         call icestage::register(&ctx, config) first"
    );
}
