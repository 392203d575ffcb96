//! Rewriting a table's data manifests: a table appended to many times (a
//! target after thousands of promotions, one of icestage's logs) lists one
//! manifest per append, and planning a scan reads every one. The live
//! entries are written again into fewer manifests, in a `replace` snapshot
//! that changes no row: entries keep their snapshot ids and sequence
//! numbers, and the older snapshots (and their exactly-once evidence) stay.
//! The commit swaps the table's pointer from the version it read; a commit
//! in between makes it a conflict that changed nothing.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use iceberg::TableUpdate;
use iceberg::spec::{
    FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, Summary,
};
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::commit::append::{Refusal, apply_append};
use crate::catalog::snapshot::{add_as_head, new_snapshot_id};
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

/// How [`rewrite_manifests`] lays a table's data manifests out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Every data manifest merged into one per partition spec (`REWRITE
    /// MANIFESTS`: a scan plans from as few files as there can be).
    OnePerSpec,
    /// Levels, for a table appended to one small manifest at a time (the
    /// logs icestage owns), so that what a merge rewrites and what a lookup
    /// reads stay bounded as the table grows:
    /// - level 0: the manifests appends wrote since the last merge;
    /// - level 1: one run of at most `level_one` entries, sorted by
    ///   partition in manifests of `per_manifest` entries;
    /// - level 2: every older entry, sorted the same way.
    ///
    /// A merge folds level 0 into level 1, and only when level 1 would
    /// outgrow `level_one` everything into level 2: a level-1 merge rewrites
    /// at most `level_one` entries, a level-2 merge happens once per
    /// `level_one` entries appended. A lookup by partition value reads the
    /// manifest list (level 0's few, level 1's `level_one / per_manifest`,
    /// and one per `per_manifest` entries of level 2) and about one manifest
    /// per level besides the level-0 ones holding the value.
    Levels { per_manifest: usize, level_one: i64 },
}

/// The level of a data manifest in [`Layout::Levels`], by the name it was
/// written under (a manifest icestage did not merge is level 0; a
/// [`Layout::OnePerSpec`] rewrite counts as level 2).
pub(crate) fn level(manifest: &ManifestFile) -> u8 {
    let name = manifest
        .manifest_path
        .rsplit('/')
        .next()
        .unwrap_or_default();
    if name.starts_with("icestage-l1-") {
        1
    } else if name.starts_with("icestage-l2-") || name.starts_with("icestage-rewrite-") {
        2
    } else {
        0
    }
}

/// Entries a manifest lists (added and existing), from the manifest list.
fn entries(manifest: &ManifestFile) -> i64 {
    i64::from(manifest.added_files_count.unwrap_or(0))
        + i64::from(manifest.existing_files_count.unwrap_or(0))
}

/// Rewrites the data manifests of `table` as `layout` says, the entries
/// sorted by partition so each manifest covers a narrow range of partition
/// values (a lookup by partition value reads one per level).
pub(crate) async fn rewrite_manifests(
    catalog: &IcebergCatalog,
    table: &Table,
    layout: Layout,
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
    // A target's manifests may be another writer's: read as a client's.
    let assigned = catalog.assigned_location(table).await?;
    let list = crate::catalog::manifests::load_list(table, current, &assigned).await?;
    let data: Vec<&ManifestFile> = list
        .entries()
        .iter()
        .filter(|m| m.content == ManifestContentType::Data)
        .collect();
    let before = data.len() as i64;
    // What is rewritten, by spec, and under which name (level).
    let mut by_spec: BTreeMap<i32, Vec<&ManifestFile>> = BTreeMap::new();
    let (prefix, per_manifest) = match layout {
        Layout::OnePerSpec => {
            for manifest in &data {
                by_spec
                    .entry(manifest.partition_spec_id)
                    .or_default()
                    .push(manifest);
            }
            if by_spec.values().all(|group| group.len() <= 1) {
                return Ok(Rewrite::Nothing {
                    manifests: before,
                    why: format!("{name} has as few data manifests as its entries need already"),
                });
            }
            ("icestage-rewrite", usize::MAX)
        }
        Layout::Levels {
            per_manifest,
            level_one,
        } => {
            let upper: i64 = data
                .iter()
                .filter(|m| level(m) < 2)
                .map(|m| entries(m))
                .sum();
            if !data.iter().any(|m| level(m) == 0) {
                return Ok(Rewrite::Nothing {
                    manifests: before,
                    why: format!("{name} has no data manifest appended since its last merge"),
                });
            }
            let (top, prefix) = if upper > level_one {
                (2, "icestage-l2")
            } else {
                (1, "icestage-l1")
            };
            for manifest in data.iter().filter(|m| level(m) <= top) {
                by_spec
                    .entry(manifest.partition_spec_id)
                    .or_default()
                    .push(manifest);
            }
            (prefix, per_manifest.max(1))
        }
    };

    // The manifests this rewrite replaces.
    let rewritten: HashSet<&str> = by_spec
        .values()
        .flatten()
        .map(|m| m.manifest_path.as_str())
        .collect();
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
            let read = crate::catalog::manifests::load(table, manifest, &assigned).await?;
            for entry in read.entries().iter().filter(|e| e.is_alive()) {
                let (added_in, sequence) =
                    crate::catalog::manifests::kept_numbers(entry, manifest, &name)?;
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
        for (n, part) in entries.chunks(per_manifest).enumerate() {
            let output = table.file_io().new_output(format!(
                "{location}/metadata/{prefix}-{snapshot_id}-{spec_id}-m{n}.avro"
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
    let after = before - rewritten.len() as i64 + merged.len() as i64;

    // Appends that land while the entries are rewritten do not undo it: the
    // rewrite is put on top of the version they made, as long as every
    // manifest it replaces is still there (a concurrent rewrite of the same
    // manifests wins, and this one changes nothing).
    let mut base = table.clone();
    let mut refused_lists = vec![];
    for attempt in 0..REBASES {
        let metadata = base.metadata();
        let Some(parent) = metadata.current_snapshot() else {
            break;
        };
        // What the version holds besides what is rewritten: on the first
        // attempt, the list read above.
        let reloaded;
        let now = if attempt == 0 {
            &list
        } else {
            reloaded = crate::catalog::manifests::load_list(&base, parent, &assigned).await?;
            &reloaded
        };
        let listed: HashSet<&str> = now
            .entries()
            .iter()
            .map(|m| m.manifest_path.as_str())
            .collect();
        if !rewritten.iter().all(|path| listed.contains(path)) {
            break;
        }
        let others = now
            .entries()
            .iter()
            .filter(|m| !rewritten.contains(m.manifest_path.as_str()))
            .cloned();
        let list_path =
            format!("{location}/metadata/snap-{snapshot_id}-{attempt}-icestage-rewrite.avro");
        let sequence_number = metadata.next_sequence_number();
        let mut list_writer = ManifestListWriter::v2(
            base.file_io().new_output(&list_path)?.writer().await?,
            snapshot_id,
            Some(parent.snapshot_id()),
            sequence_number,
        );
        list_writer.add_manifests(merged.iter().cloned().chain(others))?;
        list_writer.close().await?;

        // The table's totals do not change; a replace says so.
        let totals = crate::catalog::snapshot::totals(parent);
        let snapshot = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(Some(parent.snapshot_id()))
            .with_sequence_number(sequence_number)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path.clone())
            .with_summary(Summary {
                operation: Operation::Replace,
                additional_properties: totals,
            })
            .with_schema_id(metadata.current_schema_id())
            .build();
        // When and how much was merged: what tells the next merge when it
        // is due (see `upkeep`).
        let mut updates = vec![TableUpdate::SetProperties {
            updates: std::collections::HashMap::from([
                (MERGED_AT.to_string(), sequence_number.to_string()),
                (MERGED_ENTRIES.to_string(), files.to_string()),
            ]),
        }];
        updates.extend(add_as_head(snapshot, MAIN_BRANCH));
        match apply_append(catalog, &base, updates).await? {
            Ok(_) => {
                return Ok(Rewrite::Done {
                    before,
                    after,
                    files,
                    snapshot_id,
                });
            }
            Err(refusal) => {
                refused_lists.push(list_path);
                if matches!(refusal, Refusal::Invalid(_)) {
                    break;
                }
                base = catalog.catalog().load_table(base.identifier()).await?;
            }
        }
    }
    // Nothing refers to what this rewrite wrote (every commit of it was
    // refused): best effort, an orphan is harmless, only untidy.
    let written = merged.iter().map(|m| m.manifest_path.clone());
    for path in written.chain(refused_lists) {
        crate::catalog::confine::delete_within(table.file_io(), &path, &assigned).await;
    }
    Err(Error::Conflict(format!(
        "{name} changed while its manifests were rewritten (another rewrite or a commit that \
         removed files); nothing was changed: run REWRITE MANIFESTS again"
    )))
}

/// Times a rewrite is put on top of appends that landed meanwhile.
const REBASES: usize = 8;
