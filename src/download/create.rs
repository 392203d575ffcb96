//! `CREATE DOWNLOAD [WITH (...)] AS <query>`: plan the query against one
//! snapshot of each Iceberg table it reads, create the download table with
//! the query's columns, and start filling it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use iceberg::spec::Schema;
use iceberg::{NamespaceIdent, TableCreation};

use super::files::{Area, Files, IncludeFiles, References, Referencing};
use super::fill::{Fill, fill};
use super::{
    DOWNLOADS_NAMESPACE, DownloadId, DownloadState, PROP_DOWNLOAD_ID, PROP_HEARTBEAT_AT,
    PROP_LEASE_SECONDS, PROP_QUERY, PROP_SOURCES,
};
use crate::catalog::Catalogs;
use crate::cluster::{Cluster, Recipe, RecipeTable};
use crate::config::{
    IcestageOptions, OptionDoc, Ttl, WithOptions, bounded_ttl, flag_option, option, parse_duration,
};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::operation::{Operation, flag};
use crate::session::{PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_OWNER, PROP_STATE};
use crate::tables::files::{PROP_FILE_COLUMNS, file_columns, reference_columns};

/// How `CREATE DOWNLOAD` runs (its `WITH (...)` options).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DownloadOptions {
    /// How long the download table stays; the session option
    /// `icestage.download_ttl` when `None`, at most `icestage.max_ttl`.
    pub ttl: Option<Ttl>,
    /// Answer once the table is filled (`ready` or `failed`) rather than
    /// at once with `pending`.
    pub wait: bool,
    /// How long the filler's heartbeat holds: a pending download whose
    /// filler went quiet for longer is marked failed.
    pub lease: Duration,
    /// Who the download belongs to (a service's caller), if anyone.
    pub owner: Option<String>,
    /// The catalog the download table goes in (a service's caller's, so
    /// that one tenant's download never lands in another's catalog); the
    /// default catalog when `None`.
    pub catalog: Option<String>,
    /// Copy the files the rows reference (`FILE` columns) into the
    /// download's own `files/` folder and point the rows at the copies, so
    /// the download's access reaches them (`include_files`).
    pub include_files: bool,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        Self {
            ttl: None,
            wait: false,
            lease: Duration::from_secs(60),
            owner: None,
            catalog: None,
            include_files: false,
        }
    }
}

result_row! {
    /// A download `CREATE DOWNLOAD` started: the table a client reads once
    /// it is `ready`, and how it connects.
    #[derive(Debug, Clone, PartialEq)]
    pub struct DownloadOpened {
        /// The download's id.
        pub download_id: DownloadId,
        /// The table a client reads, `downloads.download_<id>`.
        pub download_table: String,
        /// `pending`, or with `wait`, `ready` or `failed`.
        pub state: DownloadState,
        /// When `EXPIRE STAGING` may remove it.
        pub expires_at: Option<DateTime<Utc>>,
        /// The catalog of the download table.
        pub catalog: String,
        /// A JSON object of catalog connection properties for a client.
        pub connection: String => json,
        /// Where the query runs: `local`, or the cluster's URL.
        pub ran_on: String,
    }
}

impl WithOptions for DownloadOptions {
    const STATEMENT: &'static str = "CREATE DOWNLOAD";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "ttl",
            default: "the session's `icestage.download_ttl`",
            doc: "how long the download's table stays (at most `icestage.max_ttl`)",
        },
        OptionDoc {
            key: "wait",
            default: "false",
            doc: "answer once the table is filled (`ready` or `failed`), not at once with `pending`",
        },
        OptionDoc {
            key: "lease",
            default: "`'60s'`",
            doc: "how long the filler's heartbeat holds before a pending download is marked failed",
        },
        OptionDoc {
            key: "owner",
            default: "none",
            doc: "who the download belongs to (a service's caller)",
        },
        OptionDoc {
            key: "catalog",
            default: "the default catalog",
            doc: "the catalog the download's table goes in",
        },
        OptionDoc {
            key: "include_files",
            default: "false",
            doc: "copy the files the rows reference (`FILE` columns) into the download's own `files/` folder",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        let defaults = Self::default();
        Ok(Self {
            ttl: option(pairs, "ttl").map(Ttl::parse).transpose()?,
            wait: flag_option(pairs, "wait")?,
            lease: option(pairs, "lease")
                .map(parse_duration)
                .transpose()?
                .unwrap_or(defaults.lease),
            owner: option(pairs, "owner").map(str::to_string),
            catalog: option(pairs, "catalog").map(str::to_string),
            include_files: flag_option(pairs, "include_files")?,
        })
    }
}

/// A planned download.
#[derive(Debug, PartialEq)]
pub(crate) struct CreateDownload {
    pub(crate) catalog: String,
    pub(crate) schema: Schema,
    /// What the download holds, in words: the statement's SQL (secrets
    /// redacted), or a plan built in Rust.
    pub(crate) query: String,
    /// Source table → snapshot id read (`None`: the table was empty).
    pub(crate) sources: BTreeMap<String, Option<i64>>,
    pub(crate) options: DownloadOptions,
    /// The cluster the query runs on (`icestage.cluster`) and the query as
    /// a plan (the cluster plans it itself); `None`: here, from the
    /// command's input.
    pub(crate) remote: Option<(Cluster, LogicalPlan)>,
    /// The download's file columns (none unless a table it reads declares
    /// some), and where their files may lie: the `files/` folders of the
    /// tables read that declare file columns.
    pub(crate) file_columns: Vec<String>,
    pub(crate) areas: Vec<Area>,
}

impl Operation for CreateDownload {
    const NAME: &'static str = "CreateDownload";
    type Outcome = DownloadOpened;

    async fn run(&self, ctx: &CommandContext) -> Result<DownloadOpened> {
        create_download(ctx, self).await
    }
}

impl fmt::Display for CreateDownload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sources: Vec<String> = self
            .sources
            .iter()
            .map(|(t, s)| format!("{t}@{}", s.map_or("empty".to_string(), |s| s.to_string())))
            .collect();
        write!(
            f,
            "catalog={}, sources=[{}]",
            self.catalog,
            sources.join(", ")
        )?;
        write!(f, "{}", flag(self.options.wait, "wait"))
    }
}

/// A download of `plan`: every Iceberg table it reads pinned to one
/// snapshot, the download table's schema from its columns, and the plan that
/// fills it (cast to the table's types).
pub(crate) async fn plan_download(
    state: &SessionState,
    icestage: &Catalogs,
    plan: LogicalPlan,
    query: String,
    options: DownloadOptions,
) -> Result<(CreateDownload, LogicalPlan)> {
    let cluster = match state.config().options().extensions.get::<IcestageOptions>() {
        Some(options) => crate::cluster::of_options(options)?,
        None => None,
    };
    let (pinned, sources, areas) = pin_snapshots(state, icestage, plan, cluster.as_ref()).await?;
    let schema = crate::tables::ddl::iceberg_schema(pinned.schema().as_arrow())?;
    let file_columns = if areas.is_empty() {
        vec![]
    } else {
        reference_columns(&schema)
    };
    if options.include_files {
        if cluster.is_some() {
            return Err(Error::invalid(
                "include_files copies the rows' files in this process, not on a cluster: \
                 SET icestage.cluster = '' for this download",
            ));
        }
        if file_columns.is_empty() {
            return Err(Error::invalid(format!(
                "include_files = true copies the files of the result's FILE columns, and the \
                 query selects none from a table that declares them (its columns: {}): select \
                 a FILE column, or leave include_files out",
                schema
                    .as_struct()
                    .fields()
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let input = crate::tables::ddl::cast_to_table_types(pinned, &schema)?;
    let catalog = match &options.catalog {
        Some(name) => icestage.catalog(name)?.name().to_string(),
        None => icestage.default_catalog().name().to_string(),
    };
    let spec = CreateDownload {
        catalog,
        schema,
        query,
        sources,
        options,
        remote: cluster.map(|c| (c, input.clone())),
        file_columns,
        areas,
    };
    Ok((spec, input))
}

/// `plan` with every Iceberg table of icestage's catalogs pinned to its
/// current snapshot, the snapshots read, and the file areas of the tables
/// read that declare file columns. For a cluster, each table is a recipe
/// its executors can open.
async fn pin_snapshots(
    state: &SessionState,
    icestage: &Catalogs,
    plan: LogicalPlan,
    cluster: Option<&Cluster>,
) -> Result<(LogicalPlan, BTreeMap<String, Option<i64>>, Vec<Area>)> {
    let mut names = vec![];
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && !scan.table_name.table().contains('$')
        {
            names.push(scan.table_name.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut pinned: HashMap<String, Arc<dyn datafusion::catalog::TableProvider>> = HashMap::new();
    let mut sources = BTreeMap::new();
    let mut areas = vec![];
    for name in names {
        let Ok((catalog, ident)) = icestage.resolve(state, &name) else {
            continue;
        };
        let Ok(table) = catalog.catalog().load_table(&ident).await else {
            continue;
        };
        if !file_columns(&table)?.is_empty() {
            let location = catalog.placed_or_reported(&table).await?;
            areas.push(Area::of(&table, &location));
        }
        let snapshot = table.metadata().current_snapshot_id();
        // Read a file at a time per partition, its files and row groups
        // pruned by the query's filters: a download's memory stays that of
        // the batches in flight.
        let provider: Arc<dyn datafusion::catalog::TableProvider> = match cluster {
            Some(cluster) => cluster.table(&table, snapshot)?,
            None => Arc::new(RecipeTable::of_recipe(
                &table,
                Recipe::here(&table, snapshot)?,
            )?),
        };
        sources.insert(format!("{}.{ident}", catalog.name()), snapshot);
        pinned.insert(name.to_string(), provider);
    }
    let plan = plan
        .transform_up(|node| match node {
            LogicalPlan::TableScan(mut scan) => match pinned.get(&scan.table_name.to_string()) {
                Some(provider) => {
                    scan.source = provider_as_source(Arc::clone(provider));
                    Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
                }
                None => Ok(Transformed::no(LogicalPlan::TableScan(scan))),
            },
            other => Ok(Transformed::no(other)),
        })?
        .data;
    Ok((plan, sources, areas))
}

async fn create_download(ctx: &CommandContext, spec: &CreateDownload) -> Result<DownloadOpened> {
    let catalog = Arc::clone(ctx.icestage.catalog(&spec.catalog)?);
    // Here, the query is the command's input, planned with the session;
    // on a cluster, the cluster plans it.
    let source = match (&spec.remote, ctx.input.clone(), ctx.session.as_ref()) {
        (Some((cluster, plan)), _, _) => Fill::on_cluster(cluster, plan)?,
        (None, Some(input), Some(session)) => Fill::Here(input, session.task_ctx(), None),
        (None, _, _) => {
            return Err(Error::internal(
                "CREATE DOWNLOAD runs with its query as input",
            ));
        }
    };
    let options = &spec.options;
    let ttl = bounded_ttl(
        options.ttl.as_ref().unwrap_or(&ctx.options.download_ttl),
        &ctx.options.max_ttl,
        "download",
    )?;
    let id = DownloadId::random();
    let created_at = Utc::now();
    let expires_at = created_at
        + ChronoDuration::from_std(ttl).map_err(|_| Error::invalid("ttl is too long"))?;
    let ident = id.table();
    catalog
        .ensure_namespace(&NamespaceIdent::new(DOWNLOADS_NAMESPACE.to_string()))
        .await?;
    crate::session::log::log_table(&catalog, crate::session::log::DOWNLOADS).await?;
    let sources =
        serde_json::to_string(&spec.sources).map_err(|e| Error::invalid(e.to_string()))?;
    let mut properties = HashMap::from([
        (PROP_DOWNLOAD_ID.to_string(), id.to_string()),
        (PROP_STATE.to_string(), DownloadState::Pending.to_string()),
        (PROP_CREATED_AT.to_string(), created_at.to_rfc3339()),
        (PROP_EXPIRES_AT.to_string(), expires_at.to_rfc3339()),
        (PROP_QUERY.to_string(), spec.query.clone()),
        (PROP_SOURCES.to_string(), sources),
        (PROP_HEARTBEAT_AT.to_string(), created_at.to_rfc3339()),
        (
            PROP_LEASE_SECONDS.to_string(),
            options.lease.as_secs().to_string(),
        ),
    ]);
    if let Some(owner) = &options.owner {
        properties.insert(PROP_OWNER.to_string(), owner.clone());
    }
    if !spec.file_columns.is_empty() {
        properties.insert(PROP_FILE_COLUMNS.to_string(), spec.file_columns.join(","));
    }
    properties.extend(crate::catalog::session_table_properties());
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(spec.schema.clone())
        .properties(properties)
        .build();
    let table = catalog
        .catalog()
        .create_table(ident.namespace(), creation)
        .await?;
    let source = match source {
        Fill::Here(input, task, _) if !spec.file_columns.is_empty() => {
            let location = catalog.placed_or_reported(&table).await?;
            let of = Referencing::new(
                &table,
                &location,
                spec.file_columns.clone(),
                spec.areas.clone(),
            );
            let files = if options.include_files {
                Files::Include(Arc::new(IncludeFiles::new(&catalog, of)))
            } else {
                Files::Name(Arc::new(References::new(of)))
            };
            Fill::Here(input, task, Some(files))
        }
        other => other,
    };

    let filling = tokio::spawn(fill(
        Arc::clone(&catalog),
        id.clone(),
        source,
        options.lease,
    ));
    let state = if options.wait {
        let _ = filling.await;
        super::status::status_of(&ctx.icestage, &id)
            .await?
            .map_or(DownloadState::Pending, |r| r.state)
    } else {
        ctx.icestage.keep_background(filling);
        DownloadState::Pending
    };
    Ok(DownloadOpened {
        download_id: id,
        download_table: ident.to_string(),
        state,
        expires_at: Some(expires_at),
        catalog: catalog.name().to_string(),
        connection: catalog.connection_json()?,
        ran_on: crate::cluster::ran_on(spec.remote.as_ref().map(|(c, _)| c)),
    })
}
