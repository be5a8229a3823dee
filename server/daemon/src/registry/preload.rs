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
    /// Where to keep the working set: `memory`, decoded in the cache (the only place today).
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
}

/// A dataset's preload, as the registry holds it.
#[derive(Clone)]
pub struct PreloadEntry {
    pub request: PreloadRequest,
    pub progress: Arc<PreloadProgress>,
    pub started: Instant,
}

/// Starts a dataset's preload; it loads in the background (its progress is the dataset's
/// `preload`).
pub async fn preload_dataset(registry: &Registry, name: &str, req: PreloadRequest) -> Result<()> {
    super::check_not_draining(registry)?;
    let pipeline = super::jobs::pipeline_or_default(&registry.config, req.pipeline.as_ref())?;
    let (dataset, index, source, pipeline_id) = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        let pipeline_id = inner.pipeline_id(&pipeline)?;
        let (d, index, source) = inner.open_source(name)?;
        if let Some(p) = &d.preload
            && !matches!(p.progress.state(), actors::PreloadState::Failed(_))
        {
            return Err(exists(name));
        }
        (d.id, index, source, pipeline_id)
    };
    let elements = resolve_subset(req.subset.clone(), index).await?;
    let progress = Arc::new(PreloadProgress::default());
    let prepare = Arc::new(PipelinePrepare {
        pipeline: pipeline.clone(),
        limits: Limits {
            max_pixels: registry.config.max_pixels,
        },
    });
    registry
        .cache
        .send(actors::Preload {
            dataset,
            source,
            pipeline: pipeline_id,
            prepare,
            elements: Arc::new(elements),
            min_element_bytes: min_element_bytes(&pipeline),
            progress: progress.clone(),
        })
        .await
        .map_err(Error::internal)?
        .map_err(|e| match e {
            PreloadError::ShutDown => Error::new(Code::ShuttingDown, e.to_string()),
            PreloadError::Exists => exists(name),
            PreloadError::TooLarge { .. } => Error::new(Code::PinBudget, e.to_string()),
        })?;
    let request = PreloadRequest {
        pipeline: Some(pipeline),
        ..req
    };
    let saved = serde_json::to_value(&request).map_err(Error::internal)?;
    let entry = PreloadEntry {
        request,
        progress,
        started: Instant::now(),
    };
    let record = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        match inner.datasets.get_mut(name) {
            // Deleted or re-indexed meanwhile: the Cache's preload is of a dataset gone.
            Some(d) if d.id == dataset => {
                d.preload = Some(entry);
                d.record.preload = Some(saved);
                Some(d.record.clone())
            }
            _ => None,
        }
    };
    let Some(record) = record else {
        registry.cache.do_send(Unpreload { dataset });
        return Err(Error::dataset_not_found(name));
    };
    persist(registry, record).await?;
    tracing::info!(dataset = %name, "preload started");
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
        let registry = registry.clone();
        actix_web::rt::spawn(async move {
            tracing::info!(dataset = %name, "preloading again the working set the catalog keeps");
            if let Err(e) = preload_dataset(&registry, &name, req.clone()).await {
                tracing::warn!(dataset = %name, error = %e, "the kept preload failed");
                let progress = Arc::new(PreloadProgress::default());
                progress.set_state(actors::PreloadState::Failed(format!(
                    "preloading again after the restart failed: {e}"
                )));
                if let Ok(mut inner) = registry.inner.lock()
                    && let Some(d) = inner.datasets.get_mut(&name)
                {
                    d.preload = Some(PreloadEntry {
                        request: req,
                        progress,
                        started: Instant::now(),
                    });
                }
            }
        });
    }
}

/// Releases a dataset's preload: its elements stay cached, evictable like any other.
pub async fn release_preload(registry: &Registry, name: &str) -> Result<()> {
    let (dataset, record) = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        let d = inner
            .datasets
            .get_mut(name)
            .ok_or_else(|| Error::dataset_not_found(name))?;
        if d.preload.take().is_none() {
            return Err(Error::new(
                Code::PreloadNotFound,
                format!("dataset '{name}' has no preload"),
            ));
        }
        d.record.preload = None;
        (d.id, d.record.clone())
    };
    persist(registry, record).await?;
    registry
        .cache
        .send(Unpreload { dataset })
        .await
        .map_err(Error::internal)?;
    Ok(())
}

/// The working set's ids (a whole-index pass: on the blocking pool).
async fn resolve_subset(
    spec: Option<SubsetSpec>,
    index: Arc<joader_storage::DatasetIndex>,
) -> Result<RoaringBitmap> {
    let elements = actix_web::rt::task::spawn_blocking(move || {
        let len = index.len() as u32;
        match &spec {
            None => {
                let mut all = RoaringBitmap::new();
                all.insert_range(0..len);
                Ok(all)
            }
            Some(s) => s.resolve(len, |e| index.label(e).unwrap_or(-1), index.classes()),
        }
    })
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
