//! `joader bench sampler`: insertion time of the dependent sampling tree and DSA's sampling
//! rate, against the paper's targets.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use roaring::RoaringBitmap;

use joader_core::sampling::{DependentSamplingTree, JobSpec, Round, Sampler, SamplerKind};

#[derive(Debug, Args)]
pub struct SamplerBenchArgs {
    /// Datasets inserted in the insertion benchmark.
    #[arg(long, default_value_t = 128)]
    pub datasets: usize,
    /// Universe of ids of the insertion benchmark.
    #[arg(long, default_value_t = 2_000_000)]
    pub universe: u32,
    /// Concurrent jobs in the sampling benchmark.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// Elements of each job's dataset in the sampling benchmark.
    #[arg(long, default_value_t = 1_280_000)]
    pub dataset_size: u32,
    /// Seconds of sampling measured per variant.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// A random subset of `0..universe` with about `size` elements.
fn random_subset(rng: &mut Xoshiro256PlusPlus, universe: u32, size: u32) -> RoaringBitmap {
    let threshold = ((f64::from(size) / f64::from(universe)) * 4_294_967_296.0) as u64;
    (0..universe)
        .filter(|_| u64::from(rng.random::<u32>()) < threshold)
        .collect()
}

pub fn sampler(args: SamplerBenchArgs) -> Result<()> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(args.seed);
    println!("joader bench sampler (one core, release build expected)");

    // 1. Insertion of large random datasets.
    let datasets: Vec<RoaringBitmap> = (0..args.datasets)
        .map(|_| {
            let size = rng
                .random_range(1_000_000..=2_000_000u32)
                .min(args.universe);
            random_subset(&mut rng, args.universe, size)
        })
        .collect();
    let mut tree = DependentSamplingTree::new();
    let mut times = Vec::with_capacity(datasets.len());
    for (i, d) in datasets.into_iter().enumerate() {
        let t = Instant::now();
        tree.add_job(JobSpec {
            key: i as u64,
            dataset: d,
            seed: i as u64,
            epochs: None,
        })?;
        times.push(t.elapsed());
    }
    let mean = times.iter().sum::<Duration>() / times.len().max(1) as u32;
    let max = times.iter().max().copied().unwrap_or_default();
    println!(
        "insertion: {} datasets of 1,000,000-2,000,000 ids over {} ids: mean {:.2} ms, max {:.2} ms per insertion \
         (target <= 10 ms; paper 570 ms: {:.0}x faster)",
        times.len(),
        args.universe,
        mean.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        0.57 / mean.as_secs_f64().max(1e-12)
    );
    drop(tree);

    // 2. Sampling throughput on two shapes of overlap: shifted windows of one id range (subsets
    // by class or id range), and random subsets drawn from a universe 1.25x their size (the
    // harder case for the tree: many small, scattered vertices).
    let universe = (f64::from(args.dataset_size) * 1.25) as u32;
    let shift = (universe - args.dataset_size) / args.jobs.max(1) as u32;
    let windows: Vec<RoaringBitmap> = (0..args.jobs as u32)
        .map(|j| (j * shift..j * shift + args.dataset_size).collect())
        .collect();
    let random: Vec<RoaringBitmap> = (0..args.jobs)
        .map(|_| random_subset(&mut rng, universe, args.dataset_size))
        .collect();
    for (shape, sets, kind, p_active) in [
        ("windows", &windows, SamplerKind::Dsa, 1.0),
        ("windows", &windows, SamplerKind::Dsa, 0.75),
        ("windows", &windows, SamplerKind::Isa, 1.0),
        ("random subsets", &random, SamplerKind::Dsa, 1.0),
        ("random subsets", &random, SamplerKind::Dsa, 0.75),
        ("random subsets", &random, SamplerKind::Isa, 1.0),
    ] {
        let mut s = kind.build();
        for (i, d) in sets.iter().enumerate() {
            s.add_job(JobSpec {
                key: i as u64,
                dataset: d.clone(),
                seed: i as u64,
                epochs: None,
            })?;
        }
        let keys = s.jobs();
        let mut round = Round::default();
        let mut active = Vec::with_capacity(keys.len());
        let (mut samples, mut rounds, mut shared) = (0u64, 0u64, 0u64);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < args.seconds {
            for _ in 0..1000 {
                active.clear();
                active.extend(
                    keys.iter()
                        .copied()
                        .filter(|_| p_active >= 1.0 || rng.random_bool(p_active)),
                );
                s.sample(&active, &mut round)?;
                samples += round.deliveries.len() as u64;
                shared += (round.deliveries.len() - round.groups.len()) as u64;
                rounds += 1;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let rate = samples as f64 / secs;
        println!(
            "sampling: {} on {shape}, {} jobs x {} ids, {:.0}% active per round: {:.2} M job-samples/s, \
             {:.2} us/round, {:.1}% of deliveries shared (target >= 2 M/s: {:.2}x)",
            kind.name(),
            args.jobs,
            args.dataset_size,
            p_active * 100.0,
            rate / 1e6,
            secs * 1e6 / rounds as f64,
            100.0 * shared as f64 / samples.max(1) as f64,
            rate / 2e6
        );
    }
    Ok(())
}
