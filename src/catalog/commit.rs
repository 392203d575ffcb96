//! Appending data files exactly once.
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

use iceberg::Catalog;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::provider::jitter;
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

const ALREADY_COMMITTED: &str = "these files were already committed to this table";

/// Appends `files` to `table` in one snapshot carrying `key = value`, unless
/// a snapshot with that property exists. Returns the snapshot that holds
/// them and whether this call committed it.
pub(crate) async fn append_once(
    catalog: &Arc<dyn Catalog>,
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
                if attempt < 8
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
