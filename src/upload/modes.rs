//! How a promotion lands the verified rows in its target:
//!
//! * `append` (the default): the files are added, nothing else changes;
//! * `upsert`: the target's rows whose key is in the upload are replaced by
//!   the upload's rows, the others are inserted;
//! * `replace_partitions`: every partition the upload touches holds exactly
//!   the upload's rows afterwards; the others are untouched.
//!
//! Upserts and partition replacements are copy-on-write `overwrite`
//! snapshots ([`crate::catalog::commit::replace`]): a target file that loses rows
//! is written again without them and replaced, so the target never holds
//! delete files and every engine reads it as an append-only table
//! (iceberg-rust, PyIceberg, DuckDB and Spark alike). They carry the same
//! exactly-once evidence as appends and commit on exactly the version they
//! were planned on; a commit that lands in between (another promotion, a
//! copy) makes them plan again on the newer version, so their effect is as
//! if they ran after it: no row committed meanwhile escapes an upsert's key
//! match, and a partition replaced holds the upload's rows only.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use datafusion::prelude::SessionContext;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use iceberg::spec::{DataFile, Datum};
use iceberg::table::Table;

use super::Staging;
use super::validation::enforce::ident;
use crate::catalog::bridge::writer::write_rows;
use crate::catalog::commit::Landed;
use crate::catalog::commit::replace::{Live, Plan, Replaced, Version, overwrite_once, records};
use crate::catalog::snapshot::summary_property;
use crate::cluster::RecipeTable;
use crate::error::{Error, Result};
use crate::tables::rules::{IDENTIFIER_FIELDS_RULE, Rule, rules_of};

/// Snapshot summary key: the mode of the promotion that committed it
/// (absent: `append`).
pub(crate) const SNAPSHOT_MODE: &str = "icestage.promote-mode";

/// The mode the promotion that committed `snapshot_id` of `target` ran in.
pub(crate) fn landed_mode(target: &Table, snapshot_id: i64) -> String {
    summary_property(target, snapshot_id, SNAPSHOT_MODE)
        .unwrap_or_else(|| PromoteMode::Append.name().to_string())
}

/// How a promotion lands its rows in the target (`PROMOTE UPLOAD ... WITH
/// (mode = ...)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PromoteMode {
    /// The rows are added (the default).
    #[default]
    Append,
    /// Target rows whose key is in the upload are replaced by the upload's,
    /// the others inserted. The key: the columns named, else the target's
    /// identifier fields, else its one UNIQUE rule.
    Upsert {
        /// The key columns, when named (`key = 'id'`, `key = '(a, b)'`).
        key: Option<Vec<String>>,
    },
    /// Every partition the upload touches is replaced by its rows.
    ReplacePartitions,
}

impl PromoteMode {
    /// The mode `mode` names, with the key `key` names (upsert only).
    pub fn parse(mode: &str, key: Option<&str>) -> Result<Self> {
        let key = key
            .map(|text| {
                let columns: Vec<String> = text
                    .trim()
                    .trim_start_matches('(')
                    .trim_end_matches(')')
                    .split(',')
                    .map(|c| c.trim().trim_matches('"').to_string())
                    .collect();
                if columns.iter().any(String::is_empty) {
                    return Err(Error::invalid(format!(
                        "key = '{text}' is not a list of columns: write key = 'id' or key = '(region, id)'"
                    )));
                }
                Ok(columns)
            })
            .transpose()?;
        let mode = match mode.trim().to_ascii_lowercase().as_str() {
            "append" => PromoteMode::Append,
            "upsert" => return Ok(PromoteMode::Upsert { key }),
            "replace_partitions" => PromoteMode::ReplacePartitions,
            other => {
                return Err(Error::invalid(format!(
                    "mode = '{other}' is not a promotion mode: write 'append' (the default), \
                     'upsert' or 'replace_partitions'"
                )));
            }
        };
        if key.is_some() {
            return Err(Error::invalid(format!(
                "key names the columns an upsert matches rows by; mode = '{}' takes none: \
                 drop key, or write mode = 'upsert'",
                mode.name()
            )));
        }
        Ok(mode)
    }

    /// The mode's name, as `mode = '...'` writes it.
    pub fn name(&self) -> &'static str {
        match self {
            PromoteMode::Append => "append",
            PromoteMode::Upsert { .. } => "upsert",
            PromoteMode::ReplacePartitions => "replace_partitions",
        }
    }
}

/// What a promotion does to the target's rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Upload rows that are new to the target.
    pub(crate) inserted: i64,
    /// Target rows replaced by upload rows with their key (upsert).
    pub(crate) updated: i64,
    /// Target rows removed without a replacement (the replaced partitions'
    /// old rows).
    pub(crate) deleted: i64,
}

/// Whether `mode` can promote into `target`, and the key an upsert
/// matches by: refused before the upload is claimed, with what to do.
pub(crate) fn check(mode: &PromoteMode, target: &Table) -> Result<Option<Vec<String>>> {
    let name = target.identifier();
    match mode {
        PromoteMode::Append => Ok(None),
        PromoteMode::ReplacePartitions => {
            if target
                .metadata()
                .default_partition_spec()
                .is_unpartitioned()
            {
                return Err(Error::invalid(format!(
                    "mode = 'replace_partitions' replaces the partitions an upload touches, but \
                     {name} has no partitions: promote with mode = 'append', or with mode = \
                     'upsert' and a key, or create the target PARTITIONED BY (...)"
                )));
            }
            Ok(None)
        }
        PromoteMode::Upsert { key: Some(columns) } => {
            let schema = target.metadata().current_schema();
            if let Some(missing) = columns.iter().find(|c| schema.field_by_name(c).is_none()) {
                return Err(Error::invalid(format!(
                    "key = '{}' names column '{missing}', which {name} does not have",
                    columns.join(", ")
                )));
            }
            Ok(Some(columns.clone()))
        }
        PromoteMode::Upsert { key: None } => {
            let keys: Vec<(String, Vec<String>)> = rules_of(target)?
                .into_iter()
                .filter_map(|rule| match rule {
                    Rule::Unique { name, columns } => Some((name, columns)),
                    Rule::Check { .. } => None,
                })
                .collect();
            if let Some((_, columns)) = keys.iter().find(|(n, _)| n == IDENTIFIER_FIELDS_RULE) {
                return Ok(Some(columns.clone()));
            }
            match keys.as_slice() {
                [(_, columns)] => Ok(Some(columns.clone())),
                [] => Err(Error::invalid(format!(
                    "mode = 'upsert' matches rows by a key, and {name} has none: name it with \
                     key = '<column>' (or key = '(a, b)'), or give the target identifier fields \
                     or a UNIQUE rule"
                ))),
                several => Err(Error::invalid(format!(
                    "{name} has several keys ({}): name the one to upsert by with key = '...'",
                    several
                        .iter()
                        .map(|(_, c)| format!("UNIQUE ({})", c.join(", ")))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        }
    }
}

/// Commits `files` (verified) to `target` as `mode` says (not `append`),
/// exactly once: the snapshot holding them, whether this call committed
/// it, and what it did to the target's rows.
pub(crate) async fn commit(
    staging: &Staging,
    target: &Table,
    mode: &PromoteMode,
    key: Option<&[String]>,
    files: Vec<DataFile>,
) -> Result<(Landed, Changes)> {
    let changes = Arc::new(Mutex::new(Changes::default()));
    let upserting = match (mode, key) {
        (PromoteMode::Upsert { .. }, Some(key)) => Some(Upserting::new(target, key, &files)?),
        _ => None,
    };
    let plan: Plan<'_> = {
        let changes = Arc::clone(&changes);
        let files = files.clone();
        Box::new(
            move |version: &Table, live: Vec<Live>| -> BoxFuture<'static, Result<Replaced>> {
                let changes = Arc::clone(&changes);
                let files = files.clone();
                let upserting = upserting.clone();
                let version = version.clone();
                Box::pin(async move {
                    let (replaced, found) = match &upserting {
                        Some(upserting) => upserting.plan(&version, live, &files, true).await?,
                        None => replace_partitions(&version, live, &files),
                    };
                    *changes.lock().expect("changes") = found;
                    Ok(replaced)
                })
            },
        )
    };
    let landed = overwrite_once(
        &staging.catalog,
        target,
        &staging.evidence(),
        mode.name(),
        HashMap::from([(SNAPSHOT_MODE.to_string(), mode.name().to_string())]),
        plan,
    )
    .await?;
    let changes = *changes.lock().expect("changes");
    Ok((landed, changes))
}

/// What `mode` would do to `target` as it is now, committing nothing
/// (`dry_run`): nothing is written.
pub(crate) async fn preview(
    staging: &Staging,
    target: &Table,
    mode: &PromoteMode,
    key: Option<&[String]>,
    files: &[DataFile],
) -> Result<Changes> {
    let rows = records(files);
    if *mode == PromoteMode::Append {
        return Ok(Changes {
            inserted: rows,
            ..Changes::default()
        });
    }
    let assigned = staging.catalog.assigned_location(target).await?;
    let live = Version::read(target, &assigned, "this promotion mode")
        .await?
        .live();
    Ok(match (mode, key) {
        (PromoteMode::Upsert { .. }, Some(key)) => {
            Upserting::new(target, key, files)?
                .plan(target, live, files, false)
                .await?
                .1
        }
        _ => replace_partitions(target, live, files).1,
    })
}

/// `replace_partitions` on one version: the live files of the partitions
/// `files` touch (under the target's current spec) are deleted.
fn replace_partitions(target: &Table, live: Vec<Live>, files: &[DataFile]) -> (Replaced, Changes) {
    let spec_id = target.metadata().default_partition_spec_id();
    let touched: HashSet<String> = files
        .iter()
        .map(|f| format!("{:?}", f.partition()))
        .collect();
    let deleted: Vec<DataFile> = live
        .into_iter()
        .filter(|l| l.spec_id == spec_id && touched.contains(&format!("{:?}", l.file.partition())))
        .map(|l| l.file)
        .collect();
    let changes = Changes {
        inserted: records(files),
        updated: 0,
        deleted: records(&deleted),
    };
    (
        Replaced {
            deleted,
            added: files.to_vec(),
            scratch: vec![],
        },
        changes,
    )
}

/// What one target file holds of an upsert's keys: how many of its rows
/// match, and the files its other rows were written to (when it was
/// rewritten).
#[derive(Debug, Clone)]
struct Matched {
    rows: i64,
    remainder: Vec<DataFile>,
}

/// An upsert's key match, kept across the versions it is planned on (data
/// files never change, so a file matched once is not read again).
#[derive(Clone)]
struct Upserting {
    key: Vec<String>,
    /// The first key column's field id and the upload's bounds of it: a
    /// target file whose bounds lie outside holds none of the keys.
    bounds: Option<(i32, Datum, Datum)>,
    /// Per target file (by path): its match, once read.
    matched: Arc<Mutex<HashMap<String, Matched>>>,
}

impl Upserting {
    fn new(target: &Table, key: &[String], files: &[DataFile]) -> Result<Self> {
        let schema = target.metadata().current_schema();
        let first = schema.field_by_name(&key[0]).ok_or_else(|| {
            Error::invalid(format!(
                "{} has no column '{}'",
                target.identifier(),
                key[0]
            ))
        })?;
        let mut bounds: Option<(Datum, Datum)> = None;
        let mut complete = true;
        for file in files {
            match (
                file.lower_bounds().get(&first.id),
                file.upper_bounds().get(&first.id),
            ) {
                (Some(lower), Some(upper)) => {
                    bounds = Some(match bounds {
                        None => (lower.clone(), upper.clone()),
                        Some((lo, hi)) => (
                            if lower < &lo { lower.clone() } else { lo },
                            if upper > &hi { upper.clone() } else { hi },
                        ),
                    });
                }
                // A file of NULL keys only has no bounds and matches nothing.
                _ if file.null_value_counts().get(&first.id) == Some(&file.record_count()) => {}
                _ => complete = false,
            }
        }
        Ok(Self {
            key: key.to_vec(),
            bounds: bounds
                .filter(|_| complete)
                .map(|(lower, upper)| (first.id, lower, upper)),
            matched: Arc::default(),
        })
    }

    /// Whether `file` may hold one of the upload's keys, by its bounds.
    fn may_match(&self, file: &DataFile) -> bool {
        let Some((id, lower, upper)) = &self.bounds else {
            return true;
        };
        match (file.lower_bounds().get(id), file.upper_bounds().get(id)) {
            (Some(low), Some(high)) => !(high < lower || low > upper),
            _ => true,
        }
    }

    /// The upsert on one version: every live file that holds an upload key
    /// is replaced by its other rows (`write`; otherwise only counted).
    async fn plan(
        &self,
        target: &Table,
        live: Vec<Live>,
        files: &[DataFile],
        write: bool,
    ) -> Result<(Replaced, Changes)> {
        let ctx = SessionContext::new();
        ctx.register_table("staged", Arc::new(RecipeTable::of_files(target, files)?))?;
        let mut replaced = Replaced {
            added: files.to_vec(),
            ..Replaced::default()
        };
        let mut matched_rows = 0i64;
        for Live { file, .. } in live {
            if !self.may_match(&file) {
                continue;
            }
            let path = file.file_path().to_string();
            let known = self.matched.lock().expect("matched").get(&path).cloned();
            let matched = match known {
                Some(matched) => matched,
                None => {
                    let matched = self.match_file(&ctx, target, &file, write).await?;
                    if write {
                        self.matched
                            .lock()
                            .expect("matched")
                            .insert(path, matched.clone());
                    }
                    matched
                }
            };
            if matched.rows == 0 {
                continue;
            }
            matched_rows += matched.rows;
            replaced.deleted.push(file);
            replaced
                .scratch
                .extend(matched.remainder.iter().map(|f| f.file_path().to_string()));
            replaced.added.extend(matched.remainder);
        }
        let rows = records(files);
        Ok((
            replaced,
            Changes {
                inserted: (rows - matched_rows).max(0),
                updated: matched_rows,
                deleted: 0,
            },
        ))
    }

    /// Reads one target file against the upload's keys: how many of its
    /// rows match and, with `write`, its other rows written as new files
    /// (none when every row matches or none does).
    async fn match_file(
        &self,
        ctx: &SessionContext,
        target: &Table,
        file: &DataFile,
        write: bool,
    ) -> Result<Matched> {
        ctx.deregister_table("target_file")?;
        ctx.register_table(
            "target_file",
            Arc::new(RecipeTable::of_files(target, std::slice::from_ref(file))?),
        )?;
        let joined = self
            .key
            .iter()
            .map(|c| format!("s.{0} = t.{0}", ident(c)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let exists = format!("EXISTS (SELECT 1 FROM staged s WHERE {joined})");
        let count = ctx
            .sql(&format!(
                "SELECT count(*) FROM target_file t WHERE {exists}"
            ))
            .await?
            .collect()
            .await?;
        let rows = count
            .first()
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .map(|a| a.value(0))
            })
            .unwrap_or(0);
        if rows == 0 || !write || rows == file.record_count() as i64 {
            return Ok(Matched {
                rows,
                remainder: vec![],
            });
        }
        let columns = crate::catalog::column_names(target)
            .iter()
            .map(|c| format!("t.{}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ");
        let kept = ctx
            .sql(&format!(
                "SELECT {columns} FROM target_file t WHERE NOT {exists}"
            ))
            .await?
            .execute_stream()
            .await?
            .map_err(Error::from);
        let remainder = write_rows(
            target,
            &format!("icestage-upsert-{}", uuid::Uuid::new_v4().simple()),
            kept,
        )
        .await?;
        if records(&remainder) + rows != file.record_count() as i64 {
            return Err(Error::internal(format!(
                "an upsert into {} read {} rows of {} where its manifest records {}",
                target.identifier(),
                records(&remainder) + rows,
                file.file_path(),
                file.record_count()
            )));
        }
        Ok(Matched { rows, remainder })
    }
}
