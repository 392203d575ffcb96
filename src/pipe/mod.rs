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

pub(crate) mod notify;
pub(crate) mod run;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};
use serde::{Deserialize, Serialize};

use crate::catalog::commit::{Swap, swap_properties};
use crate::catalog::{IcebergCatalog, Icestage, Removal};
use crate::config::{format_duration, parse_duration};
use crate::error::{Error, Result};
use crate::ingest::copy_into::Loaded;
use crate::ingest::{Format, OnError, SourceOptions};
use crate::rows::result_row;
use crate::session::log::ICESTAGE_NAMESPACE;
use crate::session::{is_missing, property_time, state_named};

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

/// The options `CREATE PIPE` takes (before `AS`).
pub(crate) const PIPE_OPTIONS: &[&str] =
    &["interval", "lease", "notification_queue", "list_interval"];

/// How long a pipe's runs may be apart, at least and at most.
const INTERVAL_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));
/// How long a lease may be, at least and at most.
const LEASE_BOUNDS: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(3600));
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
    pub(crate) fn catalog<'a>(&self, icestage: &'a Icestage) -> Result<&'a Arc<IcebergCatalog>> {
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

/// How a pipe finds and loads files, beside its `COPY INTO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipeOptions {
    /// Time between runs (`interval`, default 30 s, 1 s to 24 h).
    pub interval: Duration,
    /// How long a runner holds the pipe without renewing (`lease`, default
    /// 2 min): a runner that dies is replaced after this.
    pub lease: Duration,
    /// An SQS queue receiving the bucket's S3 event notifications
    /// (`notification_queue`): new files are found from its messages.
    pub notification_queue: Option<String>,
    /// With a queue: time between full listings, which catch what a
    /// notification missed (`list_interval`, default 10 min).
    pub list_interval: Duration,
}

impl Default for PipeOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            lease: Duration::from_secs(120),
            notification_queue: None,
            list_interval: Duration::from_secs(600),
        }
    }
}

fn bounded(name: &str, value: &str, (min, max): (Duration, Duration)) -> Result<Duration> {
    let duration = parse_duration(value)?;
    if duration < min || duration > max {
        return Err(Error::invalid(format!(
            "pipe option {name} = '{value}' is out of range: give {} to {}",
            format_duration(min),
            format_duration(max)
        )));
    }
    Ok(duration)
}

impl PipeOptions {
    /// Reads `CREATE PIPE`'s `WITH (...)` pairs.
    pub(crate) fn from_pairs(pairs: &[(String, String)]) -> Result<Self> {
        let mut options = Self::default();
        for (key, value) in pairs {
            match key.as_str() {
                "interval" => options.interval = bounded(key, value, INTERVAL_BOUNDS)?,
                "lease" => options.lease = bounded(key, value, LEASE_BOUNDS)?,
                "list_interval" => options.list_interval = bounded(key, value, INTERVAL_BOUNDS)?,
                "notification_queue" => {
                    if !value.starts_with("https://") && !value.starts_with("http://") {
                        return Err(Error::invalid(format!(
                            "notification_queue = '{value}' is not a queue URL: give the SQS queue's URL, \
                             e.g. 'https://sqs.eu-west-1.amazonaws.com/123456789012/landing-events'"
                        )));
                    }
                    options.notification_queue = Some(value.clone());
                }
                other => {
                    return Err(Error::invalid(format!(
                        "CREATE PIPE has no option '{other}': valid options are {}",
                        PIPE_OPTIONS.join(", ")
                    )));
                }
            }
        }
        Ok(options)
    }
}

/// `CREATE PIPE`, checked.
#[derive(Debug, Clone)]
pub struct CreatePipe {
    /// The pipe.
    pub name: PipeName,
    /// Fail when it exists (`false`: `IF NOT EXISTS`).
    pub if_not_exists: bool,
    /// The table it loads (in the pipe's catalog).
    pub target: TableIdent,
    /// The prefix it watches.
    pub uri: String,
    /// The `COPY INTO` options as written (no secrets).
    pub copy_options: Vec<(String, String)>,
    /// How it runs.
    pub options: PipeOptions,
}

/// COPY INTO options a pipe refuses, and why.
fn refused_copy_option(key: &str) -> Option<&'static str> {
    match key {
        "access_key_id" | "secret_access_key" | "session_token" => Some(
            "a pipe's definition is kept in the catalog, where secrets do not belong: give the \
             runner credentials through its environment, or role_arn",
        ),
        "files" => {
            Some("a pipe watches the whole prefix: point the URI at a narrower prefix instead")
        }
        "all_files" => Some("a pipe always takes every file under its prefix"),
        "force" => {
            Some("a pipe loads each file once: run COPY INTO ... WITH (force = true) to reload")
        }
        "validation_mode" => Some(
            "a pipe loads what lands: check the files first with COPY INTO ... WITH \
             (validation_mode = 'return_errors')",
        ),
        _ => None,
    }
}

/// The options a pipe's runs give `COPY INTO`: those written, every file
/// of the prefix, a failed file skipped.
fn copy_source_options(pairs: &[(String, String)]) -> Result<SourceOptions> {
    for (key, _) in pairs {
        if let Some(why) = refused_copy_option(key) {
            return Err(Error::invalid(format!(
                "CREATE PIPE takes no COPY INTO option '{key}': {why}"
            )));
        }
    }
    let mut options =
        SourceOptions::from_pairs("COPY INTO", pairs, &crate::ingest::copy_options())?;
    options.all_files = true;
    options.on_error = match options.on_error {
        OnError::Continue => OnError::Continue,
        OnError::SkipFile => OnError::SkipFile,
        OnError::AbortStatement if pairs.iter().any(|(k, _)| k == "on_error") => {
            return Err(Error::invalid(
                "CREATE PIPE takes on_error = 'skip_file' (the default: a file that fails is \
                 skipped and reported in pipe_status) or 'continue' (malformed rows are \
                 rejected one by one), not 'abort_statement': a pipe never stops on one file"
                    .to_string(),
            ));
        }
        OnError::AbortStatement => OnError::SkipFile,
    };
    Ok(options)
}

impl CreatePipe {
    /// Checks the parts of `CREATE PIPE`.
    pub fn new(
        name: PipeName,
        if_not_exists: bool,
        target: TableIdent,
        uri: String,
        copy_options: Vec<(String, String)>,
        options: PipeOptions,
    ) -> Result<Self> {
        copy_source_options(&copy_options)?;
        if options.notification_queue.is_some() && !uri.starts_with("s3://") {
            return Err(Error::invalid(format!(
                "notification_queue needs an s3:// prefix (S3 sends the notifications), not '{uri}': \
                 leave it out to find new files by listing"
            )));
        }
        Ok(Self {
            name,
            if_not_exists,
            target,
            uri,
            copy_options,
            options,
        })
    }
}

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

/// The pipe's runs: one row per run that loaded or failed something.
fn runs_schema() -> Result<Schema> {
    let string = || Type::Primitive(PrimitiveType::String);
    let long = || Type::Primitive(PrimitiveType::Long);
    let time = || Type::Primitive(PrimitiveType::Timestamptz);
    let fields = vec![
        NestedField::required(1, "run_id", string()),
        NestedField::required(2, "started_at", time()),
        NestedField::required(3, "finished_at", time()),
        NestedField::required(4, "runner", string()),
        NestedField::required(5, "files_loaded", long()),
        NestedField::required(6, "rows", long()),
        NestedField::required(7, "files_failed", long()),
        NestedField::optional(8, "snapshot_id", long()),
        NestedField::required(9, "message", string()),
    ];
    Ok(Schema::builder()
        .with_fields(fields.into_iter().map(Arc::new))
        .build()?)
}

fn missing(name: &PipeName) -> Error {
    Error::invalid(format!(
        "pipe {name} does not exist: list pipes with SELECT * FROM pipes(), or create it with \
         CREATE PIPE {name} AS COPY INTO <table> FROM '<uri>'"
    ))
}

/// The pipe `name`.
pub(crate) async fn load(icestage: &Icestage, name: &PipeName) -> Result<Pipe> {
    let catalog = name.catalog(icestage)?;
    let table = match catalog.catalog().load_table(&name.table()).await {
        Ok(table) => table,
        Err(e) if is_missing(&e) => return Err(missing(name)),
        Err(e) => return Err(e.into()),
    };
    Pipe::from_table(name, catalog.name(), table)
}

/// Every pipe of every catalog.
pub(crate) async fn list(icestage: &Icestage) -> Result<Vec<Pipe>> {
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

/// The format of a pipe without one: what the files under its prefix
/// announce, when they agree.
async fn format_of(create: &CreatePipe, options: &SourceOptions) -> Result<Format> {
    if let Some(format) = options.format {
        return Ok(format);
    }
    let access = crate::ingest::copy_into::Access::open(&create.uri, options).await?;
    let files = crate::ingest::source::candidates(&access).await?;
    let formats: Vec<Option<Format>> = files
        .iter()
        .map(|f| crate::ingest::options::classify(&f.uri).0)
        .collect();
    match formats.first() {
        Some(Some(first)) if formats.iter().all(|f| f == &Some(*first)) => Ok(*first),
        Some(_) => Err(Error::invalid(format!(
            "the files under '{}' do not all announce one format by their names: give the pipe's \
             COPY INTO WITH (format = 'parquet' | 'csv' | 'json' | 'avro')",
            create.uri
        ))),
        None => Err(Error::invalid(format!(
            "'{}' holds no files yet, so the pipe cannot tell their format: give the pipe's \
             COPY INTO WITH (format = 'parquet' | 'csv' | 'json' | 'avro')",
            create.uri
        ))),
    }
}

/// `CREATE PIPE`: the pipe's table, with its definition; running.
pub(crate) async fn create(icestage: &Icestage, create: &CreatePipe) -> Result<PipeStatus> {
    let catalog = create.name.catalog(icestage)?;
    let ident = create.name.table();
    if catalog.catalog().table_exists(&ident).await? {
        if create.if_not_exists {
            return status(icestage, &create.name).await;
        }
        return Err(Error::invalid(format!(
            "pipe {} exists: DROP PIPE {} first, or use CREATE PIPE IF NOT EXISTS",
            create.name, create.name
        )));
    }
    let source = copy_source_options(&create.copy_options)?;
    let format = format_of(create, &source).await?;
    let mut copy_options = create.copy_options.clone();
    if source.format.is_none() {
        copy_options.push(("format".to_string(), format.to_string()));
    }
    let options = &create.options;
    let mut properties = HashMap::from([
        (PROP_NAME.to_string(), create.name.name.clone()),
        (PROP_TARGET.to_string(), create.target.to_string()),
        (PROP_URI.to_string(), create.uri.clone()),
        (
            PROP_COPY_OPTIONS.to_string(),
            serde_json::to_string(&copy_options).expect("pairs serialize"),
        ),
        (PROP_INTERVAL.to_string(), format_duration(options.interval)),
        (PROP_LEASE.to_string(), format_duration(options.lease)),
        (
            PROP_LIST_INTERVAL.to_string(),
            format_duration(options.list_interval),
        ),
        (
            PROP_QUEUE.to_string(),
            options.notification_queue.clone().unwrap_or_default(),
        ),
        (PROP_STATE.to_string(), PipeState::Running.to_string()),
        (PROP_CREATED_AT.to_string(), Utc::now().to_rfc3339()),
    ]);
    // Its properties change at every run: a bounded metadata folder.
    properties.extend(crate::catalog::owned_table_properties());
    catalog.ensure_namespace(ident.namespace()).await?;
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(runs_schema()?)
        .properties(properties)
        .build();
    match catalog
        .catalog()
        .create_table(ident.namespace(), creation)
        .await
    {
        Ok(_) => {}
        // Another process created it between the check and here.
        Err(e) => {
            if !catalog.catalog().table_exists(&ident).await? {
                return Err(e.into());
            }
            if !create.if_not_exists {
                return Err(Error::invalid(format!(
                    "pipe {} exists: it was created meanwhile by another process; \
                     DROP PIPE {} first, or use CREATE PIPE IF NOT EXISTS",
                    create.name, create.name
                )));
            }
        }
    }
    status(icestage, &create.name).await
}

/// `ALTER PIPE <name> PAUSE | RESUME`.
pub(crate) async fn set_state(
    icestage: &Icestage,
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

/// `DROP PIPE [IF EXISTS] <name>`: the pipe and its runs; what it loaded
/// stays.
pub(crate) async fn drop(icestage: &Icestage, name: &PipeName, if_exists: bool) -> Result<bool> {
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

/// Sets `properties` on the pipe if it is still held by `holder`.
pub(crate) async fn swap_if_held(
    catalog: &IcebergCatalog,
    table: &Table,
    holder: &str,
    properties: HashMap<String, String>,
) -> Result<Option<Table>> {
    let holder = holder.to_string();
    match swap_properties(
        catalog,
        table,
        PROP_HOLDER,
        move |props| props.get(PROP_HOLDER) == Some(&holder),
        properties,
    )
    .await?
    {
        Swap::Done(table) => Ok(Some(table)),
        Swap::Refused(_) => Ok(None),
    }
}

result_row! {
    /// Where a pipe stands: a row of `pipes()` and `pipe_status('<name>')`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PipeStatus {
        /// The pipe.
        pub pipe: PipeName,
        /// Its catalog.
        pub catalog: String,
        /// `running` (loaded at every interval) or `paused`.
        pub state: PipeState,
        /// The table it loads.
        pub target_table: String,
        /// The prefix it watches.
        pub source: String,
        /// Time between runs.
        pub interval: String,
        /// How it finds new files.
        pub discovery: String,
        /// When it last ran.
        pub last_run_at: Option<DateTime<Utc>>,
        /// When it last loaded a file.
        pub last_loaded_at: Option<DateTime<Utc>>,
        /// Files loaded since it was created.
        pub files_loaded: i64,
        /// Rows loaded since it was created.
        pub rows_loaded: i64,
        /// Files that failed and did not load since (each is tried again
        /// once it changes).
        pub files_failed: i64,
        /// The first failed files and their errors.
        pub failures: Option<String>,
        /// Why its last run failed, if it did.
        pub last_error: Option<String>,
        /// Files under the prefix not loaded yet (not counting failed
        /// ones), as listed now.
        pub pending_files: Option<i64>,
        /// Seconds since the oldest of them was written: how far the pipe is
        /// behind.
        pub lag_seconds: Option<i64>,
        /// The runner loading it now, if one is.
        pub running_on: Option<String>,
    }
}

/// How many failed files a status names.
const NAMED_FAILURES: usize = 3;

impl Pipe {
    fn status(&self, pending: Option<(i64, Option<i64>)>) -> PipeStatus {
        let failures = (!self.failures.is_empty()).then(|| {
            let mut named: Vec<String> = self
                .failures
                .iter()
                .take(NAMED_FAILURES)
                .map(|f| format!("{}: {}", f.uri, f.error))
                .collect();
            if self.failures.len() > NAMED_FAILURES {
                named.push(format!("and {} more", self.failures.len() - NAMED_FAILURES));
            }
            named.join("; ")
        });
        PipeStatus {
            pipe: self.name.clone(),
            catalog: self.catalog.clone(),
            state: self.state,
            target_table: self.target.to_string(),
            source: self.uri.clone(),
            interval: format_duration(self.options.interval),
            discovery: match &self.options.notification_queue {
                Some(queue) => format!(
                    "notifications from {queue}, and listing every {}",
                    format_duration(self.options.list_interval)
                ),
                None => "listing".to_string(),
            },
            last_run_at: self.last_run,
            last_loaded_at: self.last_loaded,
            files_loaded: self.files_loaded,
            rows_loaded: self.rows_loaded,
            files_failed: self.failures.len() as i64,
            failures,
            last_error: self.last_error.clone(),
            pending_files: pending.map(|(n, _)| n),
            lag_seconds: pending.and_then(|(_, lag)| lag),
            running_on: self.held_by(Utc::now()).map(str::to_string),
        }
    }
}

/// `pipe_status('<name>')`, with the files pending as listed now.
pub(crate) async fn status(icestage: &Icestage, name: &PipeName) -> Result<PipeStatus> {
    let pipe = load(icestage, name).await?;
    let pending = run::pending(icestage, &pipe).await.ok();
    Ok(pipe.status(pending))
}

/// `pipes()`: every pipe, with the files pending as listed now.
pub(crate) async fn statuses(icestage: &Icestage) -> Result<Vec<PipeStatus>> {
    let mut rows = vec![];
    for pipe in list(icestage).await? {
        let pending = run::pending(icestage, &pipe).await.ok();
        rows.push(pipe.status(pending));
    }
    Ok(rows)
}

/// A pipe's error text, bounded.
pub(crate) fn short_error(text: &str) -> String {
    if text.chars().count() <= MAX_ERROR_CHARS {
        return text.to_string();
    }
    let cut: String = text.chars().take(MAX_ERROR_CHARS).collect();
    format!("{cut}…")
}

result_row! {
    /// One recorded run of a pipe (one that loaded or failed something):
    /// what the `pipe.loaded` and `pipe.failed` webhooks carry.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PipeRunRecord {
        /// The pipe.
        pub pipe: PipeName,
        /// The run.
        pub run_id: String,
        /// When it started.
        pub started_at: Option<DateTime<Utc>>,
        /// When it ended.
        pub finished_at: Option<DateTime<Utc>>,
        /// The process that ran it.
        pub runner: String,
        /// Files it loaded.
        pub files_loaded: i64,
        /// Rows it loaded.
        pub rows: i64,
        /// Files that failed in it.
        pub files_failed: i64,
        /// The target's snapshot holding its rows.
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
    }
}

/// The recorded runs of every pipe that ended at or after `since`.
pub(crate) async fn runs_since(
    icestage: &Icestage,
    since: DateTime<Utc>,
) -> Result<Vec<PipeRunRecord>> {
    use crate::catalog::lookup::Wanted;
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMicrosecondType};
    let mut records = vec![];
    for pipe in list(icestage).await? {
        // The files whose runs may have finished since, from manifests
        // decoded once; the runs are kept below.
        let wanted = Wanted::since(pipe.table.metadata().current_schema(), "finished_at", since);
        let batches = icestage
            .catalog(&pipe.catalog)?
            .manifests()
            .read(&pipe.table, wanted)
            .await?;
        for batch in &batches {
            let column = |name: &str, to: &DataType| -> Result<Arc<dyn Array>> {
                Ok(cast(batch.column_by_name(name).expect("runs column"), to)?)
            };
            let text = |name: &str| column(name, &DataType::Utf8);
            let long = |name: &str| column(name, &DataType::Int64);
            let micros =
                |name: &str| column(name, &DataType::Timestamp(TimeUnit::Microsecond, None));
            let (run_id, runner, message) = (text("run_id")?, text("runner")?, text("message")?);
            let (loaded, rows, failed, snapshot) = (
                long("files_loaded")?,
                long("rows")?,
                long("files_failed")?,
                long("snapshot_id")?,
            );
            let (started, finished) = (micros("started_at")?, micros("finished_at")?);
            let at = |array: &Arc<dyn Array>, row: usize| {
                let array = array.as_primitive::<TimestampMicrosecondType>();
                array
                    .is_valid(row)
                    .then(|| DateTime::from_timestamp_micros(array.value(row)))
                    .flatten()
            };
            for row in 0..batch.num_rows() {
                let long = |array: &Arc<dyn Array>| array.as_primitive::<Int64Type>().value(row);
                let snapshot = snapshot.as_primitive::<Int64Type>();
                records.push(PipeRunRecord {
                    pipe: pipe.name.clone(),
                    run_id: run_id.as_string::<i32>().value(row).to_string(),
                    started_at: at(&started, row),
                    finished_at: at(&finished, row),
                    runner: runner.as_string::<i32>().value(row).to_string(),
                    files_loaded: long(&loaded),
                    rows: long(&rows),
                    files_failed: long(&failed),
                    snapshot_id: snapshot.is_valid(row).then(|| snapshot.value(row)),
                    message: message.as_string::<i32>().value(row).to_string(),
                });
            }
        }
    }
    records.retain(|run| run.finished_at.is_some_and(|at| at >= since));
    Ok(records)
}
