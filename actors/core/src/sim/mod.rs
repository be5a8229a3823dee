//! The cache simulator behind `joader simulate`: drives a [`Sampler`] and a cache [`Policy`]
//! through a scenario and counts misses.
//!
//! # Semantics
//! Time advances in *rounds*. A job registers with the sampler at its `start` round; from then
//! on it earns `speed` credits per round. Within a round the simulator samples sub-rounds: each
//! sub-round, every job holding at least one credit is active, spends one credit and receives
//! one element (jobs without credit are masked and hold nobody back). A job leaves when it has
//! finished its epochs; the simulation ends when every job has.
//!
//! Accesses are served in the order they were sampled. The first access to an element that is
//! not cached is a *miss* and inserts it (evicting a victim chosen by the policy when the
//! cache is full); any later access while it stays cached is a hit, including the other jobs
//! of a shared pick. With `n` jobs, misses lie between `|D_1 ∪ … ∪ D_n|` (every element loaded
//! once) and `Σ |D_i|` (no sharing at all), per epoch.
//!
//! Sampling does not depend on the cache, so one trace per sampler and repetition is replayed
//! against every policy and cache size; the clairvoyant policy sees the trace `lookahead`
//! sub-rounds ahead, which is exactly what a sampler deciding that many rounds early would
//! tell the cache, and it changes no job's order.

mod scenario;

use std::collections::HashMap;
use std::io::Write;

use roaring::RoaringBitmap;
use serde::Serialize;

pub use scenario::{DatasetSpec, JobScenario, MAX_ELEMENT_ID, Scenario};

use crate::cache::{Policy, PolicyKind};
use crate::sampling::{JobEvent, JobSpec, Round, SamplerKind, mix64};

/// One access of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub job: u32,
    pub element: u32,
    pub epoch: u32,
}

/// The accesses of a whole run, sub-round by sub-round.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub accesses: Vec<Access>,
    /// `accesses[starts[r]..starts[r + 1]]` is sub-round `r`.
    pub starts: Vec<usize>,
    pub datasets: Vec<RoaringBitmap>,
}

impl Trace {
    pub fn sub_rounds(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Writes each job's delivered order as JSON lines `{"job","epoch","ids"}` (plus the labels
    /// given in `extra`).
    pub fn write_orders(
        &self,
        extra: &serde_json::Map<String, serde_json::Value>,
        mut w: impl Write,
    ) -> std::io::Result<()> {
        let mut orders: std::collections::BTreeMap<(u32, u32), Vec<u32>> =
            std::collections::BTreeMap::new();
        for a in &self.accesses {
            orders.entry((a.job, a.epoch)).or_default().push(a.element);
        }
        for ((job, epoch), ids) in orders {
            let mut obj = extra.clone();
            obj.insert("job".into(), job.into());
            obj.insert("epoch".into(), epoch.into());
            obj.insert("ids".into(), ids.into());
            serde_json::to_writer(&mut w, &obj)?;
            w.write_all(b"\n")?;
        }
        Ok(())
    }
}

/// Runs the sampler over the scenario's jobs (repetition `rep`) and records every access.
pub fn generate(scn: &Scenario, kind: SamplerKind, rep: u32) -> Result<Trace, String> {
    let datasets = scn.datasets(rep)?;
    let n = datasets.len();
    let mut sampler = kind.build();
    let mut credit = vec![0.0f64; n];
    let mut joined = vec![false; n];
    let mut finished = vec![false; n];
    let mut trace = Trace {
        datasets: datasets.clone(),
        ..Trace::default()
    };
    trace.starts.push(0);
    let mut round = Round::default();
    let mut active = Vec::with_capacity(n);
    let mut t = 0u64;
    while finished.iter().any(|f| !f) {
        for j in 0..n {
            if finished[j] {
                continue;
            }
            if !joined[j] && scn.jobs[j].start <= t {
                joined[j] = true;
                sampler
                    .add_job(JobSpec {
                        key: j as u64,
                        dataset: datasets[j].clone(),
                        seed: mix64(scn.seed ^ (u64::from(rep) << 40) ^ j as u64),
                        epochs: Some(scn.jobs[j].epochs),
                    })
                    .map_err(|e| e.to_string())?;
            }
            if joined[j] {
                credit[j] += scn.jobs[j].speed;
            }
        }
        loop {
            active.clear();
            active.extend(
                (0..n)
                    .filter(|&j| joined[j] && !finished[j] && credit[j] >= 1.0)
                    .map(|j| j as u64),
            );
            if active.is_empty() {
                break;
            }
            sampler
                .sample(&active, &mut round)
                .map_err(|e| e.to_string())?;
            for d in &round.deliveries {
                trace.accesses.push(Access {
                    job: d.job as u32,
                    element: d.element,
                    epoch: d.epoch,
                });
            }
            trace.starts.push(trace.accesses.len());
            for &j in &active {
                credit[j as usize] -= 1.0;
            }
            for ev in &round.events {
                if let JobEvent::Finished { job } = *ev {
                    finished[job as usize] = true;
                }
            }
        }
        t += 1;
    }
    Ok(trace)
}

/// Counts of one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub accesses: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Replays a trace against a cache of `capacity` elements managed by `policy`.
pub fn replay(
    trace: &Trace,
    policy: PolicyKind,
    capacity: usize,
    lookahead: u64,
    seed: u64,
) -> Counts {
    let max_id = trace
        .datasets
        .iter()
        .filter_map(|d| d.max())
        .max()
        .unwrap_or(0) as usize;
    // RefCnt's counts: how many jobs still need each element in their current epoch.
    let mut need = vec![0u32; max_id + 1];
    let mut epoch_of: Vec<Option<u32>> = vec![None; trace.datasets.len()];
    let mut p = Policy::new(policy, seed);
    let clairvoyant = policy == PolicyKind::Clairvoyant;
    // Next access of the same element, as a sub-round index.
    let next_round: Vec<u64> = if clairvoyant {
        next_use_rounds(trace)
    } else {
        Vec::new()
    };
    let mut counts = Counts::default();
    let subs = trace.sub_rounds();
    for r in 0..subs {
        if clairvoyant {
            // The sampler has decided round r + lookahead: reveal its elements' use.
            let ahead = r + lookahead as usize;
            if ahead < subs {
                for a in &trace.accesses[trace.starts[ahead]..trace.starts[ahead + 1]] {
                    let key = u64::from(a.element);
                    if p.contains(key) && p.next_use(key).is_none() {
                        p.set_next_use(key, Some(ahead as u64));
                    }
                }
            }
        }
        for i in trace.starts[r]..trace.starts[r + 1] {
            let a = trace.accesses[i];
            let job = a.job as usize;
            if epoch_of[job] != Some(a.epoch) {
                // The job's epoch starts: it needs its whole dataset again.
                epoch_of[job] = Some(a.epoch);
                for e in &trace.datasets[job] {
                    need[e as usize] += 1;
                    if p.contains(u64::from(e)) {
                        p.set_refcount(u64::from(e), need[e as usize]);
                    }
                }
            }
            need[a.element as usize] -= 1;
            let key = u64::from(a.element);
            let next = if clairvoyant && next_round[i] <= (r as u64).saturating_add(lookahead) {
                Some(next_round[i])
            } else {
                None
            };
            counts.accesses += 1;
            if p.contains(key) {
                p.hit(key);
                p.set_refcount(key, need[a.element as usize]);
                if clairvoyant {
                    p.set_next_use(key, next);
                }
            } else {
                counts.misses += 1;
                if capacity == 0 {
                    continue;
                }
                if p.len() >= capacity {
                    p.victim().expect("nothing is pinned in the simulator");
                    counts.evictions += 1;
                }
                p.insert(key, need[a.element as usize], next);
            }
        }
    }
    counts
}

fn next_use_rounds(trace: &Trace) -> Vec<u64> {
    let mut next = vec![u64::MAX; trace.accesses.len()];
    let mut seen: HashMap<u32, u64> = HashMap::new();
    for r in (0..trace.sub_rounds()).rev() {
        for i in (trace.starts[r]..trace.starts[r + 1]).rev() {
            let e = trace.accesses[i].element;
            if let Some(&n) = seen.get(&e) {
                next[i] = n;
            }
            seen.insert(e, r as u64);
        }
    }
    next
}

/// One line of a simulation's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResultRow {
    pub scenario: String,
    pub sampler: SamplerKind,
    pub policy: PolicyKind,
    pub cache_size: usize,
    /// Mean misses over the repetitions.
    pub misses: f64,
    /// Mean accesses over the repetitions (the same in each when datasets are fixed).
    pub accesses: f64,
    /// Mean `|D_1 ∪ … ∪ D_n|`: the fewest misses possible.
    pub union_size: f64,
    /// Mean `Σ |D_i| × epochs_i`: the misses of a run without any sharing.
    pub sum_sizes: f64,
    pub repetitions: u32,
}

/// Runs a scenario: every sampler × policy × cache size, averaged over the repetitions. Calls
/// `on_trace` with each generated trace (for `--trace`).
pub fn run(
    scn: &Scenario,
    mut on_trace: impl FnMut(SamplerKind, u32, &Trace),
) -> Result<Vec<ResultRow>, String> {
    scn.validate()?;
    let mut sums: HashMap<(SamplerKind, PolicyKind, usize), (f64, f64)> = HashMap::new();
    let (mut union_sum, mut total_sum) = (0.0, 0.0);
    for rep in 0..scn.repetitions {
        let datasets = scn.datasets(rep)?;
        let mut union = RoaringBitmap::new();
        for d in &datasets {
            union |= d;
        }
        union_sum += union.len() as f64;
        total_sum += datasets
            .iter()
            .zip(&scn.jobs)
            .map(|(d, j)| d.len() as f64 * f64::from(j.epochs))
            .sum::<f64>();
        for &kind in &scn.samplers {
            let trace = generate(scn, kind, rep)?;
            on_trace(kind, rep, &trace);
            for &policy in &scn.policies {
                for &size in &scn.cache_sizes {
                    let c = replay(
                        &trace,
                        policy,
                        size,
                        scn.lookahead,
                        mix64(scn.seed ^ u64::from(rep)),
                    );
                    let e = sums.entry((kind, policy, size)).or_default();
                    e.0 += c.misses as f64;
                    e.1 += c.accesses as f64;
                }
            }
        }
    }
    let reps = f64::from(scn.repetitions);
    let mut rows = Vec::new();
    for &kind in &scn.samplers {
        for &policy in &scn.policies {
            for &size in &scn.cache_sizes {
                let (m, a) = sums[&(kind, policy, size)];
                rows.push(ResultRow {
                    scenario: scn.name.clone(),
                    sampler: kind,
                    policy,
                    cache_size: size,
                    misses: m / reps,
                    accesses: a / reps,
                    union_size: union_sum / reps,
                    sum_sizes: total_sum / reps,
                    repetitions: scn.repetitions,
                });
            }
        }
    }
    Ok(rows)
}

/// The cases of the appendix's Table 1 with cache sizes 1 to 10000, named after the figures
/// that plot them (the appendix's text calls the 4-job DSA/ISA figures 6a and 6b).
#[allow(
    clippy::too_many_lines,
    reason = "a data table: the appendix's cases, one after another"
)]
pub fn preset_paper_a2(seed: u64, repetitions: u32) -> Vec<Scenario> {
    let sizes: Vec<usize> = std::iter::once(1)
        .chain((1..=20).map(|i| i * 500))
        .collect();
    let job = |d: &str| JobScenario {
        dataset: DatasetSpec::Text(d.into()),
        start: 0,
        speed: 1.0,
        epochs: 1,
    };
    let base = |name: &str,
                jobs: Vec<JobScenario>,
                samplers: Vec<SamplerKind>,
                policies: Vec<PolicyKind>| Scenario {
        name: name.into(),
        jobs,
        samplers,
        policies,
        cache_sizes: sizes.clone(),
        seed,
        repetitions,
        lookahead: 64,
    };
    let both = vec![SamplerKind::Dsa, SamplerKind::Isa];
    let lru = vec![PolicyKind::Lru];
    let mut out = Vec::new();
    for d2 in [
        "range:0:10000",
        "range:7500:17500",
        "range:5000:15000",
        "range:2500:12500",
    ] {
        out.push(base(
            &format!("fig4a overlap D1=range:0:10000 D2={d2}"),
            vec![job("range:0:10000"), job(d2)],
            both.clone(),
            lru.clone(),
        ));
    }
    for d2 in [
        "range:0:10000",
        "range:0:7500",
        "range:0:5000",
        "range:0:2500",
    ] {
        out.push(base(
            &format!("fig4b size D1=range:0:10000 D2={d2}"),
            vec![job("range:0:10000"), job(d2)],
            both.clone(),
            lru.clone(),
        ));
    }
    let random4 = || {
        (0..4)
            .map(|_| job("sample:0:13333:10000"))
            .collect::<Vec<_>>()
    };
    let sizes4 = || {
        [
            "range:0:10000",
            "range:0:7500",
            "range:0:5000",
            "range:0:2500",
        ]
        .map(job)
        .to_vec()
    };
    out.push(base(
        "fig6a 4 jobs sample(0..13333, 10000)",
        random4(),
        both.clone(),
        lru.clone(),
    ));
    out.push(base(
        "fig6b 4 jobs sizes 10000/7500/5000/2500",
        sizes4(),
        both,
        lru,
    ));
    let policies = vec![
        PolicyKind::RefCnt,
        PolicyKind::Lru,
        PolicyKind::Fifo,
        PolicyKind::Random,
        PolicyKind::Clairvoyant,
    ];
    out.push(base(
        "fig5a policies, 4 jobs sample(0..13333, 10000), dsa",
        random4(),
        vec![SamplerKind::Dsa],
        policies.clone(),
    ));
    out.push(base(
        "fig5b policies, 4 jobs sizes 10000/7500/5000/2500, dsa",
        sizes4(),
        vec![SamplerKind::Dsa],
        policies,
    ));
    out
}

#[cfg(test)]
mod tests;
