//! The Sampler actor: one per base dataset. It owns the dataset's dependent sampling tree (and
//! an independent sampler for jobs that opted out) and samples rounds for the jobs that have
//! credit. A job's credit is the number of deliveries it may have outstanding (the free places
//! of its rings): fast jobs never wait for slow ones, and a job without credit is masked, not
//! dropped.
//!
//! Rounds are sampled in passes, a short batching window (the tick) after an event that can
//! let a job move (credit returned, a job added). A DSA job's first credit (its clients have
//! attached) waits for the end of a *start window* opened by the first of the jobs starting
//! together: jobs launched together (a sweep's script, a launcher's processes) are sampled
//! together from their first element, where the first to attach used to be sampled a ring and
//! a lookahead ahead of the others, elements each later job then loaded again on its own.
//!
//! A pass also samples, up to two batches beyond their credit (their lookahead), the DSA jobs
//! that keep pace (slower ones on a grid sized by their pace), so that jobs that read together
//! are sampled together and share their loads; a job that keeps pace has its own passes on
//! that grid, which top it up to half its lookahead, so that jobs whose batches come back at
//! different moments of one period (a shared GPU) are still sampled in one pass (see
//! [`pace`]). With no job able to move, no pass is scheduled: an idle sampler costs nothing.
//!
//! The jobs of a dataset read from an object store are sampled further ahead still, by about
//! what they read in a few fetch times; those picks wait here, their bytes fetched meanwhile,
//! and reach the Cache as they would without it (see [`ahead`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::stages::SAMPLER;
use actix::prelude::*;
use joader_stages as stages;

mod ahead;

pub use ahead::FetchClock;
mod invariants;
mod pace;

#[cfg(test)]
pub(crate) use invariants::probe;

use crate::messages::{
    AddJob, DatasetId, Deliver, DeliverGroup, DeliverItem, ElementSource, EndAt, GrowJob, Grown,
    JobId, JobSignal, Pass, RemoveJob,
};
use crate::stats::{CacheStats, JobStats};
use joader_core::invariants::Periodic;
use joader_core::sampling::{
    DependentSamplingTree, IndependentSampler, JobEvent, JobSpec, Round, Sampler, SamplerError,
    SamplerKind,
};

/// Rounds per pass at most, so that one pass never holds the arbiter for long.
const MAX_ROUNDS_PER_PASS: usize = 4096;

struct JobEntry {
    kind: SamplerKind,
    credit: i64,
    stats: Arc<JobStats>,
    /// Deliveries the job may be sampled beyond its credit when it joins a pass.
    lookahead: u32,
    pace: pace::Pace,
    /// Joins the pass under way within its lookahead (see [`pace`]).
    joins: bool,
    /// The pass under way is for this paced job: it samples it up to its top-up level (see
    /// [`pace`]).
    drives: bool,
    /// The most credit the job has had: its rings' places, all free.
    capacity: i64,
    /// Its credit has come back at least once (its clients attached).
    started: bool,
    /// Its first credit waits for the end of this start window (see the module docs).
    held_until: Option<Instant>,
    /// Where the job's deliveries are recorded, and those of the pass under way.
    record: Option<(RecordSender, Vec<[u32; 3]>)>,
}

/// Where a recording job's deliveries `(epoch, position, element)` go (see `AddJob::record`).
type RecordSender = std::sync::mpsc::SyncSender<Vec<[u32; 3]>>;

/// See the module docs.
pub struct SamplerActor {
    dataset: DatasetId,
    dsa: DependentSamplingTree,
    isa: IndependentSampler,
    jobs: HashMap<JobId, JobEntry>,
    downstream: Recipient<Deliver>,
    tick: Duration,
    stats: Arc<CacheStats>,
    round: Round,
    /// When the next pass is scheduled, if one is, and its timer's number: a timer that an
    /// earlier one replaced does nothing when it fires.
    scheduled: Option<(Instant, u64)>,
    /// Timers started so far.
    timers: u64,
    /// How long a start window is; zero: jobs start at their first credit.
    start_window: Duration,
    /// The end of the start window open now, if one is.
    cohort_until: Option<Instant>,
    /// The origin of the grid on which jobs join passes (see [`pace`]).
    started: Instant,
    /// Messages (and timed passes) handled, and the full invariant checks run after them.
    checks: Periodic,
    /// The held picks of a dataset read from an object store (see [`ahead`]).
    ahead: Option<ahead::FetchAhead>,
}

impl SamplerActor {
    pub fn new(
        dataset: DatasetId,
        downstream: Recipient<Deliver>,
        tick: Duration,
        stats: Arc<CacheStats>,
    ) -> Self {
        Self {
            dataset,
            dsa: DependentSamplingTree::new(),
            isa: IndependentSampler::new(),
            jobs: HashMap::new(),
            downstream,
            tick,
            stats,
            round: Round::default(),
            scheduled: None,
            timers: 0,
            start_window: Duration::ZERO,
            cohort_until: None,
            started: Instant::now(),
            checks: Periodic::default(),
            ahead: None,
        }
    }

    /// Samples the jobs ahead and asks `source` for the bytes of their picks before the Cache
    /// loads them, when the source fetches ahead (see [`ahead`]).
    pub fn with_fetch_ahead(self, source: Arc<dyn ElementSource>) -> Self {
        if source.fetching().and_then(|f| f.fetch_time()).is_none() {
            return self;
        }
        self.with_fetch_clock(Arc::new(move || {
            source.fetching().and_then(|f| f.fetch_time())
        }))
    }

    /// Samples the jobs ahead by what `clock` says a fetch takes, and sends the picks to fetch
    /// ahead downstream in `Deliver::ahead`, for a Sampler whose downstream is not the source's
    /// Cache: a cluster leader's, whose nodes fetch (see `ahead`). While the clock says
    /// `None`, the jobs are sampled as without fetch-ahead.
    pub fn with_fetch_clock(mut self, clock: FetchClock) -> Self {
        self.ahead = Some(ahead::FetchAhead::new(clock));
        self
    }

    /// Opens a start window of `window` at each DSA job's first credit (see the module docs).
    pub fn with_start_window(mut self, window: Duration) -> Self {
        self.start_window = window;
        self
    }

    /// Whether a job takes part in the pass: it has credit and its start is not held (a pass
    /// first ends the holds whose window is over).
    fn can_move(j: &JobEntry) -> bool {
        j.credit > 0 && j.held_until.is_none()
    }

    /// A job's credit came back: the first time, a DSA job waits for the start window.
    fn credited(&mut self, job: JobId, now: Instant) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.started {
            return;
        }
        j.started = true;
        if j.kind != SamplerKind::Dsa || self.start_window.is_zero() {
            return;
        }
        let end = match self.cohort_until.filter(|&t| t > now) {
            Some(t) => t,
            None => *self.cohort_until.insert(now + self.start_window),
        };
        j.held_until = Some(end);
    }

    /// Schedules a pass for the job due first (one tick from now at the earliest; see
    /// [`Self::due`]) unless one is scheduled as soon.
    fn wake(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let at = self.next_due(now);
        let Some(at) = at.map(|t| t.max(now + self.tick)) else {
            return;
        };
        if self.scheduled.is_some_and(|(s, _)| s <= at) {
            return;
        }
        self.timers += 1;
        let timer = self.timers;
        self.scheduled = Some((at, timer));
        ctx.run_later(at - now, move |act, ctx| {
            let _cpu = stages::enter(&SAMPLER);
            if act.scheduled.map(|(_, t)| t) != Some(timer) {
                return;
            }
            act.scheduled = None;
            act.pass();
            act.after_message();
            // A pass stops after MAX_ROUNDS_PER_PASS rounds: what is left goes on next window.
            act.wake(ctx);
        });
    }

    /// Samples rounds while some job has credit, and sends them downstream in one message. The
    /// DSA jobs that keep pace join the rounds within their lookahead (see [`pace`]).
    fn pass(&mut self) {
        self.pass_at(Instant::now());
    }

    /// [`Self::pass`] at `now`.
    fn pass_at(&mut self, now: Instant) {
        self.end_holds(now);
        self.deepen_all(now);
        self.choose_roles(now);
        let mut out = Deliver {
            dataset: self.dataset,
            groups: Vec::new(),
            ends: Vec::new(),
            ahead: Vec::new(),
            grown: Vec::new(),
        };
        let mut active: Vec<JobId> = Vec::new();
        for _ in 0..MAX_ROUNDS_PER_PASS {
            let mut any = false;
            for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
                match self.sample_round(kind, &mut active, &mut out) {
                    Ok(sampled) => any |= sampled,
                    Err(e) => {
                        let dataset = self.dataset;
                        tracing::error!(error = %e, dataset, "sampler refused a round");
                        return;
                    }
                }
            }
            if !any {
                break;
            }
        }
        self.release(&mut out);
        // A pass may only have picks to fetch ahead: the Cache asks for their bytes now.
        if !out.groups.is_empty() || !out.ends.is_empty() || !out.ahead.is_empty() {
            self.downstream.do_send(out);
        }
        self.flush_records();
    }

    /// Hands the Cache the held picks its jobs' credit allows (see [`ahead`]).
    fn release(&mut self, out: &mut Deliver) {
        if let Some(a) = &mut self.ahead {
            let (dsa, isa) = (&self.dsa, &self.isa);
            a.release(
                |element, kind| match kind {
                    SamplerKind::Dsa => dsa.need_count(element),
                    SamplerKind::Isa => isa.need_count(element),
                },
                out,
            );
        }
    }

    /// Sets a started job's fetch-ahead depth to what its rate and the store's fetch time ask
    /// (see [`ahead`]): its credit here grows by as much; a smaller depth takes back only the
    /// credit the job has left (never below minus its lookahead).
    fn deepen(&mut self, job: JobId, now: Instant) {
        let Some(a) = &mut self.ahead else {
            return;
        };
        let Some(fetch) = a.fetch_time() else {
            return;
        };
        let (Some(j), Some(q)) = (self.jobs.get_mut(&job), a.queue_mut(job)) else {
            return;
        };
        if !j.started {
            return;
        }
        let target = ahead::target_depth(j.pace.rate(now), fetch, j.lookahead, q.places);
        let change = if target >= q.depth {
            i64::from(target - q.depth)
        } else {
            let spare = (j.credit + i64::from(j.lookahead)).max(0);
            -(i64::from(q.depth - target).min(spare))
        };
        j.credit += change;
        j.capacity = j.capacity.max(j.credit);
        q.depth = (i64::from(q.depth) + change) as u32;
    }

    /// [`Self::deepen`] for every job (at each pass).
    fn deepen_all(&mut self, now: Instant) {
        if self.ahead.is_none() {
            return;
        }
        let jobs: Vec<JobId> = self.jobs.keys().copied().collect();
        for job in jobs {
            self.deepen(job, now);
        }
    }

    /// Ends the start windows that are over.
    fn end_holds(&mut self, now: Instant) {
        for j in self.jobs.values_mut() {
            if j.held_until.is_some_and(|t| t <= now) {
                j.held_until = None;
            }
        }
    }

    /// When the next pass is due (see [`Self::due`]).
    fn next_due(&self, now: Instant) -> Option<Instant> {
        self.jobs.values().filter_map(|j| self.due(j, now)).min()
    }

    /// Whether a job keeps pace as a DSA job whose start is over: its passes follow the grid
    /// and top it up (see [`pace`]).
    fn paced(j: &JobEntry, now: Instant) -> bool {
        j.kind == SamplerKind::Dsa && j.started && j.held_until.is_none() && j.pace.keeps_pace(now)
    }

    /// The credit down to which a paced job's passes sample it: half its lookahead below zero,
    /// so that its reader has its rings and half its lookahead to read before it needs
    /// another pass, and the other half is room to ride along with other jobs' passes.
    fn top_up(j: &JobEntry) -> i64 {
        -i64::from(j.lookahead / 2)
    }

    /// When a pass is due for `j`, if one is: one tick from now for a job that can move and
    /// does not keep pace (or when its start window ends); for a paced job below its top-up
    /// level, the end of the grid slot in which its credit came back (so that the jobs of a
    /// pace are sampled in one pass, whatever the moments their batches come back within a
    /// period), or now if its reader would run out before then.
    fn due(&self, j: &JobEntry, now: Instant) -> Option<Instant> {
        if let Some(t) = j.held_until {
            return (j.credit > 0).then_some(t.max(now));
        }
        if !Self::paced(j, now) {
            return (j.credit > 0).then_some(now);
        }
        if j.credit <= Self::top_up(j) {
            return None;
        }
        let at = j.pace.due(self.started, now)?;
        Some(if Self::runs_out_before(j, now, at) {
            now
        } else {
            at
        })
    }

    /// Whether a paced job's reader would read everything it has been sampled before a pass
    /// at `at` has loaded its next deliveries (half a period after the pass).
    fn runs_out_before(j: &JobEntry, now: Instant, at: Instant) -> bool {
        let (Some(rate), Some(period)) = (j.pace.rate(now), j.pace.period(now)) else {
            return true;
        };
        let outstanding = (j.capacity - j.credit).max(0) as f64;
        let need = at.saturating_duration_since(now) + period / 2;
        outstanding / rate.max(1e-9) < need.as_secs_f64()
    }

    /// Decides each DSA job's part in this pass. A paced job whose pass is due *drives* it: the
    /// rounds go on until it is topped up. Other paced jobs *join* within their lookahead if
    /// they keep pace with the jobs the pass is for (see [`pace`]). Jobs that do not keep pace
    /// take part for their credit only.
    fn choose_roles(&mut self, now: Instant) {
        let due: Vec<bool> = self
            .jobs
            .values()
            .map(|j| Self::paced(j, now) && self.due(j, now).is_some_and(|t| t <= now))
            .collect();
        for (j, due) in self.jobs.values_mut().zip(due) {
            j.drives = due;
            j.joins = false;
            if due {
                j.pace.served();
            }
        }
        let lead = self
            .jobs
            .values()
            .filter(|j| j.kind == SamplerKind::Dsa && (j.drives || Self::can_move(j)))
            .filter_map(|j| j.pace.period(now))
            .min();
        // Jobs join DSA rounds only: without a DSA job the pass is for there is none, and a
        // join would use up a slow job's eligibility for nothing.
        let dsa_moves = self
            .jobs
            .values()
            .any(|j| j.kind == SamplerKind::Dsa && Self::moves(j));
        for j in self.jobs.values_mut() {
            j.joins = dsa_moves
                && j.kind == SamplerKind::Dsa
                && !j.drives
                && j.credit > -i64::from(j.lookahead)
                && (Self::paced(j, now) || j.credit <= 0)
                && j.pace.join(self.started, now, lead);
        }
    }

    /// Whether a job keeps the pass's rounds going: a job the pass is for below its top-up
    /// level, or a job with credit left that does not ride along.
    fn moves(j: &JobEntry) -> bool {
        if j.drives {
            j.credit > Self::top_up(j)
        } else {
            Self::can_move(j) && !j.joins
        }
    }

    /// Samples one round of the `kind` jobs that can move, with the joiners, into `out`;
    /// returns whether there was one (some job of that kind could move).
    fn sample_round(
        &mut self,
        kind: SamplerKind,
        active: &mut Vec<JobId>,
        out: &mut Deliver,
    ) -> Result<bool, SamplerError> {
        if !self.round_jobs(kind, active) {
            return Ok(false);
        }
        let sampler: &mut dyn Sampler = match kind {
            SamplerKind::Dsa => &mut self.dsa,
            SamplerKind::Isa => &mut self.isa,
        };
        sampler.sample(active, &mut self.round)?;
        debug_assert_eq!(
            self.round.deliveries.len(),
            active.len(),
            "every job of a round receives exactly one element"
        );
        self.stats.rounds.fetch_add(1, Relaxed);
        self.stats
            .round_deliveries
            .fetch_add(self.round.deliveries.len() as u64, Relaxed);
        self.stats
            .round_elements
            .fetch_add(self.round.groups.len() as u64, Relaxed);
        self.add_picks(kind, out);
        self.charge_deliveries();
        self.add_events(out);
        Ok(true)
    }

    /// The jobs of a `kind` round into `active` (sorted), if some job keeps the rounds going
    /// ([`Self::moves`]): every job with credit, and the drivers and joiners still within their
    /// lookahead. Returns whether there is a round.
    fn round_jobs(&self, kind: SamplerKind, active: &mut Vec<JobId>) -> bool {
        active.clear();
        if !self.jobs.values().any(|j| j.kind == kind && Self::moves(j)) {
            return false;
        }
        active.extend(
            self.jobs
                .iter()
                .filter(|(_, j)| {
                    let room = if j.drives || j.joins {
                        j.credit > -i64::from(j.lookahead)
                    } else {
                        j.credit > 0
                    };
                    j.kind == kind && room && j.held_until.is_none()
                })
                .map(|(k, _)| *k),
        );
        active.sort_unstable();
        true
    }

    /// Appends the round's picks to `out`: each element with its need count and the
    /// deliveries that share it. The picks of jobs that fetch ahead are held instead, and
    /// their bytes asked for (see [`ahead`]).
    fn add_picks(&mut self, kind: SamplerKind, out: &mut Deliver) {
        let sampler: &dyn Sampler = match kind {
            SamplerKind::Dsa => &self.dsa,
            SamplerKind::Isa => &self.isa,
        };
        // While no fetch time is known (a leader whose nodes fetch nothing ahead), picks are
        // held as ever but no one is asked for their bytes.
        let fetching = self
            .ahead
            .as_ref()
            .is_some_and(|a| a.fetch_time().is_some());
        for (element, ds) in self.round.picks() {
            let items = ds.iter().map(|d| DeliverItem {
                job: d.job,
                epoch: d.epoch,
                position: d.position,
            });
            let items: Vec<DeliverItem> = match &mut self.ahead {
                None => items.collect(),
                Some(a) => items
                    .filter(|&i| match a.hold(element, i) {
                        None => true,
                        Some(hint) => {
                            if hint && fetching {
                                out.ahead.push((element, i.job));
                            }
                            false
                        }
                    })
                    .collect(),
            };
            if items.is_empty() {
                continue;
            }
            let held = self.ahead.as_ref().map_or(0, |a| a.held(element, None));
            out.groups.push(DeliverGroup {
                element,
                need: sampler.need_count(element) + held,
                items,
            });
        }
    }

    /// Charges each delivery of the round to its job: its credit, its counters, its record.
    fn charge_deliveries(&mut self) {
        for d in &self.round.deliveries {
            let j = self.jobs.get_mut(&d.job);
            debug_assert!(j.is_some(), "job {} was sampled but is not known", d.job);
            if let Some(j) = j {
                if let Some((_, buf)) = &mut j.record {
                    buf.push([d.epoch, d.position, d.element]);
                }
                j.credit -= 1;
                debug_assert!(
                    j.credit >= -i64::from(j.lookahead),
                    "job {}: sampled beyond its credit and lookahead ({} left, lookahead {})",
                    d.job,
                    j.credit,
                    j.lookahead
                );
                j.stats.sampled.fetch_add(1, Relaxed);
                j.stats.epoch.store(u64::from(d.epoch), Relaxed);
                j.stats.position.store(u64::from(d.position), Relaxed);
            }
        }
    }

    /// Appends the round's ends of epochs to `out` (after the picks so far); a finished job
    /// leaves, its last end marked as the end of its stream.
    fn add_events(&mut self, out: &mut Deliver) {
        let after = out.groups.len();
        for ev in &self.round.events {
            match *ev {
                JobEvent::EpochEnded { job, epoch } => {
                    if self.ahead.as_mut().is_some_and(|a| a.hold_end(job, epoch)) {
                        continue;
                    }
                    out.ends.push(EndAt {
                        after,
                        job,
                        epoch,
                        finished: false,
                    });
                }
                JobEvent::Finished { job } => {
                    if let Some(mut j) = self.jobs.remove(&job) {
                        flush_record(&mut j);
                    }
                    if self.ahead.as_mut().is_some_and(|a| a.finish(job)) {
                        continue;
                    }
                    if let Some(last) = out.ends.last_mut().filter(|e| e.job == job) {
                        last.finished = true;
                    }
                }
            }
        }
    }

    /// Sends the pass's recorded deliveries of each recording job to its recorder (off this
    /// actor: a bounded channel, never a wait).
    fn flush_records(&mut self) {
        self.jobs.values_mut().for_each(flush_record);
    }
}

fn flush_record(j: &mut JobEntry) {
    if let Some((tx, buf)) = &mut j.record
        && !buf.is_empty()
    {
        let n = buf.len() as u64;
        if tx.try_send(std::mem::take(buf)).is_err() {
            j.stats.record_dropped.fetch_add(n, Relaxed);
        }
    }
}

impl Actor for SamplerActor {
    type Context = Context<Self>;
}

impl SamplerActor {
    /// Registers a job with the sampler of its kind (ISA for a replay), fresh or resumed.
    fn add_job(&mut self, msg: AddJob, ctx: &mut Context<Self>) -> Result<(), SamplerError> {
        self.insert_job(msg, Instant::now())?;
        self.wake(ctx);
        Ok(())
    }

    /// [`Self::add_job`] at `now`, without scheduling a pass.
    fn insert_job(&mut self, msg: AddJob, now: Instant) -> Result<(), SamplerError> {
        if self.jobs.contains_key(&msg.job) {
            return Err(SamplerError::DuplicateJob(msg.job));
        }
        let spec = JobSpec {
            key: msg.job,
            dataset: (*msg.subset).clone(),
            seed: msg.seed,
            epochs: msg.epochs,
        };
        let kind = if msg.replay.is_some() {
            SamplerKind::Isa
        } else {
            msg.sampler
        };
        let sampler: &mut dyn Sampler = match kind {
            SamplerKind::Dsa => &mut self.dsa,
            SamplerKind::Isa => &mut self.isa,
        };
        match (msg.replay, msg.resume) {
            (Some(order), _) => self.isa.add_replay_job(msg.job, order, msg.epochs)?,
            (None, None) => sampler.add_job(spec)?,
            (None, Some((epoch, remaining))) => {
                sampler.resume_job(spec, epoch, (*remaining).clone())?
            }
        }
        debug_assert!(
            self.sampler(kind).epoch(msg.job).is_some(),
            "job {}: added, unknown to its sampler",
            msg.job
        );
        self.jobs.insert(
            msg.job,
            JobEntry {
                kind,
                record: msg.record.map(|tx| (tx, Vec::new())),
                credit: i64::from(msg.credit),
                stats: msg.stats,
                lookahead: pace::lookahead(msg.step),
                pace: pace::Pace::default(),
                joins: false,
                drives: false,
                capacity: i64::from(msg.credit),
                started: false,
                held_until: None,
            },
        );
        if let Some(a) = &mut self.ahead {
            a.add(
                msg.job,
                kind,
                i64::from(msg.credit),
                pace::lookahead(msg.step),
            );
        }
        if msg.credit > 0 {
            self.credited(msg.job, now);
            self.deepen(msg.job, now);
        }
        Ok(())
    }

    /// Removes a job (gone, or removed by the registry) from its sampler.
    fn remove_job(&mut self, job: JobId) {
        if let Some(a) = &mut self.ahead {
            a.remove(job);
        }
        if let Some(j) = self.jobs.remove(&job) {
            let _ = match j.kind {
                SamplerKind::Dsa => self.dsa.remove_job(job),
                SamplerKind::Isa => self.isa.remove_job(job),
            };
        }
        debug_assert!(
            self.dsa.epoch(job).is_none() && self.isa.epoch(job).is_none(),
            "job {job}: removed, still known to a sampler"
        );
    }

    /// The job's credit came back: `n` more deliveries may be outstanding.
    fn credit(&mut self, job: JobId, n: u32, ctx: &mut Context<Self>) {
        self.credit_at(job, n, Instant::now());
        self.wake(ctx);
    }

    /// [`Self::credit`] at `now`, without scheduling a pass: held picks the credit allows go
    /// to the Cache at once.
    fn credit_at(&mut self, job: JobId, n: u32, now: Instant) {
        if let Some(a) = &mut self.ahead {
            a.credit(job, n);
            let mut out = Deliver {
                dataset: self.dataset,
                groups: Vec::new(),
                ends: Vec::new(),
                ahead: Vec::new(),
                grown: Vec::new(),
            };
            self.release(&mut out);
            if !out.groups.is_empty() || !out.ends.is_empty() {
                self.downstream.do_send(out);
            }
        }
        self.credited(job, now);
        self.deepen(job, now);
        if let Some(j) = self.jobs.get_mut(&job) {
            j.pace.returned(now, n, j.lookahead / 2);
            j.credit += i64::from(n);
            j.capacity = j.capacity.max(j.credit);
            if j.credit > -i64::from(j.lookahead) {
                j.pace.eligible(now);
            }
        }
    }

    /// Grows a job's dataset from its next epoch, and tells the Cache its subset from then.
    fn grow_job(&mut self, msg: &GrowJob) -> Result<u32, SamplerError> {
        let kind = self
            .jobs
            .get(&msg.job)
            .ok_or(SamplerError::UnknownJob(msg.job))?
            .kind;
        let sampler: &mut dyn Sampler = match kind {
            SamplerKind::Dsa => &mut self.dsa,
            SamplerKind::Isa => &mut self.isa,
        };
        let (from_epoch, subset) = sampler.grow_job(msg.job, &msg.added)?;
        self.downstream.do_send(Deliver {
            dataset: self.dataset,
            groups: Vec::new(),
            ends: Vec::new(),
            ahead: Vec::new(),
            grown: vec![Grown {
                job: msg.job,
                from_epoch,
                subset: Arc::new(subset),
            }],
        });
        Ok(from_epoch)
    }

    /// The sampler of a kind.
    fn sampler(&self, kind: SamplerKind) -> &dyn Sampler {
        match kind {
            SamplerKind::Dsa => &self.dsa,
            SamplerKind::Isa => &self.isa,
        }
    }
}

impl Handler<AddJob> for SamplerActor {
    type Result = Result<(), SamplerError>;
    fn handle(&mut self, msg: AddJob, ctx: &mut Context<Self>) -> Self::Result {
        let _cpu = stages::enter(&SAMPLER);
        let added = self.add_job(msg, ctx);
        self.after_message();
        added
    }
}

impl Handler<GrowJob> for SamplerActor {
    type Result = Result<u32, SamplerError>;
    fn handle(&mut self, msg: GrowJob, _: &mut Context<Self>) -> Self::Result {
        let _cpu = stages::enter(&SAMPLER);
        let grown = self.grow_job(&msg);
        self.after_message();
        grown
    }
}

impl Handler<RemoveJob> for SamplerActor {
    type Result = ();
    fn handle(&mut self, msg: RemoveJob, _: &mut Context<Self>) {
        let _cpu = stages::enter(&SAMPLER);
        self.remove_job(msg.job);
        self.after_message();
    }
}

impl Handler<Pass> for SamplerActor {
    type Result = ();
    fn handle(&mut self, _: Pass, _: &mut Context<Self>) {
        let _cpu = stages::enter(&SAMPLER);
        self.pass();
        self.after_message();
    }
}

impl Handler<JobSignal> for SamplerActor {
    type Result = ();
    fn handle(&mut self, msg: JobSignal, ctx: &mut Context<Self>) {
        let _cpu = stages::enter(&SAMPLER);
        match msg {
            JobSignal::Credit { job, n } => self.credit(job, n, ctx),
            JobSignal::Gone { job } => self.remove_job(job),
        }
        self.after_message();
    }
}

#[cfg(test)]
mod tests;
