//! One object-store request as the fetch stage makes it ([`Remote::call`]): each attempt at
//! most `request_timeout` long; transient failures (5xx, 408, 429, connection errors,
//! timeouts) tried again with exponential backoff and jitter while the total retry budget
//! lasts; authentication, permission and other 4xx failures final at once. Every attempt is
//! counted in the stage's [`ObjectStats`].

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::{GetOptions, GetRange, ObjectStore};

use super::dataset::object_key;
use super::limit::InFlight;
use super::stats::{ObjectStats, Op};
use super::{FetchConfig, S3Dataset};
use crate::StorageError;

/// The first backoff; each retry doubles it up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Limits and counters shared by every request.
pub(super) struct Remote {
    pub(super) config: FetchConfig,
    pub(super) stats: Arc<ObjectStats>,
    /// The places of the requests in flight (at most `max_in_flight`, adapting below).
    pub(super) limit: Arc<InFlight>,
    /// The disk tier of encoded bytes, when the server has one.
    pub(super) tier: Option<Arc<crate::tier::DiskTier>>,
    /// Places of the Parquet row reads running at once (`parquet::ROW_READS`).
    pub(super) row_reads: Arc<tokio::sync::Semaphore>,
}

/// A failure worth trying again, or not.
enum Class {
    Final(&'static str),
    Transient(&'static str),
}

fn classify(e: &object_store::Error) -> Class {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => Class::Final("not_found"),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Class::Final("access_denied"),
        E::Precondition { .. } | E::NotModified { .. } => Class::Final("refused"),
        E::Generic { .. } => {
            // object_store hides the status in its error chain's text ("...status code: 503
            // Service Unavailable..."); transport errors carry none.
            let text = chain(e);
            match status_in(&text) {
                Some(408 | 429) | None if !text.contains("redirect") => {
                    Class::Transient("unavailable")
                }
                Some(s) if s >= 500 => Class::Transient("unavailable"),
                Some(401 | 403) => Class::Final("access_denied"),
                Some(404) => Class::Final("not_found"),
                _ => Class::Final("refused"),
            }
        }
        _ => Class::Final("refused"),
    }
}

/// The whole chain of an error as text, each cause once (object_store's messages often
/// repeat their sources' already).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The HTTP status object_store wrote into an error's text.
fn status_in(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

impl Remote {
    pub(super) fn stats(&self) -> &ObjectStats {
        &self.stats
    }

    /// Runs `attempt` until it succeeds, fails for good, or the retry budget is spent.
    pub(super) async fn call<T, F, Fut>(
        &self,
        ds: &S3Dataset,
        key: &str,
        op: Op,
        mut attempt: F,
    ) -> Result<T, StorageError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let start = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let left = self.config.budget.saturating_sub(start.elapsed());
            let limit = self
                .config
                .request_timeout
                .min(left.max(Duration::from_millis(100)));
            let t0 = Instant::now();
            let outcome = tokio::time::timeout(limit, attempt()).await;
            self.stats.request(op, t0.elapsed());
            let (class, message) = match outcome {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => (classify(&e), ds.redact(&chain(&e))),
                Err(_) => (
                    Class::Transient("timeout"),
                    format!("no answer within {limit:?}"),
                ),
            };
            let (code, transient) = match class {
                Class::Final(c) => (c, false),
                Class::Transient(c) => (c, true),
            };
            self.stats.error(code);
            if transient {
                self.limit.overloaded();
                self.stats.limit.store(self.limit.limit() as u64, Relaxed);
            }
            // Full jitter: spread the retries of many elements failing together.
            let sleep = backoff.mul_f64(0.5 + jitter() / 2.0);
            if !transient || start.elapsed() + sleep >= self.config.budget {
                let message = if transient {
                    format!(
                        "gave up after {tries} attempts in {:.1} s (retry budget {:?}): {message}",
                        start.elapsed().as_secs_f64(),
                        self.config.budget
                    )
                } else {
                    message
                };
                return Err(StorageError::Remote {
                    url: ds.name(key),
                    code: if code == "timeout" {
                        "unavailable"
                    } else {
                        code
                    },
                    message: message.to_lowercase(),
                });
            }
            self.stats.retries.fetch_add(1, Relaxed);
            tokio::time::sleep(sleep).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// `range` of the object `key` (the whole object for `None`). With `if_match` (the ETag
    /// the index holds: every element read), the request carries `If-Match` and an answer of
    /// another ETag is refused too (a store that ignores the header): a changed object is an
    /// element error, never bytes stored under the old key.
    pub(super) async fn get(
        &self,
        ds: &S3Dataset,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<Bytes, StorageError> {
        let path = object_key(key);
        let bytes = self
            .call(ds, key, Op::Get, || async {
                let options = GetOptions {
                    range: range.clone().map(GetRange::Bounded),
                    if_match: if_match.map(str::to_owned),
                    ..GetOptions::default()
                };
                let result = ds.store.get_opts(&path, options).await?;
                if let (Some(want), Some(got)) = (if_match, result.meta.e_tag.as_deref())
                    && want != got
                {
                    return Err(object_store::Error::Precondition {
                        path: key.to_owned(),
                        source: format!("the object's ETag is {got}, not {want}").into(),
                    });
                }
                result.bytes().await
            })
            .await
            .map_err(|e| match (e, if_match) {
                (StorageError::Remote { url, code, message }, Some(etag))
                    if code == "refused" && message.contains("precondition") =>
                {
                    StorageError::Remote {
                        url,
                        code,
                        message: format!(
                            "the object changed since the dataset was indexed (indexed ETag \
                             {etag}): re-index the dataset ({message})"
                        ),
                    }
                }
                (e, _) => e,
            })?;
        self.stats.bytes.fetch_add(bytes.len() as u64, Relaxed);
        if let Some(r) = &range
            && bytes.len() as u64 != r.end - r.start
        {
            return Err(StorageError::Remote {
                url: ds.name(key),
                code: "refused",
                message: format!(
                    "asked for bytes {r:?}, got {}: the object is shorter than its index says \
                     (changed since indexing?)",
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }
}

/// A number in `[0, 1)` that differs between calls (SipHash under a fresh random key).
fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let x = std::collections::hash_map::RandomState::new().hash_one(0u8);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_read_from_object_store_messages() {
        assert_eq!(
            status_in("Server returned non-2xx status code: 503 Service Unavailable: x"),
            Some(503)
        );
        assert_eq!(status_in("HTTP error: error sending request"), None);
    }
}
