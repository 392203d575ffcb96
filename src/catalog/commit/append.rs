//! A commit a client sends through icestage's REST catalog, taken as a claim:
//! accepted only when it is an append (one new snapshot with operation
//! `append`, set as `main`, its files under the table's assigned location),
//! checked against the requirements that pin the version it was built on,
//! and applied by icestage itself on exactly that version (a compare-and-swap
//! of the metadata pointer, [`crate::catalog::pointer`]). A lost race is a conflict
//! the client retries.

use iceberg::spec::{MAIN_BRANCH, Operation, SnapshotRetention, TableMetadata};
use iceberg::table::Table;
use iceberg::{TableRequirement, TableUpdate};

use crate::catalog::IcebergCatalog;
use crate::catalog::confine::is_under;
use crate::error::Result;

/// The most requirements and updates one commit may carry.
pub(crate) const MAX_CHANGES: usize = 16;

/// Why an append is refused: the client's mistake (`Invalid`) or a version
/// that moved under it (`Conflict`, retry).
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Not an append, or not this session's to make.
    Invalid(String),
    /// The table changed since the client loaded it.
    Conflict(String),
}

/// Checks that `updates` are an append to `table` whose new files lie under
/// `location`: exactly one `add-snapshot` (operation `append`, parent the
/// current snapshot, manifest list under `location`) and the `set-snapshot-ref`
/// that makes it `main`. The requirements may pin the table's uuid, `main`'s
/// snapshot, its schema, spec and sort order, and nothing else.
pub(crate) fn check_append(
    table: &Table,
    location: &str,
    requirements: &[TableRequirement],
    updates: &[TableUpdate],
) -> std::result::Result<(), Refusal> {
    let name = table.identifier();
    let invalid = |what: String| Refusal::Invalid(format!("{name}: {what}"));
    if requirements.len() > MAX_CHANGES || updates.len() > MAX_CHANGES {
        return Err(invalid(format!(
            "a commit carries at most {MAX_CHANGES} requirements and {MAX_CHANGES} updates"
        )));
    }
    for requirement in requirements {
        match requirement {
            TableRequirement::UuidMatch { .. }
            | TableRequirement::CurrentSchemaIdMatch { .. }
            | TableRequirement::DefaultSpecIdMatch { .. }
            | TableRequirement::DefaultSortOrderIdMatch { .. }
            | TableRequirement::LastAssignedFieldIdMatch { .. }
            | TableRequirement::LastAssignedPartitionIdMatch { .. } => {}
            TableRequirement::RefSnapshotIdMatch { r#ref, .. } if r#ref == MAIN_BRANCH => {}
            other => {
                return Err(invalid(format!(
                    "requirement {other:?} is not accepted: a session appends to branch main only"
                )));
            }
        }
        requirement
            .check(Some(table.metadata()))
            .map_err(|e| Refusal::Conflict(format!("{name}: {}", e.message())))?;
    }
    let [
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name,
            reference,
        },
    ] = updates
    else {
        return Err(invalid(format!(
            "only an append is accepted (add-snapshot, then set-snapshot-ref main), got [{}]",
            updates
                .iter()
                .map(update_name)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if snapshot.summary().operation != Operation::Append {
        return Err(invalid(format!(
            "snapshot {} is a {:?}, not an append: a session only adds rows",
            snapshot.snapshot_id(),
            snapshot.summary().operation
        )));
    }
    let current = table.metadata().current_snapshot_id();
    if snapshot.parent_snapshot_id() != current {
        return Err(Refusal::Conflict(format!(
            "{name}: snapshot {} builds on {:?}, but main is at {current:?}: reload the table and retry",
            snapshot.snapshot_id(),
            snapshot.parent_snapshot_id()
        )));
    }
    let is_branch = matches!(reference.retention, SnapshotRetention::Branch { .. });
    if ref_name != MAIN_BRANCH || !is_branch || reference.snapshot_id != snapshot.snapshot_id() {
        return Err(invalid(format!(
            "set-snapshot-ref must make the new snapshot {} branch main, got {ref_name} -> {}",
            snapshot.snapshot_id(),
            reference.snapshot_id
        )));
    }
    if !is_under(snapshot.manifest_list(), location) {
        return Err(invalid(format!(
            "manifest list '{}' is outside the table's location '{location}': write under it",
            snapshot.manifest_list()
        )));
    }
    Ok(())
}

fn update_name(update: &TableUpdate) -> String {
    serde_json::to_value(update)
        .ok()
        .and_then(|v| v.get("action").and_then(|a| a.as_str()).map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string())
}

/// Applies `updates` (checked by [`check_append`]) to `table`, writes the new
/// metadata file and moves the catalog's pointer from the version `table` is
/// at: the new metadata and its location, or [`Refusal::Conflict`] when
/// another commit landed first (the new file is removed again).
pub(crate) async fn apply_append(
    catalog: &IcebergCatalog,
    table: &Table,
    updates: Vec<TableUpdate>,
) -> Result<std::result::Result<(String, TableMetadata), Refusal>> {
    match catalog.pointers().commit(table, vec![], updates).await? {
        Some(committed) => Ok(Ok((
            committed.metadata_location_result()?.to_string(),
            committed.metadata().clone(),
        ))),
        None => Ok(Err(Refusal::Conflict(format!(
            "{} changed while this commit was applied: reload it and retry",
            table.identifier()
        )))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use iceberg::spec::{Snapshot, Summary};

    use super::*;

    fn append(
        table: &Table,
        id: i64,
        manifest_list: &str,
        operation: Operation,
    ) -> Vec<TableUpdate> {
        let snapshot = Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(table.metadata().current_snapshot_id())
            .with_sequence_number(table.metadata().last_sequence_number() + 1)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(manifest_list)
            .with_summary(Summary {
                operation,
                additional_properties: HashMap::new(),
            })
            .with_schema_id(0)
            .build();
        crate::catalog::snapshot::add_as_head(snapshot, MAIN_BRANCH).into()
    }

    fn refusal(result: std::result::Result<(), Refusal>) -> String {
        match result {
            Err(Refusal::Invalid(m)) => format!("invalid: {m}"),
            Err(Refusal::Conflict(m)) => format!("conflict: {m}"),
            Ok(()) => "accepted".to_string(),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn only_appends_under_the_location_on_the_version_they_build_on() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = crate::catalog::test_table(dir.path()).await;
        let location = table.metadata().location().to_string();
        let inside = format!("{location}/metadata/snap-1.avro");
        let pin = vec![TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN_BRANCH.to_string(),
            snapshot_id: None,
        }];

        let good = append(&table, 1, &inside, Operation::Append);
        assert_eq!(
            refusal(check_append(&table, &location, &pin, &good)),
            "accepted"
        );
        let outside = append(
            &table,
            1,
            "file:///tmp/elsewhere/snap.avro",
            Operation::Append,
        );
        assert!(
            refusal(check_append(&table, &location, &pin, &outside))
                .contains("is outside the table's location"),
        );
        let overwrite = append(&table, 1, &inside, Operation::Overwrite);
        assert!(
            refusal(check_append(&table, &location, &pin, &overwrite)).contains("not an append")
        );
        let properties = vec![TableUpdate::SetProperties {
            updates: HashMap::from([("icestage.target".to_string(), "x.y".to_string())]),
        }];
        assert!(
            refusal(check_append(&table, &location, &pin, &properties))
                .starts_with("invalid: s.t: only an append is accepted")
        );
        let tag = vec![TableRequirement::RefSnapshotIdMatch {
            r#ref: "audit".to_string(),
            snapshot_id: None,
        }];
        assert!(refusal(check_append(&table, &location, &tag, &good)).contains("branch main only"));

        // Applied on the version checked; a second commit built on that same
        // version then conflicts, by its requirement or by the pointer.
        let (new_location, metadata) = apply_append(&catalog, &table, good).await.unwrap().unwrap();
        assert_eq!(metadata.current_snapshot_id(), Some(1));
        let reloaded = catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap();
        assert_eq!(reloaded.metadata_location(), Some(new_location.as_str()));
        let late = append(&table, 2, &inside, Operation::Append);
        assert!(refusal(check_append(&reloaded, &location, &pin, &late)).starts_with("conflict:"),);
        let lost = apply_append(&catalog, &table, late).await.unwrap();
        assert!(matches!(lost, Err(Refusal::Conflict(_))));
        let unchanged = catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap();
        assert_eq!(unchanged.metadata_location(), Some(new_location.as_str()));
    }
}
