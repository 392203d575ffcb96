//! The storage layer under every table's files: a local warehouse through
//! the operating system's file calls, object stores through opendal.
//!
//! opendal's operators, a local folder's too, each hold its shared HTTP
//! client, and the first one of a process builds that client, which loads
//! the system's CA certificates: 7 to 20 ms before a one-statement
//! process's first read of a local table, and on a system without any CA
//! certificate a panic (the client cannot be built) on every statement.
//! A local folder needs no HTTP client, so [`Storages`] sends paths of the
//! local file system (`file:` URLs and absolute paths) to [`LocalFolders`]
//! and every other path to opendal, which builds its client only when an
//! object store is first used; on a system without CA certificates, that
//! use is an error that says so ([`certificates`]) instead of a panic.
//!
//! [`LocalFolders`] keeps the behaviour opendal's file system service had:
//! writes create their parent folders and reach the disk (`fsync`) before
//! they report success; deleting what is already gone succeeds; reads past
//! a file's end are refused.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use serde::{Deserialize, Serialize};

use super::confine;

/// Builds [`Storages`]: what every catalog and cluster executor gives its
/// tables' `FileIO`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct StoragesFactory;

#[typetag::serde(name = "icestage-storages")]
impl StorageFactory for StoragesFactory {
    fn build(&self, config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(Storages {
            config: config.clone(),
            remote: OnceLock::new(),
        }))
    }
}

/// Local paths to [`LocalFolders`], the rest to opendal (built on first
/// use, with the properties the `FileIO` was given).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Storages {
    config: StorageConfig,
    #[serde(skip)]
    remote: OnceLock<Arc<dyn Storage>>,
}

impl Storages {
    fn resolve(&self, path: &str) -> Result<Arc<dyn Storage>> {
        if local_path(path).is_some() {
            return Ok(Arc::new(LocalFolders));
        }
        if let Some(remote) = self.remote.get() {
            return Ok(Arc::clone(remote));
        }
        certificates()?;
        let built = OpenDalResolvingStorageFactory::new().build(&self.config)?;
        Ok(Arc::clone(self.remote.get_or_init(|| built)))
    }
}

#[async_trait::async_trait]
#[typetag::serde(name = "icestage-storages")]
impl Storage for Storages {
    async fn exists(&self, path: &str) -> Result<bool> {
        self.resolve(path)?.exists(path).await
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        self.resolve(path)?.metadata(path).await
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        self.resolve(path)?.read(path).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        self.resolve(path)?.reader(path).await
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        self.resolve(path)?.write(path, bs).await
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        self.resolve(path)?.writer(path).await
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.resolve(path)?.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        self.resolve(path)?.delete_prefix(path).await
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        let mut remote = vec![];
        while let Some(path) = paths.next().await {
            match local_path(&path) {
                Some(local) => delete_local(local).await?,
                None => remote.push(path),
            }
        }
        if let Some(first) = remote.first() {
            let storage = self.resolve(first)?;
            storage
                .delete_stream(futures::stream::iter(remote).boxed())
                .await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        self.resolve(path)?.new_input(path)
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        self.resolve(path)?.new_output(path)
    }
}

/// Whether the system has the CA certificates opendal's HTTP client loads
/// when it is built (the first object-store operation of a process):
/// without any, building it panics, so an object store's first use is
/// refused here with what to do. The system's certificates are looked up
/// as that client does (`SSL_CERT_FILE` and `SSL_CERT_DIR`, else the
/// system's bundle), once per process.
fn certificates() -> Result<()> {
    static FOUND: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            if !found.certs.is_empty() {
                return Ok(());
            }
            let reasons: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
            Err(format!(
                "the HTTP client of object storage needs the system's CA certificates and none \
                 was found{}: install them (the ca-certificates package) or name a PEM bundle \
                 with SSL_CERT_FILE",
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", reasons.join("; "))
                }
            ))
        })
        .clone()
        .map_err(|reason| Error::new(ErrorKind::Unexpected, reason))
}

/// The local file system path `path` names ([`confine::local`]), when it
/// is absolute; `None` for any other storage's.
pub(crate) fn local_path(path: &str) -> Option<PathBuf> {
    let local = confine::local(path).filter(|p| p.starts_with('/'))?;
    // `file:///a` and `file:////a` are both `/a`.
    Some(PathBuf::from(format!("/{}", local.trim_start_matches('/'))))
}

/// The files of local folders.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct LocalFolders;

/// `path` as a local path, or the error that it is not one.
fn local(path: &str) -> Result<PathBuf> {
    local_path(path).ok_or_else(|| {
        Error::new(
            ErrorKind::DataInvalid,
            format!("'{path}' is not a path of the local file system"),
        )
    })
}

/// The error of `what` on `path`, with the system's reason.
fn failed(what: &str, path: &Path, error: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("cannot {what} {}: {error}", path.display()),
    )
    .with_source(error)
}

/// Runs `work` (blocking file calls) on tokio's blocking threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        Error::new(
            ErrorKind::Unexpected,
            format!("a file operation stopped: {e}"),
        )
    })?
}

/// Removes the file (or empty folder) `path`; what is already gone is no error.
async fn delete_local(path: PathBuf) -> Result<()> {
    blocking(move || {
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(failed("delete", &path, e)),
            _ => Ok(()),
        }
    })
    .await
}

/// Creates `path`'s parent folders and the file itself (truncated).
fn create(path: &Path) -> Result<File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| failed("create the folder of", path, e))?;
    }
    File::create(path).map_err(|e| failed("create", path, e))
}

#[async_trait::async_trait]
#[typetag::serde(name = "icestage-local-folders")]
impl Storage for LocalFolders {
    async fn exists(&self, path: &str) -> Result<bool> {
        let path = local(path)?;
        tokio::fs::try_exists(&path)
            .await
            .map_err(|e| failed("look for", &path, e))
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let path = local(path)?;
        let meta = tokio::fs::metadata(&path)
            .await
            .map_err(|e| failed("read the size of", &path, e))?;
        Ok(FileMetadata { size: meta.len() })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let path = local(path)?;
        let bytes = tokio::fs::read(&path)
            .await
            .map_err(|e| failed("read", &path, e))?;
        Ok(Bytes::from(bytes))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let path = local(path)?;
        blocking(move || {
            let file = File::open(&path).map_err(|e| failed("open", &path, e))?;
            let size = file
                .metadata()
                .map_err(|e| failed("read the size of", &path, e))?
                .len();
            Ok(Box::new(LocalRead {
                file: Arc::new(file),
                size,
                path,
            }) as Box<dyn FileRead>)
        })
        .await
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let path = local(path)?;
        blocking(move || {
            let mut file = create(&path)?;
            file.write_all(&bs)
                .and_then(|()| file.sync_all())
                .map_err(|e| failed("write", &path, e))
        })
        .await
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let path = local(path)?;
        let opened = path.clone();
        let file = blocking(move || create(&opened)).await?;
        Ok(Box::new(LocalWrite {
            file: Some(file),
            path,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        delete_local(local(path)?).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let path = local(path)?;
        blocking(move || match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(failed("delete the folder", &path, e))
            }
            _ => Ok(()),
        })
        .await
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            delete_local(local(&path)?).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(*self), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(*self), path.to_string()))
    }
}

/// The bytes of `range` of `file` (of `size` bytes) in one buffer, by a
/// positioned read; a range past the end is refused before anything is
/// allocated.
pub(crate) fn read_at(file: &File, size: u64, range: &Range<u64>) -> std::io::Result<Bytes> {
    if range.start > range.end || range.end > size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a read of bytes {}..{} lies outside the file's {size} bytes",
                range.start, range.end
            ),
        ));
    }
    let length = usize::try_from(range.end - range.start).map_err(std::io::Error::other)?;
    let mut buffer = vec![0u8; length];
    file.read_exact_at(&mut buffer, range.start)?;
    Ok(Bytes::from(buffer))
}

/// A local file open for reading.
struct LocalRead {
    file: Arc<File>,
    /// Its size when opened: no read reaches past it.
    size: u64,
    path: PathBuf,
}

#[async_trait::async_trait]
impl FileRead for LocalRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let (file, size) = (Arc::clone(&self.file), self.size);
        let path = self.path.clone();
        blocking(move || read_at(&file, size, &range).map_err(|e| failed("read", &path, e))).await
    }
}

/// A local file open for writing; closing it puts its bytes on the disk.
struct LocalWrite {
    /// `None` once closed.
    file: Option<File>,
    path: PathBuf,
}

impl LocalWrite {
    /// Runs `work` on the open file, off the async threads.
    async fn with_file(
        &mut self,
        work: impl FnOnce(&mut File) -> std::io::Result<()> + Send + 'static,
        what: &'static str,
    ) -> Result<()> {
        let mut file = self.file.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!("{} is closed already", self.path.display()),
            )
        })?;
        let path = self.path.clone();
        let (file, done) = blocking(move || {
            let done = work(&mut file).map_err(|e| failed(what, &path, e));
            Ok((file, done))
        })
        .await?;
        self.file = Some(file);
        done
    }
}

#[async_trait::async_trait]
impl FileWrite for LocalWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.with_file(move |file| file.write_all(&bs), "write")
            .await
    }

    async fn close(&mut self) -> Result<()> {
        self.with_file(|file| file.sync_all(), "write").await?;
        self.file = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_are_file_urls_and_absolute_paths() {
        for (path, local) in [
            ("file:///w/t/f.parquet", Some("/w/t/f.parquet")),
            ("file:/w/t/f.parquet", Some("/w/t/f.parquet")),
            ("/w/t/f.parquet", Some("/w/t/f.parquet")),
            ("s3://bucket/w/f.parquet", None),
            ("memory:///w", None),
            ("file:relative", None),
            ("relative/f.parquet", None),
        ] {
            assert_eq!(local_path(path), local.map(PathBuf::from), "{path}");
        }
    }

    #[tokio::test]
    async fn local_files_are_written_read_and_deleted_without_opendal() {
        let dir = tempfile::tempdir().unwrap();
        let io = iceberg::io::FileIOBuilder::new(Arc::new(StoragesFactory)).build();
        let root = format!("file://{}", dir.path().display());
        let path = format!("{root}/a/b/f.bin");

        // Writes create the folders; reads see the bytes; ranges past the
        // end are refused.
        io.new_output(&path)
            .unwrap()
            .write(Bytes::from_static(b"0123456789"))
            .await
            .unwrap();
        let input = io.new_input(&path).unwrap();
        assert!(input.exists().await.unwrap());
        assert_eq!(input.metadata().await.unwrap().size, 10);
        assert_eq!(
            input.read().await.unwrap(),
            Bytes::from_static(b"0123456789")
        );
        let reader = input.reader().await.unwrap();
        assert_eq!(reader.read(2..5).await.unwrap(), Bytes::from_static(b"234"));
        let past = reader.read(8..11).await.unwrap_err().to_string();
        assert!(
            past.contains("bytes 8..11 lies outside the file's 10 bytes"),
            "{past}"
        );

        // A writer's bytes arrive in order; a second close is an error.
        let streamed = format!("{root}/a/c/g.bin");
        let mut writer = io.new_output(&streamed).unwrap().writer().await.unwrap();
        writer.write(Bytes::from_static(b"ab")).await.unwrap();
        writer.write(Bytes::from_static(b"cd")).await.unwrap();
        writer.close().await.unwrap();
        assert!(writer.close().await.is_err());
        assert_eq!(
            std::fs::read(dir.path().join("a/c/g.bin")).unwrap(),
            b"abcd"
        );

        // A missing file is absent, an error to read, no error to delete.
        let missing = format!("{root}/a/none.bin");
        assert!(!io.exists(&missing).await.unwrap());
        let error = io.new_input(&missing).unwrap().read().await.unwrap_err();
        assert!(error.to_string().contains("No such file"), "{error}");
        io.delete(&missing).await.unwrap();

        // Deleting a stream of paths and a prefix.
        io.delete_stream(futures::stream::iter(vec![path.clone()]))
            .await
            .unwrap();
        assert!(!io.exists(&path).await.unwrap());
        io.delete_prefix(format!("{root}/a")).await.unwrap();
        assert!(!dir.path().join("a").exists());
        io.delete_prefix(format!("{root}/a")).await.unwrap();
    }

    #[tokio::test]
    async fn other_paths_go_to_opendal() {
        let io = iceberg::io::FileIOBuilder::new(Arc::new(StoragesFactory)).build();
        io.new_output("memory:///m/f.bin")
            .unwrap()
            .write(Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(
            io.new_input("memory:///m/f.bin")
                .unwrap()
                .read()
                .await
                .unwrap(),
            Bytes::from_static(b"x")
        );
    }
}
