//! [`StorageError`]: why indexing or reading failed, with a stable code per kind.

use std::io;
use std::path::{Path, PathBuf};

/// Why indexing or reading failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("path {} is outside the allowed roots", path.display())]
    OutsideRoots { path: PathBuf },
    #[error("not found: {}", path.display())]
    NotFound { path: PathBuf },
    #[error("not a directory: {}", path.display())]
    NotADirectory { path: PathBuf },
    #[error("the dataset is empty: no image found")]
    Empty,
    #[error("bad manifest {} line {line}: {reason}", path.display())]
    BadManifest {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("bad shard {}: {reason}", path.display())]
    BadShard { path: PathBuf, reason: String },
    /// A path pattern (glob or braces) that cannot be read.
    #[error("bad path pattern {pattern}: {reason}")]
    BadPattern { pattern: String, reason: String },
    /// A path pattern, or a dataset folder's split, that names no file.
    #[error("{pattern} matches no `.{ext}` file (nor folder)")]
    NoMatch { pattern: String, ext: String },
    #[error("bad Parquet file {}: {reason}", path.display())]
    BadParquet { path: PathBuf, reason: String },
    #[error("bad array {}: {reason}", path.display())]
    BadArray { path: PathBuf, reason: String },
    #[error("bad label for {what}: {reason}")]
    BadLabel { what: String, reason: String },
    /// Items that cannot be appended to the dataset (`DatasetIndex::appended`).
    #[error("cannot append: {reason}")]
    CannotAppend { reason: String },
    /// A declaration of fields the source kind cannot follow.
    #[error("bad fields: {reason}")]
    BadFields { reason: String },
    /// A sample lacks a declared field (indexing).
    #[error("{key}: no member or value for the declared field `{field}`")]
    MissingField { key: String, field: String },
    /// An element's field is not what its kind says (reading).
    #[error("{what}: field `{field}` is {reason}")]
    BadField {
        what: String,
        field: String,
        reason: String,
    },
    #[error("too many items: a dataset holds at most {} items", u32::MAX)]
    TooManyItems,
    #[error("no item {id}: the dataset has {len} items")]
    NoSuchItem { id: u32, len: usize },
    #[error("cannot read {}: {source}", path.display())]
    ReadFailed {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("i/o error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{url} may not be read: {reason}")]
    S3NotAllowed { url: String, reason: String },
    /// An `s3` source that names no valid url, endpoint or region.
    #[error("invalid s3 source: {reason}")]
    S3Invalid { reason: String },
    #[error("endpoint {endpoint} may not be used: {reason}")]
    S3EndpointNotAllowed { endpoint: String, reason: String },
    #[error("no credentials for the object store: {reason}")]
    S3Credentials { reason: String },
    #[error("{url}: {message}")]
    Remote {
        url: String,
        /// `not_found`, `access_denied`, `refused` (another 4xx), `unavailable` (5xx,
        /// connection or timeouts past the retry budget), `s3_config`.
        code: &'static str,
        message: String,
    },
}

impl StorageError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StorageError::OutsideRoots { .. } => "outside_roots",
            StorageError::NotFound { .. } => "not_found",
            StorageError::NotADirectory { .. } => "not_a_directory",
            StorageError::Empty => "empty_dataset",
            StorageError::BadManifest { .. } => "bad_manifest",
            StorageError::BadShard { .. } => "bad_shard",
            StorageError::BadParquet { .. } => "bad_parquet",
            StorageError::BadArray { .. } => "bad_array",
            StorageError::BadPattern { .. } => "bad_pattern",
            StorageError::NoMatch { .. } => "no_match",
            StorageError::BadLabel { .. } => "bad_label",
            StorageError::CannotAppend { .. } => "cannot_append",
            StorageError::BadFields { .. } => "bad_fields",
            StorageError::MissingField { .. } => "missing_field",
            StorageError::BadField { .. } => "bad_field",
            StorageError::TooManyItems => "too_many_items",
            StorageError::NoSuchItem { .. } => "no_such_item",
            StorageError::ReadFailed { .. } => "read_failed",
            StorageError::Io { .. } => "io_error",
            StorageError::S3NotAllowed { .. } => "s3_not_allowed",
            StorageError::S3Invalid { .. } => "invalid_s3_source",
            StorageError::S3EndpointNotAllowed { .. } => "endpoint_not_allowed",
            StorageError::S3Credentials { .. } => "no_credentials",
            StorageError::Remote {
                code: "not_found", ..
            } => "not_found",
            StorageError::Remote { code, .. } => match *code {
                "access_denied" => "access_denied",
                "unavailable" => "s3_unavailable",
                "s3_config" => "s3_config",
                _ => "s3_refused",
            },
        }
    }

    /// An I/O error met while indexing `path`.
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        Self::missing_or(path, source, |path, source| StorageError::Io {
            path,
            source,
        })
    }

    /// An I/O error met while reading an item from `path`.
    pub(crate) fn read(path: &Path, source: io::Error) -> Self {
        Self::missing_or(path, source, |path, source| StorageError::ReadFailed {
            path,
            source,
        })
    }

    /// `NotFound` when `source` says `path` is missing, else `other`.
    pub(crate) fn missing_or(
        path: &Path,
        source: io::Error,
        other: fn(PathBuf, io::Error) -> Self,
    ) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            StorageError::NotFound {
                path: path.to_owned(),
            }
        } else {
            other(path.to_owned(), source)
        }
    }
}
