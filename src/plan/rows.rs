//! Result rows of commands, built value by value against the command's schema.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

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
            Error::invalid(format!(
                "internal: column '{}' of type {} got {v:?}",
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
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish())
            }
            other => {
                return Err(Error::invalid(format!(
                    "internal: result column '{}' has unsupported type {other}",
                    field.name()
                )));
            }
        };
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}
