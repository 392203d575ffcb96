//! OAuth2's client-credentials grant on the REST catalog
//! (`POST /iceberg/v1/oauth/tokens`), as Spark, Trino and PyIceberg use it
//! with `credential = "<client id>:<client secret>"`: an API token's name
//! and secret are the client id and secret, and the answer is a bearer
//! token that stands for that API token until it expires
//! (`[service] oauth_token_lifetime`, default one hour).
//!
//! The bearer token carries its own proof, so every replica sharing
//! `id_secret` accepts it and none keeps it: `icestage-oauth.<name>.
//! <expiry>.<mac>`, the MAC keyed by `id_secret` over the name, the expiry
//! and the hash of the API token's secret (a changed secret voids the
//! tokens issued for the old one). A bearer token is never a client
//! secret: only an API token's own secret gets a new one, so a stolen
//! bearer token ends at its expiry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::AppState;
use super::config::TokenSettings;

/// What every bearer token this module issues starts with.
const PREFIX: &str = "icestage-oauth.";

/// The route of the token endpoint.
pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/iceberg/v1/oauth/tokens", post(tokens))
}

/// The MAC of a bearer token for the API token `name`, whose secret hashes
/// to `hash`, valid until `expires` (Unix seconds).
fn mac(key: &[u8], name: &str, hash: &[u8; 32], expires: u64) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(b"icestage-oauth\0");
    mac.update(hash);
    mac.update(name.as_bytes());
    mac.update(b"\0");
    mac.update(&expires.to_be_bytes());
    mac.finalize().into_bytes().into()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A bearer token for the API token `name` (secret hash `hash`), lasting
/// `lifetime`.
fn issue(key: &[u8], name: &str, hash: &[u8; 32], lifetime: Duration) -> String {
    let expires = now() + lifetime.as_secs();
    format!(
        "{PREFIX}{}.{expires}.{}",
        hex::encode(name),
        hex::encode(mac(key, name, hash, expires))
    )
}

/// Whether `presented` has the shape of a bearer token this module issues
/// (for the message that answers an expired one).
pub(crate) fn looks_issued(presented: &str) -> bool {
    presented.starts_with(PREFIX)
}

/// The API token a bearer token this module issued stands for, while it
/// has not expired; `None` for anything else.
pub(crate) fn holder(
    key: &[u8],
    tokens: &[([u8; 32], TokenSettings)],
    presented: &str,
) -> Option<TokenSettings> {
    let mut parts = presented.strip_prefix(PREFIX)?.splitn(3, '.');
    let name = String::from_utf8(hex::decode(parts.next()?).ok()?).ok()?;
    let expires: u64 = parts.next()?.parse().ok()?;
    let proof: [u8; 32] = hex::decode(parts.next()?).ok()?.try_into().ok()?;
    if expires <= now() {
        return None;
    }
    let (hash, token) = tokens.iter().find(|(_, t)| t.name == name)?;
    crate::secret::equal_time(&mac(key, &name, hash, expires), &proof).then(|| token.clone())
}

/// An OAuth2 error answer (RFC 6749, section 5.2), which OAuth clients
/// read instead of the catalog's own error body.
fn refuse(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        Json(json!({"error": error, "error_description": description})),
    )
        .into_response()
}

/// The client id and secret of a token request: the form's `client_id`
/// and `client_secret`, or HTTP Basic authentication.
fn client_credentials(
    form: &std::collections::HashMap<String, String>,
    headers: &HeaderMap,
) -> Option<(Option<String>, String)> {
    if let Some(secret) = form.get("client_secret") {
        return Some((form.get("client_id").cloned(), secret.clone()));
    }
    use base64::Engine;
    let basic = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic.trim())
        .ok()?;
    let (id, secret) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some((Some(id.to_string()), secret.to_string()))
}

/// `POST /iceberg/v1/oauth/tokens`.
async fn tokens(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(wait) = state.limiter().stranger_wait() {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "slow_down",
            &format!(
                "this address sent too many requests without valid credentials: retry after \
                 {wait}s"
            ),
        );
    }
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(&body).into_owned().collect();
    match form.get("grant_type").map(String::as_str) {
        Some("client_credentials") => {}
        Some(other) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                &format!(
                    "grant_type '{other}' is not supported: use client_credentials with an API \
                     token's name and secret"
                ),
            );
        }
        None => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "no grant_type: send grant_type=client_credentials, client_id and client_secret \
                 as a form",
            );
        }
    }
    let Some((id, secret)) = client_credentials(&form, &headers) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "no client credentials: send client_id (an API token's name) and client_secret (its \
             secret), or HTTP Basic authentication",
        );
    };
    let token = state
        .static_token(&secret)
        .filter(|t| id.as_deref().is_none_or(|id| id == t.name));
    let Some(token) = token else {
        state.limiter().refused();
        return refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "the client id and secret are not an API token's name and secret",
        );
    };
    if let Some(wait) = state.admit(&format!("token '{}'", token.name)) {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "slow_down",
            &format!(
                "token '{}' made more than {} requests a minute: retry after {wait}s",
                token.name,
                state.requests_per_minute()
            ),
        );
    }
    let lifetime = state.oauth_lifetime();
    let access_token = issue(
        state.id_secret(),
        &token.name,
        &state.token_hash(&token.name),
        lifetime,
    );
    let mut answer = json!({
        "access_token": access_token,
        "token_type": "bearer",
        "expires_in": lifetime.as_secs(),
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
    });
    if let Some(scope) = form.get("scope") {
        answer["scope"] = json!(scope);
    }
    let mut response = Json(answer).into_response();
    // RFC 6749, section 5.1: a token answer is never cached.
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str) -> TokenSettings {
        TokenSettings {
            name: name.to_string(),
            token: crate::secret::Secret::new("s".to_string()),
            tables: vec![],
            operations: vec![],
            catalogs: vec![],
        }
    }

    /// A bearer token stands for its API token until it expires, and not
    /// once its MAC, its name, its expiry, the key or the API token's secret
    /// differ.
    #[test]
    fn a_bearer_token_holds_only_as_issued() {
        let tokens = [([1u8; 32], token("acme")), ([2u8; 32], token("other"))];
        let issued = issue(b"key", "acme", &[1u8; 32], Duration::from_secs(60));
        assert_eq!(
            holder(b"key", &tokens, &issued).map(|t| t.name),
            Some("acme".to_string())
        );
        assert!(holder(b"another key", &tokens, &issued).is_none());
        let rotated = [([9u8; 32], token("acme"))];
        assert!(holder(b"key", &rotated, &issued).is_none());
        let parts: Vec<&str> = issued.split('.').collect();
        let later = format!(
            "{}.{}.{}.{}",
            parts[0],
            parts[1],
            parts[2].parse::<u64>().unwrap() + 3600,
            parts[3]
        );
        assert!(holder(b"key", &tokens, &later).is_none());
        let renamed = format!(
            "{}.{}.{}.{}",
            parts[0],
            hex::encode("other"),
            parts[2],
            parts[3]
        );
        assert!(holder(b"key", &tokens, &renamed).is_none());
        let expired = issue(b"key", "acme", &[1u8; 32], Duration::ZERO);
        assert!(holder(b"key", &tokens, &expired).is_none());
        for garbage in ["icestage-oauth.", "icestage-oauth.zz.1.00", "acme"] {
            assert!(holder(b"key", &tokens, garbage).is_none(), "{garbage}");
        }
    }
}
