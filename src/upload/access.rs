//! An upload's access token for icestage's REST catalog (see
//! [`crate::session::token`]): issued while the session is open or failed,
//! only its hash kept on the staging table; a new token replaces the last.

use super::{UploadId, UploadState, find_staging};
use crate::catalog::Catalogs;
use crate::error::{Error, Result};
use crate::session::token::{self, TokenKind};

/// A new access token for upload `id`'s staging table.
pub(crate) async fn issue_access_token(icestage: &Catalogs, id: &UploadId) -> Result<String> {
    let staging = find_staging(icestage, id)
        .await?
        .ok_or_else(|| Error::UnknownUpload(id.to_string()))?;
    let writable = |state: &str| {
        state
            .parse()
            .is_ok_and(|s| matches!(s, UploadState::Open | UploadState::Failed))
    };
    token::issue_on(
        &staging.catalog,
        &staging.table,
        TokenKind::Upload,
        id.as_str(),
        writable,
    )
    .await?
    .map_err(|state| Error::UploadState {
        id: id.to_string(),
        state,
        hint: "an upload's rows can be written only while it is open or failed".to_string(),
    })
}
