//! The Sampler actor alone: what it sends downstream for given credit, captured, with passes
//! driven by the tests (a tick that never fires) and start windows ended by them
//! ([`WindowOver`]), so that sharing is the algorithm's, not timing's.

use super::*;
use crate::messages::Fetch;
use roaring::RoaringBitmap;
use std::collections::{BTreeSet, HashMap};
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
        step: 0,
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

/// The sampler holds its invariants, and its periodic checks ran (debug builds).
async fn assert_invariants(s: &Addr<SamplerActor>) {
    let i = s.send(probe::Inspect).await.unwrap();
    assert_eq!(i.check, Ok(()));
    assert!(i.messages > 0);
    assert_eq!(
        i.full_checks,
        joader_core::invariants::checks_after(i.messages)
    );
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
    assert_invariants(&s).await;
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
    assert_invariants(&s).await;
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

/// The test's stand-in for the clock reaching the end of the start window open now: every
/// held start ends at the next pass (the test says when the window is over instead of
/// waiting for it, so that which jobs start together never depends on the machine's speed).
#[derive(Message)]
#[rtype(result = "()")]
struct WindowOver;
impl Handler<WindowOver> for SamplerActor {
    type Result = ();
    fn handle(&mut self, _: WindowOver, _: &mut Context<Self>) {
        let now = Instant::now();
        self.cohort_until = self.cohort_until.map(|t| t.min(now));
        for j in self.jobs.values_mut() {
            j.held_until = j.held_until.map(|t| t.min(now));
        }
    }
}

#[actix::test]
async fn jobs_starting_in_one_window_are_sampled_together_from_their_first_element() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let cap = Capture(got.clone()).start();
    let stats = Arc::new(CacheStats::default());
    // Neither the tick nor the window ends during the test: passes are the test's `Pass`, and
    // the window ends on its `WindowOver`.
    let s = SamplerActor::new(1, cap.clone().recipient(), NEVER, stats)
        .with_start_window(NEVER)
        .start();
    for (job, kind) in [
        (1, SamplerKind::Dsa),
        (2, SamplerKind::Dsa),
        (3, SamplerKind::Isa),
        (4, SamplerKind::Dsa),
    ] {
        s.send(add(job, 0..1000, kind, 0, None))
            .await
            .unwrap()
            .unwrap();
    }
    let credit = |job| JobSignal::Credit { job, n: 64 };
    let counts = |jobs: &[JobId]| {
        let g = got.lock().unwrap();
        jobs.iter().map(|&j| count(j, &g)).collect::<Vec<_>>()
    };
    // Job 1's clients attach: its first credit waits for the window (a pass samples the
    // ISA job 3, which shares nothing and does not wait, and not job 1).
    s.send(credit(1)).await.unwrap();
    s.send(credit(3)).await.unwrap();
    pass(&s, &cap).await;
    assert_eq!(
        counts(&[1, 3]),
        [0, 64],
        "job 1 waits for the start window; an ISA job starts at once"
    );
    // Job 2 attaches within the window: it waits for the same end.
    s.send(credit(2)).await.unwrap();
    pass(&s, &cap).await;
    assert_eq!(counts(&[1, 2]), [0, 0], "both wait for the window's end");
    // The window ends: both start in the same pass.
    s.send(WindowOver).await.unwrap();
    pass(&s, &cap).await;
    assert_eq!(counts(&[1, 2]), [64, 64], "both start at the window's end");
    {
        let g = got.lock().unwrap();
        assert_eq!(
            elements(1, &g),
            elements(2, &g),
            "identical jobs started together share every pick"
        );
    }
    // A job whose first credit comes after the window ended opens a window of its own; the
    // jobs already started never wait again.
    s.send(credit(4)).await.unwrap();
    s.send(credit(1)).await.unwrap();
    pass(&s, &cap).await;
    assert_eq!(
        counts(&[1, 2, 4]),
        [128, 64, 0],
        "a late job waits for a new window, a started one does not"
    );
    s.send(WindowOver).await.unwrap();
    pass(&s, &cap).await;
    assert_eq!(
        counts(&[4]),
        [64],
        "the late job starts at its window's end"
    );
    assert_invariants(&s).await;
}

/// Four jobs of one pace whose readers take a batch each in turn (one GPU shared by their
/// processes: each job's batch comes back a quarter of a period after the previous job's, and
/// in parts, as its reader copies it out) are sampled together: once the jobs keep pace, one
/// pass per grid slot (256 ms for a period of 192 ms) samples all four, where a pass at each
/// return sampled each job with whoever was eligible at that moment; and no reader ever wants
/// a batch it has not been sampled. The test plays the clock and the timer: it runs a pass
/// whenever one is due.
#[actix::test]
async fn jobs_of_one_pace_returning_credit_in_turn_are_sampled_together() {
    let cap = Capture(Arc::new(Mutex::new(Vec::new()))).start();
    let stats = Arc::new(CacheStats::default());
    let mut s = SamplerActor::new(1, cap.recipient(), NEVER, stats.clone());
    let t0 = s.started;
    let (batch, k, period) = (64u32, 4u64, 192u64);
    for job in 1..=k {
        let mut a = add(job, 0..3600, SamplerKind::Dsa, 2 * batch, None);
        a.step = batch;
        s.insert_job(a, t0).unwrap();
    }
    let sampled = |s: &SamplerActor| -> Vec<u64> {
        (1..=k)
            .map(|j| s.jobs[&j].stats.sampled.load(Relaxed))
            .collect()
    };
    let mut read = [0u64; 4];
    let mut late_passes = Vec::new();
    for ms in 0..20_000u64 {
        let now = t0 + Duration::from_millis(ms);
        for job in 1..=k {
            // Job j's step ends at phase (j - 1) / k of every period: it takes its next batch,
            // and acknowledges it in four parts 2 ms apart as it copies them out.
            let phase = (ms + period - (job - 1) * period / k) % period;
            if ms > 0 && phase % 2 == 0 && phase < 8 {
                let i = job as usize - 1;
                read[i] += u64::from(batch / 4);
                let has = sampled(&s)[i];
                assert!(
                    read[i] <= has,
                    "job {job} at {ms} ms: its reader ran out ({} read, {has} sampled)",
                    read[i]
                );
                s.credit_at(job, batch / 4, now);
            }
        }
        if s.next_due(now).is_some_and(|t| t <= now) {
            let before = sampled(&s);
            s.pass_at(now);
            if ms >= 3_000 {
                let after = sampled(&s);
                late_passes.push((ms, before.iter().zip(&after).filter(|(b, a)| a > b).count()));
            }
        }
    }
    // After the start (the first returns give no pace), each pass is on the 256 ms grid and
    // samples every job.
    assert!(
        late_passes
            .iter()
            .all(|&(ms, jobs)| ms % 256 == 0 && jobs == k as usize),
        "passes (ms, jobs sampled) after 3 s: {late_passes:?}"
    );
    assert!(late_passes.len() >= 60, "{late_passes:?}");
}

/// A remote source for fetch-ahead (the Cache, not the Sampler, asks it for bytes).
struct Remote;

impl ElementSource for Remote {
    fn read(&self, _: u32) -> Result<Vec<u8>, crate::LoadFailure> {
        unreachable!("the sampler reads nothing")
    }
    fn label(&self, _: u32) -> i64 {
        0
    }
    fn fetching(&self) -> Option<&dyn Fetch> {
        Some(self)
    }
}

impl Fetch for Remote {
    fn fetch(&self, _: u32, _: crate::messages::Fetched) {
        unreachable!("the sampler fetches nothing")
    }
    // Instant fetches: the depth is the lookahead once the rate is known, two lookaheads
    // before, whatever the rate the test's clock makes of its credit.
    fn fetch_time(&self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

/// A sampler of a remote dataset (fetch-ahead), what it sends captured.
fn fetching_ahead() -> (Arc<Mutex<Vec<Deliver>>>, Addr<Capture>, Addr<SamplerActor>) {
    capturing(|s| s.with_fetch_ahead(Arc::new(Remote)))
}

/// A sampler built by `build`, what it sends captured.
fn capturing(
    build: impl FnOnce(SamplerActor) -> SamplerActor,
) -> (Arc<Mutex<Vec<Deliver>>>, Addr<Capture>, Addr<SamplerActor>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let cap = Capture(got.clone()).start();
    let s = build(SamplerActor::new(
        1,
        cap.clone().recipient(),
        NEVER,
        Arc::new(CacheStats::default()),
    ))
    .start();
    (got, cap, s)
}

/// Every (job, element) delivery in the order the Cache received them, with the need count
/// its group carried, and each job's ends `(epoch, finished, deliveries before it)`.
type Received = (Vec<(JobId, u32, u32)>, Vec<(JobId, u32, bool, usize)>);

fn received(got: &[Deliver]) -> Received {
    let (mut items, mut ends) = (Vec::new(), Vec::new());
    for d in got {
        let mut e = d.ends.iter().peekable();
        for (gi, g) in d.groups.iter().enumerate() {
            while let Some(end) = e.next_if(|x| x.after <= gi) {
                let before = items.iter().filter(|i: &&(u64, u32, u32)| i.0 == end.job);
                ends.push((end.job, end.epoch, end.finished, before.count()));
            }
            items.extend(g.items.iter().map(|i| (i.job, g.element, g.need)));
        }
        for end in e {
            let before = items.iter().filter(|i| i.0 == end.job).count();
            ends.push((end.job, end.epoch, end.finished, before));
        }
    }
    (items, ends)
}

#[actix::test]
async fn a_remote_datasets_picks_are_fetched_ahead_and_reach_the_cache_within_its_credit() {
    let (got, cap, s) = fetching_ahead();
    // Two jobs on overlapping subsets, rings of 8, lookahead 4: sampled 12 deeper (their rate
    // is not known yet: their rings' places and their lookahead), so 20 picks each, of which
    // the Cache gets 8 + 4; later 4 deeper.
    for (job, ids) in [(1, 0..100), (2, 50..150)] {
        let mut a = add(job, ids, SamplerKind::Dsa, 8, Some(2));
        a.step = 2;
        s.send(a).await.unwrap().unwrap();
    }
    pass(&s, &cap).await;
    {
        let g = got.lock().unwrap();
        assert_eq!((count(1, &g), count(2, &g)), (12, 12), "credit + lookahead");
        // Every held pick goes to the Cache as a pick to fetch ahead, with its job.
        let asked: BTreeSet<(u32, JobId)> =
            g.iter().flat_map(|d| d.ahead.iter().copied()).collect();
        let handed: BTreeSet<(u32, JobId)> = g
            .iter()
            .flat_map(|d| &d.groups)
            .flat_map(|grp| grp.items.iter().map(|i| (grp.element, i.job)))
            .collect();
        assert_eq!(asked.len(), 40, "20 picks of each job");
        assert!(
            handed.is_subset(&asked),
            "every pick handed over was held first"
        );
    }
    // A job's credit that comes back hands over its held picks at once, before any pass.
    s.send(JobSignal::Credit { job: 1, n: 4 }).await.unwrap();
    cap.send(Sync).await.unwrap();
    assert_eq!(count(1, &got.lock().unwrap()), 16);
    let mut returned: HashMap<JobId, usize> = HashMap::from([(1, 8 + 4), (2, 8)]);
    // Read everything: each job returns what it was handed, batch by batch.
    for _ in 0..200 {
        for job in [1, 2] {
            let handed = count(job, &got.lock().unwrap());
            assert!(
                handed <= returned[&job] + 4,
                "job {job}: {handed} handed over with {} credit and lookahead 4",
                returned[&job]
            );
            // The reader reads what reached its rings (8 places) and gives the places back.
            let read = returned[&job] - 8;
            let n = (handed - read).min(8);
            if n > 0 {
                s.send(JobSignal::Credit { job, n: n as u32 })
                    .await
                    .unwrap();
                *returned.get_mut(&job).unwrap() += n;
            }
        }
        pass(&s, &cap).await;
    }
    // Every pick reached the Cache first as one to fetch ahead (in this pass or an earlier
    // one), whether or not the pass handed anything over; but a job's next epoch is announced
    // only once its first pick is handed over (what the Cache knows of a job's epoch is what
    // it was handed), so the picks of that epoch handed over in the same message go
    // unannounced.
    {
        let g = got.lock().unwrap();
        let mut hinted: HashMap<(u32, JobId), usize> = HashMap::new();
        let mut epoch_of: HashMap<JobId, (u32, usize)> = HashMap::new();
        let mut unannounced = 0;
        for (m, d) in g.iter().enumerate() {
            for &(element, job) in &d.ahead {
                *hinted.entry((element, job)).or_default() += 1;
            }
            for grp in &d.groups {
                for i in &grp.items {
                    let (epoch, since) = *epoch_of.entry(i.job).or_insert((i.epoch, m));
                    let since = if epoch == i.epoch { since } else { m };
                    epoch_of.insert(i.job, (i.epoch, since));
                    let n = hinted.entry((grp.element, i.job)).or_default();
                    if *n > 0 {
                        *n -= 1;
                    } else {
                        assert!(
                            i.epoch > 0 && since == m,
                            "job {}: element {} (epoch {}) handed over unannounced",
                            i.job,
                            grp.element,
                            i.epoch
                        );
                        unannounced += 1;
                    }
                }
            }
        }
        assert!(
            unannounced >= 2,
            "each job's second epoch starts unannounced"
        );
        assert!(
            hinted.values().all(|&n| n == 0),
            "every announced pick was handed over once"
        );
    }
    let (items, ends) = received(&got.lock().unwrap());
    for (job, ids) in [(1u64, 0..100u32), (2, 50..150)] {
        let mine: Vec<u32> = items.iter().filter(|i| i.0 == job).map(|i| i.1).collect();
        assert_eq!(mine.len(), 200, "job {job}: two epochs");
        for epoch in mine.chunks(100) {
            let set: BTreeSet<u32> = epoch.iter().copied().collect();
            assert_eq!(
                set,
                ids.clone().collect(),
                "job {job}: each epoch a permutation"
            );
        }
        let its: Vec<(u32, bool, usize)> = ends
            .iter()
            .filter(|e| e.0 == job)
            .map(|e| (e.1, e.2, e.3))
            .collect();
        assert_eq!(
            its,
            vec![(0, false, 100), (1, true, 200)],
            "job {job}: ends in order"
        );
    }
    // Within an epoch, the need each delivery carried is what is still to come: the jobs that
    // will pick the element, and the picks of it still held.
    let first: Vec<(JobId, u32, u32)> = {
        let mut seen: HashMap<JobId, usize> = HashMap::new();
        items
            .iter()
            .filter(|i| {
                let n = seen.entry(i.0).or_default();
                *n += 1;
                *n <= 100
            })
            .copied()
            .collect()
    };
    let shared = first.iter().filter(|i| (50..100).contains(&i.1)).count();
    assert_eq!(shared, 100, "both jobs' first epochs hold 50..100");
    for (k, &(job, element, need)) in first.iter().enumerate() {
        let later = first[k + 1..].iter().filter(|i| i.1 == element).count() as u32;
        // A job that is already in its second epoch counts the element once more in the
        // sampler: never less than what is still to come.
        assert!(
            need >= later,
            "job {job}, element {element}: need {need}, {later} deliveries to come"
        );
    }
    assert_invariants(&s).await;
}

#[actix::test]
async fn a_removed_jobs_held_picks_are_dropped_and_the_others_go_on() {
    let (got, cap, s) = fetching_ahead();
    for job in [1, 2] {
        let mut a = add(job, 0..50, SamplerKind::Dsa, 4, Some(1));
        a.step = 2;
        s.send(a).await.unwrap().unwrap();
    }
    pass(&s, &cap).await;
    s.send(RemoveJob { job: 2 }).await.unwrap();
    for _ in 0..40 {
        s.send(JobSignal::Credit { job: 1, n: 4 }).await.unwrap();
        pass(&s, &cap).await;
    }
    let (items, ends) = received(&got.lock().unwrap());
    let mine: BTreeSet<u32> = items.iter().filter(|i| i.0 == 1).map(|i| i.1).collect();
    assert_eq!(mine, (0..50).collect(), "job 1 gets its whole epoch");
    assert_eq!(items.iter().filter(|i| i.0 == 1).count(), 50);
    assert_eq!(
        ends.iter().filter(|e| e.0 == 1 && e.2).count(),
        1,
        "and its end of stream"
    );
    assert_invariants(&s).await;
}

#[actix::test]
async fn a_pass_that_hands_nothing_over_still_announces_its_picks() {
    let (got, cap, s) = fetching_ahead();
    // Rings of 8, lookahead 8: 16 deeper before the rate is known (places and lookahead), so
    // 24 picks, 16 handed over and 8 held.
    let mut a = add(1, 0..100, SamplerKind::Dsa, 8, Some(1));
    a.step = 4;
    s.send(a).await.unwrap().unwrap();
    pass(&s, &cap).await;
    assert_eq!(count(1, &got.lock().unwrap()), 16);
    // Two places come back: two held picks go over at once; the pass then picks two more,
    // which stay held: it hands nothing over, and still announces them.
    s.send(JobSignal::Credit { job: 1, n: 2 }).await.unwrap();
    pass(&s, &cap).await;
    let g = got.lock().unwrap();
    assert_eq!(count(1, &g), 18);
    let last = g.last().unwrap();
    assert!(last.groups.is_empty(), "{last:?}");
    assert_eq!(last.ahead.len(), 2, "{last:?}");
    let hinted: usize = g.iter().map(|d| d.ahead.len()).sum();
    assert_eq!(hinted, 26);
}

/// A cluster leader's Sampler (`with_fetch_clock`): while its clock knows no fetch time (no
/// node fetches ahead), a job is sampled within its credit as without fetch-ahead and no pick
/// is sent to be fetched; once a fetch time is known, it is sampled deeper and its held picks
/// are sent.
#[actix::test]
async fn a_leaders_sampler_asks_for_nothing_ahead_until_a_fetch_time_is_known() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let known = Arc::new(AtomicBool::new(false));
    let clock: crate::FetchClock = {
        let known = known.clone();
        Arc::new(move || known.load(Relaxed).then_some(Duration::ZERO))
    };
    let (got, cap, s) = capturing(|s| s.with_fetch_clock(clock));
    s.send(add(1, 0..100, SamplerKind::Dsa, 8, Some(2)))
        .await
        .unwrap()
        .unwrap();
    pass(&s, &cap).await;
    {
        let g = got.lock().unwrap();
        assert_eq!(count(1, &g), 8, "its credit, no deeper");
        assert!(
            g.iter().all(|d| d.ahead.is_empty()),
            "nothing to fetch ahead"
        );
    }
    known.store(true, Relaxed);
    s.send(JobSignal::Credit { job: 1, n: 8 }).await.unwrap();
    pass(&s, &cap).await;
    let g = got.lock().unwrap();
    assert_eq!(count(1, &g), 16, "what its credit allows reaches the Cache");
    let asked: usize = g.iter().map(|d| d.ahead.len()).sum();
    assert!(asked > 0, "held picks are sent to be fetched ahead");
}
