//! The REST catalog as a session's token sees it: its one table and that
//! table's namespace, nothing else (another table answers 404).
//!
//! A download's token reads its table while the download is ready. An
//! upload's token loads its staging table and commits appends to it while
//! the session is open (a failed upload's table is read only); every commit
//! is checked to be an append under the table's assigned location and
//! applied by icestage on exactly the version the client built on (409
//! otherwise, which clients retry). Nothing else changes: no schema,
//! property, spec or location update, no create, drop or rename. Storage is
//! reached with vended keys for the table's folder, or by remote signing,
//! request by request ([`crate::credentials::sign`]).

use std::collections::HashMap;

use async_trait::async_trait;
use axum::http::StatusCode;
use iceberg::{NamespaceIdent, TableIdent};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
    RegisterTableRequest, RenameTableRequest, StorageCredential,
};
use serde_json::json;

use super::error::RestError;
use super::view::{
    CatalogView, CommitTransactionRequest, CommitViewRequest, CreateViewRequest,
    UpdateNamespaceProperties, ViewResult,
};
use crate::catalog::commit::append::{Refusal, apply_append, check_append};
use crate::credentials::sign::{Scope, SignRequest, SignResponse, check, sign_request};
use crate::credentials::vend::{DEFAULT_DURATION, Grant, check_usable};
use crate::service::AppState;
use crate::upload::{Staging, UploadState};

/// The endpoints a session's token is served, as `GET /v1/config` lists
/// them (clients use exactly these).
pub(super) const ENDPOINTS: &[&str] = &[
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/transactions/commit",
];

/// Where the signer answers, relative to the catalog's URI (the protocol's
/// default, which PyIceberg also assumes).
const SIGNER_ENDPOINT: &str = "v1/aws/s3/sign";

/// The session a request's token opens: its table as the catalog holds it
/// now, where icestage placed it and what the token may do (a [`Grant`]).
pub(crate) struct SessionView {
    pub(super) grant: Grant,
    /// The session's id.
    pub(super) session: String,
    /// An upload's session (appends allowed while it is open);
    /// `None` for a download (read only).
    pub(super) upload: Option<Staging>,
    /// Whether the session's storage requests are signed rather than
    /// given keys.
    pub(super) signing: bool,
    pub(super) state: AppState,
}

/// 403 for what only a catalog token may do.
fn may_not(what: &str) -> RestError {
    RestError::new(
        StatusCode::FORBIDDEN,
        "ForbiddenException",
        format!("a session's token cannot {what}: it reaches its own table only"),
    )
}

/// 501 for the view endpoints: a session's token reaches one table and no
/// views.
fn no_views() -> RestError {
    RestError::new(
        StatusCode::NOT_IMPLEMENTED,
        "NotImplementedException",
        "views are not served to a session's token: it reaches its own table only",
    )
}

impl SessionView {
    fn ident(&self) -> &TableIdent {
        self.grant.table.identifier()
    }

    /// `namespace` if it is this session's; 404 otherwise.
    fn check_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<()> {
        if namespace == self.ident().namespace() {
            Ok(())
        } else {
            Err(RestError::new(
                StatusCode::NOT_FOUND,
                "NoSuchNamespaceException",
                format!("namespace {namespace} does not exist or is not this session's"),
            ))
        }
    }

    /// `ident` if it is this session's table; 404 otherwise.
    fn check_table(&self, ident: &TableIdent) -> ViewResult<()> {
        if ident == self.ident() {
            Ok(())
        } else {
            Err(RestError::not_found(&format!("table {ident}")))
        }
    }

    /// `config` as the vended credentials of the session's table.
    fn storage_credential(&self, config: HashMap<String, String>) -> StorageCredential {
        StorageCredential {
            prefix: self.grant.location.clone(),
            config,
        }
    }

    /// The session's storage configuration with vended keys.
    async fn storage(&self) -> ViewResult<HashMap<String, String>> {
        // As vend_credentials: write keys while the upload is open.
        if let Some(staging) = &self.upload {
            check_usable(staging, self.grant.mode)?;
        }
        let session = format!("icestage-{}", self.session);
        let (credentials, connection) = self.grant.vend(&session, DEFAULT_DURATION).await?;
        let mut storage: HashMap<String, String> = connection
            .properties
            .into_iter()
            .filter(|(key, _)| key.starts_with("s3."))
            .collect();
        if let Some(expiration) = credentials.map(|c| c.expiration) {
            storage.insert(
                "s3.session-token-expires-at-ms".to_string(),
                expiration.timestamp_millis().to_string(),
            );
            // Where a client fetches fresh keys before these end (relative to
            // the catalog URI, as Iceberg's REST clients resolve it).
            let ident = self.ident();
            storage.insert(
                "client.refresh-credentials-endpoint".to_string(),
                format!(
                    "v1/namespaces/{}/tables/{}/credentials",
                    ident.namespace().join("%1F"),
                    ident.name()
                ),
            );
        }
        Ok(storage)
    }

    /// The session's storage configuration under remote signing: where the
    /// signer is, how to reach the store, and no key.
    fn signing_config(&self) -> HashMap<String, String> {
        let mut config = self.grant.catalog.aws().store_properties();
        config.extend([
            ("s3.remote-signing-enabled".to_string(), "true".to_string()),
            // PyIceberg's name for the signer it loads, and the file IO that
            // carries it (its pyarrow file IO does not sign remotely).
            ("s3.signer".to_string(), "S3V4RestSigner".to_string()),
            (
                "py-io-impl".to_string(),
                "pyiceberg.io.fsspec.FsspecFileIO".to_string(),
            ),
            ("s3.signer.uri".to_string(), self.state.rest_uri()),
            (
                "s3.signer.endpoint".to_string(),
                SIGNER_ENDPOINT.to_string(),
            ),
        ]);
        config
    }

    /// Commits `request` to the session's table: an upload's append, checked
    /// and applied on the version checked (a claim taken or an append landed
    /// since moves the pointer, and the commit conflicts). The new metadata
    /// and its location.
    async fn commit(
        &self,
        request: CommitTableRequest,
    ) -> ViewResult<(String, iceberg::spec::TableMetadata)> {
        let Some(staging) = &self.upload else {
            return Err(RestError::new(
                StatusCode::FORBIDDEN,
                "ForbiddenException",
                "this session reads its table; it cannot commit",
            ));
        };
        if staging.state != UploadState::Open {
            let hint = if staging.state == UploadState::Failed {
                format!(
                    "; its findings say why (GET /uploads/{}/findings): open a new upload with \
                     the corrected rows",
                    staging.id
                )
            } else {
                String::new()
            };
            return Err(RestError::new(
                StatusCode::CONFLICT,
                "CommitFailedException",
                format!(
                    "upload {} is {}: its rows can no longer change{hint}",
                    staging.id, staging.state
                ),
            ));
        }
        let refused = |refusal: Refusal| match refusal {
            Refusal::Invalid(message) => {
                RestError::new(StatusCode::FORBIDDEN, "ForbiddenException", message)
            }
            Refusal::Conflict(message) => {
                RestError::new(StatusCode::CONFLICT, "CommitFailedException", message)
            }
        };
        check_append(
            &self.grant.table,
            &self.grant.location,
            &request.requirements,
            &request.updates,
        )
        .map_err(refused)?;
        // Manifests that name the wrong schema in their metadata (as DuckDB
        // writes them) are rewritten now, so that every later reader can plan
        // scans of the staging table.
        let mut updates = request.updates;
        crate::catalog::manifests::normalize(&self.grant.table, &self.grant.location, &mut updates)
            .await?;
        apply_append(&self.grant.catalog, &self.grant.table, updates)
            .await?
            .map_err(refused)
    }
}

#[async_trait]
impl CatalogView for SessionView {
    fn endpoints(&self) -> Vec<&'static str> {
        ENDPOINTS.to_vec()
    }

    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> ViewResult<ListNamespaceResponse> {
        Ok(ListNamespaceResponse {
            namespaces: match parent {
                None => vec![self.ident().namespace().clone()],
                Some(_) => vec![],
            },
            next_page_token: None,
        })
    }

    async fn load_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<NamespaceResponse> {
        self.check_namespace(namespace)?;
        Ok(NamespaceResponse {
            namespace: namespace.clone(),
            properties: HashMap::new(),
        })
    }

    async fn create_namespace(&self, _: CreateNamespaceRequest) -> ViewResult<NamespaceResponse> {
        Err(may_not("create a namespace"))
    }

    async fn update_namespace_properties(
        &self,
        _: &NamespaceIdent,
        _: UpdateNamespaceProperties,
    ) -> ViewResult<serde_json::Value> {
        Err(may_not("change a namespace"))
    }

    async fn drop_namespace(&self, _: &NamespaceIdent) -> ViewResult<()> {
        Err(may_not("drop a namespace"))
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> ViewResult<ListTablesResponse> {
        self.check_namespace(namespace)?;
        Ok(ListTablesResponse {
            identifiers: vec![self.ident().clone()],
            next_page_token: None,
        })
    }

    async fn create_table(
        &self,
        _: &NamespaceIdent,
        _: CreateTableRequest,
    ) -> ViewResult<LoadTableResult> {
        Err(may_not("create a table"))
    }

    async fn register_table(
        &self,
        _: &NamespaceIdent,
        _: RegisterTableRequest,
    ) -> ViewResult<LoadTableResult> {
        Err(may_not("register a table"))
    }

    async fn load_table(&self, ident: &TableIdent) -> ViewResult<LoadTableResult> {
        self.check_table(ident)?;
        let (config, storage_credentials) = if self.signing {
            (self.signing_config(), None)
        } else {
            let config = self.storage().await?;
            let credentials = vec![self.storage_credential(config.clone())];
            (config, Some(credentials))
        };
        Ok(LoadTableResult {
            metadata_location: self.grant.table.metadata_location().map(str::to_string),
            metadata: self.grant.table.metadata().clone(),
            storage_credentials,
            config,
        })
    }

    async fn table_exists(&self, ident: &TableIdent) -> ViewResult<()> {
        self.check_table(ident)
    }

    async fn credentials(&self, ident: &TableIdent) -> ViewResult<serde_json::Value> {
        self.check_table(ident)?;
        if self.signing {
            // Signed request by request: no key to hand out.
            return Ok(json!({"storage-credentials": []}));
        }
        let config = self.storage().await?;
        Ok(json!({"storage-credentials": [self.storage_credential(config)]}))
    }

    async fn commit_table(
        &self,
        ident: &TableIdent,
        request: CommitTableRequest,
    ) -> ViewResult<CommitTableResponse> {
        self.check_table(ident)?;
        let (metadata_location, metadata) = self.commit(request).await?;
        Ok(CommitTableResponse {
            metadata_location,
            metadata,
        })
    }

    /// The multi-table commit (DuckDB uses it when it is listed): a session
    /// reaches one table, so the transaction holds one change, to that
    /// table.
    async fn commit_transaction(&self, request: CommitTransactionRequest) -> ViewResult<()> {
        let mut changes = request.table_changes;
        let (Some(change), true) = (changes.pop(), changes.is_empty()) else {
            return Err(RestError::new(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                "a session's transaction changes exactly one table, its own",
            ));
        };
        match &change.identifier {
            Some(ident) => self.check_table(ident)?,
            None => {
                return Err(RestError::new(
                    StatusCode::BAD_REQUEST,
                    "BadRequestException",
                    "each table change of a transaction names its table (identifier)",
                ));
            }
        }
        self.commit(change).await.map(|_| ())
    }

    async fn drop_table(&self, _: &TableIdent, _: bool) -> ViewResult<()> {
        Err(may_not("drop a table"))
    }

    async fn rename_table(&self, _: RenameTableRequest) -> ViewResult<()> {
        Err(may_not("rename a table"))
    }

    async fn list_views(&self, _: &NamespaceIdent) -> ViewResult<ListTablesResponse> {
        Err(no_views())
    }

    async fn create_view(
        &self,
        _: &NamespaceIdent,
        _: CreateViewRequest,
    ) -> ViewResult<serde_json::Value> {
        Err(no_views())
    }

    async fn load_view(&self, _: &TableIdent) -> ViewResult<serde_json::Value> {
        Err(no_views())
    }

    async fn view_exists(&self, _: &TableIdent) -> ViewResult<()> {
        Err(no_views())
    }

    async fn replace_view(
        &self,
        _: &TableIdent,
        _: CommitViewRequest,
    ) -> ViewResult<serde_json::Value> {
        Err(no_views())
    }

    async fn drop_view(&self, _: &TableIdent) -> ViewResult<()> {
        Err(no_views())
    }

    async fn rename_view(&self, _: RenameTableRequest) -> ViewResult<()> {
        Err(no_views())
    }

    /// Signs one storage request of the session with the service's
    /// credentials, if the session may make it now; 403 naming the request
    /// otherwise.
    async fn sign(&self, request: SignRequest) -> ViewResult<SignResponse> {
        let signature = |outcome: &'static str| {
            crate::metrics::count(
                "icestage_storage_signatures_total",
                "Storage requests the REST catalog was asked to sign, by outcome.",
                &[("outcome", outcome)],
                1.0,
            );
        };
        let refused = |why: String| {
            signature("refused");
            RestError::new(StatusCode::FORBIDDEN, "ForbiddenException", why)
        };
        // Writes while the upload is open; a download's reads while it is
        // ready (its token is refused otherwise); nothing for an upload that
        // is no longer open.
        let write = match &self.upload {
            Some(staging) if staging.state == UploadState::Open => true,
            Some(staging) => {
                return Err(refused(format!(
                    "upload {} is {}: its storage requests are no longer signed",
                    staging.id, staging.state
                )));
            }
            None => false,
        };
        // A download reads, besides its table, the files its rows name.
        let named = match &self.upload {
            Some(_) => None,
            None => Some(self.state.named_files(&self.grant).await?),
        };
        let aws = self.grant.catalog.aws();
        let scope = Scope {
            location: &self.grant.location,
            write,
            reads: named.as_deref(),
        };
        let allowed = check(&scope, aws, &request).map_err(refused)?;
        let credentials = self.state.signing_credentials(&self.grant.catalog).await?;
        let signed = sign_request(
            &request,
            &allowed,
            &credentials,
            &aws.region,
            std::time::SystemTime::now(),
        )
        .map_err(|e| {
            RestError::new(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                format!("the request cannot be signed: {e}"),
            )
        })?;
        signature("signed");
        Ok(signed)
    }
}
