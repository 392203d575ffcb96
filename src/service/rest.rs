//! icestage's Iceberg REST catalog, under `/iceberg`: what any Iceberg
//! client (PyIceberg `type="rest"`, iceberg-rust's `RestCatalog`, Spark,
//! DuckDB) uses to reach one session's one table with the session's token.
//!
//! A token sees its table and that table's namespace, nothing else (another
//! table answers 404). A download's token reads its table while the
//! download is ready. An upload's token loads its staging table and commits
//! appends to it while the session is open (a failed upload's table is
//! read only); every commit is checked to be an append under the table's
//! assigned location and applied
//! by icestage on exactly the version the client built on (409 otherwise,
//! which clients retry). Nothing else changes: no schema, property, spec or
//! location update, no create, drop or rename.
//!
//! An API token with the `catalog` operation sees more: the tables its
//! `tables` reach, with creates, drops and commits of any kind
//! ([`super::catalog_view`]); that is what another icestage uses as its
//! `type = "rest"` catalog.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use chrono::Utc;
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
    RegisterTableRequest, RenameTableRequest, StorageCredential,
};
use serde_json::json;

use super::catalog_view::{self, CatalogView};
use super::{AppState, TokenOperation};
use crate::catalog::commit::append::{Refusal, apply_append, check_append};
use crate::credentials::AccessMode;
use crate::credentials::sign::{Scope, SignRequest, check, sign_request};
use crate::credentials::vend::{DEFAULT_DURATION, Grant, check_usable, download_grant};
use crate::download::{DownloadId, DownloadState, find_download};
use crate::session::log;
use crate::session::token::{self, PROP_ACCESS_TOKEN, TokenKind};
use crate::upload::{Staging, UploadId, UploadState, find_staging};

/// The endpoints served, as `GET /v1/config` lists them (clients use exactly
/// these).
const ENDPOINTS: &[&str] = &[
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/transactions/commit",
];

/// The header an Iceberg client asks for storage access with, and the
/// catalog property (PyIceberg's `header.` prefix) that makes it send one.
const ACCESS_DELEGATION: &str = "x-iceberg-access-delegation";
pub(crate) const ACCESS_DELEGATION_PROPERTY: &str = "header.X-Iceberg-Access-Delegation";
/// The access delegation mode where the catalog signs each storage request.
pub(crate) const REMOTE_SIGNING: &str = "remote-signing";
/// Where the signer answers, relative to the catalog's URI (the protocol's
/// default, which PyIceberg also assumes).
const SIGNER_ENDPOINT: &str = "v1/aws/s3/sign";

/// The catalog a request's path names (`/iceberg/v1/{prefix}/...`), put
/// on the request by [`prefixed`].
#[derive(Debug, Clone)]
struct Warehouse(String);

/// What a REST request presents: its headers (the bearer token) and the
/// catalog its path's prefix names, if any.
struct Presented {
    headers: HeaderMap,
    warehouse: Option<String>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Presented {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> std::result::Result<Self, Self::Rejection> {
        Ok(Self {
            headers: parts.headers.clone(),
            warehouse: parts.extensions.get::<Warehouse>().map(|w| w.0.clone()),
        })
    }
}

/// The REST catalog's routes: each at `/iceberg/v1/...` (the token's own
/// catalog) and at `/iceberg/v1/{prefix}/...`, the prefix naming one of
/// the service's catalogs (`GET /v1/config?warehouse=<name>` answers it).
pub(crate) fn routes() -> Router<AppState> {
    unprefixed().route("/iceberg/v1/{prefix}/{*rest}", any(prefixed))
}

/// A prefixed request, answered by the unprefixed routes knowing its
/// catalog.
async fn prefixed(
    State(state): State<AppState>,
    Path((prefix, _)): Path<(String, String)>,
    mut request: axum::extract::Request,
) -> Response {
    static ROUTES: std::sync::OnceLock<Router<AppState>> = std::sync::OnceLock::new();
    // The rest of the path as sent, still percent-encoded (a nested
    // namespace's U+001F, a name with a space).
    let rest = request
        .uri()
        .path()
        .strip_prefix("/iceberg/v1/")
        .and_then(|path| path.split_once('/'))
        .map_or("", |(_, rest)| rest);
    let query = request
        .uri()
        .query()
        .map_or_else(String::new, |q| format!("?{q}"));
    let Ok(uri) = format!("/iceberg/v1/{rest}{query}").parse() else {
        return RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "the path is not a valid URI",
        )
        .into_response();
    };
    *request.uri_mut() = uri;
    // Fresh extensions: the outer route's path parameters must not reach
    // the inner routes' extractors (the peer address lives in the task).
    let mut extensions = axum::http::Extensions::new();
    extensions.insert(Warehouse(prefix));
    *request.extensions_mut() = extensions;
    let routes = ROUTES
        .get_or_init(|| unprefixed().fallback(not_served))
        .clone()
        .with_state(state);
    match tower::ServiceExt::oneshot(routes, request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// A path of the REST catalog that is not served: 404 in the protocol's
/// error shape. (What a catalog cannot keep, such as views on S3 Tables,
/// answers 501 from its own endpoint.)
pub(crate) async fn not_served(uri: axum::http::Uri) -> Response {
    RestError::new(
        StatusCode::NOT_FOUND,
        "NotFoundException",
        format!(
            "no such endpoint: {}: GET /v1/config lists the endpoints served",
            uri.path()
        ),
    )
    .into_response()
}

fn unprefixed() -> Router<AppState> {
    Router::new()
        .route("/iceberg/v1/config", get(config))
        .route(
            "/iceberg/v1/namespaces",
            get(list_namespaces).post(create_namespace),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}",
            get(load_namespace)
                .head(namespace_exists)
                .delete(drop_namespace),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}/properties",
            post(update_namespace_properties),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}/tables",
            get(list_tables).post(create_table),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}/tables/{table}",
            get(load_table)
                .head(table_exists)
                .post(commit_table)
                .delete(drop_table),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}/tables/{table}/credentials",
            get(credentials),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}/register",
            post(register_table),
        )
        .route("/iceberg/v1/tables/rename", post(rename_table))
        .route(
            "/iceberg/v1/namespaces/{namespace}/views",
            get(list_views).post(create_view),
        )
        .route(
            "/iceberg/v1/namespaces/{namespace}/views/{view}",
            get(load_view)
                .head(view_exists)
                .post(replace_view)
                .delete(drop_view),
        )
        .route("/iceberg/v1/views/rename", post(rename_view))
        .route("/iceberg/v1/transactions/commit", post(commit_transaction))
        .route("/iceberg/v1/aws/s3/sign", post(sign_storage_request))
}

pub(crate) use super::rest_error::RestError;

type RestResult = std::result::Result<Response, RestError>;

/// An answer that carries a table's metadata (`LoadTableResult`,
/// `CommitTableResponse`), as JSON with the metadata's lists in order:
/// snapshots by sequence number, schemas, partition specs and sort orders
/// by id, statistics by snapshot. iceberg keeps them in maps, so their
/// order in its JSON varies; clients (PyIceberg's `snapshots()`, history)
/// show them in the order received, and Java's catalogs write them in
/// order.
struct TableJson<T>(T);

impl<T: serde::Serialize> IntoResponse for TableJson<T> {
    fn into_response(self) -> Response {
        let mut answer = match serde_json::to_value(&self.0) {
            Ok(answer) => answer,
            Err(e) => {
                return RestError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                    format!("internal: cannot write the table's metadata: {e}"),
                )
                .into_response();
            }
        };
        if let Some(metadata) = answer.get_mut("metadata") {
            order_metadata(metadata);
        }
        Json(answer).into_response()
    }
}

/// The defaults of `float` fields in schema type `kind` (JSON) written as
/// the float they are: iceberg writes a float's value widened to a double
/// (22.27 as 22.270000457763672), and clients read the JSON number as
/// given.
fn float_defaults(kind: &mut serde_json::Value) {
    let Some(fields) = kind.get_mut("fields").and_then(|f| f.as_array_mut()) else {
        for part in ["element", "key", "value"] {
            if let Some(inner) = kind.get_mut(part) {
                float_defaults(inner);
            }
        }
        return;
    };
    for field in fields {
        if field.get("type").and_then(|t| t.as_str()) == Some("float") {
            for key in ["initial-default", "write-default"] {
                if let Some(value) = field.get_mut(key)
                    && let Some(wide) = value.as_f64()
                    && let Ok(narrow) = (wide as f32).to_string().parse::<f64>()
                    && let Some(number) = serde_json::Number::from_f64(narrow)
                {
                    *value = number.into();
                }
            }
        } else if let Some(inner) = field.get_mut("type") {
            float_defaults(inner);
        }
    }
}

/// Sorts the lists of table metadata `metadata` (JSON) by their keys.
fn order_metadata(metadata: &mut serde_json::Value) {
    let by = |list: &str, keys: &[&str], metadata: &mut serde_json::Value| {
        if let Some(items) = metadata.get_mut(list).and_then(|v| v.as_array_mut()) {
            items.sort_by_key(|item| {
                keys.iter()
                    .map(|key| item.get(*key).and_then(|v| v.as_i64()).unwrap_or(i64::MIN))
                    .collect::<Vec<_>>()
            });
        }
    };
    for schema in metadata
        .get_mut("schemas")
        .and_then(|s| s.as_array_mut())
        .into_iter()
        .flatten()
    {
        float_defaults(schema);
    }
    by("snapshots", &["sequence-number", "timestamp-ms"], metadata);
    by("schemas", &["schema-id"], metadata);
    by("partition-specs", &["spec-id"], metadata);
    by("sort-orders", &["order-id"], metadata);
    by("statistics", &["snapshot-id"], metadata);
    by("partition-statistics", &["snapshot-id"], metadata);
}

/// The session a request's token opens: its table as the catalog holds it
/// now, where icestage placed it and what the token may do (a [`Grant`]).
struct Access {
    grant: Grant,
    /// The session's id.
    session: String,
    /// An upload's session (appends allowed while it is open);
    /// `None` for a download (read only).
    upload: Option<Staging>,
}

impl Access {
    fn ident(&self) -> &TableIdent {
        self.grant.table.identifier()
    }

    /// `namespace` (and `table`) as the request names them, if they are
    /// this session's; 404 otherwise.
    fn check(&self, namespace: &str, table: Option<&str>) -> std::result::Result<(), RestError> {
        let ident = self.ident();
        let same_namespace = NamespaceIdent::from_strs(namespace_parts(namespace))
            .is_ok_and(|ns| &ns == ident.namespace());
        let same_table = table.is_none_or(|t| t == ident.name());
        if same_namespace && same_table {
            Ok(())
        } else {
            Err(match table {
                Some(table) => RestError::not_found(&format!("table {namespace}.{table}")),
                None => RestError::new(
                    StatusCode::NOT_FOUND,
                    "NoSuchNamespaceException",
                    format!("namespace {namespace} does not exist or is not this session's"),
                ),
            })
        }
    }
}

/// Who a request's bearer token is.
enum Bearer {
    /// A session's token: its one table.
    Session(Box<Access>),
    /// An API token with the `catalog` operation: its tables.
    Catalog(CatalogView),
}

fn unauthorized(message: &str) -> RestError {
    RestError::new(StatusCode::UNAUTHORIZED, "NotAuthorizedException", message)
}

fn slow_down(state: &AppState, who: &str) -> std::result::Result<(), RestError> {
    match state.admit(who) {
        None => Ok(()),
        Some(wait) => Err(RestError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "SlowDownException",
            format!(
                "{who} made more than {} requests a minute: retry after {wait}s",
                state.0.config.service.requests_per_minute
            ),
        )),
    }
}

/// The bearer of `headers`: a session token icestage issued, or an API
/// token with the `catalog` operation; 401 for anything else.
///
/// A failed authentication is charged to the client's address, never to
/// the session or token it named (see `limit`).
async fn bearer(state: &AppState, asked: &Presented) -> std::result::Result<Bearer, RestError> {
    let stranger = || match state.limiter().stranger_wait() {
        Some(wait) => Err(RestError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "SlowDownException",
            format!(
                "this address sent too many requests without a valid token: retry after \
                 {wait}s with a valid token"
            ),
        )),
        None => Ok(()),
    };
    let refused = |error: RestError| {
        if error.status == StatusCode::UNAUTHORIZED {
            state.limiter().refused();
        }
        error
    };
    let presented = super::bearer_token(&asked.headers).ok_or_else(|| {
        stranger().err().unwrap_or_else(|| {
            refused(unauthorized(
                "send the session's token as Authorization: Bearer <token>",
            ))
        })
    })?;
    if token::parse(presented).is_some() {
        // Checking a session token reads the catalog: an address that keeps
        // failing is stopped before that work.
        stranger()?;
        let access = session_access(state, presented).await.map_err(refused)?;
        // A session is in one catalog; under another's prefix it is not.
        if let Some(warehouse) = &asked.warehouse
            && access.grant.catalog.name() != warehouse
        {
            return Err(no_warehouse(warehouse));
        }
        return Ok(Bearer::Session(Box::new(access)));
    }
    let Some(token) = state.api_token(presented) else {
        stranger()?;
        return Err(refused(unauthorized(
            if super::oauth::looks_issued(presented) {
                "the OAuth token has expired or is not valid: get a new one from \
             POST /iceberg/v1/oauth/tokens"
            } else {
                "the token is not a session token icestage issued"
            },
        )));
    };
    slow_down(state, &format!("token '{}'", token.name))?;
    if !token.operations.contains(&TokenOperation::Catalog) {
        return Err(RestError::new(
            StatusCode::FORBIDDEN,
            "ForbiddenException",
            format!(
                "token '{}' may not use the REST catalog: give it the catalog operation, or use \
                 the connection of an upload or download",
                token.name
            ),
        ));
    }
    let catalog = state
        .token_catalog(&token, asked.warehouse.as_deref())
        .ok_or_else(|| no_warehouse(asked.warehouse.as_deref().unwrap_or_default()))?;
    Ok(Bearer::Catalog(CatalogView::new(token, catalog)))
}

/// 404 for a catalog that does not exist or that the token does not reach
/// (the same answer: a token learns nothing of other tenants).
fn no_warehouse(name: &str) -> RestError {
    RestError::new(
        StatusCode::NOT_FOUND,
        "NoSuchWarehouseException",
        format!("warehouse '{name}' does not exist or this token does not reach it"),
    )
}

/// A session's bearer only: what the session endpoints need.
async fn access(state: &AppState, asked: &Presented) -> std::result::Result<Access, RestError> {
    match bearer(state, asked).await? {
        Bearer::Session(access) => Ok(*access),
        Bearer::Catalog(_) => Err(RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "this endpoint takes a session's token",
        )),
    }
}

/// The session of `presented` (a session token): 401 when it is not valid,
/// 403 when the session is over (a token lives as long as its session).
async fn session_access(
    state: &AppState,
    presented: &str,
) -> std::result::Result<Access, RestError> {
    let (kind, id, secret) = token::parse(presented)
        .ok_or_else(|| unauthorized("the token is not a session token icestage issued"))?;
    match kind {
        TokenKind::Upload => {
            let id = UploadId::parse(id).map_err(|_| unauthorized("the token is not valid"))?;
            let staging = find_staging(&state.0.icestage, &id)
                .await?
                .filter(|s| holds(&s.table, secret))
                .ok_or_else(|| unauthorized("the token is not valid, or its upload has ended"))?;
            // Each session has the request rate of an API token, charged once
            // its secret was checked (a stranger's guesses charge its address).
            slow_down(state, &format!("session {id}"))?;
            if staging.is_expired(Utc::now()) || staging.tampered.is_some() {
                return Err(RestError::new(
                    StatusCode::FORBIDDEN,
                    "ForbiddenException",
                    format!("upload {id} has expired or can no longer be promoted"),
                ));
            }
            // Rows change only while the upload is open: a failed upload's
            // table is read (its findings explained), never written.
            let mode = if staging.state == UploadState::Open {
                AccessMode::Write
            } else {
                AccessMode::Read
            };
            Ok(Access {
                grant: Grant::upload(&staging, mode).await?,
                session: staging.id.to_string(),
                upload: Some(staging),
            })
        }
        TokenKind::Download => {
            let id = DownloadId::parse(id).map_err(|_| unauthorized("the token is not valid"))?;
            let connection = state.download_connection_secret(id.as_str());
            let download = find_download(&state.0.icestage, &id)
                .await?
                .filter(|d| {
                    holds(&d.table, secret)
                        || crate::secret::equal_time(connection.as_bytes(), secret.as_bytes())
                })
                .ok_or_else(|| unauthorized("the token is not valid, or its download has ended"))?;
            slow_down(state, &format!("session {id}"))?;
            if download.state == DownloadState::Pending && !download.is_expired(Utc::now()) {
                return Err(RestError::not_ready(format!(
                    "download {id} is not ready yet (pending): wait until GET /downloads/{id} \
                     answers ready (or its webhook comes), then load the table"
                )));
            }
            if download.state != DownloadState::Ready || download.is_expired(Utc::now()) {
                return Err(RestError::new(
                    StatusCode::FORBIDDEN,
                    "ForbiddenException",
                    format!(
                        "download {id} is {}: it can no longer be read",
                        download.state
                    ),
                ));
            }
            Ok(Access {
                session: download.id.to_string(),
                grant: download_grant(download, Some(AccessMode::Read))?,
                upload: None,
            })
        }
    }
}

/// Whether `table` keeps the hash of `secret` as its session's token.
fn holds(table: &Table, secret: &str) -> bool {
    token::matches(secret, table.metadata().properties().get(PROP_ACCESS_TOKEN))
}

/// `GET /v1/config?warehouse=`.
#[derive(Debug, serde::Deserialize)]
struct ConfigQuery {
    warehouse: Option<String>,
}

async fn config(
    State(state): State<AppState>,
    mut asked: Presented,
    Query(query): Query<ConfigQuery>,
) -> RestResult {
    // A session's token reaches its one table wherever it is asked from:
    // the warehouse a client names (DuckDB always names one) chooses
    // nothing for it. An API token's chooses its catalog.
    let session = super::bearer_token(&asked.headers).is_some_and(|t| token::parse(t).is_some());
    if query.warehouse.is_some() && !session {
        asked.warehouse = query.warehouse;
    }
    let endpoints = match bearer(&state, &asked).await {
        Ok(Bearer::Session(_)) => ENDPOINTS.to_vec(),
        Ok(Bearer::Catalog(view)) => view.endpoints(),
        // A client configures its catalog as soon as it has the download's
        // connection; its table answers once the download is ready.
        Err(e) if e.is_not_ready() => ENDPOINTS.to_vec(),
        Err(e) => return Err(e),
    };
    // The client sends the rest of its requests under the catalog it asked
    // for.
    let overrides = match &asked.warehouse {
        Some(warehouse) => json!({"prefix": warehouse}),
        None => json!({}),
    };
    Ok(Json(json!({
        "defaults": {"namespace-separator": NAMESPACE_SEPARATOR},
        "overrides": overrides,
        "endpoints": endpoints,
    }))
    .into_response())
}

/// What separates the parts of a namespace in a path, as `GET /v1/config`
/// tells clients (`namespace-separator`). The protocol's default, U+001F,
/// is taken too, from clients that do not read it. A part cannot hold a
/// `.` anyway: the SQL catalog's layout keeps namespaces dotted.
const NAMESPACE_SEPARATOR: &str = ".";

/// The parts of a namespace as a path names it.
fn namespace_parts(namespace: &str) -> impl Iterator<Item = &str> {
    namespace.split(['\u{1f}', '.'])
}

/// A namespace as a path names it ([`namespace_parts`]); 400 when it is
/// empty.
fn namespace_of(namespace: &str) -> std::result::Result<NamespaceIdent, RestError> {
    NamespaceIdent::from_strs(namespace_parts(namespace)).map_err(|_| {
        RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            format!("'{namespace}' is not a namespace"),
        )
    })
}

fn table_of(namespace: &str, table: &str) -> std::result::Result<TableIdent, RestError> {
    Ok(TableIdent::new(namespace_of(namespace)?, table.to_string()))
}

/// 403 for what only a catalog token may do.
fn session_may_not(what: &str) -> RestError {
    RestError::new(
        StatusCode::FORBIDDEN,
        "ForbiddenException",
        format!("a session's token cannot {what}: it reaches its own table only"),
    )
}

/// `GET /v1/namespaces?parent=`.
#[derive(Debug, serde::Deserialize)]
struct Parent {
    parent: Option<String>,
}

async fn list_namespaces(
    State(state): State<AppState>,
    asked: Presented,
    Query(query): Query<Parent>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(access) => Ok(Json(ListNamespaceResponse {
            namespaces: match query.parent {
                None => vec![access.ident().namespace().clone()],
                Some(_) => vec![],
            },
            next_page_token: None,
        })
        .into_response()),
        Bearer::Catalog(view) => {
            let parent = query.parent.as_deref().map(namespace_of).transpose()?;
            Ok(Json(view.list_namespaces(parent.as_ref()).await?).into_response())
        }
    }
}

async fn create_namespace(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<CreateNamespaceRequest>, JsonRejection>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("create a namespace")),
        Bearer::Catalog(view) => {
            Ok(Json(view.create_namespace(request(body)?).await?).into_response())
        }
    }
}

async fn load_namespace(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(access) => {
            access.check(&namespace, None)?;
            Ok(Json(NamespaceResponse {
                namespace: access.ident().namespace().clone(),
                properties: HashMap::new(),
            })
            .into_response())
        }
        Bearer::Catalog(view) => {
            Ok(Json(view.load_namespace(&namespace_of(&namespace)?).await?).into_response())
        }
    }
}

async fn drop_namespace(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("drop a namespace")),
        Bearer::Catalog(view) => {
            view.drop_namespace(&namespace_of(&namespace)?).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}

async fn update_namespace_properties(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<catalog_view::UpdateNamespaceProperties>, JsonRejection>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("change a namespace")),
        Bearer::Catalog(view) => Ok(Json(
            view.update_namespace_properties(&namespace_of(&namespace)?, request(body)?)
                .await?,
        )
        .into_response()),
    }
}

async fn namespace_exists(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(access) => access.check(&namespace, None)?,
        Bearer::Catalog(view) => {
            view.load_namespace(&namespace_of(&namespace)?).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_tables(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(access) => {
            access.check(&namespace, None)?;
            Ok(Json(ListTablesResponse {
                identifiers: vec![access.ident().clone()],
                next_page_token: None,
            })
            .into_response())
        }
        Bearer::Catalog(view) => {
            Ok(Json(view.list_tables(&namespace_of(&namespace)?).await?).into_response())
        }
    }
}

async fn create_table(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<CreateTableRequest>, JsonRejection>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("create a table")),
        Bearer::Catalog(view) => Ok(TableJson(
            view.create_table(&namespace_of(&namespace)?, request(body)?)
                .await?,
        )
        .into_response()),
    }
}

async fn register_table(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<RegisterTableRequest>, JsonRejection>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("register a table")),
        Bearer::Catalog(view) => Ok(TableJson(
            view.register_table(&namespace_of(&namespace)?, request(body)?)
                .await?,
        )
        .into_response()),
    }
}

async fn rename_table(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<RenameTableRequest>, JsonRejection>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("rename a table")),
        Bearer::Catalog(view) => {
            view.rename_table(request(body)?).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}

/// A catalog token's view of the catalog, for the view endpoints: a
/// session's token reaches one table and no views (501, as before views
/// were served at all).
async fn view_bearer(
    state: &AppState,
    asked: &Presented,
) -> std::result::Result<CatalogView, RestError> {
    match bearer(state, asked).await? {
        Bearer::Session(_) => Err(RestError::new(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplementedException",
            "views are not served to a session's token: it reaches its own table only",
        )),
        Bearer::Catalog(view) => Ok(view),
    }
}

async fn list_views(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    Ok(Json(view.list_views(&namespace_of(&namespace)?).await?).into_response())
}

async fn create_view(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<catalog_view::CreateViewRequest>, JsonRejection>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    Ok(Json(
        view.create_view(&namespace_of(&namespace)?, request(body)?)
            .await?,
    )
    .into_response())
}

async fn load_view(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    Ok(Json(view.load_view(&table_of(&namespace, &name)?).await?).into_response())
}

async fn view_exists(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    view.view_exists(&table_of(&namespace, &name)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn replace_view(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
    body: std::result::Result<Json<catalog_view::CommitViewRequest>, JsonRejection>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    Ok(Json(
        view.replace_view(&table_of(&namespace, &name)?, request(body)?)
            .await?,
    )
    .into_response())
}

async fn drop_view(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    view.drop_view(&table_of(&namespace, &name)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn rename_view(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<RenameTableRequest>, JsonRejection>,
) -> RestResult {
    let view = view_bearer(&state, &asked).await?;
    view.rename_view(request(body)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE .../tables/{table}?purgeRequested=`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Purge {
    #[serde(default, deserialize_with = "boolean_as_sent")]
    purge_requested: bool,
}

/// A boolean query parameter as clients send it: `true`/`false` in any
/// case (Java sends `false`, PyIceberg Python's `False`).
fn boolean_as_sent<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<bool, D::Error> {
    let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
    match text.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(serde::de::Error::custom(format!(
            "'{text}' is not a boolean: send true or false"
        ))),
    }
}

async fn drop_table(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
    Query(query): Query<Purge>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(_) => Err(session_may_not("drop a table")),
        Bearer::Catalog(view) => {
            view.drop_table(&table_of(&namespace, &table)?, query.purge_requested)
                .await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}

/// `config` as the vended credentials of the table `access` reaches.
fn storage_credential(access: &Access, config: HashMap<String, String>) -> StorageCredential {
    StorageCredential {
        prefix: access.grant.location.clone(),
        config,
    }
}

async fn storage(access: &Access) -> std::result::Result<HashMap<String, String>, RestError> {
    // As vend_credentials: write keys while the upload is open.
    if let Some(staging) = &access.upload {
        check_usable(staging, access.grant.mode)?;
    }
    let session = format!("icestage-{}", access.session);
    let (credentials, connection) = access.grant.vend(&session, DEFAULT_DURATION).await?;
    let mut storage: HashMap<String, String> = connection
        .properties
        .into_iter()
        .filter(|(key, _)| key.starts_with("s3."))
        .collect();
    if let Some(expiration) = credentials.map(|c| c.expiration) {
        storage.insert(
            "s3.session-token-expires-at-ms".to_string(),
            expiration.timestamp_millis().to_string(),
        );
        // Where a client fetches fresh keys before these end (relative to
        // the catalog URI, as Iceberg's REST clients resolve it).
        let ident = access.ident();
        storage.insert(
            "client.refresh-credentials-endpoint".to_string(),
            format!(
                "v1/namespaces/{}/tables/{}/credentials",
                ident.namespace().join("%1F"),
                ident.name()
            ),
        );
    }
    Ok(storage)
}

/// Whether a session's storage requests are signed rather than given
/// keys: the service requires it, or the client asked for remote signing
/// alone (a client that also accepts vended credentials gets those).
fn signing(state: &AppState, asked: &Presented) -> bool {
    let modes: Vec<String> = asked
        .headers
        .get_all(ACCESS_DELEGATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|m| m.trim().to_ascii_lowercase())
        .collect();
    state.remote_signing_required()
        || (modes.iter().any(|m| m == REMOTE_SIGNING)
            && !modes.iter().any(|m| m == "vended-credentials"))
}

/// A session's storage configuration under remote signing: where the
/// signer is, how to reach the store, and no key.
fn signing_config(state: &AppState, access: &Access) -> HashMap<String, String> {
    let mut config = access.grant.catalog.aws().store_properties();
    config.extend([
        ("s3.remote-signing-enabled".to_string(), "true".to_string()),
        // PyIceberg's name for the signer it loads, and the file IO that
        // carries it (its pyarrow file IO does not sign remotely).
        ("s3.signer".to_string(), "S3V4RestSigner".to_string()),
        (
            "py-io-impl".to_string(),
            "pyiceberg.io.fsspec.FsspecFileIO".to_string(),
        ),
        ("s3.signer.uri".to_string(), state.rest_uri()),
        (
            "s3.signer.endpoint".to_string(),
            SIGNER_ENDPOINT.to_string(),
        ),
    ]);
    config
}

async fn load_table(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
) -> RestResult {
    let access = match bearer(&state, &asked).await? {
        Bearer::Session(access) => access,
        Bearer::Catalog(view) => {
            let ident = table_of(&namespace, &table)?;
            return Ok(TableJson(view.load_table(&ident).await?).into_response());
        }
    };
    access.check(&namespace, Some(&table))?;
    let (config, storage_credentials) = if signing(&state, &asked) {
        (signing_config(&state, &access), None)
    } else {
        let config = storage(&access).await?;
        let credentials = vec![storage_credential(&access, config.clone())];
        (config, Some(credentials))
    };
    Ok(TableJson(LoadTableResult {
        metadata_location: access.grant.table.metadata_location().map(str::to_string),
        metadata: access.grant.table.metadata().clone(),
        storage_credentials,
        config,
    })
    .into_response())
}

/// 403 for the token of a session that has ended (promoted, aborted,
/// expired), from the session log; `None` for any other token.
async fn ended_session(state: &AppState, asked: &Presented) -> Option<RestError> {
    let (kind, id, _) = token::parse(super::bearer_token(&asked.headers)?)?;
    let icestage = &state.0.icestage;
    let ended = match kind {
        TokenKind::Upload => log::find::<UploadState>(icestage, log::UPLOADS, id)
            .await
            .ok()??
            .state
            .to_string(),
        TokenKind::Download => log::find::<DownloadState>(icestage, log::DOWNLOADS, id)
            .await
            .ok()??
            .state
            .to_string(),
    };
    Some(RestError::new(
        StatusCode::FORBIDDEN,
        "ForbiddenException",
        format!("session {id} is {ended}: its storage requests are no longer signed"),
    ))
}

/// `POST /v1/aws/s3/sign`: signs one storage request of a session with the
/// service's credentials, if the session may make it now
/// ([`crate::credentials::sign`]); 403 naming the request otherwise, and
/// for any request once the session has ended.
async fn sign_storage_request(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<SignRequest>, JsonRejection>,
) -> RestResult {
    let access = match bearer(&state, &asked).await {
        Ok(Bearer::Session(access)) => access,
        // A session that ended removed its table, and the token with it:
        // say that it ended, as its log records.
        Err(error) if error.status == StatusCode::UNAUTHORIZED => {
            return Err(ended_session(&state, &asked).await.unwrap_or(error));
        }
        Err(error) => return Err(error),
        Ok(Bearer::Catalog(_)) => {
            return Err(RestError::new(
                StatusCode::FORBIDDEN,
                "ForbiddenException",
                "storage requests are signed for sessions (an upload's or a download's token); \
                 a catalog token's clients use their own storage credentials",
            ));
        }
    };
    let request = request(body)?;
    let signature = |outcome: &'static str| {
        crate::metrics::count(
            "icestage_storage_signatures_total",
            "Storage requests the REST catalog was asked to sign, by outcome.",
            &[("outcome", outcome)],
            1.0,
        );
    };
    let refused = |why: String| {
        signature("refused");
        RestError::new(StatusCode::FORBIDDEN, "ForbiddenException", why)
    };
    // Writes while the upload is open; a download's reads while it is
    // ready (its token is refused otherwise); nothing for an upload that
    // is no longer open.
    let write = match &access.upload {
        Some(staging) if staging.state == UploadState::Open => true,
        Some(staging) => {
            return Err(refused(format!(
                "upload {} is {}: its storage requests are no longer signed",
                staging.id, staging.state
            )));
        }
        None => false,
    };
    // A download reads, besides its table, the files its rows name.
    let named = match &access.upload {
        Some(_) => None,
        None => Some(
            state
                .named_files(&access.grant)
                .await
                .map_err(RestError::from)?,
        ),
    };
    let aws = access.grant.catalog.aws();
    let scope = Scope {
        location: &access.grant.location,
        write,
        reads: named.as_deref(),
    };
    let allowed = check(&scope, aws, &request).map_err(refused)?;
    let credentials = state
        .signing_credentials(&access.grant.catalog)
        .await
        .map_err(RestError::from)?;
    let signed = sign_request(
        &request,
        &allowed,
        &credentials,
        &aws.region,
        std::time::SystemTime::now(),
    )
    .map_err(|e| {
        RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            format!("the request cannot be signed: {e}"),
        )
    })?;
    signature("signed");
    Ok(Json(signed).into_response())
}

async fn table_exists(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
) -> RestResult {
    match bearer(&state, &asked).await? {
        Bearer::Session(access) => access.check(&namespace, Some(&table))?,
        Bearer::Catalog(view) => view.table_exists(&table_of(&namespace, &table)?).await?,
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn credentials(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
) -> RestResult {
    let access = match bearer(&state, &asked).await? {
        Bearer::Session(access) => access,
        Bearer::Catalog(view) => {
            let ident = table_of(&namespace, &table)?;
            return Ok(Json(view.credentials(&ident).await?).into_response());
        }
    };
    access.check(&namespace, Some(&table))?;
    if signing(&state, &asked) {
        // Signed request by request: no key to hand out.
        return Ok(Json(json!({"storage-credentials": []})).into_response());
    }
    let config = storage(&access).await?;
    Ok(Json(json!({"storage-credentials": [storage_credential(&access, config)]})).into_response())
}

async fn commit_table(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
    body: std::result::Result<Json<CommitTableRequest>, JsonRejection>,
) -> RestResult {
    let access = match bearer(&state, &asked).await? {
        Bearer::Session(access) => access,
        Bearer::Catalog(view) => {
            let ident = table_of(&namespace, &table)?;
            return Ok(TableJson(view.commit(&ident, request(body)?).await?).into_response());
        }
    };
    access.check(&namespace, Some(&table))?;
    let (metadata_location, metadata) = commit(&access, request(body)?).await?;
    Ok(TableJson(CommitTableResponse {
        metadata_location,
        metadata,
    })
    .into_response())
}

/// The body of `POST /v1/transactions/commit`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CommitTransactionRequest {
    table_changes: Vec<CommitTableRequest>,
}

/// The multi-table commit (DuckDB uses it when it is listed): a session
/// reaches one table, so the transaction holds one change, to that table.
async fn commit_transaction(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<CommitTransactionRequest>, JsonRejection>,
) -> RestResult {
    let access = access(&state, &asked).await?;
    let mut changes = request(body)?.table_changes;
    let (Some(change), true) = (changes.pop(), changes.is_empty()) else {
        return Err(RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "a session's transaction changes exactly one table, its own",
        ));
    };
    match &change.identifier {
        Some(ident) if ident == access.ident() => {}
        Some(ident) => return Err(RestError::not_found(&format!("table {ident}"))),
        None => {
            return Err(RestError::new(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                "each table change of a transaction names its table (identifier)",
            ));
        }
    }
    commit(&access, change).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A request body, or a 400 that says what is wrong with it.
fn request<T>(
    body: std::result::Result<Json<T>, JsonRejection>,
) -> std::result::Result<T, RestError> {
    body.map(|Json(request)| request).map_err(|e| {
        RestError::new(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            format!("the request body is not valid: {}", e.body_text()),
        )
    })
}

/// Commits `request` to the session's table: an upload's append, checked
/// and applied on the version checked (a claim taken or an append landed
/// since moves the pointer, and the commit conflicts). The new metadata and
/// its location.
async fn commit(
    access: &Access,
    request: CommitTableRequest,
) -> std::result::Result<(String, iceberg::spec::TableMetadata), RestError> {
    let Some(staging) = &access.upload else {
        return Err(RestError::new(
            StatusCode::FORBIDDEN,
            "ForbiddenException",
            "this session reads its table; it cannot commit",
        ));
    };
    if staging.state != UploadState::Open {
        let hint = if staging.state == UploadState::Failed {
            format!(
                "; its findings say why (GET /uploads/{}/findings): open a new upload with the \
                 corrected rows",
                staging.id
            )
        } else {
            String::new()
        };
        return Err(RestError::new(
            StatusCode::CONFLICT,
            "CommitFailedException",
            format!(
                "upload {} is {}: its rows can no longer change{hint}",
                staging.id, staging.state
            ),
        ));
    }
    let refused = |refusal: Refusal| match refusal {
        Refusal::Invalid(message) => {
            RestError::new(StatusCode::FORBIDDEN, "ForbiddenException", message)
        }
        Refusal::Conflict(message) => {
            RestError::new(StatusCode::CONFLICT, "CommitFailedException", message)
        }
    };
    check_append(
        &access.grant.table,
        &access.grant.location,
        &request.requirements,
        &request.updates,
    )
    .map_err(refused)?;
    // Manifests that name the wrong schema in their metadata (as DuckDB
    // writes them) are rewritten now, so that every later reader can plan
    // scans of the staging table.
    let mut updates = request.updates;
    crate::catalog::manifests::normalize(&access.grant.table, &access.grant.location, &mut updates)
        .await?;
    apply_append(&access.grant.catalog, &access.grant.table, updates)
        .await?
        .map_err(refused)
}
