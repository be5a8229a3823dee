//! Working sets (seed 003): `POST /v1/datasets/{name}/preload` loads a subset of a dataset,
//! prepared by the pipeline its jobs will use, into the cache before they start, and pins it
//! there until `DELETE /v1/datasets/{name}/preload` (the Cache's `preload.rs` has the rules:
//! below the jobs' loads, half the cache at most). A job on the same pipeline then finds every
//! element of the working set cached: it decodes nothing of it. The catalog keeps the request
//! until released, and a restarted server preloads it again ([`restore`]).

use std::sync::Arc;
use std::time::Instant;

use actors::{PreloadError, PreloadProgress, Unpreload};
use joader_pipeline::{Limits, Pipeline};
use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};

use super::Registry;
use super::jobs::min_element_bytes;
use super::subset::SubsetSpec;
use crate::error::{Code, Error, Result};
use crate::loading::PipelinePrepare;

/// `POST /v1/datasets/{name}/preload`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"subset": {"start": 0, "end": 1000}, "pipeline": {"kind": "decode", "resize_shorter": 256}}))]
pub struct PreloadRequest {
    /// The elements to preload, in the jobs' subset forms; `null`: the whole dataset.
    #[serde(default)]
    pub subset: Option<SubsetSpec>,
    /// The pipeline the jobs will use (`null`: the server's default pipeline, as for a
    /// job): a job shares the preloaded elements only with the same pipeline.
    #[serde(default)]
    pub pipeline: Option<Pipeline>,
    /// Where to keep the working set: `memory` (decoded by the pipeline into the cache) or
    /// `disk` (an object-store dataset's stored bytes in the disk tier, with no pipeline).
    #[serde(default)]
    pub keep: Keep,
}

/// Where a working set is kept.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Decoded by the pipeline into the shared-memory cache, pinned there.
    #[default]
    Memory,
    /// An object-store dataset's stored bytes, fetched into the server's disk tier and pinned
    /// there (kept across restarts); no pipeline.
    Disk,
}

/// A dataset's preload, as the registry holds it.
#[derive(Clone)]
pub struct PreloadEntry {
    pub request: PreloadRequest,
    pub progress: Arc<PreloadProgress>,
    pub started: Instant,
    /// A disk preload's cancel flag (its thread stops when set); `None` for a memory preload.
    pub disk: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// Starts a dataset's preload; it loads in the background (its progress is the dataset's
/// `preload`).
pub async fn preload_dataset(registry: &Registry, name: &str, req: PreloadRequest) -> Result<()> {
    let progress = Arc::new(PreloadProgress::default());
    start_preload(registry, name, req, progress).await
}

/// [`preload_dataset`] reporting to `progress`: a new one, or the one of the entry that
/// [`restore`] put in place while the preload starts (it replaces that entry).
async fn start_preload(
    registry: &Registry,
    name: &str,
    req: PreloadRequest,
    progress: Arc<PreloadProgress>,
) -> Result<()> {
    super::check_not_draining(registry)?;
    let keep = req.keep;
    let has_image = registry
        .dataset(name)
        .map_or(true, |d| d.record.source.has_image());
    let pipeline = pipeline_of(registry, &req, has_image)?;
    let (dataset, index, source, pipeline_id, others) = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        let pipeline_id = pipeline
            .as_ref()
            .map(|p| inner.pipeline_id(p))
            .transpose()?;
        let others = disk_pins_of_others(&inner, name);
        let (d, index, source) = inner.open_source(name)?;
        if let Some(p) = &d.preload
            && !matches!(p.progress.state(), actors::PreloadState::Failed(_))
            && !Arc::ptr_eq(&p.progress, &progress)
        {
            return Err(exists(name));
        }
        (d.id, index, source, pipeline_id, others)
    };
    let elements = resolve_subset(req.subset.clone(), index).await?;
    let disk = match (pipeline.as_ref(), pipeline_id) {
        (Some(p), Some(id)) => {
            let into = CacheTarget {
                dataset,
                source: source.clone(),
                pipeline: (p, id),
            };
            in_memory(registry, name, into, elements, progress.clone()).await?;
            None
        }
        _ => {
            let cancel = super::disk_preload::start(
                name,
                source.clone(),
                elements,
                progress.clone(),
                others,
            )?;
            Some(cancel)
        }
    };
    let request = PreloadRequest { pipeline, ..req };
    let saved = serde_json::to_value(&request).map_err(Error::internal)?;
    let entry = PreloadEntry {
        request,
        progress,
        started: Instant::now(),
        disk,
    };
    let record = hold(registry, name, dataset, entry, saved)?;
    let record = match record {
        Ok(record) => record,
        Err(entry) => {
            let_go(registry, dataset, Some(&source), &entry).await?;
            return Err(Error::dataset_not_found(name));
        }
    };
    persist(registry, record).await?;
    tracing::info!(dataset = %name, ?keep, "preload started");
    Ok(())
}

/// The pipeline of a memory preload (the server's default when it names none); none for a
/// disk preload, which refuses one.
fn pipeline_of(
    registry: &Registry,
    req: &PreloadRequest,
    has_image: bool,
) -> Result<Option<Pipeline>> {
    match req.keep {
        Keep::Memory => Ok(Some(super::jobs::pipeline_or_default(
            &registry.config,
            req.pipeline.as_ref(),
            has_image,
        )?)),
        Keep::Disk if req.pipeline.is_some() => Err(Error::new(
            Code::InvalidRequest,
            "a preload kept on disk keeps the stored bytes, not a pipeline's output: give it \
             no pipeline",
        )),
        Keep::Disk => Ok(None),
    }
}

/// What the disk preloads of the datasets other than `name` pin (the tier's pin budget is
/// shared).
fn disk_pins_of_others(inner: &super::Inner, name: &str) -> u64 {
    inner
        .datasets
        .values()
        .filter(|d| d.record.name != name)
        .filter_map(|d| d.preload.as_ref())
        .filter(|p| p.disk.is_some())
        .map(|p| {
            p.progress
                .pinned_bytes
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum()
}

/// Holds a started preload in its dataset's entry and record; gives the entry back when the
/// dataset was deleted or re-indexed meanwhile (the preload is of a dataset gone).
fn hold(
    registry: &Registry,
    name: &str,
    dataset: actors::DatasetId,
    entry: PreloadEntry,
    saved: serde_json::Value,
) -> Result<std::result::Result<crate::catalog::DatasetRecord, PreloadEntry>> {
    let mut inner = registry.inner.lock().map_err(Error::internal)?;
    Ok(match inner.datasets.get_mut(name) {
        Some(d) if d.id == dataset => {
            d.preload = Some(entry);
            d.record.preload = Some(saved);
            Ok(d.record.clone())
        }
        _ => Err(entry),
    })
}

/// Where a memory preload goes: the dataset, its source and the pipeline (with its id).
struct CacheTarget<'a> {
    dataset: actors::DatasetId,
    source: Arc<dyn actors::ElementSource>,
    pipeline: (&'a Pipeline, actors::PipelineId),
}

/// Starts a memory preload in the Cache.
async fn in_memory(
    registry: &Registry,
    name: &str,
    into: CacheTarget<'_>,
    elements: RoaringBitmap,
    progress: Arc<PreloadProgress>,
) -> Result<()> {
    let (pipeline, pipeline_id) = into.pipeline;
    let prepare = Arc::new(PipelinePrepare {
        pipeline: pipeline.clone(),
        limits: Limits {
            max_pixels: registry.config.max_pixels,
        },
    });
    registry
        .cache
        .send(actors::Preload {
            dataset: into.dataset,
            source: into.source,
            pipeline: pipeline_id,
            prepare,
            elements: Arc::new(elements),
            min_element_bytes: min_element_bytes(pipeline),
            progress,
        })
        .await
        .map_err(Error::internal)?
        .map_err(|e| match e {
            PreloadError::ShutDown => Error::new(Code::ShuttingDown, e.to_string()),
            PreloadError::Exists => exists(name),
            PreloadError::TooLarge { .. } => Error::new(Code::PinBudget, e.to_string()),
        })?;
    Ok(())
}

/// Lets a preload go: the Cache's pins, or a disk preload's thread and demand.
pub(super) async fn let_go(
    registry: &Registry,
    dataset: actors::DatasetId,
    source: Option<&Arc<dyn actors::ElementSource>>,
    entry: &PreloadEntry,
) -> Result<()> {
    match &entry.disk {
        Some(cancel) => super::disk_preload::release(source, cancel),
        None => {
            registry
                .cache
                .send(Unpreload { dataset })
                .await
                .map_err(Error::internal)?;
        }
    }
    Ok(())
}

/// Writes a dataset's record (its preload request with it) to the catalog, on the blocking
/// pool.
async fn persist(registry: &Registry, record: crate::catalog::DatasetRecord) -> Result<()> {
    let catalog = registry.catalog.clone();
    actix_web::rt::task::spawn_blocking(move || catalog.put(&record, None))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)
}

/// At start-up: preloads again the datasets whose preload the catalog keeps (a memory
/// preload does not outlive the server's cache). One that fails now (a smaller cache, a
/// dataset that changed) is shown failed, with why, until released.
pub fn restore(registry: &Arc<Registry>) {
    let wanted: Vec<(String, PreloadRequest)> = match registry.inner.lock() {
        Ok(inner) => inner
            .datasets
            .values()
            .filter(|d| d.index.is_some())
            .filter_map(|d| {
                let saved = d.record.preload.clone()?;
                match serde_json::from_value(saved) {
                    Ok(req) => Some((d.record.name.clone(), req)),
                    Err(e) => {
                        tracing::warn!(dataset = %d.record.name, error = %e, "a stored preload request cannot be read: not preloaded");
                        None
                    }
                }
            })
            .collect(),
        Err(_) => return,
    };
    for (name, req) in wanted {
        // In place at once (`loading`): the dataset shows its preload from the start.
        let progress = Arc::new(PreloadProgress::default());
        if let Ok(mut inner) = registry.inner.lock()
            && let Some(d) = inner.datasets.get_mut(&name)
        {
            d.preload = Some(PreloadEntry {
                request: req.clone(),
                progress: progress.clone(),
                started: Instant::now(),
                disk: None,
            });
        }
        let registry = registry.clone();
        actix_web::rt::spawn(async move {
            tracing::info!(dataset = %name, "preloading again the working set the catalog keeps");
            if let Err(e) = start_preload(&registry, &name, req, progress.clone()).await {
                tracing::warn!(dataset = %name, error = %e, "the kept preload failed");
                progress.set_state(actors::PreloadState::Failed(format!(
                    "preloading again after the restart failed: {e}"
                )));
            }
        });
    }
}

/// Releases a dataset's preload: its elements stay cached, evictable like any other.
pub async fn release_preload(registry: &Registry, name: &str) -> Result<()> {
    let (dataset, record, entry, source) = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        let d = inner
            .datasets
            .get_mut(name)
            .ok_or_else(|| Error::dataset_not_found(name))?;
        let Some(entry) = d.preload.take() else {
            return Err(Error::new(
                Code::PreloadNotFound,
                format!("dataset '{name}' has no preload"),
            ));
        };
        d.record.preload = None;
        (d.id, d.record.clone(), entry, d.source.clone())
    };
    persist(registry, record).await?;
    let_go(registry, dataset, source.as_ref(), &entry).await
}

/// The working set's ids (a whole-index pass: on the blocking pool).
async fn resolve_subset(
    spec: Option<SubsetSpec>,
    index: Arc<joader_storage::DatasetIndex>,
) -> Result<RoaringBitmap> {
    let elements =
        actix_web::rt::task::spawn_blocking(move || super::subset::ids_of(spec.as_ref(), &index))
            .await
            .map_err(Error::internal)??;
    if elements.is_empty() {
        return Err(Error::new(
            Code::EmptySubset,
            "the preload's subset selects no element of the dataset",
        ));
    }
    Ok(elements)
}

fn exists(name: &str) -> Error {
    Error::new(
        Code::PreloadExists,
        format!(
            "dataset '{name}' has a preload: release it first (DELETE \
             /v1/datasets/{name}/preload)"
        ),
    )
}
