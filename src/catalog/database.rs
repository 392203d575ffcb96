//! The SQL catalog's database, as icestage reaches it itself: SQLite (the
//! embedded default, one host) or PostgreSQL (a catalog that several hosts
//! and other Iceberg clients share).
//!
//! Both hold the layout of Iceberg's JDBC catalog (`iceberg_tables`,
//! `iceberg_namespace_properties`), which iceberg's SQL catalog and
//! PyIceberg's `SqlCatalog` create and read; icestage creates nothing here
//! and rewrites nothing another implementation wrote. What it does itself
//! is the one compare-and-swap every state change rests on
//! ([`Database::swap`]): `UPDATE iceberg_tables ... WHERE metadata_location
//! = $old`, one statement, which the database applies whole or not at all.

use std::collections::BTreeMap;
use std::time::Duration;

use iceberg::TableIdent;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::error::{Error, Result};

/// The pool settings of a SQL catalog (`[catalogs.config]`), checked here:
/// iceberg's SQL catalog reads the same keys and would stop the process on
/// a value that is not a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolSettings {
    /// `pool.max-connections`: connections to the database at most, in
    /// each of the two pools (iceberg's and icestage's own).
    pub(crate) max_connections: u32,
    /// `pool.idle-timeout`: seconds an idle connection is kept.
    pub(crate) idle_timeout: Duration,
    /// `pool.acquire-timeout`: seconds to wait for a connection (also the
    /// bound on the first connection at start-up).
    pub(crate) acquire_timeout: Duration,
    /// `pool.test-before-acquire`: whether a pooled connection is checked
    /// before use, so that one the server dropped is replaced, not failed on.
    pub(crate) test_before_acquire: bool,
}

/// The settings keys [`PoolSettings`] reads.
const MAX_CONNECTIONS: &str = "pool.max-connections";
const IDLE_TIMEOUT: &str = "pool.idle-timeout";
const ACQUIRE_TIMEOUT: &str = "pool.acquire-timeout";
const TEST_BEFORE_ACQUIRE: &str = "pool.test-before-acquire";

impl PoolSettings {
    /// The settings of catalog `catalog` from its `config`; an unknown
    /// `pool.*` key or a bad value is an error naming both.
    pub(crate) fn from_config(catalog: &str, config: &BTreeMap<String, String>) -> Result<Self> {
        let mut settings = Self {
            max_connections: 10,
            idle_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(30),
            test_before_acquire: true,
        };
        let bad = |key: &str, value: &str, expected: &str| {
            Error::Config(format!(
                "catalog '{catalog}': {key} = '{value}' is not {expected}: set it to {expected}"
            ))
        };
        let seconds = |key: &str, value: &str| {
            value
                .parse::<u64>()
                .ok()
                .filter(|s| (1..=3600).contains(s))
                .map(Duration::from_secs)
                .ok_or_else(|| bad(key, value, "a number of seconds from 1 to 3600"))
        };
        for (key, value) in config.iter().filter(|(k, _)| k.starts_with("pool.")) {
            match key.as_str() {
                MAX_CONNECTIONS => {
                    settings.max_connections = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| bad(key, value, "a whole number from 1 to 1000"))?;
                }
                IDLE_TIMEOUT => settings.idle_timeout = seconds(key, value)?,
                ACQUIRE_TIMEOUT => settings.acquire_timeout = seconds(key, value)?,
                TEST_BEFORE_ACQUIRE => {
                    settings.test_before_acquire = value
                        .parse()
                        .map_err(|_| bad(key, value, "true or false"))?;
                }
                _ => {
                    return Err(Error::Config(format!(
                        "catalog '{catalog}': unknown setting '{key}': the pool settings are \
                         {MAX_CONNECTIONS}, {IDLE_TIMEOUT}, {ACQUIRE_TIMEOUT} and \
                         {TEST_BEFORE_ACQUIRE}"
                    )));
                }
            }
        }
        Ok(settings)
    }

    /// The properties iceberg's SQL catalog reads for its own pool.
    pub(crate) fn catalog_properties(&self) -> [(String, String); 3] {
        [
            (MAX_CONNECTIONS.into(), self.max_connections.to_string()),
            (IDLE_TIMEOUT.into(), self.idle_timeout.as_secs().to_string()),
            (
                TEST_BEFORE_ACQUIRE.into(),
                self.test_before_acquire.to_string(),
            ),
        ]
    }
}

/// Which database a URI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    /// The engine of `uri` (`sqlite:`, `postgres://`, `postgresql://`).
    pub(crate) fn of(uri: &str) -> Option<Self> {
        if uri.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }
}

/// `uri` with its password, if any, replaced by `***`: how a database URI
/// is shown in messages and logs.
pub(crate) fn redacted_uri(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => uri.to_string(),
    }
}

/// `uri` in the form PyIceberg's `SqlCatalog` (SQLAlchemy) takes.
pub(crate) fn client_uri(uri: &str) -> String {
    if let Some(path) = crate::config::sqlite_path(uri) {
        return format!("sqlite:///{}", path.display());
    }
    match uri.strip_prefix("postgres://") {
        Some(rest) => format!("postgresql://{rest}"),
        None => uri.to_string(),
    }
}

/// A connection pool on the catalog's database.
#[derive(Clone)]
pub(crate) enum Database {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite(_) => "Sqlite",
            Self::Postgres(_) => "Postgres",
        })
    }
}

/// Runs `$body` with `$pool` bound to the pool of either engine (the
/// statements are written once, with `$1`-style parameters both take).
macro_rules! on_pool {
    ($database:expr, $pool:ident => $body:expr) => {
        match $database {
            Database::Sqlite($pool) => $body,
            Database::Postgres($pool) => $body,
        }
    };
}

/// What a row of `iceberg_tables` is: a table (`iceberg_type` `TABLE`, or
/// none in the layout's first version) or a view (`VIEW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Table,
    View,
}

impl Entry {
    /// The condition on `iceberg_type` that selects this kind of row.
    fn condition(self) -> &'static str {
        match self {
            Self::Table => "(iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
            Self::View => "iceberg_type = 'VIEW'",
        }
    }

    /// The value of `iceberg_type` a new row of this kind gets.
    fn value(self) -> &'static str {
        match self {
            Self::Table => "TABLE",
            Self::View => "VIEW",
        }
    }
}

/// How many times a swap whose outcome a lost connection hid is looked at
/// again before it is reported as unknown.
const SWAP_ATTEMPTS: usize = 3;

impl Database {
    /// Opens the database of catalog `catalog` at `uri`: a PostgreSQL
    /// server is reached once here, so that a wrong host, user, password
    /// or database is one clear error at start-up, not a timeout later.
    pub(crate) async fn open(catalog: &str, uri: &str, settings: &PoolSettings) -> Result<Self> {
        match Engine::of(uri) {
            Some(Engine::Sqlite) => {
                let options = uri.parse::<SqliteConnectOptions>().map_err(|e| {
                    Error::Config(format!(
                        "catalog '{catalog}': cannot read the SQLite URI '{uri}': {e}: write it \
                         as sqlite:/path/to/catalog.db?mode=rwc"
                    ))
                })?;
                // A writer waits for another process's write instead of
                // failing at once. Commits append to a write-ahead log, one
                // fsync each (with `synchronous` at FULL, SQLite's default):
                // a rollback journal took five per commit, about 35 ms of a
                // 10M-row promotion's 300.
                let options = options
                    .busy_timeout(Duration::from_secs(30))
                    .journal_mode(SqliteJournalMode::Wal);
                Ok(Self::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(2)
                        .connect_lazy_with(options),
                ))
            }
            Some(Engine::Postgres) => {
                let options = uri.parse::<PgConnectOptions>().map_err(|e| {
                    Error::Config(format!(
                        "catalog '{catalog}': cannot read the PostgreSQL URI '{}': {e}: write \
                         it as postgresql://user:password@host:5432/database",
                        redacted_uri(uri)
                    ))
                })?;
                let first = tokio::time::timeout(settings.acquire_timeout, options.connect()).await;
                match first {
                    Ok(Ok(connection)) => {
                        let _ = sqlx::Connection::close(connection).await;
                    }
                    Ok(Err(e)) => return Err(postgres_error(catalog, &options, &e)),
                    Err(_) => {
                        return Err(Error::Config(format!(
                            "catalog '{catalog}': PostgreSQL at {} did not answer within {} s: \
                             check the host and port in the URI and that the server runs \
                             (or raise pool.acquire-timeout)",
                            address(&options),
                            settings.acquire_timeout.as_secs()
                        )));
                    }
                }
                Ok(Self::Postgres(
                    PgPoolOptions::new()
                        .max_connections(settings.max_connections)
                        .idle_timeout(settings.idle_timeout)
                        .acquire_timeout(settings.acquire_timeout)
                        .test_before_acquire(settings.test_before_acquire)
                        .connect_lazy_with(options),
                ))
            }
            None => Err(Error::Config(format!(
                "catalog '{catalog}': '{}' is not a SQL catalog URI: use \
                 sqlite:/path/to/catalog.db?mode=rwc or postgresql://user@host:5432/database",
                redacted_uri(uri)
            ))),
        }
    }

    /// Where `catalog`'s pointer of `table` points now (`None`: no such
    /// table).
    pub(crate) async fn pointer(
        &self,
        catalog: &str,
        table: &TableIdent,
    ) -> std::result::Result<Option<String>, sqlx::Error> {
        self.entry_pointer(catalog, table, Entry::Table).await
    }

    /// Where the pointer of `catalog`'s `entry` named `ident` points now
    /// (`None`: no such entry).
    pub(crate) async fn entry_pointer(
        &self,
        catalog: &str,
        ident: &TableIdent,
        entry: Entry,
    ) -> std::result::Result<Option<String>, sqlx::Error> {
        let (namespace, name) = (ident.namespace().join("."), ident.name().to_string());
        let statement = format!(
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3 AND {}",
            entry.condition()
        );
        on_pool!(self, pool => {
            sqlx::query_scalar(&statement)
                .bind(catalog.to_string())
                .bind(namespace)
                .bind(name)
                .fetch_optional(pool)
                .await
        })
    }

    /// The names of `catalog`'s entries of kind `entry` in `namespace`
    /// (dotted), sorted.
    pub(crate) async fn names(
        &self,
        catalog: &str,
        namespace: &str,
        entry: Entry,
    ) -> std::result::Result<Vec<String>, sqlx::Error> {
        let statement = format!(
            "SELECT table_name FROM iceberg_tables \
             WHERE catalog_name = $1 AND table_namespace = $2 AND {} ORDER BY table_name",
            entry.condition()
        );
        let (catalog, namespace) = (catalog.to_string(), namespace.to_string());
        on_pool!(self, pool => {
            sqlx::query_scalar(&statement)
                .bind(catalog)
                .bind(namespace)
                .fetch_all(pool)
                .await
        })
    }

    /// Removes `catalog`'s `entry` named `ident`: whether it was there.
    pub(crate) async fn remove(
        &self,
        catalog: &str,
        ident: &TableIdent,
        entry: Entry,
    ) -> std::result::Result<bool, sqlx::Error> {
        let statement = format!(
            "DELETE FROM iceberg_tables \
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3 AND {}",
            entry.condition()
        );
        let binds = [
            catalog.to_string(),
            ident.namespace().join("."),
            ident.name().to_string(),
        ];
        Ok(self.execute(&statement, binds).await? == 1)
    }

    /// Renames `catalog`'s `entry` `from` to `to`: whether it was there
    /// (a row named `to` already, of any kind, is the database's key
    /// error).
    pub(crate) async fn rename(
        &self,
        catalog: &str,
        from: &TableIdent,
        to: &TableIdent,
        entry: Entry,
    ) -> std::result::Result<bool, sqlx::Error> {
        let statement = format!(
            "UPDATE iceberg_tables SET table_namespace = $1, table_name = $2 \
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 AND {}",
            entry.condition()
        );
        let binds = [
            to.namespace().join("."),
            to.name().to_string(),
            catalog.to_string(),
            from.namespace().join("."),
            from.name().to_string(),
        ];
        Ok(self.execute(&statement, binds).await? == 1)
    }

    /// Runs `statement` with `binds` for its `$1`, `$2`, ...: the rows it
    /// changed.
    async fn execute<const N: usize>(
        &self,
        statement: &str,
        binds: [String; N],
    ) -> std::result::Result<u64, sqlx::Error> {
        Ok(on_pool!(self, pool => {
            let mut query = sqlx::query(statement);
            for value in binds {
                query = query.bind(value);
            }
            query.execute(pool).await?.rows_affected()
        }))
    }

    /// Every table and view of `catalog` with where its pointer points:
    /// namespace (dotted), name, metadata location. One statement, read
    /// whole (a new table's location is checked against all of them).
    pub(crate) async fn entries(
        &self,
        catalog: &str,
    ) -> std::result::Result<Vec<(String, String, String)>, sqlx::Error> {
        let catalog = catalog.to_string();
        on_pool!(self, pool => {
            sqlx::query_as(
                "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables \
                 WHERE catalog_name = $1 AND metadata_location IS NOT NULL",
            )
            .bind(catalog)
            .fetch_all(pool)
            .await
        })
    }

    /// Adds `catalog`'s `entry` `ident`, pointing at `metadata_location`,
    /// unless a table or view of that name exists: whether it was added.
    /// The database's key decides between racing adds.
    pub(crate) async fn insert(
        &self,
        catalog: &str,
        ident: &TableIdent,
        metadata_location: &str,
        entry: Entry,
    ) -> std::result::Result<bool, sqlx::Error> {
        let (catalog, namespace, name, location) = (
            catalog.to_string(),
            ident.namespace().join("."),
            ident.name().to_string(),
            metadata_location.to_string(),
        );
        let inserted = on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO iceberg_tables \
                 (catalog_name, table_namespace, table_name, metadata_location, iceberg_type) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(catalog)
            .bind(namespace)
            .bind(name)
            .bind(location)
            .bind(entry.value())
            .execute(pool)
            .await
            .map(|_| ())
        });
        match inserted {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the properties `keys` of `catalog`'s namespace `namespace`
    /// (dotted), in one transaction: how many were there.
    pub(crate) async fn remove_namespace_properties(
        &self,
        catalog: &str,
        namespace: &str,
        keys: &[String],
    ) -> std::result::Result<u64, sqlx::Error> {
        let (catalog, namespace) = (catalog.to_string(), namespace.to_string());
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let mut removed = 0;
            for key in keys {
                removed += sqlx::query(
                    "DELETE FROM iceberg_namespace_properties \
                     WHERE catalog_name = $1 AND namespace = $2 AND property_key = $3",
                )
                .bind(catalog.clone())
                .bind(namespace.clone())
                .bind(key.clone())
                .execute(&mut *tx)
                .await?
                .rows_affected();
            }
            tx.commit().await?;
            Ok(removed)
        })
    }

    /// One `UPDATE ... WHERE metadata_location = $old`: whether it moved
    /// the pointer.
    async fn update(
        &self,
        catalog: &str,
        table: &TableIdent,
        expected: &str,
        new: &str,
        entry: Entry,
    ) -> std::result::Result<bool, sqlx::Error> {
        let statement = format!(
            "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 \
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 AND {} \
             AND metadata_location = $6",
            entry.condition()
        );
        // Owned values: sqlx's borrowed binds make the future's Send bound
        // lifetime-specific.
        let binds = [
            new.to_string(),
            expected.to_string(),
            catalog.to_string(),
            table.namespace().join("."),
            table.name().to_string(),
            expected.to_string(),
        ];
        Ok(self.execute(&statement, binds).await? == 1)
    }

    /// Points `catalog`'s `table` at `new` if, and only if, it points at
    /// `expected` now: `Ok(false)` when it points elsewhere.
    ///
    /// A connection lost while the statement was under way hides whether
    /// it applied. `new` names content no one else writes, so the pointer
    /// itself tells: at `new`, it applied; at `expected`, it did not and is
    /// sent again. Anything else after such a doubt is an error, never
    /// `Ok(false)`: the caller removes `new` on `Ok(false)`, which must not
    /// happen to a file a late commit may have pointed at.
    pub(crate) async fn swap(
        &self,
        catalog: &str,
        table: &TableIdent,
        expected: &str,
        new: &str,
    ) -> iceberg::Result<bool> {
        self.swap_entry(catalog, table, expected, new, Entry::Table)
            .await
    }

    /// [`Self::swap`] for an entry of kind `entry`.
    pub(crate) async fn swap_entry(
        &self,
        catalog: &str,
        table: &TableIdent,
        expected: &str,
        new: &str,
        entry: Entry,
    ) -> iceberg::Result<bool> {
        let mut doubt = None;
        for _ in 0..SWAP_ATTEMPTS {
            match self.update(catalog, table, expected, new, entry).await {
                Ok(true) => return Ok(true),
                Ok(false) if doubt.is_none() => return Ok(false),
                Ok(false) => {}
                Err(e) => doubt = Some(e),
            }
            match self.entry_pointer(catalog, table, entry).await {
                Ok(Some(at)) if at == new => return Ok(true),
                Ok(Some(at)) if at == expected => continue,
                Ok(_) => break,
                Err(e) => doubt = Some(e),
            }
        }
        Err(super::snapshot::unexpected(format!(
            "the outcome of moving {table}'s pointer to {new} is unknown (the catalog database \
             failed: {}): nothing was removed; run the statement again",
            doubt.map_or_else(
                || "another writer moved it meanwhile".to_string(),
                |e| e.to_string()
            )
        )))
    }
}

/// `host:port` of a PostgreSQL connection, for messages.
fn address(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// One line naming the server and what to check for a failed first
/// connection to PostgreSQL.
fn postgres_error(catalog: &str, options: &PgConnectOptions, e: &sqlx::Error) -> Error {
    let at = address(options);
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
    let what = match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "no PostgreSQL answers at {at} (connection refused): check that the server runs and \
             the host and port in the URI"
        ),
        sqlx::Error::Io(io) => format!(
            "cannot reach PostgreSQL at {at}: {io}: check the host and port in the URI and the \
             network"
        ),
        sqlx::Error::Tls(tls) => format!(
            "TLS to PostgreSQL at {at} failed: {tls}: check the server's certificate and the \
             URI's sslmode"
        ),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("28P01") | Some("28000") => format!(
                "PostgreSQL at {at} refused user '{user}': {}: check the user and password in \
                 the URI",
                db.message()
            ),
            Some("3D000") => format!(
                "PostgreSQL at {at} has no database '{database}': create it (createdb -h {} -p \
                 {} -U {user} {database}) or name an existing one in the URI",
                options.get_host(),
                options.get_port()
            ),
            _ => format!(
                "PostgreSQL at {at} refused the connection: {}",
                db.message()
            ),
        },
        other => format!("cannot connect to PostgreSQL at {at}: {other}"),
    };
    Error::Config(format!("catalog '{catalog}': {what}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_database_uri_is_shown_without_its_password() {
        assert_eq!(
            redacted_uri("postgresql://icestage:hunter2@db:5432/catalog?sslmode=require"),
            "postgresql://icestage:***@db:5432/catalog?sslmode=require"
        );
        assert_eq!(
            redacted_uri("postgres://icestage@db/catalog"),
            "postgres://icestage@db/catalog"
        );
        assert_eq!(
            client_uri("postgres://u@db/c"),
            "postgresql://u@db/c",
            "SQLAlchemy knows postgresql:// only"
        );
    }

    #[test]
    fn pool_settings_are_checked_before_iceberg_reads_them() {
        let config = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        let settings =
            PoolSettings::from_config("c", &config("pool.max-connections", "4")).unwrap();
        assert_eq!(settings.max_connections, 4);
        for (key, value, says) in [
            (
                "pool.max-connections",
                "many",
                "'many' is not a whole number",
            ),
            ("pool.max-connections", "0", "from 1 to 1000"),
            ("pool.idle-timeout", "-1", "a number of seconds"),
            ("pool.test-before-acquire", "yes", "true or false"),
            ("pool.size", "4", "unknown setting 'pool.size'"),
        ] {
            let e = PoolSettings::from_config("c", &config(key, value)).unwrap_err();
            assert!(e.to_string().contains(says), "{key}={value}: {e}");
        }
    }
}
