//! An Iceberg table as it travels to a cluster: a recipe (metadata file,
//! snapshot, file-IO properties), never a list of files, so a plan over a
//! table of a million files stays a few hundred bytes on the wire.
//!
//! The scheduler turns a [`RecipeTable`] into a [`RecipeScanExec`] of `n`
//! partitions; every executor opens the same metadata file, plans the same
//! snapshot's files, sorts them by path and reads every `n`-th one. Two
//! checks stop a table that did not resolve from reading as empty: every
//! executor must plan as many files as the scheduler did, and every
//! partition must read as many rows as its files' manifests record.
//!
//! A recipe can instead pin exactly the files to read ([`Recipe::pinned`]):
//! a promotion's rules read the files its verification read (the copies,
//! where it made copies), never the staged ones again. Pinned recipes read
//! the same here and on a cluster.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::TableProviderFilterPushDown;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use iceberg::expr::Predicate;
use iceberg::io::FileIOBuilder;
use iceberg::scan::FileScanTask;
use iceberg::table::{StaticTable, Table};
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where to find one snapshot of one Iceberg table, and how to reach its files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Recipe {
    /// The table's name, for messages.
    pub(crate) table: String,
    /// Its `metadata.json` at the time the plan was made.
    pub(crate) metadata_location: String,
    /// The snapshot read; `None` for a table without one (reads nothing).
    pub(crate) snapshot_id: Option<i64>,
    /// The file IO's properties (storage endpoint, region, credentials; on
    /// the way to a cluster only temporary ones, see [`Recipe::travelling`]).
    pub(crate) file_io: HashMap<String, String>,
    /// Exactly these data files, read whole, instead of the snapshot's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) files: Option<Vec<PinnedFile>>,
    /// The query's filters Iceberg can bind: the snapshot's files and row
    /// groups whose metrics rule every row out are not read. Rows that
    /// pass are filtered again above the scan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) filter: Option<Predicate>,
}

/// A data file a pinned recipe reads: where, how many bytes, how many rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct PinnedFile {
    pub(crate) path: String,
    pub(crate) bytes: u64,
    pub(crate) rows: u64,
}

impl From<&iceberg::spec::DataFile> for PinnedFile {
    /// A data file as its manifest entry describes it.
    fn from(file: &iceberg::spec::DataFile) -> Self {
        Self {
            path: file.file_path().to_string(),
            bytes: file.file_size_in_bytes(),
            rows: file.record_count(),
        }
    }
}

/// Plans compare recipes as values; a filter's float literal that is NaN
/// only makes two recipes of one plan compare unequal (never equal ones
/// that differ).
impl Eq for Recipe {}

/// Hashed by what names the snapshot (the file-IO properties are a map).
impl std::hash::Hash for Recipe {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.metadata_location.hash(state);
        self.snapshot_id.hash(state);
        self.files.hash(state);
    }
}

impl Recipe {
    /// The recipe of `table` at `snapshot_id` (its current snapshot when
    /// `None`) as it leaves for a cluster: without long-lived keys.
    #[cfg(feature = "cluster")]
    pub(crate) fn of(table: &Table, snapshot_id: Option<i64>) -> Result<Self> {
        Ok(Self::described(table, snapshot_id, table.file_io())?.travelling())
    }

    fn described(
        table: &Table,
        snapshot_id: Option<i64>,
        io: &iceberg::io::FileIO,
    ) -> Result<Self> {
        let metadata_location = table.metadata_location().ok_or_else(|| {
            Error::invalid(format!(
                "table {} has no metadata file, so it cannot be read from a recipe",
                table.identifier()
            ))
        })?;
        Ok(Self {
            table: table.identifier().to_string(),
            metadata_location: metadata_location.to_string(),
            snapshot_id: snapshot_id.or_else(|| table.metadata().current_snapshot_id()),
            file_io: io.config().props().clone(),
            files: None,
            filter: None,
        })
    }

    /// The recipe of `table` at `snapshot_id` for reading in this process,
    /// with the table's own file IO.
    pub(crate) fn here(table: &Table, snapshot_id: Option<i64>) -> Result<Self> {
        Self::described(table, snapshot_id, table.file_io())
    }

    /// `table`'s schema over exactly `files` (read whole, sorted by path,
    /// each checked to hold the rows given), reached with `io` (its keys
    /// kept: [`Recipe::travelling`] drops them before a cluster sees it).
    pub(crate) fn pinned(
        table: &Table,
        files: impl IntoIterator<Item = PinnedFile>,
        io: &iceberg::io::FileIO,
    ) -> Result<Self> {
        let mut files: Vec<PinnedFile> = files.into_iter().collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Self {
            files: Some(files),
            ..Self::described(table, None, io)?
        })
    }

    /// This recipe as it may leave the process: without long-lived keys.
    #[cfg(feature = "cluster")]
    pub(crate) fn travelling(mut self) -> Self {
        self.file_io = without_long_lived_keys(self.file_io);
        self
    }

    /// `opened` when this process holds the table, else the table opened.
    async fn opened_or_open(&self, opened: &Option<Table>) -> Result<Table> {
        match opened {
            Some(table) => Ok(table.clone()),
            None => self.open().await,
        }
    }

    /// Opens the table the recipe names, read-only.
    pub(crate) async fn open(&self) -> Result<Table> {
        let io = file_io(&self.file_io);
        let ident = TableIdent::new(
            NamespaceIdent::new("cluster".to_string()),
            self.table.clone(),
        );
        let table = StaticTable::from_metadata_file(&self.metadata_location, ident, io)
            .await
            .map_err(|e| {
                Error::invalid(format!(
                    "cannot read {}'s metadata file {} where the task ran ({e}): every executor \
                     must reach the table's storage (same paths, endpoint and credentials)",
                    self.table, self.metadata_location
                ))
            })?;
        Ok(table.into_table())
    }

    /// The snapshot's data files for `columns`, in path order (the order
    /// every executor agrees on).
    pub(crate) async fn tasks(
        &self,
        table: &Table,
        columns: &[String],
    ) -> Result<Vec<FileScanTask>> {
        if let Some(files) = &self.files {
            return self.pinned_tasks(table, files, columns);
        }
        let Some(snapshot) = self.snapshot_id else {
            return Ok(vec![]);
        };
        let mut scan = table
            .scan()
            .snapshot_id(snapshot)
            .select(columns.iter().cloned());
        if let Some(filter) = &self.filter {
            scan = scan.with_filter(filter.clone());
        }
        let scan = scan.build()?;
        let mut tasks: Vec<FileScanTask> = scan.plan_files().await?.try_collect().await?;
        tasks.sort_by(|a, b| {
            (a.data_file_path.as_str(), a.start).cmp(&(b.data_file_path.as_str(), b.start))
        });
        Ok(tasks)
    }
}

impl Recipe {
    /// Whole-file tasks for `files`, projecting `columns` of the table's
    /// current schema.
    fn pinned_tasks(
        &self,
        table: &Table,
        files: &[PinnedFile],
        columns: &[String],
    ) -> Result<Vec<FileScanTask>> {
        let schema = Arc::clone(table.metadata().current_schema());
        let ids = columns
            .iter()
            .map(|name| {
                schema
                    .field_by_name(name)
                    .map(|f| f.id)
                    .ok_or_else(|| Error::invalid(format!("{} has no column '{name}'", self.table)))
            })
            .collect::<Result<Vec<i32>>>()?;
        Ok(files
            .iter()
            .map(|file| FileScanTask {
                file_size_in_bytes: file.bytes,
                start: 0,
                length: file.bytes,
                record_count: Some(file.rows),
                data_file_path: file.path.clone(),
                data_file_format: iceberg::spec::DataFileFormat::Parquet,
                schema: Arc::clone(&schema),
                project_field_ids: ids.clone(),
                predicate: None,
                deletes: vec![],
                partition: None,
                partition_spec: None,
                name_mapping: None,
                case_sensitive: true,
            })
            .collect())
    }
}

/// The share of `items` partition `partition` of `partitions` takes: every
/// `partitions`-th, with its index.
pub(crate) fn share<T: Clone>(items: &[T], partition: usize, partitions: usize) -> Vec<(usize, T)> {
    items
        .iter()
        .cloned()
        .enumerate()
        .filter(|(k, _)| k % partitions.max(1) == partition)
        .collect()
}

/// Storage properties as a plan or job carries them to executors: without
/// long-lived keys. Keys travel only with their session token (temporary
/// credentials, which expire); otherwise every executor reaches storage
/// with its own credentials (its environment, profile or instance role),
/// as any other process of the deployment would.
#[cfg(feature = "cluster")]
pub(crate) fn without_long_lived_keys<C: FromIterator<(String, String)>>(
    properties: impl IntoIterator<Item = (String, String)>,
) -> C {
    let named = |name: &str, words: &[&str]| {
        let name = name.to_ascii_lowercase().replace('_', "-");
        words.iter().any(|w| name.contains(w))
    };
    let temporary_keys = ["access-key-id", "secret-access-key", "session-token"];
    let credentials = [
        "secret",
        "access-key",
        "account-key",
        "credential",
        "password",
        "private-key",
        "token",
        "sas",
    ];
    let pairs: Vec<(String, String)> = properties.into_iter().collect();
    let temporary = pairs
        .iter()
        .any(|(k, v)| named(k, &["session-token"]) && !v.trim().is_empty());
    pairs
        .into_iter()
        .filter(|(k, _)| !named(k, &credentials) || (temporary && named(k, &temporary_keys)))
        .collect()
}

/// A file IO from the properties a recipe or job carries.
pub(crate) fn file_io(properties: &HashMap<String, String>) -> iceberg::io::FileIO {
    FileIOBuilder::new(Arc::new(crate::catalog::storage::StoragesFactory))
        .with_props(properties.clone())
        .build()
}

/// A table provider for one pinned snapshot that a cluster can plan: the
/// logical codec sends its recipe.
#[derive(Debug)]
pub(crate) struct RecipeTable {
    pub(crate) recipe: Recipe,
    pub(crate) schema: SchemaRef,
    /// The table, where this process already holds it: scans here read it
    /// instead of the metadata file again (a recipe that travels does not
    /// carry it).
    pub(crate) opened: Option<Table>,
}

impl RecipeTable {
    /// `table` at `snapshot_id` (its current snapshot when `None`).
    #[cfg(feature = "cluster")]
    pub(crate) fn new(table: &Table, snapshot_id: Option<i64>) -> Result<Self> {
        Self::of_recipe(table, Recipe::of(table, snapshot_id)?)
    }

    /// Exactly `files` (data files of `table`, read whole, never pruned by
    /// their metrics) as a table of `table`'s columns, reached with its
    /// file IO.
    pub(crate) fn of_files(table: &Table, files: &[iceberg::spec::DataFile]) -> Result<Self> {
        let pinned = files.iter().map(PinnedFile::from);
        Self::of_recipe(table, Recipe::pinned(table, pinned, table.file_io())?)
    }

    /// `recipe`, a recipe of `table`, as a table; its files are reached
    /// with the recipe's file IO.
    pub(crate) fn of_recipe(table: &Table, recipe: Recipe) -> Result<Self> {
        let schema = recipe.arrow_schema(table)?;
        let opened = Table::builder()
            .metadata(table.metadata_ref())
            .metadata_location(recipe.metadata_location.clone())
            .identifier(table.identifier().clone())
            .file_io(file_io(&recipe.file_io))
            .runtime(iceberg::Runtime::current())
            .readonly(true)
            .build()?;
        Ok(Self {
            recipe,
            schema,
            opened: Some(opened),
        })
    }
}

#[async_trait]
impl TableProvider for RecipeTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters on primitive columns of a snapshot's table prune its files
    /// and row groups (by their metrics) and stay above the scan too; a
    /// pinned recipe reads its files whole, whatever the filters.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|filter| match self.prunes_by(filter) {
                true => TableProviderFilterPushDown::Inexact,
                false => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(indices) => Arc::new(self.schema.project(indices)?),
            None => Arc::clone(&self.schema),
        };
        let mut recipe = self.recipe.clone();
        let pruning: Vec<Expr> = filters
            .iter()
            .filter(|f| self.prunes_by(f))
            .cloned()
            .collect();
        recipe.filter = convert_filters_to_predicate(&pruning);
        let table = recipe.opened_or_open(&self.opened).await?;
        let columns = scan_columns(&self.schema, &schema);
        let files = recipe.tasks(&table, &columns).await?.len();
        let partitions = files.clamp(1, state.config().target_partitions().max(1));
        let mut scan = RecipeScanExec::new(recipe, schema, partitions, files);
        scan.opened = self.opened.clone();
        Ok(Arc::new(scan))
    }
}

impl RecipeTable {
    /// Whether `filter` may prune the files read: a snapshot's (not pinned
    /// files), on primitive columns only (Iceberg binds no other).
    fn prunes_by(&self, filter: &Expr) -> bool {
        self.recipe.files.is_none()
            && filter.column_refs().iter().all(|column| {
                self.schema
                    .field_with_name(&column.name)
                    .is_ok_and(|field| !field.data_type().is_nested())
            })
    }
}

/// The columns to ask Iceberg for: the projected ones, or the first column
/// when none is (`count(*)` reads rows, not values).
fn scan_columns(table: &SchemaRef, projected: &SchemaRef) -> Vec<String> {
    let names: Vec<String> = projected
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    if names.is_empty() {
        table
            .fields()
            .iter()
            .take(1)
            .map(|f| f.name().clone())
            .collect()
    } else {
        names
    }
}

/// Reads every `partitions`-th file of a recipe's snapshot, starting at the
/// partition's index.
#[derive(Debug)]
pub(crate) struct RecipeScanExec {
    pub(crate) recipe: Recipe,
    pub(crate) schema: SchemaRef,
    pub(crate) partitions: usize,
    /// The files the scheduler planned; every executor must plan as many.
    pub(crate) files: usize,
    /// The table, where the scan runs in the process that holds it.
    pub(crate) opened: Option<Table>,
    properties: Arc<PlanProperties>,
}

impl RecipeScanExec {
    pub(crate) fn new(recipe: Recipe, schema: SchemaRef, partitions: usize, files: usize) -> Self {
        let properties = crate::rows::bounded_properties(Arc::clone(&schema), partitions, true);
        Self {
            recipe,
            schema,
            partitions,
            files,
            opened: None,
            properties,
        }
    }
}

impl DisplayAs for RecipeScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "RecipeScanExec: table={} snapshot={} files={} partitions={}",
            self.recipe.table,
            self.recipe
                .snapshot_id
                .map_or_else(|| "none".to_string(), |s| s.to_string()),
            self.files,
            self.partitions
        )
    }
}

impl ExecutionPlan for RecipeScanExec {
    fn name(&self) -> &str {
        "RecipeScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let (recipe, opened) = (self.recipe.clone(), self.opened.clone());
        let schema = Arc::clone(&self.schema);
        let (partitions, planned) = (self.partitions, self.files);
        let stream = futures::stream::once(async move {
            let table = recipe.opened_or_open(&opened).await?;
            read_partition(recipe, table, schema, partition, partitions, planned).await
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }
}

/// One partition's rows, checked against what the manifests record.
async fn read_partition(
    recipe: Recipe,
    table: Table,
    schema: SchemaRef,
    partition: usize,
    partitions: usize,
    planned: usize,
) -> DFResult<futures::stream::BoxStream<'static, DFResult<RecordBatch>>> {
    crate::session::failpoint("cluster.scan");
    let all = recipe.schema_columns(&table, &schema)?;
    let tasks = recipe.tasks(&table, &all).await?;
    if tasks.len() != planned {
        return Err(DataFusionError::External(Box::new(Error::invalid(
            format!(
                "{} at snapshot {} has {} data files where this task ran but {planned} when the job \
             was planned: the executors see other storage than the coordinator",
                recipe.table,
                recipe.snapshot_id.unwrap_or_default(),
                tasks.len()
            ),
        ))));
    }
    let mine: Vec<FileScanTask> = share(&tasks, partition, partitions)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    // Rows the manifests record for these files (exact when no delete file
    // applies and no filter prunes row groups; else the rows read are
    // fewer, and not checked).
    let expected: Option<u64> = match recipe.filter {
        Some(_) => None,
        None => mine
            .iter()
            .map(|t| t.deletes.is_empty().then_some(t.record_count).flatten())
            .sum(),
    };
    // One file at a time: the partitions are what runs in parallel, and a
    // file read ahead holds its decoded row groups in memory meanwhile.
    let batches = table
        .reader_builder()
        .with_data_file_concurrency_limit(1)
        .build()
        .read(Box::pin(futures::stream::iter(mine.into_iter().map(Ok))))
        .map_err(|e| DataFusionError::External(Box::new(Error::from(e))))?
        .stream();
    let reading = Reading {
        batches,
        schema,
        table: recipe.table,
        partition,
        expected,
        read: 0,
        done: false,
    };
    let checked = futures::stream::unfold(reading, |mut reading| async move {
        let item = reading.next().await?;
        Some((item, reading))
    });
    Ok(checked.boxed())
}

/// A partition's batches as they are read, then the check of their count.
struct Reading {
    batches: iceberg::scan::ArrowRecordBatchStream,
    schema: SchemaRef,
    table: String,
    partition: usize,
    expected: Option<u64>,
    read: u64,
    done: bool,
}

impl Reading {
    async fn next(&mut self) -> Option<DFResult<RecordBatch>> {
        if self.done {
            return None;
        }
        match self.batches.next().await {
            Some(Ok(batch)) => {
                self.read += batch.num_rows() as u64;
                Some(conform(&batch, &self.schema))
            }
            Some(Err(e)) => {
                self.done = true;
                Some(Err(DataFusionError::External(Box::new(Error::from(e)))))
            }
            None => {
                self.done = true;
                let expected = self.expected.filter(|e| *e != self.read)?;
                Some(Err(DataFusionError::External(Box::new(Error::invalid(
                    format!(
                        "{}: partition {} read {} rows where the manifests record {expected}: a data \
                     file is missing, truncated or unreadable",
                        self.table, self.partition, self.read
                    ),
                )))))
            }
        }
    }
}

impl Recipe {
    /// The schema of the recipe's snapshot (the table's current one when
    /// it has none), in Arrow form.
    fn arrow_schema(&self, table: &Table) -> Result<SchemaRef> {
        let schema = match self
            .snapshot_id
            .and_then(|id| table.metadata().snapshot_by_id(id))
        {
            Some(snapshot) => snapshot.schema(table.metadata())?,
            None => Arc::clone(table.metadata().current_schema()),
        };
        Ok(Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?))
    }

    /// The columns to read for `projected`, a projection of the table's schema.
    fn schema_columns(&self, table: &Table, projected: &SchemaRef) -> Result<Vec<String>> {
        Ok(scan_columns(&self.arrow_schema(table)?, projected))
    }
}

/// `batch` with `schema`'s fields (the reader's carry Iceberg's field ids);
/// a projection of no column keeps only the row count.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> DFResult<RecordBatch> {
    if schema.fields().is_empty() {
        let options = datafusion::arrow::array::RecordBatchOptions::new()
            .with_row_count(Some(batch.num_rows()));
        return Ok(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            vec![],
            &options,
        )?);
    }
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            batch.column_by_name(field.name()).cloned().ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "the scan returned no column '{}'",
                    field.name()
                ))
            })
        })
        .collect::<DFResult<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "cluster")]
    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shares_cover_every_item_once() {
        let items: Vec<usize> = (0..10).collect();
        let mut seen: Vec<usize> = (0..3)
            .flat_map(|p| share(&items, p, 3))
            .map(|(i, _)| i)
            .collect();
        seen.sort();
        assert_eq!(seen, items);
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn long_lived_keys_never_travel() {
        let static_keys = pairs(&[
            ("s3.endpoint", "http://127.0.0.1:9000"),
            ("s3.region", "eu-west-1"),
            ("s3.access-key-id", "AKIAEXAMPLE"),
            ("s3.secret-access-key", "wJalrXUtnFEMI"),
            ("adls.account-key", "key"),
            ("gcs.credentials-json", "{}"),
            ("access_key_id", "AKIAEXAMPLE"),
            ("secret_access_key", "wJalrXUtnFEMI"),
            ("role_arn", "arn:aws:iam::1:role/r"),
        ]);
        let kept: Vec<(String, String)> = without_long_lived_keys(static_keys);
        assert_eq!(
            kept,
            pairs(&[
                ("s3.endpoint", "http://127.0.0.1:9000"),
                ("s3.region", "eu-west-1"),
                ("role_arn", "arn:aws:iam::1:role/r"),
            ])
        );
        // Temporary credentials travel: they expire.
        let temporary = pairs(&[
            ("s3.access-key-id", "ASIAEXAMPLE"),
            ("s3.secret-access-key", "s"),
            ("s3.session-token", "t"),
            ("adls.account-key", "key"),
        ]);
        let kept: HashMap<String, String> = without_long_lived_keys(temporary);
        assert_eq!(kept.len(), 3);
        assert!(!kept.contains_key("adls.account-key"));
    }
}
