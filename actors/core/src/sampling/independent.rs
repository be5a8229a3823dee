//! ISA: every job shuffles on its own (PyTorch's default behaviour), the baseline of the
//! simulator and the opt-out for users who need uncorrelated jobs.
//!
//! Each job has its own random stream seeded from its seed alone, so a job's order depends
//! only on its seed and its dataset, whatever the other jobs do.

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
}

impl Sampler for IndependentSampler {
    fn add_job(&mut self, spec: JobSpec) -> Result<(), SamplerError> {
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
            remaining: spec.dataset.clone(),
            dataset: spec.dataset,
            epoch: 0,
            epochs: spec.epochs,
            rng: Xoshiro256PlusPlus::seed_from_u64(mix64(spec.seed)),
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
            let element = uniform_element(&job.remaining, len, &mut job.rng);
            let position = (job.dataset.len() - len) as u32;
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
}
