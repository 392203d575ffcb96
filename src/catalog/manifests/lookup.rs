//! Finding the data files that may hold some rows, in a table whose
//! manifests rarely change: icestage's logs, looked up by session id on
//! every status read and every promotion, and read by time by the pollers
//! (the webhook dispatcher: what ended, what was delivered, which pipe runs
//! finished since its last round).
//!
//! A log's manifests are merged in levels ([`crate::catalog::maintain::compact::Layout`]): the
//! merged ones stay the same across thousands of appends, while each append
//! makes a new table version. iceberg's scan keeps what it decoded with the
//! table version, so every read after an append decoded the merged
//! manifests again (a few hundred entries each; every one of them, for a
//! read by time). Manifest files never change once written: here they are
//! kept by path, across versions, and a read decodes only the manifest list
//! and the manifests appended since it last looked.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use datafusion::arrow::array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use iceberg::expr::{Predicate, Reference};
use iceberg::io::FileIO;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataContentType, DataFile, Datum, Literal, Manifest, ManifestContentType, ManifestFile,
    PrimitiveLiteral, Schema, TableMetadata, Transform,
};
use iceberg::table::Table;

use crate::catalog::cache::Lru;
use crate::error::Result;

/// Manifest entries kept at most, over all kept manifests; past it, the
/// least recently used manifests go. Bounded by entries, not manifests: a
/// poll reads every manifest of each log it polls (one entry each at level
/// 0, up to 200 above), and a bound by count that all of them together
/// outgrew would evict each one just before it is read again. A lean entry
/// decodes to a few hundred bytes: tens of MB at most.
const MOST_ENTRIES: usize = 100_000;

/// Decoded manifests by path (see the module documentation).
#[derive(Debug)]
pub(crate) struct Manifests {
    kept: Mutex<Lru<String, Arc<Manifest>>>,
}

impl Default for Manifests {
    fn default() -> Self {
        Self {
            kept: Mutex::new(Lru::new(MOST_ENTRIES)),
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
        self.kept().put_weighing(
            file.manifest_path.clone(),
            Arc::clone(&manifest),
            manifest.entries().len(),
        );
        Ok(manifest)
    }

    /// Every column of the rows of `table` in the files that may hold a
    /// row `wanted` asks for (the caller keeps the matching rows), planned
    /// from manifests decoded once; a table with delete files is scanned
    /// with `wanted` as its filter instead. Every row when `wanted` is
    /// `None`.
    pub(crate) async fn read(
        &self,
        table: &Table,
        wanted: Option<Wanted<'_>>,
    ) -> Result<Vec<RecordBatch>> {
        let planned = match wanted {
            Some(wanted) => self.files(table, wanted).await?,
            None => None,
        };
        let stream = match planned {
            Some(tasks) => table
                .reader_builder()
                .build()
                .read(futures::stream::iter(tasks.into_iter().map(Ok)).boxed())?
                .stream(),
            None => {
                let mut scan = table.scan();
                if let Some(filter) =
                    wanted.and_then(|w| w.filter(table.metadata().current_schema()))
                {
                    scan = scan.with_filter(filter);
                }
                scan.build()?.to_arrow().await?
            }
        };
        Ok(stream.try_collect().await?)
    }

    /// Tasks reading every column of the current snapshot's data files of
    /// `table` that may hold a row `wanted` asks for, from manifests decoded
    /// once. `None` when the table has delete files.
    pub(crate) async fn files(
        &self,
        table: &Table,
        wanted: Wanted<'_>,
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
            let position = wanted.partition_position(metadata, file);
            if !wanted.manifest_may_hold(file, position) {
                continue;
            }
            let manifest = self.load(file, table.file_io()).await?;
            for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                let data = entry.data_file();
                if data.content_type() != DataContentType::Data {
                    return Ok(None);
                }
                if !wanted.file_may_hold(data, position) {
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

/// Which rows a plan from decoded manifests ([`Manifests::files`]) is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wanted<'a> {
    /// Rows whose string column `field` equals `value`: under a spec that
    /// partitions by `field`'s identity, the files of that partition value
    /// (manifests skipped by their partition bounds); under any other,
    /// every file.
    Holding { field: i32, value: &'a str },
    /// Rows whose timestamp column `field` is at or after `micros`: the
    /// files whose upper bound of it is not before (or that keep none).
    Since { field: i32, micros: i64 },
}

impl Wanted<'_> {
    /// Rows of `schema` whose timestamp column `column` is at or after
    /// `since`; `None` when it has no such column.
    pub(crate) fn since(schema: &Schema, column: &str, since: DateTime<Utc>) -> Option<Self> {
        Some(Wanted::Since {
            field: schema.field_by_name(column)?.id,
            micros: since.timestamp_micros(),
        })
    }

    /// Where the wanted value sits in the partition tuple of `manifest`,
    /// if its spec partitions by the identity of the wanted column (only a
    /// value is looked up by partition).
    fn partition_position(
        &self,
        metadata: &TableMetadata,
        manifest: &ManifestFile,
    ) -> Option<usize> {
        let Wanted::Holding { field, .. } = *self else {
            return None;
        };
        metadata
            .partition_spec_by_id(manifest.partition_spec_id)?
            .fields()
            .iter()
            .position(|p| p.source_id == field && p.transform == Transform::Identity)
    }

    /// Whether `manifest` may list a wanted file, by the partition bounds
    /// the manifest list keeps for it (at `position`).
    fn manifest_may_hold(&self, manifest: &ManifestFile, position: Option<usize>) -> bool {
        let (Wanted::Holding { value, .. }, Some(position)) = (self, position) else {
            return true;
        };
        match manifest.partitions.as_ref().and_then(|p| p.get(position)) {
            Some(summary) => match (&summary.lower_bound, &summary.upper_bound) {
                (Some(lower), Some(upper)) => {
                    lower.as_ref() <= value.as_bytes() && value.as_bytes() <= upper.as_ref()
                }
                _ => true,
            },
            None => true,
        }
    }

    /// Whether `data` may hold a wanted row: its partition value (at
    /// `position`), or its upper bound of the time column (none kept: it
    /// may).
    fn file_may_hold(&self, data: &DataFile, position: Option<usize>) -> bool {
        match *self {
            Wanted::Holding { value, .. } => position.is_none_or(|position| {
                matches!(
                    data.partition().fields().get(position),
                    Some(Some(Literal::Primitive(PrimitiveLiteral::String(held)))) if held == value
                )
            }),
            Wanted::Since { field, micros } => {
                data.upper_bounds().get(&field).is_none_or(|upper| {
                    upper.partial_cmp(&Datum::timestamptz_micros(micros))
                        != Some(std::cmp::Ordering::Less)
                })
            }
        }
    }

    /// The same rows as a scan filter of `schema`.
    fn filter(&self, schema: &Schema) -> Option<Predicate> {
        match *self {
            Wanted::Holding { field, value } => {
                Some(Reference::new(schema.name_by_field_id(field)?).equal_to(Datum::string(value)))
            }
            Wanted::Since { field, micros } => Some(
                Reference::new(schema.name_by_field_id(field)?)
                    .greater_than_or_equal_to(Datum::timestamptz_micros(micros)),
            ),
        }
    }
}
