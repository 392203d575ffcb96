//! DataFusion helpers: result rows ([`Value`], [`batch`]), the Arrow
//! schemas of every statement's result, and small plans ([`one_batch`],
//! [`project`]). They depend on nothing above the error type.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use crate::error::{Error, Result};

/// One value of a result row.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    /// A string, or NULL.
    Str(Option<String>),
    /// A 64-bit integer, or NULL.
    Int(Option<i64>),
    /// A UTC timestamp, or NULL.
    Time(Option<DateTime<Utc>>),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(Some(v.to_string()))
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(Some(v))
    }
}

impl From<Option<String>> for Value {
    fn from(v: Option<String>) -> Self {
        Value::Str(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(Some(v))
    }
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Self {
        Value::Int(v)
    }
}

impl From<Option<DateTime<Utc>>> for Value {
    fn from(v: Option<DateTime<Utc>>) -> Self {
        Value::Time(v)
    }
}

/// Builds a batch of `rows` whose values follow the order of `schema`.
pub(crate) fn batch(schema: SchemaRef, rows: &[Vec<Value>]) -> Result<RecordBatch> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let value = |row: &Vec<Value>| row.get(i).cloned();
        let mismatch = |v: Option<Value>| {
            Error::invalid(format!(
                "internal: column '{}' of type {} got {v:?}",
                field.name(),
                field.data_type()
            ))
        };
        let column: ArrayRef = match field.data_type() {
            DataType::Utf8 => {
                let mut b = StringBuilder::new();
                for row in rows {
                    match value(row) {
                        Some(Value::Str(v)) => b.append_option(v),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Int64 => {
                let mut b = Int64Builder::new();
                for row in rows {
                    match value(row) {
                        Some(Value::Int(v)) => b.append_option(v),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Timestamp(_, tz) => {
                let mut b = TimestampMicrosecondBuilder::new().with_timezone_opt(tz.clone());
                for row in rows {
                    match value(row) {
                        Some(Value::Time(v)) => b.append_option(v.map(|t| t.timestamp_micros())),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            other => {
                return Err(Error::invalid(format!(
                    "internal: result column '{}' has unsupported type {other}",
                    field.name()
                )));
            }
        };
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

fn utf8(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable)
}

fn int64(name: &str) -> Field {
    Field::new(name, DataType::Int64, true)
}

/// The timestamp type of icestage's result columns.
pub(crate) fn timestamp_type() -> DataType {
    DataType::Timestamp(
        datafusion::arrow::datatypes::TimeUnit::Microsecond,
        Some("+00:00".into()),
    )
}

fn timestamp(name: &str) -> Field {
    Field::new(name, timestamp_type(), true)
}

/// The columns of `upload_status(id)` and `uploads()`.
pub(crate) fn status_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("upload_id", false),
        utf8("state", false),
        utf8("catalog", false),
        utf8("target_table", false),
        utf8("staging_table", false),
        timestamp("created_at"),
        timestamp("expires_at"),
        int64("rows"),
        int64("files"),
        int64("snapshot_id"),
        int64("findings"),
        utf8("message", true),
        utf8("owner", true),
    ]))
}

/// The columns of `upload_findings(id)`.
pub(crate) fn findings_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("upload_id", false),
        utf8("rule", false),
        utf8("kind", false),
        utf8("row", false),
        utf8("file", true),
        int64("position"),
        utf8("values", false),
        utf8("message", false),
    ]))
}

/// The columns of `vend_credentials(id, ...)`.
pub(crate) fn vend_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("id", false),
        utf8("mode", false),
        utf8("table_name", false),
        utf8("access_key_id", true),
        utf8("secret_access_key", true),
        utf8("session_token", true),
        timestamp("expiration"),
        utf8("region", false),
        utf8("connection", false),
        utf8("catalog_config", false),
    ]))
}

/// The columns of `CREATE DOWNLOAD`.
pub(crate) fn create_download_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("download_id", false),
        utf8("download_table", false),
        utf8("state", false),
        timestamp("expires_at"),
        utf8("catalog", false),
        utf8("connection", false),
    ]))
}

/// The columns of `download_status(id)`, `downloads()` and `wait_download(id)`.
pub(crate) fn download_status_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("download_id", false),
        utf8("state", false),
        utf8("catalog", false),
        utf8("download_table", false),
        utf8("sources", false),
        timestamp("created_at"),
        timestamp("expires_at"),
        int64("rows"),
        int64("files"),
        int64("snapshot_id"),
        utf8("message", true),
        utf8("owner", true),
    ]))
}

/// The columns of `DROP DOWNLOAD`.
pub(crate) fn drop_download_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("download_id", false),
        utf8("state", false),
    ]))
}

/// The columns of `COPY INTO`.
pub(crate) fn copy_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("files_loaded", DataType::Int64, false),
        Field::new("files_skipped", DataType::Int64, false),
        Field::new("files_changed", DataType::Int64, false),
        Field::new("rows", DataType::Int64, false),
        int64("snapshot_id"),
        utf8("table_created", false),
        utf8("message", false),
    ]))
}

/// The columns of `table_constraints(table)`.
pub(crate) fn constraints_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("table_name", false),
        utf8("constraint_name", false),
        utf8("kind", false),
        utf8("definition", false),
    ]))
}

/// The columns of `CREATE UPLOAD`.
pub(crate) fn create_upload_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("upload_id", false),
        utf8("staging_table", false),
        utf8("target_table", false),
        utf8("state", false),
        timestamp("expires_at"),
        utf8("catalog", false),
        utf8("connection", false),
    ]))
}

/// The columns of `PROMOTE UPLOAD`.
pub(crate) fn promote_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("upload_id", false),
        utf8("state", false),
        int64("rows"),
        int64("files"),
        int64("snapshot_id"),
        utf8("path", false),
        int64("findings"),
        utf8("message", false),
    ]))
}

/// The columns of `EXPIRE STAGING`.
pub(crate) fn expire_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "tables_removed",
        DataType::Int64,
        false,
    )]))
}

/// The columns of `ABORT UPLOAD`.
pub(crate) fn abort_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        utf8("upload_id", false),
        utf8("state", false),
    ]))
}

/// The stream of partition `partition` of a plan with one output partition
/// whose one batch `batch` computes.
pub(crate) fn one_batch(
    plan: &str,
    partition: usize,
    schema: SchemaRef,
    batch: impl Future<Output = DFResult<RecordBatch>> + Send + 'static,
) -> DFResult<SendableRecordBatchStream> {
    if partition != 0 {
        return Err(DataFusionError::Internal(format!(
            "{plan} has one partition, asked for {partition}"
        )));
    }
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::once(batch),
    )))
}

/// `plan` narrowed to the columns of `projection` (indices into its schema).
pub(crate) fn project(
    plan: Arc<dyn ExecutionPlan>,
    projection: Option<&Vec<usize>>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let Some(projection) = projection else {
        return Ok(plan);
    };
    let schema = plan.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = projection
        .iter()
        .map(|&i| {
            let name = schema.field(i).name().clone();
            (Arc::new(Column::new(&name, i)) as _, name)
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
}
