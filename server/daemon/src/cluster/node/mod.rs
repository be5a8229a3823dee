//! A node's agent: registers the node with the leader and heartbeats, forwards the node's
//! ranks of multi-node jobs ([`join_leader`]), receives the leader's placements for them and
//! gives them to the node's Cache as `Deliver`s (it stands where a local Sampler stands: the
//! Cache returns credit to it, and it returns the credit to the leader).
//!
//! It speaks to the leader with `awc`, actix's asynchronous HTTP client, never blocking the
//! actor: registration, heartbeats and forwarding are requests; placements and credit travel
//! on the node's stream, one WebSocket opened while the node has multi-node jobs (or is
//! joining one) and closed when it has had none for two heartbeats. The stream's task
//! (`link::run_link`) turns the leader's frames into `Placed` messages, in order, and writes
//! the credit the actor hands it, merging what accumulated while it was writing into one frame.
//!
//! Faults: a leader not heard from for `node_timeout_ms` (or that no longer knows this node),
//! or a stream that breaks, ends or stays silent as long (the leader pings an idle one every
//! heartbeat), fails the node's multi-node jobs with the reason; single-node jobs never depend
//! on it. The agent keeps registering, and rejoins when the leader is back.
//!
//! The parts: the agent and its heartbeats (here), its calls to the leader (`call.rs`), the
//! stream (`link.rs`), placements handed to the Cache and credit returned (`deliver.rs`), and
//! the forwarding of a job's ranks (`join.rs`, where the registry's `ClusterNode` is
//! implemented).

mod call;
mod deliver;
mod join;
mod link;
mod pause;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ::actors::{CloseJob, DatasetId, JobId, JobState, JobStats};
use actix::prelude::*;

use super::{
    ClusterDataset, Heartbeat, HeartbeatReply, JobFailure, NodeDataset, NodeRegistered,
    NodeRegistration, Placements,
};
use crate::registry::Registry;
pub use call::CallError;
use call::{client, post};
pub use join::{AgentHandle, Joined, Joining, Track, join_leader};
use link::Link;
pub use link::MAX_FRAME;

struct Tracked {
    local: JobId,
    dataset: DatasetId,
    stats: Arc<JobStats>,
    /// What the node received of the job, for a restarted leader.
    progress: pause::Progress,
}

/// See the module docs.
pub struct NodeAgent {
    registry: Weak<Registry>,
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
    /// How long multi-node jobs stay paused when the leader is lost (`Config::leader_grace`).
    grace: Duration,
    /// The newest leader generation this node registered with (0: none yet).
    generation: u64,
    /// Since when, and why, the multi-node jobs are paused (the leader was lost).
    paused: Option<pause::Paused>,
    /// A report of the paused jobs is due to the leader (after each registration), and on
    /// its way.
    report_due: bool,
    resuming: bool,
    /// Why the leader's last answer was refused (a stale generation).
    stale: Option<String>,
    /// A registration retry is scheduled before the next heartbeat (`pause::retry_soon`).
    retrying: bool,
    /// Jobs that finished here lately, with what the node received of them.
    finished: std::collections::VecDeque<(u64, pause::Progress)>,
}

impl NodeAgent {
    pub fn new(registry: &Arc<Registry>, leader: String, address: String) -> Self {
        let c = &registry.config();
        Self {
            registry: Arc::downgrade(registry),
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
            grace: c.leader_grace(),
            generation: 0,
            paused: None,
            report_due: false,
            retrying: false,
            resuming: false,
            stale: None,
            finished: Default::default(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.leader)
    }

    /// Fails a local multi-node job: its registry says why (clients that find their ring closed
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
        if let Some(registry) = self.registry.upgrade() {
            registry.cache().do_send(CloseJob { job: t.local });
        }
    }

    fn fail_all(&mut self, reason: &str) {
        let ids: Vec<u64> = self.jobs.keys().copied().collect();
        for id in ids {
            self.fail_local(id, reason);
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.registered && self.last_contact.elapsed() > self.timeout {
            let reason = format!("the leader {} is unreachable", self.leader);
            self.leader_lost(&reason, ctx);
        }
        self.check_grace();
        self.resume(ctx);
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
                    .registry
                    .upgrade()
                    .map(|s| s.config().instance.clone())
                    .unwrap_or_default(),
            };
            let fut = async move {
                post::<NodeRegistered>(&client, url, token.as_deref(), timeout, &body).await
            };
            ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
                act.beating = false;
                match res {
                    Ok(reg) => {
                        if act.registered_with(&reg, ctx) {
                            tracing::info!(leader = %act.leader, node = %act.name,
                                generation = reg.generation, "registered with the leader");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e.message, "cannot register with the leader");
                        act.retry_soon(ctx);
                    }
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
                        act.leader_lost("the leader no longer knows this node (it restarted)", ctx);
                    }
                    Err(e) => tracing::debug!(error = %e.message, "heartbeat failed"),
                }
            }));
        }
    }

    /// The node's cache use and datasets, for the leader's `GET /v1/nodes`.
    fn report(&self) -> Heartbeat {
        let Some(registry) = self.registry.upgrade() else {
            return Heartbeat::default();
        };
        let mut datasets: Vec<NodeDataset> = registry
            .datasets()
            .into_iter()
            .map(|d| NodeDataset {
                fetch_ms: d
                    .source
                    .as_ref()
                    .and_then(|s| s.fetching())
                    .and_then(|f| f.fetch_time())
                    .map(|t| t.as_secs_f64() * 1e3),
                name: d.record.name,
                state: d.record.state,
                error: d.record.error,
            })
            .collect();
        datasets.extend(self.dataset_errors.iter().map(|(n, e)| NodeDataset {
            name: n.clone(),
            state: "failed".into(),
            error: Some(e.clone()),
            fetch_ms: None,
        }));
        Heartbeat {
            cache_bytes_in_use: registry.stats().bytes_in_use.load(Relaxed),
            cache_capacity_bytes: registry.stats().capacity_bytes.load(Relaxed),
            datasets,
        }
    }

    /// Creates the leader's datasets this node does not have (indexed from the same source).
    fn sync_datasets(&mut self, datasets: Vec<ClusterDataset>, ctx: &mut Context<Self>) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        for d in datasets {
            let known = registry.has_dataset(&d.name);
            if known || !self.tried.insert(d.name.clone()) {
                continue;
            }
            let (st, name) = (registry.clone(), d.name.clone());
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
