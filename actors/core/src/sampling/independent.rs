//! ISA: every job shuffles on its own (PyTorch's default behaviour), the baseline of the
//! simulator and the opt-out for users who need uncorrelated jobs.
//!
//! Each job has its own random stream seeded from its seed alone, so a job's order depends
//! only on its seed and its dataset, whatever the other jobs do. A job added with
//! [`IndependentSampler::add_replay_job`] follows a given order instead, every epoch (the
//! replay of a recorded epoch).

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use roaring::RoaringBitmap;

use super::{
    ElementId, JobEvent, JobKey, JobSpec, KeyMap, Round, Sampler, SamplerError, mix64,
    uniform_element,
};

#[derive(Debug, Clone)]
struct Job {
    dataset: RoaringBitmap,
    remaining: RoaringBitmap,
    epoch: u32,
    epochs: Option<u32>,
    rng: Xoshiro256PlusPlus,
    /// A replayed job's order (a permutation of its dataset), followed every epoch.
    order: Option<std::sync::Arc<[ElementId]>>,
    /// What joins `dataset` when the job's next epoch starts ([`Sampler::grow_job`]).
    grown: RoaringBitmap,
}

/// Independent sampling; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct IndependentSampler {
    jobs: KeyMap<Job>,
    order: Vec<JobKey>,
    scratch: Vec<JobKey>,
}

impl IndependentSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a job that receives exactly `order` every epoch (its dataset is the set of
    /// `order`, which must hold each id once).
    pub fn add_replay_job(
        &mut self,
        key: JobKey,
        order: std::sync::Arc<[ElementId]>,
        epochs: Option<u32>,
    ) -> Result<(), SamplerError> {
        let dataset: RoaringBitmap = order.iter().copied().collect();
        if dataset.len() != order.len() as u64 {
            return Err(SamplerError::BadStart(key, "the order repeats an element"));
        }
        let spec = JobSpec {
            key,
            dataset,
            seed: 0,
            epochs,
        };
        let remaining = spec.dataset.clone();
        self.insert_job(spec, 0, remaining)?;
        if let Some(j) = self.jobs.get_mut(&key) {
            j.order = Some(order);
        }
        Ok(())
    }
}

impl Sampler for IndependentSampler {
    fn insert_job(
        &mut self,
        spec: JobSpec,
        epoch: u32,
        remaining: RoaringBitmap,
    ) -> Result<(), SamplerError> {
        if self.jobs.contains_key(&spec.key) {
            return Err(SamplerError::DuplicateJob(spec.key));
        }
        if spec.dataset.is_empty() {
            return Err(SamplerError::EmptyDataset(spec.key));
        }
        if spec.epochs == Some(0) {
            return Err(SamplerError::ZeroEpochs(spec.key));
        }
        let job = Job {
            remaining,
            dataset: spec.dataset,
            epoch,
            epochs: spec.epochs,
            rng: Xoshiro256PlusPlus::seed_from_u64(mix64(spec.seed)),
            order: None,
            grown: RoaringBitmap::new(),
        };
        self.jobs.insert(spec.key, job);
        self.order.push(spec.key);
        Ok(())
    }

    fn remove_job(&mut self, key: JobKey) -> Result<(), SamplerError> {
        self.jobs
            .remove(&key)
            .ok_or(SamplerError::UnknownJob(key))?;
        self.order.retain(|&k| k != key);
        Ok(())
    }

    fn grow_job(
        &mut self,
        key: JobKey,
        added: &RoaringBitmap,
    ) -> Result<(u32, RoaringBitmap), SamplerError> {
        let job = self
            .jobs
            .get_mut(&key)
            .ok_or(SamplerError::UnknownJob(key))?;
        if job.order.is_some() {
            return Err(SamplerError::FixedOrder(key));
        }
        job.grown |= added - &job.dataset;
        Ok((job.epoch + 1, &job.dataset | &job.grown))
    }

    fn sample(&mut self, active: &[JobKey], out: &mut Round) -> Result<(), SamplerError> {
        out.clear();
        if let Some(&unknown) = active.iter().find(|k| !self.jobs.contains_key(k)) {
            return Err(SamplerError::UnknownJob(unknown));
        }
        let mut keys = std::mem::take(&mut self.scratch);
        keys.clear();
        keys.extend_from_slice(active);
        keys.sort_unstable();
        keys.dedup();
        for &key in &keys {
            let job = self.jobs.get_mut(&key).expect("checked above");
            let len = job.remaining.len();
            let position = (job.dataset.len() - len) as u32;
            let element = match &job.order {
                Some(order) => order[position as usize],
                None => uniform_element(&job.remaining, len, &mut job.rng),
            };
            job.remaining.remove(element);
            out.push_group(element, std::iter::once((key, job.epoch, position)));
            if len == 1 {
                out.events.push(JobEvent::EpochEnded {
                    job: key,
                    epoch: job.epoch,
                });
                if job.epochs.is_some_and(|e| job.epoch + 1 >= e) {
                    out.events.push(JobEvent::Finished { job: key });
                    self.jobs.remove(&key);
                    self.order.retain(|&k| k != key);
                } else {
                    job.epoch += 1;
                    job.dataset |= std::mem::take(&mut job.grown);
                    job.remaining = job.dataset.clone();
                }
            }
        }
        self.scratch = keys;
        Ok(())
    }

    fn remaining(&self, key: JobKey) -> Option<&RoaringBitmap> {
        self.jobs.get(&key).map(|j| &j.remaining)
    }

    fn dataset(&self, key: JobKey) -> Option<&RoaringBitmap> {
        self.jobs.get(&key).map(|j| &j.dataset)
    }

    fn epoch(&self, key: JobKey) -> Option<u32> {
        self.jobs.get(&key).map(|j| j.epoch)
    }

    fn jobs(&self) -> Vec<JobKey> {
        self.order.clone()
    }

    fn need_count(&self, element: ElementId) -> u32 {
        self.jobs
            .values()
            .filter(|j| j.remaining.contains(element))
            .count() as u32
    }

    /// Every registered job is listed once in `order`; its remaining set is a non-empty part
    /// of its dataset (an emptied one has started its next epoch or left); a replayed job's
    /// order is a permutation of its dataset.
    fn check_invariants(&self) -> Result<(), String> {
        let listed: std::collections::HashSet<&JobKey> = self.order.iter().collect();
        if listed.len() != self.order.len()
            || listed.len() != self.jobs.len()
            || self.jobs.keys().any(|k| !listed.contains(k))
        {
            return Err(format!(
                "order lists {:?} for {} jobs",
                self.order,
                self.jobs.len()
            ));
        }
        for (key, j) in &self.jobs {
            if j.remaining.is_empty() {
                return Err(format!("job {key} has an empty remaining set"));
            }
            if !j.remaining.is_subset(&j.dataset) {
                return Err(format!(
                    "job {key}'s remaining set is not within its dataset"
                ));
            }
            if j.epochs.is_some_and(|e| j.epoch >= e) {
                return Err(format!("job {key} is past its last epoch"));
            }
            if let Some(order) = &j.order
                && (order.len() as u64 != j.dataset.len()
                    || order.iter().any(|&e| !j.dataset.contains(e)))
            {
                return Err(format!("job {key}'s replayed order is not its dataset"));
            }
        }
        Ok(())
    }
}
