//! `DROP PIPE`.

use std::fmt;

use super::{PipeName, load};
use crate::catalog::{Catalogs, Removal};
use crate::error::Result;
use crate::session::CommandContext;
use crate::session::operation::{Operation, flag};

/// `DROP PIPE [IF EXISTS] <name>`.
#[derive(Debug)]
pub(crate) struct DropPipe {
    pub(crate) name: PipeName,
    pub(crate) if_exists: bool,
}

impl Operation for DropPipe {
    const NAME: &'static str = "DropPipe";
    type Outcome = bool;

    async fn run(&self, ctx: &CommandContext) -> Result<bool> {
        drop_pipe(&ctx.icestage, &self.name, self.if_exists).await
    }
}

impl fmt::Display for DropPipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.name, flag(self.if_exists, "if_exists"))
    }
}

/// `DROP PIPE [IF EXISTS] <name>`: the pipe and its runs; what it loaded
/// stays.
async fn drop_pipe(icestage: &Catalogs, name: &PipeName, if_exists: bool) -> Result<bool> {
    let catalog = name.catalog(icestage)?;
    if if_exists && !catalog.catalog().table_exists(&name.table()).await? {
        return Ok(false);
    }
    let pipe = load(icestage, name).await?;
    catalog
        .remove_table(&pipe.table, Removal::Everything)
        .await?;
    Ok(true)
}
