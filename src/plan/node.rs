//! Commands as plans: a logical node, the execution node that runs it, and
//! the extension planner that turns one into the other.

use std::any::Any;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{
    Expr, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};

use super::command::{Command, CommandContext};

/// A command in a logical plan.
#[derive(Debug, Clone)]
pub(crate) struct CommandNode {
    command: Arc<Command>,
    schema: DFSchemaRef,
    input: Option<LogicalPlan>,
}

impl CommandNode {
    pub(crate) fn new(command: Command, input: Option<LogicalPlan>) -> DFResult<Self> {
        let schema = Arc::new(DFSchema::try_from(command.schema())?);
        Ok(Self {
            command: Arc::new(command),
            schema,
            input,
        })
    }

    pub(crate) fn into_plan(self) -> LogicalPlan {
        LogicalPlan::Extension(datafusion::logical_expr::Extension {
            node: Arc::new(self),
        })
    }

    fn key(&self) -> (String, Option<&LogicalPlan>) {
        (self.command.to_string(), self.input.as_ref())
    }
}

impl PartialEq for CommandNode {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for CommandNode {}

impl Hash for CommandNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl PartialOrd for CommandNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.command
            .to_string()
            .partial_cmp(&other.command.to_string())
    }
}

impl UserDefinedLogicalNodeCore for CommandNode {
    fn name(&self) -> &str {
        self.command.name()
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        self.input.iter().collect()
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.command)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> DFResult<Self> {
        Ok(Self {
            command: Arc::clone(&self.command),
            schema: Arc::clone(&self.schema),
            input: inputs.pop(),
        })
    }
}

/// Runs a command when executed; one output partition with the result row(s).
#[derive(Debug)]
pub(crate) struct CommandExec {
    command: Arc<Command>,
    input: Option<Arc<dyn ExecutionPlan>>,
    session: Option<Arc<SessionState>>,
    properties: Arc<PlanProperties>,
}

impl CommandExec {
    pub(crate) fn new(
        command: Arc<Command>,
        input: Option<Arc<dyn ExecutionPlan>>,
        session: Option<Arc<SessionState>>,
    ) -> Self {
        let schema = command.schema();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            command,
            input,
            session,
            properties,
        }
    }
}

impl DisplayAs for CommandExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}Exec: ", self.command.name())?;
        let text = self.command.to_string();
        let detail = text.split_once(": ").map_or("", |(_, d)| d);
        write!(f, "{detail}")
    }
}

impl ExecutionPlan for CommandExec {
    fn name(&self) -> &str {
        "CommandExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.command.schema()
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.input.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            Arc::clone(&self.command),
            children.pop(),
            self.session.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        task: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let mut ctx = CommandContext::new(task)?;
        ctx.input = self.input.clone();
        ctx.session = self.session.clone();
        let command = Arc::clone(&self.command);
        one_batch(self.name(), partition, self.schema(), async move {
            command.execute(ctx).await.map_err(DataFusionError::from)
        })
    }
}

/// The stream of partition `partition` of a plan with one output partition
/// whose one batch `batch` computes.
pub(crate) fn one_batch(
    plan: &str,
    partition: usize,
    schema: SchemaRef,
    batch: impl Future<Output = DFResult<RecordBatch>> + Send + 'static,
) -> DFResult<SendableRecordBatchStream> {
    if partition != 0 {
        return Err(DataFusionError::Internal(format!(
            "{plan} has one partition, asked for {partition}"
        )));
    }
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::once(batch),
    )))
}

/// `plan` narrowed to the columns of `projection` (indices into its schema).
pub(crate) fn project(
    plan: Arc<dyn ExecutionPlan>,
    projection: Option<&Vec<usize>>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let Some(projection) = projection else {
        return Ok(plan);
    };
    let schema = plan.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = projection
        .iter()
        .map(|&i| {
            let name = schema.field(i).name().clone();
            (Arc::new(Column::new(&name, i)) as _, name)
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
}

/// Plans [`CommandNode`]s into [`CommandExec`]s.
#[derive(Debug, Default)]
pub(crate) struct CommandPlanner;

#[async_trait]
impl ExtensionPlanner for CommandPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session_state: &SessionState,
    ) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<CommandNode>() else {
            return Ok(None);
        };
        let input = physical_inputs.first().cloned();
        let session = input.is_some().then(|| Arc::new(session_state.clone()));
        Ok(Some(Arc::new(CommandExec::new(
            Arc::clone(&node.command),
            input,
            session,
        ))))
    }
}

/// DataFusion's physical planner plus [`CommandPlanner`].
#[derive(Debug, Default)]
pub(crate) struct IcestageQueryPlanner;

#[async_trait]
impl QueryPlanner for IcestageQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(CommandPlanner)])
            .create_physical_plan(logical_plan, session_state)
            .await
    }
}
