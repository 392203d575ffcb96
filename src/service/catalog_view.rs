//! The REST catalog as an API token with the `catalog` operation sees it:
//! the tables of one of the service's catalogs (the token's first, or the
//! one its path's prefix names) that the token's `tables` reach
//! (`namespace.table`, `namespace.*`, `*`), with what an engine that manages
//! tables needs: namespaces (list, load, create, update and remove
//! properties, drop when empty; the last two only for a token that owns
//! every table of the namespace), tables (list, load, create, drop) and
//! commits of any kind. Another icestage uses it as its `type = "rest"`
//! catalog.
//!
//! Commits are checked against their requirements and applied by icestage
//! on exactly the version checked (the same compare-and-swap as a session's
//! append), so a lost race is a 409 the client retries. A table outside the
//! token's reach answers 404, as if it did not exist; creating one there is
//! 403. A table is placed where the catalog places it (a request that names
//! another location is refused).

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;
use iceberg::spec::FormatVersion;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
};

use super::config::TokenSettings;
use super::rest_error::RestError;
use crate::catalog::IcebergCatalog;

/// The most requirements and updates one commit through the catalog view
/// may carry.
const MAX_CHANGES: usize = 64;

/// The endpoints a catalog token is served, as `GET /v1/config` lists them.
pub(crate) const ENDPOINTS: &[&str] = &[
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
];

type ViewResult<T> = std::result::Result<T, RestError>;

/// The most property changes one namespace update may carry.
const MAX_NAMESPACE_CHANGES: usize = 1000;

/// The property the JDBC layout keeps so that a namespace without
/// properties of its own exists.
const NAMESPACE_MARK: &str = "exists";

/// `POST .../namespaces/{namespace}/properties`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateNamespaceProperties {
    #[serde(default)]
    removals: Option<Vec<String>>,
    #[serde(default)]
    updates: Option<HashMap<String, String>>,
}

/// See the module documentation.
pub(crate) struct CatalogView {
    token: TokenSettings,
    catalog: Arc<IcebergCatalog>,
}

fn dotted(namespace: &NamespaceIdent) -> String {
    namespace.join(".")
}

impl CatalogView {
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

    pub(crate) async fn list_namespaces(
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

    pub(crate) async fn load_namespace(
        &self,
        namespace: &NamespaceIdent,
    ) -> ViewResult<NamespaceResponse> {
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

    pub(crate) async fn create_namespace(
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

    /// Sets `updates` and removes `removals` among `namespace`'s
    /// properties: which were updated, removed, and asked to be removed but
    /// missing.
    pub(crate) async fn update_namespace_properties(
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
    pub(crate) async fn drop_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<()> {
        self.owned_namespace(namespace, "drop")?;
        self.load_namespace(namespace).await?;
        let catalog = self.catalog.catalog();
        let tables = catalog.list_tables(namespace).await?.len();
        // Children only: a SQL catalog answers every namespace whose name
        // starts with the parent's text (`db2` for `db`).
        let children = catalog
            .list_namespaces(Some(namespace))
            .await?
            .iter()
            .filter(|child| child.len() > namespace.len() && child.starts_with(namespace))
            .count();
        if tables + children > 0 {
            return Err(RestError::new(
                StatusCode::CONFLICT,
                "NamespaceNotEmptyException",
                format!(
                    "namespace {} is not empty ({tables} table(s), {children} namespace(s)): \
                     drop what it holds first",
                    dotted(namespace)
                ),
            ));
        }
        catalog.drop_namespace(namespace).await?;
        Ok(())
    }

    pub(crate) async fn list_tables(
        &self,
        namespace: &NamespaceIdent,
    ) -> ViewResult<ListTablesResponse> {
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

    pub(crate) async fn load_table(&self, ident: &TableIdent) -> ViewResult<LoadTableResult> {
        let table = self.table(ident).await?;
        Ok(loaded(&table))
    }

    pub(crate) async fn table_exists(&self, ident: &TableIdent) -> ViewResult<()> {
        self.visible_table(ident)?;
        if self.catalog.catalog().table_exists(ident).await? {
            Ok(())
        } else {
            Err(self.no_table(ident))
        }
    }

    pub(crate) async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        request: CreateTableRequest,
    ) -> ViewResult<LoadTableResult> {
        let ident = TableIdent::new(namespace.clone(), request.name.clone());
        if self.visible_table(&ident).is_err() {
            return Err(self.may_not_create(&format!("table {ident}")));
        }
        let bad = |message: String| {
            RestError::new(StatusCode::BAD_REQUEST, "BadRequestException", message)
        };
        if request.stage_create == Some(true) {
            return Err(bad(format!(
                "{ident}: staged creation is not served; create the table, then commit to it"
            )));
        }
        if let Some(location) = &request.location
            && self.catalog.default_table_location(&ident).as_deref() != Some(location.as_str())
        {
            return Err(bad(format!(
                "{ident}: location '{location}' was asked for; this catalog places tables itself, \
                 leave location out"
            )));
        }
        // `format-version` among the properties is how clients ask for a
        // v1, v2 or v3 table; new tables write zstd Parquet unless told
        // otherwise, as Iceberg's own REST catalog creates them.
        let mut properties = request.properties;
        let format_version = match properties.remove("format-version").as_deref() {
            None | Some("2") => FormatVersion::V2,
            Some("1") => FormatVersion::V1,
            Some("3") => FormatVersion::V3,
            Some(other) => {
                return Err(bad(format!(
                    "{ident}: format-version '{other}' is not one of 1, 2 or 3"
                )));
            }
        };
        properties
            .entry("write.parquet.compression-codec".to_string())
            .or_insert_with(|| "zstd".to_string());
        let creation = TableCreation::builder()
            .name(request.name)
            .schema(request.schema)
            .partition_spec_opt(request.partition_spec)
            .sort_order_opt(request.write_order)
            .properties(properties)
            .format_version(format_version)
            .build();
        let table = self
            .catalog
            .catalog()
            .create_table(namespace, creation)
            .await
            .map_err(|e| match e.kind() {
                iceberg::ErrorKind::TableAlreadyExists => RestError::new(
                    StatusCode::CONFLICT,
                    "AlreadyExistsException",
                    format!("table {ident} already exists"),
                ),
                iceberg::ErrorKind::NamespaceNotFound => self.no_namespace(namespace),
                _ => e.into(),
            })?;
        Ok(loaded(&table))
    }

    /// Drops `ident`; with `purge`, also its files, through the deletion
    /// gate: only what lies under the location the catalog assigned to the
    /// table, whatever its metadata names (iceberg's own purge would follow
    /// every path the metadata holds, and a client wrote it).
    pub(crate) async fn drop_table(&self, ident: &TableIdent, purge: bool) -> ViewResult<()> {
        let table = self.table(ident).await?;
        let catalog = self.catalog.catalog();
        let dropped = if purge {
            self.catalog
                .remove_table(&table, crate::catalog::Removal::Everything)
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
    pub(crate) async fn commit(
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
        let table = self.table(ident).await?;
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

    /// No storage credentials: a catalog token's holder brings its own
    /// storage access (a local warehouse needs none).
    pub(crate) async fn credentials(&self, ident: &TableIdent) -> ViewResult<serde_json::Value> {
        self.table_exists(ident).await?;
        Ok(serde_json::json!({"storage-credentials": []}))
    }
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
    use crate::catalog::rest::VERSION_REF;
    use crate::config::CatalogConfig;
    use crate::service::{AppState, ServiceConfig, router};

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
            ("namespaces/shared/views", 501, "NotImplementedException"),
            ("namespaces/shared/views/v", 501, "NotImplementedException"),
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
        let send = |method, path: &'static str, body| send(&uri, method, path, body);
        use reqwest::Method;
        let (status, body) = send(
            Method::POST,
            "namespaces",
            Some(serde_json::json!({"namespace": ["sandbox"]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let schema = serde_json::json!({"type": "struct", "schema-id": 0, "fields": [
            {"id": 1, "name": "id", "required": true, "type": "long"}]});
        let (status, body) = send(
            Method::POST,
            "namespaces/sandbox/tables",
            Some(serde_json::json!({"name": "t", "schema": schema})),
        )
        .await;
        assert_eq!(status, 200, "{body}");

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
