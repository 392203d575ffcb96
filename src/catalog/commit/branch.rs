//! Audit branches (write-audit-publish): a promotion that lands its files on
//! a branch of the target instead of `main`, and the publication of such a
//! snapshot on `main` later, by moving `main` to it (a fast-forward, when
//! `main` has not moved since) or by appending its files on top of `main`
//! (re-applied).
//!
//! icestage lists the branches it creates in the target's property
//! [`PROP_AUDIT_BRANCHES`]; it writes to no other branch, and the REST
//! catalog refuses any client commit that moves, removes or unlists one
//! ([`client_touches`]). Every commit here is a compare-and-swap of the
//! table's pointer from exactly the version it was built on.

use std::collections::HashMap;

use iceberg::TableUpdate;
use iceberg::spec::{DataFile, MAIN_BRANCH, ManifestContentType, Operation, SnapshotRef};
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::commit::append::{Refusal, apply_append};
use crate::catalog::commit::replace::{Version, commit_written, write_replacement};
use crate::catalog::commit::{Evidence, Landed};
use crate::catalog::snapshot::{add_as_head, new_snapshot_id, retry_pause};
use crate::error::{Error, Result};

/// Table property: the audit branches icestage created on the table, comma
/// separated.
pub const PROP_AUDIT_BRANCHES: &str = "icestage.audit-branches";
/// Snapshot summary property: the audit branch a promotion landed on.
pub const SNAPSHOT_BRANCH: &str = "icestage.branch";
/// Snapshot summary property of a publication re-applied on `main`: the
/// branch snapshot whose files it appends.
pub const SNAPSHOT_PUBLISHED_FROM: &str = "icestage.published-from";

/// Longest branch name accepted.
const MAX_BRANCH_NAME: usize = 128;

/// How often a branch commit is tried again on a newer version.
const BRANCH_ATTEMPTS: usize = 30;

/// The audit branches of `table`.
pub(crate) fn audit_branches(table: &Table) -> Vec<String> {
    table
        .metadata()
        .properties()
        .get(PROP_AUDIT_BRANCHES)
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `name` can be an audit branch of `table`: a plain name (letters,
/// digits, `_`, `-`, `.`, `/`), not `main`, and either absent or a branch
/// icestage created there.
pub(crate) fn check_branch(table: &Table, name: &str) -> Result<()> {
    let ident = table.identifier();
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if name.is_empty() || name.len() > MAX_BRANCH_NAME || !plain {
        return Err(Error::invalid(format!(
            "to_branch = '{name}' is not a branch name icestage creates: use up to \
             {MAX_BRANCH_NAME} letters, digits, '_', '-', '.' or '/', e.g. 'audit'"
        )));
    }
    if name == MAIN_BRANCH {
        return Err(Error::invalid(format!(
            "to_branch = 'main' names {ident}'s main branch: promote without to_branch to land \
             on main, or name an audit branch such as 'audit'"
        )));
    }
    match crate::catalog::snapshot::refs(table.metadata()).get(name) {
        None => Ok(()),
        Some(found) if !found.branch => Err(Error::invalid(format!(
            "{ident} has a tag '{name}', not a branch: name another audit branch"
        ))),
        Some(_) if !audit_branches(table).iter().any(|b| b == name) => {
            Err(Error::invalid(format!(
                "{ident} has a branch '{name}' that icestage did not create (another engine's): \
                 icestage lands promotions only on branches it creates; name another, e.g. \
                 'audit'"
            )))
        }
        Some(_) => Ok(()),
    }
}

/// Why a client commit may not touch `table`'s audit branches, if it
/// does: moving or removing one, removing its head snapshot, or changing
/// the property that lists them.
pub(crate) fn client_touches(table: &Table, updates: &[TableUpdate]) -> Option<String> {
    let branches = audit_branches(table);
    let audited = |name: &str| branches.iter().any(|b| b == name);
    let heads: Vec<i64> = branches
        .iter()
        .filter_map(|b| table.metadata().snapshot_for_ref(b))
        .map(|s| s.snapshot_id())
        .collect();
    updates.iter().find_map(|update| match update {
        TableUpdate::SetSnapshotRef { ref_name, .. }
        | TableUpdate::RemoveSnapshotRef { ref_name }
            if audited(ref_name) =>
        {
            Some(format!("branch '{ref_name}' is an audit branch"))
        }
        TableUpdate::RemoveSnapshots { snapshot_ids }
            if snapshot_ids.iter().any(|id| heads.contains(id)) =>
        {
            Some("the commit removes the head of an audit branch".to_string())
        }
        TableUpdate::SetProperties { updates } if updates.contains_key(PROP_AUDIT_BRANCHES) => {
            Some(format!("{PROP_AUDIT_BRANCHES} lists the audit branches"))
        }
        TableUpdate::RemoveProperties { removals }
            if removals.iter().any(|k| k == PROP_AUDIT_BRANCHES) =>
        {
            Some(format!("{PROP_AUDIT_BRANCHES} lists the audit branches"))
        }
        _ => None,
    })
}

/// Appends `files` to branch `branch` of `table` in one snapshot carrying
/// `evidence`, exactly once: a version of the table that holds the evidence
/// on any snapshot answers (that snapshot, committed before). A branch that
/// does not exist yet starts at `main`'s head and is listed as an audit
/// branch in the same commit.
pub(crate) async fn append_to_branch_once(
    catalog: &IcebergCatalog,
    table: &Table,
    evidence: &Evidence,
    branch: &str,
    files: &[DataFile],
) -> Result<Landed> {
    let assigned = catalog.assigned_location(table).await?;
    let name = table.identifier().to_string();
    let mut base = table.clone();
    for attempt in 0..BRANCH_ATTEMPTS {
        if attempt > 0 {
            base = catalog.catalog().load_table(table.identifier()).await?;
        }
        if let Some(snapshot_id) = evidence.found_in(&base) {
            return Ok(Landed::before(snapshot_id));
        }
        check_branch(&base, branch)?;
        crate::catalog::commit::replace::check_format(&base, "a promotion to a branch")?;
        let metadata = base.metadata();
        let head = metadata.snapshot_for_ref(branch);
        let new = head.is_none();
        let version =
            Version::listed(&base, head.or(metadata.current_snapshot()), &assigned).await?;
        let snapshot_id = new_snapshot_id(metadata);
        let mut properties = evidence.properties();
        properties.insert(SNAPSHOT_BRANCH.to_string(), branch.to_string());
        let (snapshot, written) = write_append(
            &base,
            &version,
            snapshot_id,
            ("branch", attempt),
            files,
            properties,
        )
        .await?;
        let mut updates: Vec<TableUpdate> = add_as_head(snapshot, branch).into();
        if new {
            let mut listed = audit_branches(&base);
            listed.push(branch.to_string());
            updates.push(TableUpdate::SetProperties {
                updates: HashMap::from([(PROP_AUDIT_BRANCHES.to_string(), listed.join(","))]),
            });
        }
        match commit_written(catalog, &base, updates, &written, &assigned).await? {
            Ok(_) => return Ok(Landed::here(snapshot_id)),
            Err(Refusal::Invalid(reason)) => return Err(Error::invalid(reason)),
            Err(Refusal::Conflict(_)) => retry_pause().await,
        }
    }
    Err(Error::Conflict(format!(
        "{name} kept changing while this promotion was committed to branch '{branch}' \
         ({BRANCH_ATTEMPTS} attempts); nothing was committed: promote again"
    )))
}

/// Writes the manifests and the manifest list of an `append` snapshot
/// `snapshot_id` of `base` on top of the one `version` read, adding
/// `files`, with `properties` in its summary; `(tag, attempt)` name the
/// files. The snapshot, and the files written (to delete when it is not
/// committed).
async fn write_append(
    base: &Table,
    version: &Version,
    snapshot_id: i64,
    (tag, attempt): (&str, usize),
    files: &[DataFile],
    properties: HashMap<String, String>,
) -> Result<(iceberg::spec::Snapshot, Vec<String>)> {
    let staged = write_replacement(
        base,
        version,
        snapshot_id,
        tag,
        attempt,
        &[],
        files,
        Operation::Append,
        properties,
    )
    .await?;
    match staged.snapshot {
        Some(snapshot) => Ok((snapshot, staged.written)),
        None => Err(Error::internal(format!(
            "{}: an append found files to delete",
            base.identifier()
        ))),
    }
}

/// The data files snapshot `snapshot` of `table` added (read from its own
/// manifests, confined to `assigned`), all under `table`'s default
/// partition spec, else refused: a publication re-applies them under it.
pub(crate) async fn added_files(
    table: &Table,
    snapshot: &SnapshotRef,
    assigned: &str,
) -> Result<Vec<DataFile>> {
    let id = snapshot.snapshot_id();
    let default_spec = table.metadata().default_partition_spec_id();
    let list = crate::catalog::manifests::load_list(table, snapshot, assigned).await?;
    let mut files = vec![];
    for manifest in list
        .entries()
        .iter()
        .filter(|m| m.content == ManifestContentType::Data && m.added_snapshot_id == id)
    {
        if manifest.partition_spec_id != default_spec {
            return Err(Error::NotSupported(format!(
                "{}: snapshot {id} was written under partition spec {}, but the table is now \
                 partitioned by spec {default_spec}: promote the upload's rows again",
                table.identifier(),
                manifest.partition_spec_id
            )));
        }
        let read = crate::catalog::manifests::load(table, manifest, assigned).await?;
        files.extend(
            read.entries()
                .iter()
                .filter(|e| e.is_alive() && e.snapshot_id() == Some(id))
                .map(|e| e.data_file().clone()),
        );
    }
    Ok(files)
}

/// How a publication reached `main`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication {
    /// `main` was moved to the branch snapshot (it had not moved since).
    FastForward,
    /// The branch snapshot's files were appended on top of `main`.
    Reapplied,
}

impl Publication {
    /// The name results show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FastForward => "fast_forward",
            Self::Reapplied => "reapplied",
        }
    }
}

/// Publishes branch snapshot `from` (carrying `evidence`) on `base`'s
/// `main`, on exactly that version: a fast-forward when `main`'s head is
/// `from`'s parent, else a new snapshot on top of `main` appending `files`
/// (what `from` added) with `evidence` and [`SNAPSHOT_PUBLISHED_FROM`].
/// `attempt` names the files. The snapshot now at `main` holding the rows,
/// or [`Refusal::Conflict`] when another commit landed first.
pub(crate) async fn publish_on(
    catalog: &IcebergCatalog,
    base: &Table,
    from: &SnapshotRef,
    files: &[DataFile],
    evidence: &Evidence,
    attempt: usize,
) -> Result<std::result::Result<(i64, Publication), Refusal>> {
    let metadata = base.metadata();
    let main = metadata.current_snapshot();
    if from.parent_snapshot_id() == main.map(|s| s.snapshot_id()) {
        let forward = vec![TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: iceberg::spec::SnapshotReference::new(
                from.snapshot_id(),
                iceberg::spec::SnapshotRetention::branch(None, None, None),
            ),
        }];
        let committed = apply_append(catalog, base, forward).await?;
        return Ok(committed.map(|(location, metadata)| {
            catalog.appended_version(base, metadata, location);
            (from.snapshot_id(), Publication::FastForward)
        }));
    }
    let assigned = catalog.assigned_location(base).await?;
    let version = Version::listed(base, main, &assigned).await?;
    let snapshot_id = new_snapshot_id(metadata);
    let mut properties = evidence.properties();
    properties.insert(
        SNAPSHOT_PUBLISHED_FROM.to_string(),
        from.snapshot_id().to_string(),
    );
    let (snapshot, written) = write_append(
        base,
        &version,
        snapshot_id,
        ("publish", attempt),
        files,
        properties,
    )
    .await?;
    let updates = add_as_head(snapshot, MAIN_BRANCH).into();
    let committed = commit_written(catalog, base, updates, &written, &assigned).await?;
    Ok(committed.map(|(location, metadata)| {
        catalog.appended_version(base, metadata, location);
        (snapshot_id, Publication::Reapplied)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_branch_append_lands_once_beside_main_and_publishes_by_either_path() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = crate::catalog::test_table(dir.path()).await;
        let ident = table.identifier().clone();
        let load = || async { catalog.catalog().load_table(&ident).await.unwrap() };
        let files = crate::catalog::test_files(&table, vec![1, 2]).await;
        let first = Evidence::new("test-branch", "a");

        let landed = append_to_branch_once(&catalog, &table, &first, "audit", &files)
            .await
            .unwrap();
        assert!(landed.committed_here);
        let a = landed.snapshot_id;
        // Again, from the stale table: the evidence answers.
        let again = append_to_branch_once(&catalog, &table, &first, "audit", &files)
            .await
            .unwrap();
        assert_eq!(again, Landed::before(a));
        let now = load().await;
        assert_eq!(now.metadata().current_snapshot(), None, "main is untouched");
        assert_eq!(audit_branches(&now), ["audit"]);
        assert_eq!(first.found_on(&now, "audit"), Some(a));
        assert_eq!(first.found_on(&now, MAIN_BRANCH), None);

        // A client may not move the branch or unlist it.
        let moved = [TableUpdate::RemoveSnapshotRef {
            ref_name: "audit".to_string(),
        }];
        assert!(client_touches(&now, &moved).is_some());
        let unlisted = [TableUpdate::RemoveProperties {
            removals: vec![PROP_AUDIT_BRANCHES.to_string()],
        }];
        assert!(client_touches(&now, &unlisted).is_some());
        assert!(check_branch(&now, MAIN_BRANCH).is_err());
        assert!(check_branch(&now, "no spaces").is_err());

        // main has not moved since: a fast-forward.
        let from = std::sync::Arc::clone(now.metadata().snapshot_by_id(a).unwrap());
        let assigned = catalog.assigned_location(&now).await.unwrap();
        let added = added_files(&now, &from, &assigned).await.unwrap();
        assert_eq!(added.len(), 1);
        let (on_main, how) = publish_on(&catalog, &now, &from, &added, &first, 0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((on_main, how), (a, Publication::FastForward));

        // A second branch snapshot whose parent main has left behind (main
        // gained an append since): its files are re-applied on top.
        let second = Evidence::new("test-branch", "b");
        let more = crate::catalog::test_files(&table, vec![3]).await;
        let b = append_to_branch_once(&catalog, &load().await, &second, "audit", &more)
            .await
            .unwrap()
            .snapshot_id;
        let other = crate::catalog::test_files(&table, vec![4]).await;
        crate::catalog::commit::append_files(&catalog, &load().await, other)
            .await
            .unwrap();
        let now = load().await;
        let from = std::sync::Arc::clone(now.metadata().snapshot_by_id(b).unwrap());
        let added = added_files(&now, &from, &assigned).await.unwrap();
        let stale = now.clone();
        let (on_main, how) = publish_on(&catalog, &now, &from, &added, &second, 0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(how, Publication::Reapplied);
        let now = load().await;
        assert_eq!(second.found_on(&now, MAIN_BRANCH), Some(on_main));
        assert_eq!(
            now.metadata()
                .current_snapshot()
                .unwrap()
                .summary()
                .additional_properties["total-records"],
            "4",
            "every file's rows once"
        );
        // Built on a version main has left: refused as a conflict.
        let late = publish_on(&catalog, &stale, &from, &added, &second, 1)
            .await
            .unwrap();
        assert!(matches!(late, Err(Refusal::Conflict(_))));
    }
}
