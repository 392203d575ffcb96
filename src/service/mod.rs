//! `icestage serve`: the upload/download HTTP API of the source design, as a
//! thin axum service whose every endpoint runs icestage statements on one
//! embedded session. It keeps no state of its own: two replicas on one
//! catalog serve the same uploads.
//!
//! [`router`] builds the API (tested in-process); [`serve`] binds it and
//! starts the webhook dispatcher.

mod config;
mod filter;
mod handlers;
mod limit;
mod log;
mod oauth;
mod openapi;
mod rest_catalog;
mod webhooks;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use datafusion::prelude::SessionContext;
use hmac::{Hmac, Mac};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

pub use self::config::{
    ServiceConfig, ServiceSettings, TokenOperation, TokenSettings, WebhookSettings,
};
use crate::catalog::Catalogs;
use crate::config::format_duration;
use crate::error::{Error, ErrorKind, Result};
use crate::operations::Operations;
use crate::rows::ResultRow;
use crate::upload::{UploadId, UploadState};

/// Downloads whose named files are kept in memory at once.
const NAMED_FILES_CACHED: usize = 256;

/// The service's shared state.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    ctx: SessionContext,
    ops: Operations,
    icestage: Arc<Catalogs>,
    config: ServiceConfig,
    /// Tokens by the SHA-256 of their secret.
    tokens: Vec<([u8; 32], TokenSettings)>,
    id_secret: Vec<u8>,
    /// How long an OAuth bearer token lasts.
    oauth_lifetime: Duration,
    /// The hash of `metrics_token`, when set.
    metrics_token: Option<[u8; 32]>,
    log: log::Log,
    timeout: Duration,
    limiter: limit::Limiter,
    /// Where clients reach this service (see `ServiceSettings::public_url`),
    /// once known.
    public_url: std::sync::OnceLock<String>,
    /// Uploads this process is promoting, with what the next attempt runs
    /// with: a retried complete does not start a second promotion here
    /// (another replica's is still safe: exactly once holds in the catalog),
    /// and one that claims the upload again while a failed attempt waits to
    /// be retried hands its claim and options to that retry. While an
    /// attempt runs, or another complete claims, a complete here claims
    /// nothing (see [`AppState::reserve_attempt`]).
    promoting: Mutex<std::collections::HashMap<String, NextAttempt>>,
    /// The files each ready download's rows name, by its location, once
    /// read ([`crate::download::files::named_files`]): what its signed
    /// reads reach besides its table. At most [`NAMED_FILES_CACHED`].
    named_files: Mutex<std::collections::HashMap<String, Arc<HashSet<String>>>>,
    /// The credentials each catalog's storage requests are signed with, by
    /// catalog, once resolved.
    signing: Mutex<
        std::collections::HashMap<
            String,
            aws_credential_types::provider::SharedCredentialsProvider,
        >,
    >,
}

impl AppState {
    /// Opens the catalogs of `config` in a new session.
    pub async fn new(config: ServiceConfig) -> Result<Self> {
        let ctx = SessionContext::new();
        let icestage = crate::register(&ctx, config.catalogs()?).await?;
        if let Some(lease) = &config.service.promotion_lease {
            let lease = crate::config::Ttl::parse(lease)?;
            ctx.sql(&format!(
                "SET icestage.promotion_lease = '{}'",
                lease.as_str()
            ))
            .await?
            .collect()
            .await?;
        }
        if let Some(cluster) = &config.service.cluster {
            let cluster = crate::cluster::Cluster::from_setting(cluster)?
                .map_or_else(String::new, |c| c.url().to_string());
            ctx.sql(&format!("SET icestage.cluster = '{cluster}'"))
                .await?
                .collect()
                .await?;
        }
        for (setting, file) in [
            ("cluster_secret_file", &config.service.cluster_secret_file),
            ("cluster_tls_ca_file", &config.service.cluster_tls_ca_file),
        ] {
            if let Some(file) = file {
                let file = file.display().to_string().replace('\'', "''");
                ctx.sql(&format!("SET icestage.{setting} = '{file}'"))
                    .await?
                    .collect()
                    .await?;
            }
        }
        let id_secret = match &config.service.id_secret {
            Some(secret) => secret.expose().as_bytes().to_vec(),
            None => rand::random::<[u8; 32]>().to_vec(),
        };
        for token in &config.service.tokens {
            for name in &token.catalogs {
                icestage.catalog(name).map_err(|_| {
                    Error::Config(format!(
                        "token '{}' names catalog '{name}', which is not configured: its \
                         catalogs must be among the [[catalogs]] names ({})",
                        token.name,
                        icestage
                            .catalogs()
                            .iter()
                            .map(|c| c.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            }
        }
        let limiter = limit::Limiter::new(config.service.requests_per_minute);
        Ok(Self(Arc::new(Inner {
            limiter,
            tokens: config.tokens()?,
            timeout: config.timeout()?,
            oauth_lifetime: config.oauth_lifetime()?,
            metrics_token: config
                .service
                .metrics_token
                .as_ref()
                .map(|t| Sha256::digest(t.expose().as_bytes()).into()),
            log: log::Log::new(config.json_log()?),
            ops: Operations::new(&ctx)?,
            ctx,
            icestage,
            config,
            id_secret,

            public_url: std::sync::OnceLock::new(),
            promoting: Mutex::default(),
            named_files: Mutex::default(),
            signing: Mutex::default(),
        })))
    }

    /// The connection a client gives its Iceberg library (PyIceberg's
    /// `load_catalog(name, **props)`): this service's REST catalog with
    /// `token`.
    pub(crate) fn rest_connection(&self, token: &str) -> Json {
        let mut connection = json!({
            "name": "icestage",
            "type": "rest",
            "uri": self.rest_uri(),
            "token": token,
        });
        if self.0.config.service.require_remote_signing {
            // The client asks for signing, as the service will answer.
            connection[rest_catalog::auth::ACCESS_DELEGATION_PROPERTY] =
                json!(rest_catalog::auth::REMOTE_SIGNING);
        }
        connection
    }

    /// This service's REST catalog, as clients reach it.
    pub(crate) fn rest_uri(&self) -> String {
        let base = self.0.public_url.get().cloned().unwrap_or_else(|| {
            self.0
                .config
                .service
                .public_url
                .clone()
                .unwrap_or_else(|| format!("http://{}", self.0.config.service.listen))
        });
        format!("{}/iceberg", base.trim_end_matches('/'))
    }

    /// Whether sessions get their storage requests signed, never keys.
    pub(crate) fn remote_signing_required(&self) -> bool {
        self.0.config.service.require_remote_signing
    }

    /// The files download access `grant` may read besides its table.
    pub(crate) async fn named_files(
        &self,
        grant: &crate::credentials::vend::Grant,
    ) -> Result<Arc<HashSet<String>>> {
        let cached = self
            .0
            .named_files
            .lock()
            .expect("named files")
            .get(&grant.location)
            .cloned();
        if let Some(named) = cached {
            return Ok(named);
        }
        let named = Arc::new(
            crate::download::files::named_files(grant.table.file_io(), &grant.location).await?,
        );
        let mut cache = self.0.named_files.lock().expect("named files");
        if cache.len() >= NAMED_FILES_CACHED {
            cache.clear();
        }
        cache.insert(grant.location.clone(), Arc::clone(&named));
        Ok(named)
    }

    /// The credentials storage requests to `catalog` are signed with: the
    /// catalog's own (its configured keys, or the default chain), resolved
    /// once per catalog and refreshed by their provider.
    pub(crate) async fn signing_credentials(
        &self,
        catalog: &crate::catalog::IcebergCatalog,
    ) -> Result<aws_credential_types::Credentials> {
        let cached = self
            .0
            .signing
            .lock()
            .expect("signing")
            .get(catalog.name())
            .cloned();
        let provider = match cached {
            Some(provider) => provider,
            None => {
                let provider = catalog.aws().credentials_provider().await?;
                self.0
                    .signing
                    .lock()
                    .expect("signing")
                    .insert(catalog.name().to_string(), provider.clone());
                provider
            }
        };
        let what = format!(
            "signing the storage requests of catalog '{}'",
            catalog.name()
        );
        crate::aws::credentials_of(&provider, &what).await
    }

    /// The API token `presented` stands for: the token whose secret it is,
    /// or whose OAuth bearer token it is while that lasts ([`oauth`]).
    pub(crate) fn api_token(&self, presented: &str) -> Option<TokenSettings> {
        self.static_token(presented)
            .or_else(|| oauth::holder(&self.0.id_secret, &self.0.tokens, presented))
    }

    /// The API token whose secret is `presented`. Every token is compared,
    /// in constant time, as a fixed-length hash: neither the match's
    /// position nor the secret's length shows in the time taken.
    pub(crate) fn static_token(&self, presented: &str) -> Option<TokenSettings> {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (hash, token) in &self.0.tokens {
            if crate::secret::equal_time(hash, &presented) {
                found = Some(token);
            }
        }
        found.cloned()
    }

    /// The catalog a request of `token` goes to: `asked` (a request's
    /// `catalog`, a REST prefix) or the token's first; `None` when that
    /// catalog does not exist or the token does not reach it.
    pub(crate) fn token_catalog(
        &self,
        token: &TokenSettings,
        asked: Option<&str>,
    ) -> Option<Arc<crate::catalog::IcebergCatalog>> {
        let default = self.0.icestage.default_catalog().name();
        let name = asked.unwrap_or_else(|| token.home(default));
        if !token.reaches_catalog(name, default) {
            return None;
        }
        self.0.icestage.catalog(name).ok().map(Arc::clone)
    }

    /// The hash of the secret of the API token `name` (zeros for none).
    pub(crate) fn token_hash(&self, name: &str) -> [u8; 32] {
        self.0
            .tokens
            .iter()
            .find(|(_, t)| t.name == name)
            .map_or([0; 32], |(hash, _)| *hash)
    }

    /// The key of the service's MACs (`id_secret`).
    pub(crate) fn id_secret(&self) -> &[u8] {
        &self.0.id_secret
    }

    /// How long an OAuth bearer token lasts.
    pub(crate) fn oauth_lifetime(&self) -> Duration {
        self.0.oauth_lifetime
    }

    /// Requests one token may make per minute.
    pub(crate) fn requests_per_minute(&self) -> u32 {
        self.0.config.service.requests_per_minute
    }

    /// Takes one request from the authenticated caller `key`'s token
    /// bucket (requests_per_minute, refilled continuously); `Some(seconds
    /// to wait)` when it is empty. See [`limit`].
    pub(crate) fn admit(&self, key: &str) -> Option<u64> {
        self.0.limiter.admit(key)
    }

    /// The request rates (see [`limit`]).
    pub(crate) fn limiter(&self) -> &limit::Limiter {
        &self.0.limiter
    }

    /// The operations, on the service's session.
    pub(crate) fn ops(&self) -> &Operations {
        &self.0.ops
    }

    /// Fails unless the default catalog answers.
    pub(crate) async fn check_catalog(&self) -> std::result::Result<(), ApiError> {
        self.0
            .icestage
            .default_catalog()
            .catalog()
            .list_namespaces(None)
            .await
            .map_err(|e| ApiError::from(Error::from(e)))?;
        Ok(())
    }

    /// The uploads this process is promoting (see [`Inner::promoting`]).
    fn promoting(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, NextAttempt>> {
        self.0.promoting.lock().expect("promoting")
    }

    /// A complete's place in [`Inner::promoting`] for upload `id`, taken
    /// before it claims the upload. `None` when an attempt runs here, or
    /// another complete holds the place: the complete then claims nothing
    /// (the attempt takes the claim itself once it can; a claim taken
    /// beside it would be one no attempt runs or renews, in the way until
    /// it lapsed). Between two attempts, the place is the waiting retry's,
    /// which the complete's claim goes to.
    pub(crate) fn reserve_attempt(&self, id: &UploadId) -> Option<AttemptSlot> {
        use std::collections::hash_map::Entry;
        let reserved = match self.promoting().entry(id.to_string()) {
            Entry::Occupied(next) if next.get().waiting => false,
            Entry::Occupied(_) => return None,
            Entry::Vacant(next) => {
                next.insert(NextAttempt {
                    landing: crate::PromoteOptions::default(),
                    claim: None,
                    waiting: false,
                    reserved: true,
                });
                true
            }
        };
        Some(AttemptSlot {
            state: self.clone(),
            id: id.clone(),
            reserved,
        })
    }

    /// Promotes upload `id` in the background, holding `claim` when the
    /// caller took one, unless this process already is; the outcome lands
    /// in the catalog, where GET /uploads/{id} reads it. When it already
    /// is, a new `claim` (the upload was `failed` between two attempts)
    /// replaces the one the next attempt holds, with its options: that
    /// attempt runs with it rather than waiting for it to lapse. A place a
    /// complete reserved ([`AppState::reserve_attempt`]) is this one's.
    pub(crate) fn promote_in_background(
        &self,
        id: &UploadId,
        landing: crate::PromoteOptions,
        claim: Option<crate::upload::promote::PromotionClaim>,
    ) {
        use std::collections::hash_map::Entry;
        match self.promoting().entry(id.to_string()) {
            Entry::Occupied(mut next) if next.get().reserved => {
                *next.get_mut() = NextAttempt::new(landing, claim);
            }
            Entry::Occupied(mut next) => {
                if claim.is_some() {
                    let next = next.get_mut();
                    (next.landing, next.claim) = (landing, claim);
                }
                return;
            }
            Entry::Vacant(next) => {
                next.insert(NextAttempt::new(landing, claim));
            }
        }
        let state = self.clone();
        let id = id.clone();
        // Kept, so that a shutdown waits for it (see `serve`).
        let task = tokio::spawn(async move {
            // A promotion that failed on the catalog or storage (not on the
            // upload's content) is tried again: the client already has its
            // 202. A claim left behind by a failure lapses with its lease and
            // the retry takes it over.
            let mut pause = Duration::from_secs(1);
            let started = std::time::Instant::now();
            for attempt in 0..5 {
                if attempt > 0 {
                    crate::session::failpoint_async("promote.retry").await;
                }
                let Some((landing, claim)) = state.promoting().get_mut(id.as_str()).map(|next| {
                    next.waiting = false;
                    (next.landing.clone(), next.claim.clone())
                }) else {
                    break;
                };
                let promoted = state
                    .ops()
                    .promote_claimed_upload(&id, landing, claim)
                    .await;
                let outcome = match promoted {
                    Err(e) if matches!(e.kind(), ErrorKind::Upstream | ErrorKind::Internal) => {
                        if let Some(next) = state.promoting().get_mut(id.as_str()) {
                            next.waiting = true;
                        }
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                        continue;
                    }
                    Ok(promotion) => promotion.state.as_str(),
                    Err(_) => UploadState::Failed.as_str(),
                };
                crate::metrics::observe(
                    "icestage_promotion_duration_seconds",
                    "Time from an upload's complete to its promotion's outcome, retries included.",
                    &[("outcome", outcome)],
                    started.elapsed().as_secs_f64(),
                );
                crate::metrics::transition(crate::metrics::Session::Upload, id.as_str(), outcome);
                break;
            }
            state.promoting().remove(id.as_str());
        });
        self.0.icestage.keep_background(task);
    }

    /// Finishes upload `id`'s promotion here when the process promoting it
    /// stopped before it did (its claim lapsed: a replica killed after its
    /// `complete` answered 202), with the options it was claimed with. A
    /// failure is left to the next look.
    pub(crate) async fn resume_stalled(&self, id: &UploadId) {
        if self.promoting().contains_key(id.as_str()) {
            return;
        }
        if let Ok(Some((landing, claim))) = self.ops().stalled_promotion(id).await {
            crate::metrics::transition(
                crate::metrics::Session::Upload,
                id.as_str(),
                UploadState::Promoting.as_str(),
            );
            self.promote_in_background(id, landing, Some(claim));
        }
    }

    /// The read token `POST /downloads` answers for download `id`: its
    /// secret is a keyed hash of the id, so every replica sharing
    /// `id_secret` knows it without storing it, and it reads the download
    /// (and nothing else) while the download is ready. The token of
    /// `POST /downloads/{id}/credentials` is another, kept on the table.
    pub(crate) fn download_connection_token(&self, id: &crate::download::DownloadId) -> String {
        format!(
            "d.{}.{}",
            id.as_str(),
            self.download_connection_secret(id.as_str())
        )
    }

    /// The secret of [`AppState::download_connection_token`].
    pub(crate) fn download_connection_secret(&self, id: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0.id_secret).expect("any key length");
        mac.update(format!("download-connection:{id}").as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// The upload id for `key` from `caller`: a keyed hash, so a retried
    /// create finds the same upload, on any replica sharing `id_secret`.
    fn derived_id(&self, caller: &str, key: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0.id_secret).expect("any key length");
        mac.update(format!("upload:{caller}:{key}").as_bytes());
        hex::encode(mac.finalize().into_bytes())[..32].to_string()
    }
}

/// What a background promotion's next attempt runs with.
struct NextAttempt {
    /// The options the upload was completed with.
    landing: crate::PromoteOptions,
    /// The claim taken for them, if the complete took one.
    claim: Option<crate::upload::promote::PromotionClaim>,
    /// Between two attempts: the last one failed upstream and the next
    /// waits its turn. A complete now claims the upload again and hands the
    /// claim (and its options) to that attempt.
    waiting: bool,
    /// No attempt yet: a complete holds the place while it claims the
    /// upload ([`AppState::reserve_attempt`]).
    reserved: bool,
}

impl NextAttempt {
    /// The first attempt, with what the complete asked for and claimed.
    fn new(
        landing: crate::PromoteOptions,
        claim: Option<crate::upload::promote::PromotionClaim>,
    ) -> Self {
        Self {
            landing,
            claim,
            waiting: false,
            reserved: false,
        }
    }
}

/// A complete's place among the uploads this process promotes (see
/// [`AppState::reserve_attempt`]). Dropped before [`AttemptSlot::start`]
/// (the claim failed), it gives the place back.
pub(crate) struct AttemptSlot {
    state: AppState,
    id: UploadId,
    /// Whether the place is this complete's own (not a waiting retry's).
    reserved: bool,
}

impl AttemptSlot {
    /// Promotes the upload in the background with `landing`, holding
    /// `claim` (see [`AppState::promote_in_background`]).
    pub(crate) fn start(
        mut self,
        landing: crate::PromoteOptions,
        claim: Option<crate::upload::promote::PromotionClaim>,
    ) {
        self.state.promote_in_background(&self.id, landing, claim);
        self.reserved = false;
    }
}

impl Drop for AttemptSlot {
    fn drop(&mut self) {
        if self.reserved {
            let mut promoting = self.state.promoting();
            if promoting
                .get(self.id.as_str())
                .is_some_and(|next| next.reserved)
            {
                promoting.remove(self.id.as_str());
            }
        }
    }
}

/// An API error: `{"error": {"code": ..., "message": ...}}` with a status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        let (status, code) = match error.kind() {
            ErrorKind::User => (StatusCode::BAD_REQUEST, "bad_request"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
            ErrorKind::Upstream => (StatusCode::BAD_GATEWAY, "upstream"),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        Self::new(status, code, error.user_message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The bearer token of a request's `Authorization` header, if it has one.
pub(crate) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) TokenSettings);

impl Caller {
    /// Checks that the caller may do `operation` on `table`.
    pub(crate) fn allow(
        &self,
        operation: TokenOperation,
        table: &str,
    ) -> std::result::Result<(), ApiError> {
        if !self.0.operations.contains(&operation) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("token '{}' may not {operation}", self.0.name),
            ));
        }
        if !self.0.reaches(table) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "token '{}' may not {operation} table '{table}': its tables are {}",
                    self.0.name,
                    self.0.tables.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> std::result::Result<Self, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let presented = bearer_token(&parts.headers);
        // A token is a hash comparison away: a valid one is charged to
        // itself alone; a failure to the client's address.
        let Some(token) = presented.and_then(|p| state.api_token(p)) else {
            if let Some(wait) = state.limiter().stranger_wait() {
                let mut error = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "this address sent too many requests without a valid token: retry \
                         after {wait}s with a valid token"
                    ),
                );
                error.retry_after = Some(wait);
                return Err(error);
            }
            state.limiter().refused();
            return Err(unauthorized(if presented.is_none() {
                "send the token as Authorization: Bearer <token>"
            } else {
                "the bearer token is not valid"
            }));
        };
        if let Some(wait) = state.admit(&token.name) {
            let mut error = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "token '{}' made more than {} requests a minute: retry after {wait}s",
                    token.name, state.0.config.service.requests_per_minute
                ),
            );
            error.retry_after = Some(wait);
            return Err(error);
        }
        Ok(Caller(token))
    }
}

/// Answers 504 when a request takes longer than `request_timeout`.
async fn deadline(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(state.0.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "the request took longer than the service's request_timeout ({}): \
                 retry it; a retried POST /uploads with the same idempotency_key \
                 returns the same upload",
                format_duration(state.0.timeout)
            ),
        )
        .into_response(),
    }
}

/// The API; see the module documentation.
pub fn router(state: AppState) -> Router {
    let body_limit = state.0.config.service.max_body_bytes;
    Router::new()
        .route("/healthz", get(handlers::healthz))
        .route("/openapi.json", get(openapi::document))
        .route("/uploads", post(handlers::create_upload))
        .route(
            "/uploads/{id}",
            get(handlers::upload_status).delete(handlers::abort_upload),
        )
        .route(
            "/uploads/{id}/credentials",
            post(handlers::upload_credentials),
        )
        .route("/uploads/{id}/complete", post(handlers::complete_upload))
        .route("/uploads/{id}/publish", post(handlers::publish_upload))
        .route("/uploads/{id}/findings", get(handlers::upload_findings))
        .route("/downloads", post(handlers::create_download))
        .route("/downloads/{id}", get(handlers::download_status))
        .route(
            "/downloads/{id}/credentials",
            post(handlers::download_credentials),
        )
        .merge(rest_catalog::routes::routes())
        .merge(oauth::routes())
        .route("/metrics", get(metrics))
        .fallback(|uri: axum::http::Uri| async move {
            // The REST catalog answers in its protocol's shape.
            if uri.path().starts_with("/iceberg/") {
                return rest_catalog::routes::not_served(uri).await;
            }
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such endpoint: see /openapi.json",
            )
            .into_response()
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            deadline,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .layer(axum::middleware::from_fn(limit::with_peer))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `GET /metrics` on the service's address: with `metrics_token` as the
/// bearer token only (404 when none is set, as if it were not there).
async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    let Some(expected) = state.0.metrics_token else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not served here: set [service] metrics_token (or metrics_listen)",
        )
        .into_response();
    };
    let presented: [u8; 32] =
        Sha256::digest(bearer_token(&headers).unwrap_or_default().as_bytes()).into();
    if !crate::secret::equal_time(&expected, &presented) {
        state.limiter().refused();
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send [service] metrics_token as Authorization: Bearer <token>",
        )
        .into_response();
    }
    metrics_text().await
}

/// The metrics in Prometheus' text format.
async fn metrics_text() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(),
    )
        .into_response()
}

/// Counts and times every request (by route template, never the path a
/// client wrote: the series stay bounded) and logs one line for it, with
/// a request id (the client's `x-request-id` when it is a short plain
/// word, else a new one), answered in `x-request-id`.
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().to_string();
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (1..=64).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .map_or_else(|| hex::encode(rand::random::<[u8; 8]>()), str::to_string);
    let log = &state.0.log;
    let caller = log
        .shows("icestage::request", log::Level::Info)
        .then(|| caller_name(&state, request.headers()));
    let mut response = next.run(request).await;
    let seconds = started.elapsed().as_secs_f64();
    let status = response.status().as_u16().to_string();
    crate::metrics::count(
        "icestage_http_requests_total",
        "HTTP requests answered, by route, method and status.",
        &[("route", &route), ("method", &method), ("status", &status)],
        1.0,
    );
    crate::metrics::observe(
        "icestage_http_request_duration_seconds",
        "Time to answer an HTTP request, by route.",
        &[("route", &route)],
        seconds,
    );
    if let Some(caller) = caller {
        let mut fields = serde_json::Map::new();
        fields.insert("request_id".into(), json!(id));
        fields.insert("method".into(), json!(method));
        fields.insert("route".into(), json!(route));
        fields.insert("status".into(), json!(response.status().as_u16()));
        fields.insert("latency_ms".into(), json!((seconds * 1e4).round() / 10.0));
        fields.insert("caller".into(), json!(caller));
        log.line("icestage::request", log::Level::Info, fields);
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

/// Who a request says it is, for the log: its API token's name, its
/// session's id, or `anonymous`; never the token itself.
fn caller_name(state: &AppState, headers: &axum::http::HeaderMap) -> String {
    let Some(presented) = bearer_token(headers) else {
        return "anonymous".to_string();
    };
    if let Some((kind, id, _)) = crate::session::token::parse(presented) {
        return format!("{} session {id}", kind.tag_name());
    }
    state
        .api_token(presented)
        .map_or_else(|| "unknown token".to_string(), |t| t.name)
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM, whichever comes first: when a
/// long-running process (`serve`, a cluster's scheduler and executors)
/// stops.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Binds `config.service.listen`, starts the webhook dispatcher (when a
/// webhook is configured) and serves until Ctrl-C or SIGTERM; then it stops
/// taking requests and waits for the promotions and downloads it started.
pub async fn serve(config: ServiceConfig) -> Result<()> {
    let state = AppState::new(config).await?;
    let listen = state.0.config.service.listen.clone();
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {listen}: {e}")))?;
    if let Some(webhook) = state.0.config.service.webhook.clone() {
        tokio::spawn(webhooks::dispatch(state.clone(), webhook));
    }
    if state.0.config.service.run_pipes {
        tokio::spawn(run_pipes(state.clone()));
    }
    log::install(state.0.log.clone());
    if let Some(address) = &state.0.config.service.metrics_listen {
        let metrics = tokio::net::TcpListener::bind(address).await.map_err(|e| {
            Error::Config(format!("cannot listen on {address} (metrics_listen): {e}"))
        })?;
        eprintln!(
            "icestage serve: metrics on http://{}/metrics",
            metrics.local_addr()?
        );
        let app = Router::new().route("/metrics", get(metrics_text));
        tokio::spawn(async move { axum::serve(metrics, app).await });
    }
    let bound = format!("http://{}", listener.local_addr()?);
    let public = state.0.config.service.public_url.clone();
    let _ = state
        .0
        .public_url
        .set(public.unwrap_or_else(|| bound.clone()));
    for line in state.0.config.opened() {
        eprintln!("icestage serve: {line}");
    }
    eprintln!("icestage serve: listening on {bound}");
    let app = router(state.clone()).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    eprintln!("icestage serve: stopping; waiting for background promotions and downloads");
    state.0.icestage.finish_background_work().await;
    eprintln!("icestage serve: stopped");
    Ok(())
}

/// Runs the pipes of the service's catalogs for as long as it serves: every
/// second, each running pipe whose interval has passed and that no other
/// replica holds. What each run did goes to stderr (and to the webhooks,
/// from the pipe's runs).
async fn run_pipes(state: AppState) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        match state.ops().run_due_pipes().await {
            Ok(runs) => {
                for (name, run) in runs {
                    match run {
                        Ok(run) if run.files_loaded > 0 || run.files_failed > 0 => {
                            eprintln!("icestage serve: pipe {name}: {}", run.message)
                        }
                        Ok(_) => {}
                        Err(e) => eprintln!("icestage serve: pipe {name}: {}", e.user_message()),
                    }
                }
            }
            Err(e) => eprintln!("icestage serve: listing pipes failed: {}", e.user_message()),
        }
    }
}

/// Outcomes as the API answers them: JSON objects with the columns SQL
/// shows; JSON columns (`connection`) as the objects they hold.
pub(crate) fn json_of<T: ResultRow>(rows: &[T]) -> Result<Vec<serde_json::Map<String, Json>>> {
    crate::rows::json_rows(&[T::to_batch(rows)?])
}
