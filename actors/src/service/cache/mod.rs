//! The Cache actor: owns the shared-memory data segment (through the dataplane writer), the
//! cache policy over its slots, the jobs' delivery rings and the acknowledgements.
//!
//! For every sampled delivery it either reuses a cached slot (a hit), joins a load already
//! under way for another job (a hit too: one decode serves both), or asks for a load (a miss).
//!
//! **Flow control** (per job, never global):
//! - A job's credit (the places of its rings) goes to its Sampler only when every rank's
//!   client has attached: a job registered but not read gets no samples and holds nothing.
//! - Each ring is fed in its job's sampled order, one *unit* at a time: a whole batch (the
//!   job's `batch_size` records), or what is left before an end of epoch. A unit is pushed
//!   when all of its elements are cached, so a ring's pinned records are always batches its
//!   client can take at once: no job ever pins a half batch while it waits for room.
//! - Loads are bounded ([`CacheConfig::max_loading`] elements being read, decoded or waiting
//!   for room; the rest wait as *pending* keys): decoded payloads held outside shared memory
//!   never exceed that bound, whatever the number of jobs.
//! - A payload that finds no room waits on its own; it holds back only the rings that need
//!   it. Payloads that wait are stored nearest need first.
//!
//! **Pinning and eviction.** A slot that some ring holds (pushed, not yet acknowledged; the
//! dataplane's read bits say the same in shared memory) is never evicted. A slot only queued
//! for a ring is kept by the policy like a pinned one, but when memory is short, liveness wins
//! over the RefCnt rule: such a slot is evicted if it is needed later than the payload that
//! needs the room (the furthest-behind reader's elements go first: need time is the records
//! ahead of the element in its ring divided by the job's reading rate). The element is loaded
//! again when its ring reaches it (a *reload*, counted with `evictions{reason="needed"}`), so
//! every epoch stays an exact permutation whatever is evicted.
//!
//! Split: this file holds the state, the handlers and the polls; `flow.rs` the loads, room
//! and eviction under pressure; `rings.rs` what goes into the rings.

mod flow;
mod rings;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dataplane::{ReaderStatus, RingWriter, SlotRef, Writer};
use roaring::RoaringBitmap;

use super::messages::*;
use super::stats::{CacheStats, JobState, JobStats};
use joader_core::cache::{Policy, PolicyKind};

/// Settings of the cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub policy: PolicyKind,
    /// How often acknowledgements and client liveness are polled.
    pub tick: Duration,
    /// Elements being loaded or holding a decoded payload that waits for room, at most.
    pub max_loading: usize,
}

impl CacheConfig {
    /// Enough loads in flight to keep `workers` decode threads busy.
    pub fn max_loading_for(workers: usize) -> usize {
        (workers * 4).max(16)
    }
}

#[derive(Debug, Clone, Copy)]
struct SlotEntry {
    slot: SlotRef,
    /// Deliveries of the key queued for a ring, not yet pushed.
    queued: u32,
    /// Deliveries pushed into a ring and not yet acknowledged (the read bits set).
    pushed: u32,
}

impl SlotEntry {
    fn uses(&self) -> u32 {
        self.queued + self.pushed
    }
}

/// A key being read and prepared, or prepared and waiting for room.
#[derive(Debug, Clone, Copy, Default)]
struct Loading {
    /// Queued deliveries waiting for it.
    refs: u32,
    need: u32,
}

/// A key some ring needs that is not loading yet (loads are bounded).
#[derive(Debug, Clone, Copy)]
struct Pending {
    refs: u32,
    need: u32,
    /// It was cached once and evicted while still needed.
    reload: bool,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Item {
        key: u64,
        element: u32,
        epoch: u32,
        position: u32,
    },
    EndOfEpoch {
        epoch: u32,
    },
    EndOfStream,
}

struct RankRing {
    ring: RingWriter,
    queue: VecDeque<Entry>,
    /// How many entries at the queue's front are known ready (cached, failed, or an end), at
    /// most one unit; `ready_items` of them are items.
    ready: usize,
    ready_items: usize,
    /// One flag per record pushed and not yet acknowledged: does it return credit?
    shadow: VecDeque<bool>,
    acked: u64,
    epoch_count: u64,
    /// The client was attached and alive at the last liveness probe.
    alive: bool,
    /// The ring has been probed at least once (before that, a client may be reading it).
    probed: bool,
}

struct CacheJob {
    dataset: DatasetId,
    pipeline: PipelineId,
    prepare: Arc<dyn Prepare>,
    subset: Arc<RoaringBitmap>,
    rings: Vec<RankRing>,
    /// Records a unit holds (the job's batch size per rank).
    batch: u32,
    credit: u32,
    /// The sampler was given the job's credit: every rank's client has attached.
    granted: bool,
    opened: Instant,
    /// Records the client takes per second (an estimate; `None` until measured).
    rate: Option<f64>,
    /// Where the rate was last measured: (when, records taken by then).
    rate_mark: (Instant, u64),
    stats: Arc<JobStats>,
    sampler: Recipient<JobSignal>,
    /// A resumed job's first epoch, until its first delivery: the elements it still needs.
    resume: Option<Arc<RoaringBitmap>>,
}

/// See the module docs.
pub struct CacheActor {
    writer: Option<Writer>,
    policy: Policy,
    slots: HashMap<u64, SlotEntry>,
    by_slot: HashMap<u32, (SlotRef, u64)>,
    loading: HashMap<u64, Loading>,
    pending: HashMap<u64, Pending>,
    /// Pending keys in the order they were first needed (may hold keys no longer pending).
    pending_order: VecDeque<u64>,
    failed: HashMap<u64, (u32, u32)>,
    /// Prepared payloads waiting for room (their keys are in `loading`).
    waiting: HashMap<u64, flow::Waiting>,
    /// Something may have made room since the waiting payloads last tried.
    room_changed: bool,
    max_loading: usize,
    jobs: HashMap<JobId, CacheJob>,
    sources: HashMap<DatasetId, Arc<dyn ElementSource>>,
    loader: Recipient<Load>,
    stats: Arc<CacheStats>,
    tick: Duration,
    /// When acknowledgements were last polled (stall time is counted in poll intervals).
    last_poll: Instant,
    /// When the clients' liveness (a flock probe per ring) was last checked.
    last_liveness: Instant,
    /// The next poll, and whether it was scheduled at the idle interval.
    next_poll: Option<(SpawnHandle, bool)>,
}

/// How often the clients' liveness is probed (two syscalls per ring).
const LIVENESS_INTERVAL: Duration = Duration::from_millis(20);
/// How long after its registration a job's attach is watched at the fast tick.
const ATTACH_WATCH: Duration = Duration::from_secs(2);
/// How often an idle cache (see `CacheActor::idle`) polls at all.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// How often a job's reading rate is measured.
const RATE_INTERVAL: Duration = Duration::from_millis(250);

fn split_key(key: u64) -> (DatasetId, PipelineId, u32) {
    (
        (key >> 48) as u16,
        ((key >> 32) & 0xffff) as u16,
        key as u32,
    )
}

impl CacheActor {
    pub fn new(
        writer: Writer,
        cfg: &CacheConfig,
        loader: Recipient<Load>,
        stats: Arc<CacheStats>,
    ) -> Self {
        stats
            .slot_capacity
            .store(u64::from(writer.slot_count()), Relaxed);
        stats
            .capacity_bytes
            .store(writer.arena_stats().size, Relaxed);
        Self {
            writer: Some(writer),
            policy: Policy::new(cfg.policy, 0x6a6f_6164),
            slots: HashMap::new(),
            by_slot: HashMap::new(),
            loading: HashMap::new(),
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            failed: HashMap::new(),
            waiting: HashMap::new(),
            room_changed: false,
            max_loading: cfg.max_loading.max(1),
            jobs: HashMap::new(),
            sources: HashMap::new(),
            loader,
            stats,
            tick: cfg.tick,
            last_poll: Instant::now(),
            last_liveness: Instant::now(),
            next_poll: None,
        }
    }

    fn update_gauges(&self) {
        self.stats
            .slots_in_use
            .store(self.slots.len() as u64, Relaxed);
        if let Some(w) = &self.writer {
            let a = w.arena_stats();
            self.stats.bytes_in_use.store(a.size - a.free, Relaxed);
        }
        self.stats
            .waiting_for_space
            .store(self.waiting.len() as u64, Relaxed);
        self.stats
            .pending_loads
            .store(self.pending.len() as u64, Relaxed);
        self.stats.open_jobs.store(self.jobs.len() as u64, Relaxed);
        self.stats
            .open_sources
            .store(self.sources.len() as u64, Relaxed);
    }

    /// A job's epoch starts: every cached element of its subset is needed once more.
    fn epoch_started(&mut self, dataset: DatasetId, pipeline: PipelineId, subset: &RoaringBitmap) {
        for &key in self.slots.keys() {
            let (ds, pl, el) = split_key(key);
            if ds == dataset && pl == pipeline && subset.contains(el) {
                let r = self.policy.refcount(key).unwrap_or(0);
                self.policy.set_refcount(key, r + 1);
            }
        }
    }

    /// A pushed record was acknowledged (or its reader reclaimed): its slot is no longer held
    /// by that ring.
    fn release(&mut self, r: SlotRef) {
        let Some(&(cur, key)) = self.by_slot.get(&r.slot) else {
            return;
        };
        if cur != r {
            return;
        }
        if let Some(e) = self.slots.get_mut(&key) {
            e.pushed = e.pushed.saturating_sub(1);
            if e.uses() == 0 {
                self.policy.unpin(key);
            }
            // Unpinned, or now only queued (evictable for a sooner need): either may make room.
            self.room_changed = true;
        }
    }

    /// Drops the reference a queued (never pushed) entry held.
    fn unref(&mut self, key: u64) {
        if let Some(e) = self.slots.get_mut(&key) {
            e.queued = e.queued.saturating_sub(1);
            if e.uses() == 0 {
                self.policy.unpin(key);
                self.room_changed = true;
            }
        } else if let Some(l) = self.loading.get_mut(&key) {
            l.refs = l.refs.saturating_sub(1);
        } else if let Some(p) = self.pending.get_mut(&key) {
            p.refs = p.refs.saturating_sub(1);
            if p.refs == 0 {
                self.pending.remove(&key);
            }
        } else if let Some(f) = self.failed.get_mut(&key) {
            f.1 = f.1.saturating_sub(1);
            if f.1 == 0 {
                self.failed.remove(&key);
            }
        }
    }

    /// Polls acknowledgements and client liveness of every ring.
    fn poll(&mut self) {
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
        let mut gone: Vec<(JobId, String)> = Vec::new();
        let mut done: Vec<JobId> = Vec::new();
        let mut released: Vec<SlotRef> = Vec::new();
        for (&id, job) in &mut self.jobs {
            let mut credit = 0u32;
            let mut alive = false;
            // Rings whose client read to the end and left (the job ends when every one has).
            let mut finished_rings = 0;
            for rr in &mut job.rings {
                match rr.ring.poll_acks() {
                    Ok(refs) => released.extend(refs),
                    Err(e) => {
                        gone.push((id, format!("client broke the ring protocol: {e}")));
                        continue;
                    }
                }
                let acked = rr.ring.acked();
                for _ in rr.acked..acked {
                    if rr.shadow.pop_front().unwrap_or(false) {
                        credit += 1;
                    }
                }
                rr.acked = acked;
                // A stall: the client is attached, has taken everything pushed and could
                // take more (it has credit), but nothing is ready for it.
                if rr.alive
                    && rr.ring.consumer_position() == rr.ring.pushed()
                    && rr.ring.free_credit() > 0
                    && job.stats.state() != JobState::Finished
                {
                    job.stats
                        .stall_us
                        .fetch_add(interval.as_micros() as u64, Relaxed);
                }
                if !probe {
                    alive |= rr.alive;
                    continue;
                }
                rr.alive = false;
                rr.probed = true;
                match rr.ring.reader_status() {
                    ReaderStatus::Alive => {
                        alive = true;
                        rr.alive = true;
                    }
                    ReaderStatus::Dead => gone.push((id, "client process died".into())),
                    // A ring cannot be reopened: a client that left before the end of the
                    // job ends it.
                    ReaderStatus::Detached if job.stats.state() != JobState::Finished => {
                        gone.push((id, "client detached before the end of the job".into()));
                    }
                    // Finished and read: once every rank's client has (a fast rank that
                    // left must not close the rings its job's slower ranks still read).
                    ReaderStatus::Detached => finished_rings += 1,
                    ReaderStatus::NotAttached => {}
                }
            }
            if probe && finished_rings == job.rings.len() {
                done.push(id);
            }
            if alive {
                job.stats.set_state(JobState::Running);
            }
            // New rates reorder the needs: waiting payloads may now find room.
            self.room_changed |= measure_rate(job, now);
            // Credit only once every rank reads: an unattached job must not pin the cache.
            // (The registry adds the job to its Sampler before it answers the client, so the
            // Sampler knows the job before any client can attach.)
            if !job.granted && job.rings.iter().all(|rr| rr.ring.reader_attached()) {
                job.granted = true;
                tracing::debug!(job = id, "every rank attached: credit granted");
                job.sampler.do_send(JobSignal::Credit {
                    job: id,
                    n: job.credit,
                });
            }
            if credit > 0 {
                job.stats.acknowledged.fetch_add(u64::from(credit), Relaxed);
                job.sampler
                    .do_send(JobSignal::Credit { job: id, n: credit });
            }
        }
        for r in released {
            self.release(r);
        }
        for (id, reason) in gone {
            self.close_job(id, Some(reason));
        }
        for id in done {
            self.close_job(id, None);
        }
        self.drain_waiting();
        self.issue_loads();
        self.pump();
    }

    /// Nothing can change but by a message or a client attaching, leaving or dying (which the
    /// liveness probe notices): nothing loading, pending or waiting for room, and every ring
    /// either fully acknowledged or without a live client, with nothing queued that it could
    /// take.
    fn idle(&self) -> bool {
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
    fn schedule_poll(&mut self, ctx: &mut Context<Self>) {
        let idle = self.idle();
        let delay = if idle { IDLE_POLL } else { self.tick };
        let handle = ctx.run_later(delay, |act, ctx| {
            act.next_poll = None;
            act.poll();
            act.schedule_poll(ctx);
        });
        self.next_poll = Some((handle, idle));
    }

    /// Something arrived: if the cache is no longer idle and the next poll is an idle one,
    /// poll at the fast tick instead (never later than already scheduled).
    fn wake(&mut self, ctx: &mut Context<Self>) {
        if let Some((handle, true)) = self.next_poll
            && !self.idle()
        {
            ctx.cancel_future(handle);
            self.next_poll = None;
            self.schedule_poll(ctx);
        }
    }

    /// Drops a job's rings and everything it held; tells its sampler when it failed.
    fn close_job(&mut self, id: JobId, failure: Option<String>) {
        let Some(mut job) = self.jobs.remove(&id) else {
            return;
        };
        for rr in &mut job.rings {
            for r in rr.ring.reclaim_reader() {
                self.release(r);
            }
        }
        for rr in job.rings.drain(..) {
            for entry in rr.queue {
                if let Entry::Item { key, .. } = entry {
                    self.unref(key);
                }
            }
            drop(rr.ring);
        }
        self.room_changed = true;
        job.stats.closed.store(true, Relaxed);
        // The last job of a dataset forgets its source (the dataset may be deleted: its index
        // must not live on here). Loads in flight hold their own reference.
        if !self.jobs.values().any(|j| j.dataset == job.dataset) {
            self.sources.remove(&job.dataset);
        }
        if let Some(reason) = failure {
            tracing::warn!(job = id, reason = %reason, "job stopped");
            job.stats.set_state(JobState::Failed(reason));
            job.sampler.do_send(JobSignal::Gone { job: id });
        }
        self.update_gauges();
    }

    fn queue_end(&mut self, end: &EndAt) {
        if let Some(j) = self.jobs.get_mut(&end.job) {
            for rr in &mut j.rings {
                rr.queue.push_back(Entry::EndOfEpoch { epoch: end.epoch });
                if end.finished {
                    rr.queue.push_back(Entry::EndOfStream);
                }
            }
        }
    }

    fn shutdown(&mut self) {
        // The data segment is marked shut down first, so that a client whose ring is closed
        // next learns why (`server_gone`: "server shut down"), not merely `ring_closed`.
        self.writer.take();
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.close_job(id, None);
        }
        self.slots.clear();
        self.by_slot.clear();
        self.waiting.clear();
        self.pending.clear();
        self.pending_order.clear();
    }

    fn open_job(&mut self, msg: OpenJob) -> Result<Vec<RingInfo>, OpenJobError> {
        let Some(writer) = &self.writer else {
            return Err(OpenJobError::ShutDown);
        };
        if self.jobs.contains_key(&msg.job) {
            return Err(OpenJobError::AlreadyOpen(msg.job));
        }
        if msg.ranks == 0 || msg.capacity == 0 || msg.batch == 0 || msg.batch > msg.capacity {
            return Err(OpenJobError::Empty);
        }
        // No reservation against the other jobs: a job costs cache memory only while its
        // client reads (credit is granted on attach), so a sweep of many jobs is admitted.
        let mut rings = Vec::new();
        let mut infos = Vec::new();
        for rank in 0..msg.ranks {
            let name = format!("{}-r{rank}", msg.ring_prefix);
            match writer.create_ring(&name, msg.capacity) {
                Ok(ring) => {
                    infos.push(RingInfo {
                        rank,
                        ring: name,
                        segment: ring.segment_name().to_string(),
                        reader_index: ring.reader_index(),
                        capacity: ring.capacity(),
                    });
                    rings.push(RankRing {
                        ring,
                        queue: VecDeque::new(),
                        ready: 0,
                        ready_items: 0,
                        shadow: VecDeque::new(),
                        acked: 0,
                        epoch_count: 0,
                        alive: false,
                        probed: false,
                    });
                }
                Err(e) => {
                    return Err(OpenJobError::Ring {
                        ring: name,
                        message: e.to_string(),
                    });
                }
            }
        }
        // The sampler's credit is what the rings hold in total.
        let credit = rings.iter().map(|r| r.ring.capacity()).sum();
        self.sources.insert(msg.dataset, msg.source);
        let now = Instant::now();
        self.jobs.insert(
            msg.job,
            CacheJob {
                dataset: msg.dataset,
                pipeline: msg.pipeline,
                prepare: msg.prepare,
                subset: msg.subset,
                rings,
                batch: msg.batch,
                credit,
                granted: false,
                opened: now,
                rate: None,
                rate_mark: (now, 0),
                stats: msg.stats,
                sampler: msg.sampler,
                resume: msg.resume,
            },
        );
        self.update_gauges();
        Ok(infos)
    }

    fn deliver(&mut self, msg: Deliver) {
        // A dataset whose last job closed meanwhile: nothing is left to deliver to.
        if !self.sources.contains_key(&msg.dataset) {
            return;
        }
        let mut ends = msg.ends.iter().peekable();
        for (gi, group) in msg.groups.iter().enumerate() {
            while let Some(end) = ends.next_if(|e| e.after <= gi) {
                self.queue_end(end);
            }
            for item in &group.items {
                let Some(job) = self.jobs.get_mut(&item.job) else {
                    continue;
                };
                let resumed = job.resume.take();
                let (pipeline, stats, subset) =
                    (job.pipeline, job.stats.clone(), job.subset.clone());
                let rank = (item.position % job.rings.len() as u32) as usize;
                if let Some(remaining) = resumed {
                    // A resumed epoch starts: only what remains of it is needed once more.
                    self.epoch_started(msg.dataset, pipeline, &remaining);
                } else if item.position == 0 {
                    self.epoch_started(msg.dataset, pipeline, &subset);
                }
                let key = cache_key(msg.dataset, pipeline, group.element);
                self.stats.requests.fetch_add(1, Relaxed);
                let hit = self.want(key, group.need);
                let counter = if hit {
                    (&self.stats.hits, &stats.hits)
                } else {
                    (&self.stats.misses, &stats.misses)
                };
                counter.0.fetch_add(1, Relaxed);
                counter.1.fetch_add(1, Relaxed);
                if let Some(job) = self.jobs.get_mut(&item.job) {
                    job.rings[rank].queue.push_back(Entry::Item {
                        key,
                        element: group.element,
                        epoch: item.epoch,
                        position: item.position,
                    });
                }
            }
        }
        for end in ends {
            self.queue_end(end);
        }
        self.issue_loads();
        self.pump();
    }

    /// A queued delivery of `key` takes a reference on it wherever it is; returns whether it
    /// is served without a read of its own (cached, loading or about to load for another).
    fn want(&mut self, key: u64, need: u32) -> bool {
        if let Some(e) = self.slots.get_mut(&key) {
            e.queued += 1;
            if e.uses() == 1 {
                self.policy.pin(key);
            }
            self.policy.hit(key);
            self.policy.set_refcount(key, need);
            true
        } else if let Some(l) = self.loading.get_mut(&key) {
            l.refs += 1;
            l.need = need;
            true
        } else if let Some(p) = self.pending.get_mut(&key) {
            p.refs += 1;
            p.need = need;
            true
        } else if let Some(f) = self.failed.get_mut(&key) {
            f.1 += 1;
            false
        } else {
            self.pending.insert(
                key,
                Pending {
                    refs: 1,
                    need,
                    reload: false,
                },
            );
            self.pending_order.push_back(key);
            false
        }
    }
}

/// Updates a job's reading-rate estimate: records taken per second, measured only over
/// intervals in which the client had something to take (a starved client is not slow, a
/// paused one is). Returns whether it measured.
fn measure_rate(job: &mut CacheJob, now: Instant) -> bool {
    let (at, before) = job.rate_mark;
    let elapsed = now.duration_since(at);
    if elapsed < RATE_INTERVAL {
        return false;
    }
    let taken: u64 = job.rings.iter().map(|rr| rr.ring.consumer_position()).sum();
    let waiting: u64 = job
        .rings
        .iter()
        .map(|rr| rr.ring.pushed() - rr.ring.consumer_position().min(rr.ring.pushed()))
        .sum();
    let moved = taken.saturating_sub(before);
    if moved > 0 || waiting > 0 {
        let now_rate = moved as f64 / elapsed.as_secs_f64();
        job.rate = Some(match job.rate {
            Some(r) => 0.5 * r + 0.5 * now_rate,
            None => now_rate,
        });
    }
    job.rate_mark = (now, taken);
    true
}

impl Actor for CacheActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.schedule_poll(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.shutdown();
    }
}

impl Handler<OpenJob> for CacheActor {
    type Result = Result<Vec<RingInfo>, OpenJobError>;
    fn handle(&mut self, msg: OpenJob, ctx: &mut Context<Self>) -> Self::Result {
        let opened = self.open_job(msg);
        self.wake(ctx);
        opened
    }
}

impl Handler<CloseJob> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: CloseJob, ctx: &mut Context<Self>) {
        self.close_job(msg.job, None);
        // What the job held may let another job's payload in.
        self.drain_waiting();
        self.issue_loads();
        self.pump();
        self.wake(ctx);
    }
}

impl Handler<Shutdown> for CacheActor {
    type Result = ();
    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) {
        self.shutdown();
    }
}

impl Handler<Deliver> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: Deliver, ctx: &mut Context<Self>) {
        self.deliver(msg);
        self.wake(ctx);
    }
}

impl Handler<Loaded> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: Loaded, ctx: &mut Context<Self>) {
        self.loaded(msg);
        self.wake(ctx);
    }
}
