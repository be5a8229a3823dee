//! The read state of one `parquet` dataset, shared by the Loader's threads: what makes a row
//! cost about its own bytes rather than its row group's.
//!
//! - **Files**: each file's footer is parsed once and kept with the open file (at most
//!   [`MAX_OPEN_FILES`] at a time, the oldest dropped first); the readers of a file being
//!   opened wait for it.
//! - **Row directories**: the first read of a row group reads its image column chunk whole
//!   (one `pread`), lets the `parquet` crate decode it (page headers, dictionary page,
//!   levels, encodings), and notes where each row's value lies (`pages.rs`): the page that holds its bytes
//!   (a data page, or the dictionary page for a dictionary-encoded row, as `pyarrow` writes
//!   Hugging Face's images by default) and its position in the page's decompressed payload.
//!   For a Snappy page (the default) it also notes the piece of the compressed stream that
//!   produces the value alone (`snappy.rs`); for an uncompressed page the value's own bytes.
//!   Every later read of a row of that group is one `pread` of about the value's bytes and,
//!   for Snappy, the decompression of that piece only. A directory costs
//!   `size_of::<Row>()` (32) bytes per row, 3.2 KiB for Hugging Face's 100-row groups, and
//!   the directories are kept up to [`DIRECTORY_BUDGET`] (2 M rows), the oldest dropped
//!   first. Files with an offset index are read the same way: the one pass over the chunk
//!   finds the pages without it.
//! - **Decoded rows**: the rows decoded by a group's first read are kept for a while
//!   (up to [`DECODED_BUDGET`] bytes, the oldest group dropped first; a group larger than
//!   that is not kept), so that rows of one page due together are not read again; codecs whose stream
//!   cannot be entered in the middle (zstd, gzip) are read this way only: a group's column is
//!   decoded whole once for the rows read while it is kept.
//!
//! The build of a group holds its compressed chunk and its decoded pages at once (twice the
//! chunk, about 22 MB for an ImageNet-sized group of 100 images); readers of the same group
//! wait for it rather than build it again.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use parquet::data_type::ByteArray;

use super::Input;
use super::input::{OpenFile, lock};
use super::pages::{self, Directory, Row, fewer_rows};
use super::snappy;
use super::spill::Spill;

/// Files whose footer and descriptor are kept at once.
pub(super) const MAX_OPEN_FILES: usize = 256;
/// Bytes of row directories kept, by default.
pub const DIRECTORY_BUDGET: usize = 64 << 20;
/// Bytes of decoded rows kept, by default (the server's is sized from its cache: see its
/// `parquet_decoded_bytes`).
pub const DECODED_BUDGET: usize = 64 << 20;
/// Bytes of small-field values kept (row groups' values of the fields' columns), by default.
pub const FIELDS_BUDGET: usize = 32 << 20;

/// What the reads of a dataset have cost so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParquetReads {
    /// Rows read (image bytes returned).
    pub rows: u64,
    /// Bytes read from the files (row groups' chunks on their first read, pieces after).
    pub bytes_read: u64,
    /// Bytes of decompressed output (pages on a group's first read, pieces after).
    pub bytes_decompressed: u64,
    /// Row groups decoded whole (a first read, or a read after its decoded rows were dropped
    /// where no directory could be made).
    pub groups_decoded: u64,
    /// Rows served from decoded rows kept.
    pub decoded_hits: u64,
    /// Row groups' small-field columns read whole (a binary column in one pass, a struct or
    /// list assembled), once for the group's rows read while their values are kept.
    pub field_groups: u64,
    /// Small-field values served from those kept.
    pub field_hits: u64,
    /// Row groups of zstd or gzip pages spilled decoded to local disk (`spill.rs`).
    pub spilled_groups: u64,
    /// Rows read from a spilled group (one positioned read of the row's bytes).
    pub spill_hits: u64,
    /// Bytes the reader's spilled groups take on disk now.
    pub spill_bytes: u64,
}

#[derive(Default)]
struct Counters {
    rows: AtomicU64,
    bytes_read: AtomicU64,
    bytes_decompressed: AtomicU64,
    groups_decoded: AtomicU64,
    decoded_hits: AtomicU64,
    field_groups: AtomicU64,
    field_hits: AtomicU64,
    spilled_groups: AtomicU64,
    spill_hits: AtomicU64,
}

/// A file's state: `None` until it is opened (a failed open leaves it `None`).
type FileSlot = Mutex<Option<Arc<OpenFile>>>;

/// A row group's state: `None` until its first read; `Some(None)` when it cannot be located
/// (its rows are read from its decoded column).
type Slot = Mutex<Option<Option<Arc<Directory>>>>;

/// A row group's decoded image column: each row's bytes (`None`: null).
type Decoded = Arc<Vec<Option<ByteArray>>>;

/// A row group's values of one small field: each row's value as the field's bytes (`None`:
/// null), or why it cannot be one.
pub(super) type FieldValuesOfGroup = Arc<Vec<Result<Option<Vec<u8>>, String>>>;

/// A row group's values of one small field: `None` until read.
type FieldSlot = Mutex<Option<FieldValuesOfGroup>>;

/// How a dataset whose files are objects opens one (the `s3` source installs it when it
/// opens the dataset; without one, the index's files are local paths).
pub(crate) trait Objects: Send + Sync {
    /// File number `n`, recorded in the index as `recorded` (its key).
    fn open(&self, n: u32, recorded: &std::path::Path) -> Result<Arc<Input>, super::StorageError>;
}

/// The per-dataset read state (see the module docs).
pub(crate) struct Reader {
    objects: Mutex<Option<Arc<dyn Objects>>>,
    files: Mutex<Fifo<u32, Arc<FileSlot>>>,
    groups: Mutex<Fifo<(u32, u32), Arc<Slot>>>,
    decoded: Mutex<Fifo<(u32, u32), Decoded>>,
    /// By (file, group, small field's number).
    fields: Mutex<Fifo<(u32, u32, u32), Arc<FieldSlot>>>,
    counters: Counters,
    budgets: Budgets,
    /// Zstd and gzip groups decoded once, on local disk (`None`: the server spills nothing).
    spill: Option<Spill>,
}

impl Default for Reader {
    /// The budgets and the spill configured for the process.
    fn default() -> Self {
        Reader {
            objects: Mutex::default(),
            files: Mutex::default(),
            groups: Mutex::default(),
            decoded: Mutex::default(),
            fields: Mutex::default(),
            counters: Counters::default(),
            budgets: Budgets::default(),
            spill: Spill::configured(),
        }
    }
}

/// How much a [`Reader`] keeps: files, bytes of directories, bytes of decoded rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Budgets {
    pub(super) files: usize,
    pub(super) directories: usize,
    pub(super) decoded: usize,
    pub(super) fields: usize,
}

impl Default for Budgets {
    /// The budgets configured for the process ([`ParquetBudgets::set`]), else the defaults.
    fn default() -> Self {
        let b = ParquetBudgets::current();
        Budgets {
            files: MAX_OPEN_FILES,
            directories: b.directories,
            decoded: b.decoded,
            fields: b.fields,
        }
    }
}

/// What the reader of each `parquet` dataset keeps in the server's memory, in bytes (`joader
/// serve --parquet-decoded-bytes`, `--parquet-directory-bytes`, `--parquet-field-bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParquetBudgets {
    /// Decoded rows of row groups (what a compressed group's pages decompress to).
    pub decoded: usize,
    /// Row directories (where each row lies in a group's pages).
    pub directories: usize,
    /// Row groups' small-field values.
    pub fields: usize,
}

/// The budgets of the readers made from now on (set once by the server at start).
static CONFIGURED: std::sync::Mutex<Option<ParquetBudgets>> = std::sync::Mutex::new(None);

impl Default for ParquetBudgets {
    fn default() -> Self {
        ParquetBudgets {
            decoded: DECODED_BUDGET,
            directories: DIRECTORY_BUDGET,
            fields: FIELDS_BUDGET,
        }
    }
}

impl ParquetBudgets {
    /// Makes these the budgets of every reader made from now on, in this process.
    pub fn set(self) {
        *CONFIGURED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(self);
    }

    /// The budgets set for the process, else the defaults.
    pub fn current() -> Self {
        CONFIGURED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("reads", &self.reads())
            .finish()
    }
}

/// What a [`Reader`] holds (tests).
#[cfg(test)]
#[derive(Debug)]
pub(super) struct Held {
    pub(super) files: usize,
    pub(super) groups: usize,
    pub(super) group_bytes: usize,
    pub(super) decoded_bytes: usize,
}

/// What a row read found: bytes, or a null `bytes` leaf.
pub(super) enum Found {
    Bytes(Vec<u8>),
    Null,
}

impl Reader {
    #[cfg(test)]
    pub(super) fn with_budgets(budgets: Budgets) -> Reader {
        Reader {
            budgets,
            ..Reader::default()
        }
    }

    #[cfg(test)]
    pub(super) fn with_spill(budgets: Budgets, spill: Spill) -> Reader {
        Reader {
            budgets,
            spill: Some(spill),
            ..Reader::default()
        }
    }

    /// What it holds now.
    #[cfg(test)]
    pub(super) fn held(&self) -> Held {
        let (groups, decoded) = (lock(&self.groups), lock(&self.decoded));
        Held {
            files: lock(&self.files).map.len(),
            groups: groups.map.len(),
            group_bytes: groups.cost,
            decoded_bytes: decoded.cost,
        }
    }

    pub(crate) fn reads(&self) -> ParquetReads {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ParquetReads {
            rows: get(&c.rows),
            bytes_read: get(&c.bytes_read),
            bytes_decompressed: get(&c.bytes_decompressed),
            groups_decoded: get(&c.groups_decoded),
            decoded_hits: get(&c.decoded_hits),
            field_groups: get(&c.field_groups),
            field_hits: get(&c.field_hits),
            spilled_groups: get(&c.spilled_groups),
            spill_hits: get(&c.spill_hits),
            spill_bytes: self
                .spill
                .as_ref()
                .map_or(0, |s| s.bytes.load(Ordering::Relaxed)),
        }
    }

    /// Reads the dataset's files as objects from now on (files opened before are dropped).
    pub(crate) fn set_objects(&self, objects: Arc<dyn Objects>) {
        *lock(&self.objects) = Some(objects);
        *lock(&self.files) = Fifo::default();
    }

    /// How the dataset's files are opened, when they are objects.
    pub(super) fn objects(&self) -> Option<Arc<dyn Objects>> {
        lock(&self.objects).clone()
    }

    /// Drops the decoded rows kept, as a pass over a dataset larger than their budget does.
    pub(crate) fn drop_decoded(&self) {
        *lock(&self.decoded) = Fifo::default();
    }

    fn count(&self, counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// File number `n`, opened by `open` (its footer parsed) on first use; readers of a
    /// file being opened wait for it rather than open it again (an object's footer is a GET).
    pub(super) fn file(
        &self,
        n: u32,
        open: impl FnOnce() -> Result<OpenFile, super::StorageError>,
    ) -> Result<Arc<OpenFile>, super::StorageError> {
        let slot = lock(&self.files).slot(n, 1, self.budgets.files);
        let mut state = lock(&slot);
        if let Some(f) = &*state {
            return Ok(f.clone());
        }
        let f = Arc::new(open()?);
        *state = Some(f.clone());
        Ok(f)
    }

    /// The image bytes of row `row` of group `group` in `file` (file number `n`).
    pub(super) fn read_row(
        &self,
        n: u32,
        file: &OpenFile,
        group: u32,
        row: u32,
    ) -> Result<Found, String> {
        let key = (n, group);
        let slot = lock(&self.groups).slot(key, 0, self.budgets.directories);
        let directory = {
            let mut state = lock(&slot);
            match &*state {
                Some(d) => d.clone(),
                None => {
                    let (directory, decoded) = self.build(file, group)?;
                    let directory = directory.map(Arc::new);
                    *state = Some(directory.clone());
                    let cost = directory.as_ref().map_or(size_of::<Slot>(), |d| d.cost());
                    lock(&self.groups).insert(key, slot.clone(), cost, self.budgets.directories);
                    let found = from_decoded(&decoded, row)?;
                    if directory.is_none() {
                        self.spill_decoded(key, &decoded);
                    }
                    self.keep_decoded(key, decoded);
                    self.count(&self.counters.rows, 1);
                    return Ok(found);
                }
            }
        };
        if let Some(decoded) = lock(&self.decoded).get(&key).cloned() {
            self.count(&self.counters.decoded_hits, 1);
            self.count(&self.counters.rows, 1);
            return from_decoded(&decoded, row);
        }
        let found = match directory {
            Some(d) => self.read_located(file, &d, row)?,
            None => match self.spilled_row(key, row) {
                Some(found) => found?,
                None => {
                    let (_, decoded) = self.build(file, group)?;
                    let found = from_decoded(&decoded, row)?;
                    self.spill_decoded(key, &decoded);
                    self.keep_decoded(key, decoded);
                    found
                }
            },
        };
        self.count(&self.counters.rows, 1);
        Ok(found)
    }

    /// The values of small field `key.2` in group `key.1` of file `key.0` when they are kept
    /// (counted as a hit), else `None`.
    pub(super) fn kept_field_values(&self, key: (u32, u32, u32)) -> Option<FieldValuesOfGroup> {
        // The slot is locked after the map is let go: `field_values` holds a slot while it
        // inserts into the map.
        let slot = lock(&self.fields).get(&key).cloned()?;
        let kept = lock(&slot).clone()?;
        self.count(&self.counters.field_hits, 1);
        Some(kept)
    }

    /// The values of small field `key.2` in group `key.1` of file `key.0`, from those kept,
    /// or read by `read` (the group's column read whole once, rather than the rows up to each
    /// one for every row read) and kept unless they alone exceed the budget; readers of a
    /// group being read wait for it rather than read it again.
    pub(super) fn field_values(
        &self,
        key: (u32, u32, u32),
        read: impl FnOnce() -> Result<FieldValuesOfGroup, String>,
    ) -> Result<FieldValuesOfGroup, String> {
        let slot = lock(&self.fields).slot(key, 0, self.budgets.fields);
        let mut state = lock(&slot);
        if let Some(r) = &*state {
            self.count(&self.counters.field_hits, 1);
            return Ok(r.clone());
        }
        let values = read()?;
        self.count(&self.counters.field_groups, 1);
        let cost = values
            .iter()
            .map(|v| v.as_ref().map_or(0, |b| b.as_ref().map_or(0, Vec::len)) + 32)
            .sum();
        if cost <= self.budgets.fields {
            *state = Some(values.clone());
            lock(&self.fields).insert(key, slot.clone(), cost, self.budgets.fields);
        } else {
            // Not kept: its empty slot still counts, so that such slots stay bounded.
            let empty = size_of::<FieldSlot>();
            lock(&self.fields).insert(key, slot.clone(), empty, self.budgets.fields);
        }
        Ok(values)
    }

    /// Spills a group's decoded rows that cannot be located in its pages (zstd, gzip).
    fn spill_decoded(&self, key: (u32, u32), decoded: &Decoded) {
        if let Some(s) = &self.spill
            && s.put(key, decoded.iter().map(|v| v.as_ref().map(ByteArray::data))) > 0
        {
            self.count(&self.counters.spilled_groups, 1);
        }
    }

    /// Row `row` of group `key` from the spill, when it is there (one read of its bytes).
    fn spilled_row(&self, key: (u32, u32), row: u32) -> Option<Result<Found, String>> {
        let got = self.spill.as_ref()?.get(key, row)?;
        self.count(&self.counters.spill_hits, 1);
        Some(got.map(|v| match v {
            Some(b) => {
                self.count(&self.counters.bytes_read, b.len());
                Found::Bytes(b)
            }
            None => Found::Null,
        }))
    }

    /// Keeps a group's decoded rows, unless they alone exceed the budget.
    fn keep_decoded(&self, key: (u32, u32), decoded: Decoded) {
        let cost = decoded
            .iter()
            .map(|v| v.as_ref().map_or(0, ByteArray::len) + 16)
            .sum();
        if cost <= self.budgets.decoded {
            lock(&self.decoded).insert(key, decoded, cost, self.budgets.decoded);
        }
    }

    /// A located row: one read of its piece, and for Snappy the piece decompressed.
    fn read_located(&self, file: &OpenFile, d: &Directory, row: u32) -> Result<Found, String> {
        let Some(&r) = d.rows.get(row as usize) else {
            return Err(fewer_rows());
        };
        let Row::Value {
            page,
            at,
            len,
            span,
        } = r
        else {
            return Ok(Found::Null);
        };
        if len == 0 {
            return Ok(Found::Bytes(Vec::new()));
        }
        let stream = d.streams[page as usize];
        if !stream.snappy {
            let bytes = file
                .file
                .read_range(stream.offset + u64::from(at), len as usize)?;
            self.count(&self.counters.bytes_read, bytes.len());
            return Ok(Found::Bytes(bytes));
        }
        let piece = file.file.read_range(
            stream.offset + u64::from(span.start),
            (span.end - span.start) as usize,
        )?;
        self.count(&self.counters.bytes_read, piece.len());
        let mut out = snappy::decode_span(&piece, &span, (at + len - span.out_start) as usize)
            .map_err(|e| format!("{e} (the file changed since it was first read?)"))?;
        self.count(&self.counters.bytes_decompressed, out.len());
        out.drain(..(at - span.out_start) as usize);
        Ok(Found::Bytes(out))
    }

    /// Reads and decodes row group `group`'s image column: its rows, and their directory when
    /// every value can be located.
    fn build(&self, file: &OpenFile, group: u32) -> Result<(Option<Directory>, Decoded), String> {
        let d = pages::decode(file, group)?;
        self.count(&self.counters.bytes_read, d.chunk.bytes.len());
        self.count(&self.counters.groups_decoded, 1);
        let decompressed: usize = d.pages.iter().map(|p| p.buf.len()).sum();
        self.count(&self.counters.bytes_decompressed, decompressed);
        let directory = pages::locate(&d.chunk, &d.pages, &d.rows, d.codec);
        Ok((directory, Arc::new(d.rows)))
    }
}

fn from_decoded(decoded: &[Option<ByteArray>], row: u32) -> Result<Found, String> {
    match decoded.get(row as usize) {
        None => Err(fewer_rows()),
        Some(None) => Ok(Found::Null),
        Some(Some(v)) => Ok(Found::Bytes(v.data().to_vec())),
    }
}

/// A map of at most `budget` cost, dropping its oldest entries first (the newest is always
/// kept).
struct Fifo<K, V> {
    map: HashMap<K, (V, usize)>,
    order: VecDeque<K>,
    cost: usize,
}

impl<K, V> Default for Fifo<K, V> {
    fn default() -> Self {
        Fifo {
            map: HashMap::new(),
            order: VecDeque::new(),
            cost: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, T: Default> Fifo<K, Arc<Mutex<T>>> {
    /// The slot of `k`, inserted empty at `cost` when missing.
    fn slot(&mut self, k: K, cost: usize, budget: usize) -> Arc<Mutex<T>> {
        if let Some(s) = self.get(&k) {
            return s.clone();
        }
        let s = Arc::new(Mutex::new(T::default()));
        self.insert(k, s.clone(), cost, budget);
        s
    }
}

impl<K: Hash + Eq + Clone, V> Fifo<K, V> {
    fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k).map(|(v, _)| v)
    }

    /// Inserts or replaces `k`, then drops the oldest entries while over `budget`.
    fn insert(&mut self, k: K, v: V, cost: usize, budget: usize) {
        match self.map.insert(k.clone(), (v, cost)) {
            Some((_, old)) => self.cost -= old,
            None => self.order.push_back(k),
        }
        self.cost += cost;
        while self.cost > budget && self.order.len() > 1 {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, c)) = self.map.remove(&oldest) {
                self.cost -= c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fifo;

    #[test]
    fn a_fifo_keeps_its_budget_and_its_newest_entry() {
        let mut f = Fifo::default();
        for i in 0..10u32 {
            f.insert(i, i, 30, 100);
            assert!(f.cost <= 100);
        }
        assert_eq!(f.map.len(), 3);
        assert!(f.get(&9).is_some() && f.get(&6).is_none());
        f.insert(10, 10, 500, 100);
        assert_eq!((f.map.len(), f.get(&10)), (1, Some(&10)));
        // Replacing an entry counts its new cost only.
        f.insert(10, 11, 20, 100);
        assert_eq!((f.cost, f.map.len()), (20, 1));
    }
}
