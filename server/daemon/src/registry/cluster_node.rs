//! What the registry needs of the cluster: this node's agent, which takes a multi-node job's
//! ranks on this node to the leader and then stands where the dataset's Sampler stands for a
//! single-node job (the Cache returns the job's credit to it). `crate::cluster::node`
//! implements it, so that the registry never imports the cluster (the cluster imports the
//! registry's types instead).

use std::sync::Arc;

use actix::Recipient;
use actors::{DatasetId, JobId, JobSignal, JobStats, RemoveJob};
use futures::future::LocalBoxFuture;

use super::jobs::JobRequest;
use crate::config::Config;
use crate::error::Result;

/// This node in the cluster, as the registry sees it (`Registry::node`).
pub trait ClusterNode: Send + Sync {
    /// Where the Cache sends a multi-node job's credit and its clients' departures.
    fn signals(&self) -> Recipient<JobSignal>;

    /// What is told when a multi-node job is deleted here (the agent tells the leader).
    fn remover(&self) -> Recipient<RemoveJob>;

    /// Forwards this node's `ranks` of the multi-node job `job` (over a dataset of `items`
    /// elements as this node indexed it) to the leader and, once the leader accepted them,
    /// has the agent serve `local` from the leader's placements. The outer error: the agent
    /// could not be reached. The inner result: the leader's id of the job, or its refusal
    /// with its code (`leader_unreachable` when it cannot be reached); `local` is then not
    /// served.
    fn join<'a>(
        &'a self,
        config: &'a Config,
        job: JobRequest,
        ranks: Vec<u32>,
        items: u64,
        local: LocalJob,
    ) -> LocalBoxFuture<'a, Result<Result<u64>>>;
}

/// The local job that serves a multi-node job's ranks on this node.
pub struct LocalJob {
    pub job: JobId,
    pub dataset: DatasetId,
    pub stats: Arc<JobStats>,
}
