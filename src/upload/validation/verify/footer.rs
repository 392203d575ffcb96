//! A staged file's footer: read within its bound, decoded without a panic
//! reaching the caller, and compared with the target by field id.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef as ArrowSchemaRef;
use iceberg::arrow::arrow_schema_to_schema;
use iceberg::io::FileIO;
use iceberg::spec::Schema;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};

use super::plan::Plan;
use crate::error::{Error, Result};
use crate::upload::validation::drift::{Matching, schema_drift};

/// Reads the footer of `path`: its actual size and the Arrow view of it.
///
/// The footer's length (the file's last 8 bytes say it) is checked against
/// [`crate::limits::ReadLimits::footer_bytes`] before the footer is read: a
/// client's file cannot make verification read or decode more than that.
pub(crate) async fn open(io: &FileIO, path: &str) -> Result<(u64, ArrowReaderMetadata)> {
    use iceberg::io::FileRead;
    let input = io.new_input(path)?;
    let meta = input.metadata().await?;
    let size = meta.size;
    let file = input.reader().await?;
    if size < 8 {
        return Err(unreadable(path, "it is shorter than a Parquet footer"));
    }
    let tail = file.read(size - 8..size).await?;
    if &tail[4..] != b"PAR1" {
        return Err(unreadable(path, "it does not end in Parquet's magic bytes"));
    }
    let length = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let bound = crate::limits::current().footer_bytes;
    if length > bound {
        return Err(unreadable(
            path,
            format!(
                "its footer holds {length} bytes, more than the {} a staged file's footer may \
                 hold (limits.footer_bytes)",
                crate::limits::human(bound)
            ),
        ));
    }
    if length + 8 > size {
        return Err(unreadable(
            path,
            format!("its footer claims {length} bytes, more than the file holds"),
        ));
    }
    let footer = file.read(size - 8 - length..size - 8).await?;
    let metadata = decode_footer(&footer, path)?;
    // Decode strings and binaries with 32-bit offsets, as the target's Arrow
    // schema has them (writers such as PyIceberg store 64-bit ones), so the
    // batches need no copy to conform.
    let hint = decode_hint(&metadata);
    if hint == *metadata.schema() {
        return Ok((size, metadata));
    }
    // Nothing is shared across the unwind: the metadata is only read.
    let narrowed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ArrowReaderMetadata::try_new(
            Arc::clone(metadata.metadata()),
            ArrowReaderOptions::new().with_schema(hint),
        )
    }))
    .map_err(|_| unreadable(path, "its footer is malformed"))?
    .map_err(|e| unreadable(path, e))?;
    Ok((size, narrowed))
}

/// A Parquet footer's Thrift `bytes` (of the file at `path`) decoded into
/// the Arrow view verification reads with. The `parquet` crate panics on
/// some malformed footers (an unknown physical type, an integer of an
/// impossible width: found by the fuzz harness); such a panic is an error
/// naming the file here, never a dead verification task.
pub(crate) fn decode_footer(bytes: &[u8], path: &str) -> Result<ArrowReaderMetadata> {
    let decoded = std::panic::catch_unwind(|| {
        let metadata = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(bytes)?;
        ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
    });
    match decoded {
        Ok(Ok(metadata)) => Ok(metadata),
        Ok(Err(e)) => Err(unreadable(path, e)),
        Err(_) => Err(unreadable(path, "its footer is malformed")),
    }
}

/// How to decode the file: top-level strings and binaries with 32-bit
/// offsets, as the target's Arrow schema has them (writers such as PyIceberg
/// store 64-bit ones), and those the file dictionary-encodes as dictionaries,
/// so that decoding copies no string and bounds are taken over the
/// dictionary (bounds that hold every value; a dictionary entry no row uses
/// only widens them).
fn decode_hint(footer: &ArrowReaderMetadata) -> ArrowSchemaRef {
    use datafusion::arrow::datatypes::DataType;
    let schema = footer.schema();
    let parquet = footer.metadata();
    let dictionary_encoded = |name: &str| {
        let descriptor = parquet.file_metadata().schema_descr();
        let Some(leaf) = (0..descriptor.num_columns()).find(|i| {
            let path = descriptor.column(*i).path().parts().to_vec();
            path.len() == 1 && path[0] == name
        }) else {
            return false;
        };
        // Every data page dictionary-encoded (a chunk that fell back to
        // plain pages would have to be hashed into a dictionary).
        !parquet.row_groups().is_empty()
            && parquet.row_groups().iter().all(|g| {
                let chunk = g.column(leaf);
                chunk.dictionary_page_offset().is_some()
                    && chunk.page_encoding_stats_mask().is_some_and(|mask| {
                        mask.is_only(parquet::basic::Encoding::PLAIN_DICTIONARY)
                            || mask.is_only(parquet::basic::Encoding::RLE_DICTIONARY)
                    })
            })
    };
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| {
            let plain = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
                DataType::Binary | DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
                _ => return Arc::clone(f),
            };
            let kind = if dictionary_encoded(f.name()) {
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(plain))
            } else if plain == DataType::Utf8 {
                // Views point into the decoded pages instead of copying
                // every string.
                DataType::Utf8View
            } else {
                plain
            };
            Arc::new(f.as_ref().clone().with_data_type(kind))
        })
        .collect();
    Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

pub(super) fn unreadable(path: &str, error: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "staged file {path} is not a readable Parquet file ({error}): the upload cannot be \
         promoted; write the rows again in a new upload"
    ))
}

/// The columns of the file's own schema that differ from the target's:
/// compared by field id, types only (NULLs are counted from the values).
pub(super) fn footer_drift(path: &str, footer: &ArrowReaderMetadata, plan: &Plan) -> Vec<String> {
    let schema = match arrow_schema_to_schema(footer.schema()) {
        Ok(schema) => schema,
        Err(e) => {
            return vec![format!(
                "staged file {path} has no Iceberg field ids in its Parquet schema ({}): write it \
                 with an Iceberg client",
                e.message()
            )];
        }
    };
    // Compare as the staging table's own schema would (required-ness
    // aside): the target's columns under the staged ids.
    let relabeled = match relabel(&plan.target, &plan.staged_ids, &schema) {
        Ok(schema) => schema,
        Err(e) => return vec![format!("staged file {path}: {e}")],
    };
    schema_drift(&relabeled, &plan.target, Matching::ById)
        .into_iter()
        .filter(|line| !line.contains(" is required in the target but optional"))
        .map(|line| format!("staged file {path}: {line}"))
        .collect()
}

/// The file's `schema` with its top-level columns renumbered from the
/// staged ids to the target's, so it compares with the target by id.
fn relabel(target: &Schema, staged_ids: &[i32], schema: &Schema) -> Result<Schema> {
    let mut fields = vec![];
    for field in schema.as_struct().fields() {
        let id = target
            .as_struct()
            .fields()
            .iter()
            .zip(staged_ids)
            .find(|(_, staged)| **staged == field.id)
            .map(|(t, _)| t.id)
            .unwrap_or(field.id);
        let mut copy = field.as_ref().clone();
        copy.id = id;
        fields.push(Arc::new(copy));
    }
    Ok(Schema::builder().with_fields(fields).build()?)
}
