//! Commits to a table of an Iceberg REST catalog that land on exactly the
//! version a caller checked.
//!
//! The REST protocol has no requirement that pins a metadata version: a
//! commit names requirements on the table's uuid, its refs' snapshots and
//! its schema, spec and sort-order ids, and the catalog applies it to
//! whatever version is current if they hold. A property change (a session's
//! state transition) moves none of those, so two racing transitions that
//! checked one version would both land. icestage therefore keeps a version
//! ref of its own, the branch [`VERSION_REF`]:
//!
//! * every exact commit requires `main` and [`VERSION_REF`] to point where
//!   they pointed in the version checked;
//! * an exact commit that adds no snapshot of its own (a property change, an
//!   expiry) also moves [`VERSION_REF`] to a new, empty snapshot (an empty
//!   manifest list under the table's metadata folder, operation `append`,
//!   never on `main`).
//!
//! So any two exact commits on one version conflict (one of them moves a
//! ref the other pins), and an append that checked a session's state fails
//! once a transition landed. Any catalog that implements the protocol's
//! requirements enforces it: Polaris, Lakekeeper or icestage's own.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{
    FormatVersion, MAIN_BRANCH, ManifestListWriter, Operation, Snapshot, Summary, TableMetadata,
};
use iceberg::table::Table;
use iceberg::{ErrorKind, TableIdent, TableRequirement, TableUpdate};
use iceberg_catalog_rest::{CommitTableRequest, CommitTableResponse};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};

use super::snapshot::unexpected;
use crate::error::{Error, Result};

/// The branch whose snapshot stands for the version of a table's
/// properties (see the module documentation).
pub(crate) const VERSION_REF: &str = "icestage-version";

/// The summary property that marks a [`VERSION_REF`] snapshot.
pub(crate) const PROP_VERSION_MARK: &str = "icestage.version-mark";

/// Who icestage is to a REST catalog.
#[derive(Debug, Clone)]
pub(crate) enum Bearer {
    /// No token.
    None,
    /// A token that lasts.
    Token(String),
    /// OAuth2 client credentials: a token fetched again as it ages.
    Credentials(Arc<super::oauth::ClientCredentials>),
}

/// How icestage reaches a REST catalog's commit endpoint itself.
#[derive(Clone)]
pub(crate) struct RestCommits {
    http: reqwest::Client,
    /// `<uri>/v1[/<prefix>]`.
    base: String,
    /// Where the token of each request comes from, with client
    /// credentials (a fixed token is in the client's default headers).
    credentials: Option<Arc<super::oauth::ClientCredentials>>,
}

impl std::fmt::Debug for RestCommits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the token in its default headers: never shown.
        f.debug_struct("RestCommits")
            .field("base", &self.base)
            .finish()
    }
}

/// The catalog's `{"error": {"message": ...}}`, or the body as it came.
fn server_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(500).collect())
}

impl RestCommits {
    /// Reaches the catalog at `uri` as `token` with extra `headers`
    /// (`header.<name>` settings): asks its `/v1/config` for the path
    /// prefix of `warehouse`, as every REST client does first.
    pub(crate) async fn connect(
        name: &str,
        uri: &str,
        warehouse: Option<&str>,
        bearer: Bearer,
        headers: &HashMap<String, String>,
    ) -> Result<Self> {
        let config_error =
            |what: String| Error::Config(format!("REST catalog '{name}' at '{uri}': {what}"));
        let mut defaults = HeaderMap::new();
        for (key, value) in headers {
            let header = HeaderName::from_bytes(key.as_bytes())
                .map_err(|_| config_error(format!("'header.{key}' is not a header name")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| config_error(format!("the value of 'header.{key}' is not valid")))?;
            defaults.insert(header, value);
        }
        let credentials = match &bearer {
            Bearer::Credentials(credentials) => Some(Arc::clone(credentials)),
            _ => None,
        };
        if let Bearer::Token(token) = &bearer {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| config_error("its token is not a valid header value".to_string()))?;
            value.set_sensitive(true);
            defaults.insert(AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(defaults)
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| config_error(e.to_string()))?;
        let uri = uri.trim_end_matches('/');
        let mut request = http.get(format!("{uri}/v1/config"));
        if let Some(warehouse) = warehouse {
            request = request.query(&[("warehouse", warehouse)]);
        }
        if let Some(credentials) = &credentials {
            request = request.bearer_auth(credentials.token().await?);
        }
        let response = request.send().await.map_err(|e| {
            config_error(format!(
                "cannot reach it: {e}; is the catalog running there?"
            ))
        })?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(config_error(format!(
                "GET /v1/config answered {status}: {}; check its token",
                server_message(&body)
            )));
        }
        let config: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| config_error(format!("its /v1/config is not JSON: {e}")))?;
        let setting = |key: &str| {
            config["overrides"][key]
                .as_str()
                .or_else(|| config["defaults"][key].as_str())
                .map(str::to_string)
        };
        let uri = setting("uri").unwrap_or_else(|| uri.to_string());
        let base = match setting("prefix") {
            Some(prefix) => format!("{}/v1/{prefix}", uri.trim_end_matches('/')),
            None => format!("{}/v1", uri.trim_end_matches('/')),
        };
        Ok(Self {
            http,
            base,
            credentials,
        })
    }

    /// `<base>/namespaces/<namespace>/tables/<table>`, each segment
    /// percent-encoded (a nested namespace's parts joined by U+001F).
    fn table_url(&self, table: &TableIdent) -> iceberg::Result<url::Url> {
        let mut url = url::Url::parse(&self.base)
            .map_err(|e| unexpected(format!("REST catalog URI '{}': {e}", self.base)))?;
        url.path_segments_mut()
            .map_err(|_| unexpected(format!("REST catalog URI '{}' has no path", self.base)))?
            .extend([
                "namespaces",
                &table.namespace().join("\u{1f}"),
                "tables",
                table.name(),
            ]);
        Ok(url)
    }

    /// Commits `updates` (with `requirements`) on exactly `base`'s version
    /// (see the module documentation): the table as committed, or `None`
    /// when another commit landed since `base` was loaded.
    pub(crate) async fn commit(
        &self,
        base: &Table,
        mut requirements: Vec<TableRequirement>,
        mut updates: Vec<TableUpdate>,
    ) -> iceberg::Result<Option<Table>> {
        let metadata = base.metadata();
        let ref_id = |name: &str| metadata.snapshot_for_ref(name).map(|s| s.snapshot_id());
        requirements.extend([
            TableRequirement::UuidMatch {
                uuid: metadata.uuid(),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: ref_id(MAIN_BRANCH),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: VERSION_REF.to_string(),
                snapshot_id: ref_id(VERSION_REF),
            },
        ]);
        let adds_snapshot = updates
            .iter()
            .any(|u| matches!(u, TableUpdate::AddSnapshot { .. }));
        let mut mark = None;
        if !adds_snapshot {
            let (path, mark_updates) = version_mark(base).await?;
            updates.extend(mark_updates);
            mark = Some(path);
        }
        let committed = self.send(base, requirements, updates).await;
        // A mark refused with its commit is referenced by nothing: remove it
        // (best effort). Not after an error: the commit may have landed.
        if let (Some(path), Ok(None)) = (&mark, &committed) {
            super::confine::delete_within(base.file_io(), path, base.metadata().location()).await;
        }
        committed
    }

    /// POSTs the commit; `None` on 409.
    async fn send(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> iceberg::Result<Option<Table>> {
        let ident = base.identifier().clone();
        let request = CommitTableRequest {
            identifier: Some(ident.clone()),
            requirements,
            updates,
        };
        let mut post = self.http.post(self.table_url(&ident)?).json(&request);
        if let Some(credentials) = &self.credentials {
            let token = credentials
                .token()
                .await
                .map_err(|e| unexpected(e.to_string()))?;
            post = post.bearer_auth(token);
        }
        let response = post
            .send()
            .await
            .map_err(|e| unexpected(format!("cannot commit to {ident}: {e}")))?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        if status == reqwest::StatusCode::CONFLICT {
            return Ok(None);
        }
        if !status.is_success() {
            let kind = match status.as_u16() {
                404 => ErrorKind::TableNotFound,
                _ => ErrorKind::Unexpected,
            };
            return Err(iceberg::Error::new(
                kind,
                format!(
                    "the REST catalog refused a commit to {ident} ({status}): {}",
                    server_message(&body)
                ),
            ));
        }
        let committed: CommitTableResponse = serde_json::from_str(&body).map_err(|e| {
            unexpected(format!(
                "the REST catalog's answer to a commit to {ident} is not a table: {e}"
            ))
        })?;
        super::snapshot::successor(base, committed.metadata, committed.metadata_location).map(Some)
    }
}

/// The updates that move [`VERSION_REF`] of `base` to a new empty snapshot,
/// whose manifest list is written now (its path is returned with them).
async fn version_mark(base: &Table) -> iceberg::Result<(String, Vec<TableUpdate>)> {
    let metadata: &TableMetadata = base.metadata();
    let parent = metadata
        .snapshot_for_ref(VERSION_REF)
        .map(|s| s.snapshot_id());
    let snapshot_id = super::snapshot::new_snapshot_id(metadata);
    let sequence_number = metadata.next_sequence_number();
    let path = format!(
        "{}/metadata/snap-{snapshot_id}-icestage-version.avro",
        metadata.location().trim_end_matches('/')
    );
    let output = base.file_io().new_output(&path)?;
    let writer = match metadata.format_version() {
        FormatVersion::V1 => ManifestListWriter::v1(output.writer().await?, snapshot_id, parent),
        FormatVersion::V2 => {
            ManifestListWriter::v2(output.writer().await?, snapshot_id, parent, sequence_number)
        }
        other => {
            return Err(iceberg::Error::new(
                ErrorKind::FeatureUnsupported,
                format!(
                    "{}: icestage changes tables of format {other} over a REST catalog only by \
                     appends; use format version 2",
                    base.identifier()
                ),
            ));
        }
    };
    writer.close().await?;
    // Later than every snapshot already there: catalogs refuse one older
    // than the table's last change.
    let timestamp_ms = chrono::Utc::now()
        .timestamp_millis()
        .max(metadata.last_updated_ms() + 1);
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(timestamp_ms)
        .with_manifest_list(path.clone())
        .with_summary(Summary {
            operation: Operation::Append,
            additional_properties: HashMap::from([(
                PROP_VERSION_MARK.to_string(),
                "true".to_string(),
            )]),
        })
        .with_schema_id(metadata.current_schema_id())
        .build();
    Ok((
        path,
        super::snapshot::add_as_head(snapshot, VERSION_REF).into(),
    ))
}
