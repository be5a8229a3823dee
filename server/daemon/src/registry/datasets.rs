//! Datasets: creation (indexed in the background), failures, deletion.

use std::sync::Arc;

use joader_storage::{SourceSpec, StorageError};

use super::{DatasetEntry, Registry, check_name, start_indexing};
use crate::catalog::DatasetRecord;
use crate::error::{Code, Error, Result};

/// Creates a dataset and starts indexing it. Blocks on a catalog commit: call it on the
/// blocking pool.
pub fn create_dataset(registry: &Arc<Registry>, name: String, source: SourceSpec) -> Result<()> {
    check_name("dataset", &name)?;
    super::check_not_draining(registry)?;
    let source = source
        .resolved()
        .map_err(|e| Error::new(Code::InvalidRequest, e.to_string()))?;
    check_source(registry, &source)?;
    let record = DatasetRecord {
        name: name.clone(),
        source,
        state: "indexing".into(),
        error: None,
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        changes: None,
        preload: None,
        appended: Vec::new(),
    };
    {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        if inner.datasets.contains_key(&record.name) {
            return Err(Error::new(
                Code::DatasetExists,
                format!("dataset '{}' already exists", record.name),
            ));
        }
        let id = inner.next_dataset_id()?;
        inner
            .datasets
            .insert(record.name.clone(), DatasetEntry::new(id, record.clone()));
    }
    // Persisted outside the registry's lock (a redb commit); the caller runs this function on
    // the blocking pool.
    if let Err(e) = registry.catalog.put(&record, None) {
        if let Ok(mut inner) = registry.inner.lock() {
            inner.datasets.remove(&record.name);
        }
        return Err(Error::internal(e));
    }
    start_indexing(registry.clone(), record.name);
    Ok(())
}

/// Checks a source's paths against the server's allowed roots and object stores, before any
/// indexing.
pub(super) fn check_source(registry: &Registry, source: &SourceSpec) -> Result<()> {
    crate::loading::check_source(
        source,
        &registry.config.allowed_roots,
        registry.objects.as_deref(),
    )
    .map_err(|e| match e {
        StorageError::S3Invalid { .. }
        | StorageError::BadFields { .. }
        | StorageError::NoMatch { .. }
        | StorageError::BadPattern { .. } => Error::new(Code::InvalidRequest, e.to_string()),
        StorageError::S3EndpointNotAllowed { .. } => {
            Error::new(Code::EndpointNotAllowed, e.to_string())
        }
        StorageError::S3NotAllowed { .. } => Error::new(Code::PathNotAllowed, e.to_string()),
        e => Error::new(
            Code::PathNotAllowed,
            format!("{e}; allowed roots: {:?}", registry.config.allowed_roots),
        ),
    })
}

/// Indexes an `s3` dataset again, in the background; once done, its record's `changes` says
/// which objects were added, removed or changed since the last index. Refused while jobs use
/// the dataset (their element ids would change under them; ended jobs do not count). The dataset takes a new id, so
/// that no element cached from the previous index is ever served for the new one. Blocks on
/// a catalog commit: call it on the blocking pool.
pub fn reindex_dataset(registry: &Arc<Registry>, name: &str) -> Result<()> {
    super::check_not_draining(registry)?;
    let record = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        let d = inner
            .datasets
            .get(name)
            .ok_or_else(|| Error::dataset_not_found(name))?;
        if !matches!(d.record.source, SourceSpec::S3 { .. }) {
            return Err(Error::new(
                Code::InvalidRequest,
                format!(
                    "dataset '{name}' is read from local files: re-indexing compares the sizes \
                     and ETags an object store lists, so only s3 datasets are re-indexed \
                     (delete a local dataset and create it again)"
                ),
            ));
        }
        if d.record.state == "indexing" {
            return Err(Error::new(
                Code::DatasetNotReady,
                format!("dataset '{name}' is being indexed already"),
            ));
        }
        let users: Vec<&str> = inner
            .jobs
            .values()
            .filter(|j| j.dataset == name && !j.has_ended())
            .map(|j| j.name.as_str())
            .chain(
                inner
                    .registering
                    .iter()
                    .filter(|(_, r)| r.request.dataset == name)
                    .map(|(n, _)| n.as_str()),
            )
            .collect();
        if !users.is_empty() {
            return Err(Error::new(
                Code::DatasetInUse,
                format!(
                    "dataset '{name}' is used by job(s) {}: a re-index changes its element ids; \
                     delete the jobs first",
                    users.join(", ")
                ),
            ));
        }
        if d.preload.is_some() {
            return Err(Error::new(
                Code::DatasetInUse,
                format!(
                    "dataset '{name}' has a preload: a re-index changes its element ids; \
                     release it first (DELETE /v1/datasets/{name}/preload)"
                ),
            ));
        }
        let id = inner.next_dataset_id()?;
        let d = inner
            .datasets
            .get_mut(name)
            .ok_or_else(|| Error::dataset_not_found(name))?;
        d.id = id;
        d.record.state = "indexing".into();
        d.record.error = None;
        d.record.changes = None;
        d.progress.store(0, std::sync::atomic::Ordering::Relaxed);
        d.index = None;
        d.source = None;
        d.sampler = None;
        d.record.clone()
    };
    // The previous index and objects stay stored until the new ones replace them.
    registry
        .catalog
        .put(&record, None)
        .map_err(Error::internal)?;
    start_indexing(registry.clone(), record.name);
    Ok(())
}

/// Deletes a dataset; with `force`, stops the jobs that use it first.
pub async fn delete_dataset(registry: &Registry, name: &str, force: bool) -> Result<()> {
    let users: Vec<String> = {
        let inner = registry.inner.lock().map_err(Error::internal)?;
        let Some(d) = inner.datasets.get(name) else {
            return Err(Error::dataset_not_found(name));
        };
        if d.appending {
            return Err(Error::new(
                Code::DatasetInUse,
                format!("dataset '{name}' is being appended to: delete it once that ends"),
            ));
        }
        inner
            .jobs
            .values()
            .filter(|j| j.dataset == name)
            .map(|j| j.name.clone())
            .collect()
    };
    if !users.is_empty() && !force {
        return Err(Error::new(
            Code::DatasetInUse,
            format!(
                "dataset '{name}' is used by job(s) {}; delete them first or pass ?force=true",
                users.join(", ")
            ),
        ));
    }
    for job in users {
        super::jobs::stop_job(registry, &job).await?;
    }
    let removed = {
        let mut inner = registry.inner.lock().map_err(Error::internal)?;
        // An append may have started while its jobs stopped: it persists the dataset again.
        if inner.datasets.get(name).is_some_and(|d| d.appending) {
            return Err(Error::new(
                Code::DatasetInUse,
                format!("dataset '{name}' is being appended to: delete it once that ends"),
            ));
        }
        inner.datasets.remove(name)
    };
    // Its working set is released with it (its pins, and the index its preload held).
    if let Some(d) = removed
        && let Some(p) = &d.preload
    {
        super::preload::let_go(registry, d.id, d.source.as_ref(), p).await?;
    }
    // A redb commit: on the blocking pool, never on an HTTP worker or an actor.
    let catalog = registry.catalog.clone();
    let owned = name.to_string();
    actix_web::rt::task::spawn_blocking(move || catalog.remove(&owned))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)
}

/// An element that failed to load: (element, kind, message).
pub type Failure = (u32, String, String);

/// The elements of a dataset that failed to load.
pub fn failures(registry: &Registry, name: &str) -> Result<Vec<Failure>> {
    let id = {
        let inner = registry.inner.lock().map_err(Error::internal)?;
        inner
            .datasets
            .get(name)
            .ok_or_else(|| Error::dataset_not_found(name))?
            .id
    };
    let failures = registry.stats.failures.lock().map_err(Error::internal)?;
    Ok(failures
        .iter()
        .filter(|((ds, _), _)| *ds == id)
        .map(|((_, element), (kind, message))| (*element, kind.clone(), message.clone()))
        .collect())
}
