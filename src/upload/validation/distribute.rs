//! Verification's chunks on a cluster: the same proof ([`super::verify`]),
//! read by executors. The coordinator reads the footers (small), checks
//! them, and sends a job holding the plan as a recipe (the target's
//! metadata file, the staging schema, the CHECK rules as SQL) and the
//! chunks (file, row groups, first row); each executor rebuilds the plan,
//! reads its share of the chunks and answers what it proved, which the
//! coordinator merges exactly as it merges its own reads.

use std::collections::HashMap;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, Schema};
use iceberg::table::Table;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use serde::{Deserialize, Serialize};

use super::drift::Matching;
use super::verify::{Chunk, Columns, Plan, Read, ReadChunks, compile_checks, open, read_chunk};
use crate::cluster::{
    Answer, Cluster, Job, Jobs, Recipe, decode_message, encode_message, run_for_items, share,
};
use crate::error::{Error, Result};

/// The job's kind, as decoders know it.
const KIND: &str = "upload.verify";
/// Partitions a verification is split into (each reads every n-th chunk).
const PARTITIONS: usize = 8;

/// A verification plan as it travels: what [`Plan::new`] is built from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PlanRecipe {
    target: Recipe,
    staging: Schema,
    by_name: bool,
    /// CHECK rules: name and predicate.
    checks: Vec<(String, String)>,
    key: Vec<String>,
}

impl PlanRecipe {
    pub(crate) fn new(
        target: &Table,
        staging: &Schema,
        matching: Matching,
        checks: Vec<(String, String)>,
        key: Vec<String>,
    ) -> Result<Self> {
        Ok(Self {
            target: Recipe::of(target, None)?,
            staging: staging.clone(),
            by_name: matching == Matching::ByName,
            checks,
            key,
        })
    }

    async fn build(&self) -> Result<Plan> {
        let target = self.target.open().await?;
        let matching = if self.by_name {
            Matching::ByName
        } else {
            Matching::ById
        };
        Plan::new(
            &target,
            &self.staging,
            matching,
            compile_checks(&target, &self.checks)?,
            self.key.clone(),
        )
    }
}

/// Reading some chunks of an upload's files.
#[derive(Debug, Serialize, Deserialize)]
struct VerifyJob {
    plan: PlanRecipe,
    /// The file IO's properties for the staged files.
    io: HashMap<String, String>,
    /// The chunks, each naming its file by path.
    chunks: Vec<Chunk<String>>,
    partitions: usize,
}

/// One chunk's proof as it travels back.
#[derive(Serialize, Deserialize)]
struct ChunkRead {
    chunk: usize,
    partition: Option<serde_json::Value>,
    read: Read,
}

impl Answer for ChunkRead {
    fn item(&self) -> usize {
        self.chunk
    }
}

impl Job for VerifyJob {
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
        let plan = self.plan.clone();
        let io = crate::cluster::file_io(&self.io);
        let mine = share(&self.chunks, partition, self.partitions);
        async move {
            let plan = Arc::new(plan.build().await?);
            let mut rows = vec![];
            // A file's footer is read once however many of its chunks fall here.
            let mut footers = HashMap::new();
            for (index, chunk) in mine {
                let Chunk {
                    file: path,
                    groups,
                    first_row,
                } = chunk;
                let footer = match footers.get(&path) {
                    Some(footer) => ArrowReaderMetadata::clone(footer),
                    None => {
                        let (_, footer) = open(&io, &path).await?;
                        footers.insert(path.clone(), footer.clone());
                        footer
                    }
                };
                let read = read_chunk(
                    io.clone(),
                    path,
                    footer,
                    groups,
                    first_row,
                    Columns::All,
                    Arc::clone(&plan),
                )
                .await?;
                let answer = ChunkRead {
                    chunk: index,
                    partition: read.partition_json(&plan)?,
                    read,
                };
                rows.push(answer.to_row()?);
            }
            Ok(rows)
        }
        .boxed()
    }
}

fn decode(bytes: &[u8]) -> Result<Arc<dyn Job>> {
    Ok(Arc::new(decode_message::<VerifyJob>(
        bytes,
        "a verification job",
    )?))
}

/// The jobs the upload layer sends.
pub(crate) fn jobs(jobs: Jobs) -> Jobs {
    jobs.with(KIND, decode)
}

/// Reads `chunks` of `files` on `cluster`; answers per chunk its file's
/// index and what was proved.
/// Verification's reads on `cluster`: the plan as a recipe each executor
/// rebuilds.
pub(super) struct OnCluster(pub(super) Cluster, pub(super) PlanRecipe);

#[async_trait::async_trait]
impl ReadChunks for OnCluster {
    async fn read(
        &self,
        io: &FileIO,
        files: &[DataFile],
        _footers: &[(u64, ArrowReaderMetadata)],
        chunks: Vec<Chunk>,
        plan: &Arc<Plan>,
    ) -> Result<Vec<(usize, Read)>> {
        let job = VerifyJob {
            plan: self.1.clone(),
            io: crate::cluster::without_long_lived_keys(io.config().props().clone()),
            chunks: chunks
                .iter()
                .map(|chunk| Chunk {
                    file: files[chunk.file].file_path().to_string(),
                    groups: chunk.groups.clone(),
                    first_row: chunk.first_row,
                })
                .collect(),
            partitions: chunks.len().clamp(1, PARTITIONS),
        };
        let ctx = self.0.context().await?;
        let answers =
            run_for_items::<ChunkRead>(&ctx, Arc::new(job), chunks.len(), "a verification task")
                .await?;
        let mut reads = vec![];
        // Every chunk proved exactly once: a lost answer is not a pass.
        for (chunk, answer) in answers.into_iter().enumerate() {
            let Some(answer) = answer else {
                return Err(Error::invalid(format!(
                    "the cluster did not verify chunk {chunk} of {} (file {}): promote again",
                    chunks.len(),
                    files[chunks[chunk].file].file_path()
                )));
            };
            let mut read = answer.read;
            read.set_partition_json(answer.partition, plan)?;
            reads.push((chunks[chunk].file, read));
        }
        Ok(reads)
    }
}
