//! Snapshots and table versions as icestage writes them: the small helpers
//! the commit protocol, manifest rewrites and the REST front share. A leaf:
//! it imports no other file of this folder.

use iceberg::ErrorKind;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;

/// An unexpected failure of a catalog or store, with `message`.
pub(crate) fn unexpected(message: String) -> iceberg::Error {
    iceberg::Error::new(ErrorKind::Unexpected, message)
}

/// A snapshot id, positive and not yet used in `metadata`, for a snapshot
/// icestage writes itself (a manifest rewrite, a version mark).
pub(crate) fn new_snapshot_id(metadata: &iceberg::spec::TableMetadata) -> i64 {
    loop {
        let id = rand::random::<i64>() & i64::MAX;
        if id != 0 && metadata.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// The updates that add `snapshot` and make it the head of branch `branch`.
pub(crate) fn add_as_head(
    snapshot: iceberg::spec::Snapshot,
    branch: &str,
) -> [iceberg::TableUpdate; 2] {
    let id = snapshot.snapshot_id();
    [
        iceberg::TableUpdate::AddSnapshot { snapshot },
        iceberg::TableUpdate::SetSnapshotRef {
            ref_name: branch.to_string(),
            reference: iceberg::spec::SnapshotReference::new(
                id,
                iceberg::spec::SnapshotRetention::branch(None, None, None),
            ),
        },
    ]
}

/// The snapshots of branch `branch` of `metadata`: its head, then the
/// head's ancestors, each at most once whatever the parents say.
pub(crate) fn ancestry<'a>(
    metadata: &'a TableMetadata,
    branch: &str,
) -> impl Iterator<Item = &'a iceberg::spec::SnapshotRef> + 'a {
    std::iter::successors(metadata.snapshot_for_ref(branch), |s| {
        metadata.snapshot_by_id(s.parent_snapshot_id()?)
    })
    .take(metadata.snapshots().count())
}

/// A randomised pause before a commit is tried again on a newer version.
pub(crate) async fn retry_pause() {
    let pause = 10 + rand::random::<u64>() % 90;
    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
}

/// Summary property `key` of snapshot `snapshot_id` of `table`, if the
/// snapshot exists and has it.
pub(crate) fn summary_property(table: &Table, snapshot_id: i64, key: &str) -> Option<String> {
    table
        .metadata()
        .snapshot_by_id(snapshot_id)?
        .summary()
        .additional_properties
        .get(key)
        .cloned()
}

/// A branch or tag of a table: the snapshot it names, and whether it is a
/// branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ref {
    /// The snapshot.
    pub(crate) snapshot_id: i64,
    /// A branch (else a tag).
    pub(crate) branch: bool,
}

/// Every branch and tag of `metadata`, by name (iceberg-rust keeps them
/// private; its serialized form lists them).
pub(crate) fn refs(metadata: &TableMetadata) -> std::collections::HashMap<String, Ref> {
    let refs = serde_json::to_value(metadata)
        .ok()
        .and_then(|m| m.get("refs").and_then(|r| r.as_object()).cloned())
        .unwrap_or_default();
    refs.into_iter()
        .filter_map(|(name, found)| {
            let snapshot_id = found.get("snapshot-id")?.as_i64()?;
            let branch = found.get("type").and_then(|t| t.as_str()) == Some("branch");
            Some((
                name,
                Ref {
                    snapshot_id,
                    branch,
                },
            ))
        })
        .collect()
}

/// The `total-*` counts of `snapshot`'s summary (what a snapshot on top of
/// it carries forward).
pub(crate) fn totals(
    snapshot: &iceberg::spec::Snapshot,
) -> std::collections::HashMap<String, String> {
    snapshot
        .summary()
        .additional_properties
        .iter()
        .filter(|(k, _)| k.starts_with("total-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `base` at its next version: `metadata`, written at `location`.
pub(crate) fn successor(
    base: &Table,
    metadata: TableMetadata,
    location: String,
) -> iceberg::Result<Table> {
    Table::builder()
        .identifier(base.identifier().clone())
        .file_io(base.file_io().clone())
        .metadata(metadata)
        .metadata_location(location)
        .runtime(iceberg::Runtime::current())
        .build()
}
