//! Liveness and the poll's rhythm: the clients' liveness probes (alive, dead, detached
//! early, finished and gone), stalls (a client waiting with nothing ready for it), the jobs'
//! reading rates, and when the cache polls at all (at the tick while anything moves, rarely
//! when idle).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dataplane::ReaderStatus;

use super::{CacheActor, CacheJob, Polled, RankRing};
use crate::service::messages::JobId;
use crate::service::stats::{JobState, JobStats};

/// How often the clients' liveness is probed (two syscalls per ring).
const LIVENESS_INTERVAL: Duration = Duration::from_millis(20);
/// How long after its registration a job's attach is watched at the fast tick.
const ATTACH_WATCH: Duration = Duration::from_secs(2);
/// How often an idle cache (see `CacheActor::idle`) polls at all.
const IDLE_POLL: Duration = Duration::from_millis(50);
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

    /// Schedules the next poll: one tick away while anything moves, [`IDLE_POLL`] when idle
    /// (an idle server's cache costs a few probes a second, not a thousand polls).
    pub(super) fn schedule_poll(&mut self, ctx: &mut Context<Self>) {
        let idle = self.idle();
        let delay = if idle { IDLE_POLL } else { self.tick };
        let handle = ctx.run_later(delay, |act, ctx| {
            let _cpu = dataplane::stages::enter(&dataplane::stages::server::CACHE);
            act.next_poll = None;
            act.poll();
            act.after_message();
            act.schedule_poll(ctx);
        });
        self.next_poll = Some((handle, idle));
    }

    /// Something arrived: if the cache is no longer idle and the next poll is an idle one,
    /// poll at the fast tick instead (never later than already scheduled).
    pub(super) fn wake(&mut self, ctx: &mut Context<Self>) {
        if let Some((handle, true)) = self.next_poll
            && !self.idle()
        {
            ctx.cancel_future(handle);
            self.next_poll = None;
            self.schedule_poll(ctx);
        }
    }
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
