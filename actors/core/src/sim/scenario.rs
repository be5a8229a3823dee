//! Simulation scenarios: datasets, jobs (start round, speed, epochs) and what to compare.

use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::index::sample;
use rand::{RngExt, SeedableRng};
use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};

use crate::cache::PolicyKind;
use crate::sampling::SamplerKind;

/// Largest element id a simulation accepts (its per-element counters are dense arrays).
pub const MAX_ELEMENT_ID: u32 = 1 << 27;

/// How a job's dataset is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DatasetSpec {
    /// Textual form: `range:A:B` (ids A..B, B excluded), `sample:A:B:K` (K distinct ids drawn
    /// uniformly from A..B, drawn again for every repetition) or `ids:1,2,3`.
    Text(String),
    /// An explicit list of ids.
    Ids(Vec<u32>),
}

impl DatasetSpec {
    /// Builds the dataset; `seed` only matters to `sample:`.
    pub fn build(&self, seed: u64) -> Result<RoaringBitmap, String> {
        let set: RoaringBitmap = match self {
            DatasetSpec::Ids(ids) => ids.iter().copied().collect(),
            DatasetSpec::Text(t) => {
                let parts: Vec<&str> = t.split(':').collect();
                let num = |s: &str| -> Result<u32, String> {
                    s.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("dataset '{t}': '{s}' is not a non-negative integer"))
                };
                match parts.as_slice() {
                    ["range", a, b] => {
                        let (a, b) = (num(a)?, num(b)?);
                        if a >= b {
                            return Err(format!(
                                "dataset '{t}': range start must be below its end"
                            ));
                        }
                        (a..b).collect()
                    }
                    ["sample", a, b, k] => {
                        let (a, b, k) = (num(a)?, num(b)?, num(k)?);
                        if a >= b || k > b - a {
                            return Err(format!(
                                "dataset '{t}': cannot draw {k} ids from {a}..{b}"
                            ));
                        }
                        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
                        sample(&mut rng, (b - a) as usize, k as usize)
                            .into_iter()
                            .map(|i| a + i as u32)
                            .collect()
                    }
                    ["ids", list] => list
                        .split(',')
                        .filter(|s| !s.trim().is_empty())
                        .map(num)
                        .collect::<Result<_, _>>()?,
                    _ => {
                        return Err(format!(
                            "dataset '{t}': expected range:A:B, sample:A:B:K or ids:1,2,3"
                        ));
                    }
                }
            }
        };
        if set.is_empty() {
            return Err(format!("dataset {self:?} is empty"));
        }
        if set.max().is_some_and(|m| m > MAX_ELEMENT_ID) {
            return Err(format!("dataset {self:?} has ids above {MAX_ELEMENT_ID}"));
        }
        Ok(set)
    }
}

fn one() -> f64 {
    1.0
}
fn one_u32() -> u32 {
    1
}

/// One simulated job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobScenario {
    pub dataset: DatasetSpec,
    /// Round at which the job registers and starts requesting.
    #[serde(default)]
    pub start: u64,
    /// Requests per round; fractional speeds request every few rounds.
    #[serde(default = "one")]
    pub speed: f64,
    #[serde(default = "one_u32")]
    pub epochs: u32,
}

impl JobScenario {
    /// Parses `DATASET[,start=R][,speed=S][,epochs=E]`, e.g. `range:0:10000,start=500,speed=0.5`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let first = parts.next().unwrap_or_default();
        let mut job = JobScenario {
            dataset: DatasetSpec::Text(first.to_string()),
            start: 0,
            speed: 1.0,
            epochs: 1,
        };
        let mut rest: Vec<&str> = parts.collect();
        // `ids:1,2,3` contains commas: glue back the bare numbers.
        if first.starts_with("ids:") {
            let n = rest.iter().take_while(|p| !p.contains('=')).count();
            let mut ids = first.to_string();
            for p in rest.drain(..n) {
                ids.push(',');
                ids.push_str(p);
            }
            job.dataset = DatasetSpec::Text(ids);
        }
        for kv in rest {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("job '{s}': expected key=value, got '{kv}'"))?;
            let bad = || format!("job '{s}': bad value for {k}: '{v}'");
            match k.trim() {
                "start" => job.start = v.trim().parse().map_err(|_| bad())?,
                "speed" => job.speed = v.trim().parse().map_err(|_| bad())?,
                "epochs" => job.epochs = v.trim().parse().map_err(|_| bad())?,
                other => {
                    return Err(format!(
                        "job '{s}': unknown key '{other}' (start, speed, epochs)"
                    ));
                }
            }
        }
        Ok(job)
    }
}

fn default_samplers() -> Vec<SamplerKind> {
    vec![SamplerKind::Dsa, SamplerKind::Isa]
}
fn default_policies() -> Vec<PolicyKind> {
    vec![PolicyKind::RefCnt]
}
fn default_cache_sizes() -> Vec<usize> {
    vec![1, 100, 1000, 10000]
}
fn default_lookahead() -> u64 {
    64
}

/// A whole simulation: the jobs and the grid of samplers × policies × cache sizes to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A label for reports.
    #[serde(default)]
    pub name: String,
    pub jobs: Vec<JobScenario>,
    #[serde(default = "default_samplers")]
    pub samplers: Vec<SamplerKind>,
    #[serde(default = "default_policies")]
    pub policies: Vec<PolicyKind>,
    /// Cache capacities, in elements.
    #[serde(default = "default_cache_sizes")]
    pub cache_sizes: Vec<usize>,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "one_u32")]
    pub repetitions: u32,
    /// Rounds the clairvoyant policy sees ahead.
    #[serde(default = "default_lookahead")]
    pub lookahead: u64,
}

impl Scenario {
    pub fn validate(&self) -> Result<(), String> {
        if self.jobs.is_empty() {
            return Err("a scenario needs at least one job".into());
        }
        for (i, j) in self.jobs.iter().enumerate() {
            if !(j.speed.is_finite() && j.speed > 0.0) {
                return Err(format!(
                    "job {i}: speed must be a positive number, got {}",
                    j.speed
                ));
            }
            if j.epochs == 0 {
                return Err(format!("job {i}: epochs must be at least 1"));
            }
            j.dataset.build(0)?;
        }
        if self.samplers.is_empty() || self.policies.is_empty() || self.cache_sizes.is_empty() {
            return Err("samplers, policies and cache sizes must not be empty".into());
        }
        if self.repetitions == 0 {
            return Err("repetitions must be at least 1".into());
        }
        Ok(())
    }

    /// The datasets of one repetition (only `sample:` datasets differ between repetitions).
    pub fn datasets(&self, rep: u32) -> Result<Vec<RoaringBitmap>, String> {
        self.jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(
                    self.seed ^ (u64::from(rep) << 32) ^ i as u64,
                );
                j.dataset.build(rng.random())
            })
            .collect()
    }
}
