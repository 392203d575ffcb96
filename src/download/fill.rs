//! Filling a download table in the background: each of the pinned query's
//! partitions streams into its own Parquet files on its own task (the
//! writer promotion and COPY INTO use), then one commit appends them all,
//! while a heartbeat in the table's properties tells other processes that
//! the filler is alive. Memory grows with the partitions and row groups in
//! flight, not with the download.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;

use super::files::Files;
use super::{Download, DownloadId, DownloadState, PROP_FILES, PROP_HEARTBEAT_AT, PROP_ROWS};
use crate::catalog::IcebergCatalog;
use crate::catalog::bridge::writer::write_partitions;
use crate::catalog::commit::{Evidence, append_once};
use crate::cluster::Cluster;
use crate::error::Result;
use crate::session::{PROP_MESSAGE, PROP_STATE, failpoint};

/// Snapshot summary key carrying the download id (the commit's evidence).
const SNAPSHOT_DOWNLOAD_ID: &str = "icestage.download-id";

fn pending(props: &HashMap<String, String>) -> bool {
    props
        .get(PROP_STATE)
        .is_some_and(|s| s == DownloadState::Pending.as_str())
}

async fn load(catalog: &Arc<IcebergCatalog>, id: &DownloadId) -> Option<Download> {
    let table = catalog.catalog().load_table(&id.table()).await.ok()?;
    Download::from_table(Arc::clone(catalog), table).ok()
}

/// Renews the heartbeat every third of the lease while the download is pending.
async fn heartbeat(catalog: Arc<IcebergCatalog>, id: DownloadId, lease: Duration) {
    loop {
        tokio::time::sleep(lease / 3).await;
        let Some(mut download) = load(&catalog, &id).await else {
            return;
        };
        let beat = HashMap::from([(PROP_HEARTBEAT_AT.to_string(), Utc::now().to_rfc3339())]);
        match download.swap(pending, DownloadState::Pending, beat).await {
            Ok(true) => {}
            // No longer pending (finished, failed or dropped): stop.
            Ok(false) => return,
            // A failed beat is retried at the next tick.
            Err(_) => {}
        }
    }
}

/// Where a download's rows are computed and written.
pub(crate) enum Fill {
    /// In this process: every partition of the plan on its own task, the
    /// files its rows reference handled as they are written.
    Here(Arc<dyn ExecutionPlan>, Arc<TaskContext>, Option<Files>),
    /// On a cluster: the executors run the query and write the files.
    #[cfg(feature = "cluster")]
    Cluster(Cluster, Box<LogicalPlan>),
}

impl Fill {
    /// The query `plan` on `cluster`.
    pub(crate) fn on_cluster(cluster: &Cluster, plan: &LogicalPlan) -> Result<Self> {
        #[cfg(feature = "cluster")]
        return Ok(Self::Cluster(cluster.clone(), Box::new(plan.clone())));
        #[cfg(not(feature = "cluster"))]
        {
            let _ = plan;
            Err(cluster.unavailable())
        }
    }

    /// What the download's status says once it is ready.
    fn ready_message(&self) -> String {
        match self {
            Self::Here(..) => String::new(),
            #[cfg(feature = "cluster")]
            Self::Cluster(cluster, _) => format!(
                "the query ran and its files were written on the cluster at {}",
                cluster.url()
            ),
        }
    }
}

/// Writes the download's rows into its table (in this process: one task
/// per partition) and appends the files in one commit. Returns the row and
/// file counts.
async fn write(catalog: &IcebergCatalog, id: &DownloadId, source: Fill) -> Result<(u64, usize)> {
    let table = catalog.catalog().load_table(&id.table()).await?;
    let prefix = format!("icestage-download-{id}");
    let files = match source {
        Fill::Here(input, task, files) => {
            let map = files.as_ref().map(Files::map);
            let written = write_partitions(&table, &prefix, input, task, map).await?;
            if let Some(files) = &files {
                files.finish().await?;
            }
            written
        }
        #[cfg(feature = "cluster")]
        Fill::Cluster(cluster, query) => {
            let ctx = cluster.context().await?;
            crate::cluster::write_on_cluster(&ctx, &table, &prefix, *query).await?
        }
    };
    let counts = (files.iter().map(|f| f.record_count()).sum(), files.len());
    append_once(
        catalog,
        &table,
        files,
        Evidence::new(SNAPSHOT_DOWNLOAD_ID, id.as_str()),
    )
    .await?;
    Ok(counts)
}

/// Runs `source` into the download table and records the outcome.
pub(crate) async fn fill(
    catalog: Arc<IcebergCatalog>,
    id: DownloadId,
    source: Fill,
    lease: Duration,
) {
    let ready_message = source.ready_message();
    let beating = tokio::spawn(heartbeat(Arc::clone(&catalog), id.clone(), lease));
    failpoint("download.fill");
    let written = write(&catalog, &id, source).await;
    beating.abort();
    let Some(mut download) = load(&catalog, &id).await else {
        // Dropped while it was being filled.
        return;
    };
    let (state, properties) = match written {
        Ok((rows, files)) => (
            DownloadState::Ready,
            HashMap::from([
                (PROP_ROWS.to_string(), rows.to_string()),
                (PROP_FILES.to_string(), files.to_string()),
                (PROP_MESSAGE.to_string(), ready_message),
            ]),
        ),
        Err(error) => (
            DownloadState::Failed,
            HashMap::from([(
                PROP_MESSAGE.to_string(),
                format!(
                    "the query failed while filling the download: {}",
                    error.user_message()
                ),
            )]),
        ),
    };
    // If another process already declared this filler dead, its verdict stands.
    if let Ok(true) = download.swap(pending, state, properties).await {
        crate::metrics::transition(
            crate::metrics::Session::Download,
            id.as_str(),
            state.as_str(),
        );
    }
}
