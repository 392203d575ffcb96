//! What the benchmarks share.

use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;

/// Runs one statement through icestage and collects its result; a failure
/// stops the benchmark, naming the statement.
pub async fn run(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    icestage::sql(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}
