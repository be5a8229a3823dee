//! The allowed-roots check: canonicalize, then require a root as prefix.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::StorageError;

/// Canonical allowed roots.
pub(super) struct Roots(Vec<PathBuf>);

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

    pub(super) fn contains(&self, canonical: &Path) -> bool {
        self.0.iter().any(|r| canonical.starts_with(r))
    }

    /// Resolves `path` (symlinks, `.`, `..`) and checks that it lies under a root.
    ///
    /// A missing path is `NotFound` only if it would lie under a root when resolved
    /// lexically: paths outside the roots are refused without telling whether they exist.
    pub(super) fn check(&self, path: &Path) -> Result<PathBuf, StorageError> {
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
