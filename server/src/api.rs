//! The REST API under `/v1`: datasets and jobs, one error model.
//!
//! Errors are `{"error": {"code": "...", "message": "..."}}` with the HTTP status of the code
//! (see [`ApiError`]). Bad input changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use actix::Actor;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError, delete, get, post, web};
use actors::pipeline::{Limits, Pipeline};
use actors::sampling::SamplerKind;
use actors::service::{
    AddJob, CloseJob, JobState, JobStats, OpenJob, RemoveJob, RingInfo, SamplerActor,
};
use actors::storage::SourceSpec;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::catalog::DatasetRecord;
use crate::glue::{IndexSource, PipelinePrepare};
use crate::state::{AppState, DatasetEntry, JobEntry};

/// The machine-readable error codes and their HTTP statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidRequest,
    Unauthorized,
    PathNotAllowed,
    DatasetNotFound,
    JobNotFound,
    NotFound,
    DatasetExists,
    JobExists,
    DatasetInUse,
    DatasetNotReady,
    EmptySubset,
    VersionMismatch,
    CacheFull,
    Internal,
}

impl Code {
    pub const ALL: [Code; 14] = [
        Code::InvalidRequest,
        Code::Unauthorized,
        Code::PathNotAllowed,
        Code::DatasetNotFound,
        Code::JobNotFound,
        Code::NotFound,
        Code::DatasetExists,
        Code::JobExists,
        Code::DatasetInUse,
        Code::DatasetNotReady,
        Code::EmptySubset,
        Code::VersionMismatch,
        Code::CacheFull,
        Code::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::Unauthorized => "unauthorized",
            Code::PathNotAllowed => "path_not_allowed",
            Code::DatasetNotFound => "dataset_not_found",
            Code::JobNotFound => "job_not_found",
            Code::NotFound => "not_found",
            Code::DatasetExists => "dataset_exists",
            Code::JobExists => "job_exists",
            Code::DatasetInUse => "dataset_in_use",
            Code::DatasetNotReady => "dataset_not_ready",
            Code::EmptySubset => "empty_subset",
            Code::VersionMismatch => "version_mismatch",
            Code::CacheFull => "cache_full",
            Code::Internal => "internal",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidRequest | Code::EmptySubset => StatusCode::BAD_REQUEST,
            Code::Unauthorized => StatusCode::UNAUTHORIZED,
            Code::PathNotAllowed => StatusCode::FORBIDDEN,
            Code::DatasetNotFound | Code::JobNotFound | Code::NotFound => StatusCode::NOT_FOUND,
            Code::DatasetExists
            | Code::JobExists
            | Code::DatasetInUse
            | Code::DatasetNotReady
            | Code::VersionMismatch => StatusCode::CONFLICT,
            Code::CacheFull => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An API error: a code and a human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.code.status()
    }
    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code())
            .json(json!({"error": {"code": self.code.as_str(), "message": self.message}}))
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(Code::Internal, e.to_string())
}

/// Names of datasets and jobs: they end up in shared-memory names.
fn check_name(kind: &str, name: &str) -> ApiResult<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            Code::InvalidRequest,
            format!(
                "{kind} name '{name}' must have 1 to 64 characters from A-Z a-z 0-9 _ - . and not start with '.'"
            ),
        ))
    }
}

// ---------------------------------------------------------------- datasets

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateDataset {
    pub name: String,
    pub source: SourceSpec,
}

pub fn dataset_json(d: &DatasetEntry) -> serde_json::Value {
    let index = d.index.as_ref();
    json!({
        "name": d.record.name,
        "source": d.record.source,
        "state": d.record.state,
        "error": d.record.error,
        "progress": d.progress.load(Relaxed),
        "items": index.map(|i| i.items.len()),
        "classes": index.map(|i| i.classes.clone()),
        "created_unix": d.record.created_unix,
    })
}

#[post("/v1/datasets")]
async fn create_dataset(
    state: web::Data<AppState>,
    body: web::Json<CreateDataset>,
) -> ApiResult<HttpResponse> {
    let body = body.into_inner();
    check_name("dataset", &body.name)?;
    body.source
        .check_roots(&state.config.allowed_roots)
        .map_err(|e| {
            ApiError::new(
                Code::PathNotAllowed,
                format!("{e}; allowed roots: {:?}", state.config.allowed_roots),
            )
        })?;
    let record = DatasetRecord {
        name: body.name.clone(),
        source: body.source,
        state: "indexing".into(),
        error: None,
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    {
        let mut inner = state.inner.lock().map_err(internal)?;
        if inner.datasets.contains_key(&record.name) {
            return Err(ApiError::new(
                Code::DatasetExists,
                format!("dataset '{}' already exists", record.name),
            ));
        }
        state.catalog.put(&record, None).map_err(internal)?;
        let id = inner.next_dataset_id()?;
        inner
            .datasets
            .insert(record.name.clone(), DatasetEntry::new(id, record.clone()));
    }
    crate::state::start_indexing(state.clone().into_inner(), record.name.clone());
    let inner = state.inner.lock().map_err(internal)?;
    Ok(HttpResponse::Accepted().json(dataset_json(&inner.datasets[&record.name])))
}

#[get("/v1/datasets")]
async fn list_datasets(state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    let inner = state.inner.lock().map_err(internal)?;
    let list: Vec<_> = inner.datasets.values().map(dataset_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "datasets": list })))
}

#[get("/v1/datasets/{name}")]
async fn get_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let inner = state.inner.lock().map_err(internal)?;
    let d = inner
        .datasets
        .get(name.as_str())
        .ok_or_else(|| dataset_not_found(&name))?;
    Ok(HttpResponse::Ok().json(dataset_json(d)))
}

#[get("/v1/datasets/{name}/failures")]
async fn dataset_failures(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let id = {
        let inner = state.inner.lock().map_err(internal)?;
        inner
            .datasets
            .get(name.as_str())
            .ok_or_else(|| dataset_not_found(&name))?
            .id
    };
    let failures = state.stats.failures.lock().map_err(internal)?;
    let list: Vec<_> = failures
        .iter()
        .filter(|((ds, _), _)| *ds == id)
        .map(|((_, element), (kind, message))| json!({"element": element, "kind": kind, "message": message}))
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "failures": list })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

#[delete("/v1/datasets/{name}")]
async fn delete_dataset(
    state: web::Data<AppState>,
    name: web::Path<String>,
    q: web::Query<DeleteQuery>,
) -> ApiResult<HttpResponse> {
    let users: Vec<String> = {
        let inner = state.inner.lock().map_err(internal)?;
        if !inner.datasets.contains_key(name.as_str()) {
            return Err(dataset_not_found(&name));
        }
        inner
            .jobs
            .values()
            .filter(|j| j.dataset == *name)
            .map(|j| j.name.clone())
            .collect()
    };
    if !users.is_empty() && !q.force {
        return Err(ApiError::new(
            Code::DatasetInUse,
            format!(
                "dataset '{name}' is used by job(s) {}; delete them first or pass ?force=true",
                users.join(", ")
            ),
        ));
    }
    for job in users {
        stop_job(&state, &job).await?;
    }
    state.catalog.remove(&name).map_err(internal)?;
    let mut inner = state.inner.lock().map_err(internal)?;
    inner.datasets.remove(name.as_str());
    Ok(HttpResponse::NoContent().finish())
}

fn dataset_not_found(name: &str) -> ApiError {
    ApiError::new(Code::DatasetNotFound, format!("no dataset named '{name}'"))
}

// ---------------------------------------------------------------- jobs

/// Which elements of the dataset a job trains on. Either a list of ids, or an object whose
/// filters all apply: `{"start": a, "end": b}` (ids a..b), `"ranges": [[a, b], …]`,
/// `"classes": ["cat", …]`, `"ids": […]`, then `"fraction": f` with `"seed"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum SubsetSpec {
    Ids(Vec<u32>),
    Filter(SubsetFilter),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SubsetFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Vec<[u32; 2]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl SubsetSpec {
    /// The subset as ids of a dataset of `len` items with these labels and class names.
    pub fn resolve(
        &self,
        len: u32,
        labels: impl Fn(u32) -> i64,
        classes: &[String],
    ) -> ApiResult<RoaringBitmap> {
        let bad = |m: String| ApiError::new(Code::InvalidRequest, m);
        let check_ids = |ids: &[u32]| -> ApiResult<RoaringBitmap> {
            if let Some(&e) = ids.iter().find(|&&e| e >= len) {
                return Err(bad(format!(
                    "subset id {e} is beyond the dataset's {len} items"
                )));
            }
            Ok(ids.iter().copied().collect())
        };
        let f = match self {
            SubsetSpec::Ids(ids) => return check_ids(ids),
            SubsetSpec::Filter(f) => f,
        };
        let mut set: RoaringBitmap = (0..len).collect();
        if f.start.is_some() || f.end.is_some() {
            let (a, b) = (f.start.unwrap_or(0), f.end.unwrap_or(len));
            if a > b || b > len {
                return Err(bad(format!("subset range {a}..{b} is not within 0..{len}")));
            }
            set &= (a..b).collect::<RoaringBitmap>();
        }
        if let Some(ranges) = &f.ranges {
            let mut r = RoaringBitmap::new();
            for &[a, b] in ranges {
                if a > b || b > len {
                    return Err(bad(format!("subset range {a}..{b} is not within 0..{len}")));
                }
                r.insert_range(a..b);
            }
            set &= r;
        }
        if let Some(names) = &f.classes {
            let mut wanted = Vec::new();
            for n in names {
                let i = classes
                    .iter()
                    .position(|c| c == n)
                    .ok_or_else(|| bad(format!("the dataset has no class '{n}'")))?;
                wanted.push(i as i64);
            }
            set = set
                .iter()
                .filter(|&e| wanted.contains(&labels(e)))
                .collect();
        }
        if let Some(ids) = &f.ids {
            set &= check_ids(ids)?;
        }
        if let Some(frac) = f.fraction {
            if !(frac > 0.0 && frac <= 1.0) {
                return Err(bad(format!(
                    "subset fraction must be in (0, 1], got {frac}"
                )));
            }
            let all: Vec<u32> = set.iter().collect();
            let k = ((all.len() as f64) * frac).round() as usize;
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(f.seed.unwrap_or(0));
            set = rand::seq::index::sample(&mut rng, all.len(), k)
                .into_iter()
                .map(|i| all[i])
                .collect();
        }
        Ok(set)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
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
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    pub name: String,
    pub dataset: String,
    #[serde(default)]
    pub subset: Option<SubsetSpec>,
    pub batch_size: u32,
    #[serde(default)]
    pub seed: u64,
    /// This process's rank (informational: every rank's ring is returned).
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub world_size: Option<u32>,
    /// `null`: until deleted.
    #[serde(default)]
    pub epochs: Option<u32>,
    #[serde(default)]
    pub drop_last: bool,
    #[serde(default)]
    pub sampler: Option<SamplerKind>,
    #[serde(default)]
    pub pipeline: Option<Pipeline>,
    #[serde(default)]
    pub ring_capacity: Option<u32>,
    #[serde(default)]
    pub client: Option<ClientInfo>,
}

impl JobRequest {
    /// The parameters that define the job (two ranks registering must agree on them).
    fn identity(&self) -> JobRequest {
        JobRequest {
            rank: None,
            client: None,
            ..self.clone()
        }
    }
}

pub fn job_json(j: &JobEntry) -> serde_json::Value {
    let s = &j.stats;
    let state = s.state();
    let (state_name, reason) = match &state {
        JobState::Waiting => ("waiting", None),
        JobState::Running => ("running", None),
        JobState::Finished => ("finished", None),
        JobState::Failed(r) => ("failed", Some(r.clone())),
    };
    json!({
        "name": j.name,
        "dataset": j.dataset,
        "state": state_name,
        "reason": reason,
        "epoch": s.epoch.load(Relaxed),
        "position": s.position.load(Relaxed),
        "subset_size": j.subset_len,
        "sampled": s.sampled.load(Relaxed),
        "delivered": s.delivered.load(Relaxed),
        "acknowledged": s.acknowledged.load(Relaxed),
        "samples_per_s": j.rate(),
        "hits": s.hits.load(Relaxed),
        "misses": s.misses.load(Relaxed),
        "hit_ratio": s.hit_ratio(),
        "errors": s.errors.load(Relaxed),
        "stall_s": s.stall_us.load(Relaxed) as f64 / 1e6,
        "batch_size": j.request.batch_size,
        "seed": j.request.seed,
        "world_size": j.request.world_size.unwrap_or(1),
        "epochs": j.request.epochs,
        "drop_last": j.request.drop_last,
        "sampler": j.request.sampler.unwrap_or(SamplerKind::Dsa).name(),
        "pipeline": j.pipeline,
        "age_s": j.created.elapsed().as_secs_f64(),
    })
}

fn registration_json(state: &AppState, j: &JobEntry) -> serde_json::Value {
    let ranks: Vec<_> = j
        .rings
        .iter()
        .map(|r| {
            json!({
                "rank": r.rank,
                "instance": state.config.instance,
                "data_segment": dataplane::names::data_segment(&state.config.instance),
                "ring": r.ring,
                "ring_segment": r.segment,
                "reader_index": r.reader_index,
                "capacity": r.capacity,
            })
        })
        .collect();
    json!({ "job": job_json(j), "layout_version": dataplane::LAYOUT_VERSION, "ranks": ranks })
}

#[post("/v1/jobs")]
async fn create_job(
    state: web::Data<AppState>,
    body: web::Json<JobRequest>,
) -> ApiResult<HttpResponse> {
    let req = body.into_inner();
    check_name("job", &req.name)?;
    if let Some(v) = req.client.as_ref().and_then(|c| c.layout_version)
        && v != dataplane::LAYOUT_VERSION
    {
        return Err(ApiError::new(
            Code::VersionMismatch,
            format!(
                "the client speaks layout version {v}, this server {}",
                dataplane::LAYOUT_VERSION
            ),
        ));
    }
    if req.batch_size == 0 {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "batch_size must be at least 1",
        ));
    }
    if req.epochs == Some(0) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "epochs must be at least 1 (or null for unlimited)",
        ));
    }
    let world = req.world_size.unwrap_or(1);
    if world == 0 || world > 64 {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "world_size must be between 1 and 64",
        ));
    }
    if let Some(r) = req.rank
        && r >= world
    {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!("rank {r} is not below world_size {world}"),
        ));
    }
    let pipeline = req
        .pipeline
        .clone()
        .unwrap_or_else(|| state.config.default_pipeline.clone());
    pipeline
        .validate()
        .map_err(|e| ApiError::new(Code::InvalidRequest, format!("pipeline: {e}")))?;

    // Existing job: the same parameters mean another rank of it; a finished or failed job
    // of that name is replaced.
    let replaced = {
        let inner = state.inner.lock().map_err(internal)?;
        match inner.jobs.get(&req.name) {
            Some(j)
                if j.request.identity() == req.identity()
                    && !matches!(j.stats.state(), JobState::Failed(_) | JobState::Finished) =>
            {
                return Ok(HttpResponse::Ok().json(registration_json(&state, j)));
            }
            Some(j) if matches!(j.stats.state(), JobState::Failed(_) | JobState::Finished) => true,
            Some(_) => {
                return Err(ApiError::new(
                    Code::JobExists,
                    format!(
                        "a job named '{}' is running with other parameters",
                        req.name
                    ),
                ));
            }
            None => false,
        }
    };
    if replaced {
        stop_job(&state, &req.name).await?;
    }

    // Resolve the dataset and the subset.
    let (dataset_id, index, source, sampler, pipeline_id) = {
        let mut inner = state.inner.lock().map_err(internal)?;
        let pipeline_id = inner.pipeline_id(&pipeline)?;
        let d = inner
            .datasets
            .get_mut(&req.dataset)
            .ok_or_else(|| dataset_not_found(&req.dataset))?;
        let Some(index) = d.index.clone() else {
            return Err(ApiError::new(
                Code::DatasetNotReady,
                format!("dataset '{}' is {}", req.dataset, d.record.state),
            ));
        };
        let source = d
            .source
            .get_or_insert_with(|| Arc::new(IndexSource(index.clone())))
            .clone();
        let sampler = d
            .sampler
            .get_or_insert_with(|| {
                SamplerActor::new(
                    d.id,
                    state.cache.clone().recipient(),
                    std::time::Duration::from_millis(state.config.sampler_tick_ms),
                    state.stats.clone(),
                )
                .start()
            })
            .clone();
        (d.id, index, source, sampler, pipeline_id)
    };
    let subset = match &req.subset {
        None => (0..index.items.len() as u32).collect(),
        Some(s) => s.resolve(
            index.items.len() as u32,
            |e| index.label(e).unwrap_or(-1),
            &index.classes,
        )?,
    };
    if subset.is_empty() {
        return Err(ApiError::new(
            Code::EmptySubset,
            "the subset selects no element of the dataset",
        ));
    }
    let subset = Arc::new(subset);
    let capacity =
        req.ring_capacity
            .filter(|&c| c > 0)
            .unwrap_or(if state.config.ring_capacity > 0 {
                state.config.ring_capacity
            } else {
                (2 * req.batch_size).max(64)
            });
    let stats = Arc::new(JobStats::default());
    let job_id = {
        let mut inner = state.inner.lock().map_err(internal)?;
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
            ranks: world,
            capacity,
            stats: stats.clone(),
            sampler: sampler.clone().recipient(),
        })
        .await
        .map_err(internal)?
        .map_err(|m| ApiError::new(Code::CacheFull, m))?;
    let credit = rings.iter().map(|r| r.capacity).sum();
    let added = sampler
        .send(AddJob {
            job: job_id,
            subset: subset.clone(),
            seed: req.seed,
            epochs: req.epochs,
            sampler: req.sampler.unwrap_or(SamplerKind::Dsa),
            credit,
            stats: stats.clone(),
        })
        .await
        .map_err(internal)?;
    if let Err(e) = added {
        state.cache.do_send(CloseJob { job: job_id });
        return Err(internal(e));
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
        sampler,
        created: Instant::now(),
        rate: Default::default(),
    };
    let body = registration_json(&state, &entry);
    state
        .inner
        .lock()
        .map_err(internal)?
        .jobs
        .insert(req.name.clone(), entry);
    tracing::info!(job = %req.name, dataset = %req.dataset, world, capacity, "job registered");
    Ok(HttpResponse::Created().json(body))
}

#[get("/v1/jobs")]
async fn list_jobs(state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    let inner = state.inner.lock().map_err(internal)?;
    let list: Vec<_> = inner.jobs.values().map(job_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "jobs": list })))
}

#[get("/v1/jobs/{name}")]
async fn get_job(state: web::Data<AppState>, name: web::Path<String>) -> ApiResult<HttpResponse> {
    let inner = state.inner.lock().map_err(internal)?;
    let j = inner
        .jobs
        .get(name.as_str())
        .ok_or_else(|| job_not_found(&name))?;
    Ok(HttpResponse::Ok().json(job_json(j)))
}

#[delete("/v1/jobs/{name}")]
async fn delete_job(
    state: web::Data<AppState>,
    name: web::Path<String>,
) -> ApiResult<HttpResponse> {
    stop_job(&state, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}

fn job_not_found(name: &str) -> ApiError {
    ApiError::new(Code::JobNotFound, format!("no job named '{name}'"))
}

/// Stops a job: no more sampling, its rings closed and its slots released.
async fn stop_job(state: &AppState, name: &str) -> ApiResult<()> {
    let entry = state
        .inner
        .lock()
        .map_err(internal)?
        .jobs
        .remove(name)
        .ok_or_else(|| job_not_found(name))?;
    entry
        .sampler
        .send(RemoveJob { job: entry.id })
        .await
        .map_err(internal)?;
    state
        .cache
        .send(CloseJob { job: entry.id })
        .await
        .map_err(internal)?;
    entry.stats.set_state(JobState::Failed("deleted".into()));
    // Closed: its counters are final; a later job of the same name continues from them.
    let now = crate::metrics::job_counts(&entry.stats);
    let stall = entry
        .stats
        .stall_us
        .load(std::sync::atomic::Ordering::Relaxed) as f64
        / 1e6;
    let mut inner = state.inner.lock().map_err(internal)?;
    let r = inner.retired.entry(name.to_string()).or_default();
    for (acc, v) in r.counts.iter_mut().zip(now) {
        *acc += v;
    }
    r.stall_s += stall;
    Ok(())
}

// ---------------------------------------------------------------- service

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

#[get("/v1/stats")]
async fn cache_stats(state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(crate::state::stats_json(&state)))
}

#[get("/metrics")]
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(state.metrics.render(&state))
}

/// The dashboard's files (`web-ui/`), embedded in the binary.
const DASHBOARD: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../web-ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web-ui/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../web-ui/style.css"),
    ),
];

fn dashboard_file(name: &str) -> HttpResponse {
    match DASHBOARD.iter().find(|(n, _, _)| *n == name) {
        Some((_, mime, body)) => HttpResponse::Ok()
            .content_type(*mime)
            .insert_header(("cache-control", "no-cache"))
            .body(*body),
        None => {
            ApiError::new(Code::NotFound, format!("no dashboard file '{name}'")).error_response()
        }
    }
}

#[get("/")]
async fn dashboard() -> HttpResponse {
    dashboard_file("index.html")
}

#[get("/ui/{file}")]
async fn dashboard_asset(file: web::Path<String>) -> HttpResponse {
    dashboard_file(&file)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Only samples taken after this many seconds of uptime.
    #[serde(default)]
    since: Option<f64>,
}

#[get("/v1/stats/history")]
async fn stats_history(
    state: web::Data<AppState>,
    q: web::Query<HistoryQuery>,
) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(json!({
        "interval_s": crate::metrics::HISTORY_INTERVAL.as_secs_f64(),
        "samples": state.metrics.history(q.since.unwrap_or(f64::NEG_INFINITY)),
    })))
}

#[get("/v1/openapi.json")]
async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}

/// The OpenAPI document (kept in step with the routes by a test).
pub const OPENAPI: &str = include_str!("openapi.json");

/// Every route: (method, path) as written in the OpenAPI document.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/"),
    ("get", "/ui/{file}"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/stats"),
    ("get", "/v1/stats/history"),
    ("post", "/v1/datasets"),
    ("get", "/v1/datasets"),
    ("get", "/v1/datasets/{name}"),
    ("delete", "/v1/datasets/{name}"),
    ("get", "/v1/datasets/{name}/failures"),
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{name}"),
    ("delete", "/v1/jobs/{name}"),
];

/// Registers the routes and the JSON error handling.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::JsonConfig::default().limit(64 << 20).error_handler(
        |err, _req: &HttpRequest| {
            ApiError::new(Code::InvalidRequest, format!("invalid JSON body: {err}")).into()
        },
    ))
    .app_data(
        web::QueryConfig::default().error_handler(|err, _req: &HttpRequest| {
            ApiError::new(Code::InvalidRequest, format!("invalid query: {err}")).into()
        }),
    )
    .app_data(
        web::PathConfig::default().error_handler(|err, _req: &HttpRequest| {
            ApiError::new(Code::InvalidRequest, format!("invalid path: {err}")).into()
        }),
    )
    .service(dashboard)
    .service(dashboard_asset)
    .service(healthz)
    .service(metrics)
    .service(openapi)
    .service(cache_stats)
    .service(stats_history)
    .service(create_dataset)
    .service(list_datasets)
    .service(get_dataset)
    .service(delete_dataset)
    .service(dataset_failures)
    .service(create_job)
    .service(list_jobs)
    .service(get_job)
    .service(delete_job);
}

/// Anything else: the same error model.
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        Code::NotFound,
        format!("no route for {} {}", req.method(), req.path()),
    )
    .error_response()
}

/// For the dashboard and tests: a snapshot of every job.
pub fn jobs_snapshot(state: &AppState) -> BTreeMap<String, serde_json::Value> {
    state
        .inner
        .lock()
        .map(|i| {
            i.jobs
                .iter()
                .map(|(k, v)| (k.clone(), job_json(v)))
                .collect()
        })
        .unwrap_or_default()
}
