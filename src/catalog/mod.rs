//! The Iceberg catalogs icestage serves, and their bridge into DataFusion.
//!
//! [`IcebergCatalog`] is one configured catalog (an iceberg [`Catalog`] plus
//! what icestage must know about its storage). This folder holds connecting
//! to catalogs, one file per concern of a backend: the SQL catalog's
//! database ([`database`]), a REST catalog's exact commits and OAuth2
//! ([`rest_backend`], [`oauth`]), views ([`views`]), the pointer swap
//! ([`pointer`]), tables kept once loaded ([`cache`]), the decorator that
//! re-checks a condition at every load ([`scoped`]), which table a folder
//! belongs to ([`claims`]), path confinement and the one deletion gate
//! ([`confine`]), object copies ([`copy`]), the storage layer under every
//! table's files ([`storage`]) and the leaf helpers for snapshots
//! ([`snapshot`]). Beside them, each in its own folder:
//!
//! - [`commit`]: the exactly-once commit protocol (appends, claims of a
//!   client's commit, group commits, replacing files, audit branches);
//! - [`maintain`]: what keeps a table in shape (manifest merges, data-file
//!   rewrites, orphan files, the upkeep an append leaves due);
//! - [`manifests`]: manifests a client wrote, read within bounds, and
//!   manifests decoded once for lookups;
//! - [`bridge`]: DataFusion's view of a catalog, `INSERT INTO`, and the one
//!   Parquet writer.

pub(crate) mod bridge;
pub(crate) mod cache;
pub(crate) mod claims;
pub(crate) mod commit;
pub(crate) mod confine;
pub(crate) mod copy;
pub(crate) mod database;
pub(crate) mod maintain;
pub(crate) mod manifests;
pub(crate) mod oauth;
pub(crate) mod pointer;
pub(crate) mod registry;
pub(crate) mod rest_backend;
pub(crate) mod scoped;
pub(crate) mod snapshot;
pub(crate) mod specs;
pub(crate) mod storage;
pub(crate) mod views;

/// Namespace of staging tables.
pub const STAGING_NAMESPACE: &str = "staging";

pub use registry::Catalogs;
pub(crate) use registry::TableName;

/// Who owns the table an append went to, which decides its upkeep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// One of icestage's own tables (logs, `copy_log`, deliveries).
    Icestage,
    /// A user's table: a target, a staging or download table, a table
    /// `INSERT INTO` writes.
    User,
}

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use std::fmt;

use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_s3tables::S3TablesCatalogBuilder;
use iceberg_catalog_sql::SqlCatalogBuilder;

use crate::aws::AwsSettings;
use crate::config::{
    CATALOG_TYPE_REST, CATALOG_TYPE_S3TABLES, CATALOG_TYPE_SQL, CatalogConfig, PROP_CREDENTIAL,
    PROP_ENDPOINT_URL, PROP_OAUTH_SERVER, PROP_SCOPE, PROP_TABLE_BUCKET_ARN, PROP_TOKEN, PROP_URI,
    PROP_WAREHOUSE, sqlite_path,
};
use crate::error::{Error, Result};
use crate::secret::redacted;

/// What kind of catalog it is, and what icestage knows of its storage.
#[derive(Debug, Clone)]
pub(crate) enum CatalogKind {
    /// iceberg's SQL catalog; the warehouse is a local folder or `s3://...`.
    Sql { uri: String, warehouse: String },
    /// Amazon S3 Tables: one table bucket; each table gets its own storage,
    /// which goes away when the table is deleted.
    S3Tables {
        bucket_arn: String,
        endpoint_url: Option<String>,
    },
    /// An Iceberg REST catalog: it places tables and vends storage access
    /// itself; icestage's exact commits pin its version ref
    /// ([`rest_backend`]).
    Rest {
        uri: String,
        warehouse: Option<String>,
    },
}

/// One Iceberg catalog as icestage uses it. A clone is another handle on
/// the same catalog: it shares this process's turns and group commits at
/// its tables and the sealing key.
#[derive(Clone)]
pub struct IcebergCatalog {
    name: String,
    /// `scoped`, as the catalog every caller loads and commits through.
    catalog: Arc<dyn Catalog>,
    /// The backend's catalog, keeping the tables it loads where it can
    /// ([`cache`]); commits that must land on the version they checked
    /// ([`Self::exact`]) share what it keeps.
    scoped: scoped::ScopedCatalog,
    kind: CatalogKind,
    aws: AwsSettings,
    /// Properties a third-party client (PyIceberg `load_catalog`) needs.
    client_properties: BTreeMap<String, String>,
    /// Per-table turns and group commits of this process ([`commit::group`]).
    local: Arc<commit::group::Local>,
    /// Compare-and-swap of table pointers, for commits that must land on the
    /// version they checked.
    pointers: pointer::PointerStore,
    /// The key that seals sessions' authority, once read (see `upload::seal`).
    seal_key: Arc<tokio::sync::OnceCell<Vec<u8>>>,
    /// Manifests decoded once, for lookups by partition value and reads by
    /// time ([`manifests::lookup`]).
    manifests: Arc<manifests::lookup::Manifests>,
}

impl fmt::Debug for IcebergCatalog {
    // The inner catalogs print their properties, secrets included: never
    // show them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IcebergCatalog")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("aws", &self.aws)
            .field("client_properties", &redacted(&self.client_properties))
            .finish()
    }
}

impl IcebergCatalog {
    /// Opens the catalog described by `config`.
    pub async fn open(config: &CatalogConfig) -> Result<Self> {
        match config.kind.as_str() {
            CATALOG_TYPE_SQL => Self::open_sql(config).await,
            CATALOG_TYPE_S3TABLES => Self::open_s3tables(config).await,
            CATALOG_TYPE_REST => Self::open_rest(config).await,
            other => Err(Error::Config(format!(
                "catalog '{}' has type '{other}', which icestage does not support: \
                 use type = \"{CATALOG_TYPE_SQL}\", \"{CATALOG_TYPE_S3TABLES}\" or \
                 \"{CATALOG_TYPE_REST}\"",
                config.name
            ))),
        }
    }

    fn setting(config: &CatalogConfig, key: &str) -> Result<String> {
        config.config.get(key).cloned().ok_or_else(|| {
            Error::Config(format!(
                "catalog '{}' (type {}) needs '{key}' in [catalogs.config]",
                config.name, config.kind
            ))
        })
    }

    async fn open_sql(config: &CatalogConfig) -> Result<Self> {
        let uri = Self::setting(config, PROP_URI)?;
        let warehouse = Self::setting(config, PROP_WAREHOUSE)?
            .trim_end_matches('/')
            .to_string();
        if let Some(path) = sqlite_path(&uri)
            && let Some(parent) = path.parent()
        {
            std::fs::create_dir_all(parent)?;
        }
        let settings = database::PoolSettings::from_config(&config.name, &config.config)?;
        let engine = database::Engine::of(&uri);
        let aws = AwsSettings::from_config(&config.config)?;
        let mut props: HashMap<String, String> = settings.catalog_properties().into();
        props.insert(PROP_URI.to_string(), uri.clone());
        props.insert(PROP_WAREHOUSE.to_string(), warehouse.clone());
        if on_s3(&warehouse) {
            props.extend(aws.file_io_properties());
        }
        // SQLite takes `?` placeholders; the SQL catalog's default, `$1`, is
        // PostgreSQL's.
        let bind_style = match engine {
            Some(database::Engine::Sqlite) => "QMark",
            _ => "DollarNumeric",
        };
        props.insert("sql_bind_style".to_string(), bind_style.to_string());
        let io = iceberg::io::FileIOBuilder::new(Arc::new(storage::StoragesFactory))
            .with_props(props.clone())
            .build();
        let database = database::Database::open(&config.name, &uri, &settings).await?;
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(Arc::new(storage::StoragesFactory))
            .load(&config.name, props)
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot open catalog '{}' at '{}': {}",
                    config.name,
                    database::redacted_uri(&uri),
                    e.message()
                ))
            })?;
        let mut client_properties = BTreeMap::from([
            ("type".to_string(), "sql".to_string()),
            ("warehouse".to_string(), warehouse.clone()),
        ]);
        // PyIceberg's SqlCatalog takes a SQLAlchemy URI.
        client_properties.insert("uri".to_string(), database::client_uri(&uri));
        if warehouse.starts_with("s3") {
            client_properties.insert("s3.region".to_string(), aws.region.clone());
            if let Some(endpoint) = &aws.s3_endpoint {
                client_properties.insert("s3.endpoint".to_string(), endpoint.clone());
            }
        }
        let pointers = pointer::PointerStore::Sql {
            database,
            catalog_name: config.name.clone(),
        };
        let scoped =
            scoped::ScopedCatalog::new(Arc::new(catalog)).keeping_tables(pointers.clone(), io);
        Ok(Self {
            name: config.name.clone(),
            catalog: Arc::new(scoped.clone()),
            scoped,
            pointers,
            kind: CatalogKind::Sql { uri, warehouse },
            aws,
            client_properties,
            local: Default::default(),
            seal_key: Default::default(),
            manifests: Default::default(),
        })
    }

    async fn open_s3tables(config: &CatalogConfig) -> Result<Self> {
        let bucket_arn = Self::setting(config, PROP_TABLE_BUCKET_ARN)?;
        let aws = AwsSettings::from_config(&config.config)?;
        let endpoint_url = config.config.get(PROP_ENDPOINT_URL).cloned();
        let mut props = aws.file_io_properties();
        props.insert(PROP_TABLE_BUCKET_ARN.to_string(), bucket_arn.clone());
        props.insert("region_name".to_string(), aws.region.clone());
        if let Some(endpoint) = &endpoint_url {
            props.insert(PROP_ENDPOINT_URL.to_string(), endpoint.clone());
        }
        // The S3 Tables API client uses the same identity as the data files.
        let sdk = aws.sdk_config(endpoint_url.as_deref()).await;
        let client = aws_sdk_s3tables::Client::new(&sdk);
        let pointers = pointer::PointerStore::S3Tables {
            client: client.clone(),
            bucket_arn: bucket_arn.clone(),
        };
        let catalog = S3TablesCatalogBuilder::default()
            .with_client(client)
            .load(&config.name, props)
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot open S3 Tables catalog '{}' ({bucket_arn}): {}",
                    config.name,
                    e.message()
                ))
            })?;
        let region = aws.region.clone();
        let client_properties = BTreeMap::from([
            ("type".to_string(), "rest".to_string()),
            (
                "uri".to_string(),
                endpoint_url
                    .clone()
                    .map(|e| format!("{}/iceberg", e.trim_end_matches('/')))
                    .unwrap_or_else(|| format!("https://s3tables.{region}.amazonaws.com/iceberg")),
            ),
            ("warehouse".to_string(), bucket_arn.clone()),
            ("rest.sigv4-enabled".to_string(), "true".to_string()),
            ("rest.signing-name".to_string(), "s3tables".to_string()),
            ("rest.signing-region".to_string(), region),
        ]);
        let scoped = scoped::ScopedCatalog::new(Arc::new(catalog));
        Ok(Self {
            name: config.name.clone(),
            catalog: Arc::new(scoped.clone()),
            scoped,
            kind: CatalogKind::S3Tables {
                bucket_arn,
                endpoint_url,
            },
            aws,
            client_properties,
            local: Default::default(),
            pointers,
            seal_key: Default::default(),
            manifests: Default::default(),
        })
    }

    /// An Iceberg REST catalog: `uri`, optional `warehouse`, `token` or
    /// `credential` (with `oauth2-server-uri` and `scope`) and
    /// `header.<name>` settings (and `s3.*` storage settings, used where
    /// the catalog vends nothing).
    async fn open_rest(config: &CatalogConfig) -> Result<Self> {
        let uri = Self::setting(config, PROP_URI)?
            .trim_end_matches('/')
            .to_string();
        let warehouse = config.config.get(PROP_WAREHOUSE).cloned();
        let token = config.config.get(PROP_TOKEN).cloned();
        // OAuth2 client credentials: tokens fetched from the catalog's
        // endpoint and fetched again at half their lifetime (a `token`
        // set too is used first, as iceberg's REST catalog does).
        let credentials = match config.config.get(PROP_CREDENTIAL) {
            Some(credential) => Some(Arc::new(oauth::ClientCredentials::new(
                &config.name,
                &uri,
                credential,
                config.config.get(PROP_OAUTH_SERVER).map(String::as_str),
                config.config.get(PROP_SCOPE).map(String::as_str),
            )?)),
            None => None,
        };
        let refresh = match &credentials {
            Some(credentials) if token.is_none() => Some(credentials.refresh_period().await?),
            _ => None,
        };
        let headers: HashMap<String, String> = config
            .config
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("header.")?.to_string(), v.clone())))
            .collect();
        let commits = rest_backend::RestCommits::connect(
            &config.name,
            &uri,
            warehouse.as_deref(),
            match (&token, &credentials) {
                (Some(token), _) => rest_backend::Bearer::Token(token.clone()),
                (None, Some(credentials)) => {
                    rest_backend::Bearer::Credentials(Arc::clone(credentials))
                }
                (None, None) => rest_backend::Bearer::None,
            },
            &headers,
        )
        .await?;
        let aws = AwsSettings::from_config(&config.config)?;
        let mut props: HashMap<String, String> = config
            .config
            .iter()
            .filter(|(k, _)| {
                *k == PROP_URI
                    || *k == PROP_WAREHOUSE
                    || *k == PROP_TOKEN
                    || *k == PROP_CREDENTIAL
                    || *k == PROP_OAUTH_SERVER
                    || *k == PROP_SCOPE
                    || k.starts_with("header.")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        props.extend(aws.file_io_properties());
        let catalog = RestCatalogBuilder::default()
            .with_storage_factory(Arc::new(storage::StoragesFactory))
            .load(&config.name, props)
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot open REST catalog '{}' at '{uri}': {}",
                    config.name,
                    e.message()
                ))
            })?;
        // The token is the caller's own: a connection handed on names the
        // catalog, and its holder brings their own token.
        let mut client_properties = BTreeMap::from([
            ("type".to_string(), "rest".to_string()),
            ("uri".to_string(), uri.clone()),
        ]);
        if let Some(warehouse) = &warehouse {
            client_properties.insert("warehouse".to_string(), warehouse.clone());
        }
        let catalog = Arc::new(catalog);
        if let Some(period) = refresh {
            oauth::keep_fresh(&catalog, period);
        }
        let scoped = scoped::ScopedCatalog::new(catalog);
        Ok(Self {
            name: config.name.clone(),
            catalog: Arc::new(scoped.clone()),
            scoped,
            pointers: pointer::PointerStore::Rest(commits),
            kind: CatalogKind::Rest { uri, warehouse },
            aws,
            client_properties,
            local: Default::default(),
            seal_key: Default::default(),
            manifests: Default::default(),
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

    /// [`Self::client_properties`] with the catalog's `name`: everything a
    /// `load_catalog(props.pop("name"), **props)` call needs.
    pub(crate) fn named_client_properties(&self) -> BTreeMap<String, String> {
        let mut properties = self.client_properties.clone();
        properties.insert("name".to_string(), self.name.clone());
        properties
    }

    /// [`Self::named_client_properties`] as JSON, the `connection` column
    /// of `CREATE UPLOAD` and `CREATE DOWNLOAD`.
    pub(crate) fn connection_json(&self) -> Result<String> {
        serde_json::to_string(&self.named_client_properties())
            .map_err(|e| Error::invalid(e.to_string()))
    }

    /// A turn at committing to `key` (a table): this process's commits to
    /// one table wait for each other instead of conflicting and retrying.
    pub(crate) async fn exclusive(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.local.turns.exclusive(key).await
    }

    /// A turn at `key` if no one in this process holds it now: for work
    /// that one process needs to do once however many callers find it due
    /// (merging a log's manifests), where a caller that finds it taken
    /// leaves it to the holder.
    pub(crate) fn try_exclusive(&self, key: &str) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.local.turns.try_exclusive(key)
    }

    /// This process's turns, and the queues of its group commits.
    pub(crate) fn local(&self) -> &commit::group::Local {
        &self.local
    }

    /// The manifests this process decoded, by path ([`manifests::lookup`]).
    pub(crate) fn manifests(&self) -> &manifests::lookup::Manifests {
        &self.manifests
    }

    /// Where the sealing key is kept once read.
    pub(crate) fn seal_key(&self) -> &tokio::sync::OnceCell<Vec<u8>> {
        &self.seal_key
    }

    /// Why `table`'s current metadata file is not the one icestage
    /// committed, if it is not ([`pointer::rewritten`]). A table this
    /// process committed, or whose file it checked since parsing it, is not
    /// read again: what it parsed stays what it parsed (a table parsed from
    /// its file again is checked again).
    pub(crate) async fn metadata_rewritten(&self, table: &Table) -> Result<Option<String>> {
        let kept = self.scoped.kept_tables();
        if kept.is_some_and(|kept| kept.vouched(table)) {
            return Ok(None);
        }
        let Some(path) = table.metadata_location() else {
            return Ok(None);
        };
        let rewritten = pointer::rewritten(table.file_io(), path).await?;
        if rewritten.is_none()
            && let Some(kept) = kept
        {
            kept.vouch(table);
        }
        Ok(rewritten)
    }

    /// Reports an append this process committed to `appended`: the upkeep
    /// it leaves due (snapshot expiry, manifest merges) runs apart
    /// ([`maintain::upkeep`]). Commit code calls this, never the upkeep itself.
    pub(crate) fn appended(&self, appended: Table, whose: Owner) {
        maintain::upkeep::after_append(self, appended, whose);
    }

    /// [`IcebergCatalog::appended`] for the version a commit of this process
    /// made on top of `base` (`metadata`, at `location`), without reading it
    /// back.
    pub(crate) fn appended_version(
        &self,
        base: &Table,
        metadata: iceberg::spec::TableMetadata,
        location: String,
    ) {
        if let Ok(current) = snapshot::successor(base, metadata, location) {
            self.appended(current, Owner::User);
        }
    }

    /// This catalog as commits that must land on exactly the version they
    /// loaded see it ([`scoped::ScopedCatalog::exact`]).
    pub(crate) fn exact(&self) -> scoped::ScopedCatalog {
        self.scoped.clone().exact(self.pointers.clone())
    }

    /// Compare-and-swap of this catalog's table pointers.
    pub(crate) fn pointers(&self) -> &pointer::PointerStore {
        &self.pointers
    }

    pub(crate) fn kind(&self) -> &CatalogKind {
        &self.kind
    }

    pub(crate) fn aws(&self) -> &AwsSettings {
        &self.aws
    }

    /// Where a new table of this namespace is placed, mirroring the SQL
    /// catalog's rule; `None` where the catalog chooses (S3 Tables).
    pub(crate) fn default_table_location(&self, ident: &TableIdent) -> Option<String> {
        Some(format!(
            "{}/{}",
            self.default_namespace_location(ident.namespace())?,
            ident.name()
        ))
    }

    /// Where a promotion leaves the staging files it registers in a target
    /// (the staging namespace's folder): besides a target's own location,
    /// where its data files may lie.
    pub(crate) fn promoted_roots(&self) -> Vec<String> {
        self.default_namespace_location(&NamespaceIdent::new(STAGING_NAMESPACE.to_string()))
            .into_iter()
            .collect()
    }

    /// The folder under which this catalog places the tables of
    /// `namespace` by default (the SQL catalog's rule); `None` for catalogs
    /// that place each table themselves.
    pub(crate) fn default_namespace_location(&self, namespace: &NamespaceIdent) -> Option<String> {
        match &self.kind {
            CatalogKind::Sql { warehouse, .. } => {
                Some(format!("{warehouse}/{}", namespace.join("/")))
            }
            CatalogKind::S3Tables { .. } | CatalogKind::Rest { .. } => None,
        }
    }

    /// Where this catalog placed `table`, as far as icestage can tell
    /// without asking it: the SQL catalog's rule, or for a REST catalog the
    /// location it gave the table at creation (no client can move it:
    /// icestage's REST catalog refuses `set-location`). `None` for S3
    /// Tables, which reports each table's storage itself.
    pub(crate) fn placed_location(&self, table: &Table) -> Option<String> {
        match &self.kind {
            CatalogKind::Sql { .. } => self.default_table_location(table.identifier()),
            CatalogKind::Rest { .. } => Some(table.metadata().location().to_string()),
            CatalogKind::S3Tables { .. } => None,
        }
    }

    /// Where `table`'s files may be read and deleted by maintenance
    /// (expiry, manifest rewrites): [`Self::placed_location`], or as the
    /// catalog reports it (S3 Tables). On a SQL catalog, a table a trusted
    /// tool placed elsewhere under the warehouse (PyIceberg's
    /// `<namespace>.db/<table>`) keeps the location its metadata gives;
    /// nothing outside the warehouse is ever accepted. Session tables are
    /// held to the rule alone (`upload::confine`).
    pub(crate) async fn assigned_location(&self, table: &Table) -> Result<String> {
        if let (CatalogKind::Sql { warehouse, .. }, Some(placed)) =
            (&self.kind, self.placed_location(table))
        {
            let claimed = table.metadata().location();
            if confine::canonical(claimed) != confine::canonical(&placed)
                && confine::is_under(claimed, warehouse)
            {
                return Ok(claimed.to_string());
            }
            return Ok(placed);
        }
        self.placed_or_reported(table).await
    }

    /// Where this catalog put `table`, by its rule alone or as it reports
    /// it (S3 Tables), never by the table's metadata: what session tables
    /// are held to.
    pub(crate) async fn placed_or_reported(&self, table: &Table) -> Result<String> {
        if let Some(location) = self.placed_location(table) {
            return Ok(location);
        }
        let ident = table.identifier();
        self.pointers
            .assigned_location(ident)
            .await?
            .ok_or_else(|| {
                Error::internal(format!(
                    "catalog '{}' cannot say where {ident} is stored",
                    self.name
                ))
            })
    }

    /// Whether icestage can register metadata it wrote (keeping a target's
    /// field ids in a staging table). S3 Tables cannot.
    pub(crate) fn can_register_tables(&self) -> bool {
        matches!(self.kind, CatalogKind::Sql { .. })
    }

    /// Whether promotion may register staged files in the target as they
    /// are: only where no credential that can still write reaches them after
    /// verification. That holds for a SQL catalog on a local warehouse, where
    /// a client's connection is the catalog itself (trusted clients only);
    /// on S3 a vended credential may outlive the promotion, and S3 Tables
    /// deletes a table's storage with the table.
    pub(crate) fn zero_copy_safe(&self) -> bool {
        match &self.kind {
            CatalogKind::Sql { warehouse, .. } => !on_s3(warehouse),
            CatalogKind::S3Tables { .. } | CatalogKind::Rest { .. } => false,
        }
    }

    /// Removes a session table from the catalog, then its files: only paths
    /// under the location icestage gave the table are deleted, whatever its
    /// metadata names (the metadata may be a client's). With
    /// [`Removal::MetadataOnly`] its data files stay: the target references
    /// them. S3 Tables deletes the table's own storage with it.
    pub(crate) async fn remove_table(&self, table: &Table, removal: Removal) -> Result<()> {
        self.remove_table_within(table, self.placed_location(table), removal)
            .await
    }

    /// [`Self::remove_table`], deleting only under `location` (`None`:
    /// nothing, as for S3 Tables, which deleted the table's storage with it).
    pub(crate) async fn remove_table_within(
        &self,
        table: &Table,
        location: Option<String>,
        removal: Removal,
    ) -> Result<()> {
        let ident = table.identifier();
        let result = match &self.kind {
            CatalogKind::Sql { .. } | CatalogKind::Rest { .. } => {
                self.catalog.drop_table(ident).await
            }
            CatalogKind::S3Tables { .. } => self.catalog.purge_table(ident).await,
        };
        if let Err(e) = result {
            // A concurrent clean-up got there first (S3 Tables reports it as
            // an unexpected error, so ask).
            if self.catalog.table_exists(ident).await.unwrap_or(true) {
                return Err(e.into());
            }
            return Ok(());
        }
        let Some(location) = location else {
            return Ok(());
        };
        manifests::delete_confined(table, &location, removal).await
    }

    /// Drops `table` with its files, if it exists: as [`Self::remove_table`]
    /// does, through the deletion gate (iceberg's own purge is never run).
    pub(crate) async fn purge_if_exists(&self, table: &TableIdent) -> Result<()> {
        match self.load_if_present(table).await? {
            Some(loaded) => self.remove_table(&loaded, Removal::Everything).await,
            None => Ok(()),
        }
    }

    /// Loads `ident` if the catalog has it. A session table is removed
    /// entry first, files next ([`Self::remove_table`]), so a load racing
    /// its removal can read the pointer and then find the metadata file
    /// gone: that, too, is `None` once the entry is gone.
    pub(crate) async fn load_if_present(&self, ident: &TableIdent) -> Result<Option<Table>> {
        match self.catalog.load_table(ident).await {
            Ok(table) => Ok(Some(table)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => self.unless_removed(ident, e.into()).await.map(|()| None),
        }
    }

    /// `error`, unless table `ident` is no longer in the catalog: what
    /// failed read a table that was removed meanwhile.
    pub(crate) async fn unless_removed(&self, ident: &TableIdent, error: Error) -> Result<()> {
        if self.catalog.table_exists(ident).await.unwrap_or(true) {
            return Err(error);
        }
        Ok(())
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

    /// Table `ident`, created with `schema` (and its namespace) unless it
    /// exists; racing creators both get the table. For the tables icestage
    /// keeps for itself: see [`Self::owned_table`].
    pub(crate) async fn table_or_create(
        &self,
        ident: &TableIdent,
        schema: impl FnOnce() -> Result<Schema>,
    ) -> Result<Table> {
        self.owned_table(ident, schema, None).await
    }

    /// One of the tables icestage keeps for itself (logs, deliveries,
    /// pipes), created with `schema` unless it exists, with
    /// [`OWNED_TABLE_PROPERTIES`] (a bounded metadata folder) and, with
    /// `partition_by = Some((field id, name))`, partitioned by that column's
    /// value, so a lookup by it reads only the manifests that hold it. A
    /// table created before either is brought up to date here (new files are
    /// partitioned; older ones stay as they are).
    pub(crate) async fn owned_table(
        &self,
        ident: &TableIdent,
        schema: impl FnOnce() -> Result<Schema>,
        partition_by: Option<(i32, &str)>,
    ) -> Result<Table> {
        let spec = partition_by
            .map(|(field, name)| {
                iceberg::spec::UnboundPartitionSpec::builder()
                    .add_partition_field(field, name, iceberg::spec::Transform::Identity)
                    .map(|b| b.build())
            })
            .transpose()?;
        let table = match self.catalog.load_table(ident).await {
            Ok(table) => table,
            Err(e) if is_missing(&e) => {
                self.ensure_namespace(ident.namespace()).await?;
                let schema = schema()?;
                let creation = TableCreation::builder()
                    .name(ident.name().to_string())
                    .schema(schema.clone())
                    .partition_spec_opt(spec.clone())
                    .properties(own_properties(&schema))
                    .build();
                match self.catalog.create_table(ident.namespace(), creation).await {
                    Ok(table) => return Ok(table),
                    // Another process created it first (the SQL catalog may
                    // report the race as a failed insert rather than
                    // TableAlreadyExists).
                    Err(e) => self.catalog.load_table(ident).await.map_err(|_| e)?,
                }
            }
            Err(e) => return Err(e.into()),
        };
        // Boxed: the callers' futures nest deep enough already.
        Box::pin(self.bring_up_to_date(table, spec)).await
    }

    /// Sets the owned-table properties and the partition spec on a table
    /// created without them; the table as it is afterwards.
    async fn bring_up_to_date(
        &self,
        table: Table,
        spec: Option<iceberg::spec::UnboundPartitionSpec>,
    ) -> Result<Table> {
        use iceberg::TableUpdate;

        let mut table = table;
        for _ in 0..10 {
            let props = table.metadata().properties();
            let missing: HashMap<String, String> =
                own_properties(table.metadata().current_schema())
                    .into_iter()
                    .filter(|(k, _)| !props.contains_key(k))
                    .collect();
            let repartition = spec
                .as_ref()
                .filter(|_| table.metadata().default_partition_spec().is_unpartitioned());
            if missing.is_empty() && repartition.is_none() {
                return Ok(table);
            }
            let mut updates = vec![];
            if !missing.is_empty() {
                updates.push(TableUpdate::SetProperties { updates: missing });
            }
            if let Some(spec) = repartition {
                updates.push(TableUpdate::AddSpec { spec: spec.clone() });
                updates.push(TableUpdate::SetDefaultSpec { spec_id: -1 });
            }
            // A race with another process (an append, the same change) is
            // met by looking again.
            let _ = commit::append::apply_append(self, &table, updates).await?;
            table = self.catalog.load_table(table.identifier()).await?;
        }
        Ok(table)
    }
}

/// Properties of the tables icestage keeps for itself: ten earlier metadata
/// versions kept, older metadata files deleted after each commit.
pub(crate) const OWNED_TABLE_PROPERTIES: [(&str, &str); 2] = [
    ("write.metadata.previous-versions-max", "10"),
    ("write.metadata.delete-after-commit.enabled", "true"),
];

/// The names of `table`'s current columns, in order.
pub(crate) fn column_names(table: &Table) -> Vec<String> {
    table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

pub(crate) fn owned_table_properties() -> HashMap<String, String> {
    OWNED_TABLE_PROPERTIES
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Properties of a session's table (a staging or download table):
/// [`OWNED_TABLE_PROPERTIES`], and its manifests never merged (by icestage
/// or a client honouring the property): a staging table takes appends alone
/// (a merge's `replace` snapshot would leave its upload unpromotable), a
/// download table one fill.
pub(crate) fn session_table_properties() -> HashMap<String, String> {
    let mut properties = owned_table_properties();
    properties.insert(
        maintain::upkeep::MANIFEST_MERGE_ENABLED.into(),
        "false".into(),
    );
    properties
}

/// True for "no such table / namespace" errors.
pub(crate) fn is_missing(error: &iceberg::Error) -> bool {
    matches!(
        error.kind(),
        iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound
    )
}

/// Properties of the tables only icestage writes ([`IcebergCatalog::owned_table`]):
/// [`OWNED_TABLE_PROPERTIES`]; manifest entries that keep the bounds of the
/// timestamp columns alone (what reading "recorded since" prunes by; a
/// lookup by the partition column prunes by partition values), so a merge
/// or a lookup decodes a few fields per entry instead of five per column;
/// and snappy for data files of a row or two, where zstd's per-column
/// contexts cost more than they save.
fn own_properties(schema: &Schema) -> HashMap<String, String> {
    let mut properties = owned_table_properties();
    properties.insert(bridge::writer::METRICS_DEFAULT.into(), "none".into());
    properties.insert(bridge::writer::CODEC_PROPERTY.into(), "snappy".into());
    for field in schema.as_struct().fields() {
        if matches!(
            *field.field_type,
            iceberg::spec::Type::Primitive(
                iceberg::spec::PrimitiveType::Timestamptz | iceberg::spec::PrimitiveType::Timestamp
            )
        ) {
            properties.insert(
                format!("{}{}", bridge::writer::METRICS_COLUMN, field.name),
                "full".into(),
            );
        }
    }
    properties
}

/// What [`IcebergCatalog::remove_table`] deletes besides the catalog entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// Every file of the table (within its location).
    Everything,
    /// Its metadata files only: another table references its data files.
    MetadataOnly,
    /// Every file under its location, referenced or not: for tables only
    /// icestage and its cluster write (a download), whose location may hold
    /// files a retried task wrote and no commit references.
    Location,
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

/// `ids` written as new data files of [`test_table`]'s table (not
/// committed).
#[cfg(test)]
pub(crate) async fn test_files(table: &Table, ids: Vec<i64>) -> Vec<iceberg::spec::DataFile> {
    use datafusion::arrow::array::{Int64Array, RecordBatch};

    let schema = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap(),
    );
    let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(ids))]).unwrap();
    bridge::writer::write_rows(
        table,
        &format!("test-{}", uuid::Uuid::new_v4().simple()),
        futures::stream::iter([Ok(batch)]),
    )
    .await
    .unwrap()
}

/// What the catalog's unit tests share: a table `s.t` (one `id` column) in
/// a fresh embedded catalog under `dir`.
#[cfg(test)]
pub(crate) async fn test_table(dir: &std::path::Path) -> (IcebergCatalog, Table) {
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    let config = crate::config::IcestageConfig::embedded(dir).unwrap();
    let catalog = IcebergCatalog::open(&config.catalogs[0]).await.unwrap();
    let ident = TableIdent::new(NamespaceIdent::new("s".into()), "t".into());
    let table = catalog
        .table_or_create(&ident, || {
            Ok(Schema::builder()
                .with_fields(vec![Arc::new(NestedField::required(
                    1,
                    "id",
                    Type::Primitive(PrimitiveType::Long),
                ))])
                .build()?)
        })
        .await
        .unwrap();
    (catalog, table)
}

/// Whether a SQL catalog's `warehouse` is on S3 (else a local folder).
fn on_s3(warehouse: &str) -> bool {
    warehouse.starts_with("s3://") || warehouse.starts_with("s3a://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_table_removed_while_it_is_read_is_absent_and_a_broken_one_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = test_table(dir.path()).await;
        let ident = table.identifier().clone();
        assert!(catalog.load_if_present(&ident).await.unwrap().is_some());

        // The metadata file gone while the entry stays is an error.
        let metadata = table.metadata_location().unwrap();
        let metadata = metadata.strip_prefix("file://").unwrap_or(metadata);
        std::fs::rename(metadata, format!("{metadata}.away")).unwrap();
        // A second connection: nothing of the table cached.
        let config = crate::config::IcestageConfig::embedded(dir.path()).unwrap();
        let catalog = IcebergCatalog::open(&config.catalogs[0]).await.unwrap();
        let broken = catalog.load_if_present(&ident).await.unwrap_err();
        assert!(broken.to_string().contains("No such file"), "{broken}");

        // A read that failed because the table was removed meanwhile (its
        // entry, then its files) is no error.
        catalog.catalog().drop_table(&ident).await.unwrap();
        let failed = Error::internal("the metadata file is gone");
        catalog.unless_removed(&ident, failed).await.unwrap();
        assert!(catalog.load_if_present(&ident).await.unwrap().is_none());
    }
}
