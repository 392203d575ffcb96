//! The upload flow's part in expiry: `EXPIRE STAGING` ends the sessions
//! that are over ([`expire`]), and `EXPIRE SNAPSHOTS` keeps the target
//! snapshots that are an unfinished upload's exactly-once evidence
//! ([`evidence`]).

use std::collections::HashSet;
use std::sync::Arc;

use chrono::Utc;
use futures::future::BoxFuture;
use iceberg::spec::MAIN_BRANCH;
use iceberg::table::Table;

use super::abort::discard;
use super::promote::PromoteUpload;
use super::validation::load_target;
use super::{
    SNAPSHOT_UPLOAD_ID, UploadId, UploadState, list_staging, promoted_snapshot, staging_tables,
};
use crate::catalog::IcebergCatalog;
use crate::catalog::commit::branch::SNAPSHOT_BRANCH;
use crate::catalog::snapshot::ancestry;
use crate::error::Result;
use crate::session::CommandContext;
use crate::session::operation::Operation;

/// The upload flow's part of `EXPIRE STAGING`: removes the staging tables
/// of uploads that expired or were aborted, finishes promotions that
/// committed but did not clean up, and completes interrupted discards.
/// Answers how many staging tables were removed.
pub(crate) fn expire(ctx: &CommandContext) -> BoxFuture<'_, Result<i64>> {
    Box::pin(expire_uploads(ctx))
}

async fn expire_uploads(ctx: &CommandContext) -> Result<i64> {
    let now = Utc::now();
    let mut removed = 0i64;
    for catalog in ctx.icestage.catalogs() {
        for staging in list_staging(catalog).await? {
            let promoted = match load_target(&staging).await {
                Ok(target) => promoted_snapshot(&target, &staging).is_some(),
                Err(_) => false,
            };
            if promoted {
                let finish = PromoteUpload::new(staging.id.clone(), Default::default());
                finish.run(ctx).await?;
                removed += 1;
                continue;
            }
            // A client rewrote its sealed properties: its expiry cannot be
            // believed, and it can never be promoted.
            if staging.tampered.is_some() && !staging.claimed_elsewhere(now) {
                discard(staging, UploadState::Expired).await?;
                removed += 1;
                continue;
            }
            match staging.state {
                UploadState::Aborted | UploadState::Expired => {
                    let state = staging.state;
                    discard(staging, state).await?;
                    removed += 1;
                }
                // A live promotion holds it: never pull files from under it.
                UploadState::Promoting if staging.claimed_elsewhere(now) => {}
                UploadState::Promoting if staging.past_promotion(now) => {
                    discard(staging, UploadState::Expired).await?;
                    removed += 1;
                }
                UploadState::Promoting | UploadState::Promoted | UploadState::Published => {}
                UploadState::Open | UploadState::Failed if staging.is_expired(now) => {
                    discard(staging, UploadState::Expired).await?;
                    removed += 1;
                }
                UploadState::Open | UploadState::Failed => {}
            }
        }
    }
    Ok(removed)
}

/// The snapshots of `table` that `EXPIRE SNAPSHOTS` keeps for the upload
/// flow: those that promoted an upload whose session has not finished (its
/// staging table is still there), and promotions to an audit branch that
/// `PUBLISH UPLOAD` has not put on main yet.
pub(crate) fn evidence(
    catalog: Arc<IcebergCatalog>,
    table: Table,
) -> BoxFuture<'static, Result<HashSet<i64>>> {
    Box::pin(async move {
        let unfinished: HashSet<String> = staging_tables(&catalog)
            .await?
            .iter()
            .map(UploadId::to_string)
            .collect();
        let metadata = table.metadata();
        let on_main: HashSet<&String> = ancestry(metadata, MAIN_BRANCH)
            .filter_map(|s| s.summary().additional_properties.get(SNAPSHOT_UPLOAD_ID))
            .collect();
        Ok(metadata
            .snapshots()
            .filter(|snapshot| {
                let props = &snapshot.summary().additional_properties;
                let Some(upload) = props.get(SNAPSHOT_UPLOAD_ID) else {
                    return false;
                };
                unfinished.contains(upload)
                    || (props.contains_key(SNAPSHOT_BRANCH) && !on_main.contains(upload))
            })
            .map(|snapshot| snapshot.snapshot_id())
            .collect())
    })
}
