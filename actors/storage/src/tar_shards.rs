//! `tar_shards`: WebDataset shards, indexed once into member offsets.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::fields::{FieldKind, Fields};
use super::index::IndexBuilder;
use super::index::SampleFields;
use super::roots::Roots;
use super::{DatasetIndex, Progress, StorageError};
use crate::fields::FieldValues;

/// A `.cls` member longer than this is not a label.
const MAX_LABEL_LEN: u64 = 64;

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
    fields: Option<&Fields>,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let shards = roots.files_with_extension(paths, "tar")?;
    let mut items = IndexBuilder::members();
    items.sample = fields.map(|f| SampleFields::new(f, true));
    for (n, shard) in shards.iter().enumerate() {
        let n = u32::try_from(n).map_err(|_| StorageError::TooManyItems)?;
        index_shard(n, shard, fields, &mut items, progress)?;
    }
    let classes = items.text_classes(true, &|| "tar shards".to_owned())?;
    Ok(items.finish(classes, shards))
}

/// The sample being assembled from consecutive members with one key.
#[derive(Default)]
struct Sample {
    key: String,
    /// Where the key's first member starts (its headers included) in the shard.
    start: u64,
    /// Where its last member's data ends, padded to the tar block.
    end: u64,
    image: Option<(u64, u64)>,
    /// From the first member a load reads (the image, a small field; its headers included) to
    /// the end of the last, padded: what an item with fields locates, so that the key's
    /// other members before and after them (a video, a segmentation mask) are never read.
    kept: Option<(u64, u64)>,
    /// The class member's text (a number or a name).
    label: Option<String>,
    /// With declared fields: which small fields have a member (name order).
    found: Vec<bool>,
}

/// What a declaration asks of a key's members: the image's and the class's extensions,
/// and each small field's (name order).
struct Wanted<'f> {
    image: Vec<&'f str>,
    class: Option<Vec<&'f str>>,
    small: Vec<(&'f str, Vec<&'f str>)>,
    /// Each small field may be missing (`optional`).
    optional: Vec<bool>,
}

impl<'f> Wanted<'f> {
    fn of(fields: Option<&'f Fields>) -> Self {
        let split = |from: Option<&'f str>, default: &'f str| -> Vec<&'f str> {
            from.unwrap_or(default)
                .split(';')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .collect()
        };
        let Some(fields) = fields else {
            return Wanted {
                image: IMAGE_EXTENSIONS.to_vec(),
                class: Some(vec!["cls"]),
                small: Vec::new(),
                optional: Vec::new(),
            };
        };
        Wanted {
            // A declaration without an image: samples of small fields only.
            image: match fields.from_of(FieldKind::Image) {
                Some(from) => split(from, DEFAULT_IMAGE_FROM),
                None => Vec::new(),
            },
            class: fields
                .from_of(FieldKind::Class)
                .map(|from| split(from, "cls")),
            small: fields
                .small()
                .map(|(name, f)| (name, split(f.from.as_deref(), name)))
                .collect(),
            optional: fields.small().map(|(_, f)| f.optional).collect(),
        }
    }
}

/// The image extensions of the default declaration.
const IMAGE_EXTENSIONS: [&str; 4] = ["jpg", "jpeg", "png", "webp"];
const DEFAULT_IMAGE_FROM: &str = "jpg;jpeg;png;webp";

/// True if `ext` is one of `list` (any case).
fn listed(list: &[&str], ext: &str) -> bool {
    list.iter().any(|e| e.eq_ignore_ascii_case(ext))
}

/// Splits a member path into WebDataset's key and extension: the key is the path up to the
/// first dot of the file name, the extension what follows it. Names without a dot, or whose
/// file name starts with a dot, belong to no sample.
pub(super) fn key_and_extension(path: &str) -> Option<(&str, &str)> {
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
    fields: Option<&Fields>,
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
    index_entries(n, path, file_len, fields, entries, items, progress)
}

/// Rounds a tar member's end up to the 512-byte block.
fn block_end(end: u64) -> u64 {
    end.div_ceil(512).saturating_mul(512)
}

/// The shard being indexed, and what its keys must hold.
struct Shard<'a> {
    n: u32,
    path: &'a Path,
    fields: Option<&'a Fields>,
    wanted: &'a Wanted<'a>,
}

impl Shard<'_> {
    /// Adds a key whose members have all been seen as an item (or skips it: without
    /// `fields`, a key with no image), or fails naming what it lacks.
    fn finish(
        &self,
        s: Sample,
        items: &mut IndexBuilder,
        progress: &mut Progress<'_>,
    ) -> Result<(), StorageError> {
        let missing = |field: &str| StorageError::MissingField {
            key: format!("{} in {}", s.key, self.path.display()),
            field: field.to_owned(),
        };
        let label = match (&self.wanted.class, &s.label) {
            (_, Some(label)) => items.texts.id(label),
            (Some(_), None) if self.fields.is_none() && s.image.is_none() => return Ok(()),
            (Some(_), None) if self.fields.is_none() => {
                return Err(StorageError::BadLabel {
                    what: format!("sample {} in {}", s.key, self.path.display()),
                    reason: "the sample has no .cls member".into(),
                });
            }
            (Some(_), None) => {
                let f = self.fields.and_then(|f| {
                    f.iter()
                        .find(|(_, s)| s.kind == FieldKind::Class)
                        .map(|(n, _)| n)
                });
                return Err(missing(f.unwrap_or("class")));
            }
            (None, None) => items.texts.id("0"),
        };
        match self.fields {
            None => {
                let Some((offset, len)) = s.image else {
                    return Ok(());
                };
                items.push_member(self.n, offset, len, label);
            }
            Some(f) => {
                if s.image.is_none() && !self.wanted.image.is_empty() {
                    let name = f.iter().find(|(_, s)| s.kind == FieldKind::Image);
                    return Err(missing(name.map_or("image", |(n, _)| n)));
                }
                if let Some(i) = s
                    .found
                    .iter()
                    .zip(&self.wanted.optional)
                    .position(|(&found, &optional)| !found && !optional)
                {
                    return Err(missing(self.wanted.small[i].0));
                }
                let (from, to) = s.kept.unwrap_or((s.start, s.end));
                items.push_member(self.n, from, to - from, label);
            }
        }
        progress.tick()
    }
}

/// Indexes the members of shard number `n` (named `path` in errors, `file_len` bytes long)
/// as `entries` yields them: from a local file (seeking past member data) or an object
/// store's stream. Without `fields`, an item is the key's image member (keys with no image
/// are skipped, an image with no `.cls` is an error); with `fields`, every key is an item
/// covering all its members, headers included (one range), and a key missing a declared
/// field is an error naming it.
pub(super) fn index_entries<R: Read>(
    n: u32,
    path: &Path,
    file_len: u64,
    fields: Option<&Fields>,
    entries: tar::Entries<'_, R>,
    items: &mut IndexBuilder,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    let bad = bad_shard(path);
    let wanted = Wanted::of(fields);
    let mut current: Option<Sample> = None;
    let shard = Shard {
        n,
        path,
        fields,
        wanted: &wanted,
    };
    let mut finish = |sample: Option<Sample>, items: &mut IndexBuilder| match sample {
        Some(s) => shard.finish(s, items, progress),
        None => Ok(()),
    };

    // Where the previous entry's data ended: the next key starts there (its members'
    // extension headers, long names, included).
    let mut previous_end = 0u64;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(e.to_string().to_lowercase()))?;
        let (offset, len) = (entry.raw_file_position(), entry.size());
        let start = std::mem::replace(&mut previous_end, block_end(offset.saturating_add(len)));
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
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
                start,
                found: vec![false; wanted.small.len()],
                ..Sample::default()
            });
        }
        let Some(sample) = current.as_mut() else {
            continue;
        };
        sample.end = block_end(offset + len).min(file_len);
        let keep = |sample: &mut Sample| {
            let from = sample.kept.map_or(start, |k| k.0);
            sample.kept = Some((from, sample.end));
        };
        if listed(&wanted.image, ext) {
            if sample.image.is_none() {
                keep(sample);
            }
            sample.image.get_or_insert((offset, len));
        } else if wanted.class.as_ref().is_some_and(|c| listed(c, ext)) {
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
            if text.trim().is_empty() {
                return Err(bad_label("an empty class member".into()));
            }
            // A number, or a class name (the classes are then the names, sorted).
            sample.label = Some(text.trim().to_owned());
        } else if let Some(i) = wanted.small.iter().position(|(_, exts)| listed(exts, ext)) {
            if !sample.found[i] {
                keep(sample);
            }
            sample.found[i] = true;
        }
    }
    finish(current.take(), items)
}

/// The image and small fields of a key read whole (what an item of a tar dataset with
/// `fields` locates): its members parsed from the bytes, each field the first member with
/// one of its extensions, in the declaration's name order.
pub(super) fn key_members(
    stored: &[u8],
    fields: &Fields,
) -> Result<(Vec<u8>, FieldValues), String> {
    let wanted = Wanted::of(Some(fields));
    let mut image = None;
    let mut small: FieldValues = vec![None; wanted.small.len()];
    let mut archive = tar::Archive::new(stored);
    let entries = archive
        .entries()
        .map_err(|e| format!("not readable from the key's members: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("not readable from the key's members: {e}"))?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some((_, ext)) = key_and_extension(&name) else {
            continue;
        };
        let slot = if listed(&wanted.image, ext) {
            &mut image
        } else if let Some(i) = wanted.small.iter().position(|(_, e)| listed(e, ext)) {
            &mut small[i]
        } else {
            continue;
        };
        if slot.is_none() {
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| format!("not readable from member {name}: {e}"))?;
            *slot = Some(bytes);
        }
    }
    let image = match image {
        Some(image) => image,
        // Samples of small fields only.
        None if wanted.image.is_empty() => Vec::new(),
        None => {
            return Err(
                "missing from the key's members (the shard changed since indexing?)".to_owned(),
            );
        }
    };
    Ok((image, small))
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
