//! The Cache actor: owns the shared-memory data segment (through the dataplane writer), the
//! cache policy over its slots, the jobs' delivery rings and the acknowledgements.
//!
//! For every sampled delivery it either reuses a cached slot (a hit), joins a load already in
//! flight for another job (a hit too: one decode serves both), or asks the Loader for the
//! element (a miss). Each ring is fed strictly in the job's sampled order: an element still
//! loading holds back the ones behind it in that ring only.
//!
//! A key is *pinned* (never evicted) while some delivery of it is queued or pushed but not yet
//! acknowledged; the dataplane's read bits enforce the same rule in shared memory. When the
//! arena is full and everything is pinned, decoded payloads wait (back-pressure); credits
//! bound how many can wait, and [`OpenJob`] refuses jobs whose credit the cache cannot hold.
//!
//! (Longer than this codebase's usual 600 lines on purpose: one actor's state, slots, pins,
//! rings, their queues and credit, and the handlers that must keep the invariants above
//! together; splitting the handlers across files would scatter those invariants.)

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dataplane::{ReaderStatus, RingWriter, SlotMeta, SlotRef, Writer, element_error};
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
}

#[derive(Debug, Clone, Copy)]
struct SlotEntry {
    slot: SlotRef,
    /// Deliveries queued or pushed and not yet acknowledged.
    uses: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Loading {
    refs: u32,
    need: u32,
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
    credit: u32,
    stats: Arc<JobStats>,
    sampler: Recipient<JobSignal>,
}

/// See the module docs.
pub struct CacheActor {
    writer: Option<Writer>,
    policy: Policy,
    slots: HashMap<u64, SlotEntry>,
    by_slot: HashMap<u32, (SlotRef, u64)>,
    loading: HashMap<u64, Loading>,
    failed: HashMap<u64, (u32, u32)>,
    /// Prepared payloads waiting for room, in arrival order.
    waiting: VecDeque<(u64, u32, i64, Prepared)>,
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
/// How often an idle cache (see `CacheActor::idle`) polls at all.
const IDLE_POLL: Duration = Duration::from_millis(50);

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
            failed: HashMap::new(),
            waiting: VecDeque::new(),
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

    fn total_credit(&self) -> u64 {
        self.jobs.values().map(|j| u64::from(j.credit)).sum()
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
        self.stats.open_jobs.store(self.jobs.len() as u64, Relaxed);
        self.stats
            .open_sources
            .store(self.sources.len() as u64, Relaxed);
    }

    /// A job's epoch starts: every cached element of its subset is needed once more.
    fn epoch_started(&mut self, dataset: DatasetId, pipeline: PipelineId, subset: &RoaringBitmap) {
        for &key in self.slots.keys() {
            let (ds, pl, el) = (
                (key >> 48) as u16,
                ((key >> 32) & 0xffff) as u16,
                key as u32,
            );
            if ds == dataset && pl == pipeline && subset.contains(el) {
                let r = self.policy.refcount(key).unwrap_or(0);
                self.policy.set_refcount(key, r + 1);
            }
        }
    }

    fn release(&mut self, r: SlotRef) {
        let Some(&(cur, key)) = self.by_slot.get(&r.slot) else {
            return;
        };
        if cur != r {
            return;
        }
        if let Some(e) = self.slots.get_mut(&key) {
            e.uses = e.uses.saturating_sub(1);
            if e.uses == 0 {
                self.policy.unpin(key);
            }
        }
    }

    /// Drops the reference a queued entry held.
    fn forget_entry(&mut self, key: u64) {
        if let Some(e) = self.slots.get_mut(&key) {
            e.uses = e.uses.saturating_sub(1);
            if e.uses == 0 {
                self.policy.unpin(key);
            }
        } else if let Some(l) = self.loading.get_mut(&key) {
            l.refs = l.refs.saturating_sub(1);
        } else if let Some(f) = self.failed.get_mut(&key) {
            f.1 = f.1.saturating_sub(1);
            if f.1 == 0 {
                self.failed.remove(&key);
            }
        }
    }

    fn evict(&mut self, key: u64) -> bool {
        let Some(e) = self.slots.remove(&key) else {
            return false;
        };
        self.by_slot.remove(&e.slot.slot);
        self.stats.evictions.fetch_add(1, Relaxed);
        if let Some(w) = &self.writer
            && let Err(err) = w.free_slot(e.slot)
        {
            tracing::error!(error = %err, key, "evicted key's slot could not be freed");
        }
        true
    }

    /// Stores waiting payloads, in order, evicting unpinned keys as needed.
    fn drain_waiting(&mut self) {
        while let Some((key, element, label, prepared)) = self.waiting.pop_front() {
            let Some(writer) = &self.writer else { return };
            let meta = SlotMeta {
                element_id: element,
                label,
                format: prepared.format,
            };
            match writer.write_slot(meta, &prepared.bytes) {
                Ok(slot) => {
                    let l = self.loading.remove(&key).unwrap_or_default();
                    self.slots.insert(key, SlotEntry { slot, uses: l.refs });
                    self.by_slot.insert(slot.slot, (slot, key));
                    self.policy.insert(key, l.need, None);
                    if l.refs > 0 {
                        self.policy.pin(key);
                    }
                }
                Err(dataplane::Error::Full { .. } | dataplane::Error::NoFreeSlot { .. }) => {
                    if let Some((victim, refcount)) = self.policy.victim_with_refcount() {
                        let reason = if refcount == 0 {
                            &self.stats.evictions_unneeded
                        } else {
                            &self.stats.evictions_needed
                        };
                        reason.fetch_add(1, Relaxed);
                        self.evict(victim);
                        self.waiting.push_front((key, element, label, prepared));
                    } else if self.slots.is_empty() {
                        // Nothing cached and still no room: the element cannot fit at all.
                        self.fail(key, element_error::TOO_LARGE);
                    } else {
                        // Everything is pinned: wait for acknowledgements.
                        self.waiting.push_front((key, element, label, prepared));
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, element, "cannot store a prepared element");
                    self.fail(key, element_error::INTERNAL);
                }
            }
        }
    }

    fn fail(&mut self, key: u64, code: u32) {
        let l = self.loading.remove(&key).unwrap_or_default();
        self.stats.load_errors.fetch_add(1, Relaxed);
        if l.refs > 0 {
            self.failed.insert(key, (code, l.refs));
        }
    }

    /// Pushes what each ring can take, in order.
    fn pump(&mut self) {
        let mut broken: Vec<(JobId, String)> = Vec::new();
        let job_ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in job_ids {
            let Some(mut job) = self.jobs.remove(&id) else {
                continue;
            };
            'rings: for rr in &mut job.rings {
                while let Some(&front) = rr.queue.front() {
                    if rr.ring.free_credit() == 0 {
                        break;
                    }
                    let pushed = match front {
                        Entry::Item {
                            key,
                            element,
                            epoch,
                            position,
                        } => {
                            if let Some(e) = self.slots.get(&key) {
                                let r = rr.ring.push_data(
                                    e.slot,
                                    u64::from(epoch),
                                    u64::from(position),
                                );
                                if r.is_ok() {
                                    job.stats.delivered.fetch_add(1, Relaxed);
                                    rr.shadow.push_back(true);
                                    rr.epoch_count += 1;
                                }
                                r
                            } else if let Some(&(code, _)) = self.failed.get(&key) {
                                let r = rr.ring.push_error(
                                    element,
                                    code,
                                    u64::from(epoch),
                                    u64::from(position),
                                );
                                if r.is_ok() {
                                    job.stats.delivered.fetch_add(1, Relaxed);
                                    job.stats.errors.fetch_add(1, Relaxed);
                                    rr.shadow.push_back(true);
                                    rr.epoch_count += 1;
                                    self.forget_entry(key);
                                }
                                r
                            } else {
                                break; // still loading, or waiting for room
                            }
                        }
                        Entry::EndOfEpoch { epoch } => {
                            let r = rr.ring.push_end_of_epoch(u64::from(epoch), rr.epoch_count);
                            if r.is_ok() {
                                rr.shadow.push_back(false);
                                rr.epoch_count = 0;
                            }
                            r
                        }
                        Entry::EndOfStream => {
                            let r = rr.ring.push_end_of_stream();
                            if r.is_ok() {
                                rr.shadow.push_back(false);
                                job.stats.set_state(JobState::Finished);
                            }
                            r
                        }
                    };
                    match pushed {
                        Ok(()) => {
                            rr.queue.pop_front();
                        }
                        Err(dataplane::Error::RingFull { .. }) => break,
                        Err(e) => {
                            broken.push((id, format!("delivery failed: {e}")));
                            break 'rings;
                        }
                    }
                }
            }
            self.jobs.insert(id, job);
        }
        for (id, reason) in broken {
            self.close_job(id, Some(reason));
        }
        self.update_gauges();
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
                    // Finished and read: free the reader index and the ring.
                    ReaderStatus::Detached => done.push(id),
                    ReaderStatus::NotAttached => {}
                }
            }
            if alive {
                job.stats.set_state(JobState::Running);
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
        self.pump();
    }

    /// Nothing can change but by a message or a client attaching, leaving or dying (which the
    /// liveness probe notices): nothing loading or waiting for room, and every ring either
    /// fully acknowledged or without a live client, with nothing queued that it could take.
    fn idle(&self) -> bool {
        self.loading.is_empty()
            && self.waiting.is_empty()
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
                    self.forget_entry(key);
                }
            }
            drop(rr.ring);
        }
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
    }
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
    fn handle(&mut self, msg: OpenJob, _: &mut Context<Self>) -> Self::Result {
        let Some(writer) = &self.writer else {
            return Err(OpenJobError::ShutDown);
        };
        if self.jobs.contains_key(&msg.job) {
            return Err(OpenJobError::AlreadyOpen(msg.job));
        }
        if msg.ranks == 0 || msg.capacity == 0 {
            return Err(OpenJobError::Empty);
        }
        let credit = msg.ranks * msg.capacity;
        let slots = u64::from(writer.slot_count());
        if self.total_credit() + u64::from(credit) > slots {
            return Err(OpenJobError::NoSlots {
                slots,
                held: self.total_credit(),
                ranks: msg.ranks,
                capacity: msg.capacity,
            });
        }
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
        self.jobs.insert(
            msg.job,
            CacheJob {
                dataset: msg.dataset,
                pipeline: msg.pipeline,
                prepare: msg.prepare,
                subset: msg.subset,
                rings,
                credit,
                stats: msg.stats,
                sampler: msg.sampler,
            },
        );
        self.update_gauges();
        Ok(infos)
    }
}

impl Handler<CloseJob> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: CloseJob, _: &mut Context<Self>) {
        self.close_job(msg.job, None);
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

impl CacheActor {
    fn deliver(&mut self, msg: Deliver) {
        let Some(source) = self.sources.get(&msg.dataset).cloned() else {
            return;
        };
        let mut ends = msg.ends.iter().peekable();
        for (gi, group) in msg.groups.iter().enumerate() {
            while let Some(end) = ends.next_if(|e| e.after <= gi) {
                self.queue_end(end);
            }
            let mut to_load: Vec<(PipelineId, Arc<dyn Prepare>)> = Vec::new();
            for item in &group.items {
                let Some(job) = self.jobs.get(&item.job) else {
                    continue;
                };
                let (pipeline, prepare, stats, subset) = (
                    job.pipeline,
                    job.prepare.clone(),
                    job.stats.clone(),
                    job.subset.clone(),
                );
                let rank = (item.position % job.rings.len() as u32) as usize;
                if item.position == 0 {
                    self.epoch_started(msg.dataset, pipeline, &subset);
                }
                let key = cache_key(msg.dataset, pipeline, group.element);
                self.stats.requests.fetch_add(1, Relaxed);
                if let Some(e) = self.slots.get_mut(&key) {
                    e.uses += 1;
                    if e.uses == 1 {
                        self.policy.pin(key);
                    }
                    self.policy.hit(key);
                    self.policy.set_refcount(key, group.need);
                    self.stats.hits.fetch_add(1, Relaxed);
                    stats.hits.fetch_add(1, Relaxed);
                } else if let Some(l) = self.loading.get_mut(&key) {
                    l.refs += 1;
                    l.need = group.need;
                    self.stats.hits.fetch_add(1, Relaxed);
                    stats.hits.fetch_add(1, Relaxed);
                } else if let Some(f) = self.failed.get_mut(&key) {
                    f.1 += 1;
                    self.stats.misses.fetch_add(1, Relaxed);
                    stats.misses.fetch_add(1, Relaxed);
                } else {
                    self.loading.insert(
                        key,
                        Loading {
                            refs: 1,
                            need: group.need,
                        },
                    );
                    self.stats.misses.fetch_add(1, Relaxed);
                    stats.misses.fetch_add(1, Relaxed);
                    if !to_load.iter().any(|(p, _)| *p == pipeline) {
                        to_load.push((pipeline, prepare));
                    }
                }
                if let Some(job) = self.jobs.get_mut(&item.job) {
                    job.rings[rank].queue.push_back(Entry::Item {
                        key,
                        element: group.element,
                        epoch: item.epoch,
                        position: item.position,
                    });
                }
            }
            if !to_load.is_empty() {
                self.loader.do_send(Load {
                    dataset: msg.dataset,
                    element: group.element,
                    source: source.clone(),
                    pipelines: to_load,
                });
            }
        }
        for end in ends {
            self.queue_end(end);
        }
        self.pump();
    }
}

impl Handler<Loaded> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: Loaded, ctx: &mut Context<Self>) {
        self.loaded(msg);
        self.wake(ctx);
    }
}

impl CacheActor {
    fn loaded(&mut self, msg: Loaded) {
        for (pipeline, result) in msg.results {
            let key = cache_key(msg.dataset, pipeline, msg.element);
            if !self.loading.contains_key(&key) {
                continue;
            }
            match result {
                Ok(prepared) => self
                    .waiting
                    .push_back((key, msg.element, msg.label, prepared)),
                Err(f) => {
                    tracing::debug!(element = msg.element, kind = %f.kind, message = %f.message, "element failed to load");
                    self.stats
                        .record_failure(msg.dataset, msg.element, &f.kind, &f.message);
                    self.fail(key, f.code);
                }
            }
        }
        self.drain_waiting();
        self.pump();
    }
}
