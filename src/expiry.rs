//! `EXPIRE STAGING`: removes staging tables whose upload expired (and download
//! tables whose download expired), finishes
//! promotions that committed but did not clean up, and completes discards
//! that were interrupted.

use chrono::Utc;

use crate::error::Result;
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::upload::abort::discard;
use crate::upload::promote::{load_target, promote};
use crate::upload::{UploadState, list_staging, promoted_snapshot};

result_row! {
    /// What `EXPIRE STAGING` removed.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StagingExpired {
        /// Staging and download tables removed.
        pub tables_removed: i64,
    }
}

pub(crate) async fn expire_staging(ctx: &CommandContext) -> Result<StagingExpired> {
    let now = Utc::now();
    let mut removed = 0i64;
    for catalog in ctx.icestage.catalogs() {
        for staging in list_staging(catalog).await? {
            let promoted = match load_target(&staging).await {
                Ok(target) => promoted_snapshot(&target, &staging.id).is_some(),
                Err(_) => false,
            };
            if promoted {
                promote(&ctx.icestage, &staging.id, Default::default()).await?;
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
                UploadState::Promoting if staging.is_expired(now) => {
                    discard(staging, UploadState::Expired).await?;
                    removed += 1;
                }
                UploadState::Promoting | UploadState::Promoted => {}
                UploadState::Open | UploadState::Failed if staging.is_expired(now) => {
                    discard(staging, UploadState::Expired).await?;
                    removed += 1;
                }
                UploadState::Open | UploadState::Failed => {}
            }
        }
    }
    removed += crate::download::status::expire(&ctx.icestage).await?;
    Ok(StagingExpired {
        tables_removed: removed,
    })
}
