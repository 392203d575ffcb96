//! The upload log: an Iceberg table owned by icestage (`icestage.upload_log`
//! in each catalog) that records how each upload session ended, so that its
//! status outlives the staging table. Append-only; the latest row of an id
//! is its state.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMicrosecondType};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;
use iceberg::expr::Reference;
use iceberg::spec::{Datum, NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use super::{UploadState, is_missing};
use crate::catalog::IcebergCatalog;
use crate::catalog::provider::insert_into;
use crate::error::{Error, Result};
use crate::plan::rows::{Value, batch};

/// Namespace of the tables icestage owns.
pub const ICESTAGE_NAMESPACE: &str = "icestage";
/// Name of the upload log table.
pub const UPLOAD_LOG_TABLE: &str = "upload_log";

/// One row of the upload log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogRecord {
    pub(crate) upload_id: String,
    pub(crate) state: UploadState,
    pub(crate) target_table: String,
    pub(crate) staging_table: String,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) recorded_at: DateTime<Utc>,
    pub(crate) rows: Option<i64>,
    pub(crate) files: Option<i64>,
    pub(crate) snapshot_id: Option<i64>,
    pub(crate) message: Option<String>,
}

fn log_ident() -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()),
        UPLOAD_LOG_TABLE.to_string(),
    )
}

fn log_schema() -> Result<Schema> {
    let string = || Type::Primitive(PrimitiveType::String);
    let long = || Type::Primitive(PrimitiveType::Long);
    let time = || Type::Primitive(PrimitiveType::Timestamptz);
    let fields = vec![
        NestedField::required(1, "upload_id", string()),
        NestedField::required(2, "state", string()),
        NestedField::required(3, "target_table", string()),
        NestedField::optional(4, "staging_table", string()),
        NestedField::optional(5, "created_at", time()),
        NestedField::optional(6, "expires_at", time()),
        NestedField::required(7, "recorded_at", time()),
        NestedField::optional(8, "rows", long()),
        NestedField::optional(9, "files", long()),
        NestedField::optional(10, "snapshot_id", long()),
        NestedField::optional(11, "message", string()),
    ];
    Ok(Schema::builder()
        .with_fields(fields.into_iter().map(Arc::new))
        .build()?)
}

/// The log table of `catalog`, created on first use.
async fn log_table(catalog: &IcebergCatalog) -> Result<Table> {
    let ident = log_ident();
    match catalog.catalog().load_table(&ident).await {
        Ok(table) => return Ok(table),
        Err(e) if is_missing(&e) => {}
        Err(e) => return Err(e.into()),
    }
    catalog.ensure_namespace(ident.namespace()).await?;
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(log_schema()?)
        .build();
    match catalog.catalog().create_table(ident.namespace(), creation).await {
        Ok(table) => Ok(table),
        // Another process created it first.
        Err(e) if e.kind() == iceberg::ErrorKind::TableAlreadyExists => {
            Ok(catalog.catalog().load_table(&ident).await?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Appends `record` to the log of `catalog`.
pub(crate) async fn append(catalog: &IcebergCatalog, record: &LogRecord) -> Result<()> {
    let table = log_table(catalog).await?;
    let schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(
        table.metadata().current_schema(),
    )?);
    let rows = batch(Arc::clone(&schema), &[vec![
        Value::from(record.upload_id.clone()),
        Value::from(record.state.as_str()),
        Value::from(record.target_table.clone()),
        Value::from(record.staging_table.clone()),
        Value::from(record.created_at),
        Value::from(record.expires_at),
        Value::from(Some(record.recorded_at)),
        Value::from(record.rows),
        Value::from(record.files),
        Value::from(record.snapshot_id),
        Value::from(record.message.clone()),
    ]])?;
    // iceberg's commit retries conflicts with backoff but no jitter, so a
    // crowd of concurrent writers can exhaust it; retry the whole append.
    let mut attempt = 0u32;
    loop {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let input = MemorySourceConfig::try_new_exec(&[vec![rows.clone()]], Arc::clone(&schema), None)?;
        match insert_into(catalog, table.identifier(), &state, input, &state.task_ctx()).await {
            Ok(_) => return Ok(()),
            Err(e) if is_commit_conflict(&e) && attempt < 8 => {
                attempt += 1;
                tokio::time::sleep(jitter(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A randomised pause before retry `attempt` (1-based).
pub(crate) fn jitter(attempt: u32) -> Duration {
    let base = 50u64 * u64::from(attempt.min(10));
    Duration::from_millis(base + rand::random::<u64>() % (base * 4 + 1))
}

/// True when `error` is an Iceberg commit conflict (retryable).
pub(crate) fn is_commit_conflict(error: &Error) -> bool {
    let iceberg = match error {
        Error::Iceberg(e) => Some(e),
        Error::DataFusion(DataFusionError::External(inner)) => inner.downcast_ref::<iceberg::Error>(),
        _ => None,
    };
    iceberg.is_some_and(|e| e.kind() == iceberg::ErrorKind::CatalogCommitConflicts)
}

/// The latest record of `upload_id` in the log of `catalog`.
pub(crate) async fn lookup(catalog: &IcebergCatalog, upload_id: &str) -> Result<Option<LogRecord>> {
    let records = read(catalog, Some(upload_id)).await?;
    Ok(records.into_iter().max_by_key(|r| r.recorded_at))
}

/// The latest record of every upload in the log of `catalog`.
pub(crate) async fn latest_records(catalog: &IcebergCatalog) -> Result<Vec<LogRecord>> {
    let mut latest: std::collections::HashMap<String, LogRecord> = Default::default();
    for record in read(catalog, None).await? {
        match latest.get(&record.upload_id) {
            Some(seen) if seen.recorded_at >= record.recorded_at => {}
            _ => {
                latest.insert(record.upload_id.clone(), record);
            }
        }
    }
    Ok(latest.into_values().collect())
}

async fn read(catalog: &IcebergCatalog, upload_id: Option<&str>) -> Result<Vec<LogRecord>> {
    let table = match catalog.catalog().load_table(&log_ident()).await {
        Ok(table) => table,
        Err(e) if is_missing(&e) => return Ok(vec![]),
        Err(e) => return Err(e.into()),
    };
    let mut scan = table.scan();
    if let Some(id) = upload_id {
        scan = scan.with_filter(Reference::new("upload_id").equal_to(Datum::string(id)));
    }
    let batches: Vec<RecordBatch> = scan.build()?.to_arrow().await?.try_collect().await?;
    let mut records = vec![];
    for batch in &batches {
        records.extend(decode(batch)?);
    }
    if let Some(id) = upload_id {
        records.retain(|r| r.upload_id == id);
    }
    Ok(records)
}

fn decode(batch: &RecordBatch) -> Result<Vec<LogRecord>> {
    let column = |name: &str, to: &DataType| -> Result<Arc<dyn Array>> {
        let array = batch.column_by_name(name).ok_or_else(|| {
            Error::invalid(format!("the upload log has no column '{name}': it was not written by icestage"))
        })?;
        Ok(cast(array, to)?)
    };
    let time_type = DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
    let strings: Vec<Arc<dyn Array>> = ["upload_id", "state", "target_table", "staging_table", "message"]
        .iter()
        .map(|n| column(n, &DataType::Utf8))
        .collect::<Result<_>>()?;
    let longs: Vec<Arc<dyn Array>> = ["rows", "files", "snapshot_id"]
        .iter()
        .map(|n| column(n, &DataType::Int64))
        .collect::<Result<_>>()?;
    let times: Vec<Arc<dyn Array>> = ["created_at", "expires_at", "recorded_at"]
        .iter()
        .map(|n| column(n, &time_type))
        .collect::<Result<_>>()?;
    let string = |c: usize, row: usize| {
        let a = strings[c].as_string::<i32>();
        a.is_valid(row).then(|| a.value(row).to_string())
    };
    let long = |c: usize, row: usize| {
        let a = longs[c].as_primitive::<Int64Type>();
        a.is_valid(row).then(|| a.value(row))
    };
    let time = |c: usize, row: usize| {
        let a = times[c].as_primitive::<TimestampMicrosecondType>();
        a.is_valid(row)
            .then(|| DateTime::<Utc>::from_timestamp_micros(a.value(row)))
            .flatten()
    };
    (0..batch.num_rows())
        .map(|row| {
            Ok(LogRecord {
                upload_id: string(0, row).unwrap_or_default(),
                state: string(1, row).unwrap_or_default().parse()?,
                target_table: string(2, row).unwrap_or_default(),
                staging_table: string(3, row).unwrap_or_default(),
                message: string(4, row),
                rows: long(0, row),
                files: long(1, row),
                snapshot_id: long(2, row),
                created_at: time(0, row),
                expires_at: time(1, row),
                recorded_at: time(2, row).unwrap_or_default(),
            })
        })
        .collect()
}
