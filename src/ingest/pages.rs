//! Parquet sources read with their pages checked: DataFusion's Parquet
//! format, with every file reader it makes wrapped in the page guard of
//! [`crate::limits::pages`], so that a page of a file under a watched
//! prefix cannot inflate past `limits.page_inflated_bytes` or past what its
//! header declares.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::config::TableParquetOptions;
use datafusion::common::{Statistics, internal_datafusion_err};
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::file_format::{FileFormat, FileMeta};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, FileSource, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::Result as DFResult;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use object_store::{ObjectMeta, ObjectStore};
use parquet::arrow::async_reader::AsyncFileReader;

use crate::limits::pages::PageGuard;

/// DataFusion's Parquet format, reading through page guards. The page
/// index is not used: a scan then fetches whole column chunks only, each
/// walked before it is decoded (a read of part of a chunk is refused).
#[derive(Debug)]
pub(crate) struct GuardedParquet {
    inner: ParquetFormat,
}

impl GuardedParquet {
    pub(crate) fn new() -> Self {
        let mut options = TableParquetOptions::default();
        options.global.enable_page_index = false;
        options.global.pushdown_filters = false;
        Self {
            inner: ParquetFormat::default().with_options(options),
        }
    }
}

#[async_trait]
impl FileFormat for GuardedParquet {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn get_ext(&self) -> String {
        self.inner.get_ext()
    }

    fn get_ext_with_compression(&self, compression: &FileCompressionType) -> DFResult<String> {
        self.inner.get_ext_with_compression(compression)
    }

    fn compression_type(&self) -> Option<FileCompressionType> {
        self.inner.compression_type()
    }

    async fn infer_schema(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        objects: &[ObjectMeta],
    ) -> DFResult<SchemaRef> {
        self.inner.infer_schema(state, store, objects).await
    }

    async fn infer_stats(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        table_schema: SchemaRef,
        object: &ObjectMeta,
    ) -> DFResult<Statistics> {
        self.inner
            .infer_stats(state, store, table_schema, object)
            .await
    }

    async fn infer_stats_and_ordering(
        &self,
        state: &dyn Session,
        store: &Arc<dyn ObjectStore>,
        table_schema: SchemaRef,
        object: &ObjectMeta,
    ) -> DFResult<FileMeta> {
        self.inner
            .infer_stats_and_ordering(state, store, table_schema, object)
            .await
    }

    async fn create_physical_plan(
        &self,
        state: &dyn Session,
        conf: FileScanConfig,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.create_physical_plan(state, conf).await?;
        let unguarded = || internal_datafusion_err!("a Parquet scan without a reader factory");
        let exec = plan
            .as_any()
            .downcast_ref::<DataSourceExec>()
            .ok_or_else(unguarded)?;
        let (config, source) = exec
            .downcast_to_file_source::<ParquetSource>()
            .ok_or_else(unguarded)?;
        let readers = Arc::clone(source.parquet_file_reader_factory().ok_or_else(unguarded)?);
        let source = source
            .clone()
            .with_parquet_file_reader_factory(Arc::new(GuardedReaders(readers)));
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }

    fn file_source(&self, table_schema: TableSchema) -> Arc<dyn FileSource> {
        self.inner.file_source(table_schema)
    }
}

/// Makes the readers its inner factory makes, each behind a page guard.
#[derive(Debug)]
struct GuardedReaders(Arc<dyn ParquetFileReaderFactory>);

impl ParquetFileReaderFactory for GuardedReaders {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> DFResult<Box<dyn AsyncFileReader + Send>> {
        let path = file.object_meta.location.to_string();
        let inner: Box<dyn AsyncFileReader> =
            self.0
                .create_reader(partition_index, file, metadata_size_hint, metrics)?;
        Ok(Box::new(PageGuard::unread(inner, &path)))
    }
}
