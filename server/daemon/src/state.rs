//! The state the HTTP layer and the metrics share: the registry, and this server's roles in
//! the cluster. It sits above both: the registry never imports the cluster (what it needs of
//! it is `registry::ClusterNode`, which the cluster implements), and the cluster imports only
//! the registry's types, so the arrows run one way (http → registry ← cluster).

use std::sync::Arc;

use crate::cluster::leader::Leader;
use crate::error::{Code, Error, Result};
use crate::registry::Registry;

pub struct AppState {
    pub registry: Arc<Registry>,
    /// This server's leader role (a server without `--leader`).
    pub leader: Option<Arc<Leader>>,
    /// The leader's URL (this server's own for a leader).
    pub leader_url: Option<String>,
}

impl AppState {
    /// This server's leader role, or `not_a_leader`.
    pub fn leader_role(&self) -> Result<&Arc<Leader>> {
        self.leader.as_ref().ok_or_else(|| {
            Error::new(
                Code::NotALeader,
                format!(
                    "this server follows {}: send cluster requests to the leader",
                    self.registry
                        .config()
                        .leader
                        .as_deref()
                        .unwrap_or("a leader")
                ),
            )
        })
    }
}
