//! Work that is not a query, sent to the executors as a table: a [`Job`]
//! has a fixed number of partitions, each answering rows of JSON. The
//! layers above define jobs (verifying an upload's files); this module only
//! carries them, so a job travels as its kind and its own bytes, and the
//! processes that decode it are given the decoders ([`Jobs`]) when they start.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use datafusion::arrow::array::{AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::future::BoxFuture;

use crate::error::{Error, Result};

/// The one column a job answers.
const RESULT: &str = "result";

static OUTPUT: LazyLock<SchemaRef> =
    LazyLock::new(|| Arc::new(Schema::new(vec![Field::new(RESULT, DataType::Utf8, false)])));

/// Work split into partitions that executors run independently.
pub trait Job: fmt::Debug + Send + Sync {
    /// The name its decoder is registered under.
    fn kind(&self) -> &'static str;
    /// Everything an executor needs to run it.
    fn encode(&self) -> Result<Vec<u8>>;
    /// How many partitions it has.
    fn partitions(&self) -> usize;
    /// Runs one partition; each string becomes a row.
    fn run(&self, partition: usize) -> BoxFuture<'static, Result<Vec<String>>>;
}

/// Turns a job's bytes back into the job.
pub type JobDecoder = fn(&[u8]) -> Result<Arc<dyn Job>>;

/// The decoders a scheduler or executor knows, by kind.
#[derive(Clone, Default)]
pub struct Jobs(Vec<(&'static str, JobDecoder)>);

impl fmt::Debug for Jobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

impl Jobs {
    /// Adds the decoder of `kind`.
    pub fn with(mut self, kind: &'static str, decoder: JobDecoder) -> Self {
        self.0.push((kind, decoder));
        self
    }

    /// `kind: bytes` back into a job.
    pub(crate) fn decode(&self, kind: &str, bytes: &[u8]) -> Result<Arc<dyn Job>> {
        let (_, decoder) = self.0.iter().find(|(k, _)| *k == kind).ok_or_else(|| {
            Error::invalid(format!(
                "this process cannot run icestage job '{kind}': scheduler, executors and client \
                 must be the same icestage build"
            ))
        })?;
        decoder(bytes)
    }
}

/// A job's bytes: its message as JSON.
pub(crate) fn encode_message(message: &impl serde::Serialize) -> Result<Vec<u8>> {
    serde_json::to_vec(message).map_err(|e| Error::internal(format!("{e}")))
}

/// A job's message back from [`encode_message`]'s bytes.
pub(crate) fn decode_message<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::invalid(format!(
            "cannot decode {what} ({e}): scheduler, executors and client must be the same \
             icestage build"
        ))
    })
}

/// One answer of a job for one of its items (the item's position in the
/// job's list), as a partition returns it.
pub(crate) trait Answer: serde::Serialize + serde::de::DeserializeOwned {
    fn item(&self) -> usize;

    /// The answer as the row a partition returns.
    fn to_row(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::internal(format!("{e}")))
    }
}

/// Runs `job` on `ctx`, whose partitions answer for its `items` items: each
/// answer in its item's slot, `None` where none came back. An answer for
/// an item the job does not have, or a second for one item, is an error.
pub(crate) async fn run_for_items<A: Answer>(
    ctx: &datafusion::prelude::SessionContext,
    job: Arc<dyn Job>,
    items: usize,
    what: &str,
) -> Result<Vec<Option<A>>> {
    let mut slots: Vec<Option<A>> = (0..items).map(|_| None).collect();
    for row in run_job(ctx, job).await? {
        let answer: A = serde_json::from_str(&row)
            .map_err(|e| Error::invalid(format!("{what}'s answer: {e}")))?;
        let item = answer.item();
        match slots.get_mut(item) {
            Some(slot @ None) => *slot = Some(answer),
            Some(Some(_)) => {
                return Err(Error::invalid(format!(
                    "{what} answered twice for item {item}: run the statement again"
                )));
            }
            None => {
                return Err(Error::invalid(format!(
                    "{what} answered for item {item} of {items}"
                )));
            }
        }
    }
    Ok(slots)
}

/// A job as a table the cluster can plan.
#[derive(Debug)]
pub(crate) struct JobTable(pub(crate) Arc<dyn Job>);

#[async_trait]
impl TableProvider for JobTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&OUTPUT)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(JobExec::new(Arc::clone(&self.0))))
    }
}

/// A job's partitions as an execution plan.
#[derive(Debug)]
pub(crate) struct JobExec {
    pub(crate) job: Arc<dyn Job>,
    properties: Arc<PlanProperties>,
}

impl JobExec {
    pub(crate) fn new(job: Arc<dyn Job>) -> Self {
        let properties =
            crate::rows::bounded_properties(Arc::clone(&OUTPUT), job.partitions().max(1), false);
        Self { job, properties }
    }
}

impl DisplayAs for JobExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcestageJobExec: kind={} partitions={}",
            self.job.kind(),
            self.job.partitions()
        )
    }
}

impl ExecutionPlan for JobExec {
    fn name(&self) -> &str {
        "IcestageJobExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let run = self.job.run(partition);
        let rows = futures::stream::once(async move {
            let rows = run.await?;
            Ok(RecordBatch::try_new(
                Arc::clone(&OUTPUT),
                vec![Arc::new(StringArray::from(rows))],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&OUTPUT),
            rows,
        )))
    }
}

/// The largest job icestage sends: half of Ballista's default gRPC message
/// limit (16 MiB), which also carries the plan around it.
const MAX_JOB_BYTES: usize = 8 << 20;

/// Refuses a job too large for one message, saying what to do instead.
fn check_size(job: &dyn Job) -> Result<()> {
    let bytes = job.encode()?.len();
    if bytes > MAX_JOB_BYTES {
        return Err(Error::invalid(format!(
            "the cluster job '{}' is {bytes} bytes, more than the {MAX_JOB_BYTES} one message \
             carries: split the work (fewer files per statement), or run it here with \
             SET icestage.cluster = ''",
            job.kind()
        )));
    }
    Ok(())
}

/// Runs `job` on the cluster session `ctx`; returns every partition's rows.
pub(crate) async fn run_job(
    ctx: &datafusion::prelude::SessionContext,
    job: Arc<dyn Job>,
) -> Result<Vec<String>> {
    check_size(job.as_ref())?;
    let batches = ctx.read_table(Arc::new(JobTable(job)))?.collect().await?;
    let mut rows = vec![];
    for batch in &batches {
        if let Some(column) = batch.column_by_name(RESULT) {
            rows.extend(column.as_string::<i32>().iter().flatten().map(String::from));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Sized(usize);

    impl Job for Sized {
        fn kind(&self) -> &'static str {
            "test.sized"
        }
        fn encode(&self) -> Result<Vec<u8>> {
            Ok(vec![0; self.0])
        }
        fn partitions(&self) -> usize {
            1
        }
        fn run(&self, _partition: usize) -> BoxFuture<'static, Result<Vec<String>>> {
            Box::pin(async { Ok(vec![]) })
        }
    }

    #[test]
    fn a_job_larger_than_a_message_is_refused_with_what_to_do() {
        assert!(check_size(&Sized(MAX_JOB_BYTES)).is_ok());
        let error = check_size(&Sized(MAX_JOB_BYTES + 1))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("test.sized") && error.contains("icestage.cluster = ''"),
            "{error}"
        );
    }
}
