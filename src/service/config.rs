//! The service's configuration file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::{CatalogConfig, IcestageConfig, parse_duration};
use crate::error::{Error, Result};
use crate::secret::Secret;

/// `icestage serve --config FILE`: the catalogs (a `warehouse` folder for
/// the embedded catalog, or `[[catalogs]]` entries) and a `[service]` table.
///
/// ```toml
/// warehouse = "./warehouse"
///
/// [service]
/// listen = "127.0.0.1:8080"
///
/// [[service.tokens]]
/// name = "acme"
/// token = "sk_acme_..."
/// tables = ["payments.transactions"]
/// operations = ["upload", "download"]
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Folder of the embedded catalog, when `catalogs` is empty.
    #[serde(default)]
    pub warehouse: Option<PathBuf>,
    /// Catalog that two-part names resolve to.
    #[serde(default)]
    pub default_catalog: Option<String>,
    /// The catalogs, as in `--catalog-config`.
    #[serde(default)]
    pub catalogs: Vec<CatalogConfig>,
    /// The service itself.
    pub service: ServiceSettings,
    /// Bounds on the work done on bytes a client wrote.
    #[serde(default)]
    pub limits: crate::limits::ReadLimits,
}

/// `[service]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSettings {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The address clients reach the service at (`https://ingest.example.com`),
    /// for the REST catalog URI in the connections it hands out; the bound
    /// address (`http://<listen>`) when unset.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Largest request body accepted, in bytes.
    #[serde(default = "default_body")]
    pub max_body_bytes: usize,
    /// How long a request may take, e.g. `30s`.
    #[serde(default = "default_timeout")]
    pub request_timeout: String,
    /// Requests one token may make per minute.
    #[serde(default = "default_rate")]
    pub requests_per_minute: u32,
    /// Key that turns idempotency keys into upload ids; give every replica
    /// the same one so a retry reaches any of them. Random when unset.
    #[serde(default)]
    pub id_secret: Option<Secret>,
    /// Where events go.
    #[serde(default)]
    pub webhook: Option<WebhookSettings>,
    /// How long a promotion's claim holds without renewal (the session
    /// option `icestage.promotion_lease`, default 60s): a replica killed
    /// mid-promotion blocks that upload's next promotion this long.
    #[serde(default)]
    pub promotion_lease: Option<String>,
    /// The Ballista cluster promotions, downloads, COPY INTO and pipes run
    /// on, `df://HOST:PORT` (the session option `icestage.cluster`; needs
    /// the `cluster` feature). Unset: in this process.
    #[serde(default)]
    pub cluster: Option<String>,
    /// The file holding that cluster's shared secret (the session option
    /// `icestage.cluster_secret_file`); unset: the file the environment
    /// variable ICESTAGE_CLUSTER_SECRET_FILE names.
    #[serde(default)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// The authority a TLS cluster's certificates chain to, PEM (the
    /// session option `icestage.cluster_tls_ca_file`); unset: the file
    /// ICESTAGE_CLUSTER_TLS_CA_FILE names, or plain connections.
    #[serde(default)]
    pub cluster_tls_ca_file: Option<std::path::PathBuf>,
    /// Whether this replica runs the catalogs' pipes (every replica may:
    /// one at a time per pipe). On by default.
    #[serde(default = "default_run_pipes")]
    pub run_pipes: bool,
    /// How long a bearer token from the REST catalog's OAuth endpoint
    /// (`POST /iceberg/v1/oauth/tokens`) lasts, e.g. `1h` (the default);
    /// from 1s to 24h.
    #[serde(default = "default_oauth_lifetime")]
    pub oauth_token_lifetime: String,
    /// The bearer token `GET /metrics` takes on the service's address
    /// (Prometheus' `authorization` setting). Unset: `/metrics` answers
    /// there to nobody (404: see `metrics_listen`).
    #[serde(default)]
    pub metrics_token: Option<Secret>,
    /// A second address serving `GET /metrics` alone, without a token
    /// (`127.0.0.1:9464`): for a scraper on a private network.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// `text` (the default) or `json`: the form of the log lines on stderr
    /// (one per request, one per state change), filtered by `ICESTAGE_LOG`
    /// or `RUST_LOG` (`info` by default; `icestage::request=off` drops the
    /// request lines).
    #[serde(default = "default_log_format")]
    pub log_format: String,
    /// Sessions never get storage keys: the REST catalog signs each of
    /// their storage requests (Iceberg's remote signing), and the
    /// connections handed out ask for it. Off by default: a client asks for
    /// remote signing with `X-Iceberg-Access-Delegation: remote-signing`,
    /// else it gets vended keys.
    #[serde(default)]
    pub require_remote_signing: bool,
    /// Who may call, and what.
    #[serde(default)]
    pub tokens: Vec<TokenSettings>,
}

fn default_log_format() -> String {
    "text".to_string()
}

fn default_oauth_lifetime() -> String {
    "1h".to_string()
}

/// `[service.webhook]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// The receiver's URL.
    pub url: String,
    /// The key of the `Icestage-Signature` HMAC.
    pub secret: Secret,
    /// How often to look for events to deliver, e.g. `2s`.
    #[serde(default = "default_interval")]
    pub interval: String,
}

/// `[[service.tokens]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// A name for the caller (recorded as the owner of what it creates).
    pub name: String,
    /// The bearer token.
    pub token: Secret,
    /// Tables it may upload to, download from or reach through the REST
    /// catalog: `namespace.table`, `namespace.*` (every table of the
    /// namespace) or `*` (every table).
    pub tables: Vec<String>,
    /// `upload`, `download`, `catalog` (the REST catalog's full view of its
    /// tables, for another icestage or any engine that manages them).
    pub operations: Vec<TokenOperation>,
    /// The catalogs (`[[catalogs]]` names) its tables are in: one service
    /// can front several tenants' catalogs, and a token sees nothing of a
    /// catalog it does not name (404). The first is where its requests go
    /// unless they name another (`"catalog"` in a request body, the
    /// `warehouse` of the REST catalog's `/v1/config`). Unset: the default
    /// catalog alone.
    #[serde(default)]
    pub catalogs: Vec<String>,
}

impl TokenSettings {
    /// The catalog this token's requests go to unless they name another:
    /// its first catalog, or `default`.
    pub(crate) fn home<'a>(&'a self, default: &'a str) -> &'a str {
        self.catalogs.first().map_or(default, String::as_str)
    }

    /// Whether this token reaches catalog `name` (`default` is the
    /// service's default catalog).
    pub(crate) fn reaches_catalog(&self, name: &str, default: &str) -> bool {
        if self.catalogs.is_empty() {
            name == default
        } else {
            self.catalogs.iter().any(|c| c == name)
        }
    }

    /// Whether `table` (`namespace.table`) is one of this token's tables.
    pub(crate) fn reaches(&self, table: &str) -> bool {
        self.tables.iter().any(|pattern| {
            pattern == "*"
                || pattern == table
                || pattern.strip_suffix(".*").is_some_and(|namespace| {
                    table
                        .strip_prefix(namespace)
                        .and_then(|rest| rest.strip_prefix('.'))
                        .is_some_and(|name| !name.is_empty() && !name.contains('.'))
                })
        })
    }

    /// Whether every table of `namespace` is this token's (`*` or
    /// `<namespace>.*`): what changing or dropping the namespace takes.
    pub(crate) fn owns_namespace(&self, namespace: &str) -> bool {
        self.tables.iter().any(|pattern| {
            pattern == "*"
                || pattern
                    .strip_suffix(".*")
                    .is_some_and(|owned| owned == namespace)
        })
    }

    /// Whether `namespace` holds any of this token's tables.
    pub(crate) fn reaches_namespace(&self, namespace: &str) -> bool {
        self.tables.iter().any(|pattern| {
            pattern == "*"
                || pattern
                    .rsplit_once('.')
                    .is_some_and(|(ns, _)| ns == namespace)
        })
    }
}

/// What a token may be allowed to do (`operations = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub enum TokenOperation {
    /// Open uploads to its tables (`POST /uploads`) and see them.
    Upload,
    /// Open downloads of its tables (`POST /downloads`) and see them.
    Download,
    /// The REST catalog's full view of its tables.
    Catalog,
}

impl TokenOperation {
    const ALL: [Self; 3] = [Self::Upload, Self::Download, Self::Catalog];

    /// The name a config file and the API's messages use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Upload => "upload",
            Self::Download => "download",
            Self::Catalog => "catalog",
        }
    }
}

impl std::fmt::Display for TokenOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for TokenOperation {
    type Error = String;

    fn try_from(name: String) -> std::result::Result<Self, String> {
        crate::session::state_named(&Self::ALL, &name).ok_or_else(|| {
            format!(
                "'{name}' is not a token operation: operations are {}",
                Self::ALL.map(Self::as_str).join(", ")
            )
        })
    }
}

fn default_run_pipes() -> bool {
    true
}

fn default_listen() -> String {
    "127.0.0.1:8080".to_string()
}

fn default_body() -> usize {
    1024 * 1024
}

fn default_timeout() -> String {
    "30s".to_string()
}

fn default_rate() -> u32 {
    600
}

fn default_interval() -> String {
    "2s".to_string()
}

impl ServiceConfig {
    /// Reads and checks a service config file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "cannot read service config '{}': {e}",
                path.display()
            ))
        })?;
        Self::from_toml_str(&text)
            .map_err(|e| Error::Config(format!("in '{}': {}", path.display(), e.user_message())))
    }

    /// Parses and checks the TOML text of a service config.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let config: Self = toml::from_str(text).map_err(|e| {
            // The line the problem is on, where the parser knows it.
            let line = e
                .span()
                .map(|span| format!("line {}: ", text[..span.start].lines().count().max(1)));
            Error::Config(format!("{}{}", line.unwrap_or_default(), e.message()))
        })?;
        config.timeout()?;
        config.oauth_lifetime()?;
        config.json_log()?;
        if config.catalogs.is_empty() && config.warehouse.is_none() {
            return Err(Error::Config(
                "no catalog: set warehouse = \"<folder>\" or add [[catalogs]] entries".to_string(),
            ));
        }
        Ok(config)
    }

    /// The catalogs to serve.
    pub fn catalogs(&self) -> Result<IcestageConfig> {
        if self.catalogs.is_empty() {
            let mut embedded =
                IcestageConfig::embedded(self.warehouse.as_deref().expect("checked"))?;
            embedded.limits = self.limits;
            return Ok(embedded);
        }
        Ok(IcestageConfig {
            default_catalog: self.default_catalog.clone(),
            catalogs: self.catalogs.clone(),
            limits: self.limits,
        })
    }

    /// What `serve` says it opened, a line each: its catalogs (where an
    /// embedded warehouse is, relative paths being from the current
    /// folder) and its tokens (none: every request is refused).
    pub(crate) fn opened(&self) -> Vec<String> {
        let mut lines = vec![];
        match &self.warehouse {
            Some(folder) if self.catalogs.is_empty() => {
                let absolute = std::path::absolute(folder).unwrap_or_else(|_| folder.clone());
                lines.push(format!(
                    "embedded catalog, warehouse {} (relative to the current folder)",
                    absolute.display()
                ));
            }
            _ => {
                for catalog in &self.catalogs {
                    let warehouse = catalog
                        .config
                        .get("warehouse")
                        .map_or(String::new(), |w| format!(", warehouse {w}"));
                    lines.push(format!(
                        "catalog {} ({}){warehouse}",
                        catalog.name, catalog.kind
                    ));
                }
            }
        }
        lines.push(match self.service.tokens.len() {
            0 => "no [[service.tokens]]: every request is refused with 401 until the config \
                  names a token"
                .to_string(),
            n => format!(
                "{n} API token(s): {}",
                self.service
                    .tokens
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
        lines
    }

    pub(crate) fn timeout(&self) -> Result<Duration> {
        parse_duration(&self.service.request_timeout)
    }

    /// Whether the log lines are JSON.
    pub(crate) fn json_log(&self) -> Result<bool> {
        match self.service.log_format.as_str() {
            "text" => Ok(false),
            "json" => Ok(true),
            other => Err(Error::Config(format!(
                "[service] log_format = '{other}' is not a log format: use \"text\" or \"json\""
            ))),
        }
    }

    pub(crate) fn oauth_lifetime(&self) -> Result<Duration> {
        let text = &self.service.oauth_token_lifetime;
        let lifetime = parse_duration(text)?;
        if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&lifetime) {
            return Err(Error::Config(format!(
                "[service] oauth_token_lifetime = '{text}' is out of range: set it from 1s to 24h"
            )));
        }
        Ok(lifetime)
    }

    /// Tokens by their secret value.
    /// The tokens, each by the SHA-256 of its secret (only hashes are kept,
    /// and they compare in constant time). Two tokens with one secret are
    /// refused: a caller could not tell which rights it holds.
    pub(crate) fn tokens(&self) -> Result<Vec<([u8; 32], TokenSettings)>> {
        let mut seen: BTreeMap<[u8; 32], &str> = BTreeMap::new();
        let mut tokens = vec![];
        for token in &self.service.tokens {
            let hash: [u8; 32] = Sha256::digest(token.token.expose().as_bytes()).into();
            if let Some(other) = seen.insert(hash, &token.name) {
                return Err(Error::Config(format!(
                    "tokens '{other}' and '{}' have the same secret: give each token its own",
                    token.name
                )));
            }
            tokens.push((hash, token.clone()));
        }
        Ok(tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example configuration parses, and its commented `[limits]`
    /// table, uncommented, gives the bounds it documents (the defaults).
    #[test]
    fn the_example_configuration_and_its_limits_parse() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/examples/service.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let plain = ServiceConfig::from_toml_str(&text).unwrap();
        assert_eq!(plain.limits, crate::limits::ReadLimits::default());
        let limits = text
            .split("# [limits]")
            .nth(1)
            .expect("a [limits] example")
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .map(|l| l.split('#').next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let uncommented = format!("{text}\n[limits]\n{limits}");
        let config = ServiceConfig::from_toml_str(&uncommented).unwrap();
        assert_eq!(config.limits, crate::limits::ReadLimits::default());
        // The second service of the REST-backend walk-through, on the first.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/sql/examples/rest-backend.toml"
        );
        let backend =
            ServiceConfig::from_toml_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(backend.catalogs[0].kind, "rest");
        let token = &backend.catalogs[0].config["token"];
        assert!(
            plain
                .service
                .tokens
                .iter()
                .any(|t| t.token.expose() == token && t.operations == [TokenOperation::Catalog])
        );
    }

    #[test]
    fn token_operations_are_typed_and_a_wrong_one_is_named_with_its_line() {
        let config = |operations: &str| {
            ServiceConfig::from_toml_str(&format!(
                "warehouse = \"/tmp/w\"\n\n[[service.tokens]]\nname = \"acme\"\ntoken = \"s\"\n\
                 tables = [\"*\"]\noperations = {operations}\n"
            ))
        };
        let parsed = config(r#"["upload", "catalog"]"#).unwrap();
        assert_eq!(
            parsed.service.tokens[0].operations,
            [TokenOperation::Upload, TokenOperation::Catalog]
        );
        let error = config(r#"["upload", "uplaod"]"#)
            .unwrap_err()
            .user_message();
        assert!(
            error.contains("line 7")
                && error.contains("'uplaod' is not a token operation")
                && error.contains("operations are upload, download, catalog"),
            "{error}"
        );
    }

    #[test]
    fn a_token_reaches_its_tables_by_name_namespace_or_all() {
        let token = |tables: &[&str]| TokenSettings {
            name: "t".to_string(),
            token: Secret::new("s".to_string()),
            tables: tables.iter().map(|t| t.to_string()).collect(),
            operations: vec![TokenOperation::Catalog],
            catalogs: vec![],
        };
        let some = token(&["payments.transactions", "raw.*"]);
        assert!(some.reaches("payments.transactions"));
        assert!(!some.reaches("payments.other"));
        assert!(some.reaches("raw.orders"));
        assert!(!some.reaches("raw"), "a namespace is not a table");
        assert!(!some.reaches("rawx.orders"));
        assert!(!some.reaches("raw.nested.orders"));
        assert!(some.reaches_namespace("payments") && some.reaches_namespace("raw"));
        assert!(!some.reaches_namespace("icestage"));
        let all = token(&["*"]);
        assert!(all.reaches("icestage.upload_log") && all.reaches_namespace("anything"));
    }
}
