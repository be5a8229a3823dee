//! A node's agent: registers the node with the leader and heartbeats, forwards the node's
//! ranks of multi-node jobs ([`join_leader`]), receives the leader's placements for them and
//! gives them to the node's Cache as `Deliver`s (it stands where a local Sampler stands: the
//! Cache returns credit to it, and it returns the credit to the leader).
//!
//! It speaks to the leader with `awc`, actix's asynchronous HTTP client, never blocking the
//! actor: registration, heartbeats and forwarding are requests; placements and credit travel
//! on the node's stream, one WebSocket opened while the node has multi-node jobs (or is
//! joining one) and closed when it has had none for two heartbeats. The stream's task
//! ([`run_link`]) turns the leader's frames into [`Placed`] messages, in order, and writes the
//! credit the actor hands it, merging what accumulated while it was writing into one frame.
//!
//! Faults: a leader not heard from for `node_timeout_ms` (or that no longer knows this node),
//! or a stream that breaks, ends or stays silent as long (the leader pings an idle one every
//! heartbeat), fails the node's multi-node jobs with the reason; single-node jobs never depend
//! on it. The agent keeps registering, and rejoins when the leader is back.

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

/// The largest frame of a node stream (a drain of an outbox the node was slow to read can be
/// large; the leader's requests' bodies had the same bound).
pub const MAX_FRAME: usize = 256 << 20;

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

/// awc's client with `TCP_NODELAY` on its connections: a stream writes small frames back to
/// back, which Nagle's algorithm would hold until the leader acknowledged the previous one
/// (a request waits for its answer, so requests never met it).
fn client() -> awc::Client {
    use actix_service::ServiceExt;
    use actix_tls::connect::{Connection, ConnectorService};
    let tcp = ConnectorService::default().map(
        |c: Connection<awc::http::Uri, actix_web::rt::net::TcpStream>| {
            let _ = c.io_ref().set_nodelay(true);
            c
        },
    );
    awc::Client::builder()
        .connector(awc::Connector::new().connector(tcp))
        .finish()
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
    /// The node's stream while it is open.
    link: Option<Link>,
    links: u64,
    /// Heartbeats the open stream has had nothing to carry.
    idle: u32,
    beating: bool,
    tried: HashSet<String>,
    dataset_errors: HashMap<String, String>,
    /// Registrations being forwarded, and the fetched placements held back meanwhile.
    joining: u32,
    held: Vec<Placements>,
}

/// The node's open stream: its task, and where the actor hands it credit reports.
struct Link {
    id: u64,
    reports: tokio::sync::mpsc::UnboundedSender<CreditReport>,
    task: tokio::task::JoinHandle<()>,
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
            client: client(),
            registered: false,
            last_contact: Instant::now(),
            jobs: HashMap::new(),
            by_local: HashMap::new(),
            credits: HashMap::new(),
            failures: Vec::new(),
            link: None,
            links: 0,
            idle: 0,
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
            self.unregistered();
        }
        if self.registered {
            if self.needs_link() {
                self.idle = 0;
                self.connect(ctx);
            } else if self.link.is_some() {
                self.idle += 1;
                if self.idle >= 2 {
                    // Graceful: what is queued is still written, then a close frame.
                    self.link = None;
                }
            }
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
                        act.connect(ctx);
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
                        act.unregistered();
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

    /// The node is no longer registered: its stream (if any) is cut at once.
    fn unregistered(&mut self) {
        self.registered = false;
        if let Some(l) = self.link.take() {
            l.task.abort();
        }
    }

    /// Whether the node needs its stream: jobs to receive placements for or to return credit
    /// and failures of.
    fn needs_link(&self) -> bool {
        !self.jobs.is_empty() || self.joining > 0 || !self.failures.is_empty()
    }

    /// Opens the node's stream when it needs one and has none.
    fn connect(&mut self, ctx: &mut Context<Self>) {
        if self.link.is_some() || !self.registered || !self.needs_link() {
            return;
        }
        self.links += 1;
        let id = self.links;
        let (reports, rx) = tokio::sync::mpsc::unbounded_channel();
        let url = self.url(&format!("/v1/nodes/{}/stream", self.name));
        let task = actix_web::rt::spawn(run_link(
            ctx.address(),
            id,
            self.client.clone(),
            url,
            self.token.clone(),
            self.timeout,
            rx,
        ));
        tracing::debug!(link = id, "opening the stream to the leader");
        self.link = Some(Link { id, reports, task });
        self.idle = 0;
        self.send_credits();
    }

    /// Hands received placements to the Cache, one `Deliver` per local dataset, in order.
    /// A job whose end (`finished`) is handed over is no longer tracked: the leader forgets it,
    /// and its ranks may read their last records long after. Failures come last, so that a
    /// job that finished in this reply is not failed by the leader's not knowing it any more.
    fn apply(&mut self, reply: Placements) {
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

    fn deliver(&mut self, reply: &Placements) {
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

    /// Hands the credit and failures gathered so far to the stream (credit of jobs not
    /// tracked yet, under placeholder keys, waits for `Joined`; without a stream, all waits
    /// for the next one).
    fn send_credits(&mut self) {
        let Some(link) = &self.link else {
            return;
        };
        let ready: Vec<u64> = self
            .credits
            .keys()
            .copied()
            .filter(|k| self.jobs.contains_key(k))
            .collect();
        if ready.is_empty() && self.failures.is_empty() {
            return;
        }
        let report = CreditReport {
            credits: ready
                .into_iter()
                .filter_map(|job| self.credits.remove(&job).map(|n| Credit { job, n }))
                .collect(),
            failed: std::mem::take(&mut self.failures),
        };
        // A closed channel means the task ended: its `LinkEnded` fails the jobs this credit
        // was for.
        let _ = link.reports.send(report);
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
            self.connect(ctx);
            self.send_credits();
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
    fn handle(&mut self, _: Joining, ctx: &mut Context<Self>) {
        self.joining += 1;
        // The stream opens beside the forwarding: the job's first credit needs it.
        self.connect(ctx);
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
            self.connect(ctx);
            self.send_credits();
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
                    self.send_credits();
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

/// Link → agent: a frame of placements from the leader, on stream `link`.
#[derive(Message)]
#[rtype(result = "()")]
struct Placed {
    link: u64,
    placements: Placements,
}

impl Handler<Placed> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: Placed, _: &mut Context<Self>) {
        if self.link.as_ref().map(|l| l.id) != Some(msg.link) {
            return;
        }
        self.last_contact = Instant::now();
        if self.joining > 0 {
            self.held.push(msg.placements);
        } else {
            self.apply(msg.placements);
        }
    }
}

/// Link → agent: stream `link` ended, and why; `unknown` when the leader does not know this
/// node (any more).
#[derive(Message)]
#[rtype(result = "()")]
struct LinkEnded {
    link: u64,
    why: String,
    unknown: bool,
}

impl Handler<LinkEnded> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: LinkEnded, ctx: &mut Context<Self>) {
        if self.link.as_ref().map(|l| l.id) != Some(msg.link) {
            return;
        }
        self.link = None;
        tracing::warn!(why = %msg.why, "the stream to the leader ended");
        // Frames may have been lost either way: the jobs it carried cannot go on exactly.
        self.fail_all(&format!("the stream to the leader ended: {}", msg.why));
        if msg.unknown {
            self.unregistered();
        } else {
            // Failures still to report (a new job joining) go on a new stream, after a pause
            // that keeps a refusing leader from being asked in a loop.
            ctx.run_later(Duration::from_millis(100), |act, ctx| act.connect(ctx));
        }
    }
}

/// The task of stream `link`: opens the WebSocket, then forwards the leader's frames to the
/// agent and the agent's credit reports to the leader until either side ends it or the leader
/// is silent for `timeout`; tells the agent why it ended.
async fn run_link(
    agent: Addr<NodeAgent>,
    link: u64,
    client: awc::Client,
    url: String,
    token: Option<String>,
    timeout: Duration,
    mut reports: tokio::sync::mpsc::UnboundedReceiver<CreditReport>,
) {
    use awc::ws::{Frame, Message};
    use futures::{SinkExt, StreamExt};
    let (why, unknown) = async {
        let mut req = client.ws(&url).max_frame_size(MAX_FRAME);
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        let framed = match req.connect().await {
            Ok((_, framed)) => framed,
            Err(awc::error::WsClientError::InvalidResponseStatus(s)) => {
                return (format!("the leader refused it ({s})"), s.as_u16() == 404);
            }
            Err(e) => return (format!("cannot open it: {e}"), false),
        };
        let (mut sink, mut frames) = framed.split();
        let mut heard = Instant::now();
        loop {
            let silent = tokio::time::Instant::from_std(heard + timeout);
            tokio::select! {
                report = reports.recv() => {
                    let Some(mut report) = report else {
                        let _ = sink.send(Message::Close(None)).await;
                        return ("closed by the node (no multi-node job left)".into(), false);
                    };
                    while let Ok(more) = reports.try_recv() {
                        report.merge(more);
                    }
                    let text = match serde_json::to_string(&report) {
                        Ok(t) => t,
                        Err(e) => return (format!("cannot encode a report: {e}"), false),
                    };
                    if let Err(e) = sink.send(Message::Text(text.into())).await {
                        return (format!("broken: {e}"), false);
                    }
                }
                frame = frames.next() => {
                    heard = Instant::now();
                    match frame {
                        Some(Ok(Frame::Text(b) | Frame::Binary(b))) => {
                            match serde_json::from_slice::<Placements>(&b) {
                                Ok(placements) => agent.do_send(Placed { link, placements }),
                                Err(e) => return (format!("unreadable frame: {e}"), false),
                            }
                        }
                        Some(Ok(Frame::Ping(p))) => {
                            let _ = sink.send(Message::Pong(p)).await;
                        }
                        Some(Ok(Frame::Close(r))) => {
                            return (format!("closed by the leader ({r:?})"), false);
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return (format!("broken: {e}"), false),
                        None => return ("closed by the leader".into(), false),
                    }
                }
                _ = tokio::time::sleep_until(silent) => {
                    return (format!("the leader was silent for {timeout:?}"), false);
                }
            }
        }
    }
    .await;
    agent.do_send(LinkEnded { link, why, unknown });
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
