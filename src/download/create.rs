//! `CREATE DOWNLOAD [WITH (...)] AS <query>`: plan the query against one
//! snapshot of each Iceberg table it reads, create the download table with
//! the query's columns, and start filling it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use datafusion::arrow::array::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use iceberg::spec::Schema;
use iceberg::{NamespaceIdent, TableCreation};
use iceberg_datafusion::IcebergStaticTableProvider;

use super::fill::fill;
use super::{
    DOWNLOADS_NAMESPACE, DownloadId, DownloadState, PROP_DOWNLOAD_ID, PROP_HEARTBEAT_AT,
    PROP_LEASE_SECONDS, PROP_QUERY, PROP_SOURCES,
};
use crate::catalog::Icestage;
use crate::config::bounded_ttl;
use crate::error::{Error, Result};
use crate::rows::create_download_schema;
use crate::rows::{Value, batch};
use crate::session::CommandContext;
use crate::session::{PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_OWNER, PROP_STATE};

/// A planned download.
#[derive(Debug)]
pub(crate) struct CreateDownload {
    pub(crate) catalog: String,
    pub(crate) schema: Schema,
    pub(crate) query: String,
    /// Source table → snapshot id read (`None`: the table was empty).
    pub(crate) sources: BTreeMap<String, Option<i64>>,
    pub(crate) ttl: Option<String>,
    pub(crate) wait: bool,
    pub(crate) lease: Duration,
    pub(crate) owner: Option<String>,
}

/// `plan` with every Iceberg table of icestage's catalogs pinned to its
/// current snapshot, and the snapshots read.
pub(crate) async fn pin_snapshots(
    state: &SessionState,
    icestage: &Icestage,
    plan: LogicalPlan,
) -> Result<(LogicalPlan, BTreeMap<String, Option<i64>>)> {
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
    for name in names {
        let Ok((catalog, ident)) = icestage.resolve(state, &name) else {
            continue;
        };
        let Ok(table) = catalog.catalog().load_table(&ident).await else {
            continue;
        };
        let snapshot = table.metadata().current_snapshot_id();
        let provider: Arc<dyn datafusion::catalog::TableProvider> = match snapshot {
            Some(id) => {
                Arc::new(IcebergStaticTableProvider::try_new_from_table_snapshot(table, id).await?)
            }
            None => Arc::new(IcebergStaticTableProvider::try_new_from_table(table).await?),
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
    Ok((plan, sources))
}

pub(crate) async fn create_download(
    ctx: &CommandContext,
    spec: &CreateDownload,
) -> Result<RecordBatch> {
    let catalog = Arc::clone(ctx.icestage.catalog(&spec.catalog)?);
    let (Some(input), Some(session)) = (ctx.input.clone(), ctx.session.clone()) else {
        return Err(Error::invalid(
            "internal: CREATE DOWNLOAD runs with its query as input",
        ));
    };
    let ttl = bounded_ttl(
        spec.ttl
            .as_deref()
            .unwrap_or(ctx.options.download_ttl.as_str()),
        ctx.options.max_ttl.as_str(),
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
            spec.lease.as_secs().to_string(),
        ),
    ]);
    if let Some(owner) = &spec.owner {
        properties.insert(PROP_OWNER.to_string(), owner.clone());
    }
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(spec.schema.clone())
        .properties(properties)
        .build();
    catalog
        .catalog()
        .create_table(ident.namespace(), creation)
        .await?;

    let filling = tokio::spawn(fill(
        Arc::clone(&catalog),
        id.clone(),
        input,
        session,
        spec.lease,
    ));
    let state = if spec.wait {
        let _ = filling.await;
        super::status::status_of(&ctx.icestage, &id)
            .await?
            .map_or(DownloadState::Pending, |r| r.state)
    } else {
        ctx.icestage.keep_background(filling);
        DownloadState::Pending
    };
    let connection = catalog.connection_json()?;
    batch(
        create_download_schema(),
        &[vec![
            Value::from(id.to_string()),
            Value::from(ident.to_string()),
            Value::from(state.as_str()),
            Value::from(Some(expires_at)),
            Value::from(catalog.name()),
            Value::from(connection),
        ]],
    )
}
