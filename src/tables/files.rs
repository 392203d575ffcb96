//! File references: a column declared `FILE` holds, in each row, a file
//! that lands with the row. It is stored as the Iceberg struct
//! `(uri string, size long, sha256 string, content_type string)`, which any
//! engine reads as a plain struct, and named in the table property
//! `icestage.file-columns` (like CHECK and UNIQUE, the rule lives with the
//! table). An upload's rows point at files under its staging table's
//! `files/` folder; promotion verifies each one (where it lies, its size,
//! its SHA-256, its content type), copies it into the target's `files/`
//! folder and rewrites the row's `uri` (see `upload::files`).

use datafusion::arrow::array::{Array, AsArray, StructArray};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::sql::sqlparser::ast::{
    ColumnDef, DataType as SqlType, Ident, StructBracketKind, StructField,
};
use iceberg::io::FileIO;
use iceberg::spec::{PrimitiveType, Schema, Type};
use iceberg::table::Table;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Table property naming a table's file columns, comma-separated.
pub const PROP_FILE_COLUMNS: &str = "icestage.file-columns";

/// The fields of a file reference, in order, with their Iceberg types.
pub(crate) const FILE_FIELDS: [(&str, PrimitiveType); 4] = [
    ("uri", PrimitiveType::String),
    ("size", PrimitiveType::Long),
    ("sha256", PrimitiveType::String),
    ("content_type", PrimitiveType::String),
];

pub(crate) use crate::catalog::confine::files_folder;
use crate::catalog::confine::local;

/// Bytes read (and written) per request while hashing or copying a file.
const CHUNK: u64 = 8 * 1024 * 1024;
/// Bytes read at a time from a local file.
const LOCAL_CHUNK: usize = 1024 * 1024;
/// Files checked at once.
pub(crate) const PARALLEL: usize = 4;
/// Distinct files one upload may reference (or one download include): each is remembered while the
/// rows are read, so the count is bounded.
pub(crate) const MAX_FILES: usize = 100_000;

/// The file columns `table` declares (none when it declares none).
pub(crate) fn file_columns(table: &Table) -> Result<Vec<String>> {
    let Some(stored) = table.metadata().properties().get(PROP_FILE_COLUMNS) else {
        return Ok(vec![]);
    };
    let columns = parse(stored);
    check_columns(table.metadata().current_schema(), &columns).map_err(|e| {
        Error::invalid(format!(
            "{} of {} is '{stored}', which no longer fits its schema: {}",
            PROP_FILE_COLUMNS,
            table.identifier(),
            e.user_message()
        ))
    })?;
    Ok(columns)
}

/// The columns a [`PROP_FILE_COLUMNS`] value names.
pub(crate) fn parse(stored: &str) -> Vec<String> {
    stored
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

/// Each of `columns` is a top-level struct of exactly [`FILE_FIELDS`].
pub(crate) fn check_columns(schema: &Schema, columns: &[String]) -> Result<()> {
    let expected = || {
        FILE_FIELDS
            .iter()
            .map(|(name, ty)| format!("{name} {ty}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for column in columns {
        let field = schema
            .as_struct()
            .fields()
            .iter()
            .find(|f| f.name == *column)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "file column '{column}' is not a top-level column of the table: declare it \
                     in CREATE TABLE as {column} FILE"
                ))
            })?;
        let Type::Struct(inner) = field.field_type.as_ref() else {
            return Err(Error::invalid(format!(
                "file column '{column}' is {}, not a file reference struct ({}): declare it \
                 as {column} FILE",
                field.field_type,
                expected()
            )));
        };
        let fits = inner.fields().len() == FILE_FIELDS.len()
            && inner
                .fields()
                .iter()
                .zip(FILE_FIELDS)
                .all(|(f, (name, ty))| f.name == name && *f.field_type == Type::Primitive(ty));
        if !fits {
            return Err(Error::invalid(format!(
                "file column '{column}' is {}, not a file reference struct ({}): declare it \
                 as {column} FILE",
                field.field_type,
                expected()
            )));
        }
    }
    Ok(())
}

/// The top-level columns of `schema` that are file references (structs of
/// exactly the file reference's fields).
pub(crate) fn reference_columns(schema: &Schema) -> Vec<String> {
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .filter(|name| check_columns(schema, std::slice::from_ref(name)).is_ok())
        .collect()
}

/// Rewrites each column of `columns` declared `FILE` into the struct a file
/// reference is stored as; the names of those columns, to be recorded
/// under [`PROP_FILE_COLUMNS`].
pub(crate) fn declare(columns: &mut [ColumnDef]) -> Vec<String> {
    let mut declared = vec![];
    for column in columns {
        let is_file = matches!(
            &column.data_type,
            SqlType::Custom(name, modifiers)
                if modifiers.is_empty() && name.to_string().eq_ignore_ascii_case("file")
        );
        if is_file {
            column.data_type = reference_type();
            declared.push(column.name.value.clone());
        }
    }
    declared
}

/// The SQL type of a file reference.
fn reference_type() -> SqlType {
    let field = |name: &str, field_type: SqlType| StructField {
        field_name: Some(Ident::new(name)),
        field_type,
        options: None,
    };
    SqlType::Struct(
        vec![
            field("uri", SqlType::Varchar(None)),
            field("size", SqlType::BigInt(None)),
            field("sha256", SqlType::Varchar(None)),
            field("content_type", SqlType::Varchar(None)),
        ],
        StructBracketKind::AngleBrackets,
    )
}

/// The property value recording `declared` (plus any a `WITH` gave).
pub(crate) fn property_value(given: Option<&String>, declared: &[String]) -> Option<String> {
    let mut columns = given.map(|g| parse(g)).unwrap_or_default();
    for column in declared {
        if !columns.contains(column) {
            columns.push(column.clone());
        }
    }
    (!columns.is_empty()).then(|| columns.join(","))
}

/// The SHA-256 of the `size` bytes at `path` (hex) and the kind its first
/// bytes show, read in [`CHUNK`] pieces (a local file in [`LOCAL_CHUNK`]
/// pieces into one buffer, on a blocking thread).
pub(crate) async fn hash(
    io: &FileIO,
    path: &str,
    size: u64,
) -> Result<(String, Option<&'static str>)> {
    if let Some(file) = local(path) {
        let file = file.to_string();
        return tokio::task::spawn_blocking(move || hash_local(&file))
            .await
            .map_err(|e| Error::internal(format!("hashing {path}: {e}")))?;
    }
    let reader = io.new_input(path)?.reader().await?;
    let mut hasher = Sha256::new();
    let mut kind = None;
    let mut offset = 0;
    while offset < size {
        let end = (offset + CHUNK).min(size);
        let bytes = reader.read(offset..end).await?;
        if offset == 0 {
            kind = sniff(&bytes);
        }
        hasher.update(&bytes);
        offset = end;
    }
    Ok((hex::encode(hasher.finalize()), kind))
}

/// [`hash`] of a local file.
fn hash_local(path: &str) -> Result<(String, Option<&'static str>)> {
    use std::io::Read;
    let failed = |e: std::io::Error| Error::internal(format!("reading {path}: {e}"));
    let mut file = std::fs::File::open(path).map_err(failed)?;
    let mut buffer = vec![0u8; LOCAL_CHUNK];
    let mut hasher = Sha256::new();
    let mut kind = None;
    let mut first = true;
    loop {
        let read = file.read(&mut buffer).map_err(failed)?;
        if read == 0 {
            break;
        }
        if first {
            kind = sniff(&buffer[..read]);
            first = false;
        }
        hasher.update(&buffer[..read]);
    }
    Ok((hex::encode(hasher.finalize()), kind))
}

/// Copies local file `from` to `to` (its folder made as needed) through a
/// temporary name, so a copy that exists is whole; the bytes copied. With
/// `shared`, other writers may copy to `to` at once (two partitions of a
/// download), so the temporary is named apart from theirs; otherwise it is
/// `<to>.part`, which the one writer (a promotion holds its claim) replaces
/// when it runs again after being killed.
pub(crate) fn copy_local(from: &str, to: &str, shared: bool) -> Result<u64> {
    let failed = |e: std::io::Error| Error::internal(format!("copying {from} to {to}: {e}"));
    if let Some(folder) = std::path::Path::new(to).parent() {
        std::fs::create_dir_all(folder).map_err(failed)?;
    }
    let part = if shared {
        format!("{to}.part-{}", uuid::Uuid::new_v4().simple())
    } else {
        format!("{to}.part")
    };
    let size = std::fs::copy(from, &part).map_err(failed)?;
    std::fs::rename(&part, to).map_err(failed)?;
    Ok(size)
}

/// Field `field` of file reference `row` of `refs`, as text.
pub(crate) fn text_field(refs: &StructArray, field: &str, row: usize) -> Option<String> {
    let array = refs.column_by_name(field)?;
    if array.is_null(row) {
        return None;
    }
    let array = datafusion::arrow::compute::cast(
        &array.slice(row, 1),
        &datafusion::arrow::datatypes::DataType::Utf8,
    )
    .ok()?;
    Some(array.as_string::<i32>().value(0).to_string())
}

/// Field `field` of file reference `row` of `refs`, as a number.
pub(crate) fn long_field(refs: &StructArray, field: &str, row: usize) -> Option<i64> {
    let array = refs.column_by_name(field)?;
    if array.is_null(row) {
        return None;
    }
    array.as_primitive_opt::<Int64Type>().map(|a| a.value(row))
}

/// Signatures at the start of a file, with the kind they show.
const MAGIC: &[(&[u8], &str)] = &[
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"II*\0", "image/tiff"),
    (b"MM\0*", "image/tiff"),
    (b"%PDF-", "application/pdf"),
    (b"fLaC", "audio/flac"),
    (b"OggS", "audio/ogg"),
    (b"ID3", "audio/mpeg"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"PAR1", "application/vnd.apache.parquet"),
];

/// The kind of file `head` (its first bytes) begins, when recognised.
pub(crate) fn sniff(head: &[u8]) -> Option<&'static str> {
    if let Some((_, kind)) = MAGIC.iter().find(|(magic, _)| head.starts_with(magic)) {
        return Some(kind);
    }
    // A RIFF container names its form at bytes 8..12; an ISO media file
    // (MP4, QuickTime, HEIC, AVIF) its box type at 4..8.
    match (head.get(0..4), head.get(4..8), head.get(8..12)) {
        (Some(b"RIFF"), _, Some(b"WEBP")) => Some("image/webp"),
        (Some(b"RIFF"), _, Some(b"WAVE")) => Some("audio/wav"),
        (_, Some(b"ftyp"), _) => Some("video/mp4"),
        _ => None,
    }
}
