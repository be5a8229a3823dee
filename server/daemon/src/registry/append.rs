//! Appending to a dataset (`POST /v1/datasets/{name}/append`): more shards, Parquet files,
//! manifest files or class folders join an indexed local dataset while its jobs run.
//!
//! - The appended part is indexed as the dataset's own source with these paths
//!   (`SourceSpec::appended_parts`) and the index grows by it (`DatasetIndex::appended`): the
//!   existing ids, labels and cached elements stay, and the new items take the next ids. The
//!   grown index and the append are persisted before anything serves them.
//! - The dataset's reader reads through the grown index from then on (`IndexSource::replace`).
//! - Each running job that follows its dataset (`JobEntry::grows`) is told through its
//!   Sampler (`GrowJob`): from the next epoch the Sampler starts for it, its epochs are
//!   permutations of the grown dataset; the epoch under way keeps its elements. Other jobs
//!   (a `subset`, a `replay`, several ranks) keep the dataset they registered with.
//! - A state saved before the append still resumes: its fingerprint is that of the dataset's
//!   first items, which the append does not change (`DatasetIndex::fingerprint_matches`), and
//!   the rest of its epoch is taken over the grown dataset.

use std::path::PathBuf;
use std::sync::Arc;

use actors::{GrowJob, SamplerActor};
use joader_storage::{DatasetIndex, StorageError};
use roaring::RoaringBitmap;

use super::{Registry, check_not_draining};
use crate::catalog::{Appended, DatasetRecord};
use crate::error::{Code, Error, Result};

/// What an append did: the items it added, and the jobs that follow them.
#[derive(Debug)]
pub struct AppendOutcome {
    pub added: u64,
    /// `(job, the first epoch that covers the new items)`.
    pub jobs: Vec<(String, u32)>,
}

/// What the append starts from, taken under the registry's lock.
struct Start {
    id: u16,
    record: DatasetRecord,
    index: Arc<DatasetIndex>,
}

/// Appends `paths` to the dataset `name` (see the module docs). Indexes them on the blocking
/// pool and answers once every job that follows the dataset knows.
pub async fn append_dataset(
    registry: &Arc<Registry>,
    name: &str,
    paths: Vec<PathBuf>,
) -> Result<AppendOutcome> {
    check_not_draining(registry)?;
    let start = begin(registry, name)?;
    let grown = grow(registry, name, &start, paths).await;
    let finished = finish(registry, name, &start, grown);
    let (added, jobs, sampler) = finished?;
    let mut followed = Vec::new();
    if let Some(sampler) = sampler {
        let new: RoaringBitmap =
            ((start.index.len() as u32)..(start.index.len() as u32 + added as u32)).collect();
        let new = Arc::new(new);
        for (id, job) in jobs {
            followed.extend(tell(&sampler, id, new.clone(), job).await);
        }
    }
    tracing::info!(dataset = %name, added, jobs = followed.len(), "dataset appended to");
    Ok(AppendOutcome {
        added,
        jobs: followed,
    })
}

/// Tells a job's Sampler that its dataset grew; a job that ended meanwhile is left out.
async fn tell(
    sampler: &actix::Addr<SamplerActor>,
    id: u64,
    added: Arc<RoaringBitmap>,
    job: String,
) -> Option<(String, u32)> {
    match sampler.send(GrowJob { job: id, added }).await {
        Ok(Ok(from)) => Some((job, from)),
        Ok(Err(e)) => {
            tracing::debug!(job = %job, error = %e, "a job did not grow (it ended)");
            None
        }
        Err(e) => {
            tracing::warn!(job = %job, error = %e, "the dataset's sampler is gone");
            None
        }
    }
}

/// Checks that the dataset can take an append now and marks it appending.
fn begin(registry: &Registry, name: &str) -> Result<Start> {
    let mut inner = registry.inner.lock().map_err(Error::internal)?;
    let d = inner
        .datasets
        .get_mut(name)
        .ok_or_else(|| Error::dataset_not_found(name))?;
    let index = match (&d.index, d.record.state.as_str()) {
        (Some(index), "ready") => index.clone(),
        (_, state) => {
            return Err(Error::new(
                Code::DatasetNotReady,
                format!("dataset '{name}' is {state}: append to it once it is ready"),
            ));
        }
    };
    if d.appending {
        return Err(Error::new(
            Code::CannotAppend,
            format!("dataset '{name}' is being appended to already: retry when that ends"),
        ));
    }
    d.appending = true;
    Ok(Start {
        id: d.id,
        record: d.record.clone(),
        index,
    })
}

/// Indexes the appended paths as the dataset's source, grows its index and persists both.
/// Returns the grown index and its record.
async fn grow(
    registry: &Arc<Registry>,
    name: &str,
    start: &Start,
    paths: Vec<PathBuf>,
) -> Result<(Arc<DatasetIndex>, DatasetRecord)> {
    let parts = start
        .record
        .source
        .appended_parts(&paths)
        .map_err(|e| storage_error(name, e))?;
    for part in &parts {
        super::datasets::check_source(registry, part)?;
    }
    let (registry, name) = (registry.clone(), name.to_string());
    let (index, mut record) = (start.index.clone(), start.record.clone());
    actix_web::rt::task::spawn_blocking(move || {
        let roots = &registry.config.allowed_roots;
        let mut grown: Option<DatasetIndex> = None;
        for part in &parts {
            let part = joader_storage::index(part, roots, &mut |_| {})
                .map_err(|e| storage_error(&name, e))?;
            let base = grown.as_ref().unwrap_or(&index);
            grown = Some(base.appended(&part).map_err(|e| storage_error(&name, e))?);
        }
        let grown = grown.ok_or_else(|| Error::internal("an append of no part"))?;
        record.appended.push(Appended {
            paths,
            items: (grown.len() - index.len()) as u64,
            appended_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        registry
            .catalog
            .put(&record, Some(&grown))
            .map_err(Error::internal)?;
        Ok((Arc::new(grown), record))
    })
    .await
    .map_err(Error::internal)?
}

/// The jobs to tell, and their Sampler.
type Followers = (u64, Vec<(u64, String)>, Option<actix::Addr<SamplerActor>>);

/// Serves the grown index (when the append succeeded) and ends the append; returns the items
/// added, the jobs that follow the dataset and its Sampler.
fn finish(
    registry: &Registry,
    name: &str,
    start: &Start,
    grown: Result<(Arc<DatasetIndex>, DatasetRecord)>,
) -> Result<Followers> {
    let mut inner = registry.inner.lock().map_err(Error::internal)?;
    let Some(d) = inner.datasets.get_mut(name).filter(|d| d.id == start.id) else {
        // Deleted (and maybe created again) meanwhile: what was persisted went with it.
        return Err(Error::dataset_not_found(name));
    };
    d.appending = false;
    let (index, record) = grown?;
    let added = (index.len() - start.index.len()) as u64;
    d.progress
        .store(index.len() as u64, std::sync::atomic::Ordering::Relaxed);
    if let Some(local) = &d.local {
        local.replace(index.clone());
    }
    d.index = Some(index.clone());
    d.record = record;
    let sampler = d.sampler.clone();
    let jobs = inner
        .jobs
        .values()
        .filter(|j| j.dataset == name && j.grows && !j.has_ended())
        .map(|j| {
            j.subset_len
                .store(index.len() as u64, std::sync::atomic::Ordering::Relaxed);
            (j.id, j.name.clone())
        })
        .collect();
    Ok((added, jobs, sampler))
}

/// A storage error of an append as the server's error.
fn storage_error(name: &str, e: StorageError) -> Error {
    match e {
        StorageError::CannotAppend { .. } => {
            Error::new(Code::CannotAppend, format!("dataset '{name}': {e}"))
        }
        e => Error::new(
            Code::InvalidRequest,
            format!("the appended paths do not index: {}: {e}", e.code()),
        ),
    }
}

/// A dataset indexed again from its source (a server that stopped while indexing it): `base`,
/// its source's index, grown by each of its appends in order.
pub fn replay_appends(
    record: &DatasetRecord,
    roots: &[PathBuf],
    base: DatasetIndex,
) -> std::result::Result<DatasetIndex, StorageError> {
    let mut index = base;
    for a in &record.appended {
        for part in record.source.appended_parts(&a.paths)? {
            let part = joader_storage::index(&part, roots, &mut |_| {})?;
            index = index.appended(&part)?;
        }
    }
    Ok(index)
}
