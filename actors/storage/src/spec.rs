//! [`SourceSpec`]: where a dataset comes from, as a request names it, and the checks of a
//! spec before any indexing (its fields against what its kind can hold, its paths against the
//! allowed roots).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fields::{self, FieldKind};
use crate::{StorageError, s3};
use crate::{manifest, roots, select};

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
    /// WebDataset tar shards: each path is a `.tar` file, a folder of them, a glob pattern
    /// (`/data/laion/*.tar`) or brace ranges (`/data/shards-{000000..000146}.tar`).
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
    /// A CSV, TSV or JSON-lines list of `path, label`.
    Manifest {
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        path: PathBuf,
        /// `csv`, `tsv` or `jsonl` (JSON lines or one JSON array); default: the file's
        /// extension (`.csv`, `.tsv`, `.jsonl`, `.json`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<manifest::ManifestFormat>,
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
        /// `parquet` only: a split (`train`, `validation`, ...) of the Hugging Face dataset
        /// folder the url names, its objects picked as a local `parquet` source's `split`
        /// picks files (the `README.md` object's `configs`, else the Hub's layouts).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        split: Option<String>,
    },
    /// Parquet files as the Hugging Face Hub stores image datasets: each path is a
    /// `.parquet` file, a folder of them (not recursive) or a glob pattern
    /// (`/data/beans/data/train-*.parquet`); with `split`, each path is a dataset folder as
    /// downloaded from the Hub, read for that split's files.
    Parquet {
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
        paths: Vec<PathBuf>,
        /// A split (`train`, `validation`, `test`, ...): its files in each folder of `paths`,
        /// as the dataset card's `configs` give them, else as the Hub lays them out
        /// (`data/train-00000-of-00004.parquet`, `train/0000.parquet`,
        /// `default/train/0000.parquet`, `train.parquet`; `validation` also `valid`, `dev`,
        /// `val`; `test` also `eval`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        split: Option<String>,
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
    /// NumPy `.npy` files aligned along their first dimension: element `i` is row `i` of
    /// every array (all of them have as many rows), delivered as fields, with no image. Each
    /// file is an `npy` field, named by its file name without `.npy` unless `fields` names
    /// them (`from`: that name); one 1-D integer array may be the `class` instead. Rows are
    /// read with positioned reads, one per array per element.
    Array {
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
        paths: Vec<PathBuf>,
        /// The sample's fields, each `from` a file's name without `.npy`: `npy` fields and at
        /// most one `class` (a 1-D integer array). Default: every file an `npy` field named
        /// by it (filled in when the dataset is created, so that its view shows them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "openapi",
            schema(value_type = Option<std::collections::BTreeMap<String, fields::FieldSpec>>)
        )]
        fields: Option<fields::Fields>,
    },
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
        if let Some(reason) = self.imageless_refused() {
            return Err(StorageError::BadFields { reason });
        }
        if let Some(arrays) = self.check_arrays() {
            return arrays;
        }
        if let SourceSpec::S3 {
            layout,
            split: Some(_),
            ..
        } = self
            && *layout != s3::S3Layout::Parquet
        {
            return Err(StorageError::S3Invalid {
                reason: "a `split` picks a Hugging Face dataset folder's Parquet files: it is \
                         for the `parquet` layout"
                    .into(),
            });
        }
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
            SourceSpec::ImageFolder { .. } | SourceSpec::S3 { .. } | SourceSpec::Array { .. } => {
                return Ok(());
            }
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

    /// [`SourceSpec::check_fields`] of an `array` source or layout (`None` for the others).
    fn check_arrays(&self) -> Option<Result<(), StorageError>> {
        match self {
            SourceSpec::Array { paths, fields } => {
                Some(crate::array::check_spec(paths, fields.as_ref()))
            }
            // Which objects the fields come from is known once they are listed.
            SourceSpec::S3 {
                layout: s3::S3Layout::Array,
                fields,
                ..
            } => Some(
                fields
                    .as_ref()
                    .map_or(Ok(()), crate::array::check_declaration),
            ),
            _ => None,
        }
    }

    /// True if the source's samples have an image: every source but an `array` and a
    /// declaration of `fields` without an `image` field (text-only shards, Parquet without
    /// an image column). Jobs on a dataset without images run no pipeline.
    pub fn has_image(&self) -> bool {
        match self {
            SourceSpec::Array { .. }
            | SourceSpec::S3 {
                layout: s3::S3Layout::Array,
                ..
            } => false,
            SourceSpec::TarShards { fields, .. }
            | SourceSpec::Manifest { fields, .. }
            | SourceSpec::Parquet { fields, .. }
            | SourceSpec::S3 { fields, .. } => {
                fields.as_ref().is_none_or(fields::Fields::has_image)
            }
            SourceSpec::ImageFolder { .. } => true,
        }
    }

    /// Why a declaration without an `image` field is refused for this source, if it is: a
    /// manifest's and an image folder's entries are image files.
    fn imageless_refused(&self) -> Option<String> {
        let manifest = matches!(
            self,
            SourceSpec::Manifest { .. }
                | SourceSpec::S3 {
                    layout: s3::S3Layout::Manifest,
                    ..
                }
        );
        (manifest && !self.has_image()).then(|| {
            "a manifest's entries are image files: declare its field of kind `image`. \
             Samples without an image come from `tar_shards` (a key's members), `parquet` \
             (a row's columns) or an `array` source"
                .into()
        })
    }

    /// The sources of items appended to a dataset of this source (`POST
    /// /v1/datasets/{name}/append`), each indexed like it, with its fields: `tar_shards` and
    /// `parquet` take more shards or files (paths, folders, patterns; a `parquet` source
    /// with a `split` takes dataset folders), a `manifest` more manifest files of its format,
    /// an `image_folder` more folders of class folders (one source each). An `array` source
    /// and an `s3` one do not grow (`CannotAppend`, saying why).
    pub fn appended_parts(&self, paths: &[PathBuf]) -> Result<Vec<SourceSpec>, StorageError> {
        let refuse = |reason: &str| StorageError::CannotAppend {
            reason: reason.into(),
        };
        if paths.is_empty() {
            return Err(refuse("name at least one path to append"));
        }
        let paths = paths.to_vec();
        Ok(match self {
            SourceSpec::TarShards { fields, .. } => vec![SourceSpec::TarShards {
                paths,
                fields: fields.clone(),
            }],
            SourceSpec::Parquet { split, fields, .. } => vec![SourceSpec::Parquet {
                paths,
                split: split.clone(),
                fields: fields.clone(),
            }],
            SourceSpec::Manifest { format, fields, .. } => paths
                .into_iter()
                .map(|path| SourceSpec::Manifest {
                    path,
                    format: *format,
                    fields: fields.clone(),
                })
                .collect(),
            SourceSpec::ImageFolder { .. } => paths
                .into_iter()
                .map(|path| SourceSpec::ImageFolder { path })
                .collect(),
            SourceSpec::Array { .. } => {
                return Err(refuse(
                    "an array dataset's elements are its files' rows: it does not grow",
                ));
            }
            SourceSpec::S3 { .. } => {
                return Err(refuse(
                    "an s3 dataset grows by re-indexing it (POST /v1/datasets/{name}/reindex), \
                     which adds the store's new objects",
                ));
            }
        })
    }

    /// The source as the server keeps it: an `array` source without `fields` gets its
    /// default declaration (each file an `npy` field named by it), so that its view and its
    /// clients see the fields.
    pub fn resolved(self) -> Result<SourceSpec, StorageError> {
        match self {
            SourceSpec::Array {
                paths,
                fields: None,
            } => {
                let fields = crate::array::default_fields(&paths)?;
                Ok(SourceSpec::Array {
                    paths,
                    fields: Some(fields),
                })
            }
            other => Ok(other),
        }
    }

    /// Checks, before any indexing, that the source's top-level paths lie under the allowed
    /// roots (what lies below them is checked again while indexing), that its path patterns
    /// are well formed and match files (`BadPattern`, `NoMatch`), and that a Parquet split is
    /// found. Missing literal paths fail the indexing with their own error.
    pub fn check_roots(&self, allowed: &[PathBuf]) -> Result<(), StorageError> {
        let roots = roots::Roots::new(allowed);
        let selected = match self {
            SourceSpec::TarShards { paths, .. } => select::expand(&roots, paths, "tar").map(drop),
            SourceSpec::Parquet {
                paths,
                split: Some(split),
                ..
            } => paths
                .iter()
                .try_for_each(|p| select::hub_split(&roots, p, split).map(drop)),
            SourceSpec::Parquet { paths, .. } => select::expand(&roots, paths, "parquet").map(drop),
            _ => Ok(()),
        };
        if let Err(
            e @ (StorageError::OutsideRoots { .. }
            | StorageError::NoMatch { .. }
            | StorageError::BadPattern { .. }),
        ) = selected
        {
            return Err(e);
        }
        let paths: Vec<&Path> = match self {
            SourceSpec::ImageFolder { path } | SourceSpec::Manifest { path, .. } => {
                vec![path.as_path()]
            }
            SourceSpec::TarShards { paths, .. }
            | SourceSpec::Parquet { paths, .. }
            | SourceSpec::Array { paths, .. } => paths.iter().map(PathBuf::as_path).collect(),
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
