//! Reading an indexed item: its stored bytes by id ([`DatasetIndex::read`], each source kind
//! by its location), a readable location for error listings, and the split of what was read
//! into the image and its small fields ([`DatasetIndex::split`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::fields::{self, FieldKind, FieldValues, Fields};
use crate::{
    DatasetIndex, Location, MAX_MEMBER_LEN, ParquetReads, StorageError, manifest, parquet,
    tar_shards,
};

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
            Location::ArrayRow { row } => {
                let first = self
                    .shards()
                    .first()
                    .map_or_else(|| "the arrays".to_owned(), |p| p.display().to_string());
                let more = self.shards().len().saturating_sub(1);
                if more == 0 {
                    format!("{first} row {row}")
                } else {
                    format!("{first} (and {more} more arrays) row {row}")
                }
            }
        })
    }

    /// What the reads of a `parquet` dataset have cost so far (`None` for other sources).
    pub fn parquet_reads(&self) -> Option<ParquetReads> {
        self.rows_info()
            .map(|info| parquet::reader_of(info).reads())
    }

    /// Drops the decoded rows a `parquet` dataset's reads keep (at most 64 MiB), as an epoch
    /// over a dataset larger than that does: the benchmarks' way to measure reads of rows
    /// located in their pages. Reads stay correct either way.
    pub fn parquet_drop_decoded(&self) {
        if let Some(info) = self.rows_info() {
            parquet::reader_of(info).drop_decoded();
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
            // The row of every field array, framed as a row's values are (no image).
            Location::ArrayRow { row } => {
                let Some((columns, open)) = self.arrays() else {
                    return Err(StorageError::NoSuchItem {
                        id,
                        len: self.len(),
                    });
                };
                let values = crate::array::read_row(self.shards(), columns, open, row)?;
                Ok(whole_row::encode(Vec::new(), &values))
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

    /// A stable tag of the small fields the source declares (their names and declarations):
    /// what a Parquet row's stored bytes carry beside the image (`read_whole_row`).
    pub fn small_fields_tag(&self) -> String {
        let small: Vec<_> = self
            .sample_fields()
            .map(|s| s.fields().small().collect())
            .unwrap_or_default();
        let json = serde_json::to_vec(&small).unwrap_or_default();
        format!("{:016x}", twox_hash::XxHash3_64::oneshot(&json))
    }

    /// Item `id`'s image, with a Parquet row's small fields' values after it when the source
    /// declares some (one buffer: what an object store's fetch stage reads ahead and its disk
    /// tier keeps for a row); [`DatasetIndex::split_whole`] takes it apart without reading the
    /// row's file again. Other items: [`DatasetIndex::read`].
    pub fn read_whole_row(&self, id: u32) -> Result<Vec<u8>, StorageError> {
        let image = self.read(id)?;
        let Some(sample) = self
            .sample_fields()
            .filter(|s| s.columns && self.has_small_fields())
        else {
            return Ok(image);
        };
        let values = self.row_fields(id, sample.fields())?;
        Ok(whole_row::encode(image, &values))
    }

    /// [`DatasetIndex::split`] of what [`DatasetIndex::read_whole_row`] gave.
    pub fn split_whole(&self, id: u32, stored: Vec<u8>) -> Result<Sample, StorageError> {
        match self.sample_fields() {
            Some(s) if s.columns && self.has_small_fields() => {
                let (image, values) =
                    whole_row::decode(stored).map_err(|reason| StorageError::BadField {
                        what: self.describe(id).unwrap_or_else(|| format!("item {id}")),
                        field: "(row)".into(),
                        reason,
                    })?;
                self.check_fields(id, image, values)
            }
            _ => self.split(id, stored),
        }
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
        let (image, values) = if self.arrays().is_some() {
            whole_row::decode(stored).map_err(|reason| StorageError::BadField {
                what: what(),
                field: "(row)".into(),
                reason,
            })?
        } else if sample.columns {
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
        self.check_fields(id, image, values)
    }

    /// The sample of `image` and the small fields' `values` (in declaration order), each
    /// value checked against its kind.
    fn check_fields(
        &self,
        id: u32,
        image: Vec<u8>,
        values: FieldValues,
    ) -> Result<Sample, StorageError> {
        let Some(sample) = self.sample_fields() else {
            return Ok(Sample {
                image,
                fields: Vec::new(),
            });
        };
        let what = || self.describe(id).unwrap_or_else(|| format!("item {id}"));
        let small: Vec<_> = sample.fields().small().collect();
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
                // An array's rows all have one shape: clients stack them.
                fixed_shape: spec.shape.is_some() || self.arrays().is_some(),
                value,
            });
        }
        Ok(Sample { image, fields })
    }
}

/// A Parquet row's image and small fields' values as one buffer: the values first (`u32`
/// LE count, then per value a presence byte and, when present, a `u32` LE length and the
/// bytes), the image after them.
mod whole_row {
    use crate::fields::FieldValues;

    pub(super) fn encode(image: Vec<u8>, values: &FieldValues) -> Vec<u8> {
        let len: usize = values.iter().flatten().map(|v| 5 + v.len()).sum::<usize>()
            + values.len()
            + 4
            + image.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(values.len() as u32).to_le_bytes());
        for v in values {
            match v {
                Some(v) => {
                    out.push(1);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
                None => out.push(0),
            }
        }
        out.extend_from_slice(&image);
        out
    }

    pub(super) fn decode(mut stored: Vec<u8>) -> Result<(Vec<u8>, FieldValues), String> {
        let bad = || "the row's stored bytes are damaged".to_string();
        let mut at = 0usize;
        let u32_at = |at: &mut usize, b: &[u8]| -> Result<usize, String> {
            let v = b.get(*at..*at + 4).ok_or_else(bad)?;
            *at += 4;
            Ok(u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize)
        };
        let n = u32_at(&mut at, &stored)?;
        if n > crate::fields::MAX_FIELDS {
            return Err(bad());
        }
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            let present = *stored.get(at).ok_or_else(bad)?;
            at += 1;
            if present == 0 {
                values.push(None);
                continue;
            }
            let len = u32_at(&mut at, &stored)?;
            let v = stored.get(at..at + len).ok_or_else(bad)?.to_vec();
            at += len;
            values.push(Some(v));
        }
        let image = stored.split_off(at);
        Ok((image, values))
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn a_row_round_trips_and_damage_is_an_error() {
            let values = vec![Some(b"a caption".to_vec()), None, Some(Vec::new())];
            let image = vec![0xff, 0xd8, 1, 2, 3];
            let whole = super::encode(image.clone(), &values);
            assert_eq!(super::decode(whole.clone()).unwrap(), (image, values));
            for cut in [0, 3, 6, 12] {
                assert!(
                    super::decode(whole[..cut].to_vec()).is_err(),
                    "cut at {cut}"
                );
            }
            let no_fields = super::encode(vec![9, 9], &Vec::new());
            assert_eq!(super::decode(no_fields).unwrap(), (vec![9, 9], Vec::new()));
        }
    }
}
