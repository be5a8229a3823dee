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
//! Split: this file holds the state, the poll and the handlers; `jobs.rs` opens and closes
//! a job's rings; `deliver.rs` queues a Sampler's deliveries; `acks.rs` takes the clients'
//! acknowledgements and gives credit; `liveness.rs` probes the clients and paces the polls;
//! `flow.rs` the loads, room and eviction under pressure; `rings.rs` what goes into the rings;
//! `invariants.rs` what debug builds check after each message.

mod acks;
mod deliver;
mod flow;
mod invariants;
mod jobs;
mod liveness;
mod preload;
mod rings;

#[cfg(test)]
pub(crate) use invariants::probe;

use crate::messages::CacheKey;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::stages::CACHE;
use actix::prelude::*;
use dataplane::{RingWriter, SlotRef, Writer};
use joader_core::invariants::Periodic;
use joader_stages as stages;
use roaring::RoaringBitmap;

use super::messages::*;
use super::stats::{CacheStats, JobStats};
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
    /// Pinned by its dataset's preload (`preload.rs`): used until the preload is released.
    pinned: bool,
}

impl SlotEntry {
    fn uses(&self) -> u32 {
        self.queued + self.pushed + u32::from(self.pinned)
    }
}

/// A key being read and prepared, or prepared and waiting for room.
#[derive(Debug, Clone, Copy, Default)]
struct Loading {
    /// Queued deliveries waiting for it.
    refs: u32,
    need: u32,
    /// Its dataset's preload pins it once stored (`preload.rs`).
    preload: bool,
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
enum RingRecord {
    Item {
        key: CacheKey,
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
    queue: VecDeque<RingRecord>,
    /// How many entries at the queue's front are known ready (cached, failed, or an end), at
    /// most one unit; `ready_items` of them are items.
    ready: usize,
    ready_items: usize,
    /// One flag per record pushed and not yet acknowledged: does it return credit?
    shadow: VecDeque<bool>,
    /// Data records pushed and not yet acknowledged: the slots the ring holds.
    pinned: u64,
    /// The unit at the queue's front was counted as waiting for room other jobs hold
    /// (`JobStats::waited_for_others`); cleared when a unit is pushed.
    waited: bool,
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
    subsets: Subsets,
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
    /// See [`OpenJob::own_positions`](crate::messages::OpenJob::own_positions).
    own_positions: bool,
}

/// A job's subset by epoch: it changes only when its dataset grows (`Deliver::grown`), from
/// the epoch the Sampler says on. Deliveries and ring records of an earlier epoch still
/// queued keep theirs.
struct Subsets(Vec<(u32, Arc<RoaringBitmap>)>);

impl Subsets {
    fn new(subset: Arc<RoaringBitmap>) -> Self {
        Subsets(vec![(0, subset)])
    }

    /// The job's subset in `epoch`.
    fn at(&self, epoch: u32) -> &Arc<RoaringBitmap> {
        &self
            .0
            .iter()
            .rev()
            .find(|(from, _)| *from <= epoch)
            .unwrap_or(&self.0[0])
            .1
    }

    /// The subset from `from` on.
    fn grow(&mut self, from: u32, subset: Arc<RoaringBitmap>) {
        self.0.retain(|(f, _)| *f < from);
        self.0.push((from, subset));
    }
}

/// See the module docs.
pub struct CacheActor {
    /// Shared with the Loader's threads (weakly), which write loaded elements into new slots
    /// while there is room to spare (`flow::keep_headroom`).
    writer: Option<Arc<Writer>>,
    /// The largest payload stored so far (bytes): the unit of the room kept free.
    largest_payload: u64,
    policy: Policy,
    slots: HashMap<CacheKey, SlotEntry>,
    by_slot: HashMap<u32, (SlotRef, CacheKey)>,
    loading: HashMap<CacheKey, Loading>,
    /// Who pays for a key's load in store bytes: the job whose miss issued it, and the epoch
    /// of that delivery (removed when the load ends, or with the job).
    charged: HashMap<CacheKey, (Arc<JobStats>, u64)>,
    pending: HashMap<CacheKey, Pending>,
    /// Pending keys in the order they were first needed (may hold keys no longer pending).
    pending_order: VecDeque<CacheKey>,
    failed: HashMap<CacheKey, (u32, u32)>,
    /// Prepared payloads waiting for room (their keys are in `loading`).
    waiting: HashMap<CacheKey, flow::Waiting>,
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
    /// The next poll, when it is due, and whether it was scheduled at the idle interval.
    next_poll: Option<(SpawnHandle, Instant, bool)>,
    /// The delay before the next busy poll (`liveness::pace_polls`).
    poll_delay: Duration,
    /// Messages (and polls) handled, and the full invariant checks run after them.
    checks: Periodic,
    /// The working sets being preloaded or pinned, by dataset (`preload.rs`).
    preloads: HashMap<DatasetId, preload::Run>,
    pins: preload::Pins,
}

impl CacheActor {
    pub fn new(
        writer: impl Into<Arc<Writer>>,
        cfg: &CacheConfig,
        loader: Recipient<Load>,
        stats: Arc<CacheStats>,
    ) -> Self {
        let writer: Arc<Writer> = writer.into();
        stats
            .slot_capacity
            .store(u64::from(writer.slot_count()), Relaxed);
        stats
            .capacity_bytes
            .store(writer.arena_stats().size, Relaxed);
        Self {
            writer: Some(writer),
            largest_payload: 0,
            policy: Policy::new(cfg.policy, 0x6a6f_6164),
            slots: HashMap::new(),
            by_slot: HashMap::new(),
            loading: HashMap::new(),
            charged: HashMap::new(),
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
            poll_delay: cfg.tick,
            checks: Periodic::default(),
            preloads: HashMap::new(),
            pins: preload::Pins::default(),
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

    /// Polls acknowledgements and client liveness of every ring, then loads and pushes what
    /// they let in. Returns whether it found anything: acknowledgements, a client gone or
    /// done, or records pushed (`liveness::pace_polls` backs off while polls find nothing).
    fn poll(&mut self) -> bool {
        let clock = self.poll_clock();
        let mut polled = Polled::default();
        let mut found = false;
        for (&id, job) in &mut self.jobs {
            let credit = job.poll_rings(id, clock, &mut polled);
            found |= credit > 0;
            // New rates reorder the needs: waiting payloads may now find room.
            self.room_changed |= job.measure_rate(clock.now);
            // Credit only once every rank reads: an unattached job must not pin the cache.
            job.grant_on_attach(id);
            job.return_credit(id, credit);
        }
        found |= !polled.released.is_empty() || !polled.gone.is_empty() || !polled.done.is_empty();
        self.settle(polled);
        self.drain_waiting();
        self.keep_headroom();
        self.issue_loads();
        let pushed = self.pump();
        found || pushed
    }

    /// Applies what a poll found once every job is polled: acknowledged slots are released,
    /// then the jobs whose clients are gone, or done, are closed.
    fn settle(&mut self, polled: Polled) {
        for r in polled.released {
            self.release(r);
        }
        for (id, reason) in polled.gone {
            self.close_job(id, Some(reason));
        }
        for id in polled.done {
            self.close_job(id, None);
        }
    }
}

/// What a poll found that changes the cache once every job has been polled.
#[derive(Default)]
struct Polled {
    /// Slots of acknowledged records.
    released: Vec<SlotRef>,
    /// Jobs whose client broke the protocol, died or left early, with why.
    gone: Vec<(JobId, String)>,
    /// Jobs every rank's client read to the end and left.
    done: Vec<JobId>,
}

impl CacheJob {
    /// Polls each of the job's rings (its acknowledgements, a stall, its client's liveness)
    /// and notes what the probes found; returns the credit the acknowledgements return.
    fn poll_rings(&mut self, id: JobId, clock: liveness::PollClock, polled: &mut Polled) -> u32 {
        let mut credit = 0u32;
        let mut alive = false;
        // Rings whose client read to the end and left (the job ends when every one has).
        let mut finished = 0;
        for rr in &mut self.rings {
            match rr.take_acks() {
                Ok((released, c)) => {
                    polled.released.extend(released);
                    credit += c;
                }
                Err(e) => {
                    polled
                        .gone
                        .push((id, format!("client broke the ring protocol: {e}")));
                    continue;
                }
            }
            rr.count_stall(&self.stats, clock.interval);
            if !clock.probe {
                alive |= rr.alive;
                continue;
            }
            match rr.probe(&self.stats) {
                liveness::Probe::Alive => alive = true,
                liveness::Probe::Gone(reason) => polled.gone.push((id, reason.into())),
                liveness::Probe::Finished => finished += 1,
                liveness::Probe::Waiting => {}
            }
        }
        self.note_liveness(id, clock.probe, alive, finished, polled);
        credit
    }
}

impl Actor for CacheActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.schedule_poll(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let _cpu = stages::enter(&CACHE);
        self.shutdown();
    }
}

impl Handler<OpenJob> for CacheActor {
    type Result = Result<Vec<RingInfo>, OpenJobError>;
    fn handle(&mut self, msg: OpenJob, ctx: &mut Context<Self>) -> Self::Result {
        let _cpu = stages::enter(&CACHE);
        let opened = self.open_job(msg);
        self.hurry(ctx);
        self.after_message();
        opened
    }
}

impl Handler<CloseJob> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: CloseJob, ctx: &mut Context<Self>) {
        let _cpu = stages::enter(&CACHE);
        self.close_job(msg.job, None);
        // What the job held may let another job's payload in.
        self.drain_waiting();
        self.issue_loads();
        self.pump();
        self.wake(ctx);
        self.after_message();
    }
}

impl Handler<Shutdown> for CacheActor {
    type Result = ();
    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) {
        let _cpu = stages::enter(&CACHE);
        self.shutdown();
        self.after_message();
    }
}

impl Handler<Preload> for CacheActor {
    type Result = Result<u64, PreloadError>;
    fn handle(&mut self, msg: Preload, ctx: &mut Context<Self>) -> Self::Result {
        let _cpu = stages::enter(&CACHE);
        let started = self.preload(msg);
        self.wake(ctx);
        self.after_message();
        started
    }
}

impl Handler<Unpreload> for CacheActor {
    type Result = bool;
    fn handle(&mut self, msg: Unpreload, ctx: &mut Context<Self>) -> bool {
        let _cpu = stages::enter(&CACHE);
        let had = self.unpreload(msg.dataset);
        // What it pinned may let a waiting payload in.
        self.unblock_preloads();
        self.drain_waiting();
        self.issue_loads();
        self.pump();
        self.wake(ctx);
        self.after_message();
        had
    }
}

impl Handler<Deliver> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: Deliver, ctx: &mut Context<Self>) {
        let _cpu = stages::enter(&CACHE);
        // Loads start and cached units are pushed by `deliver` itself, not at the next poll.
        self.deliver(msg);
        self.wake(ctx);
        self.after_message();
    }
}

impl Handler<Loaded> for CacheActor {
    type Result = ();
    fn handle(&mut self, msg: Loaded, ctx: &mut Context<Self>) {
        let _cpu = stages::enter(&CACHE);
        // Stored, the freed load place used and units pushed by `loaded` itself.
        self.loaded(msg);
        self.wake(ctx);
        self.after_message();
    }
}
