//! The fetch stage's public face: [`ObjectStores`] (the server's object-store access: its
//! runtime, limits, counters and allow-list; it checks, opens and indexes `s3` sources) and
//! [`S3Source`] (one indexed dataset's reader, which queues element fetches).
//!
//! Object-store requests run on a small runtime of their own, apart from the decode threads,
//! so that a server keeps many requests waiting on the network while its decode threads stay
//! busy; how many at once adapts to what the store sustains (`limit`, at most
//! `max_in_flight`). How one request is tried is `remote`'s business; how queued fetches
//! become requests (tar members read together) is `coalesce`'s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Handle, Runtime};
use tokio::sync::mpsc;

use super::coalesce::dispatch;
use super::limit::InFlight;
use super::remote::Remote;
use super::stats::ObjectStats;
use super::{S3Allow, S3Dataset, S3Index, S3Layout, S3Url};
use crate::{DatasetIndex, Progress, StorageError};

/// How the stage talks to object stores.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Requests in flight at once, for the whole server, at most (the limit adapts below it).
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
            max_in_flight: 256,
            budget: Duration::from_secs(15),
            request_timeout: Duration::from_secs(10),
            list_page: 1000,
        }
    }
}

/// Called once with an element's bytes or why it could not be fetched, on a thread of the
/// fetch stage.
pub type Done = Box<dyn FnOnce(Result<Vec<u8>, StorageError>) + Send>;

/// One queued element fetch.
pub(super) struct Request {
    pub(super) source: Arc<SourceInner>,
    pub(super) element: u32,
    pub(super) done: Done,
    /// When it was queued.
    pub(super) queued_at: std::time::Instant,
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
        let limit = Arc::new(InFlight::new(config.max_in_flight));
        let stats = Arc::new(ObjectStats::default());
        stats
            .limit
            .store(limit.limit() as u64, std::sync::atomic::Ordering::Relaxed);
        let remote = Arc::new(Remote {
            limit,
            config,
            stats,
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
        let index = crate::finish_index(index, &mut counter)?;
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

/// What every fetch of one dataset shares.
pub(super) struct SourceInner {
    pub(super) dataset: S3Dataset,
    pub(super) index: Arc<DatasetIndex>,
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
            queued_at: std::time::Instant::now(),
        };
        if let Err(mpsc::error::SendError(r)) = self.queue.send(request) {
            (r.done)(Err(self.shut_down()));
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
        rx.recv().unwrap_or_else(|_| Err(self.shut_down()))
    }

    /// The error of a fetch the stage can no longer run.
    fn shut_down(&self) -> StorageError {
        StorageError::Remote {
            url: self.inner.dataset.url.to_string(),
            code: "unavailable",
            message: "the fetch stage is shut down".into(),
        }
    }

    /// The label of `element` (-1 for an unknown element).
    pub fn label(&self, element: u32) -> i64 {
        self.inner.index.label(element).unwrap_or(-1)
    }
}
