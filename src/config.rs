//! Configuration, in three tiers:
//!
//! * user knobs ([`IcestageOptions`]) settable with `SET icestage.<name> = ...`;
//! * the catalogs icestage serves ([`IcestageConfig`], [`CatalogConfig`]),
//!   read from a TOML file in the shape iceberg-rust's playground uses;
//! * properties handed to external systems, as string maps with `pub const` keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use datafusion::common::config::{ConfigExtension, ConfigField, Visit};
use datafusion::common::extensions_options;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

extensions_options! {
    /// Session options, settable with `SET icestage.<name> = <value>`.
    pub struct IcestageOptions {
        /// How long a new upload stays open before `EXPIRE STAGING` removes it,
        /// e.g. `30m`, `24h`, `7d`. `CREATE UPLOAD ... WITH (ttl = ...)` overrides it.
        pub upload_ttl: Ttl, default = Ttl::default()

        /// How long a new download stays before `EXPIRE STAGING` removes it.
        /// `CREATE DOWNLOAD ... WITH (ttl = ...)` overrides it.
        pub download_ttl: Ttl, default = Ttl::default()

        /// The longest time to live an upload or download may ask for.
        pub max_ttl: Ttl, default = Ttl::written("7d")

        /// How long a promotion's claim holds: a `promoting` upload whose claim
        /// is older can be taken over by `ABORT UPLOAD` and `EXPIRE STAGING`.
        pub promotion_lease: Ttl, default = Ttl::written("60s")

        /// Where PROMOTE's proof and rules, CREATE DOWNLOAD's query and COPY INTO
        /// (and RUN PIPE) run: '' (here) or a Ballista scheduler, `df://HOST:PORT`
        /// (needs the `cluster` feature).
        pub cluster: String, default = String::new()

        /// The file holding the cluster's shared secret, the one its scheduler
        /// and executors were started with; '' for the file the environment
        /// variable ICESTAGE_CLUSTER_SECRET_FILE names.
        pub cluster_secret_file: String, default = String::new()

        /// The PEM file of the certificate authority a TLS cluster's
        /// certificates chain to (its scheduler and executors were started
        /// with --tls-cert); '' for the file the environment variable
        /// ICESTAGE_CLUSTER_TLS_CA_FILE names, or none: plain connections.
        pub cluster_tls_ca_file: String, default = String::new()
    }
}

/// A duration as the user wrote it (`24h`, `90s`), parsed once: session
/// options, `WITH (ttl = ...)` and the Rust API's time-to-live arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ttl {
    text: String,
    duration: Duration,
}

impl Default for Ttl {
    fn default() -> Self {
        Self::written("24h")
    }
}

impl Ttl {
    /// Parses a duration such as `30m`, `24h` or `7d` (see [`parse_duration`]).
    pub fn parse(text: &str) -> Result<Self> {
        Ok(Self {
            duration: parse_duration(text)?,
            text: text.trim().to_string(),
        })
    }

    /// A default written in the code.
    fn written(text: &str) -> Self {
        Self::parse(text).expect("a valid default duration")
    }

    /// The value as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value.
    pub fn duration(&self) -> Duration {
        self.duration
    }
}

impl From<Duration> for Ttl {
    fn from(duration: Duration) -> Self {
        Self {
            text: format_duration(duration),
            duration,
        }
    }
}

impl std::str::FromStr for Ttl {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl std::fmt::Display for Ttl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl ConfigField for Ttl {
    fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
        v.some(key, &self.text, description)
    }

    fn set(&mut self, _key: &str, value: &str) -> datafusion::error::Result<()> {
        *self = Self::parse(value)?;
        Ok(())
    }

    fn reset(&mut self, _key: &str) -> datafusion::error::Result<()> {
        *self = Self::default();
        Ok(())
    }
}

impl ConfigExtension for IcestageOptions {
    const PREFIX: &'static str = "icestage";
}

/// Catalog type of the embedded default: iceberg's SQL catalog.
pub const CATALOG_TYPE_SQL: &str = "sql";
/// Catalog type: Amazon S3 Tables.
pub const CATALOG_TYPE_S3TABLES: &str = "s3tables";
/// Catalog type: an Iceberg REST catalog (Polaris, Lakekeeper, another
/// icestage's `serve`).
pub const CATALOG_TYPE_REST: &str = "rest";
/// Property key (REST): the bearer token sent with every request.
pub const PROP_TOKEN: &str = "token";
/// Property key (REST): OAuth2 client credentials, `<client id>:<secret>`.
pub const PROP_CREDENTIAL: &str = "credential";
/// Property key (REST): the OAuth2 token endpoint, when it is not the
/// catalog's own `<uri>/v1/oauth/tokens`.
pub const PROP_OAUTH_SERVER: &str = "oauth2-server-uri";
/// Property key (REST): the OAuth2 scope asked for (default `catalog`).
pub const PROP_SCOPE: &str = "scope";
/// Property key (S3 Tables): the table bucket's ARN.
pub const PROP_TABLE_BUCKET_ARN: &str = "table_bucket_arn";
/// Property key (S3 Tables): the S3 Tables API endpoint, for an emulator.
pub const PROP_ENDPOINT_URL: &str = "endpoint_url";
/// Property key: the catalog database URI (sqlx form, `sqlite:/path?mode=rwc`).
pub const PROP_URI: &str = "uri";
/// Property key: the warehouse root (`file:///path` or `s3://bucket/prefix`).
pub const PROP_WAREHOUSE: &str = "warehouse";
/// Name of the embedded default catalog.
pub const EMBEDDED_CATALOG_NAME: &str = "local";
/// File name of the embedded catalog database inside the warehouse folder.
pub const EMBEDDED_CATALOG_FILE: &str = "catalog.db";

/// One catalog icestage serves.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct CatalogConfig {
    /// The name SQL uses for it (`<name>.<namespace>.<table>`).
    pub name: String,
    /// Catalog type: `sql`, `s3tables` or `rest`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Properties handed to the catalog (`uri`, `warehouse`, ...).
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

impl std::fmt::Debug for CatalogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("config", &crate::secret::redacted(&self.config))
            .finish()
    }
}

/// The catalogs of one icestage session.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct IcestageConfig {
    /// Catalog that two-part names (`namespace.table`) resolve to; the first
    /// catalog when unset.
    #[serde(default)]
    pub default_catalog: Option<String>,
    /// One entry per catalog.
    pub catalogs: Vec<CatalogConfig>,
    /// Bounds on the work done on bytes a client wrote (`[limits]`).
    #[serde(default)]
    pub limits: crate::limits::ReadLimits,
}

impl IcestageConfig {
    /// The embedded default: a SQLite catalog and a warehouse in one local folder.
    ///
    /// The folder is created on first use; the catalog database is
    /// `<dir>/catalog.db`, the same layout PyIceberg's `SqlCatalog` reads.
    pub fn embedded(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::Config(format!(
                "cannot create the warehouse folder '{}': {e}",
                dir.display()
            ))
        })?;
        let dir = dir.canonicalize()?;
        Ok(Self {
            default_catalog: None,
            catalogs: vec![CatalogConfig {
                name: EMBEDDED_CATALOG_NAME.to_string(),
                kind: CATALOG_TYPE_SQL.to_string(),
                config: BTreeMap::from([
                    (
                        PROP_URI.to_string(),
                        sqlite_uri(&dir.join(EMBEDDED_CATALOG_FILE)),
                    ),
                    (PROP_WAREHOUSE.to_string(), file_uri(&dir)),
                ]),
            }],
            limits: Default::default(),
        })
    }

    /// Reads a catalog TOML file:
    ///
    /// ```toml
    /// default_catalog = "local"
    ///
    /// [[catalogs]]
    /// name = "local"
    /// type = "sql"
    /// [catalogs.config]
    /// uri = "sqlite:/data/warehouse/catalog.db?mode=rwc"
    /// warehouse = "file:///data/warehouse"
    /// ```
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "cannot read catalog config '{}': {e}",
                path.display()
            ))
        })?;
        Self::from_toml_str(&text)
            .map_err(|e| Error::Config(format!("in '{}': {e}", path.display())))
    }

    /// Parses the TOML text of a catalog config.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let config: IcestageConfig =
            toml::from_str(text).map_err(|e| Error::Config(e.message().to_string()))?;
        if config.catalogs.is_empty() {
            return Err(Error::Config(
                "no catalogs configured: add at least one [[catalogs]] entry".to_string(),
            ));
        }
        Ok(config)
    }
}

/// The sqlx URI of a SQLite database file, created when missing.
pub fn sqlite_uri(path: &Path) -> String {
    format!("sqlite:{}?mode=rwc", path.display())
}

/// A `file://` URI for an absolute local path.
pub fn file_uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// The local path of a `sqlite:` URI in sqlx form (`sqlite:/p?mode=rwc`,
/// `sqlite:///p`, `sqlite:///p?x`).
pub(crate) fn sqlite_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("sqlite:")?;
    let rest = rest.split('?').next().unwrap_or(rest);
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    (!rest.is_empty()).then(|| PathBuf::from(rest))
}

/// One option of a statement's `WITH (...)`: its key, its default and
/// what it does, as the options reference shows them.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the default and the text are the reference page's"
    )
)]
pub(crate) struct OptionDoc {
    pub(crate) key: &'static str,
    pub(crate) default: &'static str,
    pub(crate) doc: &'static str,
}

impl OptionDoc {
    /// Option `key`, `default` when not given, doing what `doc` says.
    pub(crate) const fn new(key: &'static str, default: &'static str, doc: &'static str) -> Self {
        Self { key, default, doc }
    }
}

/// Where option `key` is in `options`, at compile time: a key that is
/// not there stops the build.
pub(crate) const fn position(options: &[OptionDoc], key: &str) -> usize {
    let mut at = 0;
    while at < options.len() {
        if same(options[at].key.as_bytes(), key.as_bytes()) {
            return at;
        }
        at += 1;
    }
    panic!("no such option")
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    while at < a.len() {
        if a[at] != b[at] {
            return false;
        }
        at += 1;
    }
    true
}

/// The keys of `options`.
pub(crate) fn keys(options: &[OptionDoc]) -> Vec<&'static str> {
    options.iter().map(|o| o.key).collect()
}

/// The options of a statement's `WITH (...)`, parsed by their own type.
/// The keys it takes, their defaults and what each does are declared once,
/// in [`WithOptions::OPTIONS`]: the parser refuses any other key with that
/// list, and the options reference page is checked against it.
pub(crate) trait WithOptions: Sized {
    /// The statement, as messages name it (`CREATE UPLOAD`).
    const STATEMENT: &'static str;
    /// Every option it takes.
    const OPTIONS: &'static [OptionDoc];

    /// The options `pairs` give over the defaults; every key is one of
    /// [`WithOptions::OPTIONS`]. A bad value is refused by its key.
    fn parse(pairs: &[(String, String)]) -> Result<Self>;

    /// `WITH (...)` as written: an unknown key is refused naming the keys
    /// the statement takes, then the values are parsed.
    fn from_with(pairs: &[(String, String)]) -> Result<Self> {
        check_options(Self::STATEMENT, pairs, &keys(Self::OPTIONS))?;
        Self::parse(pairs)
    }
}

/// The value of option `key` in `pairs`, if given.
pub(crate) fn option<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Boolean option `key` of `pairs`: false when not given.
pub(crate) fn flag_option(pairs: &[(String, String)], key: &str) -> Result<bool> {
    option(pairs, key).map_or(Ok(false), |value| parse_bool(key, value))
}

/// Refuses a key of `options` outside `accepted`, naming the ones
/// `statement` takes.
pub(crate) fn check_options(
    statement: &str,
    options: &[(String, String)],
    accepted: &[&str],
) -> Result<()> {
    for (key, _) in options {
        if !accepted.contains(&key.as_str()) {
            let valid = if accepted.is_empty() {
                "it takes no options".to_string()
            } else {
                format!("valid options are {}", accepted.join(", "))
            };
            return Err(Error::invalid(format!(
                "{statement} has no option '{key}': {valid}"
            )));
        }
    }
    Ok(())
}

/// `true`/`false` (and `on`/`off`, `1`/`0`) for option `name`.
pub(crate) fn parse_bool(name: &str, value: &str) -> Result<bool> {
    OptionSyntax::With.parse_bool(name, value)
}

/// How a statement's options are written, so a message about one shows
/// it as the user wrote it: `WITH (key = value)`, or a table function's
/// named arguments, `key => value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OptionSyntax {
    With,
    Arguments,
}

impl OptionSyntax {
    fn arrow(self) -> &'static str {
        match self {
            Self::With => "=",
            Self::Arguments => "=>",
        }
    }

    /// `value` of option `name` as a boolean (`true`, `on`, `1`, `yes` or
    /// their opposites, in any case).
    pub(crate) fn parse_bool(self, name: &str, value: &str) -> Result<bool> {
        match value.to_ascii_lowercase().as_str() {
            "true" | "on" | "1" | "yes" => Ok(true),
            "false" | "off" | "0" | "no" => Ok(false),
            _ => {
                let arrow = self.arrow();
                Err(Error::invalid(format!(
                    "option {name} {arrow} '{value}' is not a boolean: \
                     write {name} {arrow} true or {name} {arrow} false"
                )))
            }
        }
    }
}

/// `text` as a whole number and the unit after it (`"24 h"`: 24, `"h"`).
fn number_and_unit(text: &str) -> Option<(u64, &str)> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    Some((number.parse().ok()?, unit.trim()))
}

/// The largest size [`parse_size`] takes (64 GiB).
const MAX_SIZE_BYTES: u64 = 64 << 30;

/// Parses a size such as `512MB`, `64 MiB`, `1GB`, `4096` (a bare number is
/// bytes; `KB`/`MB`/`GB`/`TB` count in 1,024s as `KiB`/`MiB`/`GiB`/`TiB`
/// do, as Iceberg's sizes are usually written), from 1 byte to 64 GiB.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = || {
        Error::invalid(format!(
            "'{text}' is not a size: write a whole number with a unit, e.g. '4096', '64KB', '512MB', '1GB'"
        ))
    };
    let (value, unit) = number_and_unit(text).ok_or_else(bad)?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    match value.checked_mul(1u64 << shift) {
        Some(0) => Err(Error::invalid(format!(
            "size '{text}' is zero: give a positive size such as '512MB'"
        ))),
        Some(bytes) if bytes <= MAX_SIZE_BYTES => Ok(bytes),
        _ => Err(Error::invalid(format!(
            "size '{text}' is too large: the largest is 64GB"
        ))),
    }
}

/// Parses a duration such as `500ms`, `90s`, `30m`, `24h`, `7d` (a bare
/// number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let bad = || {
        Error::invalid(format!(
            "'{text}' is not a duration: write a whole number with a unit, e.g. '500ms', '90s', '30m', '24h', '7d'"
        ))
    };
    let (value, unit) = number_and_unit(text).ok_or_else(bad)?;
    let seconds = |per: u64| {
        value
            .checked_mul(per)
            .filter(|s| *s <= MAX_DURATION_SECS)
            .map(Duration::from_secs)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "duration '{text}' is too long: the longest is {} days",
                    MAX_DURATION_SECS / 86_400
                ))
            })
    };
    let duration = match unit.trim() {
        "ms" | "millis" | "milliseconds" => seconds(1).map(|_| Duration::from_millis(value))?,
        "" | "s" | "sec" | "secs" | "seconds" => seconds(1)?,
        "m" | "min" | "mins" | "minutes" => seconds(60)?,
        "h" | "hour" | "hours" => seconds(3600)?,
        "d" | "day" | "days" => seconds(86_400)?,
        _ => return Err(bad()),
    };
    if duration.is_zero() {
        return Err(Error::invalid(format!(
            "duration '{text}' is zero: give a positive duration such as '24h'"
        )));
    }
    Ok(duration)
}

/// The longest duration [`parse_duration`] accepts: 100 years, far below
/// what time arithmetic can hold.
const MAX_DURATION_SECS: u64 = 100 * 365 * 86_400;

/// `ttl` if it is at most `max` (the `max_ttl` option); an error naming both
/// otherwise. `what` names the session kind (`upload`, `download`).
pub(crate) fn bounded_ttl(ttl: &Ttl, max: &Ttl, what: &str) -> Result<Duration> {
    let (value, limit) = (ttl.duration(), max.duration());
    if value > limit {
        return Err(Error::invalid(format!(
            "{what} ttl '{ttl}' is longer than the maximum of '{max}': ask for at most '{max}', \
             or raise it with SET icestage.max_ttl = '...'"
        )));
    }
    Ok(value)
}

/// `duration` as [`parse_duration`] reads it back: `1500ms`, `90s`.
pub fn format_duration(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(
            parse_duration("2 days").unwrap(),
            Duration::from_secs(172_800)
        );
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        let err = parse_duration("soon").unwrap_err().to_string();
        assert!(err.contains("'soon' is not a duration"), "{err}");
        assert!(parse_duration("0h").is_err());
        assert!(parse_duration("0ms").is_err());
        assert!(parse_duration("3w").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512MB").unwrap(), 512 << 20);
        assert_eq!(parse_size("64 MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1gb").unwrap(), 1 << 30);
        assert_eq!(parse_size("64GB").unwrap(), 64 << 30);
        let err = parse_size("big").unwrap_err().to_string();
        assert!(err.contains("'big' is not a size"), "{err}");
        assert!(parse_size("0MB").is_err());
        assert!(parse_size("65GB").is_err());
        assert!(parse_size("99999999999999999999TB").is_err());
        assert!(parse_size("3PB").is_err());
    }

    #[test]
    fn sqlite_paths() {
        assert_eq!(
            sqlite_path("sqlite:/a/b.db?mode=rwc"),
            Some(PathBuf::from("/a/b.db"))
        );
        assert_eq!(
            sqlite_path("sqlite:///a/b.db"),
            Some(PathBuf::from("/a/b.db"))
        );
        assert_eq!(sqlite_path("postgres://x"), None);
    }

    #[test]
    fn toml_config() {
        let config = IcestageConfig::from_toml_str(
            r#"
            [[catalogs]]
            name = "lake"
            type = "sql"
            [catalogs.config]
            uri = "sqlite:/tmp/x.db?mode=rwc"
            warehouse = "file:///tmp/wh"
            "#,
        )
        .unwrap();
        assert_eq!(config.catalogs[0].name, "lake");
        assert_eq!(
            config.catalogs[0].config[PROP_URI],
            "sqlite:/tmp/x.db?mode=rwc"
        );
        let err = IcestageConfig::from_toml_str("catalogs = []").unwrap_err();
        assert!(err.to_string().contains("no catalogs configured"), "{err}");
    }
}
