//! The typed Rust API: every icestage operation with typed arguments and a
//! typed outcome. The SQL statements, the table functions and the HTTP
//! service are thin layers over the same functions; an outcome's
//! [`ResultRow`](crate::ResultRow) gives the columns SQL shows for it.

use std::sync::Arc;
use std::time::Duration;

use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::execution::TaskContext;
use datafusion::prelude::SessionContext;

use crate::catalog::{Catalogs, TableName};
use crate::config::Ttl;
use crate::credentials::AccessMode;
use crate::credentials::vend::{SessionCredentials, VendCredentials};
use crate::download::DownloadId;
use crate::download::create::{DownloadOpened, DownloadOptions, plan_download};
use crate::download::status::{
    DownloadDropped, DownloadStatus, DropDownload, ListDownloads, ShowDownload, WaitDownload,
};
use crate::error::{Error, Result};
use crate::ingest::SourceOptions;
use crate::ingest::copy_into::{CopyInto, CopyReport};
use crate::pipe::alter::AlterPipe;
use crate::pipe::drop::DropPipe;
use crate::pipe::run::{PipeRun, RunPipe};
use crate::pipe::status::{ListPipes, ShowPipe};
use crate::pipe::{CreatePipe, PipeName, PipeOptions, PipeRunRecord, PipeState, PipeStatus};
use crate::session::CommandContext;
use crate::session::expire::{ExpireStaging, StagingExpired};
use crate::session::operation::Operation;
use crate::tables::expire::{ExpireOptions, ExpireSnapshots, SnapshotsExpired};
use crate::tables::maintain::{
    DataFilesRewritten, ManifestsRewritten, OrphanFilesRemoved, OrphanOptions, RemoveOrphanFiles,
    RewriteDataFiles, RewriteDataOptions, RewriteManifests,
};
use crate::tables::rules::{ListConstraints, TableConstraint};
use crate::upload::UploadId;
use crate::upload::abort::{AbortUpload, UploadAborted};
use crate::upload::create::{CreateUpload, UploadOpened, UploadOptions};
use crate::upload::promote::{PromoteOptions, PromoteUpload, Promotion, PromotionClaim};
use crate::upload::publish::{PublishUpload, Published};
use crate::upload::status::{ListUploads, ShowUpload, UploadFinding, UploadFindings, UploadStatus};

/// icestage's operations on a session that [`register`](crate::register)
/// prepared: the catalogs, the `icestage.*` options and the progress sink
/// are that session's. Cheap to clone; one per session is enough.
///
/// ```
/// # async fn example() -> icestage::Result<()> {
/// use datafusion::prelude::SessionContext;
/// use icestage::{IcestageConfig, Operations, PromoteOptions, UploadOptions, UploadState};
///
/// let warehouse = tempfile::tempdir()?;
/// let ctx = SessionContext::new();
/// icestage::register(&ctx, IcestageConfig::embedded(warehouse.path())?).await?;
/// icestage::sql(&ctx, "CREATE SCHEMA shop").await?.collect().await?;
/// icestage::sql(&ctx, "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)")
///     .await?
///     .collect()
///     .await?;
///
/// let ops = Operations::new(&ctx)?;
/// // Open an upload: a staging table the client writes with any Iceberg client.
/// let upload = ops.create_upload("shop.orders", UploadOptions::default()).await?;
/// assert_eq!(upload.state, UploadState::Open);
/// // (Here the client appends rows to `upload.staging_table`.)
/// let promotion = ops
///     .promote_upload(&upload.upload_id, PromoteOptions::default())
///     .await?;
/// assert_eq!(promotion.state, UploadState::Promoted);
/// let status = ops.upload_status(&upload.upload_id).await?;
/// assert_eq!(status.state, UploadState::Promoted);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(example()).unwrap();
/// ```
#[derive(Clone)]
pub struct Operations {
    ctx: SessionContext,
    icestage: Arc<Catalogs>,
}

impl std::fmt::Debug for Operations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operations")
            .field("session", &self.ctx.session_id())
            .finish()
    }
}

impl Operations {
    /// The operations of `ctx`; fails unless [`register`](crate::register)
    /// ran on it.
    pub fn new(ctx: &SessionContext) -> Result<Self> {
        let icestage = Catalogs::from_config(ctx.state().config())?;
        Ok(Self {
            ctx: ctx.clone(),
            icestage,
        })
    }

    /// The context one operation runs in: the session's options as they
    /// are now.
    fn context(&self) -> Result<CommandContext> {
        CommandContext::new(self.ctx.task_ctx())
    }

    /// `table` resolved against the session's default catalog: `ns.table`
    /// or `catalog.ns.table` as SQL reads it (a `&str`), or a
    /// `TableReference` taken as it is.
    fn table(&self, table: impl Into<TableReference>) -> Result<TableName> {
        self.icestage.name_of(&self.ctx.state(), &table.into())
    }

    /// Runs `operation` as its statement would in this session.
    async fn run<O: Operation>(&self, operation: O) -> Result<O::Outcome> {
        operation.run(&self.context()?).await
    }

    /// `CREATE UPLOAD FOR <table>`: opens an upload session.
    /// `table` is `ns.table` or `catalog.ns.table` as SQL reads it (a
    /// `&str`), or a `TableReference` taken as it is.
    pub async fn create_upload(
        &self,
        table: impl Into<TableReference>,
        options: UploadOptions,
    ) -> Result<UploadOpened> {
        self.run(CreateUpload {
            target: self.table(table)?,
            options,
        })
        .await
    }

    /// `PROMOTE UPLOAD`: validates the staged rows and commits them into the
    /// target exactly once (or, with `dry_run`, only validates). A promotion
    /// that finds problems commits nothing and answers
    /// [`Error::ValidationFailed`](crate::Error::ValidationFailed) with them;
    /// the session is then `failed` and its findings are kept. The claim's
    /// lease and the cluster are the session's, as for the statement.
    pub async fn promote_upload(
        &self,
        id: &UploadId,
        options: PromoteOptions,
    ) -> Result<Promotion> {
        self.promote_claimed_upload(id, options, None).await
    }

    /// Claims upload `id`'s promotion now for
    /// [`Self::promote_claimed_upload`] to run later (the service answers
    /// `complete` first): from here on the upload reads `promoting`
    /// everywhere. `None` when there is nothing to claim; what would stop
    /// the promotion before its claim is the error (see
    /// [`promote::claim`](crate::upload::promote::claim)).
    pub(crate) async fn claim_promotion(
        &self,
        id: &UploadId,
        options: &PromoteOptions,
    ) -> Result<Option<PromotionClaim>> {
        let lease = self.context()?.options.promotion_lease.duration();
        crate::upload::promote::claim(&self.icestage, id, options, lease).await
    }

    /// Upload `id`'s promotion, claimed again with the options it was
    /// claimed with, when the process promoting it stopped before it
    /// finished (see [`promote::stalled`](crate::upload::promote::stalled)).
    pub(crate) async fn stalled_promotion(
        &self,
        id: &UploadId,
    ) -> Result<Option<(PromoteOptions, PromotionClaim)>> {
        let lease = self.context()?.options.promotion_lease.duration();
        crate::upload::promote::stalled(&self.icestage, id, lease).await
    }

    /// [`Self::promote_upload`], holding `claim` (taken by
    /// [`Self::claim_promotion`]) as its own when there is one.
    pub(crate) async fn promote_claimed_upload(
        &self,
        id: &UploadId,
        options: PromoteOptions,
        claim: Option<PromotionClaim>,
    ) -> Result<Promotion> {
        self.run(PromoteUpload {
            claim,
            ..PromoteUpload::new(id.clone(), options)
        })
        .await
    }

    /// Whether the mode and branch of `options` can promote upload `id` into
    /// its target: what `PROMOTE UPLOAD ... WITH (mode = ..., to_branch =
    /// ...)` refuses before it claims anything (a target without partitions
    /// for `replace_partitions`, an upsert key that is missing or
    /// ambiguous, a branch name icestage does not write).
    pub async fn check_promote_mode(&self, id: &UploadId, options: &PromoteOptions) -> Result<()> {
        crate::upload::promote::check_mode(&self.icestage, id, options).await
    }

    /// `PUBLISH UPLOAD`: puts the rows of an upload promoted `WITH
    /// (to_branch = ...)` on the target's `main`, exactly once, after
    /// checking the target's rules again against `main` as it is then.
    pub async fn publish_upload(&self, id: &UploadId) -> Result<Published> {
        self.run(PublishUpload { id: id.clone() }).await
    }

    /// A token for icestage's REST catalog (`icestage serve`'s `/iceberg`)
    /// that reaches upload `id`'s staging table only, to append while the
    /// upload is open; issuing one revokes the one before. Only its SHA-256
    /// is kept, on the staging table.
    pub async fn upload_access_token(&self, id: &UploadId) -> Result<String> {
        crate::upload::access::issue_access_token(&self.icestage, id).await
    }

    /// `ABORT UPLOAD`: discards the staged rows.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # for statement in ["CREATE SCHEMA shop", "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)"] {
    /// #     icestage::sql(&ctx, statement).await?.collect().await?;
    /// # }
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// use icestage::{UploadOptions, UploadState};
    ///
    /// let upload = ops.create_upload("shop.orders", UploadOptions::default()).await?;
    /// let aborted = ops.abort_upload(&upload.upload_id).await?;
    /// assert_eq!(aborted.state, UploadState::Aborted);
    /// // The upload log keeps its end.
    /// assert_eq!(ops.upload_status(&upload.upload_id).await?.state, UploadState::Aborted);
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn abort_upload(&self, id: &UploadId) -> Result<UploadAborted> {
        self.run(AbortUpload { id: id.clone() }).await
    }

    /// `upload_status(id)`: where one upload stands.
    pub async fn upload_status(&self, id: &UploadId) -> Result<UploadStatus> {
        self.run(ShowUpload { id: id.clone() }).await
    }

    /// `uploads()`: every upload the catalogs know, oldest first.
    pub async fn uploads(&self) -> Result<Vec<UploadStatus>> {
        self.run(ListUploads).await
    }

    /// The open uploads and those ended since `since`: what changed, read
    /// without the log's older files (what the webhook dispatcher polls).
    pub async fn uploads_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<UploadStatus>> {
        crate::upload::status::list_uploads_since(&self.context()?, Some(since)).await
    }

    /// `upload_findings(id)`: the rule violations the last validation found.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # for statement in ["CREATE SCHEMA shop", "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)"] {
    /// #     icestage::sql(&ctx, statement).await?.collect().await?;
    /// # }
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// use icestage::{PromoteOptions, UploadOptions, UploadState};
    ///
    /// icestage::sql(&ctx, "ALTER TABLE shop.orders ADD CONSTRAINT positive CHECK (cents > 0)")
    ///     .await?
    ///     .collect()
    ///     .await?;
    /// assert_eq!(ops.table_constraints("shop.orders").await?[0].constraint_name, "positive");
    /// let upload = ops.create_upload("shop.orders", UploadOptions::default()).await?;
    /// let insert = format!("INSERT INTO {} VALUES (1, 250), (2, -5)", upload.staging_table);
    /// icestage::sql(&ctx, &insert).await?.collect().await?;
    ///
    /// // A promotion that finds violations commits nothing and fails, naming them.
    /// let failed = ops.promote_upload(&upload.upload_id, PromoteOptions::default()).await;
    /// assert!(matches!(failed, Err(icestage::Error::ValidationFailed { .. })));
    /// let status = ops.upload_status(&upload.upload_id).await?;
    /// assert_eq!((status.state, status.findings), (UploadState::Failed, Some(1)));
    /// let findings = ops.upload_findings(&upload.upload_id).await?;
    /// assert_eq!((findings[0].rule.as_str(), findings[0].kind.as_str()), ("positive", "check"));
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn upload_findings(&self, id: &UploadId) -> Result<Vec<UploadFinding>> {
        self.run(UploadFindings { id: id.clone() }).await
    }

    /// `vend_credentials(id, mode, duration)`: credentials that reach only
    /// the table of upload or download `id` (write for an upload's staging
    /// table, read for a download's table, when `mode` is `None`).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # for statement in ["CREATE SCHEMA shop", "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)"] {
    /// #     icestage::sql(&ctx, statement).await?.collect().await?;
    /// # }
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// use icestage::{AccessMode, UploadOptions};
    ///
    /// let upload = ops.create_upload("shop.orders", UploadOptions::default()).await?;
    /// let vended = ops.vend_credentials(upload.upload_id.as_str(), None, None).await?;
    /// assert_eq!(vended.mode, AccessMode::Write);
    /// assert_eq!(vended.table_name, upload.staging_table);
    /// // The embedded catalog is a local file: the connection alone reaches it.
    /// assert!(vended.access_key_id.is_none());
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn vend_credentials(
        &self,
        id: &str,
        mode: Option<AccessMode>,
        duration: Option<Ttl>,
    ) -> Result<SessionCredentials> {
        let id = id.to_string();
        self.run(VendCredentials { id, mode, duration }).await
    }

    /// `CREATE DOWNLOAD AS <query>`: a table holding what `query` answers,
    /// read from one snapshot of each Iceberg table it reads. Build the query
    /// with DataFusion's `DataFrame` API (`ctx.table(..)?.filter(..)`).
    pub async fn create_download(
        &self,
        query: DataFrame,
        options: DownloadOptions,
    ) -> Result<DownloadOpened> {
        let (state, plan) = query.into_parts();
        let described = plan.display_indent().to_string();
        let (spec, input) = plan_download(&state, &self.icestage, plan, described, options).await?;
        let input = state.create_physical_plan(&input).await?;
        let mut ctx = CommandContext::new(Arc::new(TaskContext::from(&state)))?;
        ctx.input = Some(input);
        ctx.session = Some(Arc::new(state));
        spec.run(&ctx).await
    }

    /// A read-only token for icestage's REST catalog that reaches download
    /// `id`'s table only, once it is ready; issuing one revokes the one
    /// before.
    pub async fn download_access_token(&self, id: &DownloadId) -> Result<String> {
        crate::download::access::issue_access_token(&self.icestage, id).await
    }

    /// `download_status(id)`: where one download stands.
    pub async fn download_status(&self, id: &DownloadId) -> Result<DownloadStatus> {
        self.run(ShowDownload { id: id.clone() }).await
    }

    /// `downloads()`: every download the catalogs know, oldest first.
    pub async fn downloads(&self) -> Result<Vec<DownloadStatus>> {
        self.run(ListDownloads).await
    }

    /// The live downloads and those ended since `since`.
    pub async fn downloads_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<DownloadStatus>> {
        crate::download::status::list_since(&self.context()?, Some(since)).await
    }

    /// `wait_download(id, timeout)`: the download's status once it is no
    /// longer pending; an error after `timeout`.
    pub async fn wait_download(
        &self,
        id: &DownloadId,
        timeout: Duration,
    ) -> Result<DownloadStatus> {
        self.run(WaitDownload {
            id: id.clone(),
            timeout,
        })
        .await
    }

    /// `DROP DOWNLOAD`: removes the download's table.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # for statement in ["CREATE SCHEMA shop", "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)"] {
    /// #     icestage::sql(&ctx, statement).await?.collect().await?;
    /// # }
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// use std::time::Duration;
    /// use icestage::{DownloadOptions, DownloadState};
    ///
    /// let query = ctx.table("shop.orders").await?;
    /// let download = ops.create_download(query, DownloadOptions::default()).await?;
    /// let ready = ops.wait_download(&download.download_id, Duration::from_secs(60)).await?;
    /// assert_eq!((ready.state, ready.rows), (DownloadState::Ready, Some(0)));
    /// let dropped = ops.drop_download(&download.download_id).await?;
    /// assert_eq!(dropped.state, DownloadState::Dropped);
    /// assert_eq!(ops.downloads().await?[0].state, DownloadState::Dropped);
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn drop_download(&self, id: &DownloadId) -> Result<DownloadDropped> {
        self.run(DropDownload { id: id.clone() }).await
    }

    /// `COPY INTO <table> FROM <uri>`: loads the files under an S3 prefix
    /// (or a local directory) that were not loaded before.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # for statement in ["CREATE SCHEMA shop", "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)"] {
    /// #     icestage::sql(&ctx, statement).await?.collect().await?;
    /// # }
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// # let files = tempfile::tempdir()?;
    /// # std::fs::write(files.path().join("a.csv"), "id,cents\n1,250\n2,990\n")?;
    /// # let prefix = format!("{}/", files.path().display());
    /// use icestage::SourceOptions;
    ///
    /// // A directory of CSV files (an S3 prefix reads the same).
    /// let report = ops.copy_into("shop.orders", &prefix, SourceOptions::default()).await?;
    /// assert_eq!((report.files_loaded, report.rows), (1, 2));
    /// // Each file lands once.
    /// let again = ops.copy_into("shop.orders", &prefix, SourceOptions::default()).await?;
    /// assert_eq!((again.files_loaded, again.files_skipped), (0, 1));
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn copy_into(
        &self,
        table: impl Into<TableReference>,
        uri: &str,
        options: SourceOptions,
    ) -> Result<CopyReport> {
        if options.validation_mode.is_some() {
            return Err(Error::invalid(
                "copy_into loads: to check files without loading them, use validate_copy"
                    .to_string(),
            ));
        }
        Ok(self
            .run(copy(self.table(table)?, uri, options))
            .await?
            .report)
    }

    /// `COPY INTO ... WITH (validation_mode = 'return_errors')`: reads the
    /// files as a load with `options` would and answers every error it
    /// finds (malformed rows, files that cannot be loaded); commits
    /// nothing, neither rows nor copy-log entries.
    pub async fn validate_copy(
        &self,
        table: impl Into<TableReference>,
        uri: &str,
        mut options: SourceOptions,
    ) -> Result<Vec<crate::ingest::rejects::CopyError>> {
        options.validation_mode = Some(crate::ingest::ValidationMode::ReturnErrors);
        let run = self.run(copy(self.table(table)?, uri, options)).await?;
        Ok(match run.validation {
            Some(crate::ingest::copy_into::Validation::Errors(errors)) => errors,
            _ => vec![],
        })
    }

    /// `EXPIRE STAGING`: removes the sessions whose time ran out.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # for statement in ["CREATE SCHEMA shop", "CREATE TABLE shop.orders (id BIGINT NOT NULL, cents BIGINT)"] {
    /// #     icestage::sql(&ctx, statement).await?.collect().await?;
    /// # }
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// use std::time::Duration;
    /// use icestage::{Ttl, UploadOptions, UploadState};
    ///
    /// let brief = UploadOptions {
    ///     ttl: Some(Ttl::from(Duration::from_secs(1))),
    ///     ..UploadOptions::default()
    /// };
    /// let upload = ops.create_upload("shop.orders", brief).await?;
    /// tokio::time::sleep(Duration::from_millis(1500)).await;
    /// assert_eq!(ops.expire_staging().await?.tables_removed, 1);
    /// assert_eq!(ops.upload_status(&upload.upload_id).await?.state, UploadState::Expired);
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn expire_staging(&self) -> Result<StagingExpired> {
        self.run(ExpireStaging).await
    }

    /// `EXPIRE SNAPSHOTS <table>`: removes old snapshots from `table`'s
    /// metadata, keeping the exactly-once evidence of unfinished
    /// promotions and copies.
    pub async fn expire_snapshots(
        &self,
        table: impl Into<TableReference>,
        options: ExpireOptions,
    ) -> Result<SnapshotsExpired> {
        self.run(ExpireSnapshots {
            table: self.table(table)?,
            options,
        })
        .await
    }

    /// `REWRITE MANIFESTS <table>`: merges the table's data manifests into
    /// one per partition spec (no row changes).
    pub async fn rewrite_manifests(
        &self,
        table: impl Into<TableReference>,
    ) -> Result<ManifestsRewritten> {
        self.run(RewriteManifests {
            table: self.table(table)?,
        })
        .await
    }

    /// `REWRITE DATA FILES <table>`: bin-packs each partition's small data
    /// files into files of the target size, in one `replace` snapshot that
    /// changes no row; promotions that land meanwhile are committed around.
    pub async fn rewrite_data_files(
        &self,
        table: impl Into<TableReference>,
        options: RewriteDataOptions,
    ) -> Result<DataFilesRewritten> {
        self.run(RewriteDataFiles {
            table: self.table(table)?,
            options,
        })
        .await
    }

    /// `REMOVE ORPHAN FILES <table>`: deletes the files under the table's
    /// location that nothing references and that are older than
    /// `options.older_than` (or, with `dry_run`, only finds them).
    pub async fn remove_orphan_files(
        &self,
        table: impl Into<TableReference>,
        options: OrphanOptions,
    ) -> Result<OrphanFilesRemoved> {
        self.run(RemoveOrphanFiles {
            table: self.table(table)?,
            options,
        })
        .await
    }

    /// `table_constraints(table)`: the rules promotions into `table` check.
    pub async fn table_constraints(
        &self,
        table: impl Into<TableReference>,
    ) -> Result<Vec<TableConstraint>> {
        self.run(ListConstraints {
            table: self.table(table)?,
        })
        .await
    }

    /// `CREATE PIPE <name> [WITH (...)] AS COPY INTO <table> FROM '<uri>'
    /// [WITH (copy_options)]`: a pipe that keeps loading what is new under
    /// `uri` into `table`, in `table`'s catalog. `copy_options` are
    /// `COPY INTO`'s (`format`, `header`, `region`, ...), without secrets.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir()?;
    /// # let ctx = datafusion::prelude::SessionContext::new();
    /// # icestage::register(&ctx, icestage::IcestageConfig::embedded(dir.path())?).await?;
    /// # icestage::sql(&ctx, "CREATE SCHEMA shop").await?.collect().await?;
    /// # let ops = icestage::Operations::new(&ctx)?;
    /// # let landing = tempfile::tempdir()?;
    /// # std::fs::write(landing.path().join("1.csv"), "id,cents\n1,250\n")?;
    /// # let prefix = format!("{}/", landing.path().display());
    /// use icestage::{PipeName, PipeOptions};
    ///
    /// let name = PipeName::parse("orders")?;
    /// ops.create_pipe(&name, "shop.orders", &prefix, vec![], PipeOptions::default()).await?;
    /// let run = ops.run_pipe(&name).await?;
    /// assert_eq!((run.files_loaded, run.rows), (1, 1));
    /// // What is loaded is not loaded again.
    /// assert_eq!(ops.run_pipe(&name).await?.files_loaded, 0);
    /// std::fs::write(landing.path().join("2.csv"), "id,cents\n2,990\n")?;
    /// assert_eq!(ops.run_pipe(&name).await?.files_loaded, 1);
    /// assert_eq!(ops.pipe_status(&name).await?.files_loaded, 2);
    /// # Ok::<_, icestage::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn create_pipe(
        &self,
        name: &PipeName,
        table: impl Into<TableReference>,
        uri: &str,
        copy_options: Vec<(String, String)>,
        options: PipeOptions,
    ) -> Result<PipeStatus> {
        let table = self.table(table)?;
        let default = self.icestage.default_catalog().name();
        let name = CreatePipe::loading(name.clone(), &table, default)?;
        let uri = uri.to_string();
        self.run(CreatePipe::new(
            name,
            false,
            table.ident,
            uri,
            copy_options,
            options,
        )?)
        .await
    }

    /// `RUN PIPE <name>`: loads what is new under the pipe's prefix now.
    pub async fn run_pipe(&self, name: &PipeName) -> Result<PipeRun> {
        self.run(RunPipe { name: name.clone() }).await
    }

    /// One round of a pipe runner: runs every running pipe whose interval
    /// has passed and that no other runner holds (what `icestage serve` does
    /// every second); each pipe's outcome. The session's `icestage.cluster`
    /// decides where the files are read and written.
    pub async fn run_due_pipes(&self) -> Result<Vec<(PipeName, Result<PipeRun>)>> {
        let cluster = crate::cluster::of_options(&self.context()?.options)?;
        crate::pipe::run::run_due(&self.icestage, cluster.as_ref()).await
    }

    /// `ALTER PIPE <name> PAUSE | RESUME`.
    pub async fn set_pipe_state(&self, name: &PipeName, state: PipeState) -> Result<PipeStatus> {
        self.run(AlterPipe {
            name: name.clone(),
            state,
        })
        .await
    }

    /// `DROP PIPE [IF EXISTS] <name>`: whether there was a pipe to drop.
    pub async fn drop_pipe(&self, name: &PipeName, if_exists: bool) -> Result<bool> {
        self.run(DropPipe {
            name: name.clone(),
            if_exists,
        })
        .await
    }

    /// `pipes()`: every pipe of every catalog.
    pub async fn pipes(&self) -> Result<Vec<PipeStatus>> {
        self.run(ListPipes).await
    }

    /// The recorded runs of every pipe (those that loaded or failed
    /// something) that ended at or after `since`.
    pub async fn pipe_runs_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<PipeRunRecord>> {
        crate::pipe::status::runs_since(&self.icestage, since).await
    }

    /// `pipe_status('<name>')`.
    pub async fn pipe_status(&self, name: &PipeName) -> Result<PipeStatus> {
        self.run(ShowPipe { name: name.clone() }).await
    }
}

/// `COPY INTO table FROM uri` with `options` as the typed API gives them.
fn copy(table: TableName, uri: &str, options: SourceOptions) -> CopyInto {
    CopyInto {
        table,
        uri: uri.to_string(),
        options,
        written: vec![],
    }
}
