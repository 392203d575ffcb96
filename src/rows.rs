//! DataFusion helpers: typed result rows ([`ResultRow`], declared with
//! `result_row!`; [`Value`] and [`batch`] underneath) and small plans
//! ([`one_batch`], [`project`]). They depend on nothing above the error and
//! secret types.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Int32Builder, Int64Builder, RecordBatch,
    StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{
    DataType, Int32Type, Int64Type, SchemaRef, TimestampMicrosecondType,
};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column as ColumnExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, PlanProperties};

use crate::error::{Error, Result};

/// One value of a result row.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    /// A string, or NULL.
    Str(Option<String>),
    /// A 64-bit integer, or NULL.
    Int(Option<i64>),
    /// A UTC timestamp, or NULL.
    Time(Option<DateTime<Utc>>),
    /// A boolean, or NULL.
    Bool(Option<bool>),
    /// NULL, in a column of any type.
    Null,
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(Some(v.to_string()))
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(Some(v))
    }
}

impl From<Option<String>> for Value {
    fn from(v: Option<String>) -> Self {
        Value::Str(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(Some(v))
    }
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Self {
        Value::Int(v)
    }
}

impl From<Option<DateTime<Utc>>> for Value {
    fn from(v: Option<DateTime<Utc>>) -> Self {
        Value::Time(v)
    }
}

/// Builds a batch of `rows` whose values follow the order of `schema`.
pub(crate) fn batch(schema: SchemaRef, rows: &[Vec<Value>]) -> Result<RecordBatch> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let value = |row: &Vec<Value>| row.get(i).cloned();
        let mismatch = |v: Option<Value>| {
            Error::internal(format!(
                "column '{}' of type {} got {v:?}",
                field.name(),
                field.data_type()
            ))
        };
        let column: ArrayRef = match field.data_type() {
            DataType::Utf8 => {
                let mut b = StringBuilder::new();
                for row in rows {
                    match value(row) {
                        Some(Value::Str(v)) => b.append_option(v),
                        Some(Value::Null) => b.append_null(),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Int64 => {
                let mut b = Int64Builder::new();
                for row in rows {
                    match value(row) {
                        Some(Value::Int(v)) => b.append_option(v),
                        Some(Value::Null) => b.append_null(),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Int32 => {
                let mut b = Int32Builder::new();
                for row in rows {
                    match value(row) {
                        Some(Value::Int(v)) => b.append_option(
                            v.map(i32::try_from)
                                .transpose()
                                .map_err(|_| mismatch(value(row)))?,
                        ),
                        Some(Value::Null) => b.append_null(),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Timestamp(_, tz) => {
                let mut b = TimestampMicrosecondBuilder::new().with_timezone_opt(tz.clone());
                for row in rows {
                    match value(row) {
                        Some(Value::Time(v)) => b.append_option(v.map(|t| t.timestamp_micros())),
                        Some(Value::Null) => b.append_null(),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Boolean => {
                let mut b = BooleanBuilder::new();
                for row in rows {
                    match value(row) {
                        Some(Value::Bool(v)) => b.append_option(v),
                        Some(Value::Null) => b.append_null(),
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            other => {
                return Err(Error::internal(format!(
                    "result column '{}' has unsupported type {other}",
                    field.name()
                )));
            }
        };
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The Arrow extension a text column holding a JSON document carries (a
/// field declared `=> json` in [`result_row!`]): printers and the HTTP API
/// write its values as JSON, not as strings of JSON.
const JSON_EXTENSION: (&str, &str) = ("ARROW:extension:name", "arrow.json");

/// The field metadata of a result column of kind `kind` (`json` or none).
pub(crate) fn kind_metadata(kind: &str) -> std::collections::HashMap<String, String> {
    match kind {
        "json" => [(JSON_EXTENSION.0.to_string(), JSON_EXTENSION.1.to_string())].into(),
        _ => Default::default(),
    }
}

/// Whether `field` holds JSON documents as text.
pub(crate) fn is_json(field: &datafusion::arrow::datatypes::Field) -> bool {
    field.metadata().get(JSON_EXTENSION.0).map(String::as_str) == Some(JSON_EXTENSION.1)
}

/// Whether a column of `schema` holds JSON documents as text.
pub fn has_json_columns(schema: &datafusion::arrow::datatypes::Schema) -> bool {
    schema.fields().iter().any(|f| is_json(f))
}

/// `batches` as JSON objects, one per row, with the columns SQL shows; a
/// JSON column's values are the documents they hold, not strings of them.
pub fn json_rows(
    batches: &[RecordBatch],
) -> Result<Vec<serde_json::Map<String, serde_json::Value>>> {
    let Some(first) = batches.first() else {
        return Ok(vec![]);
    };
    let json: Vec<String> = first
        .schema()
        .fields()
        .iter()
        .filter(|f| is_json(f))
        .map(|f| f.name().clone())
        .collect();
    let mut writer = datafusion::arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, datafusion::arrow::json::writer::JsonArray>(Vec::new());
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    let text = writer.into_inner();
    if text.is_empty() {
        return Ok(vec![]);
    }
    let mut rows: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(&text)
            .map_err(|e| Error::internal(format!("result rows as JSON: {e}")))?;
    for row in &mut rows {
        for name in &json {
            if let Some(value) = row.get_mut(name)
                && let serde_json::Value::String(text) = value
                && let Ok(document) = serde_json::from_str(text)
            {
                *value = document;
            }
        }
    }
    Ok(rows)
}

/// The timestamp type of icestage's result columns.
pub(crate) fn timestamp_type() -> DataType {
    DataType::Timestamp(
        datafusion::arrow::datatypes::TimeUnit::Microsecond,
        Some("+00:00".into()),
    )
}

/// The row an icestage operation answers: a statement's result, a table
/// function's row, an HTTP endpoint's body. Each implementation is declared
/// with `result_row!`, which derives the Arrow schema and the row from the
/// struct's own fields, so the two cannot drift apart.
pub trait ResultRow: Sized {
    /// The result's columns: one per field, named and typed as the field.
    fn schema() -> SchemaRef;

    /// `rows` as one batch of [`ResultRow::schema`].
    fn to_batch(rows: &[Self]) -> Result<RecordBatch>;
}

/// A Rust type that can be one column of a [`ResultRow`]: its Arrow type and
/// each value.
pub(crate) trait Column {
    /// The column's Arrow type.
    fn data_type() -> DataType;
    /// Whether the column may hold NULL (an `Option` field).
    fn nullable() -> bool {
        false
    }
    /// The field's value.
    fn value(&self) -> Value;
    /// The value at `row` of `column`, an array of [`Column::data_type`]:
    /// `None` for NULL, or for a type icestage never reads back from its
    /// own tables.
    fn read(column: &dyn Array, row: usize) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = (column, row);
        None
    }
}

impl Column for String {
    fn data_type() -> DataType {
        DataType::Utf8
    }
    fn value(&self) -> Value {
        Value::Str(Some(self.clone()))
    }
    fn read(column: &dyn Array, row: usize) -> Option<Self> {
        let column = column.as_string_opt::<i32>()?;
        column.is_valid(row).then(|| column.value(row).to_string())
    }
}

impl Column for i64 {
    fn data_type() -> DataType {
        DataType::Int64
    }
    fn value(&self) -> Value {
        Value::Int(Some(*self))
    }
    fn read(column: &dyn Array, row: usize) -> Option<Self> {
        let column = column.as_primitive_opt::<Int64Type>()?;
        column.is_valid(row).then(|| column.value(row))
    }
}

impl Column for bool {
    fn data_type() -> DataType {
        DataType::Boolean
    }
    fn value(&self) -> Value {
        Value::Bool(Some(*self))
    }
    fn read(column: &dyn Array, row: usize) -> Option<Self> {
        let column = column.as_boolean_opt()?;
        column.is_valid(row).then(|| column.value(row))
    }
}

impl Column for DateTime<Utc> {
    fn data_type() -> DataType {
        timestamp_type()
    }
    fn value(&self) -> Value {
        Value::Time(Some(*self))
    }
    fn read(column: &dyn Array, row: usize) -> Option<Self> {
        let column = column.as_primitive_opt::<TimestampMicrosecondType>()?;
        column
            .is_valid(row)
            .then(|| DateTime::from_timestamp_micros(column.value(row)))
            .flatten()
    }
}

impl Column for i32 {
    fn data_type() -> DataType {
        DataType::Int32
    }
    fn value(&self) -> Value {
        Value::Int(Some(i64::from(*self)))
    }
    fn read(column: &dyn Array, row: usize) -> Option<Self> {
        let column = column.as_primitive_opt::<Int32Type>()?;
        column.is_valid(row).then(|| column.value(row))
    }
}

impl Column for crate::secret::Secret {
    fn data_type() -> DataType {
        DataType::Utf8
    }
    fn value(&self) -> Value {
        Value::Str(Some(self.expose().to_string()))
    }
}

impl<T: Column> Column for Option<T> {
    fn data_type() -> DataType {
        T::data_type()
    }
    fn nullable() -> bool {
        true
    }
    fn value(&self) -> Value {
        match self {
            Some(value) => value.value(),
            None => Value::Null,
        }
    }
    fn read(column: &dyn Array, row: usize) -> Option<Self> {
        match column.is_valid(row) {
            true => T::read(column, row).map(Some),
            false => Some(None),
        }
    }
}

/// A column type shown by its name: a state, a mode, a path (anything with
/// `Display`), stored as a string. Those listed after `read:` are read back
/// too, by their `FromStr` (a value it refuses reads as unreadable).
macro_rules! named_column {
    ($($ty:ty),* $(,)?) => {$(
        impl $crate::rows::Column for $ty {
            fn data_type() -> ::datafusion::arrow::datatypes::DataType {
                ::datafusion::arrow::datatypes::DataType::Utf8
            }
            fn value(&self) -> $crate::rows::Value {
                $crate::rows::Value::Str(Some(self.to_string()))
            }
        }
    )*};
    (read: $($ty:ty),* $(,)?) => {$(
        impl $crate::rows::Column for $ty {
            fn data_type() -> ::datafusion::arrow::datatypes::DataType {
                ::datafusion::arrow::datatypes::DataType::Utf8
            }
            fn value(&self) -> $crate::rows::Value {
                $crate::rows::Value::Str(Some(self.to_string()))
            }
            fn read(column: &dyn ::datafusion::arrow::array::Array, row: usize) -> Option<Self> {
                <String as $crate::rows::Column>::read(column, row)?.parse().ok()
            }
        }
    )*};
}
pub(crate) use named_column;

/// A row of a table icestage keeps for itself (the copy log, its
/// rejections, findings, a pipe's runs, webhook deliveries): the row type's
/// columns are the table's schema and its fields are what is written, so the
/// two cannot drift apart. `result_row!` derives it.
pub(crate) trait StoredRow {
    /// The columns, as the result row's.
    fn columns() -> SchemaRef;

    /// The row's values, in the columns' order.
    fn values(&self) -> Vec<Value>;

    /// The table's Iceberg schema: a field per column, ids from 1 in
    /// order, optional where the column is nullable.
    fn iceberg_schema() -> Result<iceberg::spec::Schema> {
        iceberg_schema(&Self::columns())
    }

    /// The rows of `batch`, read from `table` (named in errors): each
    /// column found by its name and cast to the field's type.
    fn from_batch(table: &str, batch: &RecordBatch) -> Result<Vec<Self>>
    where
        Self: Sized;
}

/// The columns of `batch` that stored row `columns` reads, by name and
/// cast to their types: a table changed outside icestage is refused by the
/// column it lacks, not read wrongly.
pub(crate) fn stored_columns(
    table: &str,
    columns: &SchemaRef,
    batch: &RecordBatch,
) -> Result<Vec<ArrayRef>> {
    columns
        .fields()
        .iter()
        .map(|field| {
            let found = batch.column_by_name(field.name()).ok_or_else(|| {
                Error::invalid(format!(
                    "table {table} has no column '{}': it was changed outside icestage; \
                     add the column back as {} or drop the table",
                    field.name(),
                    field.data_type()
                ))
            })?;
            Ok(datafusion::arrow::compute::cast(found, field.data_type())?)
        })
        .collect()
}

/// The value at `row` of stored column `name`, read back as `T`.
pub(crate) fn stored_value<T: Column>(
    table: &str,
    name: &str,
    column: &ArrayRef,
    row: usize,
) -> Result<T> {
    T::read(column.as_ref(), row).ok_or_else(|| {
        Error::invalid(format!(
            "table {table} holds NULL or an unreadable value in column '{name}' at row {row}: \
             it was changed outside icestage; drop the table"
        ))
    })
}

/// The Iceberg schema of the columns of a stored row (see [`StoredRow`]).
fn iceberg_schema(columns: &SchemaRef) -> Result<iceberg::spec::Schema> {
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    let fields = columns
        .fields()
        .iter()
        .zip(1..)
        .map(|(field, id)| {
            let kind = match field.data_type() {
                DataType::Utf8 => PrimitiveType::String,
                DataType::Int64 => PrimitiveType::Long,
                DataType::Int32 => PrimitiveType::Int,
                DataType::Boolean => PrimitiveType::Boolean,
                DataType::Timestamp(_, Some(_)) => PrimitiveType::Timestamptz,
                other => {
                    return Err(Error::internal(format!(
                        "stored column '{}' has type {other}, which no stored row uses",
                        field.name()
                    )));
                }
            };
            let kind = Type::Primitive(kind);
            Ok(Arc::new(match field.is_nullable() {
                true => NestedField::optional(id, field.name(), kind),
                false => NestedField::required(id, field.name(), kind),
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(iceberg::spec::Schema::builder()
        .with_fields(fields)
        .build()?)
}

/// Declares a public result struct and derives its [`ResultRow`]: one
/// column per field, in order, named as the field, typed by its
/// [`Column`] type (an `Option` field is a nullable column).
macro_rules! result_row {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident : $ty:ty $(=> $kind:ident)?, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $crate::rows::ResultRow for $name {
            fn schema() -> ::datafusion::arrow::datatypes::SchemaRef {
                ::std::sync::Arc::new(::datafusion::arrow::datatypes::Schema::new(vec![
                    $( ::datafusion::arrow::datatypes::Field::new(
                        stringify!($field),
                        <$ty as $crate::rows::Column>::data_type(),
                        <$ty as $crate::rows::Column>::nullable(),
                    ).with_metadata($crate::rows::kind_metadata(stringify!($($kind)?))), )*
                ]))
            }

            fn to_batch(
                rows: &[Self],
            ) -> $crate::error::Result<::datafusion::arrow::array::RecordBatch> {
                let values: Vec<Vec<$crate::rows::Value>> =
                    rows.iter().map($crate::rows::StoredRow::values).collect();
                $crate::rows::batch(<Self as $crate::rows::ResultRow>::schema(), &values)
            }
        }

        impl $crate::rows::StoredRow for $name {
            fn columns() -> ::datafusion::arrow::datatypes::SchemaRef {
                <Self as $crate::rows::ResultRow>::schema()
            }

            fn values(&self) -> Vec<$crate::rows::Value> {
                vec![ $( $crate::rows::Column::value(&self.$field), )* ]
            }

            fn from_batch(
                table: &str,
                batch: &::datafusion::arrow::array::RecordBatch,
            ) -> $crate::error::Result<Vec<Self>> {
                let columns = $crate::rows::stored_columns(
                    table,
                    &<Self as $crate::rows::StoredRow>::columns(),
                    batch,
                )?;
                (0..batch.num_rows())
                    .map(|row| {
                        let mut column = columns.iter();
                        Ok(Self { $(
                            $field: $crate::rows::stored_value(
                                table,
                                stringify!($field),
                                column.next().ok_or_else(|| {
                                    $crate::error::Error::internal("a stored row's columns")
                                })?,
                                row,
                            )?,
                        )* })
                    })
                    .collect()
            }
        }
    };
}
pub(crate) use result_row;

/// The stream of partition `partition` of a plan with one output partition
/// whose one batch `batch` computes.
pub(crate) fn one_batch(
    plan: &str,
    partition: usize,
    schema: SchemaRef,
    batch: impl Future<Output = DFResult<RecordBatch>> + Send + 'static,
) -> DFResult<SendableRecordBatchStream> {
    if partition != 0 {
        return Err(DataFusionError::Internal(format!(
            "{plan} has one partition, asked for {partition}"
        )));
    }
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::once(batch),
    )))
}

/// The properties of a bounded plan of `partitions` partitions producing
/// `schema`, which emits its rows as it goes (`incremental`) or at the end.
pub(crate) fn bounded_properties(
    schema: SchemaRef,
    partitions: usize,
    incremental: bool,
) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        if incremental {
            EmissionType::Incremental
        } else {
            EmissionType::Final
        },
        Boundedness::Bounded,
    ))
}

/// `plan` narrowed to the columns of `projection` (indices into its schema).
pub(crate) fn project(
    plan: Arc<dyn ExecutionPlan>,
    projection: Option<&Vec<usize>>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let Some(projection) = projection else {
        return Ok(plan);
    };
    let schema = plan.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = projection
        .iter()
        .map(|&i| {
            let name = schema.field(i).name().clone();
            (Arc::new(ColumnExpr::new(&name, i)) as _, name)
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
}

/// A stored row's Iceberg schema as [`schema_shape`] writes it.
#[cfg(test)]
pub(crate) fn stored_shape<R: StoredRow>() -> Vec<String> {
    schema_shape(&R::iceberg_schema().unwrap())
}

/// An Iceberg schema as `id name type required|optional` lines, for the
/// tests that keep existing tables' schemas.
#[cfg(test)]
pub(crate) fn schema_shape(schema: &iceberg::spec::Schema) -> Vec<String> {
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            let required = if f.required { "required" } else { "optional" };
            format!("{} {} {} {required}", f.id, f.name, f.field_type)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables icestage keeps for itself have the schemas earlier
    /// versions created (field ids, names, types, optionality): a table
    /// made before the schemas came from the row types reads and takes the
    /// same rows.
    #[test]
    fn stored_rows_keep_the_schemas_of_existing_tables() {
        use crate::ingest::copy_into::LogRow;
        use crate::ingest::rejects::RejectRow;
        use crate::pipe::RunRow;
        use crate::upload::status::UploadFinding;

        assert_eq!(
            stored_shape::<UploadFinding>(),
            [
                "1 upload_id string required",
                "2 rule string required",
                "3 kind string required",
                "4 row string required",
                "5 file string optional",
                "6 position long optional",
                "7 values string required",
                "8 message string required",
            ]
        );
        assert_eq!(
            stored_shape::<RunRow>(),
            [
                "1 run_id string required",
                "2 started_at timestamptz required",
                "3 finished_at timestamptz required",
                "4 runner string required",
                "5 files_loaded long required",
                "6 rows long required",
                "7 files_failed long required",
                "8 snapshot_id long optional",
                "9 message string required",
            ]
        );
        assert_eq!(
            stored_shape::<LogRow>(),
            [
                "1 target_table string required",
                "2 file string required",
                "3 size long optional",
                "4 etag string optional",
                "5 version string optional",
                "6 copy_id string required",
                "7 state string required",
                "8 recorded_at timestamptz required",
            ]
        );
        assert_eq!(
            stored_shape::<RejectRow>(),
            [
                "1 target_table string required",
                "2 copy_id string required",
                "3 file string required",
                "4 line long optional",
                "5 column string optional",
                "6 error string required",
                "7 record string optional",
                "8 recorded_at timestamptz required",
            ]
        );
    }

    /// A stored row reads back as written, from the columns as a scan
    /// returns them (by name, in any order, in a type that casts to the
    /// field's); a table changed outside icestage is refused by the column
    /// it lacks or the NULL it holds, not read wrongly.
    #[test]
    fn stored_rows_read_back_as_written() {
        use crate::ingest::copy_into::LogRow;
        use datafusion::arrow::array::{Int32Array, StringViewArray};
        use datafusion::arrow::datatypes::Schema;

        let at = DateTime::from_timestamp_micros(1_764_000_000_123_456).unwrap();
        let rows = vec![
            LogRow {
                target_table: "db.t".into(),
                file: "s3://b/a.csv".into(),
                size: Some(42),
                etag: None,
                version: Some("v1".into()),
                copy_id: "c1".into(),
                state: "loading".into(),
                recorded_at: at,
            },
            LogRow {
                target_table: "db.t".into(),
                file: String::new(),
                size: None,
                etag: Some("\"e\"".into()),
                version: None,
                copy_id: "c1".into(),
                state: "committed".into(),
                recorded_at: at,
            },
        ];
        let batch = LogRow::to_batch(&rows).unwrap();
        assert_eq!(
            LogRow::from_batch("icestage.copy_log", &batch).unwrap(),
            rows
        );

        // Reordered, with the text as string views and the size as int:
        // read by name and cast.
        let schema = batch.schema();
        let mut fields = vec![];
        let mut columns: Vec<ArrayRef> = vec![];
        for (field, column) in schema.fields().iter().zip(batch.columns()).rev() {
            let column: ArrayRef = match field.name().as_str() {
                "state" => Arc::new(StringViewArray::from(vec!["loading", "committed"])),
                "size" => Arc::new(Int32Array::from(vec![Some(42), None])),
                _ => Arc::clone(column),
            };
            fields.push(
                field
                    .as_ref()
                    .clone()
                    .with_data_type(column.data_type().clone()),
            );
            columns.push(column);
        }
        let scanned = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        assert_eq!(
            LogRow::from_batch("icestage.copy_log", &scanned).unwrap(),
            rows
        );

        let without = batch.project(&[0, 1, 2, 3, 4, 6, 7]).unwrap();
        let err = LogRow::from_batch("icestage.copy_log", &without)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("table icestage.copy_log has no column 'copy_id'")
                && err.contains("add the column back as Utf8 or drop the table"),
            "{err}"
        );

        // A scan of a changed table: `state` made optional, one NULL in it.
        let relaxed = Arc::new(Schema::new(
            batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns[6] = Arc::new(datafusion::arrow::array::StringArray::from(vec![
            Some("loading"),
            None,
        ]));
        let changed = RecordBatch::try_new(relaxed, columns).unwrap();
        let err = LogRow::from_batch("icestage.copy_log", &changed)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("table icestage.copy_log holds NULL or an unreadable value in column 'state' at row 1"),
            "{err}"
        );
    }
}
