//! One source file's rows written as data files of a target: the step
//! every COPY INTO and pipe run takes per file, here or on a cluster's
//! executors (`distribute`). A leaf: it imports no file that calls it.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::DataType;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::options::{Format, SourceOptions};
use super::read::{PrefixTable, Source};
use super::records::{Conform, Rejected, csv_columns, delimiter, refuse, text_rows};
use super::shape::{Plan, RowErrors, extras};
use super::source::{Access, SourceFile};
use crate::catalog::bridge::writer::write_rows;
use crate::catalog::column_names;
use crate::error::{Error, ErrorKind, Result};
use crate::memory::{Churn, Churning};

/// The most rows of one file a copy rejects; past it the whole file fails
/// (a file that is mostly malformed is the wrong file, not bad rows).
pub(crate) const MAX_REJECTED_ROWS: usize = 10_000;

/// What every file of one copy shares.
#[derive(Debug, Clone)]
pub(crate) struct Copying {
    /// The target as rows are written to it (with the columns this copy
    /// adds, when it evolves the schema).
    pub(crate) target: Table,
    pub(crate) access: Access,
    pub(crate) format: Format,
    pub(crate) options: SourceOptions,
    /// The Hive partition columns of the copy's files, typed.
    pub(crate) hive: Vec<(String, DataType)>,
}

/// One file's rows written.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) files: Vec<DataFile>,
    /// The rows rejected (with `on_error = 'continue'`).
    pub(crate) rejected: Vec<Rejected>,
}

/// The rows rejected so far while a file streams.
#[derive(Debug, Clone)]
pub(crate) struct Rejections {
    /// The file's URI.
    uri: String,
    rows: Arc<Mutex<Vec<Rejected>>>,
}

impl Rejections {
    fn new(uri: &str) -> Self {
        Self {
            uri: uri.to_string(),
            rows: Arc::default(),
        }
    }

    /// Adds `more`; fails the file past [`MAX_REJECTED_ROWS`].
    fn gather(&self, more: Vec<Rejected>) -> Result<()> {
        if more.is_empty() {
            return Ok(());
        }
        let mut rows = self.rows.lock().expect("rejections");
        rows.extend(more);
        if rows.len() > MAX_REJECTED_ROWS {
            return Err(Error::invalid(format!(
                "more than {MAX_REJECTED_ROWS} rows of {} are malformed: the file is not \
                 loaded; check it with validation_mode = 'return_errors'",
                self.uri
            )));
        }
        Ok(())
    }

    /// The rows rejected so far, taken.
    pub(crate) fn take(&self) -> Vec<Rejected> {
        std::mem::take(&mut *self.rows.lock().expect("rejections"))
    }
}

/// Opens `file` for a copy, its columns inferred. When a copy looks at
/// rows one by one, a malformed row must not fail the file before it
/// starts: a CSV file whose sample does not infer is opened with its
/// header's names, every column text, and a JSON file with the names of
/// `target`'s columns; the rows then meet the table's types one by one.
pub(crate) async fn open_file(
    access: &Access,
    file: &SourceFile,
    format: Format,
    options: &SourceOptions,
    target: Option<&Table>,
) -> Result<Source> {
    let error = match Source::of_files(access.clone(), vec![file.clone()], format, options).await {
        Ok(source) => return Ok(source),
        Err(error) => error,
    };
    if !RowErrors::of(options).row_by_row() || error.kind() == ErrorKind::Upstream {
        return Err(error);
    }
    let names: Vec<String> = match (format, target) {
        (Format::Csv, _) => csv_columns(access, file, options).await?,
        (Format::Json, Some(target)) => column_names(target),
        _ => return Err(error),
    };
    let mut text = options.clone();
    text.schema = Some(
        names
            .iter()
            .map(|name| format!("\"{}\" VARCHAR", name.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(", "),
    );
    Source::of_files(access.clone(), vec![file.clone()], format, &text).await
}

impl Copying {
    /// Opens `file` as [`open_file`] does, for this copy's target.
    pub(crate) async fn open(&self, file: &SourceFile) -> Result<Source> {
        open_file(
            &self.access,
            file,
            self.format,
            &self.options,
            Some(&self.target),
        )
        .await
    }

    /// The rows of `source` (one file) as the target's, streaming, and
    /// where its rejected rows gather.
    pub(crate) async fn rows(
        &self,
        source: Arc<Source>,
    ) -> Result<(BoxStream<'static, Result<RecordBatch>>, Rejections)> {
        let file = source
            .files
            .first()
            .cloned()
            .ok_or_else(|| Error::internal("a copy of no file"))?;
        let extras = extras(&self.access, &file, &self.options, &self.hive)?;
        let plan = Arc::new(Plan::new(
            &self.target,
            &file,
            &source.schema,
            extras,
            &self.options,
            self.format,
        )?);
        let rejections = Rejections::new(&file.uri);
        let errors = RowErrors::of(&self.options);
        // CSV and JSON rows are numbered by the line they start on, so
        // `_source_row` is read as text even when no row is rejected.
        let stream: BoxStream<'static, Result<RecordBatch>> = if (errors.row_by_row()
            || plan.numbers_rows())
            && matches!(self.format, Format::Csv | Format::Json)
        {
            let rejected = rejections.clone();
            let delimiter =
                (self.format == Format::Csv).then(|| delimiter(&self.options, &file.uri));
            let numbered = plan.numbers_rows();
            let conform: Conform = Arc::new(move |batch: &RecordBatch, lines: Option<&[i64]>| {
                plan.apply(batch, 1, lines, delimiter)
            });
            text_rows(
                &self.access,
                &file,
                self.format,
                &self.options,
                &source.schema,
                (conform, numbered),
            )
            .map(move |rows| {
                let (batch, more) = rows?;
                if !errors.reject {
                    refuse(&more)?;
                }
                rejected.gather(more)?;
                Ok(batch)
            })
            .boxed()
        } else {
            // Row numbers and metadata columns need the file's order:
            // one partition.
            let mut config = SessionConfig::new();
            if errors.row_by_row() || self.options.include_metadata {
                config = config.with_target_partitions(1);
            }
            let session = SessionContext::new_with_config(config);
            session.register_table("source", Arc::new(PrefixTable::new(source)))?;
            let rows = session
                .sql("SELECT * FROM source")
                .await?
                .execute_stream()
                .await?;
            let rejected = rejections.clone();
            let mut next_row = 1i64;
            rows.map(move |batch| {
                let batch = batch?;
                let first = next_row;
                next_row += batch.num_rows() as i64;
                let (batch, more) = plan.apply(&batch, first, None, None)?;
                rejected.gather(more)?;
                Ok(batch)
            })
            .boxed()
        };
        Ok((stream, rejections))
    }

    /// Writes the rows of `source` (one file) as data files of the target,
    /// named from `file_prefix`.
    pub(crate) async fn copy_file(
        &self,
        source: Arc<Source>,
        file_prefix: &str,
    ) -> Result<Written> {
        let _churning = Churning::start(Churn::Loading);
        let (rows, rejections) = self.rows(source).await?;
        let files = write_rows(&self.target, file_prefix, rows.map_err(Error::from)).await?;
        let rejected = rejections.take();
        Ok(Written { files, rejected })
    }
}
