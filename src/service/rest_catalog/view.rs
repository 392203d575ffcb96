//! The one view of the REST catalog every bearer has ([`CatalogView`]),
//! and the protocol's request bodies it takes that iceberg's REST crate
//! does not define. The routes (`super`) parse the path and the body, ask
//! the bearer's view and write its answer; what a bearer may see and do is
//! the view's alone:
//!
//! - [`super::session_view::SessionView`]: an upload's or a download's
//!   token, its one table;
//! - [`super::token_view::TokenView`]: an API token with the `catalog`
//!   operation, the tables its `tables` reach.
//!
//! Every method answers, in the protocol's error shape, even where the
//! answer is a refusal: no endpoint is left to a default.

use std::collections::HashMap;

use async_trait::async_trait;
use iceberg::spec::{Schema, ViewVersion};
use iceberg::{NamespaceIdent, TableIdent, ViewUpdate};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
    RegisterTableRequest, RenameTableRequest,
};

use super::error::RestError;
use crate::credentials::sign::{SignRequest, SignResponse};

/// What a view answers: the protocol's answer, or its error.
pub(crate) type ViewResult<T> = std::result::Result<T, RestError>;

/// A bearer's view of the REST catalog: one method per endpoint, each
/// with the path's identifiers parsed and the body read.
#[async_trait]
pub(crate) trait CatalogView: Send + Sync {
    /// The endpoints this bearer is served, as `GET /v1/config` lists
    /// them (clients call exactly these).
    fn endpoints(&self) -> Vec<&'static str>;

    /// `GET /v1/namespaces?parent=`.
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> ViewResult<ListNamespaceResponse>;

    /// `GET /v1/namespaces/{namespace}`.
    async fn load_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<NamespaceResponse>;

    /// `HEAD /v1/namespaces/{namespace}`: whether it loads.
    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> ViewResult<()> {
        self.load_namespace(namespace).await.map(|_| ())
    }

    /// `POST /v1/namespaces`.
    async fn create_namespace(
        &self,
        request: CreateNamespaceRequest,
    ) -> ViewResult<NamespaceResponse>;

    /// `POST /v1/namespaces/{namespace}/properties`.
    async fn update_namespace_properties(
        &self,
        namespace: &NamespaceIdent,
        request: UpdateNamespaceProperties,
    ) -> ViewResult<serde_json::Value>;

    /// `DELETE /v1/namespaces/{namespace}`.
    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> ViewResult<()>;

    /// `GET /v1/namespaces/{namespace}/tables`.
    async fn list_tables(&self, namespace: &NamespaceIdent) -> ViewResult<ListTablesResponse>;

    /// `POST /v1/namespaces/{namespace}/tables`.
    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        request: CreateTableRequest,
    ) -> ViewResult<LoadTableResult>;

    /// `POST /v1/namespaces/{namespace}/register`.
    async fn register_table(
        &self,
        namespace: &NamespaceIdent,
        request: RegisterTableRequest,
    ) -> ViewResult<LoadTableResult>;

    /// `GET /v1/namespaces/{namespace}/tables/{table}`.
    async fn load_table(&self, ident: &TableIdent) -> ViewResult<LoadTableResult>;

    /// `HEAD /v1/namespaces/{namespace}/tables/{table}`.
    async fn table_exists(&self, ident: &TableIdent) -> ViewResult<()>;

    /// `GET /v1/namespaces/{namespace}/tables/{table}/credentials`.
    async fn credentials(&self, ident: &TableIdent) -> ViewResult<serde_json::Value>;

    /// `POST /v1/namespaces/{namespace}/tables/{table}`.
    async fn commit_table(
        &self,
        ident: &TableIdent,
        request: CommitTableRequest,
    ) -> ViewResult<CommitTableResponse>;

    /// `POST /v1/transactions/commit`.
    async fn commit_transaction(&self, request: CommitTransactionRequest) -> ViewResult<()>;

    /// `DELETE /v1/namespaces/{namespace}/tables/{table}?purgeRequested=`.
    async fn drop_table(&self, ident: &TableIdent, purge: bool) -> ViewResult<()>;

    /// `POST /v1/tables/rename`.
    async fn rename_table(&self, request: RenameTableRequest) -> ViewResult<()>;

    /// `GET /v1/namespaces/{namespace}/views`.
    async fn list_views(&self, namespace: &NamespaceIdent) -> ViewResult<ListTablesResponse>;

    /// `POST /v1/namespaces/{namespace}/views`.
    async fn create_view(
        &self,
        namespace: &NamespaceIdent,
        request: CreateViewRequest,
    ) -> ViewResult<serde_json::Value>;

    /// `GET /v1/namespaces/{namespace}/views/{view}`.
    async fn load_view(&self, ident: &TableIdent) -> ViewResult<serde_json::Value>;

    /// `HEAD /v1/namespaces/{namespace}/views/{view}`.
    async fn view_exists(&self, ident: &TableIdent) -> ViewResult<()>;

    /// `POST /v1/namespaces/{namespace}/views/{view}`.
    async fn replace_view(
        &self,
        ident: &TableIdent,
        request: CommitViewRequest,
    ) -> ViewResult<serde_json::Value>;

    /// `DELETE /v1/namespaces/{namespace}/views/{view}`.
    async fn drop_view(&self, ident: &TableIdent) -> ViewResult<()>;

    /// `POST /v1/views/rename`.
    async fn rename_view(&self, request: RenameTableRequest) -> ViewResult<()>;

    /// `POST /v1/aws/s3/sign`: one storage request signed, if this bearer
    /// may make it now.
    async fn sign(&self, request: SignRequest) -> ViewResult<SignResponse>;
}

/// The body of `POST /v1/transactions/commit`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CommitTransactionRequest {
    pub(super) table_changes: Vec<CommitTableRequest>,
}

/// `POST .../namespaces/{namespace}/views`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CreateViewRequest {
    pub(super) name: String,
    #[serde(default)]
    pub(super) location: Option<String>,
    pub(super) schema: Schema,
    pub(super) view_version: ViewVersion,
    #[serde(default)]
    pub(super) properties: HashMap<String, String>,
}

/// `POST .../views/{view}`: a view's changes, applied if its requirements
/// hold.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CommitViewRequest {
    #[serde(default)]
    pub(super) identifier: Option<TableIdent>,
    #[serde(default)]
    pub(super) requirements: Vec<ViewRequirement>,
    pub(super) updates: Vec<ViewUpdate>,
}

/// What a view commit may require (the protocol's one requirement).
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub(crate) enum ViewRequirement {
    AssertViewUuid { uuid: uuid::Uuid },
}

/// `POST .../namespaces/{namespace}/properties`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateNamespaceProperties {
    #[serde(default)]
    pub(super) removals: Option<Vec<String>>,
    #[serde(default)]
    pub(super) updates: Option<HashMap<String, String>>,
}
