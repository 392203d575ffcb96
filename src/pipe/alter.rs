//! `ALTER PIPE <name> PAUSE | RESUME`.

use std::collections::HashMap;
use std::fmt;

use super::status::{PipeStatus, status};
use super::{PROP_STATE, PipeName, PipeState, load};
use crate::catalog::Catalogs;
use crate::catalog::commit::swap_properties;
use crate::error::Result;
use crate::session::CommandContext;
use crate::session::operation::Operation;

/// `ALTER PIPE <name> PAUSE | RESUME`.
#[derive(Debug)]
pub(crate) struct AlterPipe {
    pub(crate) name: PipeName,
    pub(crate) state: PipeState,
}

impl Operation for AlterPipe {
    const NAME: &'static str = "AlterPipe";
    type Outcome = PipeStatus;

    async fn run(&self, ctx: &CommandContext) -> Result<PipeStatus> {
        set_state(&ctx.icestage, &self.name, self.state).await
    }
}

impl fmt::Display for AlterPipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.state)
    }
}

/// `ALTER PIPE <name> PAUSE | RESUME`.
async fn set_state(icestage: &Catalogs, name: &PipeName, state: PipeState) -> Result<PipeStatus> {
    let pipe = load(icestage, name).await?;
    let catalog = name.catalog(icestage)?;
    swap_properties(
        catalog,
        &pipe.table,
        PROP_STATE,
        |_| true,
        HashMap::from([(PROP_STATE.to_string(), state.to_string())]),
    )
    .await?;
    status(icestage, name).await
}
