//! How a file's columns become the target's: matched by name (or
//! position), cast to the target's types, with the columns a path or the
//! copy itself adds (`hive_partitioning`, `include_metadata`), new columns
//! added to the target (`schema_evolution = 'add_columns'`) or rescued
//! (`'rescue'`), and malformed rows rejected one by one
//! (`on_error = 'continue'`) instead of failing the file.

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, new_null_array,
};
use datafusion::arrow::compute::{CastOptions, cast_with_options, filter};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema as ArrowSchema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::scalar::ScalarValue;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;

use super::options::{Format, MatchByName, OnError, SchemaEvolution, SourceOptions};
use super::records::{Rejected, cut};
use super::source::{Access, SourceFile};
use crate::error::{Error, Result};
use crate::tables::ddl::iceberg_schema;

/// The column `schema_evolution = 'rescue'` keeps unknown and unparsable
/// values in, as a JSON object per row.
pub(crate) const RESCUED: &str = "_rescued_data";
/// `include_metadata`: the file's URI. Not `_file`: Iceberg reserves that
/// name for the metadata column engines answer with the data file's path.
pub(crate) const FILE_COLUMN: &str = "_source_file";
/// `include_metadata`: the row's line (CSV, JSON) or row number.
pub(crate) const ROW_COLUMN: &str = "_source_row";
/// `include_metadata`: when the file was last modified.
pub(crate) const MODIFIED_COLUMN: &str = "_source_modified";
/// The partition value Hive writes for NULL.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// What a value that does not fit does: fail the file, reject its row, or
/// go to `_rescued_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowErrors {
    pub(crate) reject: bool,
    pub(crate) rescue: bool,
}

impl RowErrors {
    pub(crate) fn of(options: &SourceOptions) -> Self {
        Self {
            reject: options.on_error == OnError::Continue || options.validation_mode.is_some(),
            rescue: options.schema_evolution == SchemaEvolution::Rescue,
        }
    }

    /// Whether rows are looked at one by one (else the file's first bad
    /// value fails it).
    pub(crate) fn row_by_row(&self) -> bool {
        self.reject || self.rescue
    }
}

/// A column a file offers past its own.
#[derive(Debug, Clone)]
pub(crate) enum Extra {
    /// The same value on every row (a path's `key=value`, the file's URI).
    Constant(ScalarValue),
    /// The row's line or row number.
    Row,
}

/// The `key=value` segments of `key` (a path relative to the prefix)
/// before its file name, URL-decoded; `None` for the default partition.
fn hive_segments(key: &str) -> Vec<(String, Option<String>)> {
    let mut segments: Vec<&str> = key.split('/').collect();
    segments.pop();
    segments
        .into_iter()
        .filter_map(|s| s.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| {
            let v = decode(v);
            (decode(k), (v != HIVE_NULL).then_some(v))
        })
        .collect()
}

/// `text` with `%XX` escapes decoded (left as is where not valid).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The Hive partition columns of `files` under `access`, in order of first
/// appearance, each typed by what all its values parse as (as DuckDB
/// does): BIGINT, DATE, else VARCHAR.
pub(crate) fn hive_columns(access: &Access, files: &[SourceFile]) -> Vec<(String, DataType)> {
    let mut columns: Vec<(String, Vec<Option<String>>)> = vec![];
    for file in files {
        for (key, value) in hive_segments(&access.relative_key(&file.meta.location)) {
            match columns.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => columns.push((key, vec![value])),
            }
        }
    }
    columns
        .into_iter()
        .map(|(key, values)| {
            let values: Vec<&String> = values.iter().flatten().collect();
            let data_type = if !values.is_empty() && values.iter().all(|v| v.parse::<i64>().is_ok())
            {
                DataType::Int64
            } else if !values.is_empty()
                && values
                    .iter()
                    .all(|v| NaiveDate::parse_from_str(v, "%Y-%m-%d").is_ok())
            {
                DataType::Date32
            } else {
                DataType::Utf8
            };
            (key, data_type)
        })
        .collect()
}

/// The columns `file` offers past its own: its Hive partition values
/// (`hive`, typed across the copy's files) and the metadata columns.
pub(crate) fn extras(
    access: &Access,
    file: &SourceFile,
    options: &SourceOptions,
    hive: &[(String, DataType)],
) -> Result<Vec<(FieldRef, Extra)>> {
    let mut extras = vec![];
    if options.hive_partitioning {
        let segments = hive_segments(&access.relative_key(&file.meta.location));
        for (key, data_type) in hive {
            let value = segments
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.clone());
            let scalar = ScalarValue::Utf8(value.clone())
                .cast_to(data_type)
                .map_err(|_| {
                    Error::invalid(format!(
                        "{}: partition value {key}={} is not a {data_type}",
                        file.uri,
                        value.unwrap_or_default()
                    ))
                })?;
            extras.push((
                Arc::new(Field::new(key, data_type.clone(), true)),
                Extra::Constant(scalar),
            ));
        }
    }
    if options.include_metadata {
        let modified: DateTime<Utc> = file.meta.last_modified;
        extras.push((
            Arc::new(Field::new(FILE_COLUMN, DataType::Utf8, true)),
            Extra::Constant(ScalarValue::Utf8(Some(file.uri.clone()))),
        ));
        extras.push((
            Arc::new(Field::new(ROW_COLUMN, DataType::Int64, true)),
            Extra::Row,
        ));
        extras.push((
            Arc::new(Field::new(
                MODIFIED_COLUMN,
                DataType::Timestamp(
                    datafusion::arrow::datatypes::TimeUnit::Microsecond,
                    Some("+00:00".into()),
                ),
                true,
            )),
            Extra::Constant(ScalarValue::TimestampMicrosecond(
                Some(modified.timestamp_micros()),
                Some("+00:00".into()),
            )),
        ));
    }
    Ok(extras)
}

/// The columns of a file as the target sees them: the file's own, then
/// its extras.
pub(crate) fn offered(own: &ArrowSchema, extras: &[(FieldRef, Extra)]) -> Vec<FieldRef> {
    own.fields()
        .iter()
        .cloned()
        .chain(extras.iter().map(|(f, _)| Arc::clone(f)))
        .collect()
}

/// Where a file's column `name` meets the target's fields (by name, or by
/// position `at` among the file's own `own_width` columns).
fn find_target<'a>(
    fields: &'a [Arc<NestedField>],
    name: &str,
    at: usize,
    own_width: usize,
    matching: MatchByName,
) -> Option<&'a Arc<NestedField>> {
    match matching {
        MatchByName::None if at < own_width => fields.get(at),
        MatchByName::CaseInsensitive => fields.iter().find(|f| f.name.eq_ignore_ascii_case(name)),
        _ => fields.iter().find(|f| f.name == name),
    }
}

/// How the file's columns are matched when the option is not given: by
/// position for CSV without a header, else by name.
pub(crate) fn matching(options: &SourceOptions, format: Format) -> MatchByName {
    options.match_by_column_name.unwrap_or(
        if format == Format::Csv && options.header == Some(false) {
            MatchByName::None
        } else {
            MatchByName::CaseSensitive
        },
    )
}

/// The schema `target` needs to take the columns `offered` by the copy's
/// files (each file's list): new columns added as optional fields with new
/// ids and narrower types widened (`add_columns`), or `_rescued_data`
/// added (`rescue`); `None` when it takes them as it is.
pub(crate) fn evolved(
    target: &Table,
    offered: &[(String, Vec<FieldRef>, usize)],
    options: &SourceOptions,
    format: Format,
) -> Result<Option<Schema>> {
    let current = target.metadata().current_schema();
    let mut fields: Vec<Arc<NestedField>> = current.as_struct().fields().to_vec();
    let mut next_id = target.metadata().last_column_id() + 1;
    let name = target.identifier().to_string();
    let matching = matching(options, format);
    match options.schema_evolution {
        SchemaEvolution::Fail => return Ok(None),
        SchemaEvolution::Rescue => match fields.iter().find(|f| f.name == RESCUED) {
            Some(f) if *f.field_type == Type::Primitive(PrimitiveType::String) => {
                return Ok(None);
            }
            Some(f) => {
                return Err(Error::invalid(format!(
                    "schema_evolution = 'rescue' keeps values in a string column {RESCUED}, but \
                         {name} has a {RESCUED} of type {}: rename that column, or use \
                         schema_evolution = 'add_columns'",
                    f.field_type
                )));
            }
            None => fields.push(Arc::new(NestedField::optional(
                next_id,
                RESCUED,
                Type::Primitive(PrimitiveType::String),
            ))),
        },
        SchemaEvolution::AddColumns => {
            for (uri, columns, own_width) in offered {
                for (at, column) in columns.iter().enumerate() {
                    let found = find_target(&fields, column.name(), at, *own_width, matching);
                    let wanted = iceberg_type(column, uri)?;
                    match found {
                        None => {
                            fields.push(Arc::new(NestedField::optional(
                                next_id,
                                column.name(),
                                wanted,
                            )));
                            next_id += 1;
                        }
                        Some(field) => {
                            if let Some(wider) = widened(&field.field_type, &wanted) {
                                let id = field.id;
                                let slot = fields.iter_mut().find(|f| f.id == id).expect("found");
                                let mut changed = slot.as_ref().clone();
                                changed.field_type = Box::new(wider);
                                *slot = Arc::new(changed);
                            }
                        }
                    }
                }
            }
        }
    }
    if fields.as_slice() == current.as_struct().fields() {
        return Ok(None);
    }
    Ok(Some(
        Schema::builder()
            .with_schema_id(current.schema_id() + 1)
            .with_identifier_field_ids(current.identifier_field_ids())
            .with_fields(fields)
            .build()?,
    ))
}

/// The Iceberg type a new column of a file takes.
fn iceberg_type(column: &FieldRef, uri: &str) -> Result<Type> {
    let schema = iceberg_schema(&ArrowSchema::new(vec![Arc::clone(column)]))?;
    match schema
        .as_struct()
        .fields()
        .first()
        .map(|f| f.field_type.as_ref())
    {
        Some(Type::Primitive(p)) => Ok(Type::Primitive(p.clone())),
        _ => Err(Error::NotSupported(format!(
            "{uri}: column {} is nested ({}); schema_evolution = 'add_columns' adds primitive \
             columns only: add it to the table with ALTER TABLE, or load into a new table",
            column.name(),
            column.data_type()
        ))),
    }
}

/// The type `have` widens to for values of `wanted`, where Iceberg allows
/// it (int to long, float to double, a decimal's precision).
fn widened(have: &Type, wanted: &Type) -> Option<Type> {
    use PrimitiveType as P;
    match (have, wanted) {
        (Type::Primitive(P::Int), Type::Primitive(P::Long)) => Some(Type::Primitive(P::Long)),
        (Type::Primitive(P::Float), Type::Primitive(P::Double)) => Some(Type::Primitive(P::Double)),
        (
            Type::Primitive(P::Decimal { precision, scale }),
            Type::Primitive(P::Decimal {
                precision: wider,
                scale: same,
            }),
        ) if same == scale && wider > precision => Some(Type::Primitive(P::Decimal {
            precision: *wider,
            scale: *scale,
        })),
        _ => None,
    }
}

/// Where one target column's values come from.
#[derive(Debug, Clone)]
enum Take {
    /// The file's column at this index (its own, then its extras).
    Column(usize),
    /// No such column in the file: NULL.
    Null,
    /// `_rescued_data`.
    Rescued,
}

/// How one file's batches become the target's rows.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    file: String,
    table: String,
    schema: SchemaRef,
    takes: Vec<Take>,
    /// The file's columns the target lacks, rescued by name.
    unknown: Vec<usize>,
    own_width: usize,
    extras: Vec<Extra>,
    names: Vec<String>,
    errors: RowErrors,
}

impl Plan {
    /// The plan for a file offering `own` (its columns) and `extras`, into
    /// `target` (as it will be written).
    pub(crate) fn new(
        target: &Table,
        file: &SourceFile,
        own: &ArrowSchema,
        extras: Vec<(FieldRef, Extra)>,
        options: &SourceOptions,
        format: Format,
    ) -> Result<Self> {
        let table = target.identifier().to_string();
        let iceberg = target.metadata().current_schema();
        let schema: SchemaRef = Arc::new(schema_to_arrow_schema(iceberg)?);
        let offered = offered(own, &extras);
        let fields = iceberg.as_struct().fields();
        let matching = matching(options, format);
        let errors = RowErrors::of(options);
        let mut takes = vec![Take::Null; fields.len()];
        let mut unknown = vec![];
        for (at, column) in offered.iter().enumerate() {
            match find_target(fields, column.name(), at, own.fields().len(), matching) {
                Some(field) => {
                    let index = fields.iter().position(|f| f.id == field.id).expect("found");
                    if matches!(takes[index], Take::Column(_)) {
                        return Err(Error::invalid(format!(
                            "{}: two columns match {}'s column {} ({}): rename one, or use \
                             match_by_column_name = 'case_sensitive'",
                            file.uri,
                            table,
                            field.name,
                            column.name()
                        )));
                    }
                    takes[index] = Take::Column(at);
                }
                None => unknown.push(at),
            }
        }
        if errors.rescue
            && let Some(index) = fields.iter().position(|f| f.name == RESCUED)
        {
            takes[index] = Take::Rescued;
        }
        let columns = || {
            offered
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let missing: Vec<String> = fields
            .iter()
            .zip(&takes)
            .filter(|(f, t)| f.required && matches!(t, Take::Null))
            .map(|(f, _)| f.name.clone())
            .collect();
        if !missing.is_empty() {
            return Err(Error::invalid(format!(
                "{}: the file has no column {} that {table} requires (NOT NULL): the file's columns \
                 are {}{}",
                file.uri,
                missing.join(", "),
                columns(),
                if matching == MatchByName::CaseSensitive {
                    "; match_by_column_name = 'case_insensitive' ignores case"
                } else {
                    ""
                }
            )));
        }
        if !unknown.is_empty() && !errors.rescue {
            let names: Vec<String> = unknown.iter().map(|&i| offered[i].name().clone()).collect();
            return Err(Error::invalid(format!(
                "{}: the file has column(s) {} that {table} lacks: set schema_evolution = \
                 'add_columns' to add them to the table, or 'rescue' to keep their values in \
                 {RESCUED}",
                file.uri,
                names.join(", ")
            )));
        }
        if errors.rescue && !fields.iter().any(|f| f.name == RESCUED) {
            return Err(Error::internal(format!(
                "{table} has no {RESCUED} column for a rescuing copy"
            )));
        }
        Ok(Self {
            file: file.uri.clone(),
            table,
            schema,
            takes,
            unknown,
            own_width: own.fields().len(),
            extras: extras.into_iter().map(|(_, e)| e).collect(),
            names: offered.iter().map(|f| f.name().clone()).collect(),
            errors,
        })
    }

    /// Whether the rows' lines are loaded (`_source_row`).
    pub(crate) fn numbers_rows(&self) -> bool {
        self.extras.iter().any(|e| matches!(e, Extra::Row))
    }

    /// The rows of `batch` (the file's own columns) as the target's, and
    /// the rows rejected; `lines` numbers the rows (else they count from
    /// `first_row`). A rejected row's record is its values joined by
    /// `delimiter` (a CSV file read as text), else a JSON object.
    pub(crate) fn apply(
        &self,
        batch: &RecordBatch,
        first_row: i64,
        lines: Option<&[i64]>,
        delimiter: Option<u8>,
    ) -> Result<(RecordBatch, Vec<Rejected>)> {
        let rows = batch.num_rows();
        let line = |row: usize| lines.map_or(first_row + row as i64, |l| l[row]);
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.truncate(self.own_width);
        for extra in &self.extras {
            columns.push(match extra {
                Extra::Constant(value) => value.to_array_of_size(rows)?,
                Extra::Row => Arc::new(Int64Array::from_iter_values((0..rows).map(line))),
            });
        }
        let mut rejected: Vec<Rejected> = vec![];
        let mut keep: Option<Vec<bool>> = None;
        let mut rescued: Vec<Option<serde_json::Map<String, serde_json::Value>>> = vec![];
        let own_width = self.own_width;
        let record = |row: usize, columns: &[ArrayRef]| -> String {
            match delimiter {
                Some(delimiter) => cut(&joined_row(&columns[..own_width], row, delimiter)),
                None => cut(&render_row(&self.names, columns, row)),
            }
        };
        let mut reject = |row: usize, column: &str, error: String, keep: &mut Option<Vec<bool>>| {
            let keep = keep.get_or_insert_with(|| vec![true; rows]);
            if keep[row] {
                keep[row] = false;
                rejected.push(Rejected {
                    file: self.file.clone(),
                    line: line(row),
                    column: Some(column.to_string()),
                    error,
                    record: record(row, &columns),
                });
            }
        };
        let mut rescue = |row: usize, name: &str, value: String| {
            if rescued.is_empty() {
                rescued = vec![None; rows];
            }
            rescued[row]
                .get_or_insert_with(Default::default)
                .insert(name.to_string(), serde_json::Value::String(value));
        };
        for &at in &self.unknown {
            let column = &columns[at];
            if column.null_count() == column.len() {
                continue;
            }
            let text = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
            for row in (0..rows).filter(|&r| column.is_valid(r)) {
                rescue(row, &self.names[at], text.value(row).to_string());
            }
        }
        let mut out: Vec<ArrayRef> = Vec::with_capacity(self.takes.len());
        for (field, take) in self.schema.fields().iter().zip(&self.takes) {
            let name = field.name();
            let value = match take {
                Take::Null | Take::Rescued => new_null_array(field.data_type(), rows),
                Take::Column(at) => {
                    let column = &columns[*at];
                    if column.data_type() == field.data_type() {
                        Arc::clone(column)
                    } else if !self.errors.row_by_row() {
                        let strict = CastOptions {
                            safe: false,
                            ..Default::default()
                        };
                        cast_with_options(column, field.data_type(), &strict).map_err(|e| {
                            Error::invalid(format!(
                                "{}: column {name} does not fit {}'s type {}: {}",
                                self.file,
                                self.table,
                                field.data_type(),
                                e
                            ))
                        })?
                    } else {
                        let cast =
                            cast_with_options(column, field.data_type(), &CastOptions::default())?;
                        if cast.null_count() > column.null_count() {
                            let text = ArrayFormatter::try_new(
                                column.as_ref(),
                                &FormatOptions::default(),
                            )?;
                            for row in (0..rows).filter(|&r| column.is_valid(r) && cast.is_null(r))
                            {
                                let value = text.value(row).to_string();
                                if self.errors.rescue {
                                    rescue(row, name, value);
                                } else {
                                    reject(
                                        row,
                                        name,
                                        format!(
                                            "'{}' is not a valid {}",
                                            cut(&value),
                                            field.data_type()
                                        ),
                                        &mut keep,
                                    );
                                }
                            }
                        }
                        cast
                    }
                }
            };
            if !field.is_nullable() && value.null_count() > 0 {
                if !self.errors.reject {
                    let row = (0..rows).find(|&r| value.is_null(r)).unwrap_or_default();
                    return Err(Error::invalid(format!(
                        "{}: column {name} of {} is NOT NULL, but row {} has no value: give every \
                         row a value, or load with on_error = 'continue' to reject such rows",
                        self.file,
                        self.table,
                        line(row)
                    )));
                }
                for row in (0..rows).filter(|&r| value.is_null(r)) {
                    reject(
                        row,
                        name,
                        format!("NULL in the required column {name}"),
                        &mut keep,
                    );
                }
            }
            out.push(value);
        }
        if let Some(index) = self.takes.iter().position(|t| matches!(t, Take::Rescued))
            && !rescued.is_empty()
        {
            out[index] = Arc::new(StringArray::from_iter(rescued.iter().map(|r| {
                r.as_ref()
                    .map(|map| serde_json::Value::Object(map.clone()).to_string())
            })));
        }
        // The rejected rows go before the batch is built: they are what
        // breaks its NOT NULL columns.
        let (out, rows) = match keep {
            Some(keep) => {
                let keep = BooleanArray::from(keep);
                let kept = keep.true_count();
                let out = out
                    .iter()
                    .map(|column| filter(column, &keep))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                (out, kept)
            }
            None => (out, rows),
        };
        let options =
            datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = RecordBatch::try_new_with_options(Arc::clone(&self.schema), out, &options)?;
        Ok((batch, rejected))
    }
}

/// Row `row` of `columns` (text) joined by `delimiter`, NULL as nothing:
/// a CSV record as it was read.
fn joined_row(columns: &[ArrayRef], row: usize, delimiter: u8) -> String {
    let values: Vec<String> = columns
        .iter()
        .map(|column| {
            if column.is_null(row) {
                return String::new();
            }
            ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())
                .map(|text| text.value(row).to_string())
                .unwrap_or_default()
        })
        .collect();
    values.join(&char::from(delimiter).to_string())
}

/// Row `row` of `columns` as a JSON object (for a rejection's record when
/// the file was not read as text).
fn render_row(names: &[String], columns: &[ArrayRef], row: usize) -> String {
    let mut object = serde_json::Map::new();
    for (name, column) in names.iter().zip(columns) {
        let value = if column.is_null(row) {
            serde_json::Value::Null
        } else {
            match ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default()) {
                Ok(text) => serde_json::Value::String(text.value(row).to_string()),
                Err(_) => serde_json::Value::Null,
            }
        };
        object.insert(name.clone(), value);
    }
    serde_json::Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hive_segments_are_decoded() {
        assert_eq!(
            hive_segments("dt=2026-07-01/region=eu%2Fwest/part-0.csv"),
            vec![
                ("dt".to_string(), Some("2026-07-01".to_string())),
                ("region".to_string(), Some("eu/west".to_string())),
            ]
        );
        assert_eq!(
            hive_segments("dt=__HIVE_DEFAULT_PARTITION__/a.csv"),
            vec![("dt".to_string(), None)]
        );
        assert!(hive_segments("a=1.csv").is_empty());
    }
}
