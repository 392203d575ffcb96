//! Path confinement: which paths lie under a table's location; the one
//! deletion gate ([`delete_within`]) every path icestage deletes passes;
//! and the one way a client's file is read ([`read_confined`]): confined to
//! the table's location first, then bounded in size.
//!
//! The location is always the one icestage assigned to the table (the SQL
//! catalog's rule, the location S3 Tables reports, the one a REST catalog
//! gave at creation), never the one its metadata claims: a client may have
//! written the metadata.

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::limits;

/// `path` in one comparable form: `file://` dropped, `s3a://` as `s3://`.
/// `None` when it has `.`/`..` segments, empty segments, backslashes or
/// control characters: such a path could name something else than it seems.
pub(crate) fn canonical(path: &str) -> Option<String> {
    let (scheme, rest) = match path.split_once("://") {
        Some(("file", rest)) => ("", rest),
        Some(("s3a", rest)) => ("s3://", rest),
        Some((scheme, rest)) => (scheme, rest),
        None => ("", path),
    };
    if rest.contains('\\') || rest.chars().any(char::is_control) {
        return None;
    }
    let lowered = rest.to_ascii_lowercase();
    if lowered.contains("%2e") || lowered.contains("%2f") {
        return None;
    }
    let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    // A leading '/' of an absolute local path gives one empty first segment.
    let inner = if segments.first() == Some(&"") {
        &segments[1..]
    } else {
        &segments[..]
    };
    if inner
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return None;
    }
    let scheme = if scheme.is_empty() || scheme.ends_with("://") {
        scheme.to_string()
    } else {
        format!("{scheme}://")
    };
    Some(format!("{scheme}{}", rest.trim_end_matches('/')))
}

/// The folder of a table's `location` that holds the files its rows
/// reference (`FILE` columns): a staging table's, where a client
/// puts them; a target's, where promotion copies them.
pub(crate) fn files_folder(location: &str) -> String {
    format!("{}/files", location.trim_end_matches('/'))
}

/// True when `path` lies strictly under the folder `location`.
pub(crate) fn is_under(path: &str, location: &str) -> bool {
    match (canonical(path), canonical(location)) {
        (Some(path), Some(location)) => path.starts_with(&format!("{location}/")),
        _ => false,
    }
}

/// The local file system path of `path` (`file:///a`, `file:/a` or
/// absolute), `None` for an object store's.
pub(crate) fn local(path: &str) -> Option<&str> {
    match path.split_once("://") {
        Some(("file", rest)) => Some(rest),
        Some(_) => None,
        None => Some(
            path.strip_prefix("file:")
                .filter(|rest| rest.starts_with('/'))
                .unwrap_or(path),
        ),
    }
}

/// True when `path`, on a local file system, is or passes through a
/// symbolic link below `location` (so that what it names may lie elsewhere
/// although its text is under the location). Object stores have no links.
pub(crate) fn through_link(path: &str, location: &str) -> bool {
    let (Some(file), Some(root)) = (local(path), local(location)) else {
        return false;
    };
    let root = std::path::Path::new(root);
    let mut at = std::path::Path::new(file);
    while at.starts_with(root) && at != root {
        if std::fs::symlink_metadata(at).is_ok_and(|m| m.file_type().is_symlink()) {
            return true;
        }
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    false
}

/// The one deletion gate: deletes `path` only when it lies under
/// `location` (the location icestage assigned to the table whose file it
/// is) and reaches nothing through a link; `false` when it was refused or
/// the store refused. Every delete icestage performs on a table's behalf
/// (purge, drop, abort, expiry, metadata clean-up, rewrite clean-up)
/// passes here, whatever the metadata that named `path` says.
pub(crate) async fn delete_within(io: &FileIO, path: &str, location: &str) -> bool {
    if !is_under(path, location) || through_link(path, location) {
        return false;
    }
    io.delete(path).await.is_ok()
}

/// Reads a file a client may have written: refused unless it lies under
/// `location` (before anything is opened: the answer must not tell what
/// exists elsewhere), reaches nothing through a link, and its stored size
/// is within [`limits::ReadLimits::metadata_bytes`]. `what` names the file
/// in errors (`manifest list`, `manifest`).
pub(crate) async fn read_confined(
    io: &FileIO,
    path: &str,
    location: &str,
    what: &str,
) -> Result<bytes::Bytes> {
    if !is_under(path, location) || through_link(path, location) {
        return Err(Error::invalid(format!(
            "{what} '{path}' is outside the table's location '{location}': write it under \
             the table's location"
        )));
    }
    read_bounded(io, path).await?.map_err(|(size, bound)| {
        Error::invalid(format!(
            "{what} '{path}' holds {size} bytes, more than the {} a metadata file may hold \
                 (limits.metadata_bytes): write smaller manifests",
            limits::human(bound)
        ))
    })
}

/// The bytes of `path`, when its stored size is within
/// [`limits::ReadLimits::metadata_bytes`]; otherwise its size and the
/// bound. Only the stored length is read, even if the file grows meanwhile.
pub(crate) async fn read_bounded(
    io: &FileIO,
    path: &str,
) -> Result<std::result::Result<bytes::Bytes, (u64, u64)>> {
    use iceberg::io::FileRead;
    let input = io.new_input(path)?;
    let size = input.metadata().await?.size;
    let bound = limits::current().metadata_bytes;
    if size > bound {
        return Ok(Err((size, bound)));
    }
    Ok(Ok(input.reader().await?.read(0..size).await?))
}

/// The gzip-compressed metadata file `bytes` (read from `path`) inflated,
/// up to [`limits::ReadLimits::metadata_inflated_bytes`]: a file that
/// inflates past it is refused once one byte more has come out.
pub(crate) fn inflate_bounded(path: &str, bytes: &[u8]) -> iceberg::Result<Vec<u8>> {
    use std::io::Read;
    let bound = limits::current().metadata_inflated_bytes;
    let mut inflated = vec![];
    flate2::read::GzDecoder::new(bytes)
        .take(bound + 1)
        .read_to_end(&mut inflated)
        .map_err(|e| {
            iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!("the metadata file {path} is not valid gzip: {e}"),
            )
        })?;
    if inflated.len() as u64 > bound {
        return Err(iceberg::Error::new(
            iceberg::ErrorKind::DataInvalid,
            format!(
                "the metadata file {path} decompresses to more than the {} a metadata file may \
                 (limits.metadata_inflated_bytes): it was written outside icestage; restore the \
                 table or raise the limit",
                limits::human(bound)
            ),
        ));
    }
    Ok(inflated)
}

/// The JSON of metadata file `bytes` (read from `path`): as read, or
/// inflated within [`inflate_bounded`]'s bound when gzip-compressed (as
/// `write.metadata.compression-codec = gzip` writes it).
pub(crate) fn metadata_json<'a>(
    path: &str,
    bytes: &'a [u8],
) -> iceberg::Result<std::borrow::Cow<'a, [u8]>> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        Ok(std::borrow::Cow::Owned(inflate_bounded(path, bytes)?))
    } else {
        Ok(std::borrow::Cow::Borrowed(bytes))
    }
}

/// Table properties that move where a writer puts files.
const PATH_PROPERTIES: &[&str] = &[
    "write.data.path",
    "write.metadata.path",
    "write.object-storage.path",
    "write.folder-storage.path",
];

/// Why `updates` (a commit a client sends) would make the table name a
/// file outside `location`, the location icestage assigned to it: one line
/// per path (a manifest list, statistics, partition statistics, a path
/// property) or for a new location. Empty when every path stays inside.
/// The check is on paths alone: what the files hold is read, confined,
/// when it is used.
pub(crate) fn paths_outside(updates: &[iceberg::TableUpdate], location: &str) -> Vec<String> {
    use iceberg::TableUpdate;
    let mut outside = vec![];
    let named = |outside: &mut Vec<String>, what: &str, path: &str| {
        if !is_under(path, location) {
            outside.push(format!(
                "{what} '{path}' is outside the table's location '{location}'"
            ));
        }
    };
    for update in updates {
        match update {
            TableUpdate::AddSnapshot { snapshot } => {
                named(&mut outside, "manifest list", snapshot.manifest_list());
            }
            TableUpdate::SetStatistics { statistics } => {
                named(&mut outside, "statistics file", &statistics.statistics_path);
            }
            TableUpdate::SetPartitionStatistics {
                partition_statistics,
            } => named(
                &mut outside,
                "partition statistics file",
                &partition_statistics.statistics_path,
            ),
            TableUpdate::SetProperties { updates } => {
                for key in PATH_PROPERTIES {
                    if let Some(path) = updates.get(*key) {
                        named(&mut outside, &format!("property {key}"), path);
                    }
                }
            }
            TableUpdate::SetLocation { location: new } if canonical(new) != canonical(location) => {
                outside.push(format!(
                    "set-location to '{new}': the table stays where the catalog placed it \
                     ('{location}')"
                ));
            }
            _ => {}
        }
    }
    outside
}

/// The paths the metadata itself names (no file is read): the metadata
/// location, its log, every snapshot's manifest list and the statistics.
pub(crate) fn metadata_paths(table: &Table) -> Vec<String> {
    let mut paths: Vec<String> = table
        .metadata_location()
        .map(str::to_string)
        .into_iter()
        .collect();
    paths.extend(paths_named_by(table.metadata()));
    paths
}

/// Why `metadata` (a file a client wrote) would make a table name a file
/// outside `location`: one line per path its log, snapshots, statistics or
/// path properties name. Empty when every path stays inside.
pub(crate) fn metadata_outside(metadata: &TableMetadata, location: &str) -> Vec<String> {
    let mut outside: Vec<String> = paths_named_by(metadata)
        .into_iter()
        .filter(|path| !is_under(path, location))
        .map(|path| format!("'{path}' is outside the table's location '{location}'"))
        .collect();
    for key in PATH_PROPERTIES {
        if let Some(path) = metadata.properties().get(*key)
            && !is_under(path, location)
        {
            outside.push(format!(
                "property {key} '{path}' is outside the table's location '{location}'"
            ));
        }
    }
    outside
}

/// The paths `metadata` names: its log, every snapshot's manifest list and
/// the statistics.
fn paths_named_by(metadata: &TableMetadata) -> Vec<String> {
    let mut paths = vec![];
    paths.extend(
        metadata
            .metadata_log()
            .iter()
            .map(|m| m.metadata_file.clone()),
    );
    paths.extend(metadata.snapshots().map(|s| s.manifest_list().to_string()));
    paths.extend(
        metadata
            .statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    paths.extend(
        metadata
            .partition_statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_strictly_under_the_location_are_inside() {
        let at = "file:///w/staging/upload_1";
        assert!(is_under("file:///w/staging/upload_1/data/a.parquet", at));
        assert!(is_under("/w/staging/upload_1/metadata/v1.json", at));
        assert!(!is_under("file:///w/staging/upload_10/data/a.parquet", at));
        assert!(!is_under("file:///w/staging/upload_1", at));
        assert!(!is_under(
            "file:///w/staging/upload_1/../upload_2/a.parquet",
            at
        ));
        assert!(!is_under("file:///w/staging/upload_1/./a.parquet", at));
        assert!(!is_under("file:///w/staging/upload_1//a.parquet", at));
        assert!(!is_under("file:///w/staging/upload_1/%2e%2e/x", at));
        assert!(!is_under("file:///w/payments/t/data/a.parquet", at));
        assert!(!is_under("s3://w/staging/upload_1/a.parquet", at));
        let s3 = "s3://bucket/wh/staging/upload_1";
        assert!(is_under(
            "s3a://bucket/wh/staging/upload_1/data/x.parquet",
            s3
        ));
        assert!(!is_under(
            "s3://other/wh/staging/upload_1/data/x.parquet",
            s3
        ));
    }
}
