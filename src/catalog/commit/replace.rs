//! Commits that replace data files: a snapshot that marks some live data
//! files deleted and adds others, written by icestage itself (iceberg-rust's
//! transactions have no overwrite). `REWRITE DATA FILES` commits one as a
//! `replace` (the same rows, fewer files, see [`crate::catalog::maintain::bin_pack`]); a
//! promotion that upserts or replaces partitions commits one as an
//! `overwrite`, exactly once ([`overwrite_once`]).
//!
//! Copy-on-write: a file that loses rows is rewritten without them and
//! replaced, so the table never holds delete files and every engine reads
//! it as it reads an append-only table.
//!
//! The manifests that list a deleted file are written again (the other
//! entries kept as `existing`, with their snapshot ids and sequence
//! numbers), the added files go in a manifest of their own, every other
//! manifest is listed as it was. Each commit is a compare-and-swap of the
//! table's pointer from exactly the version it was built on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::BoxFuture;
use iceberg::spec::{
    DataFile, FormatVersion, MAIN_BRANCH, Manifest, ManifestContentType, ManifestFile,
    ManifestListWriter, ManifestWriterBuilder, Operation, Snapshot, SnapshotRef, Summary,
};
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::commit::append::{Refusal, apply_append};
use crate::catalog::commit::{Evidence, Landed};
use crate::catalog::confine::delete_within;
use crate::catalog::snapshot::{add_as_head, new_snapshot_id, retry_pause};
use crate::error::{Error, Result};

/// A live data file of a table, with the partition spec it was written
/// under.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    /// The spec of the manifest that lists it.
    pub(crate) spec_id: i32,
    /// The file.
    pub(crate) file: DataFile,
}

/// Refuses tables whose data files a replacement cannot keep exact: v1
/// (no sequence numbers to keep) and v3 (row lineage to carry) tables.
/// `what` names the statement.
pub(crate) fn check_format(table: &Table, what: &str) -> Result<()> {
    let version = table.metadata().format_version();
    if version != FormatVersion::V2 {
        return Err(Error::NotSupported(format!(
            "{what} needs an Iceberg v2 table; {} is {version}: nothing was changed",
            table.identifier()
        )));
    }
    Ok(())
}

/// The delete manifests of `list` that still hold live delete files.
fn live_deletes(list: &[ManifestFile]) -> usize {
    list.iter()
        .filter(|m| m.content == ManifestContentType::Deletes)
        .filter(|m| m.added_files_count.unwrap_or(0) + m.existing_files_count.unwrap_or(0) > 0)
        .count()
}

/// Refuses a table with row-level deletes: the rows its files hold are not
/// the rows it holds. `what` names the statement.
fn no_deletes(table: &Table, list: &[ManifestFile], what: &str) -> Result<()> {
    if live_deletes(list) > 0 {
        return Err(Error::NotSupported(format!(
            "{} has row-level deletes (delete files), which {what} does not apply yet: compact \
             them with an engine that does (Spark's rewrite_data_files); nothing was changed",
            table.identifier()
        )));
    }
    Ok(())
}

/// The current snapshot of one version of a table as its manifests say:
/// the manifest list and every data manifest, each read once (as a
/// client's file confined to the table's location), for both what is live
/// ([`Version::live`]) and a replacement built on it ([`write_replacement`]).
pub(crate) struct Version {
    /// The snapshot read (a replacement's parent); `None` for a table
    /// without one.
    parent: Option<SnapshotRef>,
    /// The manifest list's entries.
    list: Vec<ManifestFile>,
    /// The data manifests, decoded, by path.
    data: HashMap<String, Manifest>,
}

impl Version {
    /// Reads `table`'s current snapshot's manifests, confined to
    /// `assigned` (the table's location). A table with row-level deletes
    /// is refused (`what` names the statement).
    pub(crate) async fn read(table: &Table, assigned: &str, what: &str) -> Result<Self> {
        let mut version =
            Self::listed(table, table.metadata().current_snapshot(), assigned).await?;
        no_deletes(table, &version.list, what)?;
        let Self { list, data, .. } = &mut version;
        for manifest in list
            .iter()
            .filter(|m| m.content == ManifestContentType::Data)
        {
            let read = crate::catalog::manifests::load(table, manifest, assigned).await?;
            data.insert(manifest.manifest_path.clone(), read);
        }
        Ok(version)
    }

    /// `snapshot` of `table` (none: an empty table) with its manifest list
    /// only, confined to `assigned`: what an append on top of it keeps as
    /// it is.
    pub(crate) async fn listed(
        table: &Table,
        snapshot: Option<&SnapshotRef>,
        assigned: &str,
    ) -> Result<Self> {
        let list = match snapshot {
            Some(snapshot) => crate::catalog::manifests::load_list(table, snapshot, assigned)
                .await?
                .entries()
                .to_vec(),
            None => vec![],
        };
        Ok(Self {
            parent: snapshot.cloned(),
            list,
            data: HashMap::new(),
        })
    }

    /// Every live data file, in manifest list order.
    pub(crate) fn live(&self) -> Vec<Live> {
        self.list
            .iter()
            .filter_map(|m| Some((m, self.data.get(&m.manifest_path)?)))
            .flat_map(|(manifest, read)| {
                read.entries()
                    .iter()
                    .filter(|e| e.is_alive())
                    .map(|e| Live {
                        spec_id: manifest.partition_spec_id,
                        file: e.data_file().clone(),
                    })
            })
            .collect()
    }
}

/// The rows `files` hold, from their manifest entries.
pub(crate) fn records(files: &[DataFile]) -> i64 {
    files.iter().map(|f| f.record_count() as i64).sum()
}

/// The bytes `files` take, from their manifest entries.
pub(crate) fn bytes(files: &[DataFile]) -> i64 {
    files.iter().map(|f| f.file_size_in_bytes() as i64).sum()
}

/// One attempt at a replacement, as [`write_replacement`] left it.
pub(crate) struct Staged {
    /// The snapshot, or `None` when a file to delete is no longer live.
    pub(crate) snapshot: Option<Snapshot>,
    /// The manifests and manifest list written (to delete when the
    /// snapshot is not committed).
    pub(crate) written: Vec<String>,
}

/// Writes the manifests and the manifest list of a snapshot of `base` on
/// top of the one `version` read (its parent) that marks `deleted` (live
/// data files of `base`) deleted and adds `added`, with `operation` and
/// `properties` in its summary besides the counts. `tag` and `attempt`
/// name the files.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_replacement(
    base: &Table,
    version: &Version,
    snapshot_id: i64,
    tag: &str,
    attempt: usize,
    deleted: &[DataFile],
    added: &[DataFile],
    operation: Operation,
    properties: HashMap<String, String>,
) -> Result<Staged> {
    let name = base.identifier().to_string();
    let metadata = base.metadata();
    let location = metadata.location();
    let schema = metadata.current_schema();
    let sequence_number = metadata.next_sequence_number();
    let paths: HashSet<&str> = deleted.iter().map(DataFile::file_path).collect();
    let parent = version.parent.as_ref();
    let mut staged = Staged {
        snapshot: None,
        written: vec![],
    };
    let mut manifests = vec![];
    let mut found = 0usize;
    for manifest in &version.list {
        let Some(read) = version.data.get(&manifest.manifest_path) else {
            manifests.push(manifest.clone());
            continue;
        };
        let hits = read
            .entries()
            .iter()
            .filter(|e| e.is_alive() && paths.contains(e.file_path()))
            .count();
        if hits == 0 {
            manifests.push(manifest.clone());
            continue;
        }
        found += hits;
        let spec = metadata
            .partition_spec_by_id(manifest.partition_spec_id)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{name}: manifest {} names partition spec {}, which its metadata lacks",
                    manifest.manifest_path, manifest.partition_spec_id
                ))
            })?;
        let path = format!(
            "{location}/metadata/icestage-{tag}-{snapshot_id}-{attempt}-m{}.avro",
            manifests.len()
        );
        let mut writer = ManifestWriterBuilder::new(
            base.file_io().new_output(&path)?,
            Some(snapshot_id),
            Arc::clone(schema),
            spec.as_ref().clone(),
        )
        .build_v2_data();
        staged.written.push(path);
        for entry in read.entries().iter().filter(|e| e.is_alive()) {
            let (added_in, sequence) =
                crate::catalog::manifests::kept_numbers(entry, manifest, &name)?;
            let file = entry.data_file().clone();
            if paths.contains(entry.file_path()) {
                writer.add_delete_file(file, sequence, entry.file_sequence_number)?;
            } else {
                writer.add_existing_file(file, added_in, sequence, entry.file_sequence_number)?;
            }
        }
        manifests.push(writer.write_manifest_file().await?);
    }
    if found != paths.len() {
        return Ok(staged);
    }
    if !added.is_empty() {
        let path = format!("{location}/metadata/icestage-{tag}-{snapshot_id}-{attempt}-added.avro");
        let mut writer = ManifestWriterBuilder::new(
            base.file_io().new_output(&path)?,
            Some(snapshot_id),
            Arc::clone(schema),
            metadata.default_partition_spec().as_ref().clone(),
        )
        .build_v2_data();
        staged.written.push(path);
        for file in added {
            writer.add_file(file.clone(), sequence_number)?;
        }
        // The new files first: a scan meets them before the old entries.
        manifests.insert(0, writer.write_manifest_file().await?);
    }
    let list_path = format!("{location}/metadata/snap-{snapshot_id}-{attempt}-icestage-{tag}.avro");
    let mut list_writer = ManifestListWriter::v2(
        base.file_io().new_output(&list_path)?.writer().await?,
        snapshot_id,
        parent.map(|p| p.snapshot_id()),
        sequence_number,
    );
    list_writer.add_manifests(manifests.into_iter())?;
    list_writer.close().await?;
    staged.written.push(list_path.clone());
    let mut summary = summary(parent.map(|p| p.as_ref()), deleted, added);
    summary.extend(properties);
    staged.snapshot = Some(
        Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
            .with_sequence_number(sequence_number)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation,
                additional_properties: summary,
            })
            .with_schema_id(metadata.current_schema_id())
            .build(),
    );
    Ok(staged)
}

/// Deletes `written` (what an attempt wrote, within `assigned`), which the
/// table does not reference: its commit was refused or never made.
pub(crate) async fn discard(base: &Table, written: &[String], assigned: &str) {
    for path in written {
        delete_within(base.file_io(), path, assigned).await;
    }
}

/// Commits `updates` (a snapshot whose manifests the attempt wrote,
/// `written`) on exactly `base`, a compare-and-swap ([`apply_append`]);
/// when refused, `written` is deleted (within `assigned`). The committed
/// metadata and its location, or the refusal.
pub(crate) async fn commit_written(
    catalog: &IcebergCatalog,
    base: &Table,
    updates: Vec<iceberg::TableUpdate>,
    written: &[String],
    assigned: &str,
) -> Result<std::result::Result<(String, iceberg::spec::TableMetadata), Refusal>> {
    let committed = apply_append(catalog, base, updates).await?;
    if committed.is_err() {
        discard(base, written, assigned).await;
    }
    Ok(committed)
}

/// The summary of a snapshot that replaces `deleted` with `added` on top of
/// `parent`: what was added and removed, and the parent's totals carried
/// forward.
fn summary(
    parent: Option<&Snapshot>,
    deleted: &[DataFile],
    added: &[DataFile],
) -> HashMap<String, String> {
    let count = |files: &[DataFile]| files.len() as i64;
    // A table's first snapshot starts from nothing; otherwise a total the
    // parent does not give stays unknown.
    let mut properties = match parent {
        Some(parent) => crate::catalog::snapshot::totals(parent),
        None => ["total-data-files", "total-files-size", "total-records"]
            .into_iter()
            .map(|key| (key.to_string(), "0".to_string()))
            .collect(),
    };
    let mut adjust = |key: &str, by: i64| {
        if let Some(total) = properties
            .get(key)
            .and_then(|v| v.parse::<i64>().ok())
            .map(|t| t + by)
        {
            properties.insert(key.to_string(), total.max(0).to_string());
        }
    };
    adjust("total-data-files", count(added) - count(deleted));
    adjust("total-files-size", bytes(added) - bytes(deleted));
    adjust("total-records", records(added) - records(deleted));
    for (key, value) in [
        ("added-data-files", count(added)),
        ("deleted-data-files", count(deleted)),
        ("added-records", records(added)),
        ("deleted-records", records(deleted)),
        ("added-files-size", bytes(added)),
        ("removed-files-size", bytes(deleted)),
    ] {
        properties.insert(key.to_string(), value.to_string());
    }
    properties
}

/// Tags snapshot `snapshot_id` of `table` as `name` (an Iceberg tag ref, so
/// any engine can read that snapshot by name), unless it is tagged so
/// already; a compare-and-swap from the version loaded, tried again when
/// another commit lands first. A tag of that name on another snapshot is
/// refused.
pub(crate) async fn tag_snapshot(
    catalog: &IcebergCatalog,
    table: &iceberg::TableIdent,
    name: &str,
    snapshot_id: i64,
) -> Result<()> {
    for _ in 0..OVERWRITE_ATTEMPTS {
        let version = catalog.catalog().load_table(table).await?;
        match version.metadata().snapshot_for_ref(name) {
            Some(tagged) if tagged.snapshot_id() == snapshot_id => return Ok(()),
            Some(tagged) => {
                return Err(Error::invalid(format!(
                    "{table} has a ref '{name}' on snapshot {}, not {snapshot_id}: drop it to tag \
                     this promotion",
                    tagged.snapshot_id()
                )));
            }
            None => {}
        }
        let tag = iceberg::TableUpdate::SetSnapshotRef {
            ref_name: name.to_string(),
            reference: iceberg::spec::SnapshotReference::new(
                snapshot_id,
                iceberg::spec::SnapshotRetention::Tag {
                    max_ref_age_ms: None,
                },
            ),
        };
        match apply_append(catalog, &version, vec![tag]).await? {
            Ok(_) => return Ok(()),
            Err(Refusal::Invalid(reason)) => return Err(Error::invalid(reason)),
            Err(Refusal::Conflict(_)) => retry_pause().await,
        }
    }
    Err(Error::Conflict(format!(
        "{table} kept changing while snapshot {snapshot_id} was tagged '{name}': promote again \
         to tag it"
    )))
}

/// What an overwrite does to one version of its table: the live files it
/// marks deleted and the files it adds (the promoted ones and, for files
/// that lose only some rows, their rewritten remainders).
#[derive(Debug, Clone, Default)]
pub(crate) struct Replaced {
    /// Live files of the version, marked deleted.
    pub(crate) deleted: Vec<DataFile>,
    /// Files added.
    pub(crate) added: Vec<DataFile>,
    /// Of `added`, the paths written for this version alone: deleted again
    /// when it is not the one committed.
    pub(crate) scratch: Vec<String>,
}

/// How an overwrite is planned on one version of its table: given the
/// version and its live files, what it deletes and adds there.
pub(crate) type Plan<'a> =
    Box<dyn FnMut(&Table, Vec<Live>) -> BoxFuture<'static, Result<Replaced>> + Send + 'a>;

/// How often an overwrite is planned again on a newer version before it
/// gives up.
const OVERWRITE_ATTEMPTS: u32 = 30;

/// Commits an overwrite carrying `evidence` to `table` exactly once: on each
/// attempt the table is loaded, a version that holds the evidence answers
/// (the snapshot, `false`), otherwise `plan` says what to delete and add on
/// that version, and the snapshot is committed on exactly that version (a
/// compare-and-swap: a commit that landed in between makes the attempt
/// start again, planned on the newer version). Returns the snapshot and
/// whether this call committed it.
pub(crate) async fn overwrite_once(
    catalog: &IcebergCatalog,
    table: &Table,
    evidence: &Evidence,
    tag: &str,
    properties: HashMap<String, String>,
    mut plan: Plan<'_>,
) -> Result<Landed> {
    let assigned = catalog.assigned_location(table).await?;
    // Files a plan wrote for some version (a rewritten file's other rows):
    // those the committed version does not add are deleted at the end.
    let mut scratch: HashSet<String> = HashSet::new();
    let outcome = attempts(
        catalog,
        table,
        evidence,
        (tag, &properties),
        &mut plan,
        &assigned,
        &mut scratch,
    )
    .await;
    let kept: HashSet<String> = match &outcome {
        Ok((_, added)) => added.clone(),
        Err(_) => HashSet::new(),
    };
    for path in scratch.difference(&kept) {
        delete_within(table.file_io(), path, &assigned).await;
    }
    outcome.map(|(landed, _)| landed)
}

/// The attempts of [`overwrite_once`]: where its changes landed, and the
/// paths it added.
async fn attempts(
    catalog: &IcebergCatalog,
    table: &Table,
    evidence: &Evidence,
    (tag, properties): (&str, &HashMap<String, String>),
    plan: &mut Plan<'_>,
    assigned: &str,
    scratch: &mut HashSet<String>,
) -> Result<(Landed, HashSet<String>)> {
    let name = table.identifier().to_string();
    let mut base = table.clone();
    for attempt in 0..OVERWRITE_ATTEMPTS {
        if attempt > 0 {
            base = catalog.catalog().load_table(table.identifier()).await?;
        }
        let base = &base;
        if let Some(snapshot_id) = evidence.found_in(base) {
            return Ok((Landed::before(snapshot_id), HashSet::new()));
        }
        check_format(base, "this promotion mode")?;
        let version = Version::read(base, assigned, "this promotion mode").await?;
        let replaced = plan(base, version.live()).await?;
        scratch.extend(replaced.scratch.iter().cloned());
        let snapshot_id = new_snapshot_id(base.metadata());
        let staged = write_replacement(
            base,
            &version,
            snapshot_id,
            tag,
            attempt as usize,
            &replaced.deleted,
            &replaced.added,
            Operation::Overwrite,
            evidence
                .properties()
                .into_iter()
                .chain(properties.clone())
                .collect(),
        )
        .await?;
        let committed = match staged.snapshot {
            Some(snapshot) => {
                let updates = add_as_head(snapshot, MAIN_BRANCH).into();
                commit_written(catalog, base, updates, &staged.written, assigned).await?
            }
            None => {
                discard(base, &staged.written, assigned).await;
                Err(Refusal::Conflict(format!("{name} changed")))
            }
        };
        match committed {
            Ok((location, metadata)) => {
                catalog.appended_version(base, metadata, location);
                let added = replaced
                    .added
                    .iter()
                    .map(|f| f.file_path().to_string())
                    .collect();
                return Ok((Landed::here(snapshot_id), added));
            }
            Err(Refusal::Invalid(reason)) => return Err(Error::invalid(reason)),
            Err(Refusal::Conflict(_)) => retry_pause().await,
        }
    }
    Err(Error::Conflict(format!(
        "{name} kept changing while this promotion was committed ({OVERWRITE_ATTEMPTS} attempts); \
         nothing was committed: promote again"
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::catalog::bridge::insert::append_rows;
    use crate::rows::Value;

    /// An overwrite whose table gains a commit between its plan and its
    /// commit plans again on the newer version (and so replaces what that
    /// commit added too); once committed, its evidence answers every later
    /// call without planning.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_overwrite_plans_again_on_a_newer_version_and_commits_once() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = crate::catalog::test_table(dir.path()).await;
        append_rows(&catalog, &table, &[vec![Value::Int(Some(1))]])
            .await
            .unwrap();
        let table = catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap();
        let added = crate::catalog::test_files(&table, vec![100]).await;
        let plans = Arc::new(AtomicUsize::new(0));
        let evidence = Evidence::new("test-overwrite", "once");
        let plan = |plans: Arc<AtomicUsize>,
                    catalog: IcebergCatalog,
                    added: Vec<DataFile>|
         -> Plan<'static> {
            Box::new(
                move |version: &Table, live: Vec<Live>| -> BoxFuture<'static, Result<Replaced>> {
                    let (plans, catalog, added, version) = (
                        Arc::clone(&plans),
                        catalog.clone(),
                        added.clone(),
                        version.clone(),
                    );
                    Box::pin(async move {
                        // The first plan loses the race to an append.
                        if plans.fetch_add(1, Ordering::SeqCst) == 0 {
                            append_rows(&catalog, &version, &[vec![Value::Int(Some(2))]]).await?;
                        }
                        Ok(Replaced {
                            deleted: live.into_iter().map(|l| l.file).collect(),
                            added,
                            scratch: vec![],
                        })
                    })
                },
            )
        };
        let landed = overwrite_once(
            &catalog,
            &table,
            &evidence,
            "test",
            HashMap::new(),
            plan(Arc::clone(&plans), catalog.clone(), added.clone()),
        )
        .await
        .unwrap();
        assert!(landed.committed_here);
        assert_eq!(
            plans.load(Ordering::SeqCst),
            2,
            "planned again after the append"
        );
        let now = catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap();
        let assigned = catalog.assigned_location(&now).await.unwrap();
        let live = Version::read(&now, &assigned, "test").await.unwrap().live();
        let paths: Vec<&str> = live.iter().map(|l| l.file.file_path()).collect();
        assert_eq!(
            paths,
            [added[0].file_path()],
            "the appended row was replaced too"
        );
        let summary = &now.metadata().current_snapshot().unwrap().summary();
        assert_eq!(summary.operation, Operation::Overwrite);
        assert_eq!(summary.additional_properties["total-records"], "1");
        assert_eq!(summary.additional_properties["deleted-data-files"], "2");

        let again = overwrite_once(
            &catalog,
            &now,
            &evidence,
            "test",
            HashMap::new(),
            plan(Arc::clone(&plans), catalog.clone(), added.clone()),
        )
        .await
        .unwrap();
        assert_eq!(again, Landed::before(landed.snapshot_id));
        assert_eq!(plans.load(Ordering::SeqCst), 2, "no plan once committed");
    }
}
