//! Tests of the samplers: structure (proptest against the definitions and against "every
//! element once per epoch"), exact distribution against the reference Algorithm 1 + 2 (whose
//! own marginals are checked exactly, in rationals, with the leaf coupling active), the tree's
//! exact fallback of the coupled leaf draw alone, uniformity and locality. Statistical tests use fixed seeds, so they are deterministic; their
//! thresholds are at p = 0.001 so that a correct implementation passes with a wide margin.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use roaring::RoaringBitmap;

use super::reference::{CoupledDraw, Coupling, Ratio, coupled, exact_round, exact_round_with};
use super::*;

fn bitmap(ids: impl IntoIterator<Item = u32>) -> RoaringBitmap {
    ids.into_iter().collect()
}

fn spec(key: JobKey, dataset: RoaringBitmap, seed: u64) -> JobSpec {
    JobSpec {
        key,
        dataset,
        seed,
        epochs: None,
    }
}

/// Upper critical value of the chi-square distribution at p = 0.001 (Wilson–Hilferty).
fn chi2_critical(df: usize) -> f64 {
    let df = df as f64;
    let z = 3.0902;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Chi-square statistic of observed counts against expected probabilities, merging outcomes
/// with small expected counts into one bin. Returns (statistic, degrees of freedom).
fn chi2(
    observed: &HashMap<Vec<u32>, u64>,
    expected: &HashMap<Vec<u32>, f64>,
    n: u64,
) -> (f64, usize) {
    for k in observed.keys() {
        assert!(
            expected.contains_key(k),
            "outcome {k:?} is impossible under the reference"
        );
    }
    let mut stat = 0.0;
    let mut bins = 0usize;
    let (mut small_o, mut small_e) = (0.0, 0.0);
    for (k, &p) in expected {
        let e = p * n as f64;
        let o = *observed.get(k).unwrap_or(&0) as f64;
        if e < 5.0 {
            small_o += o;
            small_e += e;
        } else {
            stat += (o - e).powi(2) / e;
            bins += 1;
        }
    }
    if small_e > 0.0 {
        stat += (small_o - small_e).powi(2) / small_e.max(1e-9);
        bins += 1;
    }
    (stat, bins.saturating_sub(1))
}

fn assert_uniform_counts(counts: &[u64], what: &str) {
    let n: u64 = counts.iter().sum();
    let e = n as f64 / counts.len() as f64;
    let stat: f64 = counts.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
    let crit = chi2_critical(counts.len() - 1);
    assert!(
        stat < crit,
        "{what}: chi2 {stat:.1} >= {crit:.1}, counts {counts:?}"
    );
}

/// Runs a sampler round by round and checks that each job gets its dataset exactly once per
/// epoch; returns every job's orders, epoch by epoch.
#[derive(Default)]
struct EpochChecker {
    current: HashMap<JobKey, Vec<u32>>,
    done: HashMap<JobKey, Vec<Vec<u32>>>,
}

impl EpochChecker {
    fn observe(
        &mut self,
        s: &dyn Sampler,
        round: &Round,
        datasets: &HashMap<JobKey, RoaringBitmap>,
    ) {
        for g in &round.groups {
            let ds = &round.deliveries[g.clone()];
            let mut seen = BTreeSet::new();
            for d in ds {
                assert_eq!(d.element, ds[0].element, "a group mixes elements");
                assert!(seen.insert(d.job), "a job appears twice in one group");
            }
        }
        for d in &round.deliveries {
            let cur = self.current.entry(d.job).or_default();
            assert_eq!(
                d.position as usize,
                cur.len(),
                "position of job {} is wrong",
                d.job
            );
            assert!(
                datasets[&d.job].contains(d.element),
                "job {} got a foreign element",
                d.job
            );
            cur.push(d.element);
        }
        for ev in &round.events {
            match *ev {
                JobEvent::EpochEnded { job, epoch } => {
                    let order = self.current.remove(&job).unwrap_or_default();
                    let got: RoaringBitmap = order.iter().copied().collect();
                    assert_eq!(
                        got.len() as usize,
                        order.len(),
                        "job {job} got an element twice in epoch {epoch}"
                    );
                    assert_eq!(
                        got, datasets[&job],
                        "job {job} epoch {epoch} is not its dataset"
                    );
                    let done = self.done.entry(job).or_default();
                    assert_eq!(
                        done.len() as u32,
                        epoch,
                        "epochs of job {job} are not consecutive"
                    );
                    done.push(order);
                }
                JobEvent::Finished { job } => {
                    assert!(
                        s.remaining(job).is_none(),
                        "finished job {job} is still registered"
                    );
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Sample(Vec<bool>),
    Add(Vec<u32>),
    Remove(usize),
}

fn dataset_strategy() -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        // dense ranges
        (0u32..40, 1u32..40).prop_map(|(a, len)| (a..a + len).collect()),
        // random subsets of a small universe
        proptest::collection::btree_set(0u32..60, 1..40).prop_map(|s| s.into_iter().collect()),
        // dense in one container, sparse across others
        (
            proptest::collection::btree_set(0u32..20, 1..15),
            proptest::collection::btree_set(1u32..6, 0..4)
        )
            .prop_map(|(d, s)| d
                .into_iter()
                .chain(s.into_iter().map(|c| c << 16))
                .collect()),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => proptest::collection::vec(proptest::bool::weighted(0.7), 8).prop_map(Op::Sample),
        1 => dataset_strategy().prop_map(Op::Add),
        1 => (0usize..8).prop_map(Op::Remove),
    ]
}

fn run_ops(
    kind: SamplerKind,
    initial: Vec<Vec<u32>>,
    ops: Vec<Op>,
    seed: u64,
    epochs: Option<u32>,
) {
    let mut s = kind.build();
    let mut datasets = HashMap::new();
    let mut next_key = 0u64;
    let mut add =
        |s: &mut Box<dyn Sampler>, datasets: &mut HashMap<JobKey, RoaringBitmap>, ids: Vec<u32>| {
            let d = bitmap(ids);
            s.add_job(JobSpec {
                key: next_key,
                dataset: d.clone(),
                seed: seed ^ next_key,
                epochs,
            })
            .unwrap();
            datasets.insert(next_key, d);
            next_key += 1;
        };
    for ids in initial {
        add(&mut s, &mut datasets, ids);
    }
    let mut checker = EpochChecker::default();
    let mut round = Round::default();
    for op in ops {
        match op {
            Op::Sample(mask) => {
                let jobs = s.jobs();
                let active: Vec<JobKey> = jobs
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask[i % mask.len()])
                    .map(|(_, &k)| k)
                    .collect();
                s.sample(&active, &mut round).unwrap();
                let mut served: Vec<JobKey> = round.deliveries.iter().map(|d| d.job).collect();
                served.sort_unstable();
                let mut want = active.clone();
                want.sort_unstable();
                assert_eq!(served, want, "every active job gets exactly one element");
                checker.observe(s.as_ref(), &round, &datasets);
            }
            Op::Add(ids) => add(&mut s, &mut datasets, ids),
            Op::Remove(i) => {
                let jobs = s.jobs();
                if !jobs.is_empty() {
                    let key = jobs[i % jobs.len()];
                    s.remove_job(key).unwrap();
                    checker.current.remove(&key);
                }
            }
        }
        s.check_invariants().unwrap();
        let jobs = s.jobs();
        for probe in [0u32, 7, 33, 1 << 16] {
            let want = jobs
                .iter()
                .filter(|&&k| s.remaining(k).unwrap().contains(probe))
                .count();
            assert_eq!(s.need_count(probe) as usize, want, "need_count({probe})");
        }
        for key in jobs {
            assert!(
                !s.remaining(key).unwrap().is_empty(),
                "a registered job has an empty remaining set"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn dsa_every_element_once_per_epoch(
        initial in proptest::collection::vec(dataset_strategy(), 1..6),
        ops in proptest::collection::vec(op_strategy(), 1..400),
        seed in any::<u64>(),
    ) {
        run_ops(SamplerKind::Dsa, initial, ops, seed, None);
    }

    #[test]
    fn isa_every_element_once_per_epoch(
        initial in proptest::collection::vec(dataset_strategy(), 1..6),
        ops in proptest::collection::vec(op_strategy(), 1..300),
        seed in any::<u64>(),
    ) {
        run_ops(SamplerKind::Isa, initial, ops, seed, None);
    }

    #[test]
    fn dsa_finite_epochs_finish(
        initial in proptest::collection::vec(dataset_strategy(), 1..5),
        seed in any::<u64>(),
    ) {
        let total: usize = initial.iter().map(|d| d.iter().collect::<BTreeSet<_>>().len()).sum();
        let ops = vec![Op::Sample(vec![true; 8]); total * 2 + 2];
        run_ops(SamplerKind::Dsa, initial, ops, seed, Some(2));
    }
}

/// `tree` with one job per dataset (seeds `seed`, `seed + 1`, …) after `warmup` rounds of all
/// its jobs, with the jobs' order and their remaining sets in that order.
fn warmed_up(
    mut tree: DependentSamplingTree,
    datasets: &[Vec<u32>],
    warmup: usize,
    seed: u64,
) -> (DependentSamplingTree, Vec<JobKey>, Vec<BTreeSet<u32>>) {
    for (i, d) in datasets.iter().enumerate() {
        tree.add_job(spec(
            i as JobKey,
            bitmap(d.iter().copied()),
            seed + i as u64,
        ))
        .unwrap();
    }
    let mut round = Round::default();
    for _ in 0..warmup {
        let jobs = tree.jobs();
        tree.sample(&jobs, &mut round).unwrap();
        assert!(round.events.is_empty(), "warm-up must not end an epoch");
    }
    let order = tree.order();
    let sets = order
        .iter()
        .map(|&k| tree.remaining(k).unwrap().iter().collect())
        .collect();
    (tree, order, sets)
}

/// Trial `t`: one round of a copy of `tree` reseeded for it; the copy, and each job's element
/// in `order`.
fn trial(
    tree: &DependentSamplingTree,
    order: &[JobKey],
    seed: u64,
    t: u64,
    round: &mut Round,
) -> (DependentSamplingTree, Vec<u32>) {
    let mut c = tree.clone();
    c.reseed(seed.wrapping_mul(1_000_003) + t);
    c.sample(order, round).unwrap();
    let mut outcome = vec![u32::MAX; order.len()];
    for d in &round.deliveries {
        outcome[order.iter().position(|&k| k == d.job).unwrap()] = d.element;
    }
    (c, outcome)
}

/// Builds a tree, optionally runs some all-jobs rounds, then compares the joint distribution of
/// one more round with the exact distribution of the reference Algorithm 1 + 2.
fn compare_with_reference(datasets: &[Vec<u32>], warmup_rounds: usize, trials: u64, seed: u64) {
    let (tree, order, sets) =
        warmed_up(DependentSamplingTree::new(), datasets, warmup_rounds, seed);
    let mut round = Round::default();
    let exact = exact_round(&sets);
    let total: f64 = exact.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "reference probabilities sum to {total}"
    );
    let mut counts: HashMap<Vec<u32>, u64> = HashMap::new();
    for t in 0..trials {
        let (_, outcome) = trial(&tree, &order, seed, t, &mut round);
        *counts.entry(outcome).or_default() += 1;
    }
    let (stat, df) = chi2(&counts, &exact, trials);
    let crit = chi2_critical(df.max(1));
    assert!(
        stat < crit,
        "tree vs reference: chi2 {stat:.1} >= {crit:.1} (df {df}) for {datasets:?}"
    );
}

#[test]
fn tree_matches_reference_two_nested_jobs() {
    compare_with_reference(&[(0..4).collect(), (0..6).collect()], 0, 20_000, 1);
}

#[test]
fn tree_matches_reference_non_nested_overlaps() {
    // A∩B = {0,1}, B∩C = {0,4}, A∩C = {0,2}: three different pairwise overlaps.
    let a = vec![0, 1, 2, 3, 10, 11];
    let b = vec![0, 1, 4, 5, 12, 13, 14];
    let c = vec![0, 2, 4, 6, 7, 8, 9, 15];
    compare_with_reference(&[a.clone(), b.clone(), c.clone()], 0, 40_000, 2);
    compare_with_reference(&[a, b, c], 2, 40_000, 3);
}

#[test]
fn tree_matches_reference_four_jobs_with_ties_and_sparse_ids() {
    let a = vec![0, 1, 2, 1 << 16];
    let b = vec![1, 2, 3, 1 << 17];
    let c = vec![0, 2, 3, 5, 1 << 16, 1 << 17];
    let d = vec![0, 1, 2, 3, 4, 5, 6, 1 << 16, 1 << 18];
    compare_with_reference(&[a.clone(), b.clone(), c.clone(), d.clone()], 0, 40_000, 4);
    compare_with_reference(&[a, b, c, d], 1, 40_000, 5);
}

/// Fraction of single all-jobs rounds, each from the same state, in which all jobs got the
/// same element.
fn same_pick_rate(datasets: &[RoaringBitmap], kind: SamplerKind, trials: u64) -> f64 {
    let mut same = 0;
    let mut round = Round::default();
    for t in 0..trials {
        let mut s = kind.build();
        for (i, d) in datasets.iter().enumerate() {
            s.add_job(spec(i as JobKey, d.clone(), t * 31 + i as u64))
                .unwrap();
        }
        let jobs = s.jobs();
        s.sample(&jobs, &mut round).unwrap();
        if round.groups.len() == 1 {
            same += 1;
        }
    }
    same as f64 / trials as f64
}

#[test]
fn two_jobs_share_with_optimal_probability() {
    let trials = 20_000;
    for (d1, d2) in [(0..600, 300..1300), (0..1000, 0..250), (0..800, 200..1000)] {
        let (d1, d2) = (bitmap(d1), bitmap(d2));
        let want = (&d1 & &d2).len() as f64 / d1.len().max(d2.len()) as f64;
        let got = same_pick_rate(&[d1.clone(), d2.clone()], SamplerKind::Dsa, trials);
        let sd = (want * (1.0 - want) / trials as f64).sqrt();
        assert!(
            (got - want).abs() < 4.5 * sd + 1e-9,
            "DSA shared {got}, optimum {want}"
        );
        let isa = same_pick_rate(&[d1.clone(), d2.clone()], SamplerKind::Isa, trials);
        let isa_want = (&d1 & &d2).len() as f64 / (d1.len() * d2.len()) as f64;
        assert!(
            isa < isa_want + 0.01,
            "ISA shared {isa}, expected about {isa_want}"
        );
    }
}

#[test]
fn n_jobs_all_share_with_probability_intersection_over_largest() {
    // Equation (10): p(all jobs pick the same) = |I| / max |D_i|.
    let ds = [
        bitmap(0..500),
        bitmap(100..700),
        bitmap((0..900).filter(|x| x % 3 != 0)),
    ];
    let inter = ds.iter().skip(1).fold(ds[0].clone(), |acc, d| acc & d);
    let want = inter.len() as f64 / ds.iter().map(|d| d.len()).max().unwrap() as f64;
    let trials = 20_000;
    let got = same_pick_rate(&ds, SamplerKind::Dsa, trials);
    let sd = (want * (1.0 - want) / trials as f64).sqrt();
    assert!(
        (got - want).abs() < 4.5 * sd,
        "all shared {got}, want {want}"
    );
}

/// Index of a permutation of `elems` (lexicographic by position in `elems`).
fn perm_index(order: &[u32], elems: &[u32]) -> usize {
    let mut idx: Vec<usize> = order
        .iter()
        .map(|e| elems.iter().position(|x| x == e).unwrap())
        .collect();
    let mut code = 0;
    for i in 0..idx.len() {
        code = code * (idx.len() - i) + idx[i];
        let v = idx[i];
        for x in &mut idx[i + 1..] {
            if *x > v {
                *x -= 1;
            }
        }
    }
    code
}

/// Runs `runs` independent simulations of `datasets` (job 0 is observed) with a random mask
/// per round (`p_active` per job, job 0 forced active in every round when `force0`), and
/// returns job 0's epoch-0 orders.
fn epoch_orders(
    kind: SamplerKind,
    datasets: &[RoaringBitmap],
    runs: u64,
    p_active: f64,
    seed: u64,
) -> Vec<Vec<u32>> {
    use rand::{RngExt, SeedableRng};
    let mut out = Vec::with_capacity(runs as usize);
    let mut round = Round::default();
    for r in 0..runs {
        let mut mask_rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(seed ^ (r << 20));
        let mut s = kind.build();
        for (i, d) in datasets.iter().enumerate() {
            s.add_job(spec(
                i as JobKey,
                d.clone(),
                seed.wrapping_add(r * 97 + i as u64),
            ))
            .unwrap();
        }
        let mut order = Vec::new();
        while order.len() < datasets[0].len() as usize {
            let active: Vec<JobKey> = s
                .jobs()
                .into_iter()
                .filter(|_| mask_rng.random_bool(p_active))
                .collect();
            s.sample(&active, &mut round).unwrap();
            order.extend(
                round
                    .deliveries
                    .iter()
                    .filter(|d| d.job == 0 && d.epoch == 0)
                    .map(|d| d.element),
            );
        }
        out.push(order);
    }
    out
}

#[test]
fn permutations_are_uniform_under_concurrency_and_masks() {
    let x = bitmap([0, 1, 70_000, 200_000]);
    let others = [
        bitmap([0, 1, 2, 3, 70_000, 5]),
        bitmap([1, 200_000, 9]),
        bitmap([0, 70_000]),
    ];
    let elems: Vec<u32> = x.iter().collect();
    for (kind, p_active, seed) in [
        (SamplerKind::Dsa, 1.0, 11),
        (SamplerKind::Dsa, 0.6, 12),
        (SamplerKind::Isa, 0.6, 13),
    ] {
        let mut ds = vec![x.clone()];
        ds.extend(others.iter().cloned());
        let orders = epoch_orders(kind, &ds, 24_000, p_active, seed);
        let mut counts = vec![0u64; 24];
        for o in &orders {
            counts[perm_index(o, &elems)] += 1;
        }
        assert_uniform_counts(
            &counts,
            &format!("{kind:?} p_active={p_active}: permutations"),
        );
    }
}

#[test]
fn positions_are_uniform_for_dense_and_sparse_ids() {
    // 30 ids dense in one roaring container and 10 ids alone in their own containers: a pick
    // uniform over containers instead of elements would favour the sparse ones.
    let x: RoaringBitmap = (0..30).chain((1..=10).map(|c| c << 16)).collect();
    let y: RoaringBitmap = (10..50).chain((1..=5).map(|c| c << 16)).collect();
    let z: RoaringBitmap = (0..60)
        .filter(|i| i % 2 == 0)
        .chain([3 << 16, 7 << 16, 11 << 16])
        .collect();
    let elems: Vec<u32> = x.iter().collect();
    let n = elems.len();
    for (kind, p_active, seed) in [
        (SamplerKind::Dsa, 1.0, 21),
        (SamplerKind::Dsa, 0.7, 22),
        (SamplerKind::Isa, 1.0, 23),
    ] {
        let orders = epoch_orders(
            kind,
            &[x.clone(), y.clone(), z.clone()],
            6_000,
            p_active,
            seed,
        );
        let mut first = vec![0u64; n];
        let mut sparse_pos = vec![0u64; n];
        let mut dense_pos = vec![0u64; n];
        let mut before = 0u64;
        let mut sparse_first = 0u64;
        for o in &orders {
            first[elems.iter().position(|&e| e == o[0]).unwrap()] += 1;
            let ps = o.iter().position(|&e| e == 5 << 16).unwrap();
            let pd = o.iter().position(|&e| e == 12).unwrap();
            sparse_pos[ps] += 1;
            dense_pos[pd] += 1;
            before += u64::from(pd < ps);
            sparse_first += u64::from(o[0] >= 1 << 16);
        }
        let what = format!("{kind:?} p_active={p_active}");
        assert_uniform_counts(&first, &format!("{what}: first positions"));
        assert_uniform_counts(&sparse_pos, &format!("{what}: position of a sparse id"));
        assert_uniform_counts(&dense_pos, &format!("{what}: position of a dense id"));
        assert_uniform_counts(
            &[before, orders.len() as u64 - before],
            &format!("{what}: pair order"),
        );
        // Sparse ids are 10 of 40: a container-uniform pick would put one first ~90% of the time.
        let frac = sparse_first as f64 / orders.len() as f64;
        assert!(
            (frac - 0.25).abs() < 0.03,
            "{what}: a sparse id came first in {frac:.3} of runs"
        );
    }
}

#[test]
fn errors_are_reported_not_panics() {
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let mut s = kind.build();
        assert_eq!(
            s.add_job(spec(1, RoaringBitmap::new(), 0)),
            Err(SamplerError::EmptyDataset(1))
        );
        s.add_job(spec(1, bitmap(0..3), 0)).unwrap();
        assert_eq!(
            s.add_job(spec(1, bitmap(0..3), 0)),
            Err(SamplerError::DuplicateJob(1))
        );
        let zero = JobSpec {
            key: 2,
            dataset: bitmap(0..3),
            seed: 0,
            epochs: Some(0),
        };
        assert_eq!(s.add_job(zero), Err(SamplerError::ZeroEpochs(2)));
        let mut round = Round::default();
        assert_eq!(
            s.sample(&[1, 9], &mut round),
            Err(SamplerError::UnknownJob(9))
        );
        assert_eq!(s.remove_job(9), Err(SamplerError::UnknownJob(9)));
        s.remove_job(1).unwrap();
        s.sample(&[], &mut round).unwrap();
        assert!(round.deliveries.is_empty());
    }
}

#[test]
fn same_seed_same_jobs_same_orders() {
    let ds = [bitmap(0..50), bitmap(25..90)];
    let a = epoch_orders(SamplerKind::Dsa, &ds, 3, 0.8, 77);
    let b = epoch_orders(SamplerKind::Dsa, &ds, 3, 0.8, 77);
    let c = epoch_orders(SamplerKind::Dsa, &ds, 3, 0.8, 78);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn identical_datasets_in_lockstep_always_share() {
    let d = bitmap((0..5000).map(|i| i * 3));
    let mut s = DependentSamplingTree::new();
    for k in 0..4 {
        s.add_job(spec(k, d.clone(), k)).unwrap();
    }
    let mut round = Round::default();
    for _ in 0..d.len() * 2 {
        s.sample(&[0, 1, 2, 3], &mut round).unwrap();
        assert_eq!(
            round.groups.len(),
            1,
            "equal datasets in lockstep must share every pick"
        );
    }
    assert_eq!(s.epoch(0), Some(2));
}

#[test]
fn a_resumed_job_finishes_its_epoch_with_exactly_the_remaining_set() {
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let mut s = kind.build();
        // Another job mid-way, so that the resumed one lands in a populated tree.
        s.add_job(spec(1, bitmap(0..40), 7)).unwrap();
        let mut round = Round::default();
        for _ in 0..5 {
            s.sample(&[1], &mut round).unwrap();
        }
        let remaining = bitmap((0..30).filter(|i| i % 3 != 0));
        let resumed = JobSpec {
            epochs: Some(4),
            ..spec(2, bitmap(0..30), 9)
        };
        s.resume_job(resumed, 2, remaining.clone()).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.remaining(2), Some(&remaining));
        let mut got: Vec<Delivery> = Vec::new();
        let mut ended: Vec<JobEvent> = Vec::new();
        while s.jobs().contains(&2) {
            s.sample(&[1, 2], &mut round).unwrap();
            s.check_invariants().unwrap();
            got.extend(round.deliveries.iter().filter(|d| d.job == 2));
            ended.extend(round.events.iter().copied().filter(|e| match e {
                JobEvent::EpochEnded { job, .. } | JobEvent::Finished { job } => *job == 2,
            }));
        }
        let rest: Vec<&Delivery> = got.iter().filter(|d| d.epoch == 2).collect();
        assert_eq!(rest.len() as u64, remaining.len(), "{kind:?}");
        assert_eq!(
            bitmap(rest.iter().map(|d| d.element)),
            remaining,
            "{kind:?}"
        );
        let positions: Vec<u32> = rest.iter().map(|d| d.position).collect();
        assert_eq!(
            positions,
            (10..30).collect::<Vec<u32>>(),
            "positions continue"
        );
        let last: Vec<&Delivery> = got.iter().filter(|d| d.epoch == 3).collect();
        assert_eq!(bitmap(last.iter().map(|d| d.element)), bitmap(0..30));
        assert_eq!(last.len(), 30, "the next epoch is the whole dataset");
        assert!(got.iter().all(|d| d.epoch == 2 || d.epoch == 3));
        assert_eq!(
            ended,
            vec![
                JobEvent::EpochEnded { job: 2, epoch: 2 },
                JobEvent::EpochEnded { job: 2, epoch: 3 },
                JobEvent::Finished { job: 2 }
            ],
            "{kind:?}: the budget counts from epoch 0"
        );
    }
}

#[test]
fn a_resumed_epoch_is_uniform_beside_another_job() {
    // The first pick of a job resumed with 6 of 10 elements left, beside an active job over
    // the whole dataset, is uniform over the 6.
    let remaining = bitmap([1, 2, 4, 6, 7, 9]);
    let mut counts = [0u64; 10];
    let mut round = Round::default();
    for trial in 0..6000u64 {
        let mut s = DependentSamplingTree::new();
        s.add_job(spec(1, bitmap(0..10), trial)).unwrap();
        s.resume_job(spec(2, bitmap(0..10), trial), 0, remaining.clone())
            .unwrap();
        s.reseed(trial);
        s.sample(&[1, 2], &mut round).unwrap();
        let d = round.deliveries.iter().find(|d| d.job == 2).unwrap();
        counts[d.element as usize] += 1;
    }
    assert!(
        counts
            .iter()
            .enumerate()
            .all(|(i, &c)| remaining.contains(i as u32) || c == 0)
    );
    let within: Vec<u64> = remaining.iter().map(|i| counts[i as usize]).collect();
    assert_uniform_counts(&within, "first pick of a resumed epoch");
}

#[test]
fn resuming_where_a_job_cannot_be_is_refused() {
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let mut s = kind.build();
        let two = JobSpec {
            epochs: Some(2),
            ..spec(1, bitmap(0..5), 0)
        };
        assert!(matches!(
            s.resume_job(two.clone(), 2, bitmap(0..2)),
            Err(SamplerError::BadStart(1, _))
        ));
        assert!(matches!(
            s.resume_job(two.clone(), 0, RoaringBitmap::new()),
            Err(SamplerError::BadStart(1, _))
        ));
        assert!(matches!(
            s.resume_job(two.clone(), 0, bitmap([3, 5])),
            Err(SamplerError::BadStart(1, _))
        ));
        assert!(s.jobs().is_empty());
        s.resume_job(two, 1, bitmap([0])).unwrap();
    }
}

#[test]
fn a_replayed_job_receives_exactly_its_order_every_epoch() {
    let mut s = IndependentSampler::new();
    let order: std::sync::Arc<[u32]> = vec![7, 3, 9, 0, 4].into();
    s.add_replay_job(1, order.clone(), Some(2)).unwrap();
    s.add_job(spec(2, bitmap(0..10), 3)).unwrap();
    let mut round = Round::default();
    let mut got = Vec::new();
    while s.jobs().contains(&1) {
        s.sample(&[1, 2], &mut round).unwrap();
        got.extend(
            round
                .deliveries
                .iter()
                .filter(|d| d.job == 1)
                .map(|d| (d.epoch, d.position, d.element)),
        );
    }
    let want: Vec<(u32, u32, u32)> = (0..2)
        .flat_map(|e| {
            order
                .iter()
                .enumerate()
                .map(move |(p, &x)| (e, p as u32, x))
        })
        .collect();
    assert_eq!(got, want);
    assert!(matches!(
        s.add_replay_job(3, vec![1, 2, 1].into(), None),
        Err(SamplerError::BadStart(3, _))
    ));
}

/// Counts of outcomes, as `chi2` takes them.
type Counts = HashMap<Vec<u32>, u64>;

/// Samples one round from clones of a tree of jobs 0, 1, 2 (datasets as given) many times;
/// returns the counts of job 0's and job 1's picks and how often they were the same.
fn leaf_coupling_rounds(datasets: [RoaringBitmap; 3], trials: u64) -> (Counts, Counts, u64) {
    let mut tree = DependentSamplingTree::new();
    for (i, d) in datasets.into_iter().enumerate() {
        tree.add_job(spec(i as JobKey, d, 7 + i as u64)).unwrap();
    }
    assert_eq!(tree.order(), vec![0, 1, 2], "positions follow the sizes");
    let mut round = Round::default();
    let (mut first, mut second, mut same) = (HashMap::new(), HashMap::new(), 0);
    for t in 0..trials {
        let mut c = tree.clone();
        c.reseed(t);
        c.sample(&[0, 1, 2], &mut round).unwrap();
        let pick = |job| {
            round
                .deliveries
                .iter()
                .find(|d| d.job == job)
                .unwrap()
                .element
        };
        let (a, b) = (pick(0), pick(1));
        *first.entry(vec![a]).or_insert(0) += 1;
        *second.entry(vec![b]).or_insert(0) += 1;
        same += u64::from(a == b);
    }
    (first, second, same)
}

fn assert_uniform(counts: &Counts, set: &RoaringBitmap, trials: u64) {
    let expected: HashMap<Vec<u32>, f64> = set
        .iter()
        .map(|e| (vec![e], 1.0 / set.len() as f64))
        .collect();
    let (stat, df) = chi2(counts, &expected, trials);
    assert!(
        stat < chi2_critical(df.max(1)),
        "not uniform: chi2 {stat:.1} (df {df})"
    );
}

/// Two jobs that both draw from their leaves in one round draw coupled: each pick stays
/// uniform over the job's remaining set, and they coincide as often as a maximal coupling
/// allows. Job 0's leaf (99 elements) lies inside job 1's (100): job 1 takes job 0's element
/// with probability 99/100, else the one element outside (the exact fallback after the
/// rejection tries, most of the time).
#[test]
fn leaf_draws_are_coupled_and_stay_uniform_smaller_leaf_first() {
    let common = 0..10;
    let x = bitmap(common.clone().chain(1000..1099));
    let y = bitmap(common.clone().chain(1000..1100));
    let z = bitmap(common.chain(2000..2200));
    let trials = 40_000;
    let (a, b, same) = leaf_coupling_rounds([x.clone(), y.clone(), z], trials);
    assert_uniform(&a, &x, trials);
    assert_uniform(&b, &y, trials);
    // Job 0 takes the 10 common elements (job 1 follows with 109/110) or its leaf (job 1's
    // coupled pick is the same with 99/100). Independent leaf draws would give about 0.10.
    let expected = 10.0 / 110.0 + 99.0 / 109.0 * 0.99;
    let got = same as f64 / trials as f64;
    assert!(
        (got - expected).abs() < 0.01,
        "same {got:.4} vs {expected:.4}"
    );
}

/// The other way round: job 0's leaf (100 elements) contains job 1's (99); job 1 also has 5
/// elements offered to it alone (shared with job 2).
#[test]
fn leaf_draws_are_coupled_and_stay_uniform_larger_leaf_first() {
    let common = 0..10;
    let x = bitmap(common.clone().chain(1000..1100));
    let y = bitmap(common.clone().chain(1000..1099).chain(2000..2005));
    let z = bitmap(common.chain(2000..2005).chain(3000..3200));
    let trials = 40_000;
    let (a, b, same) = leaf_coupling_rounds([x.clone(), y.clone(), z], trials);
    assert_uniform(&a, &x, trials);
    assert_uniform(&b, &y, trials);
    // Job 0 takes the common part (job 1 follows with 110/114) or its leaf; then job 1 takes
    // its 5 own shared elements with 5/104, or its leaf, coupled: the same with 99/100.
    let expected = 10.0 / 110.0 * (110.0 / 114.0) + 100.0 / 110.0 * (99.0 / 104.0) * 0.99;
    let got = same as f64 / trials as f64;
    assert!(
        (got - expected).abs() < 0.01,
        "same {got:.4} vs {expected:.4}"
    );
}

/// The case behind a sweep's fast jobs splitting up beside a slow one: jobs with identical
/// remaining sets sampled together beside a job with a different one (here it has taken some
/// of their elements and they some of its) take their leaves in many rounds; they must still
/// share every pick, over whole epochs, whichever rounds the other job takes part in.
#[test]
fn identical_jobs_share_every_pick_beside_a_job_that_differs() {
    let mut tree = DependentSamplingTree::new();
    for job in 0..3 {
        tree.add_job(spec(job, bitmap(0..300), 11 + job)).unwrap();
    }
    tree.add_job(spec(3, bitmap(0..300), 99)).unwrap();
    let mut round = Round::default();
    let mut leaf_rounds = 0;
    // Job 3 reads alone for a while, so that its remaining set differs from the others'.
    for _ in 0..40 {
        tree.sample(&[3], &mut round).unwrap();
    }
    for r in 0..900 {
        let with_slow = r % 7 == 0;
        let active: &[JobKey] = if with_slow { &[0, 1, 2, 3] } else { &[0, 1, 2] };
        let before = tree.remaining(0).unwrap().clone();
        assert_eq!(&before, tree.remaining(1).unwrap());
        assert_eq!(&before, tree.remaining(2).unwrap());
        let slow = tree.remaining(3).unwrap().clone();
        tree.sample(active, &mut round).unwrap();
        let picks: Vec<u32> = (0..3)
            .map(|j| {
                round
                    .deliveries
                    .iter()
                    .find(|d| d.job == j)
                    .unwrap()
                    .element
            })
            .collect();
        assert!(
            picks.iter().all(|&p| p == picks[0]),
            "round {r}: identical jobs picked {picks:?}"
        );
        // Below the other job in the tree (fewer remaining), the identical jobs took an
        // element it no longer needs: they refused the shared part and drew from their leaves.
        if with_slow && before.len() < slow.len() && !slow.contains(picks[0]) {
            leaf_rounds += 1;
        }
    }
    // The case occurred.
    assert!(
        leaf_rounds > 5,
        "only {leaf_rounds} rounds outside the shared part"
    );
}

/// Two overlapping jobs on a tree, sampled together for `rounds` rounds.
fn sampled_tree(rounds: usize, corrupt: bool) -> DependentSamplingTree {
    let mut t = DependentSamplingTree::new();
    t.add_job(spec(1, bitmap(0..100_000), 1)).unwrap();
    t.add_job(spec(2, bitmap(50_000..150_000), 2)).unwrap();
    if corrupt {
        t.shrink_dataset(1, 0..50_000);
    }
    let mut round = Round::default();
    for _ in 0..rounds {
        t.sample(&[1, 2], &mut round).unwrap();
    }
    t
}

#[test]
fn the_tree_checks_itself_every_1024th_round() {
    let t = sampled_tree(2 * crate::invariants::EVERY as usize + 1, false);
    let want = if cfg!(debug_assertions) { 2 } else { 0 };
    assert_eq!(t.full_checks(), want);
}

#[test]
#[cfg_attr(
    debug_assertions,
    should_panic(expected = "dependent sampling tree: invariant broken after operation 1024")
)]
fn a_broken_tree_fails_its_periodic_check() {
    let t = sampled_tree(crate::invariants::EVERY as usize - 1, true);
    assert!(
        t.check_invariants().is_err(),
        "the full check sees the broken tree"
    );
    // Debug builds: the next round's periodic check panics. Release builds never check.
    sampled_tree(crate::invariants::EVERY as usize, true);
}

// The coupling of leaf draws, checked against the law it must keep rather than against a copy
// of itself: the reference's exact enumeration must give every job exactly uniform marginals,
// and the tree's exact fallback (forced by a tree that gives up its rejection loop at once)
// must be uniform by chi-square and match the reference.

fn set(ids: impl IntoIterator<Item = u32>) -> BTreeSet<u32> {
    ids.into_iter().collect()
}

/// Whether a coupled draw is of some kind.
type Holds = fn(&CoupledDraw) -> bool;

/// Rounds in which the coupling is active: some outcomes draw two or three leaves (own sets),
/// each later one coupled with the first, of more than two elements, overlapping in part. Jobs
/// in tree order (ascending size); the comments give the leaves `L` and the spine `V`.
fn coupled_states() -> Vec<Vec<BTreeSet<u32>>> {
    vec![
        // V_0 = {0,1}, V_1 = {30}; L_0 = {10,11,12,20,21}, L_1 = {10,11,31,32,33}: equal
        // sizes, x outside L_1 in 3 of 5 draws.
        vec![
            set([0, 1, 10, 11, 12, 20, 21]),
            set([0, 1, 10, 11, 30, 31, 32, 33]),
            set([0, 1, 30, 40, 41, 42, 43, 44, 45]),
        ],
        // |L_0| = 4 < |L_1| = 6: L_0 = {10..=13}, L_1 = {10,11,30..=33}, overlapping in {10,11}.
        vec![
            set([0, 10, 11, 12, 13]),
            set([0, 5, 10, 11, 30, 31, 32, 33]),
            set([0, 5, 6, 40, 41, 42, 43, 44, 45, 46]),
        ],
        // |L_0| = 8 > |L_1| = 6: L_0 = {10..=17}, L_1 = {10..=13,30,31}; the rest of L_1's
        // law weighs the overlap too.
        vec![
            set([0, 10, 11, 12, 13, 14, 15, 16, 17]),
            set([0, 50, 51, 52, 53, 10, 11, 12, 13, 30, 31]),
            set([0, 50, 51, 52, 53, 60, 61, 62, 63, 64, 65, 66, 67]),
        ],
        // L_1 = {10,11,12} inside L_0 = {10..=16}: the rest lies in the overlap alone.
        vec![
            set([0, 10, 11, 12, 13, 14, 15, 16]),
            set([0, 50, 51, 52, 53, 54, 10, 11, 12]),
            set([0, 50, 51, 52, 53, 54, 60, 61, 62, 63, 64, 65]),
        ],
        // Four jobs, a tie and an empty V_1: up to three leaves in one round, L_1 and L_2 both
        // coupled with L_0 = {10,11,12,20}: L_1 = {10,11,21,22}, L_2 = {10,20,21,23,24}.
        vec![
            set([0, 10, 11, 12, 20]),
            set([0, 10, 11, 21, 22]),
            set([0, 7, 10, 20, 21, 23, 24]),
            set([0, 7, 8, 9, 30, 31, 32, 33]),
        ],
    ]
}

/// The first way in which an enumerated round is not exactly uniform for every job: the
/// outcomes must sum to 1, and each job's marginal must be 1/|R_j| on every element of its
/// remaining set (so nothing elsewhere).
fn marginal_defect(sets: &[BTreeSet<u32>], outcomes: &HashMap<Vec<u32>, Ratio>) -> Option<String> {
    let total = outcomes.values().fold(Ratio::ZERO, |t, &p| t + p);
    if total != Ratio::ONE {
        return Some(format!("the outcomes sum to {total}"));
    }
    for (j, r) in sets.iter().enumerate() {
        let mut marginal: BTreeMap<u32, Ratio> = BTreeMap::new();
        for (outcome, &p) in outcomes {
            let m = marginal.entry(outcome[j]).or_insert(Ratio::ZERO);
            *m = *m + p;
        }
        let want = Ratio::new(1, r.len() as i128);
        for (&e, &p) in &marginal {
            if !r.contains(&e) {
                return Some(format!("job {j} picks {e}, outside its set, with {p}"));
            }
            if p != want {
                return Some(format!("job {j} picks {e} with {p}, not {want}"));
            }
        }
        if marginal.len() != r.len() {
            return Some(format!("job {j} never picks some of its set"));
        }
    }
    None
}

/// From the reference's exact enumeration, in rationals: each job's pick is exactly uniform
/// over its remaining set in rounds where the leaves draw coupled, in every case of the
/// coupling (|L_a| below, equal to, above |L_b|; x in L_b or not; L_b inside L_a).
#[test]
fn coupled_rounds_are_exactly_uniform_for_every_job() {
    let mut cases = BTreeSet::new();
    for sets in coupled_states() {
        let round = exact_round_with(&sets, coupled);
        if let Some(defect) = marginal_defect(&sets, &round.outcomes) {
            panic!("{defect} in {sets:?}");
        }
        assert!(
            round
                .coupled
                .iter()
                .any(|c| c.a > 2 && c.b > 2 && c.both > 0),
            "no coupled draw of overlapping leaves over two elements in {sets:?}: {:?}",
            round.coupled
        );
        cases.extend(round.coupled);
    }
    let wanted: [(&str, Holds); 5] = [
        ("|L_a| < |L_b|", |c| c.a < c.b),
        ("|L_a| = |L_b|", |c| c.a == c.b),
        ("|L_a| > |L_b| with L_b reaching outside L_a", |c| {
            c.a > c.b && c.b_only > 0
        }),
        ("L_b inside a larger L_a", |c| c.a > c.b && c.b_only == 0),
        ("x outside L_b", |c| c.both < c.a),
    ];
    for (what, case) in wanted {
        assert!(
            cases
                .iter()
                .any(|c| c.a > 2 && c.b > 2 && c.both > 0 && case(c)),
            "no state covers {what} with leaves over two elements: {cases:?}"
        );
    }
}

/// Broken on purpose: keeps `x` with the right probability but draws the miss uniformly over
/// `b`, not from the rest of its law (elements of the overlap get too much).
fn coupled_without_rest(a: &BTreeSet<u32>, x: u32, b: &BTreeSet<u32>, y: u32) -> Ratio {
    let keep = if b.contains(&x) {
        Ratio::new(a.len() as i128, b.len() as i128).min(Ratio::ONE)
    } else {
        Ratio::ZERO
    };
    let stay = if y == x { keep } else { Ratio::ZERO };
    stay + (Ratio::ONE - keep) * Ratio::new(1, b.len() as i128)
}

/// Broken on purpose: keeps `x` whenever it is in `b`, whatever the sizes, else draws from
/// `b \ a` (the overlap gets `1/|a|` each instead of `1/|b|`).
fn coupled_greedy(a: &BTreeSet<u32>, x: u32, b: &BTreeSet<u32>, y: u32) -> Ratio {
    if b.contains(&x) {
        return if y == x { Ratio::ONE } else { Ratio::ZERO };
    }
    let outside: BTreeSet<u32> = b.difference(a).copied().collect();
    if outside.contains(&y) {
        Ratio::new(1, outside.len() as i128)
    } else {
        Ratio::ZERO
    }
}

/// Broken on purpose, as a fallback that forgets the overlap's weight `|a| - |b|` when
/// `|a| > |b|`: the miss is drawn from `b \ a` alone. Right whenever `|a| <= |b|`.
fn coupled_rest_outside_only(a: &BTreeSet<u32>, x: u32, b: &BTreeSet<u32>, y: u32) -> Ratio {
    let keep = if b.contains(&x) {
        Ratio::new(a.len() as i128, b.len() as i128).min(Ratio::ONE)
    } else {
        Ratio::ZERO
    };
    let stay = if y == x { keep } else { Ratio::ZERO };
    let outside: BTreeSet<u32> = b.difference(a).copied().collect();
    if outside.contains(&y) {
        stay + (Ratio::ONE - keep) * Ratio::new(1, outside.len() as i128)
    } else {
        stay
    }
}

/// The exact check has teeth. Each wrong coupling above is right in some cases (all three
/// when the leaves do not overlap; the greedy one when |L_a| = |L_b|; the one without the rest
/// when L_b lies inside L_a; the one with its rest outside the overlap when |L_a| <= |L_b|),
/// and the check rejects it on exactly the coupled states that have a coupled draw where it is
/// wrong; each is rejected on some state, and every state rejects some.
#[test]
fn a_wrong_coupling_fails_the_exact_marginal_check() {
    let wrong: [(&str, Coupling, Holds); 3] = [
        ("without the rest", coupled_without_rest, |c| {
            c.both > 0 && c.b_only > 0
        }),
        ("greedy", coupled_greedy, |c| c.both > 0 && c.a != c.b),
        (
            "rest outside the overlap only",
            coupled_rest_outside_only,
            |c| c.both > 0 && c.a > c.b,
        ),
    ];
    let mut rejected = [0; 3];
    for sets in coupled_states() {
        let cases = exact_round_with(&sets, coupled).coupled;
        let mut here = 0;
        for (i, (what, coupling, wrong_in)) in wrong.iter().enumerate() {
            let round = exact_round_with(&sets, *coupling);
            let defect = marginal_defect(&sets, &round.outcomes);
            assert_eq!(
                defect.is_some(),
                cases.iter().any(wrong_in),
                "the coupling {what} on {sets:?} (coupled draws {cases:?}): {defect:?}"
            );
            rejected[i] += usize::from(defect.is_some());
            here += usize::from(defect.is_some());
        }
        assert!(here > 0, "every wrong coupling passes on {sets:?}");
    }
    for ((what, ..), n) in wrong.iter().zip(rejected) {
        assert!(n > 0, "the coupling {what} passes on every state");
    }
}

/// Samples one all-jobs round from clones of a tree that gives up its rejection loop at once
/// (after `warmup` rounds of it), `trials` times: each job's pick must be uniform over its
/// remaining set, and the joint law must be the reference's. Returns the fraction of trials
/// whose round ran the exact fallback.
fn exact_fallback_rounds(datasets: &[BTreeSet<u32>], warmup: usize, trials: u64, seed: u64) -> f64 {
    let mut forced = DependentSamplingTree::new();
    forced.give_up_rejection_at_once();
    let datasets: Vec<Vec<u32>> = datasets
        .iter()
        .map(|d| d.iter().copied().collect())
        .collect();
    let (tree, order, sets) = warmed_up(forced, &datasets, warmup, seed);
    let mut round = Round::default();
    let before = tree.exact_fallbacks();
    let mut joint: Counts = HashMap::new();
    let mut marginals: Vec<Counts> = vec![HashMap::new(); order.len()];
    let mut fallback_rounds = 0;
    for t in 0..trials {
        let (c, outcome) = trial(&tree, &order, seed, t, &mut round);
        fallback_rounds += u64::from(c.exact_fallbacks() > before);
        for (m, &e) in marginals.iter_mut().zip(&outcome) {
            *m.entry(vec![e]).or_default() += 1;
        }
        *joint.entry(outcome).or_default() += 1;
    }
    for (j, (m, r)) in marginals.iter().zip(&sets).enumerate() {
        let expected: HashMap<Vec<u32>, f64> =
            r.iter().map(|&e| (vec![e], 1.0 / r.len() as f64)).collect();
        let (stat, df) = chi2(m, &expected, trials);
        let crit = chi2_critical(df.max(1));
        assert!(
            stat < crit,
            "job at position {j}: chi2 {stat:.1} >= {crit:.1} (df {df}) for {sets:?}"
        );
    }
    let (stat, df) = chi2(&joint, &exact_round(&sets), trials);
    let crit = chi2_critical(df.max(1));
    assert!(
        stat < crit,
        "joint law vs reference: chi2 {stat:.1} >= {crit:.1} (df {df}) for {sets:?}"
    );
    fallback_rounds as f64 / trials as f64
}

/// The tree's exact fallback alone (the rejection loop leaves it only the draws whose 64 tries
/// all fail, rare unless the rest of `L_b`'s law is a small part of `L_b`): a tree whose
/// rejection loop gives up at once keeps every job's pick uniform and the joint law of the
/// reference (whose marginals are exact, above), on the coupled states and on states its own
/// rounds reach. A fallback that forgets the overlap's weight when `|L_a| > |L_b|` fails here
/// with a chi-square above 1000.
#[test]
fn the_exact_fallback_alone_keeps_every_job_uniform() {
    for (i, sets) in coupled_states().iter().enumerate() {
        let seed = 100 + 10 * i as u64;
        let ran = exact_fallback_rounds(sets, 0, 40_000, seed);
        assert!(
            ran > 0.1,
            "the fallback ran in only {ran:.3} of rounds in {sets:?}"
        );
        exact_fallback_rounds(sets, 2, 40_000, seed + 1);
    }
}
