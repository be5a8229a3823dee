//! The registry, the server's domain: configuration, catalog, the datasets and jobs, and the
//! handles of the actors. It knows nothing of HTTP: its operations return [`crate::error`]
//! errors, which the HTTP layer (`crate::http`) turns into responses. Nor does it know the
//! cluster: what it needs of it, this node's agent for multi-node jobs, is the
//! [`ClusterNode`] interface, which `crate::cluster` implements (the cluster imports the
//! registry, never the reverse; `crate::state` holds both).

pub mod append;
pub mod cluster_node;
pub mod datasets;
mod disk_preload;
pub mod jobs;
pub mod preload;
pub mod record;
pub mod subset;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::Addr;
use actors::{CacheActor, CacheStats, ElementSource, JobState, JobStats, RingInfo, SamplerActor};
use joader_pipeline::Pipeline;
use joader_storage::DatasetIndex;
use joader_storage::s3::{ObjectChanges, ObjectStores};

use crate::catalog::{Catalog, DatasetRecord};
use crate::config::Config;
use crate::error::{Code, Error};
pub use cluster_node::{ClusterNode, LocalJob};
use jobs::JobRequest;

/// The registry: what the server serves (datasets, jobs) and the actors that serve it. Its
/// state is private: the HTTP, metrics and cluster layers call its methods, each of which
/// returns a snapshot or does one operation under the lock.
pub struct Registry {
    config: Config,
    catalog: Arc<Catalog>,
    cache: Addr<CacheActor>,
    /// The thread the samplers run on (never an HTTP worker's: a pass must not wait for a
    /// request, nor a request for a pass).
    samplers: actix::ArbiterHandle,
    /// Set by SIGTERM: new datasets and jobs are refused while running jobs drain.
    draining: std::sync::atomic::AtomicBool,
    stats: Arc<CacheStats>,
    /// The object-store stage (`s3` sources), when the server has `--allowed-s3`.
    objects: Option<Arc<ObjectStores>>,
    inner: Mutex<Inner>,
    started: Instant,
    /// This node's agent in the cluster (every server but a `--leader-only` leader), set once
    /// the agent has started.
    node: std::sync::OnceLock<Box<dyn ClusterNode>>,
}

/// The datasets and jobs, behind the registry's lock.
#[derive(Default)]
struct Inner {
    datasets: BTreeMap<String, DatasetEntry>,
    jobs: BTreeMap<String, Arc<JobEntry>>,
    /// Final counters of the stopped jobs of each name (a reused name continues its metrics).
    retired: BTreeMap<String, Retired>,
    /// Job names being registered, reserved before the registration's first await: a rank
    /// that arrives meanwhile waits for that registration to end, then joins the job.
    registering: BTreeMap<String, Registering>,
    pipelines: Vec<Pipeline>,
    next_job_id: u64,
    dataset_ids: u16,
}

/// How many entries the registry's per-job maps hold (`GET /v1/stats`'s `state`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub jobs: usize,
    pub retired_job_names: usize,
    pub registering: usize,
}

impl Registry {
    pub fn new(
        config: Config,
        catalog: Catalog,
        cache: Addr<CacheActor>,
        samplers: actix::ArbiterHandle,
        stats: Arc<CacheStats>,
        objects: Option<Arc<ObjectStores>>,
    ) -> Self {
        Self {
            config,
            catalog: Arc::new(catalog),
            cache,
            samplers,
            draining: Default::default(),
            stats,
            objects,
            inner: Mutex::new(Inner::default()),
            started: Instant::now(),
            node: Default::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The persistent catalog (a leader journals its multi-node jobs in it).
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The Cache actor's counters.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    pub fn cache(&self) -> &Addr<CacheActor> {
        &self.cache
    }

    /// The thread the samplers (and the leader's placement) run on.
    pub fn samplers(&self) -> &actix::ArbiterHandle {
        &self.samplers
    }

    /// The object-store stage, on a server with `--allowed-s3`.
    pub fn objects(&self) -> Option<&ObjectStores> {
        self.objects.as_deref()
    }

    /// Time since the server started.
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Sets this node's cluster agent (once, at start-up).
    pub fn set_node(&self, node: Box<dyn ClusterNode>) {
        if self.node.set(node).is_err() {
            tracing::warn!("the cluster agent was set twice; the first one stays");
        }
    }

    /// SIGTERM: from now on new datasets and jobs are refused (`check_not_draining`).
    pub fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, Error> {
        self.inner.lock().map_err(Error::internal)
    }

    /// A snapshot of every dataset, by name.
    pub fn datasets(&self) -> Vec<DatasetEntry> {
        self.lock()
            .map(|i| i.datasets.values().cloned().collect())
            .unwrap_or_default()
    }

    /// A snapshot of one dataset (`dataset_not_found` if there is none of that name).
    pub fn dataset(&self, name: &str) -> Result<DatasetEntry, Error> {
        self.lock()?
            .datasets
            .get(name)
            .cloned()
            .ok_or_else(|| Error::dataset_not_found(name))
    }

    pub fn has_dataset(&self, name: &str) -> bool {
        self.lock().is_ok_and(|i| i.datasets.contains_key(name))
    }

    /// Every job the registry knows (running, and ended ones not yet forgotten), by name.
    pub fn jobs(&self) -> Vec<Arc<JobEntry>> {
        self.lock()
            .map(|i| i.jobs.values().cloned().collect())
            .unwrap_or_default()
    }

    /// One job (`job_not_found` if there is none of that name).
    pub fn job(&self, name: &str) -> Result<Arc<JobEntry>, Error> {
        self.lock()?
            .jobs
            .get(name)
            .cloned()
            .ok_or_else(|| Error::job_not_found(name))
    }

    /// The jobs that have not ended.
    pub fn running_jobs(&self) -> usize {
        self.lock()
            .map_or(0, |i| i.jobs.values().filter(|j| !j.has_ended()).count())
    }

    /// The jobs, and the retired counters of each name, taken under one lock (a job's series
    /// adds the two: they must not be seen at two moments).
    pub fn jobs_and_retired(&self) -> (Vec<Arc<JobEntry>>, BTreeMap<String, Retired>) {
        self.lock()
            .map(|i| (i.jobs.values().cloned().collect(), i.retired.clone()))
            .unwrap_or_default()
    }

    pub fn sizes(&self) -> Sizes {
        self.lock()
            .map(|i| Sizes {
                jobs: i.jobs.len(),
                retired_job_names: i.retired.len(),
                registering: i.registering.len(),
            })
            .unwrap_or_default()
    }
}

impl Inner {
    fn next_dataset_id(&mut self) -> Result<u16, Error> {
        self.dataset_ids = self.dataset_ids.checked_add(1).ok_or_else(|| {
            Error::new(
                Code::Internal,
                "too many datasets created since the server started",
            )
        })?;
        Ok(self.dataset_ids)
    }

    /// A ready dataset with its index and element source (opened on first use).
    fn open_source(&mut self, name: &str) -> Result<OpenedSource<'_>, Error> {
        let d = self
            .datasets
            .get_mut(name)
            .ok_or_else(|| Error::dataset_not_found(name))?;
        let Some(index) = d.index.clone() else {
            return Err(Error::new(
                Code::DatasetNotReady,
                format!("dataset '{name}' is {}", d.record.state),
            ));
        };
        let source = match &d.source {
            Some(s) => s.clone(),
            // Opened when the dataset was indexed or loaded; failing then, it is logged.
            None if matches!(d.record.source, joader_storage::SourceSpec::S3 { .. }) => {
                return Err(Error::new(
                    Code::DatasetNotReady,
                    format!(
                        "dataset '{name}' cannot open its object store (the server's log says \
                         why; check its AWS_* environment and restart it)"
                    ),
                ));
            }
            None => {
                let local = Arc::new(crate::loading::IndexSource::new(index.clone()));
                d.local = Some(local.clone());
                d.source.insert(local).clone()
            }
        };
        Ok((d, index, source))
    }

    /// The id of a pipeline (interned: jobs with equal pipelines share cached elements).
    fn pipeline_id(&mut self, p: &Pipeline) -> Result<u16, Error> {
        if let Some(i) = self.pipelines.iter().position(|q| q == p) {
            return Ok(i as u16);
        }
        if self.pipelines.len() >= usize::from(u16::MAX) {
            return Err(Error::new(Code::Internal, "too many distinct pipelines"));
        }
        self.pipelines.push(p.clone());
        Ok((self.pipelines.len() - 1) as u16)
    }
}

/// A ready dataset's entry, its index and its element source.
type OpenedSource<'a> = (
    &'a mut DatasetEntry,
    Arc<DatasetIndex>,
    Arc<dyn ElementSource>,
);

/// A job's integer counters, as the metrics export them (`metrics::record::JOB_COUNTERS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounts {
    pub sampled: u64,
    /// Records pushed into the job's rings.
    pub pushed: u64,
    /// Records (samples) the client took and acknowledged.
    pub acknowledged: u64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub waited_for_others: u64,
    pub store_read_bytes: u64,
}

impl JobCounts {
    pub fn of(s: &JobStats) -> JobCounts {
        JobCounts {
            sampled: s.sampled.load(Relaxed),
            pushed: s.delivered.load(Relaxed),
            acknowledged: s.acknowledged.load(Relaxed),
            hits: s.hits.load(Relaxed),
            misses: s.misses.load(Relaxed),
            errors: s.errors.load(Relaxed),
            waited_for_others: s.waited_for_others.load(Relaxed),
            store_read_bytes: s.store_read_bytes.load(Relaxed),
        }
    }

    /// Applies `f` to each pair of counters.
    pub fn zip_with(self, o: JobCounts, f: impl Fn(u64, u64) -> u64) -> JobCounts {
        JobCounts {
            sampled: f(self.sampled, o.sampled),
            pushed: f(self.pushed, o.pushed),
            acknowledged: f(self.acknowledged, o.acknowledged),
            hits: f(self.hits, o.hits),
            misses: f(self.misses, o.misses),
            errors: f(self.errors, o.errors),
            waited_for_others: f(self.waited_for_others, o.waited_for_others),
            store_read_bytes: f(self.store_read_bytes, o.store_read_bytes),
        }
    }
}

/// A registration in progress: the job's parameters, and a channel whose sender is dropped
/// when the registration ends (created or failed).
pub struct Registering {
    pub request: JobRequest,
    pub done: tokio::sync::watch::Receiver<()>,
}

/// What the stopped jobs of one name had counted, and when
/// the last of them stopped (the registry forgets the name `metrics_retention_s` later).
#[derive(Debug, Clone, Copy, Default)]
pub struct Retired {
    pub counts: JobCounts,
    pub stall_s: f64,
    pub at: Option<Instant>,
}

impl Inner {
    /// Adds a stopped job's final counters to its name's retired counters.
    fn retire(&mut self, name: &str, stats: &JobStats) {
        let now = JobCounts::of(stats);
        let stall = stats.stall_us.load(Relaxed) as f64 / 1e6;
        let r = self.retired.entry(name.to_string()).or_default();
        r.counts = r.counts.zip_with(now, u64::saturating_add);
        r.stall_s += stall;
        r.at = Some(Instant::now());
    }
}

/// Forgets what the retention rules (`Config::retention`) say is no longer needed (called
/// every second).
pub fn housekeep(registry: &Registry) {
    let keep = registry.config.retention();
    let now = Instant::now();
    let Ok(mut inner) = registry.inner.lock() else {
        return;
    };
    let mut ended: Vec<(Instant, String)> = inner
        .jobs
        .iter()
        .filter(|(_, j)| j.has_ended())
        .map(|(name, j)| (*j.ended_at.get_or_init(|| now), name.clone()))
        .collect();
    ended.sort();
    let excess = ended.len().saturating_sub(keep.ended_jobs);
    let forget: Vec<String> = ended
        .into_iter()
        .enumerate()
        .filter(|(i, (t, _))| *i < excess || now.duration_since(*t) >= keep.ended_ttl)
        .map(|(_, (_, name))| name)
        .collect();
    for name in forget {
        if let Some(j) = inner.jobs.remove(&name) {
            inner.retire(&name, &j.stats);
        }
    }
    let Inner { jobs, retired, .. } = &mut *inner;
    retired.retain(|name, r| {
        jobs.contains_key(name) || r.at.is_some_and(|t| now.duration_since(t) < keep.metrics)
    });
}

/// A dataset: its record, its index once indexed, its element source and Sampler once opened
/// (a snapshot of it is cheap: the record and handles are cloned).
#[derive(Clone)]
pub struct DatasetEntry {
    pub id: u16,
    pub record: DatasetRecord,
    /// Items indexed so far.
    pub progress: Arc<AtomicU64>,
    pub index: Option<Arc<DatasetIndex>>,
    pub source: Option<Arc<dyn ElementSource>>,
    pub sampler: Option<Addr<SamplerActor>>,
    /// Its working set preloaded and pinned in the cache, until released.
    pub preload: Option<preload::PreloadEntry>,
    /// `source` when it reads local files: an append gives it the grown index.
    pub local: Option<Arc<crate::loading::IndexSource>>,
    /// An append is under way (`append::append_dataset`; one at a time).
    pub appending: bool,
}

impl DatasetEntry {
    pub fn new(id: u16, record: DatasetRecord) -> Self {
        Self {
            id,
            record,
            progress: Arc::new(AtomicU64::new(0)),
            index: None,
            source: None,
            sampler: None,
            preload: None,
            local: None,
            appending: false,
        }
    }
}

pub struct JobEntry {
    pub id: u64,
    pub name: String,
    pub dataset: String,
    /// Elements of its subset (of its next epoch, when its dataset grew).
    pub subset_len: AtomicU64,
    /// Its subset is the whole dataset, which it follows as it grows by appends (a job of
    /// one rank registered without `subset` or `replay`; see `append`).
    pub grows: bool,
    pub pipeline: Pipeline,
    pub request: JobRequest,
    pub stats: Arc<JobStats>,
    pub rings: Vec<RingInfo>,
    /// What samples the job: its dataset's Sampler, or the node's agent (multi-node jobs).
    pub sampler: actix::Recipient<actors::RemoveJob>,
    pub created: Instant,
    /// The dataset's fingerprint when the job registered (`DatasetIndex::fingerprint`).
    pub fingerprint: String,
    /// (time, acknowledged, rate) of the last rate estimate.
    pub rate: Mutex<Option<(Instant, u64, f64)>>,
    /// When housekeeping first saw the job ended.
    pub ended_at: std::sync::OnceLock<Instant>,
}

impl JobEntry {
    /// Nothing more will happen to the job: it failed, or it finished and its rings are
    /// closed (its reader took everything and left).
    pub fn has_ended(&self) -> bool {
        match self.stats.state() {
            JobState::Failed(_) => true,
            JobState::Finished => self.stats.closed.load(Relaxed),
            _ => false,
        }
    }

    /// Samples per second acknowledged by the client: over the last second or so while the
    /// job has not ended (its first reading: over its run so far), its mean over its own run
    /// once it has ended (see [`RateOver`]).
    pub fn rate(&self) -> (f64, RateOver) {
        if self.has_ended() {
            return (self.stats.run_rate(false), RateOver::Run);
        }
        let now = Instant::now();
        let acked = self.stats.acknowledged.load(Relaxed);
        let Ok(mut r) = self.rate.lock() else {
            return (0.0, RateOver::Recent);
        };
        match *r {
            None => *r = Some((now, acked, self.stats.run_rate(true))),
            Some((t, a, _)) if now.duration_since(t).as_secs_f64() >= 1.0 => {
                let rate = (acked - a) as f64 / now.duration_since(t).as_secs_f64();
                *r = Some((now, acked, rate));
            }
            Some(_) => {}
        }
        (r.map_or(0.0, |x| x.2), RateOver::Recent)
    }
}

/// What a job's reported samples per second are measured over.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RateOver {
    /// The last second or so (a job that has not ended).
    Recent,
    /// The job's whole run, from its first credit to its last acknowledgement (an ended job).
    Run,
}

/// Indexes a dataset on a background thread and records the outcome.
pub fn start_indexing(registry: Arc<Registry>, name: String) {
    let spawned = std::thread::Builder::new().name(format!("joader-index-{name}")).spawn(move || {
        let (spec, progress, record) = {
            let Ok(inner) = registry.inner.lock() else { return };
            let Some(d) = inner.datasets.get(&name) else { return };
            (d.record.source.clone(), d.progress.clone(), d.record.clone())
        };
        let started = Instant::now();
        let objects = registry.objects.as_deref();
        let result = crate::loading::index(&spec, &registry.config.allowed_roots, objects, &mut |n| progress.store(n, Relaxed))
            .and_then(|(index, versions)| {
                // What was appended to it joins it again, in order.
                let index = append::replay_appends(&record, &registry.config.allowed_roots, index)?;
                // An object store's reader is opened here, off the HTTP workers.
                let index = Arc::new(index);
                let source = matches!(spec, joader_storage::SourceSpec::S3 { .. })
                    .then(|| crate::loading::element_source(&spec, objects, index.clone(), versions.as_deref().unwrap_or_default()))
                    .transpose()?;
                Ok((index, source, versions))
            });
        let Some(mut record) = registry.inner.lock().ok().and_then(|i| i.datasets.get(&name).map(|d| d.record.clone())) else {
            return;
        };
        // Persisted before the registry's lock is taken: a redb commit of a whole index must
        // not hold up the HTTP workers.
        let (index, source) = match result {
            Ok((index, source, versions)) => {
                progress.store(index.len() as u64, Relaxed);
                record.state = "ready".into();
                // An `s3` array's default fields are known once its objects are listed.
                if let joader_storage::SourceSpec::S3 { layout: joader_storage::s3::S3Layout::Array, fields: f @ None, .. } = &mut record.source {
                    f.clone_from(&index.declared_fields().cloned());
                }
                record.error = None;
                // Compared with the objects of the previous index (a re-index).
                record.changes = match (&versions, registry.catalog.objects(&name)) {
                    (Some(new), Ok(Some(old))) => Some(ObjectChanges::between(&old, new)),
                    _ => None,
                };
                if let Some(c) = &record.changes {
                    tracing::info!(dataset = %name, added = c.added, removed = c.removed, changed = c.changed, "dataset re-indexed");
                }
                if let Err(e) = registry.catalog.put_indexed(&record, Some(&index), versions.as_deref()) {
                    tracing::error!(dataset = %name, error = %e, "cannot persist the dataset index");
                }
                tracing::info!(dataset = %name, items = index.len(), secs = started.elapsed().as_secs_f64(), "dataset indexed");
                (Some(index), source)
            }
            Err(e) => {
                record.state = "failed".into();
                record.error = Some(format!("{}: {e}", e.code()));
                let _ = registry.catalog.put(&record, None);
                tracing::warn!(dataset = %name, error = %e, "indexing failed");
                (None, None)
            }
        };
        let Ok(mut inner) = registry.inner.lock() else { return };
        match inner.datasets.get_mut(&name) {
            Some(d) => {
                d.record = record;
                d.index = index;
                if source.is_some() {
                    d.source = source;
                }
            }
            // Deleted while it was indexed: forget what was just persisted.
            None => {
                drop(inner);
                let _ = registry.catalog.remove(&name);
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start an indexing thread");
    }
}

/// Loads the catalog at start-up: ready datasets with their index; interrupted ones, and
/// ones whose index an older joader stored in another format, are indexed again.
pub fn load_catalog(registry: &Arc<Registry>) -> anyhow::Result<()> {
    let records = registry.catalog.records()?;
    let mut reindex = Vec::new();
    {
        let mut inner = registry
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        for rec in records {
            let id = inner
                .next_dataset_id()
                .map_err(|e| anyhow::anyhow!(e.message))?;
            let mut entry = DatasetEntry::new(id, rec.clone());
            match (rec.state.as_str(), registry.catalog.index(&rec.name)?) {
                ("ready", Some(index)) => {
                    entry.progress.store(index.len() as u64, Relaxed);
                    let index = Arc::new(index);
                    if matches!(rec.source, joader_storage::SourceSpec::S3 { .. }) {
                        // Its objects' ETags key the disk tier (none: not stored there).
                        let versions = registry
                            .catalog
                            .objects(&rec.name)
                            .ok()
                            .flatten()
                            .unwrap_or_default();
                        // Jobs of a dataset whose store cannot be opened are refused, naming
                        // this log line's reason.
                        match crate::loading::element_source(
                            &rec.source,
                            registry.objects.as_deref(),
                            index.clone(),
                            &versions,
                        ) {
                            Ok(source) => entry.source = Some(source),
                            Err(e) => {
                                tracing::warn!(dataset = %rec.name, error = %e, "cannot open the dataset's object store")
                            }
                        }
                    }
                    entry.index = Some(index);
                }
                ("failed", _) => {}
                _ => {
                    entry.record.state = "indexing".into();
                    reindex.push(rec.name.clone());
                }
            }
            inner.datasets.insert(rec.name.clone(), entry);
        }
    }
    for name in reindex {
        start_indexing(registry.clone(), name);
    }
    Ok(())
}

/// Refuses new work while the server drains (after SIGTERM).
pub fn check_not_draining(registry: &Registry) -> Result<(), Error> {
    if registry.is_draining() {
        return Err(Error::new(
            Code::ShuttingDown,
            "the server is shutting down (SIGTERM): it takes no new datasets or jobs; \
             register with the server that replaces it",
        ));
    }
    Ok(())
}

/// Names of datasets and jobs: they end up in shared-memory names.
pub fn check_name(kind: &str, name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            Code::InvalidRequest,
            format!(
                "{kind} name '{name}' must have 1 to 64 characters from A-Z a-z 0-9 _ - . and not start with '.'"
            ),
        ))
    }
}
