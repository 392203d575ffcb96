//! Appending data files: plainly ([`append_files`]), or exactly once
//! ([`append_once`]).
//!
//! The snapshot that adds the files carries an evidence property (an upload
//! id, a copy id). The commit runs through a catalog that looks for that
//! evidence every time the table is loaded, and iceberg's
//! `Transaction::commit` loads the table at the start of every attempt,
//! including the retries it performs on conflicts, so none of them can append
//! twice. After any answer, including a lost one, the table is loaded again
//! and the evidence decides.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, TableIdent};

use super::IcebergCatalog;
use super::provider::{MAX_COMMIT_ATTEMPTS, is_commit_conflict, jitter};
use super::scoped::{LoadCheck, ScopedCatalog};
use crate::error::{Error, Result};

/// The snapshot of `table` whose summary has `key = value`, if any.
pub(crate) fn snapshot_with(table: &Table, key: &str, value: &str) -> Option<i64> {
    table
        .metadata()
        .snapshots()
        .find(|s| {
            s.summary()
                .additional_properties
                .get(key)
                .is_some_and(|v| v == value)
        })
        .map(|s| s.snapshot_id())
}

/// Appends `files` to table `ident` in one snapshot. The commit skips
/// iceberg's duplicate-file check, which reads every manifest of the table
/// (the files are new: their names are unique). iceberg retries conflicts
/// with backoff but no jitter, so a crowd of concurrent writers can exhaust
/// it; the commit is retried again with jitter on the reloaded table.
pub(crate) async fn append_files(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    files: Vec<DataFile>,
) -> Result<()> {
    // Commits of this process to one table take turns; other processes are
    // met by retries.
    let _turn = catalog.exclusive(&ident.to_string()).await;
    let mut attempt = 0u32;
    loop {
        let base = catalog.catalog().load_table(ident).await?;
        let tx = Transaction::new(&base);
        let tx = tx
            .fast_append()
            .with_check_duplicate(false)
            .add_data_files(files.clone())
            .apply(tx)?;
        match tx
            .commit(catalog.catalog().as_ref())
            .await
            .map_err(Error::from)
        {
            Ok(_) => return Ok(()),
            Err(e) if is_commit_conflict(&e) && attempt < MAX_COMMIT_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(jitter(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

const ALREADY_COMMITTED: &str = "these files were already committed to this table";

/// Appends `files` to `table` in one snapshot carrying `key = value`, unless
/// a snapshot with that property exists. Returns the snapshot that holds
/// them and whether this call committed it.
pub(crate) async fn append_once(
    catalog: &IcebergCatalog,
    table: &Table,
    files: Vec<DataFile>,
    key: &str,
    value: &str,
) -> Result<(i64, bool)> {
    let (check_key, check_value) = (key.to_string(), value.to_string());
    let check: LoadCheck =
        Arc::new(
            move |table: &Table| match snapshot_with(table, &check_key, &check_value) {
                Some(_) => Err(iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    ALREADY_COMMITTED,
                )),
                None => Ok(()),
            },
        );
    // Commits of this process to one table take turns; other processes are
    // met by retries.
    let _turn = catalog.exclusive(&table.identifier().to_string()).await;
    let catalog = catalog.catalog();
    let guarded = ScopedCatalog::new(Arc::clone(catalog)).check_on_load(check);
    let mut base = table.clone();
    let mut attempt = 0u32;
    loop {
        let tx = Transaction::new(&base);
        let tx = tx
            .fast_append()
            // The evidence check replaces the duplicate-file check, which
            // reads every manifest of the table on each attempt.
            .with_check_duplicate(false)
            .set_snapshot_properties(HashMap::from([(key.to_string(), value.to_string())]))
            .add_data_files(files.clone())
            .apply(tx)?;
        let result = tx.commit(&guarded).await;
        let current = catalog.load_table(table.identifier()).await?;
        if let Some(snapshot_id) = snapshot_with(&current, key, value) {
            let committed_here = matches!(
                &result,
                Ok(committed) if snapshot_with(committed, key, value) == Some(snapshot_id)
            );
            return Ok((snapshot_id, committed_here));
        }
        match result {
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "internal: the commit to {} succeeded but it holds no snapshot with {key}={value}",
                    table.identifier()
                )));
            }
            Err(e)
                if attempt < MAX_COMMIT_ATTEMPTS
                    && (e.retryable()
                        || e.kind() == iceberg::ErrorKind::CatalogCommitConflicts) =>
            {
                attempt += 1;
                tokio::time::sleep(jitter(attempt)).await;
                base = current;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Where a compare-and-swap on a table's properties stands.
#[derive(Debug)]
pub(crate) enum Swap {
    /// Committed: the table as it is now.
    Done(Table),
    /// The condition did not hold when the commit was attempted; the value
    /// of the `state` property found instead.
    Refused(String),
}

const CONDITION_FAILED: &str = "the table changed concurrently: state is now ";

/// Sets `properties` on `table`, but only if `accept` approves the table's
/// properties as they are when the commit is attempted: the check runs again
/// on every retry, so two processes racing for one transition cannot both
/// win. `state_key` names the property reported when the check refuses.
pub(crate) async fn swap_properties(
    catalog: &Arc<dyn Catalog>,
    table: &Table,
    state_key: &'static str,
    accept: impl Fn(&HashMap<String, String>) -> bool + Send + Sync + 'static,
    properties: HashMap<String, String>,
) -> Result<Swap> {
    let check: LoadCheck = Arc::new(move |table: &Table| {
        let props = table.metadata().properties();
        if accept(props) {
            Ok(())
        } else {
            let now = props
                .get(state_key)
                .cloned()
                .unwrap_or_else(|| "unknown".to_string());
            Err(iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!("{CONDITION_FAILED}{now}"),
            ))
        }
    });
    let guarded = ScopedCatalog::new(Arc::clone(catalog)).check_on_load(check);
    let tx = Transaction::new(table);
    let mut action = tx.update_table_properties();
    for (key, value) in properties {
        action = action.set(key, value);
    }
    let tx = action.apply(tx)?;
    match tx.commit(&guarded).await {
        Ok(table) => Ok(Swap::Done(table)),
        Err(e) if e.message().starts_with(CONDITION_FAILED) => Ok(Swap::Refused(
            e.message().trim_start_matches(CONDITION_FAILED).to_string(),
        )),
        Err(e) => Err(e.into()),
    }
}
