//! The endpoints. Each checks the caller, builds an icestage statement from
//! validated values (never from raw SQL it was sent) and runs it.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value as Json_, json};

use super::filter::{DownloadRequest, download_sql};
use super::{ApiError, AppState, Caller, json_rows};

type ApiResult = std::result::Result<Response, ApiError>;

/// A request body, or a 400/413 that says what is wrong with it.
fn body<T>(
    payload: std::result::Result<Json<T>, JsonRejection>,
) -> std::result::Result<T, ApiError> {
    payload.map(|Json(value)| value).map_err(|rejection| {
        let status = rejection.status();
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
            _ => "bad_request",
        };
        ApiError::new(
            status,
            code,
            format!("the request body is not valid: {}", rejection.body_text()),
        )
    })
}

/// `ns.table` checked to be plain identifiers, and its quoted SQL form.
pub(crate) fn table_name(text: &str) -> std::result::Result<(String, String), ApiError> {
    let parts: Vec<&str> = text.split('.').collect();
    let plain =
        |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if parts.len() != 2 || !parts.iter().all(plain) {
        return Err(ApiError::bad_request(format!(
            "'{text}' is not a table name: write <namespace>.<table> with letters, digits and underscores"
        )));
    }
    Ok((
        text.to_string(),
        format!("\"{}\".\"{}\"", parts[0], parts[1]),
    ))
}

/// The `WITH (...)` options every session the API opens has: its owner
/// (the caller's token) and the requested ttl, checked.
fn session_options(
    caller: &Caller,
    ttl: Option<&str>,
) -> std::result::Result<Vec<String>, ApiError> {
    let mut options = vec![format!("owner = {}", quote(&caller.0.name))];
    if let Some(ttl) = ttl {
        crate::config::parse_duration(ttl).map_err(|e| ApiError::bad_request(e.to_string()))?;
        options.push(format!("ttl = {}", quote(ttl)));
    }
    Ok(options)
}

fn hex_id(id: &str, session: Session) -> std::result::Result<String, ApiError> {
    crate::upload::id_shape(id).ok_or_else(|| {
        let what = match session {
            Session::Upload => "an upload",
            Session::Download => "a download",
        };
        ApiError::bad_request(format!(
            "'{id}' is not {what} id: ids are the 32 hex characters the API returned"
        ))
    })
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The first row of `batches` as a JSON object, with `status`.
fn answer(status: StatusCode, batches: &[datafusion::arrow::array::RecordBatch]) -> Response {
    (status, Json(Json_::Object(first_row(batches)))).into_response()
}

fn first_row(batches: &[datafusion::arrow::array::RecordBatch]) -> serde_json::Map<String, Json_> {
    json_rows(batches).into_iter().next().unwrap_or_default()
}

/// An upload or a download, as the API names them.
#[derive(Debug, Clone, Copy)]
enum Session {
    Upload,
    Download,
}

impl Session {
    fn name(self) -> &'static str {
        match self {
            Session::Upload => "upload",
            Session::Download => "download",
        }
    }
}

/// The checked id and status row of a session the caller owns.
async fn owned(
    state: &AppState,
    caller: &Caller,
    session: Session,
    id: &str,
) -> std::result::Result<(String, serde_json::Map<String, Json_>), ApiError> {
    let kind = session.name();
    let id = hex_id(id, session)?;
    let row = first_row(
        &state
            .run(&format!("SELECT * FROM {kind}_status('{id}')"))
            .await?,
    );
    if row.get("owner").and_then(|o| o.as_str()) != Some(caller.0.name.as_str()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{kind} '{id}' was not created with this token"),
        ));
    }
    Ok((id, row))
}

pub(crate) async fn healthz(State(state): State<AppState>) -> ApiResult {
    state.run("SELECT 1").await?;
    Ok(Json(json!({"status": "ok"})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateUpload {
    table: String,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

pub(crate) async fn create_upload(
    State(state): State<AppState>,
    caller: Caller,
    payload: std::result::Result<Json<CreateUpload>, JsonRejection>,
) -> ApiResult {
    let request = body(payload)?;
    let (table, quoted) = table_name(&request.table)?;
    caller.allow("upload", &table)?;
    let mut options = session_options(&caller, request.ttl.as_deref())?;
    if let Some(key) = &request.idempotency_key {
        if key.is_empty() || key.len() > 200 {
            return Err(ApiError::bad_request(
                "idempotency_key must have 1 to 200 characters",
            ));
        }
        options.push(format!(
            "upload_id = '{}'",
            state.derived_id(&caller.0.name, key)
        ));
    }
    let created = state
        .run(&format!(
            "CREATE UPLOAD FOR {quoted} WITH ({})",
            options.join(", ")
        ))
        .await?;
    Ok(answer(StatusCode::CREATED, &created))
}

pub(crate) async fn upload_credentials(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    vend(&state, &caller, Session::Upload, &id).await
}

/// Credentials for a session the caller owns: write for an upload's staging
/// table, read for a download's table.
async fn vend(state: &AppState, caller: &Caller, session: Session, id: &str) -> ApiResult {
    let (id, _) = owned(state, caller, session, id).await?;
    let mode = match session {
        Session::Upload => "write",
        Session::Download => "read",
    };
    let vended = state
        .run(&format!("SELECT * FROM vend_credentials('{id}', '{mode}')"))
        .await?;
    Ok(answer(StatusCode::OK, &vended))
}

pub(crate) async fn complete_upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let (id, row) = owned(&state, &caller, Session::Upload, &id).await?;
    let current = row
        .get("state")
        .and_then(|s| s.as_str())
        .unwrap_or_default()
        .to_string();
    if !matches!(current.as_str(), "open" | "failed" | "promoting") {
        return Ok((
            StatusCode::ACCEPTED,
            Json(json!({"upload_id": id, "state": current})),
        )
            .into_response());
    }
    state.promote_in_background(&id);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"upload_id": id, "state": "promoting"})),
    )
        .into_response())
}

pub(crate) async fn upload_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let (_, row) = owned(&state, &caller, Session::Upload, &id).await?;
    Ok(Json(Json_::Object(row)).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct Page {
    #[serde(default = "first_page")]
    page: u64,
    #[serde(default = "page_size")]
    page_size: u64,
}

fn first_page() -> u64 {
    1
}

fn page_size() -> u64 {
    100
}

pub(crate) async fn upload_findings(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    page: std::result::Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(page) =
        page.map_err(|e| ApiError::bad_request(format!("bad page parameters: {}", e.body_text())))?;
    let offset = (page.page >= 1 && (1..=1000).contains(&page.page_size))
        .then(|| (page.page - 1).checked_mul(page.page_size))
        .flatten()
        .filter(|offset| *offset <= i64::MAX as u64)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "page {} with page_size {} is out of range: page starts at 1 and page_size is 1 to 1000",
                page.page, page.page_size
            ))
        })?;
    let (id, _) = owned(&state, &caller, Session::Upload, &id).await?;
    let total = first_row(
        &state
            .run(&format!(
                "SELECT count(*) AS n FROM upload_findings('{id}')"
            ))
            .await?,
    )
    .get("n")
    .and_then(|n| n.as_i64())
    .unwrap_or(0);
    let items = json_rows(
        &state
            .run(&format!(
                "SELECT rule, kind, \"row\", file, position, \"values\", message FROM upload_findings('{id}') \
                 ORDER BY rule, file, position, \"row\" LIMIT {} OFFSET {}",
                page.page_size, offset
            ))
            .await?,
    );
    Ok(Json(json!({"upload_id": id, "page": page.page, "page_size": page.page_size, "total": total, "items": items}))
        .into_response())
}

pub(crate) async fn abort_upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let (id, _) = owned(&state, &caller, Session::Upload, &id).await?;
    let aborted = state.run(&format!("ABORT UPLOAD '{id}'")).await?;
    Ok(answer(StatusCode::OK, &aborted))
}

pub(crate) async fn create_download(
    State(state): State<AppState>,
    caller: Caller,
    payload: std::result::Result<Json<DownloadRequest>, JsonRejection>,
) -> ApiResult {
    let request = body(payload)?;
    let (table, quoted) = table_name(&request.table)?;
    caller.allow("download", &table)?;
    let query = download_sql(&state, &table, &quoted, &request).await?;
    let options = session_options(&caller, request.ttl.as_deref())?;
    let created = state
        .run(&format!(
            "CREATE DOWNLOAD WITH ({}) AS {query}",
            options.join(", ")
        ))
        .await?;
    Ok(answer(StatusCode::ACCEPTED, &created))
}

pub(crate) async fn download_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let (_, row) = owned(&state, &caller, Session::Download, &id).await?;
    Ok(Json(Json_::Object(row)).into_response())
}

pub(crate) async fn download_credentials(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    vend(&state, &caller, Session::Download, &id).await
}
