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

/// A host application's own query planner: counts the plans it is asked for.
#[derive(Debug, Default)]
struct CountingPlanner(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl datafusion::execution::context::QueryPlanner for CountingPlanner {
    async fn create_physical_plan(
        &self,
        plan: &datafusion::logical_expr::LogicalPlan,
        state: &datafusion::execution::context::SessionState,
    ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
    {
        use datafusion::physical_planner::PhysicalPlanner;
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        datafusion::physical_planner::DefaultPhysicalPlanner::default()
            .create_physical_plan(plan, state)
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_keeps_the_hosts_query_planner() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    let warehouse = Warehouse::new();
    let host = Arc::new(CountingPlanner::default());
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_default_features()
        .with_query_planner(Arc::clone(&host) as _)
        .build();
    let ctx = SessionContext::new_with_state(state);
    icestage::register(&ctx, warehouse.config()).await.unwrap();

    collect(&ctx, "SELECT 1").await;
    assert_eq!(
        host.0.load(Ordering::SeqCst),
        1,
        "the host planner planned the query"
    );
    // icestage's statements still plan (with icestage's planner).
    let uploads = collect(&ctx, "SELECT count(*) AS n FROM uploads()").await;
    assert_eq!(value(&uploads, "n"), "0");
}
