//! `s3`: datasets in an S3-compatible object store (AWS S3, MinIO, Ceph RGW, Garage, R2),
//! read through the `object_store` crate.
//!
//! - `image_folder`: classes are the key prefixes ("folders") under the url, listed page by
//!   page; images are found below each class prefix and ordered like the local layout
//!   (folder, then file name), hidden components skipped.
//! - `tar_shards`: the `.tar` objects under the url (or the one the url names), indexed once
//!   with one streaming GET per shard that reads the tar headers as they pass (a broken
//!   stream resumes with a ranged GET from where it stopped, on the same ETag).
//! - `manifest`: the url names a `.csv`/`.jsonl`/`.json` object, read as a stream; its paths
//!   are keys relative to its prefix (`..` may not climb above the bucket).
//! - `parquet`: the `.parquet` objects under the url (or the one it names), as the local
//!   `parquet` source reads files, through ranged GETs: footers and class columns at
//!   indexing, a row group's image column chunk on its first read, then each row's piece.
//!
//! **Every key an index records lies under one of the server's `--allowed-s3` prefixes**,
//! checked before any request and for each manifest entry. Credentials come only from the
//! server's environment (`AmazonS3Builder::from_env`); with none configured, opening fails at
//! once instead of probing instance metadata, and error messages never carry them.
//!
//! Items record object keys where local sources record paths (`Location::File` is the key,
//! shards are keys), so the index and its persisted form are the local ones.
//!
//! The parts: `url` (what a source names, checked for syntax), `allow` (the allow-list),
//! `dataset` (a bucket opened with the credentials), `version` (what a re-index compares),
//! the layouts' indexers (`folder`, `tar_shards`, `manifest`, beside the local ones, and
//! `parquet`, which also opens the objects of a Parquet dataset's reads),
//! `stream` (the indexers' blocking reader of an object), and the fetch stage that runs every
//! request (`fetch`, `remote`, `coalesce`, and `limit`, the adaptive limit on requests in
//! flight) with its counters (`stats`). This file holds the
//! public surface and what the indexers share.

mod ahead;
mod allow;
mod array;
mod coalesce;
mod dataset;
mod fetch;
mod folder;
mod limit;
mod manifest;
mod parquet;
mod remote;
mod request;
mod stats;
mod stream;
mod tar_shards;
mod url;
mod version;

use object_store::ObjectMeta;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use serde::{Deserialize, Serialize};

use super::{DatasetIndex, Progress, StorageError};

pub use ahead::{DEFAULT_BYTES as DEFAULT_FETCH_AHEAD_BYTES, STALE as FETCH_AHEAD_STALE};
pub use allow::S3Allow;
pub use dataset::S3Dataset;
pub use fetch::{FetchConfig, ObjectStores, S3Source};
pub use request::Done;
pub use stats::{AheadCounts, ERROR_KINDS, LATENCY_BUCKETS, ObjectStats, Op};
pub use url::{S3Url, normalize_endpoint, validate};
pub use version::{CHANGES_LISTED, ObjectChanges, ObjectVersion};

/// How the objects under an `s3` source's url make a dataset.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum S3Layout {
    ImageFolder,
    TarShards,
    Manifest,
    /// Parquet files as the Hugging Face Hub stores image datasets (see `parquet`).
    Parquet,
    /// NumPy `.npy` objects aligned along their first dimension, as a local `array` source
    /// (see `array`).
    Array,
}

/// An indexed `s3` source: its index, and the objects it was made of, sorted by key.
pub struct S3Index {
    pub index: DatasetIndex,
    pub objects: Vec<ObjectVersion>,
}

/// Indexes an `s3` source (blocking: runs the requests on the fetch stage's runtime).
fn index(
    stores: &ObjectStores,
    dataset: &S3Dataset,
    (layout, split): (S3Layout, Option<&str>),
    fields: Option<&crate::fields::Fields>,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
    stores.allow().check(&dataset.url)?;
    match layout {
        S3Layout::ImageFolder => folder::index(stores, dataset, progress),
        S3Layout::TarShards => tar_shards::index(stores, dataset, fields, progress),
        S3Layout::Manifest => manifest::index(stores, dataset, fields, progress),
        S3Layout::Parquet => parquet::index(stores, dataset, fields, split, progress),
        S3Layout::Array => array::index(stores, dataset, fields, progress),
    }
}

/// Every object and common prefix under `prefix`, page by page.
fn list_all(
    stores: &ObjectStores,
    ds: &S3Dataset,
    prefix: &str,
    delimited: bool,
) -> Result<(Vec<ObjectMeta>, Vec<String>), StorageError> {
    let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
    let mut token = None;
    loop {
        let opts = PaginatedListOptions {
            delimiter: delimited.then_some("/".into()),
            max_keys: Some(stores.config().list_page),
            page_token: token.take(),
            ..PaginatedListOptions::default()
        };
        let page = stores.block_on(stores.remote().call(ds, prefix, Op::List, || {
            ds.store.list_paginated(Some(prefix), opts.clone())
        }))?;
        objects.extend(page.result.objects);
        prefixes.extend(
            page.result
                .common_prefixes
                .into_iter()
                .map(|p| p.to_string()),
        );
        match page.page_token {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => return Ok((objects, prefixes)),
        }
    }
}

/// The objects of a layout of files (`.tar` shards, `.parquet` files) that the url names:
/// its brace ranges and lists expanded in their order, then per key the objects a glob
/// pattern matches (sorted; none is `NoMatch`), or those under a prefix whose key `is_file`
/// accepts (sorted), or the one object the key names when `is_file` accepts it; hidden names
/// skipped. A prefix or a named object with nothing is the url's `not_found`.
fn files_of(
    stores: &ObjectStores,
    ds: &S3Dataset,
    ext: &str,
    is_file: impl Fn(&str) -> bool,
) -> Result<Vec<ObjectMeta>, StorageError> {
    let mut all = Vec::new();
    for key in crate::select::brace_keys(&ds.url.key)? {
        all.extend(files_of_key(stores, ds, &key, ext, &is_file)?);
    }
    Ok(all)
}

/// Checks that each glob pattern among `keys` matches an object of a layout of files (what
/// [`ObjectStores::check_patterns`] asks before a dataset is created).
fn pattern_objects(
    stores: &ObjectStores,
    ds: &S3Dataset,
    layout: S3Layout,
    keys: &[String],
) -> Result<(), StorageError> {
    let (ext, is_file): (&str, fn(&str) -> bool) = match layout {
        S3Layout::Parquet => ("parquet", parquet::has_parquet_extension),
        S3Layout::Array => ("npy", array::has_npy_extension),
        _ => ("tar", |k| {
            crate::tar_shards::has_tar_extension(std::path::Path::new(k))
        }),
    };
    for key in keys {
        if crate::select::KeyPattern::of(key)?.is_some() {
            files_of_key(stores, ds, key, ext, &is_file)?;
        }
    }
    Ok(())
}

fn files_of_key(
    stores: &ObjectStores,
    ds: &S3Dataset,
    key: &str,
    ext: &str,
    is_file: &impl Fn(&str) -> bool,
) -> Result<Vec<ObjectMeta>, StorageError> {
    let pattern = crate::select::KeyPattern::of(key)?;
    let one = pattern.is_none() && is_file(key);
    let (objects, _) = match &pattern {
        // Listed from the key's part before its first metacharacter, unfolded.
        Some(p) => list_all(stores, ds, &p.prefix, false)?,
        None if one => list_all(stores, ds, key, false)?,
        None => list_all(stores, ds, &url::folder_of(key), true)?,
    };
    let mut found: Vec<ObjectMeta> = objects
        .into_iter()
        .filter(|o| {
            let k = o.location.as_ref();
            is_file(k)
                && !crate::is_hidden(std::ffi::OsStr::new(last_component(k)))
                && (!one || k == key)
                && pattern.as_ref().is_none_or(|p| p.matches(k))
        })
        .collect();
    found.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    if let Some(o) = found
        .iter()
        .find(|o| !stores.allow().permits(&ds.url.bucket, o.location.as_ref()))
    {
        return Err(StorageError::S3NotAllowed {
            url: format!("s3://{}/{}", ds.url.bucket, o.location.as_ref()),
            reason: "the pattern matches it, outside --allowed-s3".into(),
        });
    }
    match (found.is_empty(), pattern) {
        // A key that holds pattern characters and matches nothing may be an object's name.
        (true, Some(_)) if is_file(key) => {
            let (objects, _) = list_all(stores, ds, key, false)?;
            let exact: Vec<ObjectMeta> = objects
                .into_iter()
                .filter(|o| o.location.as_ref() == key)
                .collect();
            if exact.is_empty() {
                Err(StorageError::NoMatch {
                    pattern: format!("s3://{}/{key}", ds.url.bucket),
                    ext: ext.to_owned(),
                })
            } else {
                Ok(exact)
            }
        }
        (true, Some(_)) => Err(StorageError::NoMatch {
            pattern: format!("s3://{}/{key}", ds.url.bucket),
            ext: ext.to_owned(),
        }),
        (true, None) => Err(ds.not_found(key)),
        (false, _) => Ok(found),
    }
}

/// The last component of a key or prefix.
fn last_component(key: &str) -> &str {
    key.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}
