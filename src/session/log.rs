//! Session logs: Iceberg tables owned by icestage (`icestage.upload_log`,
//! `icestage.download_log` in each catalog) that record how each session
//! ended, so that its status outlives its table. Append-only; the latest row
//! of an id is its state.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMicrosecondType};
use futures::TryStreamExt;
use iceberg::expr::Reference;
use iceberg::spec::{Datum, NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use super::{SessionRecord, is_missing};
use crate::catalog::IcebergCatalog;
use crate::catalog::Icestage;
use crate::catalog::insert::append_rows;
use crate::error::{Error, Result};
use crate::rows::Value;
use std::fmt::Display;
use std::str::FromStr;

/// Namespace of the tables icestage owns.
pub const ICESTAGE_NAMESPACE: &str = "icestage";
/// Name of the upload log table.
pub const UPLOAD_LOG_TABLE: &str = "upload_log";
/// Name of the download log table.
pub const DOWNLOAD_LOG_TABLE: &str = "download_log";

/// Which log: its table's name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLog(&'static str);

/// The log of upload sessions.
pub(crate) const UPLOADS: SessionLog = SessionLog(UPLOAD_LOG_TABLE);
/// The log of download sessions.
pub(crate) const DOWNLOADS: SessionLog = SessionLog(DOWNLOAD_LOG_TABLE);

fn log_ident(log: SessionLog) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()),
        log.0.to_string(),
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
        NestedField::optional(12, "owner", string()),
    ];
    Ok(Schema::builder()
        .with_fields(fields.into_iter().map(Arc::new))
        .build()?)
}

/// The log table of `catalog`, created on first use.
pub(crate) async fn log_table(catalog: &IcebergCatalog, log: SessionLog) -> Result<Table> {
    catalog.table_or_create(&log_ident(log), log_schema).await
}

/// Appends `record` to the log of `catalog`.
pub(crate) async fn append<S: Display>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    record: &SessionRecord<S>,
) -> Result<()> {
    let table = log_table(catalog, log).await?;
    let rows = [vec![
        Value::from(record.id.clone()),
        Value::from(record.state.to_string()),
        Value::from(record.target.clone()),
        Value::from(record.staging.clone()),
        Value::from(record.created_at),
        Value::from(record.expires_at),
        Value::from(Some(record.recorded_at.unwrap_or_else(Utc::now))),
        Value::from(record.rows),
        Value::from(record.files),
        Value::from(record.snapshot_id),
        Value::from(record.message.clone()),
        Value::from(record.owner.clone()),
    ]];
    append_rows(catalog, &table, &rows).await
}

/// The latest record of `upload_id` in the log of `catalog`.
pub(crate) async fn lookup<S: FromStr<Err = Error>>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    id: &str,
) -> Result<Option<SessionRecord<S>>> {
    let records = read(catalog, log, Some(id)).await?;
    Ok(records.into_iter().max_by_key(|r| r.recorded_at))
}

/// The latest record of session `id` in the log of whichever catalog holds
/// it (a session lives in one catalog).
pub(crate) async fn find<S: FromStr<Err = Error>>(
    icestage: &Icestage,
    log: SessionLog,
    id: &str,
) -> Result<Option<SessionRecord<S>>> {
    for catalog in icestage.catalogs() {
        if let Some(record) = lookup(catalog, log, id).await? {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// The latest record of every upload in the log of `catalog`.
pub(crate) async fn latest_records<S: FromStr<Err = Error>>(
    catalog: &IcebergCatalog,
    log: SessionLog,
) -> Result<Vec<SessionRecord<S>>> {
    let mut latest: std::collections::HashMap<String, SessionRecord<S>> = Default::default();
    for record in read(catalog, log, None).await? {
        match latest.get(&record.id) {
            Some(seen) if seen.recorded_at >= record.recorded_at => {}
            _ => {
                latest.insert(record.id.clone(), record);
            }
        }
    }
    Ok(latest.into_values().collect())
}

async fn read<S: FromStr<Err = Error>>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    upload_id: Option<&str>,
) -> Result<Vec<SessionRecord<S>>> {
    let table = match catalog.catalog().load_table(&log_ident(log)).await {
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
        records.extend(decode(batch, catalog.name())?);
    }
    if let Some(id) = upload_id {
        records.retain(|r| r.id == id);
    }
    Ok(records)
}

fn decode<S: FromStr<Err = Error>>(
    batch: &RecordBatch,
    catalog: &str,
) -> Result<Vec<SessionRecord<S>>> {
    let column = |name: &str, to: &DataType| -> Result<Arc<dyn Array>> {
        let array = batch.column_by_name(name).ok_or_else(|| {
            Error::invalid(format!(
                "the upload log has no column '{name}': it was not written by icestage"
            ))
        })?;
        Ok(cast(array, to)?)
    };
    let time_type = DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
    let strings: Vec<Arc<dyn Array>> = [
        "upload_id",
        "state",
        "target_table",
        "staging_table",
        "message",
        "owner",
    ]
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
            Ok(SessionRecord {
                id: string(0, row).unwrap_or_default(),
                state: string(1, row).unwrap_or_default().parse()?,
                catalog: catalog.to_string(),
                target: string(2, row).unwrap_or_default(),
                staging: string(3, row).unwrap_or_default(),
                message: string(4, row),
                owner: string(5, row),
                rows: long(0, row),
                files: long(1, row),
                snapshot_id: long(2, row),
                findings: None,
                created_at: time(0, row),
                expires_at: time(1, row),
                recorded_at: time(2, row),
            })
        })
        .collect()
}
