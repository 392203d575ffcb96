//! `CREATE DOWNLOAD ... WITH (include_files = true)`: the files a
//! download's rows reference ([`crate::tables::files`]) are copied into the
//! download's own `files/` folder as the rows are written, and each row's
//! `uri` names the copy, so whatever reads the download table (its access
//! reaches the table's location) reads the files too.
//!
//! A file is copied only when it lies in the `files/` folder of a table the
//! download reads (never outside it, never through a symbolic link), and
//! the copy is hashed: a file whose size or SHA-256 is no longer the row's
//! fails the download with a message naming it, rather than hand a client
//! bytes nobody verified. Copies are named by their SHA-256, so a file two
//! rows name is copied once, and go with the download table when it is
//! dropped or expires.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, StructArray};
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::confine::{is_under, local, through_link};
use crate::catalog::copy::Copier;
use crate::catalog::writer::BatchMap;
use crate::error::{Error, Result};
use crate::tables::files::{
    MAX_FILES, PARALLEL, copy_local, files_folder, hash, long_field, text_field,
};

/// The `files/` folder of a table the download reads.
pub(crate) struct Area {
    /// `<location>/files/`.
    prefix: String,
    /// The table's assigned location.
    location: String,
    io: FileIO,
}

impl Area {
    /// The file area of `table`, stored at `location`.
    pub(crate) fn of(table: &Table, location: &str) -> Self {
        Self {
            prefix: format!("{}/", files_folder(location)),
            location: location.to_string(),
            io: table.file_io().clone(),
        }
    }
}

/// Copies the files of one download's rows, batch by batch.
pub(crate) struct IncludeFiles {
    download: String,
    columns: Vec<String>,
    areas: Vec<Area>,
    /// `<download location>/files/`.
    to: String,
    io: FileIO,
    catalog: Arc<IcebergCatalog>,
    /// Each file met so far: its copy, or why it cannot be handed out.
    copied: tokio::sync::Mutex<HashMap<String, std::result::Result<String, String>>>,
}

impl IncludeFiles {
    /// Copies for download table `table` (stored at `location`) of the
    /// files its `columns` reference, which must lie in one of `areas`.
    pub(crate) fn new(
        catalog: Arc<IcebergCatalog>,
        table: &Table,
        location: &str,
        columns: Vec<String>,
        areas: Vec<Area>,
    ) -> Self {
        Self {
            download: table.identifier().to_string(),
            columns,
            areas,
            to: format!("{}/", files_folder(location)),
            io: table.file_io().clone(),
            catalog,
            copied: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The writer's hook: each batch with its files copied and its
    /// references naming the copies.
    pub(crate) fn into_map(self) -> BatchMap {
        let files = Arc::new(self);
        Arc::new(move |batch| {
            let files = Arc::clone(&files);
            Box::pin(async move { files.batch(batch).await })
        })
    }

    /// `batch` with each file column's references copied and rewritten.
    async fn batch(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        for name in &self.columns {
            let Some(index) = batch.schema().index_of(name).ok() else {
                continue;
            };
            let Some(refs) = columns[index].as_struct_opt().cloned() else {
                continue;
            };
            let wanted = self.unseen(&refs).await?;
            let done: Vec<(String, std::result::Result<String, String>)> =
                futures::stream::iter(wanted)
                    .map(|(uri, size, sha256)| async move {
                        let outcome = self.one(&uri, size, &sha256).await?;
                        Ok::<_, Error>((uri, outcome))
                    })
                    .buffer_unordered(PARALLEL)
                    .try_collect()
                    .await?;
            let mut copied = self.copied.lock().await;
            copied.extend(done);
            let mut uris: Vec<Option<String>> = Vec::with_capacity(refs.len());
            for row in 0..refs.len() {
                if refs.is_null(row) {
                    uris.push(None);
                    continue;
                }
                let uri = text_field(&refs, "uri", row).unwrap_or_default();
                match copied.get(&uri) {
                    Some(Ok(copy)) => uris.push(Some(copy.clone())),
                    Some(Err(why)) => {
                        return Err(Error::invalid(format!(
                            "download {}: column '{name}': file '{uri}' {why}",
                            self.download
                        )));
                    }
                    None => {
                        return Err(Error::internal(format!(
                            "download {}: file '{uri}' was not copied",
                            self.download
                        )));
                    }
                }
            }
            drop(copied);
            columns[index] = with_uris(&refs, uris)?;
        }
        Ok(RecordBatch::try_new(batch.schema(), columns)?)
    }

    /// The references of `refs` not met before, once each, as (uri, size,
    /// sha256); a reference missing any of them fails the download.
    async fn unseen(&self, refs: &StructArray) -> Result<Vec<(String, i64, String)>> {
        let copied = self.copied.lock().await;
        let mut wanted: HashMap<String, (i64, String)> = HashMap::new();
        for row in 0..refs.len() {
            if refs.is_null(row) {
                continue;
            }
            let uri = text_field(refs, "uri", row);
            let size = long_field(refs, "size", row);
            let sha256 = text_field(refs, "sha256", row);
            let (Some(uri), Some(size), Some(sha256)) = (uri, size, sha256) else {
                return Err(Error::invalid(format!(
                    "download {}: a file reference lacks its uri, size or sha256, so its file \
                     cannot be included: select rows whose references are whole, or download \
                     without include_files",
                    self.download
                )));
            };
            if !copied.contains_key(&uri) {
                wanted.insert(uri, (size, sha256));
            }
        }
        if copied.len() + wanted.len() > MAX_FILES {
            return Err(Error::invalid(format!(
                "download {} references more than {MAX_FILES} distinct files; one download \
                 includes at most {MAX_FILES}: narrow the query, or download without \
                 include_files",
                self.download
            )));
        }
        Ok(wanted
            .into_iter()
            .map(|(uri, (size, sha256))| (uri, size, sha256))
            .collect())
    }

    /// Copies the file at `uri` (of `size` bytes and SHA-256 `sha256`, as
    /// its row says) into the download's folder: the copy's URI, or why not.
    async fn one(
        &self,
        uri: &str,
        size: i64,
        sha256: &str,
    ) -> Result<std::result::Result<String, String>> {
        let Some(area) = self.areas.iter().find(|a| uri.starts_with(&a.prefix)) else {
            return Ok(Err(
                "is not in the files/ folder of a table the download reads; only files \
                 promoted with a table's rows are included"
                    .to_string(),
            ));
        };
        if !is_under(uri, &area.location) || uri.len() == area.prefix.len() {
            return Ok(Err(format!(
                "is not a file under {} (a path with '..', '.', an empty or encoded segment \
                 names something else)",
                area.prefix
            )));
        }
        if through_link(uri, &area.location) {
            return Ok(Err("is reached through a symbolic link".to_string()));
        }
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Err(format!(
                "has sha256 '{sha256}' in its row, which is not 64 hexadecimal digits"
            )));
        }
        if let Some(path) = local(uri) {
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_file() => {}
                Ok(_) => return Ok(Err("is not a plain file".to_string())),
                Err(_) => return Ok(Err("does not exist".to_string())),
            }
        }
        let input = area.io.new_input(uri)?;
        if !input.exists().await? {
            return Ok(Err("does not exist".to_string()));
        }
        let stored = input.metadata().await?.size;
        if size < 0 || stored != size as u64 {
            return Ok(Err(format!("holds {stored} bytes; its row says {size}")));
        }
        let copy = format!("{}{}", self.to, sha256.to_ascii_lowercase());
        // A copy of these bytes already made (another row, an earlier
        // batch of another partition) is kept when whole.
        let kept = match self.io.new_input(&copy)?.metadata().await {
            Ok(meta) if meta.size == stored => {
                hash(&self.io, &copy, stored).await?.0 == copy_name(&copy)
            }
            _ => false,
        };
        if !kept {
            match (local(uri), local(&copy)) {
                (Some(from), Some(to)) => {
                    let (from, to) = (from.to_string(), to.to_string());
                    tokio::task::spawn_blocking(move || copy_local(&from, &to))
                        .await
                        .map_err(|e| Error::internal(format!("copying {uri}: {e}")))??;
                }
                _ => {
                    Copier::new(&self.catalog, &area.io, &self.io)
                        .copy(uri, &copy)
                        .await?;
                }
            }
            let (hashed, _) = hash(&self.io, &copy, stored).await?;
            if !hashed.eq_ignore_ascii_case(sha256) {
                let _ = self.io.delete(&copy).await;
                return Ok(Err(format!(
                    "hashes to SHA-256 {hashed}; its row says {sha256}: the stored file changed \
                     after it was verified"
                )));
            }
        }
        Ok(Ok(copy))
    }
}

/// The SHA-256 a copy is named by (its last path segment).
fn copy_name(copy: &str) -> String {
    copy.rsplit('/').next().unwrap_or_default().to_string()
}

/// `refs` with its `uri` field replaced by `uris` (nulls where the
/// reference is null).
fn with_uris(refs: &StructArray, uris: Vec<Option<String>>) -> Result<ArrayRef> {
    let (fields, mut children, nulls) = refs.clone().into_parts();
    let Some(index) = fields.iter().position(|f| f.name() == "uri") else {
        return Err(Error::internal("a file reference has no uri field"));
    };
    let uris: ArrayRef = Arc::new(StringArray::from(uris));
    children[index] = datafusion::arrow::compute::cast(&uris, fields[index].data_type())?;
    Ok(Arc::new(StructArray::try_new(fields, children, nulls)?))
}
