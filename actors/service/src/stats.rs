//! Counters shared between the actors and the control plane (lock-free reads for the API and
//! the metrics exporter).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Life cycle of a job as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum JobState {
    /// Registered; its client has not attached yet.
    Waiting,
    Running,
    /// All epochs delivered.
    Finished,
    /// Stopped: the client died, broke the protocol, or the job was deleted.
    Failed(String),
}

/// Counters of one job.
#[derive(Debug)]
pub struct JobStats {
    /// Deliveries decided by the sampler.
    pub sampled: AtomicU64,
    /// Records pushed into the job's rings (data and error records).
    pub delivered: AtomicU64,
    /// Records the client acknowledged.
    pub acknowledged: AtomicU64,
    /// Deliveries served by a slot that was cached or already being loaded for another job.
    pub hits: AtomicU64,
    /// Deliveries that needed a load of their own.
    pub misses: AtomicU64,
    /// Elements that failed to load.
    pub errors: AtomicU64,
    pub epoch: AtomicU64,
    /// Position in the current epoch (of the last sampled element).
    pub position: AtomicU64,
    /// Microseconds a live client's ring sat empty while the client had credit (it had taken
    /// everything pushed and nothing was ready), summed over ranks; counted by the Cache
    /// actor at every acknowledgement poll.
    pub stall_us: AtomicU64,
    /// Times one of the job's units (its next batch for a rank) was ready to go to a client
    /// that had taken everything and had credit, but an element of it waited for room that
    /// other jobs held: records they had not acknowledged, or elements they needed sooner. A
    /// wait counts once per unit. Zero while the cache holds what every reading job may pin
    /// (see `CacheActor::count_waits`): a slow job never holds a fast one back then.
    pub waited_for_others: AtomicU64,
    pub state: Mutex<JobState>,
    /// The Cache has closed the job's rings (read to the end and left, failed, or stopped):
    /// nothing of the job is left in shared memory. `Finished` alone only says that the end
    /// of the stream was pushed; a rank may not even have attached yet.
    pub closed: AtomicBool,
    /// Deliveries a recording job (`AddJob::record`) could not record: the recorder lagged.
    pub record_dropped: AtomicU64,
    /// Bytes object stores sent for the loads this job's deliveries caused (its misses; a
    /// load shared by several jobs is charged to the one whose miss issued it, so the jobs'
    /// sums add up to what the stores sent for elements). Per epoch in `store_epochs`.
    pub store_read_bytes: AtomicU64,
    pub store_epochs: Mutex<StoreEpochs>,
    /// When the job's reading began (its first credit: every rank attached) and when its
    /// client last acknowledged records: the span of its run.
    pub run: Mutex<RunSpan>,
}

/// The span of a job's reading: from its first credit to its last acknowledgement.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunSpan {
    pub started: Option<std::time::Instant>,
    pub last_ack: Option<std::time::Instant>,
}

/// A job's store bytes of its latest epoch charged and of the epoch before it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreEpochs {
    /// The latest epoch charged.
    pub epoch: u64,
    /// Its bytes.
    pub bytes: u64,
    /// The bytes of the epoch before it (0 when nothing was charged to it).
    pub previous: u64,
}

impl StoreEpochs {
    /// Charges `bytes` to `epoch`: a later epoch than the latest becomes the latest.
    pub fn charge(&mut self, epoch: u64, bytes: u64) {
        if epoch == self.epoch {
            self.bytes += bytes;
        } else if epoch > self.epoch {
            self.previous = if epoch == self.epoch + 1 {
                self.bytes
            } else {
                0
            };
            self.epoch = epoch;
            self.bytes = bytes;
        } else if epoch + 1 == self.epoch {
            self.previous += bytes;
        }
    }

    /// The bytes charged to the job's `current` epoch and to the one before it.
    pub fn at(&self, current: u64) -> (u64, u64) {
        match current.checked_sub(self.epoch) {
            Some(0) => (self.bytes, self.previous),
            Some(1) => (0, self.bytes),
            _ => (0, 0),
        }
    }
}

impl Default for JobStats {
    fn default() -> Self {
        Self {
            sampled: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            acknowledged: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            position: AtomicU64::new(0),
            stall_us: AtomicU64::new(0),
            waited_for_others: AtomicU64::new(0),
            state: Mutex::new(JobState::Waiting),
            closed: AtomicBool::new(false),
            record_dropped: AtomicU64::new(0),
            store_read_bytes: AtomicU64::new(0),
            store_epochs: Mutex::new(StoreEpochs::default()),
            run: Mutex::new(RunSpan::default()),
        }
    }
}

impl JobStats {
    pub fn state(&self) -> JobState {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(JobState::Failed("poisoned".into()))
    }

    /// Moves to `next` unless the job already finished or failed.
    pub fn set_state(&self, next: JobState) {
        if let Ok(mut s) = self.state.lock()
            && matches!(*s, JobState::Waiting | JobState::Running)
        {
            *s = next;
        }
    }

    /// Puts back a state saved before a [`set_state`](Self::set_state) whose action failed.
    pub fn replace_state(&self, state: JobState) {
        if let Ok(mut s) = self.state.lock() {
            *s = state;
        }
    }

    /// The job's reading began (its first credit).
    pub fn note_started(&self) {
        if let Ok(mut r) = self.run.lock() {
            r.started.get_or_insert_with(std::time::Instant::now);
        }
    }

    /// `n` more records acknowledged, now.
    pub fn note_acknowledged(&self, n: u64) {
        self.acknowledged.fetch_add(n, Relaxed);
        if let Ok(mut r) = self.run.lock() {
            r.last_ack = Some(std::time::Instant::now());
        }
    }

    /// Samples per second over the job's run: acknowledged records over the time from its
    /// first credit to its last acknowledgement (to `now` while `running`); 0 before any.
    pub fn run_rate(&self, running: bool) -> f64 {
        let acked = self.acknowledged.load(Relaxed);
        let Ok(r) = self.run.lock() else {
            return 0.0;
        };
        let end = if running {
            Some(std::time::Instant::now())
        } else {
            r.last_ack
        };
        match (r.started, end) {
            (Some(s), Some(e)) if e > s && acked > 0 => acked as f64 / (e - s).as_secs_f64(),
            _ => 0.0,
        }
    }

    pub fn hit_ratio(&self) -> f64 {
        let h = self.hits.load(Relaxed) as f64;
        let m = self.misses.load(Relaxed) as f64;
        if h + m == 0.0 { 0.0 } else { h / (h + m) }
    }
}

/// Counters of the cache and the loader.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub requests: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Loaded elements a loader thread wrote straight into their slot (no copy by the Cache).
    pub placed: AtomicU64,
    pub loads: AtomicU64,
    pub decodes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub load_errors: AtomicU64,
    pub evictions: AtomicU64,
    /// Evictions of elements no job needed any more in its current epoch (RefCnt's ideal).
    pub evictions_unneeded: AtomicU64,
    /// Evictions of elements some job still needed (the cache was too small): either a
    /// cached element nobody held, or one queued for a slow ring to make room for a faster one.
    pub evictions_needed: AtomicU64,
    /// Loads of an element evicted while a ring still had it queued.
    pub reloads: AtomicU64,
    pub slots_in_use: AtomicU64,
    pub bytes_in_use: AtomicU64,
    pub capacity_bytes: AtomicU64,
    pub slot_capacity: AtomicU64,
    /// Payloads decoded but waiting for room because everything cached is held or needed
    /// sooner.
    pub waiting_for_space: AtomicU64,
    /// Elements rings need that wait for a load to start (loads in flight are bounded).
    pub pending_loads: AtomicU64,
    pub loader_queue: AtomicU64,
    /// Jobs whose rings the Cache holds open, and datasets it holds a source of (state that
    /// must return to zero when every job is gone).
    pub open_jobs: AtomicU64,
    pub open_sources: AtomicU64,
    pub loader_busy_us: AtomicU64,
    pub rounds: AtomicU64,
    /// Σ over rounds of deliveries, and of distinct elements: their ratio is the mean share size.
    pub round_deliveries: AtomicU64,
    pub round_elements: AtomicU64,
    /// Elements that failed to load, by (dataset, element): (kind, message). Bounded.
    pub failures: Mutex<BTreeMap<(u16, u32), (String, String)>>,
    /// Failures by kind (`read_failed`, `corrupt_image`, …).
    pub failures_by_kind: Mutex<BTreeMap<String, u64>>,
}

/// What a working set's preload (`messages::Preload`) is doing, as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum PreloadState {
    /// Loading its elements (below the running jobs' loads).
    Loading,
    /// Every element is cached and pinned (or failed to load: `failed` counts them).
    Ready,
    /// Stopped: the working set does not fit in the pin budget, or the cache shut down. What
    /// it had pinned is released.
    Failed(String),
}

/// Progress of one dataset's preload, shared between the Cache (which writes it) and the
/// control plane (which reports it).
#[derive(Debug)]
pub struct PreloadProgress {
    /// Elements of the working set.
    pub elements: AtomicU64,
    /// Elements cached and pinned.
    pub pinned: AtomicU64,
    /// Elements that failed to load (each is the element's failure, as for a job).
    pub failed: AtomicU64,
    /// Bytes the pinned elements take in the cache.
    pub pinned_bytes: AtomicU64,
    /// Loads the preload issued itself (elements neither cached nor loading for a job).
    pub loads: AtomicU64,
    /// The most bytes every preload together may pin (half the cache's bytes).
    pub budget_bytes: AtomicU64,
    /// Its last payload found no room (everything cached is pinned or needed by jobs): it
    /// goes on when jobs acknowledge or close.
    pub waiting_for_room: AtomicBool,
    pub state: Mutex<PreloadState>,
}

impl Default for PreloadProgress {
    fn default() -> Self {
        PreloadProgress {
            elements: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            budget_bytes: AtomicU64::new(0),
            waiting_for_room: AtomicBool::new(false),
            state: Mutex::new(PreloadState::Loading),
        }
    }
}

impl PreloadProgress {
    pub fn state(&self) -> PreloadState {
        self.state
            .lock()
            .map_or_else(|e| e.into_inner().clone(), |s| s.clone())
    }

    pub fn set_state(&self, state: PreloadState) {
        match self.state.lock() {
            Ok(mut s) => *s = state,
            Err(e) => *e.into_inner() = state,
        }
    }
}

/// Most failures remembered for the API.
pub const MAX_FAILURES_LISTED: usize = 10_000;

impl CacheStats {
    pub fn record_failure(&self, dataset: u16, element: u32, kind: &str, message: &str) {
        if let Ok(mut f) = self.failures.lock()
            && (f.len() < MAX_FAILURES_LISTED || f.contains_key(&(dataset, element)))
        {
            f.insert((dataset, element), (kind.to_string(), message.to_string()));
        }
        if let Ok(mut k) = self.failures_by_kind.lock() {
            *k.entry(kind.to_string()).or_default() += 1;
        }
    }
}

#[cfg(test)]
mod store_epoch_tests {
    use super::StoreEpochs;

    #[test]
    fn store_bytes_go_to_their_epoch_and_the_one_before_is_kept() {
        let mut e = StoreEpochs::default();
        e.charge(0, 10);
        e.charge(0, 5);
        assert_eq!(e.at(0), (15, 0));
        e.charge(1, 7);
        assert_eq!(e.at(1), (7, 15));
        // A load of the previous epoch that ends late still counts for it.
        e.charge(0, 1);
        assert_eq!(e.at(1), (7, 16));
        // Older than that: no epoch of the two shown.
        e.charge(3, 2);
        assert_eq!(e.at(3), (2, 0), "epoch 2 charged nothing");
        assert_eq!(e.at(4), (0, 2), "a new epoch with nothing charged yet");
        assert_eq!(e.at(6), (0, 0));
    }
}
