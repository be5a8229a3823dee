//! Whether a job keeps pace: the jobs that may join another job's pass ahead of their credit,
//! and when a paced job's own pass is due.
//!
//! DSA correlates the picks of the jobs sampled in the same round only. A job's credit comes
//! back when its client acknowledges a batch, and when loads are the bottleneck that moment is
//! set by when the job's own last batch finished loading: jobs that were once sampled apart
//! return their credit apart, and would stay apart forever, each paying for loads of its own.
//! So a pass also samples, for up to two batches beyond their credit (their *lookahead*: with
//! one batch, a job that had fallen one batch out of step could no longer join and stayed
//! apart; `bench scale`'s mix decoded 4% more), the DSA jobs that keep pace. Sampled
//! together, they share the loads, receive their batches together and return their credit
//! together; a slow job's next batch is picked in a pass of the fast ones instead of in one of
//! its own.
//!
//! A job becomes *eligible* to join when its credit comes back within its lookahead. A job at
//! about the pace of the jobs the pass is for (its period at most twice the shortest of theirs)
//! joins at once. A slower job joins on a common grid instead: at the first pass after the end
//! of the slot of `2^k` milliseconds (counted from the Sampler's start, the smallest power of
//! two not below its period) in which it became eligible. A slot is at least a period long, so
//! every slow job of about the same pace returns credit in every slot, and they all join the
//! pass that follows the slot's end: they share among themselves too, whatever the phases of
//! their readers (with slots shorter than a period, jobs whose returns fell in different slots
//! were sampled apart, and paid for the loads of their own picks separately). Grids of
//! different sizes are nested, so jobs of neighbouring paces still meet on the coarser one.
//!
//! **A paced job's own pass is on its grid too.** When a GPU shared by several jobs sets the
//! pace, each job's batch comes back at its own moment of a common period (the jobs' steps
//! take turns on the GPU), so a pass at each return sampled each job with whoever happened to
//! be eligible then: four such jobs shared 0.42 decodes per delivered image where 0.25 is the
//! ideal (`bench e2e`'s GPU-lock scenario). So a paced job whose credit is above its *top-up
//! level* (half its lookahead below zero) is due for a pass at the end of the grid slot in
//! which its credit came back ([`Pace::due`]), and that pass samples it down to the top-up
//! level, the other jobs of its pace riding along within their lookahead: one pass per slot
//! samples every job of a pace in the same rounds. Its reader meanwhile reads what it was
//! sampled before, its rings and half a lookahead (two batches and one, for a rank); if that
//! would run out before the pass has loaded (the slot's end plus half a period), the pass is
//! due at once, as for a job that does not keep pace.
//!
//! A job keeps pace when its client is reading: a whole unit of credit (a batch of each rank)
//! has come back at least twice (so it has a period, the smoothed interval between units:
//! credit comes back in parts, as the reader copies a batch out, so the interval between
//! returns is no measure of its pace) and its last return is less than two periods old. A job
//! whose reader never attached, or paused (an evaluation pass, a SIGSTOP), does not, and is
//! sampled for its credit only, one tick after it comes back. What a job is sampled ahead
//! waits in the Cache's queue for room in its ring; those elements are loaded with the others,
//! and are evictable (and reloaded) when memory is short, like everything queued and not yet
//! pushed.

use std::time::{Duration, Instant};

/// A job's lookahead, in deliveries: two of its steps (`step`, its batch size times its
/// ranks). With one, a job that had fallen one batch out of step could no longer join the
/// others' passes and stayed apart.
pub(super) fn lookahead(step: u32) -> u32 {
    step.saturating_mul(2)
}

/// Weight of the newest interval in the smoothed period.
const ALPHA: f64 = 0.25;

/// A job's credit timing, as the Sampler sees it.
#[derive(Debug, Clone, Default)]
pub struct Pace {
    /// When credit last came back.
    last_return: Option<Instant>,
    /// The smoothed time the job's reader takes to read a unit (a batch of each of its ranks,
    /// see [`Pace::returned`]).
    period: Option<Duration>,
    /// Since when the job may join a pass (its credit is back within its lookahead).
    eligible_since: Option<Instant>,
    /// When the last whole unit came back, and the credit returned since.
    last_unit: Option<Instant>,
    partial: u64,
    /// The unit of the period.
    unit: u32,
}

impl Pace {
    /// `n` deliveries of credit came back at `now`. A reader acknowledges a batch in parts as
    /// it copies them out, so the period is the time between whole `unit`s of credit (a batch
    /// of each rank; `0`: every return counts as one), not between returns.
    pub fn returned(&mut self, now: Instant, n: u32, unit: u32) {
        self.last_return = Some(now);
        self.unit = if unit == 0 { n.max(1) } else { unit };
        self.partial += u64::from(n);
        let units = self.partial / u64::from(self.unit);
        if units == 0 {
            return;
        }
        self.partial %= u64::from(self.unit);
        if let Some(last) = self.last_unit {
            let gap = now.saturating_duration_since(last) / units as u32;
            self.period = Some(match self.period {
                None => gap,
                Some(p) => p.mul_f64(1.0 - ALPHA) + gap.mul_f64(ALPHA),
            });
        }
        self.last_unit = Some(now);
    }

    /// The deliveries per second the job's reader takes, once it keeps pace.
    pub fn rate(&self, now: Instant) -> Option<f64> {
        let period = self.period(now)?.as_secs_f64();
        Some(f64::from(self.unit) / period.max(1e-6))
    }

    /// The size of the job's grid slots: the smallest power of two of milliseconds not below
    /// its period.
    fn slot_ms(period: Duration) -> u64 {
        (period.as_millis() as u64).max(1).next_power_of_two()
    }

    /// When a paced job that wants more deliveries is due for a pass: at the end of the grid
    /// slot in which it became eligible (or of the slot of `now`, if it is not eligible), so
    /// that the jobs of one pace whose credit comes back within one slot are sampled in one
    /// pass. `None` if the job does not keep pace.
    pub fn due(&self, start: Instant, now: Instant) -> Option<Instant> {
        let size = Self::slot_ms(self.period(now)?);
        let since = self.eligible_since.unwrap_or(now);
        let ms = since.saturating_duration_since(start).as_millis() as u64;
        Some(start + Duration::from_millis((ms / size + 1) * size))
    }

    /// It was sampled in a pass as one of the jobs the pass was for: it is no longer eligible.
    pub fn served(&mut self) {
        self.eligible_since = None;
    }

    /// See the module docs.
    pub fn keeps_pace(&self, now: Instant) -> bool {
        match (self.last_return, self.period) {
            (Some(last), Some(period)) => now <= last + 2 * period,
            _ => false,
        }
    }

    /// Its credit came back within its lookahead (at `now`): it may join a pass.
    pub fn eligible(&mut self, now: Instant) {
        self.eligible_since.get_or_insert(now);
    }

    /// Whether the job joins a pass at `now`, `lead` being the shortest period of the jobs
    /// with credit in the pass and `start` the grid's origin; if it does, it is no longer
    /// eligible. See the module docs.
    pub fn join(&mut self, start: Instant, now: Instant, lead: Option<Duration>) -> bool {
        let Some(since) = self.eligible_since else {
            return false;
        };
        let Some(period) = self.period.filter(|_| self.keeps_pace(now)) else {
            return false;
        };
        let at_once = lead.is_some_and(|lead| period <= 2 * lead);
        if !at_once {
            let ms = |t: Instant| t.saturating_duration_since(start).as_millis() as u64;
            let size = Self::slot_ms(period);
            if ms(now) / size <= ms(since) / size {
                return false;
            }
        }
        self.eligible_since = None;
        true
    }

    /// The smoothed period, once the job keeps pace.
    pub fn period(&self, now: Instant) -> Option<Duration> {
        self.period.filter(|_| self.keeps_pace(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_lookahead_is_two_steps_and_none_for_a_step_of_zero() {
        assert_eq!(lookahead(64 * 4), 512);
        assert_eq!(lookahead(0), 0);
        assert_eq!(lookahead(u32::MAX), u32::MAX);
    }

    #[test]
    fn a_job_keeps_pace_while_it_returns_credit() {
        let t0 = Instant::now();
        let mut p = Pace::default();
        assert!(!p.keeps_pace(t0), "never returned credit (never attached)");
        p.returned(t0, 16, 16);
        assert!(!p.keeps_pace(t0 + ms(10)), "one return gives no period");
        p.returned(t0 + ms(100), 16, 16);
        assert_eq!(p.period, Some(ms(100)));
        assert!(p.keeps_pace(t0 + ms(250)));
        assert!(p.keeps_pace(t0 + ms(300)));
        assert!(
            !p.keeps_pace(t0 + ms(301)),
            "overdue by more than a period: paused"
        );
        // The period follows the reader's pace, smoothed.
        p.returned(t0 + ms(300), 16, 16);
        assert_eq!(p.period, Some(ms(125)));
        assert!(p.keeps_pace(t0 + ms(550)) && !p.keeps_pace(t0 + ms(551)));
    }

    #[test]
    fn slow_jobs_join_on_their_grid_and_same_pace_jobs_at_once() {
        let t0 = Instant::now();
        let paced = |period: u64, last: u64| {
            let mut p = Pace::default();
            p.returned(t0 + ms(last - period), 16, 16);
            p.returned(t0 + ms(last), 16, 16);
            p.eligible(t0 + ms(last));
            p
        };
        let fast = Some(ms(100));
        // Period 600 ms (slots of 1024 ms), eligible at 1100 ms (slot 1): joins from 2048 ms.
        let mut a = paced(600, 1100);
        assert!(
            !a.join(t0, t0 + ms(1200), fast),
            "waits for the end of its slot"
        );
        assert!(!a.join(t0, t0 + ms(2047), fast));
        // Another slow job, eligible in the same slot, joins the same pass.
        let mut b = paced(520, 1900);
        assert!(a.join(t0, t0 + ms(2048), fast) && b.join(t0, t0 + ms(2048), fast));
        assert!(
            !a.join(t0, t0 + ms(2100), fast),
            "joined: no longer eligible"
        );
        // Jobs at the pass's pace join at once.
        let mut c = paced(150, 1000);
        assert!(c.join(t0, t0 + ms(1001), fast));
        // So does a slow job in a pass of slow jobs.
        let mut d = paced(600, 1100);
        assert!(d.join(t0, t0 + ms(1101), Some(ms(500))));
        // A paused job, or one never eligible, joins nothing.
        let mut e = paced(100, 1000);
        assert!(!e.join(t0, t0 + ms(1201), fast));
        let mut f = Pace::default();
        f.returned(t0, 16, 16);
        f.returned(t0 + ms(100), 16, 16);
        assert!(!f.join(t0, t0 + ms(150), fast));
    }

    #[test]
    fn slow_jobs_of_one_pace_join_the_same_passes_whatever_their_phases() {
        // Two readers of period 173 ms, 100 ms apart, beside fast jobs whose passes come every
        // 2 ms: each joins the first pass after the end of every slot in which its credit came
        // back, and with slots at least a period long, those are the same passes. (With slots
        // of 128 ms, the largest power of two below the period, they were apart in most.)
        let t0 = Instant::now();
        let fast = Some(ms(20));
        let mut jobs = [Pace::default(), Pace::default()];
        let mut joined: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        for now in (0..5000u64).step_by(2) {
            for (i, p) in jobs.iter_mut().enumerate() {
                let phase = 10 + 100 * i as u64;
                if now >= phase && (now - phase) % 173 < 2 {
                    p.returned(t0 + ms(now), 16, 16);
                    p.eligible(t0 + ms(now));
                }
                if p.join(t0, t0 + ms(now), fast) {
                    joined[i].push(now);
                }
            }
        }
        // After the first second (a period is smoothed from the first returns on).
        let after = |v: &Vec<u64>| v.iter().copied().filter(|&t| t >= 1000).collect::<Vec<_>>();
        assert!(after(&joined[0]).len() >= 15, "{joined:?}");
        assert_eq!(after(&joined[0]), after(&joined[1]));
    }
}
