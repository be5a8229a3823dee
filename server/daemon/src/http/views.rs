//! The JSON views of the registry that responses carry (and the dashboard reads). Each is a
//! type the OpenAPI document describes (`ToSchema`), so the document is the responses' shape.

use std::sync::atomic::Ordering::Relaxed;

use actors::{JobState, PreloadState};
use joader_core::sampling::SamplerKind;
use joader_pipeline::Pipeline;
use joader_storage::SourceSpec;
use joader_storage::s3::ObjectChanges;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::registry::preload::{PreloadEntry, PreloadRequest};
use crate::registry::{DatasetEntry, JobEntry, RateOver, Registry};
use crate::state::AppState;

/// A dataset.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DatasetView {
    pub name: String,
    pub source: SourceSpec,
    pub state: DatasetState,
    /// Why indexing failed (state `failed`).
    pub error: Option<String>,
    /// Items indexed so far.
    pub progress: u64,
    /// Items of the dataset, once indexed.
    pub items: Option<u64>,
    /// Memory the index takes in the server, once indexed.
    pub index_bytes: Option<u64>,
    /// The class names (a label is an index into them), once indexed.
    pub classes: Option<Vec<String>>,
    pub created_unix: u64,
    /// What the last re-index (`POST /v1/datasets/{name}/reindex`) found changed in the
    /// object store since the index before it (`s3` sources).
    pub changes: Option<ObjectChanges>,
    /// Its working set (`POST /v1/datasets/{name}/preload`), until released.
    pub preload: Option<PreloadView>,
    /// What was appended to it, in order (`POST /v1/datasets/{name}/append`).
    pub appended: Vec<crate::catalog::Appended>,
}

/// A dataset's preload: what it asked for and how far it is.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PreloadView {
    /// `loading`, `ready` (every element pinned, or failed to load), `failed` (see `reason`:
    /// it did not fit, and pins nothing).
    pub state: String,
    pub reason: Option<String>,
    /// The request, its pipeline resolved (the server's default when it named none).
    pub request: PreloadRequest,
    /// Elements of the working set.
    pub elements: u64,
    /// Elements cached and pinned.
    pub pinned: u64,
    /// Elements that failed to read or decode (`GET /v1/datasets/{name}/failures`).
    pub failed: u64,
    /// Bytes the pinned elements take in the cache.
    pub pinned_bytes: u64,
    /// The most bytes every preload together may pin: half the cache's bytes.
    pub budget_bytes: u64,
    /// Elements the preload read and decoded itself (the others were cached or loading for
    /// jobs already).
    pub loads: u64,
    /// Its last element found no room (what is cached is pinned or needed by running jobs):
    /// it goes on as they acknowledge or end.
    pub waiting_for_room: bool,
    /// Seconds since it started.
    pub seconds: f64,
}

/// The view of a dataset's preload.
pub fn preload_view(p: &PreloadEntry) -> PreloadView {
    let g = &p.progress;
    let (state, reason) = match g.state() {
        PreloadState::Loading => ("loading", None),
        PreloadState::Ready => ("ready", None),
        PreloadState::Failed(r) => ("failed", Some(r)),
    };
    PreloadView {
        state: state.into(),
        reason,
        request: p.request.clone(),
        elements: g.elements.load(Relaxed),
        pinned: g.pinned.load(Relaxed),
        failed: g.failed.load(Relaxed),
        pinned_bytes: g.pinned_bytes.load(Relaxed),
        budget_bytes: g.budget_bytes.load(Relaxed),
        loads: g.loads.load(Relaxed),
        waiting_for_room: g.waiting_for_room.load(Relaxed),
        seconds: p.started.elapsed().as_secs_f64(),
    }
}

/// Where a dataset is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetState {
    Indexing,
    Ready,
    Failed,
}

impl DatasetState {
    /// The state of a catalog record (`indexing`, `ready` or `failed`).
    fn of(record_state: &str) -> Self {
        match record_state {
            "ready" => DatasetState::Ready,
            "failed" => DatasetState::Failed,
            _ => DatasetState::Indexing,
        }
    }
}

pub fn dataset_view(d: &DatasetEntry) -> DatasetView {
    let index = d.index.as_ref();
    DatasetView {
        name: d.record.name.clone(),
        source: d.record.source.clone(),
        state: DatasetState::of(&d.record.state),
        error: d.record.error.clone(),
        progress: d.progress.load(Relaxed),
        items: index.map(|i| i.len() as u64),
        index_bytes: index.map(|i| i.heap_bytes()),
        classes: index.map(|i| i.classes().to_vec()),
        created_unix: d.record.created_unix,
        changes: d.record.changes.clone(),
        preload: d.preload.as_ref().map(preload_view),
        appended: d.record.appended.clone(),
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DatasetList {
    pub datasets: Vec<DatasetView>,
}

/// An element of a dataset that failed to read or decode.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Failure {
    pub element: u32,
    /// `read_failed`, `corrupt_image`, `image_too_large`, `not_an_image`, …
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FailureList {
    pub failures: Vec<Failure>,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStateName {
    Waiting,
    Running,
    Finished,
    Failed,
}

/// A job: its parameters and its progress.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    pub name: String,
    pub dataset: String,
    pub state: JobStateName,
    /// Why the job failed (state `failed`).
    pub reason: Option<String>,
    pub epoch: u64,
    /// Position in the current epoch (of the last sampled element).
    pub position: u64,
    /// Elements of its subset: of its next epoch when its dataset grew (`grows`).
    pub subset_size: u64,
    /// The job follows its dataset as it grows (`POST /v1/datasets/{name}/append`): from the
    /// next epoch the server starts for it after an append, each epoch covers the grown
    /// dataset. True for a job of one rank registered without `subset` or `replay`.
    pub grows: bool,
    /// The dataset's fingerprint when the job registered (`items:xxh3-64` of its items'
    /// locations and labels, in id order): a checkpoint keeps it, and a resume on a dataset
    /// whose first items differ is refused (`dataset_changed`).
    pub dataset_fingerprint: String,
    pub sampled: u64,
    pub delivered: u64,
    pub acknowledged: u64,
    /// Samples per second acknowledged: over the last second or so while the job runs, over
    /// its whole run once it has ended (`samples_per_s_over`).
    pub samples_per_s: f64,
    /// What `samples_per_s` is measured over: `recent` (the last second or so) or `run` (an
    /// ended job's mean: acknowledged over the time from its first credit to its last
    /// acknowledgement).
    pub samples_per_s_over: RateOver,
    /// The job's mean over its run so far (to its last acknowledgement once it has ended).
    pub run_samples_per_s: f64,
    pub hits: u64,
    pub misses: u64,
    pub hit_ratio: f64,
    pub errors: u64,
    /// Seconds the job's client waited on an empty ring.
    pub stall_s: f64,
    /// Times one of the job's units (a rank's next batch) waited for cache room other jobs
    /// held (records they had not acknowledged, or elements they needed sooner) while its
    /// client had taken everything and had credit; once per unit. Zero while the cache holds
    /// two batches per reading rank: then no job is held back by another.
    pub waited_for_others: u64,
    pub batch_size: u32,
    pub seed: u64,
    pub world_size: u32,
    /// `null`: until deleted.
    pub epochs: Option<u32>,
    pub drop_last: bool,
    /// `dsa` or `isa` (independent).
    pub sampler: String,
    pub pipeline: Pipeline,
    pub age_s: f64,
    /// The job records its delivery orders (`GET /v1/jobs/{name}/record/{epoch}`).
    pub record: bool,
    /// Deliveries the recorder could not keep up with (the record has gaps).
    pub record_dropped: u64,
    /// Bytes object stores sent for the loads this job's deliveries caused (its misses; a load
    /// shared with other jobs counts for the job whose miss issued it): in all, in its current
    /// epoch and in the epoch before. Zero for local datasets and disk tier hits.
    pub store_read_bytes: u64,
    pub store_read_bytes_epoch: u64,
    pub store_read_bytes_last_epoch: u64,
}

/// A recorded epoch of a job (`record: true`): the ids in the order they were delivered.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RecordView {
    pub job: String,
    pub epoch: u32,
    pub world_size: u32,
    /// The position of `order[0]` in the epoch (0 unless the job was resumed in this epoch).
    pub first_position: u32,
    /// Every rank's deliveries together, by position (what `replay` follows).
    pub order: Vec<u32>,
    /// `ranks[r]`: what rank `r`'s ring received, in order (its batches are consecutive runs of
    /// `batch_size`).
    pub ranks: Vec<Vec<u32>>,
}

pub fn job_view(j: &JobEntry) -> JobView {
    let s = &j.stats;
    let (state, reason) = match s.state() {
        JobState::Waiting => (JobStateName::Waiting, None),
        JobState::Running => (JobStateName::Running, None),
        JobState::Finished => (JobStateName::Finished, None),
        JobState::Failed(r) => (JobStateName::Failed, Some(r)),
    };
    let epoch = s.epoch.load(Relaxed);
    let (rate, over) = j.rate();
    let (store_epoch, store_last) = s
        .store_epochs
        .lock()
        .map(|e| e.at(epoch))
        .unwrap_or_default();
    JobView {
        name: j.name.clone(),
        dataset: j.dataset.clone(),
        state,
        reason,
        epoch,
        position: s.position.load(Relaxed),
        subset_size: j.subset_len.load(Relaxed),
        grows: j.grows,
        dataset_fingerprint: j.fingerprint.clone(),
        sampled: s.sampled.load(Relaxed),
        delivered: s.delivered.load(Relaxed),
        acknowledged: s.acknowledged.load(Relaxed),
        samples_per_s: rate,
        samples_per_s_over: over,
        run_samples_per_s: s.run_rate(!j.has_ended()),
        hits: s.hits.load(Relaxed),
        misses: s.misses.load(Relaxed),
        hit_ratio: s.hit_ratio(),
        errors: s.errors.load(Relaxed),
        stall_s: s.stall_us.load(Relaxed) as f64 / 1e6,
        waited_for_others: s.waited_for_others.load(Relaxed),
        batch_size: j.request.batch_size,
        seed: j.request.seed,
        world_size: j.request.world_size.unwrap_or(1),
        epochs: j.request.epochs,
        drop_last: j.request.drop_last,
        sampler: if j.request.replay.is_some() {
            SamplerKind::Isa.name()
        } else {
            j.request.sampler.unwrap_or(SamplerKind::Dsa).name()
        }
        .into(),
        pipeline: j.pipeline.clone(),
        age_s: j.created.elapsed().as_secs_f64(),
        record: j.request.record,
        record_dropped: s.record_dropped.load(Relaxed),
        store_read_bytes: s.store_read_bytes.load(Relaxed),
        store_read_bytes_epoch: store_epoch,
        store_read_bytes_last_epoch: store_last,
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

/// The ring one rank of a job reads.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RankRing {
    pub rank: u32,
    pub instance: String,
    /// The shared-memory object of the server's data segment.
    pub data_segment: String,
    pub ring: String,
    /// The shared-memory object of this rank's delivery ring.
    pub ring_segment: String,
    pub reader_index: u32,
    /// Records the ring holds.
    pub capacity: u32,
}

/// A registered job and the rings its ranks open.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Registration {
    pub job: JobView,
    /// The shared-memory layout version the server speaks.
    pub layout_version: u32,
    pub ranks: Vec<RankRing>,
}

pub fn registration_view(registry: &Registry, j: &JobEntry) -> Registration {
    let ranks = j
        .rings
        .iter()
        .map(|r| RankRing {
            rank: r.rank,
            instance: registry.config().instance.clone(),
            data_segment: dataplane::names::data_segment(&registry.config().instance),
            ring: r.ring.clone(),
            ring_segment: r.segment.clone(),
            reader_index: r.reader_index,
            capacity: r.capacity,
        })
        .collect();
    Registration {
        job: job_view(j),
        layout_version: dataplane::LAYOUT_VERSION,
        ranks,
    }
}

/// `GET /v1/stats`: the cache, the loader, the sampler and the process.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    pub instance: String,
    pub version: String,
    pub uptime_s: f64,
    pub requests: u64,
    pub hits: u64,
    pub misses: u64,
    pub hit_ratio: f64,
    pub loads: u64,
    pub decodes: u64,
    /// Deliveries served without a read and preparation of their own (as the metric
    /// `joader_decodes_saved_total`).
    pub decodes_saved: u64,
    pub bytes_read: u64,
    pub load_errors: u64,
    pub evictions: u64,
    pub evictions_unneeded: u64,
    pub evictions_needed: u64,
    /// Loads of elements evicted while a ring still had them queued (memory was short).
    pub reloads: u64,
    pub slots_in_use: u64,
    pub slot_capacity: u64,
    pub bytes_in_use: u64,
    pub capacity_bytes: u64,
    pub waiting_for_space: u64,
    /// Elements rings need whose load waits for a free place (loads are bounded).
    pub pending_loads: u64,
    pub loader_queue: u64,
    pub loader_busy_s: f64,
    pub rounds: u64,
    pub mean_share: f64,
    pub loader_workers: u64,
    /// This process's CPU seconds (null where `/proc` is not available).
    pub process_cpu_s: Option<f64>,
    pub process_rss_bytes: Option<u64>,
    pub process_threads: Option<u64>,
    pub state: StateSizes,
    /// The disk tier of encoded bytes from object stores (null: none, `--disk-cache`).
    pub disk_cache: Option<DiskCache>,
    /// The buffer of encoded bytes fetched ahead from object stores, memory beside the
    /// cache's (null: the server reads no object store).
    pub fetch_ahead: Option<FetchAhead>,
}

/// The fetch-ahead buffer in `GET /v1/stats` (the metrics `joader_s3_fetch_ahead_*`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FetchAhead {
    /// `--s3-fetch-ahead-bytes` (0: no fetch-ahead).
    pub capacity_bytes: u64,
    /// Bytes held now (those on their way at the mean element size).
    pub bytes: u64,
    pub requests: u64,
    /// Loads whose bytes were waiting, and loads that waited for their bytes on their way.
    pub hits: u64,
    pub joined: u64,
    /// Elements not fetched ahead because the buffer was full.
    pub full: u64,
    pub failed: u64,
    pub stale: u64,
}

fn fetch_ahead_view(state: &AppState) -> Option<FetchAhead> {
    let a = state.registry.objects()?.stats().ahead();
    Some(FetchAhead {
        capacity_bytes: a.capacity,
        bytes: a.bytes,
        requests: a.requests,
        hits: a.hits,
        joined: a.joined,
        full: a.full,
        failed: a.failed,
        stale: a.stale,
    })
}

/// The disk tier in `GET /v1/stats` (the metrics `joader_disk_cache_*`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DiskCache {
    pub capacity_bytes: u64,
    pub bytes: u64,
    pub objects: u64,
    pub hits: u64,
    pub misses: u64,
    pub writes: u64,
    pub evictions: u64,
    pub not_admitted: u64,
    pub write_errors: u64,
    pub corrupt: u64,
    /// False once a write error stopped writing (it still serves what it holds).
    pub writing: bool,
    /// Body bytes received from object stores, in all.
    pub store_read_bytes: u64,
}

fn disk_cache_view(state: &AppState) -> Option<DiskCache> {
    let objects = state.registry.objects()?;
    let t = objects.tier()?.stats();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
    Some(DiskCache {
        capacity_bytes: l(&t.capacity),
        bytes: l(&t.bytes),
        objects: l(&t.objects),
        hits: l(&t.hits),
        misses: l(&t.misses),
        writes: l(&t.writes),
        evictions: l(&t.evictions),
        not_admitted: l(&t.not_admitted),
        write_errors: l(&t.write_errors),
        corrupt: l(&t.corrupt),
        writing: l(&t.writing) == 1,
        store_read_bytes: l(&objects.stats().bytes),
    })
}

/// The sizes of the server's per-job state: each returns to its idle value once the jobs are
/// gone and the retention periods have passed (see `registry::housekeep`).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct StateSizes {
    pub jobs: u64,
    pub retired_job_names: u64,
    pub registering: u64,
    pub metric_job_series: u64,
    pub cache_open_jobs: u64,
    pub cache_sources: u64,
}

pub fn stats_view(state: &AppState, sizes: StateSizes) -> Stats {
    let s = &state.registry.stats();
    let requests = s.requests.load(Relaxed);
    let hits = s.hits.load(Relaxed);
    let rounds_el = s.round_elements.load(Relaxed);
    let process = crate::procstat::process_stats();
    Stats {
        instance: state.registry.config().instance.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: state.registry.uptime().as_secs_f64(),
        requests,
        hits,
        misses: s.misses.load(Relaxed),
        hit_ratio: if requests == 0 {
            0.0
        } else {
            hits as f64 / requests as f64
        },
        loads: s.loads.load(Relaxed),
        decodes: s.decodes.load(Relaxed),
        decodes_saved: hits,
        bytes_read: s.bytes_read.load(Relaxed),
        load_errors: s.load_errors.load(Relaxed),
        evictions: s.evictions.load(Relaxed),
        evictions_unneeded: s.evictions_unneeded.load(Relaxed),
        evictions_needed: s.evictions_needed.load(Relaxed),
        reloads: s.reloads.load(Relaxed),
        slots_in_use: s.slots_in_use.load(Relaxed),
        slot_capacity: s.slot_capacity.load(Relaxed),
        bytes_in_use: s.bytes_in_use.load(Relaxed),
        capacity_bytes: s.capacity_bytes.load(Relaxed),
        waiting_for_space: s.waiting_for_space.load(Relaxed),
        pending_loads: s.pending_loads.load(Relaxed),
        loader_queue: s.loader_queue.load(Relaxed),
        loader_busy_s: s.loader_busy_us.load(Relaxed) as f64 / 1e6,
        rounds: s.rounds.load(Relaxed),
        mean_share: if rounds_el == 0 {
            0.0
        } else {
            s.round_deliveries.load(Relaxed) as f64 / rounds_el as f64
        },
        loader_workers: state.registry.config().loader_workers.max(1) as u64,
        process_cpu_s: process.map(|p| p.cpu_seconds),
        process_rss_bytes: process.map(|p| p.rss_bytes),
        process_threads: process.map(|p| p.threads),
        state: sizes,
        disk_cache: disk_cache_view(state),
        fetch_ahead: fetch_ahead_view(state),
    }
}

/// `GET /v1/stats/history`: what the dashboard charts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct History {
    /// Seconds between samples.
    pub interval_s: f64,
    /// Cumulative counters, one sample a second: `t` (uptime s), `requests`, `hits`,
    /// `decodes`, `loads`, `bytes_read`, `bytes_in_use`, `capacity_bytes`, `slots_in_use`,
    /// `cpu_s`, `rss_bytes`, `jobs` (`{name: {acknowledged, stall_s}}`).
    #[schema(value_type = Vec<Object>)]
    pub samples: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}
