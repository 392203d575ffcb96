//! The one Parquet writer: rows (named as a table's columns) streamed into
//! new data files of an Iceberg table, in the table's codec, split by its
//! partition spec. INSERT, CREATE TABLE AS, COPY INTO, download fills and
//! promotion's rewrite path all write through it.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef as ArrowSchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use iceberg::arrow::{RecordBatchPartitionSplitter, schema_to_arrow_schema};
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

/// The zstd level when the table names none.
const ZSTD_LEVEL: i32 = 3;
/// A column chunk stops dictionary-encoding (falls back to plain) once its
/// dictionary holds this many bytes: low-cardinality columns stay encoded,
/// unique keys and timestamps stop paying for hashing early.
const DICTIONARY_PAGE_BYTES: usize = 256 * 1024;

/// `batch` (columns named as the target's) with the target's Arrow types
/// and field ids. A null in a required column is refused: Parquet would
/// store the type's default (an empty string, a zero) in its place.
fn conform(batch: &RecordBatch, schema: &ArrowSchemaRef, table: &str) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            let column = batch.column_by_name(name).ok_or_else(|| {
                Error::invalid(format!(
                    "the rows written to {table} have no column '{name}'"
                ))
            })?;
            let nulls = column.null_count();
            if nulls > 0 && !field.is_nullable() {
                return Err(Error::invalid(format!(
                    "column '{name}' of {table} is NOT NULL, but {nulls} row(s) written to it have \
                     no value: give every row a value (e.g. COALESCE({name}, <default>)), or \
                     name the column in the INSERT's column list"
                )));
            }
            Ok(cast(column, field.data_type())?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The table property naming the Parquet codec of new data files.
const CODEC_PROPERTY: &str = "write.parquet.compression-codec";
/// The table property naming the codec's level.
const LEVEL_PROPERTY: &str = "write.parquet.compression-level";

/// Parquet settings from the table's `write.parquet.compression-codec` and
/// `-level` properties (Iceberg's names), zstd when unset as in Iceberg.
fn writer_properties(target: &Table) -> Result<WriterProperties> {
    let properties = target.metadata().properties();
    let table = target.identifier();
    let codec = properties
        .get(CODEC_PROPERTY)
        .map_or("zstd".to_string(), |c| c.to_ascii_lowercase());
    let level = properties
        .get(LEVEL_PROPERTY)
        .map(|l| l.parse::<i32>())
        .transpose()
        .map_err(|_| {
            Error::invalid(format!(
                "table '{table}' has {LEVEL_PROPERTY} = '{}': set a whole number or remove it",
                properties[LEVEL_PROPERTY]
            ))
        })?;
    let bad_level = |e: parquet::errors::ParquetError| {
        Error::invalid(format!(
            "table '{table}' has {LEVEL_PROPERTY} = {level:?} for {codec}: {e}"
        ))
    };
    let compression = match codec.as_str() {
        "zstd" => {
            Compression::ZSTD(ZstdLevel::try_new(level.unwrap_or(ZSTD_LEVEL)).map_err(bad_level)?)
        }
        "gzip" => {
            Compression::GZIP(GzipLevel::try_new(level.unwrap_or(6) as u32).map_err(bad_level)?)
        }
        "snappy" => Compression::SNAPPY,
        "lz4" => Compression::LZ4_RAW,
        "uncompressed" | "none" => Compression::UNCOMPRESSED,
        other => {
            return Err(Error::invalid(format!(
                "table '{table}' has {CODEC_PROPERTY} = '{other}': use zstd, snappy, gzip, lz4 or uncompressed"
            )));
        }
    };
    Ok(WriterProperties::builder()
        .set_compression(compression)
        .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES)
        .build())
}

/// Writes `rows` (columns named as the target's; types are cast) as new
/// Parquet files of `target`, split by its partition spec, streaming.
/// Returns the data files, not yet committed.
pub(crate) async fn write_rows(
    target: &Table,
    file_prefix: &str,
    mut rows: impl futures::Stream<Item = Result<RecordBatch>> + Unpin,
) -> Result<Vec<DataFile>> {
    let metadata = target.metadata();
    let schema = metadata.current_schema();
    let arrow: ArrowSchemaRef = Arc::new(schema_to_arrow_schema(schema)?);
    let name = target.identifier().to_string();
    let files = RollingFileWriterBuilder::new_with_default_file_size(
        ParquetWriterBuilder::new(writer_properties(target)?, Arc::clone(schema)),
        target.file_io().clone(),
        DefaultLocationGenerator::new(metadata)?,
        DefaultFileNameGenerator::new(file_prefix.to_string(), None, DataFileFormat::Parquet),
    );
    let builder = DataFileWriterBuilder::new(files);
    let spec = metadata.default_partition_spec();
    if spec.is_unpartitioned() {
        let mut writer = builder.build(None).await?;
        while let Some(batch) = rows.try_next().await? {
            writer.write(conform(&batch, &arrow, &name)?).await?;
        }
        return Ok(writer.close().await?);
    }
    let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
        Arc::clone(schema),
        Arc::clone(spec),
    )?;
    let mut writer = FanoutWriter::new(builder);
    while let Some(batch) = rows.try_next().await? {
        for (key, part) in splitter.split(&conform(&batch, &arrow, &name)?)? {
            writer.write(key, part).await?;
        }
    }
    Ok(writer.close().await?)
}

/// Writes every partition of `input` as new data files of `target`, each
/// partition streaming on its own task ([`write_rows`]); file names start
/// with `file_prefix`. Returns the files, not yet committed. The first
/// error (or dropping the future) stops the other partitions.
pub(crate) async fn write_partitions(
    target: &Table,
    file_prefix: &str,
    input: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
) -> Result<Vec<DataFile>> {
    let mut writers = tokio::task::JoinSet::new();
    for partition in 0..input.properties().output_partitioning().partition_count() {
        let rows = input
            .execute(partition, Arc::clone(&task))?
            .map_err(Error::from);
        let (target, prefix) = (target.clone(), format!("{file_prefix}-{partition:04}"));
        writers.spawn(async move { write_rows(&target, &prefix, rows).await });
    }
    let mut files = vec![];
    while let Some(written) = writers.join_next().await {
        files.extend(
            written.map_err(|e| Error::from(DataFusionError::ExecutionJoin(Box::new(e))))??,
        );
    }
    Ok(files)
}
