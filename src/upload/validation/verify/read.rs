//! Reading one chunk of row groups: every row decoded, NULLs counted at
//! every depth, each row's partition computed, every CHECK evaluated.

use datafusion::arrow::array::{Array, AsArray};
use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::cast;
use futures::TryStreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileIO;
use iceberg::spec::{Struct, Type};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{
    ParquetRecordBatchStreamBuilder, ProjectionMask, parquet_to_arrow_field_levels,
};

use super::footer::unreadable;
use super::local::LocalFile;
use super::metrics::ColumnMetrics;
use super::nested::{count_nulls, required_below, valid_rows};
use super::pages;
use super::plan::{Check, Plan};
use crate::error::{Error, Result};
use crate::limits::pages::{Chunks, PageGuard, range};
use crate::memory::{Churn, Churning};
use crate::upload::validation::findings::Finding;
use crate::upload::validation::{FINDINGS_PER_RULE, key_text, named, values_json};

/// Rows per decoded batch.
const BATCH_ROWS: usize = 8_192;

/// What reading one chunk (or a whole file, merged) proved.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Read {
    pub(super) rows: u64,
    /// Per target field id.
    pub(super) columns: HashMap<i32, ColumnMetrics>,
    /// The partition of the rows, when the spec is partitioned (travels
    /// apart, as JSON of the partition type: see [`Read::partition_json`]).
    #[serde(skip)]
    pub(super) partition: Option<Struct>,
    /// Violations per CHECK rule, all counted.
    pub(super) violations: HashMap<String, u64>,
    pub(super) findings: Vec<Finding>,
    /// Problems that stop the promotion (drift, mixed partitions).
    pub(super) reasons: Vec<String>,
    /// NULLs found in required nested fields (a struct column, a field of
    /// a struct, a list element, a map key or value), by the field's dotted
    /// path: counted from the decoded values at every depth.
    pub(super) nested_nulls: std::collections::BTreeMap<String, u64>,
}

impl Read {
    /// The partition as Iceberg's JSON of `plan`'s partition type.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn partition_json(&self, plan: &Plan) -> Result<Option<serde_json::Value>> {
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
    pub(crate) fn set_partition_json(
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

    pub(super) fn merge(&mut self, other: Read, file: &str) {
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

/// A file's name without its folders, for findings.
fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
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
pub(crate) async fn read_chunk(
    io: FileIO,
    path: String,
    footer: ArrowReaderMetadata,
    groups: Vec<usize>,
    first_row: i64,
    plan: Arc<Plan>,
) -> Result<Read> {
    let (size, file): (u64, Box<dyn AsyncFileReader>) = match LocalFile::open(&path) {
        Some(local) => {
            let local = local.map_err(|e| unreadable(&path, e))?;
            (local.size(), Box::new(local))
        }
        None => {
            let input = io.new_input(&path)?;
            let meta = input.metadata().await?;
            let size = meta.size;
            (
                size,
                Box::new(ArrowFileReader::new(meta, input.reader().await?)),
            )
        }
    };
    // Only the chunks of the groups read: a footer of many row groups
    // costs each read its own groups, not all of them.
    let row_groups = footer.metadata().row_groups();
    let chunks = Chunks::of(groups.iter().filter_map(|g| row_groups.get(*g)), Some(size))
        .map_err(|e| unreadable(&path, e))?;
    let mut reader = PageGuard::new(file, &path, chunks);
    let _churning = Churning::start(Churn::Verifying);
    let mut read = Read::default();
    for field in plan.target.as_struct().fields() {
        read.columns.insert(field.id, ColumnMetrics::new());
    }
    let mut position = first_row;
    if pages::decodes(footer.metadata(), &groups) {
        // Every chunk fetched (and checked) first, then decoded from memory.
        let metadata = footer.metadata();
        let ranges = groups
            .iter()
            .flat_map(|g| metadata.row_group(*g).columns())
            .map(|c| range(c).map(|(start, length)| start..start + length))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| unreadable(&path, e))?;
        let mut fetched = reader
            .get_byte_ranges(ranges)
            .await
            .map_err(|e| unreadable(&path, e))?
            .into_iter();
        let group = pages::Group {
            metadata,
            chunks: groups
                .iter()
                .map(|g| {
                    let columns = metadata.row_group(*g).columns().len();
                    fetched.by_ref().take(columns).collect()
                })
                .collect(),
            groups,
        };
        let levels = parquet_to_arrow_field_levels(
            metadata.file_metadata().schema_descr(),
            ProjectionMask::all(),
            Some(footer.schema().fields()),
        )
        .map_err(|e| unreadable(&path, e))?;
        let batches =
            ParquetRecordBatchReader::try_new_with_row_groups(&levels, &group, BATCH_ROWS, None)
                .map_err(|e| unreadable(&path, e))?;
        for batch in batches {
            let batch = batch.map_err(|e| unreadable(&path, e))?;
            if !absorb(&mut read, &batch, &plan, &path, &mut position)? {
                break;
            }
        }
    } else {
        let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer)
            .with_row_groups(groups)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| unreadable(&path, e))?;
        while let Some(batch) = stream.try_next().await.map_err(|e| unreadable(&path, e))? {
            if !absorb(&mut read, &batch, &plan, &path, &mut position)? {
                break;
            }
        }
    }
    Ok(read)
}

/// Proves what the module says of `batch`, whose first row is row
/// `position` of its file (moved past it); false once the rows turn out to
/// hold two partitions (nothing more needs reading).
fn absorb(
    read: &mut Read,
    batch: &RecordBatch,
    plan: &Plan,
    path: &str,
    position: &mut i64,
) -> Result<bool> {
    let rows = batch.num_rows();
    let columns = target_columns(batch, plan, path)?;
    let fields = plan.target.as_struct().fields();
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
    let first = *position;
    *position += rows as i64;
    read.rows += rows as u64;
    if plan.splitter.is_none() && plan.checks.is_empty() {
        return Ok(true);
    }
    let batch = conform(&columns, plan)?;
    if let Some(splitter) = &plan.splitter {
        for (key, _) in splitter.split(&batch)? {
            match &read.partition {
                None => read.partition = Some(key.data().clone()),
                Some(seen) if seen == key.data() => {}
                Some(_) => {
                    read.reasons.push(mixed_partitions(path));
                    return Ok(false);
                }
            }
        }
    }
    evaluate(&batch, plan, path, first, read)?;
    Ok(true)
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
