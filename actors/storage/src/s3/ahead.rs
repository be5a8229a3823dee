//! Fetch-ahead: the encoded bytes of elements the Sampler has picked for a job, but that the
//! Cache does not load yet, are fetched early and wait here, so that when their load comes
//! the decode thread gets them at once instead of waiting a round trip to the store.
//!
//! - One buffer for the whole server, bounded by bytes ([`Ahead::new`]'s capacity). An
//!   element being fetched counts for the mean size of the elements fetched so far until its
//!   bytes arrive. When the buffer is full, a fetch-ahead is skipped (counted): its load
//!   fetches on demand later, as without fetch-ahead.
//! - A load that finds its element's bytes here takes them (they leave the buffer); one that
//!   finds them being fetched waits for that request instead of sending another. So an element
//!   is read from the store once whether its load comes before, during or after its
//!   fetch-ahead.
//! - Bytes nobody took (the job that wanted them closed, or was sampled again from a restart)
//!   are dropped when room is wanted and they are older than [`STALE`].
//! - A failed fetch-ahead is forgotten (its load fetches again, with its own retries), or,
//!   when a load already waits for it, handed to that load as its error (the request had the
//!   same retries a load's own would have had).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::request::Done;
use super::stats::ObjectStats;
use crate::StorageError;

/// The buffer's default size.
pub const DEFAULT_BYTES: u64 = 64 << 20;

/// Bytes left untaken this long are dropped when room is wanted.
pub const STALE: Duration = Duration::from_secs(30);

/// The size assumed for an element being fetched before any element's size is known.
const FIRST_ESTIMATE: u64 = 128 << 10;

/// An element of a source: (the source's id, the element).
pub(super) type Key = (u64, u32);

/// See the module docs.
pub(super) struct Ahead {
    capacity: u64,
    state: Mutex<State>,
    stats: Arc<ObjectStats>,
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Buffered>,
    /// Bytes of the ready entries plus the estimates of those being fetched.
    bytes: u64,
    /// Elements fetched ahead and their bytes, for the estimate.
    fetched: u64,
    fetched_bytes: u64,
    /// When stale entries were last looked for.
    swept: Option<Instant>,
}

enum Buffered {
    Fetching {
        estimate: u64,
        /// A load that came while the bytes were on their way.
        waiter: Option<Done>,
    },
    Ready {
        bytes: Vec<u8>,
        /// What the store sent for them (the load that takes them is charged).
        sent: u64,
        at: Instant,
    },
}

impl State {
    fn estimate(&self) -> u64 {
        self.fetched_bytes
            .checked_div(self.fetched)
            .unwrap_or(FIRST_ESTIMATE)
    }

    /// Drops the ready entries older than [`STALE`] (at most once a second).
    fn sweep(&mut self, now: Instant, stats: &ObjectStats) {
        if self
            .swept
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        self.swept = Some(now);
        let mut freed = 0;
        let mut dropped = 0;
        self.entries.retain(|_, e| match e {
            Buffered::Ready { bytes, at, .. } if now.duration_since(*at) >= STALE => {
                freed += bytes.len() as u64;
                dropped += 1;
                false
            }
            _ => true,
        });
        self.bytes -= freed;
        stats.ahead_stale.fetch_add(dropped, Relaxed);
    }
}

/// What [`Ahead::reserve`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reserve {
    /// Fetch it: its place is held.
    Fetch,
    /// It is here or on its way already.
    Present,
    /// No room: not fetched ahead.
    Full,
}

impl Ahead {
    pub(super) fn new(capacity: u64, stats: Arc<ObjectStats>) -> Self {
        stats.ahead_capacity.store(capacity, Relaxed);
        Self {
            capacity,
            state: Mutex::new(State::default()),
            stats,
        }
    }

    /// Whether the server fetches ahead at all (a buffer of 0 bytes turns it off).
    pub(super) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds a place for `key`'s bytes when it is neither here nor on its way and there is
    /// room for an element of the mean size.
    pub(super) fn reserve(&self, key: Key) -> Reserve {
        let mut s = self.lock();
        if s.entries.contains_key(&key) {
            return Reserve::Present;
        }
        let estimate = s.estimate();
        if s.bytes + estimate > self.capacity {
            s.sweep(Instant::now(), &self.stats);
            if s.bytes + estimate > self.capacity {
                self.stats.ahead_full.fetch_add(1, Relaxed);
                return Reserve::Full;
            }
        }
        s.bytes += estimate;
        s.entries.insert(
            key,
            Buffered::Fetching {
                estimate,
                waiter: None,
            },
        );
        self.stats.ahead_requests.fetch_add(1, Relaxed);
        self.stats.ahead_bytes.store(s.bytes, Relaxed);
        Reserve::Fetch
    }

    /// A fetch-ahead of `key` finished: its bytes go to the load waiting for them, or wait
    /// here for it (a failure is forgotten unless a load waits).
    pub(super) fn fetched(&self, key: Key, result: Result<Vec<u8>, StorageError>, sent: u64) {
        let mut s = self.lock();
        let Some(Buffered::Fetching { estimate, waiter }) = s.entries.remove(&key) else {
            return;
        };
        s.bytes -= estimate;
        if let Ok(bytes) = &result {
            s.fetched += 1;
            s.fetched_bytes += bytes.len() as u64;
        }
        match (waiter, result) {
            (Some(done), result) => {
                self.stats.ahead_bytes.store(s.bytes, Relaxed);
                drop(s);
                done(result, sent);
            }
            (None, Ok(bytes)) => {
                s.bytes += bytes.len() as u64;
                s.entries.insert(
                    key,
                    Buffered::Ready {
                        bytes,
                        sent,
                        at: Instant::now(),
                    },
                );
                self.stats.ahead_bytes.store(s.bytes, Relaxed);
            }
            (None, Err(_)) => {
                self.stats.ahead_failed.fetch_add(1, Relaxed);
                self.stats.ahead_bytes.store(s.bytes, Relaxed);
            }
        }
    }

    /// A load wants `key`: its bytes are handed over at once when they are here, or when their
    /// fetch-ahead ends; otherwise `done` comes back for a fetch of its own.
    pub(super) fn take(&self, key: Key, done: Done) -> Option<Done> {
        let mut s = self.lock();
        match s.entries.get_mut(&key) {
            Some(Buffered::Fetching { waiter, .. }) if waiter.is_none() => {
                *waiter = Some(done);
                self.stats.ahead_joined.fetch_add(1, Relaxed);
                None
            }
            Some(Buffered::Ready { .. }) => {
                let Some(Buffered::Ready { bytes, sent, .. }) = s.entries.remove(&key) else {
                    unreachable!("matched above");
                };
                s.bytes -= bytes.len() as u64;
                self.stats.ahead_bytes.store(s.bytes, Relaxed);
                self.stats.ahead_hits.fetch_add(1, Relaxed);
                drop(s);
                done(Ok(bytes), sent);
                None
            }
            // Not fetched ahead, or a second load while one already waits (another pipeline's
            // reload): a fetch of its own.
            _ => Some(done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn ahead(capacity: u64) -> Ahead {
        Ahead::new(capacity, Arc::new(ObjectStats::default()))
    }

    type Got = mpsc::Receiver<(Result<Vec<u8>, StorageError>, u64)>;

    fn done() -> (Done, Got) {
        let (tx, rx) = mpsc::channel();
        (
            Box::new(move |r, n| {
                let _ = tx.send((r, n));
            }),
            rx,
        )
    }

    #[test]
    fn a_load_after_its_fetch_ahead_takes_the_bytes_and_they_leave_the_buffer() {
        let a = ahead(1 << 20);
        assert_eq!(a.reserve((1, 7)), Reserve::Fetch);
        assert_eq!(a.reserve((1, 7)), Reserve::Present);
        a.fetched((1, 7), Ok(vec![7; 1000]), 1000);
        assert_eq!(a.stats.ahead_bytes.load(Relaxed), 1000);
        let (d, rx) = done();
        assert!(a.take((1, 7), d).is_none());
        let (bytes, sent) = rx.try_recv().expect("handed over at once");
        assert_eq!((bytes.unwrap(), sent), (vec![7; 1000], 1000));
        assert_eq!(a.stats.ahead_bytes.load(Relaxed), 0);
        assert_eq!(a.stats.ahead_hits.load(Relaxed), 1);
        // Taken: a second load fetches on its own.
        let (d, _rx) = done();
        assert!(a.take((1, 7), d).is_some());
    }

    #[test]
    fn a_load_during_its_fetch_ahead_waits_for_that_request() {
        let a = ahead(1 << 20);
        assert_eq!(a.reserve((1, 3)), Reserve::Fetch);
        let (d, rx) = done();
        assert!(a.take((1, 3), d).is_none(), "joins the request on its way");
        assert!(rx.try_recv().is_err());
        a.fetched((1, 3), Ok(vec![3; 10]), 10);
        let (bytes, sent) = rx.try_recv().expect("handed over when fetched");
        assert_eq!((bytes.unwrap(), sent), (vec![3; 10], 10));
        assert_eq!(a.stats.ahead_bytes.load(Relaxed), 0, "nothing kept");
        assert_eq!(a.stats.ahead_joined.load(Relaxed), 1);
    }

    #[test]
    fn a_failed_fetch_ahead_is_forgotten_or_handed_to_the_load_that_waits() {
        let a = ahead(1 << 20);
        let err = || StorageError::Remote {
            url: "s3://b/".into(),
            code: "unavailable",
            message: "down".into(),
        };
        a.reserve((1, 1));
        a.fetched((1, 1), Err(err()), 0);
        let (d, _rx) = done();
        assert!(a.take((1, 1), d).is_some(), "fetched again by its load");
        assert_eq!(a.stats.ahead_failed.load(Relaxed), 1);

        a.reserve((1, 2));
        let (d, rx) = done();
        assert!(a.take((1, 2), d).is_none());
        a.fetched((1, 2), Err(err()), 0);
        assert!(rx.try_recv().expect("told").0.is_err());
        assert_eq!(a.stats.ahead_bytes.load(Relaxed), 0);
    }

    #[test]
    fn the_buffer_holds_what_fits_and_skips_the_rest() {
        // Room for three elements of the first estimate.
        let a = ahead(3 * FIRST_ESTIMATE);
        for e in 0..3 {
            assert_eq!(a.reserve((1, e)), Reserve::Fetch);
        }
        assert_eq!(a.reserve((1, 3)), Reserve::Full);
        assert_eq!(a.stats.ahead_full.load(Relaxed), 1);
        // Smaller than estimated: the mean shrinks and room is left for more.
        a.fetched((1, 0), Ok(vec![0; 1000]), 1000);
        assert_eq!(a.reserve((1, 3)), Reserve::Fetch);
        assert_eq!(a.reserve((1, 4)), Reserve::Fetch);
        let held = a.stats.ahead_bytes.load(Relaxed);
        assert!(held <= 3 * FIRST_ESTIMATE, "{held} bytes held");
        // Another source's element is another key.
        assert_eq!(a.reserve((2, 0)), Reserve::Fetch);
    }

    #[test]
    fn untaken_bytes_are_dropped_when_stale_and_room_is_wanted() {
        let a = ahead(2 * FIRST_ESTIMATE);
        a.reserve((1, 0));
        a.reserve((1, 1));
        a.fetched((1, 0), Ok(vec![0; FIRST_ESTIMATE as usize]), 1);
        a.fetched((1, 1), Ok(vec![0; FIRST_ESTIMATE as usize]), 1);
        assert_eq!(a.reserve((1, 2)), Reserve::Full, "fresh bytes are kept");
        {
            let mut s = a.lock();
            let old = Instant::now() - STALE;
            if let Some(Buffered::Ready { at, .. }) = s.entries.get_mut(&(1, 0)) {
                *at = old;
            }
            s.swept = None;
        }
        assert_eq!(a.reserve((1, 2)), Reserve::Fetch, "the stale one made room");
        assert_eq!(a.stats.ahead_stale.load(Relaxed), 1);
        let (d, _rx) = done();
        assert!(a.take((1, 0), d).is_some(), "dropped");
        let (d, rx) = done();
        assert!(a.take((1, 1), d).is_none(), "kept");
        assert!(rx.try_recv().is_ok());
    }
}
