//! The Iceberg catalogs icestage serves, and their bridge into DataFusion.
//!
//! [`IcebergCatalog`] is one configured catalog (an iceberg [`Catalog`] plus
//! what icestage must know about its storage); [`provider`] exposes it to
//! DataFusion so that every lookup reads the catalog afresh; [`scoped`] holds
//! the catalog decorator used for commits that must re-check a condition on
//! every attempt; [`ddl`] turns `CREATE TABLE` into an Iceberg table.

pub(crate) mod ddl;
pub(crate) mod provider;
pub(crate) mod scoped;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableIdent};
use iceberg_catalog_sql::SqlCatalogBuilder;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;

use crate::config::{CATALOG_TYPE_SQL, CatalogConfig, PROP_URI, PROP_WAREHOUSE, sqlite_path};
use crate::error::{Error, Result};

/// One Iceberg catalog as icestage uses it.
#[derive(Debug)]
pub struct IcebergCatalog {
    name: String,
    catalog: Arc<dyn Catalog>,
    warehouse: String,
    /// Properties a third-party client (PyIceberg `load_catalog`) needs.
    client_properties: BTreeMap<String, String>,
}

impl IcebergCatalog {
    /// Opens the catalog described by `config`.
    pub async fn open(config: &CatalogConfig) -> Result<Self> {
        match config.kind.as_str() {
            CATALOG_TYPE_SQL => Self::open_sql(config).await,
            other => Err(Error::Config(format!(
                "catalog '{}' has type '{other}', which icestage does not support: use type = \"{CATALOG_TYPE_SQL}\"",
                config.name
            ))),
        }
    }

    async fn open_sql(config: &CatalogConfig) -> Result<Self> {
        let setting = |key: &str| {
            config.config.get(key).cloned().ok_or_else(|| {
                Error::Config(format!(
                    "catalog '{}' (type sql) needs '{key}' in [catalogs.config]",
                    config.name
                ))
            })
        };
        let uri = setting(PROP_URI)?;
        let warehouse = setting(PROP_WAREHOUSE)?.trim_end_matches('/').to_string();
        if let Some(path) = sqlite_path(&uri)
            && let Some(parent) = path.parent()
        {
            std::fs::create_dir_all(parent)?;
        }
        let mut props: HashMap<String, String> = config.config.clone().into_iter().collect();
        props.insert(PROP_WAREHOUSE.to_string(), warehouse.clone());
        // SQLite takes `?` placeholders; the SQL catalog defaults to `$1`.
        if uri.starts_with("sqlite:") {
            props
                .entry("sql_bind_style".to_string())
                .or_insert_with(|| "QMark".to_string());
        }
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(Arc::new(OpenDalResolvingStorageFactory::new()))
            .load(&config.name, props)
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot open catalog '{}' at '{uri}': {}",
                    config.name,
                    e.message()
                ))
            })?;
        let mut client_properties = BTreeMap::from([
            ("type".to_string(), "sql".to_string()),
            ("warehouse".to_string(), warehouse.clone()),
        ]);
        // PyIceberg's SqlCatalog takes a SQLAlchemy URI.
        let client_uri = match sqlite_path(&uri) {
            Some(path) => format!("sqlite:///{}", path.display()),
            None => uri.clone(),
        };
        client_properties.insert("uri".to_string(), client_uri);
        Ok(Self {
            name: config.name.clone(),
            catalog: Arc::new(catalog),
            warehouse,
            client_properties,
        })
    }

    /// The name SQL uses for this catalog.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The iceberg catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The properties a client passes to PyIceberg's `load_catalog(name, **props)`.
    pub fn client_properties(&self) -> &BTreeMap<String, String> {
        &self.client_properties
    }

    /// Where a new table of this namespace is placed, mirroring the SQL catalog's rule.
    pub(crate) fn default_table_location(&self, ident: &TableIdent) -> String {
        format!(
            "{}/{}/{}",
            self.warehouse,
            ident.namespace().join("/"),
            ident.name()
        )
    }

    /// Creates `namespace` unless it exists (racing creators both succeed).
    pub(crate) async fn ensure_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        if self.catalog.namespace_exists(namespace).await? {
            return Ok(());
        }
        match self
            .catalog
            .create_namespace(namespace, HashMap::new())
            .await
        {
            Ok(_) => Ok(()),
            // Another process created it first (the SQL catalog may report the
            // race as a failed insert rather than NamespaceAlreadyExists).
            Err(e) => match self.catalog.namespace_exists(namespace).await {
                Ok(true) => Ok(()),
                _ => Err(e.into()),
            },
        }
    }
}

/// Runs an async catalog call from a synchronous DataFusion callback
/// (`CatalogProvider::schema`, table functions).
///
/// Needs a multi-threaded tokio runtime, as the shell, the service and the
/// tests use; on any other runtime this answers with an error instead of
/// deadlocking.
pub(crate) fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| Error::NotSupported("icestage must run inside a tokio runtime".to_string()))?;
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err(Error::NotSupported(
            "icestage needs a multi-threaded tokio runtime: build it with \
             tokio::runtime::Builder::new_multi_thread() or #[tokio::main]"
                .to_string(),
        ));
    }
    tokio::task::block_in_place(|| handle.block_on(future))
}
