//! [`DatasetIndex`]: a dataset's items stored by column, so that a 1.28 M-item dataset costs
//! about 12 bytes per item plus its path bytes (files) or 24 bytes per item (tar members),
//! with no allocation per item.
//!
//! - labels: one `u32` per item (every label is a class position, or a numeric label below
//!   [`MAX_NUMERIC_LABEL`](super::MAX_NUMERIC_LABEL), or [`NO_CLASS`]: an unlabelled item,
//!   delivered as -1);
//! - files: one byte arena holding every canonical path end to end, and the end offset of each
//!   item's path in it (`u64`);
//! - tar members: shard number, offset and length columns;
//! - Parquet rows: file number, row group and row-in-group columns (`u32` each), with the
//!   image column's name and the allowed roots that a row's image `path` must lie under, and
//!   the dataset's read state (`parquet/reader.rs`: kept with the index that the Loader reads
//!   through, never persisted nor compared).
//!
//! - array rows: nothing per item (item `i` is row `i`), and per field array where its rows
//!   are (`array.rs`);
//! - small fields (a source with `fields`): their declaration, and a manifest's values in one
//!   arena with an end offset per item and field ([`SampleFields`]).
//!
//! Persisted with [`DatasetIndex::to_bytes`]: a magic tag naming the format's version, then
//! the columns in postcard (varints; the arena as one byte string). Version 3 added the
//! small fields; a version-2 index reads back without them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fields::Fields;

mod append;
#[cfg(test)]
mod append_tests;

/// What reading a Parquet row needs besides its location: the image column's name, and the
/// allowed roots (canonical) that a row's `path` must lie under; and the dataset's read state
/// (the Parquet source's, which this module does not know: see [`ReadState`]).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
pub(crate) struct RowsInfo {
    pub(crate) column: String,
    pub(crate) roots: Vec<PathBuf>,
    #[serde(skip)]
    pub(crate) state: ReadState,
}

/// A source's read state kept with its index, of a type only that source knows: made on
/// first use, never persisted (it starts empty when the index is read back). It is a cache,
/// so a copy of an index starts with none, and two indexes compare by their columns only.
#[derive(Default)]
pub(crate) struct ReadState(std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>);

impl ReadState {
    /// A state made already (tests give one with other bounds).
    #[cfg(test)]
    pub(crate) fn with<T: std::any::Any + Send + Sync>(state: T) -> ReadState {
        let made = std::sync::OnceLock::new();
        let _ = made.set(Box::new(state) as Box<dyn std::any::Any + Send + Sync>);
        ReadState(made)
    }

    /// The state, made with `T::default()` on first use.
    ///
    /// # Panics
    /// If it was first used as another type (one source kind per index).
    pub(crate) fn get_or_default<T: std::any::Any + Default + Send + Sync>(&self) -> &T {
        self.0
            .get_or_init(|| Box::new(T::default()))
            .downcast_ref::<T>()
            .expect("one read state type per index")
    }
}

impl Clone for ReadState {
    fn clone(&self) -> Self {
        ReadState::default()
    }
}

impl PartialEq for ReadState {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ReadState {}

impl std::fmt::Debug for ReadState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "ReadState(made)"
        } else {
            "ReadState(empty)"
        })
    }
}

/// The first bytes of a persisted index; the last one is the format's version (3: with
/// [`SampleFields`]; version 2, the same without them, still reads back).
const MAGIC: &[u8; 8] = b"JOADIDX\x03";
const MAGIC_V2: &[u8; 8] = b"JOADIDX\x02";

/// The stored label of an unlabelled item (a Hugging Face test split's -1, a null class
/// cell): delivered as -1, never as a class.
pub const NO_CLASS: u32 = u32::MAX;

fn label_value(l: u32) -> i64 {
    if l == NO_CLASS { -1 } else { i64::from(l) }
}

/// The result of indexing a source: items in a deterministic order (item id = position).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DatasetIndex {
    labels: Vec<u32>,
    locations: Locations,
    /// `classes[label]` names the label.
    classes: Vec<String>,
    /// The shard files of `Location::TarMember::shard`, or the Parquet files of
    /// `Location::ParquetRow::file` (empty for other sources).
    shards: Vec<PathBuf>,
    /// The declared small fields of a source with `fields` (`None`: image and class only).
    sample: Option<SampleFields>,
    /// The fingerprint of all the items, once computed (every job's registration asks for it).
    #[serde(skip)]
    whole_fingerprint: WholeFingerprint,
}

/// [`DatasetIndex::fingerprint`] of every item, computed on first use: a built index never
/// changes (an append builds another), so it stays true. On 1.28 M entries it took about 30 ms,
/// half of what registering a job with a fraction subset cost (`bench scale`, `perf`). Not part
/// of the index's value: indexes compare equal whether or not it was computed.
#[derive(Clone, Debug, Default)]
struct WholeFingerprint(std::sync::OnceLock<String>);

impl PartialEq for WholeFingerprint {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for WholeFingerprint {}

/// The index of version 2, without fields.
#[derive(Deserialize)]
struct DatasetIndexV2 {
    labels: Vec<u32>,
    locations: Locations,
    classes: Vec<String>,
    shards: Vec<PathBuf>,
}

/// Set on a stored value's end: the item lacks that optional field.
const ABSENT: u64 = 1 << 63;

/// What reading a sample's small fields needs: the declaration, and where the values are.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct SampleFields {
    /// The declaration as JSON (postcard cannot hold its optional members).
    declared: String,
    #[serde(skip)]
    fields: Option<Fields>,
    /// `Members` locations are whole WebDataset keys (every member of the key, headers
    /// included), whose members are found at read time.
    pub(crate) keys: bool,
    /// The values are read from the item's row (`parquet` columns).
    pub(crate) columns: bool,
    /// Values stored in the index (a manifest's columns): item `i`'s value of small field
    /// `f` (of `n` small fields) is `arena[ends[i·n + f − 1]..ends[i·n + f]]`.
    #[serde(with = "serde_bytes")]
    arena: Vec<u8>,
    ends: Vec<u64>,
}

impl SampleFields {
    pub(crate) fn new(fields: &Fields, keys: bool) -> Self {
        Self {
            declared: serde_json::to_string(fields).expect("fields serialize"),
            fields: Some(fields.clone()),
            keys,
            columns: false,
            arena: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// The same, its values read from each item's row.
    pub(crate) fn with_columns(mut self) -> Self {
        self.columns = true;
        self
    }

    /// The declaration.
    pub(crate) fn fields(&self) -> &Fields {
        self.fields
            .as_ref()
            .expect("fields parsed when the index was made or read")
    }

    /// Stores one value of the item being added (values are pushed item by item, field by
    /// field in name order); `None`: an optional field the item lacks ([`ABSENT`] set on
    /// its end, no bytes).
    pub(crate) fn push_value(&mut self, value: Option<&[u8]>) {
        let absent = if value.is_none() { ABSENT } else { 0 };
        self.arena.extend_from_slice(value.unwrap_or_default());
        self.ends.push(self.arena.len() as u64 | absent);
    }

    /// Item `id`'s stored value of its `f`th small field (`n` of them), if values are stored
    /// and the item has it.
    pub(crate) fn value(&self, id: u32, f: usize, n: usize) -> Option<&[u8]> {
        let i = (id as usize).checked_mul(n)?.checked_add(f)?;
        let raw = *self.ends.get(i)?;
        if raw & ABSENT != 0 {
            return None;
        }
        let start = if i == 0 {
            0
        } else {
            (self.ends[i - 1] & !ABSENT) as usize
        };
        self.arena.get(start..raw as usize)
    }

    fn heap_bytes(&self) -> usize {
        self.arena.capacity() + self.ends.capacity() * 8
    }

    /// Parses the declaration back, and checks the values' offsets against the items.
    fn check(&mut self, items: usize) -> Result<(), String> {
        let fields: Fields = serde_json::from_str(&self.declared)
            .map_err(|e| format!("its fields do not parse: {e}"))?;
        let n = fields.small().count();
        let end = |e: u64| e & !ABSENT;
        let ok = (self.ends.is_empty() || self.ends.len() == items * n)
            && self.ends.windows(2).all(|w| end(w[0]) <= end(w[1]))
            && self
                .ends
                .last()
                .is_none_or(|&e| end(e) == self.arena.len() as u64);
        if !ok {
            return Err("its field values disagree with its items".into());
        }
        self.fields = Some(fields);
        Ok(())
    }
}

/// Every item's location, by column. One dataset comes from one source kind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
enum Locations {
    /// Item `i`'s canonical path is `arena[ends[i - 1]..ends[i]]` (from 0 for the first).
    Files {
        #[serde(with = "serde_bytes")]
        arena: Vec<u8>,
        ends: Vec<u64>,
    },
    /// Item `i` is `len[i]` bytes at `offset[i]` in shard `shard[i]`.
    Members {
        shard: Vec<u32>,
        offset: Vec<u64>,
        len: Vec<u64>,
    },
    /// Item `i` is row `row[i]` of row group `group[i]` in Parquet file `file[i]`. (Last, so
    /// that indexes persisted before it still read back.)
    Rows {
        file: Vec<u32>,
        group: Vec<u32>,
        row: Vec<u32>,
        info: RowsInfo,
    },
    /// Item `i` is row `i` of every field array: `columns[k]` locates the rows of the
    /// dataset's `shards[k]` (an `array` source; see `array.rs`). The files are opened on
    /// first read and kept in `open` (never persisted nor compared).
    Arrays {
        columns: Vec<crate::array::ArrayColumn>,
        #[serde(skip)]
        open: ReadState,
    },
}

/// Where an item's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location<'a> {
    /// A whole file (canonical path).
    File(&'a Path),
    /// `len` bytes at `offset` in shard number `shard`.
    TarMember { shard: u32, offset: u64, len: u64 },
    /// Row `row` of row group `row_group` in Parquet file number `file`.
    ParquetRow { file: u32, row_group: u32, row: u32 },
    /// Row `row` of every field array of an `array` source.
    ArrayRow { row: u32 },
}

/// Why a persisted index cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum IndexFormatError {
    #[error(
        "the index was stored by an older joader (another format); the dataset must be indexed again"
    )]
    OtherVersion,
    #[error("a damaged index: {0}")]
    Damaged(String),
}

impl DatasetIndex {
    /// Number of items.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True if there is no item (never the case for an index made by [`super::index()`]).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The label of item `id` (-1: an unlabelled item).
    pub fn label(&self, id: u32) -> Option<i64> {
        self.labels.get(id as usize).map(|&l| label_value(l))
    }

    /// Every item's label, by id (-1: an unlabelled item).
    pub fn labels(&self) -> impl ExactSizeIterator<Item = i64> + '_ {
        self.labels.iter().map(|&l| label_value(l))
    }

    /// `classes()[label]` names the label.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The shard files tar members refer to, or the Parquet files rows refer to (empty for
    /// other sources).
    pub fn shards(&self) -> &[PathBuf] {
        &self.shards
    }

    /// Where item `id`'s bytes are.
    pub fn location(&self, id: u32) -> Option<Location<'_>> {
        let i = id as usize;
        match &self.locations {
            Locations::Files { arena, ends } => {
                let end = *ends.get(i)? as usize;
                let start = if i == 0 { 0 } else { ends[i - 1] as usize };
                let bytes = arena.get(start..end)?;
                Some(Location::File(Path::new(OsStr::from_bytes(bytes))))
            }
            Locations::Members { shard, offset, len } => Some(Location::TarMember {
                shard: *shard.get(i)?,
                offset: *offset.get(i)?,
                len: *len.get(i)?,
            }),
            Locations::Rows {
                file, group, row, ..
            } => Some(Location::ParquetRow {
                file: *file.get(i)?,
                row_group: *group.get(i)?,
                row: *row.get(i)?,
            }),
            Locations::Arrays { .. } => {
                (i < self.labels.len()).then_some(Location::ArrayRow { row: id })
            }
        }
    }

    /// An `array` source's field arrays (their files are `shards()`) and its open files.
    pub(crate) fn arrays(
        &self,
    ) -> Option<(&[crate::array::ArrayColumn], &crate::array::OpenArrays)> {
        match &self.locations {
            Locations::Arrays { columns, open } => Some((columns, open.get_or_default())),
            _ => None,
        }
    }

    /// The fields the index was made with (an `array` source's default declaration once its
    /// files or objects are known), if it declares any.
    pub fn declared_fields(&self) -> Option<&Fields> {
        self.sample.as_ref().map(SampleFields::fields)
    }

    /// True if the items have an image: every source but an `array` and a declaration of
    /// fields without an `image` field. Items without one are their small fields only.
    pub fn has_image(&self) -> bool {
        !matches!(self.locations, Locations::Arrays { .. })
            && self.sample.as_ref().is_none_or(|s| s.fields().has_image())
    }

    /// The identity of the first `n` items (`None` when the index has fewer): `"n:hash"`, the
    /// xxh3-64 (hex) of each item's location (its path; its shard's path, offset and length;
    /// its Parquet file's path, row group and row) and label, in id order. A dataset that
    /// grows by items appended after these keeps the fingerprint of its first `n`, so a state
    /// saved before the append still matches (`fingerprint_matches`).
    pub fn fingerprint(&self, n: usize) -> Option<String> {
        if n != self.len() {
            return self.hash_items(n);
        }
        if let Some(f) = self.whole_fingerprint.0.get() {
            return Some(f.clone());
        }
        let f = self.hash_items(n)?;
        Some(self.whole_fingerprint.0.get_or_init(|| f).clone())
    }

    /// [`DatasetIndex::fingerprint`] computed: one pass over the first `n` items.
    fn hash_items(&self, n: usize) -> Option<String> {
        use std::hash::Hasher;
        if n > self.len() {
            return None;
        }
        let mut h = twox_hash::XxHash3_64::with_seed(0);
        let path = |h: &mut twox_hash::XxHash3_64, p: &Path| {
            let b = p.as_os_str().as_bytes();
            h.write(&(b.len() as u64).to_le_bytes());
            h.write(b);
        };
        if matches!(self.locations, Locations::Arrays { .. }) {
            // An array's rows are located by their files, the same for every row.
            for p in &self.shards {
                path(&mut h, p);
            }
        }
        for id in 0..n as u32 {
            match self.location(id)? {
                Location::File(p) => {
                    h.write(&[0]);
                    path(&mut h, p);
                }
                Location::TarMember { shard, offset, len } => {
                    h.write(&[1]);
                    path(&mut h, self.shards.get(shard as usize)?);
                    h.write(&offset.to_le_bytes());
                    h.write(&len.to_le_bytes());
                }
                Location::ParquetRow {
                    file,
                    row_group,
                    row,
                } => {
                    h.write(&[2]);
                    path(&mut h, self.shards.get(file as usize)?);
                    h.write(&row_group.to_le_bytes());
                    h.write(&row.to_le_bytes());
                }
                Location::ArrayRow { row } => {
                    h.write(&[3]);
                    h.write(&row.to_le_bytes());
                }
            }
            h.write(&self.label(id)?.to_le_bytes());
        }
        Some(format!("{n}:{:016x}", h.finish()))
    }

    /// Whether `fingerprint` (of [`fingerprint`](Self::fingerprint)) is this index's, or that
    /// of its first items (the dataset grew since).
    pub fn fingerprint_matches(&self, fingerprint: &str) -> bool {
        fingerprint
            .split_once(':')
            .and_then(|(n, _)| n.parse::<usize>().ok())
            .and_then(|n| self.fingerprint(n))
            .is_some_and(|mine| mine == fingerprint)
    }

    /// What reading a Parquet row needs besides its location (`None` for other sources).
    pub(crate) fn rows_info(&self) -> Option<&RowsInfo> {
        match &self.locations {
            Locations::Rows { info, .. } => Some(info),
            _ => None,
        }
    }

    /// Bytes of memory the index's columns hold (capacity included), classes and shard
    /// names aside.
    pub fn heap_bytes(&self) -> u64 {
        let cols = match &self.locations {
            Locations::Files { arena, ends } => arena.capacity() + ends.capacity() * 8,
            Locations::Members { shard, offset, len } => {
                shard.capacity() * 4 + offset.capacity() * 8 + len.capacity() * 8
            }
            Locations::Rows {
                file, group, row, ..
            } => (file.capacity() + group.capacity() + row.capacity()) * 4,
            Locations::Arrays { columns, .. } => {
                columns.iter().map(|c| c.row_header.capacity() + 16).sum()
            }
        };
        let fields = self.sample.as_ref().map_or(0, SampleFields::heap_bytes);
        (cols + fields + self.labels.capacity() * 4) as u64
    }

    /// The small fields' declaration and values (`None` without `fields`).
    pub(crate) fn sample_fields(&self) -> Option<&SampleFields> {
        self.sample.as_ref()
    }

    /// The persisted form: a versioned tag, then the columns.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        self.write_to(&mut out).expect("serialize a dataset index");
        out
    }

    /// Writes [`DatasetIndex::to_bytes`]'s bytes to `w` as they are made, with no copy of
    /// the whole in memory.
    pub fn write_to(&self, mut w: impl std::io::Write) -> std::io::Result<()> {
        w.write_all(MAGIC)?;
        postcard::to_io(self, w)
            .map(|_| ())
            .map_err(std::io::Error::other)
    }

    /// Reads back what [`DatasetIndex::to_bytes`] wrote, checking that the columns agree.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, IndexFormatError> {
        let damaged = |e: postcard::Error| IndexFormatError::Damaged(e.to_string());
        let mut ix: DatasetIndex = if let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) {
            postcard::from_bytes(body).map_err(damaged)?
        } else if let Some(body) = bytes.strip_prefix(MAGIC_V2.as_slice()) {
            let v2: DatasetIndexV2 = postcard::from_bytes(body).map_err(damaged)?;
            DatasetIndex {
                labels: v2.labels,
                locations: v2.locations,
                classes: v2.classes,
                shards: v2.shards,
                sample: None,
                whole_fingerprint: WholeFingerprint::default(),
            }
        } else {
            return Err(
                if bytes.starts_with(&MAGIC[..7]) || bytes.first() == Some(&b'{') {
                    IndexFormatError::OtherVersion
                } else {
                    IndexFormatError::Damaged("no index tag".into())
                },
            );
        };
        ix.check().map_err(IndexFormatError::Damaged)?;
        Ok(ix)
    }

    /// Columns of one length, path offsets within the arena and increasing, labels named.
    fn check(&mut self) -> Result<(), String> {
        let n = self.labels.len();
        if let Some(sample) = &mut self.sample {
            sample.check(n)?;
        }
        let ok = match &self.locations {
            Locations::Files { arena, ends } => {
                ends.len() == n
                    && ends.windows(2).all(|w| w[0] <= w[1])
                    && ends.last().is_none_or(|&e| e == arena.len() as u64)
            }
            Locations::Members { shard, offset, len } => {
                shard.len() == n
                    && offset.len() == n
                    && len.len() == n
                    && shard.iter().all(|&s| (s as usize) < self.shards.len())
            }
            Locations::Rows {
                file, group, row, ..
            } => {
                file.len() == n
                    && group.len() == n
                    && row.len() == n
                    && file.iter().all(|&f| (f as usize) < self.shards.len())
            }
            Locations::Arrays { columns, .. } => {
                columns.len() == self.shards.len()
                    && columns.iter().all(|c| {
                        crate::fields::NpyHeader::parse(&c.row_header).is_ok()
                            && c.row_header.len() < 1 << 20
                    })
            }
        };
        if !ok {
            return Err("its columns disagree".into());
        }
        if self
            .labels
            .iter()
            .any(|&l| l != NO_CLASS && l as usize >= self.classes.len())
        {
            return Err("a label has no class".into());
        }
        Ok(())
    }
}

/// Builds a [`DatasetIndex`] one item at a time, straight into its columns.
pub(super) struct IndexBuilder {
    labels: Vec<u32>,
    locations: Locations,
    /// The small fields, when the source declares some.
    pub(super) sample: Option<SampleFields>,
    /// Label texts, for sources that store classes as text (manifest labels, shards' class
    /// members, a string Parquet column), each numbered provisionally.
    pub(super) texts: crate::classes::ClassTexts,
}

impl IndexBuilder {
    /// The class names of labels pushed as texts' provisional numbers, the labels made final
    /// (numbers when every text is one and `numbers` allows it: [`ClassTexts::finish`]).
    ///
    /// [`ClassTexts::finish`]: crate::classes::ClassTexts::finish
    pub(super) fn text_classes(
        &mut self,
        numbers: bool,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<String>, crate::StorageError> {
        std::mem::take(&mut self.texts).finish(&mut self.labels, numbers, what)
    }

    pub(super) fn files() -> Self {
        Self::files_with_capacity(0, 0)
    }

    /// A builder of about `items` files whose paths take about `path_bytes` in all. The
    /// columns are allocated once at these sizes, so that an index of a million entries is
    /// not built by doubling (each step copies the column and frees the old one, memory that
    /// the allocator keeps: for ImageNet's manifest the freed copies outweighed the index).
    /// Pages the columns never use are never touched, so an estimate above the need costs
    /// address space, not memory.
    pub(super) fn files_with_capacity(items: usize, path_bytes: usize) -> Self {
        Self {
            labels: Vec::with_capacity(items),
            locations: Locations::Files {
                arena: Vec::with_capacity(path_bytes),
                ends: Vec::with_capacity(items),
            },
            sample: None,
            texts: Default::default(),
        }
    }

    pub(super) fn members() -> Self {
        Self {
            labels: Vec::new(),
            locations: Locations::Members {
                shard: Vec::new(),
                offset: Vec::new(),
                len: Vec::new(),
            },
            sample: None,
            texts: Default::default(),
        }
    }

    /// A builder of `rows` Parquet rows: its columns allocated once, at their size.
    pub(super) fn rows(rows: usize) -> Self {
        Self {
            labels: Vec::with_capacity(rows),
            locations: Locations::Rows {
                file: Vec::with_capacity(rows),
                group: Vec::with_capacity(rows),
                row: Vec::with_capacity(rows),
                info: RowsInfo::default(),
            },
            sample: None,
            texts: Default::default(),
        }
    }

    /// A builder of `rows` rows of an `array` source's `columns`.
    pub(super) fn arrays(rows: usize, columns: Vec<crate::array::ArrayColumn>) -> Self {
        Self {
            labels: Vec::with_capacity(rows),
            locations: Locations::Arrays {
                columns,
                open: ReadState::default(),
            },
            sample: None,
            texts: Default::default(),
        }
    }

    /// Adds the next row of an `array` source (a builder made by [`IndexBuilder::arrays`]).
    pub(super) fn push_array_row(&mut self, label: u32) {
        self.labels.push(label);
    }

    /// Adds a Parquet row (a builder made by [`IndexBuilder::rows`]).
    pub(super) fn push_row(&mut self, file_no: u32, group_no: u32, row_no: u32, label: u32) {
        let Locations::Rows {
            file, group, row, ..
        } = &mut self.locations
        else {
            unreachable!("a Parquet row pushed into a builder of another kind");
        };
        file.push(file_no);
        group.push(group_no);
        row.push(row_no);
        self.labels.push(label);
    }

    /// The index of Parquet rows (a builder made by [`IndexBuilder::rows`]).
    pub(super) fn finish_rows(
        mut self,
        classes: Vec<String>,
        files: Vec<PathBuf>,
        rows_info: RowsInfo,
    ) -> DatasetIndex {
        if let Locations::Rows { info, .. } = &mut self.locations {
            *info = rows_info;
        }
        self.finish(classes, files)
    }

    /// Adds a file item (a builder made by [`IndexBuilder::files`]).
    pub(super) fn push_file(&mut self, path: &Path, label: u32) {
        let Locations::Files { arena, ends } = &mut self.locations else {
            unreachable!("a file pushed into a builder of another kind");
        };
        arena.extend_from_slice(path.as_os_str().as_bytes());
        ends.push(arena.len() as u64);
        self.labels.push(label);
    }

    /// Adds a tar member item (a builder made by [`IndexBuilder::members`]).
    pub(super) fn push_member(&mut self, shard_no: u32, at: u64, length: u64, label: u32) {
        let Locations::Members { shard, offset, len } = &mut self.locations else {
            unreachable!("a tar member pushed into a builder of another kind");
        };
        shard.push(shard_no);
        offset.push(at);
        len.push(length);
        self.labels.push(label);
    }

    /// The labels pushed so far, to be rewritten once every class is known.
    pub(super) fn labels_mut(&mut self) -> &mut [u32] {
        &mut self.labels
    }

    /// The index, its columns trimmed to their length.
    pub(super) fn finish(mut self, classes: Vec<String>, shards: Vec<PathBuf>) -> DatasetIndex {
        self.labels.shrink_to_fit();
        match &mut self.locations {
            Locations::Files { arena, ends } => {
                arena.shrink_to_fit();
                ends.shrink_to_fit();
            }
            Locations::Members { shard, offset, len } => {
                shard.shrink_to_fit();
                offset.shrink_to_fit();
                len.shrink_to_fit();
            }
            Locations::Rows {
                file, group, row, ..
            } => {
                file.shrink_to_fit();
                group.shrink_to_fit();
                row.shrink_to_fit();
            }
            Locations::Arrays { .. } => {}
        }
        if let Some(sample) = &mut self.sample {
            sample.arena.shrink_to_fit();
            sample.ends.shrink_to_fit();
        }
        DatasetIndex {
            labels: self.labels,
            locations: self.locations,
            classes,
            shards,
            sample: self.sample,
            whole_fingerprint: WholeFingerprint::default(),
        }
    }
}
