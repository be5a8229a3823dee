//! Growing an index by the items of another of the same source (`POST
//! /v1/datasets/{name}/append`): the existing items keep their ids, locations and labels, and
//! the new ones take the next ids.

use std::collections::HashSet;
use std::path::PathBuf;

use super::{ABSENT, DatasetIndex, Locations, NO_CLASS, SampleFields};
use crate::StorageError;

fn refuse(reason: impl Into<String>) -> StorageError {
    StorageError::CannotAppend {
        reason: reason.into(),
    }
}

impl DatasetIndex {
    /// This index followed by `part`'s items (an index of the same kind of source with the
    /// same fields): item `len() + i` is `part`'s item `i`. A class `part` names that this
    /// index does not takes the next label; a class of both keeps this index's label. Refused
    /// when the sources differ in kind, fields or image column, when `part` holds a shard,
    /// Parquet file or file of this index (appended twice), or when the items would pass
    /// `u32` ids.
    pub fn appended(&self, part: &DatasetIndex) -> Result<DatasetIndex, StorageError> {
        if u32::try_from(self.len() + part.len()).is_err() {
            return Err(StorageError::TooManyItems);
        }
        if matches!(self.locations, Locations::Arrays { .. }) {
            return Err(refuse(
                "an array dataset's elements are its files' rows: it does not grow",
            ));
        }
        let sample = append_fields(self.sample.as_ref(), part.sample.as_ref())?;
        let locations = self.append_locations(part)?;
        let (classes, map) = merge_classes(&self.classes, &part.classes);
        let labels = self
            .labels
            .iter()
            .copied()
            .chain(part.labels.iter().map(|&l| {
                if l == NO_CLASS {
                    NO_CLASS
                } else {
                    map[l as usize]
                }
            }))
            .collect();
        Ok(DatasetIndex {
            labels,
            locations,
            classes,
            shards: [self.shards.as_slice(), &part.shards].concat(),
            sample,
            whole_fingerprint: Default::default(),
        })
    }

    /// The locations of both, `part`'s shard and file numbers after this index's.
    fn append_locations(&self, part: &DatasetIndex) -> Result<Locations, StorageError> {
        let shards = self.shards.len() as u32;
        Ok(match (&self.locations, &part.locations) {
            (
                Locations::Files { arena, ends },
                Locations::Files {
                    arena: a2,
                    ends: e2,
                },
            ) => {
                refuse_files_again(self, part)?;
                let base = arena.len() as u64;
                Locations::Files {
                    arena: [arena.as_slice(), a2].concat(),
                    ends: ends
                        .iter()
                        .copied()
                        .chain(e2.iter().map(|e| e + base))
                        .collect(),
                }
            }
            (
                Locations::Members { shard, offset, len },
                Locations::Members {
                    shard: s2,
                    offset: o2,
                    len: l2,
                },
            ) => {
                refuse_shards_again(self, part)?;
                Locations::Members {
                    shard: shard
                        .iter()
                        .copied()
                        .chain(s2.iter().map(|s| s + shards))
                        .collect(),
                    offset: [offset.as_slice(), o2].concat(),
                    len: [len.as_slice(), l2].concat(),
                }
            }
            (
                Locations::Rows {
                    file,
                    group,
                    row,
                    info,
                },
                Locations::Rows {
                    file: f2,
                    group: g2,
                    row: r2,
                    info: i2,
                },
            ) => {
                if info.column != i2.column {
                    return Err(refuse(format!(
                        "the dataset's images are in column `{}`, the appended files' in `{}`",
                        info.column, i2.column
                    )));
                }
                refuse_shards_again(self, part)?;
                Locations::Rows {
                    file: file
                        .iter()
                        .copied()
                        .chain(f2.iter().map(|f| f + shards))
                        .collect(),
                    group: [group.as_slice(), g2].concat(),
                    row: [row.as_slice(), r2].concat(),
                    info: info.clone(),
                }
            }
            _ => {
                return Err(refuse(
                    "the appended items come from another kind of source",
                ));
            }
        })
    }
}

/// The classes of both, this index's first (their labels unchanged), and what each of the
/// part's labels becomes.
fn merge_classes(mine: &[String], theirs: &[String]) -> (Vec<String>, Vec<u32>) {
    let mut classes = mine.to_vec();
    let map = theirs
        .iter()
        .map(|c| match classes.iter().position(|m| m == c) {
            Some(i) => i as u32,
            None => {
                classes.push(c.clone());
                (classes.len() - 1) as u32
            }
        })
        .collect();
    (classes, map)
}

/// Both declare the same fields (or neither does); the part's stored values follow this
/// index's.
fn append_fields(
    mine: Option<&SampleFields>,
    theirs: Option<&SampleFields>,
) -> Result<Option<SampleFields>, StorageError> {
    match (mine, theirs) {
        (None, None) => Ok(None),
        (Some(a), Some(b))
            if a.declared == b.declared && a.keys == b.keys && a.columns == b.columns =>
        {
            let base = a.arena.len() as u64;
            let mut out = a.clone();
            out.arena.extend_from_slice(&b.arena);
            out.ends.extend(
                b.ends
                    .iter()
                    .map(|&e| ((e & !ABSENT) + base) | (e & ABSENT)),
            );
            Ok(Some(out))
        }
        _ => Err(refuse(
            "the appended items declare other fields than the dataset's",
        )),
    }
}

/// Refuses a shard or Parquet file that the dataset already reads.
fn refuse_shards_again(mine: &DatasetIndex, part: &DatasetIndex) -> Result<(), StorageError> {
    let have: HashSet<&PathBuf> = mine.shards.iter().collect();
    match part.shards.iter().find(|s| have.contains(s)) {
        Some(s) => Err(refuse(format!("{} is in the dataset already", s.display()))),
        None => Ok(()),
    }
}

/// Refuses a file that the dataset already reads (one pass over its paths).
fn refuse_files_again(mine: &DatasetIndex, part: &DatasetIndex) -> Result<(), StorageError> {
    let new: HashSet<&std::path::Path> = (0..part.len() as u32)
        .filter_map(|id| match part.location(id)? {
            super::Location::File(p) => Some(p),
            _ => None,
        })
        .collect();
    let again = (0..mine.len() as u32).find_map(|id| match mine.location(id)? {
        super::Location::File(p) if new.contains(p) => Some(p),
        _ => None,
    });
    match again {
        Some(p) => Err(refuse(format!("{} is in the dataset already", p.display()))),
        None => Ok(()),
    }
}
