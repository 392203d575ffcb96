//! A download's access token for icestage's REST catalog (see
//! [`crate::session::token`]): read-only, issued once the download is ready,
//! only its hash kept on the download table; a new token replaces the last.

use super::{DownloadId, DownloadState, find_download};
use crate::catalog::Catalogs;
use crate::error::{Error, Result};
use crate::session::token::{self, TokenKind};

/// A new read-only access token for download `id`'s table.
pub(crate) async fn issue_access_token(icestage: &Catalogs, id: &DownloadId) -> Result<String> {
    let download = find_download(icestage, id)
        .await?
        .ok_or_else(|| Error::UnknownDownload(id.to_string()))?;
    token::issue_on(
        &download.catalog,
        &download.table,
        TokenKind::Download,
        id.as_str(),
        |state| {
            state
                .parse()
                .is_ok_and(|s: DownloadState| s == DownloadState::Ready)
        },
    )
    .await?
    .map_err(|state| Error::DownloadState {
        id: id.to_string(),
        state,
        hint: format!("a download is read once it is ready; wait with wait_download('{id}')"),
    })
}
