//! What icestage statements and table functions do, as one command enum.
//!
//! A [`Command`] knows its name, its result schema and how to execute; the
//! statement parser, the table-function twins and the HTTP service all build
//! commands, and the planner runs them, so every front end shares one path.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use iceberg::{NamespaceIdent, TableIdent};

use crate::config::Ttl;
use crate::credentials::AccessMode;
use crate::credentials::vend::SessionCredentials;
use crate::download::DownloadId;
use crate::download::create::{CreateDownload, DownloadOpened};
use crate::download::status::{DownloadDropped, DownloadStatus};
use crate::error::Result;
use crate::expiry::{ExpireOptions, SnapshotsExpired, StagingExpired};
use crate::ingest::copy_into::{CopyReport, Validation};
use crate::ingest::rejects::{CopyError, CopyPreview, CopyReject};
use crate::ingest::{SourceOptions, ValidationMode};
use crate::pipe;
use crate::pipe::run::PipeRun;
use crate::pipe::{CreatePipe, PipeName, PipeState, PipeStatus};
use crate::rows::ResultRow;
pub(crate) use crate::session::CommandContext;
use crate::tables::ddl::CreateTable;
use crate::tables::maintain::{
    DataFilesRewritten, ManifestsRewritten, OrphanFilesRemoved, OrphanOptions, RewriteDataOptions,
};
use crate::tables::rules::{Rule, TableConstraint};
use crate::upload;
use crate::upload::UploadId;
use crate::upload::abort::UploadAborted;
use crate::upload::create::{UploadOpened, UploadOptions};
use crate::upload::promote::{PromoteMode, PromoteOptions, Promotion};
use crate::upload::publish::Published;
use crate::upload::status::{UploadFinding, UploadStatus};

/// One icestage operation, its arguments parsed and checked.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    /// `CREATE UPLOAD FOR <table> [WITH (...)]`
    CreateUpload {
        catalog: String,
        target: TableIdent,
        options: UploadOptions,
    },
    /// `PROMOTE UPLOAD '<id>' [WITH (dry_run = true)]`; `plan` describes
    /// the validation for EXPLAIN (filled in only when explaining).
    PromoteUpload {
        id: UploadId,
        options: PromoteOptions,
        plan: Vec<String>,
    },
    /// `PUBLISH UPLOAD '<id>'`
    PublishUpload { id: UploadId },
    /// `upload_findings('<id>')`
    UploadFindings { id: UploadId },
    /// `vend_credentials('<id>' [, mode] [, duration])`; the id is an
    /// upload's or a download's (checked to have an id's shape).
    VendCredentials {
        id: String,
        mode: Option<AccessMode>,
        duration: Option<Ttl>,
    },
    /// `ALTER TABLE <t> ADD CONSTRAINT ...`
    AddConstraint {
        catalog: String,
        table: TableIdent,
        rule: Rule,
    },
    /// `ALTER TABLE <t> DROP CONSTRAINT ...`
    DropConstraint {
        catalog: String,
        table: TableIdent,
        name: String,
        if_exists: bool,
    },
    /// `table_constraints('<table>')`
    ListConstraints { catalog: String, table: TableIdent },
    /// `CREATE DOWNLOAD [WITH (...)] AS <query>` (the query is the node's input)
    CreateDownload(Arc<CreateDownload>),
    /// `download_status('<id>')`
    DownloadStatus { id: DownloadId },
    /// `downloads()`
    ListDownloads,
    /// `wait_download('<id>' [, timeout])`
    WaitDownload {
        id: DownloadId,
        timeout: std::time::Duration,
    },
    /// `DROP DOWNLOAD '<id>'`
    DropDownload { id: DownloadId },
    /// `COPY INTO <table> FROM '<uri>' [WITH (...)]`; `written` keeps the
    /// options as written, for EXPLAIN.
    CopyInto {
        catalog: String,
        table: TableIdent,
        uri: String,
        options: Box<SourceOptions>,
        written: Vec<(String, String)>,
    },
    /// `copy_rejects('<table>')`
    CopyRejects { catalog: String, table: TableIdent },
    /// `CREATE PIPE ...`
    CreatePipe(Arc<CreatePipe>),
    /// `RUN PIPE <name>`
    RunPipe { name: PipeName },
    /// `ALTER PIPE <name> PAUSE | RESUME`
    AlterPipe { name: PipeName, state: PipeState },
    /// `DROP PIPE [IF EXISTS] <name>`
    DropPipe { name: PipeName, if_exists: bool },
    /// `pipes()`
    ListPipes,
    /// `pipe_status('<name>')`
    PipeStatus { name: PipeName },
    /// `ABORT UPLOAD '<id>'`
    AbortUpload { id: UploadId },
    /// `EXPIRE STAGING`
    ExpireStaging,
    /// `REWRITE MANIFESTS <table>`
    RewriteManifests { catalog: String, table: TableIdent },
    /// `REWRITE DATA FILES <table> [WITH (...)]`
    RewriteDataFiles {
        catalog: String,
        table: TableIdent,
        options: RewriteDataOptions,
    },
    /// `REMOVE ORPHAN FILES <table> [WITH (...)]`
    RemoveOrphanFiles {
        catalog: String,
        table: TableIdent,
        options: OrphanOptions,
    },
    /// `EXPIRE SNAPSHOTS <table> [WITH (...)]`
    ExpireSnapshots {
        catalog: String,
        table: TableIdent,
        options: ExpireOptions,
    },
    /// `upload_status('<id>')`
    UploadStatus { id: UploadId },
    /// `uploads()`
    ListUploads,
    /// `CREATE NAMESPACE` / `CREATE SCHEMA` on an Iceberg catalog
    CreateNamespace {
        catalog: String,
        namespace: NamespaceIdent,
        if_not_exists: bool,
    },
    /// `CREATE TABLE` (and `CREATE TABLE ... AS SELECT`) on an Iceberg catalog
    CreateTable(Arc<CreateTable>),
}

impl Command {
    /// The name `EXPLAIN` shows.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Command::CreateUpload { .. } => "CreateUpload",
            Command::PromoteUpload { .. } => "PromoteUpload",
            Command::PublishUpload { .. } => "PublishUpload",
            Command::UploadFindings { .. } => "UploadFindings",
            Command::VendCredentials { .. } => "VendCredentials",
            Command::AddConstraint { .. } => "AddConstraint",
            Command::DropConstraint { .. } => "DropConstraint",
            Command::ListConstraints { .. } => "ListConstraints",
            Command::CopyInto { .. } => "CopyInto",
            Command::CopyRejects { .. } => "CopyRejects",
            Command::CreateDownload(_) => "CreateDownload",
            Command::DownloadStatus { .. } => "DownloadStatus",
            Command::ListDownloads => "ListDownloads",
            Command::WaitDownload { .. } => "WaitDownload",
            Command::DropDownload { .. } => "DropDownload",
            Command::CreatePipe(_) => "CreatePipe",
            Command::RunPipe { .. } => "RunPipe",
            Command::AlterPipe { .. } => "AlterPipe",
            Command::DropPipe { .. } => "DropPipe",
            Command::ListPipes => "ListPipes",
            Command::PipeStatus { .. } => "PipeStatus",
            Command::AbortUpload { .. } => "AbortUpload",
            Command::ExpireStaging => "ExpireStaging",
            Command::ExpireSnapshots { .. } => "ExpireSnapshots",
            Command::RewriteManifests { .. } => "RewriteManifests",
            Command::RewriteDataFiles { .. } => "RewriteDataFiles",
            Command::RemoveOrphanFiles { .. } => "RemoveOrphanFiles",
            Command::UploadStatus { .. } => "UploadStatus",
            Command::ListUploads => "ListUploads",
            Command::CreateNamespace { .. } => "CreateNamespace",
            Command::CreateTable(_) => "CreateIcebergTable",
        }
    }

    /// The columns of the command's result: those of its typed outcome.
    pub(crate) fn schema(&self) -> SchemaRef {
        match self {
            Command::CreateUpload { .. } => UploadOpened::schema(),
            Command::PromoteUpload { .. } => Promotion::schema(),
            Command::PublishUpload { .. } => Published::schema(),
            Command::AbortUpload { .. } => UploadAborted::schema(),
            Command::ExpireStaging => StagingExpired::schema(),
            Command::ExpireSnapshots { .. } => SnapshotsExpired::schema(),
            Command::RewriteManifests { .. } => ManifestsRewritten::schema(),
            Command::RewriteDataFiles { .. } => DataFilesRewritten::schema(),
            Command::RemoveOrphanFiles { .. } => OrphanFilesRemoved::schema(),
            Command::UploadStatus { .. } | Command::ListUploads => UploadStatus::schema(),
            Command::UploadFindings { .. } => UploadFinding::schema(),
            Command::VendCredentials { .. } => SessionCredentials::schema(),
            Command::ListConstraints { .. } => TableConstraint::schema(),
            Command::CopyInto { options, .. } => match options.validation_mode {
                None => CopyReport::schema(),
                Some(ValidationMode::ReturnErrors) => CopyError::schema(),
                Some(ValidationMode::ReturnRows(_)) => CopyPreview::schema(),
            },
            Command::CopyRejects { .. } => CopyReject::schema(),
            Command::CreatePipe(_)
            | Command::AlterPipe { .. }
            | Command::ListPipes
            | Command::PipeStatus { .. } => PipeStatus::schema(),
            Command::RunPipe { .. } => PipeRun::schema(),
            Command::DropPipe { .. } => Arc::new(Schema::empty()),
            Command::CreateDownload(_) => DownloadOpened::schema(),
            Command::DownloadStatus { .. }
            | Command::ListDownloads
            | Command::WaitDownload { .. } => DownloadStatus::schema(),
            Command::DropDownload { .. } => DownloadDropped::schema(),
            Command::AddConstraint { .. } | Command::DropConstraint { .. } => {
                Arc::new(Schema::empty())
            }
            Command::CreateTable(create) if create.with_query => {
                Arc::new(Schema::new(vec![Field::new(
                    "count",
                    DataType::UInt64,
                    false,
                )]))
            }
            Command::CreateNamespace { .. } | Command::CreateTable(_) => Arc::new(Schema::empty()),
        }
    }

    /// Runs the command: each operation answers its typed outcome, which
    /// becomes the result batch here.
    pub(crate) async fn execute(&self, ctx: CommandContext) -> Result<RecordBatch> {
        fn one<T: ResultRow>(outcome: T) -> Result<RecordBatch> {
            T::to_batch(&[outcome])
        }
        match self {
            Command::CreateUpload {
                catalog,
                target,
                options,
            } => one(upload::create::create_upload(&ctx, catalog, target, options).await?),
            Command::PromoteUpload { id, options, .. } => {
                one(upload::promote::promote_upload(&ctx, id, options).await?)
            }
            Command::PublishUpload { id } => {
                one(upload::publish::publish_upload(&ctx.icestage, id).await?)
            }
            Command::UploadFindings { id } => {
                UploadFinding::to_batch(&upload::status::upload_findings(&ctx, id).await?)
            }
            Command::VendCredentials { id, mode, duration } => one(
                crate::credentials::vend::vend_credentials(&ctx, id, *mode, duration.as_ref())
                    .await?,
            ),
            Command::AddConstraint {
                catalog,
                table,
                rule,
            } => {
                crate::tables::rules::add_constraint(&ctx, catalog, table, rule).await?;
                Ok(RecordBatch::new_empty(self.schema()))
            }
            Command::DropConstraint {
                catalog,
                table,
                name,
                if_exists,
            } => {
                crate::tables::rules::drop_constraint(&ctx, catalog, table, name, *if_exists)
                    .await?;
                Ok(RecordBatch::new_empty(self.schema()))
            }
            Command::ListConstraints { catalog, table } => TableConstraint::to_batch(
                &crate::tables::rules::list_constraints(&ctx, catalog, table).await?,
            ),
            Command::CreateDownload(spec) => {
                one(crate::download::create::create_download(&ctx, spec).await?)
            }
            Command::DownloadStatus { id } => {
                one(crate::download::status::download_status(&ctx, id).await?)
            }
            Command::ListDownloads => {
                DownloadStatus::to_batch(&crate::download::status::list(&ctx).await?)
            }
            Command::WaitDownload { id, timeout } => {
                one(crate::download::status::wait_download(&ctx, id, *timeout).await?)
            }
            Command::DropDownload { id } => {
                one(crate::download::status::drop_download(&ctx, id).await?)
            }
            Command::CopyInto {
                catalog,
                table,
                uri,
                options,
                ..
            } => {
                let run =
                    crate::ingest::copy_into::copy_into(&ctx, catalog, table, uri, options).await?;
                match run.validation {
                    None => one(run.report),
                    Some(Validation::Errors(errors)) => CopyError::to_batch(&errors),
                    Some(Validation::Rows(rows)) => CopyPreview::to_batch(&rows),
                }
            }
            Command::CopyRejects { catalog, table } => CopyReject::to_batch(
                &crate::ingest::copy_into::rejects_of(&ctx, catalog, table).await?,
            ),
            Command::CreatePipe(create) => one(pipe::create::create(&ctx.icestage, create).await?),
            Command::RunPipe { name } => one(pipe::run::run_pipe(
                &ctx.icestage,
                name,
                crate::cluster::of_options(&ctx.options)?.as_ref(),
            )
            .await?),
            Command::AlterPipe { name, state } => {
                one(pipe::alter::set_state(&ctx.icestage, name, *state).await?)
            }
            Command::DropPipe { name, if_exists } => {
                pipe::drop::drop_pipe(&ctx.icestage, name, *if_exists).await?;
                Ok(RecordBatch::new_empty(self.schema()))
            }
            Command::ListPipes => {
                PipeStatus::to_batch(&pipe::status::statuses(&ctx.icestage).await?)
            }
            Command::PipeStatus { name } => one(pipe::status::status(&ctx.icestage, name).await?),
            Command::AbortUpload { id } => one(upload::abort::abort_upload(&ctx, id).await?),
            Command::ExpireStaging => one(crate::expiry::expire_staging(&ctx).await?),
            Command::ExpireSnapshots {
                catalog,
                table,
                options,
            } => one(crate::expiry::expire_snapshots(&ctx, catalog, table, options).await?),
            Command::RewriteManifests { catalog, table } => {
                one(crate::tables::maintain::rewrite_manifests(&ctx, catalog, table).await?)
            }
            Command::RewriteDataFiles {
                catalog,
                table,
                options,
            } => one(
                crate::tables::maintain::rewrite_data_files(&ctx, catalog, table, options).await?,
            ),
            Command::RemoveOrphanFiles {
                catalog,
                table,
                options,
            } => one(
                crate::tables::maintain::remove_orphan_files(&ctx, catalog, table, options).await?,
            ),
            Command::UploadStatus { id } => one(upload::status::upload_status(&ctx, id).await?),
            Command::ListUploads => {
                UploadStatus::to_batch(&upload::status::list_uploads(&ctx).await?)
            }
            Command::CreateNamespace {
                catalog,
                namespace,
                if_not_exists,
            } => {
                crate::tables::ddl::create_namespace(&ctx, catalog, namespace, *if_not_exists)
                    .await?;
                Ok(RecordBatch::new_empty(self.schema()))
            }
            Command::CreateTable(create) => crate::tables::ddl::create_table(&ctx, create).await,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::CreateUpload {
                catalog,
                target,
                options,
            } => {
                write!(f, "CreateUpload: target={catalog}.{target}")?;
                if let Some(ttl) = &options.ttl {
                    write!(f, ", ttl={ttl}")?;
                }
                if let Some(owner) = &options.owner {
                    write!(f, ", owner={owner}")?;
                }
                Ok(())
            }
            Command::PromoteUpload { id, options, plan } => {
                write!(f, "PromoteUpload: upload={id}")?;
                if let Some(branch) = &options.to_branch {
                    write!(f, ", to_branch={branch}")?;
                }
                if options.tag {
                    write!(f, ", tag")?;
                }
                if options.dry_run {
                    write!(f, ", dry_run")?;
                }
                match &options.mode {
                    PromoteMode::Append => {}
                    PromoteMode::Upsert { key: Some(key) } => {
                        write!(f, ", mode=upsert, key=({})", key.join(", "))?
                    }
                    other => write!(f, ", mode={}", other.name())?,
                }
                write!(f, ", verify={}", options.verify.as_str())?;
                for step in plan {
                    write!(f, "\n  {step}")?;
                }
                Ok(())
            }
            Command::PublishUpload { id } => write!(f, "PublishUpload: upload={id}"),
            Command::UploadFindings { id } => write!(f, "UploadFindings: upload={id}"),
            Command::VendCredentials { id, mode, duration } => write!(
                f,
                "VendCredentials: upload={id}, mode={}, duration={}",
                mode.map_or("write", AccessMode::as_str),
                duration.as_ref().map_or("1h", Ttl::as_str)
            ),
            Command::AddConstraint {
                catalog,
                table,
                rule,
            } => write!(
                f,
                "AddConstraint: {catalog}.{table} {} {}",
                rule.name(),
                rule.definition()
            ),
            Command::DropConstraint {
                catalog,
                table,
                name,
                if_exists,
            } => write!(
                f,
                "DropConstraint: {catalog}.{table} {name}{}",
                if *if_exists { ", if_exists" } else { "" }
            ),
            Command::ListConstraints { catalog, table } => {
                write!(f, "ListConstraints: {catalog}.{table}")
            }
            Command::CreateDownload(spec) => {
                write!(f, "CreateDownload: catalog={}, sources=[", spec.catalog)?;
                let sources: Vec<String> = spec
                    .sources
                    .iter()
                    .map(|(t, s)| {
                        format!("{t}@{}", s.map_or("empty".to_string(), |s| s.to_string()))
                    })
                    .collect();
                write!(f, "{}]", sources.join(", "))?;
                if spec.options.wait {
                    write!(f, ", wait")?;
                }
                Ok(())
            }
            Command::DownloadStatus { id } => write!(f, "DownloadStatus: download={id}"),
            Command::ListDownloads => write!(f, "ListDownloads"),
            Command::WaitDownload { id, timeout } => {
                write!(
                    f,
                    "WaitDownload: download={id}, timeout={}s",
                    timeout.as_secs()
                )
            }
            Command::DropDownload { id } => write!(f, "DropDownload: download={id}"),
            Command::CopyInto {
                catalog,
                table,
                uri,
                written,
                ..
            } => {
                write!(f, "CopyInto: {catalog}.{table} from {uri}")?;
                for (key, value) in written {
                    let shown = if crate::secret::is_secret_key(key) {
                        "***"
                    } else {
                        value
                    };
                    write!(f, ", {key}={shown}")?;
                }
                Ok(())
            }
            Command::CopyRejects { catalog, table } => {
                write!(f, "CopyRejects: {catalog}.{table}")
            }
            Command::CreatePipe(create) => {
                write!(
                    f,
                    "CreatePipe: {} into {} from {}, interval={}",
                    create.name,
                    create.target,
                    create.uri,
                    crate::config::format_duration(create.options.interval)
                )?;
                if let Some(queue) = &create.options.notification_queue {
                    write!(f, ", notification_queue={queue}")?;
                }
                Ok(())
            }
            Command::RunPipe { name } => write!(f, "RunPipe: {name}"),
            Command::AlterPipe { name, state } => write!(f, "AlterPipe: {name} {state}"),
            Command::DropPipe { name, if_exists } => write!(
                f,
                "DropPipe: {name}{}",
                if *if_exists { ", if_exists" } else { "" }
            ),
            Command::ListPipes => write!(f, "ListPipes"),
            Command::PipeStatus { name } => write!(f, "PipeStatus: {name}"),
            Command::AbortUpload { id } => write!(f, "AbortUpload: upload={id}"),
            Command::ExpireStaging => write!(f, "ExpireStaging"),
            Command::RewriteManifests { catalog, table } => {
                write!(f, "RewriteManifests: {catalog}.{table}")
            }
            Command::RewriteDataFiles {
                catalog,
                table,
                options,
            } => write!(f, "RewriteDataFiles: {catalog}.{table}, {options:?}"),
            Command::RemoveOrphanFiles {
                catalog,
                table,
                options,
            } => write!(
                f,
                "RemoveOrphanFiles: {catalog}.{table}, older_than={}, dry_run={}",
                crate::config::format_duration(options.older_than),
                options.dry_run
            ),
            Command::ExpireSnapshots {
                catalog,
                table,
                options,
            } => write!(
                f,
                "ExpireSnapshots: {catalog}.{table}, older_than={}, retain_last={}",
                crate::config::format_duration(options.older_than),
                options.retain_last
            ),
            Command::UploadStatus { id } => write!(f, "UploadStatus: upload={id}"),
            Command::ListUploads => write!(f, "ListUploads"),
            Command::CreateNamespace {
                catalog,
                namespace,
                if_not_exists,
            } => write!(
                f,
                "CreateNamespace: {catalog}.{}{}",
                namespace.join("."),
                if *if_not_exists {
                    ", if_not_exists"
                } else {
                    ""
                }
            ),
            Command::CreateTable(create) => {
                write!(f, "CreateIcebergTable: {}.{}", create.catalog, create.ident)?;
                if let Some(spec) = &create.partition_spec {
                    let fields: Vec<String> = spec
                        .fields()
                        .iter()
                        .map(|p| format!("{}({})", p.transform, p.source_id))
                        .collect();
                    write!(f, ", partition=[{}]", fields.join(", "))?;
                }
                if create.if_not_exists {
                    write!(f, ", if_not_exists")?;
                }
                Ok(())
            }
        }
    }
}
