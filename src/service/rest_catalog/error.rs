//! The Iceberg REST protocol's error answer, what every view of the
//! catalog answers with. A leaf.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The error type of [`RestError::not_ready`].
const NOT_READY: &str = "NotReadyException";

/// An error as the REST protocol returns it: `{"error": {"message", "type",
/// "code"}}`; clients map the code to their exceptions (409 is a retryable
/// commit failure).
#[derive(Debug)]
pub(crate) struct RestError {
    pub(super) status: StatusCode,
    kind: &'static str,
    message: String,
}

impl RestError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    /// A download's table asked for before it is ready: its token is
    /// good, and the catalog's configuration is answered.
    pub(super) fn not_ready(message: String) -> Self {
        Self::new(StatusCode::FORBIDDEN, NOT_READY, message)
    }

    pub(super) fn is_not_ready(&self) -> bool {
        self.kind == NOT_READY
    }

    pub(super) fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchTableException",
            format!("{what} does not exist or is not this session's"),
        )
    }
}

impl From<crate::error::Error> for RestError {
    fn from(error: crate::error::Error) -> Self {
        use crate::error::ErrorKind;
        let (status, kind) = match error.kind() {
            ErrorKind::User => (StatusCode::BAD_REQUEST, "BadRequestException"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "NoSuchTableException"),
            ErrorKind::Conflict => (StatusCode::CONFLICT, "CommitFailedException"),
            ErrorKind::Upstream => (StatusCode::BAD_GATEWAY, "ServiceUnavailableException"),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError"),
        };
        Self::new(status, kind, error.user_message())
    }
}

impl From<iceberg::Error> for RestError {
    fn from(error: iceberg::Error) -> Self {
        crate::error::Error::from(error).into()
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "code": self.status.as_u16()}});
        (self.status, Json(body)).into_response()
    }
}
