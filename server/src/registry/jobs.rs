//! Jobs: registration (a new job, or another rank of a running one), and stopping.

use std::sync::Arc;
use std::time::Instant;

use actix::Actor;
use joader_pipeline::{Limits, Pipeline};
use actors::service::{
    AddJob, CloseJob, JobState, JobStats, OpenJob, OpenJobError, RemoveJob, RingInfo, SamplerActor,
};
use joader_core::sampling::SamplerKind;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::subset::SubsetSpec;
use super::{AppState, JobEntry, Registering, check_name};
use crate::error::{Code, Error, Result};
use crate::loading::{IndexSource, PipelinePrepare};

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

/// The most ranks a job may have on one server.
pub const MAX_WORLD_SIZE: u32 = 64;
/// The most ranks a multi-node job may have.
pub const MAX_CLUSTER_WORLD_SIZE: u32 = 4096;
/// The most records a delivery ring may hold (64 bytes each: a 4 MiB ring).
pub const MAX_RING_CAPACITY: u32 = 1 << 16;

/// The ring capacity of each of a job's ranks, or a refusal if it can never fit: above
/// [`MAX_RING_CAPACITY`], or all ranks' rings together above the cache's slots (every record
/// of a ring pins a slot).
fn ring_capacity(config: &crate::config::Config, req: &JobRequest) -> Result<u32> {
    let capacity = req
        .ring_capacity
        .filter(|&c| c > 0)
        .unwrap_or(if config.ring_capacity > 0 {
            config.ring_capacity
        } else {
            req.batch_size.saturating_mul(2).max(64)
        });
    if capacity < req.batch_size {
        return Err(Error::new(
            Code::InvalidRequest,
            format!(
                "ring_capacity {capacity} cannot hold one batch of {}: give at least batch_size",
                req.batch_size
            ),
        ));
    }
    if capacity > MAX_RING_CAPACITY {
        return Err(Error::new(
            Code::TooLarge,
            format!(
                "ring_capacity {capacity} is above the limit of {MAX_RING_CAPACITY} records per \
                 ring (a batch_size above {} needs an explicit smaller ring_capacity)",
                MAX_RING_CAPACITY / 2
            ),
        ));
    }
    let world = u64::from(req.local_world_size.or(req.world_size).unwrap_or(1));
    let needed = u64::from(capacity) * world;
    if needed > u64::from(config.cache_slots) {
        return Err(Error::new(
            Code::TooLarge,
            format!(
                "the job's {world} ring(s) of {capacity} records need {needed} cache slots and \
                 the cache has {} (cache_slots): raise --cache-slots or lower ring_capacity or \
                 batch_size",
                config.cache_slots
            ),
        ));
    }
    Ok(capacity)
}

/// The fewest bytes an element of `pipeline` can take in the cache (raw bytes: unknown, 1).
fn min_element_bytes(pipeline: &Pipeline) -> u64 {
    match pipeline {
        Pipeline::Raw => 1,
        Pipeline::Decode {
            center_crop: Some([h, w]),
            ..
        } => u64::from(*h) * u64::from(*w) * 3,
        // The shorter side is `s`, the other at least as long.
        Pipeline::Decode {
            resize_shorter: Some(s),
            ..
        } => u64::from(*s) * u64::from(*s) * 3,
        Pipeline::Decode { .. } => 1,
    }
}

/// Refuses a job one batch of which can never be in the cache at once (its client could
/// never take a batch). Everything smaller is admitted: jobs share the cache by flow control,
/// not by reservations.
fn batch_fits(config: &crate::config::Config, pipeline: &Pipeline, batch: u32) -> Result<()> {
    let bytes = min_element_bytes(pipeline).saturating_mul(u64::from(batch));
    if bytes > config.cache_bytes {
        return Err(Error::new(
            Code::TooLarge,
            format!(
                "one batch of {batch} elements takes at least {bytes} bytes and the cache holds \
                 {} (cache_bytes): raise --cache-bytes or lower batch_size",
                config.cache_bytes
            ),
        ));
    }
    Ok(())
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
    fn order(&self, data_dir: &std::path::Path, len: u32) -> Result<Vec<u32>> {
        check_name("job", &self.job)?;
        let bad = |m: String| Error::new(Code::InvalidReplay, m);
        let rec = super::record::read(data_dir, &self.job, self.epoch)
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
}

/// The first field in which two job requests differ (ranks of one job must agree on all).
fn differing_field(a: &JobRequest, b: &JobRequest) -> Option<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return Some("parameters".into());
    };
    a.keys()
        .chain(b.keys())
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
}

fn conflict(name: &str, field: &str) -> Error {
    Error::new(
        Code::JobExists,
        format!(
            "a job named '{name}' is running with other parameters ('{field}' differs): every \
             rank of a job must send the same parameters, and another job needs another name"
        ),
    )
}

/// A job name reserved for one registration; dropping it (the registration ended, however)
/// frees the name and wakes the ranks waiting for it.
struct Reservation<'a> {
    state: &'a AppState,
    name: String,
    _done: watch::Sender<()>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.state.inner.lock() {
            inner.registering.remove(&self.name);
        }
        // `_done` is dropped after this: the waiters see the registry as it now is.
    }
}

/// Registers a job, or returns the running job this request is another rank of. Returns
/// `view` of the job's entry and whether the job was created.
pub async fn register_job<T>(
    state: &AppState,
    req: JobRequest,
    view: impl Fn(&AppState, &JobEntry) -> T,
) -> Result<(T, bool)> {
    check_name("job", &req.name)?;
    super::check_not_draining(state)?;
    if let Some(v) = req.client.as_ref().and_then(|c| c.layout_version)
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
    if req.batch_size == 0 {
        return Err(Error::new(
            Code::InvalidRequest,
            "batch_size must be at least 1",
        ));
    }
    if req.epochs == Some(0) {
        return Err(Error::new(
            Code::InvalidRequest,
            "epochs must be at least 1 (or null for unlimited)",
        ));
    }
    let world = req.world_size.unwrap_or(1);
    if world == 0 {
        return Err(Error::new(
            Code::InvalidRequest,
            "world_size must be at least 1",
        ));
    }
    let local_world = req.local_world_size.unwrap_or(world);
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
    if let Some(r) = req.rank
        && r >= world
    {
        return Err(Error::new(
            Code::InvalidRequest,
            format!("rank {r} is not below world_size {world}"),
        ));
    }
    // A multi-node job: this node serves the block of `local_world` ranks holding `rank`.
    let multi = local_world < world;
    let first_rank = req.rank.unwrap_or(0) / local_world * local_world;
    let local_ranks = local_world.min(world - first_rank);
    let agent = if multi {
        if req.rank.is_none() {
            return Err(Error::new(
                Code::InvalidRequest,
                "a multi-node job (local_world_size below world_size) needs each rank's `rank`",
            ));
        }
        Some(state.node.get().cloned().ok_or_else(|| {
            Error::new(
                Code::InvalidRequest,
                "this leader serves no ranks (--leader-only): register multi-node ranks with \
                 the follower on their node",
            )
        })?)
    } else {
        None
    };
    let capacity = ring_capacity(&state.config, &req)?;
    let pipeline = req
        .pipeline
        .clone()
        .unwrap_or_else(|| state.config.default_pipeline.clone());
    pipeline
        .validate()
        .map_err(|e| Error::new(Code::InvalidRequest, format!("pipeline: {e}")))?;
    batch_fits(&state.config, &pipeline, req.batch_size)?;

    // Existing job: the same parameters mean another rank of it. A failed job's name, or a
    // finished one whose rings are closed, is taken over; so is a finished job's name by a
    // job with other parameters. The name is reserved before the first await, so that ranks
    // arriving together (as torchrun starts them) create the job once and join it.
    let identity = req.identity();
    let (replaced, _reservation) = loop {
        let mut done = {
            let mut inner = state.inner.lock().map_err(Error::internal)?;
            if let Some(r) = inner.registering.get(&req.name) {
                if let Some(field) = differing_field(&r.request, &identity) {
                    return Err(conflict(&req.name, &field));
                }
                r.done.clone()
            } else {
                let replaced = match inner.jobs.get(&req.name) {
                    Some(j) => {
                        let differs = differing_field(&j.request, &identity);
                        let closed = j.stats.closed.load(std::sync::atomic::Ordering::Relaxed);
                        match (j.stats.state(), differs) {
                            (JobState::Failed(_), _) => true,
                            (JobState::Finished, _) if closed => true,
                            // A finished job's name, wanted by another job.
                            (JobState::Finished, Some(_)) => true,
                            // Another rank of this job (a small job's end of stream may be
                            // pushed before its last rank arrives: it still joins).
                            (_, None) => return Ok((view(state, j), false)),
                            (_, Some(field)) => return Err(conflict(&req.name, &field)),
                        }
                    }
                    None => false,
                };
                let (tx, rx) = watch::channel(());
                inner.registering.insert(
                    req.name.clone(),
                    Registering {
                        request: identity.clone(),
                        done: rx,
                    },
                );
                break (
                    replaced,
                    Reservation {
                        state,
                        name: req.name.clone(),
                        _done: tx,
                    },
                );
            }
        };
        // Resolves when the registration in progress ends; then look again.
        let _ = done.changed().await;
    };
    if replaced {
        stop_job(state, &req.name).await?;
    }

    // Resolve the dataset and the subset.
    let (dataset_id, index, source, sampler, pipeline_id) = {
        let mut inner = state.inner.lock().map_err(Error::internal)?;
        let pipeline_id = inner.pipeline_id(&pipeline)?;
        let d = inner
            .datasets
            .get_mut(&req.dataset)
            .ok_or_else(|| Error::dataset_not_found(&req.dataset))?;
        let Some(index) = d.index.clone() else {
            return Err(Error::new(
                Code::DatasetNotReady,
                format!("dataset '{}' is {}", req.dataset, d.record.state),
            ));
        };
        let source = match &d.source {
            Some(s) => s.clone(),
            // Opened when the dataset was indexed or loaded; failing then, it is logged.
            None if matches!(d.record.source, joader_storage::SourceSpec::S3 { .. }) => {
                return Err(Error::new(
                    Code::DatasetNotReady,
                    format!(
                        "dataset '{}' cannot open its object store (the server's log says \
                         why; check its AWS_* environment and restart it)",
                        req.dataset
                    ),
                ));
            }
            None => d
                .source
                .insert(Arc::new(IndexSource(index.clone())))
                .clone(),
        };
        let sampler = d
            .sampler
            .get_or_insert_with(|| {
                let (id, cache, stats) = (d.id, state.cache.clone(), state.stats.clone());
                let tick = std::time::Duration::from_millis(state.config.sampler_tick_ms);
                let window = std::time::Duration::from_millis(state.config.start_window_ms);
                SamplerActor::start_in_arbiter(&state.samplers, move |_| {
                    SamplerActor::new(id, cache.recipient(), tick, stats).with_start_window(window)
                })
            })
            .clone();
        (d.id, index, source, sampler, pipeline_id)
    };
    if multi && (req.resume.is_some() || req.replay.is_some() || req.record) {
        return Err(Error::new(
            Code::InvalidRequest,
            "resume, replay and record are for jobs on one server: a multi-node job \
             (local_world_size below world_size) cannot use them yet",
        ));
    }
    if req.replay.is_some() && (req.subset.is_some() || req.resume.is_some()) {
        return Err(Error::new(
            Code::InvalidReplay,
            "replay sets the job's order and subset: give no subset and no resume with it",
        ));
    }
    // Whole-index work (a fraction of 1.28 M ids takes milliseconds) and a recorded order
    // read from disk: on the blocking pool, not on this HTTP worker.
    let spec = req.subset.clone();
    let (replay, data_dir) = (req.replay.clone(), state.config.data_dir.clone());
    let (subset, replay) = actix_web::rt::task::spawn_blocking(move || {
        let len = index.len() as u32;
        if let Some(r) = &replay {
            let order = r.order(&data_dir, len)?;
            return Ok((order.iter().copied().collect(), Some(Arc::from(order))));
        }
        match &spec {
            None => {
                let mut all = roaring::RoaringBitmap::new();
                all.insert_range(0..len);
                Ok(all)
            }
            Some(s) => s.resolve(len, |e| index.label(e).unwrap_or(-1), index.classes()),
        }
        .map(|s| (s, None))
    })
    .await
    .map_err(Error::internal)??;
    if subset.is_empty() {
        return Err(Error::new(
            Code::EmptySubset,
            "the subset selects no element of the dataset",
        ));
    }
    let resume = match &req.resume {
        Some(r) => {
            let (subset, epochs, r) = (subset.clone(), req.epochs, r.clone());
            let (epoch, remaining) =
                actix_web::rt::task::spawn_blocking(move || r.start(&subset, epochs))
                    .await
                    .map_err(Error::internal)??;
            Some((epoch, Arc::new(remaining)))
        }
        None => None,
    };
    let subset = Arc::new(subset);
    let stats = Arc::new(JobStats::default());
    let job_id = {
        let mut inner = state.inner.lock().map_err(Error::internal)?;
        inner.next_job_id += 1;
        inner.next_job_id
    };
    let prepare = Arc::new(PipelinePrepare {
        pipeline: pipeline.clone(),
        limits: Limits {
            max_pixels: state.config.max_pixels,
        },
    });
    let rings: Vec<RingInfo> = state
        .cache
        .send(OpenJob {
            job: job_id,
            dataset: dataset_id,
            source,
            pipeline: pipeline_id,
            prepare,
            subset: subset.clone(),
            ring_prefix: req.name.clone(),
            ranks: local_ranks,
            capacity,
            batch: req.batch_size,
            stats: stats.clone(),
            sampler: match &agent {
                Some(a) => a.clone().recipient(),
                None => sampler.clone().recipient(),
            },
            resume: resume.as_ref().map(|(_, remaining)| remaining.clone()),
        })
        .await
        .map_err(Error::internal)?
        .map_err(|e| match e {
            OpenJobError::AlreadyOpen(_) | OpenJobError::Empty => Error::internal(e),
            OpenJobError::ShutDown => Error::new(Code::ShuttingDown, e.to_string()),
            // Out of reader indices or shared memory for a ring: transient, jobs end.
            OpenJobError::Ring { .. } => Error::new(Code::CacheFull, e.to_string()),
        })?;
    let mut rings = rings;
    let remover: actix::Recipient<RemoveJob> = match &agent {
        None => sampler.clone().recipient(),
        Some(agent) => {
            // The rings are the node's block of global ranks.
            for r in &mut rings {
                r.rank += first_rank;
            }
            let items = {
                let inner = state.inner.lock().map_err(Error::internal)?;
                inner
                    .datasets
                    .get(&req.dataset)
                    .and_then(|d| d.index.as_ref())
                    .map_or(0, |i| i.len() as u64)
            };
            let body = crate::cluster::NodeJob {
                job: req.identity(),
                ranks: (first_rank..first_rank + local_ranks).collect(),
                items,
            };
            use crate::cluster::node::{Joined, Joining, Track, join_leader};
            agent.send(Joining).await.map_err(Error::internal)?;
            let joined = join_leader(state, body).await;
            let track = joined.as_ref().ok().map(|&cluster| Track {
                cluster,
                local: job_id,
                dataset: dataset_id,
                stats: stats.clone(),
            });
            agent.send(Joined(track)).await.map_err(Error::internal)?;
            if let Err(e) = joined {
                state.cache.do_send(CloseJob { job: job_id });
                return Err(e);
            }
            agent.clone().recipient()
        }
    };
    let record = if req.record {
        let dir = super::record::dir(&state.config.data_dir, &req.name);
        match actix_web::rt::task::spawn_blocking(move || super::record::start(dir, world))
            .await
            .map_err(Error::internal)?
        {
            Ok(tx) => Some(tx),
            Err(e) => {
                state.cache.do_send(CloseJob { job: job_id });
                return Err(Error::internal(e));
            }
        }
    } else {
        None
    };
    let added = if agent.is_some() {
        Ok(())
    } else {
        sampler
            .send(AddJob {
                job: job_id,
                subset: subset.clone(),
                seed: req.seed,
                epochs: req.epochs,
                sampler: req.sampler.unwrap_or(SamplerKind::Dsa),
                // The Cache grants the rings' capacity when every rank's client has attached.
                credit: 0,
                // Two batches: a job that fell one batch out of step still joins the others' passes.
                lookahead: 2 * req.batch_size * world,
                stats: stats.clone(),
                resume,
                replay,
                record,
            })
            .await
            .map_err(Error::internal)?
    };
    if let Err(e) = added {
        state.cache.do_send(CloseJob { job: job_id });
        return Err(Error::internal(e));
    }
    let entry = JobEntry {
        id: job_id,
        name: req.name.clone(),
        dataset: req.dataset.clone(),
        subset_len: subset.len(),
        pipeline,
        request: req.identity(),
        stats,
        rings,
        sampler: remover,
        created: Instant::now(),
        rate: Default::default(),
        ended_at: Default::default(),
    };
    let body = view(state, &entry);
    state
        .inner
        .lock()
        .map_err(Error::internal)?
        .jobs
        .insert(req.name.clone(), entry);
    tracing::info!(job = %req.name, dataset = %req.dataset, world, local_ranks, multi, capacity, "job registered");
    Ok((body, true))
}

/// Stops a job: no more sampling, its rings closed and its slots released.
pub async fn stop_job(state: &AppState, name: &str) -> Result<()> {
    let entry = state
        .inner
        .lock()
        .map_err(Error::internal)?
        .jobs
        .remove(name)
        .ok_or_else(|| Error::job_not_found(name))?;
    entry
        .sampler
        .send(RemoveJob { job: entry.id })
        .await
        .map_err(Error::internal)?;
    state
        .cache
        .send(CloseJob { job: entry.id })
        .await
        .map_err(Error::internal)?;
    entry.stats.set_state(JobState::Failed("deleted".into()));
    // Closed: its counters are final; a later job of the same name continues from them.
    state
        .inner
        .lock()
        .map_err(Error::internal)?
        .retire(name, &entry.stats);
    Ok(())
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
