//! Staged files on a local warehouse, read by positioned reads of the
//! operating system: each column chunk lands in one buffer, once.
//!
//! Through the storage layer a chunk was read into that layer's buffers and
//! then copied into one contiguous buffer, both fresh memory: in a profile
//! of promoting 10M rows (`perf record -e page-faults`) that path took a
//! third of the process's page faults. The file read is the one the storage
//! layer would open, the path as the staging table names it, after
//! confinement has checked it; never through a link.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::metadata::ParquetMetaData;

use crate::catalog::storage::{local_path, read_at};

/// A staged file of the local file system, open for reading.
pub(crate) struct LocalFile {
    file: Arc<File>,
    /// Its size when opened: no read reaches past it.
    size: u64,
}

impl LocalFile {
    /// The file `path` names, opened, when it is one of the local file
    /// system (an absolute path, or a `file:` URL); `None` for any other
    /// storage.
    pub(crate) fn open(path: &str) -> Option<std::io::Result<Self>> {
        let local = local_path(path)?;
        // Never through a link: confinement refused the staged files that
        // are links, and one made since is refused here.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(local);
        Some(opened.and_then(|file| {
            let size = file.metadata()?.len();
            Ok(Self {
                file: Arc::new(file),
                size,
            })
        }))
    }

    /// The file's size, as opened.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }
}

/// The bytes of `ranges` of `file` (of `size` bytes), each in its own
/// buffer; a range past the end is refused before anything is allocated.
fn read_ranges(file: &File, size: u64, ranges: &[Range<u64>]) -> ParquetResult<Vec<Bytes>> {
    ranges
        .iter()
        .map(|range| read_at(file, size, range).map_err(|e| ParquetError::External(Box::new(e))))
        .collect()
}

impl AsyncFileReader for LocalFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, ParquetResult<Bytes>> {
        async move {
            let mut fetched = self.get_byte_ranges(vec![range]).await?;
            fetched
                .pop()
                .ok_or_else(|| ParquetError::General("a read returned nothing".to_string()))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, ParquetResult<Vec<Bytes>>> {
        let (file, size) = (Arc::clone(&self.file), self.size);
        async move {
            // One blocking task for all of a row group's chunks.
            tokio::task::spawn_blocking(move || read_ranges(&file, size, &ranges))
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))?
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, ParquetResult<Arc<ParquetMetaData>>> {
        // Verification reads and checks each footer first (`footer::open`)
        // and gives it to the reader, which so never asks for it.
        async {
            Err(ParquetError::General(
                "a staged file's footer is read apart, with its bound".to_string(),
            ))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_ranges_and_refuses_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let mut file = LocalFile::open(path.to_str().unwrap()).unwrap().unwrap();
        assert_eq!(file.size(), 10);
        let fetched = file.get_byte_ranges(vec![2..5, 0..0, 7..10]).await.unwrap();
        assert_eq!(
            fetched,
            vec![Bytes::from("234"), Bytes::new(), Bytes::from("789")]
        );
        let url = format!("file://{}", path.display());
        assert!(LocalFile::open(&url).unwrap().is_ok());
        let past = file.get_bytes(8..11).await.unwrap_err().to_string();
        assert!(
            past.contains("bytes 8..11 lies outside the file's 10 bytes"),
            "{past}"
        );
        assert!(LocalFile::open("s3://bucket/key.parquet").is_none());
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(LocalFile::open(link.to_str().unwrap()).unwrap().is_err());
        assert!(LocalFile::open("memory://x").is_none());
    }
}
