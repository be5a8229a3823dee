//! The `tar_shards` layout in a bucket: the `.tar` objects under the url (or the one it
//! names), each read once as a stream whose tar headers are indexed as they pass, with the
//! local layout's rules (`crate::tar_shards`).

use std::io::BufReader;
use std::path::{Path, PathBuf};

use object_store::ObjectMeta;

use super::stream::StreamRead;
use super::{ObjectStores, ObjectVersion, S3Dataset, last_component, list_all};
use crate::index::IndexBuilder;
use crate::{DatasetIndex, Progress, StorageError, is_hidden, numeric_classes, tar_shards};

pub(super) fn index(
    stores: &ObjectStores,
    ds: &S3Dataset,
    fields: Option<&crate::fields::Fields>,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    let is_tar = |k: &str| tar_shards::has_tar_extension(Path::new(k));
    let (objects, _) = if is_tar(&ds.url.key) {
        list_all(stores, ds, &ds.url.key, false)?
    } else {
        list_all(stores, ds, &ds.url.folder(), true)?
    };
    let mut shards: Vec<ObjectMeta> = objects
        .into_iter()
        .filter(|o| {
            let key = o.location.as_ref();
            let name = last_component(key);
            is_tar(key)
                && !is_hidden(std::ffi::OsStr::new(name))
                && (key == ds.url.key || !is_tar(&ds.url.key))
        })
        .collect();
    shards.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    if shards.is_empty() {
        return Err(ds.not_found(&ds.url.key));
    }
    let mut items = IndexBuilder::members();
    items.sample = fields.map(|f| crate::index::SampleFields::new(f, true));
    for (n, shard) in shards.iter().enumerate() {
        let n = u32::try_from(n).map_err(|_| StorageError::TooManyItems)?;
        let key = shard.location.to_string();
        let name = PathBuf::from(ds.name(&key));
        let reader = StreamRead::new(stores, ds, shard);
        let mut archive = tar::Archive::new(BufReader::with_capacity(1 << 16, reader));
        let entries = archive
            .entries()
            .map_err(|e| tar_shards::bad_shard(&name)(e.to_string().to_lowercase()))?;
        tar_shards::index_entries(n, &name, shard.size, fields, entries, &mut items, progress)?;
    }
    let classes = numeric_classes(items.labels_mut());
    let index = items.finish(
        classes,
        shards
            .iter()
            .map(|s| PathBuf::from(s.location.to_string()))
            .collect(),
    );
    Ok((index, shards.iter().map(ObjectVersion::of).collect()))
}
