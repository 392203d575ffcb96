//! Pipes: `CREATE PIPE <name> AS COPY INTO <table> FROM '<uri>'` keeps
//! landing what is new under a prefix, each file exactly once, as it
//! arrives.
//!
//! A pipe is an Iceberg table of the catalog's `icestage` namespace
//! (`pipe_<name>`): its properties hold the definition, the state
//! (`running` or `paused`), the lease of the runner loading it now, the
//! totals, the last error and the files that failed; its rows are the runs
//! that loaded or failed something (what the webhooks report). Every
//! process on the catalog sees the same pipe, and changes to it are
//! compare-and-swaps of its properties.
//!
//! [`run`] loads what is new once (`RUN PIPE`, and `icestage serve` at each
//! pipe's interval); [`notify`] reads S3 event notifications from SQS.
//! Exactly once per file is `COPY INTO`'s file log, whose commit refuses
//! files another runner loaded meanwhile; the lease only keeps runners from
//! doing the same work twice.
//!
//! One file per verb, as uploads and downloads have: [`create`] (`CREATE
//! PIPE`), [`alter`] (`ALTER PIPE ... PAUSE | RESUME`), [`drop`] (`DROP
//! PIPE`), [`status`] (`pipes()`, `pipe_status`, the recorded runs); the
//! options a pipe takes are in [`options`]. This file is what they share: a
//! pipe's name, state and table.

pub(crate) mod alter;
pub(crate) mod create;
pub(crate) mod drop;
pub(crate) mod notify;
pub(crate) mod options;
pub(crate) mod run;
pub(crate) mod status;

pub use create::CreatePipe;
pub use options::PipeOptions;
pub use status::{PipeRunRecord, PipeStatus};

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};
use serde::{Deserialize, Serialize};

use self::options::copy_source_options;
use crate::catalog::{Catalogs, IcebergCatalog};
use crate::config::parse_duration;
use crate::error::{Error, Result};
use crate::ingest::SourceOptions;
use crate::ingest::copy_into::Loaded;
use crate::rows::result_row;
use crate::session::log::ICESTAGE_NAMESPACE;
use crate::session::{is_missing, property_time, state_named};

result_row! {
    /// One row of a pipe's table: a run that loaded or failed something.
    #[derive(Debug, Clone, PartialEq)]
    pub struct RunRow {
        /// The run.
        pub run_id: String,
        /// When it started.
        pub started_at: DateTime<Utc>,
        /// When it ended.
        pub finished_at: DateTime<Utc>,
        /// The process that ran it.
        pub runner: String,
        /// Files loaded.
        pub files_loaded: i64,
        /// Rows loaded.
        pub rows: i64,
        /// Files that failed.
        pub files_failed: i64,
        /// The snapshot that holds the rows, if any.
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
    }
}

/// Prefix of a pipe's table name in the `icestage` namespace.
pub const PIPE_TABLE_PREFIX: &str = "pipe_";

const PROP_NAME: &str = "icestage.pipe.name";
const PROP_TARGET: &str = "icestage.pipe.target";
const PROP_URI: &str = "icestage.pipe.uri";
const PROP_COPY_OPTIONS: &str = "icestage.pipe.copy-options";
const PROP_INTERVAL: &str = "icestage.pipe.interval";
const PROP_LEASE: &str = "icestage.pipe.lease";
const PROP_QUEUE: &str = "icestage.pipe.notification-queue";
const PROP_LIST_INTERVAL: &str = "icestage.pipe.list-interval";
const PROP_STATE: &str = "icestage.pipe.state";
const PROP_CREATED_AT: &str = "icestage.pipe.created-at";
pub(crate) const PROP_HOLDER: &str = "icestage.pipe.lease-holder";
pub(crate) const PROP_UNTIL: &str = "icestage.pipe.lease-until";
pub(crate) const PROP_LAST_RUN: &str = "icestage.pipe.last-run-at";
pub(crate) const PROP_LAST_LISTED: &str = "icestage.pipe.last-listed-at";
pub(crate) const PROP_LAST_LOADED: &str = "icestage.pipe.last-loaded-at";
pub(crate) const PROP_LAST_ERROR: &str = "icestage.pipe.last-error";
pub(crate) const PROP_FILES: &str = "icestage.pipe.files-loaded";
pub(crate) const PROP_ROWS: &str = "icestage.pipe.rows-loaded";
pub(crate) const PROP_FAILURES: &str = "icestage.pipe.failures";

/// Failed files a pipe remembers (and leaves alone until they change); more
/// failures are tried again at every run.
pub(crate) const MAX_REMEMBERED_FAILURES: usize = 100;
/// Longest error text kept per failed file.
const MAX_ERROR_CHARS: usize = 500;

/// A pipe's name: `name` in the default catalog, or `catalog.name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipeName {
    /// The catalog, when named.
    pub catalog: Option<String>,
    /// The pipe's own name: lowercase letters, digits and `_`.
    pub name: String,
}

impl PipeName {
    /// Reads `name` or `catalog.name`.
    pub fn parse(text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.split('.').collect();
        let (catalog, name) = match parts.as_slice() {
            [name] => (None, *name),
            [catalog, name] => (Some(catalog.to_string()), *name),
            _ => {
                return Err(Error::invalid(format!(
                    "'{text}' is not a pipe name: write <name> or <catalog>.<name>"
                )));
            }
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(Error::invalid(format!(
                "'{name}' is not a pipe name: use 1 to 64 lowercase letters, digits and underscores"
            )));
        }
        Ok(Self {
            catalog,
            name: name.to_string(),
        })
    }

    /// The catalog the pipe lives in.
    pub(crate) fn catalog<'a>(&self, icestage: &'a Catalogs) -> Result<&'a Arc<IcebergCatalog>> {
        match &self.catalog {
            Some(name) => icestage.catalog(name),
            None => Ok(icestage.default_catalog()),
        }
    }

    fn table(&self) -> TableIdent {
        TableIdent::new(
            NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()),
            format!("{PIPE_TABLE_PREFIX}{}", self.name),
        )
    }
}

impl fmt::Display for PipeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.catalog {
            Some(catalog) => write!(f, "{catalog}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Whether a pipe's runner loads it at its interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeState {
    /// Loaded at every interval.
    Running,
    /// Left alone until `ALTER PIPE ... RESUME` (`RUN PIPE` still loads).
    Paused,
}

impl fmt::Display for PipeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Paused => "paused",
        })
    }
}

crate::rows::named_column!(PipeState, PipeName);

/// A failed file a pipe leaves alone until it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub(crate) uri: String,
    pub(crate) size: Option<i64>,
    pub(crate) etag: Option<String>,
    pub(crate) error: String,
    pub(crate) at: DateTime<Utc>,
}

impl Failure {
    pub(crate) fn loaded(&self) -> Loaded {
        Loaded {
            size: self.size,
            etag: self.etag.clone(),
        }
    }
}

/// A pipe as its table describes it.
#[derive(Debug, Clone)]
pub(crate) struct Pipe {
    pub(crate) name: PipeName,
    pub(crate) catalog: String,
    pub(crate) table: Table,
    pub(crate) target: TableIdent,
    pub(crate) uri: String,
    pub(crate) copy_options: Vec<(String, String)>,
    pub(crate) options: PipeOptions,
    pub(crate) state: PipeState,
    pub(crate) holder: Option<String>,
    pub(crate) until: Option<DateTime<Utc>>,
    pub(crate) last_run: Option<DateTime<Utc>>,
    pub(crate) last_listed: Option<DateTime<Utc>>,
    pub(crate) last_loaded: Option<DateTime<Utc>>,
    pub(crate) last_error: Option<String>,
    pub(crate) files_loaded: i64,
    pub(crate) rows_loaded: i64,
    pub(crate) failures: Vec<Failure>,
}

impl Pipe {
    fn from_table(name: &PipeName, catalog: &str, table: Table) -> Result<Self> {
        let props = table.metadata().properties();
        let text = |key: &str| props.get(key).filter(|v| !v.is_empty()).cloned();
        let broken = |what: &str| {
            Error::invalid(format!(
                "pipe {name}'s table {} has no valid {what}: DROP PIPE {name} and create it again",
                table.identifier()
            ))
        };
        let duration = |key: &str| -> Result<Duration> {
            text(key)
                .and_then(|v| parse_duration(&v).ok())
                .ok_or_else(|| broken(key))
        };
        let target = text(PROP_TARGET).ok_or_else(|| broken(PROP_TARGET))?;
        let target = TableIdent::from_strs(target.split('.')).map_err(|_| broken(PROP_TARGET))?;
        let copy_options: Vec<(String, String)> = text(PROP_COPY_OPTIONS)
            .and_then(|v| serde_json::from_str(&v).ok())
            .ok_or_else(|| broken(PROP_COPY_OPTIONS))?;
        let options = PipeOptions {
            interval: duration(PROP_INTERVAL)?,
            lease: duration(PROP_LEASE)?,
            notification_queue: text(PROP_QUEUE),
            list_interval: duration(PROP_LIST_INTERVAL)?,
        };
        let state = text(PROP_STATE)
            .and_then(|v| state_named(&[PipeState::Running, PipeState::Paused], &v))
            .ok_or_else(|| broken(PROP_STATE))?;
        let count = |key: &str| text(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(Self {
            name: name.clone(),
            catalog: catalog.to_string(),
            uri: text(PROP_URI).ok_or_else(|| broken(PROP_URI))?,
            target,
            copy_options,
            options,
            state,
            holder: text(PROP_HOLDER),
            until: property_time(props, PROP_UNTIL),
            last_run: property_time(props, PROP_LAST_RUN),
            last_listed: property_time(props, PROP_LAST_LISTED),
            last_loaded: property_time(props, PROP_LAST_LOADED),
            last_error: text(PROP_LAST_ERROR),
            files_loaded: count(PROP_FILES),
            rows_loaded: count(PROP_ROWS),
            failures: text(PROP_FAILURES)
                .and_then(|v| serde_json::from_str(&v).ok())
                .unwrap_or_default(),
            table,
        })
    }

    pub(crate) fn source_options(&self) -> Result<SourceOptions> {
        copy_source_options(&self.copy_options)
    }

    /// The runner holding the pipe at `now`, if any.
    pub(crate) fn held_by(&self, now: DateTime<Utc>) -> Option<&str> {
        match (&self.holder, self.until) {
            (Some(holder), Some(until)) if until > now => Some(holder),
            _ => None,
        }
    }

    /// Whether a scheduled run is due at `now`.
    pub(crate) fn due(&self, now: DateTime<Utc>) -> bool {
        self.state == PipeState::Running
            && self.held_by(now).is_none()
            && self.last_run.is_none_or(|at| {
                now.signed_duration_since(at).to_std().unwrap_or_default() >= self.options.interval
            })
    }

    pub(crate) fn failed_before(&self) -> HashMap<String, Loaded> {
        self.failures
            .iter()
            .map(|f| (f.uri.clone(), f.loaded()))
            .collect()
    }
}

fn missing(name: &PipeName) -> Error {
    Error::invalid(format!(
        "pipe {name} does not exist: list pipes with SELECT * FROM pipes(), or create it with \
         CREATE PIPE {name} AS COPY INTO <table> FROM '<uri>'"
    ))
}

/// The pipe `name`.
pub(crate) async fn load(icestage: &Catalogs, name: &PipeName) -> Result<Pipe> {
    let catalog = name.catalog(icestage)?;
    let table = match catalog.catalog().load_table(&name.table()).await {
        Ok(table) => table,
        Err(e) if is_missing(&e) => return Err(missing(name)),
        Err(e) => return Err(e.into()),
    };
    Pipe::from_table(name, catalog.name(), table)
}

/// Every pipe of every catalog.
pub(crate) async fn list(icestage: &Catalogs) -> Result<Vec<Pipe>> {
    let mut pipes = vec![];
    let namespace = NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string());
    for catalog in icestage.catalogs() {
        let tables = match catalog.catalog().list_tables(&namespace).await {
            Ok(tables) => tables,
            Err(e) if is_missing(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        for ident in tables {
            let Some(short) = ident.name().strip_prefix(PIPE_TABLE_PREFIX) else {
                continue;
            };
            let name = PipeName {
                catalog: (catalog.name() != icestage.default_catalog().name())
                    .then(|| catalog.name().to_string()),
                name: short.to_string(),
            };
            // A pipe dropped while listing is no error.
            if let Some(table) = catalog.load_if_present(&ident).await? {
                pipes.push(Pipe::from_table(&name, catalog.name(), table)?);
            }
        }
    }
    Ok(pipes)
}

/// A pipe's error text, bounded.
pub(crate) fn short_error(text: &str) -> String {
    if text.chars().count() <= MAX_ERROR_CHARS {
        return text.to_string();
    }
    let cut: String = text.chars().take(MAX_ERROR_CHARS).collect();
    format!("{cut}…")
}
