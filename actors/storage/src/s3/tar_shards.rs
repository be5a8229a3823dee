//! The `tar_shards` layout in a bucket: the `.tar` objects under the url (or the one it
//! names), each read once as a stream whose tar headers are indexed as they pass, with the
//! local layout's rules (`crate::tar_shards`).

use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::stream::StreamRead;
use super::{ObjectStores, ObjectVersion, S3Dataset, files_of};
use crate::index::IndexBuilder;
use crate::{DatasetIndex, Progress, StorageError, tar_shards};

pub(super) fn index(
    stores: &ObjectStores,
    ds: &S3Dataset,
    fields: Option<&crate::fields::Fields>,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    let shards = files_of(stores, ds, "tar", |k| {
        tar_shards::has_tar_extension(Path::new(k))
    })?;
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
    let classes = items.text_classes(true, &|| "tar shards".to_owned())?;
    let index = items.finish(
        classes,
        shards
            .iter()
            .map(|s| PathBuf::from(s.location.to_string()))
            .collect(),
    );
    Ok((index, shards.iter().map(ObjectVersion::of).collect()))
}
