//! Many nodes (seed 000, §E.4, Figure 8): one leader samples, every node loads and serves.
//!
//! - **Roles.** A server started without `--leader` is a leader: it keeps the node registry
//!   (`leader/`: nodes, their heartbeats, the multi-node jobs) and samples every multi-node
//!   job of a dataset with one DSA tree. A server started with `--leader URL` is a follower.
//!   Every server but a `--leader-only` leader is also a *node*: its agent (`node/`)
//!   registers with the leader (itself, for a leader), heartbeats, forwards its local ranks of
//!   multi-node jobs, receives the leader's placements for them on its stream and hands them to its own
//!   Cache as `Deliver`s, exactly as its local Sampler would. Single-node jobs never leave
//!   their node.
//! - **What crosses the network.** Control and sample ids only: registrations, heartbeats
//!   (cache use, dataset states) and job forwarding as REST/JSON requests, and, while a node
//!   has multi-node jobs, one WebSocket per node (`GET /v1/nodes/{name}/stream`) on which the
//!   leader writes each pass's placements for the node (element, job, epoch, position) as it
//!   happens and the node writes the credit its readers return (records its rings freed) and
//!   the jobs that failed there. One long exchange instead of a request per pass and per
//!   acknowledged batch: the leader's cost per sample is a frame, not an HTTP request. Pixels
//!   never cross: each node reads the shared source itself. For a dataset in an object
//!   store the leader also writes the picks it holds back to the node it guesses they will
//!   be placed on, which fetches their bytes ahead (`leader::dispatch`); nodes report their
//!   GET time in their heartbeats.
//! - **Placement** is `joader_core::cluster`: hashing twice, equal counts per rank.
//!
//! The wire types below are the bodies of the `/v1/nodes` routes (`http/cluster.rs`) and the
//! frames of the node streams.

pub mod leader;
pub mod node;

use joader_storage::SourceSpec;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::registry::jobs::JobRequest;

/// `POST /v1/nodes`: a node announces itself to the leader.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistration {
    /// The node's name (stable across its restarts; placement hashes it).
    #[schema(example = "host-a-default")]
    pub name: String,
    /// Where the node's REST API is reached.
    #[schema(example = "http://10.0.0.2:7480")]
    pub address: String,
    /// Its shared-memory instance name.
    #[schema(example = "default")]
    pub instance: String,
}

/// The leader's answer to a registration: how often to heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeRegistered {
    pub name: String,
    pub heartbeat_ms: u64,
    pub timeout_ms: u64,
    /// The leader's generation: one more at each of its starts (persisted in its catalog). A
    /// node refuses a leader of an older generation than one it has seen.
    #[serde(default)]
    pub generation: u64,
}

/// A dataset as a node sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeDataset {
    pub name: String,
    /// `indexing`, `ready` or `failed`.
    pub state: String,
    /// Why it failed on this node.
    pub error: Option<String>,
    /// For a dataset the node reads from an object store and fetches ahead: how long a fetch
    /// takes there now (ms), from which the leader's Sampler sets how far ahead it samples
    /// the dataset's multi-node jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_ms: Option<f64>,
}

/// `POST /v1/nodes/{name}/heartbeat`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    #[serde(default)]
    pub cache_bytes_in_use: u64,
    #[serde(default)]
    pub cache_capacity_bytes: u64,
    #[serde(default)]
    pub datasets: Vec<NodeDataset>,
}

/// A dataset of the leader, which every node indexes from the same source.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterDataset {
    pub name: String,
    pub source: SourceSpec,
}

/// The leader's answer to a heartbeat: its datasets.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatReply {
    pub datasets: Vec<ClusterDataset>,
}

/// `POST /v1/nodes/{name}/jobs`: a node's ranks of a multi-node job.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeJob {
    pub job: JobRequest,
    /// The job's global ranks on this node.
    pub ranks: Vec<u32>,
    /// Items of the dataset as this node indexed it (must equal the leader's).
    pub items: u64,
}

/// The leader's id of a multi-node job (the same on every node).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeJobAccepted {
    pub job: u64,
}

/// Records a node's rings freed for a job (its readers acknowledged them).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Credit {
    pub job: u64,
    pub n: u32,
}

/// A multi-node job that failed, and why.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct JobFailure {
    pub job: u64,
    pub reason: String,
}

/// What a node sends on its stream: credit returned and jobs that failed on the node (one
/// WebSocket text frame each; what accumulated while a frame was being written goes in the
/// next, summed per job).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreditReport {
    #[serde(default)]
    pub credits: Vec<Credit>,
    #[serde(default)]
    pub failed: Vec<JobFailure>,
}

impl CreditReport {
    /// Adds `other` to this report (credit summed per job).
    pub fn merge(&mut self, other: CreditReport) {
        for c in other.credits {
            match self.credits.iter_mut().find(|x| x.job == c.job) {
                Some(x) => x.n = x.n.saturating_add(c.n),
                None => self.credits.push(c),
            }
        }
        self.failed.extend(other.failed);
    }

    pub fn is_empty(&self) -> bool {
        self.credits.is_empty() && self.failed.is_empty()
    }
}

/// One job's share of a placed element: its epoch and its position in the node's share.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WireItem {
    pub job: u64,
    pub epoch: u32,
    pub position: u32,
}

/// An element placed on the node, with every job it goes to there.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WireGroup {
    pub element: u32,
    /// Jobs that still need the element this epoch (the cache's RefCnt).
    pub need: u32,
    pub items: Vec<WireItem>,
}

/// An end of epoch (or of the job) after `groups[..after]`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WireEnd {
    pub after: usize,
    pub job: u64,
    pub epoch: u32,
    pub finished: bool,
}

/// An element the leader's Sampler picked for a job ahead of its placement (a dataset read
/// from an object store): the node it will most likely be placed on fetches its bytes now.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WireAhead {
    pub element: u32,
    pub job: u64,
}

/// What the leader sends on a node's stream: the placements for the node since the last
/// frame, in order (one WebSocket text frame per drain of the node's outbox).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Placements {
    #[serde(default)]
    pub groups: Vec<WireGroup>,
    #[serde(default)]
    pub ends: Vec<WireEnd>,
    /// Picks whose bytes to fetch ahead (placed in a later frame, on this node as the leader
    /// guesses: see `leader::dispatch`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ahead: Vec<WireAhead>,
    /// Multi-node jobs of the node that failed elsewhere.
    #[serde(default)]
    pub failed: Vec<JobFailure>,
    /// The generation of the leader that wrote the frame: a node refuses a frame of another
    /// generation than the one it registered with.
    #[serde(default)]
    pub generation: u64,
}

impl Placements {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
            && self.ends.is_empty()
            && self.failed.is_empty()
            && self.ahead.is_empty()
    }
}

/// What a node received of one epoch of a multi-node job (its resume report).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct EpochSeen {
    pub epoch: u32,
    /// Records placed on the node in this epoch (padding included): its positions `0..count`.
    pub count: u32,
    /// The elements of those records (each once): a serialized roaring bitmap, base64 (as a
    /// resume state's `consumed`).
    pub elements: String,
    /// The node received the epoch's end.
    pub ended: bool,
}

/// `ids` as a resume report carries them: a serialized roaring bitmap, base64.
pub fn encode_ids(ids: &roaring::RoaringBitmap) -> String {
    use base64::Engine;
    let mut bytes = Vec::with_capacity(ids.serialized_size());
    // Writing into a Vec cannot fail.
    let _ = ids.serialize_into(&mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The ids [`encode_ids`] wrote.
pub fn decode_ids(text: &str) -> std::result::Result<roaring::RoaringBitmap, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("elements are not base64: {e}"))?;
    roaring::RoaringBitmap::deserialize_from(&bytes[..])
        .map_err(|e| format!("elements are not a serialized roaring bitmap: {e}"))
}

/// A node's state of a multi-node job after losing its leader.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct JobSeen {
    pub job: u64,
    /// Its last epochs as the node received them (oldest first; the node keeps three).
    pub epochs: Vec<EpochSeen>,
    /// Records the node's rings have room for that the leader has not filled: the credit the
    /// node's readers returned minus the records placed on the node.
    pub room: u64,
    /// The credit the node's readers returned so far (a report sent again after the leader
    /// resumed the job gives it the credit returned since the first).
    pub granted: u64,
    /// Every local rank of the job has attached (its first credit was returned).
    pub attached: bool,
    /// The node received the job's last end.
    pub finished: bool,
}

/// `POST /v1/nodes/{name}/resume`: a node that lost its leader and registered with a new one
/// (a new generation) reports its multi-node jobs, paused meanwhile.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeReport {
    /// The generation the node registered with (the leader's own, or the report is refused).
    pub generation: u64,
    pub jobs: Vec<JobSeen>,
}

/// The leader's answer to a resume report: the jobs it cannot resume, and why (the node fails
/// them); the others resume once every node of theirs has reported.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ResumeReply {
    pub failed: Vec<JobFailure>,
}

/// A multi-node job as the leader sees it (`GET /v1/nodes`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClusterJobView {
    pub id: u64,
    pub name: String,
    pub dataset: String,
    /// `joining` (ranks still joining), `running`, `restoring` (the leader restarted and waits
    /// for the job's nodes), `finished` or `failed`.
    pub state: String,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its nodes, with their global ranks.
    #[schema(value_type = Object)]
    pub nodes: std::collections::BTreeMap<String, Vec<u32>>,
}

/// A node as the leader sees it (`GET /v1/nodes`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeView {
    pub name: String,
    pub address: String,
    pub instance: String,
    /// `alive`, or `lost` (no heartbeat within the timeout).
    pub state: String,
    /// Milliseconds since the node was last heard from.
    pub last_heartbeat_ms_ago: u64,
    /// Multi-node jobs with ranks on the node.
    pub jobs: Vec<String>,
    pub cache_bytes_in_use: u64,
    pub cache_capacity_bytes: u64,
    /// The leader's datasets as the node indexed them (a failed one says why).
    pub datasets: Vec<NodeDataset>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeList {
    /// This server's role: `leader` or `follower`.
    pub role: String,
    pub leader: Option<String>,
    /// The leader's generation (one more at each of its starts).
    pub generation: u64,
    pub nodes: Vec<NodeView>,
    /// The multi-node jobs: running, restoring after a restart, and those that ended lately
    /// (a failed one says why).
    pub jobs: Vec<ClusterJobView>,
}
