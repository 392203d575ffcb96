//! Validation: what promotion proves before anything reaches the target.
//!
//! This file is the vocabulary every step shares: how promotion proves what
//! it promotes ([`Verify`]), what validation found ([`Validation`]), how a
//! finding shows a row, the target an upload names and the path its rows
//! take. The steps, a file each: [`drift`] (what the staging metadata
//! answers, without reading data), [`verify`] (every staged byte, a folder
//! split by step), [`enforce`] (the target's rules), `distribute` (the
//! same on a cluster) and [`findings`] (kept beside the staging table).
//! [`validate`] orchestrates them; `promote` calls `validate`; no step
//! calls back, and this file names only the two leaves, `drift` and
//! `findings`.

#[cfg(feature = "cluster")]
pub(crate) mod distribute;
pub(crate) mod drift;
pub(crate) mod enforce;
pub(crate) mod findings;
pub(crate) mod validate;
pub(crate) mod verify;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use iceberg::spec::DataFile;
use iceberg::table::Table;

use self::drift::{Matching, schema_drift};
use self::findings::Finding;
use super::{Staging, is_missing};
use crate::cluster::{Cluster, PinnedFile, Recipe};
use crate::error::{Error, Result};
use crate::tables::rules::Rule;

/// Row-level findings kept per rule; the count covers every violation.
pub(crate) const FINDINGS_PER_RULE: usize = 1000;
/// Memory the uniqueness queries may hold before spilling to disk.
pub(crate) const VALIDATION_MEMORY: usize = 256 * 1024 * 1024;

/// What validation found.
#[derive(Debug, Default)]
pub(crate) struct Validation {
    /// The staging table's live data files (what promotion registers).
    pub(crate) files: Vec<DataFile>,
    /// Rows in those files.
    pub(crate) rows: i64,
    /// Problems of the table as a whole (drift, operations, nulls).
    pub(crate) reasons: Vec<String>,
    /// Violations per rule, all of them counted.
    pub(crate) violations: BTreeMap<String, (Rule, u64)>,
    /// Row-level findings, at most [`FINDINGS_PER_RULE`] per rule.
    pub(crate) findings: Vec<Finding>,
    /// The cluster the proof or the rules' scans ran on; `None`: this process.
    pub(crate) cluster: Option<Cluster>,
    /// File references that failed (`upload::files`), all of them counted.
    pub(crate) file_problems: u64,
}

impl Validation {
    /// True when nothing stands in the way of promotion.
    pub(crate) fn passed(&self) -> bool {
        self.reasons.is_empty() && self.violations.values().all(|(_, n)| *n == 0)
    }

    /// Where the proof and the rules' scans ran, as results show it.
    pub(crate) fn ran_on(&self) -> String {
        crate::cluster::ran_on(self.cluster.as_ref())
    }

    /// Every violation, counted.
    pub(crate) fn finding_count(&self) -> u64 {
        self.violations.values().map(|(_, n)| n).sum::<u64>() + self.file_problems
    }

    /// One line per problem: the table-level reasons, then a summary per
    /// violated rule.
    pub(crate) fn summary(&self, id: &str) -> Vec<String> {
        let mut lines = self.reasons.clone();
        for (name, (rule, count)) in &self.violations {
            if *count > 0 {
                lines.push(format!(
                    "rule '{name}' {} fails for {count} row(s) (SELECT * FROM upload_findings('{id}'))",
                    rule.definition()
                ));
            }
        }
        lines
    }
}

/// How promotion proves what it promotes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Verify {
    /// Read every staged file: schema, NULLs, rules and metrics from the
    /// bytes (the `verify` step). The default, and what the service uses.
    #[default]
    Bytes,
    /// Trust the staging table's manifests (null counts, bounds): only for
    /// files a trusted writer produced, e.g. icestage itself.
    Metadata,
}

impl Verify {
    /// The option value that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Metadata => "metadata",
        }
    }
}

impl std::str::FromStr for Verify {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "bytes" => Ok(Self::Bytes),
            "metadata" => Ok(Self::Metadata),
            _ => Err(Error::invalid(format!(
                "verify = '{text}' is not a verification mode: use 'bytes' (read every staged file, \
                 the default) or 'metadata' (trust the manifests; only for trusted writers)"
            ))),
        }
    }
}

/// Renders row `row` of `columns` (name, array) as `name=value, ...`.
pub(crate) fn key_text(columns: &[(String, Arc<dyn Array>)], row: usize) -> Result<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut parts = vec![];
    for (name, array) in columns {
        let formatter = ArrayFormatter::try_new(array.as_ref(), &options)?;
        parts.push(format!("{name}={}", formatter.value(row)));
    }
    Ok(parts.join(", "))
}

/// Renders row `row` of `columns` as a JSON object of strings (NULL as null).
pub(crate) fn values_json(columns: &[(String, Arc<dyn Array>)], row: usize) -> Result<String> {
    let options = FormatOptions::default();
    let mut object = serde_json::Map::new();
    for (name, array) in columns {
        let value = if array.is_null(row) {
            serde_json::Value::Null
        } else {
            let formatter = ArrayFormatter::try_new(array.as_ref(), &options)?;
            serde_json::Value::String(formatter.value(row).to_string())
        };
        object.insert(name.clone(), value);
    }
    Ok(serde_json::Value::Object(object).to_string())
}

pub(crate) fn named(
    batch: &RecordBatch,
    names: &[String],
) -> Result<Vec<(String, Arc<dyn Array>)>> {
    names
        .iter()
        .map(|name| {
            batch
                .column_by_name(name)
                .map(|a| (name.clone(), Arc::clone(a)))
                .ok_or_else(|| Error::internal(format!("the scan returned no column '{name}'")))
        })
        .collect()
}

/// How the rows reached the target (the `path` column of PROMOTE UPLOAD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferPath {
    /// The staged files were registered as they are.
    ZeroCopy,
    /// Nothing was committed (an empty upload, or an earlier promotion did it).
    None,
    /// Validation only (`WITH (dry_run = true)`).
    DryRun,
    /// The staged files were copied into the target's storage, verified
    /// there, then registered.
    Copy,
    /// The staged rows were rewritten as new files with the target's field ids.
    Rewrite,
}

crate::rows::named_column!(TransferPath);

impl std::fmt::Display for TransferPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TransferPath {
    /// The name the result row shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ZeroCopy => "zero_copy",
            Self::None => "none",
            Self::DryRun => "dry_run",
            Self::Copy => "copy",
            Self::Rewrite => "rewrite",
        }
    }
}

/// How the staged rows reach the target: registered as they are only when
/// the field ids match and no credential that can still write reaches the
/// staged files (a local warehouse: the client's connection is the trusted
/// catalog itself); copied, then verified, when only the ids match;
/// rewritten otherwise.
pub(crate) fn transfer_path(staging: &Staging, target: &Table) -> TransferPath {
    let same_ids = schema_drift(
        staging.table.metadata().current_schema(),
        target.metadata().current_schema(),
        Matching::ById,
    )
    .is_empty();
    // Rows with file references are rewritten: each uri then names the
    // file's copy in the target's storage.
    let references = crate::tables::files::file_columns(target).is_ok_and(|c| !c.is_empty());
    match (same_ids && !references, staging.catalog.zero_copy_safe()) {
        (true, true) => TransferPath::ZeroCopy,
        (true, false) => TransferPath::Copy,
        (false, _) => TransferPath::Rewrite,
    }
}

/// Whether verification reads copies made in the target's storage rather
/// than the staged files: wherever a client's keys may still reach the
/// staged objects (every warehouse but a local one), so that the rules, the
/// rewrite and the commit see exactly the bytes verified.
pub(crate) fn copies_first(staging: &Staging, path: TransferPath) -> bool {
    match path {
        TransferPath::Copy => true,
        TransferPath::Rewrite => !staging.catalog.zero_copy_safe(),
        _ => false,
    }
}

/// Exactly `files`, the files verification read (the copies in the
/// target's storage when `copied`), with the staging table's schema.
pub(crate) fn verified_files(
    staging: &Staging,
    target: &Table,
    files: &[DataFile],
    copied: bool,
) -> Result<Recipe> {
    let io = if copied {
        target.file_io()
    } else {
        staging.table.file_io()
    };
    Recipe::pinned(&staging.table, files.iter().map(PinnedFile::from), io)
}

/// The target `staging` names, loaded; a missing one says what becomes of
/// the upload's rows.
pub(crate) async fn load_target(staging: &Staging) -> Result<Table> {
    staging
        .catalog
        .catalog()
        .load_table(&staging.target)
        .await
        .map_err(|e| {
            if is_missing(&e) {
                Error::TableNotFound {
                    table: staging.target.to_string(),
                    hint: format!(
                        ": it is the target of upload '{}', whose rows stay in {} until the upload \
                         expires; ABORT UPLOAD '{}' discards them",
                        staging.id,
                        staging.name(),
                        staging.id
                    ),
                }
            } else {
                e.into()
            }
        })
}
