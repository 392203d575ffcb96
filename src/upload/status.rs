//! `upload_status('<id>')` and `uploads()`: where sessions stand, read from
//! the staging tables, the targets' snapshots and the upload logs.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use datafusion::arrow::array::RecordBatch;
use iceberg::TableIdent;
use iceberg::table::Table;

use super::log::LogRecord;
use super::{Staging, UploadId, UploadState, find_staging, list_staging, log, promoted_snapshot};
use crate::context::Icestage;
use crate::error::{Error, Result};
use crate::plan::command::{CommandContext, status_schema};
use crate::plan::rows::{Value, batch};

/// One row of `upload_status` / `uploads`.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    pub(crate) id: String,
    pub(crate) state: UploadState,
    pub(crate) catalog: String,
    pub(crate) target: String,
    pub(crate) staging: String,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) rows: Option<i64>,
    pub(crate) files: Option<i64>,
    pub(crate) snapshot_id: Option<i64>,
    pub(crate) message: Option<String>,
}

impl Status {
    fn row(&self) -> Vec<Value> {
        vec![
            Value::from(self.id.clone()),
            Value::from(self.state.as_str()),
            Value::from(self.catalog.clone()),
            Value::from(self.target.clone()),
            Value::from(self.staging.clone()),
            Value::from(self.created_at),
            Value::from(self.expires_at),
            Value::from(self.rows),
            Value::from(self.files),
            Value::from(self.snapshot_id),
            Value::from(self.message.clone()),
        ]
    }

    /// A live session; `target` is its target table when it could be loaded.
    fn of_staging(staging: &Staging, target: Option<&Table>, now: DateTime<Utc>) -> Self {
        let summary = staging
            .table
            .metadata()
            .current_snapshot()
            .map(|s| s.summary().additional_properties.clone())
            .unwrap_or_default();
        let count = |key: &str| summary.get(key).and_then(|v| v.parse().ok()).or(Some(0));
        let evidence = target.and_then(|t| promoted_snapshot(t, &staging.id));
        let (state, message) = match evidence {
            Some(_) => (
                UploadState::Promoted,
                Some("promoted; the staging table is removed by the next PROMOTE UPLOAD or EXPIRE STAGING".to_string()),
            ),
            None if matches!(staging.state, UploadState::Open | UploadState::Failed)
                && staging.is_expired(now) =>
            {
                (
                    UploadState::Expired,
                    Some("expired; EXPIRE STAGING removes its staging table".to_string()),
                )
            }
            None => (staging.state, staging.message.clone().filter(|m| !m.is_empty())),
        };
        Self {
            id: staging.id.to_string(),
            state,
            catalog: staging.catalog.name().to_string(),
            target: staging.target.to_string(),
            staging: staging.name(),
            created_at: staging.created_at,
            expires_at: staging.expires_at,
            rows: count("total-records"),
            files: count("total-data-files"),
            snapshot_id: evidence,
            message,
        }
    }

    fn of_record(record: LogRecord, catalog: &str) -> Self {
        Self {
            id: record.upload_id,
            state: record.state,
            catalog: catalog.to_string(),
            target: record.target_table,
            staging: record.staging_table,
            created_at: record.created_at,
            expires_at: record.expires_at,
            rows: record.rows,
            files: record.files,
            snapshot_id: record.snapshot_id,
            message: record.message,
        }
    }
}

async fn load(staging: &Staging, target: &TableIdent) -> Option<Table> {
    staging.catalog.catalog().load_table(target).await.ok()
}

/// The status of upload `id`, if any catalog knows it.
pub(crate) async fn status_of(icestage: &Icestage, id: &UploadId) -> Result<Option<Status>> {
    if let Some(staging) = find_staging(icestage, id).await? {
        let target = load(&staging, &staging.target).await;
        return Ok(Some(Status::of_staging(&staging, target.as_ref(), Utc::now())));
    }
    for catalog in icestage.catalogs() {
        if let Some(record) = log::lookup(catalog, id.as_str()).await? {
            return Ok(Some(Status::of_record(record, catalog.name())));
        }
    }
    Ok(None)
}

pub(crate) async fn upload_status(ctx: &CommandContext, id: &str) -> Result<RecordBatch> {
    let id = UploadId::parse(id)?;
    let status = status_of(&ctx.icestage, &id)
        .await?
        .ok_or_else(|| Error::UnknownUpload(id.to_string()))?;
    batch(status_schema(), &[status.row()])
}

pub(crate) async fn list_uploads(ctx: &CommandContext) -> Result<RecordBatch> {
    let now = Utc::now();
    let mut all: Vec<Status> = vec![];
    for catalog in ctx.icestage.catalogs() {
        let mut live = HashSet::new();
        let mut targets: HashMap<TableIdent, Option<Table>> = HashMap::new();
        for staging in list_staging(catalog).await? {
            if !targets.contains_key(&staging.target) {
                let table = load(&staging, &staging.target).await;
                targets.insert(staging.target.clone(), table);
            }
            let target = targets.get(&staging.target).and_then(|t| t.as_ref());
            live.insert(staging.id.to_string());
            all.push(Status::of_staging(&staging, target, now));
        }
        for record in log::latest_records(catalog).await? {
            if !live.contains(&record.upload_id) {
                all.push(Status::of_record(record, catalog.name()));
            }
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let rows: Vec<Vec<Value>> = all.iter().map(Status::row).collect();
    batch(status_schema(), &rows)
}
