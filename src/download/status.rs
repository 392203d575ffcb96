//! Where downloads stand (`download_status`, `downloads()`, `wait_download`),
//! and how they end (`DROP DOWNLOAD`, expiry).

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::{Download, DownloadId, DownloadRecord, DownloadState, find_download, list_downloads};
use crate::catalog::Catalogs;
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::log::{self, DOWNLOADS};
use crate::session::operation::Operation;

fn live_record(download: &Download) -> DownloadRecord {
    let mut record = download.record(download.state);
    record.recorded_at = None;
    if download.state == DownloadState::Pending && download.is_expired(Utc::now()) {
        record.message = Some("expired while pending".to_string());
    }
    record
}

fn unknown(id: &DownloadId) -> Error {
    Error::UnknownDownload(id.to_string())
}

/// The status of download `id`, if any catalog knows it. A pending download
/// whose filler stopped answering is marked failed on the way.
pub(crate) async fn status_of(
    icestage: &Catalogs,
    id: &DownloadId,
) -> Result<Option<DownloadRecord>> {
    if let Some(mut download) = find_download(icestage, id).await? {
        download.settle().await?;
        return Ok(Some(live_record(&download)));
    }
    log::find(icestage, DOWNLOADS, id.as_str()).await
}

result_row! {
    /// Where a download stands: a row of `download_status(id)`,
    /// `downloads()` and `wait_download(id)`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct DownloadStatus {
        /// The download's id.
        pub download_id: DownloadId,
        /// Where it stands.
        pub state: DownloadState,
        /// The catalog of its table.
        pub catalog: String,
        /// The table a client reads, `downloads.download_<id>`.
        pub download_table: String,
        /// A JSON object: each source table and the snapshot read.
        pub sources: String => json,
        /// When it was created.
        pub created_at: Option<DateTime<Utc>>,
        /// When `EXPIRE STAGING` may remove it.
        pub expires_at: Option<DateTime<Utc>>,
        /// Rows written.
        pub rows: Option<i64>,
        /// Data files written.
        pub files: Option<i64>,
        /// The download table's snapshot.
        pub snapshot_id: Option<i64>,
        /// Why it failed, or what to do next.
        pub message: Option<String>,
        /// Who it belongs to, if anyone.
        pub owner: Option<String>,
    }
}

impl From<DownloadRecord> for DownloadStatus {
    fn from(record: DownloadRecord) -> Self {
        Self {
            download_id: DownloadId(record.id),
            state: record.state,
            catalog: record.catalog,
            // A download's record keeps its table in `staging` and its
            // sources in `target` (the columns the session log shares with
            // uploads).
            download_table: record.staging,
            sources: record.target,
            created_at: record.created_at,
            expires_at: record.expires_at,
            rows: record.rows,
            files: record.files,
            snapshot_id: record.snapshot_id,
            message: record.message,
            owner: record.owner,
        }
    }
}

result_row! {
    /// What `DROP DOWNLOAD` left.
    #[derive(Debug, Clone, PartialEq)]
    pub struct DownloadDropped {
        /// The download.
        pub download_id: DownloadId,
        /// `dropped` (or how it had ended before).
        pub state: DownloadState,
    }
}

/// `download_status('<id>')`.
#[derive(Debug)]
pub(crate) struct ShowDownload {
    pub(crate) id: DownloadId,
}

impl Operation for ShowDownload {
    const NAME: &'static str = "DownloadStatus";
    type Outcome = DownloadStatus;

    async fn run(&self, ctx: &CommandContext) -> Result<DownloadStatus> {
        download_status(ctx, &self.id).await
    }
}

impl fmt::Display for ShowDownload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "download={}", self.id)
    }
}

/// `downloads()`.
#[derive(Debug)]
pub(crate) struct ListDownloads;

impl Operation for ListDownloads {
    const NAME: &'static str = "ListDownloads";
    type Outcome = Vec<DownloadStatus>;

    async fn run(&self, ctx: &CommandContext) -> Result<Vec<DownloadStatus>> {
        list_since(ctx, None).await
    }
}

impl fmt::Display for ListDownloads {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}

/// `wait_download('<id>' [, timeout])`.
#[derive(Debug)]
pub(crate) struct WaitDownload {
    pub(crate) id: DownloadId,
    pub(crate) timeout: Duration,
}

impl Operation for WaitDownload {
    const NAME: &'static str = "WaitDownload";
    type Outcome = DownloadStatus;

    async fn run(&self, ctx: &CommandContext) -> Result<DownloadStatus> {
        wait_download(ctx, &self.id, self.timeout).await
    }
}

impl fmt::Display for WaitDownload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "download={}, timeout={}s",
            self.id,
            self.timeout.as_secs()
        )
    }
}

/// `DROP DOWNLOAD '<id>'`.
#[derive(Debug)]
pub(crate) struct DropDownload {
    pub(crate) id: DownloadId,
}

impl Operation for DropDownload {
    const NAME: &'static str = "DropDownload";
    type Outcome = DownloadDropped;

    async fn run(&self, ctx: &CommandContext) -> Result<DownloadDropped> {
        drop_download(ctx, &self.id).await
    }
}

impl fmt::Display for DropDownload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "download={}", self.id)
    }
}

async fn download_status(ctx: &CommandContext, id: &DownloadId) -> Result<DownloadStatus> {
    let record = status_of(&ctx.icestage, id)
        .await?
        .ok_or_else(|| unknown(id))?;
    Ok(record.into())
}

/// The live downloads, and the ended ones recorded since `since` (all of
/// them when `None`).
pub(crate) async fn list_since(
    ctx: &CommandContext,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<DownloadStatus>> {
    let mut all = vec![];
    for catalog in ctx.icestage.catalogs() {
        let mut live = HashSet::new();
        for mut download in list_downloads(catalog).await? {
            download.settle().await?;
            live.insert(download.id.to_string());
            all.push(live_record(&download));
        }
        for record in log::latest_records::<DownloadState>(catalog, DOWNLOADS, since).await? {
            if !live.contains(&record.id) {
                all.push(record);
            }
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(all.into_iter().map(DownloadStatus::from).collect())
}

/// Waits (polling the catalog) until the download is no longer pending, or
/// `timeout` passes.
async fn wait_download(
    ctx: &CommandContext,
    id: &DownloadId,
    timeout: Duration,
) -> Result<DownloadStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let record = status_of(&ctx.icestage, id)
            .await?
            .ok_or_else(|| unknown(id))?;
        if record.state != DownloadState::Pending {
            return Ok(record.into());
        }
        if Instant::now() >= deadline {
            return Err(Error::invalid(format!(
                "download '{id}' is still pending after {}s: wait longer with wait_download('{id}', '<duration>') \
                 or check SELECT * FROM download_status('{id}')",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Records the end of `download` as `state` and purges its table.
async fn remove(download: &Download, state: DownloadState) -> Result<()> {
    log::append(&download.catalog, DOWNLOADS, &download.record(state)).await?;
    download
        .catalog
        .remove_table(&download.table, crate::catalog::Removal::Location)
        .await
}

async fn drop_download(ctx: &CommandContext, id: &DownloadId) -> Result<DownloadDropped> {
    let state = match find_download(&ctx.icestage, id).await? {
        Some(download) => {
            remove(&download, DownloadState::Dropped).await?;
            DownloadState::Dropped
        }
        // Dropping twice is harmless.
        None => {
            status_of(&ctx.icestage, id)
                .await?
                .ok_or_else(|| unknown(id))?
                .state
        }
    };
    Ok(DownloadDropped {
        download_id: id.clone(),
        state,
    })
}

/// The download flow's part of `EXPIRE STAGING`: removes downloads whose
/// time ran out; a pending one only once its filler stopped. Answers how
/// many tables were removed.
pub(crate) fn expire(ctx: &CommandContext) -> BoxFuture<'_, Result<i64>> {
    Box::pin(expire_downloads(&ctx.icestage))
}

async fn expire_downloads(icestage: &Catalogs) -> Result<i64> {
    let now = Utc::now();
    let mut removed = 0;
    for catalog in icestage.catalogs() {
        for mut download in list_downloads(catalog).await? {
            download.settle().await?;
            if download.is_expired(now) && download.state != DownloadState::Pending {
                remove(&download, DownloadState::Expired).await?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}
