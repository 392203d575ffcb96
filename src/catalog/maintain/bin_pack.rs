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

use iceberg::TableUpdate;
use iceberg::spec::{DataFile, MAIN_BRANCH, Operation};
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::commit::append::{Refusal, apply_append};
use crate::catalog::commit::replace::{Live, Version, check_format, write_replacement};
use crate::catalog::confine::{delete_within, is_under};
use crate::catalog::snapshot::{add_as_head, new_snapshot_id};
use crate::error::{Error, Result};

/// The statement, for messages.
const WHAT: &str = "REWRITE DATA FILES";

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
    if table.metadata().current_snapshot().is_none() {
        return Ok(Packing {
            live_files: 0,
            groups: vec![],
            why: format!("{name} has no snapshot: nothing to rewrite"),
            outside: 0,
        });
    }
    check_format(table, WHAT)?;
    let assigned = catalog.assigned_location(table).await?;
    let live = Version::read(table, &assigned, WHAT).await?.live();
    let small = choice.target_file_size.saturating_mul(3) / 4;
    let mut outside = 0i64;
    let mut by_partition: BTreeMap<(i32, String), Vec<DataFile>> = BTreeMap::new();
    for Live { spec_id, file } in &live {
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
            .entry((*spec_id, format!("{:?}", file.partition())))
            .or_default()
            .push(file.clone());
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
        live_files: live.len() as i64,
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
    check_format(table, WHAT)?;
    let assigned = catalog.assigned_location(table).await?;
    let snapshot_id = new_snapshot_id(table.metadata());
    let mut written: Vec<String> = vec![];
    let mut base = table.clone();
    let mut why = format!(
        "{name} changed while its data files were rewritten (another rewrite or a commit that \
         removed files)"
    );
    for attempt in 0..REBASES {
        if base.metadata().current_snapshot().is_none() {
            break;
        }
        let version = Version::read(&base, &assigned, WHAT).await?;
        let staged = write_replacement(
            &base,
            &version,
            snapshot_id,
            "packed",
            attempt,
            rewritten,
            added,
            Operation::Replace,
            HashMap::new(),
        )
        .await?;
        written.extend(staged.written);
        let Some(snapshot) = staged.snapshot else {
            break;
        };
        let mut updates = vec![TableUpdate::SetProperties {
            updates: HashMap::from([(
                PACKED_AT.to_string(),
                snapshot.sequence_number().to_string(),
            )]),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::bridge::insert::append_rows;
    use crate::rows::Value;

    async fn reload(catalog: &IcebergCatalog, table: &Table) -> Table {
        catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap()
    }

    /// An append that lands between the choice and the commit stays: the
    /// rewrite is put on top of it. The same rewrite again finds its files
    /// gone and changes nothing.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_rewrite_goes_on_top_of_appends_and_never_twice() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut table) = crate::catalog::test_table(dir.path()).await;
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
        let added = crate::catalog::test_files(&table, vec![0, 1, 2]).await;

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

        let again = crate::catalog::test_files(&now, vec![0, 1, 2]).await;
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
