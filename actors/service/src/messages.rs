//! Messages between the actors, and the two seams through which the server plugs storage and
//! the shared pipeline into them ([`ElementSource`], [`Prepare`]).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use roaring::RoaringBitmap;

use super::stats::JobStats;
use joader_core::sampling::{JobKey, SamplerError, SamplerKind};

pub type DatasetId = u16;
pub type PipelineId = u16;
pub type JobId = JobKey;

impl std::fmt::LowerHex for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// The Cache's key of an element of a base dataset prepared by one pipeline: what one slot
/// holds (the dataset in the top 16 bits, the pipeline in the next 16, the element below).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey(u64);

impl CacheKey {
    pub fn new(dataset: DatasetId, pipeline: PipelineId, element: u32) -> CacheKey {
        CacheKey((u64::from(dataset) << 48) | (u64::from(pipeline) << 32) | u64::from(element))
    }

    /// The key as the cache policy (`joader_core::cache`) holds it: an opaque `u64`.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The key of a policy's `u64` (one [`CacheKey::raw`] gave it).
    pub fn from_raw(raw: u64) -> CacheKey {
        CacheKey(raw)
    }

    /// (dataset, pipeline, element).
    pub fn parts(self) -> (DatasetId, PipelineId, u32) {
        (
            (self.0 >> 48) as u16,
            ((self.0 >> 32) & 0xffff) as u16,
            self.0 as u32,
        )
    }
}

/// Why an element could not be prepared; `code` is a dataplane element error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub code: u32,
    /// Machine-readable kind (`read_failed`, `corrupt_image`, …), for metrics and the API.
    pub kind: String,
    pub message: String,
}

/// A prepared element: its bytes, to be copied into a slot, or (`placed`) the slot a loader
/// thread already wrote it into (then `bytes` is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The payload, ending with the element's field block of `fields_len` bytes.
    pub bytes: Vec<u8>,
    pub format: dataplane::Format,
    pub placed: Option<dataplane::SlotRef>,
    /// The small fields' block that ends `bytes` (or the placed slot), 0 when none
    /// (`dataplane::fields`).
    pub fields_len: u32,
    /// The image's `(height, width)` before the pipeline resized it, `(0, 0)` when not
    /// decoded (`dataplane::SlotMeta::source`).
    pub source: (u32, u32),
}

impl Prepared {
    /// Bytes to be copied into a slot.
    pub fn bytes(bytes: Vec<u8>, format: dataplane::Format) -> Prepared {
        Prepared {
            bytes,
            format,
            placed: None,
            fields_len: 0,
            source: (0, 0),
        }
    }
}

/// Where a loader thread may write a prepared element straight into shared memory.
pub trait Place {
    /// Gives a new slot of `len` bytes for an element of `format` (decoded from an image of
    /// `source` `(height, width)`, `(0, 0)` when not decoded) to `fill`, and publishes it
    /// when `fill` succeeds (or frees it when it fails); `None` when there is no room to spare
    /// (the element then goes to the Cache as bytes, which makes room by its rules).
    fn place(
        &mut self,
        format: dataplane::Format,
        source: (u32, u32),
        len: u64,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), LoadFailure>,
    ) -> Option<Result<dataplane::SlotRef, LoadFailure>>;
}

/// Called once with an element's stored bytes, from the source's own fetch stage, and the
/// bytes an object store sent for them (0 when none did: a disk tier, a local read).
pub type Fetched = Box<dyn FnOnce(Result<Vec<u8>, LoadFailure>, u64) + Send>;

/// Reads the stored bytes of an element of one base dataset.
pub trait ElementSource: Send + Sync {
    fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure>;
    fn label(&self, element: u32) -> i64;

    /// Splits what [`ElementSource::read`] (or `fetch`) gave into the image's stored bytes
    /// and the block of the element's small fields (`dataplane::fields`; empty when the
    /// dataset declares none), checking each field: a missing or malformed one is the
    /// element's failure. By default, the bytes are the image and there is no field.
    fn split(&self, element: u32, stored: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>), LoadFailure> {
        let _ = element;
        Ok((stored, Vec::new()))
    }

    /// The source's own fetch stage, for a source that fetches (an object store's).
    fn fetching(&self) -> Option<&dyn Fetch> {
        None
    }

    /// What the source keeps of its jobs' needs, for a source that keeps it (a remote
    /// source's disk tier, whose admission asks it).
    fn demand(&self) -> Option<&dyn Demand> {
        None
    }

    /// The source's local-disk keeping of elements' stored bytes (an object store's disk
    /// tier), for a preload kept on disk; `None`: it keeps nothing on disk.
    fn disk(&self) -> Option<&dyn DiskKeep> {
        None
    }
}

/// An element source's fetch stage: its reads on the network, and its bytes fetched ahead.
pub trait Fetch: Send + Sync {
    /// True when reads wait on the network: the Loader then asks [`Fetch::fetch`] instead of
    /// reading on a decode thread, so that a slow request never holds one.
    fn is_remote(&self) -> bool {
        true
    }

    /// Starts reading `element` in the source's own fetch stage; `done` gets the bytes. Only
    /// called when [`Fetch::is_remote`].
    fn fetch(&self, element: u32, done: Fetched);

    /// How long fetching an element takes now, for a source that fetches ahead (a remote
    /// source with a fetch-ahead buffer): the Sampler then samples its jobs that much further
    /// ahead and holds those picks back a while, and the Cache asks the source for their bytes
    /// meanwhile ([`Fetch::fetch_ahead`]; see `sampler::ahead`). `None`: no fetch-ahead.
    fn fetch_time(&self) -> Option<std::time::Duration> {
        None
    }

    /// Starts fetching `element`'s bytes for a load to come (only called when
    /// [`Fetch::fetch_time`] is `Some`, by the Cache, for an element it neither holds nor
    /// loads).
    fn fetch_ahead(&self, element: u32) {
        let _ = element;
    }
}

/// A source that keeps elements' stored bytes on local disk (an object store's disk tier): what
/// a preload kept on disk asks of it. What the tier keeps follows the source's [`Demand`]: a
/// preload's elements are pinned there by an epoch that never ends (its job is
/// [`DISK_PRELOAD_JOB`]) until the preload is released.
pub trait DiskKeep: Send + Sync {
    /// The most bytes the disk keeps.
    fn capacity(&self) -> u64;
    /// The bytes the disk's copy of `element` takes, when it holds it now.
    fn holds(&self, element: u32) -> Option<u64>;
    /// Waits until what was fetched so far is written to the disk (or refused).
    fn flush(&self);
}

/// The job id of a dataset's disk preload in its source's [`Demand`] (never a real job's: the
/// registry numbers jobs from 1).
pub const DISK_PRELOAD_JOB: JobId = JobId::MAX;

/// The Cache's news of its jobs, for a source that keeps what they still need.
pub trait Demand: Send + Sync {
    /// `job` starts an epoch needing `remaining` (its subset, or a resumed epoch's rest).
    fn epoch_started(&self, job: JobId, remaining: &RoaringBitmap);

    /// `job` was handed `element` in its current epoch (queued for its ring).
    fn delivered(&self, job: JobId, element: u32);

    /// `job` closed.
    fn job_closed(&self, job: JobId);
}

/// The shared, deterministic part of the preparation (decode, resize, crop).
pub trait Prepare: Send + Sync {
    fn prepare(&self, bytes: &[u8]) -> Result<Prepared, LoadFailure>;
    /// [`Prepare::prepare`], writing the output straight into a slot that `place` gives when
    /// it has room (which saves a copy of every decoded image); by default, as bytes.
    fn prepare_placed(&self, bytes: &[u8], place: &mut dyn Place) -> Result<Prepared, LoadFailure> {
        let _ = place;
        self.prepare(bytes)
    }
    /// Whether this pipeline decodes (counted as a decode in metrics).
    fn decodes(&self) -> bool;
}

/// One job's share of a sampled element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliverItem {
    pub job: JobId,
    pub epoch: u32,
    pub position: u32,
}

/// An element sampled in a round, with every job that received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverGroup {
    pub element: u32,
    /// Jobs that still need the element in their current epoch, after this round (RefCnt).
    pub need: u32,
    pub items: Vec<DeliverItem>,
}

/// Sampler → Cache: the rounds of one pass, in order.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Deliver {
    pub dataset: DatasetId,
    pub groups: Vec<DeliverGroup>,
    /// Epochs and jobs that ended during the pass, each placed after the group that ended it.
    pub ends: Vec<EndAt>,
    /// Picks `(element, job)` the Sampler holds back for a while (a dataset read from an
    /// object store): the Cache asks the source for their bytes ahead
    /// ([`Fetch::fetch_ahead`]) unless the element is cached, loading or pending.
    pub ahead: Vec<(u32, JobId)>,
    /// Jobs whose dataset grew (`GrowJob`), from the epoch given on: the Cache takes their
    /// subsets before the pass's deliveries.
    pub grown: Vec<Grown>,
}

/// A job's subset from an epoch on (see [`Deliver::grown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grown {
    pub job: JobId,
    pub from_epoch: u32,
    pub subset: Arc<RoaringBitmap>,
}

/// An end of epoch (or of a job) that happens after `groups[..after]` of a [`Deliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndAt {
    pub after: usize,
    pub job: JobId,
    pub epoch: u32,
    /// The job's last epoch ended: nothing follows.
    pub finished: bool,
}

/// Cache → Loader: read an element once and run every pipeline that needs it.
#[derive(Clone, Message)]
#[rtype(result = "()")]
pub struct Load {
    pub dataset: DatasetId,
    pub element: u32,
    pub source: Arc<dyn ElementSource>,
    pub pipelines: Vec<(PipelineId, Arc<dyn Prepare>)>,
}

impl std::fmt::Debug for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Load")
            .field("dataset", &self.dataset)
            .field("element", &self.element)
            .finish()
    }
}

/// Loader → Cache.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Loaded {
    pub dataset: DatasetId,
    pub element: u32,
    pub label: i64,
    pub results: Vec<(PipelineId, Result<Prepared, LoadFailure>)>,
    pub bytes_read: u64,
    /// Bytes an object store sent for this load (0 for local sources and disk tier hits).
    pub store_bytes: u64,
    pub busy: Duration,
}

/// Cache → Sampler: news about a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub enum JobSignal {
    /// The client acknowledged `n` deliveries: the job may receive `n` more.
    Credit { job: JobId, n: u32 },
    /// The job's client is gone or broke the protocol: stop sampling for it.
    Gone { job: JobId },
}

/// Control → Sampler: register a job.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), SamplerError>")]
pub struct AddJob {
    pub job: JobId,
    pub subset: Arc<RoaringBitmap>,
    pub seed: u64,
    pub epochs: Option<u32>,
    pub sampler: SamplerKind,
    /// Deliveries the job may have outstanding from the start. Jobs the Cache serves start at
    /// 0: the Cache grants their rings' capacity when every rank's client has attached.
    pub credit: u32,
    /// Deliveries of one step of the job: its batch size times its ranks. The Sampler derives
    /// the job's lookahead from it (`sampler::pace::lookahead`). 0 for a job that must not be
    /// sampled ahead of its credit (a multi-node job's placement: its credit is what the
    /// nodes' rings can take).
    pub step: u32,
    pub stats: Arc<JobStats>,
    /// Resume the job in the middle of an epoch: `(epoch, remaining set)` (see
    /// `Sampler::resume_job`); `None` starts at epoch 0 with the whole subset.
    pub resume: Option<(u32, Arc<RoaringBitmap>)>,
    /// Replay: the job receives exactly this order (a permutation of `subset`) every epoch,
    /// sampled on its own (`IndependentSampler::add_replay_job`); `sampler` is then ignored.
    pub replay: Option<Arc<[u32]>>,
    /// Record: every delivery `(epoch, position, element)` of the job, in sampled order, is
    /// sent here after each pass (dropped, and counted in `JobStats::record_dropped`, when
    /// the recorder lags this channel's bound).
    pub record: Option<std::sync::mpsc::SyncSender<Vec<[u32; 3]>>>,
}

/// Control → Sampler: the job's dataset grew by `added` (an append). The job covers it from
/// the next epoch the Sampler starts for it (the epoch under way, sampled ahead or not, keeps
/// its elements), which it answers; the Cache learns the job's subset from then on in a
/// [`Deliver::grown`].
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<u32, SamplerError>")]
pub struct GrowJob {
    pub job: JobId,
    pub added: Arc<RoaringBitmap>,
}

/// Control → Sampler: forget a job.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct RemoveJob {
    pub job: JobId,
}

/// Control → Sampler: sample now, for every job that has credit, instead of waiting for the
/// next tick; answers once the pass's deliveries are sent downstream. Tests drive the sampler
/// with it (with a tick too long to fire), so that which jobs share a round is decided by the
/// test, not by timing.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Pass;

/// Why the Cache cannot open a job's rings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenJobError {
    #[error("the cache is shut down")]
    ShutDown,
    #[error("job {0} already has rings")]
    AlreadyOpen(JobId),
    #[error("ranks, ring capacity and batch must be positive, and a batch must fit its ring")]
    Empty,
    #[error("cannot create ring {ring}: {message}")]
    Ring { ring: String, message: String },
}

/// Description of one delivery ring, as the client needs it to open it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RingInfo {
    pub rank: u32,
    pub ring: String,
    pub segment: String,
    pub reader_index: u32,
    pub capacity: u32,
}

/// Control → Cache: create a job's rings.
#[derive(Clone, Message)]
#[rtype(result = "Result<Vec<RingInfo>, OpenJobError>")]
pub struct OpenJob {
    pub job: JobId,
    pub dataset: DatasetId,
    pub source: Arc<dyn ElementSource>,
    pub pipeline: PipelineId,
    pub prepare: Arc<dyn Prepare>,
    pub subset: Arc<RoaringBitmap>,
    /// Ring names are `<ring_prefix>-r<rank>`.
    pub ring_prefix: String,
    pub ranks: u32,
    pub capacity: u32,
    /// Records per batch of one rank: the Cache pushes whole batches (see the Cache's docs).
    pub batch: u32,
    pub stats: Arc<JobStats>,
    pub sampler: Recipient<JobSignal>,
    /// A job resumed mid-epoch: what remains of its first epoch (its first delivery does
    /// not have position 0, and only these elements are needed once more by it).
    pub resume: Option<Arc<RoaringBitmap>>,
    /// The deliveries' positions are the job's own, `0..subset.len()` every epoch, rank
    /// `position mod ranks` (a job whose ranks are all here; not a multi-node job's node):
    /// the Cache then marks each rank's last record of an epoch as it pushes it.
    pub own_positions: bool,
}

/// Control → Cache: preload a working set of a dataset (its `elements` prepared by
/// `pipeline`) and pin it until [`Unpreload`]. Its loads run only while no job's load waits,
/// on at most half the load places; what it pins (every preload together) is bounded by half
/// the cache's bytes and slots. Progress goes to `progress`. Answers the pin budget in bytes.
#[derive(Clone, Message)]
#[rtype(result = "Result<u64, PreloadError>")]
pub struct Preload {
    pub dataset: DatasetId,
    pub source: Arc<dyn ElementSource>,
    pub pipeline: PipelineId,
    pub prepare: Arc<dyn Prepare>,
    pub elements: Arc<RoaringBitmap>,
    /// The fewest bytes one element takes in the cache (1 when not known before decoding):
    /// a working set that cannot fit even so is refused at once.
    pub min_element_bytes: u64,
    pub progress: Arc<crate::stats::PreloadProgress>,
}

/// Why the Cache refuses a preload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreloadError {
    #[error("the cache is shut down")]
    ShutDown,
    #[error("the dataset has a preload already: delete it first")]
    Exists,
    #[error(
        "the working set of {elements} elements takes at least {needed} bytes in {elements} \
         slots, and pins may take {free_bytes} more bytes and {free_slots} more slots (half \
         the cache, less what other preloads pin): about {fit} elements fit"
    )]
    TooLarge {
        elements: u64,
        needed: u64,
        free_bytes: u64,
        free_slots: u64,
        fit: u64,
    },
}

/// Control → Cache: release a dataset's preload (its pins; what is cached stays cached, now
/// evictable); answers whether it had one.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "bool")]
pub struct Unpreload {
    pub dataset: DatasetId,
}

/// Control → Cache: drop a job's rings and release what it held.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct CloseJob {
    pub job: JobId,
}

/// Control → Cache: remove the shared-memory segments now (graceful shutdown).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Shutdown;
