//! OAuth2 client credentials for a REST catalog icestage uses as its
//! backend (`credential = "<client id>:<client secret>"`), as Spark, Trino
//! and PyIceberg configure one: a bearer token from the catalog's token
//! endpoint (`<uri>/v1/oauth/tokens`, or `oauth2-server-uri`), fetched again
//! once half its lifetime has passed.
//!
//! icestage's own commits ([`super::rest_backend::RestCommits`]) take the token
//! from here on every request; iceberg's REST catalog exchanges the same
//! credential itself and is told to fetch anew on the same schedule
//! ([`keep_fresh`]).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use iceberg_catalog_rest::RestCatalog;

use crate::error::{Error, Result};
use crate::secret::Secret;

/// A token lasting less than this is fetched again this often at least.
const SHORTEST_REFRESH: Duration = Duration::from_secs(1);

/// How long a token lasts when the endpoint does not say.
const UNSAID_LIFETIME: Duration = Duration::from_secs(3600);

/// A catalog's client credentials and the token they last gave.
pub(crate) struct ClientCredentials {
    http: reqwest::Client,
    endpoint: String,
    id: Option<String>,
    secret: Secret,
    scope: String,
    /// The token and when to fetch the next one.
    current: tokio::sync::Mutex<Option<(String, Instant)>>,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("endpoint", &self.endpoint)
            .field("id", &self.id)
            .finish()
    }
}

impl ClientCredentials {
    /// The credentials `credential` (`id:secret`, or a secret alone) for
    /// the catalog `name` at `uri`; tokens come from `server` when set.
    pub(crate) fn new(
        name: &str,
        uri: &str,
        credential: &str,
        server: Option<&str>,
        scope: Option<&str>,
    ) -> Result<Self> {
        let (id, secret) = match credential.split_once(':') {
            Some((id, secret)) => (Some(id.to_string()), secret.to_string()),
            None => (None, credential.to_string()),
        };
        if secret.is_empty() {
            return Err(Error::Config(format!(
                "REST catalog '{name}': its credential has no secret: write it as \
                 credential = \"<client id>:<client secret>\""
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::Config(format!("REST catalog '{name}': {e}")))?;
        Ok(Self {
            http,
            endpoint: server.map_or_else(
                || format!("{}/v1/oauth/tokens", uri.trim_end_matches('/')),
                str::to_string,
            ),
            id,
            secret: Secret::new(secret),
            scope: scope.unwrap_or("catalog").to_string(),
            current: tokio::sync::Mutex::new(None),
        })
    }

    /// A token that has not reached half its lifetime, fetched when the
    /// last one has.
    pub(crate) async fn token(&self) -> Result<String> {
        let mut current = self.current.lock().await;
        if let Some((token, refresh_at)) = current.as_ref()
            && Instant::now() < *refresh_at
        {
            return Ok(token.clone());
        }
        let (token, lifetime) = self.fetch().await?;
        *current = Some((token.clone(), Instant::now() + refresh_after(lifetime)));
        Ok(token)
    }

    /// How long after a fetch the next one is due, from a fresh fetch.
    pub(crate) async fn refresh_period(&self) -> Result<Duration> {
        let (token, lifetime) = self.fetch().await?;
        let period = refresh_after(lifetime);
        *self.current.lock().await = Some((token, Instant::now() + period));
        Ok(period)
    }

    /// One client-credentials grant: the token and its lifetime.
    async fn fetch(&self) -> Result<(String, Duration)> {
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_secret", self.secret.expose()),
            ("scope", self.scope.as_str()),
        ];
        if let Some(id) = &self.id {
            form.push(("client_id", id));
        }
        let failed = |what: String| {
            Error::Config(format!(
                "cannot get a token from {} with the catalog's credential: {what}",
                self.endpoint
            ))
        };
        let response = self
            .http
            .post(&self.endpoint)
            .form(&form)
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        if !status.is_success() {
            let said = body["error_description"]
                .as_str()
                .or_else(|| body["error"]["message"].as_str())
                .or_else(|| body["error"].as_str())
                .unwrap_or("no reason given");
            return Err(failed(format!("{status}: {said}; check the credential")));
        }
        let token = body["access_token"]
            .as_str()
            .ok_or_else(|| failed("the answer holds no access_token".to_string()))?
            .to_string();
        let lifetime = body["expires_in"]
            .as_u64()
            .map_or(UNSAID_LIFETIME, Duration::from_secs);
        Ok((token, lifetime))
    }
}

/// Half of `lifetime`, at least [`SHORTEST_REFRESH`].
fn refresh_after(lifetime: Duration) -> Duration {
    (lifetime / 2).max(SHORTEST_REFRESH)
}

/// Has `catalog` fetch a new token every `period` for as long as it is in
/// use (the task ends once the catalog is dropped).
pub(crate) fn keep_fresh(catalog: &Arc<RestCatalog>, period: Duration) {
    let catalog: Weak<RestCatalog> = Arc::downgrade(catalog);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let Some(catalog) = catalog.upgrade() else {
                return;
            };
            // A failure keeps the current token; the next round tries again.
            let _ = catalog.regenerate_token().await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_fetched_again_at_half_its_lifetime() {
        assert_eq!(
            refresh_after(Duration::from_secs(3600)),
            Duration::from_secs(1800)
        );
        assert_eq!(refresh_after(Duration::from_secs(1)), SHORTEST_REFRESH);
        let e = ClientCredentials::new("lake", "http://x", "lake:", None, None).unwrap_err();
        assert!(e.to_string().contains("has no secret"), "{e}");
    }
}
