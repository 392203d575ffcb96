//! Keeping a table's files in shape: `REWRITE MANIFESTS <table>` merges its
//! data manifests, one per partition spec (see `catalog::maintain::compact`);
//! `REWRITE DATA FILES <table>` bin-packs its small data files (see
//! `catalog::maintain::bin_pack`); neither changes a row.
//! `REMOVE ORPHAN FILES <table>` deletes the files under its location that
//! nothing references (see `catalog::maintain::orphans`).

use std::fmt;

use futures::TryStreamExt;
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::TableName;
use crate::catalog::bridge::writer::write_rows_sized;
use crate::catalog::maintain::bin_pack::{Choice, PACKED_AT, choose, commit_packed};
use crate::catalog::maintain::compact::{Layout, Rewrite, rewrite_manifests as rewrite};
use crate::catalog::maintain::upkeep;
use crate::cluster::RecipeTable;
use crate::config::{OptionDoc, WithOptions, option, parse_bool, parse_duration, parse_size};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::operation::Operation;

result_row! {
    /// What `REWRITE MANIFESTS <table>` did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ManifestsRewritten {
        /// The table.
        pub table_name: String,
        /// Data manifests before.
        pub manifests_before: i64,
        /// Data manifests after.
        pub manifests_after: i64,
        /// Data files they list (unchanged), when rewritten.
        pub data_files: Option<i64>,
        /// The `replace` snapshot, when one was committed.
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
    }
}

/// `REWRITE MANIFESTS <table>`.
#[derive(Debug)]
pub(crate) struct RewriteManifests {
    pub(crate) table: TableName,
}

impl Operation for RewriteManifests {
    const NAME: &'static str = "RewriteManifests";
    type Outcome = ManifestsRewritten;

    async fn run(&self, ctx: &CommandContext) -> Result<ManifestsRewritten> {
        rewrite_manifests(ctx, &self.table).await
    }
}

impl fmt::Display for RewriteManifests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.table)
    }
}

/// `REWRITE DATA FILES <table> [WITH (...)]`.
#[derive(Debug)]
pub(crate) struct RewriteDataFiles {
    pub(crate) table: TableName,
    pub(crate) options: RewriteDataOptions,
}

impl Operation for RewriteDataFiles {
    const NAME: &'static str = "RewriteDataFiles";
    type Outcome = DataFilesRewritten;

    async fn run(&self, ctx: &CommandContext) -> Result<DataFilesRewritten> {
        rewrite_data_files(ctx, &self.table, &self.options).await
    }
}

impl fmt::Display for RewriteDataFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, {:?}", self.table, self.options)
    }
}

/// `REMOVE ORPHAN FILES <table> [WITH (...)]`.
#[derive(Debug)]
pub(crate) struct RemoveOrphanFiles {
    pub(crate) table: TableName,
    pub(crate) options: OrphanOptions,
}

impl Operation for RemoveOrphanFiles {
    const NAME: &'static str = "RemoveOrphanFiles";
    type Outcome = OrphanFilesRemoved;

    async fn run(&self, ctx: &CommandContext) -> Result<OrphanFilesRemoved> {
        remove_orphan_files(ctx, &self.table, &self.options).await
    }
}

impl fmt::Display for RemoveOrphanFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, older_than={}, dry_run={}",
            self.table,
            crate::config::format_duration(self.options.older_than),
            self.options.dry_run
        )
    }
}

/// Rewrites tried before a conflict is answered.
const ATTEMPTS: u32 = 3;

async fn rewrite_manifests(ctx: &CommandContext, table: &TableName) -> Result<ManifestsRewritten> {
    let (catalog, ident) = (ctx.icestage.catalog(&table.catalog)?, &table.ident);
    // The background merge of this process waits for this one; one of
    // another process that wins meanwhile is read again, a few times.
    let _turn = upkeep::turn(catalog, ident).await;
    let mut attempt = 1;
    let rewritten = loop {
        let table = catalog.catalog().load_table(ident).await?;
        match rewrite(catalog, &table, Layout::OnePerSpec).await {
            Err(Error::Conflict(_)) if attempt < ATTEMPTS => attempt += 1,
            done => break done?,
        }
    };
    let name = ident.to_string();
    Ok(match rewritten {
        Rewrite::Nothing { manifests, why } => ManifestsRewritten {
            table_name: name,
            manifests_before: manifests,
            manifests_after: manifests,
            data_files: None,
            snapshot_id: None,
            message: why,
        },
        Rewrite::Done {
            before,
            after,
            files,
            snapshot_id,
        } => ManifestsRewritten {
            message: format!(
                "rewrote {before} data manifests of {name} as {after} ({files} data files, no row changed)"
            ),
            table_name: name,
            manifests_before: before,
            manifests_after: after,
            data_files: Some(files),
            snapshot_id: Some(snapshot_id),
        },
    })
}

result_row! {
    /// What `REWRITE DATA FILES <table>` did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct DataFilesRewritten {
        /// The table.
        pub table_name: String,
        /// Live data files before.
        pub data_files_before: i64,
        /// Live data files after.
        pub data_files_after: i64,
        /// Small files rewritten (marked deleted in the new snapshot).
        pub files_rewritten: i64,
        /// Files written in their place.
        pub files_added: i64,
        /// Partitions whose files were rewritten.
        pub partitions_rewritten: i64,
        /// Rows rewritten (the same rows, now in fewer files).
        pub rows_rewritten: i64,
        /// Bytes of the files rewritten.
        pub bytes_rewritten: i64,
        /// Bytes of the files written.
        pub bytes_added: i64,
        /// The `replace` snapshot, when one was committed.
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
    }
}

/// `REWRITE DATA FILES` options (Iceberg's `rewrite_data_files`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RewriteDataOptions {
    /// The size new files are written to (default the table's
    /// `write.target-file-size-bytes`, else 512 MiB); files smaller than
    /// three quarters of it are rewritten.
    pub target_file_size: Option<u64>,
    /// Only files that may hold rows matching this SQL predicate (by their
    /// partition and column bounds) are rewritten.
    pub filter: Option<String>,
    /// A partition is rewritten when it holds at least this many small
    /// files (default 2).
    pub min_input_files: Option<usize>,
}

impl WithOptions for RewriteDataOptions {
    const STATEMENT: &'static str = "REWRITE DATA FILES";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "target_file_size",
            default: "the table's `write.target-file-size-bytes`, else 512 MiB",
            doc: "the size new files are written to; files under three quarters of it are rewritten",
        },
        OptionDoc {
            key: "where",
            default: "every file",
            doc: "only files that may hold rows matching this SQL predicate",
        },
        OptionDoc {
            key: "min_input_files",
            default: "2",
            doc: "a partition is rewritten when it holds at least this many small files",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        let mut options = Self::default();
        if let Some(value) = option(pairs, "target_file_size") {
            options.target_file_size = Some(parse_size(value)?);
        }
        if let Some(value) = option(pairs, "where") {
            if value.trim().is_empty() {
                return Err(Error::invalid(
                    "where = '' selects nothing: give a predicate such as \
                     where = 'day >= DATE ''2026-07-01'''"
                        .to_string(),
                ));
            }
            options.filter = Some(value.to_string());
        }
        if let Some(value) = option(pairs, "min_input_files") {
            let count = value
                .trim()
                .parse()
                .ok()
                .filter(|n| (2..=1_000_000).contains(n))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "min_input_files = '{value}' is not a count of files: give a whole \
                         number from 2"
                    ))
                })?;
            options.min_input_files = Some(count);
        }
        Ok(options)
    }
}

impl RewriteDataOptions {
    /// Reads `WITH (...)` pairs; an unknown option or a bad value is refused
    /// by name.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self> {
        Self::from_with(pairs)
    }
}

/// `REWRITE DATA FILES <table>`: bin-packs each partition's small files
/// into files of the target size, in one `replace` snapshot that changes no
/// row (see `catalog::maintain::bin_pack`).
async fn rewrite_data_files(
    ctx: &CommandContext,
    table: &TableName,
    options: &RewriteDataOptions,
) -> Result<DataFilesRewritten> {
    let (catalog, ident) = (ctx.icestage.catalog(&table.catalog)?, &table.ident);
    // The background upkeep of this process waits for this one.
    let _turn = upkeep::turn(catalog, ident).await;
    let table = catalog.catalog().load_table(ident).await?;
    pack(catalog, &table, options).await
}

/// The background rewrite of a table that sets
/// `icestage.rewrite-data-files.after-commits` (installed at connect as
/// the upkeep's [`upkeep::DataRewrite`]): `REWRITE DATA FILES` with the
/// table's defaults. When nothing is due it records that it looked, so the
/// next look waits as many commits again.
pub(crate) fn rewrite_in_background(
    catalog: IcebergCatalog,
    table: Table,
) -> futures::future::BoxFuture<'static, Result<()>> {
    Box::pin(async move {
        let packed = pack(&catalog, &table, &RewriteDataOptions::default()).await?;
        if packed.snapshot_id.is_none() {
            let at = table.metadata().last_sequence_number().to_string();
            crate::catalog::commit::swap_properties(
                &catalog,
                &table,
                PACKED_AT,
                |_| true,
                std::collections::HashMap::from([(PACKED_AT.to_string(), at)]),
            )
            .await?;
        }
        Ok(())
    })
}

/// [`rewrite_data_files`] on `table` as loaded, without taking the upkeep's
/// turn (the caller holds it).
async fn pack(
    catalog: &IcebergCatalog,
    table: &Table,
    options: &RewriteDataOptions,
) -> Result<DataFilesRewritten> {
    let roots = catalog.promoted_roots();
    let target_file_size = match options.target_file_size {
        Some(size) => size,
        None => crate::catalog::bridge::writer::target_file_size(table)?,
    };
    let choice = Choice {
        target_file_size,
        min_input_files: options.min_input_files.unwrap_or(2),
    };
    let mut packing = choose(catalog, table, &choice, &roots).await?;
    if let Some(filter) = &options.filter {
        let only = files_matching(table, filter).await?;
        packing.restrict(&only, choice.min_input_files);
    }
    let name = table.identifier().to_string();
    let nothing = |message: String| DataFilesRewritten {
        table_name: name.clone(),
        data_files_before: packing.live_files,
        data_files_after: packing.live_files,
        files_rewritten: 0,
        files_added: 0,
        partitions_rewritten: 0,
        rows_rewritten: 0,
        bytes_rewritten: 0,
        bytes_added: 0,
        snapshot_id: None,
        message,
    };
    if packing.groups.is_empty() {
        return Ok(nothing(packing.why.clone()));
    }
    let names = crate::catalog::column_names(table);
    let columns: Vec<&str> = names.iter().map(String::as_str).collect();
    let prefix = format!("icestage-packed-{}", uuid::Uuid::new_v4().simple());
    let mut rewritten = vec![];
    let mut added = vec![];
    for (n, group) in packing.groups.iter().enumerate() {
        let rows = datafusion::prelude::SessionContext::new()
            .read_table(std::sync::Arc::new(RecipeTable::of_files(
                table,
                &group.files,
            )?))?
            .select_columns(&columns)?
            .execute_stream()
            .await?
            .map_err(Error::from);
        let written =
            write_rows_sized(table, &format!("{prefix}-{n:05}"), rows, target_file_size).await;
        match written {
            Ok(files) => added.extend(files),
            Err(e) => {
                forget(catalog, table, &added).await;
                return Err(e);
            }
        }
        rewritten.extend(group.files.iter().cloned());
    }
    use crate::catalog::commit::replace::{bytes, records as rows};
    if rows(&rewritten) != rows(&added) {
        forget(catalog, table, &added).await;
        return Err(Error::invalid(format!(
            "REWRITE DATA FILES {name}: the new files hold {} rows, the files they replace {}; \
             nothing was changed",
            rows(&added),
            rows(&rewritten)
        )));
    }
    let packed = commit_packed(catalog, table, &rewritten, &added).await?;
    let after = packing.live_files - rewritten.len() as i64 + added.len() as i64;
    Ok(DataFilesRewritten {
        message: format!(
            "rewrote {} data files of {name} in {} partition(s) as {} ({} rows, no row \
             changed); {} data files before, {after} now{}",
            rewritten.len(),
            packing.groups.len(),
            added.len(),
            rows(&rewritten),
            packing.live_files,
            if packing.outside > 0 {
                format!(
                    " ({} small files lie outside the table's location and were left)",
                    packing.outside
                )
            } else {
                String::new()
            }
        ),
        table_name: name,
        data_files_before: packing.live_files,
        data_files_after: after,
        files_rewritten: rewritten.len() as i64,
        files_added: added.len() as i64,
        partitions_rewritten: packing.groups.len() as i64,
        rows_rewritten: rows(&rewritten),
        bytes_rewritten: bytes(&rewritten),
        bytes_added: bytes(&added),
        snapshot_id: Some(packed.snapshot_id),
    })
}

/// The data files of `table`'s current snapshot that may hold rows
/// matching the SQL predicate `filter` (by partition values and column
/// bounds, as a scan plans).
async fn files_matching(table: &Table, filter: &str) -> Result<std::collections::HashSet<String>> {
    let name = table.identifier();
    let schema = crate::tables::rules::df_schema(table)?;
    let expr = datafusion::prelude::SessionContext::new()
        .parse_sql_expr(filter, &schema)
        .map_err(|e| {
            Error::invalid(format!(
                "REWRITE DATA FILES {name}: where = '{filter}' is not a predicate on its columns: {e}"
            ))
        })?;
    let predicate = iceberg_datafusion::physical_plan::convert_filters_to_predicate(&[expr])
        .ok_or_else(|| {
            Error::invalid(format!(
                "REWRITE DATA FILES {name}: where = '{filter}' cannot choose files: compare columns \
                 with constants (=, <>, <, <=, >, >=, IN, IS NULL, BETWEEN), joined by AND, OR, NOT"
            ))
        })?;
    let Some(snapshot) = table.metadata().current_snapshot_id() else {
        return Ok(Default::default());
    };
    let tasks: Vec<_> = table
        .scan()
        .snapshot_id(snapshot)
        .with_filter(predicate)
        .build()?
        .plan_files()
        .await?
        .try_collect()
        .await?;
    Ok(tasks.into_iter().map(|t| t.data_file_path).collect())
}

/// Deletes files a rewrite wrote and will not commit (under the table's
/// location only; best effort, an orphan is harmless).
async fn forget(
    catalog: &crate::catalog::IcebergCatalog,
    table: &Table,
    files: &[iceberg::spec::DataFile],
) {
    let Ok(location) = catalog.assigned_location(table).await else {
        return;
    };
    for file in files {
        crate::catalog::confine::delete_within(table.file_io(), file.file_path(), &location).await;
    }
}

result_row! {
    /// What `REMOVE ORPHAN FILES <table>` found and did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct OrphanFilesRemoved {
        /// The table.
        pub table_name: String,
        /// The folder swept: the location icestage assigned to the table.
        pub location: String,
        /// Files listed under it.
        pub files_listed: i64,
        /// Of those, referenced by the table (kept).
        pub files_referenced: i64,
        /// Referenced by nothing and older than the cut-off.
        pub orphans_found: i64,
        /// Of those, deleted (none on a dry run).
        pub orphans_deleted: i64,
        /// Their bytes.
        pub orphan_bytes: i64,
        /// Referenced by nothing but newer than the cut-off (kept: they may
        /// belong to a commit in progress).
        pub files_too_recent: i64,
        /// Whether this was a dry run.
        pub dry_run: bool,
        /// What happened, in words, with the first orphans' paths.
        pub message: String,
    }
}

/// `REMOVE ORPHAN FILES` options (Iceberg's `remove_orphan_files`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanOptions {
    /// Only files last written longer ago than this go (default 3 days,
    /// Iceberg's; at least 1 hour).
    pub older_than: std::time::Duration,
    /// Find them, delete nothing.
    pub dry_run: bool,
}

impl Default for OrphanOptions {
    fn default() -> Self {
        Self {
            older_than: std::time::Duration::from_secs(3 * 86_400),
            dry_run: false,
        }
    }
}

impl WithOptions for OrphanOptions {
    const STATEMENT: &'static str = "REMOVE ORPHAN FILES";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "older_than",
            default: "`'3d'`",
            doc: "only files last written longer ago than this go (at least 1 hour)",
        },
        OptionDoc {
            key: "dry_run",
            default: "false",
            doc: "find the orphans, delete nothing",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        let mut options = Self::default();
        if let Some(value) = option(pairs, "older_than") {
            options.older_than = parse_duration(value)?;
        }
        if let Some(value) = option(pairs, "dry_run") {
            options.dry_run = parse_bool("dry_run", value)?;
        }
        Ok(options)
    }
}

impl OrphanOptions {
    /// Reads `WITH (...)` pairs; an unknown option or a bad value is refused
    /// by name.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self> {
        Self::from_with(pairs)
    }
}

/// Paths of orphans a message names.
const NAMED_ORPHANS: usize = 5;

/// `REMOVE ORPHAN FILES <table>`: see `catalog::maintain::orphans`.
async fn remove_orphan_files(
    ctx: &CommandContext,
    table: &TableName,
    options: &OrphanOptions,
) -> Result<OrphanFilesRemoved> {
    let (catalog, ident) = (ctx.icestage.catalog(&table.catalog)?, &table.ident);
    let table = catalog.catalog().load_table(ident).await?;
    let sweep = crate::catalog::maintain::orphans::remove_orphans(
        catalog,
        &table,
        options.older_than,
        options.dry_run,
    )
    .await?;
    let name = ident.to_string();
    let found = sweep.orphans.len();
    let bytes: u64 = sweep.orphans.iter().map(|o| o.size).sum();
    let mut named: Vec<&str> = sweep
        .orphans
        .iter()
        .take(NAMED_ORPHANS)
        .map(|o| o.path.as_str())
        .collect();
    if found > NAMED_ORPHANS {
        named.push("...");
    }
    let cutoff = crate::config::format_duration(options.older_than);
    let message = match (found, options.dry_run) {
        (0, _) => format!(
            "no file under {} is an orphan older than {cutoff} ({} listed, {} referenced, {} \
             unreferenced but newer)",
            sweep.location, sweep.listed, sweep.referenced, sweep.too_recent
        ),
        (_, true) => format!(
            "dry run: {found} orphan(s) of {name} older than {cutoff} ({}), nothing deleted: {}",
            crate::limits::human(bytes),
            named.join(", ")
        ),
        (_, false) => format!(
            "deleted {} of {found} orphan(s) of {name} older than {cutoff} ({}): {}",
            sweep.deleted,
            crate::limits::human(bytes),
            named.join(", ")
        ),
    };
    Ok(OrphanFilesRemoved {
        table_name: name,
        location: sweep.location.clone(),
        files_listed: sweep.listed,
        files_referenced: sweep.referenced,
        orphans_found: found as i64,
        orphans_deleted: sweep.deleted,
        orphan_bytes: bytes as i64,
        files_too_recent: sweep.too_recent,
        dry_run: options.dry_run,
        message,
    })
}
