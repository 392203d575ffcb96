//! Rewriting a table's small data files into fewer, larger ones (`REWRITE
//! DATA FILES`): what to rewrite ([`choose`]) and the commit of what was
//! written in its place ([`commit_packed`]). Reading the chosen files and
//! writing the new ones is the caller's (`tables::maintain`), through the
//! one Parquet writer.
//!
//! The commit is a `replace` snapshot: the rewritten files are marked
//! deleted in the manifests that listed them, the new files are added in a
//! manifest of their own, every other entry keeps its snapshot id and
//! sequence number, and every older snapshot (the exactly-once evidence of
//! promotions and copies) stays. Appends that land while the files are
//! rewritten do not undo it: the commit is put on top of the version they
//! made, as long as every file it rewrote is still live there; a commit
//! that removed one of them (another rewrite, a delete) wins, and this one
//! changes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use iceberg::TableUpdate;
use iceberg::spec::{
    DataFile, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, Summary,
};
use iceberg::table::Table;

use super::IcebergCatalog;
use super::append::{Refusal, apply_append};
use super::confine::{delete_within, is_under};
use super::snapshot::{add_as_head, new_snapshot_id};
use crate::error::{Error, Result};

/// Table property: the sequence number of the last data-file rewrite
/// (what tells the background rewrite when the next one is due).
pub(crate) const PACKED_AT: &str = "icestage.data-files-rewritten-at";

/// Times a rewrite is put on top of commits that landed meanwhile.
const REBASES: usize = 8;

/// Which files [`choose`] picks.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    /// The size new files are written to; a file smaller than three
    /// quarters of it is small (Iceberg's `min-file-size-bytes` default).
    pub(crate) target_file_size: u64,
    /// A partition is rewritten when it holds at least this many small
    /// files (at least 2).
    pub(crate) min_input_files: usize,
}

/// The small files of one partition, rewritten together.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// Its files, by path.
    pub(crate) files: Vec<DataFile>,
}

/// What [`choose`] found.
#[derive(Debug, Clone)]
pub(crate) struct Packing {
    /// Live data files of the table.
    pub(crate) live_files: i64,
    /// The groups to rewrite (none: nothing to do, see `why`).
    pub(crate) groups: Vec<Group>,
    /// Why nothing is rewritten, when `groups` is empty.
    pub(crate) why: String,
    /// Small files left because they lie outside the table's location and
    /// the staging tables' (never read: see the trust boundary).
    pub(crate) outside: i64,
}

impl Packing {
    /// Keeps only the files in `only` (those a `where` predicate may
    /// match), and the groups still holding `min_input_files` of them.
    pub(crate) fn restrict(&mut self, only: &HashSet<String>, min_input_files: usize) {
        for group in &mut self.groups {
            group.files.retain(|f| only.contains(f.file_path()));
        }
        let min = min_input_files.max(2);
        self.groups.retain(|g| g.files.len() >= min);
        if self.groups.is_empty() && self.why.is_empty() {
            self.why = format!(
                "no partition holds {min} or more small data files that the where predicate may \
                 match: nothing to rewrite"
            );
        }
    }
}

/// What [`commit_packed`] committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Packed {
    /// The `replace` snapshot.
    pub(crate) snapshot_id: i64,
    /// Times it was put on top of commits that landed meanwhile.
    pub(crate) rebased: usize,
}

/// Refuses tables whose data files this rewrite cannot keep exact: v1
/// (no sequence numbers to keep) and v3 (row lineage to carry) tables.
fn check_format(table: &Table) -> Result<()> {
    let version = table.metadata().format_version();
    if version != FormatVersion::V2 {
        return Err(Error::NotSupported(format!(
            "REWRITE DATA FILES needs an Iceberg v2 table; {} is {version}: nothing was changed",
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

/// Picks the small files of `table`'s current snapshot to rewrite, by
/// partition: Parquet files smaller than three quarters of the target
/// size, lying under the table's location or one of `roots` (where
/// promotions leave the files they register), in partitions holding at
/// least `min_input_files` of them. Every manifest is read as a client's
/// file, confined to the table's location.
pub(crate) async fn choose(
    catalog: &IcebergCatalog,
    table: &Table,
    choice: &Choice,
    roots: &[String],
) -> Result<Packing> {
    let name = table.identifier().to_string();
    let metadata = table.metadata();
    let nothing = |live_files, why: String| Packing {
        live_files,
        groups: vec![],
        why,
        outside: 0,
    };
    let Some(current) = metadata.current_snapshot() else {
        return Ok(nothing(
            0,
            format!("{name} has no snapshot: nothing to rewrite"),
        ));
    };
    check_format(table)?;
    let assigned = catalog.assigned_location(table).await?;
    let list = super::manifest::load_list(table, current, &assigned).await?;
    if live_deletes(list.entries()) > 0 {
        return Err(Error::NotSupported(format!(
            "{name} has row-level deletes (delete files), which REWRITE DATA FILES does not apply \
             yet: rewrite it with an engine that does (Spark's rewrite_data_files); nothing was \
             changed"
        )));
    }
    let small = choice.target_file_size.saturating_mul(3) / 4;
    let mut live_files = 0i64;
    let mut outside = 0i64;
    let mut by_partition: BTreeMap<(i32, String), Vec<DataFile>> = BTreeMap::new();
    for manifest in list
        .entries()
        .iter()
        .filter(|m| m.content == ManifestContentType::Data)
    {
        let read = super::manifest::load(table, manifest, &assigned).await?;
        for entry in read.entries().iter().filter(|e| e.is_alive()) {
            live_files += 1;
            let file = entry.data_file();
            if file.file_size_in_bytes() >= small
                || file.file_format() != iceberg::spec::DataFileFormat::Parquet
            {
                continue;
            }
            let inside = std::iter::once(assigned.as_str())
                .chain(roots.iter().map(String::as_str))
                .any(|root| is_under(file.file_path(), root));
            if !inside {
                outside += 1;
                continue;
            }
            by_partition
                .entry((
                    manifest.partition_spec_id,
                    format!("{:?}", file.partition()),
                ))
                .or_default()
                .push(file.clone());
        }
    }
    let min = choice.min_input_files.max(2);
    let groups: Vec<Group> = by_partition
        .into_iter()
        .filter(|(_, files)| files.len() >= min)
        .map(|(_, mut files)| {
            files.sort_by(|a, b| a.file_path().cmp(b.file_path()));
            Group { files }
        })
        .collect();
    let why = if groups.is_empty() {
        format!(
            "no partition of {name} holds {min} or more data files smaller than {} (three \
             quarters of the target file size): nothing to rewrite",
            crate::limits::human(small)
        )
    } else {
        String::new()
    };
    Ok(Packing {
        live_files,
        groups,
        why,
        outside,
    })
}

/// Commits `added` (written from exactly the rows of `rewritten`) in place
/// of `rewritten`, in one `replace` snapshot on `table`'s main branch, put
/// on top of the commits that land meanwhile as long as every rewritten
/// file is still live. On a conflict nothing is changed and the files and
/// manifests written are deleted again (under the table's location only).
pub(crate) async fn commit_packed(
    catalog: &IcebergCatalog,
    table: &Table,
    rewritten: &[DataFile],
    added: &[DataFile],
) -> Result<Packed> {
    let name = table.identifier().to_string();
    check_format(table)?;
    let assigned = catalog.assigned_location(table).await?;
    let paths: HashSet<&str> = rewritten.iter().map(DataFile::file_path).collect();
    let snapshot_id = new_snapshot_id(table.metadata());
    let mut written: Vec<String> = vec![];
    let mut base = table.clone();
    let mut why = format!(
        "{name} changed while its data files were rewritten (another rewrite or a commit that \
         removed files)"
    );
    for attempt in 0..REBASES {
        let metadata = base.metadata();
        let Some(parent) = metadata.current_snapshot() else {
            break;
        };
        let list = super::manifest::load_list(&base, parent, &assigned).await?;
        if live_deletes(list.entries()) > 0 {
            why = format!("{name} gained row-level deletes while its data files were rewritten");
            break;
        }
        let location = metadata.location();
        let schema = metadata.current_schema();
        let sequence_number = metadata.next_sequence_number();
        let mut manifests = vec![];
        let mut found = 0usize;
        for manifest in list.entries() {
            if manifest.content != ManifestContentType::Data {
                manifests.push(manifest.clone());
                continue;
            }
            let read = super::manifest::load(&base, manifest, &assigned).await?;
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
                "{location}/metadata/icestage-packed-{snapshot_id}-{attempt}-m{}.avro",
                manifests.len()
            );
            let mut writer = ManifestWriterBuilder::new(
                base.file_io().new_output(&path)?,
                Some(snapshot_id),
                Arc::clone(schema),
                spec.as_ref().clone(),
            )
            .build_v2_data();
            written.push(path);
            for entry in read.entries().iter().filter(|e| e.is_alive()) {
                let (added_in, sequence) = super::manifest::kept_numbers(entry, manifest, &name)?;
                let file = entry.data_file().clone();
                if paths.contains(entry.file_path()) {
                    writer.add_delete_file(file, sequence, entry.file_sequence_number)?;
                } else {
                    writer.add_existing_file(
                        file,
                        added_in,
                        sequence,
                        entry.file_sequence_number,
                    )?;
                }
            }
            manifests.push(writer.write_manifest_file().await?);
        }
        if found != paths.len() {
            break;
        }
        if !added.is_empty() {
            let path =
                format!("{location}/metadata/icestage-packed-{snapshot_id}-{attempt}-added.avro");
            let mut writer = ManifestWriterBuilder::new(
                base.file_io().new_output(&path)?,
                Some(snapshot_id),
                Arc::clone(schema),
                metadata.default_partition_spec().as_ref().clone(),
            )
            .build_v2_data();
            written.push(path);
            for file in added {
                writer.add_file(file.clone(), sequence_number)?;
            }
            // The new files first: a scan meets them before the old entries.
            manifests.insert(0, writer.write_manifest_file().await?);
        }
        let list_path =
            format!("{location}/metadata/snap-{snapshot_id}-{attempt}-icestage-packed.avro");
        let mut list_writer = ManifestListWriter::v2(
            base.file_io().new_output(&list_path)?.writer().await?,
            snapshot_id,
            Some(parent.snapshot_id()),
            sequence_number,
        );
        list_writer.add_manifests(manifests.into_iter())?;
        list_writer.close().await?;
        written.push(list_path.clone());

        let snapshot = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(Some(parent.snapshot_id()))
            .with_sequence_number(sequence_number)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation: Operation::Replace,
                additional_properties: summary(parent, rewritten, added),
            })
            .with_schema_id(metadata.current_schema_id())
            .build();
        let mut updates = vec![TableUpdate::SetProperties {
            updates: HashMap::from([(PACKED_AT.to_string(), sequence_number.to_string())]),
        }];
        updates.extend(add_as_head(snapshot, MAIN_BRANCH));
        match apply_append(catalog, &base, updates).await? {
            Ok(_) => {
                return Ok(Packed {
                    snapshot_id,
                    rebased: attempt,
                });
            }
            Err(Refusal::Invalid(reason)) => {
                why = reason;
                break;
            }
            Err(Refusal::Conflict(_)) => {
                base = catalog.catalog().load_table(base.identifier()).await?;
            }
        }
    }
    // Nothing refers to what this rewrite wrote: an orphan is harmless, but
    // these are known.
    let new_files = added.iter().map(|f| f.file_path().to_string());
    for path in written.into_iter().chain(new_files) {
        delete_within(table.file_io(), &path, &assigned).await;
    }
    Err(Error::Conflict(format!(
        "{why}; nothing was changed: run REWRITE DATA FILES again"
    )))
}

/// The rows `files` hold, from their manifest entries.
pub(crate) fn records(files: &[DataFile]) -> i64 {
    files.iter().map(|f| f.record_count() as i64).sum()
}

/// The bytes `files` take, from their manifest entries.
pub(crate) fn bytes(files: &[DataFile]) -> i64 {
    files.iter().map(|f| f.file_size_in_bytes() as i64).sum()
}

/// The summary of a rewrite of `rewritten` as `added` on top of `parent`:
/// what was added and removed, and the parent's totals carried forward
/// (the records stay, the files and bytes change).
fn summary(
    parent: &Snapshot,
    rewritten: &[DataFile],
    added: &[DataFile],
) -> HashMap<String, String> {
    let count = |files: &[DataFile]| files.len() as i64;
    let mut properties = super::snapshot::totals(parent);
    let mut adjust = |key: &str, by: i64| {
        if let Some(total) = properties
            .get(key)
            .and_then(|v| v.parse::<i64>().ok())
            .map(|t| t + by)
        {
            properties.insert(key.to_string(), total.max(0).to_string());
        }
    };
    adjust("total-data-files", count(added) - count(rewritten));
    adjust("total-files-size", bytes(added) - bytes(rewritten));
    for (key, value) in [
        ("added-data-files", count(added)),
        ("deleted-data-files", count(rewritten)),
        ("added-records", records(added)),
        ("deleted-records", records(rewritten)),
        ("added-files-size", bytes(added)),
        ("removed-files-size", bytes(rewritten)),
    ] {
        properties.insert(key.to_string(), value.to_string());
    }
    properties
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, RecordBatch};

    use super::*;
    use crate::catalog::insert::append_rows;
    use crate::rows::Value;

    async fn reload(catalog: &IcebergCatalog, table: &Table) -> Table {
        catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap()
    }

    /// `ids` written as new files of `table` (not committed).
    async fn written(table: &Table, ids: Vec<i64>) -> Vec<DataFile> {
        let schema = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap(),
        );
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(ids))]).unwrap();
        super::super::writer::write_rows(
            table,
            &format!("packed-test-{}", uuid::Uuid::new_v4().simple()),
            futures::stream::iter([Ok(batch)]),
        )
        .await
        .unwrap()
    }

    /// An append that lands between the choice and the commit stays: the
    /// rewrite is put on top of it. The same rewrite again finds its files
    /// gone and changes nothing.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_rewrite_goes_on_top_of_appends_and_never_twice() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut table) = super::super::test_table(dir.path()).await;
        for id in 0..3 {
            append_rows(&catalog, &table, &[vec![Value::Int(Some(id))]])
                .await
                .unwrap();
            table = reload(&catalog, &table).await;
        }
        let choice = Choice {
            target_file_size: 1 << 20,
            min_input_files: 2,
        };
        let packing = choose(&catalog, &table, &choice, &[]).await.unwrap();
        assert_eq!(packing.live_files, 3);
        assert_eq!(packing.groups.len(), 1);
        let rewritten = packing.groups[0].files.clone();
        assert_eq!(rewritten.len(), 3);
        let added = written(&table, vec![0, 1, 2]).await;

        append_rows(&catalog, &table, &[vec![Value::Int(Some(9))]])
            .await
            .unwrap();
        let packed = commit_packed(&catalog, &table, &rewritten, &added)
            .await
            .unwrap();
        assert!(packed.rebased >= 1, "{packed:?}");
        let now = reload(&catalog, &table).await;
        let after = choose(&catalog, &now, &choice, &[]).await.unwrap();
        assert_eq!(after.live_files, 2, "the packed file and the late append");
        let head = now.metadata().current_snapshot().unwrap();
        assert_eq!(head.summary().operation, Operation::Replace);
        let summary = &head.summary().additional_properties;
        assert_eq!(summary["deleted-data-files"], "3");
        assert_eq!(summary["added-data-files"], "1");
        assert_eq!(summary["total-records"], "4");
        assert_eq!(summary["total-data-files"], "2");

        let again = written(&now, vec![0, 1, 2]).await;
        let lost = commit_packed(&catalog, &now, &rewritten, &again)
            .await
            .unwrap_err();
        assert!(
            matches!(lost, Error::Conflict(_))
                && lost.to_string().contains("run REWRITE DATA FILES again"),
            "{lost}"
        );
        let unchanged = reload(&catalog, &now).await;
        assert_eq!(
            unchanged.metadata().current_snapshot_id(),
            now.metadata().current_snapshot_id()
        );
        for file in &again {
            let path = file.file_path().trim_start_matches("file://");
            assert!(!std::path::Path::new(path).exists(), "{path} was left");
        }
    }
}
