//! Confinement: every path a staging table's metadata names must lie under
//! the location icestage gave the table, and nothing outside it is ever
//! read, promoted or deleted on the table's behalf.
//!
//! The location itself is not taken from the table's metadata (the client
//! writes that): the SQL catalog places a staging table by rule under the
//! warehouse, and S3 Tables reports the storage it assigned.

use std::collections::HashSet;

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;

use super::Staging;
use crate::catalog::Removal;
use crate::error::{Error, Result};

/// `path` in one comparable form: `file://` dropped, `s3a://` as `s3://`.
/// `None` when it has `.`/`..` segments, empty segments, backslashes or
/// control characters: such a path could name something else than it seems.
fn canonical(path: &str) -> Option<String> {
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

/// Where icestage placed the staging table of `staging`: by the catalog's
/// rule, or as the catalog reports it; never from the table's metadata.
pub(crate) async fn assigned_location(staging: &Staging) -> Result<String> {
    let ident = staging.table.identifier();
    if let Some(location) = staging.catalog.default_table_location(ident) {
        return Ok(location);
    }
    staging
        .catalog
        .pointers()
        .assigned_location(ident)
        .await?
        .ok_or_else(|| {
            Error::invalid(format!(
                "internal: catalog '{}' cannot say where {ident} is stored",
                staging.catalog.name()
            ))
        })
}

/// The paths the metadata itself names (no file is read): the metadata
/// location, its log, every snapshot's manifest list and the statistics.
fn metadata_paths(table: &Table) -> Vec<String> {
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

/// The current snapshot's manifests, each loaded (those under the location).
pub(crate) type Loaded = Vec<(iceberg::spec::ManifestFile, iceberg::spec::Manifest)>;

/// One line per problem: the table's location moved, or a path outside it;
/// and the current snapshot's manifests, loaded once for the checks that
/// follow. Reads the manifest list and the manifests under the location.
pub(crate) async fn confinement(
    staging: &Staging,
    location: &str,
) -> Result<(Vec<String>, Loaded)> {
    let mut loaded_manifests = vec![];
    let mut problems = vec![];
    let table = &staging.table;
    let claimed = table.metadata().location();
    if canonical(claimed) != canonical(location) {
        problems.push(format!(
            "the staging table's location was changed to '{claimed}'; icestage placed it at \
             '{location}': open a new upload"
        ));
    }
    let mut outside: Vec<String> = metadata_paths(table)
        .into_iter()
        .filter(|p| !is_under(p, location))
        .collect();
    if outside.is_empty()
        && let Some(current) = table.metadata().current_snapshot()
    {
        let list = table.manifest_list_reader(current).load().await?;
        for manifest in list.entries() {
            if !is_under(&manifest.manifest_path, location) {
                outside.push(manifest.manifest_path.clone());
                continue;
            }
            let loaded = manifest.load_manifest(table.file_io()).await?;
            outside.extend(
                loaded
                    .entries()
                    .iter()
                    .map(|e| e.data_file().file_path().to_string())
                    .filter(|p| !is_under(p, location)),
            );
            loaded_manifests.push((manifest.clone(), loaded));
        }
    }
    outside.sort();
    outside.dedup();
    problems.extend(outside.into_iter().map(|path| {
        format!(
            "the staging table names '{path}', which is outside its location '{location}': \
             only files under the staging table's own location can be promoted"
        )
    }));
    Ok((problems, loaded_manifests))
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
            if let Ok(loaded) = manifest.load_manifest(io).await {
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
        Removal::Everything => metadata.iter().chain(data.iter()).collect(),
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
