//! The registry: the catalogs one icestage session serves, kept as a typed
//! service in the DataFusion session config.

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::execution::context::SessionState;
use datafusion::prelude::SessionConfig;

use super::IcebergCatalog;
use crate::config::IcestageConfig;
use crate::error::{Error, Result};

/// The catalogs of an icestage session: a typed service that lives in the
/// DataFusion session config, where every command finds it.
#[derive(Debug)]
pub struct Catalogs {
    catalogs: Vec<Arc<IcebergCatalog>>,
    default_catalog: usize,
    /// Work this process started in the background (downloads being
    /// filled), so that a front end can wait for it before exiting.
    background: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Catalogs {
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

    /// Keeps `task` so that [`Catalogs::finish_background_work`] waits for it.
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

    /// The icestage service of a session that [`crate::register`] set up.
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

    /// [`Catalogs::resolve`]'s answer as a name: the catalog's name and the
    /// table's identifier in it.
    pub(crate) fn name_of(
        &self,
        state: &SessionState,
        table: &TableReference,
    ) -> Result<TableName> {
        let (catalog, ident) = self.resolve(state, table)?;
        Ok(TableName::new(catalog.name(), ident))
    }
}

/// A table of one of icestage's catalogs: the catalog's name and the
/// table's identifier in it, shown as `catalog.namespace.table`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TableName {
    pub(crate) catalog: String,
    pub(crate) ident: iceberg::TableIdent,
}

impl TableName {
    pub(crate) fn new(catalog: impl Into<String>, ident: iceberg::TableIdent) -> Self {
        Self {
            catalog: catalog.into(),
            ident,
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.catalog, self.ident)
    }
}

fn catalog_names(catalogs: &[Arc<IcebergCatalog>]) -> String {
    catalogs
        .iter()
        .map(|c| c.name().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
