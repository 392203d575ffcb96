//! `REMOVE ORPHAN FILES`: the files under a table's location that nothing
//! references. A killed copy's partial files, a lost executor's, a merge
//! cut short, metadata files that fell out of the log: no snapshot,
//! manifest or metadata file names them, and no reader ever will.
//!
//! What is referenced is read from the table as it is now: its metadata
//! file and log, every snapshot's manifest list, every manifest those
//! list, every data and delete file those name (live or not), the
//! statistics files. Every manifest list and manifest is read as a
//! client's file, confined to the location; one that cannot be read stops
//! the sweep before anything is deleted (what it names is unknown).
//!
//! Only the location icestage assigned to the table is listed, and only
//! when no other live table's location overlaps it
//! ([`IcebergCatalog::purge_location`]); every deletion passes the one
//! deletion gate ([`delete_within`]). A file newer than the cut-off is
//! never deleted: it may belong to a commit in progress.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use iceberg::table::Table;

use crate::catalog::confine::{canonical, delete_within, local};
use crate::catalog::{CatalogKind, IcebergCatalog};
use crate::error::{Error, Result};

/// The most files one sweep lists under a location; a larger table is
/// refused rather than held in memory.
const MAX_LISTED: usize = 5_000_000;

/// The shortest cut-off a sweep takes (an hour): a file younger than this
/// may be part of a commit still being written.
pub(crate) const MIN_AGE: Duration = Duration::from_secs(3600);

/// A file found under a table's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Its path, in the form the table's location is written in.
    pub(crate) path: String,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// When it was last written.
    pub(crate) modified: DateTime<Utc>,
}

/// What a sweep found, and deleted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sweep {
    /// The location listed.
    pub(crate) location: String,
    /// Files listed under it.
    pub(crate) listed: i64,
    /// Of those, referenced by the table.
    pub(crate) referenced: i64,
    /// Unreferenced and older than the cut-off, by path.
    pub(crate) orphans: Vec<Stored>,
    /// Unreferenced but newer than the cut-off: left.
    pub(crate) too_recent: i64,
    /// Orphans deleted (none on a dry run).
    pub(crate) deleted: i64,
}

/// Finds the files under `table`'s location that it does not reference
/// and that were last written more than `older_than` ago, and deletes
/// them unless `dry_run`.
pub(crate) async fn remove_orphans(
    catalog: &IcebergCatalog,
    table: &Table,
    older_than: Duration,
    dry_run: bool,
) -> Result<Sweep> {
    let name = table.identifier();
    if matches!(catalog.kind(), CatalogKind::S3Tables { .. }) {
        return Err(Error::NotSupported(format!(
            "REMOVE ORPHAN FILES {name}: S3 Tables keeps its tables' storage itself (unreferenced \
             file removal is a setting of the table bucket); nothing was deleted"
        )));
    }
    if !crate::catalog::commit::gc_enabled(table) {
        return Err(Error::invalid(format!(
            "REMOVE ORPHAN FILES {name}: the table sets {} = false (its files may be shared with \
             other tables), and no file of such a table is removed; nothing was deleted",
            crate::catalog::commit::GC_ENABLED
        )));
    }
    if older_than < MIN_AGE {
        return Err(Error::invalid(format!(
            "REMOVE ORPHAN FILES {name}: older_than = '{}' is shorter than an hour: a file that \
             young may belong to a commit still being written; give at least older_than = '1h' \
             (Iceberg's default is 3 days)",
            crate::config::format_duration(older_than)
        )));
    }
    let location = match catalog.purge_location(table).await? {
        Ok(location) => location,
        Err(why) => {
            return Err(Error::invalid(format!(
                "REMOVE ORPHAN FILES {name}: {why}, so its folder is not its own to sweep; \
                 nothing was deleted"
            )));
        }
    };
    let referenced = referenced(table, &location).await?;
    let stored = list(catalog, &location).await?;
    let cutoff =
        Utc::now() - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
    let mut sweep = Sweep {
        location: location.clone(),
        listed: stored.len() as i64,
        ..Sweep::default()
    };
    // Files under `files/` are referenced by rows, not by metadata.
    let row_files = crate::catalog::confine::files_folder(&location);
    for file in stored {
        let known = canonical(&file.path).is_none_or(|path| referenced.contains(&path))
            || crate::catalog::confine::is_under(&file.path, &row_files);
        if known {
            sweep.referenced += 1;
        } else if file.modified >= cutoff {
            sweep.too_recent += 1;
        } else {
            sweep.orphans.push(file);
        }
    }
    if !dry_run {
        for orphan in &sweep.orphans {
            if delete_within(table.file_io(), &orphan.path, &location).await {
                sweep.deleted += 1;
            }
        }
    }
    Ok(sweep)
}

/// Every path `table` references, canonical ([`canonical`]): its metadata
/// files, manifest lists, manifests, data and delete files and statistics.
async fn referenced(table: &Table, location: &str) -> Result<HashSet<String>> {
    let mut paths: HashSet<String> = crate::catalog::confine::metadata_paths(table)
        .iter()
        .filter_map(|p| canonical(p))
        .collect();
    // What a Hadoop-style reader looks for first.
    paths.extend(canonical(&format!(
        "{}/metadata/version-hint.text",
        location.trim_end_matches('/')
    )));
    let mut manifests = std::collections::HashMap::new();
    for snapshot in table.metadata().snapshots() {
        let list = crate::catalog::manifests::load_list(table, snapshot, location)
            .await
            .map_err(|e| unreadable(table, &e))?;
        for manifest in list.consume_entries() {
            manifests
                .entry(manifest.manifest_path.clone())
                .or_insert(manifest);
        }
    }
    paths.extend(manifests.keys().filter_map(|p| canonical(p)));
    let listed =
        crate::catalog::manifests::listed_files(table, manifests.values(), location, false)
            .await
            .map_err(|e| unreadable(table, &e))?;
    paths.extend(listed.iter().filter_map(|p| canonical(p)));
    Ok(paths)
}

fn unreadable(table: &Table, error: &Error) -> Error {
    Error::invalid(format!(
        "REMOVE ORPHAN FILES {}: {error}; without it what the table references is unknown, so \
         nothing was deleted",
        table.identifier()
    ))
}

/// Every file under the folder `location` (local or `s3://`), with its size
/// and time; links are not followed (nothing through one is the table's).
async fn list(catalog: &IcebergCatalog, location: &str) -> Result<Vec<Stored>> {
    let root = location.trim_end_matches('/').to_string();
    if let Some(folder) = local(&root) {
        let (folder, scheme) = (
            std::path::PathBuf::from(folder),
            if root.starts_with("file://") {
                "file://"
            } else {
                ""
            },
        );
        return tokio::task::spawn_blocking(move || walk(&folder, scheme))
            .await
            .map_err(|e| Error::invalid(format!("listing {root} stopped: {e}")))?;
    }
    let Some(rest) = root
        .strip_prefix("s3://")
        .or_else(|| root.strip_prefix("s3a://"))
    else {
        return Err(Error::NotSupported(format!(
            "REMOVE ORPHAN FILES lists local folders and s3:// locations; {root} is neither"
        )));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let store = catalog.aws().object_store(bucket).await?;
    let prefix = object_store::path::Path::from(prefix);
    let mut listing = store.list(Some(&prefix));
    let mut stored = vec![];
    while let Some(meta) = listing.try_next().await.map_err(|e| {
        Error::invalid(format!(
            "cannot list {root}: {e}: the catalog's credentials need s3:ListBucket there"
        ))
    })? {
        if stored.len() >= MAX_LISTED {
            return Err(too_many(&root));
        }
        stored.push(Stored {
            path: format!("s3://{bucket}/{}", meta.location),
            size: meta.size,
            modified: meta.last_modified,
        });
    }
    Ok(stored)
}

fn too_many(root: &str) -> Error {
    Error::invalid(format!(
        "{root} holds more than {MAX_LISTED} files, more than one sweep lists: expire the \
         table's snapshots first (EXPIRE SNAPSHOTS), which deletes what they alone held"
    ))
}

/// The files under `folder`, depth first, as `scheme` + absolute path.
fn walk(folder: &std::path::Path, scheme: &str) -> Result<Vec<Stored>> {
    let mut stored = vec![];
    let mut pending = vec![folder.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // The table has never written anything: nothing is stored.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(Error::invalid(format!(
                    "cannot list {}: {e}",
                    dir.display()
                )));
            }
        };
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::invalid(format!("cannot list {}: {e}", dir.display())))?;
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                if stored.len() >= MAX_LISTED {
                    return Err(too_many(&folder.display().to_string()));
                }
                let Some(path) = entry.path().to_str().map(|p| format!("{scheme}{p}")) else {
                    continue;
                };
                stored.push(Stored {
                    path,
                    size: meta.len(),
                    modified: meta
                        .modified()
                        .map(DateTime::<Utc>::from)
                        .unwrap_or_else(|_| Utc::now()),
                });
            }
        }
    }
    Ok(stored)
}
