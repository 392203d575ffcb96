//! Writing on the executors, committing on the coordinator.
//!
//! A [`WriteNode`] over a query asks the cluster to write the query's rows
//! as new data files of one Iceberg table (a [`Recipe`]): each partition
//! writes its rows through icestage's one Parquet writer under the job's
//! prefix, with a name unique to the attempt, and answers one row per file
//! (the file's description as Iceberg's JSON). Nothing is committed there:
//! the coordinator reads the descriptions and appends them in one commit, so
//! a retried task leaves an unreferenced file, never a second commit.

use std::any::Any;
use std::cmp::Ordering;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use datafusion::arrow::array::{AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::TryStreamExt;
use iceberg::spec::{DataFile, deserialize_data_file_from_json, serialize_data_file_to_json};
use iceberg::table::Table;
use serde::{Deserialize, Serialize};

use super::recipe::Recipe;
use crate::catalog::bridge::writer::write_rows;
use crate::error::{Error, Result};

/// The one column a write answers: a data file's description.
const DATA_FILE: &str = "data_file";

static OUTPUT: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(ArrowSchema::new(vec![Field::new(
        DATA_FILE,
        DataType::Utf8,
        false,
    )]))
});

/// Where a write goes: the table and the job's file-name prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct WriteTarget {
    pub(crate) table: Recipe,
    pub(crate) prefix: String,
}

/// The logical node: write `input`'s rows into `target`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WriteNode {
    pub(crate) target: WriteTarget,
    pub(crate) input: LogicalPlan,
    schema: DFSchemaRef,
}

impl WriteNode {
    pub(crate) fn new(target: WriteTarget, input: LogicalPlan) -> DFResult<Self> {
        Ok(Self {
            target,
            input,
            schema: Arc::new(DFSchema::try_from(OUTPUT.as_ref().clone())?),
        })
    }
}

impl PartialOrd for WriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.target
            .prefix
            .partial_cmp(&other.target.prefix)
            .filter(|o| *o != Ordering::Equal || self == other)
    }
}

impl UserDefinedLogicalNodeCore for WriteNode {
    fn name(&self) -> &str {
        "IcestageWrite"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcestageWrite: table={} prefix={}",
            self.target.table.table, self.target.prefix
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> DFResult<Self> {
        let input = inputs.pop().ok_or_else(|| {
            DataFusionError::Internal("IcestageWrite needs its input".to_string())
        })?;
        Self::new(self.target.clone(), input)
    }
}

/// The physical node: each partition writes its input partition's rows.
#[derive(Debug)]
pub(crate) struct WriteExec {
    pub(crate) target: WriteTarget,
    pub(crate) input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl WriteExec {
    pub(crate) fn new(target: WriteTarget, input: Arc<dyn ExecutionPlan>) -> Self {
        let partitions = input.properties().output_partitioning().partition_count();
        let properties = crate::rows::bounded_properties(Arc::clone(&OUTPUT), partitions, false);
        Self {
            target,
            input,
            properties,
        }
    }
}

impl DisplayAs for WriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcestageWriteExec: table={} prefix={}",
            self.target.table.table, self.target.prefix
        )
    }
}

impl ExecutionPlan for WriteExec {
    fn name(&self) -> &str {
        "IcestageWriteExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("IcestageWriteExec needs its input".to_string())
        })?;
        Ok(Arc::new(Self::new(self.target.clone(), input)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let rows = self.input.execute(partition, context)?.map_err(Error::from);
        let target = self.target.clone();
        let written = futures::stream::once(async move {
            let table = target.table.open().await?;
            // Unique per attempt: a retried task never overwrites (or is
            // overwritten by) an earlier attempt's file.
            let prefix = format!(
                "{}-{partition:04}-{}",
                target.prefix,
                uuid::Uuid::new_v4().simple()
            );
            let files = write_rows(&table, &prefix, rows).await?;
            Ok(describe(&table, files)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&OUTPUT),
            written,
        )))
    }
}

/// The files as one batch of Iceberg's JSON descriptions.
fn describe(table: &Table, files: Vec<DataFile>) -> Result<RecordBatch> {
    let metadata = table.metadata();
    let partition_type = metadata
        .default_partition_spec()
        .partition_type(metadata.current_schema())?;
    let described = files
        .into_iter()
        .map(|file| serialize_data_file_to_json(file, &partition_type, metadata.format_version()))
        .collect::<iceberg::Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(
        Arc::clone(&OUTPUT),
        vec![Arc::new(StringArray::from(described))],
    )?)
}

/// Plans [`WriteNode`]s into [`WriteExec`]s (the scheduler's planner).
#[derive(Debug, Default)]
struct WritePlanner;

#[async_trait]
impl ExtensionPlanner for WritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session_state: &SessionState,
    ) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<WriteNode>() else {
            return Ok(None);
        };
        let input = physical_inputs.first().cloned().ok_or_else(|| {
            DataFusionError::Internal("IcestageWrite needs its input".to_string())
        })?;
        Ok(Some(Arc::new(WriteExec::new(node.target.clone(), input))))
    }
}

/// The scheduler's query planner: DataFusion's, plus icestage's write.
#[derive(Debug, Default)]
pub(crate) struct ClusterQueryPlanner;

#[async_trait]
impl QueryPlanner for ClusterQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(WritePlanner)])
            .create_physical_plan(logical_plan, session_state)
            .await
    }
}

/// Runs `query` on the cluster session `ctx`, writing its rows as new data
/// files of `table` named `<prefix>-...`; returns the files, not committed.
pub(crate) async fn write_on_cluster(
    ctx: &datafusion::prelude::SessionContext,
    table: &Table,
    prefix: &str,
    query: LogicalPlan,
) -> Result<Vec<DataFile>> {
    let target = WriteTarget {
        table: Recipe::of(table, None)?,
        prefix: prefix.to_string(),
    };
    let plan = LogicalPlan::Extension(Extension {
        node: Arc::new(WriteNode::new(target, query)?),
    });
    let batches = ctx.execute_logical_plan(plan).await?.collect().await?;
    let metadata = table.metadata();
    let schema = metadata.current_schema();
    let spec = metadata.default_partition_spec();
    let partition_type = spec.partition_type(schema)?;
    let mut files = vec![];
    for batch in &batches {
        let column = batch
            .column_by_name(DATA_FILE)
            .ok_or_else(|| Error::invalid("the cluster's write answered no data files"))?;
        for json in column.as_string::<i32>().iter().flatten() {
            files.push(deserialize_data_file_from_json(
                json,
                spec.spec_id(),
                &partition_type,
                schema,
            )?);
        }
    }
    Ok(files)
}
