//! The fetch stage's public face: [`ObjectStores`] (the server's object-store access: its
//! runtime, limits, counters and allow-list; it checks, opens and indexes `s3` sources) and
//! [`S3Source`] (one indexed dataset's reader, which queues element fetches).
//!
//! Object-store requests run on a small runtime of their own, apart from the decode threads,
//! so that a server keeps many requests waiting on the network while its decode threads stay
//! busy; how many at once adapts to what the store sustains (`limit`, at most
//! `max_in_flight`). How one request is tried is `remote`'s business; how queued fetches
//! become requests (tar members read together) is `coalesce`'s.
//!
//! With a disk tier (`crate::tier`), an element stored there is read from it instead (on the
//! runtime's blocking threads), and what a request fetched is offered to it; each source
//! keeps its jobs' [`Demand`], which the tier's admission asks.
//!
//! The Sampler asks for the bytes of what it picked beyond what the Cache loads now
//! ([`S3Source::fetch_ahead`]); they wait in one bounded buffer for their load (`ahead`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use object_store::ObjectStoreExt as _;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::mpsc;

use super::ahead::{Ahead, Reserve};
use super::coalesce::dispatch;
use super::limit::InFlight;
use super::remote::Remote;
use super::request::{Done, Request, SourceInner};
use super::stats::{ObjectStats, Op};
use super::{ObjectVersion, S3Allow, S3Dataset, S3Index, S3Layout, S3Url};
use crate::tier::{Demand, DiskTier};
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
    /// The fetch-ahead buffer's size in bytes (0: no fetch-ahead; see `ahead`).
    pub ahead_bytes: u64,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 256,
            budget: Duration::from_secs(15),
            request_timeout: Duration::from_secs(10),
            list_page: 1000,
            ahead_bytes: super::ahead::DEFAULT_BYTES,
        }
    }
}

/// The server's object-store access: its runtime, its limits and counters, the allowed list.
pub struct ObjectStores {
    runtime: Option<Runtime>,
    handle: Handle,
    remote: Arc<Remote>,
    allow: S3Allow,
    queue: mpsc::UnboundedSender<Request>,
    ahead: Arc<Ahead>,
}

impl ObjectStores {
    /// Starts the stage's runtime (two threads: requests wait on the network, they do not
    /// compute), with the disk tier of encoded bytes when the server has one; its threads'
    /// CPU is the fetch stage's ([`crate::stage::FETCH`]).
    pub fn new(
        config: FetchConfig,
        allow: S3Allow,
        tier: Option<Arc<DiskTier>>,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("joader-fetch")
            .on_thread_start(|| joader_stages::set_base(&crate::stage::FETCH))
            .enable_all()
            .build()?;
        let limit = Arc::new(InFlight::new(config.max_in_flight));
        let stats = Arc::new(ObjectStats::default());
        let ahead = Arc::new(Ahead::new(config.ahead_bytes, stats.clone()));
        stats
            .limit
            .store(limit.limit() as u64, std::sync::atomic::Ordering::Relaxed);
        let remote = Arc::new(Remote {
            limit,
            config,
            stats,
            tier,
            row_reads: Arc::new(tokio::sync::Semaphore::new(super::parquet::ROW_READS)),
        });
        let (queue, rx) = mpsc::unbounded_channel();
        runtime.spawn(dispatch(rx, remote.clone(), queue.clone()));
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            remote,
            allow,
            queue,
            ahead,
        })
    }

    pub fn stats(&self) -> &Arc<ObjectStats> {
        &self.remote.stats
    }

    /// The disk tier of encoded bytes, when the server has one.
    pub fn tier(&self) -> Option<&Arc<DiskTier>> {
        self.remote.tier.as_ref()
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

    /// What the reads of an `s3` Parquet dataset hold: the stage's requests and its runtime.
    pub(super) fn shared(&self) -> (Arc<Remote>, Handle) {
        (self.remote.clone(), self.handle.clone())
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

    /// Checks, before a dataset is created, that each glob pattern in the url of a
    /// `tar_shards` or `parquet` source matches an object (`NoMatch` naming it, else
    /// `BadPattern`): one listing of each pattern's prefix (blocking). The store's own errors
    /// are left to the indexing, which reports them.
    pub fn check_patterns(
        &self,
        url: &S3Url,
        layout: S3Layout,
        split: Option<&str>,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> Result<(), StorageError> {
        if let Some(split) = split {
            let Ok(dataset) = S3Dataset::open(url, endpoint, region) else {
                return Ok(());
            };
            return match super::parquet::split_objects(self, &dataset, split) {
                Err(e @ (StorageError::NoMatch { .. } | StorageError::BadPattern { .. })) => Err(e),
                _ => Ok(()),
            };
        }
        if !matches!(
            layout,
            S3Layout::TarShards | S3Layout::Parquet | S3Layout::Array
        ) {
            return Ok(());
        }
        let keys = crate::select::brace_keys(&url.key)?;
        if !keys
            .iter()
            .any(|k| crate::select::KeyPattern::of(k).is_ok_and(|p| p.is_some()))
        {
            return Ok(());
        }
        let Ok(dataset) = S3Dataset::open(url, endpoint, region) else {
            return Ok(());
        };
        match super::pattern_objects(self, &dataset, layout, &keys) {
            Err(e @ (StorageError::NoMatch { .. } | StorageError::BadPattern { .. })) => Err(e),
            _ => Ok(()),
        }
    }

    /// Opens and indexes an `s3` source (blocking).
    pub fn index(
        &self,
        url: &str,
        (layout, split): (S3Layout, Option<&str>),
        fields: Option<&crate::fields::Fields>,
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
        let (index, mut objects) =
            super::index(self, &dataset, (layout, split), fields, &mut counter)?;
        // Every read asks for the indexed ETag (an object rewritten in place is an element
        // error, never other bytes), so every object needs one.
        self.fill_etags(&dataset, &mut objects)?;
        let index = crate::finish_index(index, &mut counter)?;
        Ok(S3Index { index, objects })
    }

    /// Asks the store for the ETag of each object its listing gave none (some S3-compatible
    /// servers, s3s-fs among them, list none; AWS, MinIO, Ceph, Garage and R2 do): every read
    /// asks for the indexed ETag and compares the answer's, and the disk tier keys objects by
    /// it. One HEAD per such object, 32 at once; an object whose HEAD gives none either is
    /// read unchecked (and never stored in the tier).
    fn fill_etags(
        &self,
        ds: &S3Dataset,
        objects: &mut [ObjectVersion],
    ) -> Result<(), StorageError> {
        use futures::StreamExt;
        let missing: Vec<(usize, String)> = objects
            .iter()
            .enumerate()
            .filter(|(_, o)| o.etag.is_none())
            .map(|(i, o)| (i, o.key.clone()))
            .collect();
        let remote = self.remote();
        let found: Vec<(usize, Result<Option<String>, StorageError>)> = self.block_on(
            futures::stream::iter(missing.into_iter().map(|(i, key)| async move {
                let path = super::dataset::object_key(&key);
                let meta = remote
                    .call(ds, &key, Op::Head, || ds.store.head(&path))
                    .await;
                (i, meta.map(|m| m.e_tag))
            }))
            .buffer_unordered(32)
            .collect(),
        );
        for (i, etag) in found {
            objects[i].etag = etag?;
        }
        Ok(())
    }

    /// The reader of an indexed `s3` source's elements; `versions` are the objects the index
    /// was made of (their ETags key the disk tier, and its fills ask for them: `If-Match`).
    pub fn source(
        &self,
        url: &str,
        endpoint: Option<&str>,
        region: Option<&str>,
        index: Arc<DatasetIndex>,
        versions: &[ObjectVersion],
    ) -> Result<S3Source, StorageError> {
        let parsed = self.check(url, endpoint, region)?;
        let dataset = S3Dataset::open(&parsed, endpoint, region)?;
        let etags = versions
            .iter()
            .filter_map(|v| Some((v.key.clone(), v.etag.clone()?)))
            .collect();
        let store = format!(
            "{}/{}",
            endpoint.map_or_else(|| "aws".to_owned(), |e| e.trim_end_matches('/').to_owned()),
            parsed.bucket
        );
        // A Parquet dataset's reads open its objects through the stage.
        if let Some(info) = index.rows_info() {
            let opener = super::parquet::Opener::new(self, &dataset, versions);
            crate::parquet::reader_of(info).set_objects(Arc::new(opener));
        }
        // An array dataset's rows are read through the stage too.
        if let Some((_, open)) = index.arrays() {
            open.set_objects(Arc::new(super::array::RowObjects::new(
                self, &dataset, versions,
            )));
        }
        static SOURCES: AtomicU64 = AtomicU64::new(0);
        let inner = Arc::new(SourceInner {
            id: SOURCES.fetch_add(1, Relaxed),
            dataset,
            index,
            etags,
            store,
            demand: Arc::new(Demand::default()),
        });
        // What the tier already holds of this dataset (a restart) is its elements from now
        // on: kept while its jobs need them.
        if let Some(tier) = self.tier() {
            let names = (0..inner.index.len() as u32)
                .filter_map(|e| Some((inner.tier_key(e)?.name(), inner.owner(e))));
            tier.adopt(names);
        }
        Ok(S3Source {
            inner,
            queue: self.queue.clone(),
            ahead: self.ahead.clone(),
            stats: self.remote.stats.clone(),
            tier: self.tier().cloned(),
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

/// Reads the elements of one indexed `s3` dataset through the fetch stage.
#[derive(Clone)]
pub struct S3Source {
    inner: Arc<SourceInner>,
    queue: mpsc::UnboundedSender<Request>,
    ahead: Arc<Ahead>,
    stats: Arc<ObjectStats>,
    /// The server's disk tier, when it has one.
    tier: Option<Arc<DiskTier>>,
}

/// How long a fetch is assumed to take before any GET has been timed.
const FIRST_GET_TIME: Duration = Duration::from_millis(50);

impl S3Source {
    /// Fetches `element`; `done` is called from the stage. Bytes fetched ahead are handed
    /// over at once, or when their request ends.
    pub fn fetch(&self, element: u32, done: Done) {
        if let Some(done) = self.ahead.take((self.inner.id, element), done) {
            self.queue(element, done);
        }
    }

    /// Starts fetching `element`'s bytes for a load to come, into the fetch-ahead buffer
    /// (nothing when they are there or on their way already, or the buffer is full).
    pub fn fetch_ahead(&self, element: u32) {
        let key = (self.inner.id, element);
        if self.ahead.reserve(key) == Reserve::Fetch {
            let ahead = self.ahead.clone();
            self.queue(element, Box::new(move |r, n| ahead.fetched(key, r, n)));
        }
    }

    /// How long fetching an element takes lately (a GET's smoothed time), when the server
    /// fetches ahead; `None` when it does not.
    pub fn fetch_time(&self) -> Option<Duration> {
        self.ahead
            .enabled()
            .then(|| self.stats.get_time().unwrap_or(FIRST_GET_TIME))
    }

    fn queue(&self, element: u32, done: Done) {
        let request = Request {
            source: self.inner.clone(),
            element,
            done,
            queued_at: std::time::Instant::now(),
            tier_checked: false,
        };
        if let Err(mpsc::error::SendError(r)) = self.queue.send(request) {
            (r.done)(Err(self.shut_down()), 0);
        }
    }

    /// Fetches `element` and waits for it (a thread that is not async).
    pub fn read(&self, element: u32) -> Result<Vec<u8>, StorageError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.fetch(
            element,
            Box::new(move |r, _| {
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

    /// `job` starts an epoch needing `remaining` (the disk tier keeps what jobs still need).
    pub fn epoch_started(&self, job: u64, remaining: &roaring::RoaringBitmap) {
        self.inner.demand.epoch_started(job, remaining);
    }

    /// `job` was handed `element` in its current epoch.
    pub fn delivered(&self, job: u64, element: u32) {
        self.inner.demand.delivered(job, element);
    }

    /// `job` ended.
    pub fn job_closed(&self, job: u64) {
        self.inner.demand.job_closed(job);
    }

    /// The disk tier's capacity in bytes, when the server has a tier.
    pub fn disk_capacity(&self) -> Option<u64> {
        Some(self.tier.as_ref()?.stats().capacity.load(Relaxed))
    }

    /// The bytes the disk tier's file of `element` takes, when it holds it now (complete,
    /// no I/O).
    pub fn on_disk(&self, element: u32) -> Option<u64> {
        match (&self.tier, self.inner.tier_key(element)) {
            (Some(tier), Some(key)) => tier.stored_len(&key),
            _ => None,
        }
    }

    /// Waits until the disk tier's writer has written (or refused) what was offered to it.
    pub fn flush_disk(&self) {
        if let Some(tier) = &self.tier {
            tier.flush();
        }
    }

    /// The dataset's index (what a read's bytes are split by into image and fields).
    pub fn index(&self) -> &Arc<DatasetIndex> {
        &self.inner.index
    }

    /// The label of `element` (-1 for an unknown element).
    pub fn label(&self, element: u32) -> i64 {
        self.inner.index.label(element).unwrap_or(-1)
    }
}
