//! Finding the data files that hold one value of an identity-partitioned
//! column, in a table whose manifests rarely change: icestage's logs, looked
//! up by session id on every status read and every promotion.
//!
//! A log's manifests are merged in levels ([`super::compact::Layout`]): the
//! merged ones stay the same across thousands of appends, while each append
//! makes a new table version. iceberg's scan keeps what it decoded with the
//! table version, so every lookup after an append decoded the merged
//! manifest holding the id again (a few hundred entries). Manifest files
//! never change once written: here they are kept by path, across versions,
//! and a lookup decodes only the manifest list and the manifests appended
//! since it last looked.

use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataContentType, Literal, Manifest, ManifestContentType, ManifestFile, PrimitiveLiteral,
    Transform,
};
use iceberg::table::Table;

use super::cache::Lru;
use crate::error::Result;

/// Manifests kept at most; past it, the least recently used goes. A log's
/// level-1 and level-2 manifests hold at most a few hundred lean entries.
const MOST_MANIFESTS: usize = 256;

/// Decoded manifests by path (see the module documentation).
#[derive(Debug)]
pub(crate) struct Manifests {
    kept: Mutex<Lru<String, Arc<Manifest>>>,
}

impl Default for Manifests {
    fn default() -> Self {
        Self {
            kept: Mutex::new(Lru::new(MOST_MANIFESTS)),
        }
    }
}

impl Manifests {
    fn kept(&self) -> std::sync::MutexGuard<'_, Lru<String, Arc<Manifest>>> {
        self.kept.lock().expect("kept manifests")
    }

    /// The manifest `file` lists, decoded once.
    async fn load(&self, file: &ManifestFile, io: &FileIO) -> Result<Arc<Manifest>> {
        if let Some(manifest) = self.kept().get(&file.manifest_path).cloned() {
            return Ok(manifest);
        }
        let manifest = Arc::new(file.load_manifest(io).await?);
        self.kept()
            .put(file.manifest_path.clone(), Arc::clone(&manifest));
        Ok(manifest)
    }

    /// Tasks reading every column of the current snapshot's data files of
    /// `table` that may hold rows whose column `field` equals `value`:
    /// under a spec that partitions by `field`'s identity, the files of
    /// that partition value; under any other, every file (the caller keeps
    /// the matching rows). `None` when the table has delete files: the
    /// caller plans a full scan instead.
    pub(crate) async fn files_holding(
        &self,
        table: &Table,
        field: i32,
        value: &str,
    ) -> Result<Option<Vec<FileScanTask>>> {
        let metadata = table.metadata();
        let Some(snapshot) = metadata.current_snapshot() else {
            return Ok(Some(vec![]));
        };
        let list = table.manifest_list_reader(snapshot).load().await?;
        if list
            .entries()
            .iter()
            .any(|m| m.content != ManifestContentType::Data)
        {
            return Ok(None);
        }
        let schema = metadata.current_schema();
        let columns: Vec<i32> = schema.as_struct().fields().iter().map(|f| f.id).collect();
        let mut tasks = vec![];
        for file in list.entries() {
            // Where `field` sits in this manifest's partition tuple, if its
            // spec partitions by its value.
            let position = metadata
                .partition_spec_by_id(file.partition_spec_id)
                .and_then(|spec| {
                    spec.fields()
                        .iter()
                        .position(|p| p.source_id == field && p.transform == Transform::Identity)
                });
            if let Some(position) = position
                && let Some(summary) = file.partitions.as_ref().and_then(|p| p.get(position))
                && let (Some(lower), Some(upper)) = (&summary.lower_bound, &summary.upper_bound)
                && !(lower.as_ref() <= value.as_bytes() && value.as_bytes() <= upper.as_ref())
            {
                continue;
            }
            let manifest = self.load(file, table.file_io()).await?;
            for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                let data = entry.data_file();
                if data.content_type() != DataContentType::Data {
                    return Ok(None);
                }
                if let Some(position) = position
                    && !matches!(
                        data.partition().fields().get(position),
                        Some(Some(Literal::Primitive(PrimitiveLiteral::String(held)))) if held == value
                    )
                {
                    continue;
                }
                tasks.push(
                    FileScanTask::builder()
                        .with_file_size_in_bytes(data.file_size_in_bytes())
                        .with_start(0)
                        .with_length(data.file_size_in_bytes())
                        .with_record_count(Some(data.record_count()))
                        .with_data_file_path(data.file_path().to_string())
                        .with_data_file_format(data.file_format())
                        .with_schema(Arc::clone(schema))
                        .with_project_field_ids(columns.clone())
                        .with_case_sensitive(true)
                        .build(),
                );
            }
        }
        Ok(Some(tasks))
    }
}

/// The rows of `tasks` (from [`Manifests::files_holding`] on `table`).
pub(crate) async fn read(
    table: &Table,
    tasks: Vec<FileScanTask>,
) -> Result<Vec<datafusion::arrow::array::RecordBatch>> {
    let stream = futures::stream::iter(tasks.into_iter().map(Ok)).boxed();
    Ok(table
        .reader_builder()
        .build()
        .read(stream)?
        .stream()
        .try_collect()
        .await?)
}
