//! `tar_shards`: WebDataset shards, indexed once into member offsets.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::index::IndexBuilder;
use super::roots::Roots;
use super::{
    DatasetIndex, Progress, StorageError, is_hidden, is_image_extension, numeric_classes,
    numeric_label,
};

/// A `.cls` member longer than this is not a label.
const MAX_LABEL_LEN: u64 = 64;

/// The shard files named by `paths`: files as they are, folders expanded to the `*.tar`
/// files they hold (not recursive, hidden files skipped), sorted by name.
fn shard_files(paths: &[PathBuf], roots: &Roots) -> Result<Vec<PathBuf>, StorageError> {
    let mut shards = Vec::new();
    for path in paths {
        let canonical = roots.check(path)?;
        if !canonical.is_dir() {
            shards.push(canonical);
            continue;
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&canonical).map_err(|e| StorageError::io(path, e))? {
            let entry = entry.map_err(|e| StorageError::io(path, e))?;
            let name = entry.file_name();
            if is_hidden(&name) || !has_tar_extension(Path::new(&name)) {
                continue;
            }
            let file = roots.check(&entry.path())?;
            if file.is_file() {
                found.push((name, file));
            }
        }
        found.sort();
        shards.extend(found.into_iter().map(|(_, f)| f));
    }
    Ok(shards)
}

/// True if the path's extension is `.tar` (any case): a shard.
pub(super) fn has_tar_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("tar"))
}

/// The `BadShard` error of shard `path`, for a reason.
pub(super) fn bad_shard(path: &Path) -> impl Fn(String) -> StorageError + '_ {
    |reason| StorageError::BadShard {
        path: path.to_owned(),
        reason,
    }
}

pub(super) fn index(
    paths: &[PathBuf],
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let shards = shard_files(paths, roots)?;
    let mut items = IndexBuilder::members();
    for (n, shard) in shards.iter().enumerate() {
        let n = u32::try_from(n).map_err(|_| StorageError::TooManyItems)?;
        index_shard(n, shard, &mut items, progress)?;
    }
    let classes = numeric_classes(items.labels_mut());
    Ok(items.finish(classes, shards))
}

/// The sample being assembled from consecutive members with one key.
#[derive(Default)]
struct Sample {
    key: String,
    image: Option<(u64, u64)>,
    label: Option<i64>,
}

/// Splits a member path into WebDataset's key and extension: the key is the path up to the
/// first dot of the file name, the extension what follows it. Names without a dot, or whose
/// file name starts with a dot, belong to no sample.
fn key_and_extension(path: &str) -> Option<(&str, &str)> {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[base_start..].find('.')?;
    if dot == 0 {
        return None;
    }
    let split = base_start + dot;
    Some((&path[..split], &path[split + 1..]))
}

fn index_shard(
    n: u32,
    path: &Path,
    items: &mut IndexBuilder,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    let bad = bad_shard(path);
    let file = File::open(path).map_err(|e| StorageError::io(path, e))?;
    let file_len = file
        .metadata()
        .map_err(|e| StorageError::io(path, e))?
        .len();
    let mut archive = tar::Archive::new(BufReader::new(file));
    let entries = archive
        .entries_with_seek()
        .map_err(|e| bad(e.to_string().to_lowercase()))?;
    index_entries(n, path, file_len, entries, items, progress)
}

/// Indexes the members of shard number `n` (named `path` in errors, `file_len` bytes long)
/// as `entries` yields them: from a local file (seeking past member data) or an object
/// store's stream.
pub(super) fn index_entries<R: Read>(
    n: u32,
    path: &Path,
    file_len: u64,
    entries: tar::Entries<'_, R>,
    items: &mut IndexBuilder,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    let bad = bad_shard(path);
    let mut current: Option<Sample> = None;
    let mut finish =
        |sample: Option<Sample>, items: &mut IndexBuilder| -> Result<(), StorageError> {
            let Some(s) = sample else { return Ok(()) };
            let Some((offset, len)) = s.image else {
                return Ok(());
            };
            let label = s.label.ok_or_else(|| StorageError::BadLabel {
                what: format!("sample {} in {}", s.key, path.display()),
                reason: "the sample has no .cls member".into(),
            })?;
            let label = numeric_label(label, &|| "tar shards".to_owned())?;
            items.push_member(n, offset, len, label);
            progress.tick()
        };

    for entry in entries {
        let mut entry = entry.map_err(|e| bad(e.to_string().to_lowercase()))?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let (offset, len) = (entry.raw_file_position(), entry.size());
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(bad(format!(
                "member {name} runs past the end of the file (truncated shard?)"
            )));
        }
        let Some((key, ext)) = key_and_extension(&name) else {
            continue;
        };
        if current.as_ref().is_none_or(|s| s.key != key) {
            finish(current.take(), items)?;
            current = Some(Sample {
                key: key.to_owned(),
                ..Sample::default()
            });
        }
        let Some(sample) = current.as_mut() else {
            continue;
        };
        if is_image_extension(ext) {
            sample.image.get_or_insert((offset, len));
        } else if ext == "cls" {
            let bad_label = |reason: String| StorageError::BadLabel {
                what: format!("{name} in {}", path.display()),
                reason,
            };
            if len > MAX_LABEL_LEN {
                return Err(bad_label(format!("a .cls member of {len} bytes")));
            }
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .map_err(|e| bad_label(format!("unreadable: {e}").to_lowercase()))?;
            let label = text
                .trim()
                .parse::<i64>()
                .map_err(|_| bad_label(format!("{:?} is not a decimal integer", text.trim())))?;
            sample.label = Some(label);
        }
    }
    finish(current.take(), items)
}

#[cfg(test)]
mod tests {
    use super::key_and_extension;

    #[test]
    fn webdataset_keys() {
        assert_eq!(key_and_extension("a/b/x001.jpg"), Some(("a/b/x001", "jpg")));
        assert_eq!(key_and_extension("x001.seg.png"), Some(("x001", "seg.png")));
        assert_eq!(key_and_extension("dir.v2/x.cls"), Some(("dir.v2/x", "cls")));
        assert_eq!(key_and_extension("README"), None);
        assert_eq!(key_and_extension("d/.hidden"), None);
    }
}
