#![doc = include_str!("../README.md")]

mod aws;
mod catalog;
pub mod cluster;
mod config;
mod context;
mod credentials;
mod download;
mod error;
mod functions;
#[doc(hidden)]
pub mod fuzz;
mod ingest;
pub mod limits;
pub mod memory;
mod metrics;
mod operations;
mod pipe;
mod plan;
#[cfg(feature = "cluster")]
pub mod processes;
mod progress;
mod rows;
mod secret;
pub mod service;
mod session;
pub mod sql;
mod tables;
mod upload;

pub use catalog::Catalogs;
pub use catalog::IcebergCatalog;
pub use config::{
    CatalogConfig, EMBEDDED_CATALOG_FILE, EMBEDDED_CATALOG_NAME, IcestageConfig, IcestageOptions,
    Ttl, parse_duration,
};
pub use context::{execute_statement, register, sql};
pub use credentials::AccessMode;
pub use credentials::vend::SessionCredentials;
pub use download::create::{DownloadOpened, DownloadOptions};
pub use download::status::{DownloadDropped, DownloadStatus};
pub use download::{DownloadId, DownloadState};
pub use error::{Error, ErrorKind, Result, error_message};
pub use ingest::copy_into::CopyReport;
pub use ingest::rejects::{CopyError, CopyPreview, CopyReject};
pub use ingest::{
    Compression, Format, MatchByName, OnError, Pattern, SchemaEvolution, SourceOptions,
    ValidationMode,
};
pub use operations::Operations;
pub use pipe::run::PipeRun;
pub use pipe::{
    CreatePipe, PIPE_TABLE_PREFIX, PipeName, PipeOptions, PipeRunRecord, PipeState, PipeStatus,
};
pub use progress::{Progress, ProgressSink};
pub use rows::{ResultRow, has_json_columns, json_rows};
pub use secret::Secret;
pub use session::expire::StagingExpired;
pub use session::log::{ICESTAGE_NAMESPACE, UPLOAD_LOG_TABLE};
pub use tables::expire::{ExpireOptions, SnapshotsExpired};
pub use tables::files::PROP_FILE_COLUMNS;
pub use tables::maintain::{
    DataFilesRewritten, ManifestsRewritten, OrphanFilesRemoved, OrphanOptions, RewriteDataOptions,
};
pub use tables::rules::TableConstraint;
pub use upload::abort::UploadAborted;
pub use upload::create::{UploadOpened, UploadOptions};
pub use upload::promote::{PromoteMode, PromoteOptions, Promotion, TransferPath};
pub use upload::publish::Published;
pub use upload::status::{UploadFinding, UploadStatus};
pub use upload::validation::Verify;
pub use upload::{
    PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_MESSAGE, PROP_STATE, PROP_TARGET, PROP_UPLOAD_ID,
    SNAPSHOT_UPLOAD_ID, STAGING_NAMESPACE, UploadId, UploadState,
};

/// The book's pages (`docs/src`), compiled as doctests so that their Rust
/// examples run with the crate's tests; `tests/it/docs.rs` checks the rest.
#[cfg(doctest)]
pub mod book {
    #[doc = include_str!("../docs/src/ARCHITECTURE.md")]
    pub struct Architecture;
    #[doc = include_str!("../docs/src/CONTRIBUTING.md")]
    pub struct Contributing;
    #[doc = include_str!("../docs/src/concepts/exactly-once.md")]
    pub struct ConceptsExactlyOnce;
    #[doc = include_str!("../docs/src/concepts/scale-and-maintenance.md")]
    pub struct ConceptsScaleAndMaintenance;
    #[doc = include_str!("../docs/src/concepts/threat-model.md")]
    pub struct ConceptsThreatModel;
    #[doc = include_str!("../docs/src/concepts/trust-boundary.md")]
    pub struct ConceptsTrustBoundary;
    #[doc = include_str!("../docs/src/guide/aws.md")]
    pub struct GuideAws;
    #[doc = include_str!("../docs/src/guide/cluster.md")]
    pub struct GuideCluster;
    #[doc = include_str!("../docs/src/guide/copy-into.md")]
    pub struct GuideCopyInto;
    #[doc = include_str!("../docs/src/guide/deploy.md")]
    pub struct GuideDeploy;
    #[doc = include_str!("../docs/src/guide/downloads.md")]
    pub struct GuideDownloads;
    #[doc = include_str!("../docs/src/guide/embedding.md")]
    pub struct GuideEmbedding;
    #[doc = include_str!("../docs/src/guide/getting-started.md")]
    pub struct GuideGettingStarted;
    #[doc = include_str!("../docs/src/guide/pipes.md")]
    pub struct GuidePipes;
    #[doc = include_str!("../docs/src/guide/service.md")]
    pub struct GuideService;
    #[doc = include_str!("../docs/src/guide/shell.md")]
    pub struct GuideShell;
    #[doc = include_str!("../docs/src/guide/upload-flow.md")]
    pub struct GuideUploadFlow;
    #[doc = include_str!("../docs/src/introduction.md")]
    pub struct Introduction;
    #[doc = include_str!("../docs/src/reference/errors.md")]
    pub struct ReferenceErrors;
    #[doc = include_str!("../docs/src/reference/settings.md")]
    pub struct ReferenceSettings;
    #[doc = include_str!("../docs/src/reference/statements.md")]
    pub struct ReferenceStatements;
}
