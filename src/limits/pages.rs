//! Parquet pages of a client's file, checked before they are decompressed.
//!
//! The `parquet` crate trusts a page's header: it reserves (and for SNAPPY,
//! LZ4_RAW and the Hadoop LZ4 fills) the uncompressed size the header
//! declares, and it inflates GZIP, BROTLI and framed LZ4 pages until their
//! stream ends, comparing sizes only afterwards. A page of a few bytes can
//! so take gigabytes. [`PageGuard`] sits between a Parquet reader and the
//! bytes it fetches: every column chunk fetched is walked page by page
//! first ([`check_pages`]), and a page that declares more than
//! `limits.page_inflated_bytes`, or whose stream inflates past what its
//! header declares, is refused before the decoder sees it. The walk reads
//! headers only, except for those three codecs, whose pages are inflated
//! once into nothing to count them (their formats give no bound up front).

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::basic::Compression;
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData, RowGroupMetaData};

/// Nesting of Thrift structs and lists a page header may have (real ones
/// have three: header, page header, statistics).
const MAX_DEPTH: u8 = 16;

/// The column chunks of one file, by (start, length): each one's column
/// and how its pages are compressed (several codecs when a malformed footer
/// places two chunks at one range: each is checked).
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    by_range: HashMap<(u64, u64), (String, Vec<Compression>)>,
}

impl Chunks {
    /// The chunks of row groups `groups` in a file of `size` bytes
    /// (`None`: unknown). A chunk at a negative offset or past the end is
    /// refused (the reader would assert on it).
    pub(crate) fn of<'a>(
        groups: impl IntoIterator<Item = &'a RowGroupMetaData>,
        size: Option<u64>,
    ) -> Result<Self, String> {
        let mut chunks = Self::default();
        for group in groups {
            for column in group.columns() {
                let name = column.column_path().string();
                let (start, length) = range(column)?;
                let end = start.checked_add(length);
                if end.is_none() || size.is_some_and(|size| end > Some(size)) {
                    return Err(format!(
                        "its footer places column '{name}' past the end of the file"
                    ));
                }
                let entry = chunks
                    .by_range
                    .entry((start, length))
                    .or_insert_with(|| (name, vec![]));
                if !entry.1.contains(&column.compression()) {
                    entry.1.push(column.compression());
                }
            }
        }
        Ok(chunks)
    }

    /// Checks the bytes fetched for `range` of the file at `path`.
    fn check(&self, path: &str, range: &Range<u64>, bytes: &[u8], bound: u64) -> ParquetResult<()> {
        let refuse = |why: String| ParquetError::General(format!("'{path}' is refused: {why}"));
        let length = range.end.saturating_sub(range.start);
        match self.by_range.get(&(range.start, length)) {
            Some((column, codecs)) => check_pages(bytes, range.start, codecs, bound)
                .map_err(|why| refuse(format!("column '{column}': {why}"))),
            // The footer, the page index and bloom filters lie outside every
            // chunk; a read that starts inside one would decode pages the
            // walk never saw.
            None if self
                .by_range
                .keys()
                .any(|(start, length)| *start < range.end && range.start < start + length) =>
            {
                Err(refuse(format!(
                    "a read of bytes {}..{} is not one whole column chunk (icestage reads staged \
                     files chunk by chunk)",
                    range.start, range.end
                )))
            }
            None => Ok(()),
        }
    }
}

/// Where `column`'s chunk lies in its file: (start, length), as the
/// `parquet` crate reads it.
pub(crate) fn range(column: &ColumnChunkMetaData) -> Result<(u64, u64), String> {
    let start = column
        .dictionary_page_offset()
        .unwrap_or_else(|| column.data_page_offset());
    match (
        u64::try_from(start),
        u64::try_from(column.compressed_size()),
    ) {
        (Ok(start), Ok(length)) => Ok((start, length)),
        _ => Err(format!(
            "its footer places column '{}' at a negative offset or length",
            column.column_path().string()
        )),
    }
}

/// An [`AsyncFileReader`] whose column chunks are checked page by page
/// before the reader decodes them (see the module's documentation).
pub(crate) struct PageGuard<R> {
    inner: R,
    path: String,
    /// Known from the start, or from the first metadata read.
    chunks: Option<Chunks>,
    bound: u64,
}

impl<R: AsyncFileReader> PageGuard<R> {
    /// Guards `inner`, the file at `path` (named in refusals), whose
    /// chunks are already known.
    pub(crate) fn new(inner: R, path: &str, chunks: Chunks) -> Self {
        Self {
            chunks: Some(chunks),
            ..Self::unread(inner, path)
        }
    }

    /// Guards `inner`, whose chunks are learned from the metadata it reads
    /// (a read of chunk bytes before it is refused).
    pub(crate) fn unread(inner: R, path: &str) -> Self {
        Self {
            inner,
            path: path.to_string(),
            chunks: None,
            bound: super::current().page_inflated_bytes,
        }
    }

    fn check(&self, range: &Range<u64>, bytes: &[u8]) -> ParquetResult<()> {
        match &self.chunks {
            Some(chunks) => chunks.check(&self.path, range, bytes, self.bound),
            // Before the metadata only the footer is read, from the end.
            None => Ok(()),
        }
    }
}

impl<R: AsyncFileReader> AsyncFileReader for PageGuard<R> {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, ParquetResult<Bytes>> {
        async move {
            let bytes = self.inner.get_bytes(range.clone()).await?;
            self.check(&range, &bytes)?;
            Ok(bytes)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, ParquetResult<Vec<Bytes>>> {
        async move {
            let fetched = self.inner.get_byte_ranges(ranges.clone()).await?;
            for (range, bytes) in ranges.iter().zip(&fetched) {
                self.check(range, bytes)?;
            }
            Ok(fetched)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, ParquetResult<Arc<ParquetMetaData>>> {
        async move {
            let metadata = self.inner.get_metadata(options).await?;
            if self.chunks.is_none() {
                let chunks = Chunks::of(metadata.row_groups(), None)
                    .map_err(|why| ParquetError::General(format!("'{}': {why}", self.path)))?;
                self.chunks = Some(chunks);
            }
            Ok(metadata)
        }
        .boxed()
    }
}

/// Walks the pages of one column chunk (`bytes`, starting at byte `start`
/// of its file) and refuses a page that would decompress to more than
/// `bound` bytes, or to more than its header declares, under any of
/// `codecs`. Headers are parsed here, never by the `parquet` crate, so a
/// malformed one is an error too.
pub(crate) fn check_pages(
    bytes: &[u8],
    start: u64,
    codecs: &[Compression],
    bound: u64,
) -> Result<(), String> {
    let compressed = codecs.iter().any(|c| *c != Compression::UNCOMPRESSED);
    let mut at = 0usize;
    while at < bytes.len() {
        let offset = start + at as u64;
        let (header, data) = PageHeader::locate(bytes, at, start)?;
        if compressed && header.compressed_data {
            if header.uncompressed as u64 > bound {
                return Err(format!(
                    "the page at byte {offset} declares {} bytes once decompressed, more than \
                     the {} a page may hold (limits.page_inflated_bytes)",
                    header.uncompressed,
                    super::human(bound)
                ));
            }
            let levels = header.levels.min(header.compressed);
            let expected = header.uncompressed.saturating_sub(header.levels) as u64;
            for codec in codecs {
                if inflated_size(*codec, &bytes[data.start + levels..data.end], expected) > expected
                {
                    return Err(format!(
                        "the page at byte {offset} inflates past the {expected} bytes its header \
                         declares ({})",
                        name(*codec)
                    ));
                }
            }
        }
        at = data.end;
    }
    Ok(())
}

/// How many bytes `data` inflates to under `codec`, counted until one
/// past `expected` or until the stream ends or turns out malformed (the
/// `parquet` crate's decoder would have produced as much before failing);
/// 0 for the codecs that crate decodes into a buffer of the declared size.
/// For LZ4 the crate tries the bounded Hadoop layout first and the frame
/// layout counted here only when that fails.
fn inflated_size(codec: Compression, data: &[u8], expected: u64) -> u64 {
    let mut reader: Box<dyn Read + '_> = match codec {
        Compression::GZIP(_) => Box::new(flate2::read::MultiGzDecoder::new(data)),
        Compression::BROTLI(_) => Box::new(brotli_decompressor::Decompressor::new(data, 4096)),
        Compression::LZ4 => Box::new(lz4_flex::frame::FrameDecoder::new(data)),
        _ => return 0,
    };
    let mut buffer = vec![0u8; 64 << 10];
    let mut total = 0u64;
    while total <= expected {
        match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    total
}

fn name(codec: Compression) -> &'static str {
    match codec {
        Compression::GZIP(_) => "GZIP",
        Compression::BROTLI(_) => "BROTLI",
        Compression::LZ4 => "LZ4",
        Compression::ZSTD(_) => "ZSTD",
        Compression::SNAPPY => "SNAPPY",
        Compression::LZ4_RAW => "LZ4_RAW",
        Compression::LZO => "LZO",
        Compression::UNCOMPRESSED => "UNCOMPRESSED",
    }
}

/// A Thrift `PageHeader`: what the walk checks, and what a page reader
/// needs to hand the page to a decoder (see [`PageHeader::locate`]).
#[derive(Debug, Default)]
pub(crate) struct PageHeader {
    /// Parquet's page type: [`DATA_PAGE`], [`INDEX_PAGE`],
    /// [`DICTIONARY_PAGE`] or [`DATA_PAGE_V2`] (others are refused by the
    /// reader, not the walk).
    pub(crate) kind: i32,
    pub(crate) uncompressed: usize,
    pub(crate) compressed: usize,
    /// A v2 data page's level bytes, stored uncompressed before its data.
    pub(crate) levels: usize,
    /// False for a v2 data page stored uncompressed.
    pub(crate) compressed_data: bool,
    /// The data or dictionary page's own header, `None` when it lacks one.
    pub(crate) page: Option<PageFields>,
}

/// Page types, as Parquet's Thrift enum numbers them.
pub(crate) const DATA_PAGE: i32 = 0;
pub(crate) const INDEX_PAGE: i32 = 1;
pub(crate) const DICTIONARY_PAGE: i32 = 2;
pub(crate) const DATA_PAGE_V2: i32 = 3;

/// The fields of a data page's (v1 or v2) or a dictionary page's header,
/// as Thrift numbers them; those a page type lacks stay 0.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PageFields {
    pub(crate) values: i32,
    pub(crate) encoding: i32,
    pub(crate) definition_encoding: i32,
    pub(crate) repetition_encoding: i32,
    pub(crate) nulls: i32,
    pub(crate) rows: i32,
    pub(crate) definition_bytes: i32,
    pub(crate) repetition_bytes: i32,
    pub(crate) sorted: bool,
}

impl PageHeader {
    /// The header of the page at byte `at` of `chunk` (a column chunk that
    /// starts at byte `start` of its file, for the errors) and where the
    /// page's stored data lies in `chunk`, which must hold all of it.
    pub(crate) fn locate(
        chunk: &[u8],
        at: usize,
        start: u64,
    ) -> Result<(Self, std::ops::Range<usize>), String> {
        let offset = start + at as u64;
        let mut input = Input {
            bytes: chunk.get(at..).unwrap_or_default(),
            at: 0,
        };
        let header = Self::read(&mut input)
            .map_err(|why| format!("the page header at byte {offset} is malformed ({why})"))?;
        let data = at + input.at;
        let end = data
            .checked_add(header.compressed)
            .filter(|end| *end <= chunk.len())
            .ok_or_else(|| {
                format!(
                    "the page at byte {offset} claims {} bytes, past the end of its column chunk",
                    header.compressed
                )
            })?;
        Ok((header, data..end))
    }

    fn read(input: &mut Input<'_>) -> Result<Self, String> {
        let mut header = Self {
            compressed_data: true,
            ..Self::default()
        };
        let (mut uncompressed, mut compressed) = (None, None);
        input.fields(0, |input, id, kind| match (id, kind) {
            (1, I32) => {
                header.kind = input.i32()?;
                Ok(())
            }
            (2, I32) => {
                uncompressed = Some(size(input.i32()?)?);
                Ok(())
            }
            (3, I32) => {
                compressed = Some(size(input.i32()?)?);
                Ok(())
            }
            // A v1 data page's and a dictionary page's headers.
            (5 | 7, STRUCT) => {
                let mut page = PageFields::default();
                input.fields(1, |input, field, kind| match (id, field, kind) {
                    (_, 1, I32) => input.i32().map(|v| page.values = v),
                    (_, 2, I32) => input.i32().map(|v| page.encoding = v),
                    (5, 3, I32) => input.i32().map(|v| page.definition_encoding = v),
                    (5, 4, I32) => input.i32().map(|v| page.repetition_encoding = v),
                    (7, 3, TRUE) => {
                        page.sorted = true;
                        Ok(())
                    }
                    (_, _, kind) => input.skip(kind, 1, false),
                })?;
                header.page = Some(page);
                Ok(())
            }
            (8, STRUCT) => {
                let mut page = PageFields::default();
                input.fields(1, |input, id, kind| match (id, kind) {
                    (1, I32) => input.i32().map(|v| page.values = v),
                    (2, I32) => input.i32().map(|v| page.nulls = v),
                    (3, I32) => input.i32().map(|v| page.rows = v),
                    (4, I32) => input.i32().map(|v| page.encoding = v),
                    (5, I32) => input.i32().map(|v| page.definition_bytes = v),
                    (6, I32) => input.i32().map(|v| page.repetition_bytes = v),
                    (7, TRUE) => Ok(()),
                    (7, FALSE) => {
                        header.compressed_data = false;
                        Ok(())
                    }
                    (_, kind) => input.skip(kind, 1, false),
                })?;
                header.levels = size(page.definition_bytes)?
                    .checked_add(size(page.repetition_bytes)?)
                    .ok_or("level lengths overflow")?;
                header.page = Some(page);
                Ok(())
            }
            (2 | 3 | 8, _) => Err(format!("field {id} has the wrong type")),
            (_, kind) => input.skip(kind, 0, false),
        })?;
        header.uncompressed = uncompressed.ok_or("no uncompressed size")?;
        header.compressed = compressed.ok_or("no compressed size")?;
        if header.levels > header.uncompressed {
            return Err("its level lengths exceed its uncompressed size".into());
        }
        Ok(header)
    }
}

fn size(value: i32) -> Result<usize, String> {
    usize::try_from(value).map_err(|_| format!("negative size {value}"))
}

// Thrift compact protocol type codes.
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const I32: u8 = 5;
const STRUCT: u8 = 12;

/// Thrift compact-protocol bytes, read without allocating: every length is
/// checked against what is left before it is skipped.
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.at).ok_or("it ends early")?;
        self.at += 1;
        Ok(byte)
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err("it ends early".into());
        }
        self.at += n as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift.min(63);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint runs past 10 bytes".into())
    }

    fn i32(&mut self) -> Result<i32, String> {
        let raw = self.varint()?;
        let value = (raw >> 1) as i64 ^ -((raw & 1) as i64);
        i32::try_from(value).map_err(|_| "an i32 out of range".into())
    }

    /// Reads a struct's fields, handing each (id, type) to `field`, which
    /// reads or skips its value.
    fn fields(
        &mut self,
        depth: u8,
        mut field: impl FnMut(&mut Self, i16, u8) -> Result<(), String>,
    ) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("it nests too deep".into());
        }
        let mut id: i16 = 0;
        loop {
            let byte = self.byte()?;
            if byte == 0 {
                return Ok(());
            }
            let delta = (byte >> 4) as i16;
            id = if delta == 0 {
                i16::try_from(self.i32()?).map_err(|_| "a field id out of range")?
            } else {
                id.checked_add(delta).ok_or("a field id out of range")?
            };
            field(self, id, byte & 0x0f)?;
        }
    }

    /// Skips one value of type `kind` (a boolean takes a byte of its own
    /// only inside a collection).
    fn skip(&mut self, kind: u8, depth: u8, in_collection: bool) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("it nests too deep".into());
        }
        match kind {
            TRUE | FALSE if in_collection => self.advance(1),
            TRUE | FALSE => Ok(()),
            3 => self.advance(1),
            4..=6 => self.varint().map(|_| ()),
            7 => self.advance(8),
            8 => {
                let length = self.varint()?;
                self.advance(length)
            }
            9 | 10 => {
                let head = self.byte()?;
                let count = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.elements(count, &[head & 0x0f], depth)
            }
            11 => {
                let count = self.varint()?;
                if count == 0 {
                    return Ok(());
                }
                let kinds = self.byte()?;
                self.elements(count, &[kinds >> 4, kinds & 0x0f], depth)
            }
            STRUCT => self.fields(depth + 1, |input, _, kind| {
                input.skip(kind, depth + 1, false)
            }),
            other => Err(format!("unknown type {other}")),
        }
    }

    fn elements(&mut self, count: u64, kinds: &[u8], depth: u8) -> Result<(), String> {
        // Every element takes at least a byte: a count past what is left is
        // malformed, and says so before a long loop.
        if count > (self.bytes.len() - self.at) as u64 {
            return Err("a collection claims more elements than bytes".into());
        }
        for _ in 0..count {
            for kind in kinds {
                self.skip(*kind, depth + 1, true)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A page header: type, sizes, and a v2 header when `levels` is given.
    fn header(uncompressed: i32, compressed: i32, levels: Option<(i32, bool)>) -> Vec<u8> {
        fn zigzag(v: i32) -> Vec<u8> {
            let mut n = ((v << 1) ^ (v >> 31)) as u32;
            let mut out = vec![];
            loop {
                if n < 0x80 {
                    out.push(n as u8);
                    return out;
                }
                out.push((n as u8 & 0x7f) | 0x80);
                n >>= 7;
            }
        }
        let mut out = vec![0x15];
        out.extend(zigzag(if levels.is_some() { 3 } else { 0 }));
        out.push(0x15);
        out.extend(zigzag(uncompressed));
        out.push(0x15);
        out.extend(zigzag(compressed));
        if let Some((levels, compressed)) = levels {
            // field 8 (delta 5 from 3): struct with 5 and 6 (i32) and 7 (bool)
            out.push(0x5c);
            out.push(0x55);
            out.extend(zigzag(levels));
            out.push(0x15);
            out.extend(zigzag(0));
            out.push(if compressed { 0x11 } else { 0x12 });
            out.push(0);
        }
        out.push(0);
        out
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(vec![], flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn gzip_page(declared: usize, actual: usize) -> Vec<u8> {
        let body = gzip(&vec![7u8; actual]);
        let mut page = header(declared as i32, body.len() as i32, None);
        page.extend(body);
        page
    }

    fn gzip_codec() -> Compression {
        Compression::GZIP(Default::default())
    }

    #[test]
    fn pages_within_their_declared_sizes_pass() {
        let mut chunk = gzip_page(1000, 1000);
        chunk.extend(gzip_page(5, 5));
        assert_eq!(check_pages(&chunk, 4, &[gzip_codec()], 1 << 20), Ok(()));
    }

    #[test]
    fn a_page_that_inflates_past_its_header_is_refused_after_one_byte_more() {
        let chunk = gzip_page(100, 50 << 20);
        let error = check_pages(&chunk, 4, &[gzip_codec()], 1 << 20).unwrap_err();
        assert!(error.contains("inflates past the 100 bytes"), "{error}");
    }

    #[test]
    fn a_page_declaring_more_than_the_bound_is_refused_before_any_decoding() {
        let chunk = {
            let mut page = header(i32::MAX, 2, None);
            page.extend([0, 0]);
            page
        };
        let error = check_pages(&chunk, 4, &[Compression::SNAPPY], 256 << 20).unwrap_err();
        assert!(error.contains("page_inflated_bytes"), "{error}");
        // Stored uncompressed it is decoded as is: nothing to refuse.
        assert_eq!(
            check_pages(&chunk, 4, &[Compression::UNCOMPRESSED], 1),
            Ok(())
        );
    }

    #[test]
    fn a_v2_page_counts_its_levels_apart_and_may_be_stored_uncompressed() {
        let body = gzip(&[1u8; 60]);
        let mut page = header(64, 4 + body.len() as i32, Some((4, true)));
        page.extend([9, 9, 9, 9]);
        page.extend(&body);
        assert_eq!(check_pages(&page, 0, &[gzip_codec()], 1 << 20), Ok(()));
        let mut raw = header(i32::MAX, 3, Some((1, false)));
        raw.extend([1, 2, 3]);
        assert_eq!(check_pages(&raw, 0, &[gzip_codec()], 1 << 20), Ok(()));
    }

    #[test]
    fn malformed_headers_are_errors_not_panics() {
        for bytes in [
            vec![0x15],
            vec![0x15, 0x02, 0x19, 0xf0],
            vec![0x1c; 64],
            header(10, 1 << 30, None),
            header(-1, 0, None),
            vec![0x19, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x0c],
        ] {
            assert!(
                check_pages(&bytes, 0, &[gzip_codec()], 1 << 20).is_err(),
                "{bytes:?}"
            );
        }
    }
}
