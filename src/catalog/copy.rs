//! Copying objects between storages: by S3's server-side `CopyObject` when
//! both lie in one bucket, so no byte passes through the service; otherwise
//! (another bucket, a local file, a key object_store cannot name, an object
//! over S3's 5 GiB single-copy limit) streamed in 8 MiB ranges (bounded
//! memory). Promotion copies staged data files and referenced files with
//! it; downloads copy the files their rows reference.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::io::FileIO;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::IcebergCatalog;
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

/// Copies objects of one table's storage into another's: by S3's
/// `CopyObject` within one bucket, streamed otherwise.
pub(crate) struct Copier {
    /// The catalog whose AWS settings reach both.
    catalog: Arc<IcebergCatalog>,
    from: FileIO,
    to: FileIO,
    /// One store per bucket, made on first use.
    stores: tokio::sync::Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl Copier {
    pub(crate) fn new(catalog: Arc<IcebergCatalog>, from: FileIO, to: FileIO) -> Self {
        Self {
            catalog,
            from,
            to,
            stores: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Copies `from` (in the first storage) to `to` (in the second); the
    /// bytes the copy holds, as the store reports them.
    pub(crate) async fn copy(&self, from: &str, to: &str) -> Result<u64> {
        if let Some((bucket, source, copy)) = same_bucket(from, to) {
            let store = {
                let mut stores = self.stores.lock().await;
                match stores.get(&bucket) {
                    Some(store) => Arc::clone(store),
                    None => {
                        let store = self.catalog.aws().object_store(&bucket).await?;
                        stores.insert(bucket, Arc::clone(&store));
                        store
                    }
                }
            };
            // The size the store reports, not the one the client's
            // manifest claims.
            let size = store.head(&source).await.map_err(store_error)?.size;
            if size <= SERVER_COPY_MAX {
                store.copy(&source, &copy).await.map_err(store_error)?;
                // What the copy holds, as the store reports it.
                let size = store.head(&copy).await.map_err(store_error)?.size;
                copied(size, "server_side");
                return Ok(size);
            }
        }
        let size = stream_copy(&self.from, &self.to, from, to).await?;
        copied(size, "streamed");
        Ok(size)
    }
}

/// Copies `from` (in storage `source`) to `to` (in `sink`) through this
/// process, in [`COPY_CHUNK`] ranges; the bytes copied, as the store
/// reports the source's size (not a client's manifest).
async fn stream_copy(source: &FileIO, sink: &FileIO, from: &str, to: &str) -> Result<u64> {
    let input = source.new_input(from)?;
    let size = input.metadata().await?.size;
    let reader = input.reader().await?;
    let mut writer = sink.new_output(to)?.writer().await?;
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
        "Bytes copied between storages before verification (a promotion's staged data and \
         referenced files, a download's included files), by how: server_side (S3 CopyObject, \
         no byte through the service) or streamed.",
        &[("how", how)],
        bytes as f64,
    );
}

/// An object store's error, as icestage's.
fn store_error(error: object_store::Error) -> Error {
    Error::Iceberg(iceberg::Error::new(
        iceberg::ErrorKind::Unexpected,
        format!("copying a file: {error}"),
    ))
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
