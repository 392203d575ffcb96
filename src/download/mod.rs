//! Downloads, the mirror of uploads: the service writes a query's result into
//! an isolated table (`downloads.download_<id>`) and the client reads it,
//! with read-only access to that one table.
//!
//! [`create`] plans the query against one snapshot of each source table,
//! creates the table and starts [`fill`]ing it in the background; [`status`]
//! answers where a download stands, waits for it, drops and expires it. All
//! state lives in the catalog: the download table's properties while it
//! exists (state, sources, a heartbeat lease while it fills), then a row of
//! the catalog's `icestage.download_log`.

pub(crate) mod access;
pub(crate) mod create;
pub(crate) mod files;
pub(crate) mod fill;
pub(crate) mod status;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use crate::catalog::Catalogs;
use crate::catalog::IcebergCatalog;
use crate::catalog::commit::{Swap, swap_properties};
use crate::error::{Error, Result};
use crate::session::{
    PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_MESSAGE, PROP_OWNER, PROP_STATE, SessionRecord,
    id_shape, property_time, random_id, state_named,
};

/// Namespace of download tables.
pub const DOWNLOADS_NAMESPACE: &str = "downloads";
/// Prefix of a download table's name; the download id follows.
pub const DOWNLOAD_TABLE_PREFIX: &str = "download_";
/// Download table property: the download id.
pub const PROP_DOWNLOAD_ID: &str = "icestage.download-id";
/// Download table property: the query, as SQL.
pub const PROP_QUERY: &str = "icestage.query";
/// Download table property: the source tables and the snapshot read of each (JSON).
pub const PROP_SOURCES: &str = "icestage.sources";
/// Download table property: when the filling process last said it is alive.
pub const PROP_HEARTBEAT_AT: &str = "icestage.heartbeat-at";
/// Download table property: seconds without a heartbeat after which a
/// pending download counts as abandoned.
pub const PROP_LEASE_SECONDS: &str = "icestage.lease-seconds";
/// Download table property: rows written.
pub const PROP_ROWS: &str = "icestage.rows";
/// Download table property: files written.
pub const PROP_FILES: &str = "icestage.files";

/// A download id: 128 random bits as 32 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DownloadId(String);

impl DownloadId {
    /// A fresh, unguessable id.
    pub fn random() -> Self {
        Self(random_id())
    }

    /// Checks that `text` has the shape of an id.
    pub fn parse(text: &str) -> Result<Self> {
        id_shape(text).map(Self).ok_or_else(|| {
            Error::invalid(format!(
                "'{}' is not a download id: download ids are the 32 hex characters returned by \
                 CREATE DOWNLOAD (see SELECT download_id FROM downloads())",
                text.trim()
            ))
        })
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The table of this download.
    pub fn table(&self) -> TableIdent {
        TableIdent::new(
            NamespaceIdent::new(DOWNLOADS_NAMESPACE.to_string()),
            format!("{DOWNLOAD_TABLE_PREFIX}{}", self.0),
        )
    }
}

crate::rows::named_column!(DownloadId, DownloadState);

impl fmt::Display for DownloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a download stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DownloadState {
    /// Being filled.
    Pending,
    /// Filled; the client may read it.
    Ready,
    /// The query or the write failed; the message says why.
    Failed,
    /// Removed by `DROP DOWNLOAD`.
    Dropped,
    /// Removed by `EXPIRE STAGING` after its time ran out.
    Expired,
}

impl DownloadState {
    const ALL: [Self; 5] = [
        Self::Pending,
        Self::Ready,
        Self::Failed,
        Self::Dropped,
        Self::Expired,
    ];

    /// The state's name as SQL shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Dropped => "dropped",
            Self::Expired => "expired",
        }
    }
}

impl fmt::Display for DownloadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DownloadState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        state_named(&Self::ALL, s).ok_or_else(|| {
            Error::invalid(format!(
                "'{s}' is not a download state: expected pending, ready, failed, dropped or expired"
            ))
        })
    }
}

/// A download's record.
pub(crate) type DownloadRecord = SessionRecord<DownloadState>;

/// A live download: its table and what its properties say.
#[derive(Debug, Clone)]
pub(crate) struct Download {
    pub(crate) id: DownloadId,
    pub(crate) catalog: Arc<IcebergCatalog>,
    pub(crate) table: Table,
    pub(crate) state: DownloadState,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) heartbeat_at: Option<DateTime<Utc>>,
    pub(crate) lease: Duration,
    pub(crate) sources: String,
    pub(crate) rows: Option<i64>,
    pub(crate) files: Option<i64>,
    pub(crate) message: Option<String>,
    pub(crate) owner: Option<String>,
}

/// True when a pending download's filler has not been heard from in its lease.
fn abandoned(props: &HashMap<String, String>, now: DateTime<Utc>) -> bool {
    let lease = props
        .get(PROP_LEASE_SECONDS)
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(60);
    props
        .get(PROP_STATE)
        .is_some_and(|s| s == DownloadState::Pending.as_str())
        && property_time(props, PROP_HEARTBEAT_AT).is_none_or(|at| (now - at).num_seconds() > lease)
}

impl Download {
    pub(crate) fn from_table(catalog: Arc<IcebergCatalog>, table: Table) -> Result<Self> {
        let props = table.metadata().properties();
        let name = table.identifier().to_string();
        let id = props.get(PROP_DOWNLOAD_ID).ok_or_else(|| {
            Error::invalid(format!(
                "{name} has no '{PROP_DOWNLOAD_ID}': it was not created by CREATE DOWNLOAD"
            ))
        })?;
        let number = |key: &str| props.get(key).and_then(|v| v.parse::<i64>().ok());
        Ok(Self {
            id: DownloadId::parse(id)?,
            state: props
                .get(PROP_STATE)
                .map(|s| s.parse())
                .transpose()?
                .unwrap_or(DownloadState::Pending),
            created_at: property_time(props, PROP_CREATED_AT),
            expires_at: property_time(props, PROP_EXPIRES_AT),
            heartbeat_at: property_time(props, PROP_HEARTBEAT_AT),
            lease: Duration::from_secs(number(PROP_LEASE_SECONDS).unwrap_or(60).max(1) as u64),
            sources: props.get(PROP_SOURCES).cloned().unwrap_or_default(),
            rows: number(PROP_ROWS),
            files: number(PROP_FILES),
            message: props.get(PROP_MESSAGE).cloned().filter(|m| !m.is_empty()),
            owner: props.get(PROP_OWNER).cloned(),
            catalog,
            table,
        })
    }

    pub(crate) fn name(&self) -> String {
        self.table.identifier().to_string()
    }

    pub(crate) fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// Where icestage placed the download's table (the catalog's rule; its
    /// metadata's location where the catalog places tables itself).
    pub(crate) fn assigned_location(&self) -> String {
        self.catalog
            .placed_location(&self.table)
            .unwrap_or_else(|| self.table.metadata().location().to_string())
    }

    /// The record of this download in `state`, as of now.
    pub(crate) fn record(&self, state: DownloadState) -> DownloadRecord {
        SessionRecord {
            id: self.id.to_string(),
            state,
            catalog: self.catalog.name().to_string(),
            target: self.sources.clone(),
            staging: self.name(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            recorded_at: Some(Utc::now()),
            rows: self.rows,
            files: self.files,
            snapshot_id: self.table.metadata().current_snapshot_id(),
            findings: None,
            message: self.message.clone(),
            owner: self.owner.clone(),
        }
    }

    /// Moves the download to `to` with `properties`, if `accept` approves the
    /// table as it is at commit time (a compare-and-swap); `false` when it
    /// did not.
    pub(crate) async fn swap(
        &mut self,
        accept: impl Fn(&HashMap<String, String>) -> bool + Send + Sync + 'static,
        to: DownloadState,
        mut properties: HashMap<String, String>,
    ) -> Result<bool> {
        properties.insert(PROP_STATE.to_string(), to.to_string());
        match swap_properties(&self.catalog, &self.table, PROP_STATE, accept, properties).await? {
            Swap::Done(table) => {
                *self = Download::from_table(Arc::clone(&self.catalog), table)?;
                Ok(true)
            }
            Swap::Refused(_) => Ok(false),
        }
    }

    /// Marks a pending download whose filler stopped answering as failed
    /// (it stays pending while the filler's heartbeat is fresh).
    pub(crate) async fn settle(&mut self) -> Result<()> {
        let now = Utc::now();
        if !abandoned(self.table.metadata().properties(), now) {
            return Ok(());
        }
        let last = self
            .heartbeat_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "never".to_string());
        let message = format!(
            "the process filling this download stopped (last heartbeat {last}, lease {}s): create the download again",
            self.lease.as_secs()
        );
        self.swap(
            move |props| abandoned(props, Utc::now()),
            DownloadState::Failed,
            HashMap::from([(PROP_MESSAGE.to_string(), message)]),
        )
        .await?;
        Ok(())
    }
}

/// Finds the live download `id` in any catalog.
pub(crate) async fn find_download(
    icestage: &Catalogs,
    id: &DownloadId,
) -> Result<Option<Download>> {
    let ident = id.table();
    for catalog in icestage.catalogs() {
        if let Some(table) = catalog.load_if_present(&ident).await? {
            return Ok(Some(Download::from_table(Arc::clone(catalog), table)?));
        }
    }
    Ok(None)
}

/// Every live download of one catalog.
pub(crate) async fn list_downloads(catalog: &Arc<IcebergCatalog>) -> Result<Vec<Download>> {
    let namespace = NamespaceIdent::new(DOWNLOADS_NAMESPACE.to_string());
    if !catalog.catalog().namespace_exists(&namespace).await? {
        return Ok(vec![]);
    }
    let mut found = vec![];
    for ident in catalog.catalog().list_tables(&namespace).await? {
        if !ident.name().starts_with(DOWNLOAD_TABLE_PREFIX) {
            continue;
        }
        if let Some(table) = catalog.load_if_present(&ident).await?
            && let Ok(download) = Download::from_table(Arc::clone(catalog), table)
        {
            found.push(download);
        }
    }
    Ok(found)
}
