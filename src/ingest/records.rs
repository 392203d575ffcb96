//! Row-by-row reading of a CSV or newline-delimited JSON file: every
//! value as text, each row with its line number and its raw record, so that
//! a malformed row can be rejected alone (`on_error = 'continue'`), its bad
//! values rescued (`schema_evolution = 'rescue'`) or reported
//! (`validation_mode`), while the rest of the file loads.
//!
//! The file streams from its store (decompressed on the way) into a reader
//! on a blocking thread; batches of rows come back through a bounded
//! channel, so memory holds a few batches, not the file.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::{Stream, StreamExt};
use object_store::ObjectStoreExt;
use tokio::sync::mpsc;

use super::codec::compression_type;
use super::options::{Format, SourceOptions};
use super::source::{Access, SourceFile};
use crate::error::{Error, Result};

/// Rows per batch.
const BATCH_ROWS: usize = 8192;
/// The most bytes of a raw record kept in a rejection.
pub(crate) const RECORD_BYTES: usize = 4096;
/// The longest line or record read: past it the row is rejected unread.
const MAX_RECORD_BYTES: usize = 64 << 20;

/// One row that could not be loaded as it stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rejected {
    /// The source file's URI.
    pub(crate) file: String,
    /// The line (CSV, JSON) or row number (Parquet, Avro), from 1.
    pub(crate) line: i64,
    /// The column at fault, when one is.
    pub(crate) column: Option<String>,
    pub(crate) error: String,
    /// The record as read (cut to [`RECORD_BYTES`]).
    pub(crate) record: String,
}

/// `text` cut to at most [`RECORD_BYTES`] on a character boundary.
pub(crate) fn cut(text: &str) -> String {
    if text.len() <= RECORD_BYTES {
        return text.to_string();
    }
    let mut end = RECORD_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Rows read as text: the values (one Utf8 column per source column), the
/// line each row starts on, its raw record, and the rows rejected before
/// any value was looked at (a wrong field count, bytes that are not UTF-8,
/// a line that is not a JSON object).
#[derive(Debug)]
pub(crate) struct TextRows {
    pub(crate) batch: RecordBatch,
    pub(crate) lines: Vec<i64>,
    pub(crate) records: Vec<String>,
    pub(crate) rejected: Vec<Rejected>,
}

/// A [`Read`] over chunks that arrive on a channel: the blocking reader's
/// end of the file's byte stream.
struct ChunkReader {
    chunks: mpsc::Receiver<std::io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Batches under construction: one builder per column.
struct Builders {
    schema: SchemaRef,
    columns: Vec<StringBuilder>,
    lines: Vec<i64>,
    records: Vec<String>,
    rejected: Vec<Rejected>,
}

impl Builders {
    fn new(schema: SchemaRef) -> Self {
        let columns = (0..schema.fields().len())
            .map(|_| StringBuilder::new())
            .collect();
        Self {
            schema,
            columns,
            lines: vec![],
            records: vec![],
            rejected: vec![],
        }
    }

    fn rows(&self) -> usize {
        self.lines.len() + self.rejected.len()
    }

    fn take(&mut self) -> Result<TextRows> {
        let columns: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef)
            .collect();
        let options = datafusion::arrow::array::RecordBatchOptions::new()
            .with_row_count(Some(self.lines.len()));
        Ok(TextRows {
            batch: RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?,
            lines: std::mem::take(&mut self.lines),
            records: std::mem::take(&mut self.records),
            rejected: std::mem::take(&mut self.rejected),
        })
    }
}

/// The rows of `file` as text, with the column names `columns` (the
/// names the file's schema was read with: a CSV's header, or `column_<n>`
/// without one; a JSON file's keys).
pub(crate) fn text_rows(
    access: &Access,
    file: &SourceFile,
    format: Format,
    options: &SourceOptions,
    columns: Vec<String>,
) -> impl Stream<Item = Result<TextRows>> + Send + Unpin + 'static {
    let schema: SchemaRef = Arc::new(Schema::new(
        columns
            .iter()
            .map(|name| Field::new(name, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let (chunk_tx, chunk_rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
    let (rows_tx, rows_rx) = mpsc::channel::<Result<TextRows>>(2);
    let store = Arc::clone(&access.store);
    let location = file.meta.location.clone();
    let compression = compression_type(file.compression);
    let storage_error = {
        let access = access.clone();
        move |e: object_store::Error| access.storage_error(e)
    };
    let feed_errors = rows_tx.clone();
    tokio::spawn(async move {
        let stream = match store.get(&location).await {
            Ok(got) => got.into_stream(),
            Err(e) => {
                let _ = feed_errors.send(Err(storage_error(e))).await;
                return;
            }
        };
        let stream = stream
            .map(|chunk| chunk.map_err(datafusion::error::DataFusionError::from))
            .boxed();
        let mut stream = match compression.convert_stream(stream) {
            Ok(stream) => stream,
            Err(e) => {
                let _ = feed_errors.send(Err(e.into())).await;
                return;
            }
        };
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| std::io::Error::other(e.to_string()));
            let failed = chunk.is_err();
            if chunk_tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });
    let uri = file.uri.clone();
    let csv = (
        options.header.unwrap_or(true),
        options
            .delimiter
            .unwrap_or(if uri.to_ascii_lowercase().contains(".tsv") {
                b'\t'
            } else {
                b','
            }),
    );
    tokio::task::spawn_blocking(move || {
        let reader = ChunkReader {
            chunks: chunk_rx,
            current: Bytes::new(),
        };
        let bound = crate::limits::current().source_inflated_bytes;
        let reader = reader.take(bound);
        let builders = Builders::new(schema);
        let read = match format {
            Format::Json => read_json(reader, builders, &uri, &rows_tx),
            _ => read_csv(reader, builders, &uri, csv, &rows_tx),
        };
        if let Err(e) = read {
            let _ = rows_tx.blocking_send(Err(e));
        }
    });
    futures::stream::unfold(rows_rx, |mut rx| async move {
        rx.recv().await.map(|rows| (rows, rx))
    })
    .boxed()
}

/// Sends the batch when it is full; false when nobody reads any more.
fn flush_if_full(builders: &mut Builders, out: &mpsc::Sender<Result<TextRows>>) -> Result<bool> {
    if builders.rows() < BATCH_ROWS {
        return Ok(true);
    }
    Ok(out.blocking_send(builders.take()).is_ok())
}

fn read_csv(
    reader: impl Read,
    mut builders: Builders,
    uri: &str,
    (header, delimiter): (bool, u8),
    out: &mpsc::Sender<Result<TextRows>>,
) -> Result<()> {
    let width = builders.columns.len();
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(reader);
    let mut record = csv::ByteRecord::new();
    let mut first = true;
    loop {
        let more = csv
            .read_byte_record(&mut record)
            .map_err(|e| match e.kind() {
                csv::ErrorKind::Io(io) => Error::invalid(format!("{uri}: {io}")),
                _ => Error::invalid(format!("{uri}: not readable as CSV: {e}")),
            })?;
        if !more {
            break;
        }
        let line = record.position().map_or(0, |p| p.line()) as i64;
        if std::mem::take(&mut first) && header {
            continue;
        }
        let raw = || {
            let fields: Vec<String> = record
                .iter()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            cut(&fields.join(&(delimiter as char).to_string()))
        };
        let reject = |error: String| Rejected {
            file: uri.to_string(),
            line,
            column: None,
            error,
            record: raw(),
        };
        if record.len() != width {
            // A blank line is no row.
            if record.len() == 1 && record[0].is_empty() {
                continue;
            }
            builders.rejected.push(reject(format!(
                "expected {width} field(s), found {}",
                record.len()
            )));
        } else if record.as_slice().len() > MAX_RECORD_BYTES {
            builders.rejected.push(reject(format!(
                "a record of {} is longer than the {} a row may take",
                crate::limits::human(record.as_slice().len() as u64),
                crate::limits::human(MAX_RECORD_BYTES as u64)
            )));
        } else if let Err(e) = std::str::from_utf8(record.as_slice()) {
            builders
                .rejected
                .push(reject(format!("the record is not UTF-8 text ({e})")));
        } else {
            for (builder, field) in builders.columns.iter_mut().zip(record.iter()) {
                if field.is_empty() {
                    builder.append_null();
                } else {
                    // Checked as UTF-8 above, as a whole.
                    builder.append_value(std::str::from_utf8(field).unwrap_or_default());
                }
            }
            builders.lines.push(line);
            builders.records.push(raw());
        }
        if !flush_if_full(&mut builders, out)? {
            return Ok(());
        }
    }
    if builders.rows() > 0 {
        let _ = out.blocking_send(builders.take());
    }
    Ok(())
}

fn read_json(
    reader: impl Read,
    mut builders: Builders,
    uri: &str,
    out: &mpsc::Sender<Result<TextRows>>,
) -> Result<()> {
    use std::io::BufRead;
    let names: Vec<String> = builders
        .schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, reader);
    let mut buffer = vec![];
    let mut line = 0i64;
    loop {
        buffer.clear();
        let n = (&mut reader)
            .take(MAX_RECORD_BYTES as u64 + 1)
            .read_until(b'\n', &mut buffer)
            .map_err(|e| Error::invalid(format!("{uri}: {e}")))?;
        if n == 0 {
            break;
        }
        line += 1;
        let reject = |error: String, text: &str| Rejected {
            file: uri.to_string(),
            line,
            column: None,
            error,
            record: cut(text),
        };
        if buffer.len() > MAX_RECORD_BYTES {
            let head = String::from_utf8_lossy(&buffer[..RECORD_BYTES]).into_owned();
            builders.rejected.push(reject(
                format!(
                    "a line longer than {} is not read",
                    crate::limits::human(MAX_RECORD_BYTES as u64)
                ),
                &head,
            ));
            // The rest of the line goes unread.
            while !buffer.ends_with(b"\n") {
                buffer.clear();
                let n = (&mut reader)
                    .take(1 << 20)
                    .read_until(b'\n', &mut buffer)
                    .map_err(|e| Error::invalid(format!("{uri}: {e}")))?;
                if n == 0 {
                    break;
                }
            }
        } else {
            let text = String::from_utf8_lossy(&buffer);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
                Err(e) => builders
                    .rejected
                    .push(reject(format!("not a JSON object: {e}"), text)),
                Ok(object) => {
                    for (builder, name) in builders.columns.iter_mut().zip(&names) {
                        match object.get(name) {
                            None | Some(serde_json::Value::Null) => builder.append_null(),
                            Some(serde_json::Value::String(s)) => builder.append_value(s),
                            Some(other) => builder.append_value(other.to_string()),
                        }
                    }
                    builders.lines.push(line);
                    builders.records.push(cut(text));
                }
            }
        }
        if !flush_if_full(&mut builders, out)? {
            return Ok(());
        }
    }
    if builders.rows() > 0 {
        let _ = out.blocking_send(builders.take());
    }
    Ok(())
}
