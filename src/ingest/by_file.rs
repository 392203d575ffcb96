//! `read_s3_prefix` read file by file, for what differs from one file to
//! the next: columns put together by name (`union_by_name`), a path's
//! `key=value` folders (`hive_partitioning`) and each row's file, row and
//! time (`include_metadata`). The columns mean what they mean in
//! `COPY INTO`: both take them from [`shape::extras`](super::shape::extras).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::error::Result as DFResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::options::{Format, SourceOptions};
use super::read::{PrefixTable, Source, vocabulary};
use super::records::{Conform, refuse, text_rows};
use super::shape::{Extra, extras, hive_columns};
use super::source::{Access, SourceFile, select};
use crate::error::{Error, Result};

/// Whether `options` ask for reading file by file.
pub(crate) fn wanted(options: &SourceOptions) -> bool {
    options.union_by_name || options.hive_partitioning || options.include_metadata
}

/// The files `uri` and `options` select, as one table whose partitions
/// are the files, each with its own columns past the shared ones.
pub(crate) async fn table(uri: &str, options: &SourceOptions) -> Result<StreamingTable> {
    let access = Access::open(uri, options).await?;
    let (files, format) = select(&access, uri, options).await?;
    let hive = if options.hive_partitioning {
        hive_columns(&access, &files)
    } else {
        vec![]
    };
    let mut sources = vec![];
    if options.union_by_name {
        for file in &files {
            let one = Source::of_files(access.clone(), vec![file.clone()], format, options).await?;
            sources.push(Arc::new(one));
        }
    } else {
        let shared = Source::of_files(access.clone(), files.clone(), format, options).await?;
        for file in &files {
            let schema = Some(Arc::clone(&shared.schema));
            let one =
                Source::of_files_as(access.clone(), vec![file.clone()], format, options, schema)
                    .await?;
            sources.push(Arc::new(one));
        }
    }
    let own = columns(&sources);
    let mut schema = Arc::new(Schema::new(own.clone()));
    let mut partitions: Vec<Arc<dyn PartitionStream>> = vec![];
    for (source, file) in sources.into_iter().zip(files) {
        let extras = extras(&access, &file, options, &hive)?;
        if let Some((field, _)) = extras
            .iter()
            .find(|(field, _)| own.iter().any(|f| f.name() == field.name()))
        {
            return Err(Error::invalid(format!(
                "{}: the column {} is both in the files and one read_s3_prefix adds: rename \
                 the files' column, or leave out hive_partitioning / include_metadata",
                file.uri,
                field.name()
            )));
        }
        schema = Arc::new(Schema::new(
            own.iter()
                .cloned()
                .chain(extras.iter().map(|(f, _)| Arc::clone(f)))
                .collect::<Vec<_>>(),
        ));
        partitions.push(Arc::new(FileRows {
            access: access.clone(),
            file,
            format,
            options: options.clone(),
            source,
            schema: Arc::clone(&schema),
            own: own.len(),
            extras: extras.into_iter().map(|(_, e)| e).collect(),
        }));
    }
    Ok(StreamingTable::try_new(schema, partitions)?)
}

/// The columns of every file, in the order they first appear; a column
/// several files hold is read as the type they share (the wider integer,
/// a float for mixed numbers, else text), as DuckDB's `union_by_name`.
fn columns(sources: &[Arc<Source>]) -> Vec<FieldRef> {
    let mut columns: Vec<(String, DataType)> = vec![];
    for source in sources {
        for field in source.schema.fields() {
            match columns.iter_mut().find(|(name, _)| name == field.name()) {
                Some((_, data_type)) => *data_type = common_type(data_type, field.data_type()),
                None => columns.push((field.name().clone(), field.data_type().clone())),
            }
        }
    }
    columns
        .into_iter()
        .map(|(name, data_type)| Arc::new(Field::new(name, data_type, true)))
        .collect()
}

/// The type two files' columns of one name are read as together.
fn common_type(a: &DataType, b: &DataType) -> DataType {
    match (vocabulary(a), vocabulary(b)) {
        _ if a == b => a.clone(),
        ("integer", "integer") => DataType::Int64,
        ("integer" | "float", "integer" | "float") => DataType::Float64,
        _ => DataType::Utf8,
    }
}

/// One file's rows with the table's columns.
#[derive(Debug, Clone)]
struct FileRows {
    access: Access,
    file: SourceFile,
    format: Format,
    options: SourceOptions,
    /// The file, read alone.
    source: Arc<Source>,
    schema: SchemaRef,
    /// How many of `schema`'s columns come from the files.
    own: usize,
    extras: Vec<Extra>,
}

impl FileRows {
    /// `batch` (the file's columns) with the table's: each cast to the
    /// shared type, NULL where the file lacks it, then the extras; rows
    /// start on `lines` (CSV and JSON read as text) or count from
    /// `first_row`.
    fn conform(
        &self,
        batch: &RecordBatch,
        first_row: i64,
        lines: Option<&[i64]>,
    ) -> Result<RecordBatch> {
        let rows = batch.num_rows();
        let strict = CastOptions {
            safe: false,
            ..Default::default()
        };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for field in self.schema.fields().iter().take(self.own) {
            columns.push(match batch.column_by_name(field.name()) {
                None => new_null_array(field.data_type(), rows),
                Some(column) if column.data_type() == field.data_type() => Arc::clone(column),
                Some(column) => {
                    cast_with_options(column, field.data_type(), &strict).map_err(|e| {
                        Error::invalid(format!(
                            "{}: column {} is not a {}: {e}",
                            self.file.uri,
                            field.name(),
                            field.data_type()
                        ))
                    })?
                }
            });
        }
        for extra in &self.extras {
            columns.push(match extra {
                Extra::Constant(value) => value.to_array_of_size(rows)?,
                Extra::Row => Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|row| lines.map_or(first_row + row as i64, |l| l[row])),
                )),
            });
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// The file's rows, in the file's order. CSV and JSON numbered by
    /// line are read as `COPY INTO` reads them row by row; anything else
    /// through the listing table, in one partition.
    async fn rows(self) -> Result<BoxStream<'static, DFResult<RecordBatch>>> {
        let numbered = self.extras.iter().any(|e| matches!(e, Extra::Row));
        if numbered && matches!(self.format, Format::Csv | Format::Json) {
            let this = self.clone();
            let conform: Conform = Arc::new(move |batch: &RecordBatch, lines: Option<&[i64]>| {
                Ok((this.conform(batch, 1, lines)?, vec![]))
            });
            let rows = text_rows(
                &self.access,
                &self.file,
                self.format,
                &self.options,
                &self.source.schema,
                (conform, true),
            );
            return Ok(rows
                .map(|rows| {
                    let (batch, rejected) = rows?;
                    refuse(&rejected)?;
                    Ok(batch)
                })
                .boxed());
        }
        let session =
            SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        session.register_table(
            "source",
            Arc::new(PrefixTable::new(Arc::clone(&self.source))),
        )?;
        let rows = session
            .sql("SELECT * FROM source")
            .await?
            .execute_stream()
            .await?;
        let mut next_row = 1i64;
        Ok(rows
            .map(move |batch| {
                let batch = batch?;
                let first = next_row;
                next_row += batch.num_rows() as i64;
                Ok(self.conform(&batch, first, None)?)
            })
            .boxed())
    }
}

impl PartitionStream for FileRows {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let rows = futures::stream::once(self.clone().rows())
            .map_err(datafusion::error::DataFusionError::from)
            .try_flatten();
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            rows,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_share_the_wider_type() {
        assert_eq!(
            common_type(&DataType::Int32, &DataType::Int64),
            DataType::Int64
        );
        assert_eq!(
            common_type(&DataType::Int64, &DataType::Float32),
            DataType::Float64
        );
        assert_eq!(
            common_type(&DataType::Int64, &DataType::Utf8View),
            DataType::Utf8
        );
        assert_eq!(
            common_type(&DataType::Date32, &DataType::Date32),
            DataType::Date32
        );
    }
}
