//! DataFusion's view of an Iceberg catalog, read afresh on every lookup.
//!
//! iceberg-datafusion's own `IcebergCatalogProvider` lists the catalog once
//! when built, so tables created later (a staging table, say) stay invisible.
//! These providers ask the catalog each time; table providers come from
//! iceberg-datafusion so scans, metadata tables (`t$snapshots`) and
//! `INSERT INTO` behave as upstream.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, RecordBatch, UInt64Array};
use datafusion::catalog::Session;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_plan::{ExecutionPlan, collect};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_datafusion::IcebergCatalogProvider as UpstreamCatalogProvider;

use super::scoped::ScopedCatalog;
use super::{IcebergCatalog, block_on};
use crate::error::{Error, Result};
use crate::plan::node::project;
use crate::upload::transfer::write_rows;

/// An Iceberg catalog as a DataFusion catalog.
#[derive(Debug)]
pub(crate) struct IcestageCatalogProvider {
    catalog: Arc<IcebergCatalog>,
}

impl IcestageCatalogProvider {
    pub(crate) fn new(catalog: Arc<IcebergCatalog>) -> Self {
        Self { catalog }
    }
}

impl CatalogProvider for IcestageCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            block_on(async { Ok(self.catalog.catalog().list_namespaces(None).await?) })
                .unwrap_or_default()
                .into_iter()
                .map(|ns| ns.join("."))
                .collect();
        names.sort();
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let namespace = NamespaceIdent::new(name.to_string());
        let exists =
            block_on(async { Ok(self.catalog.catalog().namespace_exists(&namespace).await?) })
                .unwrap_or(false);
        exists.then(|| {
            Arc::new(IcestageSchemaProvider {
                catalog: Arc::clone(&self.catalog),
                namespace,
            }) as Arc<dyn SchemaProvider>
        })
    }

    fn register_schema(
        &self,
        name: &str,
        _schema: Arc<dyn SchemaProvider>,
    ) -> DFResult<Option<Arc<dyn SchemaProvider>>> {
        let namespace = NamespaceIdent::new(name.to_string());
        block_on(async {
            self.catalog
                .catalog()
                .create_namespace(&namespace, HashMap::new())
                .await?;
            Ok(())
        })?;
        Ok(None)
    }

    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> DFResult<Option<Arc<dyn SchemaProvider>>> {
        let Some(schema) = self.schema(name) else {
            return Ok(None);
        };
        let namespace = NamespaceIdent::new(name.to_string());
        block_on(async {
            let catalog = self.catalog.catalog();
            let tables = catalog.list_tables(&namespace).await?;
            if !tables.is_empty() && !cascade {
                return Err(Error::invalid(format!(
                    "namespace '{name}' holds {} table(s): drop them first, or use DROP SCHEMA {name} CASCADE",
                    tables.len()
                )));
            }
            for table in &tables {
                catalog.drop_table(table).await?;
            }
            catalog.drop_namespace(&namespace).await?;
            Ok(())
        })?;
        Ok(Some(schema))
    }
}

/// One Iceberg namespace as a DataFusion schema.
#[derive(Debug)]
pub(crate) struct IcestageSchemaProvider {
    catalog: Arc<IcebergCatalog>,
    namespace: NamespaceIdent,
}

impl IcestageSchemaProvider {
    fn ident(&self, name: &str) -> TableIdent {
        TableIdent::new(self.namespace.clone(), name.to_string())
    }
}

/// The catalog-backed iceberg-datafusion provider of one table (or of one of
/// its metadata tables, `name$snapshots`), or `None` when it does not exist.
pub(crate) async fn table_provider(
    catalog: &IcebergCatalog,
    table: &TableIdent,
    metadata_table: Option<&str>,
) -> Result<Option<Arc<dyn TableProvider>>> {
    if !catalog.catalog().table_exists(table).await? {
        return Ok(None);
    }
    let scoped = ScopedCatalog::new(Arc::clone(catalog.catalog())).listing_only(table.clone());
    let upstream = UpstreamCatalogProvider::try_new(Arc::new(scoped)).await?;
    let Some(schema) = upstream.schema(&table.namespace().join(".")) else {
        return Ok(None);
    };
    let name = match metadata_table {
        Some(kind) => format!("{}${kind}", table.name()),
        None => table.name().to_string(),
    };
    let provider = schema.table(&name).await?;
    Ok(match (provider, metadata_table) {
        (Some(provider), Some(_)) => Some(Arc::new(MetadataTable { inner: provider }) as _),
        (provider, _) => provider,
    })
}

/// An iceberg-datafusion metadata table (`t$snapshots`, `t$manifests`),
/// whose scan returns every column whatever the projection: this scans all
/// and projects, so `SELECT one_column FROM t$manifests` works.
#[derive(Debug)]
struct MetadataTable {
    inner: Arc<dyn TableProvider>,
}

#[async_trait]
impl TableProvider for MetadataTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> datafusion::logical_expr::TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let all = self.inner.scan(state, None, &[], None).await?;
        project(all, projection)
    }
}

/// Appends the rows of `input` to an Iceberg table through iceberg-datafusion's
/// writer (one commit); returns the number of rows written.
pub(crate) async fn insert_into(
    catalog: &IcebergCatalog,
    table: &TableIdent,
    session: &dyn Session,
    input: Arc<dyn ExecutionPlan>,
    task: &Arc<TaskContext>,
) -> Result<u64> {
    let provider =
        table_provider(catalog, table, None)
            .await?
            .ok_or_else(|| Error::TableNotFound {
                table: table.to_string(),
                hint: String::new(),
            })?;
    let plan = provider
        .insert_into(session, input, InsertOp::Append)
        .await?;
    let batches = collect(plan, Arc::clone(task)).await?;
    let mut rows = 0;
    for batch in &batches {
        if let Some(counts) = batch.column(0).as_any().downcast_ref::<UInt64Array>() {
            rows += counts.iter().flatten().sum::<u64>();
        }
    }
    Ok(rows)
}

/// Appends `rows` (a few log rows) to an Iceberg table in one commit: one
/// data file, one `fast_append` without iceberg's duplicate-file check (it
/// reads every manifest of the table, so a log's appends would cost more as
/// the log grows). iceberg's own commit retries conflicts with backoff but
/// no jitter, so a crowd of concurrent writers can exhaust it; the commit is
/// retried with jitter on a freshly loaded table.
pub(crate) async fn append_batch(
    catalog: &IcebergCatalog,
    table: &TableIdent,
    rows: RecordBatch,
) -> Result<()> {
    // Writers of this process take turns; other processes are met by retries.
    let _turn = catalog.exclusive(&table.to_string()).await;
    let current = catalog.catalog().load_table(table).await?;
    let prefix = format!("icestage-{}", uuid::Uuid::new_v4());
    let files = write_rows(&current, &prefix, futures::stream::iter([Ok(rows)])).await?;
    let mut base = current;
    let mut attempt = 0u32;
    loop {
        let tx = Transaction::new(&base);
        let tx = tx
            .fast_append()
            .with_check_duplicate(false)
            .add_data_files(files.clone())
            .apply(tx)?;
        match tx
            .commit(catalog.catalog().as_ref())
            .await
            .map_err(Error::from)
        {
            Ok(_) => return Ok(()),
            Err(e) if is_commit_conflict(&e) && attempt < MAX_COMMIT_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(jitter(attempt)).await;
                base = catalog.catalog().load_table(table).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How often a commit that keeps conflicting is tried before giving up.
pub(crate) const MAX_COMMIT_ATTEMPTS: u32 = 30;

/// A randomised pause before retry `attempt` (1-based).
pub(crate) fn jitter(attempt: u32) -> Duration {
    let base = 50u64 * u64::from(attempt.min(10));
    Duration::from_millis(base + rand::random::<u64>() % (base * 4 + 1))
}

/// True when `error` is an Iceberg commit conflict (retryable).
pub(crate) fn is_commit_conflict(error: &Error) -> bool {
    let iceberg = match error {
        Error::Iceberg(e) => Some(e),
        Error::DataFusion(DataFusionError::External(inner)) => {
            inner.downcast_ref::<iceberg::Error>()
        }
        _ => None,
    };
    iceberg.is_some_and(|e| e.kind() == iceberg::ErrorKind::CatalogCommitConflicts)
}

#[async_trait]
impl SchemaProvider for IcestageSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            block_on(async { Ok(self.catalog.catalog().list_tables(&self.namespace).await?) })
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.name().to_string())
                .collect();
        names.sort();
        names
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let (base, metadata_table) = match name.split_once('$') {
            Some((base, kind)) => (base, Some(kind)),
            None => (name, None),
        };
        Ok(table_provider(&self.catalog, &self.ident(base), metadata_table).await?)
    }

    fn register_table(
        &self,
        name: String,
        _table: Arc<dyn TableProvider>,
    ) -> DFResult<Option<Arc<dyn TableProvider>>> {
        Err(DataFusionError::Plan(format!(
            "cannot register '{}.{name}' in Iceberg catalog '{}': only Iceberg tables live there; \
             create one with CREATE TABLE {}.{name} (<column> <type>, ...)",
            self.namespace.join("."),
            self.catalog.name(),
            self.namespace.join("."),
        )))
    }

    fn deregister_table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let ident = self.ident(name);
        let dropped = block_on(async {
            let Some(provider) = table_provider(&self.catalog, &ident, None).await? else {
                return Ok(None);
            };
            self.catalog.catalog().drop_table(&ident).await?;
            Ok(Some(provider))
        })?;
        Ok(dropped)
    }

    fn table_exist(&self, name: &str) -> bool {
        let base = name.split_once('$').map_or(name, |(base, _)| base);
        let ident = self.ident(base);
        block_on(async { Ok(self.catalog.catalog().table_exists(&ident).await?) }).unwrap_or(false)
    }
}
