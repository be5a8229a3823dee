//! Storage backends: turn a dataset source into a [`DatasetIndex`] (a dense list of items,
//! each a location and a label, stored by column: see `index.rs`) once, then read any item's
//! stored bytes by id.
//!
//! Plain blocking code, no actix: indexing runs in the background and reads run on the
//! Loader's worker pool.
//!
//! Four local source kinds ([`SourceSpec`]):
//! - `image_folder`: the torchvision `ImageFolder` layout. Classes are the sub-folders of the
//!   root, sorted by name; an image's label is its class's position. Files are found
//!   recursively in each class folder, ordered like torchvision (by folder, then file name),
//!   and kept when their extension is `.jpg`, `.jpeg` or `.png` (any case). Unlike
//!   torchvision, hidden entries (names starting with `.`) are skipped, so that
//!   `.ipynb_checkpoints` or `._x.jpg` never become classes or images.
//! - `tar_shards`: the WebDataset convention. Members are grouped into samples by key (the
//!   member path up to the first dot of its file name), consecutive members with one key
//!   forming one sample; a sample is its first `.jpg`/`.jpeg`/`.png` member plus a `.cls`
//!   member holding a decimal label. Samples without an image are skipped; an image without
//!   a label is an error. Byte offsets are recorded once, so reads are random access.
//!   With `fields` (see [`fields`]), every key is a sample whose members are matched to
//!   the declared fields by extension, an item is the key's whole byte range (members and
//!   headers: one read), and a key missing a declared field fails the indexing.
//! - `manifest`: a CSV (`path,label`, optional `path,label` header, RFC 4180 quoting) or
//!   JSON lines (`{"path": ..., "label": ...}`, extra fields ignored; a `.json` file may also
//!   be one JSON array of such objects). Relative paths resolve against the manifest's
//!   folder. Items keep the manifest's order. With `fields`, columns (a CSV then has a
//!   header) or keys name the image, the class and small fields: a `text`/`json` value is
//!   the cell, kept in the index; an `npy`/`bytes` cell names a file, resolved as the
//!   image's path is and read when the element is loaded.
//! - `parquet`: Parquet files (or folders of them, not recursive) as the Hugging Face Hub
//!   stores image datasets: an image column (Hugging Face's `{bytes, path}` struct, or
//!   binary) and an integer class column (`label` unless a `class` field names another),
//!   with the class names of the files' `huggingface` metadata (`ClassLabel`) when present.
//!   Items are rows, in file, row group and row order (see `parquet/`). With `fields`, other
//!   columns are small fields, read from the item's row (`parquet/small.rs`).
//!
//! Labels and classes: **`classes[label]` is always the name of `label`.** Folder classes
//! are folder names; Parquet classes are the `ClassLabel` names when the files carry them.
//! Numeric labels (tar `.cls`, numeric manifest labels, Parquet class columns) must lie in
//! `0..MAX_NUMERIC_LABEL`, and `classes` is then `"0", "1", ..., "max"`. Text manifest labels
//! are class names: sorted, and the label is the position.
//!
//! - `s3`: an S3-compatible object store, in any of the four layouts above (see `s3/`);
//!   indexed and read through the server's [`s3::ObjectStores`], not through [`index()`];
//!   what it fetches may be kept on local disk by the [`tier`] (`--disk-cache`).
//!
//! **Every path is canonicalized (symlinks and `..` resolved) and must lie under one of the
//! allowed roots**: the source paths, each manifest entry and each symlink target met while
//! walking. The check happens at indexing time; items record canonical paths.
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

pub mod fields;
mod folder;
#[cfg(test)]
mod fuzz;
mod index;
mod manifest;
mod parquet;
mod roots;
pub mod s3;
mod tar_shards;
#[cfg(test)]
mod tests;
pub mod tier;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use fields::{FieldKind, FieldValues, Fields};
use roots::Roots;

pub use index::{DatasetIndex, IndexFormatError, Location};
pub use parquet::ParquetReads;

/// Numeric labels must be below this (their class list is `0..=max`).
pub const MAX_NUMERIC_LABEL: i64 = 1 << 20;

/// Largest tar member read into memory (guards against a damaged persisted index).
pub(crate) const MAX_MEMBER_LEN: u64 = 1 << 32;

/// How often (in items) indexing reports progress.
const PROGRESS_EVERY: u64 = 256;

/// Where a dataset comes from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// torchvision `ImageFolder`: one folder per class.
    ImageFolder {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        path: PathBuf,
    },
    /// WebDataset tar shards: each path is a `.tar` file or a folder of them.
    TarShards {
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
        paths: Vec<PathBuf>,
        /// The sample's fields, each `from` member extensions separated by `;` (WebDataset
        /// names a key's members `0001.jpg`, `0001.txt`): one of kind `image` (default
        /// `jpg;jpeg;png;webp`), at most one `class` (default `cls`; without one every
        /// label is 0), and `text`, `json`, `npy`, `bytes` fields (default: the field's
        /// name). Every key is then a sample and a key missing a declared field fails the
        /// indexing, naming it. Default: the image and the `.cls` label.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(value_type = Option<std::collections::BTreeMap<String, fields::FieldSpec>>)
        )]
        fields: Option<fields::Fields>,
    },
    /// A CSV or JSON-lines list of `path, label`.
    Manifest {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        path: PathBuf,
        /// The sample's fields, each `from` a CSV column (the CSV then needs a header) or a
        /// JSON key: one of kind `image` (default `path`), at most one `class` (default
        /// `label`; without one every label is 0), and `text` or `json` fields, whose values
        /// are the cells, or `npy` or `bytes` fields, whose cells name files (relative to the
        /// manifest's folder or absolute, under the allowed roots) read when the element is
        /// loaded (default: the field's name). An entry missing a declared field, or whose
        /// field's file is missing, fails the indexing, naming its line. Default: `path` and
        /// `label`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(value_type = Option<std::collections::BTreeMap<String, fields::FieldSpec>>)
        )]
        fields: Option<fields::Fields>,
    },
    /// An S3-compatible object store: `url` is `s3://bucket/prefix` (for `manifest`, the
    /// manifest object). Credentials come from the server's environment, never from here.
    S3 {
        url: String,
        layout: s3::S3Layout,
        /// The store's address (MinIO, Garage, Ceph RGW, R2); default: `AWS_ENDPOINT_URL`,
        /// else AWS.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
        /// Default: `AWS_REGION`, else `us-east-1`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        region: Option<String>,
        /// The sample's fields, as for the local layout of the same name (`tar_shards`:
        /// member extensions; `manifest`: columns or keys, `text` and `json` only;
        /// `parquet`: top-level columns); an `image_folder` takes none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(value_type = Option<std::collections::BTreeMap<String, fields::FieldSpec>>)
        )]
        fields: Option<fields::Fields>,
    },
    /// Parquet files as the Hugging Face Hub stores image datasets: each path is a
    /// `.parquet` file or a folder of them (not recursive; name one split's files).
    Parquet {
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
        paths: Vec<PathBuf>,
        /// The sample's fields, each `from` a top-level column: one of kind `image`, at most
        /// one `class`, and `text`, `json`, `npy`, `bytes` fields (binary or string columns
        /// give their bytes; a struct or list column a `json` document, a list of numbers an
        /// `npy` array). Default: the column Hugging Face's metadata types as `Image`, else
        /// the first one holding Hugging Face's image struct `{bytes, path}` or binary; and
        /// the `label` column.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(value_type = Option<std::collections::BTreeMap<String, fields::FieldSpec>>)
        )]
        fields: Option<fields::Fields>,
    },
}

/// Why indexing or reading failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("path {} is outside the allowed roots", path.display())]
    OutsideRoots { path: PathBuf },
    #[error("not found: {}", path.display())]
    NotFound { path: PathBuf },
    #[error("not a directory: {}", path.display())]
    NotADirectory { path: PathBuf },
    #[error("the dataset is empty: no image found")]
    Empty,
    #[error("bad manifest {} line {line}: {reason}", path.display())]
    BadManifest {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("bad shard {}: {reason}", path.display())]
    BadShard { path: PathBuf, reason: String },
    #[error("bad Parquet file {}: {reason}", path.display())]
    BadParquet { path: PathBuf, reason: String },
    #[error("bad label for {what}: {reason}")]
    BadLabel { what: String, reason: String },
    /// A declaration of fields the source kind cannot follow.
    #[error("bad fields: {reason}")]
    BadFields { reason: String },
    /// A sample lacks a declared field (indexing).
    #[error("{key}: no member or value for the declared field `{field}`")]
    MissingField { key: String, field: String },
    /// An element's field is not what its kind says (reading).
    #[error("{what}: field `{field}` is {reason}")]
    BadField {
        what: String,
        field: String,
        reason: String,
    },
    #[error("too many items: a dataset holds at most {} items", u32::MAX)]
    TooManyItems,
    #[error("no item {id}: the dataset has {len} items")]
    NoSuchItem { id: u32, len: usize },
    #[error("cannot read {}: {source}", path.display())]
    ReadFailed {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("i/o error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{url} may not be read: {reason}")]
    S3NotAllowed { url: String, reason: String },
    /// An `s3` source that names no valid url, endpoint or region.
    #[error("invalid s3 source: {reason}")]
    S3Invalid { reason: String },
    #[error("endpoint {endpoint} may not be used: {reason}")]
    S3EndpointNotAllowed { endpoint: String, reason: String },
    #[error("no credentials for the object store: {reason}")]
    S3Credentials { reason: String },
    #[error("{url}: {message}")]
    Remote {
        url: String,
        /// `not_found`, `access_denied`, `refused` (another 4xx), `unavailable` (5xx,
        /// connection or timeouts past the retry budget), `s3_config`.
        code: &'static str,
        message: String,
    },
}

impl StorageError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StorageError::OutsideRoots { .. } => "outside_roots",
            StorageError::NotFound { .. } => "not_found",
            StorageError::NotADirectory { .. } => "not_a_directory",
            StorageError::Empty => "empty_dataset",
            StorageError::BadManifest { .. } => "bad_manifest",
            StorageError::BadShard { .. } => "bad_shard",
            StorageError::BadParquet { .. } => "bad_parquet",
            StorageError::BadLabel { .. } => "bad_label",
            StorageError::BadFields { .. } => "bad_fields",
            StorageError::MissingField { .. } => "missing_field",
            StorageError::BadField { .. } => "bad_field",
            StorageError::TooManyItems => "too_many_items",
            StorageError::NoSuchItem { .. } => "no_such_item",
            StorageError::ReadFailed { .. } => "read_failed",
            StorageError::Io { .. } => "io_error",
            StorageError::S3NotAllowed { .. } => "s3_not_allowed",
            StorageError::S3Invalid { .. } => "invalid_s3_source",
            StorageError::S3EndpointNotAllowed { .. } => "endpoint_not_allowed",
            StorageError::S3Credentials { .. } => "no_credentials",
            StorageError::Remote {
                code: "not_found", ..
            } => "not_found",
            StorageError::Remote { code, .. } => match *code {
                "access_denied" => "access_denied",
                "unavailable" => "s3_unavailable",
                "s3_config" => "s3_config",
                _ => "s3_refused",
            },
        }
    }

    /// An I/O error met while indexing `path`.
    fn io(path: &Path, source: io::Error) -> Self {
        Self::missing_or(path, source, |path, source| StorageError::Io {
            path,
            source,
        })
    }

    /// An I/O error met while reading an item from `path`.
    fn read(path: &Path, source: io::Error) -> Self {
        Self::missing_or(path, source, |path, source| StorageError::ReadFailed {
            path,
            source,
        })
    }

    /// `NotFound` when `source` says `path` is missing, else `other`.
    fn missing_or(path: &Path, source: io::Error, other: fn(PathBuf, io::Error) -> Self) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            StorageError::NotFound {
                path: path.to_owned(),
            }
        } else {
            other(path.to_owned(), source)
        }
    }
}

/// Indexes a source. `progress` is called with the number of items indexed so far, every
/// few hundred items and once at the end.
pub fn index(
    spec: &SourceSpec,
    allowed_roots: &[PathBuf],
    progress: &mut dyn FnMut(u64),
) -> Result<DatasetIndex, StorageError> {
    spec.check_fields()?;
    let roots = Roots::new(allowed_roots);
    let mut counter = Progress {
        count: 0,
        report: progress,
    };
    let index = match spec {
        SourceSpec::ImageFolder { path } => folder::index(path, &roots, &mut counter)?,
        SourceSpec::TarShards { paths, fields } => {
            tar_shards::index(paths, fields.as_ref(), &roots, &mut counter)?
        }
        SourceSpec::Manifest { path, fields } => {
            manifest::index(path, fields.as_ref(), &roots, &mut counter)?
        }
        SourceSpec::Parquet { paths, fields } => {
            parquet::index(paths, fields.as_ref(), &roots, &mut counter)?
        }
        SourceSpec::S3 { url, .. } => {
            return Err(StorageError::S3NotAllowed {
                url: url.clone(),
                reason: "an s3 source is indexed by the server's object-store stage".into(),
            });
        }
    };
    finish_index(index, &mut counter)
}

/// The checks every finished index passes, and the last progress report.
fn finish_index(
    index: DatasetIndex,
    counter: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    if index.is_empty() {
        return Err(StorageError::Empty);
    }
    if u32::try_from(index.len()).is_err() {
        return Err(StorageError::TooManyItems);
    }
    (counter.report)(index.len() as u64);
    Ok(index)
}

/// Counts indexed items and reports every `PROGRESS_EVERY`.
struct Progress<'a> {
    count: u64,
    report: &'a mut dyn FnMut(u64),
}

impl Progress<'_> {
    fn tick(&mut self) -> Result<(), StorageError> {
        self.count += 1;
        if self.count > u64::from(u32::MAX) {
            return Err(StorageError::TooManyItems);
        }
        if self.count.is_multiple_of(PROGRESS_EVERY) {
            (self.report)(self.count);
        }
        Ok(())
    }
}

/// A numeric label, checked to lie in `0..MAX_NUMERIC_LABEL`; -1 is an unlabelled item
/// ([`index::NO_CLASS`]).
fn numeric_label(label: i64, what: &dyn Fn() -> String) -> Result<u32, StorageError> {
    if (0..MAX_NUMERIC_LABEL).contains(&label) {
        Ok(label as u32)
    } else if label == -1 {
        Ok(index::NO_CLASS)
    } else {
        Err(StorageError::BadLabel {
            what: what(),
            reason: format!(
                "numeric label {label} is not in 0..{MAX_NUMERIC_LABEL} (or -1: unlabelled)"
            ),
        })
    }
}

/// The class list of numeric labels: `"0"..="max"` (unlabelled items name no class).
fn numeric_classes(labels: &[u32]) -> Vec<String> {
    labels
        .iter()
        .filter(|&&l| l != index::NO_CLASS)
        .max()
        .map_or_else(Vec::new, |&max| (0..=max).map(|l| l.to_string()).collect())
}

impl DatasetIndex {
    /// A human-readable location of item `id` (a path, or `shard.tar@offset+len`), for error
    /// listings.
    pub fn describe(&self, id: u32) -> Option<String> {
        Some(match self.location(id)? {
            Location::File(p) => p.display().to_string(),
            Location::TarMember { shard, offset, len } => {
                let shard = self
                    .shards()
                    .get(shard as usize)
                    .map_or_else(|| format!("shard {shard}"), |p| p.display().to_string());
                format!("{shard}@{offset}+{len}")
            }
            Location::ParquetRow {
                file,
                row_group,
                row,
            } => {
                let file = self
                    .shards()
                    .get(file as usize)
                    .map_or_else(|| format!("file {file}"), |p| p.display().to_string());
                format!("{file} row group {row_group} row {row}")
            }
        })
    }

    /// What the reads of a `parquet` dataset have cost so far (`None` for other sources).
    pub fn parquet_reads(&self) -> Option<ParquetReads> {
        self.rows_info().map(|info| info.reader.reads())
    }

    /// Drops the decoded rows a `parquet` dataset's reads keep (at most 64 MiB), as an epoch
    /// over a dataset larger than that does: the benchmarks' way to measure reads of rows
    /// located in their pages. Reads stay correct either way.
    pub fn parquet_drop_decoded(&self) {
        if let Some(info) = self.rows_info() {
            info.reader.drop_decoded();
        }
    }

    /// Reads the stored bytes of item `id` (blocking).
    pub fn read(&self, id: u32) -> Result<Vec<u8>, StorageError> {
        let location = self.location(id).ok_or(StorageError::NoSuchItem {
            id,
            len: self.len(),
        })?;
        match location {
            Location::File(path) => std::fs::read(path).map_err(|e| StorageError::read(path, e)),
            Location::TarMember { shard, offset, len } => {
                let path =
                    self.shards()
                        .get(shard as usize)
                        .ok_or_else(|| StorageError::ReadFailed {
                            path: PathBuf::from(format!("shard {shard}")),
                            source: io::Error::new(io::ErrorKind::InvalidData, "no such shard"),
                        })?;
                let file = File::open(path).map_err(|e| StorageError::read(path, e))?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|l| *l as u64 <= MAX_MEMBER_LEN)
                    .ok_or_else(|| StorageError::ReadFailed {
                        path: path.clone(),
                        source: io::Error::new(io::ErrorKind::InvalidData, "member too large"),
                    })?;
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, offset).map_err(|e| {
                    let source = if e.kind() == io::ErrorKind::UnexpectedEof {
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "shard is shorter than its index says (truncated?)",
                        )
                    } else {
                        e
                    };
                    StorageError::ReadFailed {
                        path: path.clone(),
                        source,
                    }
                })?;
                Ok(buf)
            }
            Location::ParquetRow {
                file,
                row_group,
                row,
            } => {
                let path = self.shards().get(file as usize);
                match (path, self.rows_info()) {
                    (Some(path), Some(info)) => parquet::read(path, file, info, row_group, row),
                    _ => Err(StorageError::ReadFailed {
                        path: PathBuf::from(format!("file {file}")),
                        source: io::Error::new(io::ErrorKind::InvalidData, "no such file"),
                    }),
                }
            }
        }
    }
}

/// An element's stored bytes split into its image and its small fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The image's stored (encoded) bytes.
    pub image: Vec<u8>,
    /// The small fields, in name order, each value checked against its kind.
    pub fields: Vec<SampleField>,
}

/// One small field of an element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleField {
    pub name: String,
    pub kind: FieldKind,
    /// The field declares a fixed shape (`npy`).
    pub fixed_shape: bool,
    pub value: Vec<u8>,
}

impl DatasetIndex {
    /// True if the source declares small fields (text, JSON, `.npy`, bytes).
    pub fn has_small_fields(&self) -> bool {
        self.sample_fields()
            .is_some_and(|s| s.fields().small().next().is_some())
    }

    /// The small fields of Parquet row `id`, read from its row group's columns.
    fn row_fields(&self, id: u32, declared: &Fields) -> Result<FieldValues, StorageError> {
        let no_such_item = || StorageError::NoSuchItem {
            id,
            len: self.len(),
        };
        let Some(Location::ParquetRow {
            file,
            row_group,
            row,
        }) = self.location(id)
        else {
            return Err(no_such_item());
        };
        let info = self.rows_info().ok_or_else(no_such_item)?;
        let path = self.shards().get(file as usize).ok_or_else(no_such_item)?;
        parquet::read_fields(path, file, info, row_group, row, declared)
    }

    /// Splits what [`DatasetIndex::read`] gave for item `id` into its image and small
    /// fields, checking each value against its kind (`BadField` when it is not what the kind
    /// says, or missing). Without `fields`, the bytes are the image.
    pub fn split(&self, id: u32, stored: Vec<u8>) -> Result<Sample, StorageError> {
        let Some(sample) = self.sample_fields() else {
            return Ok(Sample {
                image: stored,
                fields: Vec::new(),
            });
        };
        let what = || self.describe(id).unwrap_or_else(|| format!("item {id}"));
        let declared = sample.fields();
        let small: Vec<_> = declared.small().collect();
        let (image, values) = if sample.columns {
            (stored, self.row_fields(id, declared)?)
        } else if sample.keys {
            tar_shards::key_members(&stored, declared).map_err(|reason| StorageError::BadField {
                what: what(),
                field: declared
                    .iter()
                    .find(|(_, f)| f.kind == FieldKind::Image)
                    .map_or("image", |(n, _)| n)
                    .to_owned(),
                reason,
            })?
        } else {
            // A manifest's values; an `npy` or `bytes` value is where its file is.
            let image = match self.location(id) {
                Some(Location::File(p)) => Some(p),
                _ => None,
            };
            let mut values = Vec::with_capacity(small.len());
            for (f, (_, spec)) in small.iter().enumerate() {
                let value = sample.value(id, f, small.len());
                values.push(match (spec.kind, value, image) {
                    (FieldKind::Npy | FieldKind::Bytes, Some(file), Some(image)) => {
                        Some(manifest::read_field_file(image, file)?)
                    }
                    (_, value, _) => value.map(<[u8]>::to_vec),
                });
            }
            (stored, values)
        };
        let mut fields = Vec::with_capacity(small.len());
        for ((name, spec), value) in small.into_iter().zip(values) {
            let bad = |reason: String| StorageError::BadField {
                what: what(),
                field: name.to_owned(),
                reason,
            };
            let Some(value) = value else {
                if spec.optional {
                    // Absent from the sample: no entry in its block.
                    continue;
                }
                return Err(bad("missing (null)".into()));
            };
            fields::check_value(spec, &value).map_err(bad)?;
            fields.push(SampleField {
                name: name.to_owned(),
                kind: spec.kind,
                fixed_shape: spec.shape.is_some(),
                value,
            });
        }
        Ok(Sample { image, fields })
    }
}

/// True if the file name starts with a dot.
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

/// True if the path has an image extension we decode (`.jpg`, `.jpeg`, `.png`, `.webp`, any case).
fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(is_image_extension)
}

fn is_image_extension(ext: &str) -> bool {
    ["jpg", "jpeg", "png", "webp"]
        .iter()
        .any(|e| e.eq_ignore_ascii_case(ext))
}

/// The small-field kinds a source that holds every kind takes.
const ALL_SMALL_KINDS: &[FieldKind] = &[
    FieldKind::Text,
    FieldKind::Json,
    FieldKind::Npy,
    FieldKind::Bytes,
];

impl SourceSpec {
    /// Checks that the source kind can follow its `fields` declaration: `tar_shards`,
    /// `parquet` and a local `manifest` take every kind; an `s3` manifest `text` and `json`
    /// (its `npy`/`bytes` cells would name objects, each a request of its own per element);
    /// an image folder none (an `s3` source as its layout).
    pub fn check_fields(&self) -> Result<(), StorageError> {
        let mut why = "";
        let (fields, supported, kind): (_, &[FieldKind], _) = match self {
            SourceSpec::TarShards { fields, .. }
            | SourceSpec::S3 {
                layout: s3::S3Layout::TarShards,
                fields,
                ..
            } => (fields, ALL_SMALL_KINDS, "tar_shards"),
            SourceSpec::Manifest { fields, .. } => (fields, ALL_SMALL_KINDS, "manifest"),
            SourceSpec::S3 {
                layout: s3::S3Layout::Manifest,
                fields,
                ..
            } => {
                why = ": an `s3` manifest's element is one object, fetched, kept on the disk \
                       tier and fetched ahead as one; a file per field would be another \
                       request per element outside all three. Keep the arrays as `.npy` \
                       members of `tar_shards` or in a `parquet` column, or use a local \
                       manifest";
                (fields, manifest::TEXT_KINDS, "manifest")
            }
            SourceSpec::S3 {
                layout: s3::S3Layout::ImageFolder,
                fields: Some(_),
                ..
            } => {
                return Err(StorageError::BadFields {
                    reason: "an `image_folder` layout declares no fields (its samples are an \
                             image and its folder's class)"
                        .into(),
                });
            }
            SourceSpec::Parquet { fields, .. }
            | SourceSpec::S3 {
                layout: s3::S3Layout::Parquet,
                fields,
                ..
            } => (fields, ALL_SMALL_KINDS, "parquet"),
            SourceSpec::ImageFolder { .. } | SourceSpec::S3 { .. } => return Ok(()),
        };
        match fields.as_ref().and_then(|f| f.unsupported(supported)) {
            Some((name, k)) => Err(StorageError::BadFields {
                reason: format!(
                    "field `{name}`: a `{kind}` source cannot hold fields of kind `{}` (it \
                     holds {}){why}",
                    k.name(),
                    supported
                        .iter()
                        .map(|k| format!("`{}`", k.name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
            None => Ok(()),
        }
    }

    /// Checks, before any indexing, that the source's top-level paths lie under the allowed
    /// roots (what lies below them is checked again while indexing). Only `OutsideRoots` is
    /// reported here; missing paths fail the indexing with their own error.
    pub fn check_roots(&self, allowed: &[PathBuf]) -> Result<(), StorageError> {
        let roots = roots::Roots::new(allowed);
        let paths: Vec<&Path> = match self {
            SourceSpec::ImageFolder { path } | SourceSpec::Manifest { path, .. } => {
                vec![path.as_path()]
            }
            SourceSpec::TarShards { paths, .. } | SourceSpec::Parquet { paths, .. } => {
                paths.iter().map(PathBuf::as_path).collect()
            }
            // Checked against `--allowed-s3` by the object-store stage.
            SourceSpec::S3 { .. } => Vec::new(),
        };
        for p in paths {
            if let Err(e @ StorageError::OutsideRoots { .. }) = roots.check(p) {
                return Err(e);
            }
        }
        Ok(())
    }
}
