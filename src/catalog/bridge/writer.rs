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
use iceberg::spec::{DataFile, DataFileBuilder, DataFileFormat, Datum, PrimitiveLiteral};
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
pub(crate) const CODEC_PROPERTY: &str = "write.parquet.compression-codec";
/// The table property naming the codec's level.
const LEVEL_PROPERTY: &str = "write.parquet.compression-level";
/// Iceberg's table property bounding a row group's bytes (as the writer
/// estimates them, encoded): a writer holds one row group in memory.
const ROW_GROUP_BYTES_PROPERTY: &str = "write.parquet.row-group-size-bytes";
/// The table property bounding a row group's rows (PyIceberg's name).
const ROW_GROUP_ROWS_PROPERTY: &str = "write.parquet.row-group-limit";
/// Largest row group size a table property may ask for (bytes or rows).
const MAX_ROW_GROUP: u64 = 1 << 30;

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
    let bound = |key: &str| -> Result<Option<usize>> {
        let Some(value) = properties.get(key) else {
            return Ok(None);
        };
        match value.trim().parse::<u64>() {
            Ok(n) if (1..=MAX_ROW_GROUP).contains(&n) => Ok(Some(n as usize)),
            _ => Err(Error::invalid(format!(
                "table '{table}' has {key} = '{value}': set a whole number from 1 to \
                 {MAX_ROW_GROUP}, or remove it"
            ))),
        }
    };
    let mut builder = WriterProperties::builder()
        .set_compression(compression)
        .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES)
        .set_max_row_group_bytes(bound(ROW_GROUP_BYTES_PROPERTY)?);
    if let Some(rows) = bound(ROW_GROUP_ROWS_PROPERTY)? {
        builder = builder.set_max_row_group_row_count(Some(rows));
    }
    Ok(builder.build())
}

/// Iceberg's table property: how much of each column's metrics a new data
/// file's manifest entry keeps, unless a column names its own.
pub(crate) const METRICS_DEFAULT: &str = "write.metadata.metrics.default";
/// Iceberg's table property prefix naming one column's metrics mode.
pub(crate) const METRICS_COLUMN: &str = "write.metadata.metrics.column.";

/// A metrics mode: Iceberg's `none`, `counts`, `truncate(N)` and `full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetricsMode {
    /// Nothing.
    None,
    /// Sizes, value, null and NaN counts; no bounds.
    Counts,
    /// Counts, and bounds of strings and binaries cut to N characters (bytes).
    Truncate(usize),
    /// Everything the writer collected.
    Full,
}

impl MetricsMode {
    fn parse(value: &str, table: &str, key: &str) -> Result<Self> {
        let lower = value.trim().to_ascii_lowercase();
        let truncated = lower
            .strip_prefix("truncate(")
            .and_then(|n| n.strip_suffix(')'))
            .map(|n| n.trim().parse::<usize>());
        match (lower.as_str(), truncated) {
            ("none", _) => Ok(Self::None),
            ("counts", _) => Ok(Self::Counts),
            ("full", _) => Ok(Self::Full),
            (_, Some(Ok(n))) if n > 0 => Ok(Self::Truncate(n)),
            _ => Err(Error::invalid(format!(
                "table '{table}' has {key} = '{value}': use none, counts, truncate(N) with N > 0, \
                 or full"
            ))),
        }
    }
}

/// `files` (new files of `target`) with the metrics `target`'s
/// `write.metadata.metrics.*` properties keep: the entries of a table that
/// is only ever looked up by a column or two stay small to read.
fn with_metrics_modes(target: &Table, files: Vec<DataFile>) -> Result<Vec<DataFile>> {
    let properties = target.metadata().properties();
    if !properties
        .keys()
        .any(|k| k == METRICS_DEFAULT || k.starts_with(METRICS_COLUMN))
    {
        return Ok(files);
    }
    let table = target.identifier().to_string();
    let schema = target.metadata().current_schema();
    let default = properties
        .get(METRICS_DEFAULT)
        .map(|v| MetricsMode::parse(v, &table, METRICS_DEFAULT))
        .transpose()?
        .unwrap_or(MetricsMode::Full);
    let mut by_field = std::collections::HashMap::new();
    for (key, value) in properties {
        if let Some(column) = key.strip_prefix(METRICS_COLUMN) {
            let mode = MetricsMode::parse(value, &table, key)?;
            // A column the schema no longer has (dropped, renamed) names nothing.
            if let Some(id) = schema.field_id_by_name(column) {
                by_field.insert(id, mode);
            }
        }
    }
    let mode = |id: &i32| by_field.get(id).copied().unwrap_or(default);
    let counts = |m: &std::collections::HashMap<i32, u64>| {
        m.iter()
            .filter(|(id, _)| mode(id) != MetricsMode::None)
            .map(|(id, n)| (*id, *n))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let bounds = |m: &std::collections::HashMap<i32, Datum>, upper: bool| {
        m.iter()
            .filter_map(|(id, datum)| match mode(id) {
                MetricsMode::None | MetricsMode::Counts => None,
                MetricsMode::Full => Some((*id, datum.clone())),
                MetricsMode::Truncate(n) => truncated(datum, n, upper).map(|d| (*id, d)),
            })
            .collect::<std::collections::HashMap<_, _>>()
    };
    files
        .into_iter()
        .map(|file| {
            let mut builder = DataFileBuilder::default();
            if let Some(order) = file.sort_order_id() {
                builder.sort_order_id(order);
            }
            builder
                .content(file.content_type())
                .file_path(file.file_path().to_string())
                .file_format(file.file_format())
                .partition(file.partition().clone())
                .record_count(file.record_count())
                .file_size_in_bytes(file.file_size_in_bytes())
                .column_sizes(counts(file.column_sizes()))
                .value_counts(counts(file.value_counts()))
                .null_value_counts(counts(file.null_value_counts()))
                .nan_value_counts(counts(file.nan_value_counts()))
                .lower_bounds(bounds(file.lower_bounds(), false))
                .upper_bounds(bounds(file.upper_bounds(), true))
                .split_offsets(file.split_offsets().map(<[i64]>::to_vec))
                .partition_spec_id(target.metadata().default_partition_spec_id())
                .build()
                .map_err(|e| Error::internal(format!("data file of {table}: {e}")))
        })
        .collect()
}

/// `bound` cut to `n` characters (bytes for a binary): a lower bound is
/// its prefix; an upper bound its prefix with the last character (byte)
/// incremented, or none when no increment exists. Other types stay whole.
fn truncated(bound: &Datum, n: usize, upper: bool) -> Option<Datum> {
    match bound.literal() {
        PrimitiveLiteral::String(s) if s.chars().count() > n => {
            let mut chars: Vec<char> = s.chars().take(n).collect();
            if upper {
                loop {
                    let last = chars.pop()?;
                    if let Some(next) =
                        (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32)
                    {
                        chars.push(next);
                        break;
                    }
                }
            }
            Some(Datum::string(chars.into_iter().collect::<String>()))
        }
        PrimitiveLiteral::Binary(b) if b.len() > n => {
            let mut bytes = b[..n].to_vec();
            if upper {
                loop {
                    let last = bytes.pop()?;
                    if last < u8::MAX {
                        bytes.push(last + 1);
                        break;
                    }
                }
            }
            Some(Datum::binary(bytes))
        }
        _ => Some(bound.clone()),
    }
}

/// Iceberg's table property for the size a writer rolls to a new file at.
pub(crate) const TARGET_FILE_SIZE_PROPERTY: &str = "write.target-file-size-bytes";
/// [`TARGET_FILE_SIZE_PROPERTY`] when a table does not set it (Iceberg's
/// default, 512 MiB).
pub(crate) const DEFAULT_TARGET_FILE_SIZE: u64 = 512 * 1024 * 1024;

/// The size `target`'s writers roll to a new file at: its
/// `write.target-file-size-bytes`, else Iceberg's default. A value that is
/// not a positive number is refused by name.
pub(crate) fn target_file_size(target: &Table) -> Result<u64> {
    match target
        .metadata()
        .properties()
        .get(TARGET_FILE_SIZE_PROPERTY)
    {
        None => Ok(DEFAULT_TARGET_FILE_SIZE),
        Some(value) => value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "table {} sets {TARGET_FILE_SIZE_PROPERTY} = '{value}', which is not a \
                     positive number of bytes: set it to one (e.g. 536870912) or unset it",
                    target.identifier()
                ))
            }),
    }
}

/// Writes `rows` (columns named as the target's; types are cast) as new
/// Parquet files of `target`, split by its partition spec, streaming, each
/// file rolled at the table's target file size ([`target_file_size`]).
/// Returns the data files, not yet committed.
pub(crate) async fn write_rows(
    target: &Table,
    file_prefix: &str,
    rows: impl futures::Stream<Item = Result<RecordBatch>> + Unpin,
) -> Result<Vec<DataFile>> {
    write_rows_sized(target, file_prefix, rows, target_file_size(target)?).await
}

/// [`write_rows`], rolling to a new file at `file_size` bytes.
pub(crate) async fn write_rows_sized(
    target: &Table,
    file_prefix: &str,
    mut rows: impl futures::Stream<Item = Result<RecordBatch>> + Unpin,
    file_size: u64,
) -> Result<Vec<DataFile>> {
    let metadata = target.metadata();
    let schema = metadata.current_schema();
    let arrow: ArrowSchemaRef = Arc::new(schema_to_arrow_schema(schema)?);
    let name = target.identifier().to_string();
    let files = RollingFileWriterBuilder::new(
        ParquetWriterBuilder::new(writer_properties(target)?, Arc::clone(schema)),
        usize::try_from(file_size).unwrap_or(usize::MAX),
        target.file_io().clone(),
        DefaultLocationGenerator::new(metadata)?,
        DefaultFileNameGenerator::new(file_prefix.to_string(), None, DataFileFormat::Parquet),
    );
    let builder = DataFileWriterBuilder::new(files);
    let spec = metadata.default_partition_spec();
    if spec.is_unpartitioned() {
        // Named by the table's spec, which may have fields that are all
        // `void` (a v1 table's removed ones), each value null.
        let key = iceberg::spec::PartitionKey::new(
            spec.as_ref().clone(),
            Arc::clone(schema),
            spec.fields().iter().map(|_| None).collect(),
        );
        let mut writer = builder.build(Some(key)).await?;
        while let Some(batch) = rows.try_next().await? {
            writer.write(conform(&batch, &arrow, &name)?).await?;
        }
        return with_metrics_modes(target, writer.close().await?);
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
    with_metrics_modes(target, writer.close().await?)
}

/// What [`write_partitions`] does to each batch before writing it (a
/// download copying the files its rows reference, say).
pub(crate) type BatchMap = Arc<
    dyn Fn(RecordBatch) -> futures::future::BoxFuture<'static, Result<RecordBatch>> + Send + Sync,
>;

/// Writes every partition of `input` as new data files of `target`, each
/// partition streaming on its own task ([`write_rows`]); file names start
/// with `file_prefix`. Returns the files, not yet committed. The first
/// error (or dropping the future) stops the other partitions.
pub(crate) async fn write_partitions(
    target: &Table,
    file_prefix: &str,
    input: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
    map: Option<BatchMap>,
) -> Result<Vec<DataFile>> {
    let mut writers = tokio::task::JoinSet::new();
    for partition in 0..input.properties().output_partitioning().partition_count() {
        let rows = input
            .execute(partition, Arc::clone(&task))?
            .map_err(Error::from);
        let rows: futures::stream::BoxStream<'static, Result<RecordBatch>> = match &map {
            Some(map) => {
                let map = Arc::clone(map);
                Box::pin(rows.and_then(move |batch| map(batch)))
            }
            None => Box::pin(rows),
        };
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    use iceberg::{NamespaceIdent, TableCreation};

    use super::*;
    use crate::catalog::IcebergCatalog;
    use crate::config::IcestageConfig;

    /// A table `s.t (id long, name string, at timestamptz)` with
    /// `properties`, in an embedded catalog under `dir`.
    async fn table_with(dir: &std::path::Path, properties: &[(&str, &str)]) -> Table {
        let config = IcestageConfig::embedded(dir).unwrap();
        let catalog = IcebergCatalog::open(&config.catalogs[0]).await.unwrap();
        let namespace = NamespaceIdent::new("s".into());
        catalog.ensure_namespace(&namespace).await.unwrap();
        let schema = Schema::builder()
            .with_fields([
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
                NestedField::optional(3, "at", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            ])
            .build()
            .unwrap();
        let creation = TableCreation::builder()
            .name("t".into())
            .schema(schema)
            .properties(
                properties
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<HashMap<_, _>>(),
            )
            .build();
        catalog
            .catalog()
            .create_table(&namespace, creation)
            .await
            .unwrap()
    }

    async fn write_one(table: &Table) -> Result<DataFile> {
        let schema = Arc::new(schema_to_arrow_schema(table.metadata().current_schema())?);
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["apple", "apricot"])),
                Arc::new(TimestampMicrosecondArray::from(vec![10, 20]).with_timezone("+00:00")),
            ],
        )?;
        let mut files = write_rows(table, "t", futures::stream::iter([Ok(batch)])).await?;
        assert_eq!(files.len(), 1);
        Ok(files.remove(0))
    }

    /// Without metrics properties every column keeps its metrics; with them,
    /// `none` drops a column's counts and bounds, `counts` its bounds, and
    /// `truncate(N)` cuts a string's bounds (the upper one incremented so it
    /// still bounds every value).
    #[tokio::test(flavor = "multi_thread")]
    async fn new_files_keep_the_metrics_their_table_asks_for() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_one(&table_with(dir.path(), &[]).await).await.unwrap();
        assert_eq!(file.lower_bounds().len(), 3);
        assert_eq!(file.value_counts().len(), 3);

        let dir = tempfile::tempdir().unwrap();
        let table = table_with(
            dir.path(),
            &[
                ("write.metadata.metrics.default", "none"),
                ("write.metadata.metrics.column.id", "counts"),
                ("write.metadata.metrics.column.name", "truncate(2)"),
                ("write.metadata.metrics.column.at", "full"),
                ("write.metadata.metrics.column.gone", "full"),
            ],
        )
        .await;
        let file = write_one(&table).await.unwrap();
        let mut counted: Vec<i32> = file.value_counts().keys().copied().collect();
        counted.sort();
        assert_eq!(counted, [1, 2, 3]);
        assert!(!file.lower_bounds().contains_key(&1));
        assert_eq!(file.lower_bounds()[&2], Datum::string("ap"));
        assert_eq!(file.upper_bounds()[&2], Datum::string("aq"));
        assert_eq!(file.lower_bounds()[&3], Datum::timestamptz_micros(10));
        assert_eq!(file.upper_bounds()[&3], Datum::timestamptz_micros(20));
        assert_eq!(file.record_count(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_bad_metrics_mode_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let table = table_with(dir.path(), &[("write.metadata.metrics.default", "some")]).await;
        let error = write_one(&table).await.unwrap_err().to_string();
        assert!(
            error.contains("write.metadata.metrics.default = 'some'")
                && error.contains("truncate(N)"),
            "{error}"
        );
    }

    /// Iceberg's row group properties bound a new file's row groups (a
    /// writer holds one in memory); a value out of range is refused by name.
    #[tokio::test(flavor = "multi_thread")]
    async fn row_groups_are_as_small_as_their_table_asks() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_one(&table_with(dir.path(), &[]).await).await.unwrap();
        assert_eq!(file.split_offsets().map(<[i64]>::len), Some(1));

        let dir = tempfile::tempdir().unwrap();
        let table = table_with(dir.path(), &[("write.parquet.row-group-limit", "1")]).await;
        let file = write_one(&table).await.unwrap();
        assert_eq!(file.split_offsets().map(<[i64]>::len), Some(2));

        for (key, value) in [
            ("write.parquet.row-group-size-bytes", "0"),
            ("write.parquet.row-group-limit", "lots"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let table = table_with(dir.path(), &[(key, value)]).await;
            let error = write_one(&table).await.unwrap_err().to_string();
            assert!(
                error.contains(&format!("{key} = '{value}'")) && error.contains("whole number"),
                "{error}"
            );
        }
    }

    #[test]
    fn an_upper_bound_cut_short_still_bounds_its_values() {
        let upper = |s: &str, n| truncated(&Datum::string(s), n, true);
        assert_eq!(upper("abc", 2), Some(Datum::string("ac")));
        assert_eq!(upper("ab", 2), Some(Datum::string("ab")));
        assert_eq!(
            upper("a\u{10FFFF}\u{10FFFF}", 2),
            Some(Datum::string("b")),
            "the last character has no successor: the one before is incremented"
        );
        assert_eq!(upper("\u{10FFFF}\u{10FFFF}x", 2), None);
        assert_eq!(
            truncated(&Datum::string("abc"), 2, false),
            Some(Datum::string("ab"))
        );
        assert_eq!(
            truncated(&Datum::binary(vec![1, 255, 3]), 2, true),
            Some(Datum::binary(vec![2]))
        );
    }
}
