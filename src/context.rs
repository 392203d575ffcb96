//! The entry points: [`register`] plugs icestage into a DataFusion
//! `SessionContext`, [`sql`] runs one statement through icestage's parser,
//! planner and executor.

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;

use crate::catalog::bridge::provider::IcestageCatalogProvider;
use crate::config::{IcestageConfig, IcestageOptions};
use crate::error::{Error, Result};
use crate::functions;
use crate::plan::{IcestageQueryPlanner, statement_to_plan};
use crate::sql::parser::{IcestageParser, Statement};

pub use crate::catalog::Catalogs;

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
pub async fn register(ctx: &SessionContext, config: IcestageConfig) -> Result<Arc<Catalogs>> {
    crate::limits::install(config.limits);
    // The Avro reader's own bound on one allocation (set once per process).
    apache_avro::util::max_allocation_bytes(
        usize::try_from(config.limits.metadata_inflated_bytes).unwrap_or(usize::MAX),
    );
    crate::catalog::maintain::upkeep::install_data_rewrite(
        crate::tables::maintain::rewrite_in_background,
    );
    // What the flows keep and end when snapshots or sessions expire.
    crate::tables::expire::install_expiry_hooks(crate::tables::expire::ExpiryHooks {
        protected: crate::upload::expire::evidence,
        before_expiry: crate::ingest::copy_into::before_expiry,
    });
    crate::session::expire::install_flows(vec![
        crate::upload::expire::expire,
        crate::download::status::expire,
    ]);
    let icestage = Arc::new(Catalogs::connect(&config).await?);
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
    // Compose with the host's planner: it keeps planning every plan that
    // holds no icestage statement.
    let inner = Arc::clone(state.query_planner());
    let mut next = SessionStateBuilder::new_from_existing(state.clone())
        .with_query_planner(Arc::new(IcestageQueryPlanner { inner }))
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
