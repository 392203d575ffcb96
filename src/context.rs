//! The entry points: [`register`] plugs icestage into a DataFusion
//! `SessionContext`, [`sql`] runs one statement through icestage's parser,
//! planner and executor.

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::catalog::IcebergCatalog;
use crate::catalog::provider::IcestageCatalogProvider;
use crate::config::{IcestageConfig, IcestageOptions};
use crate::error::{Error, Result};
use crate::functions;
use crate::plan::{IcestageQueryPlanner, statement_to_plan};
use crate::sql::parser::{IcestageParser, Statement};

/// The catalogs of an icestage session: a typed service that lives in the
/// DataFusion session config, where every command finds it.
#[derive(Debug)]
pub struct Icestage {
    catalogs: Vec<Arc<IcebergCatalog>>,
    default_catalog: usize,
    /// Work this process started in the background (downloads being
    /// filled), so that a front end can wait for it before exiting.
    background: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Icestage {
    /// Opens every catalog of `config`.
    pub async fn connect(config: &IcestageConfig) -> Result<Self> {
        let mut catalogs = Vec::with_capacity(config.catalogs.len());
        for entry in &config.catalogs {
            if catalogs
                .iter()
                .any(|c: &Arc<IcebergCatalog>| c.name() == entry.name)
            {
                return Err(Error::Config(format!(
                    "catalog '{}' is configured twice: give each [[catalogs]] entry its own name",
                    entry.name
                )));
            }
            catalogs.push(Arc::new(IcebergCatalog::open(entry).await?));
        }
        let default_catalog = match &config.default_catalog {
            None => 0,
            Some(name) => catalogs
                .iter()
                .position(|c| c.name() == name)
                .ok_or_else(|| Error::UnknownCatalog {
                    name: name.clone(),
                    available: catalog_names(&catalogs),
                })?,
        };
        Ok(Self {
            catalogs,
            default_catalog,
            background: Default::default(),
        })
    }

    /// Keeps `task` so that [`Icestage::finish_background_work`] waits for it.
    pub(crate) fn keep_background(&self, task: tokio::task::JoinHandle<()>) {
        let mut tasks = self.background.lock().expect("background tasks");
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// Waits for the background work this process started (downloads being
    /// filled). A front end calls it before it exits; the catalog would
    /// otherwise see those downloads abandoned once their lease runs out.
    pub async fn finish_background_work(&self) {
        let tasks: Vec<_> = self
            .background
            .lock()
            .expect("background tasks")
            .drain(..)
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Every configured catalog.
    pub fn catalogs(&self) -> &[Arc<IcebergCatalog>] {
        &self.catalogs
    }

    /// The catalog that two-part names resolve to.
    pub fn default_catalog(&self) -> &Arc<IcebergCatalog> {
        &self.catalogs[self.default_catalog]
    }

    /// The catalog called `name`.
    pub fn catalog(&self, name: &str) -> Result<&Arc<IcebergCatalog>> {
        self.catalogs
            .iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| Error::UnknownCatalog {
                name: name.to_string(),
                available: catalog_names(&self.catalogs),
            })
    }

    /// The icestage service of a session that [`register`] set up.
    pub fn from_config(config: &SessionConfig) -> Result<Arc<Self>> {
        config.get_extension::<Self>().ok_or_else(|| {
            Error::Config(
                "this DataFusion session has no icestage catalogs: call icestage::register(&ctx, config) first"
                    .to_string(),
            )
        })
    }

    /// Resolves a table name as the session would, to an Iceberg catalog and
    /// a table identifier.
    pub(crate) fn resolve(
        &self,
        state: &SessionState,
        table: &TableReference,
    ) -> Result<(Arc<IcebergCatalog>, iceberg::TableIdent)> {
        let options = state.config().options();
        let resolved = table.clone().resolve(
            &options.catalog.default_catalog,
            &options.catalog.default_schema,
        );
        let catalog = self.catalog(&resolved.catalog).map_err(|_| {
            Error::invalid(format!(
                "table '{table}' is in catalog '{}', which is not an Iceberg catalog icestage serves \
                 (those are {}): name the table as <catalog>.<namespace>.<table>",
                resolved.catalog,
                catalog_names(&self.catalogs)
            ))
        })?;
        let ident =
            iceberg::TableIdent::from_strs([resolved.schema.as_ref(), resolved.table.as_ref()])?;
        Ok((Arc::clone(catalog), ident))
    }
}

fn catalog_names(catalogs: &[Arc<IcebergCatalog>]) -> String {
    catalogs
        .iter()
        .map(|c| c.name().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Registers everything icestage adds into `ctx`: the Iceberg catalogs of
/// `config` (the first, or `default_catalog`, becomes the session's default
/// catalog), the planner for icestage statements, the table functions and
/// the `icestage.*` session options.
///
/// ```no_run
/// # async fn example() -> icestage::Result<()> {
/// use datafusion::prelude::SessionContext;
/// use icestage::IcestageConfig;
///
/// let ctx = SessionContext::new();
/// icestage::register(&ctx, IcestageConfig::embedded("./warehouse")?).await?;
/// let batches = icestage::sql(&ctx, "SELECT * FROM uploads()").await?.collect().await?;
/// # Ok(()) }
/// ```
pub async fn register(ctx: &SessionContext, config: IcestageConfig) -> Result<Arc<Icestage>> {
    let icestage = Arc::new(Icestage::connect(&config).await?);
    for catalog in icestage.catalogs() {
        ctx.register_catalog(
            catalog.name(),
            Arc::new(IcestageCatalogProvider::new(Arc::clone(catalog))),
        );
    }
    functions::register_all(ctx);
    ctx.register_relation_planner(Arc::new(crate::ingest::functions::PrefixRelationPlanner))?;
    let state_ref = ctx.state_ref();
    let mut state = state_ref.write();
    let mut next = SessionStateBuilder::new_from_existing(state.clone())
        .with_query_planner(Arc::new(IcestageQueryPlanner))
        .build();
    let config = next.config_mut();
    config.set_extension(Arc::clone(&icestage));
    let options = config.options_mut();
    if options.extensions.get::<IcestageOptions>().is_none() {
        options.extensions.insert(IcestageOptions::default());
    }
    options.catalog.default_catalog = icestage.default_catalog().name().to_string();
    options.catalog.information_schema = true;
    // `TIMESTAMP WITH TIME ZONE` needs a session time zone to mean Iceberg's
    // timestamptz; UTC unless the application chose one.
    if options.execution.time_zone.is_none() {
        options.execution.time_zone = Some("+00:00".to_string());
    }
    *state = next;
    Ok(icestage)
}

/// Plans one statement (icestage's or DataFusion's) and returns it as a
/// `DataFrame`. Like DataFusion's `INSERT`, icestage statements run when the
/// frame is collected.
pub async fn sql(ctx: &SessionContext, sql: &str) -> Result<DataFrame> {
    let mut statements = IcestageParser::parse_sql(sql)?;
    let statement = match (statements.pop_front(), statements.is_empty()) {
        (Some(statement), true) => statement,
        (None, _) => return Err(Error::invalid("no statement to run: the text is empty")),
        (Some(_), false) => {
            return Err(Error::invalid(
                "more than one statement: run them one at a time (the shell splits a script on ';')",
            ));
        }
    };
    execute_statement(ctx, statement).await
}

/// Plans a parsed statement and returns it as a `DataFrame`.
pub async fn execute_statement(ctx: &SessionContext, statement: Statement) -> Result<DataFrame> {
    let state = ctx.state();
    let plan = statement_to_plan(&state, statement).await?;
    Ok(ctx.execute_logical_plan(plan).await?)
}
