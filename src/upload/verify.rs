//! Verification from bytes: what promotion proves by reading the staged
//! files, never by believing what the client wrote about them.
//!
//! A client holding an upload's connection writes the data files *and* the
//! metadata that describes them: manifest metrics (null counts, bounds,
//! record counts), file sizes, partition values and Parquet footers are all
//! its claims. Before any of it reaches the target, every staged file is
//! read here:
//!
//! * its own Parquet schema is checked against the target by field id
//!   (every column present, same type);
//! * every row is decoded (a corrupt or truncated file fails with its name);
//! * NULLs in required columns are counted from the decoded values;
//! * every `CHECK` rule is evaluated on every row;
//! * each row's partition is computed and must be the one the file claims;
//! * the metrics the target's manifest will carry (record count, file size,
//!   value and null counts, lower and upper bounds) are computed from what
//!   was read.
//!
//! Files are split into row-group chunks that run on all cores; each chunk
//! streams batch by batch, so memory is bounded by the chunks in flight.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::{self, cast};
use datafusion::arrow::datatypes::{
    Date32Type, Float32Type, Float64Type, Int32Type, Int64Type, SchemaRef as ArrowSchemaRef,
    TimestampMicrosecondType,
};
use datafusion::physical_expr::PhysicalExpr;
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::{
    ArrowFileReader, RecordBatchPartitionSplitter, arrow_schema_to_schema, schema_to_arrow_schema,
};
use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, PrimitiveType, Schema,
    SchemaRef, Struct, Type,
};
use iceberg::table::Table;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};

use super::drift::{Matching, schema_drift};
use super::findings::Finding;
use super::validation::{FINDINGS_PER_RULE, key_text, named, values_json};
use crate::error::{Error, Result};
use crate::limits::pages::{Chunks, PageGuard};

/// Rows per decoded batch.
const BATCH_ROWS: usize = 65_536;
/// Row groups a chunk reads: small enough to spread a file over the cores.
const ROW_GROUPS_PER_CHUNK: usize = 1;
/// String bounds longer than this are left out of the metrics (Iceberg
/// truncates bounds; leaving one out only costs pruning, never correctness).
const MAX_STRING_BOUND: usize = 64;

/// One CHECK rule as verification evaluates it.
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) predicate: String,
    pub(crate) expr: Arc<dyn PhysicalExpr>,
    /// The columns it reads, sorted, for findings.
    pub(crate) columns: Vec<String>,
}

impl Check {
    pub(crate) fn new(name: String, predicate: String, expr: Arc<dyn PhysicalExpr>) -> Self {
        let mut columns: Vec<String> = datafusion::physical_expr::utils::collect_columns(&expr)
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        columns.sort();
        columns.dedup();
        Self {
            name,
            predicate,
            expr,
            columns,
        }
    }
}

/// The CHECK rules (name, predicate) compiled against `target`'s columns.
pub(crate) fn compile_checks(target: &Table, checks: &[(String, String)]) -> Result<Vec<Check>> {
    let arrow = schema_to_arrow_schema(target.metadata().current_schema())?;
    let schema = datafusion::common::DFSchema::try_from(arrow)?;
    let ctx = datafusion::prelude::SessionContext::new();
    checks
        .iter()
        .map(|(name, predicate)| {
            let expr = ctx.parse_sql_expr(predicate, &schema)?;
            Ok(Check::new(
                name.clone(),
                predicate.clone(),
                ctx.create_physical_expr(expr, &schema)?,
            ))
        })
        .collect()
}

/// What to read and prove, shared by every chunk.
pub(crate) struct Plan {
    /// The target's schema; batches are conformed to it.
    pub(crate) target: SchemaRef,
    /// The target's schema in Arrow form, with field ids.
    pub(crate) arrow: ArrowSchemaRef,
    /// For each top-level target column (by position), the field id its
    /// values carry in the staged files.
    pub(crate) staged_ids: Vec<i32>,
    /// The target's partition spec, when it is partitioned.
    pub(crate) splitter: Option<Arc<RecordBatchPartitionSplitter>>,
    /// The target's default partition spec id.
    pub(crate) spec_id: i32,
    /// Its partition type, when it is partitioned.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) partition_type: Option<iceberg::spec::StructType>,
    /// The CHECK rules, compiled against the conformed batch.
    pub(crate) checks: Vec<Check>,
    /// Columns that identify a row in findings (the first UNIQUE key).
    pub(crate) key: Vec<String>,
}

impl Plan {
    /// A plan for files staged for `target`, whose columns carry the
    /// `staging` schema's field ids.
    pub(crate) fn new(
        target: &Table,
        staging: &Schema,
        matching: Matching,
        checks: Vec<Check>,
        key: Vec<String>,
    ) -> Result<Self> {
        let metadata = target.metadata();
        let schema = Arc::clone(metadata.current_schema());
        let arrow = Arc::new(schema_to_arrow_schema(&schema)?);
        let staged_ids =
            schema
                .as_struct()
                .fields()
                .iter()
                .map(|field| match matching {
                    Matching::ById => Ok(field.id),
                    Matching::ByName => staging
                        .field_by_name(&field.name)
                        .map(|f| f.id)
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "the staging table has no column '{}' of the target",
                                field.name
                            ))
                        }),
                })
                .collect::<Result<Vec<_>>>()?;
        let spec = metadata.default_partition_spec();
        let splitter = if spec.is_unpartitioned() {
            None
        } else {
            Some(Arc::new(
                RecordBatchPartitionSplitter::try_new_with_computed_values(
                    Arc::clone(&schema),
                    Arc::clone(spec),
                )?,
            ))
        };
        let partition_type = if spec.is_unpartitioned() {
            None
        } else {
            Some(spec.partition_type(&schema)?)
        };
        Ok(Self {
            target: schema,
            arrow,
            staged_ids,
            splitter,
            spec_id: metadata.default_partition_spec_id(),
            partition_type,
            checks,
            key,
        })
    }
}

/// Metrics of one column, accumulated over the rows read.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct ColumnMetrics {
    values: u64,
    nulls: u64,
    lower: Option<Datum>,
    upper: Option<Datum>,
    /// False once some batch had values whose bounds could not be taken.
    bounded: bool,
}

impl ColumnMetrics {
    fn new() -> Self {
        Self {
            bounded: true,
            ..Default::default()
        }
    }

    fn add(&mut self, array: &ArrayRef, kind: &Type) {
        let nulls = array.logical_null_count();
        self.values += array.len() as u64;
        self.nulls += nulls as u64;
        if nulls == array.len() {
            return;
        }
        match (bounds(array, kind), self.bounded) {
            (Some((low, high)), true) => {
                if self.lower.as_ref().is_none_or(|l| low < *l) {
                    self.lower = Some(low);
                }
                if self.upper.as_ref().is_none_or(|u| high > *u) {
                    self.upper = Some(high);
                }
            }
            _ => {
                self.bounded = false;
                self.lower = None;
                self.upper = None;
            }
        }
    }

    fn merge(&mut self, other: ColumnMetrics) {
        self.values += other.values;
        self.nulls += other.nulls;
        self.bounded &= other.bounded;
        if !self.bounded {
            self.lower = None;
            self.upper = None;
            return;
        }
        if let Some(low) = other.lower
            && self.lower.as_ref().is_none_or(|l| low < *l)
        {
            self.lower = Some(low);
        }
        if let Some(high) = other.upper
            && self.upper.as_ref().is_none_or(|u| high > *u)
        {
            self.upper = Some(high);
        }
    }
}

/// The least and greatest value of `array` (which has the Arrow type of
/// `kind`), as Iceberg bounds; `None` where they cannot be taken exactly.
fn bounds(array: &ArrayRef, kind: &Type) -> Option<(Datum, Datum)> {
    let Type::Primitive(primitive) = kind else {
        return None;
    };
    if let Some(dictionary) = array.as_any_dictionary_opt() {
        // Every value is one of the dictionary's; bounds over the dictionary
        // hold them all.
        return bounds(dictionary.values(), kind);
    }
    match primitive {
        PrimitiveType::Boolean => {
            let a = array.as_boolean_opt()?;
            Some((
                Datum::bool(compute::min_boolean(a)?),
                Datum::bool(compute::max_boolean(a)?),
            ))
        }
        PrimitiveType::Int => {
            let a = array.as_primitive_opt::<Int32Type>()?;
            Some((Datum::int(compute::min(a)?), Datum::int(compute::max(a)?)))
        }
        PrimitiveType::Long => {
            let a = array.as_primitive_opt::<Int64Type>()?;
            Some((Datum::long(compute::min(a)?), Datum::long(compute::max(a)?)))
        }
        PrimitiveType::Float => {
            let a = array.as_primitive_opt::<Float32Type>()?;
            let (low, high) = (compute::min(a)?, compute::max(a)?);
            (!low.is_nan() && !high.is_nan()).then(|| (Datum::float(low), Datum::float(high)))
        }
        PrimitiveType::Double => {
            let a = array.as_primitive_opt::<Float64Type>()?;
            let (low, high) = (compute::min(a)?, compute::max(a)?);
            (!low.is_nan() && !high.is_nan()).then(|| (Datum::double(low), Datum::double(high)))
        }
        PrimitiveType::Date => {
            let a = array.as_primitive_opt::<Date32Type>()?;
            Some((Datum::date(compute::min(a)?), Datum::date(compute::max(a)?)))
        }
        PrimitiveType::Timestamp | PrimitiveType::Timestamptz => {
            let a = array.as_primitive_opt::<TimestampMicrosecondType>()?;
            let (low, high) = (compute::min(a)?, compute::max(a)?);
            Some(if *primitive == PrimitiveType::Timestamp {
                (Datum::timestamp_micros(low), Datum::timestamp_micros(high))
            } else {
                (
                    Datum::timestamptz_micros(low),
                    Datum::timestamptz_micros(high),
                )
            })
        }
        PrimitiveType::String => {
            if let Some(views) = array.as_string_view_opt() {
                let (low, high) = (
                    compute::min_string_view(views)?,
                    compute::max_string_view(views)?,
                );
                return (low.len() <= MAX_STRING_BOUND && high.len() <= MAX_STRING_BOUND)
                    .then(|| (Datum::string(low), Datum::string(high)));
            }
            let (low, high) = match array.as_string_opt::<i32>() {
                Some(a) => string_bounds(a)?,
                None => string_bounds(array.as_string_opt::<i64>()?)?,
            };
            (low.len() <= MAX_STRING_BOUND && high.len() <= MAX_STRING_BOUND)
                .then(|| (Datum::string(low), Datum::string(high)))
        }
        _ => None,
    }
}

/// The first eight bytes of `value`, zero-padded, as a number that orders
/// as the bytes do.
fn prefix(value: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = value.len().min(8);
    bytes[..n].copy_from_slice(&value[..n]);
    u64::from_be_bytes(bytes)
}

/// The least and greatest non-null value of `array`, byte-wise (as Iceberg
/// orders strings). Most values are decided by their first eight bytes, so
/// few comparisons reach the whole strings.
fn string_bounds<O: datafusion::arrow::array::OffsetSizeTrait>(
    array: &datafusion::arrow::array::GenericStringArray<O>,
) -> Option<(&str, &str)> {
    let offsets = array.value_offsets();
    let values = array.value_data();
    let nulls = array.nulls();
    // (least, greatest), each with its prefix.
    type Bound<'a> = (&'a [u8], u64);
    let mut bounds: Option<(Bound<'_>, Bound<'_>)> = None;
    for row in 0..array.len() {
        if nulls.is_some_and(|n| n.is_null(row)) {
            continue;
        }
        let value = &values[offsets[row].as_usize()..offsets[row + 1].as_usize()];
        let key = prefix(value);
        match &mut bounds {
            None => bounds = Some(((value, key), (value, key))),
            Some((low, high)) => {
                if key < low.1 || (key == low.1 && value < low.0) {
                    *low = (value, key);
                }
                if key > high.1 || (key == high.1 && value > high.0) {
                    *high = (value, key);
                }
            }
        }
    }
    let ((low, _), (high, _)) = bounds?;
    // Slices of a valid string array at its own offsets are valid UTF-8.
    Some((
        std::str::from_utf8(low).ok()?,
        std::str::from_utf8(high).ok()?,
    ))
}

/// What reading one chunk (or a whole file, merged) proved.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Read {
    rows: u64,
    /// Per target field id.
    columns: HashMap<i32, ColumnMetrics>,
    /// The partition of the rows, when the spec is partitioned (travels
    /// apart, as JSON of the partition type: see [`Read::partition_json`]).
    #[serde(skip)]
    partition: Option<Struct>,
    /// Violations per CHECK rule, all counted.
    violations: HashMap<String, u64>,
    findings: Vec<Finding>,
    /// Problems that stop the promotion (drift, mixed partitions).
    reasons: Vec<String>,
    /// NULLs found in required nested fields (a struct column, a field of
    /// a struct, a list element, a map key or value), by the field's dotted
    /// path: counted from the decoded values at every depth.
    nested_nulls: std::collections::BTreeMap<String, u64>,
}

impl Read {
    /// The partition as Iceberg's JSON of `plan`'s partition type.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(super) fn partition_json(&self, plan: &Plan) -> Result<Option<serde_json::Value>> {
        match (&self.partition, &plan.partition_type) {
            (Some(partition), Some(kind)) => Ok(Some(
                iceberg::spec::Literal::Struct(partition.clone())
                    .try_into_json(&Type::Struct(kind.clone()))?,
            )),
            _ => Ok(None),
        }
    }

    /// Sets the partition from [`Read::partition_json`]'s form.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(super) fn set_partition_json(
        &mut self,
        json: Option<serde_json::Value>,
        plan: &Plan,
    ) -> Result<()> {
        if let (Some(json), Some(kind)) = (json, &plan.partition_type) {
            match iceberg::spec::Literal::try_from_json(json, &Type::Struct(kind.clone()))? {
                Some(iceberg::spec::Literal::Struct(partition)) => self.partition = Some(partition),
                _ => {
                    return Err(Error::invalid(
                        "a verification task answered a partition that is not a struct",
                    ));
                }
            }
        }
        Ok(())
    }

    fn merge(&mut self, other: Read, file: &str) {
        self.rows += other.rows;
        for (id, metrics) in other.columns {
            match self.columns.get_mut(&id) {
                Some(mine) => mine.merge(metrics),
                None => {
                    self.columns.insert(id, metrics);
                }
            }
        }
        match (&self.partition, other.partition) {
            (_, None) => {}
            (None, Some(p)) => self.partition = Some(p),
            (Some(mine), Some(p)) if *mine == p => {}
            (Some(_), Some(_)) => self.reasons.push(mixed_partitions(file)),
        }
        for (rule, count) in other.violations {
            *self.violations.entry(rule).or_default() += count;
        }
        for (field, count) in other.nested_nulls {
            *self.nested_nulls.entry(field).or_default() += count;
        }
        self.findings.extend(other.findings);
        self.reasons.extend(other.reasons);
    }
}

fn mixed_partitions(file: &str) -> String {
    format!(
        "staged file {file} holds rows of more than one partition: each data file must hold \
         one partition of the target's spec; write the rows again with a partitioned writer"
    )
}

/// What verification of all staged files proved.
#[derive(Debug, Default)]
pub(crate) struct Verified {
    /// The files as the target will register them: paths as given, metrics
    /// from the bytes.
    pub(crate) files: Vec<DataFile>,
    /// Rows read.
    pub(crate) rows: i64,
    /// Violations per CHECK rule.
    pub(crate) violations: HashMap<String, u64>,
    /// Row-level findings, at most [`FINDINGS_PER_RULE`] per rule.
    pub(crate) findings: Vec<Finding>,
    /// Problems of the files as a whole.
    pub(crate) reasons: Vec<String>,
    /// NULLs in required nested fields, by dotted path (see [`Read`]).
    pub(crate) nested_nulls: std::collections::BTreeMap<String, u64>,
}

/// A file's name without its folders, for findings.
fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Reads the footer of `path`: its actual size and the Arrow view of it.
///
/// The footer's length (the file's last 8 bytes say it) is checked against
/// [`crate::limits::ReadLimits::footer_bytes`] before the footer is read: a
/// client's file cannot make verification read or decode more than that.
pub(super) async fn open(io: &FileIO, path: &str) -> Result<(u64, ArrowReaderMetadata)> {
    use iceberg::io::FileRead;
    let input = io.new_input(path)?;
    let meta = input.metadata().await?;
    let size = meta.size;
    let file = input.reader().await?;
    if size < 8 {
        return Err(unreadable(path, "it is shorter than a Parquet footer"));
    }
    let tail = file.read(size - 8..size).await?;
    if &tail[4..] != b"PAR1" {
        return Err(unreadable(path, "it does not end in Parquet's magic bytes"));
    }
    let length = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let bound = crate::limits::current().footer_bytes;
    if length > bound {
        return Err(unreadable(
            path,
            format!(
                "its footer holds {length} bytes, more than the {} a staged file's footer may \
                 hold (limits.footer_bytes)",
                crate::limits::human(bound)
            ),
        ));
    }
    if length + 8 > size {
        return Err(unreadable(
            path,
            format!("its footer claims {length} bytes, more than the file holds"),
        ));
    }
    let footer = file.read(size - 8 - length..size - 8).await?;
    let metadata = decode_footer(&footer, path)?;
    // Decode strings and binaries with 32-bit offsets, as the target's Arrow
    // schema has them (writers such as PyIceberg store 64-bit ones), so the
    // batches need no copy to conform.
    let hint = decode_hint(&metadata);
    if hint == *metadata.schema() {
        return Ok((size, metadata));
    }
    // Nothing is shared across the unwind: the metadata is only read.
    let narrowed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ArrowReaderMetadata::try_new(
            Arc::clone(metadata.metadata()),
            ArrowReaderOptions::new().with_schema(hint),
        )
    }))
    .map_err(|_| unreadable(path, "its footer is malformed"))?
    .map_err(|e| unreadable(path, e))?;
    Ok((size, narrowed))
}

/// A Parquet footer's Thrift `bytes` (of the file at `path`) decoded into
/// the Arrow view verification reads with. The `parquet` crate panics on
/// some malformed footers (an unknown physical type, an integer of an
/// impossible width: found by the fuzz harness); such a panic is an error
/// naming the file here, never a dead verification task.
pub(crate) fn decode_footer(bytes: &[u8], path: &str) -> Result<ArrowReaderMetadata> {
    let decoded = std::panic::catch_unwind(|| {
        let metadata = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(bytes)?;
        ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
    });
    match decoded {
        Ok(Ok(metadata)) => Ok(metadata),
        Ok(Err(e)) => Err(unreadable(path, e)),
        Err(_) => Err(unreadable(path, "its footer is malformed")),
    }
}

/// How to decode the file: top-level strings and binaries with 32-bit
/// offsets, as the target's Arrow schema has them (writers such as PyIceberg
/// store 64-bit ones), and those the file dictionary-encodes as dictionaries,
/// so that decoding copies no string and bounds are taken over the
/// dictionary (bounds that hold every value; a dictionary entry no row uses
/// only widens them).
fn decode_hint(footer: &ArrowReaderMetadata) -> ArrowSchemaRef {
    use datafusion::arrow::datatypes::DataType;
    let schema = footer.schema();
    let parquet = footer.metadata();
    let dictionary_encoded = |name: &str| {
        let descriptor = parquet.file_metadata().schema_descr();
        let Some(leaf) = (0..descriptor.num_columns()).find(|i| {
            let path = descriptor.column(*i).path().parts().to_vec();
            path.len() == 1 && path[0] == name
        }) else {
            return false;
        };
        // Every data page dictionary-encoded (a chunk that fell back to
        // plain pages would have to be hashed into a dictionary).
        !parquet.row_groups().is_empty()
            && parquet.row_groups().iter().all(|g| {
                let chunk = g.column(leaf);
                chunk.dictionary_page_offset().is_some()
                    && chunk.page_encoding_stats_mask().is_some_and(|mask| {
                        mask.is_only(parquet::basic::Encoding::PLAIN_DICTIONARY)
                            || mask.is_only(parquet::basic::Encoding::RLE_DICTIONARY)
                    })
            })
    };
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| {
            let plain = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
                DataType::Binary | DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
                _ => return Arc::clone(f),
            };
            let kind = if dictionary_encoded(f.name()) {
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(plain))
            } else if plain == DataType::Utf8 {
                // Views point into the decoded pages instead of copying
                // every string.
                DataType::Utf8View
            } else {
                plain
            };
            Arc::new(f.as_ref().clone().with_data_type(kind))
        })
        .collect();
    Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

fn unreadable(path: &str, error: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "staged file {path} is not a readable Parquet file ({error}): the upload cannot be \
         promoted; write the rows again in a new upload"
    ))
}

/// The columns of the file's own schema that differ from the target's:
/// compared by field id, types only (NULLs are counted from the values).
fn footer_drift(path: &str, footer: &ArrowReaderMetadata, plan: &Plan) -> Vec<String> {
    let schema = match arrow_schema_to_schema(footer.schema()) {
        Ok(schema) => schema,
        Err(e) => {
            return vec![format!(
                "staged file {path} has no Iceberg field ids in its Parquet schema ({}): write it \
                 with an Iceberg client",
                e.message()
            )];
        }
    };
    // Compare as the staging table's own schema would (required-ness
    // aside): the target's columns under the staged ids.
    let relabeled = match relabel(&plan.target, &plan.staged_ids, &schema) {
        Ok(schema) => schema,
        Err(e) => return vec![format!("staged file {path}: {e}")],
    };
    schema_drift(&relabeled, &plan.target, Matching::ById)
        .into_iter()
        .filter(|line| !line.contains(" is required in the target but optional"))
        .map(|line| format!("staged file {path}: {line}"))
        .collect()
}

/// The file's `schema` with its top-level columns renumbered from the
/// staged ids to the target's, so it compares with the target by id.
fn relabel(target: &Schema, staged_ids: &[i32], schema: &Schema) -> Result<Schema> {
    let mut fields = vec![];
    for field in schema.as_struct().fields() {
        let id = target
            .as_struct()
            .fields()
            .iter()
            .zip(staged_ids)
            .find(|(_, staged)| **staged == field.id)
            .map(|(t, _)| t.id)
            .unwrap_or(field.id);
        let mut copy = field.as_ref().clone();
        copy.id = id;
        fields.push(Arc::new(copy));
    }
    Ok(Schema::builder().with_fields(fields).build()?)
}

/// The columns of `batch` (as the file holds it) for each of the target's
/// columns, found by field id, as decoded.
fn target_columns(batch: &RecordBatch, plan: &Plan, path: &str) -> Result<Vec<ArrayRef>> {
    let ids: Vec<Option<i32>> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| {
            f.metadata()
                .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
                .and_then(|v| v.parse().ok())
        })
        .collect();
    plan.arrow
        .fields()
        .iter()
        .zip(&plan.staged_ids)
        .map(|(field, staged)| {
            let index = ids
                .iter()
                .position(|id| *id == Some(*staged))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "staged file {path} has no column with field id {staged} ('{}')",
                        field.name()
                    ))
                })?;
            Ok(Arc::clone(batch.column(index)))
        })
        .collect()
}

/// `columns` as a batch of the target's schema: named and typed as the
/// target's, every column nullable (NULLs are counted, not refused here).
fn conform(columns: &[ArrayRef], plan: &Plan) -> Result<RecordBatch> {
    let columns = plan
        .arrow
        .fields()
        .iter()
        .zip(columns)
        .map(|(field, column)| {
            if column.data_type() == field.data_type() {
                Ok(Arc::clone(column))
            } else {
                Ok(cast(column, field.data_type())?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let relaxed = Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
        plan.arrow
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
        plan.arrow.metadata().clone(),
    ));
    Ok(RecordBatch::try_new(relaxed, columns)?)
}

/// Reads row groups `groups` of `path` (first row at `first_row`).
pub(super) async fn read_chunk(
    io: FileIO,
    path: String,
    footer: ArrowReaderMetadata,
    groups: Vec<usize>,
    first_row: i64,
    plan: Arc<Plan>,
) -> Result<Read> {
    let input = io.new_input(&path)?;
    let meta = input.metadata().await?;
    // Only the chunks of the groups read: a footer of many row groups
    // costs each read its own groups, not all of them.
    let row_groups = footer.metadata().row_groups();
    let chunks = Chunks::of(
        groups.iter().filter_map(|g| row_groups.get(*g)),
        Some(meta.size),
    )
    .map_err(|e| unreadable(&path, e))?;
    let reader = PageGuard::new(
        ArrowFileReader::new(meta, input.reader().await?),
        &path,
        chunks,
    );
    let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer)
        .with_row_groups(groups)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| unreadable(&path, e))?;
    let mut read = Read::default();
    let fields = plan.target.as_struct().fields();
    for field in fields {
        read.columns.insert(field.id, ColumnMetrics::new());
    }
    let mut position = first_row;
    while let Some(batch) = stream.try_next().await.map_err(|e| unreadable(&path, e))? {
        let rows = batch.num_rows();
        let columns = target_columns(&batch, &plan, &path)?;
        for (column, field) in columns.iter().zip(fields) {
            if let Some(metrics) = read.columns.get_mut(&field.id) {
                metrics.add(column, &field.field_type);
            }
            if !field.field_type.is_primitive() {
                // A required nested column's own NULLs, then every depth.
                let valid = valid_rows(column.as_ref(), None);
                if field.required {
                    count_nulls(&valid, &field.name, &mut read.nested_nulls);
                }
                required_below(
                    column.as_ref(),
                    &field.field_type,
                    &field.name,
                    &valid,
                    &mut read.nested_nulls,
                );
            }
        }
        position += rows as i64;
        read.rows += rows as u64;
        if plan.splitter.is_none() && plan.checks.is_empty() {
            continue;
        }
        let batch = conform(&columns, &plan)?;
        if let Some(splitter) = &plan.splitter {
            for (key, _) in splitter.split(&batch)? {
                match &read.partition {
                    None => read.partition = Some(key.data().clone()),
                    Some(seen) if seen == key.data() => {}
                    Some(_) => {
                        read.reasons.push(mixed_partitions(&path));
                        return Ok(read);
                    }
                }
            }
        }
        evaluate(&batch, &plan, &path, position - rows as i64, &mut read)?;
    }
    Ok(read)
}

/// Evaluates every CHECK rule on `batch`, counting each violation and
/// keeping findings up to the limit.
fn evaluate(
    batch: &RecordBatch,
    plan: &Plan,
    path: &str,
    first: i64,
    read: &mut Read,
) -> Result<()> {
    if plan.checks.is_empty() {
        return Ok(());
    }
    let key_columns = named(batch, &plan.key)?;
    for Check {
        name,
        predicate,
        expr,
        columns,
    } in &plan.checks
    {
        let result = expr.evaluate(batch)?.into_array(batch.num_rows())?;
        let result = result.as_boolean();
        let values = named(batch, columns)?;
        let count = read.violations.entry(name.clone()).or_default();
        for row in 0..batch.num_rows() {
            if !result.is_valid(row) || result.value(row) {
                continue;
            }
            *count += 1;
            if *count as usize > FINDINGS_PER_RULE {
                continue;
            }
            let at = first + row as i64;
            read.findings.push(Finding {
                rule: name.clone(),
                kind: "check".to_string(),
                row: if key_columns.is_empty() {
                    format!("{}#{at}", short(path))
                } else {
                    key_text(&key_columns, row)?
                },
                file: Some(path.to_string()),
                position: Some(at),
                values: values_json(&values, row)?,
                message: format!("violates CHECK ({predicate})"),
            });
        }
    }
    Ok(())
}

/// Reads every file of `files` (paths under `io`), proving what the module
/// documentation lists. `claimed` gives, per file, the partition the
/// client's manifest says it holds.
pub(super) async fn verify(
    io: &FileIO,
    files: &[DataFile],
    plan: Arc<Plan>,
    reader: &dyn ReadChunks,
) -> Result<Verified> {
    let parallelism = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Footers first (small reads), then the row-group chunks on all cores.
    let paths: Vec<(FileIO, String)> = files
        .iter()
        .map(|f| (io.clone(), f.file_path().to_string()))
        .collect();
    let footers: Vec<(u64, ArrowReaderMetadata)> = futures::stream::iter(paths)
        .map(|(io, path)| async move { open(&io, &path).await })
        .buffered(parallelism * 2)
        .try_collect()
        .await?;
    let mut verified = Verified::default();
    let mut chunks = vec![];
    for (index, (file, (size, footer))) in files.iter().zip(&footers).enumerate() {
        // Every later reader (rules, scans, the rewrite) reads the file at
        // the size its manifest claims: it must be the size read here.
        if file.file_size_in_bytes() != *size {
            verified.reasons.push(format!(
                "staged file {} claims {} bytes but holds {size}: the manifest does not describe \
                 the file; write the rows again",
                file.file_path(),
                file.file_size_in_bytes()
            ));
            continue;
        }
        let drift = footer_drift(file.file_path(), footer, &plan);
        if !drift.is_empty() {
            verified.reasons.extend(drift);
            continue;
        }
        let groups = footer.metadata().row_groups();
        let mut first_row = 0i64;
        let mut group = 0;
        while group < groups.len() {
            let end = (group + ROW_GROUPS_PER_CHUNK).min(groups.len());
            chunks.push((index, (group..end).collect::<Vec<_>>(), first_row));
            first_row += groups[group..end].iter().map(|g| g.num_rows()).sum::<i64>();
            group = end;
        }
    }
    if !verified.reasons.is_empty() {
        return Ok(verified);
    }
    let reads = reader.read(io, files, &footers, chunks, &plan).await?;
    let mut per_file: Vec<Read> = files.iter().map(|_| Read::default()).collect();
    for (index, read) in reads {
        per_file[index].merge(read, files[index].file_path());
    }
    for ((file, mut read), (size, _)) in files.iter().zip(per_file).zip(&footers) {
        verified.rows += read.rows as i64;
        for (rule, count) in std::mem::take(&mut read.violations) {
            *verified.violations.entry(rule).or_default() += count;
        }
        verified.findings.append(&mut read.findings);
        verified.reasons.extend(read.reasons.iter().cloned());
        for (field, count) in std::mem::take(&mut read.nested_nulls) {
            *verified.nested_nulls.entry(field).or_default() += count;
        }
        if read.rows == 0 {
            // Nothing to register: an empty file adds no rows.
            continue;
        }
        if plan.splitter.is_some() && read.partition.as_ref() != Some(file.partition()) {
            verified.reasons.push(format!(
                "staged file {} claims partition {:?} but its rows belong to {:?}: the manifest \
                 does not describe the file; write the rows again",
                file.file_path(),
                file.partition(),
                read.partition
            ));
            continue;
        }
        verified
            .files
            .push(data_file(file.file_path(), *size, &read, &plan)?);
    }
    // Findings in file and row order, at most the limit per rule.
    verified
        .findings
        .sort_by(|a, b| (&a.file, a.position).cmp(&(&b.file, b.position)));
    let mut kept: HashMap<String, usize> = HashMap::new();
    verified.findings.retain(|f| {
        let n = kept.entry(f.rule.clone()).or_default();
        *n += 1;
        *n <= FINDINGS_PER_RULE
    });
    Ok(verified)
}

/// Where verification reads the staged files' chunks: [`Here`], or on a
/// cluster (`distribute`), as the orchestrator chooses.
#[async_trait::async_trait]
pub(super) trait ReadChunks: Send + Sync {
    /// What reading each of `chunks` of `files` (with their `footers`)
    /// proved, by file index.
    async fn read(
        &self,
        io: &FileIO,
        files: &[DataFile],
        footers: &[(u64, ArrowReaderMetadata)],
        chunks: Vec<Chunk>,
        plan: &Arc<Plan>,
    ) -> Result<Vec<(usize, Read)>>;
}

/// On this process's cores.
pub(super) struct Here;

#[async_trait::async_trait]
impl ReadChunks for Here {
    async fn read(
        &self,
        io: &FileIO,
        files: &[DataFile],
        footers: &[(u64, ArrowReaderMetadata)],
        chunks: Vec<Chunk>,
        plan: &Arc<Plan>,
    ) -> Result<Vec<(usize, Read)>> {
        let parallelism = std::thread::available_parallelism().map_or(2, |n| n.get());
        futures::stream::iter(chunks)
            .map(|(index, groups, first_row)| {
                let (io, plan) = (io.clone(), Arc::clone(plan));
                let path = files[index].file_path().to_string();
                let footer = footers[index].1.clone();
                async move {
                    tokio::spawn(read_chunk(io, path, footer, groups, first_row, plan))
                        .await
                        .map_err(|e| Error::internal(format!("a verification task: {e}")))?
                        .map(|read| (index, read))
                }
            })
            // Twice the cores: a chunk waiting on a read leaves its core to another.
            .buffer_unordered(parallelism * 2)
            .try_collect()
            .await
    }
}

/// A chunk: the file's index, its row groups, the position of its first row.
pub(super) type Chunk = (usize, Vec<usize>, i64);

/// The data file the target registers for `path`: metrics from `read`.
fn data_file(path: &str, size: u64, read: &Read, plan: &Plan) -> Result<DataFile> {
    let mut values = HashMap::new();
    let mut nulls = HashMap::new();
    let mut lower = HashMap::new();
    let mut upper = HashMap::new();
    for (id, metrics) in &read.columns {
        // Metrics are kept for primitive columns, as Iceberg writers keep them.
        let primitive = plan
            .target
            .field_by_id(*id)
            .is_some_and(|f| f.field_type.is_primitive());
        if !primitive {
            continue;
        }
        values.insert(*id, metrics.values);
        nulls.insert(*id, metrics.nulls);
        if let (Some(low), Some(high)) = (&metrics.lower, &metrics.upper) {
            lower.insert(*id, low.clone());
            upper.insert(*id, high.clone());
        }
    }
    DataFileBuilder::default()
        .content(DataContentType::Data)
        .file_path(path.to_string())
        .file_format(DataFileFormat::Parquet)
        .partition(read.partition.clone().unwrap_or_else(Struct::empty))
        .partition_spec_id(plan.spec_id)
        .record_count(read.rows)
        .file_size_in_bytes(size)
        .value_counts(values)
        .null_value_counts(nulls)
        .lower_bounds(lower)
        .upper_bounds(upper)
        .build()
        .map_err(|e| Error::internal(format!("verified data file {path}: {e}")))
}

/// Required fields of the target that staged rows leave NULL: top-level
/// columns (from the verified null counts) and nested fields at every depth
/// (counted while decoding, whatever the file's own schema claims).
pub(crate) fn required_nulls(plan: &Plan, verified: &Verified) -> Vec<String> {
    let mut totals: HashMap<i32, u64> = HashMap::new();
    for file in &verified.files {
        for (id, n) in file.null_value_counts() {
            *totals.entry(*id).or_default() += n;
        }
    }
    plan.target
        .as_struct()
        .fields()
        .iter()
        .filter(|f| f.required)
        .filter_map(|f| {
            totals.get(&f.id).filter(|n| **n > 0).map(|n| {
                format!(
                    "column '{}' is required but {n} staged row(s) hold NULL in it",
                    f.name
                )
            })
        })
        .chain(verified.nested_nulls.iter().map(|(field, n)| {
            format!("field '{field}' is required but {n} staged value(s) hold NULL in it")
        }))
        .collect()
}

/// Which of `array`'s rows hold a value: its own validity, and only where
/// `parent` (the rows that exist at this depth) says so.
fn valid_rows(array: &dyn Array, parent: Option<&[bool]>) -> Vec<bool> {
    let nulls = array.logical_nulls();
    (0..array.len())
        .map(|row| parent.is_none_or(|p| p[row]) && nulls.as_ref().is_none_or(|n| n.is_valid(row)))
        .collect()
}

/// Counts, into `out` under `field`, the rows `valid` says hold NULL.
fn count_nulls(valid: &[bool], field: &str, out: &mut std::collections::BTreeMap<String, u64>) {
    let nulls = valid.iter().filter(|v| !**v).count();
    if nulls > 0 {
        *out.entry(field.to_string()).or_default() += nulls as u64;
    }
}

/// Counts, into `out`, the NULLs of required fields below `array` (of
/// Iceberg type `kind`, named `path`), among the rows `exists` holds: a
/// NULL under a NULL parent is no value at all and not counted.
fn required_below(
    array: &dyn Array,
    kind: &Type,
    path: &str,
    exists: &[bool],
    out: &mut std::collections::BTreeMap<String, u64>,
) {
    let mut child =
        |array: &dyn Array, field: &iceberg::spec::NestedField, name: &str, exists: &[bool]| {
            let here = format!("{path}.{name}");
            let valid = valid_rows(array, Some(exists));
            if field.required {
                let missing: Vec<bool> =
                    exists.iter().zip(&valid).map(|(e, v)| !*e || *v).collect();
                count_nulls(&missing, &here, out);
            }
            if !field.field_type.is_primitive() {
                required_below(array, &field.field_type, &here, &valid, out);
            }
        };
    match kind {
        Type::Struct(fields) => {
            let Some(array) = array.as_struct_opt() else {
                return;
            };
            for (index, field) in fields.fields().iter().enumerate() {
                let column = array
                    .fields()
                    .iter()
                    .position(|f| {
                        f.metadata()
                            .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
                            .is_some_and(|id| *id == field.id.to_string())
                    })
                    .or_else(|| array.fields().iter().position(|f| f.name() == &field.name))
                    .unwrap_or(index);
                if let Some(values) = array.columns().get(column) {
                    child(values.as_ref(), field, &field.name, exists);
                }
            }
        }
        Type::List(list) => {
            let (values, ranges): (&ArrayRef, Vec<(usize, usize)>) =
                if let Some(a) = array.as_list_opt::<i32>() {
                    (a.values(), offsets(a.value_offsets()))
                } else if let Some(a) = array.as_list_opt::<i64>() {
                    (a.values(), offsets(a.value_offsets()))
                } else {
                    return;
                };
            let inner = spread(exists, &ranges, values.len());
            child(values.as_ref(), &list.element_field, "element", &inner);
        }
        Type::Map(map) => {
            let Some(array) = array.as_map_opt() else {
                return;
            };
            let inner = spread(
                exists,
                &offsets(array.value_offsets()),
                array.entries().len(),
            );
            child(array.keys().as_ref(), &map.key_field, "key", &inner);
            child(array.values().as_ref(), &map.value_field, "value", &inner);
        }
        Type::Primitive(_) => {}
    }
}

/// `(start, end)` of each row's values from Arrow offsets.
fn offsets<O: Copy + TryInto<usize>>(offsets: &[O]) -> Vec<(usize, usize)> {
    offsets
        .windows(2)
        .map(|w| (w[0].try_into().unwrap_or(0), w[1].try_into().unwrap_or(0)))
        .collect()
}

/// Which of `len` child values exist: those inside the range of a row that
/// exists.
fn spread(exists: &[bool], ranges: &[(usize, usize)], len: usize) -> Vec<bool> {
    let mut inner = vec![false; len];
    for ((start, end), row) in ranges.iter().zip(exists) {
        if *row {
            for slot in inner.iter_mut().take(*end).skip(*start) {
                *slot = true;
            }
        }
    }
    inner
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{DictionaryArray, Int32Array, LargeStringArray, StringArray};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    #[test]
    fn string_bounds_order_bytes_and_skip_nulls() {
        let array = StringArray::from(vec![
            Some("txn_5"),
            None,
            Some("txn_10"),
            Some("txn_1000000000"),
            Some("a"),
            Some("txn_9"),
            Some(""),
        ]);
        assert_eq!(string_bounds(&array), Some(("", "txn_9")));
        let large = LargeStringArray::from(vec![Some("b"), Some("abcdefghij"), Some("abcdefghi")]);
        assert_eq!(string_bounds(&large), Some(("abcdefghi", "b")));
        let empty = StringArray::from(vec![None::<&str>]);
        assert_eq!(string_bounds(&empty), None);
    }

    #[test]
    fn metrics_of_a_dictionary_column_hold_every_value() {
        let keys = Int32Array::from(vec![Some(1), None, Some(1), Some(2)]);
        let values = StringArray::from(vec!["unused-a", "usd", "zar"]);
        let array: ArrayRef =
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap());
        let mut metrics = ColumnMetrics::new();
        metrics.add(&array, &Type::Primitive(PrimitiveType::String));
        assert_eq!((metrics.values, metrics.nulls), (4, 1));
        // Bounds over the dictionary: looser than the rows' (an unused entry
        // widens them), never narrower.
        assert_eq!(metrics.lower, Some(Datum::string("unused-a")));
        assert_eq!(metrics.upper, Some(Datum::string("zar")));
    }
}
