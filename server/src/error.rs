//! The server's errors: a stable machine-readable code, shared by the API, the clients and
//! the documentation, and a message that says what the user should do. The HTTP statuses are
//! the HTTP layer's business (`http::error`); the registry and the rest of the domain know
//! nothing of HTTP.

/// The machine-readable error codes (the HTTP layer gives each its status: `http::error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidRequest,
    Unauthorized,
    PathNotAllowed,
    DatasetNotFound,
    JobNotFound,
    NotFound,
    DatasetExists,
    JobExists,
    DatasetInUse,
    DatasetNotReady,
    EmptySubset,
    VersionMismatch,
    TooLarge,
    CacheFull,
    ShuttingDown,
    Internal,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::Unauthorized => "unauthorized",
            Code::PathNotAllowed => "path_not_allowed",
            Code::DatasetNotFound => "dataset_not_found",
            Code::JobNotFound => "job_not_found",
            Code::NotFound => "not_found",
            Code::DatasetExists => "dataset_exists",
            Code::JobExists => "job_exists",
            Code::DatasetInUse => "dataset_in_use",
            Code::DatasetNotReady => "dataset_not_ready",
            Code::EmptySubset => "empty_subset",
            Code::VersionMismatch => "version_mismatch",
            Code::TooLarge => "too_large",
            Code::CacheFull => "cache_full",
            Code::ShuttingDown => "shutting_down",
            Code::Internal => "internal",
        }
    }
}

/// An error of the server: a code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An internal error (a bug or a broken invariant, never the user's input).
    pub fn internal(e: impl std::fmt::Display) -> Self {
        Self::new(Code::Internal, e.to_string())
    }

    pub fn dataset_not_found(name: &str) -> Self {
        Self::new(Code::DatasetNotFound, format!("no dataset named '{name}'"))
    }

    pub fn job_not_found(name: &str) -> Self {
        Self::new(Code::JobNotFound, format!("no job named '{name}'"))
    }
}

pub type Result<T> = std::result::Result<T, Error>;
