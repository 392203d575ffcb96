//! What an append leaves due, done in the background: a table appended to
//! one small commit at a time (a target after thousands of promotions, one
//! of icestage's logs) lists a manifest per append, and an icestage-owned
//! table keeps only its last snapshots.
//!
//! - **icestage's own tables**: old snapshots expired ([`trim_snapshots`])
//!   and, every [`OWNED_MERGE_AFTER`] appends, the manifests merged into
//!   levels of a bounded size sorted by partition ([`Layout::Levels`]): a
//!   lookup by the partition column reads a manifest list of bounded length
//!   and about one manifest per level.
//! - **A user's table** (a target, a table `INSERT INTO` writes): its
//!   manifests merged as Iceberg's commit properties say,
//!   `commit.manifest-merge.enabled` (default `true`) once
//!   `commit.manifest.min-count-to-merge` commits (default 100) have landed
//!   since the last merge, into the same levels; its snapshots are the
//!   user's (`EXPIRE SNAPSHOTS`).
//!
//! A merge is a `replace` snapshot that changes no row and keeps every
//! entry's snapshot id and sequence number, and every older snapshot (the
//! exactly-once evidence), as `REWRITE MANIFESTS` does.
//!
//! A user's table that sets [`REWRITE_DATA_AFTER`] also gets its small data
//! files rewritten (`REWRITE DATA FILES` with the table's defaults) once
//! that many commits have landed since the last rewrite. Rewriting data is
//! an operation above this layer: it runs through the hook installed at
//! connect time ([`install_data_rewrite`]); this module only says when it
//! is due.

use std::sync::OnceLock;

use futures::future::BoxFuture;
use iceberg::TableIdent;
use iceberg::spec::FormatVersion;
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::Owner;
use crate::catalog::commit::{trim_due, trim_snapshots};
use crate::catalog::maintain::bin_pack::PACKED_AT;
use crate::catalog::maintain::compact::{Layout, MERGED_AT, rewrite_manifests};

/// Iceberg's switch for merging manifests on commit.
pub(crate) const MANIFEST_MERGE_ENABLED: &str = "commit.manifest-merge.enabled";
/// Iceberg's count of manifests (here: commits since the last merge) that
/// makes a merge due.
pub(crate) const MIN_COUNT_TO_MERGE: &str = "commit.manifest.min-count-to-merge";
/// [`MIN_COUNT_TO_MERGE`] when a table does not set it (Iceberg's default).
const DEFAULT_MIN_COUNT_TO_MERGE: i64 = 100;

/// Appends (commits) to an icestage-owned table between manifest merges:
/// the most level-0 manifests a lookup meets.
const OWNED_MERGE_AFTER: i64 = 128;
/// Rounds of upkeep one task does at most before it leaves the rest to
/// the next append.
const UPKEEP_PASSES: usize = 4;
/// How an icestage-owned table's manifests are merged: 200 entries per
/// manifest, at most 1,000 in level 1.
const OWNED_LAYOUT: Layout = Layout::Levels {
    per_manifest: 200,
    level_one: 1000,
};
/// How a user's table's manifests are merged: level 1 at most 1,000
/// entries, level 2 in manifests of 1,000 sorted by partition.
const USER_LAYOUT: Layout = Layout::Levels {
    per_manifest: 1000,
    level_one: 1000,
};

/// Table property: after how many commits since the last data-file
/// rewrite icestage rewrites a user's table's small data files in the
/// background (unset: never; `REWRITE DATA FILES` by hand).
pub(crate) const REWRITE_DATA_AFTER: &str = "icestage.rewrite-data-files.after-commits";

/// What rewrites a table's small data files (`REWRITE DATA FILES` with the
/// table's defaults): an operation of a layer above, installed at connect.
pub(crate) type DataRewrite =
    fn(IcebergCatalog, Table) -> BoxFuture<'static, crate::error::Result<()>>;

static DATA_REWRITE: OnceLock<DataRewrite> = OnceLock::new();

/// Installs what the background upkeep runs when a data-file rewrite is
/// due (once per process; later calls keep the first).
pub(crate) fn install_data_rewrite(rewrite: DataRewrite) {
    let _ = DATA_REWRITE.set(rewrite);
}

/// What is due on a table of `whose` after an append.
struct Due {
    trim: bool,
    merge: bool,
    pack: bool,
}

impl Due {
    fn of(table: &Table, whose: Owner) -> Self {
        match whose {
            Owner::Icestage => Due {
                trim: trim_due(table),
                merge: merge_due(table, OWNED_MERGE_AFTER),
                pack: false,
            },
            Owner::User => Due {
                trim: false,
                merge: merge_after(table).is_some_and(|after| merge_due(table, after)),
                pack: pack_due(table),
            },
        }
    }

    fn any(&self) -> bool {
        self.trim || self.merge || self.pack
    }
}

/// Starts what `appended` (the table as an append committed it) has due,
/// in the background: the appending caller is answered without waiting for
/// it, and a merge is put on top of the appends that land meanwhile
/// ([`rewrite_manifests`]).
///
/// Every append finds the upkeep due until it lands, and under load many
/// append at once: one task per table in this process does it (with the
/// table loaded again, in case another just did), the others leave it to
/// that one.
///
/// Best effort: the append is committed whatever happens here (failing it
/// now would have its caller write it twice). What fails, or is cut short
/// by the process ending, is due again at the next append.
pub(crate) fn after_append(catalog: &IcebergCatalog, appended: Table, whose: Owner) {
    if !Due::of(&appended, whose).any() {
        return;
    }
    let ident = appended.identifier().clone();
    let Some(upkeep) = catalog.try_exclusive(&turn_key(&ident)) else {
        return;
    };
    let catalog = catalog.clone();
    let layout = match whose {
        Owner::Icestage => OWNED_LAYOUT,
        Owner::User => USER_LAYOUT,
    };
    tokio::spawn(async move {
        let _upkeep = upkeep;
        // Appends that found the upkeep taken while this ran left theirs
        // to it: it looks again before it stops.
        for _ in 0..UPKEEP_PASSES {
            let mut table = catalog.catalog().load_table(&ident).await?;
            let due = Due::of(&table, whose);
            if !due.any() {
                break;
            }
            if due.trim {
                trim_snapshots(&catalog, &table).await?;
                table = catalog.catalog().load_table(&ident).await?;
            }
            if due.pack
                && let Some(rewrite) = DATA_REWRITE.get()
            {
                rewrite(catalog.clone(), table).await?;
                table = catalog.catalog().load_table(&ident).await?;
            }
            if Due::of(&table, whose).merge {
                rewrite_manifests(&catalog, &table, layout).await?;
            }
        }
        Ok::<_, crate::error::Error>(())
    });
}

/// The turn at the upkeep of `ident` in this process: the background task
/// holds it while it works, and a statement that rewrites the table's
/// manifests (`REWRITE MANIFESTS`) takes it, so that the two take turns
/// instead of undoing each other's work.
pub(crate) async fn turn(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
) -> tokio::sync::OwnedMutexGuard<()> {
    catalog.exclusive(&turn_key(ident)).await
}

fn turn_key(ident: &TableIdent) -> String {
    format!("{ident} upkeep")
}

/// Commits between merges of a user's table, from its properties; `None`
/// when it asks for no merging (or sets a count that is not one: a table
/// written elsewhere is not refused here, only left alone).
fn merge_after(table: &Table) -> Option<i64> {
    // A v1 table's manifests are not rewritten (see `rewrite_manifests`).
    if table.metadata().format_version() == FormatVersion::V1 {
        return None;
    }
    let properties = table.metadata().properties();
    if properties
        .get(MANIFEST_MERGE_ENABLED)
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("true"))
    {
        return None;
    }
    match properties.get(MIN_COUNT_TO_MERGE) {
        None => Some(DEFAULT_MIN_COUNT_TO_MERGE),
        Some(value) => value.trim().parse::<i64>().ok().filter(|n| *n >= 1),
    }
}

/// Whether [`REWRITE_DATA_AFTER`] commits have landed on `table` since its
/// data files were last rewritten (a value that is not a count is left
/// alone, as [`merge_after`] leaves one).
fn pack_due(table: &Table) -> bool {
    let metadata = table.metadata();
    if metadata.format_version() != FormatVersion::V2 || DATA_REWRITE.get().is_none() {
        return false;
    }
    let properties = metadata.properties();
    properties
        .get(REWRITE_DATA_AFTER)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|n| *n >= 1)
        .is_some_and(|after| commits_since(table, PACKED_AT) >= after)
}

/// Commits that landed on `table` since the sequence number its property
/// `at` records (every commit, when it records none).
fn commits_since(table: &Table, at: &str) -> i64 {
    let metadata = table.metadata();
    let since = metadata
        .properties()
        .get(at)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    metadata.last_sequence_number() - since
}

/// Whether `after` commits have landed on `table` since its manifests were
/// last merged (each commit adds a manifest or more).
fn merge_due(table: &Table, after: i64) -> bool {
    commits_since(table, MERGED_AT) >= after
}
