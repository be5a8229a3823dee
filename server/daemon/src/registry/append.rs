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
    /// The dataset's source.
    source: joader_storage::SourceSpec,
    index: Arc<DatasetIndex>,
}

/// Appends `paths` to the dataset `name` (see the module docs). Indexes them on the blocking
/// pool and answers once every job that follows the dataset knows. It runs as a task of its
/// own: a client that gives up waiting does not stop it halfway (the dataset would stay
/// marked appending, its jobs not told).
pub async fn append_dataset(
    registry: &Arc<Registry>,
    name: &str,
    paths: Vec<PathBuf>,
) -> Result<AppendOutcome> {
    check_not_draining(registry)?;
    let start = begin(registry, name)?;
    let (registry, name) = (registry.clone(), name.to_owned());
    actix_web::rt::spawn(async move {
        let grown = grow(&registry, &name, &start, paths).await;
        let (added, jobs, sampler) = finish(&registry, &name, &start, grown)?;
        let mut followed = Vec::new();
        if let Some(sampler) = sampler {
            let first = start.index.len() as u32;
            let new = Arc::new((first..first + added as u32).collect::<RoaringBitmap>());
            let items = start.index.len() as u64 + added;
            for job in jobs {
                followed.extend(tell(&sampler, new.clone(), job, items).await);
            }
        }
        tracing::info!(dataset = %name, added, jobs = followed.len(), "dataset appended to");
        Ok(AppendOutcome {
            added,
            jobs: followed,
        })
    })
    .await
    .map_err(Error::internal)?
}

/// Tells a job's Sampler that its dataset grew (to `items`); a job that ended meanwhile, or
/// whose last epoch is under way, is left out.
async fn tell(
    sampler: &actix::Addr<SamplerActor>,
    added: Arc<RoaringBitmap>,
    job: Arc<super::JobEntry>,
    items: u64,
) -> Option<(String, u32)> {
    match sampler.send(GrowJob { job: job.id, added }).await {
        Ok(Ok(from)) if job.request.epochs.is_none_or(|e| from < e) => {
            job.subset_len
                .store(items, std::sync::atomic::Ordering::Relaxed);
            Some((job.name.clone(), from))
        }
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            tracing::debug!(job = %job.name, error = %e, "a job did not grow (it ended)");
            None
        }
        Err(e) => {
            tracing::warn!(job = %job.name, error = %e, "the dataset's sampler is gone");
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
        source: d.record.source.clone(),
        index,
    })
}

/// Indexes the appended paths as the dataset's source, grows its index and persists both
/// (the append joins the dataset's record as it is then, under the registry's lock, so that
/// what else changed in the record meanwhile is kept). Returns the grown index.
async fn grow(
    registry: &Arc<Registry>,
    name: &str,
    start: &Start,
    paths: Vec<PathBuf>,
) -> Result<Arc<DatasetIndex>> {
    let parts = start
        .source
        .appended_parts(&paths)
        .map_err(|e| storage_error(name, e))?;
    for part in &parts {
        super::datasets::check_source(registry, part)?;
    }
    let (registry, name) = (registry.clone(), name.to_string());
    let (index, id) = (start.index.clone(), start.id);
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
        let appended = Appended {
            paths,
            items: (grown.len() - index.len()) as u64,
            appended_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let record = {
            let mut inner = registry.inner.lock().map_err(Error::internal)?;
            let d = inner
                .datasets
                .get_mut(&name)
                .filter(|d| d.id == id)
                .ok_or_else(|| Error::dataset_not_found(&name))?;
            d.record.appended.push(appended);
            d.record.clone()
        };
        if let Err(e) = registry.catalog.put(&record, Some(&grown)) {
            if let Ok(mut inner) = registry.inner.lock()
                && let Some(d) = inner.datasets.get_mut(&name).filter(|d| d.id == id)
            {
                d.record.appended.pop();
            }
            return Err(Error::internal(e));
        }
        Ok(Arc::new(grown))
    })
    .await
    .map_err(Error::internal)?
}

/// The items added, the jobs to tell, and their Sampler.
type Followers = (
    u64,
    Vec<Arc<super::JobEntry>>,
    Option<actix::Addr<SamplerActor>>,
);

/// Serves the grown index (when the append succeeded) and ends the append; returns the items
/// added, the jobs that follow the dataset and its Sampler.
fn finish(
    registry: &Registry,
    name: &str,
    start: &Start,
    grown: Result<Arc<DatasetIndex>>,
) -> Result<Followers> {
    let mut inner = registry.inner.lock().map_err(Error::internal)?;
    let Some(d) = inner.datasets.get_mut(name).filter(|d| d.id == start.id) else {
        // A dataset being appended to is not deleted (`delete_dataset` refuses).
        return Err(Error::dataset_not_found(name));
    };
    d.appending = false;
    let index = grown?;
    let added = (index.len() - start.index.len()) as u64;
    d.progress
        .store(index.len() as u64, std::sync::atomic::Ordering::Relaxed);
    if let Some(local) = &d.local {
        local.replace(index.clone());
    }
    d.index = Some(index);
    let sampler = d.sampler.clone();
    let jobs = inner
        .jobs
        .values()
        .filter(|j| j.dataset == name && j.grows && !j.has_ended())
        .cloned()
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
/// its source's index, grown by each of its appends in order. A part that the source's own
/// paths hold now (an appended shard inside the source's folder or pattern) is in `base`
/// already: it is left out, and logged.
pub fn replay_appends(
    record: &DatasetRecord,
    roots: &[PathBuf],
    base: DatasetIndex,
) -> std::result::Result<DatasetIndex, StorageError> {
    let mut index = base;
    for a in &record.appended {
        for part in record.source.appended_parts(&a.paths)? {
            let part = joader_storage::index(&part, roots, &mut |_| {})?;
            match index.appended(&part) {
                Ok(grown) => index = grown,
                Err(e @ StorageError::CannotAppend { .. }) => {
                    tracing::warn!(dataset = %record.name, error = %e, "an append is left out of the re-index");
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(index)
}
