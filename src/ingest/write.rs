//! One source file's rows written as data files of a target: the step
//! every COPY INTO and pipe run takes per file, here or on a cluster's
//! executors (`distribute`). A leaf: it imports no file that calls it.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;
use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::read::{PrefixTable, Source};
use crate::catalog::writer::write_rows;
use crate::error::{Error, Result};

/// The staged rows of `source` as the target's columns, checked by name.
fn projection(target: &Table, source: &Source) -> Result<Vec<String>> {
    let schema = target.metadata().current_schema();
    let mut select = vec![];
    let mut missing = vec![];
    for field in schema.as_struct().fields() {
        let quoted = format!("\"{}\"", field.name.replace('"', "\"\""));
        let arrow_type = iceberg::arrow::type_to_arrow_type(&field.field_type)?;
        if source.schema.field_with_name(&field.name).is_ok() {
            select.push(format!(
                "CAST({quoted} AS {}) AS {quoted}",
                sql_type(&arrow_type)?
            ));
        } else if field.required {
            missing.push(field.name.clone());
        } else {
            select.push(format!(
                "CAST(NULL AS {}) AS {quoted}",
                sql_type(&arrow_type)?
            ));
        }
    }
    if !missing.is_empty() {
        return Err(Error::invalid(format!(
            "the files have no column {} that {} requires: the files' columns are {}",
            missing.join(", "),
            target.identifier(),
            source
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let extra: Vec<String> = source
        .schema
        .fields()
        .iter()
        .filter(|f| schema.field_by_name(f.name()).is_none())
        .map(|f| f.name().clone())
        .collect();
    if !extra.is_empty() {
        return Err(Error::invalid(format!(
            "the files have column(s) {} that {} lacks: add them to the table, or load into a new table",
            extra.join(", "),
            target.identifier()
        )));
    }
    Ok(select)
}

/// The SQL spelling DataFusion casts to for an Arrow type of an Iceberg column.
fn sql_type(data_type: &DataType) -> Result<String> {
    Ok(match data_type {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "REAL".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p}, {s})"),
        DataType::Date32 => "DATE".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".into(),
        DataType::Binary | DataType::LargeBinary => "BYTEA".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE".into(),
        other => {
            return Err(Error::NotSupported(format!(
                "COPY INTO cannot load columns of type {other} yet: load into a table without them"
            )));
        }
    })
}

/// Writes the rows of `source` as data files of `target`.
pub(crate) async fn copy_file(
    target: &Table,
    source: Arc<Source>,
    file_prefix: &str,
) -> Result<Vec<DataFile>> {
    let select = projection(target, &source)?;
    let session = SessionContext::new();
    session.register_table("source", Arc::new(PrefixTable::new(source)))?;
    let frame = session
        .sql(&format!("SELECT {} FROM source", select.join(", ")))
        .await?;
    let stream = frame.execute_stream().await?.map_err(Error::from);
    write_rows(target, file_prefix, stream).await
}
