//! The leader's registry of nodes: registration, heartbeats (which answer the leader's
//! datasets), the list `GET /v1/nodes` shows, and the watch that finds nodes lost.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::{Leader, Node, lock};
use crate::cluster::{
    ClusterDataset, Heartbeat, HeartbeatReply, NodeRegistered, NodeRegistration, NodeView,
    Placements,
};
use crate::error::Result;
use crate::registry::Registry;

impl Leader {
    /// `POST /v1/nodes`. A node that registers again (it restarted) loses its running jobs.
    pub fn register(&self, reg: NodeRegistration) -> Result<NodeRegistered> {
        crate::registry::check_name("node", &reg.name)?;
        let mut inner = lock(self)?;
        // The node's count goes on across its restarts (a counter never goes down).
        let placed = inner.nodes.get(&reg.name).map_or(0, |n| n.placed);
        // Jobs taken back from the journal wait for the node's report instead: a
        // registration repeated at a restarted leader (its answer was lost) must not fail
        // them.
        if inner.nodes.contains_key(&reg.name) {
            inner.fail_running_jobs_of(
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
            generation: self.generation,
        })
    }

    /// `POST /v1/nodes/{name}/heartbeat`: the leader's datasets in return.
    pub fn heartbeat(
        &self,
        registry: &Registry,
        name: &str,
        hb: Heartbeat,
    ) -> Result<HeartbeatReply> {
        {
            let mut inner = lock(self)?;
            let node = Self::node_mut(&mut inner, name)?;
            node.last = Instant::now();
            self.note_fetch_times(name, &hb);
            node.report = hb;
        }
        Ok(HeartbeatReply {
            datasets: registry
                .datasets()
                .into_iter()
                .map(|d| ClusterDataset {
                    name: d.record.name,
                    source: d.record.source,
                })
                .collect(),
        })
    }

    /// Keeps what `node` reports a fetch of each dataset takes (only its fresh report counts).
    fn note_fetch_times(&self, node: &str, hb: &Heartbeat) {
        let Ok(mut times) = self.fetch_ms.lock() else {
            return;
        };
        for by_node in times.values_mut() {
            by_node.remove(node);
        }
        for d in &hb.datasets {
            if let Some(ms) = d.fetch_ms.filter(|ms| ms.is_finite()) {
                times
                    .entry(d.name.clone())
                    .or_default()
                    .insert(node.to_owned(), ms);
            }
        }
        times.retain(|_, by_node| !by_node.is_empty());
    }

    /// The multi-node jobs, for `GET /v1/nodes`.
    pub fn jobs(&self) -> Result<Vec<crate::cluster::ClusterJobView>> {
        Ok(lock(self)?.job_views())
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

    /// Refuses a stream for a node the leader does not know, or opened for another generation
    /// of the leader (before the WebSocket upgrade).
    pub fn check_node(&self, name: &str, generation: Option<u64>) -> Result<()> {
        if let Some(g) = generation.filter(|&g| g != self.generation) {
            return Err(crate::error::Error::new(
                crate::error::Code::StaleGeneration,
                format!(
                    "node {name} opened its stream for leader generation {g}; this leader is                      generation {}",
                    self.generation
                ),
            ));
        }
        let mut inner = lock(self)?;
        Self::node_mut(&mut inner, name).map(|_| ())
    }

    /// Marks nodes silent for longer than the timeout lost, failing their jobs.
    pub(super) fn watch(&self) {
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
            if let Ok(mut times) = self.fetch_ms.lock() {
                times.values_mut().for_each(|by_node| {
                    by_node.remove(&name);
                });
            }
            inner.fail_jobs_of(&name, &format!("node {name} stopped heartbeating (lost)"));
        }
        inner.expire_restoring(self.grace);
        // Ended jobs are kept a while (their nodes were told), for `GET /v1/nodes` and for
        // nodes that report them after a restart.
        inner.forget_ended();
    }
}
