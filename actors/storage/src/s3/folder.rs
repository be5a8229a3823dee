//! The `image_folder` layout in a bucket: classes are the key prefixes under the url, images
//! the objects below each, in the local layout's order (`crate::folder`).

use std::path::Path;

use super::{ObjectStores, ObjectVersion, S3Dataset, last_component, list_all};
use crate::index::IndexBuilder;
use crate::{DatasetIndex, Progress, StorageError, has_image_extension};

pub(super) fn index(
    stores: &ObjectStores,
    ds: &S3Dataset,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    let root = ds.url.folder();
    let (_, prefixes) = list_all(stores, ds, &root, true)?;
    let mut classes: Vec<String> = prefixes
        .iter()
        .map(|p| last_component(p).to_owned())
        .filter(|c| !c.is_empty() && !c.starts_with('.'))
        .collect();
    classes.sort();
    classes.dedup();
    if classes.is_empty() {
        return Err(ds.not_found(&ds.url.key));
    }
    let mut items = IndexBuilder::files();
    let mut versions = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let label = u32::try_from(label).map_err(|_| StorageError::TooManyItems)?;
        let prefix = format!("{root}{class}/");
        let (objects, _) = list_all(stores, ds, &prefix, false)?;
        // (folder below the class as `/a/b`, file name, key): the local layout's order.
        let mut found: Vec<(String, String, String)> = Vec::new();
        for o in objects {
            let key = o.location.to_string();
            let Some(rel) = key.strip_prefix(&prefix) else {
                continue;
            };
            let parts: Vec<&str> = rel.split('/').collect();
            let Some((name, dirs)) = parts.split_last() else {
                continue;
            };
            if parts.iter().any(|p| p.is_empty() || p.starts_with('.'))
                || !has_image_extension(Path::new(name))
            {
                continue;
            }
            let dir: String = dirs.iter().map(|d| format!("/{d}")).collect();
            versions.push(ObjectVersion::of(&o));
            found.push((dir, (*name).to_owned(), key));
        }
        found.sort();
        for (_, _, key) in found {
            items.push_file(Path::new(&key), label);
            progress.tick()?;
        }
    }
    versions.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((items.finish(classes, Vec::new()), versions))
}
