//! Moving staged rows into the target's storage, for catalogs where the
//! staging table's storage dies with it (S3 Tables deletes a table's bucket).
//!
//! * [`copy_files`] (`path = copy`): when the staging table has the target's
//!   field ids, each staged Parquet file is copied byte for byte into the
//!   target's data folder: by S3's server-side copy (`CopyObject`) when both
//!   lie in one bucket, so no byte passes through the service; otherwise
//!   (another bucket, as S3 Tables gives each table, a key object_store
//!   cannot name, an object over S3's 5 GiB single-copy limit) streamed in
//!   8 MiB ranges (bounded memory). The copies get names derived from the
//!   upload id, so a re-run overwrites rather than duplicates.
//! * [`rewrite`] (`path = rewrite`): when the catalog renumbered the staging
//!   table's field ids (S3 Tables has no way to register metadata), the rows
//!   are read by column name, batch by batch, from exactly the files
//!   verification read (copies in the target's storage wherever a client's
//!   keys could still reach the staged objects), and written as new files
//!   with the target's schema and partition spec.
//!
//! Either way the new files are then registered with the same guarded
//! `fast_append` as the zero-copy path.

use futures::TryStreamExt;
use iceberg::spec::{DataFile, DataFileBuilder};
use iceberg::table::Table;

use super::Staging;
use crate::catalog::bridge::writer::write_rows;
use crate::catalog::copy::Copier;
use crate::cluster::{Recipe, RecipeTable};
use crate::error::{Error, Result};

/// Where promoted rows' file references point: `uri`s starting with `from`
/// are rewritten to start with `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relocation {
    /// The target's file columns.
    pub(crate) columns: Vec<String>,
    /// The session's `files_location`, with a trailing `/`.
    pub(crate) from: String,
    /// The target's folder for this upload's files, with a trailing `/`.
    pub(crate) to: String,
}

/// Copies each of `files` into the target's data folder; returns the copies'
/// data files (same metrics, new paths).
pub(crate) async fn copy_files(
    staging: &Staging,
    target: &Table,
    files: &[DataFile],
) -> Result<Vec<DataFile>> {
    let data = format!(
        "{}/data",
        target.metadata().location().trim_end_matches('/')
    );
    let spec_id = target.metadata().default_partition_spec_id();
    let mut copies = Vec::with_capacity(files.len());
    let copier = Copier::new(
        std::sync::Arc::clone(&staging.catalog),
        staging.table.file_io().clone(),
        target.file_io().clone(),
    );
    for (n, file) in files.iter().enumerate() {
        // Named apart from the files a rewrite of them writes
        // (`icestage-<id>-<n>.parquet`), which must outlive them.
        let to = format!("{data}/icestage-{}-verified-{n:05}.parquet", staging.id);
        let size = copier.copy(file.file_path(), &to).await?;
        let mut builder = DataFileBuilder::default();
        if let Some(order) = file.sort_order_id() {
            builder.sort_order_id(order);
        }
        copies.push(
            builder
                .content(file.content_type())
                .file_path(to)
                .file_format(file.file_format())
                .partition(file.partition().clone())
                .record_count(file.record_count())
                .file_size_in_bytes(size)
                .column_sizes(file.column_sizes().clone())
                .value_counts(file.value_counts().clone())
                .null_value_counts(file.null_value_counts().clone())
                .nan_value_counts(file.nan_value_counts().clone())
                .lower_bounds(file.lower_bounds().clone())
                .upper_bounds(file.upper_bounds().clone())
                .split_offsets(file.split_offsets().map(<[i64]>::to_vec))
                .partition_spec_id(spec_id)
                .build()
                .map_err(|e| Error::internal(format!("copied data file: {e}")))?,
        );
    }
    Ok(copies)
}

/// Reads the staged rows by column name and writes them as new files of the
/// target (its schema, field ids and partition spec).
///
/// With a `relocation`, each file reference's `uri` is rewritten to name
/// the file's copy in the target's storage.
pub(crate) async fn rewrite(
    staging: &Staging,
    target: &Table,
    verified: Recipe,
    relocation: Option<&Relocation>,
) -> Result<Vec<DataFile>> {
    use datafusion::common::{Column, ScalarValue};
    use datafusion::functions::core::expr_fn::{get_field, named_struct};
    use datafusion::functions::string::expr_fn::concat;
    use datafusion::functions::unicode::expr_fn::substr;
    use datafusion::logical_expr::{Expr, lit, when};

    let names = crate::catalog::column_names(target);
    let staged = RecipeTable::of_recipe(&staging.table, verified)?;
    let ctx = datafusion::prelude::SessionContext::new();
    let columns = names
        .iter()
        .map(|name| {
            let column = Expr::Column(Column::from_name(name));
            let Some(relocation) = relocation.filter(|r| r.columns.contains(name)) else {
                return Ok(column);
            };
            // Verified to start with `from`: the rest is kept.
            let rest = substr(
                get_field(column.clone(), "uri"),
                lit(relocation.from.chars().count() as i64 + 1),
            );
            let mut fields = vec![lit("uri"), concat(vec![lit(relocation.to.clone()), rest])];
            for field in ["size", "sha256", "content_type"] {
                fields.push(lit(field));
                fields.push(get_field(column.clone(), field));
            }
            Ok(when(column.clone().is_null(), lit(ScalarValue::Null))
                .otherwise(named_struct(fields))?
                .alias(name))
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = ctx
        .read_table(std::sync::Arc::new(staged))?
        .select(columns)?
        .execute_stream()
        .await?
        .map_err(Error::from);
    write_rows(target, &format!("icestage-{}", staging.id), rows).await
}
