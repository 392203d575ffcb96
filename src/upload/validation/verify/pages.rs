//! Row groups whose pages are ZSTD or stored uncompressed, decoded with
//! each page's bytes written once.
//!
//! The `parquet` crate's ZSTD codec decompresses a page into a buffer of
//! its own and then copies it into the page's: every decoded byte is
//! written twice and takes two fresh allocations (a tenth of a promotion's
//! time, much of it the kernel's page faults). Verification reads the
//! column chunks itself anyway, so for the codecs Iceberg writers use (ZSTD,
//! PyIceberg's and Spark's default, and none) it hands the decoder pages it
//! decompressed straight into their final buffers: [`Group`] is the
//! crate's [`RowGroups`] over chunks already fetched and checked (see
//! [`crate::limits::pages`]), [`Pages`] its page reader. Files of other
//! codecs take the crate's own reader.

use std::collections::VecDeque;
use std::io::Cursor;

use bytes::Bytes;
use parquet::arrow::arrow_reader::RowGroups;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{Page, PageIterator, PageMetadata, PageReader};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData, RowGroupMetaData};

use crate::limits::pages::{
    DATA_PAGE, DATA_PAGE_V2, DICTIONARY_PAGE, INDEX_PAGE, PageFields, PageHeader, range,
};

/// Whether every column chunk of `groups` is ZSTD or uncompressed.
pub(super) fn decodes(metadata: &ParquetMetaData, groups: &[usize]) -> bool {
    groups.iter().all(|g| {
        metadata.row_groups().get(*g).is_some_and(|group| {
            group.columns().iter().all(|c| {
                matches!(
                    c.compression(),
                    Compression::ZSTD(_) | Compression::UNCOMPRESSED
                )
            })
        })
    })
}

/// Row groups `groups` of a file, with each one's column chunks fetched:
/// `chunks[g][c]` holds column `c` of the `g`th of `groups`.
pub(super) struct Group<'a> {
    pub(super) metadata: &'a ParquetMetaData,
    pub(super) groups: Vec<usize>,
    pub(super) chunks: Vec<Vec<Bytes>>,
}

impl RowGroups for Group<'_> {
    fn num_rows(&self) -> usize {
        self.row_groups()
            .map(|g| g.num_rows().max(0) as usize)
            .sum()
    }

    fn column_chunks(&self, column: usize) -> Result<Box<dyn PageIterator>> {
        let readers: Vec<Result<Box<dyn PageReader>>> = self
            .chunks
            .iter()
            .zip(&self.groups)
            .map(|(chunks, group)| {
                let chunk = chunks.get(column).cloned().ok_or_else(|| {
                    ParquetError::General(format!("row group {group} has no column {column}"))
                })?;
                let metadata = self.metadata.row_group(*group).column(column);
                Ok(Box::new(Pages::new(chunk, metadata)?) as Box<dyn PageReader>)
            })
            .collect();
        Ok(Box::new(Readers(readers.into())))
    }

    fn row_groups(&self) -> Box<dyn Iterator<Item = &RowGroupMetaData> + '_> {
        Box::new(self.groups.iter().map(|g| self.metadata.row_group(*g)))
    }

    fn metadata(&self) -> &ParquetMetaData {
        self.metadata
    }
}

/// One column's page readers, a row group after another.
struct Readers(VecDeque<Result<Box<dyn PageReader>>>);

impl Iterator for Readers {
    type Item = Result<Box<dyn PageReader>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.pop_front()
    }
}

impl PageIterator for Readers {}

/// The pages of one column chunk, decompressed one at a time as the
/// decoder asks for them.
pub(super) struct Pages {
    chunk: Bytes,
    /// Where the chunk starts in its file (errors name a page's byte).
    start: u64,
    at: usize,
    /// `None` when the chunk is stored uncompressed.
    zstd: Option<zstd::bulk::Decompressor<'static>>,
}

impl Pages {
    /// The pages of `column`'s chunk, whose bytes are `chunk`.
    pub(super) fn new(chunk: Bytes, column: &ColumnChunkMetaData) -> Result<Self> {
        let zstd = (column.compression() != Compression::UNCOMPRESSED)
            .then(zstd::bulk::Decompressor::new)
            .transpose()
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        let start = range(column).map_err(malformed)?.0;
        Ok(Self {
            chunk,
            start,
            at: 0,
            zstd,
        })
    }

    /// The next page's header (index pages passed over) and where its data
    /// lies in the chunk, without moving past it.
    fn header(&mut self) -> Result<Option<(PageHeader, std::ops::Range<usize>)>> {
        loop {
            if self.at >= self.chunk.len() {
                return Ok(None);
            }
            let (header, data) =
                PageHeader::locate(&self.chunk, self.at, self.start).map_err(malformed)?;
            if header.kind == INDEX_PAGE {
                self.at = data.end;
                continue;
            }
            return Ok(Some((header, data)));
        }
    }

    /// `data` (a page's stored bytes) as the decoder reads it.
    fn decompress(&mut self, header: &PageHeader, data: Bytes) -> Result<Bytes> {
        let Some(zstd) = self.zstd.as_mut().filter(|_| header.compressed_data) else {
            return Ok(data);
        };
        let levels = header.levels;
        if levels > data.len() {
            return Err(malformed("a page's level bytes run past its data"));
        }
        let mut out = Vec::with_capacity(header.uncompressed);
        out.extend_from_slice(&data[..levels]);
        // A page of no non-NULL value may hold no frame at all.
        if header.uncompressed > levels {
            let mut cursor = Cursor::new(out);
            cursor.set_position(levels as u64);
            zstd.decompress_to_buffer(&data[levels..], &mut cursor)
                .map_err(|e| malformed(format!("a page does not decompress ({e})")))?;
            out = cursor.into_inner();
        }
        if out.len() != header.uncompressed {
            return Err(malformed(format!(
                "a page decompresses to {} bytes, not the {} its header declares",
                out.len(),
                header.uncompressed
            )));
        }
        Ok(Bytes::from(out))
    }
}

impl Iterator for Pages {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Pages {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        let Some((header, data)) = self.header()? else {
            return Ok(None);
        };
        self.at = data.end;
        let fields = header
            .page
            .ok_or_else(|| malformed("a page has no header of its type"))?;
        let buf = self.decompress(&header, self.chunk.slice(data))?;
        page(header.kind, fields, header.compressed_data, buf).map(Some)
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        let Some((header, _)) = self.header()? else {
            return Ok(None);
        };
        let fields = header.page.unwrap_or_default();
        Ok(Some(match header.kind {
            DICTIONARY_PAGE => PageMetadata {
                num_rows: None,
                num_levels: None,
                is_dict: true,
            },
            DATA_PAGE_V2 => PageMetadata {
                num_rows: Some(count(fields.rows)? as usize),
                num_levels: Some(count(fields.values)? as usize),
                is_dict: false,
            },
            _ => PageMetadata {
                num_rows: None,
                num_levels: Some(count(fields.values)? as usize),
                is_dict: false,
            },
        }))
    }

    fn skip_next_page(&mut self) -> Result<()> {
        if let Some((_, data)) = self.header()? {
            self.at = data.end;
        }
        Ok(())
    }
}

/// A page of type `kind` from its header's `fields` and decoded bytes.
fn page(kind: i32, fields: PageFields, compressed: bool, buf: Bytes) -> Result<Page> {
    Ok(match kind {
        DICTIONARY_PAGE => Page::DictionaryPage {
            buf,
            num_values: count(fields.values)?,
            encoding: encoding(fields.encoding)?,
            is_sorted: fields.sorted,
        },
        DATA_PAGE => Page::DataPage {
            buf,
            num_values: count(fields.values)?,
            encoding: encoding(fields.encoding)?,
            def_level_encoding: encoding(fields.definition_encoding)?,
            rep_level_encoding: encoding(fields.repetition_encoding)?,
            statistics: None,
        },
        DATA_PAGE_V2 => Page::DataPageV2 {
            buf,
            num_values: count(fields.values)?,
            encoding: encoding(fields.encoding)?,
            num_nulls: count(fields.nulls)?,
            num_rows: count(fields.rows)?,
            def_levels_byte_len: count(fields.definition_bytes)?,
            rep_levels_byte_len: count(fields.repetition_bytes)?,
            is_compressed: compressed,
            statistics: None,
        },
        other => return Err(malformed(format!("a page has the unknown type {other}"))),
    })
}

fn count(value: i32) -> Result<u32> {
    u32::try_from(value).map_err(|_| malformed(format!("a page header counts {value}")))
}

/// Parquet's encoding numbered `value` in its Thrift enum.
fn encoding(value: i32) -> Result<Encoding> {
    #[allow(deprecated)]
    Ok(match value {
        0 => Encoding::PLAIN,
        2 => Encoding::PLAIN_DICTIONARY,
        3 => Encoding::RLE,
        4 => Encoding::BIT_PACKED,
        5 => Encoding::DELTA_BINARY_PACKED,
        6 => Encoding::DELTA_LENGTH_BYTE_ARRAY,
        7 => Encoding::DELTA_BYTE_ARRAY,
        8 => Encoding::RLE_DICTIONARY,
        9 => Encoding::BYTE_STREAM_SPLIT,
        other => {
            return Err(malformed(format!(
                "a page has the unknown encoding {other}"
            )));
        }
    })
}

fn malformed(why: impl Into<String>) -> ParquetError {
    ParquetError::General(why.into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int64Array, ListArray, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
    use parquet::arrow::{ProjectionMask, parquet_to_arrow_field_levels};
    use parquet::basic::ZstdLevel;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::{WriterProperties, WriterVersion};

    use super::*;

    /// 5,000 rows in row groups of 2,000: a long column, a string column
    /// with NULLs and repeats (dictionary pages), a list column.
    fn file(compression: Compression, version: WriterVersion) -> Bytes {
        let rows = 5_000;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new_list("tags", Field::new_list_field(DataType::Int32, true), true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i * 7 - 900))),
            Arc::new(StringArray::from_iter((0..rows).map(|i| {
                (i % 11 != 0).then(|| format!("name {} of the rows", i % 37))
            }))),
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
                (0..rows).map(|i| {
                    (i % 5 != 0).then(|| (0..i % 4).map(|j| (j != 2).then_some(j as i32)))
                }),
            )),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
        let properties = WriterProperties::builder()
            .set_compression(compression)
            .set_writer_version(version)
            .set_max_row_group_row_count(Some(2_000))
            .set_data_page_row_count_limit(300)
            .set_write_batch_size(100)
            .build();
        let mut out = vec![];
        let mut writer = ArrowWriter::try_new(&mut out, schema, Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        Bytes::from(out)
    }

    /// The file's row groups `groups` read through [`Group`], with each
    /// chunk passed through `damage` first.
    fn through_pages(
        bytes: &Bytes,
        groups: Vec<usize>,
        damage: impl Fn(Bytes) -> Bytes,
    ) -> Result<Vec<RecordBatch>> {
        let metadata = ParquetMetaDataReader::new().parse_and_finish(bytes)?;
        let chunks = groups
            .iter()
            .map(|g| {
                metadata
                    .row_group(*g)
                    .columns()
                    .iter()
                    .map(|c| {
                        let (start, length) = range(c).unwrap();
                        damage(bytes.slice(start as usize..(start + length) as usize))
                    })
                    .collect()
            })
            .collect();
        let group = Group {
            metadata: &metadata,
            groups,
            chunks,
        };
        let levels = parquet_to_arrow_field_levels(
            metadata.file_metadata().schema_descr(),
            ProjectionMask::all(),
            None,
        )?;
        ParquetRecordBatchReader::try_new_with_row_groups(&levels, &group, 1_024, None)?
            .map(|b| b.map_err(|e| ParquetError::General(e.to_string())))
            .collect()
    }

    fn through_the_crate(bytes: &Bytes, groups: Vec<usize>) -> Vec<RecordBatch> {
        ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
            .unwrap()
            .with_row_groups(groups)
            .with_batch_size(1_024)
            .build()
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn pages_decode_as_the_crate_decodes_them() {
        for compression in [
            Compression::ZSTD(ZstdLevel::default()),
            Compression::UNCOMPRESSED,
        ] {
            for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
                let bytes = file(compression, version);
                let metadata = ParquetMetaDataReader::new()
                    .parse_and_finish(&bytes)
                    .unwrap();
                assert_eq!(metadata.num_row_groups(), 3);
                assert!(decodes(&metadata, &[0, 1, 2]));
                for groups in [vec![0], vec![2], vec![0, 1, 2]] {
                    let ours = through_pages(&bytes, groups.clone(), |b| b).unwrap();
                    let theirs = through_the_crate(&bytes, groups.clone());
                    assert_eq!(ours, theirs, "{compression:?} {version:?} {groups:?}");
                    let rows: usize = ours.iter().map(|b| b.num_rows()).sum();
                    let expected: i64 = groups
                        .iter()
                        .map(|g| metadata.row_group(*g).num_rows())
                        .sum();
                    assert_eq!(rows as i64, expected);
                }
            }
        }
    }

    #[test]
    fn other_codecs_are_left_to_the_crate() {
        let bytes = file(Compression::SNAPPY, WriterVersion::PARQUET_1_0);
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .unwrap();
        assert!(!decodes(&metadata, &[0]));
        // A row group the file does not have is not decoded here either.
        let zstd = file(
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_1_0,
        );
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&zstd)
            .unwrap();
        assert!(!decodes(&metadata, &[0, 3]));
    }

    #[test]
    fn damaged_chunks_are_errors_not_panics() {
        let bytes = file(
            Compression::ZSTD(ZstdLevel::default()),
            WriterVersion::PARQUET_2_0,
        );
        let cut = through_pages(&bytes, vec![0], |b| b.slice(..b.len() - 1)).unwrap_err();
        assert!(
            cut.to_string().contains("past the end of its column chunk"),
            "{cut}"
        );
        let garbage =
            through_pages(&bytes, vec![0], |b| Bytes::from(vec![0x1c; b.len()])).unwrap_err();
        assert!(garbage.to_string().contains("malformed"), "{garbage}");
        // Every byte of a chunk's second half flipped in turn would take
        // long; every 97th, each alone, must fail cleanly or decode.
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .unwrap();
        let (_, length) = range(metadata.row_group(0).column(0)).unwrap();
        for at in (0..length as usize).step_by(97) {
            let _ = through_pages(&bytes, vec![0], |b| {
                if b.len() != length as usize {
                    return b;
                }
                let mut flipped = b.to_vec();
                flipped[at] ^= 0x5a;
                Bytes::from(flipped)
            });
        }
    }
}
