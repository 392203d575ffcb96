//! `upload_status('<id>')` and `uploads()`: where sessions stand, read from
//! the staging tables, the targets' snapshots and the upload logs.

use std::collections::{HashMap, HashSet};
use std::fmt;

use chrono::{DateTime, Utc};
use iceberg::TableIdent;
use iceberg::table::Table;

use super::{
    Staging, UploadId, UploadRecord, UploadState, find_staging, list_staging, promoted_snapshot,
    validation::findings,
};
use crate::catalog::Catalogs;
use crate::catalog::commit::summary_count;
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::log;
use crate::session::operation::Operation;
pub use crate::upload::validation::findings::UploadFinding;

result_row! {
    /// Where an upload stands: a row of `upload_status(id)` and `uploads()`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct UploadStatus {
        /// The session's id.
        pub upload_id: UploadId,
        /// Where it stands.
        pub state: UploadState,
        /// The catalog of its tables.
        pub catalog: String,
        /// The table its rows are promoted into.
        pub target_table: String,
        /// The staging table (gone once the session ended).
        pub staging_table: String,
        /// When it was opened.
        pub created_at: Option<DateTime<Utc>>,
        /// When `EXPIRE STAGING` may remove it.
        pub expires_at: Option<DateTime<Utc>>,
        /// Rows staged, or promoted.
        pub rows: Option<i64>,
        /// Data files staged, or promoted.
        pub files: Option<i64>,
        /// The target snapshot holding its rows, once promoted.
        pub snapshot_id: Option<i64>,
        /// Rule violations the last validation found.
        pub findings: Option<i64>,
        /// Why it is where it is (a failure's reasons, what to do next).
        pub message: Option<String>,
        /// Who it belongs to, if anyone.
        pub owner: Option<String>,
    }
}

impl From<UploadRecord> for UploadStatus {
    fn from(record: UploadRecord) -> Self {
        Self {
            upload_id: UploadId(record.id),
            state: record.state,
            catalog: record.catalog,
            target_table: record.target,
            staging_table: record.staging,
            created_at: record.created_at,
            expires_at: record.expires_at,
            rows: record.rows,
            files: record.files,
            snapshot_id: record.snapshot_id,
            // A promotion proves its upload has none. The log that outlives
            // the staging table keeps no count, so a promoted upload said 0
            // and then, once its staging table was dropped, nothing.
            findings: record.findings.or(matches!(
                record.state,
                UploadState::Promoted | UploadState::Published
            )
            .then_some(0)),
            message: record.message,
            owner: record.owner,
        }
    }
}

/// The record of a live session; `target` is its target table when it
/// could be loaded (to see whether the promotion committed).
fn live_record(staging: &Staging, target: Option<&Table>, now: DateTime<Utc>) -> UploadRecord {
    let evidence = target.and_then(|t| promoted_snapshot(t, staging));
    // Promoted: what the target's snapshot added (the staging table's own
    // summary is the client's, and some writers leave its totals out);
    // otherwise what the staging table holds.
    let (snapshot, rows_key, files_key) = match (target, evidence) {
        (Some(target), Some(id)) => (
            target.metadata().snapshot_by_id(id),
            "added-records",
            "added-data-files",
        ),
        _ => (
            staging.table.metadata().current_snapshot(),
            "total-records",
            "total-data-files",
        ),
    };
    let count = |key: &str| summary_count(snapshot, key).or(Some(0));
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
        None if staging.state == UploadState::Promoting
            && !super::claim_alive(staging.table.metadata().properties(), now) =>
        {
            (
                UploadState::Promoting,
                Some(format!(
                    "its promotion stopped before it finished (the process promoting it is \
                     gone); PROMOTE UPLOAD '{}' finishes it, as does the service when the \
                     upload is next looked at",
                    staging.id
                )),
            )
        }
        None => (staging.state, staging.message.clone().filter(|m| !m.is_empty())),
    };
    UploadRecord {
        recorded_at: None,
        rows: count(rows_key),
        files: count(files_key),
        snapshot_id: evidence,
        message,
        ..staging.record(state)
    }
}

async fn load(staging: &Staging, target: &TableIdent) -> Option<Table> {
    staging.catalog.catalog().load_table(target).await.ok()
}

/// The status of upload `id`, if any catalog knows it.
pub(crate) async fn status_of(icestage: &Catalogs, id: &UploadId) -> Result<Option<UploadRecord>> {
    if let Some(staging) = find_staging(icestage, id).await? {
        let target = load(&staging, &staging.target).await;
        return Ok(Some(live_record(&staging, target.as_ref(), Utc::now())));
    }
    log::find(icestage, log::UPLOADS, id.as_str()).await
}

/// `upload_status('<id>')`.
#[derive(Debug)]
pub(crate) struct ShowUpload {
    pub(crate) id: UploadId,
}

impl Operation for ShowUpload {
    const NAME: &'static str = "UploadStatus";
    type Outcome = UploadStatus;

    async fn run(&self, ctx: &CommandContext) -> Result<UploadStatus> {
        upload_status(ctx, &self.id).await
    }
}

impl fmt::Display for ShowUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upload={}", self.id)
    }
}

/// `uploads()`.
#[derive(Debug)]
pub(crate) struct ListUploads;

impl Operation for ListUploads {
    const NAME: &'static str = "ListUploads";
    type Outcome = Vec<UploadStatus>;

    async fn run(&self, ctx: &CommandContext) -> Result<Vec<UploadStatus>> {
        list_uploads_since(ctx, None).await
    }
}

impl fmt::Display for ListUploads {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}

/// `upload_findings('<id>')`.
#[derive(Debug)]
pub(crate) struct UploadFindings {
    pub(crate) id: UploadId,
}

impl Operation for UploadFindings {
    const NAME: &'static str = "UploadFindings";
    type Outcome = Vec<UploadFinding>;

    async fn run(&self, ctx: &CommandContext) -> Result<Vec<UploadFinding>> {
        upload_findings(ctx, &self.id).await
    }
}

impl fmt::Display for UploadFindings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upload={}", self.id)
    }
}

async fn upload_status(ctx: &CommandContext, id: &UploadId) -> Result<UploadStatus> {
    let status = status_of(&ctx.icestage, id)
        .await?
        .ok_or_else(|| Error::UnknownUpload(id.to_string()))?;
    Ok(status.into())
}

async fn upload_findings(ctx: &CommandContext, id: &UploadId) -> Result<Vec<UploadFinding>> {
    let found = match find_staging(&ctx.icestage, id).await? {
        Some(staging) => findings::read(&staging.catalog, id)
            .await?
            .unwrap_or_default(),
        // Findings go away with the staging table; a finished upload has
        // none, unless a publication of its rows was refused since.
        None => match status_of(&ctx.icestage, id).await? {
            Some(record) => findings::read(ctx.icestage.catalog(&record.catalog)?, id)
                .await?
                .unwrap_or_default(),
            None => return Err(Error::UnknownUpload(id.to_string())),
        },
    };
    Ok(found.into_iter().map(|f| f.of_upload(id)).collect())
}

/// The open uploads, and the ended ones recorded since `since` (all of
/// them when `None`).
pub(crate) async fn list_uploads_since(
    ctx: &CommandContext,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<UploadStatus>> {
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
        for record in log::latest_records::<UploadState>(catalog, log::UPLOADS, since).await? {
            if !live.contains(&record.id) {
                all.push(record);
            }
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(all.into_iter().map(UploadStatus::from).collect())
}
