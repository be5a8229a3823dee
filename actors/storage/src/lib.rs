//! Storage backends: turn a dataset source into a [`DatasetIndex`] (a dense list of items,
//! each a location and a label, stored by column: see `index.rs`) once, then read any item's
//! stored bytes by id.
//!
//! Plain blocking code, no actix: indexing runs in the background and reads run on the
//! Loader's worker pool.
//!
//! Five local source kinds ([`SourceSpec`]):
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
//! - `array`: NumPy `.npy` files aligned along their first dimension, whose rows are samples
//!   without an image: element `i` is row `i` of every array, each an `npy` field (one 1-D
//!   integer array may be the class). Indexing reads the headers; a read is one positioned
//!   read per array (see `array.rs`).
//!
//! Samples without an image: a declaration of `fields` without an `image` field (text-only
//! WebDataset shards, Parquet rows without an image column) makes samples of small fields
//! only, as an `array` source's are; a manifest's entries are image files and need one.
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

mod array;
mod classes;
mod error;
pub mod fields;
mod folder;
#[cfg(test)]
mod fuzz;
mod index;
mod manifest;
mod parquet;
mod read;
mod roots;
pub mod s3;
mod select;
mod spec;

/// The stage of the daemon's CPU accounting this crate marks (`joader_stage_cpu_seconds_total`).
pub mod stage {
    use joader_stages::Stage;
    /// Object-store requests: the fetch stage's runtime threads (requests, bodies, the disk
    /// tier's reads, fetch-ahead's bookkeeping) and the disk tier's writer thread.
    pub static FETCH: Stage = Stage::new("fetch");
}
mod tar_shards;
#[cfg(test)]
mod tests;
pub mod tier;

use std::path::{Path, PathBuf};

use roots::Roots;

pub use error::StorageError;
pub use index::{DatasetIndex, IndexFormatError, Location};
pub use manifest::ManifestFormat;
pub use parquet::{
    DECODED_BUDGET, DEFAULT_SPILL_MAX, DIRECTORY_BUDGET, FIELDS_BUDGET, ParquetBudgets,
    ParquetReads, ParquetSpill, default_spill_bytes, reset_spill_dir,
};
pub use read::{Sample, SampleField};
pub use spec::SourceSpec;

/// Numeric labels must be below this (their class list is `0..=max`).
pub const MAX_NUMERIC_LABEL: i64 = 1 << 20;

/// Largest tar member read into memory (guards against a damaged persisted index).
pub(crate) const MAX_MEMBER_LEN: u64 = 1 << 32;

/// How often (in items) indexing reports progress.
const PROGRESS_EVERY: u64 = 256;

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
        SourceSpec::Manifest {
            path,
            format,
            fields,
        } => manifest::index(path, *format, fields.as_ref(), &roots, &mut counter)?,
        SourceSpec::Parquet {
            paths,
            split,
            fields,
        } => {
            let files = parquet::files(paths, split.as_deref(), &roots)?;
            parquet::index(&files, fields.as_ref(), &roots, &mut counter)?
        }
        SourceSpec::Array { paths, fields } => {
            array::index(paths, fields.as_ref(), &roots, &mut counter)?
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
