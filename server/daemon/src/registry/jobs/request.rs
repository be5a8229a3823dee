//! What a job asks for (`POST /v1/jobs`, and every rank of a job sends the same) and the
//! checks the request passes on its own: [`JobRequest::validate`] before the registration
//! looks at the registry, [`JobRequest::validate_order`] once the dataset is resolved. A new
//! job parameter is a field here, checked here when it can be checked alone.

use joader_core::sampling::SamplerKind;
use joader_pipeline::Pipeline;
use serde::{Deserialize, Serialize};

use super::limits::{MAX_CLUSTER_WORLD_SIZE, MAX_WORLD_SIZE};
use crate::config::Config;
use crate::error::{Code, Error, Result};
use crate::registry::check_name;
use crate::registry::subset::SubsetSpec;

/// Who registers (the client libraries fill it in).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientInfo {
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub layout_version: Option<u32>,
}

/// `POST /v1/jobs`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "example", "dataset": "example", "batch_size": 4, "epochs": 1}))]
pub struct JobRequest {
    /// 1 to 64 characters from `A-Z a-z 0-9 _ - .`, not starting with `.`; every rank of a
    /// job registers the same name and parameters.
    #[schema(example = "example")]
    pub name: String,
    #[schema(example = "example")]
    pub dataset: String,
    /// `null`: the whole dataset.
    #[serde(default)]
    pub subset: Option<SubsetSpec>,
    /// At least 1.
    #[schema(example = 4)]
    pub batch_size: u32,
    #[serde(default)]
    pub seed: u64,
    /// This process's rank (informational: every rank's ring is returned).
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub world_size: Option<u32>,
    /// Ranks of the job on this node (torchrun's `LOCAL_WORLD_SIZE`; `null`: all of them). A
    /// job with fewer local ranks than `world_size` is a multi-node job: its ranks on this node
    /// are the block of `local_world_size` ranks that holds `rank` (torchrun numbers a node's
    /// ranks consecutively), and the leader samples it for every node.
    #[serde(default)]
    pub local_world_size: Option<u32>,
    /// `null`: until deleted.
    #[serde(default)]
    pub epochs: Option<u32>,
    #[serde(default)]
    pub drop_last: bool,
    /// `dsa` (the default: correlated with the other jobs) or `isa`/`independent`.
    #[serde(default)]
    #[schema(schema_with = sampler_schema)]
    pub sampler: Option<SamplerKind>,
    #[serde(default)]
    pub pipeline: Option<Pipeline>,
    #[serde(default)]
    pub ring_capacity: Option<u32>,
    #[serde(default)]
    pub client: Option<ClientInfo>,
    /// Continue a checkpointed job in the middle of an epoch (the clients' `state_dict()`):
    /// every rank sends the same state.
    #[serde(default)]
    pub resume: Option<ResumeState>,
    /// Record the order of every epoch's deliveries (per rank) in the data dir, served at
    /// `GET /v1/jobs/{name}/record/{epoch}` (the last 16 epochs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub record: bool,
    /// Receive exactly the order a recording job received in one epoch, every epoch (its ids
    /// are the subset: give no `subset`, no `resume`).
    #[serde(default)]
    pub replay: Option<ReplaySpec>,
}

/// A recorded epoch to replay.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaySpec {
    /// The recording job's name.
    pub job: String,
    pub epoch: u32,
}

impl ReplaySpec {
    /// The recorded order, if it can be replayed over a dataset of `len` elements.
    pub(super) fn order(&self, data_dir: &std::path::Path, len: u32) -> Result<Vec<u32>> {
        check_name("job", &self.job)?;
        let bad = |m: String| Error::new(Code::InvalidReplay, m);
        let rec = crate::registry::record::read(data_dir, &self.job, self.epoch)
            .map_err(|e| bad(format!("replay: {}", e.message)))?;
        if rec.first != 0 {
            return Err(bad(format!(
                "replay: the recorded epoch {} of '{}' starts at position {} (a resumed job): \
                 replay an epoch recorded from its start",
                self.epoch, self.job, rec.first
            )));
        }
        if rec.order.is_empty() {
            return Err(bad("replay: the recorded epoch is empty".into()));
        }
        if let Some(e) = rec.order.iter().find(|&&e| e >= len) {
            return Err(bad(format!(
                "replay: the recorded id {e} is not in the dataset ({len} elements): it changed"
            )));
        }
        Ok(rec.order)
    }
}

/// Where a resumed job continues: the rest of `epoch` is a uniform random permutation of the
/// job's subset minus `consumed` (shared among the ranks as usual), later epochs are whole.
/// `epochs` still counts from epoch 0.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"epoch": 1, "consumed": "OjAAAAEAAAAAAAEAEAAAAAAAAQA="}))]
pub struct ResumeState {
    /// The epoch the job was in (0-based).
    pub epoch: u32,
    /// The ids of that epoch already handed to the user: a roaring bitmap in its portable
    /// serialized form (as `roaring` and `pyroaring` write it), base64 (standard alphabet).
    /// Empty: the epoch starts whole.
    #[serde(default)]
    pub consumed: String,
    /// The ranks whose handed-over ids `consumed` holds (the Python client's states name
    /// them); with `world_size`, they must be every rank of the job the state was saved from,
    /// which then resumes on any number of ranks and nodes. Absent: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = json!([0, 1]))]
    pub ranks: Option<Vec<u32>>,
    /// The world size the state was saved with (needed with `ranks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// The dataset's fingerprint when the state was saved (a job's `dataset_fingerprint`):
    /// a resume on a dataset whose first items differ is refused (`dataset_changed`), one
    /// that only grew since resumes. Absent (older states): not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "1281167:9f2c0a7d41e6b305")]
    pub dataset_fingerprint: Option<String>,
    /// Resume even if the dataset's fingerprint differs: the rest of the epoch is then
    /// computed on the new index (ids of the state that are now other files count as taken).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_changed_dataset: bool,
}

impl ResumeState {
    /// The epoch to start at and what remains of it, or why the state does not fit the job.
    pub fn start(
        &self,
        subset: &roaring::RoaringBitmap,
        epochs: Option<u32>,
    ) -> Result<(u32, roaring::RoaringBitmap)> {
        use base64::Engine;
        let bad = |m: String| Error::new(Code::InvalidResume, m);
        self.check_ranks()?;
        let consumed = if self.consumed.is_empty() {
            roaring::RoaringBitmap::new()
        } else {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(self.consumed.trim())
                .map_err(|e| bad(format!("resume.consumed is not base64: {e}")))?;
            roaring::RoaringBitmap::deserialize_from(&bytes[..]).map_err(|e| {
                bad(format!(
                    "resume.consumed is not a serialized roaring bitmap: {e}"
                ))
            })?
        };
        if let Some(outside) = (&consumed - subset).min() {
            return Err(bad(format!(
                "resume.consumed holds id {outside}, which is not in the job's subset ({} ids \
                 outside it): resume with the job's own dataset and subset",
                (&consumed - subset).len()
            )));
        }
        let mut epoch = self.epoch;
        let mut remaining = subset - &consumed;
        if remaining.is_empty() {
            // The whole epoch was consumed: the next one starts.
            epoch = epoch.saturating_add(1);
            remaining = subset.clone();
        }
        if let Some(e) = epochs
            && epoch >= e
        {
            return Err(bad(format!(
                "resume at epoch {epoch} but the job has {e} epoch(s): nothing is left to deliver"
            )));
        }
        Ok((epoch, remaining))
    }

    /// A state that names its ranks must hold every rank of the job it was saved from: the
    /// ids handed over by a missing rank would be delivered again.
    fn check_ranks(&self) -> Result<()> {
        let bad = |m: String| Error::new(Code::InvalidResume, m);
        let Some(ranks) = &self.ranks else {
            return Ok(());
        };
        let Some(world) = self.world_size.filter(|&w| w > 0) else {
            return Err(bad(
                "resume.ranks needs resume.world_size (at least 1), the world size the state \
                 was saved with"
                    .into(),
            ));
        };
        let given: std::collections::BTreeSet<u32> = ranks.iter().copied().collect();
        if let Some(r) = given.iter().find(|&&r| r >= world) {
            return Err(bad(format!(
                "resume.ranks names rank {r}, not below resume.world_size {world}"
            )));
        }
        if given.len() != ranks.len() {
            return Err(bad(
                "resume.ranks names a rank twice: merge each rank's state once".into(),
            ));
        }
        let missing: Vec<u32> = (0..world).filter(|r| !given.contains(r)).collect();
        if !missing.is_empty() {
            return Err(bad(format!(
                "the resume state covers {} of the {world} ranks it was saved with: rank(s) \
                 {missing:?} missing, whose handed-over ids would be delivered again; merge \
                 every rank's state (joader.merge_states)",
                given.len()
            )));
        }
        Ok(())
    }
}

/// The names `SamplerKind` reads (it lives in `joader-core`, which knows nothing of OpenAPI;
/// a test checks that each parses).
pub const SAMPLER_NAMES: [&str; 3] = ["dsa", "isa", "independent"];

fn sampler_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .enum_values(Some(SAMPLER_NAMES))
        .build()
}

impl JobRequest {
    /// The parameters that define the job (two ranks registering must agree on them).
    pub fn identity(&self) -> JobRequest {
        JobRequest {
            rank: None,
            client: None,
            ..self.clone()
        }
    }

    /// Checks what the request says on its own (its name aside, which the registration
    /// checks first) and tells where the job's ranks are.
    pub fn validate(&self) -> Result<Ranks> {
        if let Some(v) = self.client.as_ref().and_then(|c| c.layout_version)
            && v != dataplane::LAYOUT_VERSION
        {
            return Err(Error::new(
                Code::VersionMismatch,
                format!(
                    "the client speaks layout version {v}, this server {}",
                    dataplane::LAYOUT_VERSION
                ),
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::new(
                Code::InvalidRequest,
                "batch_size must be at least 1",
            ));
        }
        if self.epochs == Some(0) {
            return Err(Error::new(
                Code::InvalidRequest,
                "epochs must be at least 1 (or null for unlimited)",
            ));
        }
        let world = self.world_size.unwrap_or(1);
        if world == 0 {
            return Err(Error::new(
                Code::InvalidRequest,
                "world_size must be at least 1",
            ));
        }
        let local_world = self.local_world_size.unwrap_or(world);
        if local_world == 0 || local_world > world {
            return Err(Error::new(
                Code::InvalidRequest,
                format!("local_world_size {local_world} must lie in 1..=world_size ({world})"),
            ));
        }
        if local_world > MAX_WORLD_SIZE || world > MAX_CLUSTER_WORLD_SIZE {
            return Err(Error::new(
                Code::TooLarge,
                format!(
                    "{local_world} ranks on this server (world_size {world}) are above the limit \
                     of {MAX_WORLD_SIZE} ranks per server and {MAX_CLUSTER_WORLD_SIZE} per job"
                ),
            ));
        }
        if let Some(r) = self.rank
            && r >= world
        {
            return Err(Error::new(
                Code::InvalidRequest,
                format!("rank {r} is not below world_size {world}"),
            ));
        }
        // A multi-node job: this node serves the block of `local_world` ranks holding `rank`.
        let multi = local_world < world;
        if multi && self.rank.is_none() {
            return Err(Error::new(
                Code::InvalidRequest,
                "a multi-node job (local_world_size below world_size) needs each rank's `rank`",
            ));
        }
        let first = self.rank.unwrap_or(0) / local_world * local_world;
        Ok(Ranks {
            world,
            first,
            local: local_world.min(world - first),
            multi,
        })
    }

    /// The job's pipeline (the server's default when the request names none), validated;
    /// on a dataset whose samples have no image (`has_image` false), none runs (`raw`).
    pub fn pipeline(&self, config: &Config, has_image: bool) -> Result<Pipeline> {
        pipeline_or_default(config, self.pipeline.as_ref(), has_image)
    }

    /// Checks the options that set or record the job's order (`resume`, `replay`, `record`)
    /// against each other and the job's ranks (the registration checks them once the
    /// dataset is resolved).
    pub fn validate_order(&self, ranks: &Ranks) -> Result<()> {
        // A multi-node job resumes (the leader samples the rest of its epoch), but its order
        // is placed over the nodes by the leader: no one server has it to record or replay.
        if ranks.multi && (self.replay.is_some() || self.record) {
            return Err(Error::new(
                Code::InvalidRequest,
                "replay and record are for jobs on one server: a multi-node job \
                 (local_world_size below world_size) has its order placed over its nodes by \
                 the leader, so no server holds it whole to record or replay (resume works)",
            ));
        }
        if self.replay.is_some() && (self.subset.is_some() || self.resume.is_some()) {
            return Err(Error::new(
                Code::InvalidReplay,
                "replay sets the job's order and subset: give no subset and no resume with it",
            ));
        }
        Ok(())
    }
}

/// Where a job's ranks are: how many in all, and the block of them this node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    /// `world_size` (1 when the request gives none).
    pub world: u32,
    /// The first rank this node serves: the block of `local_world_size` ranks holding `rank`
    /// (torchrun numbers a node's ranks consecutively).
    pub first: u32,
    /// How many ranks this node serves.
    pub local: u32,
    /// Some ranks are on other nodes: the leader samples the job for every node.
    pub multi: bool,
}

/// `pipeline`, or the server's default pipeline when none is given, checked. A dataset whose
/// samples have no image (`has_image` false: an `array` source, fields without an `image`)
/// runs none: its elements are their fields, kept as they are read (`raw`, so that every job
/// on it shares them); a pipeline other than `raw` is refused, as it has nothing to decode.
pub fn pipeline_or_default(
    config: &Config,
    pipeline: Option<&Pipeline>,
    has_image: bool,
) -> Result<Pipeline> {
    if !has_image {
        return match pipeline {
            None | Some(Pipeline::Raw) => Ok(Pipeline::Raw),
            Some(_) => Err(Error::new(
                Code::InvalidRequest,
                "pipeline: the dataset's samples have no image (an `array` source, or fields \
                 without an `image`): there is nothing to decode; give no pipeline",
            )),
        };
    }
    let pipeline = pipeline
        .cloned()
        .unwrap_or_else(|| config.default_pipeline.clone());
    pipeline
        .validate()
        .map_err(|e| Error::new(Code::InvalidRequest, format!("pipeline: {e}")))?;
    Ok(pipeline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_sampler_name_parses() {
        for name in SAMPLER_NAMES {
            let kind: SamplerKind = serde_json::from_value(serde_json::json!(name))
                .unwrap_or_else(|e| panic!("the documented sampler '{name}' does not parse: {e}"));
            // What a job reports (`JobView::sampler`) is among the documented names.
            assert!(SAMPLER_NAMES.contains(&kind.name()), "{}", kind.name());
        }
    }
}
