//! `EXPIRE SNAPSHOTS <table>`: a table's old snapshots removed, with the
//! files only they read.
//!
//! Some old snapshots are the exactly-once evidence of a flow above this
//! layer (an upload promoted but not finished, a promotion on an audit
//! branch not yet published, the copy ids of `COPY INTO`). The flows say
//! which through [`ExpiryHooks`], installed at connect time
//! ([`install_expiry_hooks`]); without them nothing is expired.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, OnceLock};

use chrono::Utc;
use futures::future::BoxFuture;
use iceberg::spec::MAIN_BRANCH;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use crate::catalog::commit::{GC_ENABLED, commit_expiry, gc_enabled};
use crate::catalog::snapshot::{ancestry, refs};
use crate::catalog::{IcebergCatalog, TableName};
use crate::config::{OptionDoc, WithOptions, option, parse_duration};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::operation::Operation;

/// The snapshots of a table (by id) that are an unfinished flow's
/// exactly-once evidence: kept, however old.
pub(crate) type Protected =
    fn(Arc<IcebergCatalog>, Table) -> BoxFuture<'static, Result<HashSet<i64>>>;

/// What a flow records before snapshots of a table (by id) are expired:
/// the proof those snapshots held, kept elsewhere.
pub(crate) type BeforeExpiry =
    fn(Arc<IcebergCatalog>, Table, Vec<i64>) -> BoxFuture<'static, Result<()>>;

/// What the flows above this layer tell `EXPIRE SNAPSHOTS`.
pub(crate) struct ExpiryHooks {
    /// The snapshots kept as evidence (uploads, audit branches).
    pub(crate) protected: Protected,
    /// Run before the commit that expires snapshots (the copy log).
    pub(crate) before_expiry: BeforeExpiry,
}

static HOOKS: OnceLock<ExpiryHooks> = OnceLock::new();

/// Installs the flows' [`ExpiryHooks`] (once per process; later calls keep
/// the first).
pub(crate) fn install_expiry_hooks(hooks: ExpiryHooks) {
    let _ = HOOKS.set(hooks);
}

/// `EXPIRE SNAPSHOTS <table> [WITH (...)]`.
#[derive(Debug)]
pub(crate) struct ExpireSnapshots {
    pub(crate) table: TableName,
    pub(crate) options: ExpireOptions,
}

impl Operation for ExpireSnapshots {
    const NAME: &'static str = "ExpireSnapshots";
    type Outcome = SnapshotsExpired;

    async fn run(&self, ctx: &CommandContext) -> Result<SnapshotsExpired> {
        expire_snapshots(ctx, &self.table, &self.options).await
    }
}

impl fmt::Display for ExpireSnapshots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, older_than={}, retain_last={}",
            self.table,
            crate::config::format_duration(self.options.older_than),
            self.options.retain_last
        )
    }
}

result_row! {
    /// What `EXPIRE SNAPSHOTS <table>` did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct SnapshotsExpired {
        /// The table.
        pub table_name: String,
        /// Snapshots removed from its metadata.
        pub snapshots_expired: i64,
        /// Snapshots it keeps.
        pub snapshots_kept: i64,
        /// Old snapshots kept because they are an unfinished promotion's
        /// exactly-once evidence.
        pub snapshots_protected: i64,
        /// Data files deleted: those no remaining snapshot reads (removed
        /// by an overwrite, a delete or a compaction).
        pub data_files_deleted: i64,
        /// What happened, in words.
        pub message: String,
    }
}

/// How `EXPIRE SNAPSHOTS` chooses (Iceberg's `expire_snapshots` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpireOptions {
    /// Snapshots older than this go (default 5 days, Iceberg's
    /// `history.expire.max-snapshot-age-ms` default).
    pub older_than: std::time::Duration,
    /// The newest snapshots kept whatever their age (at least 1, default 1).
    pub retain_last: usize,
}

impl Default for ExpireOptions {
    fn default() -> Self {
        Self {
            older_than: std::time::Duration::from_secs(5 * 86_400),
            retain_last: 1,
        }
    }
}

impl WithOptions for ExpireOptions {
    const STATEMENT: &'static str = "EXPIRE SNAPSHOTS";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "older_than",
            default: "`'5d'`",
            doc: "snapshots older than this go",
        },
        OptionDoc {
            key: "retain_last",
            default: "1",
            doc: "the newest snapshots kept whatever their age (1 to 1,000,000)",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        let mut expire = Self::default();
        if let Some(value) = option(pairs, "older_than") {
            expire.older_than = parse_duration(value)?;
        }
        if let Some(value) = option(pairs, "retain_last") {
            expire.retain_last = value
                .parse()
                .ok()
                .filter(|n: &usize| (1..=1_000_000).contains(n))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "retain_last = '{value}' is not a count of snapshots: give a whole number from 1"
                    ))
                })?;
        }
        Ok(expire)
    }
}

/// `EXPIRE SNAPSHOTS <table>`: removes the snapshots older than
/// `older_than` beyond the last `retain_last` from the table's metadata,
/// keeping the exactly-once evidence the flows name ([`ExpiryHooks`]).
/// The manifest lists of the expired snapshots are deleted, the manifests
/// no remaining snapshot lists, and the data files no remaining snapshot
/// reads (removed by an overwrite, a delete or a compaction) under the
/// table's location or the staging tables'. A table that sets `gc.enabled
/// = false` is refused, as Iceberg does.
async fn expire_snapshots(
    ctx: &CommandContext,
    table: &TableName,
    options: &ExpireOptions,
) -> Result<SnapshotsExpired> {
    let Some(hooks) = HOOKS.get() else {
        return Err(Error::internal(format!(
            "EXPIRE SNAPSHOTS {table}: the flows' expiry hooks are not installed (icestage::register \
             installs them), so the snapshots that prove a promotion or a copy cannot be told \
             apart; nothing was expired"
        )));
    };
    let (catalog, ident) = (ctx.icestage.catalog(&table.catalog)?, &table.ident);
    // This process's background merge of the table waits (it would make
    // this a conflict).
    let _turn = crate::catalog::maintain::upkeep::turn(catalog, ident).await;
    let table = catalog.catalog().load_table(ident).await?;
    if !gc_enabled(&table) {
        return Err(Error::invalid(format!(
            "EXPIRE SNAPSHOTS {ident}: the table sets {GC_ENABLED} = false (its files may be \
             shared with other tables), and Iceberg expires no snapshot of such a table; nothing \
             was changed. If the table owns its files, set {GC_ENABLED} = true on it first"
        )));
    }
    let metadata = table.metadata();
    let cutoff = Utc::now().timestamp_millis()
        - i64::try_from(options.older_than.as_millis()).unwrap_or(i64::MAX);
    // The newest `retain_last` of the main branch's ancestry, and every
    // branch or tag head, stay.
    let mut kept: HashSet<i64> = refs(metadata).values().map(|r| r.snapshot_id).collect();
    kept.extend(
        ancestry(metadata, MAIN_BRANCH)
            .take(options.retain_last.max(1))
            .map(|s| s.snapshot_id()),
    );
    let evidence = (hooks.protected)(Arc::clone(catalog), table.clone()).await?;
    let mut expire = vec![];
    let mut protected = 0i64;
    for snapshot in metadata.snapshots() {
        let id = snapshot.snapshot_id();
        if kept.contains(&id) || snapshot.timestamp_ms() >= cutoff {
            continue;
        }
        if evidence.contains(&id) {
            protected += 1;
        } else {
            expire.push(id);
        }
    }
    let name = ident.to_string();
    if expire.is_empty() {
        return Ok(SnapshotsExpired {
            table_name: name.clone(),
            snapshots_expired: 0,
            snapshots_kept: metadata.snapshots().count() as i64,
            snapshots_protected: protected,
            data_files_deleted: 0,
            message: format!("no snapshot of {name} is old enough to expire"),
        });
    }
    // The snapshots may be the proof of something; before they go, the
    // flows keep that proof themselves.
    (hooks.before_expiry)(Arc::clone(catalog), table.clone(), expire.clone()).await?;
    let tx = Transaction::new(&table);
    let tx = tx
        .expire_snapshots()
        .expire_snapshot_ids(expire.iter().copied())
        .expire_older_than_ms(i64::MIN)
        .retain_last(1)
        .apply(tx)?;
    // Data files no remaining snapshot reads are deleted under the table's
    // location, and under the staging tables' (a promotion registers the
    // staging table's files in the target).
    let roots = catalog.promoted_roots();
    let (expired, files) = commit_expiry(catalog, &table, tx, &roots).await.map_err(|e| {
        if e.kind() == iceberg::ErrorKind::CatalogCommitConflicts {
            Error::Conflict(format!(
                "{name} changed while its snapshots were expired; nothing was expired: run EXPIRE SNAPSHOTS again"
            ))
        } else {
            e.into()
        }
    })?;
    let remaining: HashSet<i64> = expired
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let gone = (metadata.snapshots().count() - remaining.len()) as i64;
    Ok(SnapshotsExpired {
        table_name: name.clone(),
        snapshots_expired: gone,
        snapshots_kept: remaining.len() as i64,
        snapshots_protected: protected,
        data_files_deleted: files.deleted,
        message: format!(
            "expired {gone} snapshot(s) of {name}, kept {}{}; deleted {} data file(s) no remaining \
             snapshot reads{}",
            remaining.len(),
            if protected > 0 {
                format!(" ({protected} kept as the evidence of promotions not finished yet)")
            } else {
                String::new()
            },
            files.deleted,
            if files.outside > 0 {
                format!(
                    " ({} more lie outside the table's location and were left where they are)",
                    files.outside
                )
            } else {
                String::new()
            }
        ),
    })
}
