//! `COPY INTO <table> FROM '<uri>' [WITH (...)]`: lands files as an Iceberg
//! table, exactly once per file.
//!
//! The table is created from the files' schema when missing. The selected
//! files are read (one task per file, as many at once as there are cores) and
//! written as the table's own Parquet files (streaming), then appended in one
//! commit. Which files were loaded (URI,
//! size, ETag or version) is recorded in the catalog's `icestage.copy_log`
//! table under a copy id that the commit's snapshot also carries: a log row
//! counts only once its copy id is proven, by that snapshot or by the
//! `committed` marker written after it. Running the statement again loads
//! only files not loaded before; a file changed in place (same URI, other
//! size or ETag) is reported, not loaded, unless `force = true`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema as ArrowSchema};
use datafusion::error::DataFusionError;
use futures::StreamExt;
use futures::future::BoxFuture;
use iceberg::spec::{Schema, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{Catalog, TableCreation, TableIdent};
use object_store::ObjectStoreExt;

use super::options::{
    Format, MatchByName, OnError, SchemaEvolution, SourceOptions, ValidationMode,
};
use super::read::Source;
use super::records::Rejected;
use super::rejects::{CopyError, CopyPreview};
use super::shape::{RESCUED, evolved, extras, hive_columns, offered as offered_columns};
use super::source::select;
pub(crate) use super::source::{Access, SourceFile};
use super::write::{Copying, Written, open_file};
use crate::catalog::IcebergCatalog;
use crate::catalog::TableName;
use crate::catalog::bridge::insert::{append_stored, stored_rows_of};
use crate::catalog::commit::{Evidence, append_once_guarded};
use crate::catalog::scoped::{LoadCheck, with_current_schema};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::rows::{ResultRow, StoredRow, result_row};
use crate::session::CommandContext;
use crate::session::log::icestage_table;
use crate::session::operation::{Operation, Outcome};
use crate::session::{failpoint, is_missing};
use crate::tables::ddl::iceberg_schema;
use datafusion::arrow::datatypes::SchemaRef;

/// Snapshot summary key carrying the copy id.
pub const SNAPSHOT_COPY_ID: &str = "icestage.copy-id";
/// Name of the copy log table (in the `icestage` namespace).
pub const COPY_LOG_TABLE: &str = "copy_log";

fn log_ident() -> TableIdent {
    icestage_table(COPY_LOG_TABLE)
}

result_row! {
    /// One row of the copy log: a file a copy into `target_table` loaded,
    /// or, with an empty `file`, where the copy itself stands.
    #[derive(Debug, Clone, PartialEq)]
    pub struct LogRow {
        /// The target, `namespace.table` (what the log is partitioned by).
        pub target_table: String,
        /// The file's URI (empty in a row about the whole copy).
        pub file: String,
        /// Its size when loaded.
        pub size: Option<i64>,
        /// Its ETag when loaded.
        pub etag: Option<String>,
        /// Its version when loaded, on a versioned bucket.
        pub version: Option<String>,
        /// The copy.
        pub copy_id: String,
        /// `loading`, `committed`, ...
        pub state: String,
        /// When the row was written.
        pub recorded_at: DateTime<Utc>,
    }
}

impl LogRow {
    /// A row about the whole copy `copy_id` into `target`: its `state`.
    fn marker(target: &str, copy_id: &str, state: &str) -> Self {
        Self {
            target_table: target.to_string(),
            file: String::new(),
            size: None,
            etag: None,
            version: None,
            copy_id: copy_id.to_string(),
            state: state.to_string(),
            recorded_at: Utc::now(),
        }
    }
}

async fn log_table(catalog: &IcebergCatalog) -> Result<Table> {
    // Partitioned by target table: a copy reads the entries of its own
    // target only.
    catalog
        .owned_table(&log_ident(), LogRow::iceberg_schema, Some((1, "by_target")))
        .await
}

/// One file as the log knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub(crate) size: Option<i64>,
    pub(crate) etag: Option<String>,
}

impl Loaded {
    pub(crate) fn of(file: &SourceFile) -> Self {
        Self {
            size: Some(file.meta.size as i64),
            etag: file.etag().map(str::to_string),
        }
    }
}

/// The log's rows for the table named `target`.
async fn log_entries(catalog: &dyn Catalog, target: &str) -> Result<Vec<LogRow>> {
    stored_rows_of(catalog, &log_ident(), target).await
}

/// The copies of `entries` that are proven: by the `committed` marker or
/// by a snapshot of `target` carrying the copy id.
fn proven_copies(entries: &[LogRow], target: &Table) -> HashSet<String> {
    entries
        .iter()
        .filter(|e| {
            e.state == "committed"
                || Evidence::new(SNAPSHOT_COPY_ID, &e.copy_id)
                    .found_in(target)
                    .is_some()
        })
        .map(|e| e.copy_id.clone())
        .collect()
}

/// What the copy log says was loaded into a table.
#[derive(Debug, Default)]
pub(crate) struct LoadedFiles {
    /// The files loaded by proven copies: URI → size and ETag.
    pub(crate) files: HashMap<String, Loaded>,
    /// Those copies.
    pub(crate) proven: HashSet<String>,
}

/// The files loaded into `target` by proven copies, and those copies.
pub(crate) async fn loaded_files(catalog: &IcebergCatalog, target: &Table) -> Result<LoadedFiles> {
    let entries = log_entries(catalog.catalog().as_ref(), &target.identifier().to_string()).await?;
    let proven = proven_copies(&entries, target);
    let files = entries
        .into_iter()
        .filter(|e| !e.file.is_empty() && proven.contains(&e.copy_id))
        .map(|e| {
            let loaded = Loaded {
                size: e.size,
                etag: e.etag,
            };
            (e.file, loaded)
        })
        .collect();
    Ok(LoadedFiles { files, proven })
}

const LOADED_MEANWHILE: &str = "loaded meanwhile: ";

/// A check run on every version a copy's commit would land on: none of
/// `files` may have been loaded by a copy that was not yet proven when this
/// one chose its files (`known`). Two copies of the same new files (two
/// statements, two pipe runners) race to the commit; the second finds the
/// first here and commits nothing.
fn not_loaded_meanwhile(
    catalog: Arc<dyn Catalog>,
    target: String,
    files: HashSet<String>,
    known: HashSet<String>,
) -> LoadCheck {
    let shared = Arc::new((catalog, target, files, known));
    Arc::new(move |table: Table| {
        let shared = Arc::clone(&shared);
        Box::pin(async move {
            let (catalog, target, files, known) = shared.as_ref();
            let entries = log_entries(catalog.as_ref(), target)
                .await
                .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::Unexpected, e.to_string()))?;
            let proven = proven_copies(&entries, &table);
            match entries.iter().find(|e| {
                files.contains(&e.file)
                    && proven.contains(&e.copy_id)
                    && !known.contains(&e.copy_id)
            }) {
                Some(e) => Err(iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!("{LOADED_MEANWHILE}{} (copy {})", e.file, e.copy_id),
                )),
                None => Ok(()),
            }
        })
    })
}

async fn log_rows(
    catalog: &IcebergCatalog,
    target: &str,
    copy_id: &str,
    state: &str,
    files: &[SourceFile],
) -> Result<()> {
    let table = log_table(catalog).await?;
    let now = Utc::now();
    let rows: Vec<LogRow> = if files.is_empty() {
        vec![LogRow::marker(target, copy_id, state)]
    } else {
        files
            .iter()
            .map(|f| LogRow {
                target_table: target.to_string(),
                file: f.uri.clone(),
                size: Some(f.meta.size as i64),
                etag: f.etag().map(str::to_string),
                version: f.meta.version.clone(),
                copy_id: copy_id.to_string(),
                state: state.to_string(),
                recorded_at: now,
            })
            .collect()
    };
    append_stored(catalog, &table, &rows).await
}

/// Before `EXPIRE SNAPSHOTS` removes the snapshots `expiring` of `table`,
/// the copies they committed are marked committed in the copy log: the
/// snapshot is the proof that a copy committed, and once it is gone the log
/// says so itself.
pub(crate) fn before_expiry(
    catalog: Arc<IcebergCatalog>,
    table: Table,
    expiring: Vec<i64>,
) -> BoxFuture<'static, Result<()>> {
    Box::pin(async move {
        let metadata = table.metadata();
        let copies: Vec<String> = expiring
            .iter()
            .filter_map(|id| metadata.snapshot_by_id(*id))
            .filter_map(|s| s.summary().additional_properties.get(SNAPSHOT_COPY_ID))
            .cloned()
            .collect();
        mark_committed(&catalog, &table.identifier().to_string(), &copies).await
    })
}

/// Marks `copies` into `target` committed in the log, in one commit: what
/// proves them once their snapshots are expired.
async fn mark_committed(catalog: &IcebergCatalog, target: &str, copies: &[String]) -> Result<()> {
    if copies.is_empty() {
        return Ok(());
    }
    let table = log_table(catalog).await?;
    let rows: Vec<LogRow> = copies
        .iter()
        .map(|copy| LogRow::marker(target, copy, "committed"))
        .collect();
    append_stored(catalog, &table, &rows).await
}

/// The columns a new target takes from its first file: the file's own,
/// its extras, and `_rescued_data` when the copy rescues.
fn creation_schema(offered: &[FieldRef], options: &SourceOptions) -> Result<Schema> {
    let mut fields: Vec<FieldRef> = offered.to_vec();
    if options.schema_evolution == SchemaEvolution::Rescue
        && !fields.iter().any(|f| f.name() == RESCUED)
    {
        fields.push(Arc::new(Field::new(RESCUED, DataType::Utf8, true)));
    }
    iceberg_schema(&ArrowSchema::new(fields))
}

/// The table `ident`, created with `schema` when missing (or, when
/// `transient`, only described: a validation creates nothing).
async fn target_table(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    schema: Schema,
    transient: bool,
) -> Result<(Table, bool)> {
    match catalog.catalog().load_table(ident).await {
        Ok(table) => return Ok((table, false)),
        Err(e) if is_missing(&e) => {}
        Err(e) => return Err(e.into()),
    }
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .location(format!("file:///icestage-validation/{}", ident.name()))
        .schema(schema)
        .build();
    if transient {
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let table = Table::builder()
            .metadata(metadata)
            .identifier(ident.clone())
            .file_io(iceberg::io::FileIO::new_with_memory())
            .runtime(iceberg::Runtime::current())
            .readonly(true)
            .build()?;
        return Ok((table, false));
    }
    let creation = TableCreation {
        location: None,
        ..creation
    };
    catalog.ensure_namespace(ident.namespace()).await?;
    Ok((
        catalog
            .catalog()
            .create_table(ident.namespace(), creation)
            .await?,
        true,
    ))
}

/// `COPY INTO <table> FROM '<uri>' [WITH (...)]`; `written` keeps the
/// options as written, for EXPLAIN.
#[derive(Debug)]
pub(crate) struct CopyInto {
    pub(crate) table: TableName,
    pub(crate) uri: String,
    pub(crate) options: SourceOptions,
    pub(crate) written: Vec<(String, String)>,
}

impl Operation for CopyInto {
    const NAME: &'static str = "CopyInto";
    type Outcome = CopyRun;

    /// The report of a load, or what `validation_mode` asks for.
    fn schema(&self) -> SchemaRef {
        match self.options.validation_mode {
            None => <CopyReport as ResultRow>::schema(),
            Some(ValidationMode::ReturnErrors) => <CopyError as ResultRow>::schema(),
            Some(ValidationMode::ReturnRows(_)) => <CopyPreview as ResultRow>::schema(),
        }
    }

    async fn run(&self, ctx: &CommandContext) -> Result<CopyRun> {
        copy_into(ctx, &self.table, &self.uri, &self.options).await
    }
}

impl fmt::Display for CopyInto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from {}", self.table, self.uri)?;
        for (key, value) in &self.written {
            let shown = if crate::secret::is_secret_key(key) {
                "***"
            } else {
                value
            };
            write!(f, ", {key}={shown}")?;
        }
        Ok(())
    }
}

impl Outcome for CopyRun {
    fn schema() -> SchemaRef {
        <CopyReport as ResultRow>::schema()
    }

    fn into_batch(self, _: SchemaRef) -> Result<RecordBatch> {
        match self.validation {
            None => CopyReport::to_batch(&[self.report]),
            Some(Validation::Errors(errors)) => CopyError::to_batch(&errors),
            Some(Validation::Rows(rows)) => CopyPreview::to_batch(&rows),
        }
    }
}

/// `copy_rejects('<table>')`.
#[derive(Debug)]
pub(crate) struct CopyRejects {
    pub(crate) table: TableName,
}

impl Operation for CopyRejects {
    const NAME: &'static str = "CopyRejects";
    type Outcome = Vec<super::rejects::CopyReject>;

    async fn run(&self, ctx: &CommandContext) -> Result<Self::Outcome> {
        rejects_of(ctx, &self.table).await
    }
}

impl fmt::Display for CopyRejects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.table)
    }
}

async fn copy_into(
    ctx: &CommandContext,
    table: &TableName,
    uri: &str,
    options: &SourceOptions,
) -> Result<CopyRun> {
    let (catalog, ident) = (ctx.icestage.catalog(&table.catalog)?, &table.ident);
    let access = Access::open(uri, options).await?;
    let (files, format) = select(&access, uri, options).await?;
    copy_files(
        catalog,
        ident,
        &access,
        files,
        format,
        options,
        &HashMap::new(),
        ctx.progress(),
        crate::cluster::of_options(&ctx.options)?.as_ref(),
    )
    .await
}

/// A file `COPY INTO` (with `on_error = 'skip_file'` or `'continue'`) left
/// out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FailedFile {
    pub(crate) uri: String,
    pub(crate) loaded: Loaded,
    pub(crate) error: String,
}

/// What [`copy_files`] did.
#[derive(Debug)]
pub(crate) struct CopyRun {
    pub(crate) report: CopyReport,
    /// Files that could not be loaded (only with `on_error = 'skip_file'`
    /// or `'continue'`).
    pub(crate) failed: Vec<FailedFile>,
    /// The files as they were when this run decided to load them.
    pub(crate) loaded: Vec<SourceFile>,
    /// With `validation_mode`: what the run found, in place of a load.
    pub(crate) validation: Option<Validation>,
}

/// What a `COPY INTO` with `validation_mode` answers.
#[derive(Debug)]
pub(crate) enum Validation {
    Errors(Vec<CopyError>),
    Rows(Vec<CopyPreview>),
}

/// The most malformed rows one copy rejects (and a validation answers),
/// over all its files.
const MAX_COPY_REJECTED_ROWS: usize = 100_000;

/// How many failed files a report names.
const NAMED_FAILURES: usize = 5;

/// Drops `ident` if it holds no snapshot; whether it did.
async fn drop_if_empty(catalog: &IcebergCatalog, ident: &TableIdent) -> bool {
    let empty = catalog
        .catalog()
        .load_table(ident)
        .await
        .is_ok_and(|t| t.metadata().current_snapshot().is_none());
    empty && catalog.catalog().drop_table(ident).await.is_ok()
}

/// Whether `options` ask for what only a local copy does (row-level
/// errors, evolution, path and metadata columns, validation, purge).
fn local_only(options: &SourceOptions) -> Option<&'static str> {
    [
        (
            options.on_error == OnError::Continue,
            "on_error = 'continue'",
        ),
        (
            options.schema_evolution != SchemaEvolution::Fail,
            "schema_evolution",
        ),
        (options.validation_mode.is_some(), "validation_mode"),
        (options.hive_partitioning, "hive_partitioning"),
        (options.include_metadata, "include_metadata"),
        (options.purge, "purge"),
        (
            options
                .match_by_column_name
                .is_some_and(|m| m != MatchByName::CaseSensitive),
            "match_by_column_name",
        ),
    ]
    .into_iter()
    .find_map(|(set, name)| set.then_some(name))
}

/// Loads `files` (found under `access`, all of `format`) into `ident`: the
/// files not loaded before, leaving out those in `failed_before` that did
/// not change since they failed. With a `cluster`, its executors read and
/// write the files; the log and the commit stay here. A table this run
/// creates goes again when the run loads nothing into it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn copy_files(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    access: &Access,
    files: Vec<SourceFile>,
    format: Format,
    options: &SourceOptions,
    failed_before: &HashMap<String, Loaded>,
    progress: Arc<dyn crate::progress::Progress>,
    cluster: Option<&Cluster>,
) -> Result<CopyRun> {
    if cluster.is_some()
        && let Some(option) = local_only(options)
    {
        return Err(Error::NotSupported(format!(
            "COPY INTO with {option} runs on this process, not on a cluster: RESET \
             icestage.cluster for this statement"
        )));
    }
    let validating = options.validation_mode.is_some();
    let existing = match catalog.catalog().load_table(ident).await {
        Ok(table) => Some(table),
        Err(e) if is_missing(&e) => None,
        Err(e) => return Err(e.into()),
    };
    let LoadedFiles {
        files: loaded,
        proven: known,
    } = match &existing {
        Some(table) => loaded_files(catalog, table).await?,
        None => Default::default(),
    };
    let mut to_load = vec![];
    let mut skipped = 0i64;
    let mut changed = vec![];
    for file in files {
        let now = Loaded::of(&file);
        if failed_before.get(&file.uri) == Some(&now) {
            continue;
        }
        match loaded.get(&file.uri) {
            _ if options.force || validating => to_load.push(file),
            None => to_load.push(file),
            Some(before) if *before == now => skipped += 1,
            Some(_) => changed.push(file.uri.clone()),
        }
    }
    let name = ident.to_string();
    let changed_note = if changed.is_empty() {
        String::new()
    } else {
        changed.sort();
        format!(
            "; {} file(s) changed since they were loaded and were not loaded again ({}): use WITH (force = true) to reload",
            changed.len(),
            changed.join(", ")
        )
    };
    let mut report = CopyReport {
        files_loaded: 0,
        files_skipped: skipped,
        files_changed: changed.len() as i64,
        files_failed: 0,
        rows: 0,
        rows_rejected: 0,
        snapshot_id: None,
        table_created: false,
        message: format!("nothing new to load into {name}{changed_note}"),
        ran_on: crate::cluster::ran_on(cluster),
        files_purged: 0,
    };
    let nothing = |report: CopyReport, failed: Vec<FailedFile>| CopyRun {
        report,
        failed,
        loaded: vec![],
        validation: None,
    };
    if to_load.is_empty() {
        return Ok(nothing(report, vec![]));
    }

    let skip_failed = matches!(options.on_error, OnError::SkipFile | OnError::Continue);
    let mut failed: Vec<FailedFile> = vec![];
    let fail = |file: &SourceFile, error: Error| FailedFile {
        uri: file.uri.clone(),
        loaded: Loaded::of(file),
        error: error.to_string(),
    };
    progress.start(
        to_load.len() as u64,
        to_load.iter().map(|f| f.meta.size).sum(),
    );
    let hive = if options.hive_partitioning {
        hive_columns(access, &to_load)
    } else {
        vec![]
    };
    // A new table takes the columns of the first file that opens; a copy
    // that evolves the target's schema opens every file first, to add all
    // their new columns in its one commit.
    let open_all = options.schema_evolution != SchemaEvolution::Fail;
    let mut opened: Vec<Option<Arc<Source>>> = vec![None; to_load.len()];
    let mut unreadable = HashSet::new();
    if existing.is_none() || open_all {
        for (n, file) in to_load.iter().enumerate() {
            match open_file(access, file, format, options, existing.as_ref()).await {
                Ok(source) => {
                    opened[n] = Some(Arc::new(source));
                    if !open_all {
                        break;
                    }
                }
                Err(e) if skip_failed || validating => {
                    unreadable.insert(n);
                    failed.push(fail(file, e));
                }
                Err(e) => return Err(e),
            }
        }
    }
    let offered: Vec<(String, Vec<FieldRef>, usize)> = to_load
        .iter()
        .zip(&opened)
        .filter_map(|(file, source)| source.as_ref().map(|s| (file, s)))
        .map(|(file, source)| {
            let extras = extras(access, file, options, &hive)?;
            Ok((
                file.uri.clone(),
                offered_columns(&source.schema, &extras),
                source.schema.fields().len(),
            ))
        })
        .collect::<Result<_>>()?;
    let (target, created) = match existing {
        Some(table) => (table, false),
        None => {
            let Some((_, first, _)) = offered.first() else {
                report.files_failed = failed.len() as i64;
                report.message = failed_message(&name, &failed, "no file could be read");
                return Ok(finish_validation(nothing(report, failed), options));
            };
            target_table(catalog, ident, creation_schema(first, options)?, validating).await?
        }
    };
    let evolved = evolved(&target, &offered, options, format)?;
    let copying = Copying {
        target: match &evolved {
            Some(schema) => with_current_schema(&target, schema)?,
            None => target.clone(),
        },
        access: access.clone(),
        format,
        options: options.clone(),
        hive,
    };
    if let Some(mode) = options.validation_mode {
        let found = validate(&copying, &to_load, &opened, &unreadable, mode).await;
        progress.finish();
        let mut run = nothing(report, failed);
        run.validation = Some(found?);
        return Ok(finish_validation(run, options));
    }
    let mut run = async {
    let copy_id = uuid::Uuid::new_v4().to_string();
    let mut data_files = vec![];
    let mut rows = 0i64;
    let mut rejected: Vec<Rejected> = vec![];
    let mut done = vec![];
    let mut record = |file: SourceFile, written: Result<Written>| -> Result<()> {
        progress.advance(1, file.meta.size);
        match written {
            // The rejections a copy keeps are bounded: past the bound a
            // file with more is left out whole, reported, not loaded.
            Ok(written) if rejected.len() + written.rejected.len() > MAX_COPY_REJECTED_ROWS => {
                failed.push(fail(
                    &file,
                    Error::invalid(format!(
                        "this copy rejected more than {MAX_COPY_REJECTED_ROWS} malformed rows in \
                         all; this file, with {} more, was left out: fix the files, or load fewer \
                         at once",
                        written.rejected.len()
                    )),
                ));
            }
            Ok(written) => {
                rows += written.files.iter().map(|f| f.record_count() as i64).sum::<i64>();
                data_files.extend(written.files);
                rejected.extend(written.rejected);
                done.push(file);
            }
            Err(e) if skip_failed => failed.push(fail(&file, e)),
            // A storage failure keeps its kind (and says where); a file that
            // does not read is named.
            Err(e) if e.kind() == crate::error::ErrorKind::Upstream => return Err(e),
            Err(e) => {
                return Err(Error::invalid(format!(
                    "{}: {}; nothing was loaded (WITH (on_error = 'skip_file') loads the other \
                     files and reports this one; on_error = 'continue' also loads the good rows \
                     of a file with malformed ones)",
                    file.uri,
                    e.user_message()
                )));
            }
        }
        Ok(())
    };
    let pending: Vec<(usize, SourceFile)> = to_load
        .iter()
        .cloned()
        .enumerate()
        .filter(|(n, _)| !unreadable.contains(n))
        .collect();
    match cluster {
        #[cfg(feature = "cluster")]
        Some(cluster) => {
            let prefix = format!("icestage-copy-{copy_id}");
            let copied = super::distribute::copy_on_cluster(
                cluster, access, options, format, &target, &prefix, pending,
            )
            .await?;
            for (file, written) in copied {
                record(
                    file,
                    written.map(|files| Written {
                        files,
                        rejected: vec![],
                    }),
                )?;
            }
        }
        #[cfg(not(feature = "cluster"))]
        Some(cluster) => return Err(cluster.unavailable()),
        None => {
            // Files are read and written on their own tasks, as many at once
            // as there are cores; each streams, so memory grows with that
            // count only.
            let parallel = std::thread::available_parallelism().map_or(1, usize::from);
            let mut copies = futures::stream::iter(pending)
                .map(|(n, file)| {
                    let ready = opened[n].clone();
                    let copying = copying.clone();
                    let prefix = format!("icestage-copy-{copy_id}-{n:05}");
                    tokio::spawn(async move {
                        let written = async {
                            let source = match ready {
                                Some(source) => source,
                                None => Arc::new(copying.open(&file).await?),
                            };
                            copying.copy_file(source, &prefix).await
                        }
                        .await;
                        (file, written)
                    })
                })
                .buffered(parallel);
            while let Some(copied) = copies.next().await {
                let (file, written) =
                    copied.map_err(|e| Error::from(DataFusionError::ExecutionJoin(Box::new(e))))?;
                record(file, written)?;
            }
        }
    }
    report.files_failed = failed.len() as i64;
    report.table_created = created;
    if done.is_empty() {
        progress.finish();
        report.message = failed_message(&name, &failed, "nothing was loaded");
        return Ok(nothing(report, failed));
    }
    log_rows(catalog, &name, &copy_id, "pending", &done).await?;
    super::rejects::record(catalog, &name, &copy_id, &rejected).await?;
    failpoint("copy.before-commit");
    let guard = not_loaded_meanwhile(
        Arc::clone(catalog.catalog()),
        name.clone(),
        done.iter().map(|f| f.uri.clone()).collect(),
        known,
    );
    let snapshot_id = match append_once_guarded(
        catalog,
        &target,
        data_files,
        Evidence::new(SNAPSHOT_COPY_ID, &copy_id),
        Some(guard),
        evolved,
    )
    .await
    {
        Ok(landed) => landed.snapshot_id,
        Err(Error::Iceberg(e)) if e.message().starts_with(LOADED_MEANWHILE) => {
            return Err(Error::Conflict(format!(
                "another COPY INTO of {name} loaded some of the same files while this one ran ({}); \
                 this one committed nothing: run it again to load what is still new",
                e.message().trim_start_matches(LOADED_MEANWHILE)
            )));
        }
        Err(e) => return Err(e),
    };
    failpoint("copy.after-commit");
    log_rows(catalog, &name, &copy_id, "committed", &[]).await?;
    let purged = if options.purge {
        purge(access, &done).await
    } else {
        Purged::default()
    };
    progress.finish();
    report.files_loaded = done.len() as i64;
    report.rows = rows;
    report.rows_rejected = rejected.len() as i64;
    report.files_purged = purged.files;
    report.snapshot_id = Some(snapshot_id);
    report.message = format!(
        "loaded {} file(s), {rows} row(s) into {name}{}{}{changed_note}{}{}",
        done.len(),
        if created { " (created)" } else { "" },
        if rejected.is_empty() {
            String::new()
        } else {
            format!(
                "; {} malformed row(s) rejected: SELECT * FROM copy_rejects('{name}') lists them",
                rejected.len()
            )
        },
        if failed.is_empty() {
            String::new()
        } else {
            format!(
                "; {}",
                failed_message(&name, &failed, "the rest was loaded")
            )
        },
        purged.note
    );
    Ok(CopyRun {
        report,
        failed,
        loaded: done,
        validation: None,
    })
    }
    .await;
    let landed = matches!(&run, Ok(r) if r.report.snapshot_id.is_some());
    if created
        && !landed
        && drop_if_empty(catalog, ident).await
        && let Ok(run) = &mut run
    {
        run.report.table_created = false;
    }
    run
}

/// A validation's answer with the files that could not be opened as
/// errors of their own.
fn finish_validation(mut run: CopyRun, options: &SourceOptions) -> CopyRun {
    let Some(mode) = options.validation_mode else {
        return run;
    };
    let whole: Vec<CopyError> = run
        .failed
        .iter()
        .map(|f| CopyError {
            file: f.uri.clone(),
            line: None,
            column: None,
            error: f.error.clone(),
            record: None,
        })
        .collect();
    run.validation = Some(match (run.validation.take(), mode) {
        (Some(Validation::Errors(errors)), _) => {
            Validation::Errors(whole.into_iter().chain(errors).collect())
        }
        (Some(rows), _) => rows,
        (None, ValidationMode::ReturnErrors) => Validation::Errors(whole),
        (None, ValidationMode::ReturnRows(_)) => Validation::Rows(vec![]),
    });
    run
}

/// Reads `files` as a load would and answers what it finds; writes nothing.
async fn validate(
    copying: &Copying,
    files: &[SourceFile],
    opened: &[Option<Arc<Source>>],
    unreadable: &HashSet<usize>,
    mode: ValidationMode,
) -> Result<Validation> {
    let mut errors: Vec<CopyError> = vec![];
    let mut preview: Vec<CopyPreview> = vec![];
    for (n, file) in files.iter().enumerate() {
        if unreadable.contains(&n) {
            continue;
        }
        let whole = |e: Error| CopyError {
            file: file.uri.clone(),
            line: None,
            column: None,
            error: e.user_message(),
            record: None,
        };
        let source = match &opened[n] {
            Some(source) => Arc::clone(source),
            None => match copying.open(file).await {
                Ok(source) => Arc::new(source),
                Err(e) => {
                    errors.push(whole(e));
                    continue;
                }
            },
        };
        let (mut rows, rejections) = match copying.rows(source).await {
            Ok(rows) => rows,
            Err(e) => {
                errors.push(whole(e));
                continue;
            }
        };
        let mut failed = None;
        while let Some(batch) = rows.next().await {
            match batch {
                Ok(batch) => {
                    if let ValidationMode::ReturnRows(limit) = mode {
                        for row in json_rows(&batch)? {
                            if preview.len() < limit {
                                preview.push(CopyPreview {
                                    file: file.uri.clone(),
                                    row,
                                });
                            }
                        }
                        if preview.len() >= limit {
                            break;
                        }
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        errors.extend(rejections.take().into_iter().map(CopyError::from));
        if let Some(e) = failed {
            errors.push(whole(e));
        }
        if errors.len() > MAX_COPY_REJECTED_ROWS {
            errors.truncate(MAX_COPY_REJECTED_ROWS);
            errors.push(CopyError {
                file: file.uri.clone(),
                line: None,
                column: None,
                error: format!(
                    "more than {MAX_COPY_REJECTED_ROWS} errors: the rest were not looked for; \
                     fix these and validate again"
                ),
                record: None,
            });
            break;
        }
        if let ValidationMode::ReturnRows(limit) = mode
            && preview.len() >= limit
        {
            break;
        }
    }
    Ok(match mode {
        ValidationMode::ReturnErrors => Validation::Errors(errors),
        ValidationMode::ReturnRows(_) => Validation::Rows(preview),
    })
}

/// The rows of `batch` as JSON objects, keys in the table's column order.
fn json_rows(batch: &RecordBatch) -> Result<Vec<String>> {
    let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(Vec::new());
    writer.write(batch)?;
    writer.finish()?;
    let text = String::from_utf8(writer.into_inner())
        .map_err(|e| Error::internal(format!("rows as JSON: {e}")))?;
    Ok(text.lines().map(str::to_string).collect())
}

/// What a copy's `purge` did.
#[derive(Debug, Default)]
struct Purged {
    /// How many source files went.
    files: i64,
    /// The message's note about them, naming those that could not be
    /// deleted (empty without `purge`).
    note: String,
}

/// Deletes the source `files` a copy loaded (after its commit). A failed
/// delete is reported, not retried: the file stays loaded once.
async fn purge(access: &Access, files: &[SourceFile]) -> Purged {
    let mut purged = 0i64;
    let mut kept = vec![];
    for file in files {
        match access.store.delete(&file.meta.location).await {
            Ok(()) => purged += 1,
            Err(e) => kept.push(format!(
                "{}: {}",
                file.uri,
                access.storage_error(e).user_message()
            )),
        }
    }
    let note = if kept.is_empty() {
        format!("; purged {purged} source file(s)")
    } else {
        format!(
            "; purged {purged} source file(s); {} could not be deleted and stay loaded ({}): \
             delete them yourself, or give the credentials s3:DeleteObject",
            kept.len(),
            kept.iter()
                .take(NAMED_FAILURES)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    Purged {
        files: purged,
        note,
    }
}

/// `<n> file(s) failed (<uri>: <error>; ...)`, naming the first few.
fn failed_message(name: &str, failed: &[FailedFile], outcome: &str) -> String {
    let named: Vec<String> = failed
        .iter()
        .take(NAMED_FAILURES)
        .map(|f| format!("{}: {}", f.uri, f.error))
        .collect();
    let more = failed.len().saturating_sub(NAMED_FAILURES);
    format!(
        "{} file(s) could not be loaded into {name}, {outcome} ({}{})",
        failed.len(),
        named.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    )
}

result_row! {
    /// What `COPY INTO` loaded.
    #[derive(Debug, Clone, PartialEq)]
    pub struct CopyReport {
        /// Files loaded by this statement.
        pub files_loaded: i64,
        /// Files skipped: loaded before, unchanged.
        pub files_skipped: i64,
        /// Files loaded before that changed since, not loaded again (see
        /// `force`).
        pub files_changed: i64,
        /// Files that could not be loaded and were left out (with
        /// `on_error = 'skip_file'`).
        pub files_failed: i64,
        /// Rows loaded.
        pub rows: i64,
        /// Malformed rows rejected (with `on_error = 'continue'`): see
        /// `copy_rejects('<table>')`.
        pub rows_rejected: i64,
        /// The table's snapshot holding them (none when nothing was new).
        pub snapshot_id: Option<i64>,
        /// Whether the statement created the table.
        pub table_created: bool,
        /// What happened, in words.
        pub message: String,
        /// Where the files were read and written: `local`, or the cluster's URL.
        pub ran_on: String,
        /// Source files deleted after the load (with `purge = true`).
        pub files_purged: i64,
    }
}

/// `copy_rejects('<table>')`: the rows copies into `table` rejected,
/// newest first.
async fn rejects_of(
    ctx: &CommandContext,
    name: &TableName,
) -> Result<Vec<super::rejects::CopyReject>> {
    let (catalog, table) = (ctx.icestage.catalog(&name.catalog)?, &name.ident);
    let target = catalog.catalog().load_table(table).await.map_err(|e| {
        if is_missing(&e) {
            Error::TableNotFound {
                table: table.to_string(),
                hint: ": copy_rejects takes the table a COPY INTO loaded".to_string(),
            }
        } else {
            e.into()
        }
    })?;
    let proven = loaded_files(catalog, &target).await?.proven;
    super::rejects::list(catalog, &target.identifier().to_string(), &proven).await
}
