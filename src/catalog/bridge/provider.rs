//! DataFusion's view of an Iceberg catalog, read afresh on every lookup.
//!
//! iceberg-datafusion's own `IcebergCatalogProvider` lists the catalog once
//! when built, so tables created later (a staging table, say) stay invisible.
//! These providers ask the catalog each time. Scans and metadata tables
//! (`t$snapshots`) are iceberg-datafusion's; `INSERT INTO` is icestage's
//! (see [`crate::catalog::bridge::insert`]).

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_plan::ExecutionPlan;
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_datafusion::IcebergCatalogProvider as UpstreamCatalogProvider;

use crate::catalog::bridge::insert::IcebergTable;
use crate::catalog::scoped::ScopedCatalog;
use crate::catalog::{IcebergCatalog, block_on};
use crate::error::{Error, Result};
use crate::rows::project;

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

/// The provider of one table (reading through iceberg-datafusion's
/// catalog-backed provider, writing through icestage's) or of one of its
/// metadata tables (`name$snapshots`), or `None` when it does not exist.
pub(crate) async fn table_provider(
    catalog: &Arc<IcebergCatalog>,
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
        (Some(provider), None) => Some(Arc::new(IcebergTable::new(
            provider,
            Arc::clone(catalog),
            table.clone(),
        )) as _),
        (None, _) => None,
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
