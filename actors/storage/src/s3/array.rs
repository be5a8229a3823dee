//! The `array` layout in a bucket: the `.npy` objects under the url (or those its patterns and
//! brace lists name), sorted by key, aligned along their first dimension as a local `array`
//! source's files are (`crate::array`: its fields, rules and errors).
//!
//! - **Indexing** reads each object's header (one ranged GET of its first 4 KiB; a second when
//!   the header is longer) and a `class` array's data (one GET), nothing else.
//! - **Reads** run on the fetch stage like a Parquet row's (`parquet::spawn_read`): a row is
//!   one ranged GET per array of exactly the row's bytes, all at once, each under a place
//!   among the requests in flight and asking for the ETag the index holds (`If-Match`: an
//!   object changed since indexing is the element's error, never other bytes). The values are
//!   framed as a local row's (`DatasetIndex::read`), fetched ahead and kept by the disk tier
//!   as one element (`TierKey::part`: the row, its object the first array's, its ETag every
//!   array's).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::runtime::Handle;

use super::parquet::{SENT, get_range};
use super::remote::Remote;
use super::{ObjectStores, ObjectVersion, S3Dataset, files_of};
use crate::array::{ArrayBytes, ArrayObjects};
use crate::{DatasetIndex, Progress, StorageError};

pub(super) fn has_npy_extension(key: &str) -> bool {
    Path::new(key)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("npy"))
}

pub(super) fn index(
    stores: &ObjectStores,
    ds: &S3Dataset,
    fields: Option<&crate::fields::Fields>,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    let found = files_of(stores, ds, "npy", has_npy_extension)?;
    let versions: Vec<ObjectVersion> = found.iter().map(ObjectVersion::of).collect();
    let keys: Vec<PathBuf> = versions.iter().map(|v| PathBuf::from(&v.key)).collect();
    let objects = RowObjects::new(stores, ds, &versions);
    let index = crate::array::index_with(&keys, fields, progress, &mut |key| {
        let key = key.to_string_lossy().into_owned();
        let v = objects
            .versions
            .get(&key)
            .ok_or_else(|| ds.not_found(&key))?;
        let object = Object {
            objects: objects.clone(),
            key: key.clone(),
            size: v.size,
        };
        Ok((PathBuf::from(key), Box::new(object) as Box<dyn ArrayBytes>))
    })?;
    Ok((index, versions))
}

/// Reads an `s3` array dataset's rows (installed in its index's read state by the source).
#[derive(Clone)]
pub(super) struct RowObjects {
    remote: Arc<Remote>,
    handle: Handle,
    dataset: Arc<S3Dataset>,
    /// The indexed objects, by key.
    versions: Arc<HashMap<String, ObjectVersion>>,
}

impl RowObjects {
    pub(super) fn new(
        stores: &ObjectStores,
        dataset: &S3Dataset,
        versions: &[ObjectVersion],
    ) -> Self {
        let (remote, handle) = stores.shared();
        RowObjects {
            remote,
            handle,
            dataset: Arc::new(dataset.clone()),
            versions: Arc::new(
                versions
                    .iter()
                    .map(|v| (v.key.clone(), v.clone()))
                    .collect(),
            ),
        }
    }

    /// Each range of each object, all at once, asking for the indexed ETags.
    fn get(&self, reads: &[(&str, Range<u64>)]) -> Result<Vec<Vec<u8>>, StorageError> {
        let gets = reads
            .iter()
            .map(|(key, range)| {
                let v = self
                    .versions
                    .get(*key)
                    .ok_or_else(|| StorageError::BadArray {
                        path: PathBuf::from(self.dataset.name(key)),
                        reason: "not among the objects the dataset was indexed from: re-index \
                                 the dataset"
                            .into(),
                    })?;
                Ok(get_range(
                    &self.remote,
                    &self.dataset,
                    key,
                    range.clone(),
                    v.etag.as_deref(),
                ))
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        let got = self.handle.block_on(futures::future::try_join_all(gets))?;
        SENT.set(SENT.get() + got.iter().map(|b| b.len() as u64).sum::<u64>());
        Ok(got.into_iter().map(|b| b.to_vec()).collect())
    }
}

impl ArrayObjects for RowObjects {
    fn read(&self, reads: &[(&Path, Range<u64>)]) -> Result<Vec<Vec<u8>>, StorageError> {
        let keys: Vec<(String, Range<u64>)> = reads
            .iter()
            .map(|(k, r)| (k.to_string_lossy().into_owned(), r.clone()))
            .collect();
        let reads: Vec<(&str, Range<u64>)> =
            keys.iter().map(|(k, r)| (k.as_str(), r.clone())).collect();
        self.get(&reads)
    }
}

/// One object's bytes while it is indexed.
struct Object {
    objects: RowObjects,
    key: String,
    size: u64,
}

impl ArrayBytes for Object {
    fn len(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        let mut got = self
            .objects
            .get(&[(self.key.as_str(), offset..offset + len as u64)])?;
        let bytes = got.pop().unwrap_or_default();
        if bytes.len() != len {
            return Err(StorageError::BadArray {
                path: PathBuf::from(self.objects.dataset.name(&self.key)),
                reason: format!(
                    "{} bytes at {offset} were asked, the store sent {}",
                    len,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }
}
