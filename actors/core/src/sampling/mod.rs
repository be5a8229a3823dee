//! Samplers: who gets which element in each round.
//!
//! A sampler holds, for every registered job, its dataset `D` (a set of `u32` element ids) and
//! its remaining set `R` (the elements it has not received yet in its current epoch). A
//! *round* samples one element for each *active* job (the mask: a job without free credit is
//! simply not active and holds nobody back). Every pick is uniform over the job's remaining
//! set, conditionally on everything that happened before, so each job's epoch is a uniform
//! random permutation of its dataset whatever the other jobs do. When `R` becomes empty the
//! job's epoch ends and, unless its epoch budget is spent, the next epoch starts with `R = D`.
//!
//! Two implementations share the [`Sampler`] trait:
//! - [`DependentSamplingTree`]: DSA (seed 001 §3, appendix Algorithm 1 and 2) on the dependent
//!   sampling tree, so that concurrent jobs pick the same element as often as possible;
//! - [`IndependentSampler`]: ISA, every job shuffles on its own (the opt-out and the baseline).

#[cfg(test)]
mod grow_tests;
mod independent;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
mod tree;

pub use independent::IndependentSampler;
pub use tree::DependentSamplingTree;

use roaring::RoaringBitmap;

/// An element of a base dataset (an image, a record): its dense integer id.
pub type ElementId = u32;

/// The caller's identifier of a job (or of one rank of a multi-rank job).
pub type JobKey = u64;

/// One job received one element in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub job: JobKey,
    pub element: ElementId,
    /// The job's epoch this element belongs to (0-based).
    pub epoch: u32,
    /// Position of the element in the job's epoch order (0-based).
    pub position: u32,
}

/// What happened to a job's epochs during a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvent {
    /// The job received the last element of `epoch`.
    EpochEnded { job: JobKey, epoch: u32 },
    /// The job's epoch budget is spent: it has been removed from the sampler.
    Finished { job: JobKey },
}

/// The output of one round: deliveries grouped by element, so that one load serves every job
/// that received the same element.
#[derive(Debug, Default, Clone)]
pub struct Round {
    /// Deliveries, grouped: all deliveries of one element are adjacent.
    pub deliveries: Vec<Delivery>,
    /// `groups[g]` is the range of `deliveries` that share one element.
    pub groups: Vec<std::ops::Range<usize>>,
    pub events: Vec<JobEvent>,
}

impl Round {
    pub fn clear(&mut self) {
        self.deliveries.clear();
        self.groups.clear();
        self.events.clear();
    }

    /// The distinct elements picked in this round, each with the deliveries that share it.
    pub fn picks(&self) -> impl Iterator<Item = (ElementId, &[Delivery])> + '_ {
        self.groups.iter().map(|g| {
            let d = &self.deliveries[g.clone()];
            (d[0].element, d)
        })
    }

    /// Appends one delivery per `(job, epoch, position)` of a shared element, merging it into an
    /// existing group when another job of this round already received the same element.
    pub(crate) fn push_group(
        &mut self,
        element: ElementId,
        jobs: impl Iterator<Item = (JobKey, u32, u32)>,
    ) {
        if let Some(gi) = self
            .groups
            .iter()
            .position(|g| self.deliveries[g.start].element == element)
        {
            // Coincidence across groups: keep deliveries of one element adjacent.
            let mut extra: Vec<Delivery> = jobs
                .map(|(job, epoch, position)| Delivery {
                    job,
                    element,
                    epoch,
                    position,
                })
                .collect();
            let end = self.groups[gi].end;
            let added = extra.len();
            self.deliveries.splice(end..end, extra.drain(..));
            self.groups[gi].end += added;
            for g in &mut self.groups[gi + 1..] {
                g.start += added;
                g.end += added;
            }
            return;
        }
        let start = self.deliveries.len();
        self.deliveries
            .extend(jobs.map(|(job, epoch, position)| Delivery {
                job,
                element,
                epoch,
                position,
            }));
        self.groups.push(start..self.deliveries.len());
    }
}

/// Errors of the samplers: all are caller mistakes, reported instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    #[error("job {0} is already registered")]
    DuplicateJob(JobKey),
    #[error("job {0} is not registered")]
    UnknownJob(JobKey),
    #[error("job {0} has an empty dataset")]
    EmptyDataset(JobKey),
    #[error("job {0} asked for zero epochs")]
    ZeroEpochs(JobKey),
    /// A resumed job's epoch is beyond its budget, or its remaining set is empty or not
    /// within its dataset; or a replayed order repeats an element.
    #[error("job {0} cannot start there: {1}")]
    BadStart(JobKey, &'static str),
    /// A replayed job follows its recorded order: its dataset cannot grow.
    #[error("job {0} replays a recorded order: its dataset does not grow")]
    FixedOrder(JobKey),
}

/// Checks where a job resumes (see [`Sampler::resume_job`]).
pub(crate) fn check_resume(
    spec: &JobSpec,
    epoch: u32,
    remaining: &RoaringBitmap,
) -> Result<(), SamplerError> {
    if spec.epochs.is_some_and(|e| epoch >= e) {
        return Err(SamplerError::BadStart(
            spec.key,
            "the epoch is past the job's epochs",
        ));
    }
    if remaining.is_empty() {
        return Err(SamplerError::BadStart(
            spec.key,
            "nothing remains of the epoch",
        ));
    }
    if !remaining.is_subset(&spec.dataset) {
        return Err(SamplerError::BadStart(
            spec.key,
            "the remaining set is not within the dataset",
        ));
    }
    Ok(())
}

/// How a job is registered with a sampler.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub key: JobKey,
    pub dataset: RoaringBitmap,
    /// Seed of the job's randomness (see the module docs of each sampler for what it fixes).
    pub seed: u64,
    /// Number of epochs, or `None` for unlimited.
    pub epochs: Option<u32>,
}

/// The common interface of the samplers; the simulator and the Sampler actor use only this.
pub trait Sampler: Send {
    /// Registers a job; it starts its epoch 0 at the next round it is active in.
    fn add_job(&mut self, spec: JobSpec) -> Result<(), SamplerError> {
        let remaining = spec.dataset.clone();
        self.insert_job(spec, 0, remaining)
    }
    /// Registers a job in the middle of `epoch` (0-based) with what it still needs of that
    /// epoch: the rest of the epoch is a uniform random permutation of `remaining` (a non-empty
    /// part of the dataset; positions continue from the elements already delivered), and later
    /// epochs cover the whole dataset. `spec.epochs` counts from epoch 0, so the job's budget
    /// ends as if it had never stopped.
    fn resume_job(
        &mut self,
        spec: JobSpec,
        epoch: u32,
        remaining: RoaringBitmap,
    ) -> Result<(), SamplerError> {
        check_resume(&spec, epoch, &remaining)?;
        self.insert_job(spec, epoch, remaining)
    }
    /// What [`Sampler::add_job`] and [`Sampler::resume_job`] share: registers a job at `epoch`
    /// with `remaining` left of it, refusing a duplicate key, an empty dataset and zero epochs.
    /// It trusts the caller on the start itself (`remaining` a non-empty part of the dataset,
    /// `epoch` within the budget): call those two, which check it.
    fn insert_job(
        &mut self,
        spec: JobSpec,
        epoch: u32,
        remaining: RoaringBitmap,
    ) -> Result<(), SamplerError>;
    /// Grows the job's dataset by `added` (a dataset that was appended to) from its next
    /// epoch on: the epoch under way keeps its remaining set and its length, and every later
    /// epoch is a uniform random permutation of the grown dataset. Returns that next epoch, the
    /// first that covers `added`, and the job's dataset from then on (every growth since its
    /// epoch started included). Refused for a replayed job (its order is fixed).
    fn grow_job(
        &mut self,
        key: JobKey,
        added: &RoaringBitmap,
    ) -> Result<(u32, RoaringBitmap), SamplerError>;
    /// Removes a job at any point of its epoch.
    fn remove_job(&mut self, key: JobKey) -> Result<(), SamplerError>;
    /// Samples one element for each job of `active` (duplicates are ignored) into `out`
    /// (cleared first). Jobs that finish their last epoch are removed and reported.
    fn sample(&mut self, active: &[JobKey], out: &mut Round) -> Result<(), SamplerError>;
    /// The elements `key` still needs in its current epoch.
    fn remaining(&self, key: JobKey) -> Option<&RoaringBitmap>;
    /// The job's dataset.
    fn dataset(&self, key: JobKey) -> Option<&RoaringBitmap>;
    /// The job's current epoch (0-based).
    fn epoch(&self, key: JobKey) -> Option<u32>;
    /// The registered jobs.
    fn jobs(&self) -> Vec<JobKey>;
    /// How many registered jobs still need `element` in their current epoch (RefCnt's count).
    fn need_count(&self, element: ElementId) -> u32;
    /// Checks the sampler's internal invariants against their definitions; returns the first
    /// that fails. Linear in the size of the data: the tests call it after every step, and
    /// the Sampler actor in debug builds every so often (see [`crate::invariants`]).
    fn check_invariants(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Which sampler a job or a simulation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    /// Dependent sampling (correlated across jobs).
    Dsa,
    /// Independent sampling: every job shuffles on its own.
    #[serde(alias = "independent")]
    Isa,
}

impl SamplerKind {
    pub fn build(self) -> Box<dyn Sampler> {
        match self {
            SamplerKind::Dsa => Box::new(DependentSamplingTree::new()),
            SamplerKind::Isa => Box::new(IndependentSampler::new()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Dsa => "dsa",
            SamplerKind::Isa => "isa",
        }
    }
}

impl std::str::FromStr for SamplerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dsa" | "dependent" => Ok(SamplerKind::Dsa),
            "isa" | "independent" => Ok(SamplerKind::Isa),
            other => Err(format!(
                "unknown sampler '{other}' (expected 'dsa' or 'isa')"
            )),
        }
    }
}

/// Draws an element uniformly at random from `set` (of known length `len > 0`).
///
/// Rejection sampling over the id span first: a uniform id in `min..=max` that lies in the set
/// is a uniform element of the set, and for the usual dense sets that takes a few membership
/// tests. After a few misses (a sparse set) it falls back to `select` of a uniform rank, which
/// is exact too but scans the container's words. Both branches are uniform over elements (not
/// over roaring containers, the original prototype's bias).
pub(crate) fn uniform_element(
    set: &RoaringBitmap,
    len: u64,
    rng: &mut impl rand::RngExt,
) -> ElementId {
    debug_assert_eq!(set.len(), len);
    let (lo, hi) = (
        set.min().expect("non-empty set"),
        set.max().expect("non-empty set"),
    );
    let span = u64::from(hi - lo) + 1;
    if span <= len * 4 {
        for _ in 0..12 {
            let id = lo + rng.random_range(0..span) as u32;
            if set.contains(id) {
                return id;
            }
        }
    }
    set.select(rng.random_range(0..len) as u32)
        .expect("rank below the set size")
}

/// A cheap hasher for job keys (they are already well spread or small integers).
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix64(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = mix64(v);
    }
}

pub(crate) type KeyMap<V> =
    std::collections::HashMap<JobKey, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Mixes a seed into 64 well-spread bits (splitmix64's finaliser).
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
