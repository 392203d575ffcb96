//! Table functions: status queries and table-function twins of the
//! statements, so a stock DataFusion front end (without icestage's parser)
//! loses nothing. Each function is a `TableFunctionImpl` that checks its
//! literal arguments up front and returns a [`CommandTable`], whose scan runs
//! the same command the statement runs.

mod download;
mod pipe;
mod upload;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{ScalarValue, TableReference, plan_err};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::catalog::{Catalogs, TableName};
use crate::plan::Command;
use crate::plan::node::CommandExec;
use crate::rows::project;
use crate::session::operation::{Operation, Outcome};

/// Registers every icestage table function in `ctx`.
pub(crate) fn register_all(ctx: &SessionContext) {
    ctx.register_udtf("upload_status", Arc::new(upload::UploadStatusFunc));
    ctx.register_udtf("uploads", Arc::new(upload::UploadsFunc));
    ctx.register_udtf("create_upload", Arc::new(upload::CreateUploadFunc));
    ctx.register_udtf("promote_upload", Arc::new(upload::PromoteUploadFunc));
    ctx.register_udtf("upload_findings", Arc::new(upload::UploadFindingsFunc));
    ctx.register_udtf("table_constraints", Arc::new(upload::TableConstraintsFunc));
    ctx.register_udtf("vend_credentials", Arc::new(upload::VendCredentialsFunc));
    ctx.register_udtf("download_status", Arc::new(download::DownloadStatusFunc));
    ctx.register_udtf("downloads", Arc::new(download::DownloadsFunc));
    ctx.register_udtf("wait_download", Arc::new(download::WaitDownloadFunc));
    ctx.register_udtf("pipes", Arc::new(pipe::PipesFunc));
    ctx.register_udtf("pipe_status", Arc::new(pipe::PipeStatusFunc));
    ctx.register_udtf("copy_rejects", Arc::new(pipe::CopyRejectsFunc));
}

/// Builds the command once the session is known (names resolve against it).
type MakeCommand = Arc<dyn Fn(&SessionState) -> crate::Result<Command> + Send + Sync>;

/// A table whose rows are the result of a command, run when scanned.
pub(crate) struct CommandTable {
    schema: SchemaRef,
    make: MakeCommand,
}

impl CommandTable {
    fn new(schema: SchemaRef, make: MakeCommand) -> Arc<Self> {
        Arc::new(Self { schema, make })
    }

    /// A table for a command that needs nothing from the session.
    pub(crate) fn of(command: impl Into<Command>) -> Arc<Self> {
        let command = command.into();
        let schema = command.schema();
        Self::new(schema, Arc::new(move |_| Ok(command.clone())))
    }

    /// A table for an operation on `table`, a name the session resolves
    /// as SQL would when the query is planned.
    pub(crate) fn on_table<O>(
        table: String,
        operation: impl Fn(TableName) -> O + Send + Sync + 'static,
    ) -> Arc<Self>
    where
        O: Operation,
        Command: From<O>,
    {
        let schema = <O::Outcome as Outcome>::schema();
        Self::new(
            schema,
            Arc::new(move |state| {
                let icestage = Catalogs::from_config(state.config())?;
                let name = icestage.name_of(state, &TableReference::from(table.as_str()))?;
                Ok(operation(name).into())
            }),
        )
    }
}

impl fmt::Debug for CommandTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandTable")
            .field("schema", &self.schema)
            .finish()
    }
}

#[async_trait]
impl TableProvider for CommandTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let state = state
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| {
                DataFusionError::Plan(
                    "icestage table functions need a DataFusion SessionState".to_string(),
                )
            })?;
        let command = (self.make)(state)?;
        let exec: Arc<dyn ExecutionPlan> =
            Arc::new(CommandExec::new(Arc::new(command), None, None));
        project(exec, projection)
    }
}

/// The string literal at `args[index]`; `signature` is restated on error.
pub(crate) fn string_arg(
    args: &[Expr],
    index: usize,
    function: &str,
    signature: &str,
) -> DFResult<String> {
    match args.get(index) {
        Some(Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        )) => Ok(s.clone()),
        Some(other) => plan_err!(
            "{function} takes a string literal as argument {}, got {other}: call it as {signature}",
            index + 1
        ),
        None => plan_err!(
            "{function} is missing argument {}: call it as {signature}",
            index + 1
        ),
    }
}

/// Fails when more than `max` arguments were given.
pub(crate) fn at_most(args: &[Expr], max: usize, function: &str, signature: &str) -> DFResult<()> {
    if args.len() > max {
        return plan_err!(
            "{function} takes at most {max} argument(s), got {}: call it as {signature}",
            args.len()
        );
    }
    Ok(())
}
