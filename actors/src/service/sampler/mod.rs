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
//! are sampled together and share their loads (see [`pace`]). With no job able to move, no
//! pass is scheduled: an idle sampler costs nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::prelude::*;

mod pace;

use crate::service::messages::{
    AddJob, DatasetId, Deliver, DeliverGroup, DeliverItem, EndAt, JobId, JobSignal, Pass, RemoveJob,
};
use crate::service::stats::{CacheStats, JobStats};
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
        }
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

    /// Schedules a pass one tick from now if some job can move (or when the first held start
    /// ends, if that is later) and none is scheduled as soon.
    fn wake(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let at = self
            .jobs
            .values()
            .filter(|j| j.credit > 0)
            .map(|j| j.held_until.map_or(now, |t| t.max(now)))
            .min();
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
            if act.scheduled.map(|(_, t)| t) != Some(timer) {
                return;
            }
            act.scheduled = None;
            act.pass();
            // A pass stops after MAX_ROUNDS_PER_PASS rounds: what is left goes on next window.
            act.wake(ctx);
        });
    }

    /// Samples rounds while some job has credit, and sends them downstream in one message. The
    /// DSA jobs that keep pace join the rounds within their lookahead (see [`pace`]).
    fn pass(&mut self) {
        let now = Instant::now();
        for j in self.jobs.values_mut() {
            if j.held_until.is_some_and(|t| t <= now) {
                j.held_until = None;
            }
        }
        let lead = self
            .jobs
            .values()
            .filter(|j| j.kind == SamplerKind::Dsa && Self::can_move(j))
            .filter_map(|j| j.pace.period(now))
            .min();
        // Jobs join DSA rounds only: without a DSA job that can move there is none, and a
        // join would use up a slow job's eligibility for nothing.
        let dsa_moves = self
            .jobs
            .values()
            .any(|j| j.kind == SamplerKind::Dsa && Self::can_move(j));
        for j in self.jobs.values_mut() {
            j.joins = dsa_moves
                && j.kind == SamplerKind::Dsa
                && j.credit <= 0
                && j.credit > -i64::from(j.lookahead)
                && j.pace.join(self.started, now, lead);
        }
        let mut out = Deliver {
            dataset: self.dataset,
            groups: Vec::new(),
            ends: Vec::new(),
        };
        let mut active: Vec<JobId> = Vec::new();
        for _ in 0..MAX_ROUNDS_PER_PASS {
            let mut any = false;
            for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
                active.clear();
                active.extend(
                    self.jobs
                        .iter()
                        .filter(|(_, j)| j.kind == kind && Self::can_move(j))
                        .map(|(k, _)| *k),
                );
                if active.is_empty() {
                    continue;
                }
                active.extend(
                    self.jobs
                        .iter()
                        .filter(|(_, j)| {
                            j.kind == kind
                                && j.joins
                                && j.credit <= 0
                                && j.credit > -i64::from(j.lookahead)
                        })
                        .map(|(k, _)| *k),
                );
                any = true;
                active.sort_unstable();
                let sampler: &mut dyn Sampler = match kind {
                    SamplerKind::Dsa => &mut self.dsa,
                    SamplerKind::Isa => &mut self.isa,
                };
                if let Err(e) = sampler.sample(&active, &mut self.round) {
                    tracing::error!(error = %e, dataset = self.dataset, "sampler refused a round");
                    return;
                }
                self.stats.rounds.fetch_add(1, Relaxed);
                self.stats
                    .round_deliveries
                    .fetch_add(self.round.deliveries.len() as u64, Relaxed);
                self.stats
                    .round_elements
                    .fetch_add(self.round.groups.len() as u64, Relaxed);
                for (element, ds) in self.round.picks() {
                    let need = sampler.need_count(element);
                    let items = ds
                        .iter()
                        .map(|d| DeliverItem {
                            job: d.job,
                            epoch: d.epoch,
                            position: d.position,
                        })
                        .collect();
                    out.groups.push(DeliverGroup {
                        element,
                        need,
                        items,
                    });
                }
                for d in &self.round.deliveries {
                    if let Some(j) = self.jobs.get_mut(&d.job) {
                        if let Some((_, buf)) = &mut j.record {
                            buf.push([d.epoch, d.position, d.element]);
                        }
                        j.credit -= 1;
                        j.stats.sampled.fetch_add(1, Relaxed);
                        j.stats.epoch.store(u64::from(d.epoch), Relaxed);
                        j.stats.position.store(u64::from(d.position), Relaxed);
                    }
                }
                let after = out.groups.len();
                for ev in &self.round.events {
                    match *ev {
                        JobEvent::EpochEnded { job, epoch } => {
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
                            if let Some(last) = out.ends.last_mut().filter(|e| e.job == job) {
                                last.finished = true;
                            }
                        }
                    }
                }
            }
            if !any {
                break;
            }
        }
        if !out.groups.is_empty() || !out.ends.is_empty() {
            self.downstream.do_send(out);
        }
        self.flush_records();
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

impl Handler<AddJob> for SamplerActor {
    type Result = Result<(), SamplerError>;
    fn handle(&mut self, msg: AddJob, ctx: &mut Context<Self>) -> Self::Result {
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
        self.jobs.insert(
            msg.job,
            JobEntry {
                kind,
                record: msg.record.map(|tx| (tx, Vec::new())),
                credit: i64::from(msg.credit),
                stats: msg.stats,
                lookahead: msg.lookahead,
                pace: pace::Pace::default(),
                joins: false,
                started: false,
                held_until: None,
            },
        );
        if msg.credit > 0 {
            self.credited(msg.job, Instant::now());
        }
        self.wake(ctx);
        Ok(())
    }
}

impl Handler<RemoveJob> for SamplerActor {
    type Result = ();
    fn handle(&mut self, msg: RemoveJob, _: &mut Context<Self>) {
        if let Some(j) = self.jobs.remove(&msg.job) {
            let _ = match j.kind {
                SamplerKind::Dsa => self.dsa.remove_job(msg.job),
                SamplerKind::Isa => self.isa.remove_job(msg.job),
            };
        }
    }
}

impl Handler<Pass> for SamplerActor {
    type Result = ();
    fn handle(&mut self, _: Pass, _: &mut Context<Self>) {
        self.pass();
    }
}

impl Handler<JobSignal> for SamplerActor {
    type Result = ();
    fn handle(&mut self, msg: JobSignal, ctx: &mut Context<Self>) {
        match msg {
            JobSignal::Credit { job, n } => {
                let now = Instant::now();
                self.credited(job, now);
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.pace.returned(now);
                    j.credit += i64::from(n);
                    if j.credit > -i64::from(j.lookahead) {
                        j.pace.eligible(now);
                    }
                }
                self.wake(ctx);
            }
            JobSignal::Gone { job } => {
                <Self as Handler<RemoveJob>>::handle(self, RemoveJob { job }, ctx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roaring::RoaringBitmap;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    /// Records what the sampler sends; `Sync` answers once every earlier message is handled.
    struct Capture(Arc<Mutex<Vec<Deliver>>>);
    impl Actor for Capture {
        type Context = Context<Self>;
    }
    impl Handler<Deliver> for Capture {
        type Result = ();
        fn handle(&mut self, msg: Deliver, _: &mut Context<Self>) {
            self.0.lock().unwrap().push(msg);
        }
    }
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Sync;
    impl Handler<Sync> for Capture {
        type Result = ();
        fn handle(&mut self, _: Sync, _: &mut Context<Self>) {}
    }

    /// A tick that never fires during a test: the test samples with [`Pass`].
    const NEVER: Duration = Duration::from_secs(3600);

    fn add(
        job: JobId,
        ids: std::ops::Range<u32>,
        kind: SamplerKind,
        credit: u32,
        epochs: Option<u32>,
    ) -> AddJob {
        AddJob {
            job,
            subset: Arc::new(ids.collect::<RoaringBitmap>()),
            seed: job,
            epochs,
            sampler: kind,
            credit,
            lookahead: 0,
            stats: Arc::new(JobStats::default()),
            resume: None,
            replay: None,
            record: None,
        }
    }

    /// Runs one pass and returns once its deliveries have reached the capture.
    async fn pass(s: &Addr<SamplerActor>, cap: &Addr<Capture>) {
        s.send(Pass).await.unwrap();
        cap.send(Sync).await.unwrap();
    }

    fn count(job: JobId, got: &[Deliver]) -> usize {
        got.iter()
            .flat_map(|d| &d.groups)
            .flat_map(|g| &g.items)
            .filter(|i| i.job == job)
            .count()
    }

    #[actix::test]
    async fn samples_within_credit_and_resumes_on_credit() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let cap = Capture(got.clone()).start();
        let s = SamplerActor::new(
            1,
            cap.clone().recipient(),
            NEVER,
            Arc::new(CacheStats::default()),
        )
        .start();
        s.send(add(1, 0..100, SamplerKind::Dsa, 10, Some(1)))
            .await
            .unwrap()
            .unwrap();
        s.send(add(2, 50..150, SamplerKind::Dsa, 4, Some(1)))
            .await
            .unwrap()
            .unwrap();
        s.send(add(3, 0..20, SamplerKind::Isa, 5, Some(1)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            s.send(add(3, 0..20, SamplerKind::Isa, 5, None))
                .await
                .unwrap(),
            Err(SamplerError::DuplicateJob(3))
        );
        pass(&s, &cap).await;
        {
            let g = got.lock().unwrap();
            assert_eq!(
                (count(1, &g), count(2, &g), count(3, &g)),
                (10, 4, 5),
                "credit caps deliveries"
            );
            for d in g.iter() {
                for grp in &d.groups {
                    assert!(grp.items.len() <= 2);
                }
            }
        }
        // A pass without new credit samples nothing.
        pass(&s, &cap).await;
        {
            let g = got.lock().unwrap();
            assert_eq!((count(1, &g), count(2, &g), count(3, &g)), (10, 4, 5));
        }
        // Job 3 (independent, 20 elements) gets the rest of its epoch and finishes.
        s.do_send(JobSignal::Credit { job: 3, n: 100 });
        s.do_send(JobSignal::Gone { job: 2 });
        s.do_send(JobSignal::Credit { job: 2, n: 100 });
        pass(&s, &cap).await;
        let g = got.lock().unwrap();
        assert_eq!(count(2, &g), 4, "a gone job receives nothing more");
        assert_eq!(count(3, &g), 20, "job 3 received exactly its epoch");
        let ids: BTreeSet<u32> = g
            .iter()
            .flat_map(|d| &d.groups)
            .filter(|grp| grp.items.iter().any(|i| i.job == 3))
            .map(|grp| grp.element)
            .collect();
        assert_eq!(
            ids,
            (0..20).collect(),
            "job 3 received its whole subset once"
        );
        let end = g
            .iter()
            .flat_map(|d| &d.ends)
            .find(|e| e.job == 3)
            .expect("job 3's epoch ended");
        assert_eq!((end.epoch, end.finished), (0, true));
    }

    #[actix::test]
    async fn jobs_with_credit_in_the_same_pass_share_elements() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let cap = Capture(got.clone()).start();
        let stats = Arc::new(CacheStats::default());
        let s = SamplerActor::new(1, cap.clone().recipient(), NEVER, stats.clone()).start();
        s.send(add(1, 0..1000, SamplerKind::Dsa, 200, None))
            .await
            .unwrap()
            .unwrap();
        s.send(add(2, 0..1000, SamplerKind::Dsa, 200, None))
            .await
            .unwrap()
            .unwrap();
        // Both jobs have credit before the first pass: DSA shares every pick of identical
        // jobs (probability |R1 ∩ R2| / max = 1).
        pass(&s, &cap).await;
        let g = got.lock().unwrap();
        let groups: Vec<&DeliverGroup> = g.iter().flat_map(|d| &d.groups).collect();
        assert_eq!(groups.len(), 200);
        assert!(
            groups
                .iter()
                .all(|grp| grp.items.len() == 2 && grp.need == 0),
            "identical jobs share every pick"
        );
        // The counters behind `joader_sampler_picks_total` and `…_pick_jobs_total`.
        assert_eq!(stats.round_elements.load(Relaxed), 200);
        assert_eq!(stats.round_deliveries.load(Relaxed), 400);
    }

    /// Deliveries of `job` in order: its elements.
    fn elements(job: JobId, got: &[Deliver]) -> Vec<u32> {
        got.iter()
            .flat_map(|d| &d.groups)
            .filter(|g| g.items.iter().any(|i| i.job == job))
            .map(|g| g.element)
            .collect()
    }

    #[actix::test]
    async fn jobs_starting_in_one_window_are_sampled_together_from_their_first_element() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let cap = Capture(got.clone()).start();
        let stats = Arc::new(CacheStats::default());
        let s = SamplerActor::new(1, cap.clone().recipient(), Duration::from_millis(1), stats)
            .with_start_window(Duration::from_secs(2))
            .start();
        for (job, kind) in [
            (1, SamplerKind::Dsa),
            (2, SamplerKind::Dsa),
            (3, SamplerKind::Isa),
        ] {
            s.send(add(job, 0..1000, kind, 0, None))
                .await
                .unwrap()
                .unwrap();
        }
        let credit = |job| JobSignal::Credit { job, n: 64 };
        // Job 1's clients attach: its first credit waits for the window (a pass samples the
        // ISA job 3, which shares nothing and does not wait, and not job 1).
        s.send(credit(1)).await.unwrap();
        s.send(credit(3)).await.unwrap();
        pass(&s, &cap).await;
        {
            let g = got.lock().unwrap();
            assert_eq!(count(1, &g), 0, "job 1 waits for the start window");
            assert_eq!(count(3, &g), 64, "an ISA job starts at once");
        }
        // Job 2 attaches within the window: both start at its end, in the same passes.
        s.send(credit(2)).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            cap.send(Sync).await.unwrap();
            let started = {
                let g = got.lock().unwrap();
                count(1, &g) == 64 && count(2, &g) == 64
            };
            if started {
                break;
            }
            assert!(Instant::now() < deadline, "the window never ended");
            actix::clock::sleep(Duration::from_millis(10)).await;
        }
        let g = got.lock().unwrap();
        assert_eq!(
            elements(1, &g),
            elements(2, &g),
            "identical jobs started together share every pick"
        );
    }
}
