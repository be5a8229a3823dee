//! The leader: the registry of nodes and multi-node jobs, one cluster Sampler per dataset
//! (DSA across every multi-node job of the dataset), and the [`Dispatch`] actor that places
//! each sampled delivery on a node (`joader_core::cluster`) into that node's outbox, which
//! the node's stream ([`Leader::serve_stream`]) drains as passes happen.
//!
//! A node's stream is a WebSocket it opens while it has multi-node jobs: the leader writes a
//! frame per drain of the outbox (a ping when idle for a heartbeat, so that the node can tell
//! a silent leader from an idle one) and reads the node's credit reports from it. A stream
//! that ends or breaks may have lost frames either way, so the leader fails the node's
//! multi-node jobs, as for a silent node, and the node does the same on its side; a node
//! that opens a new stream starts clean.
//!
//! Credit: a multi-node job's credit in its Sampler is what its nodes' rings have room for.
//! Nodes return credit as their readers acknowledge; padding records (which the Sampler never
//! sampled) are subtracted from the credit they later return, and deliveries dropped by
//! `drop_last` give their credit back at once, so the credit never drifts.
//!
//! The parts: what they all share, the records of the nodes and of the multi-node jobs
//! (here), the node registry and its heartbeats (`nodes.rs`), the nodes' streams
//! (`stream.rs`), multi-node jobs joining and starting (`join.rs`), and the placement of
//! each pass on the nodes (`dispatch.rs`).

mod dispatch;
mod join;
mod journal;
mod nodes;
mod stream;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::actors::{JobSignal, RemoveJob, SamplerActor};
use actix::prelude::*;
use joader_core::cluster::{EpochPlacer, node_key};
use tokio::sync::Notify;

use super::{Heartbeat, JobFailure, Placements};
use crate::config::Config;
use crate::error::{Code, Error, Result};
use crate::registry::jobs::JobRequest;
pub use dispatch::Dispatch;

struct Node {
    address: String,
    instance: String,
    last: Instant,
    lost: bool,
    report: Heartbeat,
    outbox: Placements,
    notify: Arc<Notify>,
    /// The id of the node's open stream (0: none); only that one drains the outbox.
    stream: u64,
    /// Samples placed on the node (for `/metrics`).
    placed: u64,
}

struct ClusterJob {
    id: u64,
    name: String,
    dataset: String,
    request: JobRequest,
    world: u32,
    /// Global ranks per node.
    nodes: BTreeMap<String, Vec<u32>>,
    subset: Arc<roaring::RoaringBitmap>,
    /// A resumed job: the epoch it continues and the rest of that epoch (its subset minus
    /// the ids its checkpoint handed over), which its first epoch's placement shares.
    resume: Option<(u32, Arc<roaring::RoaringBitmap>)>,
    /// Set when every rank has joined: the nodes in the placer's order.
    placer: Option<(EpochPlacer, Vec<String>)>,
    sampler: Option<Addr<SamplerActor>>,
    /// Credit returned before sampling started.
    pending_credit: u64,
    /// Nodes whose every local rank has attached (they sent their first credit): sampling
    /// starts when all have, so that no node's share is pushed into rings nobody reads yet.
    attached: std::collections::BTreeSet<String>,
    /// Padding records delivered, whose credit the nodes will return but must not count.
    debt: u64,
    failed: Option<String>,
    finished: bool,
    /// Its dataset is read from an object store: its Sampler samples ahead, and the nodes
    /// fetch the picks' bytes before their placement (see `dispatch`).
    remote: bool,
    /// Taken back from the journal after a restart: the nodes' reports, until every node of
    /// the job has sent its own (`journal`).
    restoring: Option<journal::Restoring>,
    /// Epochs the job's nodes had received part of before a restart, by epoch: the records
    /// to skip, where each node's positions go on, which nodes had the end (`journal`).
    restored: BTreeMap<u32, journal::RestoredEpoch>,
    /// When it failed or finished: kept a while for `GET /v1/nodes` and for the nodes that
    /// report it after a restart.
    ended_at: Option<Instant>,
    /// Items of the dataset when the job joined (a restored job keeps them).
    items: u64,
    /// After a rebuild: the credit each node had been granted when it reported (`journal`: a
    /// report sent again adds what was granted since).
    reported: BTreeMap<String, u64>,
}

impl ClusterJob {
    fn live(&self) -> bool {
        self.failed.is_none() && !self.finished
    }

    /// A placer over the nodes that run the job now (whatever nodes ran it before a resume),
    /// in the order of `nodes`, with their names; `resumed`: its first epoch is the rest of
    /// the resumed one.
    fn placer(&self, resumed: bool) -> (EpochPlacer, Vec<String>) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        let keys = names.iter().map(|n| node_key(n)).collect();
        let ranks = self.nodes.values().map(|r| r.len() as u32).collect();
        let mut placer = EpochPlacer::new(self.subset.len(), keys, ranks, self.request.drop_last);
        if let Some((_, rest)) = self.resume.as_ref().filter(|_| resumed) {
            placer = placer.resumed(rest.len());
        }
        (placer, names)
    }

    fn new(name: &str, request: &JobRequest, world: u32) -> Self {
        Self {
            id: 0,
            name: name.to_string(),
            dataset: request.dataset.clone(),
            request: request.clone(),
            world,
            nodes: BTreeMap::new(),
            subset: Arc::default(),
            resume: None,
            placer: None,
            sampler: None,
            pending_credit: 0,
            attached: Default::default(),
            debt: 0,
            failed: None,
            finished: false,
            remote: false,
            restoring: None,
            restored: BTreeMap::new(),
            ended_at: None,
            items: 0,
            reported: BTreeMap::new(),
        }
    }
}

#[derive(Default)]
struct Inner {
    nodes: BTreeMap<String, Node>,
    jobs: HashMap<u64, ClusterJob>,
    /// Live jobs by name.
    names: HashMap<String, u64>,
    next_id: u64,
    samplers: HashMap<String, Addr<SamplerActor>>,
    next_stream: u64,
    /// Where the jobs are journaled (the server's catalog).
    journal: Option<Arc<crate::catalog::Catalog>>,
}

impl Inner {
    /// Keys of the nodes that are alive, for the first hash.
    fn live_keys(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| !n.lost)
            .map(|(name, _)| node_key(name))
            .collect()
    }

    /// Fails a job everywhere: no more sampling, and every node of it is told.
    fn fail(&mut self, id: u64, reason: &str) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if !job.live() {
            return;
        }
        tracing::warn!(job = %job.name, reason, "multi-node job failed");
        job.failed = Some(reason.to_string());
        job.ended_at = Some(Instant::now());
        job.restoring = None;
        if let Some(s) = &job.sampler {
            s.do_send(RemoveJob { job: id });
        }
        self.names.remove(&job.name);
        let nodes: Vec<String> = job.nodes.keys().cloned().collect();
        for node in nodes {
            if let Some(n) = self.nodes.get_mut(&node) {
                n.outbox.failed.push(JobFailure {
                    job: id,
                    reason: reason.to_string(),
                });
                n.notify.notify_one();
            }
        }
        self.journal(id);
    }

    fn fail_jobs_of(&mut self, node: &str, reason: &str) {
        let ids: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.live() && j.nodes.contains_key(node))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.fail(id, reason);
        }
    }

    /// [`Inner::fail_jobs_of`], but for the jobs restoring after a restart.
    fn fail_running_jobs_of(&mut self, node: &str, reason: &str) {
        let ids: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.live() && j.restoring.is_none() && j.nodes.contains_key(node))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.fail(id, reason);
        }
    }

    fn give_credit(&mut self, id: u64, mut n: u64) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let paid = n.min(job.debt);
        job.debt -= paid;
        n -= paid;
        if n == 0 || !job.live() {
            return;
        }
        match &job.sampler {
            Some(s) => s.do_send(JobSignal::Credit {
                job: id,
                n: n.min(u64::from(u32::MAX)) as u32,
            }),
            None => job.pending_credit += n,
        }
    }
}

/// The leader's state (in `AppState::leader`, `crate::state`).
pub struct Leader {
    inner: Mutex<Inner>,
    heartbeat: Duration,
    timeout: Duration,
    /// The cluster Samplers' pass interval.
    tick: Duration,
    dispatch: Mutex<Option<Addr<Dispatch>>>,
    /// The arbiter the cluster Samplers run on (the server's samplers' arbiter).
    arbiter: Mutex<Option<actix::ArbiterHandle>>,
    /// What each live node reports a fetch of each dataset takes there (ms), by dataset, then
    /// node: a cluster Sampler of an object-store dataset samples ahead by the slowest.
    fetch_ms: Arc<Mutex<FetchTimes>>,
    /// This start's generation (`Catalog::next_generation`): nodes refuse an older one.
    generation: u64,
    /// How long the jobs taken back from the journal wait for their nodes.
    grace: Duration,
}

/// Fetch times (ms) by dataset, then node.
type FetchTimes = HashMap<String, BTreeMap<String, f64>>;

/// The clock of a cluster Sampler of `dataset`: the slowest fetch its nodes report.
fn fetch_clock(times: &Arc<Mutex<FetchTimes>>, dataset: &str) -> ::actors::FetchClock {
    let (times, dataset) = (times.clone(), dataset.to_owned());
    Arc::new(move || {
        let times = times.lock().ok()?;
        let slowest = times.get(&dataset)?.values().copied().reduce(f64::max)?;
        Some(Duration::from_secs_f64(slowest.max(0.0) / 1e3))
    })
}

fn lock(l: &Leader) -> Result<std::sync::MutexGuard<'_, Inner>> {
    l.inner.lock().map_err(Error::internal)
}

impl Leader {
    /// The leader of this start: a new generation, and the multi-node jobs its journal holds
    /// (those that were running wait for their nodes, `journal`).
    pub fn new(
        config: &Config,
        catalog: Arc<crate::catalog::Catalog>,
    ) -> anyhow::Result<Arc<Self>> {
        let generation = catalog.next_generation()?;
        let grace = config.leader_grace();
        let mut inner = Inner {
            journal: Some(catalog.clone()),
            ..Inner::default()
        };
        journal::load(&mut inner, &catalog, grace)?;
        tracing::info!(generation, jobs = inner.jobs.len(), "leader started");
        Ok(Arc::new(Self {
            inner: Mutex::new(inner),
            heartbeat: Duration::from_millis(config.heartbeat_ms),
            timeout: Duration::from_millis(config.node_timeout_ms),
            tick: Duration::from_millis(config.sampler_tick_ms),
            dispatch: Mutex::new(None),
            arbiter: Mutex::new(None),
            fetch_ms: Arc::default(),
            generation,
            grace,
        }))
    }

    /// This start's generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn node_mut<'a>(inner: &'a mut Inner, name: &str) -> Result<&'a mut Node> {
        match inner.nodes.get_mut(name) {
            Some(n) if !n.lost => Ok(n),
            _ => Err(Error::new(
                Code::NodeNotFound,
                format!("the leader knows no live node '{name}': register it again"),
            )),
        }
    }

    /// The cluster's figures for `/metrics`: nodes by state, samples placed per node.
    pub fn record_metrics(&self) {
        let Ok(inner) = self.inner.lock() else {
            return;
        };
        let alive = inner.nodes.values().filter(|n| !n.lost).count();
        metrics::gauge!("joader_cluster_nodes", "state" => "alive").set(alive as f64);
        metrics::gauge!("joader_cluster_nodes", "state" => "lost")
            .set((inner.nodes.len() - alive) as f64);
        for (name, n) in &inner.nodes {
            metrics::counter!("joader_cluster_placements_total", "node" => name.clone())
                .absolute(n.placed);
        }
        metrics::gauge!("joader_cluster_generation").set(self.generation as f64);
        let views = inner.job_views();
        for state in ["joining", "running", "restoring", "finished", "failed"] {
            let count = views.iter().filter(|v| v.state == state).count();
            metrics::gauge!("joader_cluster_jobs", "state" => state).set(count as f64);
        }
    }
}
