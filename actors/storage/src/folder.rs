//! `image_folder`: the torchvision `ImageFolder` layout.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::DirEntry;
use std::path::{Path, PathBuf};

use super::index::IndexBuilder;
use super::roots::Roots;
use super::{DatasetIndex, Progress, StorageError, has_image_extension, is_hidden};

/// What a directory entry is, symlinks followed (and checked against the roots).
enum Kind {
    Dir(PathBuf),
    File(PathBuf),
    Other,
}

fn kind(entry: &DirEntry, roots: &Roots) -> Result<Kind, StorageError> {
    let path = entry.path();
    let ft = entry.file_type().map_err(|e| StorageError::io(&path, e))?;
    if ft.is_symlink() {
        let target = roots.check(&path)?;
        let meta = std::fs::metadata(&target).map_err(|e| StorageError::io(&path, e))?;
        return Ok(if meta.is_dir() {
            Kind::Dir(target)
        } else if meta.is_file() {
            Kind::File(target)
        } else {
            Kind::Other
        });
    }
    // The parent is canonical and inside the roots, and this entry is no symlink: so is the
    // entry's path.
    Ok(if ft.is_dir() {
        Kind::Dir(path)
    } else if ft.is_file() {
        Kind::File(path)
    } else {
        Kind::Other
    })
}

fn read_dir(dir: &Path) -> Result<Vec<DirEntry>, StorageError> {
    std::fs::read_dir(dir)
        .map_err(|e| StorageError::io(dir, e))?
        .map(|e| e.map_err(|e| StorageError::io(dir, e)))
        .collect()
}

pub(super) fn index(
    path: &Path,
    roots: &Roots,
    progress: &mut Progress<'_>,
) -> Result<DatasetIndex, StorageError> {
    let root = roots.check(path)?;
    if !root.is_dir() {
        return Err(StorageError::NotADirectory {
            path: path.to_owned(),
        });
    }
    let mut classes: Vec<(String, PathBuf)> = Vec::new();
    for entry in read_dir(&root)? {
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        if let Kind::Dir(dir) = kind(&entry, roots)? {
            classes.push((name.to_string_lossy().into_owned(), dir));
        }
    }
    classes.sort();

    let label_of = |position: usize| {
        u32::try_from(position).map_err(|_| StorageError::BadLabel {
            what: format!("image folder {}", path.display()),
            reason: format!("more than {} classes", u32::MAX),
        })
    };
    let mut items = IndexBuilder::files();
    let mut visited = HashSet::new();
    for (label, (_, dir)) in classes.iter().enumerate() {
        let label = label_of(label)?;
        let mut files = Vec::new();
        walk(dir, &mut Vec::new(), roots, &mut visited, &mut files)?;
        files.sort_by(|a, b| {
            (a.0.as_slice(), a.1.as_encoded_bytes()).cmp(&(b.0.as_slice(), b.1.as_encoded_bytes()))
        });
        for (_, _, path) in files {
            items.push_file(&path, label);
            progress.tick()?;
        }
    }
    Ok(items.finish(
        classes.into_iter().map(|(name, _)| name).collect(),
        Vec::new(),
    ))
}

/// A found image: (its folder relative to the class folder, as `/a/b` bytes; its file name;
/// its canonical path). Sorting by the first two gives torchvision's order (`os.walk`
/// sorted by folder path string, then sorted file names).
type Found = (Vec<u8>, OsString, PathBuf);

fn walk(
    dir: &Path,
    rel: &mut Vec<u8>,
    roots: &Roots,
    visited: &mut HashSet<PathBuf>,
    out: &mut Vec<Found>,
) -> Result<(), StorageError> {
    // A symlinked folder met twice (or a cycle) is walked once.
    if !visited.insert(dir.to_owned()) {
        return Ok(());
    }
    for entry in read_dir(dir)? {
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        match kind(&entry, roots)? {
            Kind::Dir(sub) => {
                let len = rel.len();
                rel.push(b'/');
                rel.extend_from_slice(name.as_encoded_bytes());
                walk(&sub, rel, roots, visited, out)?;
                rel.truncate(len);
            }
            Kind::File(file) if has_image_extension(Path::new(&name)) => {
                out.push((rel.clone(), name, file));
            }
            Kind::File(_) | Kind::Other => {}
        }
    }
    Ok(())
}
