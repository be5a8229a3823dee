//! What a queued element fetch is, shared by the stage's parts (`fetch`, which queues them,
//! `coalesce`, which turns them into requests, `parquet` and `ahead`): the [`Request`], its
//! dataset's [`SourceInner`] and the [`Done`] callback.

use std::collections::HashMap;
use std::sync::Arc;

use super::S3Dataset;
use crate::tier::{Demand, Owner, TierKey};
use crate::{DatasetIndex, Location, StorageError};

/// Called once with an element's bytes or why it could not be fetched, on a thread of the
/// fetch stage, and the bytes the store sent for it (0 when they came from the disk tier or
/// the fetch failed; a coalesced request's bytes between members count for none).
pub type Done = Box<dyn FnOnce(Result<Vec<u8>, StorageError>, u64) + Send>;

/// One queued element fetch.
pub(super) struct Request {
    pub(super) source: Arc<SourceInner>,
    pub(super) element: u32,
    pub(super) done: Done,
    /// When it was queued.
    pub(super) queued_at: std::time::Instant,
    /// The disk tier was asked already (it missed): fetch from the store.
    pub(super) tier_checked: bool,
}

/// What every fetch of one dataset shares.
pub(super) struct SourceInner {
    /// Unique in the process: its elements' keys in the fetch-ahead buffer.
    pub(super) id: u64,
    pub(super) dataset: S3Dataset,
    pub(super) index: Arc<DatasetIndex>,
    /// Each indexed object's ETag, by key.
    pub(super) etags: HashMap<String, String>,
    /// The store's name in tier keys: its endpoint (or `aws`) and bucket.
    pub(super) store: String,
    /// The elements its jobs still need this epoch (the tier's admission).
    pub(super) demand: Arc<Demand>,
}

impl SourceInner {
    /// The ETag the index holds for `key`.
    pub(super) fn etag(&self, key: &str) -> Option<&str> {
        self.etags.get(key).map(String::as_str)
    }

    /// The tier key of `element`'s bytes (`None` when its object has no ETag: not stored). A
    /// Parquet row is a part of its object: its row group and row, and the small columns its
    /// dataset declares (its stored bytes carry their values, `DatasetIndex::read_whole_row`).
    pub(super) fn tier_key(&self, element: u32) -> Option<TierKey> {
        let shard = |i: u32| {
            Some(
                self.index
                    .shards()
                    .get(i as usize)?
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let (object, range, part) = match self.index.location(element)? {
            Location::File(key) => (key.to_string_lossy().into_owned(), None, None),
            Location::TarMember {
                shard: s,
                offset,
                len,
            } => (shard(s)?, Some(offset..offset + len), None),
            Location::ParquetRow {
                file,
                row_group,
                row,
            } => (
                shard(file)?,
                None,
                Some(format!(
                    "row {row_group}/{row} columns {}",
                    self.index.small_fields_tag()
                )),
            ),
            // A row of every array: kept under the first array's name, with every array's
            // ETag (a change to any of them is another row).
            Location::ArrayRow { row } => {
                let etags = self
                    .index
                    .shards()
                    .iter()
                    .map(|k| self.etag(&k.to_string_lossy()).map(str::to_owned))
                    .collect::<Option<Vec<String>>>()?;
                let etag = etags.join(",");
                let part = format!("array row {row} of {}", etags.len());
                return Some(TierKey {
                    store: self.store.clone(),
                    object: shard(0)?,
                    etag,
                    range: None,
                    part: Some(part),
                });
            }
        };
        let etag = self.etag(&object)?.to_owned();
        Some(TierKey {
            store: self.store.clone(),
            object,
            etag,
            range,
            part,
        })
    }

    /// Whose element a stored object holds.
    pub(super) fn owner(&self, element: u32) -> Owner {
        Owner {
            demand: Arc::downgrade(&self.demand),
            element,
        }
    }
}
