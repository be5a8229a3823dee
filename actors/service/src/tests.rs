//! The actors together over a real data segment and real readers, with a fake storage and
//! pipeline so that every byte and every load can be checked.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use dataplane::{Reader, SegmentConfig, Writer};
use roaring::RoaringBitmap;

use super::*;
use joader_core::cache::PolicyKind;
use joader_core::sampling::SamplerKind;

fn instance(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("t_{tag}_{}_{}", std::process::id(), N.fetch_add(1, Relaxed))
}

/// How long a test waits for a state before it fails: far beyond what any state here takes,
/// even on a loaded machine, so that reaching it is a failure of the code, not of the clock.
const DEADLINE: Duration = Duration::from_secs(60);

/// Waits (yielding to the actors) until `cond` holds; fails naming `what` at the deadline.
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "waited {DEADLINE:?} for {what} in vain"
        );
        actix::clock::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs `f` (which counts a message and runs the full invariant check when it is due) until
/// it panics, at most [`joader_core::invariants::EVERY`] + 1 times; returns the panic's
/// message. The invariant probes use it to show that the periodic check runs and fails.
pub(crate) fn until_panic(mut f: impl FnMut()) -> Option<String> {
    for _ in 0..=joader_core::invariants::EVERY {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut f)) {
            return Some(
                p.downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "a panic without a message".into()),
            );
        }
    }
    None
}

/// Asserts that the Cache and the Sampler hold their invariants now, and that in debug builds
/// their periodic full checks ran after the messages they handled.
async fn assert_invariants(w: &World) {
    let cache = w.cache.send(cache::probe::Inspect).await.unwrap();
    let sampler = w.sampler.send(sampler::probe::Inspect).await.unwrap();
    for (what, messages, full_checks, check) in [
        ("cache", cache.messages, cache.full_checks, cache.check),
        (
            "sampler",
            sampler.messages,
            sampler.full_checks,
            sampler.check,
        ),
    ] {
        assert_eq!(check, Ok(()), "the {what}'s invariants");
        assert_eq!(
            full_checks,
            joader_core::invariants::checks_after(messages),
            "the {what}'s full checks after {messages} messages"
        );
    }
}

/// Waits for a reader thread without blocking the actors.
async fn join<T>(h: std::thread::JoinHandle<T>) -> T {
    wait_until("the reader thread to finish", || h.is_finished()).await;
    h.join().unwrap()
}

/// Element `e` is 32 bytes derived from `e`; element 7 cannot be read. It notes what the
/// Cache tells it of the jobs (what a remote source's disk tier keeps).
struct Source {
    reads: AtomicU64,
    news: Mutex<Vec<News>>,
    /// Whether it fetches ahead now (a fetch time), as a remote source with a buffer does.
    ahead: std::sync::atomic::AtomicBool,
}

/// The Cache's news of a job, as a source heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum News {
    EpochStarted(JobId, u64),
    Delivered(JobId, u32),
    Closed(JobId),
    /// The Cache asked for an element's bytes ahead of its load.
    FetchAhead(u32),
}

impl Demand for Source {
    fn epoch_started(&self, job: JobId, remaining: &RoaringBitmap) {
        self.news
            .lock()
            .unwrap()
            .push(News::EpochStarted(job, remaining.len()));
    }
    fn delivered(&self, job: JobId, element: u32) {
        self.news
            .lock()
            .unwrap()
            .push(News::Delivered(job, element));
    }
    fn job_closed(&self, job: JobId) {
        self.news.lock().unwrap().push(News::Closed(job));
    }
}

/// The test source reads on the loader threads (not remote); it only records what the Cache
/// asks it to fetch ahead.
impl Fetch for Source {
    fn is_remote(&self) -> bool {
        false
    }
    fn fetch(&self, _: u32, _: crate::messages::Fetched) {
        unreachable!("a source that is not remote is read, not fetched")
    }
    fn fetch_time(&self) -> Option<std::time::Duration> {
        self.ahead
            .load(Relaxed)
            .then_some(std::time::Duration::from_millis(1))
    }
    fn fetch_ahead(&self, element: u32) {
        self.news.lock().unwrap().push(News::FetchAhead(element));
    }
}

impl ElementSource for Source {
    fn fetching(&self) -> Option<&dyn Fetch> {
        Some(self)
    }
    fn demand(&self) -> Option<&dyn Demand> {
        Some(self)
    }
    fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
        self.reads.fetch_add(1, Relaxed);
        if element == 7 {
            return Err(LoadFailure {
                code: dataplane::element_error::IO,
                kind: "read_failed".into(),
                message: "bad sector".into(),
            });
        }
        Ok(payload(element))
    }
    fn label(&self, element: u32) -> i64 {
        i64::from(element % 5)
    }
}

fn payload(element: u32) -> Vec<u8> {
    (0..32u32)
        .map(|i| (element.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8)
        .collect()
}

/// The stored bytes as they are. Elements whose first byte is even are written straight into
/// their slot when the Loader's place has room (as the server's decode pipeline does), the
/// others go to the Cache as bytes: every test runs both paths.
struct Identity;
impl Prepare for Identity {
    fn prepare(&self, bytes: &[u8]) -> Result<Prepared, LoadFailure> {
        Ok(Prepared::bytes(bytes.to_vec(), dataplane::Format::Raw))
    }
    fn prepare_placed(&self, bytes: &[u8], place: &mut dyn Place) -> Result<Prepared, LoadFailure> {
        if bytes.first().is_none_or(|b| b % 2 == 1) {
            return self.prepare(bytes);
        }
        let mut fill = |dst: &mut [u8]| {
            dst.copy_from_slice(bytes);
            Ok(())
        };
        match place.place(
            dataplane::Format::Raw,
            (0, 0),
            bytes.len() as u64,
            &mut fill,
        ) {
            Some(slot) => Ok(Prepared {
                bytes: Vec::new(),
                format: dataplane::Format::Raw,
                placed: Some(slot?),
                fields_len: 0,
                source: (0, 0),
            }),
            None => self.prepare(bytes),
        }
    }
    fn decodes(&self) -> bool {
        true
    }
}

struct World {
    sampler: Addr<SamplerActor>,
    cache: Addr<CacheActor>,
    stats: Arc<CacheStats>,
    source: Arc<Source>,
    instance: String,
}

fn world(tag: &str, slots: u32, arena: u64) -> World {
    world_ticking(tag, slots, arena, Duration::from_millis(2))
}

/// A world whose sampler passes every `tick` (tests that drive passes with [`Pass`] give a
/// tick that never fires).
fn world_ticking(tag: &str, slots: u32, arena: u64, tick: Duration) -> World {
    let instance = instance(tag);
    let mut cfg = SegmentConfig::new(instance.clone(), slots, arena);
    cfg.reserve = false;
    let writer = Arc::new(Writer::create(&cfg).unwrap());
    let stats = Arc::new(CacheStats::default());
    let cache_cfg = CacheConfig {
        policy: PolicyKind::RefCnt,
        tick: Duration::from_millis(1),
        max_loading: 16,
    };
    let st = stats.clone();
    let cache = CacheActor::create(move |ctx| {
        let slots = Arc::downgrade(&writer);
        let loader = Loader::placing(2, ctx.address().recipient(), st.clone(), slots).start();
        CacheActor::new(writer, &cache_cfg, loader.recipient(), st)
    });
    let sampler = SamplerActor::new(1, cache.clone().recipient(), tick, stats.clone()).start();
    World {
        sampler,
        cache,
        stats,
        source: Arc::new(Source {
            reads: AtomicU64::new(0),
            news: Default::default(),
            ahead: std::sync::atomic::AtomicBool::new(true),
        }),
        instance,
    }
}

impl World {
    /// A job through the sampler: its rings, then the sampler (no credit up front: the Cache
    /// grants the rings' capacity when the reader attaches).
    async fn job(
        &self,
        job: JobId,
        subset: RoaringBitmap,
        epochs: u32,
        capacity: u32,
    ) -> (Arc<JobStats>, String) {
        let subset = Arc::new(subset);
        let (stats, ring) = open(self, job, subset.clone(), capacity).await;
        self.sampler
            .send(AddJob {
                job,
                subset,
                seed: job,
                epochs: Some(epochs),
                sampler: SamplerKind::Dsa,
                credit: 0,
                step: BATCH / 2,
                stats: stats.clone(),
                resume: None,
                replay: None,
                record: None,
            })
            .await
            .unwrap()
            .unwrap();
        (stats, ring)
    }
}

/// Opens a job's rings (one rank) in the Cache only; a test that sends deliveries itself
/// uses it without the sampler.
async fn open(
    w: &World,
    job: JobId,
    subset: Arc<RoaringBitmap>,
    capacity: u32,
) -> (Arc<JobStats>, String) {
    let stats = Arc::new(JobStats::default());
    let rings = w
        .cache
        .send(OpenJob {
            job,
            dataset: 1,
            source: w.source.clone(),
            pipeline: 0,
            prepare: Arc::new(Identity),
            subset,
            ring_prefix: format!("job{job}"),
            ranks: 1,
            capacity,
            batch: BATCH,
            stats: stats.clone(),
            sampler: w.sampler.clone().recipient(),
            resume: None,
            own_positions: true,
        })
        .await
        .unwrap()
        .unwrap();
    (stats, rings[0].ring.clone())
}

/// Records per batch of the test jobs (the readers take batches of this size).
const BATCH: u32 = 4;

/// What a reader thread saw: per epoch, the (element, label, bytes-ok) of data items and the
/// element ids of error records.
type Seen = Vec<(Vec<(u32, i64, bool)>, Vec<u32>)>;

fn read_all(instance: String, ring: String, pause: Duration) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let reader = Reader::open(&instance, &ring).unwrap();
        let mut seen: Seen = Vec::new();
        let mut ended = 0u64;
        loop {
            let batch = reader
                .next_batch(BATCH as usize, Some(Duration::from_secs(20)))
                .unwrap();
            for item in batch.items() {
                let ok = item.data == payload(item.meta.element_id).as_slice();
                let epoch = item.meta.epoch as usize;
                assert!(item.meta.epoch >= ended, "an item of an ended epoch");
                seen.resize_with(seen.len().max(epoch + 1), Default::default);
                seen[epoch]
                    .0
                    .push((item.meta.element_id, item.meta.label, ok));
            }
            for e in batch.errors() {
                let epoch = e.epoch as usize;
                seen.resize_with(seen.len().max(epoch + 1), Default::default);
                seen[epoch].1.push(e.element_id);
            }
            if let Some(end) = batch.end_of_epoch() {
                let (items, errors) = &seen[end.epoch as usize];
                assert_eq!(
                    end.count,
                    (items.len() + errors.len()) as u64,
                    "end-of-epoch count"
                );
                ended = end.epoch + 1;
            }
            let done = batch.end_of_stream();
            drop(batch);
            if done {
                return seen;
            }
            std::thread::sleep(pause);
        }
    })
}

fn check_epochs(seen: &Seen, subset: &RoaringBitmap, epochs: usize) {
    assert_eq!(seen.len(), epochs, "epochs seen");
    for (items, errors) in seen {
        let mut ids: Vec<u32> = items
            .iter()
            .map(|i| i.0)
            .chain(errors.iter().copied())
            .collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            subset.iter().collect::<Vec<_>>(),
            "an epoch is exactly the subset"
        );
        for &(e, label, ok) in items {
            assert!(ok, "element {e}: wrong bytes");
            assert_eq!(label, i64::from(e % 5));
        }
    }
}

#[actix::test]
async fn two_jobs_decode_each_element_once_and_get_exact_epochs() {
    let w = world("share", 64, 1 << 20);
    let subset: RoaringBitmap = (0..40).collect();
    let (s1, r1) = w.job(1, subset.clone(), 2, 16).await;
    let (s2, r2) = w.job(2, subset.clone(), 2, 16).await;
    let h1 = read_all(w.instance.clone(), r1, Duration::ZERO);
    let h2 = read_all(w.instance.clone(), r2, Duration::ZERO);
    let (a, b) = (join(h1).await, join(h2).await);
    // The readers are done, but the Cache learns of their last acknowledgements when it next
    // polls the rings: wait for that state, not for a time.
    wait_until("both jobs' 80 acknowledgements", || {
        s1.acknowledged.load(Relaxed) == 80 && s2.acknowledged.load(Relaxed) == 80
    })
    .await;
    let mut without7 = subset.clone();
    without7.remove(7);
    check_epochs(&a, &subset, 2);
    check_epochs(&b, &subset, 2);
    for (items, errors) in a.iter().chain(&b) {
        assert_eq!(
            errors,
            &vec![7],
            "the unreadable element is reported, not dropped"
        );
        assert_eq!(
            items.iter().map(|i| i.0).collect::<RoaringBitmap>(),
            without7
        );
    }
    // 40 elements fit in the cache: every element is read once for both jobs and both epochs,
    // except the failed one, which is retried when requested again after its failure.
    let reads = w.source.reads.load(Relaxed);
    assert!((40..=43).contains(&reads), "{reads} reads for 40 elements");
    assert_eq!(w.stats.requests.load(Relaxed), 160);
    assert_eq!(s1.delivered.load(Relaxed), 80);
    assert_eq!(s1.state(), JobState::Finished);
    assert_eq!(s2.state(), JobState::Finished);
    assert!(w.stats.hits.load(Relaxed) >= 160 - 43);
    // The cache had room to spare: the loader threads wrote the elements that go straight
    // into their slots there (about half), and the readers saw the right bytes either way.
    assert!(
        w.stats.placed.load(Relaxed) > 0,
        "no element placed by a loader thread"
    );
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

/// Reads a ring to its end: each epoch's element ids, and the (epoch, last position) of every
/// batch that the server marked as holding its epoch's last record.
fn read_marked(instance: String, ring: String) -> std::thread::JoinHandle<MarkedEpochs> {
    std::thread::spawn(move || {
        let reader = Reader::open(&instance, &ring).unwrap();
        let mut out = MarkedEpochs::default();
        loop {
            let batch = reader
                .next_batch(BATCH as usize, Some(Duration::from_secs(20)))
                .unwrap();
            let mut last = None;
            for item in batch.items() {
                let (epoch, pos) = (item.meta.epoch as usize, item.meta.position);
                out.ids.resize_with(out.ids.len().max(epoch + 1), Vec::new);
                out.ids[epoch].push(item.meta.element_id);
                last = last.max(Some((epoch, pos)));
            }
            for e in batch.errors() {
                let epoch = e.epoch as usize;
                out.ids.resize_with(out.ids.len().max(epoch + 1), Vec::new);
                out.ids[epoch].push(e.element_id);
                last = last.max(Some((epoch, e.position)));
            }
            if batch.raw().last_of_epoch {
                out.marks.extend(last);
            }
            let done = batch.end_of_stream();
            drop(batch);
            if done {
                return out;
            }
        }
    })
}

/// What [`read_marked`] saw.
#[derive(Default)]
struct MarkedEpochs {
    ids: Vec<Vec<u32>>,
    marks: Vec<(usize, u64)>,
}

/// A job whose dataset grows twice before its first epoch is sampled: its first epoch keeps
/// the subset it registered with, the later ones cover both growths, and the ring marks each
/// epoch's last record where that epoch ends (the Cache's subset by epoch).
#[actix::test]
async fn a_grown_job_gets_exact_epochs_of_its_grown_dataset() {
    let w = world("grow", 128, 1 << 21);
    let (stats, ring) = w.job(1, (0..40).collect(), 3, 16).await;
    for added in [40..50, 50..60] {
        let from = w
            .sampler
            .send(GrowJob {
                job: 1,
                added: Arc::new(added.collect()),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(from, 1, "the epoch after the one under way");
    }
    let mut seen = join(read_marked(w.instance.clone(), ring)).await;
    for ids in &mut seen.ids {
        ids.sort_unstable();
    }
    let range = |n: u32| (0..n).collect::<Vec<u32>>();
    assert_eq!(seen.ids, [range(40), range(60), range(60)], "exact epochs");
    assert_eq!(
        seen.marks,
        [(0, 39), (1, 59), (2, 59)],
        "the epochs' last records"
    );
    wait_until("the job's 160 acknowledgements", || {
        stats.acknowledged.load(Relaxed) == 160
    })
    .await;
    assert_eq!(stats.state(), JobState::Finished);
    // A job the sampler does not know is refused.
    let unknown = w
        .sampler
        .send(GrowJob {
            job: 9,
            added: Arc::new((60..61).collect()),
        })
        .await
        .unwrap();
    assert!(unknown.is_err());
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

/// The source hears, per job, each epoch's start with what it needs, each delivery once per
/// epoch after that start, and the job's end: what a disk tier's admission asks.
#[actix::test]
async fn the_source_hears_each_epoch_start_delivery_and_close_of_a_job() {
    let w = world("news", 64, 1 << 20);
    let subset: RoaringBitmap = (0..20).collect();
    let (_, r1) = w.job(1, subset.clone(), 2, 8).await;
    let seen = join(read_all(w.instance.clone(), r1, Duration::ZERO)).await;
    check_epochs(&seen, &subset, 2);
    wait_until("the job's close to reach the source", || {
        w.source.news.lock().unwrap().contains(&News::Closed(1))
    })
    .await;
    let news = w.source.news.lock().unwrap().clone();
    assert_eq!(news.last(), Some(&News::Closed(1)));
    let starts: Vec<usize> = news
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n, News::EpochStarted(1, 20)))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(starts.len(), 2, "{news:?}");
    for (e, window) in [(0, &news[starts[0]..starts[1]]), (1, &news[starts[1]..])] {
        let delivered: Vec<u32> = window
            .iter()
            .filter_map(|n| match n {
                News::Delivered(1, el) => Some(*el),
                _ => None,
            })
            .collect();
        assert_eq!(
            delivered.iter().copied().collect::<RoaringBitmap>(),
            subset,
            "epoch {e}: every element delivered after its start"
        );
        assert_eq!(delivered.len(), 20, "epoch {e}: once each");
    }
    w.cache.send(Shutdown).await.unwrap();
}

/// Picks the Sampler holds back come with the deliveries: the Cache asks the source for the
/// bytes of those whose element it neither holds nor loads, and of no other.
#[actix::test]
async fn the_cache_fetches_ahead_only_what_it_neither_holds_nor_loads() {
    let w = world("ahead", 64, 1 << 20);
    let subset: RoaringBitmap = (0..20).collect();
    open(&w, 1, Arc::new(subset), 8).await;
    let deliver = |elements: std::ops::Range<u32>, ahead: Vec<u32>| Deliver {
        dataset: 1,
        groups: elements
            .map(|element| DeliverGroup {
                element,
                need: 1,
                items: vec![DeliverItem {
                    job: 1,
                    epoch: 0,
                    position: element,
                }],
            })
            .collect(),
        ends: Vec::new(),
        ahead: ahead.into_iter().map(|e| (e, 1)).collect(),
        grown: Vec::new(),
    };
    let asked = || -> Vec<u32> {
        let news = w.source.news.lock().unwrap();
        news.iter()
            .filter_map(|n| match n {
                News::FetchAhead(e) => Some(*e),
                _ => None,
            })
            .collect()
    };
    // Element 2 is pending or loading when its hint is read; 10 and 11 are unknown; a job
    // that is not open has no pipeline to key them by.
    let mut d = deliver(0..4, vec![2, 10, 11]);
    d.ahead.push((12, 99));
    w.cache.send(d).await.unwrap();
    assert_eq!(asked(), vec![10, 11]);
    wait_until("elements 0..4 loaded", || w.stats.loads.load(Relaxed) >= 4).await;
    // Now cached: element 0 is not fetched again; 12 is.
    w.cache.send(deliver(4..4, vec![0, 12])).await.unwrap();
    assert_eq!(asked(), vec![10, 11, 12]);
    // A source that does not fetch ahead now (a cluster node without a buffer, sent the
    // leader's picks for the others' sake) is asked for nothing.
    w.source.ahead.store(false, Relaxed);
    w.cache.send(deliver(4..4, vec![13, 14])).await.unwrap();
    assert_eq!(asked(), vec![10, 11, 12]);
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn a_small_cache_applies_back_pressure_and_evicts() {
    let w = world("small", 12, 64 * 1024);
    let subset: RoaringBitmap = (100..180).collect();
    let (s, r) = w.job(1, subset.clone(), 1, 8).await;
    let h = read_all(w.instance.clone(), r, Duration::from_millis(1));
    let seen = join(h).await;
    check_epochs(&seen, &subset, 1);
    assert!(
        w.stats.evictions.load(Relaxed) >= 80 - 12,
        "a 12-slot cache evicts"
    );
    assert_eq!(
        w.stats.evictions_unneeded.load(Relaxed) + w.stats.evictions_needed.load(Relaxed),
        w.stats.evictions.load(Relaxed),
        "every eviction has a reason"
    );
    // One job, one epoch: what it has read it never needs again.
    assert_eq!(w.stats.evictions_needed.load(Relaxed), 0);
    // Its units waited for room its own ring held, never for another job's.
    assert_eq!(s.waited_for_others.load(Relaxed), 0);
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn closing_a_job_unpins_its_slots_and_stops_its_sampling() {
    let w = world("close", 32, 1 << 20);
    let (s, ring) = w.job(1, (0..100).collect(), 1, 16).await;
    let inst = w.instance.clone();
    // A reader that takes a batch and never acknowledges it, and stays attached until told.
    let held = Arc::new(Mutex::new(None::<u32>));
    let h2 = held.clone();
    let (leave, until_told) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let reader = Reader::open(&inst, &ring).unwrap();
        let batch = reader
            .next_batch(BATCH as usize, Some(Duration::from_secs(60)))
            .unwrap();
        *h2.lock().unwrap() = Some(batch.len() as u32);
        std::mem::forget(batch);
        let _ = until_told.recv();
    });
    wait_until("the reader to take a batch", || {
        held.lock().unwrap().is_some()
    })
    .await;
    assert!(held.lock().unwrap().is_some_and(|n| n > 0));
    assert_eq!(s.acknowledged.load(Relaxed), 0);
    w.cache.send(CloseJob { job: 1 }).await.unwrap();
    w.sampler.send(RemoveJob { job: 1 }).await.unwrap();
    let sampled = s.sampled.load(Relaxed);
    w.sampler.send(Pass).await.unwrap();
    assert_eq!(
        s.sampled.load(Relaxed),
        sampled,
        "nothing is sampled for a closed job"
    );
    // Every slot is evictable again: a new job can fill the whole cache.
    let (_s2, r2) = w.job(2, (200..264).collect(), 1, 16).await;
    let h = read_all(w.instance.clone(), r2, Duration::ZERO);
    let seen = join(h).await;
    check_epochs(&seen, &(200..264).collect(), 1);
    leave.send(()).unwrap();
    t.join().unwrap();
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn an_attached_reader_with_nothing_to_read_is_a_stall() {
    // The sampler only samples when the test says so: until then the attached reader has credit
    // and an empty ring, which is what a stall is.
    let w = world_ticking("stall", 32, 1 << 20, Duration::from_secs(3600));
    let subset: RoaringBitmap = (0..12).collect();
    let (s, ring) = w.job(1, subset.clone(), 1, 8).await;
    let h = read_all(w.instance.clone(), ring, Duration::ZERO);
    wait_until("stall time to be counted", || s.stall_us.load(Relaxed) > 0).await;
    assert_eq!(
        s.state(),
        JobState::Running,
        "an attached reader runs the job"
    );
    assert_eq!(s.sampled.load(Relaxed), 0);
    // Sampling resumes the job; the reader gets its exact epoch.
    while !h.is_finished() {
        w.sampler.send(Pass).await.unwrap();
        actix::clock::sleep(Duration::from_millis(5)).await;
    }
    check_epochs(&join(h).await, &subset, 1);
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn unattached_jobs_hold_nothing_and_slow_jobs_do_not_stall_fast_ones() {
    // 24 slots; six registered jobs nobody reads would reserve 48 places between them (the
    // old admission refused the fourth, and their pushed rings pinned the cache for good).
    // Each reader's ring (8 places) pins 8 slots at most: 24 slots are room for the three
    // readers, so no unit of any job ever waits for room another job holds, however slowly
    // the slow one reads. The Cache counts every such wait: finishing alone would not show
    // that the fast jobs went at their own pace.
    let w = world("unattached", 24, 1 << 20);
    let subset: RoaringBitmap = (0..100).collect();
    let mut idle = Vec::new();
    for job in 10..16 {
        idle.push(w.job(job, subset.clone(), 1, 8).await.0);
    }
    let (slow, r_slow) = w.job(1, subset.clone(), 1, 8).await;
    let (f1, r1) = w.job(2, subset.clone(), 1, 8).await;
    let (f2, r2) = w.job(3, subset.clone(), 1, 8).await;
    let crawl = read_all(w.instance.clone(), r_slow, Duration::from_millis(20));
    let fast1 = read_all(w.instance.clone(), r1, Duration::ZERO);
    let fast2 = read_all(w.instance.clone(), r2, Duration::ZERO);
    check_epochs(&join(fast1).await, &subset, 1);
    check_epochs(&join(fast2).await, &subset, 1);
    for (who, s) in [("fast job 2", &f1), ("fast job 3", &f2)] {
        assert_eq!(
            s.waited_for_others.load(Relaxed),
            0,
            "{who}: a unit waited for room another job held"
        );
    }
    for s in &idle {
        assert_eq!(
            s.sampled.load(Relaxed),
            0,
            "an unattached job gets no samples"
        );
        assert_eq!(s.state(), JobState::Waiting);
    }
    check_epochs(&join(crawl).await, &subset, 1);
    assert_eq!(slow.state(), JobState::Finished);
    assert_eq!(
        slow.waited_for_others.load(Relaxed),
        0,
        "the slow job: a unit waited for room another job held"
    );
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn a_unit_waiting_for_room_another_job_holds_is_counted() {
    // 6 slots. Job 1's reader takes a batch of 4 and holds it, unacknowledged, until told;
    // job 2 then needs a whole batch of 4 and finds room for 2: its delivery waits for job
    // 1's acknowledgement (a stall the Cache counts), and goes on once job 1 reads on.
    let w = world("waits", 6, 1 << 20);
    let (s1, r1) = open(&w, 1, Arc::new((0..1000).collect()), 4).await;
    let (s2, r2) = open(&w, 2, Arc::new((0..1000).collect()), 4).await;
    // The whole unit is in the ring before the reader opens it: its first batch is all four.
    w.cache.do_send(epoch_of(1, 10..14));
    wait_until("job 1's unit pushed", || s1.delivered.load(Relaxed) == 4).await;
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let (taken, wait_taken) = std::sync::mpsc::channel::<usize>();
    let inst = w.instance.clone();
    let holder = std::thread::spawn(move || {
        let reader = Reader::open(&inst, &r1).unwrap();
        let mut got = Vec::new();
        let mut first = true;
        loop {
            let b = reader
                .next_batch(BATCH as usize, Some(Duration::from_secs(60)))
                .unwrap();
            got.extend(b.items().map(|i| i.meta.element_id));
            if first {
                first = false;
                taken.send(b.len()).unwrap();
                wait_go.recv().unwrap();
            }
            if b.end_of_stream() {
                return got;
            }
        }
    });
    assert_eq!(wait_taken.recv().unwrap(), 4, "the holder's first batch");
    let fast = read_all(w.instance.clone(), r2, Duration::ZERO);
    w.cache.do_send(epoch_of(2, 20..28));
    wait_until("job 2's unit counted as waiting for job 1", || {
        s2.waited_for_others.load(Relaxed) > 0
    })
    .await;
    assert_eq!(
        s2.delivered.load(Relaxed),
        0,
        "job 2 cannot get a batch while job 1 holds its slots"
    );
    go.send(()).unwrap();
    assert_eq!(join(holder).await, (10..14).collect::<Vec<_>>());
    check_epochs(&join(fast).await, &(20..28).collect(), 1);
    assert_eq!(
        s1.waited_for_others.load(Relaxed),
        0,
        "job 1 waited only for its own reader"
    );
    // One count for the one unit that waited, however long it waited (job 2's second unit
    // waited for its own reader only: job 1 held nothing any more).
    assert_eq!(s2.waited_for_others.load(Relaxed), 1);
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

/// One epoch of `elements`, in this order, for `job`; the job finishes after it.
fn epoch_of(job: JobId, elements: std::ops::Range<u32>) -> Deliver {
    let n = elements.len();
    Deliver {
        dataset: 1,
        groups: elements
            .enumerate()
            .map(|(i, element)| DeliverGroup {
                element,
                need: 0,
                items: vec![DeliverItem {
                    job,
                    epoch: 0,
                    position: i as u32,
                }],
            })
            .collect(),
        ends: vec![EndAt {
            after: n,
            job,
            epoch: 0,
            finished: true,
        }],
        ahead: Vec::new(),
        grown: Vec::new(),
    }
}

#[actix::test]
async fn a_paused_readers_queued_elements_make_room_and_are_reloaded_in_order() {
    // 8 slots (element 7 is unreadable: not used here). Job 2's reader attaches and pauses: its ring (4 places) is full and 4 more of
    // its elements are cached and queued behind it. Job 1 then needs room: the paused job's
    // queued elements are needed later, so they are evicted (never the pushed ones) and
    // loaded again when job 2 reads on; both epochs stay exact and in order.
    let w = world("pressure", 8, 1 << 20);
    let (s2, r2) = open(&w, 2, Arc::new((0..1000).collect()), 4).await;
    let (s1, r1) = open(&w, 1, Arc::new((0..1000).collect()), 4).await;
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let (attached, wait_attached) = std::sync::mpsc::channel::<()>();
    let inst = w.instance.clone();
    let paused = std::thread::spawn(move || {
        let reader = Reader::open(&inst, &r2).unwrap();
        attached.send(()).unwrap();
        wait_go.recv().unwrap();
        let mut got = Vec::new();
        loop {
            let b = reader
                .next_batch(BATCH as usize, Some(Duration::from_secs(60)))
                .unwrap();
            for item in b.items() {
                assert_eq!(item.data, payload(item.meta.element_id).as_slice());
                got.push((item.meta.element_id, item.meta.position));
            }
            if b.end_of_stream() {
                return got;
            }
        }
    });
    wait_attached.recv().unwrap();
    w.cache.do_send(epoch_of(2, 10..18));
    wait_until("job 2's ring full and the rest of its epoch cached", || {
        s2.delivered.load(Relaxed) == 4 && w.stats.slots_in_use.load(Relaxed) == 8
    })
    .await;
    let fast = read_all(w.instance.clone(), r1, Duration::ZERO);
    w.cache.do_send(epoch_of(1, 100..104));
    let seen = join(fast).await;
    check_epochs(&seen, &(100..104).collect(), 1);
    assert!(
        w.stats.evictions_needed.load(Relaxed) >= 1,
        "the paused job's queued elements made room"
    );
    assert_eq!(s1.errors.load(Relaxed), 0);
    go.send(()).unwrap();
    let got = join(paused).await;
    assert_eq!(
        got,
        (10..18).map(|e| (e, u64::from(e - 10))).collect::<Vec<_>>(),
        "the paused job gets its whole epoch, in its order"
    );
    let reloads = w.stats.reloads.load(Relaxed);
    assert!(reloads >= 1, "evicted elements are loaded again");
    assert_eq!(
        w.source.reads.load(Relaxed),
        12 + reloads,
        "every read is a first load or a counted reload"
    );
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn units_competing_for_too_little_room_complete_one_after_the_other() {
    // Room for 6 elements, two jobs each needing a whole batch of 4 at once: half of each
    // cached would wait forever; room goes to one unit first, then to the other.
    for round in 0..5 {
        let w = world(&format!("units{round}"), 6, 1 << 20);
        let (_s1, r1) = open(&w, 1, Arc::new((0..1000).collect()), 4).await;
        let (_s2, r2) = open(&w, 2, Arc::new((0..1000).collect()), 4).await;
        let h1 = read_all(w.instance.clone(), r1, Duration::ZERO);
        let h2 = read_all(w.instance.clone(), r2, Duration::ZERO);
        // Interleaved, so that the loads fill the room with half of each unit.
        let (a, b) = (epoch_of(1, 20..28), epoch_of(2, 30..38));
        let groups = a.groups.into_iter().zip(b.groups).flat_map(|(x, y)| [x, y]);
        w.cache.do_send(Deliver {
            dataset: 1,
            groups: groups.collect(),
            ends: vec![
                EndAt {
                    after: 16,
                    ..a.ends[0]
                },
                EndAt {
                    after: 16,
                    ..b.ends[0]
                },
            ],
            ahead: Vec::new(),
            grown: Vec::new(),
        });
        check_epochs(&join(h1).await, &(20..28).collect(), 1);
        check_epochs(&join(h2).await, &(30..38).collect(), 1);
        assert_invariants(&w).await;
        w.cache.send(Shutdown).await.unwrap();
    }
}

#[actix::test]
async fn the_actors_check_their_invariants_every_so_often_and_a_broken_one_fails() {
    let w = world("invariants", 32, 1 << 20);
    let subset: RoaringBitmap = (0..40).collect();
    let (s, r) = w.job(1, subset.clone(), 1, 8).await;
    // A job nobody reads: it stays registered, without credit.
    let (idle, _) = w.job(2, subset.clone(), 1, 8).await;
    check_epochs(
        &join(read_all(w.instance.clone(), r, Duration::ZERO)).await,
        &subset,
        1,
    );
    wait_until("job 1's 40 acknowledgements", || {
        s.acknowledged.load(Relaxed) == 40
    })
    .await;
    assert_eq!(idle.sampled.load(Relaxed), 0);
    let cache = w.cache.send(cache::probe::Inspect).await.unwrap();
    let sampler = w.sampler.send(sampler::probe::Inspect).await.unwrap();
    // Each delivery message, load and poll is one message to the cache.
    assert!(cache.messages > 40, "{} cache messages", cache.messages);
    assert!(
        sampler.messages >= 3,
        "{} sampler messages",
        sampler.messages
    );
    if cfg!(debug_assertions) {
        assert!(cache.full_checks >= 6 && sampler.full_checks >= 2);
    }
    assert_invariants(&w).await;

    // Broken on purpose: the full check names what broke, and the periodic check panics
    // (debug builds) at the next message it is due after.
    let (direct, periodic) = w.cache.send(cache::probe::LeakReference).await.unwrap();
    let err = direct.expect_err("a leaked reference breaks the cache's invariants");
    assert!(err.contains("references for 0 queued"), "{err}");
    if cfg!(debug_assertions) {
        let p = periodic.expect("the periodic check runs and panics");
        assert!(
            p.starts_with("cache: invariant broken after operation"),
            "{p}"
        );
        assert!(p.contains("references for 0 queued"), "{p}");
    } else {
        assert_eq!(periodic, None, "release builds never run the full check");
    }
    let (direct, periodic) = w.sampler.send(sampler::probe::Overdraw(2)).await.unwrap();
    let err = direct.expect_err("an overdrawn job breaks the sampler's invariants");
    assert!(err.contains("beyond its credit and lookahead"), "{err}");
    if cfg!(debug_assertions) {
        let p = periodic.expect("the periodic check runs and panics");
        assert!(
            p.starts_with("sampler: invariant broken after operation"),
            "{p}"
        );
    } else {
        assert_eq!(periodic, None, "release builds never run the full check");
    }
    // Both took their breakage back.
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

mod preload;
