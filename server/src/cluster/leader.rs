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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::actors::service::{AddJob, Deliver, JobSignal, JobStats, RemoveJob, SamplerActor};
use actix::prelude::*;
use joader_core::cluster::{EpochPlacer, node_key};
use joader_core::sampling::SamplerKind;
use tokio::sync::Notify;

use super::*;
use crate::error::{Code, Error, Result};
use crate::registry::AppState;

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
    name: String,
    dataset: String,
    request: JobRequest,
    world: u32,
    /// Global ranks per node.
    nodes: BTreeMap<String, Vec<u32>>,
    subset: Arc<roaring::RoaringBitmap>,
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
}

impl ClusterJob {
    fn live(&self) -> bool {
        self.failed.is_none() && !self.finished
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
        if let Some(s) = &job.sampler {
            s.do_send(RemoveJob { job: id });
        }
        self.names.remove(&job.name);
        for node in job.nodes.keys() {
            if let Some(n) = self.nodes.get_mut(node) {
                n.outbox.failed.push(JobFailure {
                    job: id,
                    reason: reason.to_string(),
                });
                n.notify.notify_one();
            }
        }
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

/// The leader's state (in `AppState::leader`).
pub struct Leader {
    inner: Mutex<Inner>,
    heartbeat: Duration,
    timeout: Duration,
    /// The cluster Samplers' pass interval.
    tick: Duration,
    dispatch: Mutex<Option<Addr<Dispatch>>>,
    /// The arbiter the cluster Samplers run on (the server's samplers' arbiter).
    arbiter: Mutex<Option<actix::ArbiterHandle>>,
}

fn lock(l: &Leader) -> Result<std::sync::MutexGuard<'_, Inner>> {
    l.inner.lock().map_err(Error::internal)
}

impl Leader {
    pub fn new(config: &crate::Config) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            heartbeat: Duration::from_millis(config.heartbeat_ms),
            timeout: Duration::from_millis(config.node_timeout_ms),
            tick: Duration::from_millis(config.sampler_tick_ms),
            dispatch: Mutex::new(None),
            arbiter: Mutex::new(None),
        })
    }

    /// Starts the dispatcher (and its watch of the nodes' heartbeats) on the cluster
    /// Samplers' arbiter: a pass's `Deliver` reaches it without waking another thread.
    pub fn start(self: &Arc<Self>, samplers: actix::ArbiterHandle) {
        if let Ok(mut a) = self.arbiter.lock() {
            *a = Some(samplers.clone());
        }
        let leader = self.clone();
        let addr = Dispatch::start_in_arbiter(&samplers, move |_| Dispatch { leader });
        if let Ok(mut d) = self.dispatch.lock() {
            *d = Some(addr);
        }
    }

    /// `POST /v1/nodes`. A node that registers again (it restarted) loses its running jobs.
    pub fn register(&self, reg: NodeRegistration) -> Result<NodeRegistered> {
        crate::registry::check_name("node", &reg.name)?;
        let mut inner = lock(self)?;
        // The node's count goes on across its restarts (a counter never goes down).
        let placed = inner.nodes.get(&reg.name).map_or(0, |n| n.placed);
        if inner.nodes.contains_key(&reg.name) {
            inner.fail_jobs_of(
                &reg.name,
                &format!("node {} restarted (it registered again)", reg.name),
            );
        }
        tracing::info!(node = %reg.name, address = %reg.address, "node registered");
        inner.nodes.insert(
            reg.name.clone(),
            Node {
                address: reg.address,
                instance: reg.instance,
                last: Instant::now(),
                lost: false,
                report: Heartbeat::default(),
                outbox: Placements::default(),
                notify: Arc::new(Notify::new()),
                stream: 0,
                placed,
            },
        );
        Ok(NodeRegistered {
            name: reg.name,
            heartbeat_ms: self.heartbeat.as_millis() as u64,
            timeout_ms: self.timeout.as_millis() as u64,
        })
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

    /// `POST /v1/nodes/{name}/heartbeat`: the leader's datasets in return.
    pub fn heartbeat(&self, state: &AppState, name: &str, hb: Heartbeat) -> Result<HeartbeatReply> {
        {
            let mut inner = lock(self)?;
            let node = Self::node_mut(&mut inner, name)?;
            node.last = Instant::now();
            node.report = hb;
        }
        let inner = state.inner.lock().map_err(Error::internal)?;
        Ok(HeartbeatReply {
            datasets: inner
                .datasets
                .values()
                .map(|d| ClusterDataset {
                    name: d.record.name.clone(),
                    source: d.record.source.clone(),
                })
                .collect(),
        })
    }

    /// `GET /v1/nodes`.
    pub fn nodes(&self) -> Result<Vec<NodeView>> {
        let inner = lock(self)?;
        let now = Instant::now();
        Ok(inner
            .nodes
            .iter()
            .map(|(name, n)| NodeView {
                name: name.clone(),
                address: n.address.clone(),
                instance: n.instance.clone(),
                state: if n.lost { "lost" } else { "alive" }.into(),
                last_heartbeat_ms_ago: now.duration_since(n.last).as_millis() as u64,
                jobs: inner
                    .jobs
                    .values()
                    .filter(|j| j.live() && j.nodes.contains_key(name))
                    .map(|j| j.name.clone())
                    .collect(),
                cache_bytes_in_use: n.report.cache_bytes_in_use,
                cache_capacity_bytes: n.report.cache_capacity_bytes,
                datasets: n.report.datasets.clone(),
            })
            .collect())
    }

    /// Credit returned by a node and the jobs that failed there (a frame of its stream).
    fn credits(&self, name: &str, report: CreditReport) -> Result<()> {
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, name)?.last = Instant::now();
        for f in report.failed {
            inner.fail(f.job, &format!("on node {name}: {}", f.reason));
        }
        for c in report.credits {
            if let Some(j) = inner.jobs.get_mut(&c.job)
                && j.nodes.contains_key(name)
            {
                j.attached.insert(name.to_string());
            }
            inner.give_credit(c.job, u64::from(c.n));
            self.start_if_complete(&mut inner, c.job)?;
        }
        Ok(())
    }

    /// Refuses a stream for a node the leader does not know (before the WebSocket upgrade).
    pub fn check_node(&self, name: &str) -> Result<()> {
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, name).map(|_| ())
    }

    /// Opens a stream for the node: its id, and what wakes it when placements are queued. A
    /// stream that replaces an open one (the node lost it without the leader noticing) fails
    /// the node's jobs first, since frames sent into the old one may be lost; what was queued
    /// for them is dropped, not the notices of jobs that failed.
    pub fn open_stream(&self, name: &str) -> Result<(u64, Arc<Notify>)> {
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, name)?;
        if inner.nodes.get(name).is_some_and(|n| n.stream != 0) {
            inner.fail_jobs_of(name, &format!("node {name} opened a new stream"));
            if let Some(n) = inner.nodes.get_mut(name) {
                n.outbox.groups.clear();
                n.outbox.ends.clear();
            }
        }
        inner.next_stream += 1;
        let id = inner.next_stream;
        let node = Self::node_mut(&mut inner, name)?;
        node.stream = id;
        node.last = Instant::now();
        // Its own wake-ups: an old stream still waiting must not take the new one's.
        node.notify = Arc::new(Notify::new());
        Ok((id, node.notify.clone()))
    }

    /// What is queued for stream `id` of the node (`None` once the stream is not the node's).
    fn take(&self, name: &str, id: u64) -> Option<Placements> {
        let mut inner = self.inner.lock().ok()?;
        let node = inner.nodes.get_mut(name).filter(|n| n.stream == id)?;
        node.placed += node
            .outbox
            .groups
            .iter()
            .map(|g| g.items.len() as u64)
            .sum::<u64>();
        Some(std::mem::take(&mut node.outbox))
    }

    /// The node's stream `id` ended: when it is still the node's, its jobs fail; a stream
    /// that broke (the node's process died, or the connection) makes the node lost, as a
    /// silent one: it registers again to go on.
    fn stream_ended(&self, name: &str, id: u64, why: &str, broke: bool) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let Some(node) = inner.nodes.get_mut(name).filter(|n| n.stream == id) else {
            return;
        };
        node.stream = 0;
        if broke {
            tracing::warn!(node = name, why, "node lost: its stream broke");
            node.lost = true;
            inner.fail_jobs_of(name, &format!("node {name} lost: its stream {why}"));
        } else {
            tracing::info!(node = name, why, "node stream ended");
            inner.fail_jobs_of(name, &format!("the stream of node {name} ended: {why}"));
        }
    }

    /// Serves the node's stream `id` until it ends: writes the outbox as passes fill it, reads
    /// the node's credit reports. Runs on the HTTP worker that upgraded the request.
    pub async fn serve_stream(
        self: Arc<Self>,
        state: Arc<AppState>,
        name: String,
        id: u64,
        notify: Arc<Notify>,
        mut session: actix_ws::Session,
        mut frames: actix_ws::MessageStream,
    ) {
        use actix_ws::Message;
        let mut sent = Instant::now();
        // Why it ended, and whether it broke (rather than the node closing it).
        let (why, broke) = loop {
            let Some(out) = self.take(&name, id) else {
                break ("replaced".to_string(), false);
            };
            if !out.is_empty() {
                let text = match serde_json::to_string(&out) {
                    Ok(t) => t,
                    Err(e) => break (format!("cannot encode placements: {e}"), false),
                };
                if session.text(text).await.is_err() {
                    break ("it broke".into(), true);
                }
                sent = Instant::now();
                continue;
            }
            if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
                break ("the leader is stopping".into(), false);
            }
            let idle = (sent + self.heartbeat).saturating_duration_since(Instant::now());
            tokio::select! {
                _ = notify.notified() => {}
                m = frames.recv() => match m {
                    Some(Ok(Message::Text(t))) => {
                        if let Err(e) = self.report(&name, t.as_bytes()) {
                            break (e, true);
                        }
                    }
                    Some(Ok(Message::Binary(b))) => {
                        if let Err(e) = self.report(&name, &b) {
                            break (e, true);
                        }
                    }
                    Some(Ok(Message::Ping(p))) => {
                        let _ = session.pong(&p).await;
                    }
                    Some(Ok(Message::Close(_))) => break ("the node closed it".into(), false),
                    None => break ("it broke".into(), true),
                    Some(Err(e)) => break (format!("it broke: {e}"), true),
                    Some(Ok(_)) => {}
                },
                _ = tokio::time::sleep(idle) => {
                    if session.ping(b"").await.is_err() {
                        break ("it broke".into(), true);
                    }
                    sent = Instant::now();
                }
            }
        };
        self.stream_ended(&name, id, &why, broke);
        let _ = session.close(None).await;
    }

    /// One credit report read from a node's stream.
    fn report(&self, name: &str, frame: &[u8]) -> std::result::Result<(), String> {
        let report: CreditReport = serde_json::from_slice(frame)
            .map_err(|e| format!("the node sent an unreadable report: {e}"))?;
        self.credits(name, report).map_err(|e| e.message)
    }

    /// `POST /v1/nodes/{name}/jobs`: a node's ranks of a multi-node job; sampling starts when
    /// every rank of the job has joined and every node's ranks have attached.
    pub async fn join(
        &self,
        state: &AppState,
        node: &str,
        req: NodeJob,
    ) -> Result<NodeJobAccepted> {
        let mut identity = req.job.identity();
        identity.local_world_size = None;
        let world = identity.world_size.unwrap_or(1);
        let (index, ready_len) = {
            let inner = state.inner.lock().map_err(Error::internal)?;
            let d = inner
                .datasets
                .get(&identity.dataset)
                .ok_or_else(|| Error::dataset_not_found(&identity.dataset))?;
            let index = d.index.clone().ok_or_else(|| {
                Error::new(
                    Code::DatasetNotReady,
                    format!(
                        "dataset '{}' is {} on the leader",
                        identity.dataset, d.record.state
                    ),
                )
            })?;
            let len = index.len() as u64;
            (index, len)
        };
        if req.items != ready_len {
            return Err(Error::new(
                Code::NodeMismatch,
                format!(
                    "node {node} indexed {} items of dataset '{}' and the leader {ready_len}: \
                     every node must read the same source",
                    req.items, identity.dataset
                ),
            ));
        }
        if req.ranks.is_empty() || req.ranks.iter().any(|&r| r >= world) {
            return Err(Error::new(
                Code::InvalidRequest,
                format!("ranks {:?} must be some of 0..{world}", req.ranks),
            ));
        }
        let spec = identity.subset.clone();
        let subset = actix_web::rt::task::spawn_blocking(move || {
            let len = index.len() as u32;
            match &spec {
                None => Ok((0..len).collect::<roaring::RoaringBitmap>()),
                Some(s) => s.resolve(len, |e| index.label(e).unwrap_or(-1), index.classes()),
            }
        })
        .await
        .map_err(Error::internal)??;
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, node)?;
        let id = match inner.names.get(&identity.name).copied() {
            Some(id) => {
                let job = inner
                    .jobs
                    .get_mut(&id)
                    .ok_or_else(|| Error::internal("lost job"))?;
                if job.request != identity {
                    return Err(Error::new(
                        Code::JobExists,
                        format!(
                            "multi-node job '{}' runs with other parameters: every rank must \
                             send the same ones",
                            identity.name
                        ),
                    ));
                }
                let taken: Vec<u32> = job
                    .nodes
                    .iter()
                    .filter(|(n, _)| n.as_str() != node)
                    .flat_map(|(_, r)| r.iter().copied())
                    .collect();
                if job.placer.is_some() || req.ranks.iter().any(|r| taken.contains(r)) {
                    return Err(Error::new(
                        Code::NodeMismatch,
                        format!(
                            "ranks {:?} of job '{}' are already served by another node",
                            req.ranks, identity.name
                        ),
                    ));
                }
                job.nodes.insert(node.to_string(), req.ranks.clone());
                id
            }
            None => {
                // Ids do not repeat across the leader's restarts (they start at the first
                // job's time in s × 2^20, below 2^53 for JSON readers), so a node's job the
                // leader does not know is one it forgot.
                if inner.next_id == 0 {
                    let secs = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(1, |d| d.as_secs());
                    inner.next_id = secs << 20;
                }
                inner.next_id += 1;
                let id = inner.next_id;
                inner.names.insert(identity.name.clone(), id);
                inner.jobs.insert(
                    id,
                    ClusterJob {
                        name: identity.name.clone(),
                        dataset: identity.dataset.clone(),
                        request: identity.clone(),
                        world,
                        nodes: BTreeMap::from([(node.to_string(), req.ranks.clone())]),
                        subset: Arc::new(subset),
                        placer: None,
                        sampler: None,
                        pending_credit: 0,
                        attached: Default::default(),
                        debt: 0,
                        failed: None,
                        finished: false,
                    },
                );
                id
            }
        };
        self.start_if_complete(&mut inner, id)?;
        tracing::info!(job = %identity.name, node, ranks = ?req.ranks, "node joined a multi-node job");
        Ok(NodeJobAccepted { job: id })
    }

    /// Once every rank has joined and attached: the placer over the job's nodes, and the job in its
    /// dataset's cluster Sampler.
    fn start_if_complete(&self, inner: &mut Inner, id: u64) -> Result<()> {
        let arbiter = self
            .arbiter
            .lock()
            .map_err(Error::internal)?
            .clone()
            .ok_or_else(|| Error::internal("the leader is not started"))?;
        let dispatch = self
            .dispatch
            .lock()
            .map_err(Error::internal)?
            .clone()
            .ok_or_else(|| Error::internal("the dispatcher is not running"))?;
        let Some(job) = inner.jobs.get(&id) else {
            return Ok(());
        };
        let joined: u32 = job.nodes.values().map(|r| r.len() as u32).sum();
        if joined < job.world || job.attached.len() < job.nodes.len() || job.placer.is_some() {
            return Ok(());
        }
        let dataset = job.dataset.clone();
        let sampler = inner
            .samplers
            .entry(dataset)
            .or_insert_with(|| {
                let tick = self.tick;
                let stats = Arc::new(::actors::service::CacheStats::default());
                SamplerActor::start_in_arbiter(&arbiter, move |_| {
                    SamplerActor::new(0, dispatch.recipient(), tick, stats)
                })
            })
            .clone();
        let job = inner
            .jobs
            .get_mut(&id)
            .ok_or_else(|| Error::internal("lost job"))?;
        let names: Vec<String> = job.nodes.keys().cloned().collect();
        let keys = names.iter().map(|n| node_key(n)).collect();
        let ranks = job.nodes.values().map(|r| r.len() as u32).collect();
        job.placer = Some((
            EpochPlacer::new(job.subset.len(), keys, ranks, job.request.drop_last),
            names,
        ));
        sampler.do_send(AddJob {
            job: id,
            subset: job.subset.clone(),
            seed: job.request.seed,
            epochs: job.request.epochs,
            sampler: job.request.sampler.unwrap_or(SamplerKind::Dsa),
            credit: job.pending_credit.min(u64::from(u32::MAX)) as u32,
            // No sampling ahead of credit across the network: a node's credit is what its
            // rings can take (the pace joins of one server need its Cache's queue).
            lookahead: 0,
            stats: Arc::new(JobStats::default()),
            resume: None,
            replay: None,
            record: None,
        });
        job.pending_credit = 0;
        job.sampler = Some(sampler);
        tracing::info!(job = %job.name, nodes = job.nodes.len(), world = job.world, "multi-node job sampling");
        Ok(())
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
    }

    /// Marks nodes silent for longer than the timeout lost, failing their jobs.
    fn watch(&self) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let now = Instant::now();
        let lost: Vec<String> = inner
            .nodes
            .iter()
            .filter(|(_, n)| !n.lost && now.duration_since(n.last) > self.timeout)
            .map(|(name, _)| name.clone())
            .collect();
        for name in lost {
            tracing::warn!(node = %name, "node lost: no heartbeat within the timeout");
            if let Some(n) = inner.nodes.get_mut(&name) {
                n.lost = true;
            }
            inner.fail_jobs_of(&name, &format!("node {name} stopped heartbeating (lost)"));
        }
        // Forget ended jobs (their nodes were told).
        inner.jobs.retain(|_, j| j.live());
    }

    /// Places the deliveries of one pass of a cluster Sampler.
    fn place(&self, msg: Deliver) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let all = inner.live_keys();
        let mut credit_back: Vec<u64> = Vec::new();
        let mut ends = msg.ends.iter().peekable();
        for (gi, group) in msg.groups.iter().enumerate() {
            while let Some(end) = ends.next_if(|e| e.after <= gi) {
                end_epoch(&mut inner, end);
            }
            let mut per_node: BTreeMap<String, WireGroup> = BTreeMap::new();
            for item in &group.items {
                let Some(job) = inner.jobs.get_mut(&item.job).filter(|j| j.live()) else {
                    continue;
                };
                let Some((placer, names)) = job.placer.as_mut() else {
                    continue;
                };
                match placer.assign(&all, group.element) {
                    Some(p) => per_node
                        .entry(names[p.node].clone())
                        .or_insert_with(|| WireGroup {
                            element: group.element,
                            need: group.need,
                            items: Vec::new(),
                        })
                        .items
                        .push(WireItem {
                            job: item.job,
                            epoch: item.epoch,
                            position: p.position,
                        }),
                    // drop_last's tail: never delivered, its credit goes back.
                    None => credit_back.push(item.job),
                }
            }
            for (node, g) in per_node {
                if let Some(n) = inner.nodes.get_mut(&node) {
                    n.outbox.groups.push(g);
                }
            }
        }
        for end in ends {
            end_epoch(&mut inner, end);
        }
        for id in credit_back {
            inner.give_credit(id, 1);
        }
        for n in inner.nodes.values() {
            n.notify.notify_one();
        }
    }
}

/// A job's epoch ended: pad its nodes to their quota, then end the epoch on each.
fn end_epoch(inner: &mut Inner, end: &::actors::service::EndAt) {
    let Some(job) = inner.jobs.get_mut(&end.job).filter(|j| j.live()) else {
        return;
    };
    let Some((placer, names)) = job.placer.as_mut() else {
        return;
    };
    let pad = placer.end_epoch();
    job.debt += pad.len() as u64;
    let names = names.clone();
    if end.finished {
        job.finished = true;
        let name = job.name.clone();
        inner.names.remove(&name);
    }
    for p in pad {
        if let Some(n) = inner.nodes.get_mut(&names[p.node]) {
            n.outbox.groups.push(WireGroup {
                element: p.element,
                need: 0,
                items: vec![WireItem {
                    job: end.job,
                    epoch: end.epoch,
                    position: p.position,
                }],
            });
        }
    }
    for name in &names {
        if let Some(n) = inner.nodes.get_mut(name) {
            n.outbox.ends.push(WireEnd {
                after: n.outbox.groups.len(),
                job: end.job,
                epoch: end.epoch,
                finished: end.finished,
            });
        }
    }
}

/// Receives the cluster Samplers' passes and places them; watches the heartbeats.
pub struct Dispatch {
    leader: Arc<Leader>,
}

impl Actor for Dispatch {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every = (self.leader.heartbeat / 2).max(Duration::from_millis(50));
        ctx.run_interval(every, |act, _| act.leader.watch());
    }
}

impl Handler<Deliver> for Dispatch {
    type Result = ();
    fn handle(&mut self, msg: Deliver, _: &mut Context<Self>) {
        self.leader.place(msg);
    }
}

/// The leader of this server, or `not_a_leader`.
pub fn of(state: &AppState) -> Result<&Arc<Leader>> {
    state.leader.as_ref().ok_or_else(|| {
        Error::new(
            Code::NotALeader,
            format!(
                "this server follows {}: send cluster requests to the leader",
                state.config.leader.as_deref().unwrap_or("a leader")
            ),
        )
    })
}
