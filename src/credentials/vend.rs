//! `vend_credentials('<id>' [, '<mode>'] [, '<duration>'])`: credentials and
//! connection properties that reach one upload's staging table and nothing
//! else.
//!
//! * S3 Tables: `sts:AssumeRole` into the configured role with the session
//!   policy of [`super::policy::s3tables_policy`];
//! * a SQL catalog whose warehouse is on S3: the same, with an S3 policy on
//!   the table's prefix ([`super::policy::s3_prefix_policy`]);
//! * a local warehouse: no credentials are needed, only the connection.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::policy::{AccessMode, pack, s3_prefix_policy, s3tables_policy};
use crate::aws::{MAX_DURATION, MIN_DURATION, VendedCredentials, assume_role};
use crate::catalog::{CatalogKind, IcebergCatalog};
use crate::config::{CATALOG_TYPE_REST, CATALOG_TYPE_S3TABLES, CATALOG_TYPE_SQL, Ttl};
use crate::download::{Download, DownloadId, DownloadState, find_download};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::secret::Secret;
use crate::session::CommandContext;
use crate::session::log;
use crate::session::operation::Operation;
use crate::upload::{Staging, UploadId, UploadState, find_staging};

/// The default lifetime of vended credentials.
pub(crate) const DEFAULT_DURATION: Duration = Duration::from_secs(3600);

/// Checks a requested lifetime against STS's bounds.
pub(crate) fn vend_duration(asked: Option<&Ttl>) -> Result<Duration> {
    let Some(asked) = asked else {
        return Ok(DEFAULT_DURATION);
    };
    let duration = asked.duration();
    if !(MIN_DURATION..=MAX_DURATION).contains(&duration) {
        return Err(Error::invalid(format!(
            "credentials cannot last '{asked}': STS grants between 15m and 12h (the role's maximum session \
             duration may be lower); the default is 1h"
        )));
    }
    Ok(duration)
}

#[derive(Serialize)]
struct TomlConfig {
    catalogs: Vec<TomlCatalog>,
}

#[derive(Serialize)]
struct TomlCatalog {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    config: BTreeMap<String, String>,
}

/// What a client needs: PyIceberg-style properties and an icestage catalog file.
pub(crate) struct Connection {
    /// The properties of PyIceberg's `load_catalog`, credentials included.
    pub(crate) properties: BTreeMap<String, String>,
    catalog_config: String,
}

fn connection(
    catalog: &IcebergCatalog,
    credentials: Option<&VendedCredentials>,
) -> Result<Connection> {
    let aws = catalog.aws();
    let mut properties = catalog.named_client_properties();
    let mut config = BTreeMap::new();
    let kind = match catalog.kind() {
        CatalogKind::Sql { uri, warehouse } => {
            config.insert("uri".to_string(), uri.clone());
            config.insert("warehouse".to_string(), warehouse.clone());
            CATALOG_TYPE_SQL
        }
        CatalogKind::S3Tables {
            bucket_arn,
            endpoint_url,
        } => {
            config.insert("table_bucket_arn".to_string(), bucket_arn.clone());
            if let Some(endpoint) = endpoint_url {
                config.insert("endpoint_url".to_string(), endpoint.clone());
            }
            CATALOG_TYPE_S3TABLES
        }
        CatalogKind::Rest { uri, warehouse } => {
            config.insert("uri".to_string(), uri.clone());
            if let Some(warehouse) = warehouse {
                config.insert("warehouse".to_string(), warehouse.clone());
            }
            CATALOG_TYPE_REST
        }
    };
    if let Some(credentials) = credentials {
        config.insert("region".to_string(), aws.region.clone());
        if let Some(endpoint) = &aws.s3_endpoint {
            config.insert("s3.endpoint".to_string(), endpoint.clone());
        }
        config.insert(
            "access_key_id".to_string(),
            credentials.access_key_id.clone(),
        );
        config.insert(
            "secret_access_key".to_string(),
            credentials.secret_access_key.expose().to_string(),
        );
        config.insert(
            "session_token".to_string(),
            credentials.session_token.expose().to_string(),
        );
        for prefix in ["s3", "client"] {
            properties.insert(
                format!("{prefix}.access-key-id"),
                credentials.access_key_id.clone(),
            );
            properties.insert(
                format!("{prefix}.secret-access-key"),
                credentials.secret_access_key.expose().to_string(),
            );
            properties.insert(
                format!("{prefix}.session-token"),
                credentials.session_token.expose().to_string(),
            );
        }
    }
    let catalog_config = toml::to_string(&TomlConfig {
        catalogs: vec![TomlCatalog {
            name: catalog.name().to_string(),
            kind: kind.to_string(),
            config,
        }],
    })
    .map_err(|e| Error::internal(format!("catalog config: {e}")))?;
    Ok(Connection {
        properties,
        catalog_config,
    })
}

/// Splits `s3://bucket/some/prefix` into bucket and prefix.
fn s3_location(location: &str) -> Option<(&str, &str)> {
    let rest = location
        .strip_prefix("s3://")
        .or_else(|| location.strip_prefix("s3a://"))?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

/// `duration`, cut so that credentials end when the session does (`until`).
/// STS grants at least 15 minutes: a session closer to its end than that
/// gets none.
fn capped(duration: Duration, until: Option<chrono::DateTime<Utc>>, id: &str) -> Result<Duration> {
    let Some(until) = until else {
        return Ok(duration);
    };
    let left = (until - Utc::now()).to_std().unwrap_or_default();
    if left < MIN_DURATION {
        return Err(Error::invalid(format!(
            "upload '{}' expires at {} and credentials last at least 15m, so none can be vended \
             that end with it: promote what was written, or open a new upload",
            id.trim_start_matches("icestage-"),
            until.to_rfc3339()
        )));
    }
    Ok(duration.min(left))
}

/// Credentials for `table` of `catalog` in `mode`, or `None` where no
/// credentials are needed (a local warehouse).
async fn credentials_for(
    catalog: &IcebergCatalog,
    namespace: &str,
    table: &str,
    location: &str,
    mode: AccessMode,
    session: &str,
    (duration, until): (Duration, Option<chrono::DateTime<Utc>>),
) -> Result<Option<VendedCredentials>> {
    let policy = match catalog.kind() {
        CatalogKind::S3Tables { bucket_arn, .. } => {
            s3tables_policy(bucket_arn, namespace, table, mode)
        }
        CatalogKind::Sql { .. } => match s3_location(location) {
            Some((bucket, prefix)) => s3_prefix_policy(bucket, prefix, mode),
            None => return Ok(None),
        },
        // The REST catalog vends its own, with each table load.
        CatalogKind::Rest { .. } => return Ok(None),
    };
    let packed = pack(&policy)?;
    let duration = capped(duration, until, session)?;
    Ok(Some(
        assume_role(catalog.aws(), catalog.name(), session, &packed, duration).await?,
    ))
}

fn refuse(id: &UploadId, state: UploadState, why: &str) -> Error {
    Error::UploadState {
        id: id.to_string(),
        state: state.to_string(),
        hint: format!("credentials are vended for open uploads only{why}"),
    }
}

/// The live session of `id` in a state that allows `mode`.
async fn open_session(ctx: &CommandContext, id: &UploadId, mode: AccessMode) -> Result<Staging> {
    let Some(staging) = find_staging(&ctx.icestage, id).await? else {
        return Err(
            match log::find::<UploadState>(&ctx.icestage, log::UPLOADS, id.as_str()).await? {
                Some(record) => refuse(id, record.state, ""),
                None => Error::UnknownUpload(id.to_string()),
            },
        );
    };
    usable(staging, mode)
}

/// `staging`, if its state allows `mode`.
fn usable(staging: Staging, mode: AccessMode) -> Result<Staging> {
    check_usable(&staging, mode)?;
    Ok(staging)
}

/// Whether the state of `staging` allows credentials in `mode`: write while
/// open, read while open or failed, and neither once expired.
pub(crate) fn check_usable(staging: &Staging, mode: AccessMode) -> Result<()> {
    let id = &staging.id;
    if staging.is_expired(Utc::now()) {
        return Err(refuse(
            id,
            UploadState::Expired,
            "; open a new upload with CREATE UPLOAD",
        ));
    }
    match (staging.state, mode) {
        (UploadState::Open, _) | (UploadState::Failed, AccessMode::Read) => Ok(()),
        (UploadState::Failed, AccessMode::Write) => Err(refuse(
            id,
            UploadState::Failed,
            "; a failed upload's staging table can be read ('read' mode) but not written",
        )),
        (state, _) => Err(refuse(id, state, "")),
    }
}

/// The table credentials are vended for, and the mode used: what a
/// session's access reaches (`vend_credentials`, the REST catalog).
pub(crate) struct Grant {
    pub(crate) catalog: std::sync::Arc<IcebergCatalog>,
    pub(crate) table: iceberg::table::Table,
    pub(crate) mode: AccessMode,
    /// Where icestage placed the table (never the location its metadata
    /// claims: a client may have rewritten that).
    pub(crate) location: String,
    /// The credentials must not outlive this (the upload's expiry).
    pub(crate) until: Option<chrono::DateTime<Utc>>,
}

impl Grant {
    /// An upload's staging table in `mode` (its state checked by the caller).
    pub(crate) async fn upload(staging: &Staging, mode: AccessMode) -> Result<Self> {
        if let Some(reason) = &staging.tampered {
            return Err(Error::Tampered {
                id: staging.id.to_string(),
                reason: reason.clone(),
            });
        }
        Ok(Self {
            location: crate::upload::confine::assigned_location(staging).await?,
            until: staging.expires_at,
            catalog: std::sync::Arc::clone(&staging.catalog),
            table: staging.table.clone(),
            mode,
        })
    }

    /// Credentials for this grant lasting `duration` (cut at `until`), named
    /// `session` in the cloud's logs, and the connection properties that
    /// carry them; no credentials where none are needed (a local warehouse).
    pub(crate) async fn vend(
        &self,
        session: &str,
        duration: Duration,
    ) -> Result<(Option<VendedCredentials>, Connection)> {
        let ident = self.table.identifier();
        let credentials = credentials_for(
            &self.catalog,
            &ident.namespace().join("."),
            ident.name(),
            &self.location,
            self.mode,
            session,
            (duration, self.until),
        )
        .await?;
        let connection = connection(&self.catalog, credentials.as_ref())?;
        Ok((credentials, connection))
    }
}

/// A ready download's table, read-only.
pub(crate) fn download_grant(download: Download, mode: Option<AccessMode>) -> Result<Grant> {
    let location = download.assigned_location();
    let id = download.id.to_string();
    if mode == Some(AccessMode::Write) {
        return Err(Error::invalid(format!(
            "download '{id}' is read-only: vend_credentials('{id}', 'read')"
        )));
    }
    if download.state != DownloadState::Ready {
        return Err(Error::DownloadState {
            id: id.clone(),
            state: download.state.to_string(),
            hint: format!(
                "credentials are vended for ready downloads only; wait with wait_download('{id}')"
            ),
        });
    }
    Ok(Grant {
        catalog: download.catalog,
        table: download.table,
        mode: AccessMode::Read,
        location,
        until: None,
    })
}

result_row! {
    /// Credentials for one session's table: a row of `vend_credentials(id)`.
    /// With the embedded (local) catalog there are no keys: the connection
    /// alone reaches the table.
    #[derive(Debug, Clone, PartialEq)]
    pub struct SessionCredentials {
        /// The upload or download.
        pub id: String,
        /// `write` (append to a staging table) or `read`.
        pub mode: AccessMode,
        /// The one table the credentials reach.
        pub table_name: String,
        /// The AWS access key id, when the catalog needs one.
        pub access_key_id: Option<String>,
        /// Its secret.
        pub secret_access_key: Option<Secret>,
        /// Its session token.
        pub session_token: Option<Secret>,
        /// When they stop working.
        pub expiration: Option<DateTime<Utc>>,
        /// The AWS region.
        pub region: String,
        /// A JSON object of catalog connection properties for a client,
        /// credentials included.
        pub connection: String => json,
        /// The same connection as an icestage catalog configuration (TOML).
        pub catalog_config: String,
    }
}

/// `vend_credentials('<id>' [, mode] [, duration])`; the id is an
/// upload's or a download's (checked to have an id's shape).
#[derive(Debug)]
pub(crate) struct VendCredentials {
    pub(crate) id: String,
    pub(crate) mode: Option<AccessMode>,
    pub(crate) duration: Option<Ttl>,
}

impl Operation for VendCredentials {
    const NAME: &'static str = "VendCredentials";
    type Outcome = SessionCredentials;

    async fn run(&self, ctx: &CommandContext) -> Result<SessionCredentials> {
        vend_credentials(ctx, &self.id, self.mode, self.duration.as_ref()).await
    }
}

impl fmt::Display for VendCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "upload={}, mode={}, duration={}",
            self.id,
            self.mode.map_or("write", AccessMode::as_str),
            self.duration.as_ref().map_or("1h", Ttl::as_str)
        )
    }
}

async fn vend_credentials(
    ctx: &CommandContext,
    id: &str,
    mode: Option<AccessMode>,
    duration: Option<&Ttl>,
) -> Result<SessionCredentials> {
    let duration = vend_duration(duration)?;
    // Upload and download ids look alike: an upload's staging table, else a
    // download's table.
    let upload = UploadId::parse(id)?;
    let grant = if let Some(staging) = find_staging(&ctx.icestage, &upload).await? {
        let mode = mode.unwrap_or(AccessMode::Write);
        Grant::upload(&usable(staging, mode)?, mode).await?
    } else {
        let download = DownloadId::parse(id)?;
        match find_download(&ctx.icestage, &download).await? {
            Some(mut found) => {
                found.settle().await?;
                download_grant(found, mode)?
            }
            None => {
                if let Some(record) =
                    crate::download::status::status_of(&ctx.icestage, &download).await?
                {
                    return Err(Error::DownloadState {
                        id: download.to_string(),
                        state: record.state.to_string(),
                        hint: "credentials are vended for ready downloads only".to_string(),
                    });
                }
                // Neither: say what the upload side knows.
                return Err(match open_session(ctx, &upload, AccessMode::Write).await {
                    Err(error) => error,
                    Ok(_) => Error::UnknownUpload(upload.to_string()),
                });
            }
        }
    };
    let ident = grant.table.identifier();
    let (credentials, connection) = grant.vend(&format!("icestage-{id}"), duration).await?;
    let properties = serde_json::to_string(&connection.properties)
        .map_err(|e| Error::internal(format!("connection: {e}")))?;
    Ok(SessionCredentials {
        id: upload.to_string(),
        mode: grant.mode,
        table_name: ident.to_string(),
        access_key_id: credentials.as_ref().map(|c| c.access_key_id.clone()),
        secret_access_key: credentials.as_ref().map(|c| c.secret_access_key.clone()),
        session_token: credentials.as_ref().map(|c| c.session_token.clone()),
        expiration: credentials.as_ref().map(|c| c.expiration),
        region: grant.catalog.aws().region.clone(),
        connection: properties,
        catalog_config: connection.catalog_config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_end_with_the_upload() {
        let hour = Duration::from_secs(3600);
        assert_eq!(capped(hour, None, "x").unwrap(), hour);
        let soon = Utc::now() + chrono::Duration::minutes(30);
        let cut = capped(hour, Some(soon), "icestage-x").unwrap();
        assert!(
            cut <= Duration::from_secs(1800) && cut > Duration::from_secs(1790),
            "{cut:?}"
        );
        let too_soon = Utc::now() + chrono::Duration::minutes(10);
        let err = capped(hour, Some(too_soon), "icestage-x")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("upload 'x' expires at"), "{err}");
    }

    #[test]
    fn durations_within_sts_bounds() {
        let asked = |text: &str| Ttl::parse(text).unwrap();
        assert_eq!(vend_duration(None).unwrap(), DEFAULT_DURATION);
        assert_eq!(
            vend_duration(Some(&asked("2h"))).unwrap(),
            Duration::from_secs(7200)
        );
        let err = vend_duration(Some(&asked("5m"))).unwrap_err().to_string();
        assert!(err.contains("STS grants between 15m and 12h"), "{err}");
        assert!(vend_duration(Some(&asked("13h"))).is_err());
    }

    #[test]
    fn s3_locations() {
        assert_eq!(
            s3_location("s3://lake/wh/staging/upload_1"),
            Some(("lake", "wh/staging/upload_1"))
        );
        assert_eq!(s3_location("file:///tmp/x"), None);
    }
}
