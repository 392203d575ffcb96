//! Path confinement: which paths lie under a table's location, and deleting
//! a table's files without ever leaving that location, whatever its
//! metadata names (a client may have written it).

use std::collections::HashSet;

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;

use super::Removal;
use crate::error::Result;

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

/// True when `path` lies strictly under the folder `location`.
pub(crate) fn is_under(path: &str, location: &str) -> bool {
    match (canonical(path), canonical(location)) {
        (Some(path), Some(location)) => path.starts_with(&format!("{location}/")),
        _ => false,
    }
}

/// The paths the metadata itself names (no file is read): the metadata
/// location, its log, every snapshot's manifest list and the statistics.
pub(crate) fn metadata_paths(table: &Table) -> Vec<String> {
    let metadata: &TableMetadata = table.metadata();
    let mut paths: Vec<String> = table
        .metadata_location()
        .map(str::to_string)
        .into_iter()
        .collect();
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

/// Deletes `table`'s files that lie under `location`: its metadata files
/// (metadata log, manifest lists, manifests) and, with
/// [`Removal::Everything`], its data files. Paths outside `location` are
/// never touched, whatever the metadata says, and with
/// [`Removal::MetadataOnly`] no path a manifest names as a data file is
/// deleted (the target references them). Best effort: a file that is already
/// gone is fine.
pub(crate) async fn delete_confined(table: &Table, location: &str, removal: Removal) -> Result<()> {
    let io: &FileIO = table.file_io();
    if removal == Removal::Location {
        let _ = io.delete_prefix(location.trim_end_matches('/')).await;
        return Ok(());
    }
    let mut metadata: HashSet<String> = metadata_paths(table).into_iter().collect();
    let mut data: HashSet<String> = HashSet::new();
    for snapshot in table.metadata().snapshots() {
        if !is_under(snapshot.manifest_list(), location) {
            continue;
        }
        let Ok(list) = table.manifest_list_reader(snapshot).load().await else {
            continue;
        };
        for manifest in list.entries() {
            if !is_under(&manifest.manifest_path, location) {
                continue;
            }
            metadata.insert(manifest.manifest_path.clone());
            if let Ok(loaded) = super::manifest::load(table, manifest).await {
                data.extend(
                    loaded
                        .entries()
                        .iter()
                        .map(|e| e.data_file().file_path().to_string()),
                );
            }
        }
    }
    let doomed: Vec<&String> = match removal {
        Removal::Everything | Removal::Location => metadata.iter().chain(data.iter()).collect(),
        // A path a manifest names as data is never deleted here, even when
        // another (client-written) manifest list calls it a manifest.
        Removal::MetadataOnly => metadata.difference(&data).collect(),
    };
    for path in doomed {
        if is_under(path, location) {
            let _ = io.delete(path).await;
        }
    }
    Ok(())
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
