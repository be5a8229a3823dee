//! Where a Parquet file's bytes come from: a local file read with positioned reads (`pread`,
//! so that readers on several threads share no file offset), or an object read with ranged
//! GETs (`s3/parquet.rs` implements [`Ranges`] over the fetch stage). The indexing, the
//! reader, the pages and the Snappy code read either through [`Input`], the `parquet`
//! crate's `ChunkReader`.
//!
//! Indexing reads [`Files`]: local files one at a time, objects several at once (each read
//! waits on the network).
//!
//! An object keeps what was fetched ahead of its reads ([`Input::prefetch`]: its footer's
//! tail, the column chunks of the labels or of a row group's small fields, each fetched with
//! one GET, all at once), up to [`KEPT_BUDGET`] bytes, so that the crate's many small reads
//! of page headers and pages are served from memory rather than each being a request.
//!
//! A read the store failed reaches the crate as text; the store's error itself is kept for
//! the caller (`STORE_ERROR`, taken by `mod.rs`'s `guarded`), so that an element or a
//! dataset fails with the store's code (`s3_unavailable`, `s3_refused`: "re-index the
//! dataset") rather than as a damaged file.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    ParquetMetaData, ParquetMetaDataOptions, ParquetMetaDataReader, ParquetStatisticsPolicy,
};
use parquet::file::reader::{ChunkReader, Length};

use super::{ImageColumn, bad};
use crate::StorageError;

/// A file's descriptor and parsed footer.
pub(super) struct OpenFile {
    pub(super) file: Arc<Input>,
    pub(super) meta: ParquetMetaData,
    /// `None`: the dataset's rows have no image (its fields declare none).
    pub(super) image: Option<ImageColumn>,
}

/// Locks one of the reader's mutexes.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent state (inserts and removes
    // are single operations): carry on with it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The tail of an object fetched to read its footer: one GET holds the footers of files as
/// Hugging Face writes them (a few KiB); a larger footer takes a second.
pub(crate) const TAIL: u64 = 64 << 10;

/// Bytes an object keeps of what was fetched ahead (the oldest dropped first): the dataset's
/// reader keeps up to 256 open files, so at most 256 MiB in all, and far less in practice
/// (a footer's tail, and a row group's small-field chunks, a few KiB each).
pub(crate) const KEPT_BUDGET: usize = 1 << 20;

/// Row groups whose class chunks indexing fetches at once (a few hundred bytes each).
const LABEL_GROUPS: usize = 64;

/// A read of bytes not fetched ahead: a page header's window (headers are a few hundred
/// bytes; the crate reads on until it has one).
const WINDOW: u64 = 64 << 10;

/// Ranged reads of an object (blocking).
pub(crate) trait Ranges: Send + Sync {
    /// The bytes of each range, in order (fetched at once).
    fn get(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, StorageError>;
}

thread_local! {
    /// The store's error behind this thread's last failed read of an object: the crate sees
    /// text, the caller gets this error back ([`store_error_or`]).
    static STORE_ERROR: std::cell::RefCell<Option<StorageError>> = const {
        std::cell::RefCell::new(None)
    };
}

/// Forgets the store error of an earlier read on this thread.
pub(super) fn clear_store_error() {
    STORE_ERROR.take();
}

/// The store's error when one made this failure (a store that failed or refused a read is
/// no damaged file: its code says what happened), else `e`.
pub(super) fn store_error_or(e: StorageError) -> StorageError {
    STORE_ERROR.take().unwrap_or(e)
}

/// A store's error as the text the `parquet` crate carries, kept for the caller.
fn failed(e: StorageError) -> String {
    let text = e.to_string();
    STORE_ERROR.set(Some(e));
    text
}

/// A Parquet file's bytes, local or remote.
pub(crate) struct Input {
    len: u64,
    from: From,
}

enum From {
    File(Arc<File>),
    Object {
        ranges: Box<dyn Ranges>,
        /// Ranges fetched ahead, oldest first, with their bytes.
        kept: Mutex<Vec<(u64, Bytes)>>,
    },
}

impl Input {
    /// A local file.
    pub(crate) fn open(path: &Path) -> io::Result<Arc<Input>> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Arc::new(Input {
            len,
            from: From::File(Arc::new(file)),
        }))
    }

    /// An object of `len` bytes, read through `ranges`.
    pub(crate) fn object(ranges: Box<dyn Ranges>, len: u64) -> Arc<Input> {
        Arc::new(Input {
            len,
            from: From::Object {
                ranges,
                kept: Mutex::new(Vec::new()),
            },
        })
    }

    /// Whether it is an object (its rows' `path`s name no local file).
    pub(crate) fn is_object(&self) -> bool {
        matches!(self.from, From::Object { .. })
    }

    /// The file's footer, parsed without its statistics, which nothing here uses (its page
    /// indexes are not read): a smaller, faster parse, and footers the reader keeps cost less.
    /// An object's tail is fetched first, with one GET.
    pub(crate) fn metadata(&self, path: &Path) -> Result<ParquetMetaData, StorageError> {
        let bad = bad(path);
        let tail = self.len.saturating_sub(TAIL)..self.len;
        self.prefetch(std::slice::from_ref(&tail))
            .map_err(|e| bad(format!("its footer cannot be read: {e}")))?;
        let options = ParquetMetaDataOptions::new()
            .with_column_stats_policy(ParquetStatisticsPolicy::SkipAll)
            .with_encoding_stats_policy(ParquetStatisticsPolicy::SkipAll)
            .with_size_stats_policy(ParquetStatisticsPolicy::SkipAll);
        ParquetMetaDataReader::new()
            .with_metadata_options(Some(options))
            .parse_and_finish(self)
            .map_err(|e| bad(format!("its footer cannot be read: {e}")))
    }

    /// Fetches `ranges` of an object ahead of the reads that need them, with one GET each,
    /// all at once (those already kept, or larger than [`KEPT_BUDGET`], are not). Nothing
    /// for a local file, which the reads themselves read.
    pub(crate) fn prefetch(&self, ranges: &[Range<u64>]) -> Result<(), String> {
        let From::Object { ranges: get, kept } = &self.from else {
            return Ok(());
        };
        let missing: Vec<Range<u64>> = {
            let kept = lock(kept);
            ranges
                .iter()
                .filter(|r| r.start < r.end && r.end <= self.len)
                .filter(|r| (r.end - r.start) as usize <= KEPT_BUDGET)
                .filter(|r| find(&kept, r.start, (r.end - r.start) as usize).is_none())
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let fetched = get.get(&missing).map_err(failed)?;
        let mut kept = lock(kept);
        for (r, bytes) in missing.iter().zip(fetched) {
            if bytes.len() as u64 == r.end - r.start {
                kept.push((r.start, bytes));
            }
        }
        let mut total: usize = kept.iter().map(|(_, b)| b.len()).sum();
        while total > KEPT_BUDGET && kept.len() > 1 {
            total -= kept.remove(0).1.len();
        }
        Ok(())
    }

    /// `len` bytes at `start`, which must lie within the file.
    pub(crate) fn read_range(&self, start: u64, len: usize) -> Result<Vec<u8>, String> {
        let bytes = self.get_bytes(start, len).map_err(|e| e.to_string())?;
        Ok(bytes.into())
    }

    /// Bytes `start..start + len` of an object, from what it keeps or with one GET.
    fn object_bytes(&self, start: u64, len: usize) -> parquet::errors::Result<Bytes> {
        let From::Object { ranges, kept } = &self.from else {
            unreachable!("called for objects only");
        };
        if len == 0 {
            return Ok(Bytes::new());
        }
        if let Some(b) = find(&lock(kept), start, len) {
            return Ok(b);
        }
        let mut got = ranges
            .get(std::slice::from_ref(&(start..start + len as u64)))
            .map_err(|e| ParquetError::General(failed(e)))?;
        got.pop()
            .filter(|b| b.len() == len)
            .ok_or_else(|| ParquetError::General(format!("no answer for {len} bytes at {start}")))
    }
}

/// The files of a dataset being indexed: local files, or the objects of an `s3` source.
pub(crate) struct Files<'a> {
    /// Each file as the index records it: its canonical path, or its key.
    pub(crate) recorded: Vec<PathBuf>,
    /// Each file as errors name it: its path, or its `s3://` url.
    pub(crate) named: Vec<PathBuf>,
    /// Opens file number `n`.
    pub(crate) open: &'a (dyn Fn(usize) -> Result<Arc<Input>, StorageError> + Sync),
    /// Files read at once (their footers and class columns): 1 for local files, more for
    /// objects, whose reads wait on the network.
    pub(crate) ahead: usize,
}

/// What indexing reads of a file: its footer, and the class column's values of each row
/// group when `class` names a column the file holds (else the checks say why).
pub(super) struct FileRead {
    pub(super) meta: ParquetMetaData,
    pub(super) labels: Option<Result<Vec<super::GroupLabels>, String>>,
}

pub(super) fn read_file(
    files: &Files<'_>,
    n: usize,
    class: Option<&str>,
) -> Result<FileRead, StorageError> {
    let input = (files.open)(n)?;
    let meta = input.metadata(&files.named[n])?;
    let leaf = class.and_then(|c| super::class_leaf(meta.file_metadata().schema_descr(), c).ok());
    // An object's class chunks are fetched [`LABEL_GROUPS`] row groups at a time, all at
    // once, so that what it keeps of them stays within its budget.
    let labels = leaf.map(|leaf| {
        let mut labels = Vec::with_capacity(meta.num_row_groups());
        for groups in meta.row_groups().chunks(LABEL_GROUPS) {
            let chunks: Vec<_> = groups.iter().map(|g| super::chunk_range(g, leaf)).collect();
            input.prefetch(&chunks)?;
            for g in groups {
                labels.push(super::read_labels(&input, g, leaf)?);
            }
        }
        Ok(labels)
    });
    Ok(FileRead { meta, labels })
}

/// `read` of files `start..start + ahead` (within the files), on a thread each when more
/// than one; the results in file order.
pub(super) fn read_ahead<T: Send>(
    files: &Files<'_>,
    start: usize,
    read: impl Fn(usize) -> Result<T, StorageError> + Sync,
) -> Vec<Result<T, StorageError>> {
    let end = (start + files.ahead.max(1)).min(files.named.len());
    if end - start <= 1 {
        return (start..end).map(read).collect();
    }
    let read = &read;
    std::thread::scope(|s| {
        let threads: Vec<_> = (start..end)
            .map(|n| s.spawn(move || read(n).map_err(store_error_or)))
            .collect();
        (start..end)
            .zip(threads)
            .map(|(n, t)| {
                t.join()
                    .unwrap_or_else(|panic| Err(super::reader_failed(&files.named[n], &*panic)))
            })
            .collect()
    })
}

/// `len` bytes at `start` of what an object keeps, when one kept range holds them.
fn find(kept: &[(u64, Bytes)], start: u64, len: usize) -> Option<Bytes> {
    kept.iter().find_map(|(at, b)| {
        let from = usize::try_from(start.checked_sub(*at)?).ok()?;
        (from.checked_add(len)? <= b.len()).then(|| b.slice(from..from + len))
    })
}

impl Length for Input {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Input {
    type T = InputRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match &self.from {
            From::File(file) => Ok(InputRead::File(BufReader::new(At {
                file: file.clone(),
                pos: start,
            }))),
            From::Object { kept, .. } => {
                let held = lock(kept).iter().find_map(|(at, b)| {
                    let from = usize::try_from(start.checked_sub(*at)?).ok()?;
                    (from < b.len()).then(|| b.slice(from..))
                });
                let bytes = match held {
                    Some(b) => b,
                    None => {
                        let len = WINDOW.min(self.len.saturating_sub(start));
                        self.object_bytes(start, len as usize)?
                    }
                };
                Ok(InputRead::Bytes(bytes.reader()))
            }
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if start
            .checked_add(length as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(ParquetError::EOF(format!(
                "{length} bytes at {start} run past the end of the file ({} bytes; truncated?)",
                self.len
            )));
        }
        match &self.from {
            From::File(file) => {
                let mut buf = vec![0u8; length];
                file.read_exact_at(&mut buf, start)?;
                Ok(Bytes::from(buf))
            }
            From::Object { .. } => self.object_bytes(start, length),
        }
    }
}

/// A reader of an [`Input`] from a position.
pub(crate) enum InputRead {
    File(BufReader<At>),
    Bytes(bytes::buf::Reader<Bytes>),
}

impl Read for InputRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            InputRead::File(r) => r.read(buf),
            InputRead::Bytes(r) => r.read(buf),
        }
    }
}

/// A reader at a position of a shared file.
pub(crate) struct At {
    file: Arc<File>,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An object in memory, counting its requests.
    struct Memory {
        bytes: Bytes,
        requests: Arc<AtomicUsize>,
    }

    impl Ranges for Memory {
        fn get(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, StorageError> {
            self.requests.fetch_add(ranges.len(), Ordering::Relaxed);
            Ok(ranges
                .iter()
                .map(|r| self.bytes.slice(r.start as usize..r.end as usize))
                .collect())
        }
    }

    fn object(len: usize) -> (Arc<Input>, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let bytes = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>());
        let memory = Memory {
            bytes: bytes.clone(),
            requests: requests.clone(),
        };
        (Input::object(Box::new(memory), len as u64), requests)
    }

    #[test]
    fn an_object_serves_what_it_fetched_ahead_without_asking_again() {
        let (input, requests) = object(10_000);
        input.prefetch(&[100..600, 2000..2100]).unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), 2);
        // Within a kept range: from memory, as bytes and as a reader.
        assert_eq!(
            &input.get_bytes(150, 10).unwrap()[..],
            &[150, 151, 152, 153, 154, 155, 156, 157, 158, 159]
        );
        let mut read = Vec::new();
        input.get_read(590).unwrap().read_to_end(&mut read).unwrap();
        assert_eq!(read, (590..600).map(|i| i as u8).collect::<Vec<_>>());
        input.prefetch(std::slice::from_ref(&(2000..2100))).unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), 2);
        // Across a kept range's end, or elsewhere: one request each.
        assert_eq!(input.get_bytes(590, 20).unwrap().len(), 20);
        assert_eq!(input.get_bytes(5000, 1).unwrap()[..], [(5000 % 256) as u8]);
        assert_eq!(requests.load(Ordering::Relaxed), 4);
        // Past the end: an error, no request.
        assert!(input.get_bytes(9_999, 2).is_err());
        assert_eq!(requests.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn an_object_keeps_at_most_its_budget() {
        let len = 3 * KEPT_BUDGET;
        let (input, requests) = object(len);
        let third = KEPT_BUDGET as u64 / 2;
        input
            .prefetch(&[0..third, third..2 * third, 2 * third..3 * third])
            .unwrap();
        let From::Object { kept, .. } = &input.from else {
            unreachable!()
        };
        let held: usize = lock(kept).iter().map(|(_, b)| b.len()).sum();
        assert!(held <= KEPT_BUDGET, "{held}");
        // The newest range is kept, the oldest dropped.
        let before = requests.load(Ordering::Relaxed);
        input.get_bytes(2 * third, 1).unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), before);
        input.get_bytes(0, 1).unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), before + 1);
        // A range larger than the budget is not fetched ahead.
        input
            .prefetch(std::slice::from_ref(&(0..len as u64)))
            .unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), before + 1);
    }
}
