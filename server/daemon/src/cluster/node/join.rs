//! A local job's ranks of a multi-node job, forwarded to the leader ([`join_leader`]), and
//! the agent told before and after ([`Joining`], [`Joined`]) so that it holds back the
//! placements it fetches meanwhile. [`AgentHandle`] is the registry's view of all this
//! (`registry::ClusterNode`).

use std::sync::Arc;
use std::time::Duration;

use ::actors::{DatasetId, JobId, JobSignal, JobStats, RemoveJob};
use actix::prelude::*;
use futures::future::LocalBoxFuture;

use super::call::post;
use super::{NodeAgent, Tracked};
use crate::cluster::{NodeJob, NodeJobAccepted};
use crate::config::Config;
use crate::error::{Code, Error, Result};
use crate::registry::jobs::JobRequest;
use crate::registry::{ClusterNode, LocalJob};

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
            let mut progress = super::pause::Progress::default();
            // Credit granted before the job was tracked.
            if let Some(n) = self.credits.remove(&(u64::MAX - t.local)) {
                *self.credits.entry(t.cluster).or_default() += n;
                progress.granted(n);
            }
            self.jobs.insert(
                t.cluster,
                Tracked {
                    local: t.local,
                    dataset: t.dataset,
                    stats: t.stats,
                    progress,
                },
            );
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

/// Forwards this node's ranks of a multi-node job to the leader; returns the leader's id of
/// the job. The leader's refusals keep their code; an unreachable leader is
/// `leader_unreachable`.
pub async fn join_leader(leader: &str, config: &Config, body: NodeJob) -> Result<u64> {
    let url = format!("{leader}/v1/nodes/{}/jobs", config.node_name());
    let client = awc::Client::default();
    let timeout = Duration::from_millis(config.node_timeout_ms).max(Duration::from_secs(10));
    match post::<NodeJobAccepted>(&client, url, config.token.as_deref(), timeout, &body).await {
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

/// The registry's handle on this node's agent (`registry::ClusterNode`): the agent, and the
/// leader the node's ranks of multi-node jobs are forwarded to.
pub struct AgentHandle {
    agent: Addr<NodeAgent>,
    leader: String,
}

impl AgentHandle {
    pub fn new(agent: Addr<NodeAgent>, leader: String) -> Self {
        Self { agent, leader }
    }
}

impl ClusterNode for AgentHandle {
    fn signals(&self) -> Recipient<JobSignal> {
        self.agent.clone().recipient()
    }

    fn remover(&self) -> Recipient<RemoveJob> {
        self.agent.clone().recipient()
    }

    fn join<'a>(
        &'a self,
        config: &'a Config,
        job: JobRequest,
        ranks: Vec<u32>,
        items: u64,
        local: LocalJob,
    ) -> LocalBoxFuture<'a, Result<Result<u64>>> {
        Box::pin(async move {
            let body = NodeJob { job, ranks, items };
            self.agent.send(Joining).await.map_err(Error::internal)?;
            // A leader away (restarting) or that does not know this node yet (it restarted and
            // the node has not registered again): tried again for a while, as the node's paused
            // jobs wait for it, so that a rank registering during a restart waits too.
            let patience = config.leader_grace().min(Duration::from_secs(8));
            let start = std::time::Instant::now();
            let joined = loop {
                let joined = join_leader(&self.leader, config, body.clone()).await;
                match &joined {
                    Err(e) if e.code == Code::LeaderUnreachable && start.elapsed() < patience => {
                        tracing::debug!(error = %e.message, "joining a multi-node job: the leader is away, trying again");
                        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ => break joined,
                }
            };
            let track = joined.as_ref().ok().map(|&cluster| Track {
                cluster,
                local: local.job,
                dataset: local.dataset,
                stats: local.stats.clone(),
            });
            self.agent
                .send(Joined(track))
                .await
                .map_err(Error::internal)?;
            Ok(joined)
        })
    }
}
