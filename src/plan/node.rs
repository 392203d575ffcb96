//! Commands as plans: a logical node, the execution node that runs it, and
//! the extension planner that turns one into the other.

use std::any::Any;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{
    Expr, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};

use super::command::{Command, CommandContext};
use crate::rows::one_batch;

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
}

// A command is equal only to itself (the same planned statement, carried
// through the optimizer's rewrites by its `Arc`): two statements that print
// alike (two `CREATE UPLOAD`s, say) are still two commands.
impl PartialEq for CommandNode {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.command, &other.command) && self.input == other.input
    }
}

impl Eq for CommandNode {}

impl Hash for CommandNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.command), state);
        self.input.hash(state);
    }
}

impl PartialOrd for CommandNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (self == other).then_some(Ordering::Equal)
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
        let properties = crate::rows::bounded_properties(schema, 1, false);
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
        write!(f, "{}Exec: {}", self.command.name(), self.command.detail())
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

/// The session's query planner with icestage's statements added: a plan
/// that holds an icestage command is planned with [`CommandPlanner`]; every
/// other plan goes to the planner the host application had installed, so
/// registering icestage composes with a host's own planner.
pub(crate) struct IcestageQueryPlanner {
    /// The planner the session had before (DataFusion's default, or the
    /// host application's).
    pub(crate) inner: Arc<dyn QueryPlanner + Send + Sync>,
}

impl fmt::Debug for IcestageQueryPlanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IcestageQueryPlanner")
            .field("inner", &self.inner)
            .finish()
    }
}

/// True when `plan` holds an icestage command anywhere.
fn holds_command(plan: &LogicalPlan) -> bool {
    use datafusion::common::tree_node::TreeNode;
    let mut found = false;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(extension) = node
            && extension
                .node
                .as_any()
                .downcast_ref::<CommandNode>()
                .is_some()
        {
            found = true;
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

#[async_trait]
impl QueryPlanner for IcestageQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if holds_command(logical_plan) {
            DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(CommandPlanner)])
                .create_physical_plan(logical_plan, session_state)
                .await
        } else {
            self.inner
                .create_physical_plan(logical_plan, session_state)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_that_print_alike_are_still_two_commands() {
        let a = CommandNode::new(crate::session::expire::ExpireStaging.into(), None).unwrap();
        let b = CommandNode::new(crate::session::expire::ExpireStaging.into(), None).unwrap();
        assert_eq!(a.command.to_string(), b.command.to_string());
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
        assert_eq!(a.partial_cmp(&b), None);
    }
}
