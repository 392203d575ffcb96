//! `upload_status('<id>')` and `uploads()`: where sessions stand, read from
//! the staging tables, the targets' snapshots and the upload logs.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use datafusion::arrow::array::RecordBatch;
use iceberg::TableIdent;
use iceberg::table::Table;

use super::{
    Staging, UploadId, UploadRecord, UploadState, find_staging, findings, list_staging,
    promoted_snapshot,
};
use crate::catalog::Icestage;
use crate::catalog::commit::summary_count;
use crate::error::{Error, Result};
use crate::rows::findings_schema;
use crate::rows::status_schema;
use crate::rows::{Value, batch};
use crate::session::CommandContext;
use crate::session::log;

/// The record of a live session; `target` is its target table when it
/// could be loaded (to see whether the promotion committed).
fn live_record(staging: &Staging, target: Option<&Table>, now: DateTime<Utc>) -> UploadRecord {
    let snapshot = staging.table.metadata().current_snapshot();
    let count = |key: &str| summary_count(snapshot, key).or(Some(0));
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
    UploadRecord {
        recorded_at: None,
        rows: count("total-records"),
        files: count("total-data-files"),
        snapshot_id: evidence,
        message,
        ..staging.record(state)
    }
}

async fn load(staging: &Staging, target: &TableIdent) -> Option<Table> {
    staging.catalog.catalog().load_table(target).await.ok()
}

/// The status of upload `id`, if any catalog knows it.
pub(crate) async fn status_of(icestage: &Icestage, id: &UploadId) -> Result<Option<UploadRecord>> {
    if let Some(staging) = find_staging(icestage, id).await? {
        let target = load(&staging, &staging.target).await;
        return Ok(Some(live_record(&staging, target.as_ref(), Utc::now())));
    }
    log::find(icestage, log::UPLOADS, id.as_str()).await
}

pub(crate) async fn upload_status(ctx: &CommandContext, id: &str) -> Result<RecordBatch> {
    let id = UploadId::parse(id)?;
    let status = status_of(&ctx.icestage, &id)
        .await?
        .ok_or_else(|| Error::UnknownUpload(id.to_string()))?;
    batch(status_schema(), &[status.row()])
}

pub(crate) async fn upload_findings(ctx: &CommandContext, id: &str) -> Result<RecordBatch> {
    let id = UploadId::parse(id)?;
    let found = match find_staging(&ctx.icestage, &id).await? {
        Some(staging) => findings::read(&staging.catalog, &id)
            .await?
            .unwrap_or_default(),
        // Findings go away with the staging table; a finished upload has none.
        None if status_of(&ctx.icestage, &id).await?.is_some() => vec![],
        None => return Err(Error::UnknownUpload(id.to_string())),
    };
    let rows: Vec<Vec<Value>> = found.iter().map(|f| f.row_values(&id)).collect();
    batch(findings_schema(), &rows)
}

pub(crate) async fn list_uploads(ctx: &CommandContext) -> Result<RecordBatch> {
    let now = Utc::now();
    let mut all: Vec<UploadRecord> = vec![];
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
            all.push(live_record(&staging, target, now));
        }
        for record in log::latest_records::<UploadState>(catalog, log::UPLOADS).await? {
            if !live.contains(&record.id) {
                all.push(record);
            }
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let rows: Vec<Vec<Value>> = all.iter().map(UploadRecord::row).collect();
    batch(status_schema(), &rows)
}
