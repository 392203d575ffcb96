//! The REST catalog as an API token with the `catalog` operation sees it:
//! the tables of one of the service's catalogs (the token's first, or the
//! one its path's prefix names) that the token's `tables` reach
//! (`namespace.table`, `namespace.*`, `*`), with what an engine that manages
//! tables needs: namespaces (list, load, create, update and remove
//! properties, drop when empty; the last two only for a token that owns
//! every table of the namespace), tables (list, load, create plain or in
//! stages, rename, register, drop) and commits of any kind. Another
//! icestage uses it as its `type = "rest"` catalog.
//!
//! Commits are checked against their requirements and applied by icestage
//! on exactly the version checked (the same compare-and-swap as a session's
//! append), so a lost race is a 409 the client retries. A table outside the
//! token's reach answers 404, as if it did not exist; creating one there is
//! 403. A table is placed where the catalog places it (a request that names
//! another location is refused); a renamed table keeps its folder, and no
//! new table may take a folder a live table holds, nor a purge delete in
//! one (`crate::catalog::claims`).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::StatusCode;
use iceberg::spec::{
    FormatVersion, TableMetadata, TableMetadataBuilder, ViewFormatVersion, ViewMetadataBuilder,
};
use iceberg::{
    NamespaceIdent, TableCreation, TableIdent, TableRequirement, TableUpdate, ViewUpdate,
};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
    RegisterTableRequest, RenameTableRequest,
};

use super::error::RestError;
use super::view::{
    CatalogView, CommitTransactionRequest, CommitViewRequest, CreateViewRequest,
    UpdateNamespaceProperties, ViewRequirement, ViewResult,
};
use crate::catalog::IcebergCatalog;
use crate::credentials::sign::{SignRequest, SignResponse};
use crate::service::config::TokenSettings;

/// The most requirements and updates one commit through the catalog view
/// may carry.
const MAX_CHANGES: usize = 64;

/// The endpoints a catalog token is served, as `GET /v1/config` lists them.
const ENDPOINTS: &[&str] = &[
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/tables/rename",
    "POST /v1/{prefix}/namespaces/{namespace}/register",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
    "POST /v1/{prefix}/namespaces/{namespace}/views",
    "GET /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/views/rename",
];

/// Whether endpoint `endpoint` of [`ENDPOINTS`] is served only on a SQL
/// catalog (icestage adds those tables, and keeps views, in the catalog's
/// database itself).
fn sql_only(endpoint: &str) -> bool {
    endpoint.ends_with("/register") || endpoint.contains("/views")
}

/// The most property changes one namespace update may carry.
const MAX_NAMESPACE_CHANGES: usize = 1000;

/// The property the JDBC layout keeps so that a namespace without
/// properties of its own exists.
const NAMESPACE_MARK: &str = "exists";

/// See the module documentation.
pub(crate) struct TokenView {
    token: TokenSettings,
    catalog: Arc<IcebergCatalog>,
}

fn dotted(namespace: &NamespaceIdent) -> String {
    namespace.join(".")
}

impl TokenView {
    pub(crate) fn new(token: TokenSettings, catalog: Arc<IcebergCatalog>) -> Self {
        Self { token, catalog }
    }

    fn no_namespace(&self, namespace: &NamespaceIdent) -> RestError {
        RestError::new(
            StatusCode::NOT_FOUND,
            "NoSuchNamespaceException",
            format!(
                "namespace {} does not exist or is not reached by token '{}'",
                dotted(namespace),
                self.token.name
            ),
        )
    }

    fn no_table(&self, table: &TableIdent) -> RestError {
        RestError::new(
            StatusCode::NOT_FOUND,
            "NoSuchTableException",
            format!(
                "table {table} does not exist or is not reached by token '{}'",
                self.token.name
            ),
        )
    }

    /// 403 for creating `what` outside the token's reach.
    fn may_not_create(&self, what: &str) -> RestError {
        RestError::new(
            StatusCode::FORBIDDEN,
            "ForbiddenException",
            format!(
                "token '{}' may not create {what}: its tables are {}",
                self.token.name,
                self.token.tables.join(", ")
            ),
        )
    }

    fn visible_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<()> {
        if self.token.reaches_namespace(&dotted(namespace)) {
            Ok(())
        } else {
            Err(self.no_namespace(namespace))
        }
    }

    fn visible_table(&self, table: &TableIdent) -> ViewResult<()> {
        if self
            .token
            .reaches(&format!("{}.{}", dotted(table.namespace()), table.name()))
        {
            Ok(())
        } else {
            Err(self.no_table(table))
        }
    }

    /// 403 for changing or dropping `namespace` without every table of it.
    fn owned_namespace(&self, namespace: &NamespaceIdent, what: &str) -> ViewResult<()> {
        if self.token.owns_namespace(&dotted(namespace)) {
            return Ok(());
        }
        self.visible_namespace(namespace)?;
        Err(RestError::new(
            StatusCode::FORBIDDEN,
            "ForbiddenException",
            format!(
                "token '{}' may not {what} namespace {}: that takes every table of it \
                 ('{}.*' or '*' among its tables)",
                self.token.name,
                dotted(namespace),
                dotted(namespace)
            ),
        ))
    }

    async fn table(&self, ident: &TableIdent) -> ViewResult<iceberg::table::Table> {
        self.visible_table(ident)?;
        match self.catalog.catalog().load_table(ident).await {
            Ok(table) => Ok(table),
            Err(e)
                if matches!(
                    e.kind(),
                    iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound
                ) =>
            {
                Err(self.no_table(ident))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Where new table `ident` goes: where the catalog places it, unless a
    /// live table's location overlaps that folder (a table renamed from
    /// there keeps its files there), which is a 409 (`None`: a catalog that
    /// places tables itself).
    async fn free_location(&self, ident: &TableIdent) -> ViewResult<Option<String>> {
        let Some(location) = self.catalog.default_table_location(ident) else {
            return Ok(None);
        };
        self.unheld(ident, &location).await?;
        Ok(Some(location))
    }

    /// 409 when a live table's location overlaps `location`, where new
    /// table `ident` would go.
    async fn unheld(&self, ident: &TableIdent, location: &str) -> ViewResult<()> {
        let holders = self.catalog.holders(location, None).await?;
        let Some((holder, _)) = holders.first() else {
            return Ok(());
        };
        if holder == ident {
            return Err(already_exists(ident));
        }
        let whose = if self.visible_table(holder).is_ok() {
            format!("table {holder}")
        } else {
            "a table this token does not reach".to_string()
        };
        Err(RestError::new(
            StatusCode::CONFLICT,
            "AlreadyExistsException",
            format!(
                "{ident}: its location {location} overlaps the files of {whose} (a table renamed \
                 keeps its folder): choose another name, or drop that table first"
            ),
        ))
    }

    /// 404 unless `namespace` exists (and is visible).
    async fn existing_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<()> {
        self.visible_namespace(namespace)?;
        if self.catalog.catalog().namespace_exists(namespace).await? {
            Ok(())
        } else {
            Err(self.no_namespace(namespace))
        }
    }

    /// The commit of a staged creation (`assert-create`): the table its
    /// updates describe, built from them as a create builds it, placed
    /// where the catalog places tables, with the rest of the updates (the
    /// transaction's appends, schema changes) applied on top, all in the
    /// table's first metadata file; 409 when the table exists by then.
    async fn create_committed(
        &self,
        ident: &TableIdent,
        request: CommitTableRequest,
    ) -> ViewResult<CommitTableResponse> {
        if self.visible_table(ident).is_err() {
            return Err(self.may_not_create(&format!("table {ident}")));
        }
        if let Some(other) = request
            .requirements
            .iter()
            .find(|r| !matches!(r, TableRequirement::NotExist))
        {
            return Err(bad_request(format!(
                "{ident}: a commit that creates the table asserts only that it does not exist; \
                 it also asserts {}",
                serde_json::to_string(other).unwrap_or_default()
            )));
        }
        self.existing_namespace(ident.namespace()).await?;
        let exists = || {
            RestError::new(
                StatusCode::CONFLICT,
                "CommitFailedException",
                format!("{ident} was created meanwhile: requirement failed: table already exists"),
            )
        };
        if self.catalog.catalog().table_exists(ident).await? {
            return Err(exists());
        }
        let Some(location) = self.free_location(ident).await? else {
            return Err(not_on_this_catalog(ident, "staged creation"));
        };
        let outside = crate::catalog::confine::paths_outside(&request.updates, &location);
        if !outside.is_empty() {
            return Err(RestError::new(
                StatusCode::FORBIDDEN,
                "ForbiddenException",
                format!(
                    "{ident}: {}: a commit may only name files under the table's location",
                    outside.join("; ")
                ),
            ));
        }
        let metadata = created(ident, &location, request.updates)?;
        let table = self
            .catalog
            .add_table(ident, metadata)
            .await?
            .ok_or_else(exists)?;
        Ok(CommitTableResponse {
            metadata_location: table.metadata_location_result()?.to_string(),
            metadata: table.metadata().clone(),
        })
    }

    fn no_view(&self, view: &TableIdent) -> RestError {
        RestError::new(
            StatusCode::NOT_FOUND,
            "NoSuchViewException",
            format!(
                "view {view} does not exist or is not reached by token '{}'",
                self.token.name
            ),
        )
    }

    /// 501 unless the catalog keeps views.
    fn keeping_views(&self) -> ViewResult<()> {
        if self.catalog.keeps_views() {
            Ok(())
        } else {
            Err(RestError::new(
                StatusCode::NOT_IMPLEMENTED,
                "NotImplementedException",
                format!(
                    "catalog '{}' keeps no views here: views are served on SQL catalogs",
                    self.catalog.name()
                ),
            ))
        }
    }

    /// View `ident` as stored; 404 when it does not exist or is out of
    /// reach (views are reached as tables are: `namespace.view`).
    async fn view(&self, ident: &TableIdent) -> ViewResult<crate::catalog::views::StoredView> {
        self.keeping_views()?;
        if self.visible_table(ident).is_err() {
            return Err(self.no_view(ident));
        }
        self.catalog
            .load_view(ident)
            .await?
            .ok_or_else(|| self.no_view(ident))
    }
}

#[async_trait]
impl CatalogView for TokenView {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> ViewResult<ListNamespaceResponse> {
        let namespaces = self.catalog.catalog().list_namespaces(parent).await?;
        Ok(ListNamespaceResponse {
            namespaces: namespaces
                .into_iter()
                .filter(|ns| self.token.reaches_namespace(&dotted(ns)))
                .collect(),
            next_page_token: None,
        })
    }

    async fn load_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<NamespaceResponse> {
        self.visible_namespace(namespace)?;
        match self.catalog.catalog().get_namespace(namespace).await {
            Ok(found) => Ok(NamespaceResponse {
                namespace: found.name().clone(),
                properties: found.properties().clone(),
            }),
            Err(e) if e.kind() == iceberg::ErrorKind::NamespaceNotFound => {
                Err(self.no_namespace(namespace))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn create_namespace(
        &self,
        request: CreateNamespaceRequest,
    ) -> ViewResult<NamespaceResponse> {
        let namespace = request.namespace;
        if !self.token.reaches_namespace(&dotted(&namespace)) {
            return Err(self.may_not_create(&format!("namespace {}", dotted(&namespace))));
        }
        let created = self
            .catalog
            .catalog()
            .create_namespace(&namespace, request.properties)
            .await
            .map_err(|e| match e.kind() {
                iceberg::ErrorKind::NamespaceAlreadyExists => RestError::new(
                    StatusCode::CONFLICT,
                    "AlreadyExistsException",
                    format!("namespace {} already exists", dotted(&namespace)),
                ),
                _ => e.into(),
            })?;
        Ok(NamespaceResponse {
            namespace: created.name().clone(),
            properties: created.properties().clone(),
        })
    }

    /// Sets `updates` and removes `removals` among `namespace`'s
    /// properties: which were updated, removed, and asked to be removed but
    /// missing.
    async fn update_namespace_properties(
        &self,
        namespace: &NamespaceIdent,
        request: UpdateNamespaceProperties,
    ) -> ViewResult<serde_json::Value> {
        self.owned_namespace(namespace, "change")?;
        let unprocessable = |message: String| {
            RestError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "UnprocessableEntityException",
                message,
            )
        };
        let (removals, updates) = (
            request.removals.unwrap_or_default(),
            request.updates.unwrap_or_default(),
        );
        if removals.len() + updates.len() > MAX_NAMESPACE_CHANGES {
            return Err(unprocessable(format!(
                "{} property changes in one request, more than {MAX_NAMESPACE_CHANGES}: send \
                 them in several",
                removals.len() + updates.len()
            )));
        }
        if let Some(both) = removals.iter().find(|k| updates.contains_key(*k)) {
            return Err(unprocessable(format!(
                "property '{both}' is both removed and updated: name it once"
            )));
        }
        if removals.iter().any(|k| k == NAMESPACE_MARK) {
            return Err(unprocessable(format!(
                "property '{NAMESPACE_MARK}' marks the namespace in the catalog database: it \
                 cannot be removed"
            )));
        }
        let current = self.load_namespace(namespace).await?.properties;
        let (removed, missing): (Vec<String>, Vec<String>) =
            removals.into_iter().partition(|k| current.contains_key(k));
        let catalog = self.catalog.catalog();
        if !updates.is_empty() {
            catalog.update_namespace(namespace, updates.clone()).await?;
        }
        if !removed.is_empty() {
            self.catalog
                .pointers()
                .remove_namespace_properties(namespace, &removed)
                .await
                .map_err(|e| match e.kind() {
                    iceberg::ErrorKind::FeatureUnsupported => {
                        unprocessable(e.message().to_string())
                    }
                    _ => e.into(),
                })?;
        }
        let mut updated: Vec<String> = updates.into_keys().collect();
        updated.sort();
        Ok(serde_json::json!({"updated": updated, "removed": removed, "missing": missing}))
    }

    /// Drops `namespace` when it holds no table and no namespace: 409
    /// otherwise (a table the token does not reach counts too, unnamed).
    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<()> {
        self.owned_namespace(namespace, "drop")?;
        self.load_namespace(namespace).await?;
        let catalog = self.catalog.catalog();
        let tables = catalog.list_tables(namespace).await?.len();
        let views = if self.catalog.keeps_views() {
            self.catalog.list_views(namespace).await?.len()
        } else {
            0
        };
        // Children only: a SQL catalog answers every namespace whose name
        // starts with the parent's text (`db2` for `db`).
        let children = catalog
            .list_namespaces(Some(namespace))
            .await?
            .iter()
            .filter(|child| child.len() > namespace.len() && child.starts_with(namespace))
            .count();
        if tables + views + children > 0 {
            return Err(RestError::new(
                StatusCode::CONFLICT,
                "NamespaceNotEmptyException",
                format!(
                    "namespace {} is not empty ({tables} table(s), {views} view(s), {children} \
                     namespace(s)): drop what it holds first",
                    dotted(namespace)
                ),
            ));
        }
        catalog.drop_namespace(namespace).await?;
        Ok(())
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> ViewResult<ListTablesResponse> {
        self.visible_namespace(namespace)?;
        let tables = self
            .catalog
            .catalog()
            .list_tables(namespace)
            .await
            .map_err(|e| match e.kind() {
                iceberg::ErrorKind::NamespaceNotFound => self.no_namespace(namespace),
                _ => e.into(),
            })?;
        Ok(ListTablesResponse {
            identifiers: tables
                .into_iter()
                .filter(|t| self.visible_table(t).is_ok())
                .collect(),
            next_page_token: None,
        })
    }

    async fn load_table(&self, ident: &TableIdent) -> ViewResult<LoadTableResult> {
        let table = self.table(ident).await?;
        Ok(loaded(&table))
    }

    async fn table_exists(&self, ident: &TableIdent) -> ViewResult<()> {
        self.visible_table(ident)?;
        if self.catalog.catalog().table_exists(ident).await? {
            Ok(())
        } else {
            Err(self.no_table(ident))
        }
    }

    /// The endpoints this view serves, as `GET /v1/config` lists them.
    fn endpoints(&self) -> Vec<&'static str> {
        let sql = self.catalog.file_io().is_some();
        ENDPOINTS
            .iter()
            .filter(|endpoint| sql || !sql_only(endpoint))
            .copied()
            .collect()
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        request: CreateTableRequest,
    ) -> ViewResult<LoadTableResult> {
        let ident = TableIdent::new(namespace.clone(), request.name.clone());
        if self.visible_table(&ident).is_err() {
            return Err(self.may_not_create(&format!("table {ident}")));
        }
        if let Some(location) = &request.location
            && self.catalog.default_table_location(&ident).as_deref() != Some(location.as_str())
        {
            return Err(bad_request(format!(
                "{ident}: location '{location}' was asked for; this catalog places tables itself, \
                 leave location out"
            )));
        }
        let location = self.free_location(&ident).await?;
        let mut properties = request.properties;
        let format_version = format_version(&ident, &mut properties)?;
        let creation = TableCreation::builder()
            .name(request.name)
            .location_opt(location.clone())
            .schema(request.schema)
            .partition_spec_opt(request.partition_spec)
            .sort_order_opt(request.write_order)
            .properties(properties)
            .format_version(format_version)
            .build();
        if location.is_some() {
            // A SQL catalog: icestage builds the metadata and adds the
            // table itself, numbering nested fields as Iceberg's own
            // catalogs do.
            self.existing_namespace(namespace).await?;
            let metadata = with_java_field_ids(
                TableMetadataBuilder::from_table_creation(creation)?
                    .build()?
                    .metadata,
            )?;
            if request.stage_create == Some(true) {
                // Nothing is kept: the commit that creates the table sends
                // everything this metadata holds (`create_committed`).
                return Ok(LoadTableResult {
                    metadata_location: None,
                    metadata,
                    config: HashMap::new(),
                    storage_credentials: None,
                });
            }
            let table = self
                .catalog
                .add_table(&ident, metadata)
                .await?
                .ok_or_else(|| already_exists_named(&ident, "a table or view"))?;
            return Ok(loaded(&table));
        }
        if request.stage_create == Some(true) {
            return Err(not_on_this_catalog(&ident, "staged creation"));
        }
        let table = self
            .catalog
            .catalog()
            .create_table(namespace, creation)
            .await
            .map_err(|e| match e.kind() {
                iceberg::ErrorKind::TableAlreadyExists => already_exists(&ident),
                iceberg::ErrorKind::NamespaceNotFound => self.no_namespace(namespace),
                _ => e.into(),
            })?;
        Ok(loaded(&table))
    }

    /// Drops `ident`; with `purge`, also its files, through the deletion
    /// gate: only what lies under the location the catalog assigned to the
    /// table, whatever its metadata names (iceberg's own purge would follow
    /// every path the metadata holds, and a client wrote it).
    /// A table renamed keeps its folder, so the location is the one the
    /// table holds ([`IcebergCatalog::purge_location`]): a purge that would
    /// reach another live table's files is refused.
    async fn drop_table(&self, ident: &TableIdent, purge: bool) -> ViewResult<()> {
        let table = self.table(ident).await?;
        let catalog = self.catalog.catalog();
        let dropped = if purge {
            let location = self.catalog.purge_location(&table).await?.map_err(|why| {
                RestError::new(
                    StatusCode::CONFLICT,
                    "CommitFailedException",
                    format!(
                        "{ident} cannot be purged: {why}: drop it without purge \
                         (purgeRequested=false); its files stay where they are"
                    ),
                )
            })?;
            self.catalog
                .remove_table_within(&table, Some(location), crate::catalog::Removal::Everything)
                .await
        } else {
            catalog.drop_table(ident).await.map_err(Into::into)
        };
        match dropped {
            Ok(()) => Ok(()),
            // A concurrent drop got there first.
            Err(_) if !catalog.table_exists(ident).await.unwrap_or(true) => {
                Err(self.no_table(ident))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Applies `request` to `ident` if its requirements hold on the version
    /// loaded, swapping from exactly that version: 409 when they do not or
    /// when another commit landed in between.
    async fn commit_table(
        &self,
        ident: &TableIdent,
        request: CommitTableRequest,
    ) -> ViewResult<CommitTableResponse> {
        if let Some(named) = &request.identifier
            && named != ident
        {
            return Err(RestError::new(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                format!("the commit names table {named} but was sent to {ident}"),
            ));
        }
        if request.requirements.len() > MAX_CHANGES || request.updates.len() > MAX_CHANGES {
            return Err(RestError::new(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                format!(
                    "{ident}: a commit carries at most {MAX_CHANGES} requirements and \
                     {MAX_CHANGES} updates; split it"
                ),
            ));
        }
        if request
            .requirements
            .iter()
            .any(|r| matches!(r, TableRequirement::NotExist))
        {
            return self.create_committed(ident, request).await;
        }
        let table = self.table(ident).await?;
        if let Some(failed) = request
            .requirements
            .iter()
            .find_map(|r| requirement_failed(r, table.metadata()))
        {
            return Err(RestError::new(
                StatusCode::CONFLICT,
                "CommitFailedException",
                format!("{ident}: {failed}"),
            ));
        }
        if let Some(why) = crate::catalog::commit::branch::client_touches(&table, &request.updates)
        {
            return Err(RestError::new(
                StatusCode::FORBIDDEN,
                "ForbiddenException",
                format!(
                    "{ident}: {why}: only icestage writes its audit branches (PROMOTE UPLOAD \
                     ... WITH (to_branch = ...), then PUBLISH UPLOAD)"
                ),
            ));
        }
        let location = self.catalog.assigned_location(&table).await?;
        let outside = crate::catalog::confine::paths_outside(&request.updates, &location);
        if !outside.is_empty() {
            return Err(RestError::new(
                StatusCode::FORBIDDEN,
                "ForbiddenException",
                format!(
                    "{ident}: {}: a commit may only name files under the table's location",
                    outside.join("; ")
                ),
            ));
        }
        let committed = self
            .catalog
            .pointers()
            .commit(&table, request.requirements, request.updates)
            .await?
            .ok_or_else(|| {
                RestError::new(
                    StatusCode::CONFLICT,
                    "CommitFailedException",
                    format!("{ident} changed while this commit was applied: reload it and retry"),
                )
            })?;
        Ok(CommitTableResponse {
            metadata_location: committed.metadata_location_result()?.to_string(),
            metadata: committed.metadata().clone(),
        })
    }

    /// Renames `source` to `destination`, both within the token's reach;
    /// the table keeps its folder (and holds it: see `free_location`).
    async fn rename_table(&self, request: RenameTableRequest) -> ViewResult<()> {
        let (source, destination) = (&request.source, &request.destination);
        self.table(source).await?;
        if self.visible_table(destination).is_err() {
            return Err(self.may_not_create(&format!("table {destination}")));
        }
        self.existing_namespace(destination.namespace()).await?;
        let catalog = self.catalog.catalog();
        if catalog.table_exists(destination).await?
            || (self.catalog.keeps_views() && self.catalog.name_taken(destination).await?)
        {
            return Err(already_exists_named(destination, "a table or view"));
        }
        catalog
            .rename_table(source, destination)
            .await
            .map_err(|e| match e.kind() {
                iceberg::ErrorKind::TableAlreadyExists => already_exists(destination),
                iceberg::ErrorKind::TableNotFound => self.no_table(source),
                iceberg::ErrorKind::NamespaceNotFound => self.no_namespace(destination.namespace()),
                _ => e.into(),
            })
    }

    /// Adds table `request.name` to `namespace` from a metadata file the
    /// client wrote under the namespace's folder: read within the metadata
    /// bounds, its location under that folder and held by no live table,
    /// every path it names under its location. The table gets a copy of it
    /// as icestage's own first metadata file (named by its content, so a
    /// later rewrite in place is seen), not the client's file.
    async fn register_table(
        &self,
        namespace: &NamespaceIdent,
        request: RegisterTableRequest,
    ) -> ViewResult<LoadTableResult> {
        use crate::catalog::confine;
        let ident = TableIdent::new(namespace.clone(), request.name.clone());
        if self.visible_table(&ident).is_err() {
            return Err(self.may_not_create(&format!("table {ident}")));
        }
        if request.overwrite == Some(true) {
            return Err(bad_request(format!(
                "{ident}: overwrite = true is not served: drop the table, then register it"
            )));
        }
        let Some(folder) = self.catalog.default_namespace_location(namespace) else {
            return Err(not_on_this_catalog(&ident, "registering a table"));
        };
        self.existing_namespace(namespace).await?;
        if self.catalog.catalog().table_exists(&ident).await? {
            return Err(already_exists(&ident));
        }
        let path = &request.metadata_location;
        let forbidden =
            |message: String| RestError::new(StatusCode::FORBIDDEN, "ForbiddenException", message);
        let io = self
            .catalog
            .file_io()
            .ok_or_else(|| not_on_this_catalog(&ident, "registering a table"))?;
        let bytes = confine::read_confined(io, path, &folder, "metadata file")
            .await
            .map_err(|e| forbidden(format!("{ident}: {}", e.user_message())))?;
        let metadata: TableMetadata =
            serde_json::from_slice(&confine::metadata_json(path, &bytes)?).map_err(|e| {
                bad_request(format!(
                    "{ident}: {path} is not Iceberg table metadata: {e}"
                ))
            })?;
        let location = metadata.location().to_string();
        if !confine::is_under(&location, &folder) || !confine::is_under(path, &location) {
            return Err(forbidden(format!(
                "{ident}: the metadata file {path} places the table at '{location}': a registered \
                 table lies under its namespace's folder '{folder}' and its metadata file under \
                 the table's location"
            )));
        }
        let outside = confine::metadata_outside(&metadata, &location);
        if !outside.is_empty() {
            return Err(forbidden(format!(
                "{ident}: {}: a registered table names only files under its location",
                outside.join("; ")
            )));
        }
        self.unheld(&ident, &location).await?;
        let table = self
            .catalog
            .add_table(&ident, metadata)
            .await?
            .ok_or_else(|| already_exists(&ident))?;
        Ok(loaded(&table))
    }

    async fn list_views(&self, namespace: &NamespaceIdent) -> ViewResult<ListTablesResponse> {
        self.keeping_views()?;
        self.existing_namespace(namespace).await?;
        let views = self.catalog.list_views(namespace).await?;
        Ok(ListTablesResponse {
            identifiers: views
                .into_iter()
                .filter(|v| self.visible_table(v).is_ok())
                .collect(),
            next_page_token: None,
        })
    }

    async fn load_view(&self, ident: &TableIdent) -> ViewResult<serde_json::Value> {
        Ok(view_result(self.view(ident).await?))
    }

    async fn view_exists(&self, ident: &TableIdent) -> ViewResult<()> {
        self.view(ident).await.map(|_| ())
    }

    /// Creates view `request.name` in `namespace`, placed where the
    /// catalog places tables (its folder held as a table's is).
    async fn create_view(
        &self,
        namespace: &NamespaceIdent,
        request: CreateViewRequest,
    ) -> ViewResult<serde_json::Value> {
        self.keeping_views()?;
        let ident = TableIdent::new(namespace.clone(), request.name.clone());
        if self.visible_table(&ident).is_err() {
            return Err(self.may_not_create(&format!("view {ident}")));
        }
        self.existing_namespace(namespace).await?;
        if self.catalog.name_taken(&ident).await? {
            return Err(already_exists_named(&ident, "a table or view"));
        }
        let Some(location) = self.catalog.default_table_location(&ident) else {
            return Err(self
                .keeping_views()
                .err()
                .unwrap_or_else(|| self.no_view(&ident)));
        };
        if let Some(asked) = &request.location
            && asked != &location
        {
            return Err(bad_request(format!(
                "{ident}: location '{asked}' was asked for; this catalog places views itself, \
                 leave location out"
            )));
        }
        self.unheld(&ident, &location).await?;
        let metadata = ViewMetadataBuilder::new(
            location,
            request.schema,
            request.view_version,
            ViewFormatVersion::V1,
            request.properties,
        )?
        .build()?
        .metadata;
        let stored = self
            .catalog
            .add_view(&ident, metadata)
            .await?
            .ok_or_else(|| already_exists_named(&ident, "a table or view"))?;
        Ok(view_result(stored))
    }

    /// Applies `request` to view `ident` if its requirements hold on the
    /// version loaded, swapping from exactly that version (409 otherwise).
    /// The view stays in its folder.
    async fn replace_view(
        &self,
        ident: &TableIdent,
        request: CommitViewRequest,
    ) -> ViewResult<serde_json::Value> {
        if let Some(named) = &request.identifier
            && named != ident
        {
            return Err(bad_request(format!(
                "the commit names view {named} but was sent to {ident}"
            )));
        }
        if request.requirements.len() > MAX_CHANGES || request.updates.len() > MAX_CHANGES {
            return Err(bad_request(format!(
                "{ident}: a commit carries at most {MAX_CHANGES} requirements and \
                 {MAX_CHANGES} updates; split it"
            )));
        }
        let base = self.view(ident).await?;
        let conflict = |message: String| {
            RestError::new(StatusCode::CONFLICT, "CommitFailedException", message)
        };
        for requirement in &request.requirements {
            let ViewRequirement::AssertViewUuid { uuid } = requirement;
            if *uuid != base.metadata.uuid() {
                return Err(conflict(format!(
                    "{ident}: requirement failed: the view's uuid is {}, not {uuid}",
                    base.metadata.uuid()
                )));
            }
        }
        let location = base.metadata.location().to_string();
        let mut builder = base.metadata.clone().into_builder();
        for update in request.updates {
            builder = match update {
                ViewUpdate::AssignUuid { uuid } => builder.assign_uuid(uuid),
                ViewUpdate::UpgradeFormatVersion { format_version } => {
                    builder.upgrade_format_version(format_version)?
                }
                ViewUpdate::AddSchema { schema, .. } => builder.add_schema(schema),
                ViewUpdate::SetLocation { location: asked } if asked == location => builder,
                ViewUpdate::SetLocation { location: asked } => {
                    return Err(RestError::new(
                        StatusCode::FORBIDDEN,
                        "ForbiddenException",
                        format!(
                            "{ident}: set-location to '{asked}': the view stays where the \
                             catalog placed it ('{location}')"
                        ),
                    ));
                }
                ViewUpdate::SetProperties { updates } => builder.set_properties(updates)?,
                ViewUpdate::RemoveProperties { removals } => builder.remove_properties(&removals),
                ViewUpdate::AddViewVersion { view_version } => builder.add_version(view_version)?,
                ViewUpdate::SetCurrentViewVersion { view_version_id } => {
                    builder.set_current_version_id(view_version_id)?
                }
            };
        }
        let metadata = builder.build()?.metadata;
        let stored = self
            .catalog
            .replace_view(ident, &base, metadata)
            .await?
            .ok_or_else(|| {
                conflict(format!(
                    "{ident} changed while this commit was applied: reload it and retry"
                ))
            })?;
        Ok(view_result(stored))
    }

    async fn drop_view(&self, ident: &TableIdent) -> ViewResult<()> {
        self.view(ident).await?;
        if self.catalog.drop_view(ident).await? {
            Ok(())
        } else {
            Err(self.no_view(ident))
        }
    }

    /// Renames view `source` to `destination`, both within the token's
    /// reach; the view keeps its folder.
    async fn rename_view(&self, request: RenameTableRequest) -> ViewResult<()> {
        let (source, destination) = (&request.source, &request.destination);
        self.view(source).await?;
        if self.visible_table(destination).is_err() {
            return Err(self.may_not_create(&format!("view {destination}")));
        }
        self.existing_namespace(destination.namespace()).await?;
        if self.catalog.name_taken(destination).await? {
            return Err(already_exists_named(destination, "a table or view"));
        }
        match self.catalog.rename_view(source, destination).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.no_view(source)),
            // A table or view of that name was added meanwhile.
            Err(_) if self.catalog.name_taken(destination).await.unwrap_or(false) => {
                Err(already_exists_named(destination, "a table or view"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// No storage credentials: a catalog token's holder brings its own
    /// storage access (a local warehouse needs none).
    async fn credentials(&self, ident: &TableIdent) -> ViewResult<serde_json::Value> {
        self.table_exists(ident).await?;
        Ok(serde_json::json!({"storage-credentials": []}))
    }

    async fn commit_transaction(&self, _: CommitTransactionRequest) -> ViewResult<()> {
        Err(RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "this endpoint takes a session's token",
        ))
    }

    async fn sign(&self, _: SignRequest) -> ViewResult<SignResponse> {
        Err(RestError::new(
            StatusCode::FORBIDDEN,
            "ForbiddenException",
            "storage requests are signed for sessions (an upload's or a download's token); a \
             catalog token's clients use their own storage credentials",
        ))
    }
}

/// Why `requirement` does not hold on `metadata`, in the words Iceberg's
/// own catalogs use (clients show them, and some match on them); `None`
/// when it holds. The commit checks every requirement again on the version
/// it swaps from.
fn requirement_failed(requirement: &TableRequirement, metadata: &TableMetadata) -> Option<String> {
    let (what, expected, found): (&str, i64, i64) = match requirement {
        TableRequirement::NotExist => {
            return Some("Requirement failed: table already exists".to_string());
        }
        TableRequirement::UuidMatch { uuid } => {
            return (*uuid != metadata.uuid()).then(|| {
                format!(
                    "Requirement failed: UUID does not match: expected {} != {uuid}",
                    metadata.uuid()
                )
            });
        }
        TableRequirement::RefSnapshotIdMatch { r#ref, snapshot_id } => {
            let current = metadata.snapshot_for_ref(r#ref).map(|s| s.snapshot_id());
            return match (snapshot_id, current) {
                (None, Some(_)) => Some(format!(
                    "Requirement failed: branch or tag {ref} was created concurrently"
                )),
                (Some(expected), None) => Some(format!(
                    "Requirement failed: branch or tag {ref} is missing, expected {expected}"
                )),
                (Some(expected), Some(found)) if *expected != found => Some(format!(
                    "Requirement failed: branch or tag {ref} has changed: expected id \
                     {expected} != {found}"
                )),
                _ => None,
            };
        }
        TableRequirement::LastAssignedFieldIdMatch {
            last_assigned_field_id: id,
        } => (
            "last assigned field id",
            (*id).into(),
            metadata.last_column_id().into(),
        ),
        TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: id,
        } => (
            "current schema id",
            (*id).into(),
            metadata.current_schema_id().into(),
        ),
        TableRequirement::LastAssignedPartitionIdMatch {
            last_assigned_partition_id: id,
        } => (
            "last assigned partition id",
            (*id).into(),
            metadata.last_partition_id().into(),
        ),
        TableRequirement::DefaultSpecIdMatch {
            default_spec_id: id,
        } => (
            "default spec id",
            (*id).into(),
            metadata.default_partition_spec_id().into(),
        ),
        TableRequirement::DefaultSortOrderIdMatch {
            default_sort_order_id: id,
        } => (
            "default sort order id",
            *id,
            metadata.default_sort_order_id(),
        ),
    };
    (expected != found).then(|| {
        format!("Requirement failed: {what} has changed: expected {expected}, found {found}")
    })
}

fn bad_request(message: String) -> RestError {
    RestError::new(StatusCode::BAD_REQUEST, "BadRequestException", message)
}

fn already_exists(table: &TableIdent) -> RestError {
    already_exists_named(table, "table")
}

/// 409 for `ident`, which `what` (`table`, `a table or view`) holds.
fn already_exists_named(ident: &TableIdent, what: &str) -> RestError {
    RestError::new(
        StatusCode::CONFLICT,
        "AlreadyExistsException",
        format!("{what} {ident} already exists"),
    )
}

/// A view as the protocol answers it (`LoadViewResult`).
fn view_result(view: crate::catalog::views::StoredView) -> serde_json::Value {
    serde_json::json!({
        "metadata-location": view.metadata_location,
        "metadata": view.metadata,
        "config": {},
    })
}

/// 501 for what only a SQL catalog serves.
fn not_on_this_catalog(table: &TableIdent, what: &str) -> RestError {
    RestError::new(
        StatusCode::NOT_IMPLEMENTED,
        "NotImplementedException",
        format!(
            "{table}: {what} is served on SQL catalogs only; this catalog adds its tables itself: \
             create the table, then commit to it"
        ),
    )
}

/// The format version `properties` ask for (`format-version`, taken out:
/// it is not a table property), 2 by default; new tables write zstd
/// Parquet unless told otherwise, as Iceberg's own REST catalog creates
/// them.
fn format_version(
    table: &TableIdent,
    properties: &mut HashMap<String, String>,
) -> ViewResult<FormatVersion> {
    let version = match properties.remove("format-version").as_deref() {
        None | Some("2") => FormatVersion::V2,
        Some("1") => FormatVersion::V1,
        Some("3") => FormatVersion::V3,
        Some(other) => {
            return Err(bad_request(format!(
                "{table}: format-version '{other}' is not one of 1, 2 or 3"
            )));
        }
    };
    properties
        .entry("write.parquet.compression-codec".to_string())
        .or_insert_with(|| "zstd".to_string());
    Ok(version)
}

/// The metadata of new table `table` at `location` that a staged
/// creation's commit describes: its first schema, partition spec and sort
/// order, its properties and format version build the table as a create
/// does; every other update (the transaction's own) is applied on top.
fn created(
    table: &TableIdent,
    location: &str,
    updates: Vec<TableUpdate>,
) -> ViewResult<TableMetadata> {
    let (mut schema, mut spec, mut order) = (None, None, None);
    let (mut version, mut uuid) = (None, None);
    let mut properties = HashMap::new();
    let mut rest = vec![];
    for update in updates {
        match update {
            TableUpdate::AddSchema { schema: s } if schema.is_none() => schema = Some(s),
            TableUpdate::AddSpec { spec: s } if spec.is_none() => spec = Some(s),
            TableUpdate::AddSortOrder { sort_order } if order.is_none() => order = Some(sort_order),
            TableUpdate::UpgradeFormatVersion { format_version } if version.is_none() => {
                version = Some(format_version)
            }
            TableUpdate::SetProperties { updates } if rest.is_empty() => properties.extend(updates),
            TableUpdate::AssignUuid { uuid: u } if rest.is_empty() => uuid = Some(u),
            // The first schema, spec and order made current, the location
            // (checked), the table's id: what the create sets itself.
            TableUpdate::SetCurrentSchema { schema_id: -1 }
            | TableUpdate::SetDefaultSpec { spec_id: -1 }
            | TableUpdate::SetDefaultSortOrder { sort_order_id: -1 }
            | TableUpdate::SetLocation { .. }
                if rest.is_empty() => {}
            other => rest.push(other),
        }
    }
    let schema = schema.ok_or_else(|| {
        bad_request(format!(
            "{table}: a commit that creates the table adds its schema (add-schema)"
        ))
    })?;
    let asked = format_version(table, &mut properties)?;
    let creation = TableCreation::builder()
        .name(table.name().to_string())
        .location(location.to_string())
        .schema(schema)
        .partition_spec_opt(spec)
        .sort_order_opt(order)
        .properties(properties)
        .format_version(version.unwrap_or(asked))
        .build();
    let mut first = TableMetadataBuilder::from_table_creation(creation)?;
    if let Some(uuid) = uuid {
        first = first.assign_uuid(uuid);
    }
    let first = with_java_field_ids(first.build()?.metadata)?;
    let mut builder = first.into_builder(None);
    for update in rest {
        builder = update.apply(builder)?;
    }
    Ok(builder.build()?.metadata)
}

/// New table `metadata` (one schema) with its field ids in the order
/// Iceberg's Java library and PyIceberg assign fresh ones: each struct's
/// fields first, then what they hold; a map's key and value ids both
/// before the key's and value's own fields. iceberg numbers a map's key
/// type before its value id, so the two differ for a map whose key is a
/// struct, and clients compare the ids they get with Java's.
fn with_java_field_ids(metadata: TableMetadata) -> ViewResult<TableMetadata> {
    use iceberg::spec::{NestedFieldRef, Type};
    fn fields(list: &[NestedFieldRef], next: &mut i32, ids: &mut HashMap<i64, i64>) {
        for field in list {
            ids.insert(field.id.into(), (*next).into());
            *next += 1;
        }
        for field in list {
            nested(&field.field_type, next, ids);
        }
    }
    fn nested(kind: &Type, next: &mut i32, ids: &mut HashMap<i64, i64>) {
        match kind {
            Type::Primitive(_) => {}
            Type::Struct(s) => fields(s.fields(), next, ids),
            Type::List(l) => {
                ids.insert(l.element_field.id.into(), (*next).into());
                *next += 1;
                nested(&l.element_field.field_type, next, ids);
            }
            Type::Map(m) => {
                ids.insert(m.key_field.id.into(), (*next).into());
                ids.insert(m.value_field.id.into(), (*next + 1).into());
                *next += 2;
                nested(&m.key_field.field_type, next, ids);
                nested(&m.value_field.field_type, next, ids);
            }
        }
    }
    fn renumber(value: &mut serde_json::Value, keys: &[&str], ids: &HashMap<i64, i64>) {
        for key in keys {
            if let Some(id) = value.get_mut(*key)
                && let Some(new) = id.as_i64().and_then(|old| ids.get(&old))
            {
                *id = (*new).into();
            }
        }
    }
    fn renumber_type(kind: &mut serde_json::Value, ids: &HashMap<i64, i64>) {
        match kind.get("type").and_then(|t| t.as_str()) {
            Some("struct") => {
                for field in kind
                    .get_mut("fields")
                    .and_then(|f| f.as_array_mut())
                    .into_iter()
                    .flatten()
                {
                    renumber(field, &["id"], ids);
                    if let Some(inner) = field.get_mut("type") {
                        renumber_type(inner, ids);
                    }
                }
            }
            Some("list") => {
                renumber(kind, &["element-id"], ids);
                if let Some(inner) = kind.get_mut("element") {
                    renumber_type(inner, ids);
                }
            }
            Some("map") => {
                renumber(kind, &["key-id", "value-id"], ids);
                for part in ["key", "value"] {
                    if let Some(inner) = kind.get_mut(part) {
                        renumber_type(inner, ids);
                    }
                }
            }
            _ => {}
        }
    }
    let schema = metadata.current_schema();
    let mut ids = HashMap::new();
    let mut next = 1;
    fields(schema.as_struct().fields(), &mut next, &mut ids);
    if ids.iter().all(|(old, new)| old == new) {
        return Ok(metadata);
    }
    let mut json = serde_json::to_value(&metadata)
        .map_err(|e| crate::error::Error::internal(format!("table metadata as JSON: {e}")))?;
    for schema in json
        .get_mut("schemas")
        .and_then(|s| s.as_array_mut())
        .into_iter()
        .flatten()
    {
        renumber_type(schema, &ids);
        if let Some(identifiers) = schema
            .get_mut("identifier-field-ids")
            .and_then(|i| i.as_array_mut())
        {
            for id in identifiers {
                if let Some(new) = id.as_i64().and_then(|old| ids.get(&old)) {
                    *id = (*new).into();
                }
            }
        }
    }
    for (list, inner) in [("partition-specs", "fields"), ("sort-orders", "fields")] {
        for item in json
            .get_mut(list)
            .and_then(|l| l.as_array_mut())
            .into_iter()
            .flatten()
        {
            for field in item
                .get_mut(inner)
                .and_then(|f| f.as_array_mut())
                .into_iter()
                .flatten()
            {
                renumber(field, &["source-id"], &ids);
            }
        }
    }
    serde_json::from_value(json).map_err(|e| {
        crate::error::Error::internal(format!("table metadata with renumbered fields: {e}")).into()
    })
}

fn loaded(table: &iceberg::table::Table) -> LoadTableResult {
    LoadTableResult {
        metadata_location: table.metadata_location().map(str::to_string),
        metadata: table.metadata().clone(),
        config: HashMap::new(),
        storage_credentials: None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use iceberg::TableUpdate;

    use crate::catalog::IcebergCatalog;
    use crate::catalog::rest_backend::VERSION_REF;
    use crate::config::CatalogConfig;
    use crate::service::{AppState, ServiceConfig, router};

    use super::{TableCreation, TableMetadataBuilder};

    /// A map whose key is a struct: Java numbers the key and value before
    /// the key's fields; iceberg numbers the key's fields first.
    #[test]
    fn new_tables_number_nested_fields_as_java_does() {
        let schema: iceberg::spec::Schema = serde_json::from_value(serde_json::json!({
            "type": "struct", "schema-id": 0, "identifier-field-ids": [1], "fields": [
                {"id": 1, "name": "id", "required": true, "type": "long"},
                {"id": 2, "name": "m", "required": false, "type": {
                    "type": "map", "key-id": 3, "value-id": 6, "value-required": false,
                    "key": {"type": "struct", "fields": [
                        {"id": 4, "name": "a", "required": true, "type": "string"},
                        {"id": 5, "name": "b", "required": true, "type": "string"}]},
                    "value": {"type": "struct", "fields": [
                        {"id": 7, "name": "c", "required": false, "type": "int"}]}}}]}))
        .unwrap();
        let creation = TableCreation::builder()
            .name("t".to_string())
            .location("/w/ns/t".to_string())
            .schema(schema)
            .build();
        let built = TableMetadataBuilder::from_table_creation(creation)
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        let renumbered = super::with_java_field_ids(built).unwrap();
        let json = serde_json::to_value(renumbered.current_schema().as_ref()).unwrap();
        let map = &json["fields"][1]["type"];
        assert_eq!(
            (&map["key-id"], &map["value-id"]),
            (&serde_json::json!(3), &serde_json::json!(4))
        );
        let names = |part: &str| -> Vec<(i64, String)> {
            map[part]["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["id"].as_i64().unwrap(),
                        f["name"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        assert_eq!(names("key"), [(5, "a".to_string()), (6, "b".to_string())]);
        assert_eq!(names("value"), [(7, "c".to_string())]);
        assert_eq!(json["identifier-field-ids"], serde_json::json!([1]));
        assert_eq!(renumbered.last_column_id(), 7);
    }

    /// A service on `dir` with a catalog token `lake` reaching `tables`,
    /// listening on a free port; its address.
    async fn serve(dir: &std::path::Path, tables: &str) -> String {
        let config = ServiceConfig::from_toml_str(&format!(
            r#"
warehouse = "{}"
[service]
listen = "127.0.0.1:0"
requests_per_minute = 100000
[[service.tokens]]
name = "lake"
token = "sk_lake"
tables = {tables}
operations = ["catalog"]
"#,
            dir.display()
        ))
        .unwrap();
        let app = router(AppState::new(config).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{address}/iceberg")
    }

    /// Sends `method path` with `body` to the REST catalog at `uri` with the
    /// token `lake`; the status and the body's text.
    async fn send(
        uri: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, String) {
        let mut request = reqwest::Client::new()
            .request(method, format!("{uri}/v1/{path}"))
            .bearer_auth("sk_lake");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// Creates namespace `sandbox` and its table `t` (one `id` column)
    /// through the REST catalog at `uri`.
    async fn sandbox_table(uri: &str) {
        let (status, body) = send(
            uri,
            reqwest::Method::POST,
            "namespaces",
            Some(serde_json::json!({"namespace": ["sandbox"]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let schema = serde_json::json!({"type": "struct", "schema-id": 0, "fields": [
            {"id": 1, "name": "id", "required": true, "type": "long"}]});
        let (status, body) = send(
            uri,
            reqwest::Method::POST,
            "namespaces/sandbox/tables",
            Some(serde_json::json!({"name": "t", "schema": schema})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }

    async fn rest_catalog(uri: &str) -> IcebergCatalog {
        IcebergCatalog::open(&CatalogConfig {
            name: "lake".to_string(),
            kind: "rest".to_string(),
            config: [("uri", uri), ("token", "sk_lake")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
        .await
        .unwrap()
    }

    fn set(key: &str, value: &str) -> Vec<TableUpdate> {
        vec![TableUpdate::SetProperties {
            updates: HashMap::from([(key.to_string(), value.to_string())]),
        }]
    }

    /// An audit branch icestage created on a table is icestage's alone: a
    /// catalog token that may commit anything else to the table cannot
    /// move it, remove it or unlist it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_catalog_token_cannot_move_an_audit_branch() {
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["sandbox.*"]"#).await;
        sandbox_table(&uri).await;
        let send = |method, path: &'static str, body| send(&uri, method, path, body);
        use reqwest::Method;
        let embedded = crate::config::IcestageConfig::embedded(dir.path()).unwrap();
        let catalog = IcebergCatalog::open(&embedded.catalogs[0]).await.unwrap();
        let ident = iceberg::TableIdent::from_strs(["sandbox", "t"]).unwrap();
        let table = catalog.catalog().load_table(&ident).await.unwrap();
        let evidence = crate::catalog::commit::Evidence::new("test", "branch");
        let head = crate::catalog::commit::branch::append_to_branch_once(
            &catalog,
            &table,
            &evidence,
            "audit",
            &[],
        )
        .await
        .unwrap()
        .snapshot_id;

        let branches = crate::catalog::commit::branch::PROP_AUDIT_BRANCHES;
        for update in [
            serde_json::json!({"action": "remove-snapshot-ref", "ref-name": "audit"}),
            serde_json::json!({"action": "set-snapshot-ref", "ref-name": "audit",
                "type": "branch", "snapshot-id": head}),
            serde_json::json!({"action": "remove-properties", "removals": [branches]}),
            serde_json::json!({"action": "remove-snapshots", "snapshot-ids": [head]}),
        ] {
            let (status, body) = send(
                Method::POST,
                "namespaces/sandbox/tables/t",
                Some(serde_json::json!({"requirements": [], "updates": [update]})),
            )
            .await;
            assert_eq!(status, 403, "{update}: {body}");
            assert!(body.contains("audit branch"), "{body}");
        }
        // Other changes to the table are the token's to make.
        let (status, body) = send(
            Method::POST,
            "namespaces/sandbox/tables/t",
            Some(serde_json::json!({"requirements": [], "updates": [
                {"action": "set-properties", "updates": {"owner": "lake"}}]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let now = catalog.catalog().load_table(&ident).await.unwrap();
        assert_eq!(
            now.metadata()
                .snapshot_for_ref("audit")
                .map(|s| s.snapshot_id()),
            Some(head)
        );
    }

    /// Two commits that checked one version: the first lands, the second
    /// is refused, although a property change moves nothing the REST
    /// protocol's requirements name (the version ref does it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_a_rest_catalog_a_commit_lands_only_on_the_version_it_checked() {
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["s.*"]"#).await;
        let lake = rest_catalog(&uri).await;
        let (_, table) = crate::catalog::test_table(&dir.path().join("other")).await;
        // The same table, created through the REST catalog this time.
        let ident = table.identifier().clone();
        let checked = lake
            .table_or_create(&ident, || {
                Ok(table.metadata().current_schema().as_ref().clone())
            })
            .await
            .unwrap();

        let first = lake
            .pointers()
            .commit(&checked, vec![], set("state", "promoting"))
            .await
            .unwrap()
            .expect("the first commit lands");
        assert!(first.metadata().snapshot_for_ref(VERSION_REF).is_some());
        let second = lake
            .pointers()
            .commit(&checked, vec![], set("state", "aborted"))
            .await
            .unwrap();
        assert!(
            second.is_none(),
            "a second commit on the checked version landed"
        );
        let now = lake.catalog().load_table(&ident).await.unwrap();
        assert_eq!(
            now.metadata().properties().get("state").map(String::as_str),
            Some("promoting")
        );
        // The refused commit's mark went with it: every mark file left is
        // a snapshot of the table.
        let metadata_dir = now
            .metadata()
            .location()
            .trim_start_matches("file://")
            .to_string();
        let marks = std::fs::read_dir(format!("{metadata_dir}/metadata"))
            .unwrap()
            .filter(|f| {
                f.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with("-icestage-version.avro")
            })
            .count();
        assert_eq!(marks, now.metadata().snapshots().count());
        // From the version as it is now, a commit lands again.
        let third = lake
            .pointers()
            .commit(&now, vec![], set("state", "promoted"))
            .await
            .unwrap();
        assert!(third.is_some());

        // A table the token does not reach does not exist for it.
        let hidden = iceberg::TableIdent::from_strs(["icestage", "upload_log"]).unwrap();
        let error = lake.catalog().load_table(&hidden).await.unwrap_err();
        assert_eq!(error.kind(), iceberg::ErrorKind::TableNotFound, "{error}");
    }

    /// Namespaces as the protocol has them: properties updated and removed
    /// (and the missing named), a drop refused while the namespace holds a
    /// table, then done; a token that does not own every table of a
    /// namespace may do neither; views and unknown paths answer in the
    /// protocol's error shape.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespaces_are_updated_and_dropped_as_the_protocol_says() {
        use reqwest::Method;
        use serde_json::{Value, json};
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["ops.*", "ops2.*", "shared.one"]"#).await;
        let send = |method, path: &'static str, body| send(&uri, method, path, body);
        let json_of = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        for namespace in ["ops", "shared", "ops2"] {
            let (status, body) = send(
                Method::POST,
                "namespaces",
                Some(json!({"namespace": [namespace], "properties": {"owner": "a", "tier": "1"}})),
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
        let (status, body) = send(
            Method::POST,
            "namespaces/ops/properties",
            Some(json!({"updates": {"tier": "2", "team": "x"}, "removals": ["owner", "nope"]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            json_of(&body),
            json!({"updated": ["team", "tier"], "removed": ["owner"], "missing": ["nope"]})
        );
        let (_, body) = send(Method::GET, "namespaces/ops", None).await;
        let properties = &json_of(&body)["properties"];
        assert_eq!(
            (
                &properties["tier"],
                &properties["team"],
                &properties["owner"]
            ),
            (&json!("2"), &json!("x"), &Value::Null),
            "{body}"
        );
        for (request, said) in [
            (
                json!({"updates": {"a": "1"}, "removals": ["a"]}),
                "both removed and updated",
            ),
            (json!({"removals": ["exists"]}), "marks the namespace"),
        ] {
            let (status, body) =
                send(Method::POST, "namespaces/ops/properties", Some(request)).await;
            assert_eq!(status, 422, "{body}");
            assert!(body.contains(said), "{body}");
        }
        // Not every table of `shared` is the token's: it may not change it.
        let (status, body) = send(
            Method::POST,
            "namespaces/shared/properties",
            Some(json!({"updates": {"tier": "3"}})),
        )
        .await;
        assert_eq!(status, 403, "{body}");
        let (status, _) = send(Method::DELETE, "namespaces/shared", None).await;
        assert_eq!(status, 403);

        let schema = json!({"type": "struct", "schema-id": 0, "fields": [
            {"id": 1, "name": "id", "required": true, "type": "long"}]});
        let (status, body) = send(
            Method::POST,
            "namespaces/ops/tables",
            Some(json!({"name": "t", "schema": schema})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = send(Method::DELETE, "namespaces/ops", None).await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(
            json_of(&body)["error"]["type"],
            "NamespaceNotEmptyException"
        );
        let (status, _) = send(Method::DELETE, "namespaces/ops/tables/t", None).await;
        assert_eq!(status, 204);
        // `ops2`, whose name starts with `ops`, is not its child.
        let (status, body) = send(Method::DELETE, "namespaces/ops", None).await;
        assert_eq!(status, 204, "{body}");
        let (status, body) = send(Method::GET, "namespaces/ops", None).await;
        assert_eq!(status, 404, "{body}");
        let (status, _) = send(Method::DELETE, "namespaces/ops", None).await;
        assert_eq!(status, 404);

        for (path, status, kind) in [
            ("namespaces/shared/views/v", 404, "NoSuchViewException"),
            ("no/such/endpoint", 404, "NotFoundException"),
        ] {
            let (got, body) = send(Method::GET, path, None).await;
            let error = &json_of(&body)["error"];
            assert_eq!(
                (got, &error["type"], &error["code"]),
                (status, &json!(kind), &json!(status)),
                "{path}: {body}"
            );
        }
    }

    /// A catalog token holds only its tables, an Iceberg client and the
    /// protocol: a commit naming a file outside the table's location is
    /// refused, and a purge deletes nothing outside it even when the
    /// metadata (written by anyone) names files elsewhere: the warehouse's
    /// catalog database, another folder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_catalog_token_cannot_make_the_service_delete_outside_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["sandbox.*"]"#).await;
        sandbox_table(&uri).await;
        let send = |method, path: &'static str, body| send(&uri, method, path, body);
        use reqwest::Method;

        let victim = dir.path().join("outside").join("victim.txt");
        std::fs::create_dir_all(victim.parent().unwrap()).unwrap();
        std::fs::write(&victim, "keep me").unwrap();
        let database = dir.path().join("catalog.db");
        assert!(database.exists());
        let statistics = |path: &std::path::Path| {
            serde_json::json!({"action": "set-statistics", "snapshot-id": 1, "statistics": {
                "snapshot-id": 1, "statistics-path": format!("file://{}", path.display()),
                "file-size-in-bytes": 7, "file-footer-size-in-bytes": 1, "blob-metadata": []}})
        };
        for (target, update) in [
            (&victim, statistics(&victim)),
            (&database, statistics(&database)),
            (
                &victim,
                serde_json::json!({"action": "set-location",
                    "location": format!("file://{}", dir.path().display())}),
            ),
            (
                &victim,
                serde_json::json!({"action": "set-properties",
                    "updates": {"write.metadata.path": format!("file://{}", dir.path().display())}}),
            ),
        ] {
            let (status, body) = send(
                Method::POST,
                "namespaces/sandbox/tables/t",
                Some(serde_json::json!({"requirements": [], "updates": [update]})),
            )
            .await;
            assert_eq!(status, 403, "{body}");
            assert!(
                body.contains("outside the table's location") || body.contains("set-location"),
                "{body}"
            );
            assert!(target.exists());
        }

        // Metadata that names outside files anyway (a trusted tool wrote
        // it): a purge through the catalog token still leaves them.
        let embedded = crate::config::IcestageConfig::embedded(dir.path()).unwrap();
        let catalog = IcebergCatalog::open(&embedded.catalogs[0]).await.unwrap();
        let ident = iceberg::TableIdent::from_strs(["sandbox", "t"]).unwrap();
        let table = catalog.catalog().load_table(&ident).await.unwrap();
        let planted = [&victim, &database].map(|path| TableUpdate::SetStatistics {
            statistics: iceberg::spec::StatisticsFile {
                snapshot_id: 1 + path.as_os_str().len() as i64,
                statistics_path: format!("file://{}", path.display()),
                file_size_in_bytes: 7,
                file_footer_size_in_bytes: 1,
                key_metadata: None,
                blob_metadata: vec![],
            },
        });
        catalog
            .pointers()
            .commit(&table, vec![], planted.to_vec())
            .await
            .unwrap()
            .expect("planted");
        let (status, body) = send(
            Method::DELETE,
            "namespaces/sandbox/tables/t?purgeRequested=true",
            None,
        )
        .await;
        assert_eq!(status, 204, "{body}");
        assert!(victim.exists(), "a purge deleted a file outside the table");
        assert!(database.exists(), "a purge deleted the catalog database");
        let (status, _) = send(Method::GET, "namespaces/sandbox/tables/t", None).await;
        assert_eq!(status, 404);
        // The table's own files went with it.
        let location = dir.path().join("sandbox").join("t").join("metadata");
        let left = std::fs::read_dir(&location).map_or(0, |d| d.count());
        assert_eq!(left, 0, "the purge left the table's own metadata");
    }

    /// Rename, register and staged creation, with the folder each table
    /// holds: a renamed table keeps its folder, and no new table (created,
    /// created in stages or registered) may take it, so no purge reaches
    /// another table's files; a registered table's metadata lies under its
    /// namespace's folder and names nothing outside its location.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tables_are_renamed_registered_and_created_in_stages_each_in_its_own_folder() {
        use reqwest::Method;
        use serde_json::{Value, json};
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["ops.*", "ops2.*"]"#).await;
        let json_of = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        let error_type = |text: &str| json_of(text)["error"]["type"].clone();
        for namespace in ["ops", "ops2"] {
            let (status, body) = send(
                &uri,
                Method::POST,
                "namespaces",
                Some(json!({"namespace": [namespace]})),
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
        let schema = json!({"type": "struct", "schema-id": 0, "fields": [
            {"id": 1, "name": "id", "required": true, "type": "long"}]});
        let create = |name: &str| json!({"name": name, "schema": schema});
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops/tables",
            Some(create("t")),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let first_location = json_of(&body)["metadata-location"].clone();
        let folder = dir.path().join("ops").join("t");
        let rename = |from: (&str, &str), to: (&str, &str)| {
            json!({"source": {"namespace": [from.0], "name": from.1},
                   "destination": {"namespace": [to.0], "name": to.1}})
        };

        let (status, body) = send(
            &uri,
            Method::POST,
            "tables/rename",
            Some(rename(("ops", "t"), ("ops2", "u"))),
        )
        .await;
        assert_eq!(status, 204, "{body}");
        let (status, body) = send(&uri, Method::GET, "namespaces/ops2/tables/u", None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(json_of(&body)["metadata-location"], first_location);
        let (status, _) = send(&uri, Method::GET, "namespaces/ops/tables/t", None).await;
        assert_eq!(status, 404);
        for (request, status, kind) in [
            (
                rename(("ops", "t"), ("ops2", "v")),
                404,
                "NoSuchTableException",
            ),
            (
                rename(("ops2", "u"), ("nowhere", "u")),
                403,
                "ForbiddenException",
            ),
            (
                rename(("ops2", "u"), ("ops2", "u")),
                409,
                "AlreadyExistsException",
            ),
        ] {
            let (got, body) = send(&uri, Method::POST, "tables/rename", Some(request)).await;
            assert_eq!((got, error_type(&body)), (status, json!(kind)), "{body}");
        }

        // `ops.t`'s folder still holds `ops2.u`'s files: a new `ops.t`
        // (whose purge would delete them) is refused, in any way of
        // making it.
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops/tables",
            Some(create("t")),
        )
        .await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("AlreadyExistsException")),
            "{body}"
        );
        assert!(body.contains("ops2.u"), "{body}");
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops/register",
            Some(json!({"name": "t", "metadata-location": first_location})),
        )
        .await;
        assert_eq!(status, 409, "{body}");
        assert!(folder.join("metadata").read_dir().unwrap().count() > 0);

        // Purging the renamed table deletes its own folder; then the name
        // is free again.
        let (status, body) = send(
            &uri,
            Method::DELETE,
            "namespaces/ops2/tables/u?purgeRequested=True",
            None,
        )
        .await;
        assert_eq!(status, 204, "{body}");
        assert_eq!(
            folder.join("metadata").read_dir().map_or(0, |d| d.count()),
            0
        );
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops/tables",
            Some(create("t")),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let kept = json_of(&body)["metadata-location"]
            .as_str()
            .unwrap()
            .to_string();

        // Register: the metadata of a table dropped without purge, as a
        // client wrote it there.
        let (status, _) = send(&uri, Method::DELETE, "namespaces/ops/tables/t", None).await;
        assert_eq!(status, 204);
        let written = folder.join("metadata").join("00001-client.metadata.json");
        std::fs::copy(kept.trim_start_matches("file://"), &written).unwrap();
        let kept = format!("file://{}", written.display());
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops/register",
            Some(json!({"name": "r", "metadata-location": kept})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let registered = json_of(&body);
        let copy = registered["metadata-location"].as_str().unwrap();
        assert!(
            copy.starts_with(&format!("file://{}/metadata/", folder.display()))
                || copy.starts_with(&format!("{}/metadata/", folder.display())),
            "{copy}"
        );
        assert_ne!(
            copy, kept,
            "the registered table points at icestage's own copy"
        );
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops/register",
            Some(json!({"name": "r", "metadata-location": kept})),
        )
        .await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("AlreadyExistsException")),
            "{body}"
        );
        // Metadata outside the namespace's folder, or placing the table
        // outside it, is never read into a table.
        let elsewhere = dir.path().join("elsewhere").join("metadata");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let mut moved =
            json_of(&std::fs::read_to_string(kept.trim_start_matches("file://")).unwrap());
        moved["location"] = json!(format!("{}", dir.path().join("elsewhere").display()));
        let outside = elsewhere.join("00000-x.metadata.json");
        std::fs::write(&outside, moved.to_string()).unwrap();
        let inside = folder.join("metadata").join("00009-x.metadata.json");
        std::fs::write(&inside, moved.to_string()).unwrap();
        for (path, said) in [(&outside, "is outside"), (&inside, "places the table at")] {
            let (status, body) = send(
                &uri,
                Method::POST,
                "namespaces/ops/register",
                Some(
                    json!({"name": "s", "metadata-location": format!("file://{}", path.display())}),
                ),
            )
            .await;
            assert_eq!(
                (status, error_type(&body)),
                (403, json!("ForbiddenException")),
                "{body}"
            );
            assert!(body.contains(said), "{body}");
        }

        // Staged creation: nothing exists until the commit that creates
        // the table, which lands once.
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops2/tables",
            Some(
                json!({"name": "staged", "schema": schema, "stage-create": true,
                        "properties": {"format-version": "1"}}),
            ),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let staged = json_of(&body);
        assert_eq!(staged["metadata-location"], Value::Null, "{body}");
        let (status, _) = send(&uri, Method::HEAD, "namespaces/ops2/tables/staged", None).await;
        assert_eq!(status, 404);
        let metadata = &staged["metadata"];
        let commit = json!({
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "assign-uuid", "uuid": metadata["table-uuid"]},
            {"action": "upgrade-format-version", "format-version": 1},
            {"action": "add-schema", "schema": metadata["schemas"][0]},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": metadata["partition-specs"][0]},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": metadata["sort-orders"][0]},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": metadata["location"]},
            {"action": "set-properties", "updates": metadata["properties"]},
            {"action": "set-properties", "updates": {"owner": "ops"}},
        ]});
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops2/tables/staged",
            Some(commit.clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let created = json_of(&body);
        assert_eq!(created["metadata"]["table-uuid"], metadata["table-uuid"]);
        assert_eq!(created["metadata"]["format-version"], json!(1));
        assert_eq!(created["metadata"]["properties"]["owner"], json!("ops"));
        let (status, _) = send(&uri, Method::HEAD, "namespaces/ops2/tables/staged", None).await;
        assert_eq!(status, 204);
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/ops2/tables/staged",
            Some(commit),
        )
        .await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("CommitFailedException")),
            "{body}"
        );
        let (status, body) = send(&uri, Method::GET, "config", None).await;
        assert_eq!(status, 200);
        let endpoints = json_of(&body)["endpoints"].clone();
        for served in [
            "POST /v1/{prefix}/tables/rename",
            "POST /v1/{prefix}/namespaces/{namespace}/register",
        ] {
            assert!(
                endpoints.as_array().unwrap().contains(&json!(served)),
                "{body}"
            );
        }
    }

    /// Views, kept in the SQL catalog's database as Iceberg's JDBC catalog
    /// keeps them: created, listed, loaded, replaced on the version loaded,
    /// renamed and dropped; a view and a table never share a name.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn views_are_kept_as_the_protocol_says() {
        use reqwest::Method;
        use serde_json::{Value, json};
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["db.*"]"#).await;
        let json_of = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        let error_type = |text: &str| json_of(text)["error"]["type"].clone();
        let (status, _) = send(
            &uri,
            Method::POST,
            "namespaces",
            Some(json!({"namespace": ["db"]})),
        )
        .await;
        assert_eq!(status, 200);
        let schema = json!({"type": "struct", "schema-id": 1, "fields": [
            {"id": 1, "name": "x", "required": true, "type": "long"}]});
        let version = |id: i64, schema: i64, sql: &str| {
            json!({
            "version-id": id, "schema-id": schema, "timestamp-ms": 1602638573874_i64,
            "summary": {"engine-name": "spark"},
            "representations": [{"type": "sql", "sql": sql, "dialect": "spark"}],
            "default-namespace": ["db"]})
        };
        let create = json!({"name": "v", "schema": schema, "view-version": version(1, 1, "SELECT 1 AS x"),
                            "properties": {"comment": "one"}});
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/db/views",
            Some(create.clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let created = json_of(&body);
        let (status, body) = send(&uri, Method::GET, "namespaces/db/views/v", None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(json_of(&body), created);
        assert_eq!(created["metadata"]["properties"]["comment"], json!("one"));
        let (status, body) = send(&uri, Method::GET, "namespaces/db/views", None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            json_of(&body)["identifiers"],
            json!([{"namespace": ["db"], "name": "v"}])
        );
        let (status, body) = send(&uri, Method::POST, "namespaces/db/views", Some(create)).await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("AlreadyExistsException")),
            "{body}"
        );
        // A table of the view's name, and the view's name for a table.
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/db/tables",
            Some(json!({"name": "v", "schema": schema})),
        )
        .await;
        assert_eq!(status, 409, "{body}");
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/db/tables",
            Some(json!({"name": "t", "schema": schema})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = send(&uri, Method::GET, "namespaces/db/views/t", None).await;
        assert_eq!(
            (status, error_type(&body)),
            (404, json!("NoSuchViewException")),
            "{body}"
        );

        // Replace: a new version, on the view's uuid; a stale uuid is 409.
        let uuid = created["metadata"]["view-uuid"].clone();
        // The schema as the view keeps it (the catalog numbers its schemas).
        let kept = created["metadata"]["versions"][0]["schema-id"]
            .as_i64()
            .unwrap();
        let replace = |uuid: Value| {
            json!({
            "requirements": [{"type": "assert-view-uuid", "uuid": uuid}],
            "updates": [{"action": "add-view-version", "view-version": version(2, kept, "SELECT 2 AS x")},
                        {"action": "set-current-view-version", "view-version-id": -1}]})
        };
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/db/views/v",
            Some(replace(uuid)),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let replaced = json_of(&body);
        assert_ne!(replaced["metadata-location"], created["metadata-location"]);
        let current = replaced["metadata"]["current-version-id"].clone();
        let sql = replaced["metadata"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["version-id"] == current)
            .map(|v| v["representations"][0]["sql"].clone());
        assert_eq!(sql, Some(json!("SELECT 2 AS x")), "{body}");
        let (status, body) = send(
            &uri,
            Method::POST,
            "namespaces/db/views/v",
            Some(replace(json!("a20125c8-7284-442c-9aea-15fee620737c"))),
        )
        .await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("CommitFailedException")),
            "{body}"
        );

        // Rename, then drop.
        let rename = |from: &str, to: &str| {
            json!({
            "source": {"namespace": ["db"], "name": from},
            "destination": {"namespace": ["db"], "name": to}})
        };
        let (status, body) = send(&uri, Method::POST, "views/rename", Some(rename("v", "t"))).await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("AlreadyExistsException")),
            "{body}"
        );
        let (status, body) = send(&uri, Method::POST, "views/rename", Some(rename("v", "w"))).await;
        assert_eq!(status, 204, "{body}");
        let (status, _) = send(&uri, Method::HEAD, "namespaces/db/views/v", None).await;
        assert_eq!(status, 404);
        let (status, _) = send(&uri, Method::HEAD, "namespaces/db/views/w", None).await;
        assert_eq!(status, 204);
        let (status, body) = send(&uri, Method::DELETE, "namespaces/db", None).await;
        assert_eq!(
            (status, error_type(&body)),
            (409, json!("NamespaceNotEmptyException")),
            "{body}"
        );
        let (status, _) = send(&uri, Method::DELETE, "namespaces/db/views/w", None).await;
        assert_eq!(status, 204);
        let (status, body) = send(&uri, Method::DELETE, "namespaces/db/views/w", None).await;
        assert_eq!(
            (status, error_type(&body)),
            (404, json!("NoSuchViewException")),
            "{body}"
        );
        let (status, body) = send(&uri, Method::GET, "namespaces/db/views", None).await;
        assert_eq!(json_of(&body)["identifiers"], json!([]), "{status} {body}");
    }

    /// What the catalog view refuses, by the protocol's codes, and what it
    /// allows a catalog token that other tokens cannot do.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_catalog_view_answers_by_the_protocol() {
        let dir = tempfile::tempdir().unwrap();
        let uri = serve(dir.path(), r#"["s.*", "x.only"]"#).await;
        let call = |method, path: &'static str, body| send(&uri, method, path, body);
        let schema = serde_json::json!({"type": "struct", "schema-id": 0, "fields": [
            {"id": 1, "name": "id", "required": true, "type": "long"}]});
        let create = |name: &str| serde_json::json!({"name": name, "schema": schema});
        use reqwest::Method;

        assert_eq!(
            call(
                Method::POST,
                "namespaces",
                Some(serde_json::json!({"namespace": ["s"]}))
            )
            .await
            .0,
            200
        );
        // Namespaces and tables outside the token's reach.
        let (status, body) = call(
            Method::POST,
            "namespaces",
            Some(serde_json::json!({"namespace": ["y"]})),
        )
        .await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("its tables are s.*, x.only"), "{body}");
        let (status, body) = call(
            Method::POST,
            "namespaces",
            Some(serde_json::json!({"namespace": ["x"]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = call(Method::POST, "namespaces/x/tables", Some(create("other"))).await;
        assert_eq!(status, 403, "{body}");
        // A location of the client's choosing.
        let mut placed = create("t");
        placed["location"] = serde_json::json!("file:///tmp/elsewhere");
        let (status, body) = call(Method::POST, "namespaces/s/tables", Some(placed)).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("leave location out"), "{body}");
        let (status, body) = call(Method::POST, "namespaces/s/tables", Some(create("t"))).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains("\"format-version\":2")
                && body.contains("\"write.parquet.compression-codec\":\"zstd\""),
            "{body}"
        );
        let (status, _) = call(Method::POST, "namespaces/s/tables", Some(create("t"))).await;
        assert_eq!(status, 409);
        // The format version a client asks for among the properties.
        for (asked, answer) in [("1", 200), ("3", 200), ("9", 400)] {
            let mut versioned = create(&format!("v{asked}"));
            versioned["properties"] = serde_json::json!({"format-version": asked});
            let (status, body) = call(Method::POST, "namespaces/s/tables", Some(versioned)).await;
            assert_eq!(status, answer, "{body}");
            if answer == 200 {
                assert!(
                    body.contains(&format!("\"format-version\":{asked}")),
                    "{body}"
                );
            }
        }
        let (_, listed) = call(Method::GET, "namespaces", None).await;
        assert!(
            listed.contains("\"s\"") && listed.contains("\"x\"") && !listed.contains("icestage"),
            "{listed}"
        );

        // A commit whose requirement fails is a conflict; one that holds lands.
        let stale = serde_json::json!({
            "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 42}],
            "updates": [{"action": "set-properties", "updates": {"k": "v"}}]});
        let (status, body) = call(Method::POST, "namespaces/s/tables/t", Some(stale)).await;
        assert_eq!(status, 409, "{body}");
        let fresh = serde_json::json!({
            "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": null}],
            "updates": [{"action": "set-properties", "updates": {"k": "v"}}]});
        let (status, body) = call(Method::POST, "namespaces/s/tables/t", Some(fresh)).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"k\":\"v\""), "{body}");

        // Dropped, it is gone; booleans are read as clients send them
        // (PyIceberg sends Python's `False`), and nonsense says so.
        let (status, body) = call(
            Method::DELETE,
            "namespaces/s/tables/t?purgeRequested=maybe",
            None,
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("'maybe' is not a boolean"), "{body}");
        let (status, _) = call(
            Method::DELETE,
            "namespaces/s/tables/t?purgeRequested=False",
            None,
        )
        .await;
        assert_eq!(status, 204);
        let (status, body) = call(Method::GET, "namespaces/s/tables/t", None).await;
        assert_eq!(status, 404, "{body}");
    }
}
