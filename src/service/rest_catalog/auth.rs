//! Who a REST catalog request's bearer token is, and the view of the
//! catalog it opens ([`CatalogView`]): a session token icestage issued (its
//! one table, [`SessionView`]), or an API token with the `catalog`
//! operation (its tables, [`TokenView`]); 401 for anything else.
//!
//! A failed authentication is charged to the client's address, never to
//! the session or token it named (see `service::limit`).

use axum::http::{HeaderMap, StatusCode};
use chrono::Utc;
use iceberg::table::Table;

use super::error::RestError;
use super::session_view::SessionView;
use super::token_view::TokenView;
use super::view::CatalogView;
use crate::credentials::AccessMode;
use crate::credentials::vend::{Grant, download_grant};
use crate::download::{DownloadId, DownloadState, find_download};
use crate::service::{AppState, TokenOperation, bearer_token};
use crate::session::log;
use crate::session::token::{self, PROP_ACCESS_TOKEN, TokenKind};
use crate::upload::{UploadId, UploadState, find_staging};

/// The header an Iceberg client asks for storage access with, and the
/// catalog property (PyIceberg's `header.` prefix) that makes it send one.
const ACCESS_DELEGATION: &str = "x-iceberg-access-delegation";
pub(crate) const ACCESS_DELEGATION_PROPERTY: &str = "header.X-Iceberg-Access-Delegation";
/// The access delegation mode where the catalog signs each storage request.
pub(crate) const REMOTE_SIGNING: &str = "remote-signing";

/// The catalog a request's path names (`/iceberg/v1/{prefix}/...`), put
/// on the request by the prefixed route.
#[derive(Debug, Clone)]
pub(super) struct Warehouse(pub(super) String);

/// What a REST request presents: its headers (the bearer token) and the
/// catalog its path's prefix names, if any.
pub(super) struct Presented {
    pub(super) headers: HeaderMap,
    pub(super) warehouse: Option<String>,
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

impl Presented {
    /// Whether the token presented is a session's (whether or not it is
    /// still valid).
    pub(super) fn is_session(&self) -> bool {
        bearer_token(&self.headers).is_some_and(|t| token::parse(t).is_some())
    }

    /// Whether a session's storage requests are signed rather than given
    /// keys: the service requires it, or the client asked for remote
    /// signing alone (a client that also accepts vended credentials gets
    /// those).
    fn signing(&self, state: &AppState) -> bool {
        let modes: Vec<String> = self
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

/// The view of the catalog the bearer of `asked` has: a session token
/// icestage issued, or an API token with the `catalog` operation; 401 for
/// anything else.
pub(super) async fn bearer(
    state: &AppState,
    asked: &Presented,
) -> std::result::Result<Box<dyn CatalogView>, RestError> {
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
    let presented = bearer_token(&asked.headers).ok_or_else(|| {
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
        let view = session(state, presented, asked.signing(state))
            .await
            .map_err(refused)?;
        // A session is in one catalog; under another's prefix it is not.
        if let Some(warehouse) = &asked.warehouse
            && view.grant.catalog.name() != warehouse
        {
            return Err(no_warehouse(warehouse));
        }
        return Ok(Box::new(view));
    }
    let Some(token) = state.api_token(presented) else {
        stranger()?;
        return Err(refused(unauthorized(
            if crate::service::oauth::looks_issued(presented) {
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
    Ok(Box::new(TokenView::new(token, catalog)))
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

/// The session of `presented` (a session token), its storage reached by
/// `signing` or vended keys: 401 when the token is not valid, 403 when the
/// session is over (a token lives as long as its session).
async fn session(
    state: &AppState,
    presented: &str,
    signing: bool,
) -> std::result::Result<SessionView, RestError> {
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
            Ok(SessionView {
                grant: Grant::upload(&staging, mode).await?,
                session: staging.id.to_string(),
                upload: Some(staging),
                signing,
                state: state.clone(),
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
            Ok(SessionView {
                session: download.id.to_string(),
                grant: download_grant(download, Some(AccessMode::Read))?,
                upload: None,
                signing,
                state: state.clone(),
            })
        }
    }
}

/// Whether `table` keeps the hash of `secret` as its session's token.
fn holds(table: &Table, secret: &str) -> bool {
    token::matches(secret, table.metadata().properties().get(PROP_ACCESS_TOKEN))
}

/// 403 for the token of a session that has ended (promoted, aborted,
/// expired), from the session log; `None` for any other token.
pub(super) async fn ended_session(state: &AppState, asked: &Presented) -> Option<RestError> {
    let (kind, id, _) = token::parse(bearer_token(&asked.headers)?)?;
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
