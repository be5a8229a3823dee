//! The local-disk tier of encoded bytes (`--disk-cache DIR`, `--disk-cache-bytes SIZE`): what
//! a remote source fetched, kept on local disk so that the next miss of the decoded cache in
//! `/dev/shm` (the first tier) reads it from there instead of the store.
//!
//! - **Keys**: one stored object per element's bytes, keyed by store, object key, ETag and
//!   byte range ([`TierKey`]): a tar member is its range of its shard, a file element its
//!   whole object. A changed object has another ETag, hence another key.
//! - **Off the fetch path**: a fetch hands its bytes to [`DiskTier::offer`], which queues them
//!   for the one writer thread (a bounded queue: what does not fit is dropped and counted);
//!   reads ([`DiskTier::read`]) run on the fetch stage's blocking threads.
//! - **Admission and eviction** use what the Cache knows of the jobs (`demand`, `index`):
//!   an object some active job has not yet read this epoch is kept, a new one evicts only
//!   objects nobody needs, least recently used first, and is not stored when there are none.
//!   **The tier never exceeds its size.**
//! - **Crash-safe and verified** (`format`): written under a temporary name and renamed,
//!   the index rebuilt at start-up from the names and headers (no payload is read), a
//!   checksum checked at every read (a damaged object is dropped, counted and fetched
//!   again), and a lock file that refuses a second server on the same folder.
//! - **Errors never reach the jobs**: a failed write (a full disk, the folder removed) stops
//!   writing, with a metric and a log line; a failed read is a miss.

mod demand;
mod format;
mod index;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

pub use demand::Demand;
pub use format::TierKey;
pub use index::{Admit, SCAN, TierIndex};

/// How much nicer (lower priority) than the process the writer thread runs, on Linux: below
/// the decode threads (5), since a write that falls behind costs only a later miss, and a
/// decode that waits costs the jobs now.
const WRITER_NICE: i32 = 10;

/// Lowers the calling thread's priority by [`WRITER_NICE`]. On Linux `setpriority` on a thread
/// id changes that thread alone; elsewhere it would change the whole process, so it is not done.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = rustix::thread::gettid();
        let result = getpriority_process(Some(tid))
            .and_then(|nice| setpriority_process(Some(tid), (nice + WRITER_NICE).min(19)));
        if let Err(e) = result {
            tracing::warn!(error = %e, "disk cache: could not lower the writer thread's priority");
        }
    }
}

/// Bytes queued for the writer, at most; a fetch whose bytes would exceed it is not stored.
const MAX_QUEUED_BYTES: u64 = 256 << 20;
/// Objects queued for the writer, at most.
const MAX_QUEUED: usize = 4096;

/// Whose element a stored object holds: the admission asks its dataset's [`Demand`].
#[derive(Clone, Debug)]
pub struct Owner {
    pub demand: Weak<Demand>,
    pub element: u32,
}

impl Owner {
    fn needed(&self) -> bool {
        self.demand
            .upgrade()
            .is_some_and(|d| d.needed(self.element))
    }
}

/// The tier's counters and gauges (the server exports them as `joader_disk_cache_*`).
#[derive(Debug, Default)]
pub struct TierStats {
    /// The tier's size limit.
    pub capacity: AtomicU64,
    /// Bytes and objects stored now.
    pub bytes: AtomicU64,
    pub objects: AtomicU64,
    /// Element reads served from the tier.
    pub hits: AtomicU64,
    /// Element reads the tier did not serve (not stored, damaged, or unreadable).
    pub misses: AtomicU64,
    /// Objects written, and their bytes.
    pub writes: AtomicU64,
    pub written_bytes: AtomicU64,
    /// Objects evicted to make room.
    pub evictions: AtomicU64,
    /// Fetched objects not stored: no object nobody needs made room, or the queue was full.
    pub not_admitted: AtomicU64,
    pub dropped: AtomicU64,
    /// Writes that failed (writing stopped at the first).
    pub write_errors: AtomicU64,
    /// Stored objects found damaged (torn, wrong checksum) and dropped.
    pub corrupt: AtomicU64,
    /// 1 while the tier writes, 0 once a write error stopped it.
    pub writing: AtomicU64,
    /// Objects queued for the writer now.
    pub queued: AtomicU64,
}

/// Why the tier cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error(
        "disk cache {}: {source} (choose a folder the server can create and write, with --disk-cache)",
        dir.display()
    )]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "disk cache {}: another joader serve uses this folder (its lock file is held): give each server its own --disk-cache",
        dir.display()
    )]
    Locked { dir: PathBuf },
    #[error("disk cache size must be positive (--disk-cache-bytes)")]
    Empty,
}

struct Inner {
    dir: PathBuf,
    objects: PathBuf,
    tmp: PathBuf,
    index: Mutex<TierIndex<Owner>>,
    stats: Arc<TierStats>,
    queued_bytes: AtomicU64,
    writing: AtomicBool,
    /// Held for the tier's life: the lock.
    _lock: File,
}

enum Job {
    Write {
        key: TierKey,
        bytes: Bytes,
        owner: Option<Owner>,
    },
    /// Answered once everything queued before it is done.
    Flush(SyncSender<()>),
}

/// The tier of one server; see the module docs.
pub struct DiskTier {
    inner: Arc<Inner>,
    /// `None` once dropped: the writer then finishes and is joined, so that the lock is free
    /// when the tier is gone.
    queue: Option<SyncSender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

impl DiskTier {
    /// Opens (creating it) the tier in `dir`, of at most `capacity` bytes: takes its lock,
    /// removes unfinished writes and rebuilds the index from the stored objects' names and
    /// headers (damaged ones are removed; the most recently written are kept when there are
    /// more than `capacity` holds). Starts the writer thread.
    /// The writer thread's CPU is the fetch stage's ([`crate::stage::FETCH`]).
    pub fn open(dir: &Path, capacity: u64) -> Result<DiskTier, TierError> {
        if capacity == 0 {
            return Err(TierError::Empty);
        }
        let io = |source| TierError::Io {
            dir: dir.to_owned(),
            source,
        };
        let (objects, tmp) = (dir.join("objects"), dir.join("tmp"));
        std::fs::create_dir_all(&objects).map_err(io)?;
        std::fs::create_dir_all(&tmp).map_err(io)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(io)?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(TierError::Locked {
                    dir: dir.to_owned(),
                });
            }
            Err(e) => return Err(io(e.into())),
        }
        for e in std::fs::read_dir(&tmp).map_err(io)?.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let stats = Arc::new(TierStats::default());
        let index = rebuild(&objects, capacity, &stats).map_err(io)?;
        stats.capacity.store(capacity, Relaxed);
        stats.writing.store(1, Relaxed);
        let inner = Arc::new(Inner {
            dir: dir.to_owned(),
            objects,
            tmp,
            index: Mutex::new(index),
            stats,
            queued_bytes: AtomicU64::new(0),
            writing: AtomicBool::new(true),
            _lock: lock,
        });
        inner.update_gauges();
        let (queue, rx) = sync_channel(MAX_QUEUED);
        let writer = inner.clone();
        let writer = std::thread::Builder::new()
            .name("joader-tier".into())
            .spawn(move || {
                joader_stages::set_base(&crate::stage::FETCH);
                writer.write_all(rx)
            })
            .map_err(io)?;
        Ok(DiskTier {
            inner,
            queue: Some(queue),
            writer: Some(writer),
        })
    }

    pub fn stats(&self) -> &Arc<TierStats> {
        &self.inner.stats
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether `key` is stored, its file complete (no I/O): worth a [`DiskTier::read`].
    pub fn contains(&self, key: &TierKey) -> bool {
        self.inner
            .index
            .lock()
            .is_ok_and(|i| i.is_ready(key.name()))
    }

    /// The bytes `key`'s stored file takes (its header included) when it is complete.
    pub fn stored_len(&self, key: &TierKey) -> Option<u64> {
        self.inner
            .index
            .lock()
            .ok()
            .and_then(|i| i.ready_len(key.name()))
    }

    /// [`DiskTier::contains`] for an element's read: a miss when not (counted).
    pub fn lookup(&self, key: &TierKey) -> bool {
        let found = self.contains(key);
        if !found {
            self.inner.stats.misses.fetch_add(1, Relaxed);
        }
        found
    }

    /// Tells the tier whose elements its stored objects hold (a source opened, at start-up
    /// or after indexing), so that the objects its jobs still need are kept from then on,
    /// whether or not they were read since the tier was opened. Returns how many it holds.
    pub fn adopt(&self, owned: impl Iterator<Item = (u128, Owner)>) -> usize {
        let mut adopted = 0;
        let mut owned = owned.peekable();
        // In chunks: reads of the fetch stage wait for the index meanwhile.
        while owned.peek().is_some() {
            let chunk: Vec<_> = owned.by_ref().take(4096).collect();
            let Ok(mut i) = self.inner.index.lock() else {
                return adopted;
            };
            for (name, owner) in chunk {
                adopted += usize::from(i.set_owner(name, owner));
            }
        }
        adopted
    }

    /// Reads and verifies the stored bytes of `key` (blocking: local disk); `None` is a miss,
    /// counted: not stored, gone, or damaged (then dropped, to be fetched and stored again).
    pub fn read(&self, key: &TierKey, owner: Option<Owner>) -> Option<Vec<u8>> {
        let inner = &self.inner;
        let name = key.name();
        if !inner.index.lock().is_ok_and(|i| i.is_ready(name)) {
            inner.stats.misses.fetch_add(1, Relaxed);
            return None;
        }
        let path = format::object_path(&inner.objects, name);
        match format::read_verified(&path, key) {
            Ok(bytes) => {
                if let Ok(mut i) = inner.index.lock() {
                    i.touch(name, owner);
                }
                inner.stats.hits.fetch_add(1, Relaxed);
                Some(bytes)
            }
            Err(damage) => {
                let unreadable = matches!(damage, format::Damage::Io(_));
                if !unreadable {
                    inner.stats.corrupt.fetch_add(1, Relaxed);
                    tracing::warn!(path = %path.display(), error = %damage, "disk cache: a damaged object is dropped and fetched again");
                    let _ = std::fs::remove_file(&path);
                }
                if let Ok(mut i) = inner.index.lock()
                    && i.is_ready(name)
                {
                    i.remove(name);
                }
                inner.update_gauges();
                inner.stats.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Hands fetched bytes to the writer without waiting: dropped (and counted) when the
    /// queue is full or writing stopped.
    pub fn offer(&self, key: TierKey, bytes: Bytes, owner: Option<Owner>) {
        let inner = &self.inner;
        if !inner.writing.load(Relaxed) {
            return;
        }
        let len = bytes.len() as u64;
        if inner.queued_bytes.fetch_add(len, Relaxed) + len > MAX_QUEUED_BYTES {
            inner.queued_bytes.fetch_sub(len, Relaxed);
            inner.stats.dropped.fetch_add(1, Relaxed);
            return;
        }
        let Some(queue) = &self.queue else { return };
        inner.stats.queued.fetch_add(1, Relaxed);
        match queue.try_send(Job::Write { key, bytes, owner }) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                inner.stats.queued.fetch_sub(1, Relaxed);
                inner.queued_bytes.fetch_sub(len, Relaxed);
                inner.stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Waits until every object offered so far is written or refused (tests and benches).
    pub fn flush(&self) {
        let (tx, rx) = sync_channel(1);
        if let Some(queue) = &self.queue
            && queue.send(Job::Flush(tx)).is_ok()
        {
            let _ = rx.recv();
        }
    }
}

impl Inner {
    fn update_gauges(&self) {
        if let Ok(i) = self.index.lock() {
            self.stats.bytes.store(i.bytes(), Relaxed);
            self.stats.objects.store(i.len() as u64, Relaxed);
        }
    }

    /// The writer thread: admits each queued object, evicts what the admission chose and
    /// writes it; stops writing at the first error.
    fn write_all(self: Arc<Self>, rx: Receiver<Job>) {
        lower_own_priority();
        let mut seq = 0u64;
        while let Ok(job) = rx.recv() {
            let (key, bytes, owner) = match job {
                Job::Write { key, bytes, owner } => (key, bytes, owner),
                Job::Flush(done) => {
                    let _ = done.send(());
                    continue;
                }
            };
            let len = bytes.len() as u64;
            self.queued_bytes.fetch_sub(len, Relaxed);
            self.write_one(key, bytes, owner, &mut seq);
            self.stats.queued.fetch_sub(1, Relaxed);
        }
    }

    /// Admits one object, evicts what the admission chose and writes it.
    fn write_one(&self, key: TierKey, bytes: Bytes, owner: Option<Owner>, seq: &mut u64) {
        let len = bytes.len() as u64;
        if !self.writing.load(Relaxed) {
            return;
        }
        let name = key.name();
        let file_len = format::encoded_len(&key, len);
        let admitted = match self.index.lock() {
            Ok(mut i) => i.admit(name, file_len, owner, Owner::needed),
            Err(_) => return,
        };
        let victims = match admitted {
            Admit::Present => return,
            Admit::No => {
                self.stats.not_admitted.fetch_add(1, Relaxed);
                return;
            }
            Admit::Yes(v) => v,
        };
        for v in &victims {
            let _ = std::fs::remove_file(format::object_path(&self.objects, *v));
        }
        self.stats
            .evictions
            .fetch_add(victims.len() as u64, Relaxed);
        *seq += 1;
        let tmp = self.tmp.join(format!("{name:032x}.{seq}"));
        let path = format::object_path(&self.objects, name);
        match format::write(&tmp, &path, &key, &bytes) {
            Ok(_) => {
                if let Ok(mut i) = self.index.lock() {
                    i.mark_ready(name);
                }
                self.stats.writes.fetch_add(1, Relaxed);
                self.stats.written_bytes.fetch_add(file_len, Relaxed);
            }
            Err(e) => {
                if let Ok(mut i) = self.index.lock() {
                    i.remove(name);
                }
                self.stats.write_errors.fetch_add(1, Relaxed);
                self.stats.writing.store(0, Relaxed);
                self.writing.store(false, Relaxed);
                tracing::error!(dir = %self.dir.display(), error = %e, "disk cache: a write failed, the tier stops writing (it still serves what it holds); jobs are not affected");
            }
        }
        self.update_gauges();
    }
}

/// The index of the objects stored in `objects`, from their names and headers; damaged
/// objects and the least recently written beyond `capacity` are removed.
fn rebuild(objects: &Path, capacity: u64, stats: &TierStats) -> std::io::Result<TierIndex<Owner>> {
    let mut found = Vec::new();
    for fan in std::fs::read_dir(objects)?.flatten() {
        let Ok(files) = std::fs::read_dir(fan.path()) else {
            continue;
        };
        for f in files.flatten() {
            let path = f.path();
            let header = format::read_header(&path);
            match (format::name_of(&path), header) {
                (Some(name), Ok(h)) if name == twox_hash::XxHash3_128::oneshot(&h.identity) => {
                    let mtime = f
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
                    found.push((mtime, name, h.file_len(), path));
                }
                _ => {
                    stats.corrupt.fetch_add(1, Relaxed);
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
    // The most recently written are kept; they are restored oldest first (the LRU order).
    found.sort_by_key(|(mtime, name, _, _)| (std::cmp::Reverse(*mtime), *name));
    let mut total = 0u64;
    let mut keep = Vec::new();
    for (_, name, len, path) in found {
        if total + len <= capacity {
            total += len;
            keep.push((name, len));
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
    let mut index = TierIndex::new(capacity);
    for (name, len) in keep.into_iter().rev() {
        index.restore(name, len);
    }
    Ok(index)
}

#[cfg(test)]
mod tests;
