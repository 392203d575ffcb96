//! `PROMOTE UPLOAD '<id>'`: validate the staging table against its target,
//! commit its rows into the target exactly once, then retire the session.
//!
//! The steps, in order:
//! 1. find the session; if the target already holds a snapshot with
//!    `upload-id=<id>`, only the clean-up is left (a crash or a concurrent
//!    promotion got there first);
//! 2. claim it (`state=promoting`, a compare-and-swap on the staging table);
//! 3. validate ([`super::validate`]): what the metadata answers (drift,
//!    operations, required NULLs), then the target's rules; row-level
//!    findings go to `upload_findings('<id>')`, and any problem stops here
//!    with the target untouched (`WITH (dry_run = true)` always stops here);
//! 4. commit: register the staging data files in the target with one
//!    `fast_append` carrying `upload-id=<id>` (no data rewritten). The commit
//!    runs through a catalog that re-checks the evidence on every load, and
//!    `Transaction::commit` loads the table at the start of each attempt, so
//!    none of its retries can append twice;
//! 5. record the outcome in the upload log, drop the staging table without
//!    purging (its data files now belong to the target) and delete its
//!    metadata files.

use chrono::Utc;
use datafusion::arrow::array::RecordBatch;
use iceberg::table::Table;

use super::validate::{Matching, Validation, schema_drift, validate};
use super::{
    SNAPSHOT_UPLOAD_ID, Staging, UploadId, UploadRecord, UploadState, failpoint, find_staging,
    findings, is_missing, log, promoted_snapshot, transfer,
};
use crate::catalog::commit::{append_once, summary_count};
use crate::context::Icestage;
use crate::error::{Error, Result};
use crate::plan::command::{CommandContext, promote_schema};
use crate::plan::rows::{Value, batch};

/// How the rows reached the target.
pub(crate) const PATH_ZERO_COPY: &str = "zero_copy";
/// Nothing was committed (an empty upload, or an earlier promotion did it).
pub(crate) const PATH_NONE: &str = "none";
/// Validation only (`WITH (dry_run = true)`).
pub(crate) const PATH_DRY_RUN: &str = "dry_run";
/// Staged files copied into the target's storage, then registered.
pub(crate) const PATH_COPY: &str = "copy";
/// Staged rows rewritten as new files with the target's field ids.
pub(crate) const PATH_REWRITE: &str = "rewrite";

/// How the staged rows reach the target: registered as they are when the
/// field ids match and the files outlive the staging table; copied when
/// only the ids match; rewritten otherwise.
fn transfer_path(staging: &Staging, target: &Table) -> &'static str {
    let same_ids = schema_drift(
        staging.table.metadata().current_schema(),
        target.metadata().current_schema(),
        Matching::ById,
    )
    .is_empty();
    match (same_ids, staging.catalog.files_outlive_tables()) {
        (true, true) => PATH_ZERO_COPY,
        (true, false) => PATH_COPY,
        (false, _) => PATH_REWRITE,
    }
}

/// The result of a promotion.
#[derive(Debug, Clone)]
pub(crate) struct Promotion {
    pub(crate) id: UploadId,
    pub(crate) state: UploadState,
    pub(crate) rows: i64,
    pub(crate) files: i64,
    pub(crate) snapshot_id: Option<i64>,
    pub(crate) path: &'static str,
    pub(crate) findings: i64,
    pub(crate) message: String,
}

impl Promotion {
    fn row(&self) -> Vec<Value> {
        vec![
            Value::from(self.id.to_string()),
            Value::from(self.state.as_str()),
            Value::from(self.rows),
            Value::from(self.files),
            Value::from(self.snapshot_id),
            Value::from(self.path),
            Value::from(self.findings),
            Value::from(self.message.clone()),
        ]
    }
}

pub(crate) async fn promote_upload(
    ctx: &CommandContext,
    id: &str,
    dry_run: bool,
) -> Result<RecordBatch> {
    let id = UploadId::parse(id)?;
    let promotion = if dry_run {
        promote_once(&ctx.icestage, &id, true).await?
    } else {
        promote(&ctx.icestage, &id).await?
    };
    batch(promote_schema(), &[promotion.row()])
}

/// Promotes upload `id`; see the module documentation.
pub(crate) async fn promote(icestage: &Icestage, id: &UploadId) -> Result<Promotion> {
    match promote_once(icestage, id, false).await {
        Ok(promotion) => Ok(promotion),
        // A concurrent promotion may have finished while this one was
        // working (and dropped the staging table under it): that is success.
        Err(error) => match log::find(icestage, log::UPLOADS, id.as_str()).await {
            Ok(Some(record)) => already_promoted(id, &record).ok_or(error),
            _ => Err(error),
        },
    }
}

async fn promote_once(icestage: &Icestage, id: &UploadId, dry_run: bool) -> Result<Promotion> {
    let Some(mut staging) = find_staging(icestage, id).await? else {
        let record = log::find(icestage, log::UPLOADS, id.as_str()).await?;
        return match record.as_ref().and_then(|r| already_promoted(id, r)) {
            Some(promotion) => Ok(promotion),
            None => Err(closed_or_unknown(id, record)),
        };
    };
    let target = load_target(&staging).await?;
    if let Some(snapshot_id) = promoted_snapshot(&target, id) {
        let (rows, files) = snapshot_counts(&target, snapshot_id);
        // Committed earlier: the files were registered as the target's own
        // only on the zero-copy path, where the catalog keeps them.
        finish(&staging, Some(snapshot_id), rows, files, true).await?;
        return Ok(Promotion {
            id: id.clone(),
            rows,
            files,
            snapshot_id: Some(snapshot_id),
            path: PATH_NONE,
            findings: 0,
            message: already_message(&staging.target.to_string(), snapshot_id),
            state: UploadState::Promoted,
        });
    }
    if matches!(staging.state, UploadState::Aborted | UploadState::Expired) {
        return Err(Error::UploadClosed {
            id: id.to_string(),
            state: staging.state.to_string(),
            target: staging.target.to_string(),
        });
    }
    if staging.is_expired(Utc::now()) {
        return Err(Error::UploadState {
            id: id.to_string(),
            state: UploadState::Expired.to_string(),
            hint: format!(
                "it expired at {} and can no longer be promoted; EXPIRE STAGING removes it. \
                 Open a new upload with CREATE UPLOAD FOR {}",
                staging
                    .expires_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default(),
                staging.target
            ),
        });
    }
    if dry_run {
        return dry_run_validation(&mut staging, &target).await;
    }
    staging
        .transition(
            &[
                UploadState::Open,
                UploadState::Failed,
                UploadState::Promoting,
            ],
            UploadState::Promoting,
            None,
        )
        .await?;

    let validation = validate(&staging, &target).await?;
    record_findings(&staging, &validation).await?;
    staging.findings = Some(validation.finding_count() as i64);
    if !validation.passed() {
        let lines = validation.summary(id.as_str());
        // If another process moved the session meanwhile, its state wins;
        // the reasons are still reported to this caller.
        let _ = staging
            .transition(
                &[UploadState::Promoting],
                UploadState::Failed,
                Some(&lines.join("; ")),
            )
            .await;
        return Err(Error::ValidationFailed {
            id: id.to_string(),
            target: staging.target.to_string(),
            staging: staging.name(),
            reasons: lines,
        });
    }
    failpoint("promote.after-validation");

    let rows = validation.rows;
    if validation.files.is_empty() {
        finish(&staging, None, 0, 0, false).await?;
        return Ok(Promotion {
            id: id.clone(),
            state: UploadState::Promoted,
            rows: 0,
            files: 0,
            snapshot_id: None,
            path: PATH_NONE,
            findings: 0,
            message: format!("the upload was empty: {} is unchanged", staging.target),
        });
    }
    let path = transfer_path(&staging, &target);
    let data_files = match path {
        PATH_ZERO_COPY => validation.files,
        PATH_COPY => transfer::copy_files(&staging, &target, &validation.files).await?,
        _ => transfer::rewrite(&staging, &target).await?,
    };
    let files = data_files.len() as i64;
    let (snapshot_id, committed_here) = append_once(
        &staging.catalog,
        &target,
        data_files,
        SNAPSHOT_UPLOAD_ID,
        id.as_str(),
    )
    .await?;
    failpoint("promote.after-commit");
    finish(
        &staging,
        Some(snapshot_id),
        rows,
        files,
        path == PATH_ZERO_COPY,
    )
    .await?;
    let how = match path {
        PATH_ZERO_COPY => "without rewriting data",
        PATH_COPY => "after copying the files into the target's storage",
        _ => "after rewriting the rows with the target's field ids",
    };
    let message = if committed_here {
        format!(
            "committed {rows} row(s) in {files} file(s) to {} in snapshot {snapshot_id} {how}",
            staging.target
        )
    } else {
        already_message(&staging.target.to_string(), snapshot_id)
    };
    Ok(Promotion {
        id: id.clone(),
        state: UploadState::Promoted,
        rows,
        files,
        snapshot_id: Some(snapshot_id),
        path: if committed_here { path } else { PATH_NONE },
        findings: 0,
        message,
    })
}

/// `WITH (dry_run = true)`: validates and records the findings; commits nothing.
async fn dry_run_validation(staging: &mut Staging, target: &Table) -> Result<Promotion> {
    let validation = validate(staging, target).await?;
    record_findings(staging, &validation).await?;
    staging.findings = Some(validation.finding_count() as i64);
    let lines = validation.summary(staging.id.as_str());
    let (state, message) = if validation.passed() {
        (
            UploadState::Open,
            format!(
                "dry run: {} row(s) in {} file(s) pass every check; nothing was committed",
                validation.rows,
                validation.files.len()
            ),
        )
    } else {
        (
            UploadState::Failed,
            format!("dry run: {}", lines.join("; ")),
        )
    };
    staging
        .transition(
            &[UploadState::Open, UploadState::Failed],
            state,
            Some(&lines.join("; ")),
        )
        .await?;
    Ok(Promotion {
        id: staging.id.clone(),
        state,
        rows: validation.rows,
        files: validation.files.len() as i64,
        snapshot_id: None,
        path: PATH_DRY_RUN,
        findings: validation.finding_count() as i64,
        message,
    })
}

/// Stores the row-level findings of `validation` (or removes stale ones).
async fn record_findings(staging: &Staging, validation: &Validation) -> Result<()> {
    if validation.findings.is_empty() {
        findings::discard(&staging.catalog, &staging.id).await
    } else {
        findings::replace(&staging.catalog, &staging.id, &validation.findings).await
    }
}

fn already_message(target: &str, snapshot_id: i64) -> String {
    format!("already promoted into {target} in snapshot {snapshot_id}; nothing changed")
}

/// The promotion an upload's log record tells of, if it was promoted.
fn already_promoted(id: &UploadId, record: &UploadRecord) -> Option<Promotion> {
    if record.state != UploadState::Promoted {
        return None;
    }
    let message = match record.snapshot_id {
        Some(snapshot_id) => already_message(&record.target, snapshot_id),
        None => "already promoted (the upload was empty); nothing changed".to_string(),
    };
    Some(Promotion {
        id: id.clone(),
        rows: record.rows.unwrap_or(0),
        files: record.files.unwrap_or(0),
        snapshot_id: record.snapshot_id,
        path: PATH_NONE,
        findings: 0,
        message,
        state: UploadState::Promoted,
    })
}

/// The error for an id with no staging table, from its log record:
/// aborted, expired, or (no record) unknown.
fn closed_or_unknown(id: &UploadId, record: Option<UploadRecord>) -> Error {
    match record {
        Some(record) => Error::UploadClosed {
            id: id.to_string(),
            state: record.state.to_string(),
            target: record.target,
        },
        None => Error::UnknownUpload(id.to_string()),
    }
}

pub(crate) async fn load_target(staging: &Staging) -> Result<Table> {
    staging
        .catalog
        .catalog()
        .load_table(&staging.target)
        .await
        .map_err(|e| {
            if is_missing(&e) {
                Error::TableNotFound {
                    table: staging.target.to_string(),
                    hint: format!(
                        ": it is the target of upload '{}', whose rows stay in {} until the upload \
                         expires; ABORT UPLOAD '{}' discards them",
                        staging.id,
                        staging.name(),
                        staging.id
                    ),
                }
            } else {
                e.into()
            }
        })
}

fn snapshot_counts(table: &Table, snapshot_id: i64) -> (i64, i64) {
    let snapshot = table.metadata().snapshot_by_id(snapshot_id);
    let count = |key: &str| summary_count(snapshot, key).unwrap_or(0);
    (count("added-records"), count("added-data-files"))
}

/// Records the promotion and removes the staging table: without its data
/// files when the target now references them (`keep_data`), else purged.
async fn finish(
    staging: &Staging,
    snapshot_id: Option<i64>,
    rows: i64,
    files: i64,
    keep_data: bool,
) -> Result<()> {
    let record = UploadRecord {
        rows: Some(rows),
        files: Some(files),
        snapshot_id,
        message: None,
        ..staging.record(UploadState::Promoted)
    };
    log::append(&staging.catalog, log::UPLOADS, &record).await?;
    failpoint("promote.before-drop");
    findings::discard(&staging.catalog, &staging.id).await?;
    staging
        .catalog
        .remove_table(&staging.table, keep_data)
        .await
}
