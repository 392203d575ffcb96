//! What icestage statements and table functions do, as one command table.
//!
//! Each operation is a request type with its `run` beside it (see
//! [`Operation`]); [`commands!`] lists them once and derives the
//! [`Command`] enum, its name, schema, execution and `EXPLAIN` text from
//! that list. The statement parser, the table-function twins and the HTTP
//! service build commands, and the planner runs them, so every front end
//! shares one path.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use crate::credentials::vend::VendCredentials;
use crate::download::create::CreateDownload;
use crate::download::status::{DropDownload, ListDownloads, ShowDownload, WaitDownload};
use crate::error::Result;
use crate::ingest::copy_into::{CopyInto, CopyRejects};
use crate::pipe::CreatePipe;
use crate::pipe::alter::AlterPipe;
use crate::pipe::drop::DropPipe;
use crate::pipe::run::RunPipe;
use crate::pipe::status::{ListPipes, ShowPipe};
pub(crate) use crate::session::CommandContext;
use crate::session::expire::ExpireStaging;
use crate::session::operation::{Operation, Outcome};
use crate::tables::ddl::{CreateNamespace, CreateTable};
use crate::tables::expire::ExpireSnapshots;
use crate::tables::maintain::{RemoveOrphanFiles, RewriteDataFiles, RewriteManifests};
use crate::tables::rules::{AddConstraint, DropConstraint, ListConstraints};
use crate::upload::abort::AbortUpload;
use crate::upload::create::CreateUpload;
use crate::upload::promote::PromoteUpload;
use crate::upload::publish::PublishUpload;
use crate::upload::status::{ListUploads, ShowUpload, UploadFindings};

/// Declares [`Command`], one variant per operation type, and what it
/// derives from the operations: `name`, `schema`, `execute`, `Display` and
/// a `From` for each request.
macro_rules! commands {
    ($($operation:ident),* $(,)?) => {
        /// One icestage operation, its arguments parsed and checked.
        #[derive(Debug, Clone)]
        pub(crate) enum Command {
            $(
                #[doc = concat!("[`", stringify!($operation), "`]")]
                $operation(Arc<$operation>),
            )*
        }

        impl Command {
            /// The name `EXPLAIN` shows.
            pub(crate) fn name(&self) -> &'static str {
                match self {
                    $(Command::$operation(_) => <$operation as Operation>::NAME,)*
                }
            }

            /// The columns of the command's result: those of its typed outcome.
            pub(crate) fn schema(&self) -> SchemaRef {
                match self {
                    $(Command::$operation(operation) => operation.schema(),)*
                }
            }

            /// What `EXPLAIN` shows after the name: the arguments.
            pub(crate) fn detail(&self) -> String {
                match self {
                    $(Command::$operation(operation) => operation.to_string(),)*
                }
            }

            /// Runs the command: the operation answers its typed outcome,
            /// which becomes the result batch here.
            pub(crate) async fn execute(&self, ctx: CommandContext) -> Result<RecordBatch> {
                match self {
                    $(Command::$operation(operation) => {
                        operation.run(&ctx).await?.into_batch(operation.schema())
                    })*
                }
            }
        }

        $(
            impl From<$operation> for Command {
                fn from(operation: $operation) -> Self {
                    Command::$operation(Arc::new(operation))
                }
            }
        )*
    };
}

commands! {
    CreateUpload,
    PromoteUpload,
    PublishUpload,
    UploadFindings,
    VendCredentials,
    AddConstraint,
    DropConstraint,
    ListConstraints,
    CopyInto,
    CopyRejects,
    CreateDownload,
    ShowDownload,
    ListDownloads,
    WaitDownload,
    DropDownload,
    CreatePipe,
    RunPipe,
    AlterPipe,
    DropPipe,
    ListPipes,
    ShowPipe,
    AbortUpload,
    ExpireStaging,
    ExpireSnapshots,
    RewriteManifests,
    RewriteDataFiles,
    RemoveOrphanFiles,
    ShowUpload,
    ListUploads,
    CreateNamespace,
    CreateTable,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.detail() {
            detail if detail.is_empty() => f.write_str(self.name()),
            detail => write!(f, "{}: {detail}", self.name()),
        }
    }
}
