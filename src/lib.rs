#![doc = include_str!("../README.md")]
#![deny(clippy::clone_on_ref_ptr)]
#![warn(missing_docs)]

mod api;
mod aws;
mod catalog;
pub mod cluster;
mod config;
mod context;
mod credentials;
mod download;
mod error;
mod expiry;
mod functions;
#[doc(hidden)]
pub mod fuzz;
mod ingest;
pub mod limits;
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

pub use api::Operations;
pub use catalog::IcebergCatalog;
pub use catalog::Icestage;
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
pub use expiry::{ExpireOptions, SnapshotsExpired, StagingExpired};
pub use ingest::copy_into::CopyReport;
pub use ingest::{Compression, Format, OnError, SourceOptions};
pub use pipe::run::PipeRun;
pub use pipe::{
    CreatePipe, PIPE_TABLE_PREFIX, PipeName, PipeOptions, PipeRunRecord, PipeState, PipeStatus,
};
pub use progress::{Progress, ProgressSink};
pub use rows::ResultRow;
pub use secret::Secret;
pub use session::log::{ICESTAGE_NAMESPACE, UPLOAD_LOG_TABLE};
pub use tables::maintain::ManifestsRewritten;
pub use tables::rules::TableConstraint;
pub use upload::abort::UploadAborted;
pub use upload::create::{UploadOpened, UploadOptions};
pub use upload::promote::{PromoteOptions, Promotion, TransferPath};
pub use upload::status::{UploadFinding, UploadStatus};
pub use upload::validation::Verify;
pub use upload::{
    PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_MESSAGE, PROP_STATE, PROP_TARGET, PROP_UPLOAD_ID,
    SNAPSHOT_UPLOAD_ID, STAGING_NAMESPACE, UploadId, UploadState,
};
