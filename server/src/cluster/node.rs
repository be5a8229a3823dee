//! A node's agent: registers the node with the leader and heartbeats, forwards the node's
//! ranks of multi-node jobs ([`join_leader`]), fetches the leader's placements for them and
//! gives them to the node's Cache as `Deliver`s (it stands where a local Sampler stands: the
//! Cache returns credit to it, and it returns the credit to the leader).
//!
//! It speaks to the leader with `awc`, actix's asynchronous HTTP client: every request is a
//! future the actor waits for without blocking (one fetch at a time, so that placements
//! arrive in order; credits and heartbeats beside it).
//!
//! Faults: a leader not heard from for `node_timeout_ms` (or that no longer knows this node)
//! fails the node's multi-node jobs with the reason; single-node jobs never depend on it. The
//! agent keeps registering, and rejoins when the leader is back.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ::actors::service::{
    CloseJob, DatasetId, Deliver, DeliverGroup, DeliverItem, EndAt, JobId, JobSignal, JobState,
    JobStats, RemoveJob,
};
use actix::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::*;
use crate::error::{Code, Error, Result};
use crate::registry::AppState;

/// How long a fetch waits at the leader for placements.
const FETCH_WAIT_MS: u64 = 500;

/// An error of a call to the leader: the leader's code, or unreachable.
#[derive(Debug, Clone)]
pub struct CallError {
    pub status: Option<u16>,
    pub code: Option<String>,
    pub message: String,
}

/// POSTs `body` to the leader and reads the JSON answer.
async fn post<T: DeserializeOwned>(
    client: &awc::Client,
    url: String,
    token: Option<&str>,
    timeout: Duration,
    body: &impl Serialize,
) -> std::result::Result<T, CallError> {
    let mut req = client.post(&url).timeout(timeout);
    if let Some(t) = token {
        req = req.insert_header(("authorization", format!("Bearer {t}")));
    }
    let mut resp = req.send_json(body).await.map_err(|e| CallError {
        status: None,
        code: None,
        message: format!("POST {url}: {e}"),
    })?;
    let status = resp.status().as_u16();
    let bytes = resp.body().limit(256 << 20).await.map_err(|e| CallError {
        status: Some(status),
        code: None,
        message: format!("POST {url}: {e}"),
    })?;
    if !(200..300).contains(&status) {
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        return Err(CallError {
            status: Some(status),
            code: v["error"]["code"].as_str().map(String::from),
            message: v["error"]["message"]
                .as_str()
                .unwrap_or("no message")
                .to_string(),
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| CallError {
        status: Some(status),
        code: None,
        message: format!("POST {url}: unexpected answer: {e}"),
    })
}

struct Tracked {
    local: JobId,
    dataset: DatasetId,
    stats: Arc<JobStats>,
}

/// See the module docs.
pub struct NodeAgent {
    state: Weak<AppState>,
    leader: String,
    name: String,
    address: String,
    token: Option<String>,
    heartbeat: Duration,
    timeout: Duration,
    client: awc::Client,
    registered: bool,
    last_contact: Instant,
    jobs: HashMap<u64, Tracked>,
    by_local: HashMap<JobId, u64>,
    credits: HashMap<u64, u32>,
    failures: Vec<JobFailure>,
    sending: bool,
    fetching: bool,
    beating: bool,
    tried: HashSet<String>,
    dataset_errors: HashMap<String, String>,
    /// Registrations being forwarded, and the fetched placements held back meanwhile.
    joining: u32,
    held: Vec<FetchReply>,
}

impl NodeAgent {
    pub fn new(state: &Arc<AppState>, leader: String, address: String) -> Self {
        let c = &state.config;
        Self {
            state: Arc::downgrade(state),
            leader: leader.trim_end_matches('/').to_string(),
            name: c.node_name(),
            address,
            token: c.token.clone(),
            heartbeat: Duration::from_millis(c.heartbeat_ms),
            timeout: Duration::from_millis(c.node_timeout_ms),
            client: awc::Client::default(),
            registered: false,
            last_contact: Instant::now(),
            jobs: HashMap::new(),
            by_local: HashMap::new(),
            credits: HashMap::new(),
            failures: Vec::new(),
            sending: false,
            fetching: false,
            beating: false,
            tried: HashSet::new(),
            dataset_errors: HashMap::new(),
            joining: 0,
            held: Vec::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.leader)
    }

    /// Fails a local multi-node job: its state says why (clients that find their ring closed
    /// read it: `job_failed`), then its rings close.
    fn fail_local(&mut self, cluster: u64, reason: &str) {
        let Some(t) = self.jobs.remove(&cluster) else {
            return;
        };
        self.by_local.remove(&t.local);
        self.credits.remove(&cluster);
        tracing::warn!(job = t.local, reason, "multi-node job failed on this node");
        t.stats
            .set_state(JobState::Failed(format!("job_failed: {reason}")));
        if let Some(state) = self.state.upgrade() {
            state.cache.do_send(CloseJob { job: t.local });
        }
    }

    fn fail_all(&mut self, reason: &str) {
        let ids: Vec<u64> = self.jobs.keys().copied().collect();
        for id in ids {
            self.fail_local(id, reason);
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.last_contact.elapsed() > self.timeout {
            if !self.jobs.is_empty() {
                let reason = format!("the leader {} is unreachable", self.leader);
                self.fail_all(&reason);
            }
            self.registered = false;
        }
        if self.beating {
            return;
        }
        self.beating = true;
        let client = self.client.clone();
        let token = self.token.clone();
        let timeout = self.heartbeat.max(Duration::from_millis(500));
        if !self.registered {
            let url = self.url("/v1/nodes");
            let body = NodeRegistration {
                name: self.name.clone(),
                address: self.address.clone(),
                instance: self
                    .state
                    .upgrade()
                    .map(|s| s.config.instance.clone())
                    .unwrap_or_default(),
            };
            let fut = async move {
                post::<NodeRegistered>(&client, url, token.as_deref(), timeout, &body).await
            };
            ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
                act.beating = false;
                match res {
                    Ok(_) => {
                        tracing::info!(leader = %act.leader, node = %act.name, "registered with the leader");
                        // A leader that lost this node lost its jobs too.
                        act.fail_all("the node registered again with the leader");
                        act.registered = true;
                        act.last_contact = Instant::now();
                        act.fetch(ctx);
                    }
                    Err(e) => tracing::debug!(error = %e.message, "cannot register with the leader"),
                }
            }));
        } else {
            let url = self.url(&format!("/v1/nodes/{}/heartbeat", self.name));
            let body = self.report();
            let fut = async move {
                post::<HeartbeatReply>(&client, url, token.as_deref(), timeout, &body).await
            };
            ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
                act.beating = false;
                match res {
                    Ok(reply) => {
                        act.last_contact = Instant::now();
                        act.sync_datasets(reply.datasets, ctx);
                    }
                    Err(e) if e.status == Some(404) => {
                        act.fail_all("the leader no longer knows this node (it restarted)");
                        act.registered = false;
                    }
                    Err(e) => tracing::debug!(error = %e.message, "heartbeat failed"),
                }
            }));
        }
    }

    /// The node's cache use and datasets, for the leader's `GET /v1/nodes`.
    fn report(&self) -> Heartbeat {
        let Some(state) = self.state.upgrade() else {
            return Heartbeat::default();
        };
        let mut datasets: Vec<NodeDataset> = state
            .inner
            .lock()
            .map(|i| {
                i.datasets
                    .values()
                    .map(|d| NodeDataset {
                        name: d.record.name.clone(),
                        state: d.record.state.clone(),
                        error: d.record.error.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        datasets.extend(self.dataset_errors.iter().map(|(n, e)| NodeDataset {
            name: n.clone(),
            state: "failed".into(),
            error: Some(e.clone()),
        }));
        Heartbeat {
            cache_bytes_in_use: state.stats.bytes_in_use.load(Relaxed),
            cache_capacity_bytes: state.stats.capacity_bytes.load(Relaxed),
            datasets,
        }
    }

    /// Creates the leader's datasets this node does not have (indexed from the same source).
    fn sync_datasets(&mut self, datasets: Vec<ClusterDataset>, ctx: &mut Context<Self>) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        for d in datasets {
            let known = state
                .inner
                .lock()
                .is_ok_and(|i| i.datasets.contains_key(&d.name));
            if known || !self.tried.insert(d.name.clone()) {
                continue;
            }
            let (st, name) = (state.clone(), d.name.clone());
            let created = actix_web::rt::task::spawn_blocking(move || {
                crate::registry::datasets::create_dataset(&st, name, d.source)
            });
            let name = d.name;
            actix_web::rt::spawn({
                let agent = ctx.address();
                async move {
                    let err = match created.await {
                        Ok(Ok(())) => return,
                        Ok(Err(e)) => e.message,
                        Err(e) => e.to_string(),
                    };
                    tracing::warn!(dataset = %name, error = %err, "cannot create the leader's dataset on this node");
                    agent.do_send(DatasetFailed { name, error: err });
                }
            });
        }
    }

    /// One long-polled fetch at a time; the next one as soon as it answers.
    fn fetch(&mut self, ctx: &mut Context<Self>) {
        if self.fetching || !self.registered {
            return;
        }
        self.fetching = true;
        let url = self.url(&format!("/v1/nodes/{}/fetch", self.name));
        let body = Fetch {
            jobs: self.jobs.keys().copied().collect(),
            wait_ms: FETCH_WAIT_MS,
        };
        let (client, token) = (self.client.clone(), self.token.clone());
        let timeout = Duration::from_millis(FETCH_WAIT_MS) + self.timeout;
        let fut =
            async move { post::<FetchReply>(&client, url, token.as_deref(), timeout, &body).await };
        ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
            act.fetching = false;
            match res {
                Ok(reply) => {
                    act.last_contact = Instant::now();
                    if act.joining > 0 {
                        act.held.push(reply);
                    } else {
                        act.apply(reply);
                    }
                    act.fetch(ctx);
                }
                Err(e) => {
                    if e.status == Some(404) {
                        act.registered = false;
                    }
                    tracing::debug!(error = %e.message, "fetch failed");
                    ctx.run_later(Duration::from_millis(100), |act, ctx| act.fetch(ctx));
                }
            }
        }));
    }

    /// Hands fetched placements to the Cache, one `Deliver` per local dataset, in order.
    /// A job whose end (`finished`) is handed over is no longer tracked: the leader forgets it,
    /// and its ranks may read their last records long after. Failures come last, so that a
    /// job that finished in this reply is not failed by the leader's not knowing it any more.
    fn apply(&mut self, reply: FetchReply) {
        self.deliver(&reply);
        for e in reply.ends.iter().filter(|e| e.finished) {
            if let Some(t) = self.jobs.remove(&e.job) {
                self.by_local.remove(&t.local);
                self.credits.remove(&e.job);
            }
        }
        for f in &reply.failed {
            self.fail_local(f.job, &f.reason);
        }
    }

    fn deliver(&mut self, reply: &FetchReply) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let mut out: HashMap<DatasetId, Deliver> = HashMap::new();
        let mut ends = reply.ends.iter().peekable();
        let end_to =
            |out: &mut HashMap<DatasetId, Deliver>, jobs: &HashMap<u64, Tracked>, e: &WireEnd| {
                if let Some(t) = jobs.get(&e.job) {
                    let d = out.entry(t.dataset).or_insert_with(|| empty(t.dataset));
                    d.ends.push(EndAt {
                        after: d.groups.len(),
                        job: t.local,
                        epoch: e.epoch,
                        finished: e.finished,
                    });
                }
            };
        for (gi, g) in reply.groups.iter().enumerate() {
            while let Some(e) = ends.next_if(|e| e.after <= gi) {
                end_to(&mut out, &self.jobs, e);
            }
            let mut per: HashMap<DatasetId, DeliverGroup> = HashMap::new();
            for it in &g.items {
                let Some(t) = self.jobs.get(&it.job) else {
                    continue;
                };
                t.stats.sampled.fetch_add(1, Relaxed);
                t.stats.epoch.store(u64::from(it.epoch), Relaxed);
                t.stats.position.store(u64::from(it.position), Relaxed);
                per.entry(t.dataset)
                    .or_insert_with(|| DeliverGroup {
                        element: g.element,
                        need: g.need,
                        items: Vec::new(),
                    })
                    .items
                    .push(DeliverItem {
                        job: t.local,
                        epoch: it.epoch,
                        position: it.position,
                    });
            }
            for (ds, grp) in per {
                out.entry(ds).or_insert_with(|| empty(ds)).groups.push(grp);
            }
        }
        for e in ends {
            end_to(&mut out, &self.jobs, e);
        }
        for (_, d) in out {
            state.cache.do_send(d);
        }
    }

    /// Sends the credit and failures gathered so far (one report at a time).
    fn send_credits(&mut self, ctx: &mut Context<Self>) {
        let tracked_credit = self.credits.keys().any(|k| self.jobs.contains_key(k));
        if self.sending || !self.registered || (!tracked_credit && self.failures.is_empty()) {
            return;
        }
        self.sending = true;
        // Credit of jobs not tracked yet (placeholder keys) waits for `Joined`.
        let ready: Vec<u64> = self
            .credits
            .keys()
            .copied()
            .filter(|k| self.jobs.contains_key(k))
            .collect();
        let body = CreditReport {
            credits: ready
                .into_iter()
                .filter_map(|job| self.credits.remove(&job).map(|n| Credit { job, n }))
                .collect(),
            failed: std::mem::take(&mut self.failures),
        };
        let url = self.url(&format!("/v1/nodes/{}/credits", self.name));
        let (client, token, timeout) = (self.client.clone(), self.token.clone(), self.timeout);
        let fut = async move {
            let r = post::<serde_json::Value>(&client, url, token.as_deref(), timeout, &body).await;
            (r, body)
        };
        ctx.spawn(fut.into_actor(self).map(|(res, body), act, ctx| {
            act.sending = false;
            match res {
                Ok(_) => act.send_credits(ctx),
                Err(e) => {
                    tracing::debug!(error = %e.message, "cannot return credit to the leader");
                    // Kept for the next try (jobs that fail meanwhile drop theirs).
                    for c in body.credits {
                        if act.jobs.contains_key(&c.job) {
                            *act.credits.entry(c.job).or_default() += c.n;
                        }
                    }
                    act.failures.extend(body.failed);
                    ctx.run_later(Duration::from_millis(100), |act, ctx| act.send_credits(ctx));
                }
            }
        }));
    }

    /// A local job left (its client died or it was deleted): the leader fails it everywhere.
    fn local_gone(&mut self, local: JobId, reason: &str, ctx: &mut Context<Self>) {
        if let Some(cluster) = self.by_local.remove(&local) {
            self.jobs.remove(&cluster);
            self.credits.remove(&cluster);
            self.failures.push(JobFailure {
                job: cluster,
                reason: reason.to_string(),
            });
            self.send_credits(ctx);
        }
    }
}

fn empty(dataset: DatasetId) -> Deliver {
    Deliver {
        dataset,
        groups: Vec::new(),
        ends: Vec::new(),
    }
}

impl Actor for NodeAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.tick(ctx);
        ctx.run_interval(self.heartbeat, |act, ctx| act.tick(ctx));
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct DatasetFailed {
    name: String,
    error: String,
}

impl Handler<DatasetFailed> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: DatasetFailed, _: &mut Context<Self>) {
        self.dataset_errors.insert(msg.name, msg.error);
    }
}

/// Registry → agent: a local job is being forwarded to the leader. Until [`Joined`],
/// fetched placements are held back (the leader may place the job's first samples before the
/// agent knows the job's id).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Joining;

impl Handler<Joining> for NodeAgent {
    type Result = ();
    fn handle(&mut self, _: Joining, _: &mut Context<Self>) {
        self.joining += 1;
    }
}

/// Registry → agent: the forwarding ended; with `Some`, serve the local job's deliveries from
/// the leader's placements.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Joined(pub Option<Track>);

pub struct Track {
    pub cluster: u64,
    pub local: JobId,
    pub dataset: DatasetId,
    pub stats: Arc<JobStats>,
}

impl Handler<Joined> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: Joined, ctx: &mut Context<Self>) {
        self.joining = self.joining.saturating_sub(1);
        if let Some(t) = msg.0 {
            self.by_local.insert(t.local, t.cluster);
            self.jobs.insert(
                t.cluster,
                Tracked {
                    local: t.local,
                    dataset: t.dataset,
                    stats: t.stats,
                },
            );
            // Credit granted before the job was tracked.
            if let Some(n) = self.credits.remove(&(u64::MAX - t.local)) {
                *self.credits.entry(t.cluster).or_default() += n;
            }
            self.send_credits(ctx);
        }
        if self.joining == 0 {
            for reply in std::mem::take(&mut self.held) {
                self.apply(reply);
            }
        }
    }
}

impl Handler<JobSignal> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: JobSignal, ctx: &mut Context<Self>) {
        match msg {
            JobSignal::Credit { job, n } => {
                // The Cache may grant credit before the registry tracks the job (its clients
                // attached at once): kept under a placeholder key until `Track`.
                let key = self.by_local.get(&job).copied().unwrap_or(u64::MAX - job);
                *self.credits.entry(key).or_default() += n;
                if self.by_local.contains_key(&job) {
                    self.send_credits(ctx);
                }
            }
            JobSignal::Gone { job } => self.local_gone(job, "a rank's client left or died", ctx),
        }
    }
}

impl Handler<RemoveJob> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: RemoveJob, ctx: &mut Context<Self>) {
        self.local_gone(msg.job, "the job was deleted on a node", ctx);
    }
}

/// Forwards this node's ranks of a multi-node job to the leader; returns the leader's id of
/// the job. The leader's refusals keep their code; an unreachable leader is
/// `leader_unreachable`.
pub async fn join_leader(state: &AppState, body: NodeJob) -> Result<u64> {
    let leader = state
        .leader_url
        .clone()
        .ok_or_else(|| Error::internal("no leader URL"))?;
    let url = format!("{leader}/v1/nodes/{}/jobs", state.config.node_name());
    let client = awc::Client::default();
    let timeout = Duration::from_millis(state.config.node_timeout_ms).max(Duration::from_secs(10));
    match post::<NodeJobAccepted>(&client, url, state.config.token.as_deref(), timeout, &body).await
    {
        Ok(a) => Ok(a.job),
        Err(e) => {
            let code = e
                .code
                .as_deref()
                .and_then(|c| Code::ALL.iter().copied().find(|k| k.as_str() == c));
            Err(match (e.status, code) {
                (None, _) => Error::new(
                    Code::LeaderUnreachable,
                    format!("cannot reach the leader {leader}: {}", e.message),
                ),
                (_, Some(Code::NodeNotFound)) => Error::new(
                    Code::LeaderUnreachable,
                    format!(
                        "this node is not registered with the leader yet: {}",
                        e.message
                    ),
                ),
                (_, Some(c)) => Error::new(c, format!("the leader refused: {}", e.message)),
                (_, None) => Error::new(Code::Internal, format!("the leader: {}", e.message)),
            })
        }
    }
}
