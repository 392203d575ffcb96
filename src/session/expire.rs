//! `EXPIRE STAGING`: every kind of session ends what is over. The flows
//! (uploads, then downloads) each install what they remove at connect time
//! ([`install_flows`]); this statement runs them in order.

use std::fmt;
use std::sync::OnceLock;

use futures::future::BoxFuture;

use super::CommandContext;
use super::operation::Operation;
use crate::error::{Error, Result};
use crate::rows::result_row;

/// One flow's part of `EXPIRE STAGING`: answers how many of its session
/// tables it removed.
pub(crate) type ExpireFlow = for<'a> fn(&'a CommandContext) -> BoxFuture<'a, Result<i64>>;

static FLOWS: OnceLock<Vec<ExpireFlow>> = OnceLock::new();

/// Installs the flows' expiries, run in this order (once per process;
/// later calls keep the first).
pub(crate) fn install_flows(flows: Vec<ExpireFlow>) {
    let _ = FLOWS.set(flows);
}

result_row! {
    /// What `EXPIRE STAGING` removed.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StagingExpired {
        /// Staging and download tables removed.
        pub tables_removed: i64,
    }
}

/// `EXPIRE STAGING`.
#[derive(Debug)]
pub(crate) struct ExpireStaging;

impl Operation for ExpireStaging {
    const NAME: &'static str = "ExpireStaging";
    type Outcome = StagingExpired;

    async fn run(&self, ctx: &CommandContext) -> Result<StagingExpired> {
        let Some(flows) = FLOWS.get() else {
            return Err(Error::internal(
                "EXPIRE STAGING: no flow installed its expiry (icestage::register installs them); \
                 nothing was removed",
            ));
        };
        let mut removed = 0;
        for flow in flows {
            removed += flow(ctx).await?;
        }
        Ok(StagingExpired {
            tables_removed: removed,
        })
    }
}

impl fmt::Display for ExpireStaging {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}
