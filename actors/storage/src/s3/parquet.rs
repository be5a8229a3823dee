//! The `parquet` layout in a bucket: the `.parquet` objects under the url (or the one it
//! names), sorted by key, read by the local source's code (`crate::parquet`) through ranged
//! GETs ([`ObjectRanges`], the `Ranges` of an object).
//!
//! - **Indexing** reads each object's footer (one GET of its last 64 KiB; a second when the
//!   footer is larger) and its class column's chunks (one GET each, 64 row groups' at once),
//!   [`OBJECTS_AHEAD`] objects at a time, with the local source's rules, errors
//!   (`bad_parquet`, naming the object's url) and `fields`.
//! - **Reads** run on the fetch stage: a row's read is a blocking task of the stage's
//!   runtime (at most [`ROW_READS`] at once) that reads as the local source does (a row
//!   group's first read GETs its image column's chunk whole and locates its rows; each later
//!   row is one GET of about its own bytes), each GET under a place among the requests in
//!   flight, counted by op, and asking for the ETag the index holds (`If-Match`): an object
//!   changed since indexing is the element's error ("re-index the dataset"), never other
//!   bytes. The dataset's reader opens objects through [`Opener`], which the source
//!   installs in the index's read state.
//! - **Fetch-ahead** applies as to any element: its read is queued like a fetch, and its
//!   bytes wait in the buffer for their load. A row's read gives its image with its small
//!   fields' values (`DatasetIndex::read_whole_row`), so the fields are fetched ahead with
//!   the image, never by a decode thread.
//! - **The disk tier** keeps a row as a part of its object (`TierKey::part`: its row group and
//!   row, and the small columns its dataset declares), the whole row's bytes as the read gave
//!   them: the next read of the row is a read of the tier, as for the other layouts. (A row's
//!   image is no byte range of its object: it is a value decompressed from a page.)

use std::cell::Cell;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use tokio::runtime::Handle;

use super::limit::Outcome;
use super::remote::Remote;
use super::request::Request;
use super::{ObjectStores, ObjectVersion, S3Dataset, files_of};
use crate::parquet::{self as local, Files, Input, Objects, Ranges};
use crate::{DatasetIndex, Progress, StorageError};

/// Objects whose footers and class columns indexing reads at once.
const OBJECTS_AHEAD: usize = 16;

/// Row reads running at once on the stage's blocking threads (each waits on its GETs).
pub(super) const ROW_READS: usize = 64;

thread_local! {
    /// Bytes the store sent to this thread's GETs (a row read's, for its `Done`; an array
    /// row's too, `s3::array`).
    pub(super) static SENT: Cell<u64> = const { Cell::new(0) };
}

pub(super) fn has_parquet_extension(key: &str) -> bool {
    Path::new(key)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

pub(super) fn index(
    stores: &ObjectStores,
    ds: &S3Dataset,
    fields: Option<&crate::fields::Fields>,
    split: Option<&str>,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    let found = match split {
        Some(split) => split_objects(stores, ds, split)?,
        None => files_of(stores, ds, "parquet", has_parquet_extension)?,
    };
    let versions: Vec<ObjectVersion> = found.iter().map(ObjectVersion::of).collect();
    let (remote, handle) = stores.shared();
    let dataset = Arc::new(ds.clone());
    let open = |n: usize| {
        let v = &versions[n];
        Ok(object(&remote, &handle, &dataset, v))
    };
    let files = Files {
        recorded: versions.iter().map(|v| PathBuf::from(&v.key)).collect(),
        named: versions
            .iter()
            .map(|v| PathBuf::from(ds.name(&v.key)))
            .collect(),
        open: &open,
        ahead: OBJECTS_AHEAD,
    };
    // Nothing of a row's `path` is read from a bucket: no local roots.
    let roots = crate::roots::Roots::from_canonical(Vec::new());
    let index = local::index_files(&files, fields, &roots, progress)?;
    Ok((index, versions))
}

/// The `.parquet` objects of split `split` of the Hugging Face dataset folder the url names
/// (a prefix), picked as `select::hub_split` picks a local folder's files: those the dataset
/// card (its `README.md` object) gives the split in its `configs`, else those of the first of
/// the Hub's layouts that holds any, under any name of the split. Sorted; `NoMatch` naming
/// the split and what was tried when there are none.
pub(super) fn split_objects(
    stores: &ObjectStores,
    ds: &S3Dataset,
    split: &str,
) -> Result<Vec<object_store::ObjectMeta>, StorageError> {
    use crate::select::{HUB_LAYOUTS, split_names};
    let prefix = super::url::folder_of(&ds.url.key);
    let (objects, _) = super::list_all(stores, ds, &prefix, false)?;
    let rel = |o: &object_store::ObjectMeta| -> Option<String> {
        o.location
            .as_ref()
            .strip_prefix(prefix.as_str())
            .map(str::to_owned)
    };
    let folder = format!("s3://{}/{prefix}", ds.url.bucket);
    let card = objects
        .iter()
        .find(|o| rel(o).as_deref() == Some("README.md"));
    let from_card = match card {
        Some(meta) => card_patterns(stores, ds, meta, &folder, split)?,
        None => None,
    };
    let pick = |patterns: &[String]| pick_objects(&objects, &prefix, &folder, patterns);
    let found = match from_card {
        Some(patterns) => pick(&patterns)?,
        None => {
            let mut found = Vec::new();
            for layout in HUB_LAYOUTS {
                let patterns: Vec<String> = split_names(split)
                    .iter()
                    .map(|n| layout.replace("{}", n))
                    .collect();
                found = pick(&patterns)?;
                if !found.is_empty() {
                    break;
                }
            }
            found
        }
    };
    if found.is_empty() {
        return Err(StorageError::NoMatch {
            pattern: format!(
                "split `{split}` of {folder} (tried its dataset card's configs, then {}, the \
                 names {})",
                HUB_LAYOUTS.join(", "),
                split_names(split).join(", ")
            ),
            ext: "parquet".into(),
        });
    }
    if let Some(o) = found
        .iter()
        .find(|o| !stores.allow().permits(&ds.url.bucket, o.location.as_ref()))
    {
        return Err(StorageError::S3NotAllowed {
            url: format!("s3://{}/{}", ds.url.bucket, o.location.as_ref()),
            reason: "the split holds it, outside --allowed-s3".into(),
        });
    }
    Ok(found)
}

/// The patterns the dataset card `meta` (a `README.md` object) gives split `split` in its
/// `configs`, when it has some.
fn card_patterns(
    stores: &ObjectStores,
    ds: &S3Dataset,
    meta: &object_store::ObjectMeta,
    folder: &str,
    split: &str,
) -> Result<Option<Vec<String>>, StorageError> {
    use std::io::Read as _;
    let mut text = String::new();
    super::stream::StreamRead::new(stores, ds, meta)
        .read_to_string(&mut text)
        .map_err(|e| StorageError::BadPattern {
            pattern: format!("{folder}README.md"),
            reason: format!("the dataset card cannot be read: {e}"),
        })?;
    crate::select::card_split_text(&text, &format!("{folder}README.md"), split)
}

/// The `.parquet` objects among `objects` whose key under `prefix` matches one of `patterns`
/// (`*` within a `/`-separated component, `**` across), sorted.
fn pick_objects(
    objects: &[object_store::ObjectMeta],
    prefix: &str,
    folder: &str,
    patterns: &[String],
) -> Result<Vec<object_store::ObjectMeta>, StorageError> {
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let compiled = patterns
        .iter()
        .map(|p| {
            glob::Pattern::new(p).map_err(|e| StorageError::BadPattern {
                pattern: format!("{folder}{p}"),
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut found: Vec<object_store::ObjectMeta> = objects
        .iter()
        .filter(|o| has_parquet_extension(o.location.as_ref()))
        .filter(|o| {
            o.location
                .as_ref()
                .strip_prefix(prefix)
                .is_some_and(|r| compiled.iter().any(|p| p.matches_with(r, options)))
        })
        .cloned()
        .collect();
    found.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    Ok(found)
}

/// Object `v` as a Parquet file's input.
fn object(
    remote: &Arc<Remote>,
    handle: &Handle,
    dataset: &Arc<S3Dataset>,
    v: &ObjectVersion,
) -> Arc<Input> {
    let ranges = ObjectRanges {
        remote: remote.clone(),
        handle: handle.clone(),
        dataset: dataset.clone(),
        key: v.key.clone(),
        etag: v.etag.clone(),
    };
    Input::object(Box::new(ranges), v.size)
}

/// Ranged GETs of one object, on the fetch stage's runtime, asking for its indexed ETag.
struct ObjectRanges {
    remote: Arc<Remote>,
    handle: Handle,
    dataset: Arc<S3Dataset>,
    key: String,
    etag: Option<String>,
}

impl Ranges for ObjectRanges {
    fn get(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, StorageError> {
        let gets = ranges.iter().map(|r| {
            get_range(
                &self.remote,
                &self.dataset,
                &self.key,
                r.clone(),
                self.etag.as_deref(),
            )
        });
        let got = self.handle.block_on(futures::future::try_join_all(gets))?;
        SENT.set(SENT.get() + got.iter().map(|b| b.len() as u64).sum::<u64>());
        Ok(got)
    }
}

/// One ranged GET under a place among the requests in flight.
pub(super) async fn get_range(
    remote: &Remote,
    ds: &S3Dataset,
    key: &str,
    range: Range<u64>,
    etag: Option<&str>,
) -> Result<Bytes, StorageError> {
    let place = remote.limit.acquire().await;
    remote.stats.in_flight.fetch_add(1, Relaxed);
    let asked = std::time::Instant::now();
    let got = remote.get(ds, key, Some(range), etag).await;
    remote.stats.in_flight.fetch_sub(1, Relaxed);
    let outcome = match &got {
        Ok(_) => Outcome::Served(asked.elapsed()),
        Err(_) => Outcome::Other,
    };
    place.release(outcome);
    remote
        .stats
        .limit
        .store(remote.limit.limit() as u64, Relaxed);
    got
}

/// Opens an `s3` dataset's Parquet objects for its reads (installed in the index's read
/// state by the source).
pub(super) struct Opener {
    remote: Arc<Remote>,
    handle: Handle,
    dataset: Arc<S3Dataset>,
    /// The indexed objects, by key.
    versions: HashMap<String, ObjectVersion>,
}

impl Opener {
    pub(super) fn new(
        stores: &ObjectStores,
        dataset: &S3Dataset,
        versions: &[ObjectVersion],
    ) -> Self {
        let (remote, handle) = stores.shared();
        Opener {
            remote,
            handle,
            dataset: Arc::new(dataset.clone()),
            versions: versions
                .iter()
                .map(|v| (v.key.clone(), v.clone()))
                .collect(),
        }
    }
}

impl Objects for Opener {
    fn open(&self, _n: u32, recorded: &Path) -> Result<Arc<Input>, StorageError> {
        let key = recorded.to_string_lossy();
        let v = self
            .versions
            .get(key.as_ref())
            .ok_or_else(|| StorageError::BadParquet {
                path: PathBuf::from(self.dataset.name(&key)),
                reason: "not among the objects the dataset was indexed from: re-index the \
                         dataset"
                    .into(),
            })?;
        Ok(object(&self.remote, &self.handle, &self.dataset, v))
    }
}

/// Reads a queued Parquet row on the stage's blocking threads (at most [`ROW_READS`] at
/// once) and hands it its image bytes, with the bytes its GETs took from the store.
pub(super) fn spawn_read(remote: &Arc<Remote>, r: Request) {
    let remote = remote.clone();
    tokio::spawn(async move {
        // (The semaphore is never closed.)
        let permit = remote.row_reads.clone().acquire_owned().await.ok();
        remote.stats.queued(r.queued_at.elapsed());
        tokio::task::spawn_blocking(move || {
            SENT.set(0);
            // The image with the row's small fields: both read ahead, and kept by the tier.
            let read = r.source.index.read_whole_row(r.element);
            let sent = SENT.take();
            drop(permit);
            let sent = if read.is_ok() { sent } else { 0 };
            if let (Ok(bytes), Some(tier), Some(key)) =
                (&read, &remote.tier, r.source.tier_key(r.element))
            {
                tier.offer(
                    key,
                    Bytes::from(bytes.clone()),
                    Some(r.source.owner(r.element)),
                );
            }
            (r.done)(read, sent);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::has_parquet_extension;

    #[test]
    fn parquet_objects_are_named_by_their_extension() {
        assert!(has_parquet_extension("data/train-00000-of-00002.parquet"));
        assert!(has_parquet_extension("x.PARQUET"));
        assert!(!has_parquet_extension("data/README.md"));
        assert!(!has_parquet_extension("data/parquet"));
    }
}
