//! `DROP PIPE`.

use super::{PipeName, load};
use crate::catalog::{Catalogs, Removal};
use crate::error::Result;

/// `DROP PIPE [IF EXISTS] <name>`: the pipe and its runs; what it loaded
/// stays.
pub(crate) async fn drop_pipe(
    icestage: &Catalogs,
    name: &PipeName,
    if_exists: bool,
) -> Result<bool> {
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
