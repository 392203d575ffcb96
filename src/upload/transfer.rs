//! Moving staged rows into the target's storage, for catalogs where the
//! staging table's storage dies with it (S3 Tables deletes a table's bucket).
//!
//! * [`copy_files`] (`path = copy`): when the staging table has the target's
//!   field ids, each staged Parquet file is copied byte for byte into the
//!   target's data folder, streamed in 8 MiB ranges (bounded memory; the
//!   bytes pass through the service, not S3's server-side copy). The copies
//!   get names derived from the upload id, so a re-run overwrites rather than
//!   duplicates.
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
use crate::catalog::writer::write_rows;
use crate::cluster::{Recipe, RecipeTable};
use crate::error::{Error, Result};

/// Bytes per range request while copying a file.
const COPY_CHUNK: u64 = 8 * 1024 * 1024;

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
    for (n, file) in files.iter().enumerate() {
        let to = format!("{data}/icestage-{}-{n:05}.parquet", staging.id);
        let input = staging.table.file_io().new_input(file.file_path())?;
        // The size the store reports, not the one the client's manifest claims.
        let size = input.metadata().await?.size;
        let reader = input.reader().await?;
        let mut writer = target.file_io().new_output(&to)?.writer().await?;
        let mut offset = 0;
        while offset < size {
            let end = (offset + COPY_CHUNK).min(size);
            writer.write(reader.read(offset..end).await?).await?;
            offset = end;
        }
        writer.close().await?;
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
pub(crate) async fn rewrite(
    staging: &Staging,
    target: &Table,
    verified: Recipe,
) -> Result<Vec<DataFile>> {
    let names = crate::catalog::column_names(target);
    let staged = RecipeTable::of_recipe(&staging.table, verified)?;
    let ctx = datafusion::prelude::SessionContext::new();
    let rows = ctx
        .read_table(std::sync::Arc::new(staged))?
        .select_columns(&names.iter().map(String::as_str).collect::<Vec<_>>())?
        .execute_stream()
        .await?
        .map_err(Error::from);
    write_rows(target, &format!("icestage-{}", staging.id), rows).await
}
