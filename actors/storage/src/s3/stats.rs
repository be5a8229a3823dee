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
    /// has a disk tier (whose keys need it).
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
}

impl ObjectStats {
    pub(super) fn request(&self, op: Op, took: Duration) {
        self.requests[op as usize].fetch_add(1, Relaxed);
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
