//! The files an upload's rows reference ([`crate::tables::files`]),
//! verified and landed with the rows.
//!
//! A client puts each file under its staging table's `files/` folder with
//! the session's own access, and writes rows whose file column names it:
//! `uri`, `size`, `sha256`, `content_type`. Before anything lands, every
//! referenced file is checked:
//!
//! * its `uri` starts with the session's `files_location` and lies under it
//!   (no `..`, no encoded separators, never through a symbolic link);
//! * it exists and is a plain file, of the row's `size`;
//! * its SHA-256, hashed while streaming in [`CHUNK`] pieces (bounded
//!   memory, [`PARALLEL`] files at a time), is the row's `sha256`;
//! * its first bytes are of the row's `content_type` where they are of a
//!   kind this module recognises ([`sniff`]).
//!
//! When the promotion goes ahead, each file is first copied into the
//! target's `files/<upload id>/` folder (S3's server-side copy within one
//! bucket) and the copy is what is hashed: what lands is exactly what was
//! verified, whatever the client writes to the staging folder meanwhile. The
//! copies are named by the upload and the file's path, so a promotion
//! killed mid-copy and run again finds the copies it made (a copy of the
//! right size and hash is kept, anything else is copied again), and never
//! duplicates one. The rows are then rewritten with each `uri` pointing at
//! its copy ([`Relocation`]) and committed with the same exactly-once
//! append as any promotion. A file no row references is not copied; it goes
//! with the staging table.
//!
//! A problem is a finding naming the row (its key, or its data file and
//! position) and the file; the upload fails and the target is unchanged
//! (copies already made are deleted).

use std::collections::HashMap;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::table::Table;

use super::Staging;
use super::transfer::Relocation;
use super::validation::findings::Finding;
use super::validation::{FINDINGS_PER_RULE, Validation, key_text, named};
use crate::catalog::confine::{delete_within, is_under, local, through_link};
use crate::catalog::copy::Copier;
use crate::error::{Error, Result};
use crate::tables::files::{
    MAX_FILES, PARALLEL, copy_local, file_columns, files_folder, hash, long_field, text_field,
};

/// Rule name of file findings.
const RULE: &str = "file_reference";

/// What one reference says of its file.
#[derive(Debug, Clone)]
struct Reference {
    column: String,
    row: String,
    data_file: String,
    position: i64,
    uri: Option<String>,
    size: Option<i64>,
    sha256: Option<String>,
    content_type: Option<String>,
}

impl Reference {
    fn values(&self) -> String {
        serde_json::json!({
            "uri": self.uri,
            "size": self.size,
            "sha256": self.sha256,
            "content_type": self.content_type,
        })
        .to_string()
    }
}

/// What was found of one file.
#[derive(Debug, Clone)]
enum Found {
    /// Stored with this size; hashed (and sniffed) when the size was the
    /// one the first reference asked for.
    File {
        size: u64,
        sha256: Option<String>,
        kind: Option<&'static str>,
    },
    /// Not there, outside, through a link: why.
    Refused(String),
}

/// Checks every file `staging`'s rows reference (the rows of
/// `validation.files`, read through the target's storage when `copied`):
/// problems become findings and a reason of `validation`. With `land`,
/// each file is copied into the target's storage first and the copy is
/// checked. Answers how promoted rows' references are rewritten (`None`
/// when the target has no file columns, no row was staged, or the table
/// as a whole already failed: its rows may not even hold the columns).
pub(crate) async fn check(
    staging: &Staging,
    target: &Table,
    validation: &mut Validation,
    copied: bool,
    land: bool,
) -> Result<Option<Relocation>> {
    if !validation.reasons.is_empty() || validation.files.is_empty() {
        return Ok(None);
    }
    let columns = file_columns(target)?;
    if columns.is_empty() {
        return Ok(None);
    }
    let location = super::confine::assigned_location(staging).await?;
    let from = format!("{}/", files_folder(&location));
    let target_location = staging.catalog.placed_or_reported(target).await?;
    let to = format!("{}/{}/", files_folder(&target_location), staging.id);
    let relocation = Relocation {
        columns: columns.clone(),
        from,
        to,
    };
    let rows_io = if copied {
        target.file_io().clone()
    } else {
        staging.table.file_io().clone()
    };
    // Rows are named by the target's first unique key, when it has one.
    let key = crate::tables::rules::rules_of(target)?
        .into_iter()
        .find_map(|rule| match rule {
            crate::tables::rules::Rule::Unique { columns, .. } => Some(columns),
            crate::tables::rules::Rule::Check { .. } => None,
        })
        .unwrap_or_default();
    let landing = Landing {
        staging,
        target,
        location: &location,
        relocation: &relocation,
        target_location: &target_location,
        land,
        copier: Copier::new(
            std::sync::Arc::clone(&staging.catalog),
            staging.table.file_io().clone(),
            target.file_io().clone(),
        ),
    };
    let mut found: HashMap<String, Found> = HashMap::new();
    let mut problems: Vec<Finding> = vec![];
    let mut count: u64 = 0;
    let landing = &landing;
    let paths: Vec<String> = validation
        .files
        .iter()
        .map(|f| f.file_path().to_string())
        .collect();
    for path in paths {
        let mut batches = read_references(&rows_io, &path, &columns, &key).await?;
        while let Some((batch, first)) = batches.next().await.transpose()? {
            let references = references_of(&batch, first, &path, &columns, &key)?;
            let new: Vec<(String, Option<i64>)> = references
                .iter()
                .filter_map(|r| Some((r.uri.clone()?, r.size)))
                .filter(|(uri, _)| !found.contains_key(uri))
                .collect::<HashMap<_, _>>()
                .into_iter()
                .collect();
            if found.len() + new.len() > MAX_FILES {
                validation.reasons.push(format!(
                    "the rows reference more than {MAX_FILES} distinct files; one upload lands at \
                     most {MAX_FILES}: split the rows and their files into several uploads"
                ));
                landing.discard(&found).await;
                return Ok(Some(relocation));
            }
            let checked: Vec<(String, Found)> = futures::stream::iter(new)
                .map(|(uri, size)| async move {
                    let outcome = landing.one(&uri, size).await?;
                    Ok::<_, Error>((uri, outcome))
                })
                .buffer_unordered(PARALLEL)
                .try_collect()
                .await?;
            found.extend(checked);
            for reference in references {
                if let Some(message) = judge(&reference, &found) {
                    count += 1;
                    if problems.len() < FINDINGS_PER_RULE {
                        problems.push(Finding {
                            rule: RULE.to_string(),
                            kind: "file".to_string(),
                            row: reference.row.clone(),
                            file: Some(reference.data_file.clone()),
                            position: Some(reference.position),
                            values: reference.values(),
                            message: format!("column '{}': {message}", reference.column),
                        });
                    }
                }
            }
        }
    }
    if count > 0 {
        let first = problems
            .first()
            .map(|f| format!("{}: {}", f.row, f.message))
            .unwrap_or_default();
        validation.reasons.push(format!(
            "{count} file reference(s) fail, e.g. {first} (SELECT * FROM upload_findings('{}'))",
            staging.id
        ));
        validation.file_problems += count;
        validation.findings.extend(problems);
        landing.discard(&found).await;
    }
    Ok(Some(relocation))
}

/// Why `reference` fails, if it does.
fn judge(reference: &Reference, found: &HashMap<String, Found>) -> Option<String> {
    let Some(uri) = &reference.uri else {
        return Some("the file reference has no uri".to_string());
    };
    let (size, sha256, kind) = match found.get(uri) {
        Some(Found::File { size, sha256, kind }) => (*size, sha256, *kind),
        Some(Found::Refused(why)) => return Some(format!("file '{uri}' {why}")),
        None => return Some(format!("file '{uri}' was not checked")),
    };
    match reference.size {
        None => return Some(format!("file '{uri}' has no size in the row")),
        Some(declared) if declared < 0 || declared as u64 != size => {
            return Some(format!(
                "file '{uri}' holds {size} bytes; the row says {declared}"
            ));
        }
        Some(_) => {}
    }
    let Some(declared) = &reference.sha256 else {
        return Some(format!("file '{uri}' has no sha256 in the row"));
    };
    if declared.len() != 64 || !declared.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(format!(
            "the row's sha256 '{declared}' for file '{uri}' is not 64 hexadecimal digits"
        ));
    }
    match sha256 {
        Some(hashed) if hashed.eq_ignore_ascii_case(declared) => {}
        Some(hashed) => {
            return Some(format!(
                "file '{uri}' hashes to SHA-256 {hashed}; the row says {declared}: the file \
                 changed after the row was written, or the row is wrong"
            ));
        }
        None => {
            return Some(format!(
                "file '{uri}' was not hashed: another row names it with another size"
            ));
        }
    }
    if let Some(declared) = &reference.content_type
        && let Some(why) = content_mismatch(declared, kind)
    {
        return Some(format!("file '{uri}' {why}"));
    }
    None
}

/// What a check needs of the promotion.
struct Landing<'a> {
    staging: &'a Staging,
    target: &'a Table,
    location: &'a str,
    relocation: &'a Relocation,
    /// The target's assigned location (copies lie under it).
    target_location: &'a str,
    land: bool,
    copier: Copier,
}

impl Landing<'_> {
    /// Checks the file at `uri` (copying it into the target first when
    /// landing), hashing it when it has `size` bytes.
    async fn one(&self, uri: &str, size: Option<i64>) -> Result<Found> {
        let Some(relative) = uri.strip_prefix(&self.relocation.from) else {
            return Ok(Found::Refused(format!(
                "is outside the upload's files folder {}: put the file there and name it by \
                 that location",
                self.relocation.from
            )));
        };
        if relative.is_empty() || !is_under(uri, self.location) {
            return Ok(Found::Refused(format!(
                "is not a file under the upload's files folder {} (a path with '..', '.', an \
                 empty or encoded segment names something else)",
                self.relocation.from
            )));
        }
        if through_link(uri, self.location) {
            return Ok(Found::Refused(
                "is reached through a symbolic link: put the file itself in the folder".to_string(),
            ));
        }
        if let Some(path) = local(uri) {
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_file() => {}
                Ok(_) => {
                    return Ok(Found::Refused("is not a plain file".to_string()));
                }
                Err(_) => return Ok(Found::Refused("does not exist".to_string())),
            }
        }
        let source = self.staging.table.file_io();
        let input = source.new_input(uri)?;
        if !input.exists().await? {
            return Ok(Found::Refused("does not exist".to_string()));
        }
        let stored = input.metadata().await?.size;
        if size != Some(stored as i64) {
            return Ok(Found::File {
                size: stored,
                sha256: None,
                kind: None,
            });
        }
        if !self.land {
            let (sha256, kind) = hash(source, uri, stored).await?;
            return Ok(Found::File {
                size: stored,
                sha256: Some(sha256),
                kind,
            });
        }
        let copy = format!("{}{relative}", self.relocation.to);
        let io = self.target.file_io();
        // A copy an earlier, interrupted run made is kept when it is whole.
        if let Ok(meta) = io.new_input(&copy)?.metadata().await
            && meta.size == stored
        {
            let (sha256, kind) = hash(io, &copy, stored).await?;
            return Ok(Found::File {
                size: stored,
                sha256: Some(sha256),
                kind,
            });
        }
        let size = match (local(uri), local(&copy)) {
            (Some(from), Some(to)) => {
                let (from, to) = (from.to_string(), to.to_string());
                tokio::task::spawn_blocking(move || copy_local(&from, &to, false))
                    .await
                    .map_err(|e| Error::internal(format!("copying {uri}: {e}")))??
            }
            _ => self.copier.copy(uri, &copy).await?,
        };
        crate::session::failpoint("promote.file-copied");
        let (sha256, kind) = hash(io, &copy, size).await?;
        Ok(Found::File {
            size,
            sha256: Some(sha256),
            kind,
        })
    }

    /// Deletes the copies of `found` this promotion made or kept (after a
    /// failed check nothing of the upload stays in the target's storage).
    async fn discard(&self, found: &HashMap<String, Found>) {
        if !self.land {
            return;
        }
        for uri in found.keys() {
            if let Some(relative) = uri.strip_prefix(&self.relocation.from) {
                let copy = format!("{}{relative}", self.relocation.to);
                delete_within(self.target.file_io(), &copy, self.target_location).await;
            }
        }
    }
}

/// Data file `path`'s batches of the file columns (and `key` columns),
/// each with the position of its first row.
async fn read_references(
    io: &FileIO,
    path: &str,
    columns: &[String],
    key: &[String],
) -> Result<futures::stream::BoxStream<'static, Result<(RecordBatch, i64)>>> {
    use iceberg::arrow::ArrowFileReader;
    use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

    let input = io.new_input(path)?;
    let meta = input.metadata().await?;
    let reader = ArrowFileReader::new(meta, input.reader().await?);
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(|e| Error::internal(format!("reading {path}: {e}")))?;
    let wanted: Vec<usize> = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| columns.contains(f.name()) || key.contains(f.name()))
        .map(|(n, _)| n)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let stream = builder
        .with_projection(mask)
        .with_batch_size(8192)
        .build()
        .map_err(|e| Error::internal(format!("reading {path}: {e}")))?;
    let path = path.to_string();
    let mut position = 0i64;
    Ok(stream
        .map(move |batch| {
            let batch = batch.map_err(|e| Error::internal(format!("reading {path}: {e}")))?;
            let first = position;
            position += batch.num_rows() as i64;
            Ok((batch, first))
        })
        .boxed())
}

/// The references in `batch` (its first row at `first` in `data_file`).
fn references_of(
    batch: &RecordBatch,
    first: i64,
    data_file: &str,
    columns: &[String],
    key: &[String],
) -> Result<Vec<Reference>> {
    let keys = if key.is_empty() {
        None
    } else {
        Some(named(batch, key)?)
    };
    let mut references = vec![];
    for column in columns {
        let Some(array) = batch.column_by_name(column) else {
            return Err(Error::internal(format!(
                "{data_file} has no file column '{column}'"
            )));
        };
        let Some(refs) = array.as_struct_opt() else {
            return Err(Error::invalid(format!(
                "file column '{column}' of {data_file} is {}, not a file reference struct",
                array.data_type()
            )));
        };
        for row in 0..refs.len() {
            if refs.is_null(row) {
                continue;
            }
            let position = first + row as i64;
            let row_text = match &keys {
                Some(keys) => key_text(keys, row)?,
                None => format!("row {position} of {data_file}"),
            };
            references.push(Reference {
                column: column.clone(),
                row: row_text,
                data_file: data_file.to_string(),
                position,
                uri: text_field(refs, "uri", row),
                size: long_field(refs, "size", row),
                sha256: text_field(refs, "sha256", row),
                content_type: text_field(refs, "content_type", row),
            });
        }
    }
    Ok(references)
}

/// The kinds of file recognised by their first bytes, with the content
/// types that name them (the first is the canonical one).
const KINDS: &[(&str, &[&str])] = &[
    ("image/png", &["image/png"]),
    ("image/jpeg", &["image/jpeg", "image/jpg", "image/pjpeg"]),
    ("image/gif", &["image/gif"]),
    ("image/webp", &["image/webp"]),
    ("image/tiff", &["image/tiff"]),
    ("application/pdf", &["application/pdf", "application/x-pdf"]),
    (
        "audio/wav",
        &["audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"],
    ),
    ("audio/flac", &["audio/flac", "audio/x-flac"]),
    ("audio/ogg", &["audio/ogg", "application/ogg", "video/ogg"]),
    ("audio/mpeg", &["audio/mpeg", "audio/mp3"]),
    (
        "video/mp4",
        &[
            "video/mp4",
            "audio/mp4",
            "video/quicktime",
            "image/heic",
            "image/avif",
        ],
    ),
    (
        "application/zip",
        &["application/zip", "application/x-zip-compressed"],
    ),
    (
        "application/gzip",
        &["application/gzip", "application/x-gzip"],
    ),
    (
        "application/vnd.apache.parquet",
        &["application/vnd.apache.parquet", "application/x-parquet"],
    ),
];

/// Why a file of `kind` (as sniffed) is not of the `declared` content type.
fn content_mismatch(declared: &str, kind: Option<&'static str>) -> Option<String> {
    let essence = declared
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    let well_formed = essence
        .split_once('/')
        .is_some_and(|(kind, sub)| token(kind) && token(sub));
    if !well_formed {
        return Some(format!(
            "has content_type '{declared}' in the row, which is not a media type: write one \
             such as image/png"
        ));
    }
    let names = |k: &str| {
        KINDS
            .iter()
            .find(|(canonical, _)| *canonical == k)
            .map(|(_, names)| *names)
            .unwrap_or_default()
    };
    match kind {
        Some(kind) if names(kind).contains(&essence.as_str()) => None,
        // Untyped bytes may hold anything.
        Some(_) if essence == "application/octet-stream" => None,
        Some(kind) => Some(format!(
            "holds {kind} bytes; the row says content_type '{declared}'"
        )),
        None => {
            let claimed = KINDS
                .iter()
                .find(|(_, names)| names.contains(&essence.as_str()));
            claimed.map(|(canonical, _)| {
                format!(
                    "does not begin as {canonical} does; the row says content_type '{declared}'"
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::tables::files::sniff;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[test]
    fn content_types_are_checked_against_the_bytes_where_they_are_known() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert_eq!(sniff(png), Some("image/png"));
        assert_eq!(content_mismatch("image/png", sniff(png)), None);
        assert_eq!(content_mismatch("IMAGE/PNG; q=1", sniff(png)), None);
        assert_eq!(
            content_mismatch("application/octet-stream", sniff(png)),
            None
        );
        assert!(
            content_mismatch("image/jpeg", sniff(png))
                .unwrap()
                .contains("holds image/png bytes")
        );
        // Text claims nothing checkable; a PNG claim on text bytes fails.
        assert_eq!(content_mismatch("text/plain", sniff(b"hello")), None);
        assert!(
            content_mismatch("image/png", sniff(b"hello"))
                .unwrap()
                .contains("does not begin as image/png")
        );
        assert!(
            content_mismatch("png", None)
                .unwrap()
                .contains("not a media type")
        );
        // Containers named past their first bytes.
        assert_eq!(sniff(b"RIFF\x10\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\x10\0\0\0WAVEfmt "), Some("audio/wav"));
        assert_eq!(sniff(b"\0\0\0\x18ftypmp42"), Some("video/mp4"));
        assert_eq!(sniff(b"RIFF"), None);
        assert_eq!(sniff(b""), None);
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
