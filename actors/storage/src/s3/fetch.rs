//! The fetch stage: object-store requests on a small runtime of their own, apart from the
//! decode threads, so that a server keeps up to `max_in_flight` requests waiting on the
//! network while its decode threads stay busy.
//!
//! A request is one attempt at most `request_timeout` long; transient failures (5xx, 408,
//! 429, connection errors, timeouts) are tried again with exponential backoff and jitter
//! while the total retry budget lasts; authentication, permission and other 4xx failures are
//! final at once. Tar members due together whose byte ranges are neighbours (at most
//! [`COALESCE_GAP`] apart) are read with one ranged GET.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use object_store::{GetOptions, GetRange, ObjectStore};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{Semaphore, mpsc};

use super::stats::{ObjectStats, Op};
use super::{S3Allow, S3Dataset, S3Index, S3Layout, S3Url, object_key};
use crate::{DatasetIndex, Location, MAX_MEMBER_LEN, Progress, StorageError};

/// Neighbouring tar members at most this many bytes apart are read with one request (the
/// gap is read and dropped: a few tar headers and `.cls` members).
pub const COALESCE_GAP: u64 = 64 << 10;

/// A coalesced request covers at most this many bytes.
const MAX_COALESCED: u64 = 16 << 20;

/// Requests taken from the queue at once (and grouped into neighbours).
const MAX_DUE: usize = 256;

/// The first backoff; each retry doubles it up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How the stage talks to object stores.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Requests in flight at once, for the whole server.
    pub max_in_flight: usize,
    /// Total time one element (or listing page) may spend on retries.
    pub budget: Duration,
    /// One attempt's limit.
    pub request_timeout: Duration,
    /// Keys asked for per listing page (S3 returns at most 1000).
    pub list_page: usize,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 64,
            budget: Duration::from_secs(15),
            request_timeout: Duration::from_secs(10),
            list_page: 1000,
        }
    }
}

/// Called once with an element's bytes or why it could not be fetched, on a thread of the
/// fetch stage.
pub type Done = Box<dyn FnOnce(Result<Vec<u8>, StorageError>) + Send>;

struct Request {
    source: Arc<SourceInner>,
    element: u32,
    done: Done,
}

/// The server's object-store access: its runtime, its limits and counters, the allowed list.
pub struct ObjectStores {
    runtime: Option<Runtime>,
    handle: Handle,
    remote: Arc<Remote>,
    allow: S3Allow,
    queue: mpsc::UnboundedSender<Request>,
}

impl ObjectStores {
    /// Starts the stage's runtime (two threads: requests wait on the network, they do not
    /// compute).
    pub fn new(config: FetchConfig, allow: S3Allow) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("joader-fetch")
            .enable_all()
            .build()?;
        let remote = Arc::new(Remote {
            permits: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            config,
            stats: Arc::new(ObjectStats::default()),
        });
        let (queue, rx) = mpsc::unbounded_channel();
        runtime.spawn(dispatch(rx, remote.clone()));
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            remote,
            allow,
            queue,
        })
    }

    pub fn stats(&self) -> &Arc<ObjectStats> {
        &self.remote.stats
    }

    pub fn allow(&self) -> &S3Allow {
        &self.allow
    }

    pub fn config(&self) -> &FetchConfig {
        &self.remote.config
    }

    pub(super) fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Runs a future on the stage's runtime from a thread that is not async (indexing).
    pub(super) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    /// Checks that an `s3` source may be read: its syntax, its url under `--allowed-s3`, its
    /// endpoint one the configuration names. Before a dataset is created, and before any
    /// request.
    pub fn check(
        &self,
        url: &str,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> Result<S3Url, StorageError> {
        let parsed = super::validate(url, endpoint, region)?;
        self.allow.check(&parsed)?;
        self.allow.check_endpoint(endpoint)?;
        Ok(parsed)
    }

    /// Opens and indexes an `s3` source (blocking).
    pub fn index(
        &self,
        url: &str,
        layout: S3Layout,
        endpoint: Option<&str>,
        region: Option<&str>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<S3Index, StorageError> {
        let url = self.check(url, endpoint, region)?;
        let dataset = S3Dataset::open(&url, endpoint, region)?;
        let mut counter = Progress {
            count: 0,
            report: progress,
        };
        let (index, objects) = super::index(self, &dataset, layout, &mut counter)?;
        let index = super::super::finish_index(index, &mut counter)?;
        Ok(S3Index { index, objects })
    }

    /// The reader of an indexed `s3` source's elements.
    pub fn source(
        &self,
        url: &str,
        endpoint: Option<&str>,
        region: Option<&str>,
        index: Arc<DatasetIndex>,
    ) -> Result<S3Source, StorageError> {
        let url = self.check(url, endpoint, region)?;
        let dataset = S3Dataset::open(&url, endpoint, region)?;
        Ok(S3Source {
            inner: Arc::new(SourceInner { dataset, index }),
            queue: self.queue.clone(),
        })
    }
}

impl Drop for ObjectStores {
    fn drop(&mut self) {
        // May be dropped on an async thread (an actor's): never wait for the runtime there.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

struct SourceInner {
    dataset: S3Dataset,
    index: Arc<DatasetIndex>,
}

/// Reads the elements of one indexed `s3` dataset through the fetch stage.
#[derive(Clone)]
pub struct S3Source {
    inner: Arc<SourceInner>,
    queue: mpsc::UnboundedSender<Request>,
}

impl S3Source {
    /// Queues the fetch of `element`; `done` is called from the stage.
    pub fn fetch(&self, element: u32, done: Done) {
        let request = Request {
            source: self.inner.clone(),
            element,
            done,
        };
        if let Err(mpsc::error::SendError(r)) = self.queue.send(request) {
            (r.done)(Err(StorageError::Remote {
                url: self.inner.dataset.url.to_string(),
                code: "unavailable",
                message: "the fetch stage is shut down".into(),
            }));
        }
    }

    /// Fetches `element` and waits for it (a thread that is not async).
    pub fn read(&self, element: u32) -> Result<Vec<u8>, StorageError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.fetch(
            element,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().unwrap_or_else(|_| {
            Err(StorageError::Remote {
                url: self.inner.dataset.url.to_string(),
                code: "unavailable",
                message: "the fetch stage is shut down".into(),
            })
        })
    }

    /// The label of `element` (-1 for an unknown element).
    pub fn label(&self, element: u32) -> i64 {
        self.inner.index.label(element).unwrap_or(-1)
    }
}

/// Limits and counters shared by every request.
pub(super) struct Remote {
    config: FetchConfig,
    stats: Arc<ObjectStats>,
    permits: Arc<Semaphore>,
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

    /// `range` of the object `key` (the whole object for `None`).
    async fn get(
        &self,
        ds: &S3Dataset,
        key: &str,
        range: Option<Range<u64>>,
    ) -> Result<Vec<u8>, StorageError> {
        let path = object_key(key);
        let bytes = self
            .call(ds, key, Op::Get, || async {
                let options = GetOptions {
                    range: range.clone().map(GetRange::Bounded),
                    ..GetOptions::default()
                };
                ds.store.get_opts(&path, options).await?.bytes().await
            })
            .await?;
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
        Ok(bytes.to_vec())
    }
}

/// A number in `[0, 1)` that differs between calls (SipHash under a fresh random key).
fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let x = std::collections::hash_map::RandomState::new().hash_one(0u8);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Where an element's bytes are: a whole object, or a range of a shard.
enum Due {
    Object(String),
    Member { shard: u32, range: Range<u64> },
}

fn due(source: &SourceInner, element: u32) -> Result<Due, StorageError> {
    let index = &source.index;
    match index.location(element) {
        Some(Location::File(key)) => Ok(Due::Object(key.to_string_lossy().into_owned())),
        Some(Location::TarMember { shard, offset, len }) if len <= MAX_MEMBER_LEN => {
            Ok(Due::Member {
                shard,
                range: offset..offset + len,
            })
        }
        Some(Location::TarMember { .. }) => Err(StorageError::Remote {
            url: source.dataset.url.to_string(),
            code: "refused",
            message: format!("element {element} is larger than a member may be"),
        }),
        None => Err(StorageError::NoSuchItem {
            id: element,
            len: index.len(),
        }),
    }
}

/// Takes what is due, groups neighbouring tar members, and runs each group under a permit.
async fn dispatch(mut rx: mpsc::UnboundedReceiver<Request>, remote: Arc<Remote>) {
    while let Some(first) = rx.recv().await {
        let mut due_now = vec![first];
        while due_now.len() < MAX_DUE {
            match rx.try_recv() {
                Ok(r) => due_now.push(r),
                Err(_) => break,
            }
        }
        for group in groups(due_now) {
            let Ok(permit) = remote.permits.clone().acquire_owned().await else {
                return;
            };
            let remote = remote.clone();
            tokio::spawn(async move {
                run(&remote, group).await;
                drop(permit);
            });
        }
    }
}

/// One request's worth of elements: a whole object, or one range of a shard that covers
/// every member in it.
struct Group {
    source: Arc<SourceInner>,
    key: Result<String, StorageError>,
    range: Option<Range<u64>>,
    /// Each element's request and its range within the group's bytes.
    members: Vec<(Request, Option<Range<usize>>)>,
}

fn groups(requests: Vec<Request>) -> Vec<Group> {
    let mut out = Vec::new();
    // (source, shard, range, request) of tar members, to be coalesced.
    let mut members = Vec::new();
    for r in requests {
        match due(&r.source, r.element) {
            Ok(Due::Object(key)) => out.push(Group {
                source: r.source.clone(),
                key: Ok(key),
                range: None,
                members: vec![(r, None)],
            }),
            Ok(Due::Member { shard, range }) => members.push((shard, range, r)),
            Err(e) => (r.done)(Err(e)),
        }
    }
    members.sort_by_key(|(shard, range, r)| (Arc::as_ptr(&r.source) as usize, *shard, range.start));
    for (shard, range, r) in members {
        let joins = out.last().is_some_and(|g: &Group| {
            let Some(span) = &g.range else { return false };
            Arc::ptr_eq(&g.source, &r.source)
                && g.members.first().and_then(|(m, _)| shard_of(m)) == Some(shard)
                && range.start >= span.start
                && range.start <= span.end + COALESCE_GAP
                && range.end.max(span.end) - span.start <= MAX_COALESCED
        });
        if joins {
            let g = out.last_mut().expect("checked above");
            let span = g.range.as_mut().expect("checked above");
            span.end = span.end.max(range.end);
            g.members.push((r, Some(offset_range(&range))));
        } else {
            let key = r
                .source
                .index
                .shards()
                .get(shard as usize)
                .map(|p| p.to_string_lossy().into_owned())
                .ok_or(StorageError::NoSuchItem {
                    id: r.element,
                    len: r.source.index.len(),
                });
            out.push(Group {
                source: r.source.clone(),
                key,
                range: Some(range.clone()),
                members: vec![(r, Some(offset_range(&range)))],
            });
        }
    }
    // Member ranges are absolute until here; make them relative to their group's start.
    for g in &mut out {
        if let Some(span) = &g.range {
            let base = span.start as usize;
            for (_, r) in &mut g.members {
                if let Some(r) = r {
                    *r = r.start - base..r.end - base;
                }
            }
        }
    }
    out
}

fn shard_of(r: &Request) -> Option<u32> {
    match r.source.index.location(r.element)? {
        Location::TarMember { shard, .. } => Some(shard),
        Location::File(_) => None,
    }
}

fn offset_range(r: &Range<u64>) -> Range<usize> {
    r.start as usize..r.end as usize
}

async fn run(remote: &Remote, group: Group) {
    let Group {
        source,
        key,
        range,
        members,
    } = group;
    let key = match key {
        Ok(k) => k,
        Err(e) => {
            for (r, _) in members {
                (r.done)(Err(clone_error(&e)));
            }
            return;
        }
    };
    if members.len() > 1 {
        remote.stats.coalesced.fetch_add(1, Relaxed);
    }
    match remote.get(&source.dataset, &key, range).await {
        Ok(bytes) => {
            for (r, part) in members {
                let piece = match part {
                    Some(p) => bytes[p].to_vec(),
                    None => bytes.clone(),
                };
                (r.done)(Ok(piece));
            }
        }
        Err(e) => {
            for (r, _) in members {
                (r.done)(Err(clone_error(&e)));
            }
        }
    }
}

/// A copy of a fetch error for each element of a failed group.
fn clone_error(e: &StorageError) -> StorageError {
    match e {
        StorageError::Remote { url, code, message } => StorageError::Remote {
            url: url.clone(),
            code,
            message: message.clone(),
        },
        other => StorageError::Remote {
            url: String::new(),
            code: "refused",
            message: other.to_string(),
        },
    }
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
