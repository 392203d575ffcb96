//! Rows `COPY INTO` rejected (`on_error = 'continue'`), kept in the
//! catalog's `icestage.copy_rejects` table under the copy's id, and read
//! back with `copy_rejects('<table>')`: a rejection counts once its copy
//! is proven committed, as the copy log's rows do.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use iceberg::TableIdent;

use super::records::Rejected;
use crate::catalog::IcebergCatalog;
use crate::catalog::bridge::insert::{append_stored, stored_rows_of};
use crate::error::Result;
use crate::rows::{StoredRow, result_row};
use crate::session::log::icestage_table;

/// Name of the rejections table (in the `icestage` namespace).
pub const COPY_REJECTS_TABLE: &str = "copy_rejects";

fn rejects_ident() -> TableIdent {
    icestage_table(COPY_REJECTS_TABLE)
}

result_row! {
    /// One row of the rejections table: a rejected row of a copy into
    /// `target_table`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct RejectRow {
        /// The target, `namespace.table` (what the table is partitioned by).
        pub target_table: String,
        /// The copy that rejected it.
        pub copy_id: String,
        /// The source file's URI.
        pub file: String,
        /// Its line or row number, from 1.
        pub line: Option<i64>,
        /// The column at fault, when one is.
        pub column: Option<String>,
        /// What is wrong.
        pub error: String,
        /// The record as read.
        pub record: Option<String>,
        /// When the copy recorded it.
        pub recorded_at: DateTime<Utc>,
    }
}

/// Records `rejected` rows of copy `copy_id` into `target`, in one commit
/// (before the copy's own: they count once it is proven).
pub(crate) async fn record(
    catalog: &IcebergCatalog,
    target: &str,
    copy_id: &str,
    rejected: &[Rejected],
) -> Result<()> {
    if rejected.is_empty() {
        return Ok(());
    }
    let table = catalog
        .owned_table(
            &rejects_ident(),
            RejectRow::iceberg_schema,
            Some((1, "by_target")),
        )
        .await?;
    let now = Utc::now();
    let rows: Vec<RejectRow> = rejected
        .iter()
        .map(|r| RejectRow {
            target_table: target.to_string(),
            copy_id: copy_id.to_string(),
            file: r.file.clone(),
            line: Some(r.line),
            column: r.column.clone(),
            error: r.error.clone(),
            record: Some(r.record.clone()),
            recorded_at: now,
        })
        .collect();
    append_stored(catalog, &table, &rows).await
}

result_row! {
    /// One row a `COPY INTO` rejected, as `copy_rejects('<table>')` lists it.
    #[derive(Debug, Clone, PartialEq)]
    pub struct CopyReject {
        /// The copy that rejected it.
        pub copy_id: String,
        /// The source file's URI.
        pub file: String,
        /// Its line (CSV, JSON) or row number (Parquet, Avro), from 1.
        pub line: Option<i64>,
        /// The column at fault, when one is.
        pub column: Option<String>,
        /// What is wrong.
        pub error: String,
        /// The record as read (cut to 4 KiB).
        pub record: Option<String>,
        /// When the copy recorded it.
        pub recorded_at: DateTime<Utc>,
    }
}

impl From<RejectRow> for CopyReject {
    fn from(row: RejectRow) -> Self {
        Self {
            copy_id: row.copy_id,
            file: row.file,
            line: row.line,
            column: row.column,
            error: row.error,
            record: row.record,
            recorded_at: row.recorded_at,
        }
    }
}

result_row! {
    /// One error `COPY INTO ... WITH (validation_mode = 'return_errors')`
    /// found: a malformed row, or a file that cannot be loaded at all
    /// (no line).
    #[derive(Debug, Clone, PartialEq)]
    pub struct CopyError {
        /// The source file's URI.
        pub file: String,
        /// The row's line or row number; none for a whole file.
        pub line: Option<i64>,
        /// The column at fault, when one is.
        pub column: Option<String>,
        /// What is wrong.
        pub error: String,
        /// The record as read (cut to 4 KiB).
        pub record: Option<String>,
    }
}

impl From<Rejected> for CopyError {
    fn from(r: Rejected) -> Self {
        Self {
            file: r.file,
            line: Some(r.line),
            column: r.column,
            error: r.error,
            record: Some(r.record),
        }
    }
}

result_row! {
    /// One row `COPY INTO ... WITH (validation_mode = 'return_<n>_rows')`
    /// would load: the file, its row, and its values as the table would
    /// receive them (a JSON object).
    #[derive(Debug, Clone, PartialEq)]
    pub struct CopyPreview {
        /// The source file's URI.
        pub file: String,
        /// The row's values, by the table's column names.
        pub row: String,
    }
}

/// The rejections of the copies into the table `name` that are `proven`
/// (committed), newest first.
pub(crate) async fn list(
    catalog: &IcebergCatalog,
    name: &str,
    proven: &HashSet<String>,
) -> Result<Vec<CopyReject>> {
    let mut rows: Vec<CopyReject> =
        stored_rows_of::<RejectRow>(catalog.catalog().as_ref(), &rejects_ident(), name)
            .await?
            .into_iter()
            .filter(|reject| proven.contains(&reject.copy_id))
            .map(CopyReject::from)
            .collect();
    rows.sort_by(|a, b| {
        b.recorded_at
            .cmp(&a.recorded_at)
            .then_with(|| a.copy_id.cmp(&b.copy_id))
            .then_with(|| a.file.cmp(&b.file))
            .then_with(|| a.line.cmp(&b.line))
    });
    Ok(rows)
}
