//! The server-wide limit on object-store requests in flight ([`InFlight`]): it grows to what
//! the store sustains and backs off when the store says it cannot keep up, as TCP's
//! congestion control does (AIMD), instead of a fixed number that is too small for a store
//! far away and too large for a store that throttles.
//!
//! - It starts at [`START`] (or the ceiling, if lower) and never leaves `1..=ceiling`
//!   (`s3_max_in_flight`).
//! - It grows only while fetches wait for a place (a limit nobody reaches says nothing): by
//!   one for each request that succeeds while it has never been cut (slow start, doubling per
//!   round trip), by one per round trip's worth of successes afterwards.
//! - It does not grow while answers take more than [`QUEUEING`] times the fastest (the least
//!   answer time seen, smoothed, as TCP Vegas does; it creeps up by [`BASE_CREEP`] every
//!   [`BASE_WINDOW`] answers, so that a store that became slower for good is followed): the
//!   store then queues requests, and more in flight would only wait longer there. Fetch-ahead keeps
//!   fetches waiting by design, so without this rule the limit grew to its ceiling against a
//!   store that could not answer faster (on a loaded 2-core machine, `s3s-fs`'s GETs went from
//!   about 40 to 130 ms as 250 requests waited in it).
//! - A request the store throttled or could not serve (429, 503 and other 5xx, a timeout, a
//!   broken connection) halves it, once per round trip (the failures of requests that were
//!   already in flight when it was cut do not cut it again).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The limit a server starts with.
pub const START: usize = 16;

/// Growth stops while answers take more than this many times the fastest lately.
pub const QUEUEING: f64 = 2.0;

/// The fastest time creeps up by [`BASE_CREEP`] every this many answers.
pub const BASE_WINDOW: u32 = 512;

/// See [`BASE_WINDOW`].
pub const BASE_CREEP: f64 = 1.01;

/// See the module docs.
pub(super) struct InFlight {
    ceiling: usize,
    state: Mutex<State>,
    /// Woken when a place is given back.
    freed: Notify,
    /// The current limit, for the counters (read without the lock).
    shown: AtomicU64,
}

struct State {
    /// Fractional so that congestion avoidance grows by `1/limit` per success.
    limit: f64,
    in_flight: usize,
    /// A fetch waits for a place now.
    wanted: bool,
    /// Never cut yet: grow by one per success.
    slow_start: bool,
    /// Requests finished since the last cut; a cut needs as many as were in flight then.
    since_cut: usize,
    in_flight_at_cut: usize,
    /// The least answer time (creeping up), the answers since it last crept, and the answers'
    /// smoothed time (s).
    base: f64,
    answers: u32,
    smoothed: Option<f64>,
}

impl State {
    /// Notes an answer's time; returns whether the store queues requests (see the module
    /// docs).
    fn queueing(&mut self, took: Duration) -> bool {
        let t = took.as_secs_f64();
        self.answers += 1;
        if self.answers >= BASE_WINDOW {
            self.base *= BASE_CREEP;
            self.answers = 0;
        }
        self.base = self.base.min(t);
        let smoothed = match self.smoothed {
            None => t,
            Some(s) => s * 0.875 + t * 0.125,
        };
        self.smoothed = Some(smoothed);
        smoothed > QUEUEING * self.base
    }
}

/// What became of a request, for the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Answered, in this time (from the request to its last byte).
    Served(Duration),
    /// Throttled, unavailable or timed out: the store did not keep up.
    Overloaded,
    /// Neither says anything more (a final error, or an overload already told).
    Other,
}

/// A place among the requests in flight, given back with [`Permit::release`] and the
/// request's outcome, or on drop (a request abandoned before its answer: the limit learns
/// nothing from it, but the place is free again).
#[must_use]
pub(super) struct Permit(Option<Arc<InFlight>>);

impl Permit {
    /// Gives the place back and adapts the limit to how the request went.
    pub(super) fn release(mut self, outcome: Outcome) {
        if let Some(limit) = self.0.take() {
            limit.give_back(outcome);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(limit) = self.0.take() {
            limit.give_back(Outcome::Other);
        }
    }
}

impl InFlight {
    pub(super) fn new(ceiling: usize) -> Self {
        let ceiling = ceiling.max(1);
        let limit = START.min(ceiling);
        Self {
            ceiling,
            state: Mutex::new(State {
                limit: limit as f64,
                in_flight: 0,
                wanted: false,
                slow_start: true,
                since_cut: 0,
                in_flight_at_cut: 0,
                base: f64::INFINITY,
                answers: 0,
                smoothed: None,
            }),
            freed: Notify::new(),
            shown: AtomicU64::new(limit as u64),
        }
    }

    /// The current limit.
    pub(super) fn limit(&self) -> usize {
        self.shown.load(Relaxed) as usize
    }

    /// Requests in flight now.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place if one is free now; otherwise marks that a fetch wants one.
    pub(super) fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let mut s = self.lock();
        if s.in_flight < s.limit as usize {
            s.in_flight += 1;
            s.wanted = false;
            Some(Permit(Some(self.clone())))
        } else {
            s.wanted = true;
            None
        }
    }

    /// Waits for a place.
    pub(super) async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            if let Some(p) = self.try_acquire() {
                return p;
            }
            // A place given back between the check and this wait left a permit in `freed`.
            self.freed.notified().await;
        }
    }

    /// A place given back (by its [`Permit`]), and what the request's outcome says.
    fn give_back(&self, outcome: Outcome) {
        let mut s = self.lock();
        s.in_flight -= 1;
        s.since_cut += 1;
        self.adapt(&mut s, outcome);
        drop(s);
        self.freed.notify_one();
    }

    /// A request still in flight was throttled (it will be tried again under its place).
    pub(super) fn overloaded(&self) {
        let mut s = self.lock();
        self.adapt(&mut s, Outcome::Overloaded);
    }

    fn adapt(&self, s: &mut State, outcome: Outcome) {
        match outcome {
            Outcome::Served(took) => {
                if s.queueing(took) || !s.wanted {
                    // Waiting fetches would wait in the store instead; none waits here.
                } else {
                    let step = if s.slow_start { 1.0 } else { 1.0 / s.limit };
                    s.limit = (s.limit + step).min(self.ceiling as f64);
                }
            }
            Outcome::Overloaded if s.since_cut > s.in_flight_at_cut => {
                s.limit = (s.limit / 2.0).floor().max(1.0);
                s.slow_start = false;
                s.since_cut = 0;
                s.in_flight_at_cut = s.in_flight;
            }
            Outcome::Overloaded | Outcome::Other => {}
        }
        self.shown.store(s.limit as u64, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer's time when the store answers at once.
    const MS: Duration = Duration::from_millis(1);

    /// Takes every free place (the fetches then want more).
    fn fill(l: &Arc<InFlight>, places: &mut Vec<Permit>) {
        while let Some(p) = l.try_acquire() {
            places.push(p);
        }
    }

    #[test]
    fn the_limit_grows_while_fetches_wait_and_stops_at_the_ceiling() {
        let l = Arc::new(InFlight::new(100));
        let mut places = Vec::new();
        fill(&l, &mut places);
        assert_eq!(places.len(), START);
        // Requests keep succeeding while more fetches wait: slow start, one more per success.
        for _ in 0..500 {
            let p = places.pop().unwrap();
            p.release(Outcome::Served(MS));
            fill(&l, &mut places);
            assert!(l.in_flight() <= l.limit(), "more in flight than the limit");
            assert_eq!(places.len(), l.in_flight());
        }
        assert_eq!(l.limit(), 100, "the ceiling is reached and held");
        assert_eq!(places.len(), 100);
    }

    #[test]
    fn a_limit_nobody_reaches_does_not_grow() {
        let l = Arc::new(InFlight::new(100));
        for _ in 0..100 {
            let p = l.try_acquire().unwrap();
            p.release(Outcome::Served(MS));
        }
        assert_eq!(l.limit(), START);
    }

    #[test]
    fn overload_halves_the_limit_once_per_round_trip_then_it_grows_slowly() {
        let l = Arc::new(InFlight::new(1000));
        let mut places = Vec::new();
        fill(&l, &mut places);
        for _ in 0..48 {
            places.pop().unwrap().release(Outcome::Served(MS));
            fill(&l, &mut places);
        }
        assert_eq!(l.limit(), 64);
        // Every request in flight fails (a throttling store): one cut, not 64.
        let n = places.len();
        for p in places.drain(..) {
            p.release(Outcome::Overloaded);
        }
        assert_eq!(l.limit(), 32, "{n} failures of one round trip cut once");
        // The next round trip's failures cut again.
        fill(&l, &mut places);
        for p in places.drain(..) {
            p.release(Outcome::Overloaded);
        }
        assert_eq!(l.limit(), 16);
        // Then one more per round trip of successes (congestion avoidance), not one each.
        fill(&l, &mut places);
        for _ in 0..20 {
            places.pop().unwrap().release(Outcome::Served(MS));
            fill(&l, &mut places);
        }
        assert_eq!(l.limit(), 17);
        // And never below one.
        let l = Arc::new(InFlight::new(4));
        for _ in 0..20 {
            let p = l.try_acquire().unwrap();
            p.release(Outcome::Overloaded);
        }
        assert_eq!(l.limit(), 1);
    }

    #[test]
    fn the_limit_stops_growing_when_the_store_queues_what_it_is_sent() {
        // A store that serves 32 requests at once in 10 ms: beyond that, each request waits
        // in it for its turn (its time grows with what is in flight).
        let l = Arc::new(InFlight::new(1000));
        let mut places = Vec::new();
        fill(&l, &mut places);
        for _ in 0..5000 {
            let in_flight = places.len() as u32;
            let took = Duration::from_millis(10) * in_flight.div_ceil(32).max(1);
            places.pop().unwrap().release(Outcome::Served(took));
            fill(&l, &mut places);
        }
        let limit = l.limit();
        assert!(
            (32..=96).contains(&limit),
            "the limit grew to {limit} against a store that serves 32 at once"
        );
        // A store whose answers do not slow down lets it grow to the ceiling.
        let l = Arc::new(InFlight::new(1000));
        fill(&l, &mut places);
        for _ in 0..5000 {
            places.pop().unwrap().release(Outcome::Served(MS * 10));
            fill(&l, &mut places);
        }
        assert_eq!(l.limit(), 1000);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_fetch_gets_the_place_given_back() {
        let l = Arc::new(InFlight::new(1));
        let first = l.acquire().await;
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire().await })
        };
        tokio::task::yield_now().await;
        first.release(Outcome::Served(MS));
        let second = waiter.await.unwrap();
        assert_eq!(l.in_flight(), 1);
        second.release(Outcome::Served(MS));
        assert_eq!(l.in_flight(), 0);
    }

    #[test]
    fn a_permit_dropped_without_an_outcome_frees_its_place() {
        let l = Arc::new(InFlight::new(1));
        let first = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        drop(first);
        assert_eq!(l.in_flight(), 0);
        let limit = l.limit();
        assert!(l.try_acquire().is_some(), "the place is free again");
        assert_eq!(
            l.limit(),
            limit,
            "an abandoned request says nothing of the store"
        );
    }
}
