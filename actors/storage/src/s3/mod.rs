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

/// A region name: it becomes part of the AWS host name, so only `a-z 0-9 -` are taken
/// (anything else could steer signed requests to another host).
fn check_region(region: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&region.len())
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "region '{region}' must have 1 to 64 characters from a-z 0-9 -"
        ))
    }
}

/// An endpoint in the form endpoints are compared in: `http(s)://host[:port][/path]`, no
/// trailing `/`, host lowercased, no credentials, query or fragment.
pub fn normalize_endpoint(endpoint: &str) -> Result<String, String> {
    let bad = |why: &str| format!("endpoint '{endpoint}' {why}");
    let u = url::Url::parse(endpoint).map_err(|e| bad(&format!("is no url ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("must start with http:// or https://"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("may not carry credentials"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("may not have a query or fragment"));
    }
    Ok(u.as_str().trim_end_matches('/').to_owned())
}

/// Checks the syntax of what an `s3` source names (before any access check): its url, its
/// endpoint and its region. Errors are [`StorageError::S3Invalid`] (the request's fault).
pub fn validate(
    url: &str,
    endpoint: Option<&str>,
    region: Option<&str>,
) -> Result<S3Url, StorageError> {
    let invalid = |reason: String| StorageError::S3Invalid { reason };
    let parsed = S3Url::parse(url).map_err(invalid)?;
    if let Some(e) = endpoint {
        normalize_endpoint(e).map_err(invalid)?;
    }
    if let Some(r) = region {
        check_region(r).map_err(invalid)?;
    }
    Ok(parsed)
}

/// What `s3` sources may name: the `--allowed-s3` prefixes, and the endpoints the server may
/// send its signed requests to (its environment's `AWS_ENDPOINT_URL` and the
/// `--allowed-s3-endpoint` list). A request's `endpoint` receives the server's credentials,
/// so it is tied to the configuration like the buckets are.
#[derive(Clone, Debug, Default)]
pub struct S3Allow {
    prefixes: Vec<S3Url>,
    /// Normalized ([`normalize_endpoint`]).
    endpoints: Vec<String>,
}

impl S3Allow {
    /// `entries` (`s3://bucket[/prefix]`) and `endpoints` (urls), as configured.
    pub fn parse(entries: &[String], endpoints: &[String]) -> Result<Self, String> {
        Ok(S3Allow {
            prefixes: entries
                .iter()
                .map(|e| S3Url::parse(e))
                .collect::<Result<_, _>>()?,
            endpoints: endpoints
                .iter()
                .map(|e| normalize_endpoint(e))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Adds the endpoint of the server's environment (`AWS_ENDPOINT_URL`), where requests
    /// without an `endpoint` go anyway.
    pub fn with_environment(mut self) -> Self {
        let env = AmazonS3Builder::from_env().get_config_value(&AmazonS3ConfigKey::Endpoint);
        if let Some(e) = env.and_then(|e| normalize_endpoint(&e).ok()) {
            self.endpoints.push(e);
        }
        self
    }

    /// Whether `key` of `bucket` lies under an allowed prefix, taken as a folder
    /// (`s3://b/train` allows `train` and `train/...`, not `training/...`).
    pub fn permits(&self, bucket: &str, key: &str) -> bool {
        self.prefixes.iter().any(|a| {
            a.bucket == bucket
                && (a.key.is_empty()
                    || key == a.key.trim_end_matches('/')
                    || key.starts_with(&a.folder()))
        })
    }

    /// Refuses a url outside the list, naming the flag.
    pub fn check(&self, url: &S3Url) -> Result<(), StorageError> {
        if self.prefixes.is_empty() {
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
        let list: Vec<String> = self.prefixes.iter().map(S3Url::to_string).collect();
        Err(StorageError::S3NotAllowed {
            url: url.to_string(),
            reason: format!("it lies outside --allowed-s3 {}", list.join(", ")),
        })
    }

    /// Refuses an endpoint the configuration does not name (no endpoint: the environment's,
    /// or AWS's, always allowed).
    pub fn check_endpoint(&self, endpoint: Option<&str>) -> Result<(), StorageError> {
        let Some(e) = endpoint else { return Ok(()) };
        let normalized =
            normalize_endpoint(e).map_err(|reason| StorageError::S3Invalid { reason })?;
        if self.endpoints.contains(&normalized) {
            return Ok(());
        }
        let allowed = if self.endpoints.is_empty() {
            "none".to_owned()
        } else {
            self.endpoints.join(", ")
        };
        Err(StorageError::S3EndpointNotAllowed {
            endpoint: e.to_owned(),
            reason: format!(
                "the server sends its signed requests (and credentials) only to the endpoints \
                 its configuration names: AWS_ENDPOINT_URL in its environment and \
                 --allowed-s3-endpoint (allowed_s3_endpoints in its configuration file); \
                 allowed: {allowed}"
            ),
        })
    }
}

/// An object as indexed: what a re-index compares.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectVersion {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
}

impl ObjectVersion {
    fn of(meta: &ObjectMeta) -> Self {
        Self {
            key: meta.location.to_string(),
            size: meta.size,
            etag: meta.e_tag.clone(),
        }
    }

    /// The compact stored form of a dataset's objects (postcard).
    pub fn encode_all(objects: &[ObjectVersion]) -> Vec<u8> {
        postcard::to_allocvec(objects).unwrap_or_default()
    }

    pub fn decode_all(bytes: &[u8]) -> Result<Vec<ObjectVersion>, String> {
        postcard::from_bytes(bytes).map_err(|e| e.to_string())
    }
}

/// At most this many keys of each kind are named in [`ObjectChanges`] (the counts are whole).
pub const CHANGES_LISTED: usize = 100;

/// What a re-index found: objects added, removed, and changed (another size or ETag) since
/// the previous index.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ObjectChanges {
    pub added: u64,
    pub removed: u64,
    pub changed: u64,
    pub unchanged: u64,
    /// The first keys added, removed and changed (at most 100 of each, sorted).
    pub added_keys: Vec<String>,
    pub removed_keys: Vec<String>,
    pub changed_keys: Vec<String>,
}

impl ObjectChanges {
    /// Compares two object lists sorted by key.
    pub fn between(old: &[ObjectVersion], new: &[ObjectVersion]) -> Self {
        let mut c = ObjectChanges::default();
        let note = |n: &mut u64, keys: &mut Vec<String>, key: &str| {
            *n += 1;
            if keys.len() < CHANGES_LISTED {
                keys.push(key.to_owned());
            }
        };
        let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => return c,
                (Some(o), None) => {
                    note(&mut c.removed, &mut c.removed_keys, &o.key);
                    a.next();
                }
                (None, Some(n)) => {
                    note(&mut c.added, &mut c.added_keys, &n.key);
                    b.next();
                }
                (Some(o), Some(n)) => match o.key.cmp(&n.key) {
                    std::cmp::Ordering::Less => {
                        note(&mut c.removed, &mut c.removed_keys, &o.key);
                        a.next();
                    }
                    std::cmp::Ordering::Greater => {
                        note(&mut c.added, &mut c.added_keys, &n.key);
                        b.next();
                    }
                    std::cmp::Ordering::Equal => {
                        if o.size != n.size || o.etag != n.etag {
                            note(&mut c.changed, &mut c.changed_keys, &n.key);
                        } else {
                            c.unchanged += 1;
                        }
                        a.next();
                        b.next();
                    }
                },
            }
        }
    }
}

/// An indexed `s3` source: its index, and the objects it was made of, sorted by key.
pub struct S3Index {
    pub index: DatasetIndex,
    pub objects: Vec<ObjectVersion>,
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
            // Checked against the allowed endpoints in this form.
            b = b.with_endpoint(normalize_endpoint(e).unwrap_or_else(|_| e.to_owned()));
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
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
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
        return Err(StorageError::NotFound {
            path: PathBuf::from(ds.url.to_string()),
        });
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

fn index_shards(
    stores: &ObjectStores,
    ds: &S3Dataset,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
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
    let index = items.finish(
        classes,
        shards
            .iter()
            .map(|s| PathBuf::from(s.location.to_string()))
            .collect(),
    );
    Ok((index, shards.iter().map(ObjectVersion::of).collect()))
}

/// A manifest: the manifest object is read as a stream; the objects it names are then found
/// with one paginated listing of their longest common folder (a key the listing lacks fails
/// the dataset, as a missing file fails a local manifest), which also gives their sizes and
/// ETags.
fn index_manifest(
    stores: &ObjectStores,
    ds: &S3Dataset,
    progress: &mut Progress<'_>,
) -> Result<(DatasetIndex, Vec<ObjectVersion>), StorageError> {
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
            return Err(StorageError::NotFound {
                path: PathBuf::from(ds.name(missing)),
            });
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
        let allow = S3Allow::parse(
            &["s3://bkt/train".into(), "s3://other".into()],
            &["http://127.0.0.1:9000/".into()],
        )
        .unwrap();
        assert!(allow.check_endpoint(None).is_ok());
        assert!(allow.check_endpoint(Some("http://127.0.0.1:9000")).is_ok());
        let e = allow
            .check_endpoint(Some("http://evil.example:9000"))
            .unwrap_err();
        assert_eq!(e.code(), "endpoint_not_allowed");
        assert!(e.to_string().contains("--allowed-s3-endpoint"), "{e}");
        assert_eq!(
            validate("s3://bkt/x", None, Some("evil.com/"))
                .unwrap_err()
                .code(),
            "invalid_s3_source"
        );
        assert_eq!(
            validate("s3:/bkt", None, None).unwrap_err().code(),
            "invalid_s3_source"
        );
        assert!(validate("s3://bkt/x", Some("ftp://h"), None).is_err());
        assert!(validate("s3://bkt/x", Some("http://u:p@h"), None).is_err());
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

    #[test]
    fn a_reindex_compares_keys_sizes_and_etags() {
        let v = |key: &str, size: u64, etag: Option<&str>| ObjectVersion {
            key: key.into(),
            size,
            etag: etag.map(Into::into),
        };
        let old = [
            v("a", 1, Some("1")),
            v("b", 2, Some("2")),
            v("c", 3, None),
            v("d", 4, Some("4")),
        ];
        let new = [
            v("a", 1, Some("1")),
            v("b", 2, Some("2b")),
            v("d", 5, Some("4")),
            v("e", 6, None),
        ];
        let c = ObjectChanges::between(&old, &new);
        assert_eq!((c.added, c.removed, c.changed, c.unchanged), (1, 1, 2, 1));
        assert_eq!(c.added_keys, ["e"]);
        assert_eq!(c.removed_keys, ["c"]);
        assert_eq!(c.changed_keys, ["b", "d"]);
        let bytes = ObjectVersion::encode_all(&new);
        assert_eq!(ObjectVersion::decode_all(&bytes).unwrap(), new);
        // Many added: all counted, the first CHANGES_LISTED named.
        let many: Vec<_> = (0..250).map(|i| v(&format!("k{i:03}"), 1, None)).collect();
        let c = ObjectChanges::between(&[], &many);
        assert_eq!(c.added, 250);
        assert_eq!(c.added_keys.len(), CHANGES_LISTED);
        assert_eq!(c.added_keys[0], "k000");
    }
}
