//! `EXPIRE STAGING`: removes staging tables whose upload expired (and download
//! tables whose download expired), finishes
//! promotions that committed but did not clean up, and completes discards
//! that were interrupted.

use std::fmt;

use chrono::Utc;

use crate::catalog::TableName;
use crate::config::{OptionDoc, WithOptions, option, parse_duration};
use crate::error::Result;
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::operation::Operation;
use crate::upload::abort::discard;
use crate::upload::promote::PromoteUpload;
use crate::upload::validation::load_target;
use crate::upload::{UploadState, list_staging, promoted_snapshot};

result_row! {
    /// What `EXPIRE STAGING` removed.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StagingExpired {
        /// Staging and download tables removed.
        pub tables_removed: i64,
    }
}

/// `EXPIRE STAGING`.
#[derive(Debug)]
pub(crate) struct ExpireStaging;

impl Operation for ExpireStaging {
    const NAME: &'static str = "ExpireStaging";
    type Outcome = StagingExpired;

    async fn run(&self, ctx: &CommandContext) -> Result<StagingExpired> {
        expire_staging(ctx).await
    }
}

impl fmt::Display for ExpireStaging {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
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

async fn expire_staging(ctx: &CommandContext) -> Result<StagingExpired> {
    let now = Utc::now();
    let mut removed = 0i64;
    for catalog in ctx.icestage.catalogs() {
        for staging in list_staging(catalog).await? {
            let promoted = match load_target(&staging).await {
                Ok(target) => promoted_snapshot(&target, &staging).is_some(),
                Err(_) => false,
            };
            if promoted {
                let finish = PromoteUpload::new(staging.id.clone(), Default::default());
                finish.run(ctx).await?;
                removed += 1;
                continue;
            }
            // A client rewrote its sealed properties: its expiry cannot be
            // believed, and it can never be promoted.
            if staging.tampered.is_some() && !staging.claimed_elsewhere(now) {
                discard(staging, UploadState::Expired).await?;
                removed += 1;
                continue;
            }
            match staging.state {
                UploadState::Aborted | UploadState::Expired => {
                    let state = staging.state;
                    discard(staging, state).await?;
                    removed += 1;
                }
                // A live promotion holds it: never pull files from under it.
                UploadState::Promoting if staging.claimed_elsewhere(now) => {}
                UploadState::Promoting if staging.past_promotion(now) => {
                    discard(staging, UploadState::Expired).await?;
                    removed += 1;
                }
                UploadState::Promoting | UploadState::Promoted | UploadState::Published => {}
                UploadState::Open | UploadState::Failed if staging.is_expired(now) => {
                    discard(staging, UploadState::Expired).await?;
                    removed += 1;
                }
                UploadState::Open | UploadState::Failed => {}
            }
        }
    }
    removed += crate::download::status::expire(&ctx.icestage).await?;
    Ok(StagingExpired {
        tables_removed: removed,
    })
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
                    crate::error::Error::invalid(format!(
                        "retain_last = '{value}' is not a count of snapshots: give a whole number from 1"
                    ))
                })?;
        }
        Ok(expire)
    }
}

/// `EXPIRE SNAPSHOTS <table>`: removes the snapshots older than
/// `older_than` beyond the last `retain_last` from the table's metadata,
/// keeping the exactly-once evidence: a snapshot that promoted an upload
/// whose session has not finished stays, and the copy ids of `COPY INTO`
/// snapshots are marked committed in the copy log before their snapshots go.
/// The manifest lists of the expired snapshots are deleted, the manifests
/// no remaining snapshot lists, and the data files no remaining snapshot
/// reads (removed by an overwrite, a delete or a compaction) under the
/// table's location or the staging tables'. A table that sets `gc.enabled
/// = false` is refused, as Iceberg does.
pub(crate) async fn expire_snapshots(
    ctx: &CommandContext,
    table: &TableName,
    options: &ExpireOptions,
) -> Result<SnapshotsExpired> {
    use std::collections::HashSet;

    use iceberg::transaction::{ApplyTransactionAction, Transaction};

    use iceberg::spec::MAIN_BRANCH;

    use crate::catalog::commit::{GC_ENABLED, commit_expiry, gc_enabled};
    use crate::catalog::snapshot::ancestry;
    use crate::ingest::copy_into::{SNAPSHOT_COPY_ID, mark_committed};
    use crate::upload::SNAPSHOT_UPLOAD_ID;

    let (catalog, ident) = (ctx.icestage.catalog(&table.catalog)?, &table.ident);
    // This process's background merge of the table waits (it would make
    // this a conflict).
    let _turn = crate::catalog::maintain::upkeep::turn(catalog, ident).await;
    let table = catalog.catalog().load_table(ident).await?;
    if !gc_enabled(&table) {
        return Err(crate::error::Error::invalid(format!(
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
    let mut kept: HashSet<i64> = crate::catalog::snapshot::refs(metadata)
        .values()
        .map(|r| r.snapshot_id)
        .collect();
    kept.extend(
        ancestry(metadata, MAIN_BRANCH)
            .take(options.retain_last.max(1))
            .map(|s| s.snapshot_id()),
    );
    // The uploads whose session has not finished: their staging tables,
    // listed once.
    let unfinished: HashSet<String> = list_staging(catalog)
        .await?
        .into_iter()
        .map(|staging| staging.id.to_string())
        .collect();
    // Uploads promoted to an audit branch and not yet on main: the snapshot
    // PUBLISH UPLOAD publishes stays.
    let on_main: HashSet<&String> = ancestry(metadata, MAIN_BRANCH)
        .filter_map(|s| s.summary().additional_properties.get(SNAPSHOT_UPLOAD_ID))
        .collect();
    let unpublished = |props: &std::collections::HashMap<String, String>| {
        props.contains_key(crate::catalog::commit::branch::SNAPSHOT_BRANCH)
            && props
                .get(SNAPSHOT_UPLOAD_ID)
                .is_some_and(|id| !on_main.contains(id))
    };
    let mut expire = vec![];
    let mut protected = 0i64;
    let mut copies = vec![];
    for snapshot in metadata.snapshots() {
        if kept.contains(&snapshot.snapshot_id()) || snapshot.timestamp_ms() >= cutoff {
            continue;
        }
        let props = &snapshot.summary().additional_properties;
        if props
            .get(SNAPSHOT_UPLOAD_ID)
            .is_some_and(|id| unfinished.contains(id))
            || unpublished(props)
        {
            protected += 1;
            continue;
        }
        if let Some(copy) = props.get(SNAPSHOT_COPY_ID) {
            copies.push(copy.clone());
        }
        expire.push(snapshot.snapshot_id());
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
    // The snapshot is the proof that a copy committed; before it goes, the
    // copy log says so itself.
    mark_committed(catalog, &name, &copies).await?;
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
            crate::error::Error::Conflict(format!(
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
