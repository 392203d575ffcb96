//! The files a download's rows reference ([`crate::tables::files`]).
//!
//! Without `include_files`, the rows keep the URIs of the files in their
//! table's `files/` folder, and the ones that lie there are recorded with
//! the download ([`References`]): the REST catalog signs the download's
//! reads of exactly those files, besides its own table.
//!
//! With `CREATE DOWNLOAD ... WITH (include_files = true)`, the files are
//! copied into the download's own `files/` folder as the rows are written,
//! and each row's `uri` names the copy, so whatever reads the download
//! table (its access reaches the table's location) reads the files too.
//!
//! A file is copied only when it lies in the `files/` folder of a table the
//! download reads (never outside it, never through a symbolic link), and
//! the copy is hashed: a file whose size or SHA-256 is no longer the row's
//! fails the download with a message naming it, rather than hand a client
//! bytes nobody verified. Copies are named by their SHA-256, so a file two
//! rows name is copied once, and go with the download table when it is
//! dropped or expires.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, StructArray};
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::bridge::writer::BatchMap;
use crate::catalog::confine::{is_under, local, through_link};
use crate::catalog::copy::Copier;
use crate::error::{Error, Result};
use crate::tables::files::{
    MAX_FILES, PARALLEL, copy_local, files_folder, hash, long_field, text_field,
};

/// The `files/` folder of a table the download reads.
#[derive(Debug, Clone)]
pub(crate) struct Area {
    /// `<location>/files/`.
    prefix: String,
    /// The table's assigned location.
    location: String,
    io: FileIO,
}

/// Two areas are one when they are one folder.
impl PartialEq for Area {
    fn eq(&self, other: &Self) -> bool {
        self.location == other.location
    }
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

    /// Whether `uri` names a file in this area (not the folder itself, no
    /// `..`, never through a symbolic link).
    fn holds(&self, uri: &str) -> bool {
        uri.starts_with(&self.prefix)
            && uri.len() > self.prefix.len()
            && is_under(uri, &self.location)
            && !through_link(uri, &self.location)
    }
}

/// What a download does with the files its rows reference.
pub(crate) enum Files {
    /// Copies them into its own folder (`include_files`).
    Include(Arc<IncludeFiles>),
    /// Records which ones its rows name, for its signed reads.
    Name(Arc<References>),
}

impl Files {
    /// The writer's hook, run on each batch before it is written.
    pub(crate) fn map(&self) -> BatchMap {
        match self {
            Self::Include(include) => {
                let include = Arc::clone(include);
                Arc::new(move |batch| {
                    let include = Arc::clone(&include);
                    Box::pin(async move { include.batch(batch).await })
                })
            }
            Self::Name(references) => {
                let references = Arc::clone(references);
                Arc::new(move |batch| {
                    let recorded = references.batch(&batch).map(|()| batch);
                    Box::pin(async move { recorded })
                })
            }
        }
    }

    /// Once every row is written: the record of the named files saved.
    pub(crate) async fn finish(&self) -> Result<()> {
        match self {
            Self::Include(_) => Ok(()),
            Self::Name(references) => references.save().await,
        }
    }
}

/// Longest URI recorded as readable (a longer one is not signed).
const MAX_URI: usize = 2048;

/// Where a download records the files its rows name, one URI per line.
fn references_path(location: &str) -> String {
    format!(
        "{}/metadata/icestage-file-references.txt",
        location.trim_end_matches('/')
    )
}

/// The files one download's rows name that lie in the `files/` folder of a
/// table it reads, gathered as the rows are written and saved with the
/// download (its `metadata/` folder, which only icestage writes).
pub(crate) struct References {
    of: Referencing,
    named: std::sync::Mutex<BTreeSet<String>>,
}

/// A download table whose file columns reference files in the `files/`
/// folders of the tables it reads.
pub(crate) struct Referencing {
    download: String,
    columns: Vec<String>,
    areas: Vec<Area>,
    /// The download table's storage.
    io: FileIO,
    /// The download table's assigned location.
    location: String,
}

impl Referencing {
    /// Download table `table`, stored at `location`, whose `columns`
    /// reference files that may lie in `areas`.
    pub(crate) fn new(
        table: &Table,
        location: &str,
        columns: Vec<String>,
        areas: Vec<Area>,
    ) -> Self {
        Self {
            download: table.identifier().to_string(),
            columns,
            areas,
            io: table.file_io().clone(),
            location: location.to_string(),
        }
    }
}

impl References {
    /// A record of the files `of`'s rows name.
    pub(crate) fn new(of: Referencing) -> Self {
        Self {
            of,
            named: std::sync::Mutex::new(BTreeSet::new()),
        }
    }

    /// Records the files `batch` names.
    fn batch(&self, batch: &RecordBatch) -> Result<()> {
        let mut named = self
            .named
            .lock()
            .map_err(|_| Error::internal("a download's file references"))?;
        for column in &self.of.columns {
            let Some(refs) = batch.column_by_name(column).and_then(|c| c.as_struct_opt()) else {
                continue;
            };
            for row in 0..refs.len() {
                if refs.is_null(row) {
                    continue;
                }
                let Some(uri) = text_field(refs, "uri", row) else {
                    continue;
                };
                if uri.len() > MAX_URI || !self.of.areas.iter().any(|a| a.holds(&uri)) {
                    continue;
                }
                named.insert(uri);
                if named.len() > MAX_FILES {
                    return Err(Error::invalid(format!(
                        "download {} names more than {MAX_FILES} distinct files; one download \
                         reaches at most {MAX_FILES}: narrow the query",
                        self.of.download
                    )));
                }
            }
        }
        Ok(())
    }

    async fn save(&self) -> Result<()> {
        let text = {
            let named = self
                .named
                .lock()
                .map_err(|_| Error::internal("a download's file references"))?;
            named.iter().cloned().collect::<Vec<_>>().join("\n")
        };
        self.of
            .io
            .new_output(references_path(&self.of.location))?
            .write(text.into())
            .await?;
        Ok(())
    }
}

/// The files a download stored at `location` may read besides its own
/// table, as recorded when it was filled (none when its rows name none).
pub(crate) async fn named_files(io: &FileIO, location: &str) -> Result<HashSet<String>> {
    let path = references_path(location);
    let input = io.new_input(&path)?;
    if !input.exists().await? {
        return Ok(HashSet::new());
    }
    let size = input.metadata().await?.size;
    let most = (MAX_FILES * (MAX_URI + 1)) as u64;
    if size > most {
        return Err(Error::internal(format!(
            "{path} holds {size} bytes, more than a download's {MAX_FILES} file references \
             take ({most})"
        )));
    }
    let bytes = input.read().await?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// Copies the files of one download's rows, batch by batch.
pub(crate) struct IncludeFiles {
    of: Referencing,
    /// `<download location>/files/`.
    to: String,
    /// From each area (in its order) into the download's storage.
    copiers: Vec<Copier>,
    /// Each file met so far: its copy, or why it cannot be handed out.
    copied: tokio::sync::Mutex<HashMap<String, std::result::Result<String, String>>>,
}

impl IncludeFiles {
    /// Copies of the files `of`'s rows reference, made with `catalog`'s
    /// storage settings (the download table's catalog).
    pub(crate) fn new(catalog: &Arc<IcebergCatalog>, of: Referencing) -> Self {
        let copiers = of
            .areas
            .iter()
            .map(|area| Copier::new(Arc::clone(catalog), area.io.clone(), of.io.clone()))
            .collect();
        Self {
            to: format!("{}/", files_folder(&of.location)),
            of,
            copiers,
            copied: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// `batch` with each file column's references copied and rewritten.
    async fn batch(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        for name in &self.of.columns {
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
                            self.of.download
                        )));
                    }
                    None => {
                        return Err(Error::internal(format!(
                            "download {}: file '{uri}' was not copied",
                            self.of.download
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
                    self.of.download
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
                self.of.download
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
        let Some(index) = self
            .of
            .areas
            .iter()
            .position(|a| uri.starts_with(&a.prefix))
        else {
            return Ok(Err(
                "is not in the files/ folder of a table the download reads; only files \
                 promoted with a table's rows are included"
                    .to_string(),
            ));
        };
        let area = &self.of.areas[index];
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
        let kept = match self.of.io.new_input(&copy)?.metadata().await {
            Ok(meta) if meta.size == stored => {
                hash(&self.of.io, &copy, stored).await?.0 == copy_name(&copy)
            }
            _ => false,
        };
        if !kept {
            match (local(uri), local(&copy)) {
                (Some(from), Some(to)) => {
                    let (from, to) = (from.to_string(), to.to_string());
                    tokio::task::spawn_blocking(move || copy_local(&from, &to, true))
                        .await
                        .map_err(|e| Error::internal(format!("copying {uri}: {e}")))??;
                }
                _ => {
                    self.copiers[index].copy(uri, &copy).await?;
                }
            }
            let (hashed, _) = hash(&self.of.io, &copy, stored).await?;
            if !hashed.eq_ignore_ascii_case(sha256) {
                let _ = self.of.io.delete(&copy).await;
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
