//! The endpoints. Each checks the caller, turns the request into typed
//! arguments (never SQL) and calls the operation through [`Operations`];
//! a response body is the operation's outcome, the same row SQL shows.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value as Json_, json};

use super::filter::{DownloadRequest, download_query};
use super::{ApiError, AppState, Caller, TokenOperation, json_of};
use crate::config::Ttl;
use crate::credentials::AccessMode;
use crate::download::DownloadId;
use crate::download::create::DownloadOptions;
use crate::rows::ResultRow;
use crate::upload::create::UploadOptions;
use crate::upload::{UploadId, UploadState};

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

/// `ns.table`, checked to be two plain identifiers.
pub(crate) fn table_name(text: &str) -> std::result::Result<(String, String), ApiError> {
    let parts: Vec<&str> = text.split('.').collect();
    let plain =
        |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    match parts.as_slice() {
        [namespace, table] if plain(namespace) && plain(table) => {
            Ok((namespace.to_string(), table.to_string()))
        }
        _ => Err(ApiError::bad_request(format!(
            "'{text}' is not a table name: write <namespace>.<table> with letters, digits and underscores"
        ))),
    }
}

/// The time to live a request asked for, checked.
fn ttl(asked: Option<&str>) -> std::result::Result<Option<Ttl>, ApiError> {
    asked
        .map(Ttl::parse)
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// An upload id from a path, or a 400 saying what ids look like.
fn upload_id(id: &str) -> std::result::Result<UploadId, ApiError> {
    UploadId::parse(id).map_err(|_| not_an_id(id, "an upload"))
}

/// A download id from a path, or a 400 saying what ids look like.
fn download_id(id: &str) -> std::result::Result<DownloadId, ApiError> {
    DownloadId::parse(id).map_err(|_| not_an_id(id, "a download"))
}

fn not_an_id(id: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!(
        "'{id}' is not {what} id: ids are the 32 hex characters the API returned"
    ))
}

/// `outcome` as a JSON object, with `status`.
fn answer<T: ResultRow>(status: StatusCode, outcome: T) -> ApiResult {
    let row = json_of(&[outcome])?.into_iter().next().unwrap_or_default();
    Ok((status, Json(Json_::Object(row))).into_response())
}

/// The session `owner` belongs to `caller`, or a 403.
/// Whether `caller` may see session `id` of `kind`, in `catalog`, created
/// by `owner`: only its own sessions, in catalogs it reaches; anything
/// else answers as if the session did not exist (404), so a token learns
/// nothing of another's sessions or another tenant's.
fn check_owner(
    state: &AppState,
    caller: &Caller,
    kind: &str,
    id: &str,
    (catalog, owner): (&str, Option<&str>),
) -> std::result::Result<(), ApiError> {
    let reached = state.token_catalog(&caller.0, Some(catalog)).is_some();
    if !reached || owner != Some(caller.0.name.as_str()) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{kind} '{id}' does not exist or was not created with this token"),
        ));
    }
    Ok(())
}

/// The catalog a request of `caller` goes to (its `catalog`, or the
/// token's first); 404 when the token does not reach it.
fn caller_catalog(
    state: &AppState,
    caller: &Caller,
    asked: Option<&str>,
) -> std::result::Result<std::sync::Arc<crate::catalog::IcebergCatalog>, ApiError> {
    state.token_catalog(&caller.0, asked).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "catalog '{}' does not exist or token '{}' does not reach it",
                asked.unwrap_or_default(),
                caller.0.name
            ),
        )
    })
}

/// The status of an upload the caller owns.
async fn owned_upload(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> std::result::Result<crate::upload::status::UploadStatus, ApiError> {
    let id = upload_id(id)?;
    let status = state.ops().upload_status(&id).await?;
    check_owner(
        state,
        caller,
        "upload",
        id.as_str(),
        (&status.catalog, status.owner.as_deref()),
    )?;
    Ok(status)
}

/// The status of a download the caller owns.
async fn owned_download(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> std::result::Result<crate::download::status::DownloadStatus, ApiError> {
    let id = download_id(id)?;
    let status = state.ops().download_status(&id).await?;
    check_owner(
        state,
        caller,
        "download",
        id.as_str(),
        (&status.catalog, status.owner.as_deref()),
    )?;
    Ok(status)
}

/// Ready when the default catalog answers.
pub(crate) async fn healthz(State(state): State<AppState>) -> ApiResult {
    state.check_catalog().await?;
    Ok(Json(json!({"status": "ok"})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateUpload {
    table: String,
    /// The catalog of `table`: one the token reaches (default: its first).
    #[serde(default)]
    catalog: Option<String>,
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
    let (namespace, name) = table_name(&request.table)?;
    caller.allow(TokenOperation::Upload, &request.table)?;
    let mut options = UploadOptions {
        ttl: ttl(request.ttl.as_deref())?,
        owner: Some(caller.0.name.clone()),
        upload_id: None,
    };
    if let Some(key) = &request.idempotency_key {
        if key.is_empty() || key.len() > 200 {
            return Err(ApiError::bad_request(
                "idempotency_key must have 1 to 200 characters",
            ));
        }
        options.upload_id = Some(upload_id(&state.derived_id(&caller.0.name, key))?);
    }
    let catalog = caller_catalog(&state, &caller, request.catalog.as_deref())?;
    let table = datafusion::common::TableReference::full(catalog.name(), namespace, name);
    let opened = state.ops().create_upload(table, options).await?;
    crate::metrics::transition(
        crate::metrics::Session::Upload,
        opened.upload_id.as_str(),
        opened.state.as_str(),
    );
    // What reaches the staging table: this service's REST catalog with a
    // token for that table alone (none once the upload can take no rows).
    let connection = match opened.state {
        UploadState::Open | UploadState::Failed => {
            let token = state.ops().upload_access_token(&opened.upload_id).await?;
            state.rest_connection(&token)
        }
        _ => Json_::Null,
    };
    let mut body = json_of(&[opened])?.into_iter().next().unwrap_or_default();
    body.insert("connection".to_string(), connection);
    Ok((StatusCode::CREATED, Json(Json_::Object(body))).into_response())
}

pub(crate) async fn upload_credentials(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let status = owned_upload(&state, &caller, &id).await?;
    let id = status.upload_id.as_str();
    let vended = vend(&state, id, AccessMode::Write).await?;
    let token = state.ops().upload_access_token(&status.upload_id).await?;
    credentials_body(&state, id, vended, &token)
}

/// `POST /uploads/{id}/complete`'s body, all optional: how the rows land.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteUpload {
    /// `append` (default), `upsert` or `replace_partitions`.
    #[serde(default)]
    mode: Option<String>,
    /// An upsert's key columns (default: the target's key).
    #[serde(default)]
    key: Option<Vec<String>>,
    /// Tag the snapshot holding the rows `upload-<id>`.
    #[serde(default)]
    tag: bool,
    /// Land the rows on this audit branch of the target; `POST
    /// /uploads/{id}/publish` publishes them on `main`.
    #[serde(default)]
    to_branch: Option<String>,
}

pub(crate) async fn complete_upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    payload: axum::body::Bytes,
) -> ApiResult {
    let status = owned_upload(&state, &caller, &id).await?;
    let request: CompleteUpload = if payload.iter().all(u8::is_ascii_whitespace) {
        CompleteUpload::default()
    } else {
        serde_json::from_slice(&payload).map_err(|e| {
            ApiError::bad_request(format!(
                "the request body is not valid: {e}; send {{\"mode\": \"append\" | \"upsert\" | \
                 \"replace_partitions\", \"key\": [\"column\", ...], \"tag\": true, \
                 \"to_branch\": \"audit\"}} or nothing"
            ))
        })?
    };
    let key = request.key.map(|columns| columns.join(", "));
    let mode = crate::upload::promote::PromoteMode::parse(
        request.mode.as_deref().unwrap_or("append"),
        key.as_deref(),
    )?;
    let id = status.upload_id.as_str();
    let accepted = |state: UploadState| {
        Ok((
            StatusCode::ACCEPTED,
            Json(json!({"upload_id": id, "state": state.as_str()})),
        )
            .into_response())
    };
    if !matches!(
        status.state,
        UploadState::Open | UploadState::Failed | UploadState::Promoting
    ) {
        return accepted(status.state);
    }
    // A promotion running here takes the claim itself once it can; so does
    // one that another complete is starting.
    let Some(slot) = state.reserve_attempt(&status.upload_id) else {
        return accepted(UploadState::Promoting);
    };
    let landing = crate::PromoteOptions {
        mode,
        tag: request.tag,
        to_branch: request.to_branch,
        ..Default::default()
    };
    // The claim is taken before the answer, so that the upload reads
    // `promoting` from here on, on every replica. What stops it (a mode or
    // branch the target cannot take, a tampered upload, a catalog that does
    // not answer) is answered now, not in the background.
    crate::session::failpoint_async("complete.before-claim").await;
    let claim = state
        .ops()
        .claim_promotion(&status.upload_id, &landing)
        .await?;
    slot.start(landing, claim);
    accepted(UploadState::Promoting)
}

/// `POST /uploads/{id}/publish`: the rows of an upload promoted to an audit
/// branch, published on the target's `main` (synchronously: one commit).
pub(crate) async fn publish_upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let status = owned_upload(&state, &caller, &id).await?;
    let published = state.ops().publish_upload(&status.upload_id).await?;
    crate::metrics::transition(
        crate::metrics::Session::Upload,
        status.upload_id.as_str(),
        UploadState::Published.as_str(),
    );
    answer(StatusCode::OK, published)
}

pub(crate) async fn upload_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let status = owned_upload(&state, &caller, &id).await?;
    if status.state == UploadState::Promoting {
        state.resume_stalled(&status.upload_id).await;
    }
    answer(StatusCode::OK, status)
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
        .and_then(|offset| usize::try_from(offset).ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "page {} with page_size {} is out of range: page starts at 1 and page_size is 1 to 1000",
                page.page, page.page_size
            ))
        })?;
    let status = owned_upload(&state, &caller, &id).await?;
    let mut findings = state.ops().upload_findings(&status.upload_id).await?;
    let total = findings.len();
    // Ordered by rule, file, position, row; a missing file or position last.
    findings.sort_by(|a, b| {
        let key = |f: &crate::upload::status::UploadFinding| {
            (
                f.rule.clone(),
                f.file.is_none(),
                f.file.clone(),
                f.position.is_none(),
                f.position,
                f.row.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let shown: Vec<_> = findings
        .into_iter()
        .skip(offset)
        .take(page.page_size as usize)
        .collect();
    let mut items = json_of(&shown)?;
    for item in &mut items {
        item.remove("upload_id");
    }
    Ok(Json(json!({"upload_id": status.upload_id.as_str(), "page": page.page, "page_size": page.page_size, "total": total, "items": items}))
        .into_response())
}

pub(crate) async fn abort_upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let status = owned_upload(&state, &caller, &id).await?;
    let aborted = state.ops().abort_upload(&status.upload_id).await?;
    crate::metrics::transition(
        crate::metrics::Session::Upload,
        status.upload_id.as_str(),
        UploadState::Aborted.as_str(),
    );
    answer(StatusCode::OK, aborted)
}

pub(crate) async fn create_download(
    State(state): State<AppState>,
    caller: Caller,
    payload: std::result::Result<Json<DownloadRequest>, JsonRejection>,
) -> ApiResult {
    let request = body(payload)?;
    let (namespace, name) = table_name(&request.table)?;
    caller.allow(TokenOperation::Download, &request.table)?;
    let catalog = caller_catalog(&state, &caller, request.catalog.as_deref())?;
    let query = download_query(&state, catalog.name(), (&namespace, &name), &request).await?;
    let options = DownloadOptions {
        ttl: ttl(request.ttl.as_deref())?,
        owner: Some(caller.0.name.clone()),
        catalog: Some(catalog.name().to_string()),
        include_files: request.include_files,
        ..DownloadOptions::default()
    };
    let created = state.ops().create_download(query, options).await?;
    // What the client configures its catalog with now, as the design's
    // client does: this service's REST catalog with a read token that
    // reads nothing until the download is ready (the catalog answers "not
    // ready" until then), never the backend catalog.
    crate::metrics::transition(
        crate::metrics::Session::Download,
        created.download_id.as_str(),
        "created",
    );
    let token = state.download_connection_token(&created.download_id);
    let mut body = json_of(&[created])?.into_iter().next().unwrap_or_default();
    body.insert("connection".to_string(), state.rest_connection(&token));
    Ok((StatusCode::ACCEPTED, Json(Json_::Object(body))).into_response())
}

pub(crate) async fn download_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    answer(StatusCode::OK, owned_download(&state, &caller, &id).await?)
}

pub(crate) async fn download_credentials(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let status = owned_download(&state, &caller, &id).await?;
    let id = status.download_id.as_str();
    let vended = vend(&state, id, AccessMode::Read).await?;
    let token = state
        .ops()
        .download_access_token(&status.download_id)
        .await?;
    credentials_body(&state, id, vended, &token)
}

/// Keys vended for session `id` in `mode`; none where the service signs
/// every storage request (`require_remote_signing`).
async fn vend(
    state: &AppState,
    id: &str,
    mode: AccessMode,
) -> Result<Option<crate::credentials::vend::SessionCredentials>, ApiError> {
    if state.remote_signing_required() {
        return Ok(None);
    }
    Ok(Some(
        state.ops().vend_credentials(id, Some(mode), None).await?,
    ))
}

/// Credentials as the API answers them: the connection is this service's
/// REST catalog with the session's token, never the backend catalog itself;
/// the storage keys (S3 warehouses) reach the session's location only, and
/// the catalog hands them out on each load too. Without keys (the service
/// signs every storage request) the connection alone, for session `id`.
fn credentials_body(
    state: &AppState,
    id: &str,
    vended: Option<crate::credentials::vend::SessionCredentials>,
    token: &str,
) -> ApiResult {
    let mut body = match vended {
        Some(vended) => json_of(&[vended])?.into_iter().next().unwrap_or_default(),
        None => serde_json::Map::from_iter([
            ("id".to_string(), json!(id)),
            ("remote_signing".to_string(), json!(true)),
        ]),
    };
    body.insert("connection".to_string(), state.rest_connection(token));
    body.remove("catalog_config");
    Ok((StatusCode::OK, Json(Json_::Object(body))).into_response())
}
