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
//!
//! **Every key an index records lies under one of the server's `--allowed-s3` prefixes**,
//! checked before any request and for each manifest entry. Credentials come only from the
//! server's environment (`AmazonS3Builder::from_env`); with none configured, opening fails at
//! once instead of probing instance metadata, and error messages never carry them.
//!
//! Items record object keys where local sources record paths (`Location::File` is the key,
//! shards are keys), so the index and its persisted form are the local ones.

mod fetch;
mod stats;

use std::fmt;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as Key;
use object_store::{ClientConfigKey, GetOptions, GetRange, ObjectMeta, ObjectStore, RetryConfig};
use serde::{Deserialize, Serialize};

use super::index::IndexBuilder;
use super::{
    DatasetIndex, Progress, StorageError, has_image_extension, is_hidden, manifest, tar_shards,
};

pub use fetch::{Done, FetchConfig, ObjectStores, S3Source};
pub use stats::{ERROR_KINDS, LATENCY_BUCKETS, ObjectStats, Op};

/// How the objects under an `s3` source's url make a dataset.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum S3Layout {
    ImageFolder,
    TarShards,
    Manifest,
}

/// `s3://bucket/key`, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    /// The key or key prefix (no leading `/`; may be empty).
    pub key: String,
}

impl S3Url {
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("'{url}' is not an s3:// url (s3://bucket/prefix)"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(format!(
                "'{url}' names no valid bucket (3 to 63 characters from a-z 0-9 . -)"
            ));
        }
        if key.split('/').any(|c| c == "." || c == "..") {
            return Err(format!("'{url}': a key may not contain . or .. components"));
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }

    /// The key as a folder prefix: empty, or ending in `/`.
    fn folder(&self) -> String {
        folder_of(&self.key)
    }
}

fn folder_of(key: &str) -> String {
    if key.is_empty() || key.ends_with('/') {
        key.to_owned()
    } else {
        format!("{key}/")
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// The `--allowed-s3` list: what `s3` sources may name.
#[derive(Clone, Debug, Default)]
pub struct S3Allow(Vec<S3Url>);

impl S3Allow {
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|e| S3Url::parse(e))
            .collect::<Result<_, _>>()
            .map(S3Allow)
    }

    /// Whether `key` of `bucket` lies under an allowed prefix, taken as a folder
    /// (`s3://b/train` allows `train` and `train/...`, not `training/...`).
    pub fn permits(&self, bucket: &str, key: &str) -> bool {
        self.0.iter().any(|a| {
            a.bucket == bucket
                && (a.key.is_empty()
                    || key == a.key.trim_end_matches('/')
                    || key.starts_with(&a.folder()))
        })
    }

    /// Refuses a url outside the list, naming the flag.
    pub fn check(&self, url: &S3Url) -> Result<(), StorageError> {
        if self.0.is_empty() {
            return Err(StorageError::S3NotAllowed {
                url: url.to_string(),
                reason: "this server reads no object store: start it with --allowed-s3 \
                         s3://bucket[/prefix] (or allowed_s3 in its configuration file)"
                    .into(),
            });
        }
        if self.permits(&url.bucket, &url.key) {
            return Ok(());
        }
        let list: Vec<String> = self.0.iter().map(S3Url::to_string).collect();
        Err(StorageError::S3NotAllowed {
            url: url.to_string(),
            reason: format!("it lies outside --allowed-s3 {}", list.join(", ")),
        })
    }
}

/// One bucket opened with the server's credentials.
pub struct S3Dataset {
    url: S3Url,
    store: AmazonS3,
    /// Secrets that must never appear in a message (a store may echo them in an error body).
    secrets: Vec<String>,
}

impl S3Dataset {
    /// Opens the bucket of `url`. Fails at once when the environment holds no credentials.
    pub fn open(
        url: &S3Url,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> Result<Self, StorageError> {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&url.bucket)
            // Retries are the fetch stage's (counted, within its budget, never on 4xx).
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        if let Some(e) = endpoint {
            b = b.with_endpoint(e);
        }
        if let Some(r) = region {
            b = b.with_region(r);
        }
        let value = |k: AmazonS3ConfigKey| b.get_config_value(&k).filter(|v| !v.is_empty());
        let bad = |reason: String| StorageError::S3Credentials { reason };
        let (key, secret) = (
            value(AmazonS3ConfigKey::AccessKeyId),
            value(AmazonS3ConfigKey::SecretAccessKey),
        );
        let web_identity = value(AmazonS3ConfigKey::WebIdentityTokenFile).is_some()
            && value(AmazonS3ConfigKey::RoleArn).is_some();
        let container = value(AmazonS3ConfigKey::ContainerCredentialsRelativeUri).is_some()
            || value(AmazonS3ConfigKey::ContainerCredentialsFullUri).is_some();
        let unsigned = value(AmazonS3ConfigKey::SkipSignature).as_deref() == Some("true");
        match (&key, &secret) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(bad(
                    "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the server's \
                     environment"
                        .into(),
                ));
            }
            (None, None) if !(web_identity || container || unsigned) => {
                return Err(bad(
                    "the server's environment holds no credentials: set AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or \
                     AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or AWS_SKIP_SIGNATURE=true \
                     for a public bucket; instance metadata is not probed"
                        .into(),
                ));
            }
            _ => {}
        }
        let target = value(AmazonS3ConfigKey::Endpoint);
        let http_allowed = value(AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
            .is_some_and(|v| v == "true");
        if target.as_deref().is_some_and(|e| e.starts_with("http://")) && !http_allowed {
            return Err(bad(format!(
                "the endpoint {} is plain http: set AWS_ALLOW_HTTP=true in the server's \
                 environment to allow it",
                target.unwrap_or_default()
            )));
        }
        let secrets = [key, secret, value(AmazonS3ConfigKey::Token)]
            .into_iter()
            .flatten()
            .filter(|s| s.len() >= 4)
            .collect();
        let store = b.build().map_err(|e| StorageError::Remote {
            url: url.to_string(),
            code: "s3_config",
            message: e.to_string().to_lowercase(),
        })?;
        Ok(Self {
            url: url.clone(),
            store,
            secrets,
        })
    }

    /// `s3://bucket/key`.
    fn name(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.url.bucket)
    }

    /// `message` with every credential replaced.
    fn redact(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for s in &self.secrets {
            out = out.replace(s.as_str(), "***");
        }
        out
    }
}

/// The object path of a key recorded in an index.
fn object_key(key: &str) -> Key {
    Key::parse(key).unwrap_or_else(|_| Key::from(key))
}

/// Indexes an `s3` source (blocking: runs the requests on the fetch stage's runtime).
pub(super) fn index(
    stores: &ObjectStores,
    dataset: &S3Dataset,
    layout: S3Layout,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    stores.allow().check(&dataset.url)?;
    match layout {
        S3Layout::ImageFolder => index_folder(stores, dataset, progress),
        S3Layout::TarShards => index_shards(stores, dataset, progress),
        S3Layout::Manifest => index_manifest(stores, dataset, progress),
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

/// The last component of a key or prefix.
fn last_component(key: &str) -> &str {
    key.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

fn index_folder(
    stores: &ObjectStores,
    ds: &S3Dataset,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
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
        return Err(StorageError::NotFound {
            path: PathBuf::from(ds.url.to_string()),
        });
    }
    let mut items = IndexBuilder::files();
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
            found.push((dir, (*name).to_owned(), key));
        }
        found.sort();
        for (_, _, key) in found {
            items.push_file(Path::new(&key), label);
            progress.tick()?;
        }
    }
    Ok(items.finish(classes, Vec::new()))
}

fn index_shards(
    stores: &ObjectStores,
    ds: &S3Dataset,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let is_tar = |k: &str| {
        Path::new(k)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("tar"))
    };
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
        return Err(StorageError::NotFound {
            path: PathBuf::from(ds.url.to_string()),
        });
    }
    let mut items = IndexBuilder::members();
    for (n, shard) in shards.iter().enumerate() {
        let n = u32::try_from(n).map_err(|_| StorageError::TooManyItems)?;
        let key = shard.location.to_string();
        let name = PathBuf::from(ds.name(&key));
        let reader = StreamRead::new(stores, ds, shard);
        let mut archive = tar::Archive::new(BufReader::with_capacity(1 << 16, reader));
        let entries = archive.entries().map_err(|e| StorageError::BadShard {
            path: name.clone(),
            reason: e.to_string().to_lowercase(),
        })?;
        tar_shards::index_entries(n, &name, shard.size, entries, &mut items, progress)?;
    }
    let classes = super::numeric_classes(items.labels_mut());
    Ok(items.finish(
        classes,
        shards
            .iter()
            .map(|s| PathBuf::from(s.location.to_string()))
            .collect(),
    ))
}

fn index_manifest(
    stores: &ObjectStores,
    ds: &S3Dataset,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let key = ds.url.key.clone();
    let (objects, _) = list_all(stores, ds, &key, false)?;
    let Some(meta) = objects.into_iter().find(|o| o.location.as_ref() == key) else {
        return Err(StorageError::NotFound {
            path: PathBuf::from(ds.url.to_string()),
        });
    };
    let base = match key.rfind('/') {
        Some(i) => key[..=i].to_owned(),
        None => String::new(),
    };
    let allow = stores.allow();
    let bucket = ds.url.bucket.clone();
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
        Ok(PathBuf::from(full))
    };
    let reader = BufReader::with_capacity(1 << 16, StreamRead::new(stores, ds, &meta));
    manifest::index_reader(
        &PathBuf::from(ds.url.to_string()),
        reader,
        &mut resolve,
        progress,
    )
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

/// A blocking reader of one object's bytes, streamed by the fetch stage's runtime (the
/// indexing thread is no async context). A stream that breaks resumes with a ranged GET
/// from where it stopped, on the listed ETag, until no byte has come for the retry budget.
struct StreamRead<'a> {
    stores: &'a ObjectStores,
    ds: &'a S3Dataset,
    key: String,
    etag: Option<String>,
    size: u64,
    pos: u64,
    stream: Option<BoxStream<'static, object_store::Result<bytes::Bytes>>>,
    buf: bytes::Bytes,
    progressed: Instant,
}

impl<'a> StreamRead<'a> {
    fn new(stores: &'a ObjectStores, ds: &'a S3Dataset, meta: &ObjectMeta) -> Self {
        Self {
            stores,
            ds,
            key: meta.location.to_string(),
            etag: meta.e_tag.clone(),
            size: meta.size,
            pos: 0,
            stream: None,
            buf: Default::default(),
            progressed: Instant::now(),
        }
    }
}

impl Read for StreamRead<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.buf.is_empty() {
                let n = out.len().min(self.buf.len());
                out[..n].copy_from_slice(&self.buf[..n]);
                let _ = self.buf.split_to(n);
                self.pos += n as u64;
                return Ok(n);
            }
            if self.pos >= self.size {
                return Ok(0);
            }
            let remote = self.stores.remote();
            if self.stream.is_none() {
                let options = GetOptions {
                    range: Some(GetRange::Offset(self.pos)),
                    if_match: self.etag.clone(),
                    ..GetOptions::default()
                };
                let key = object_key(&self.key);
                let ds = self.ds;
                let got = self
                    .stores
                    .block_on(remote.call(ds, &self.key, Op::Get, || {
                        ds.store.get_opts(&key, options.clone())
                    }))
                    .map_err(std::io::Error::other)?;
                self.stream = Some(got.into_stream());
            }
            let next = self
                .stores
                .block_on(self.stream.as_mut().expect("opened above").next());
            match next {
                Some(Ok(bytes)) => {
                    remote
                        .stats()
                        .bytes
                        .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    self.buf = bytes;
                    self.progressed = Instant::now();
                }
                Some(Err(e)) => {
                    self.stream = None;
                    if self.progressed.elapsed() > self.stores.config().budget {
                        return Err(std::io::Error::other(self.ds.redact(&e.to_string())));
                    }
                    remote
                        .stats()
                        .retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                None => {
                    self.stream = None;
                    if self.progressed.elapsed() > self.stores.config().budget {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the object stream ended early",
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_the_allowed_list() {
        let u = S3Url::parse("s3://my-bucket/train/x").unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.key.as_str()),
            ("my-bucket", "train/x")
        );
        assert!(S3Url::parse("http://b/x").is_err());
        assert!(S3Url::parse("s3://B/x").is_err());
        assert!(S3Url::parse("s3://bkt/a/../b").is_err());
        let allow = S3Allow::parse(&["s3://bkt/train".into(), "s3://other".into()]).unwrap();
        assert!(allow.permits("bkt", "train"));
        assert!(allow.permits("bkt", "train/a.jpg"));
        assert!(!allow.permits("bkt", "training/a.jpg"));
        assert!(!allow.permits("bkt", "val/a.jpg"));
        assert!(allow.permits("other", "anything/at/all"));
        let e = S3Allow::default()
            .check(&S3Url::parse("s3://bkt/train").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("--allowed-s3"), "{e}");
        let e = allow
            .check(&S3Url::parse("s3://nope/x").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("s3://bkt/train"), "{e}");
    }

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
