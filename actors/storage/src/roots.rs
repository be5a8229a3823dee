//! The allowed-roots check: canonicalize, then require a root as prefix.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::StorageError;

/// Canonical allowed roots.
pub(crate) struct Roots(Vec<PathBuf>);

impl Roots {
    /// Canonicalizes the roots; a root that does not exist cannot contain anything and is
    /// dropped.
    pub(super) fn new(allowed: &[PathBuf]) -> Roots {
        Roots(
            allowed
                .iter()
                .filter_map(|r| std::fs::canonicalize(r).ok())
                .collect(),
        )
    }

    /// Roots already canonical (as [`Roots::canonical`] gave them).
    pub(super) fn from_canonical(roots: Vec<PathBuf>) -> Roots {
        Roots(roots)
    }

    /// The canonical roots.
    pub(super) fn canonical(&self) -> &[PathBuf] {
        &self.0
    }

    /// The files named by `paths` (brace ranges and glob patterns expanded first,
    /// [`crate::select::expand`]), each checked: files as they are, folders expanded to the
    /// files they hold whose extension is `ext` (any case; not recursive, hidden files
    /// skipped), sorted by name within each folder.
    pub(super) fn files_with_extension(
        &self,
        paths: &[PathBuf],
        ext: &str,
    ) -> Result<Vec<PathBuf>, StorageError> {
        let mut files = Vec::new();
        for path in &crate::select::expand(self, paths, ext)? {
            let canonical = self.check(path)?;
            if !canonical.is_dir() {
                files.push(canonical);
                continue;
            }
            let mut found = Vec::new();
            for entry in std::fs::read_dir(&canonical).map_err(|e| StorageError::io(path, e))? {
                let entry = entry.map_err(|e| StorageError::io(path, e))?;
                let name = entry.file_name();
                let matches = Path::new(&name)
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case(ext));
                if super::is_hidden(&name) || !matches {
                    continue;
                }
                let file = self.check(&entry.path())?;
                if file.is_file() {
                    found.push((name, file));
                }
            }
            found.sort();
            files.extend(found.into_iter().map(|(_, f)| f));
        }
        Ok(files)
    }

    pub(super) fn contains(&self, canonical: &Path) -> bool {
        self.0.iter().any(|r| canonical.starts_with(r))
    }

    /// Resolves `path` (symlinks, `.`, `..`) and checks that it lies under a root.
    ///
    /// A missing path is `NotFound` only if it would lie under a root when resolved
    /// lexically: paths outside the roots are refused without telling whether they exist.
    pub(crate) fn check(&self, path: &Path) -> Result<PathBuf, StorageError> {
        match std::fs::canonicalize(path) {
            Ok(c) if self.contains(&c) => Ok(c),
            Ok(_) => Err(StorageError::OutsideRoots {
                path: path.to_owned(),
            }),
            Err(e) => {
                if resolve_missing(path).is_some_and(|p| self.contains(&p)) {
                    Err(if e.kind() == io::ErrorKind::NotFound {
                        StorageError::NotFound {
                            path: path.to_owned(),
                        }
                    } else {
                        StorageError::Io {
                            path: path.to_owned(),
                            source: e,
                        }
                    })
                } else {
                    Err(StorageError::OutsideRoots {
                        path: path.to_owned(),
                    })
                }
            }
        }
    }
}

/// Where a missing `path` would be: its longest existing ancestor canonicalized, plus the
/// rest of the (lexically normalized) path.
fn resolve_missing(path: &Path) -> Option<PathBuf> {
    let abs = lexical_absolute(path)?;
    abs.ancestors().find_map(|anc| {
        let c = std::fs::canonicalize(anc).ok()?;
        Some(c.join(abs.strip_prefix(anc).ok()?))
    })
}

/// `path` made absolute and with `.` and `..` removed, without touching the file system.
fn lexical_absolute(path: &Path) -> Option<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}
