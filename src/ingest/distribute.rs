//! COPY INTO's files on a cluster. The coordinator lists and selects the
//! files, creates the table if needed, and keeps the copy log and the one
//! commit; the executors open the prefix with the statement's options, read
//! their share of the files (staging compressed ones on their own disks),
//! and write each as data files of the target under the copy's prefix, with
//! a name unique to the attempt. Each file's answer carries the version it
//! read (size and ETag): a file that changed since the coordinator chose it
//! is refused like an unreadable one, so the copy log records what was
//! really loaded.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use iceberg::spec::{DataFile, deserialize_data_file_from_json, serialize_data_file_to_json};
use iceberg::table::Table;
use serde::{Deserialize, Serialize};

use super::options::{Format, READ_OPTIONS, SourceOptions};
use super::read::Source;
use super::source::{Access, SourceFile, files_at};
use super::write::Copying;
use crate::cluster::{
    Answer, Cluster, Job, Jobs, Recipe, decode_message, encode_message, run_for_items, share,
};
use crate::config::{OptionSyntax, WithOptions, keys};
use crate::error::{Error, Result};

/// The job's kind, as decoders know it.
const KIND: &str = "ingest.copy";
/// Partitions a copy is split into (each loads every n-th file).
const PARTITIONS: usize = 8;

/// Loading some files of a prefix into a table.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CopyJob {
    /// The prefix, as the statement named it.
    uri: String,
    /// How to open and read the files ([`SourceOptions::reading_pairs`]).
    options: Vec<(String, String)>,
    format: String,
    target: Recipe,
    /// File names start with this (the copy's id).
    prefix: String,
    /// The files: their number in the copy and their store key.
    files: Vec<(usize, String)>,
    partitions: usize,
}

/// One file's outcome as it travels back.
#[derive(Debug, Serialize, Deserialize)]
struct FileCopied {
    /// The file's position in the job's list.
    item: usize,
    size: u64,
    etag: Option<String>,
    /// The data files written, as Iceberg's JSON.
    data_files: Vec<String>,
    error: Option<String>,
}

impl CopyJob {
    async fn copy_one(
        &self,
        access: &Access,
        target: &Table,
        options: &SourceOptions,
        format: Format,
        (item, n): (usize, usize),
        key: &str,
    ) -> Result<FileCopied> {
        let file = files_at(access, &[key.to_string()])
            .await?
            .pop()
            .ok_or_else(|| Error::invalid(format!("{key} is gone from {}", self.uri)))?;
        let source = Source::of_files(access.clone(), vec![file.clone()], format, options).await?;
        let prefix = format!("{}-{n:05}-{}", self.prefix, uuid::Uuid::new_v4().simple());
        let copying = Copying {
            target: target.clone(),
            access: access.clone(),
            format,
            options: options.clone(),
            hive: vec![],
        };
        let written = copying.copy_file(Arc::new(source), &prefix).await?.files;
        let metadata = target.metadata();
        let partition_type = metadata
            .default_partition_spec()
            .partition_type(metadata.current_schema())?;
        Ok(FileCopied {
            item,
            size: file.meta.size,
            etag: file.etag().map(String::from),
            data_files: written
                .into_iter()
                .map(|f| serialize_data_file_to_json(f, &partition_type, metadata.format_version()))
                .collect::<iceberg::Result<_>>()?,
            error: None,
        })
    }
}

impl Answer for FileCopied {
    fn item(&self) -> usize {
        self.item
    }
}

impl Job for CopyJob {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn encode(&self) -> Result<Vec<u8>> {
        encode_message(self)
    }

    fn partitions(&self) -> usize {
        self.partitions
    }

    fn run(&self, partition: usize) -> BoxFuture<'static, Result<Vec<String>>> {
        let mine = share(&self.files, partition, self.partitions);
        let job = self.clone();
        async move {
            let options = SourceOptions::from_pairs(
                SourceOptions::STATEMENT,
                OptionSyntax::With,
                &job.options,
                &keys(READ_OPTIONS),
            )?;
            let format = Format::parse(&job.format)?;
            let access = Access::open(&job.uri, &options).await?;
            let target = job.target.open().await?;
            let mut rows = vec![];
            for (item, (n, key)) in mine {
                // A file that fails is an answer, not a failed task: the
                // coordinator decides (abort, or skip the file).
                let copied = match job
                    .copy_one(&access, &target, &options, format, (item, n), &key)
                    .await
                {
                    Ok(copied) => copied,
                    Err(e) => FileCopied {
                        item,
                        size: 0,
                        etag: None,
                        data_files: vec![],
                        error: Some(e.to_string()),
                    },
                };
                rows.push(copied.to_row()?);
            }
            Ok(rows)
        }
        .boxed()
    }
}

fn decode(bytes: &[u8]) -> Result<Arc<dyn Job>> {
    Ok(Arc::new(decode_message::<CopyJob>(
        bytes,
        "a COPY INTO job",
    )?))
}

/// The jobs the ingest layer sends.
pub(crate) fn jobs(jobs: Jobs) -> Jobs {
    jobs.with(KIND, decode)
}

/// Loads `files` (numbered as the copy numbers them) into `target` on
/// `cluster`; answers each file with its data files or why it failed.
pub(super) async fn copy_on_cluster(
    cluster: &Cluster,
    access: &Access,
    options: &SourceOptions,
    format: Format,
    target: &Table,
    prefix: &str,
    files: Vec<(usize, SourceFile)>,
) -> Result<Vec<(SourceFile, Result<Vec<DataFile>>)>> {
    let job = CopyJob {
        uri: access.uri.clone(),
        options: crate::cluster::without_long_lived_keys(options.reading_pairs()),
        format: format.to_string(),
        target: Recipe::of(target, None)?,
        prefix: prefix.to_string(),
        files: files
            .iter()
            .map(|(n, f)| (*n, f.meta.location.to_string()))
            .collect(),
        partitions: files.len().clamp(1, PARTITIONS),
    };
    let items = files.len();
    let ctx = cluster.context().await?;
    let answers =
        run_for_items::<FileCopied>(&ctx, Arc::new(job), items, "a COPY INTO task").await?;
    let metadata = target.metadata();
    let schema = metadata.current_schema();
    let spec = metadata.default_partition_spec();
    let partition_type = spec.partition_type(schema)?;
    let mut outcomes = vec![];
    for ((_, file), answer) in files.into_iter().zip(answers) {
        let outcome = match answer {
            // Every file answered exactly once: a lost answer is not a load.
            None => Err(Error::invalid(format!(
                "the cluster did not answer for {}: run the COPY INTO again",
                file.uri
            ))),
            Some(FileCopied {
                error: Some(error), ..
            }) => Err(Error::invalid(error)),
            Some(copied)
                if copied.size != file.meta.size || copied.etag.as_deref() != file.etag() =>
            {
                Err(Error::invalid(format!(
                    "{} changed while it was being loaded (size {} then {}): run the COPY INTO \
                     again to load its new version",
                    file.uri, file.meta.size, copied.size
                )))
            }
            Some(copied) => copied
                .data_files
                .iter()
                .map(|json| {
                    Ok(deserialize_data_file_from_json(
                        json,
                        spec.spec_id(),
                        &partition_type,
                        schema,
                    )?)
                })
                .collect(),
        };
        outcomes.push((file, outcome));
    }
    Ok(outcomes)
}
