//! `ALTER PIPE <name> PAUSE | RESUME`.

use std::collections::HashMap;

use super::status::{PipeStatus, status};
use super::{PROP_STATE, PipeName, PipeState, load};
use crate::catalog::Catalogs;
use crate::catalog::commit::swap_properties;
use crate::error::Result;

/// `ALTER PIPE <name> PAUSE | RESUME`.
pub(crate) async fn set_state(
    icestage: &Catalogs,
    name: &PipeName,
    state: PipeState,
) -> Result<PipeStatus> {
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
