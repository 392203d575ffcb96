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

use std::collections::HashMap;
use std::sync::Arc;

use futures::TryStreamExt;
use iceberg::spec::{DataFile, DataFileBuilder};
use iceberg::table::Table;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::Staging;
use crate::catalog::writer::write_rows;
use crate::cluster::{Recipe, RecipeTable};
use crate::error::{Error, Result};

/// Bytes per range request while copying a file.
const COPY_CHUNK: u64 = 8 * 1024 * 1024;
/// Largest object S3 copies in one `CopyObject` request.
const SERVER_COPY_MAX: u64 = 5 * 1024 * 1024 * 1024;

/// The bucket of `from` and `to` and their keys, when both are objects of
/// one S3 bucket whose keys object_store names exactly.
fn same_bucket(from: &str, to: &str) -> Option<(String, StorePath, StorePath)> {
    let split = |uri: &str| -> Option<(String, StorePath)> {
        let rest = uri
            .strip_prefix("s3://")
            .or_else(|| uri.strip_prefix("s3a://"))?;
        let (bucket, key) = rest.split_once('/')?;
        let path = StorePath::parse(key).ok()?;
        (path.as_ref() == key).then(|| (bucket.to_string(), path))
    };
    let (bucket, from) = split(from)?;
    let (other, to) = split(to)?;
    (bucket == other).then_some((bucket, from, to))
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
    let mut stores: HashMap<String, Arc<dyn ObjectStore>> = HashMap::new();
    for (n, file) in files.iter().enumerate() {
        let to = format!("{data}/icestage-{}-{n:05}.parquet", staging.id);
        let server_side = match same_bucket(file.file_path(), &to) {
            Some((bucket, from, copy)) => {
                let store = match stores.get(&bucket) {
                    Some(store) => Arc::clone(store),
                    None => {
                        let store = staging.catalog.aws().object_store(&bucket).await?;
                        stores.insert(bucket, Arc::clone(&store));
                        store
                    }
                };
                // The size the store reports, not the one the client's
                // manifest claims.
                let size = store.head(&from).await.map_err(store_error)?.size;
                if size <= SERVER_COPY_MAX {
                    store.copy(&from, &copy).await.map_err(store_error)?;
                    // What the copy holds, as the store reports it.
                    Some(store.head(&copy).await.map_err(store_error)?.size)
                } else {
                    None
                }
            }
            None => None,
        };
        let size = match server_side {
            Some(size) => {
                copied(size, "server_side");
                size
            }
            None => {
                let size = stream_copy(staging, target, file.file_path(), &to).await?;
                copied(size, "streamed");
                size
            }
        };
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

/// Copies `from` (a staged file) to `to` (in the target's storage) through
/// this process, in [`COPY_CHUNK`] ranges; the bytes copied, as the store
/// reports the source's size (not the client's manifest).
async fn stream_copy(staging: &Staging, target: &Table, from: &str, to: &str) -> Result<u64> {
    let input = staging.table.file_io().new_input(from)?;
    let size = input.metadata().await?.size;
    let reader = input.reader().await?;
    let mut writer = target.file_io().new_output(to)?.writer().await?;
    let mut offset = 0;
    while offset < size {
        let end = (offset + COPY_CHUNK).min(size);
        writer.write(reader.read(offset..end).await?).await?;
        offset = end;
    }
    writer.close().await?;
    Ok(size)
}

/// Counts `bytes` copied into a target's storage, `how`.
fn copied(bytes: u64, how: &'static str) {
    crate::metrics::count(
        "icestage_promotion_copied_bytes_total",
        "Bytes of staged files copied into targets' storage before verification, by how: \
         server_side (S3 CopyObject, no byte through the service) or streamed.",
        &[("how", how)],
        bytes as f64,
    );
}

/// An object store's error, as icestage's.
fn store_error(error: object_store::Error) -> Error {
    Error::Iceberg(iceberg::Error::new(
        iceberg::ErrorKind::Unexpected,
        format!("copying a staged file: {error}"),
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_side_copy_stays_in_one_bucket_and_names_keys_exactly() {
        let (bucket, from, to) = same_bucket(
            "s3://lake/wh/staging/upload_1/data/a.parquet",
            "s3://lake/wh/payments/t/data/icestage-1-00000.parquet",
        )
        .unwrap();
        assert_eq!(bucket, "lake");
        assert_eq!(from.as_ref(), "wh/staging/upload_1/data/a.parquet");
        assert_eq!(to.as_ref(), "wh/payments/t/data/icestage-1-00000.parquet");
        // Another bucket (S3 Tables gives each table its own), a local
        // file, or a key object_store would name differently: streamed.
        for (from, to) in [
            ("s3://staging-bucket/d/a.parquet", "s3://lake/d/b.parquet"),
            ("file:///tmp/a.parquet", "file:///tmp/b.parquet"),
            ("s3://lake/d//a.parquet", "s3://lake/d/b.parquet"),
        ] {
            assert!(same_bucket(from, to).is_none(), "{from}");
        }
    }
}
