//! Liveness and the poll's rhythm: the clients' liveness probes (alive, dead, detached
//! early, finished and gone), stalls (a client waiting with nothing ready for it), the jobs'
//! reading rates, and when the cache polls at all: one tick after a poll that found
//! something (or a new job), backing off (doubling, up to a quarter of the time the fastest job
//! takes to read a batch, at most [`MAX_POLL_DELAY`]) while polls find nothing, and rarely
//! when idle.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dataplane::ReaderStatus;

use super::{CacheActor, CacheJob, Polled, RankRing};
use crate::messages::JobId;
use crate::stats::{JobState, JobStats};

/// How often the clients' liveness is probed (two syscalls per ring).
const LIVENESS_INTERVAL: Duration = Duration::from_millis(20);
/// How long after its registration a job's attach is watched at the fast tick.
const ATTACH_WATCH: Duration = Duration::from_secs(2);
/// How often an idle cache (see `CacheActor::idle`) polls at all.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// The longest a busy cache waits between polls that find nothing (acknowledgements are
/// still seen within a quarter of the fastest job's batch time, whichever is sooner).
pub(super) const MAX_POLL_DELAY: Duration = Duration::from_millis(8);
/// How often a job's reading rate is measured.
const RATE_INTERVAL: Duration = Duration::from_millis(250);

/// When a poll runs and what it does besides acknowledgements.
#[derive(Debug, Clone, Copy)]
pub(super) struct PollClock {
    pub(super) now: Instant,
    /// Since the last poll (stall time is counted in poll intervals).
    pub(super) interval: Duration,
    /// The clients' liveness is probed in this poll.
    pub(super) probe: bool,
}

/// What a liveness probe found of a ring's client.
pub(super) enum Probe {
    Alive,
    /// Not attached yet.
    Waiting,
    /// Detached after its job finished and everything was pushed.
    Finished,
    /// Died or left early: the job ends, for this reason.
    Gone(&'static str),
}

impl CacheActor {
    /// Starts a poll: how long since the last one, and whether liveness is probed in it.
    pub(super) fn poll_clock(&mut self) -> PollClock {
        let now = Instant::now();
        // Capped so that a long pause of the actor is not all blamed on the rings.
        let interval = now
            .duration_since(self.last_poll)
            .min(Duration::from_secs(1));
        self.last_poll = now;
        let probe = now.duration_since(self.last_liveness) >= LIVENESS_INTERVAL;
        if probe {
            self.last_liveness = now;
        }
        PollClock {
            now,
            interval,
            probe,
        }
    }

    /// Nothing can change but by a message or a client attaching, leaving or dying (which the
    /// liveness probe notices): nothing loading, pending or waiting for room, and every ring
    /// either fully acknowledged or without a live client, with nothing queued that it could
    /// take.
    pub(super) fn idle(&self) -> bool {
        self.loading.is_empty()
            && self.pending.is_empty()
            // A job just registered: its client is expected to attach any moment, and is
            // served at once when it does (later attachers wait for an idle poll).
            && self
                .jobs
                .values()
                .all(|j| j.granted || j.opened.elapsed() > ATTACH_WATCH)
            && self.jobs.values().all(|j| {
                j.rings.iter().all(|rr| {
                    (rr.ring.pushed() == rr.ring.acked() || (rr.probed && !rr.alive))
                        && (rr.queue.is_empty() || rr.ring.free_credit() == 0)
                })
            })
    }

    /// Schedules the next poll: [`CacheActor::poll_delay`] away while anything moves,
    /// [`IDLE_POLL`] when idle (an idle server's cache costs a few probes a second, not a
    /// thousand polls).
    pub(super) fn schedule_poll(&mut self, ctx: &mut Context<Self>) {
        let idle = self.idle();
        let delay = if idle { IDLE_POLL } else { self.poll_delay };
        let handle = ctx.run_later(delay, |act, ctx| {
            let _cpu = joader_stages::enter(&crate::stages::CACHE);
            act.next_poll = None;
            let found = act.poll();
            act.pace_polls(found);
            act.after_message();
            act.schedule_poll(ctx);
        });
        self.next_poll = Some((handle, Instant::now() + delay, idle));
    }

    /// The delay before the next poll: the tick after a poll that found acknowledgements or
    /// a change of a client, else twice the last delay, up to [`CacheActor::poll_cap`].
    /// Polls are what make the cache see acknowledgements; at the tick (1 ms) a cache serving
    /// jobs paced at a few batches a second polls a thousand times a second to find one
    /// every 10 ms or so, and those empty polls (a timer, a wake-up, a walk over the rings)
    /// cost more CPU than the deliveries they wait for.
    pub(super) fn pace_polls(&mut self, found: bool) {
        let readers = self
            .jobs
            .values()
            .filter(|j| j.granted)
            .map(|j| (j.batch, j.rate));
        let cap = poll_cap(readers, self.tick);
        self.poll_delay = next_poll_delay(self.poll_delay, found, self.tick, cap);
    }

    /// Something arrived that the handler has already acted on (stored, queued, pushed): an
    /// idle cache polls at the tick again, and a busy one keeps its pace.
    pub(super) fn wake(&mut self, ctx: &mut Context<Self>) {
        if let Some((handle, _, true)) = self.next_poll
            && !self.idle()
        {
            self.poll_delay = self.tick;
            ctx.cancel_future(handle);
            self.next_poll = None;
            self.schedule_poll(ctx);
        }
    }

    /// Something arrived that only a poll will see through (a new job's clients attaching):
    /// the next poll is at most one tick away and the back-off starts again.
    pub(super) fn hurry(&mut self, ctx: &mut Context<Self>) {
        self.poll_delay = self.tick;
        if let Some((handle, due, _)) = self.next_poll
            && due > Instant::now() + self.tick
        {
            ctx.cancel_future(handle);
            self.next_poll = None;
            self.schedule_poll(ctx);
        }
    }
}

/// The delay before the next busy poll: the tick after a poll that found something, else
/// twice the last delay, up to `cap`.
fn next_poll_delay(last: Duration, found: bool, tick: Duration, cap: Duration) -> Duration {
    if found {
        tick
    } else {
        (last * 2).min(cap).max(tick)
    }
}

/// The longest back-off for jobs reading `(batch, rate)`: a quarter of the time the fastest
/// takes to read a batch, so that its acknowledgements are seen well before its ring runs
/// dry, within [tick, [`MAX_POLL_DELAY`]]; the tick while any job has no rate yet; a paused
/// job (rate zero) sets none.
fn poll_cap(readers: impl Iterator<Item = (u32, Option<f64>)>, tick: Duration) -> Duration {
    let mut cap = MAX_POLL_DELAY;
    for (batch, rate) in readers {
        match rate {
            Some(r) if r > 0.0 => {
                let batch_time = f64::from(batch.max(1)) / r;
                cap = cap.min(Duration::from_secs_f64(batch_time / 4.0));
            }
            // Paused: nothing to hurry for.
            Some(_) => {}
            None => return tick,
        }
    }
    cap.max(tick)
}

impl RankRing {
    /// Counts a stall: the client is attached, has taken everything pushed and could take more
    /// (it has credit), but nothing is ready for it.
    pub(super) fn count_stall(&self, stats: &JobStats, interval: Duration) {
        if self.alive
            && self.ring.consumer_position() == self.ring.pushed()
            && self.ring.free_credit() > 0
            && stats.state() != JobState::Finished
        {
            stats
                .stall_us
                .fetch_add(interval.as_micros() as u64, Relaxed);
        }
    }

    /// Probes the client's liveness (a flock probe), remembering whether it is alive.
    pub(super) fn probe(&mut self, stats: &JobStats) -> Probe {
        self.alive = false;
        self.probed = true;
        match self.ring.reader_status() {
            ReaderStatus::Alive => {
                self.alive = true;
                Probe::Alive
            }
            ReaderStatus::Dead => Probe::Gone("client process died"),
            // A ring cannot be reopened: a client that left before the end of the job ends it.
            ReaderStatus::Detached if stats.state() != JobState::Finished => {
                Probe::Gone("client detached before the end of the job")
            }
            // Finished and read: once every rank's client has (a fast rank that left must not
            // close the rings its job's slower ranks still read).
            ReaderStatus::Detached => Probe::Finished,
            ReaderStatus::NotAttached => Probe::Waiting,
        }
    }
}

impl CacheJob {
    /// Notes what the probes of the job's rings found: `alive` (some client is) marks the job
    /// running; `finished` rings, all of them, end it (only counted when `probe`d).
    pub(super) fn note_liveness(
        &self,
        id: JobId,
        probe: bool,
        alive: bool,
        finished: usize,
        polled: &mut Polled,
    ) {
        if probe && finished == self.rings.len() {
            polled.done.push(id);
        }
        if alive {
            self.stats.set_state(JobState::Running);
        }
    }

    /// Updates the job's reading-rate estimate: records taken per second, measured only over
    /// intervals in which the client had something to take (a starved client is not slow, a
    /// paused one is). Returns whether it measured.
    pub(super) fn measure_rate(&mut self, now: Instant) -> bool {
        let (at, before) = self.rate_mark;
        let elapsed = now.duration_since(at);
        if elapsed < RATE_INTERVAL {
            return false;
        }
        let taken: u64 = self
            .rings
            .iter()
            .map(|rr| rr.ring.consumer_position())
            .sum();
        let waiting: u64 = self
            .rings
            .iter()
            .map(|rr| rr.ring.pushed() - rr.ring.consumer_position().min(rr.ring.pushed()))
            .sum();
        let moved = taken.saturating_sub(before);
        if moved > 0 || waiting > 0 {
            let now_rate = moved as f64 / elapsed.as_secs_f64();
            self.rate = Some(match self.rate {
                Some(r) => 0.5 * r + 0.5 * now_rate,
                None => now_rate,
            });
        }
        self.rate_mark = (now, taken);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(1);

    #[test]
    fn empty_polls_back_off_by_doubling_to_the_cap_and_a_found_one_returns_to_the_tick() {
        let cap = Duration::from_millis(8);
        let mut d = TICK;
        let mut seen = vec![];
        for _ in 0..6 {
            d = next_poll_delay(d, false, TICK, cap);
            seen.push(d.as_millis());
        }
        assert_eq!(seen, [2, 4, 8, 8, 8, 8]);
        assert_eq!(next_poll_delay(d, true, TICK, cap), TICK);
        // A cap below the tick never polls faster than the tick.
        assert_eq!(next_poll_delay(TICK, false, TICK, Duration::ZERO), TICK);
    }

    #[test]
    fn the_cap_is_a_quarter_of_the_fastest_jobs_batch_time_within_the_tick_and_the_maximum() {
        // Batches of 64 at 320 records/s: 200 ms a batch, so the maximum applies.
        assert_eq!(
            poll_cap([(64, Some(320.0))].into_iter(), TICK),
            MAX_POLL_DELAY
        );
        // 64 at 16,000/s: 4 ms a batch, a quarter is 1 ms; the slower job does not matter.
        let cap = poll_cap([(64, Some(320.0)), (64, Some(16_000.0))].into_iter(), TICK);
        assert_eq!(cap, Duration::from_millis(1));
        // 64 at 8,000/s: 8 ms a batch, 2 ms.
        assert_eq!(
            poll_cap([(64, Some(8_000.0))].into_iter(), TICK),
            Duration::from_millis(2)
        );
        // Faster than the tick can follow: the tick.
        assert_eq!(poll_cap([(1, Some(1e6))].into_iter(), TICK), TICK);
        // A job whose rate is not known yet keeps the tick; a paused one sets no cap.
        let unknown = poll_cap([(64, Some(320.0)), (64, None)].into_iter(), TICK);
        assert_eq!(unknown, TICK);
        let paused = poll_cap([(64, Some(0.0)), (64, Some(8_000.0))].into_iter(), TICK);
        assert_eq!(paused, Duration::from_millis(2));
        // No job reading: the maximum (an idle cache polls at its own, slower, interval).
        assert_eq!(poll_cap(std::iter::empty(), TICK), MAX_POLL_DELAY);
    }
}
