//! The REST catalog's routes: the paths of the protocol, each handler
//! turning a request into one call of the bearer's view and its answer
//! into the protocol's JSON.

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_catalog_rest::{
    CommitTableRequest, CreateNamespaceRequest, CreateTableRequest, RegisterTableRequest,
    RenameTableRequest,
};
use serde_json::json;

use super::auth::{self, Presented, Warehouse, bearer};
use super::error::RestError;
use super::session_view;
use super::view::{
    CommitTransactionRequest, CommitViewRequest, CreateViewRequest, UpdateNamespaceProperties,
};
use crate::credentials::sign::SignRequest;
use crate::service::AppState;

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

type RestResult = std::result::Result<Response, RestError>;

/// A view's answer that carries a table's metadata, as [`TableJson`].
fn table_answer<T: serde::Serialize>(answer: T) -> RestResult {
    Ok(TableJson(answer).into_response())
}

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
    if query.warehouse.is_some() && !asked.is_session() {
        asked.warehouse = query.warehouse;
    }
    let endpoints = match bearer(&state, &asked).await {
        Ok(view) => view.endpoints(),
        // A client configures its catalog as soon as it has the download's
        // connection; its table answers once the download is ready.
        Err(e) if e.is_not_ready() => session_view::ENDPOINTS.to_vec(),
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

/// A namespace as a path names it: its parts separated by `.` or by the
/// protocol's U+001F; 400 when it is empty.
fn namespace_of(namespace: &str) -> std::result::Result<NamespaceIdent, RestError> {
    NamespaceIdent::from_strs(namespace.split(['\u{1f}', '.'])).map_err(|_| {
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

/// A view's answer as JSON.
fn answer<T: serde::Serialize>(answer: T) -> RestResult {
    Ok(Json(answer).into_response())
}

/// `204 No Content`: what a view answers with nothing to say.
fn done(_: ()) -> RestResult {
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
    let view = bearer(&state, &asked).await?;
    let parent = query.parent.as_deref().map(namespace_of).transpose()?;
    answer(view.list_namespaces(parent.as_ref()).await?)
}

async fn create_namespace(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<CreateNamespaceRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    answer(view.create_namespace(request(body)?).await?)
}

async fn load_namespace(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    answer(view.load_namespace(&namespace_of(&namespace)?).await?)
}

async fn namespace_exists(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.namespace_exists(&namespace_of(&namespace)?).await?)
}

async fn drop_namespace(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.drop_namespace(&namespace_of(&namespace)?).await?)
}

async fn update_namespace_properties(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<UpdateNamespaceProperties>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    let namespace = namespace_of(&namespace)?;
    answer(
        view.update_namespace_properties(&namespace, request(body)?)
            .await?,
    )
}

async fn list_tables(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    answer(view.list_tables(&namespace_of(&namespace)?).await?)
}

async fn create_table(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<CreateTableRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    let namespace = namespace_of(&namespace)?;
    table_answer(view.create_table(&namespace, request(body)?).await?)
}

async fn register_table(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<RegisterTableRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    let namespace = namespace_of(&namespace)?;
    table_answer(view.register_table(&namespace, request(body)?).await?)
}

async fn load_table(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    table_answer(view.load_table(&table_of(&namespace, &table)?).await?)
}

async fn table_exists(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.table_exists(&table_of(&namespace, &table)?).await?)
}

async fn credentials(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    answer(view.credentials(&table_of(&namespace, &table)?).await?)
}

async fn commit_table(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, table)): Path<(String, String)>,
    body: std::result::Result<Json<CommitTableRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    let ident = table_of(&namespace, &table)?;
    table_answer(view.commit_table(&ident, request(body)?).await?)
}

async fn commit_transaction(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<CommitTransactionRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.commit_transaction(request(body)?).await?)
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
    let view = bearer(&state, &asked).await?;
    let ident = table_of(&namespace, &table)?;
    done(view.drop_table(&ident, query.purge_requested).await?)
}

async fn rename_table(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<RenameTableRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.rename_table(request(body)?).await?)
}

async fn list_views(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    answer(view.list_views(&namespace_of(&namespace)?).await?)
}

async fn create_view(
    State(state): State<AppState>,
    asked: Presented,
    Path(namespace): Path<String>,
    body: std::result::Result<Json<CreateViewRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    let namespace = namespace_of(&namespace)?;
    answer(view.create_view(&namespace, request(body)?).await?)
}

async fn load_view(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    answer(view.load_view(&table_of(&namespace, &name)?).await?)
}

async fn view_exists(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.view_exists(&table_of(&namespace, &name)?).await?)
}

async fn replace_view(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
    body: std::result::Result<Json<CommitViewRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    let ident = table_of(&namespace, &name)?;
    answer(view.replace_view(&ident, request(body)?).await?)
}

async fn drop_view(
    State(state): State<AppState>,
    asked: Presented,
    Path((namespace, name)): Path<(String, String)>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.drop_view(&table_of(&namespace, &name)?).await?)
}

async fn rename_view(
    State(state): State<AppState>,
    asked: Presented,
    body: std::result::Result<Json<RenameTableRequest>, JsonRejection>,
) -> RestResult {
    let view = bearer(&state, &asked).await?;
    done(view.rename_view(request(body)?).await?)
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
    let view = match bearer(&state, &asked).await {
        Ok(view) => view,
        // A session that ended removed its table, and the token with it:
        // say that it ended, as its log records.
        Err(error) if error.status == StatusCode::UNAUTHORIZED => {
            return Err(auth::ended_session(&state, &asked).await.unwrap_or(error));
        }
        Err(error) => return Err(error),
    };
    answer(view.sign(request(body)?).await?)
}
