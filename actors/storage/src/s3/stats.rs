//! Counters of the object-store traffic, kept as atomics (the actors and storage know nothing
//! of Prometheus; the server's exporter reads these at scrape time).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the request latency histogram's buckets; `+Inf` follows.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// What a request to the store was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A page of a listing.
    List,
    /// A whole object, or a range of one.
    Get,
    /// An object's metadata: its ETag, at indexing, when a listing gave none and the server
    /// has a disk tier (whose keys need it) or the layout is `parquet` (whose reads ask for
    /// it).
    Head,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::List, Op::Get, Op::Head];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::List => "list",
            Op::Get => "get",
            Op::Head => "head",
        }
    }
}

/// Kinds of failed requests (each counted once per failed attempt).
pub const ERROR_KINDS: [&str; 5] = [
    "not_found",
    "access_denied",
    "refused",
    "unavailable",
    "timeout",
];

/// Object-store traffic of one server.
#[derive(Debug, Default)]
pub struct ObjectStats {
    requests: [AtomicU64; 3],
    /// Body bytes received from the store.
    pub bytes: AtomicU64,
    /// Attempts made again after a transient failure.
    pub retries: AtomicU64,
    errors: [AtomicU64; ERROR_KINDS.len()],
    /// Requests whose bytes served several elements at once (coalesced tar members).
    pub coalesced: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_sum_us: AtomicU64,
    /// Time element fetches waited for a place among the requests in flight, summed (µs).
    queued_us: AtomicU64,
    /// The server-wide limit on requests in flight now (it adapts, see `limit`).
    pub(super) limit: AtomicU64,
    /// Requests in flight now.
    pub(super) in_flight: AtomicU64,
    /// A GET's time, smoothed (µs; 0 before the first): how far ahead to fetch.
    get_smoothed_us: AtomicU64,
    /// Fetch-ahead (`ahead`): elements asked for, skipped for want of room, loads that found
    /// their bytes there or on their way, fetches that failed with no load waiting, bytes
    /// dropped untaken, and the buffer's bytes and size.
    pub(super) ahead_requests: AtomicU64,
    pub(super) ahead_full: AtomicU64,
    pub(super) ahead_hits: AtomicU64,
    pub(super) ahead_joined: AtomicU64,
    pub(super) ahead_failed: AtomicU64,
    pub(super) ahead_stale: AtomicU64,
    pub(super) ahead_bytes: AtomicU64,
    pub(super) ahead_capacity: AtomicU64,
}

/// Fetch-ahead's counters (see [`ObjectStats::ahead`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AheadCounts {
    /// Elements fetched ahead of their load.
    pub requests: u64,
    /// Elements not fetched ahead: the buffer was full.
    pub full: u64,
    /// Loads whose bytes were waiting in the buffer.
    pub hits: u64,
    /// Loads whose bytes were on their way (they waited for that request).
    pub joined: u64,
    /// Fetches ahead that failed with no load waiting (the load fetched again).
    pub failed: u64,
    /// Elements whose bytes were dropped untaken (see `ahead::STALE`).
    pub stale: u64,
    /// Bytes in the buffer now (those on their way counted at the mean element size).
    pub bytes: u64,
    /// The buffer's size (0: no fetch-ahead).
    pub capacity: u64,
}

impl ObjectStats {
    pub(super) fn request(&self, op: Op, took: Duration) {
        self.requests[op as usize].fetch_add(1, Relaxed);
        if op == Op::Get {
            // Smoothed over about the last 16 GETs; a lost update between racing requests
            // only delays the estimate.
            let us = took.as_micros().max(1) as u64;
            let old = self.get_smoothed_us.load(Relaxed);
            let new = if old == 0 { us } else { (old * 15 + us) / 16 };
            self.get_smoothed_us.store(new, Relaxed);
        }
        let s = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency[bucket].fetch_add(1, Relaxed);
        self.latency_sum_us
            .fetch_add(took.as_micros() as u64, Relaxed);
    }

    pub(super) fn queued(&self, waited: Duration) {
        self.queued_us.fetch_add(waited.as_micros() as u64, Relaxed);
    }

    /// Seconds element fetches waited for a place among the requests in flight, in all.
    pub fn queued_seconds(&self) -> f64 {
        self.queued_us.load(Relaxed) as f64 / 1e6
    }

    /// The server-wide limit on requests in flight now.
    pub fn in_flight_limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// A GET's time lately (smoothed), once one has been made.
    pub fn get_time(&self) -> Option<Duration> {
        match self.get_smoothed_us.load(Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Fetch-ahead's counters.
    pub fn ahead(&self) -> AheadCounts {
        AheadCounts {
            requests: self.ahead_requests.load(Relaxed),
            full: self.ahead_full.load(Relaxed),
            hits: self.ahead_hits.load(Relaxed),
            joined: self.ahead_joined.load(Relaxed),
            failed: self.ahead_failed.load(Relaxed),
            stale: self.ahead_stale.load(Relaxed),
            bytes: self.ahead_bytes.load(Relaxed),
            capacity: self.ahead_capacity.load(Relaxed),
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    pub(super) fn error(&self, kind: &str) {
        if let Some(i) = ERROR_KINDS.iter().position(|k| *k == kind) {
            self.errors[i].fetch_add(1, Relaxed);
        }
    }

    /// Requests made, by operation.
    pub fn requests(&self, op: Op) -> u64 {
        self.requests[op as usize].load(Relaxed)
    }

    /// Failed attempts, by kind (in the order of [`ERROR_KINDS`]).
    pub fn errors(&self) -> [(&'static str, u64); ERROR_KINDS.len()] {
        std::array::from_fn(|i| (ERROR_KINDS[i], self.errors[i].load(Relaxed)))
    }

    /// The latency histogram: cumulative counts per bucket of [`LATENCY_BUCKETS`], then the
    /// total count and the sum in seconds.
    pub fn latency(&self) -> (Vec<u64>, u64, f64) {
        let mut cumulative = Vec::with_capacity(LATENCY_BUCKETS.len());
        let mut total = 0;
        for (i, c) in self.latency.iter().enumerate() {
            total += c.load(Relaxed);
            if i < LATENCY_BUCKETS.len() {
                cumulative.push(total);
            }
        }
        let sum = self.latency_sum_us.load(Relaxed) as f64 / 1e6;
        (cumulative, total, sum)
    }
}
