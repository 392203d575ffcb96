//! Where downloads stand (`download_status`, `downloads()`, `wait_download`),
//! and how they end (`DROP DOWNLOAD`, expiry).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use datafusion::arrow::array::RecordBatch;

use super::{Download, DownloadId, DownloadRecord, DownloadState, find_download, list_downloads};
use crate::catalog::Icestage;
use crate::error::{Error, Result};
use crate::rows::download_status_schema;
use crate::rows::drop_download_schema;
use crate::rows::{Value, batch};
use crate::session::CommandContext;
use crate::session::log::{self, DOWNLOADS};

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
    icestage: &Icestage,
    id: &DownloadId,
) -> Result<Option<DownloadRecord>> {
    if let Some(mut download) = find_download(icestage, id).await? {
        download.settle().await?;
        return Ok(Some(live_record(&download)));
    }
    log::find(icestage, DOWNLOADS, id.as_str()).await
}

fn rows(records: &[DownloadRecord]) -> Result<RecordBatch> {
    let rows: Vec<Vec<Value>> = records
        .iter()
        .map(|r| {
            vec![
                Value::from(r.id.clone()),
                Value::from(r.state.as_str()),
                Value::from(r.catalog.clone()),
                Value::from(r.staging.clone()),
                Value::from(r.target.clone()),
                Value::from(r.created_at),
                Value::from(r.expires_at),
                Value::from(r.rows),
                Value::from(r.files),
                Value::from(r.snapshot_id),
                Value::from(r.message.clone()),
                Value::from(r.owner.clone()),
            ]
        })
        .collect();
    batch(download_status_schema(), &rows)
}

pub(crate) async fn download_status(ctx: &CommandContext, id: &str) -> Result<RecordBatch> {
    let id = DownloadId::parse(id)?;
    let record = status_of(&ctx.icestage, &id)
        .await?
        .ok_or_else(|| unknown(&id))?;
    rows(&[record])
}

pub(crate) async fn list(ctx: &CommandContext) -> Result<RecordBatch> {
    let mut all = vec![];
    for catalog in ctx.icestage.catalogs() {
        let mut live = HashSet::new();
        for mut download in list_downloads(catalog).await? {
            download.settle().await?;
            live.insert(download.id.to_string());
            all.push(live_record(&download));
        }
        for record in log::latest_records::<DownloadState>(catalog, DOWNLOADS).await? {
            if !live.contains(&record.id) {
                all.push(record);
            }
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    rows(&all)
}

/// Waits (polling the catalog) until the download is no longer pending, or
/// `timeout` passes.
pub(crate) async fn wait_download(
    ctx: &CommandContext,
    id: &str,
    timeout: Duration,
) -> Result<RecordBatch> {
    let id = DownloadId::parse(id)?;
    let deadline = Instant::now() + timeout;
    loop {
        let record = status_of(&ctx.icestage, &id)
            .await?
            .ok_or_else(|| unknown(&id))?;
        if record.state != DownloadState::Pending {
            return rows(&[record]);
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
        .remove_table(&download.table, crate::catalog::Removal::Everything)
        .await
}

pub(crate) async fn drop_download(ctx: &CommandContext, id: &str) -> Result<RecordBatch> {
    let id = DownloadId::parse(id)?;
    let state = match find_download(&ctx.icestage, &id).await? {
        Some(download) => {
            remove(&download, DownloadState::Dropped).await?;
            DownloadState::Dropped
        }
        // Dropping twice is harmless.
        None => {
            status_of(&ctx.icestage, &id)
                .await?
                .ok_or_else(|| unknown(&id))?
                .state
        }
    };
    batch(
        drop_download_schema(),
        &[vec![
            Value::from(id.to_string()),
            Value::from(state.as_str()),
        ]],
    )
}

/// Removes downloads whose time ran out; a pending one only once its filler
/// stopped. Returns how many tables were removed.
pub(crate) async fn expire(icestage: &Icestage) -> Result<i64> {
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
