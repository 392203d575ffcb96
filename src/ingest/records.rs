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

use super::compression::compression_type;
use super::options::{Format, SourceOptions};
use super::source::{Access, Location, SourceFile};
use crate::error::{Error, Result};

/// Rows per batch.
const BATCH_ROWS: usize = 8192;
/// The pieces a file's bytes reach the reading thread in.
const CHUNK_BYTES: usize = 1 << 20;
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

/// What a file's rows become the target's with: conforms one batch (the
/// file's columns) given the line each row starts on (`None`: the rows are
/// numbered), answering the rows to load and those rejected.
pub(crate) type Conform =
    Arc<dyn Fn(&RecordBatch, Option<&[i64]>) -> Result<(RecordBatch, Vec<Rejected>)> + Send + Sync>;

/// The rows of a file as they are read: conformed to the target on the
/// reading thread, then sent, with the rows rejected on the way (a wrong
/// field count, bytes that are not UTF-8, a line that is not a JSON
/// object, then what the target refuses).
struct Sink {
    out: mpsc::Sender<Result<(RecordBatch, Vec<Rejected>)>>,
    conform: Conform,
    /// Whether every batch needs its lines (`_source_row`).
    numbered: bool,
}

/// The line each row of a batch starts on.
enum Lines<'a> {
    /// Known row by row (the rows were read one by one).
    Known(&'a [i64]),
    /// Counted from the batch's bytes, only when asked: a batch decoded
    /// whole is numbered when a row of it is rejected or the lines are
    /// loaded.
    Counted {
        bytes: &'a [u8],
        first_line: i64,
        /// Whether the bytes start with the header.
        header: bool,
    },
}

impl Sink {
    /// Conforms and sends `batch`; false when nobody reads any more.
    fn send(&self, batch: &RecordBatch, lines: Lines<'_>, mut rejected: Vec<Rejected>) -> bool {
        let conformed = self.conformed(batch, lines).map(|(rows, more)| {
            rejected.extend(more);
            (rows, rejected)
        });
        self.out.blocking_send(conformed).is_ok()
    }

    fn conformed(
        &self,
        batch: &RecordBatch,
        lines: Lines<'_>,
    ) -> Result<(RecordBatch, Vec<Rejected>)> {
        let rows = batch.num_rows();
        match lines {
            Lines::Known(lines) => (self.conform)(batch, Some(lines)),
            Lines::Counted {
                bytes,
                first_line,
                header,
            } => {
                if !self.numbered {
                    let unnumbered = (self.conform)(batch, None)?;
                    if unnumbered.1.is_empty() {
                        return Ok(unnumbered);
                    }
                }
                let lines = record_lines(bytes, first_line, header);
                (self.conform)(batch, (lines.len() == rows).then_some(lines.as_slice()))
            }
        }
    }

    fn fail(&self, error: Error) {
        let _ = self.out.blocking_send(Err(error));
    }
}

/// Fails on the first of `rejected`, where rows are not rejected one by
/// one (`on_error` other than `continue`, or `read_s3_prefix`).
pub(crate) fn refuse(rejected: &[Rejected]) -> Result<()> {
    match rejected.first() {
        None => Ok(()),
        Some(row) => Err(Error::invalid(format!(
            "{} line {}: {} (the row reads '{}'): correct the row, or load the file with \
             COPY INTO ... WITH (on_error = 'continue') to load the others and list this one \
             in copy_rejects",
            row.file, row.line, row.error, row.record
        ))),
    }
}

/// The line each CSV record in `bytes` starts on, the first byte being on
/// `line`; blank lines hold no record, a quoted field may span lines; with
/// `header`, the first record is not counted.
fn record_lines(bytes: &[u8], mut line: i64, header: bool) -> Vec<i64> {
    let mut lines = vec![];
    let (mut in_quotes, mut at_start, mut skip) = (false, true, header);
    for &byte in bytes {
        if at_start {
            match byte {
                b'\n' => {
                    line += 1;
                    continue;
                }
                b'\r' => continue,
                _ => {}
            }
            at_start = false;
            if !std::mem::take(&mut skip) {
                lines.push(line);
            }
        }
        match byte {
            b'"' => in_quotes = !in_quotes,
            b'\n' => {
                line += 1;
                at_start = !in_quotes;
            }
            _ => {}
        }
    }
    lines
}

/// A [`Read`] over chunks that arrive on a channel: the blocking reader's
/// end of a file's byte stream from a remote store.
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

/// A [`Read`] that fails once more than `left` bytes came through: a
/// decompression bomb stops at the bound.
struct BoundedRead<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for BoundedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(std::io::Error::other(format!(
                "the file decompresses to more than {} (limits.source_inflated_bytes): it is not \
                 loaded; split it, or raise the bound if it is genuine",
                crate::limits::human(crate::limits::current().source_inflated_bytes)
            )));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Batches under construction: one builder per column.
struct Builders {
    schema: SchemaRef,
    columns: Vec<StringBuilder>,
    lines: Vec<i64>,
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
            rejected: vec![],
        }
    }

    fn rows(&self) -> usize {
        self.lines.len() + self.rejected.len()
    }

    /// Sends the rows gathered; false when nobody reads any more.
    fn send(&mut self, sink: &Sink) -> Result<bool> {
        let columns: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef)
            .collect();
        let options = datafusion::arrow::array::RecordBatchOptions::new()
            .with_row_count(Some(self.lines.len()));
        let batch = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        let lines = std::mem::take(&mut self.lines);
        Ok(sink.send(
            &batch,
            Lines::Known(&lines),
            std::mem::take(&mut self.rejected),
        ))
    }
}

/// The decompressed bytes of `file`, for a blocking reader: a task
/// streams them from the store into a bounded channel. A storage error
/// arrives as the reader's error, its kind kept (see [`from_io`]).
fn byte_reader(access: &Access, file: &SourceFile) -> Box<dyn Read + Send> {
    let bound = crate::limits::current().source_inflated_bytes;
    // A local file is read on the reading thread itself.
    if let Location::Local { .. } = access.location {
        let opened = object_store::local::LocalFileSystem::new()
            .path_to_filesystem(&file.meta.location)
            .map_err(std::io::Error::other)
            .and_then(std::fs::File::open)
            .and_then(|f| {
                compression_type(file.compression)
                    .convert_read(std::io::BufReader::with_capacity(CHUNK_BYTES, f))
                    .map_err(std::io::Error::other)
            });
        return match opened {
            Ok(read) => Box::new(BoundedRead {
                inner: read,
                left: bound,
            }),
            Err(e) => Box::new(FailedRead(Some(e))),
        };
    }
    let (chunk_tx, chunk_rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
    let store = Arc::clone(&access.store);
    let location = file.meta.location.clone();
    let compression = compression_type(file.compression);
    let access = access.clone();
    tokio::spawn(async move {
        let failed = |error: Error| Err(std::io::Error::other(error));
        let stream = match store.get(&location).await {
            Ok(got) => got.into_stream(),
            Err(e) => {
                let _ = chunk_tx.send(failed(access.storage_error(e))).await;
                return;
            }
        };
        let stream = stream
            .map(|chunk| chunk.map_err(datafusion::error::DataFusionError::from))
            .boxed();
        let mut stream = match compression.convert_stream(stream) {
            Ok(stream) => stream,
            Err(e) => {
                let _ = chunk_tx.send(failed(e.into())).await;
                return;
            }
        };
        // Stores hand out small chunks (a local file, 8 KiB): they go on
        // in pieces of about 1 MiB, so the reader wakes rarely.
        let mut piece = bytes::BytesMut::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    piece.extend_from_slice(&chunk);
                    if piece.len() < CHUNK_BYTES {
                        continue;
                    }
                    if chunk_tx.send(Ok(piece.split().freeze())).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = chunk_tx
                        .send(Err(std::io::Error::other(Error::from(e))))
                        .await;
                    return;
                }
            }
        }
        if !piece.is_empty() {
            let _ = chunk_tx.send(Ok(piece.freeze())).await;
        }
    });
    Box::new(BoundedRead {
        inner: ChunkReader {
            chunks: chunk_rx,
            current: Bytes::new(),
        },
        left: bound,
    })
}

/// A reader whose first read fails with the error opening it met.
struct FailedRead(Option<std::io::Error>);

impl Read for FailedRead {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Err(self
            .0
            .take()
            .unwrap_or_else(|| std::io::Error::other("the file could not be opened")))
    }
}

/// An error reading `uri`: a storage error as it was raised, anything
/// else named by the file.
fn from_io(uri: &str, error: std::io::Error) -> Error {
    let message = error.to_string();
    match error.into_inner().map(|inner| inner.downcast::<Error>()) {
        Some(Ok(error)) => *error,
        _ => Error::invalid(format!("{uri}: {message}")),
    }
}

/// A CSV reader of records as they are: any field count (a row with the
/// wrong one is rejected, not an error), the header read as a record.
fn csv_reader<R: Read>(reader: R, delimiter: u8) -> csv::Reader<R> {
    csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(reader)
}

/// A CSV reader's error for the file `uri`.
fn csv_error(uri: &str, error: csv::Error) -> Error {
    match error.into_kind() {
        csv::ErrorKind::Io(io) => from_io(uri, io),
        other => Error::invalid(format!("{uri}: not readable as CSV: {other:?}")),
    }
}

/// The column names of the CSV file `file`, without inferring any type:
/// its first record, or `column_<n>` without a header (DataFusion's names).
pub(crate) async fn csv_columns(
    access: &Access,
    file: &SourceFile,
    options: &SourceOptions,
) -> Result<Vec<String>> {
    let reader = byte_reader(access, file);
    let (header, delimiter, uri) = (
        options.header.unwrap_or(true),
        delimiter(options, &file.uri),
        file.uri.clone(),
    );
    tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
        let mut csv = csv_reader(reader, delimiter);
        let mut record = csv::ByteRecord::new();
        if !csv
            .read_byte_record(&mut record)
            .map_err(|e| csv_error(&uri, e))?
        {
            return Err(Error::invalid(format!("{uri}: the file is empty")));
        }
        Ok(record
            .iter()
            .enumerate()
            .map(|(n, name)| match header {
                true => String::from_utf8_lossy(name).trim().to_string(),
                false => format!("column_{}", n + 1),
            })
            .collect())
    })
    .await
    .map_err(|e| Error::internal(format!("reading a CSV header: {e}")))?
}

/// The rows of `file` as text, with the column names `columns` (the
/// names the file's schema was read with: a CSV's header, or `column_<n>`
/// without one; a JSON file's keys).
///
/// A CSV file is decoded a batch at a time with `typed`, the columns'
/// inferred types, as a plain load reads it; a batch that does not decode
/// (a malformed row in it) and the rest of the file are read row by row as
/// text. So a clean file costs little more than a plain load.
pub(crate) fn text_rows(
    access: &Access,
    file: &SourceFile,
    format: Format,
    options: &SourceOptions,
    typed: &datafusion::arrow::datatypes::Schema,
    (conform, numbered): (Conform, bool),
) -> impl Stream<Item = Result<(RecordBatch, Vec<Rejected>)>> + Send + Unpin + 'static {
    let schema: SchemaRef = Arc::new(Schema::new(
        typed
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let typed: SchemaRef = Arc::new(Schema::new(
        typed
            .fields()
            .iter()
            .map(|f| {
                let data_type = match f.data_type() {
                    DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
                    other => other.clone(),
                };
                Field::new(f.name(), data_type, true)
            })
            .collect::<Vec<_>>(),
    ));
    let (rows_tx, rows_rx) = mpsc::channel(2);
    let sink = Sink {
        out: rows_tx,
        conform,
        numbered,
    };
    let reader = byte_reader(access, file);
    let uri = file.uri.clone();
    let csv = (options.header.unwrap_or(true), delimiter(options, &uri));
    tokio::task::spawn_blocking(move || {
        let builders = Builders::new(schema);
        let read = match format {
            Format::Json => read_json(reader, builders, &uri, &sink),
            _ => read_csv_typed(reader, typed, builders, &uri, csv, &sink),
        };
        if let Err(e) = read {
            sink.fail(e);
        }
    });
    futures::stream::unfold(rows_rx, |mut rx| async move {
        rx.recv().await.map(|rows| (rows, rx))
    })
    .boxed()
}

/// The field delimiter of the CSV file `uri`: the option, else a tab for
/// `.tsv` files, else a comma.
pub(crate) fn delimiter(options: &SourceOptions, uri: &str) -> u8 {
    options
        .delimiter
        .unwrap_or(if uri.to_ascii_lowercase().contains(".tsv") {
            b'\t'
        } else {
            b','
        })
}

/// Sends the rows left, if any.
fn flush_rest(builders: &mut Builders, sink: &Sink) -> Result<()> {
    if builders.rows() > 0 {
        builders.send(sink)?;
    }
    Ok(())
}

/// Sends the batch when it is full; false when nobody reads any more.
fn flush_if_full(builders: &mut Builders, sink: &Sink) -> Result<bool> {
    if builders.rows() < BATCH_ROWS {
        return Ok(true);
    }
    builders.send(sink)
}

/// Decodes CSV a batch at a time as `typed`; from the first batch that
/// does not decode, reads the rest row by row ([`read_csv`]).
fn read_csv_typed(
    reader: Box<dyn Read + Send>,
    typed: SchemaRef,
    builders: Builders,
    uri: &str,
    (header, delimiter): (bool, u8),
    sink: &Sink,
) -> Result<()> {
    use std::io::BufRead;
    let decoder = |header: bool| {
        datafusion::arrow::csv::ReaderBuilder::new(Arc::clone(&typed))
            .with_header(header)
            .with_delimiter(delimiter)
            .with_batch_size(BATCH_ROWS)
            .build_decoder()
    };
    let mut reader = std::io::BufReader::with_capacity(1 << 20, reader);
    let mut batch = decoder(header);
    // The bytes of the batch being decoded, the line they start on, and
    // whether they start with the header.
    let mut pending: Vec<u8> = vec![];
    let (mut first_line, mut header_pending) = (1i64, header);
    let row_by_row = |pending: Vec<u8>, rest: Box<dyn Read>, header: bool, first_line: i64| {
        let rest = std::io::Cursor::new(pending).chain(rest);
        read_csv(rest, builders, uri, (header, delimiter), first_line, sink)
    };
    loop {
        let buf = reader.fill_buf().map_err(|e| from_io(uri, e))?;
        let end = buf.is_empty();
        match batch.decode(buf) {
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                reader.consume(n);
            }
            Err(_) => {
                return row_by_row(pending, Box::new(reader), header_pending, first_line);
            }
        }
        if batch.capacity() > 0 && !end {
            continue;
        }
        match batch.flush() {
            Ok(Some(rows)) => {
                let lines = Lines::Counted {
                    bytes: &pending,
                    first_line,
                    header: std::mem::take(&mut header_pending),
                };
                if !sink.send(&rows, lines, vec![]) {
                    return Ok(());
                }
                first_line += memchr::memchr_iter(b'\n', &pending).count() as i64;
                pending.clear();
            }
            Ok(None) => {}
            Err(_) => {
                return row_by_row(pending, Box::new(reader), header_pending, first_line);
            }
        }
        if end {
            return Ok(());
        }
        if !header_pending {
            batch = decoder(false);
        }
    }
}

/// Reads CSV row by row as text, the first byte being on `first_line`.
fn read_csv(
    reader: impl Read,
    mut builders: Builders,
    uri: &str,
    (header, delimiter): (bool, u8),
    first_line: i64,
    sink: &Sink,
) -> Result<()> {
    let width = builders.columns.len();
    let mut csv = csv_reader(reader, delimiter);
    let mut record = csv::ByteRecord::new();
    let mut first = true;
    loop {
        let more = csv
            .read_byte_record(&mut record)
            .map_err(|e| csv_error(uri, e))?;
        if !more {
            break;
        }
        let line = record.position().map_or(0, |p| p.line()) as i64 + first_line - 1;
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
        }
        if !flush_if_full(&mut builders, sink)? {
            return Ok(());
        }
    }
    flush_rest(&mut builders, sink)
}

fn read_json(reader: impl Read, mut builders: Builders, uri: &str, sink: &Sink) -> Result<()> {
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
            .map_err(|e| from_io(uri, e))?;
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
                    .map_err(|e| from_io(uri, e))?;
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
                }
            }
        }
        if !flush_if_full(&mut builders, sink)? {
            return Ok(());
        }
    }
    flush_rest(&mut builders, sink)
}
