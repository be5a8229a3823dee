//! The `manifest` layout in a bucket: the manifest object is parsed as a stream by the local
//! parser (`crate::manifest`), its paths resolved to keys relative to its prefix and checked
//! against the allow-list, and the objects it names found with one listing.

use std::io::BufReader;
use std::path::PathBuf;

use super::stream::StreamRead;
use super::{ObjectStores, ObjectVersion, S3Dataset, S3Url, list_all};
use crate::{DatasetIndex, Progress, StorageError, manifest};

/// A manifest: the manifest object is read as a stream; the objects it names are then found
/// with one paginated listing of their longest common folder (a key the listing lacks fails
/// the dataset, as a missing file fails a local manifest), which also gives their sizes and
/// ETags.
pub(super) fn index(
    stores: &ObjectStores,
    ds: &S3Dataset,
    fields: Option<&crate::fields::Fields>,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    let key = ds.url.key.clone();
    let (objects, _) = list_all(stores, ds, &key, false)?;
    let Some(meta) = objects.into_iter().find(|o| o.location.as_ref() == key) else {
        return Err(ds.not_found(&ds.url.key));
    };
    let base = match key.rfind('/') {
        Some(i) => key[..=i].to_owned(),
        None => String::new(),
    };
    let allow = stores.allow();
    let bucket = ds.url.bucket.clone();
    let mut named = std::collections::BTreeSet::new();
    let mut resolve = |entry: &str| -> Result<PathBuf, StorageError> {
        let full = resolve_key(&base, entry).ok_or_else(|| StorageError::S3NotAllowed {
            url: format!("s3://{bucket}/{base}{entry}"),
            reason: "manifest paths are keys relative to the manifest's prefix, and may not \
                     climb above the bucket"
                .into(),
        })?;
        if !allow.permits(&bucket, &full) {
            allow.check(&S3Url {
                bucket: bucket.clone(),
                key: full.clone(),
            })?;
        }
        named.insert(full.clone());
        Ok(PathBuf::from(full))
    };
    let reader = BufReader::with_capacity(1 << 16, StreamRead::new(stores, ds, &meta));
    let index = manifest::index_reader(
        &PathBuf::from(ds.url.to_string()),
        fields,
        reader,
        &mut resolve,
        progress,
    )?;
    let mut versions = vec![ObjectVersion::of(&meta)];
    if let (Some(first), Some(last)) = (named.first(), named.last()) {
        let common: usize = first
            .bytes()
            .zip(last.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        // The folder both keys lie in (the keys are sorted: so do all between them).
        let prefix = match first.as_bytes()[..common].iter().rposition(|&b| b == b'/') {
            Some(i) => &first[..=i],
            None => "",
        };
        let (listed, _) = list_all(stores, ds, prefix, false)?;
        for o in listed {
            if named.remove(o.location.as_ref()) {
                versions.push(ObjectVersion::of(&o));
            }
        }
        if let Some(missing) = named.first() {
            return Err(ds.not_found(missing));
        }
    }
    versions.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((index, versions))
}

/// `base` + `entry` with `.` and `..` resolved; `None` for an absolute entry or one that
/// climbs above the bucket.
fn resolve_key(base: &str, entry: &str) -> Option<String> {
    if entry.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for c in entry.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::resolve_key;

    #[test]
    fn manifest_keys_resolve_against_the_manifest_prefix() {
        assert_eq!(resolve_key("a/b/", "c.jpg").as_deref(), Some("a/b/c.jpg"));
        assert_eq!(resolve_key("a/b/", "../c.jpg").as_deref(), Some("a/c.jpg"));
        assert_eq!(
            resolve_key("a/", "./x/./y.jpg").as_deref(),
            Some("a/x/y.jpg")
        );
        assert_eq!(resolve_key("a/", "../../y.jpg"), None);
        assert_eq!(resolve_key("a/", "/y.jpg"), None);
    }
}
