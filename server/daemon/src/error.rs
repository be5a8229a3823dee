//! The server's errors: a stable machine-readable code, shared by the API, the clients and
//! the documentation, and a message that says what the user should do.
//!
//! [`codes!`] below is the one table of error codes: each code's name, its HTTP status and
//! what it means (as meilisearch's `make_error_codes!`). The HTTP responses (`http::error`)
//! and the OpenAPI document (the `ErrorCode` schema and every route's error responses) come
//! from it; nothing else lists codes. The registry and the rest of the domain pick a code and
//! never look at the status.

/// Declares [`Code`] from the table: `Variant = ("name", status, "meaning")`.
macro_rules! codes {
    ($($variant:ident = ($name:literal, $status:literal, $meaning:literal),)*) => {
        /// The machine-readable error codes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $($variant,)*
        }

        impl Code {
            /// Every code, in the table's order.
            pub const ALL: &[Code] = &[$(Code::$variant,)*];

            /// The name clients match on (`{"error": {"code": ...}}`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $name,)*
                }
            }

            /// The HTTP status of a response carrying this code.
            pub fn http_status(self) -> u16 {
                match self {
                    $(Code::$variant => $status,)*
                }
            }

            /// What the code means and what to do about it.
            pub fn meaning(self) -> &'static str {
                match self {
                    $(Code::$variant => $meaning,)*
                }
            }
        }
    };
}

codes! {
    InvalidRequest = ("invalid_request", 400,
        "the request is malformed or a parameter is out of range; the message names it"),
    EmptySubset = ("empty_subset", 400, "the job's subset selects no element of the dataset"),
    InvalidResume = ("invalid_resume", 400,
        "the job's `resume` state does not fit it: `consumed` is not a base64 serialized roaring \
         bitmap, holds ids outside the job's subset, or the epoch is past the job's epochs"),
    InvalidReplay = ("invalid_replay", 400,
        "the job's `replay` cannot be followed: the recorded epoch is missing or incomplete, \
         its ids are not in the dataset any more, or `subset`/`resume` is also given"),
    Unauthorized = ("unauthorized", 401,
        "the server requires a bearer token (`--token`) and the request has none or another"),
    PathNotAllowed = ("path_not_allowed", 403,
        "a dataset path lies outside the server's `--allowed-root` folders, or an s3 url \
         outside its `--allowed-s3` prefixes (a server without `--allowed-s3` refuses every \
         s3 source)"),
    EndpointNotAllowed = ("endpoint_not_allowed", 403,
        "an s3 source names an `endpoint` the server's configuration does not (its \
         `AWS_ENDPOINT_URL` and `--allowed-s3-endpoint`): the server sends its credentials only \
         there"),
    DatasetNotFound = ("dataset_not_found", 404, "no dataset has this name"),
    NodeNotFound = ("node_not_found", 404,
        "the leader knows no node of this name (it restarted or lost the node): register again"),
    JobNotFound = ("job_not_found", 404, "no job has this name"),
    RecordNotFound = ("record_not_found", 404,
        "no complete record of this job's epoch: the job did not set `record`, has not reached \
         the epoch, the epoch is older than the last 16 kept, or the recorder lagged"),
    NotFound = ("not_found", 404, "no route or dashboard file has this path"),
    MethodNotAllowed = ("method_not_allowed", 405,
        "the path exists but not with this method: the `Allow` header lists the methods it has"),
    PreloadNotFound = ("preload_not_found", 404,
        "the dataset has no preload (`POST /v1/datasets/{name}/preload` makes one)"),
    DatasetExists = ("dataset_exists", 409, "a dataset of this name exists: delete it first"),
    PreloadExists = ("preload_exists", 409,
        "the dataset has a preload already: release it first (`DELETE \
         /v1/datasets/{name}/preload`)"),
    PinBudget = ("pin_budget", 409,
        "the working set does not fit in what preloads may pin (half the cache's bytes and \
         slots, less what other preloads pin): the message says how many elements fit; \
         preload a smaller subset, release another preload, or raise `--cache-bytes`"),
    JobExists = ("job_exists", 409,
        "a job of this name runs with other parameters: every rank must send the same ones, \
         and another job needs another name"),
    DatasetInUse = ("dataset_in_use", 409,
        "jobs use the dataset: delete them first or pass `force=true`"),
    DatasetNotReady = ("dataset_not_ready", 409,
        "the dataset is still indexing (retry when its state is ready) or its indexing failed"),
    VersionMismatch = ("version_mismatch", 409,
        "the client speaks another shared-memory layout version: upgrade the client or the server"),
    NotALeader = ("not_a_leader", 409,
        "this server follows a leader (`--leader`): send cluster requests to the leader"),
    NodeMismatch = ("node_mismatch", 409,
        "a node's view of a multi-node job disagrees with the leader's (another dataset size, \
         overlapping ranks): every node must index the same source and ranks must be disjoint"),
    CannotAppend = ("cannot_append", 409,
        "the items cannot join the dataset: it does not grow (an `array` or `s3` source), an \
         append is under way, or the appended source differs from the dataset's (another kind, \
         other fields or image column) or holds a shard or file the dataset reads already; the \
         message says which"),
    DatasetChanged = ("dataset_changed", 409,
        "the resume state was saved on another version of the dataset (its fingerprint differs: \
         files added in its middle, replaced, relabelled, or the dataset re-indexed from other \
         files); resume with `allow_changed_dataset` to compute the rest on the new index"),
    StaleGeneration = ("stale_generation", 409,
        "a node and the leader disagree on the leader's generation: a node that has seen a \
         newer leader refuses an older one (restored from an older data directory, or one \
         that came back after being replaced), and a leader refuses a node's stream opened \
         for another generation"),
    JobFailed = ("job_failed", 409,
        "the multi-node job failed (a node died or stopped heartbeating, the leader was lost, \
         or a rank left): DDP cannot go on without a rank; restart the job"),
    TooLarge = ("too_large", 422,
        "the request can never succeed on this server (a ring above the record limit, more \
         ranks than allowed, rings needing more slots than `--cache-slots`, one batch larger than \
         `--cache-bytes`): change it"),
    CacheFull = ("cache_full", 503,
        "transient: no reader index is free or `/dev/shm` has no room for a new ring until \
         running jobs end; retry later"),
    LeaderUnreachable = ("leader_unreachable", 503,
        "transient: a multi-node job needs the leader and this follower cannot reach it; \
         retry when the leader is back"),
    ShuttingDown = ("shutting_down", 503,
        "transient: the server is draining after SIGTERM; register with the one that replaces it"),
    Internal = ("internal", 500, "a bug in the server: report it with the server's log"),
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

#[cfg(test)]
mod tests {
    use super::Code;

    #[test]
    fn codes_have_unique_names_and_error_statuses() {
        let mut names: Vec<_> = Code::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Code::ALL.len(), "two codes share a name");
        for c in Code::ALL {
            assert!(
                (400..600).contains(&c.http_status()),
                "{c:?} has status {}",
                c.http_status()
            );
            // Only what a retry can cure is a 503 (clients retry those).
            assert_eq!(
                c.http_status() == 503,
                c.meaning().starts_with("transient"),
                "{c:?}: a 503 must be documented as transient, and only a 503"
            );
        }
    }
}
