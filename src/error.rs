//! The crate's one error type.
//!
//! Error text is part of the contract: every message names the object, quotes
//! the bad value and says what to do instead. Errors from Arrow, DataFusion
//! and IO stay native when converted to [`DataFusionError`]; the rest become
//! [`DataFusionError::External`].

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Result type used throughout icestage.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in icestage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A string that cannot be an upload id (ids are 32 lowercase hex characters).
    #[error(
        "'{0}' is not an upload id: upload ids are the 32 hex characters returned by CREATE UPLOAD \
         (see SELECT upload_id FROM uploads())"
    )]
    InvalidUploadId(String),

    /// No catalog knows the upload, and no record of it exists.
    #[error(
        "upload '{0}' does not exist: check the id returned by CREATE UPLOAD, \
         or list uploads with SELECT * FROM uploads()"
    )]
    UnknownUpload(String),

    /// No catalog knows the download, and no record of it exists.
    #[error(
        "download '{0}' does not exist: check the id returned by CREATE DOWNLOAD, or list \
         downloads with SELECT * FROM downloads()"
    )]
    UnknownDownload(String),

    /// The upload was aborted or expired; its rows were discarded.
    #[error(
        "upload '{id}' was {state} and its staged rows were discarded: \
         open a new upload with CREATE UPLOAD FOR {target}"
    )]
    UploadClosed {
        /// Upload id.
        id: String,
        /// `aborted` or `expired`.
        state: String,
        /// The target table of the upload.
        target: String,
    },

    /// The upload cannot change state from where it is.
    #[error("upload '{id}' is {state}: {hint}")]
    UploadState {
        /// Upload id.
        id: String,
        /// Its current state.
        state: String,
        /// What the user can do.
        hint: String,
    },

    /// The download cannot serve the request in its state.
    #[error("download '{id}' is {state}: {hint}")]
    DownloadState {
        /// Download id.
        id: String,
        /// Its current state.
        state: String,
        /// What the user can do.
        hint: String,
    },

    /// Validation of the staged rows failed; the target was not touched.
    #[error(
        "upload '{id}' failed validation against {target}, the target is unchanged: {}; \
         the staging table {staging} is kept for inspection (SELECT * FROM upload_status('{id}'))",
        reasons.join("; ")
    )]
    ValidationFailed {
        /// Upload id.
        id: String,
        /// Target table.
        target: String,
        /// Staging table.
        staging: String,
        /// One line per problem found.
        reasons: Vec<String>,
    },

    /// A client changed what only icestage may write: a session's sealed
    /// properties, or a staging table's location or paths.
    #[error(
        "upload '{id}' cannot be promoted: {reason}; the target is unchanged. \
         ABORT UPLOAD '{id}' discards it; open a new upload to send the rows again"
    )]
    Tampered {
        /// Upload id.
        id: String,
        /// What was changed.
        reason: String,
    },

    /// A table that a statement refers to does not exist.
    #[error("table '{table}' does not exist{hint}")]
    TableNotFound {
        /// The name as the user wrote it, qualified.
        table: String,
        /// What to do instead, starting with `: `, or empty.
        hint: String,
    },

    /// A catalog name that is not configured.
    #[error("catalog '{name}' is not configured: configured catalogs are {available}")]
    UnknownCatalog {
        /// The name as written.
        name: String,
        /// Comma-separated list of configured catalog names.
        available: String,
    },

    /// A statement or argument that icestage understands but the value is wrong.
    #[error("{0}")]
    InvalidInput(String),

    /// Another process changed what the statement works on; nothing was
    /// changed by this one.
    #[error("{0}")]
    Conflict(String),

    /// Bad configuration (catalog TOML, command line).
    #[error("configuration error: {0}")]
    Config(String),

    /// The statement parsed but icestage does not support it.
    #[error("{0}")]
    NotSupported(String),

    /// A defect in icestage: a state its own code should never reach,
    /// whatever the request (DataFusion's `internal_err!`).
    #[error(
        "internal error: {0}: this is a defect in icestage, not in the request; please report \
         it with this message"
    )]
    Internal(String),

    /// An error from the Iceberg library.
    #[error("{}", iceberg_message(.0))]
    Iceberg(#[from] iceberg::Error),

    /// An error from DataFusion.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),

    /// An error from Arrow.
    #[error(transparent)]
    Arrow(#[from] ArrowError),

    /// A filesystem error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Iceberg errors print their kind and a long context chain; keep the message
/// and the innermost source, which is what a user can act on.
fn iceberg_message(error: &iceberg::Error) -> String {
    let mut message = format!("iceberg: {}", error.message());
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        if inner.source().is_none() {
            message.push_str(&format!(" ({inner})"));
        }
        source = inner.source();
    }
    message
}

/// What kind of failure an [`Error`] is: what a caller can do about it.
/// Front ends map kinds (never message text) to their own codes, e.g. HTTP
/// statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is wrong: change it.
    User,
    /// What the request names does not exist.
    NotFound,
    /// The object is not in a state that allows the request (or another
    /// process changed it): look at its state, then retry or stop.
    Conflict,
    /// A system icestage depends on (a catalog, storage, STS) failed: retry.
    Upstream,
    /// A defect in icestage.
    Internal,
}

/// Runs `work` as a task of its own, so that the CPU work of several such
/// tasks spreads over the runtime's threads; a task that panicked or was
/// cancelled is an internal error naming it (`what`).
pub(crate) async fn on_own_task<T: Send + 'static>(
    what: &str,
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(work)
        .await
        .map_err(|e| Error::internal(format!("{what}: {e}")))?
}

impl Error {
    /// The kind of failure, for front ends that map errors to codes.
    pub fn kind(&self) -> ErrorKind {
        match self.root() {
            Error::InvalidUploadId(_)
            | Error::InvalidInput(_)
            | Error::Config(_)
            | Error::NotSupported(_)
            | Error::UnknownCatalog { .. } => ErrorKind::User,
            Error::UnknownUpload(_) | Error::UnknownDownload(_) | Error::TableNotFound { .. } => {
                ErrorKind::NotFound
            }
            Error::UploadClosed { .. }
            | Error::UploadState { .. }
            | Error::DownloadState { .. }
            | Error::ValidationFailed { .. }
            | Error::Tampered { .. }
            | Error::Conflict(_) => ErrorKind::Conflict,
            Error::Iceberg(e) => match e.kind() {
                iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound => {
                    ErrorKind::NotFound
                }
                iceberg::ErrorKind::TableAlreadyExists
                | iceberg::ErrorKind::NamespaceAlreadyExists
                | iceberg::ErrorKind::CatalogCommitConflicts => ErrorKind::Conflict,
                iceberg::ErrorKind::DataInvalid | iceberg::ErrorKind::FeatureUnsupported => {
                    ErrorKind::User
                }
                _ => ErrorKind::Upstream,
            },
            Error::Io(_) => ErrorKind::Upstream,
            Error::Arrow(_) | Error::Internal(_) => ErrorKind::Internal,
            Error::DataFusion(e) => match e.find_root() {
                DataFusionError::Plan(_)
                | DataFusionError::SQL(..)
                | DataFusionError::SchemaError(..)
                | DataFusionError::NotImplemented(_)
                | DataFusionError::Configuration(_) => ErrorKind::User,
                DataFusionError::ObjectStore(_) | DataFusionError::IoError(_) => {
                    ErrorKind::Upstream
                }
                DataFusionError::ResourcesExhausted(_) => ErrorKind::Upstream,
                DataFusionError::External(inner) => match inner.downcast_ref::<iceberg::Error>() {
                    Some(e) => Error::Iceberg(clone_iceberg(e)).kind(),
                    None => ErrorKind::Internal,
                },
                _ => ErrorKind::Internal,
            },
        }
    }

    /// The one-line message a user sees: icestage's own text, or for an
    /// error that went through DataFusion, [`error_message`].
    pub fn user_message(&self) -> String {
        match self {
            Error::DataFusion(e) => error_message(e),
            other => other.to_string(),
        }
    }

    /// The icestage error inside, when this one only carries it through
    /// DataFusion; `self` otherwise.
    pub fn root(&self) -> &Error {
        if let Error::DataFusion(e) = self
            && let DataFusionError::External(inner) = e.find_root()
            && let Some(ours) = inner.downcast_ref::<Error>()
        {
            return ours.root();
        }
        self
    }

    /// Shorthand for [`Error::InvalidInput`].
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidInput(message.into())
    }

    /// [`Error::Internal`]: a defect, never the request's fault.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }
}

/// An iceberg error of the same kind and message (iceberg errors do not
/// clone), for [`Error::kind`].
fn clone_iceberg(error: &iceberg::Error) -> iceberg::Error {
    iceberg::Error::new(error.kind(), error.message().to_string())
}

impl From<Error> for DataFusionError {
    fn from(error: Error) -> Self {
        match error {
            Error::DataFusion(e) => e,
            Error::Arrow(e) => DataFusionError::ArrowError(Box::new(e), None),
            Error::Io(e) => DataFusionError::IoError(e),
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// The one-line message a user sees for an error that went through DataFusion.
///
/// DataFusion prefixes wrapped errors ("External error: ..."); for errors that
/// icestage raised, this returns icestage's own text, otherwise DataFusion's
/// message without the backtrace.
pub fn error_message(error: &DataFusionError) -> String {
    let root = error.find_root();
    if let DataFusionError::External(inner) = root {
        if let Some(ours) = inner.downcast_ref::<Error>() {
            return ours.to_string();
        }
        if let Some(iceberg) = inner.downcast_ref::<iceberg::Error>() {
            return iceberg_message(iceberg);
        }
        return inner.to_string();
    }
    let message = root.strip_backtrace();
    // Arrow's words when INSERT ... VALUES gives a NOT NULL column a NULL.
    if message.contains("is declared as non-nullable but contains null values") {
        return format!(
            "{message}: a NOT NULL column was given NULL (in INSERT ... VALUES, 'columnN' is \
             the N-th value of each row); give it a value in every row"
        );
    }
    message
}
