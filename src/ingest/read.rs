//! Reading selected files as one DataFusion table: format, compression,
//! schema (inferred from Parquet footers with range requests, from a bounded
//! sample for csv/json/avro, or given), and the vocabulary every connector
//! shares.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::avro::AvroFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::Result as DFResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan, TableType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use object_store::{ObjectMeta, ObjectStore};
use tempfile::TempDir;

use super::compression::{compression_type, stage_locally};
use super::options::{Compression, Format, SourceOptions};
use super::pages::GuardedParquet;
use super::source::{Access, SourceFile, select};
pub(crate) use super::store::CountingStore;
use crate::error::{Error, Result};

/// Rows sampled to infer a csv or json schema.
const SAMPLE_ROWS: usize = 1000;

fn file_format(
    format: Format,
    compression: Compression,
    options: &SourceOptions,
    files: &[SourceFile],
) -> Arc<dyn FileFormat> {
    let compression = compression_type(compression);
    match format {
        Format::Csv => {
            let tab = files
                .iter()
                .all(|f| f.uri.to_ascii_lowercase().contains(".tsv"));
            Arc::new(
                CsvFormat::default()
                    .with_has_header(options.header.unwrap_or(true))
                    .with_delimiter(options.delimiter.unwrap_or(if tab { b'\t' } else { b',' }))
                    .with_schema_infer_max_rec(SAMPLE_ROWS)
                    .with_file_compression_type(compression),
            )
        }
        Format::Json => Arc::new(
            JsonFormat::default()
                .with_schema_infer_max_rec(SAMPLE_ROWS)
                .with_file_compression_type(compression),
        ),
        Format::Parquet => Arc::new(GuardedParquet::new()),
        Format::Avro => Arc::new(AvroFormat),
    }
}

/// The columns of a user-supplied schema (`id BIGINT, name VARCHAR`).
async fn user_schema(text: &str) -> Result<SchemaRef> {
    let ctx = SessionContext::new();
    let plan = ctx
        .state()
        .create_logical_plan(&format!("CREATE TABLE icestage_schema ({text})"))
        .await
        .map_err(|e| {
            Error::invalid(format!(
                "schema '{text}' is not a column list: write it as in CREATE TABLE, e.g. 'id BIGINT, name VARCHAR' ({})",
                crate::error_message(&e)
            ))
        })?;
    match plan {
        LogicalPlan::Ddl(datafusion::logical_expr::DdlStatement::CreateMemoryTable(create)) => {
            Ok(Arc::clone(create.input.schema().inner()))
        }
        _ => Err(Error::invalid(format!(
            "schema '{text}' is not a column list"
        ))),
    }
}

/// Selected files ready to be read as one table.
pub(crate) struct Source {
    pub(crate) files: Vec<SourceFile>,
    pub(crate) format: Format,
    pub(crate) schema: SchemaRef,
    /// Bytes fetched to infer the schema (0 when it was given).
    pub(crate) schema_bytes: u64,
    /// Total size of the selected files.
    pub(crate) total_bytes: u64,
    table: Arc<ListingTable>,
    store_url: url::Url,
    store: Arc<dyn ObjectStore>,
    scratch: Option<Arc<TempDir>>,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("files", &self.files.len())
            .field("format", &self.format)
            .field("schema", &self.schema)
            .finish()
    }
}

impl Source {
    /// Lists, guards, infers: everything but reading the rows.
    pub(crate) async fn open(uri: &str, options: &SourceOptions) -> Result<Self> {
        let access = Access::open(uri, options).await?;
        let (files, format) = select(&access, uri, options).await?;
        Self::of_files(access, files, format, options).await
    }

    /// A table over `files` (already selected) of `access`.
    pub(crate) async fn of_files(
        access: Access,
        files: Vec<SourceFile>,
        format: Format,
        options: &SourceOptions,
    ) -> Result<Self> {
        Self::of_files_as(access, files, format, options, None).await
    }

    /// As [`Source::of_files`], read as `schema` when given (columns
    /// inferred across more files than these), else as the options say.
    pub(crate) async fn of_files_as(
        access: Access,
        files: Vec<SourceFile>,
        format: Format,
        options: &SourceOptions,
        schema: Option<SchemaRef>,
    ) -> Result<Self> {
        let total_bytes = files.iter().map(|f| f.meta.size).sum();
        let first = files.first().map_or(Compression::None, |f| f.compression);
        let uniform = files.iter().all(|f| f.compression == first) && first != Compression::Snappy;
        if !uniform && matches!(format, Format::Parquet | Format::Avro) {
            return Err(Error::invalid(format!(
                "{format} files carry their own compression: a whole-file .gz/.snappy suffix is not readable"
            )));
        }
        let (read_files, store, store_url, scratch, compression): (
            Vec<SourceFile>,
            Arc<dyn ObjectStore>,
            url::Url,
            _,
            _,
        ) = if uniform {
            (
                files.clone(),
                Arc::clone(&access.store),
                access.store_url.clone(),
                None,
                first,
            )
        } else {
            let (dir, staged) = stage_locally(&access, &files).await?;
            (
                staged,
                Arc::new(object_store::local::LocalFileSystem::new()),
                url::Url::parse("file:///").expect("valid"),
                Some(Arc::new(dir)),
                Compression::None,
            )
        };
        let format_impl = file_format(format, compression, options, &read_files);
        let counting = Arc::new(CountingStore::new(Arc::clone(&store)));
        let ctx = SessionContext::new();
        ctx.register_object_store(&store_url, Arc::clone(&counting) as Arc<dyn ObjectStore>);
        let (schema, schema_bytes) = match (schema, &options.schema) {
            (Some(schema), _) => (schema, 0),
            (None, Some(text)) => (user_schema(text).await?, 0),
            (None, None) => {
                let metas: Vec<ObjectMeta> = read_files.iter().map(|f| f.meta.clone()).collect();
                let store: Arc<dyn ObjectStore> = Arc::clone(&counting) as _;
                let schema = format_impl
                    .infer_schema(&ctx.state(), &store, &metas)
                    .await
                    .map_err(|e| {
                        Error::invalid(format!(
                            "cannot infer a schema from the {format} files ({}): {}; pass format => or schema =>",
                            read_files.first().map_or("", |f| f.uri.as_str()),
                            crate::error_message(&e)
                        ))
                    })?;
                (schema, counting.bytes())
            }
        };
        let urls = read_files
            .iter()
            .map(|f| ListingTableUrl::parse(&f.uri))
            .collect::<DFResult<Vec<_>>>()?;
        let listing = ListingOptions::new(format_impl).with_file_extension("");
        let config = ListingTableConfig::new_with_multi_paths(urls)
            .with_listing_options(listing)
            .with_schema(Arc::clone(&schema));
        let table = Arc::new(ListingTable::try_new(config)?);
        Ok(Self {
            files,
            format,
            schema,
            schema_bytes,
            total_bytes,
            table,
            store_url,
            store,
            scratch,
        })
    }
}

/// `read_s3_prefix(...)` as a table: the listing table over the selected
/// files, with its object store registered in the session that scans it.
#[derive(Debug)]
pub(crate) struct PrefixTable {
    source: Arc<Source>,
}

impl PrefixTable {
    pub(crate) fn new(source: Arc<Source>) -> Self {
        Self { source }
    }
}

#[async_trait]
impl TableProvider for PrefixTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.source.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        state
            .runtime_env()
            .register_object_store(&self.source.store_url, Arc::clone(&self.source.store));
        let plan = self
            .source
            .table
            .scan(state, projection, filters, limit)
            .await?;
        Ok(match &self.source.scratch {
            Some(dir) => Arc::new(KeepAliveExec::new(plan, Arc::clone(dir))),
            None => plan,
        })
    }
}

/// Runs `inner` while keeping the staged files it reads on disk: the scan
/// outlives the table provider that staged them.
#[derive(Debug)]
struct KeepAliveExec {
    inner: Arc<dyn ExecutionPlan>,
    dir: Arc<TempDir>,
}

impl KeepAliveExec {
    fn new(inner: Arc<dyn ExecutionPlan>, dir: Arc<TempDir>) -> Self {
        Self { inner, dir }
    }
}

impl DisplayAs for KeepAliveExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StagedFilesExec: {}", self.dir.path().display())
    }
}

impl ExecutionPlan for KeepAliveExec {
    fn name(&self) -> &str {
        "StagedFilesExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.inner.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.inner]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let inner = children.pop().unwrap_or_else(|| Arc::clone(&self.inner));
        Ok(Arc::new(Self::new(inner, Arc::clone(&self.dir))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let stream = self.inner.execute(partition, context)?;
        let schema = stream.schema();
        let dir = Arc::clone(&self.dir);
        let kept = stream.map(move |batch| {
            let _ = &dir;
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, kept)))
    }
}

/// The shared vocabulary type of an Arrow type: integer, float, string,
/// boolean, date or timestamp (nested and binary values read as string).
pub(crate) fn vocabulary(data_type: &DataType) -> &'static str {
    match data_type {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => "integer",
        DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal32(_, _)
        | DataType::Decimal64(_, _)
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => "float",
        DataType::Boolean => "boolean",
        DataType::Date32 | DataType::Date64 => "date",
        DataType::Timestamp(_, _) => "timestamp",
        DataType::Dictionary(_, value) => vocabulary(value),
        _ => "string",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_types() {
        assert_eq!(vocabulary(&DataType::Int64), "integer");
        assert_eq!(vocabulary(&DataType::Float64), "float");
        assert_eq!(vocabulary(&DataType::Utf8View), "string");
        assert_eq!(vocabulary(&DataType::Date32), "date");
        assert_eq!(
            vocabulary(&DataType::Timestamp(
                datafusion::arrow::datatypes::TimeUnit::Microsecond,
                None
            )),
            "timestamp"
        );
        assert_eq!(vocabulary(&DataType::Boolean), "boolean");
    }
}
