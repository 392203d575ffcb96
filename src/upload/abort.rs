//! `ABORT UPLOAD '<id>'`: discard a session's staged rows. Refused once a
//! promotion holds the session, so a promotion's files are never purged.

use std::fmt;

use super::validation::load_target;
use super::{
    Staging, UploadId, UploadState, find_staging, promoted_snapshot, validation::findings,
};
use crate::catalog::Catalogs;
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::log;
use crate::session::operation::Operation;

result_row! {
    /// What `ABORT UPLOAD` left.
    #[derive(Debug, Clone, PartialEq)]
    pub struct UploadAborted {
        /// The session.
        pub upload_id: UploadId,
        /// `aborted` (or `expired`, when expiry got there first).
        pub state: UploadState,
    }
}

/// `ABORT UPLOAD '<id>'`.
#[derive(Debug)]
pub(crate) struct AbortUpload {
    pub(crate) id: UploadId,
}

impl Operation for AbortUpload {
    const NAME: &'static str = "AbortUpload";
    type Outcome = UploadAborted;

    async fn run(&self, ctx: &CommandContext) -> Result<UploadAborted> {
        abort_upload(ctx, &self.id).await
    }
}

impl fmt::Display for AbortUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upload={}", self.id)
    }
}

async fn abort_upload(ctx: &CommandContext, id: &UploadId) -> Result<UploadAborted> {
    let state = abort(&ctx.icestage, id).await?;
    Ok(UploadAborted {
        upload_id: id.clone(),
        state,
    })
}

async fn abort(icestage: &Catalogs, id: &UploadId) -> Result<UploadState> {
    if let Some(staging) = find_staging(icestage, id).await? {
        match discard(staging, UploadState::Aborted).await {
            Ok(()) => return Ok(UploadState::Aborted),
            // The session ended meanwhile (a promotion finished and removed
            // its table): answer with how it ended.
            Err(e) if e.kind() == crate::error::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    match log::find::<UploadState>(icestage, log::UPLOADS, id.as_str()).await? {
        Some(record) => match record.state {
            // Aborting twice is harmless.
            UploadState::Aborted | UploadState::Expired => Ok(record.state),
            state => Err(Error::UploadState {
                id: id.to_string(),
                state: state.to_string(),
                hint: format!(
                    "its rows are in {}{}; a promoted upload cannot be aborted",
                    record.target,
                    record
                        .snapshot_id
                        .map(|s| format!(" (snapshot {s})"))
                        .unwrap_or_default()
                ),
            }),
        },
        None => Err(Error::UnknownUpload(id.to_string())),
    }
}

/// Marks the session `state` (aborted or expired), records it and purges the
/// staging table with its data files.
pub(crate) async fn discard(mut staging: Staging, state: UploadState) -> Result<()> {
    staging
        .transition(
            // `promoting` only when its claim lapsed (the promotion died).
            &[
                UploadState::Open,
                UploadState::Failed,
                UploadState::Aborted,
                UploadState::Expired,
                UploadState::Promoting,
            ],
            state,
            None,
        )
        .await
        .map_err(|e| match e {
            Error::UploadState { id, state: now, .. } if now == UploadState::Promoting.as_str() => {
                Error::UploadState {
                    hint: format!(
                        "a PROMOTE UPLOAD holds it; wait for it to end (SELECT * FROM upload_status('{id}')), \
                         or, if it died, for its claim to lapse, then ABORT UPLOAD '{id}' again"
                    ),
                    id,
                    state: now,
                }
            }
            other => other,
        })?;
    // Defensive: never purge files a promotion registered in the target.
    if let Ok(target) = load_target(&staging).await
        && let Some(snapshot_id) = promoted_snapshot(&target, &staging)
    {
        return Err(Error::UploadState {
            id: staging.id.to_string(),
            state: UploadState::Promoted.to_string(),
            hint: format!(
                "its rows are in {} (snapshot {snapshot_id}); run PROMOTE UPLOAD '{}' to finish its clean-up",
                staging.target, staging.id
            ),
        });
    }
    log::append(&staging.catalog, log::UPLOADS, &staging.record(state)).await?;
    findings::discard(&staging.catalog, &staging.id).await?;
    staging
        .catalog
        .remove_table(&staging.table, crate::catalog::Removal::Everything)
        .await
}
