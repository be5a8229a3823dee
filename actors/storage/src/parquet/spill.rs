//! Decoded row groups spilled to local disk: what makes a row of a zstd or gzip group cost
//! about its own bytes in a shuffled order once its group was decoded.
//!
//! A Snappy or uncompressed page can be entered in the middle (`snappy.rs`, `pages.rs`): a
//! row is located and read alone. A zstd or gzip stream cannot: without more, each row read
//! after its group's decoded rows left the budget in memory decompresses the whole group
//! again (about group-size times the row's bytes: 100x for Hugging Face's 100-row groups).
//! pyarrow writes a group's images as one dictionary page, so smaller pages do not help its
//! files either. So the first decode of such a group also writes its rows, one after the
//! other, to a file of their own under the spill folder, and notes where each lies; a later
//! read of a row is one positioned read of its bytes there.
//!
//! - **Bounded, server-wide:** the spilled groups of every dataset's reader take at most the
//!   server's `--parquet-spill-bytes` on disk together (two readers spilling at the same moment
//!   may each pass it by one group). A reader makes room by removing its own oldest groups;
//!   when the others hold the budget, it spills nothing more (its rows are decoded as without
//!   a spill). A group larger than the budget is not spilled.
//! - **Never fatal:** a spill that cannot be written (a full disk, the folder removed) stops
//!   the reader's spilling with one log line, and a spilled file that cannot be read is
//!   dropped: the row is decoded from its group again, as without a spill.
//! - **Private:** each reader spills under a folder of its own, removed when the reader is
//!   dropped; the server empties the spill folder at start-up.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Where the readers made from now on spill, and how much each may (set once by the server
/// at start: `joader serve --parquet-spill-bytes`; unset, readers do not spill).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParquetSpill {
    pub dir: PathBuf,
    pub bytes: u64,
}

static CONFIGURED: Mutex<Option<ParquetSpill>> = Mutex::new(None);

impl ParquetSpill {
    /// Makes this the spill of every reader made from now on, in this process.
    pub fn set(self) {
        *CONFIGURED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(self);
    }

    /// What is set for the process.
    pub fn current() -> Option<ParquetSpill> {
        CONFIGURED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Where a spilled row lies in its group's file (`None`: a null value).
type Place = Option<(u64, u32)>;

/// One reader's spilled groups.
pub(super) struct Spill {
    dir: PathBuf,
    /// The most every spill sharing `shared` (the server's readers) takes together.
    budget: u64,
    /// What every spill sharing it takes on disk now.
    shared: Arc<AtomicU64>,
    state: Mutex<State>,
    /// Bytes on disk now (for the reader's counters).
    pub(super) bytes: AtomicU64,
}

/// What the configured spills of the process (every dataset's reader) take together.
static SPILLED: std::sync::LazyLock<Arc<AtomicU64>> =
    std::sync::LazyLock::new(|| Arc::new(AtomicU64::new(0)));

#[derive(Default)]
struct State {
    groups: HashMap<(u32, u32), Arc<Vec<Place>>>,
    order: VecDeque<(u32, u32)>,
    sizes: HashMap<(u32, u32), u64>,
    bytes: u64,
    /// A write failed: no more spilling by this reader.
    stopped: bool,
    made_dir: bool,
}

impl Spill {
    /// A reader's spill: under a folder of its own in the configured one, when one is set
    /// with a positive budget.
    pub(super) fn configured() -> Option<Spill> {
        static READERS: AtomicU64 = AtomicU64::new(0);
        let c = ParquetSpill::current().filter(|c| c.bytes > 0)?;
        let n = READERS.fetch_add(1, Relaxed);
        Some(Spill::sharing(
            c.dir.join(format!("{}-{n}", std::process::id())),
            c.bytes,
            SPILLED.clone(),
        ))
    }

    /// A spill of its own budget.
    #[cfg(test)]
    pub(super) fn new(dir: PathBuf, budget: u64) -> Spill {
        Spill::sharing(dir, budget, Arc::new(AtomicU64::new(0)))
    }

    /// A spill whose budget it shares with the others counted in `shared`.
    pub(super) fn sharing(dir: PathBuf, budget: u64, shared: Arc<AtomicU64>) -> Spill {
        Spill {
            dir,
            budget,
            shared,
            state: Mutex::new(State::default()),
            bytes: AtomicU64::new(0),
        }
    }

    /// Drops spilled group `key` (its file and its bytes), when it is spilled.
    fn drop_group(&self, st: &mut State, key: (u32, u32)) {
        if st.groups.remove(&key).is_some() {
            let size = st.sizes.remove(&key).unwrap_or(0);
            st.bytes -= size;
            self.shared.fetch_sub(size, Relaxed);
            st.order.retain(|k| *k != key);
            let _ = std::fs::remove_file(self.path(key));
        }
    }

    fn path(&self, key: (u32, u32)) -> PathBuf {
        self.dir.join(format!("{}-{}.rows", key.0, key.1))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether group `key` is spilled.
    #[cfg(test)]
    pub(super) fn has(&self, key: (u32, u32)) -> bool {
        self.lock().groups.contains_key(&key)
    }

    /// Writes a decoded group's rows (`None`: null) to its file; returns the bytes written
    /// (0 when it was not spilled: too large, spilled already, or spilling stopped).
    pub(super) fn put<'a>(
        &self,
        key: (u32, u32),
        rows: impl ExactSizeIterator<Item = Option<&'a [u8]>> + Clone,
    ) -> u64 {
        let total: u64 = rows.clone().map(|r| r.map_or(0, |b| b.len() as u64)).sum();
        {
            let mut st = self.lock();
            if st.stopped || st.groups.contains_key(&key) || total > self.budget {
                return 0;
            }
            // Room from this reader's oldest groups; what the others hold is theirs.
            while self.shared.load(Relaxed) + total > self.budget {
                let Some(&old) = st.order.front() else {
                    return 0;
                };
                self.drop_group(&mut st, old);
            }
            self.bytes.store(st.bytes, Relaxed);
        }
        let mut places = Vec::with_capacity(rows.len());
        let written = (|| -> std::io::Result<()> {
            if !self.lock().made_dir {
                std::fs::create_dir_all(&self.dir)?;
                self.lock().made_dir = true;
            }
            let f = std::fs::File::create(self.path(key))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            let mut at = 0u64;
            for r in rows {
                places.push(r.map(|b| (at, b.len() as u32)));
                if let Some(b) = r {
                    w.write_all(b)?;
                    at += b.len() as u64;
                }
            }
            w.flush()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(self.path(key));
            tracing::warn!(dir = %self.dir.display(), error = %e,
                "parquet spill: cannot write a decoded row group; this dataset's reads decode their groups again from now on");
            self.lock().stopped = true;
            return 0;
        }
        let mut st = self.lock();
        st.groups.insert(key, Arc::new(places));
        st.sizes.insert(key, total);
        st.order.push_back(key);
        st.bytes += total;
        self.shared.fetch_add(total, Relaxed);
        self.bytes.store(st.bytes, Relaxed);
        total
    }

    /// Row `row` of spilled group `key`: `Some(Ok(bytes or None for a null))`; `None` when
    /// the group is not spilled, or its file could not be read (then dropped).
    pub(super) fn get(&self, key: (u32, u32), row: u32) -> Option<Result<Option<Vec<u8>>, String>> {
        let places = self.lock().groups.get(&key)?.clone();
        let Some(place) = places.get(row as usize) else {
            return Some(Err(super::pages::fewer_rows()));
        };
        let Some((at, len)) = *place else {
            return Some(Ok(None));
        };
        let read = (|| -> std::io::Result<Vec<u8>> {
            let f = std::fs::File::open(self.path(key))?;
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, at)?;
            Ok(buf)
        })();
        match read {
            Ok(b) => Some(Ok(Some(b))),
            Err(e) => {
                tracing::warn!(path = %self.path(key).display(), error = %e,
                    "parquet spill: a spilled row group cannot be read; it is decoded again");
                let mut st = self.lock();
                self.drop_group(&mut st, key);
                self.bytes.store(st.bytes, Relaxed);
                None
            }
        }
    }

    #[cfg(test)]
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let st = self.lock();
        self.shared.fetch_sub(st.bytes, Relaxed);
        if st.made_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The most a reader spills by default: the smaller of [`DEFAULT_SPILL_MAX`] and half the
/// space free in the file system of `dir` now (0 when it cannot be known).
pub fn default_spill_bytes(dir: &Path) -> u64 {
    let free = rustix::fs::statvfs(dir).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize));
    (free / 2).min(DEFAULT_SPILL_MAX)
}

/// The most a reader spills by default, whatever the free space.
pub const DEFAULT_SPILL_MAX: u64 = 16 << 30;

/// Empties the spill folder `dir` (what a previous server left) and creates it.
pub fn reset_spill_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, len: usize, seed: u8) -> Vec<Option<Vec<u8>>> {
        (0..n)
            .map(|i| {
                (i % 5 != 3).then(|| (0..len + i).map(|b| (b as u8).wrapping_add(seed)).collect())
            })
            .collect()
    }

    fn put(s: &Spill, key: (u32, u32), rows: &[Option<Vec<u8>>]) -> u64 {
        s.put(key, rows.iter().map(|r| r.as_deref()))
    }

    #[test]
    fn spilled_rows_read_back_and_the_budget_drops_the_oldest_group() {
        let root = tempfile::tempdir().unwrap();
        let a = rows(10, 100, 1);
        let b = rows(10, 100, 2);
        let one: u64 = a.iter().flatten().map(|r| r.len() as u64).sum();
        let s = Spill::new(root.path().join("r"), one + one / 2);
        assert_eq!(put(&s, (0, 0), &a), one);
        assert_eq!(put(&s, (0, 0), &a), 0, "spilled once");
        for (i, want) in a.iter().enumerate() {
            assert_eq!(s.get((0, 0), i as u32).unwrap().unwrap(), *want, "row {i}");
        }
        assert!(s.get((0, 0), 10).unwrap().is_err(), "past the group's rows");
        assert!(s.get((0, 1), 0).is_none(), "not spilled");
        // A second group crosses the budget: the first goes, its file too.
        put(&s, (0, 1), &b);
        assert!(!s.has((0, 0)) && s.has((0, 1)));
        assert_eq!(
            s.bytes.load(Relaxed),
            b.iter().flatten().map(|r| r.len() as u64).sum::<u64>()
        );
        assert!(!s.dir().join("0-0.rows").exists());
        assert_eq!(s.get((0, 1), 4).unwrap().unwrap(), b[4]);
        // A group larger than the whole budget is not spilled.
        let big = rows(40, 100, 3);
        assert_eq!(put(&s, (1, 0), &big), 0);
        // A removed file is a miss (the group is decoded again), and is forgotten.
        std::fs::remove_file(s.dir().join("0-1.rows")).unwrap();
        assert!(s.get((0, 1), 0).is_none());
        assert!(!s.has((0, 1)));
        let dir = s.dir().to_owned();
        drop(s);
        assert!(!dir.exists(), "a dropped reader's spill is removed");
    }

    #[test]
    fn readers_share_one_budget_and_each_makes_room_from_its_own_groups() {
        let root = tempfile::tempdir().unwrap();
        let g = rows(10, 100, 1);
        let one: u64 = g.iter().flatten().map(|r| r.len() as u64).sum();
        let shared = Arc::new(AtomicU64::new(0));
        let a = Spill::sharing(root.path().join("a"), 2 * one, shared.clone());
        let b = Spill::sharing(root.path().join("b"), 2 * one, shared.clone());
        assert_eq!(put(&a, (0, 0), &g), one);
        assert_eq!(put(&a, (0, 1), &g), one);
        assert_eq!(shared.load(Relaxed), 2 * one);
        // The budget is a's: b cannot take a's groups.
        assert_eq!(put(&b, (0, 0), &g), 0);
        assert!(a.has((0, 0)) && a.has((0, 1)));
        // a makes room from its own oldest.
        assert_eq!(put(&a, (0, 2), &g), one);
        assert!(!a.has((0, 0)) && a.has((0, 2)));
        assert_eq!(shared.load(Relaxed), 2 * one);
        // A dropped reader gives its bytes back: b spills.
        drop(a);
        assert_eq!(shared.load(Relaxed), 0);
        assert_eq!(put(&b, (0, 0), &g), one);
        assert_eq!(shared.load(Relaxed), one);
    }

    #[test]
    fn a_spill_that_cannot_be_written_stops_and_reads_go_on_without_it() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("a-file");
        std::fs::write(&file, b"not a folder").unwrap();
        let s = Spill::new(file.join("r"), 1 << 20);
        assert_eq!(put(&s, (0, 0), &rows(3, 10, 0)), 0);
        assert!(!s.has((0, 0)));
        assert_eq!(put(&s, (0, 1), &rows(3, 10, 0)), 0, "stopped");
    }
}
