//! Rewriting a table's data manifests: a table appended to many times (a
//! target after thousands of promotions, one of icestage's logs) lists one
//! manifest per append, and planning a scan reads every one. The live
//! entries are written again into fewer manifests, in a `replace` snapshot
//! that changes no row: entries keep their snapshot ids and sequence
//! numbers, and the older snapshots (and their exactly-once evidence) stay.
//! The commit swaps the table's pointer from the version it read; a commit
//! in between makes it a conflict that changed nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use iceberg::TableUpdate;
use iceberg::spec::{
    FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, SnapshotReference, SnapshotRetention, Summary,
};
use iceberg::table::Table;

use super::IcebergCatalog;
use super::append::{Refusal, apply_append};
use super::commit::new_snapshot_id;
use crate::error::{Error, Result};

/// Table property: the sequence number of the last manifest rewrite.
pub(crate) const MERGED_AT: &str = "icestage.manifests-merged-at";
/// Table property: how many entries the last manifest rewrite wrote.
pub(crate) const MERGED_ENTRIES: &str = "icestage.manifests-merged-entries";

/// What [`rewrite_manifests`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rewrite {
    /// Nothing to merge: the data manifests there are.
    Nothing { manifests: i64, why: String },
    /// Committed.
    Done {
        before: i64,
        after: i64,
        files: i64,
        snapshot_id: i64,
    },
}

/// Rewrites the data manifests of `table`: one per partition spec, or, with
/// `per_manifest`, manifests of at most that many entries, the entries
/// sorted by partition so each manifest covers a narrow range of partition
/// values (a lookup by partition value reads one).
pub(crate) async fn rewrite_manifests(
    catalog: &IcebergCatalog,
    table: &Table,
    per_manifest: Option<usize>,
) -> Result<Rewrite> {
    let metadata = table.metadata();
    let name = table.identifier().to_string();
    let Some(current) = metadata.current_snapshot() else {
        return Ok(Rewrite::Nothing {
            manifests: 0,
            why: format!("{name} has no snapshot: nothing to rewrite"),
        });
    };
    if metadata.format_version() == FormatVersion::V1 {
        return Err(Error::NotSupported(format!(
            "REWRITE MANIFESTS needs an Iceberg v2 table; {name} is v1"
        )));
    }
    let list = table.manifest_list_reader(current).load().await?;
    let (data, other): (Vec<&ManifestFile>, Vec<&ManifestFile>) = list
        .entries()
        .iter()
        .partition(|m| m.content == ManifestContentType::Data);
    let mut by_spec: BTreeMap<i32, Vec<&ManifestFile>> = BTreeMap::new();
    for manifest in &data {
        by_spec
            .entry(manifest.partition_spec_id)
            .or_default()
            .push(manifest);
    }
    let before = data.len() as i64;
    let wanted = |group: &[&ManifestFile]| {
        let entries: i64 = group
            .iter()
            .map(|m| {
                i64::from(m.added_files_count.unwrap_or(0))
                    + i64::from(m.existing_files_count.unwrap_or(0))
            })
            .sum();
        per_manifest.map_or(1, |n| (entries as usize).div_ceil(n.max(1)).max(1))
    };
    if by_spec.values().all(|group| group.len() <= wanted(group)) {
        return Ok(Rewrite::Nothing {
            manifests: before,
            why: format!("{name} has as few data manifests as its entries need already"),
        });
    }

    let snapshot_id = new_snapshot_id(metadata);
    let location = metadata.location();
    let schema = metadata.current_schema();
    let mut merged = vec![];
    let mut files = 0i64;
    for (spec_id, group) in by_spec {
        let spec = metadata.partition_spec_by_id(spec_id).ok_or_else(|| {
            Error::invalid(format!(
                "{name}: a manifest names partition spec {spec_id}, which its metadata lacks"
            ))
        })?;
        let mut entries = vec![];
        for manifest in group {
            let read = manifest.load_manifest(table.file_io()).await?;
            for entry in read.entries().iter().filter(|e| e.is_alive()) {
                let (Some(added_in), Some(sequence)) =
                    (entry.snapshot_id(), entry.sequence_number())
                else {
                    return Err(Error::invalid(format!(
                        "{name}: manifest {} has an entry without its snapshot or sequence number",
                        manifest.manifest_path
                    )));
                };
                entries.push((
                    format!("{:?}", entry.data_file().partition()),
                    entry.data_file().clone(),
                    added_in,
                    sequence,
                    entry.file_sequence_number,
                ));
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let chunk = per_manifest.unwrap_or(usize::MAX).max(1);
        for (n, part) in entries.chunks(chunk).enumerate() {
            let output = table.file_io().new_output(format!(
                "{location}/metadata/icestage-rewrite-{snapshot_id}-{spec_id}-m{n}.avro"
            ))?;
            let mut writer = ManifestWriterBuilder::new(
                output,
                Some(snapshot_id),
                Arc::clone(schema),
                spec.as_ref().clone(),
            )
            .build_v2_data();
            for (_, file, added_in, sequence, file_sequence) in part {
                writer.add_existing_file(file.clone(), *added_in, *sequence, *file_sequence)?;
                files += 1;
            }
            merged.push(writer.write_manifest_file().await?);
        }
    }
    let after = merged.len() as i64;
    let list_path = format!("{location}/metadata/snap-{snapshot_id}-icestage-rewrite.avro");
    let sequence_number = metadata.next_sequence_number();
    let mut list_writer = ManifestListWriter::v2(
        table.file_io().new_output(&list_path)?.writer().await?,
        snapshot_id,
        Some(current.snapshot_id()),
        sequence_number,
    );
    list_writer.add_manifests(merged.into_iter().chain(other.into_iter().cloned()))?;
    list_writer.close().await?;

    // The table's totals do not change; a replace says so.
    let totals: std::collections::HashMap<String, String> = current
        .summary()
        .additional_properties
        .iter()
        .filter(|(k, _)| k.starts_with("total-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(Some(current.snapshot_id()))
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .with_manifest_list(list_path)
        .with_summary(Summary {
            operation: Operation::Replace,
            additional_properties: totals,
        })
        .with_schema_id(metadata.current_schema_id())
        .build();
    let updates = vec![
        // When and how much was merged: what tells the next merge when it
        // is due (see `insert::append_rows`).
        TableUpdate::SetProperties {
            updates: std::collections::HashMap::from([
                (MERGED_AT.to_string(), sequence_number.to_string()),
                (MERGED_ENTRIES.to_string(), files.to_string()),
            ]),
        },
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: SnapshotReference::new(
                snapshot_id,
                SnapshotRetention::branch(None, None, None),
            ),
        },
    ];
    match apply_append(catalog, table, updates).await? {
        Ok(_) => Ok(Rewrite::Done {
            before,
            after,
            files,
            snapshot_id,
        }),
        Err(Refusal::Conflict(_) | Refusal::Invalid(_)) => Err(Error::Conflict(format!(
            "{name} changed while its manifests were rewritten; nothing was changed: run REWRITE MANIFESTS again"
        ))),
    }
}
