//! Reading one chunk of row groups: every row decoded, NULLs counted at
//! every depth, each row's partition computed, every CHECK evaluated.

use datafusion::arrow::array::{Array, AsArray};
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
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
use parquet::schema::types::SchemaDescriptor;

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

    /// Adds `other`, a read of other columns of the same rows of `file`:
    /// both must have decoded as many rows.
    pub(super) fn join(&mut self, other: Read, file: &str) -> Result<()> {
        if self.rows != other.rows {
            return Err(unreadable(
                file,
                format!(
                    "its columns hold different numbers of rows ({} and {}) in one row group",
                    self.rows, other.rows
                ),
            ));
        }
        self.columns.extend(other.columns);
        for (field, count) in other.nested_nulls {
            *self.nested_nulls.entry(field).or_default() += count;
        }
        self.reasons.extend(other.reasons);
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

/// For each of the target's columns, the file's top-level column that holds
/// it (the first whose field id is the staged one), if any.
fn holders(file: &datafusion::arrow::datatypes::Schema, plan: &Plan) -> Vec<Option<usize>> {
    let ids: Vec<Option<i32>> = file
        .fields()
        .iter()
        .map(|f| {
            f.metadata()
                .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
                .and_then(|v| v.parse().ok())
        })
        .collect();
    plan.staged_ids
        .iter()
        .map(|staged| ids.iter().position(|id| *id == Some(*staged)))
        .collect()
}

/// Which of a file's top-level columns one read decodes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Columns {
    /// Every column: whole rows, as rules and partitions need them.
    All,
    /// The one at this index: a column's metrics and NULLs need no other.
    One(usize),
}

impl Columns {
    /// Which of a file's leaf columns (by index, as `descriptor` numbers
    /// them) a read of these columns decodes: every one, or those under the
    /// one top-level column (none, for a column the file does not have).
    pub(super) fn leaves(self, descriptor: &SchemaDescriptor) -> Vec<bool> {
        (0..descriptor.num_columns())
            .map(|leaf| match self {
                Columns::All => true,
                Columns::One(root) => descriptor.get_column_root_idx(leaf) == root,
            })
            .collect()
    }

    /// Whether a read of these columns decodes the target column that the
    /// file's top-level column `holder` holds.
    fn decode(self, holder: Option<usize>) -> bool {
        match self {
            Columns::All => true,
            Columns::One(root) => holder == Some(root),
        }
    }
}

/// The columns of `batch` (decoded from `columns` of a file whose
/// top-level columns hold the target's as `holders` says) for each of the
/// target's columns: `None` for those another read decodes.
fn target_columns(
    batch: &RecordBatch,
    holders: &[Option<usize>],
    columns: Columns,
    plan: &Plan,
    path: &str,
) -> Result<Vec<Option<ArrayRef>>> {
    plan.arrow
        .fields()
        .iter()
        .zip(&plan.staged_ids)
        .zip(holders)
        .map(|((field, staged), holder)| match (columns, holder) {
            (Columns::All, Some(index)) => Ok(Some(Arc::clone(batch.column(*index)))),
            (Columns::All, None) => Err(Error::invalid(format!(
                "staged file {path} has no column with field id {staged} ('{}')",
                field.name()
            ))),
            (Columns::One(_), _) => {
                Ok(columns.decode(*holder).then(|| Arc::clone(batch.column(0))))
            }
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

/// Reads `columns` of row groups `groups` of `path` (first row at
/// `first_row`).
pub(crate) async fn read_chunk(
    io: FileIO,
    path: String,
    footer: ArrowReaderMetadata,
    groups: Vec<usize>,
    first_row: i64,
    columns: Columns,
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
    let descriptor = footer.metadata().file_metadata().schema_descr_ptr();
    let leaves = columns.leaves(&descriptor);
    let mask = ProjectionMask::leaves(&descriptor, (0..leaves.len()).filter(|leaf| leaves[*leaf]));
    // Only the chunks of the groups read: a footer of many row groups
    // costs each read its own groups, not all of them.
    let row_groups = footer.metadata().row_groups();
    let chunks = Chunks::of(groups.iter().filter_map(|g| row_groups.get(*g)), Some(size))
        .map_err(|e| unreadable(&path, e))?;
    let mut reader = PageGuard::new(file, &path, chunks);
    let _churning = Churning::start(Churn::Verifying);
    let holders = holders(footer.schema(), &plan);
    let mut read = Read::default();
    for (field, holder) in plan.target.as_struct().fields().iter().zip(&holders) {
        if columns.decode(*holder) {
            read.columns.insert(field.id, ColumnMetrics::new());
        }
    }
    let mut position = first_row;
    // Proves what `absorb` says of one batch; false once nothing more
    // needs reading.
    let mut take = |batch: &RecordBatch| {
        let decoded = target_columns(batch, &holders, columns, &plan, &path)?;
        absorb(&mut read, batch, decoded, &plan, &path, &mut position)
    };
    if pages::decodes(footer.metadata(), &groups) {
        // Every chunk fetched (and checked) first, then decoded from memory.
        let metadata = footer.metadata();
        let ranges = groups
            .iter()
            .flat_map(|g| metadata.row_group(*g).columns().iter().zip(&leaves))
            .filter(|(_, decoded)| **decoded)
            .map(|(c, _)| range(c).map(|(start, length)| start..start + length))
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
                    // A column not decoded is never asked for: no bytes.
                    let columns = metadata.row_group(*g).columns().len();
                    (0..columns)
                        .map(|c| match leaves.get(c) {
                            Some(true) => fetched.next().unwrap_or_default(),
                            _ => Bytes::new(),
                        })
                        .collect()
                })
                .collect(),
            groups,
        };
        let levels = parquet_to_arrow_field_levels(
            metadata.file_metadata().schema_descr(),
            mask,
            Some(footer.schema().fields()),
        )
        .map_err(|e| unreadable(&path, e))?;
        let batches =
            ParquetRecordBatchReader::try_new_with_row_groups(&levels, &group, BATCH_ROWS, None)
                .map_err(|e| unreadable(&path, e))?;
        for batch in batches {
            let batch = batch.map_err(|e| unreadable(&path, e))?;
            if !take(&batch)? {
                break;
            }
        }
    } else {
        let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer)
            .with_row_groups(groups)
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| unreadable(&path, e))?;
        while let Some(batch) = stream.try_next().await.map_err(|e| unreadable(&path, e))? {
            if !take(&batch)? {
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
    columns: Vec<Option<ArrayRef>>,
    plan: &Plan,
    path: &str,
    position: &mut i64,
) -> Result<bool> {
    let rows = batch.num_rows();
    let fields = plan.target.as_struct().fields();
    for (column, field) in columns.iter().zip(fields) {
        let Some(column) = column else {
            continue;
        };
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
    let Some(columns) = columns.into_iter().collect::<Option<Vec<_>>>() else {
        return Err(Error::internal(
            "rules or partitions were evaluated on a read of one column",
        ));
    };
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use iceberg::spec::{NestedField, PrimitiveType, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterProperties;

    use super::*;

    fn plan() -> Arc<Plan> {
        let target = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                    NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
                    NestedField::required(3, "code", Type::Primitive(PrimitiveType::String)).into(),
                ])
                .build()
                .unwrap(),
        );
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&target).unwrap());
        Arc::new(Plan {
            target,
            arrow,
            staged_ids: vec![1, 2, 3],
            splitter: None,
            spec_id: 0,
            partition_type: None,
            checks: vec![],
            key: vec![],
        })
    }

    /// 2,500 rows in row groups of 1,000: ids, names (every seventh NULL,
    /// some over the 12 bytes a string view holds inline), two codes.
    fn write(path: &std::path::Path, plan: &Plan, compression: Compression) {
        let ids: Vec<i64> = (0..2_500).map(|i| (i * 7919) % 2_500 - 1_000).collect();
        let names: Vec<Option<String>> = (0..2_500)
            .map(|i| {
                (i % 7 != 0).then(|| match i % 3 {
                    0 => format!("n{i}"),
                    1 => format!("a longer name than twelve bytes {i}"),
                    _ => String::new(),
                })
            })
            .collect();
        let codes: Vec<&str> = (0..2_500)
            .map(|i| if i % 5 == 0 { "eur" } else { "usd" })
            .collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&plan.arrow),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(names)),
                Arc::new(StringArray::from(codes)),
            ],
        )
        .unwrap();
        let properties = WriterProperties::builder()
            .set_compression(compression)
            .set_max_row_group_row_count(Some(1_000))
            .set_data_page_row_count_limit(300)
            .build();
        let mut writer = ArrowWriter::try_new(
            std::fs::File::create(path).unwrap(),
            Arc::clone(&plan.arrow),
            Some(properties),
        )
        .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    #[tokio::test]
    async fn a_chunk_read_column_by_column_proves_what_a_whole_read_does() {
        let dir = tempfile::tempdir().unwrap();
        let (_catalog, table) = crate::catalog::test_table(dir.path()).await;
        let io = table.file_io().clone();
        let plan = plan();
        // ZSTD takes verification's own page reader, SNAPPY the crate's.
        for (name, compression) in [
            ("zstd", Compression::ZSTD(ZstdLevel::default())),
            ("snappy", Compression::SNAPPY),
        ] {
            let path = dir.path().join(format!("{name}.parquet"));
            write(&path, &plan, compression);
            let path = format!("file://{}", path.display());
            let (_, footer) = super::super::open(&io, &path).await.unwrap();
            let groups: Vec<usize> = (0..footer.metadata().num_row_groups()).collect();
            assert_eq!(groups.len(), 3);
            let read = |columns| {
                let (io, path, footer) = (io.clone(), path.clone(), footer.clone());
                read_chunk(
                    io,
                    path,
                    footer,
                    groups.clone(),
                    0,
                    columns,
                    Arc::clone(&plan),
                )
            };
            let whole = read(Columns::All).await.unwrap();
            let mut joined = read(Columns::One(0)).await.unwrap();
            assert_eq!(joined.columns.keys().collect::<Vec<_>>(), vec![&1]);
            for root in [1, 2] {
                joined
                    .join(read(Columns::One(root)).await.unwrap(), &path)
                    .unwrap();
            }
            assert_eq!(whole.rows, 2_500, "{name}");
            assert_eq!(whole.columns[&2].nulls, 358, "{name}");
            assert_eq!(
                whole.columns[&1].lower,
                Some(iceberg::spec::Datum::long(-1_000))
            );
            assert_eq!(
                serde_json::to_value(&whole).unwrap(),
                serde_json::to_value(&joined).unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn columns_of_different_row_counts_do_not_join() {
        let mut one = Read {
            rows: 3,
            ..Read::default()
        };
        let other = Read {
            rows: 2,
            ..Read::default()
        };
        let error = one.join(other, "/w/f.parquet").unwrap_err().to_string();
        assert!(
            error.contains("staged file /w/f.parquet")
                && error.contains("its columns hold different numbers of rows (3 and 2)"),
            "{error}"
        );
    }
}
