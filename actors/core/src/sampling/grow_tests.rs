//! Tests of [`Sampler::grow_job`]: a job's dataset grows from its next epoch on, each epoch
//! an exact, uniform permutation of the dataset as it stood when the epoch started.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use super::*;

/// Each job's deliveries by epoch, in position order.
type Epochs = BTreeMap<(JobKey, u32), Vec<(u32, ElementId)>>;

fn run_to_end(s: &mut dyn Sampler, jobs: &[JobKey], out: &mut Epochs, rounds: Option<usize>) {
    let mut round = Round::default();
    let mut n = 0;
    while !s.jobs().is_empty() && rounds.is_none_or(|r| n < r) {
        let live: Vec<JobKey> = jobs
            .iter()
            .copied()
            .filter(|k| s.epoch(*k).is_some())
            .collect();
        s.sample(&live, &mut round).unwrap();
        for d in &round.deliveries {
            out.entry((d.job, d.epoch))
                .or_default()
                .push((d.position, d.element));
        }
        s.check_invariants().unwrap();
        n += 1;
    }
}

fn job(key: JobKey, ids: std::ops::Range<u32>, seed: u64, epochs: u32) -> JobSpec {
    JobSpec {
        key,
        dataset: ids.collect(),
        seed,
        epochs: Some(epochs),
    }
}

/// Checks that an epoch is positions `0..` in order over exactly `ids`.
fn assert_permutation(got: &[(u32, ElementId)], ids: std::ops::Range<u32>, what: &str) {
    let positions: Vec<u32> = got.iter().map(|d| d.0).collect();
    assert_eq!(
        positions,
        (0..ids.len() as u32).collect::<Vec<_>>(),
        "{what}: positions"
    );
    let mut elements: Vec<u32> = got.iter().map(|d| d.1).collect();
    elements.sort_unstable();
    assert_eq!(elements, ids.collect::<Vec<_>>(), "{what}: elements");
}

#[test]
fn a_grown_job_covers_its_new_elements_from_its_next_epoch() {
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let mut s = kind.build();
        s.add_job(job(1, 0..100, 7, 3)).unwrap();
        s.add_job(job(2, 0..60, 9, 3)).unwrap();
        let mut got = Epochs::new();
        run_to_end(s.as_mut(), &[1, 2], &mut got, Some(30));
        // Overlapping what it has: only the new ids join.
        // Two appends in one epoch (the first overlapping what it has): the next epoch's
        // dataset holds both.
        let (from, next) = s.grow_job(1, &(90..110).collect()).unwrap();
        assert_eq!((from, next), (1, (0..110).collect()), "{kind:?}");
        let added: RoaringBitmap = (110..130).collect();
        assert_eq!(
            s.grow_job(1, &added).unwrap(),
            (1, (0..130).collect()),
            "{kind:?}"
        );
        assert_eq!(
            s.dataset(1).unwrap().len(),
            100,
            "{kind:?}: the epoch keeps its set"
        );
        assert_eq!(s.grow_job(3, &added), Err(SamplerError::UnknownJob(3)));
        run_to_end(s.as_mut(), &[1, 2], &mut got, None);
        assert_permutation(&got[&(1, 0)], 0..100, &format!("{kind:?} job 1 epoch 0"));
        for e in 1..3 {
            assert_permutation(&got[&(1, e)], 0..130, &format!("{kind:?} job 1 epoch {e}"));
        }
        for e in 0..3 {
            assert_permutation(&got[&(2, e)], 0..60, &format!("{kind:?} job 2 epoch {e}"));
        }
        assert_eq!(got.len(), 6);
    }
}

#[test]
fn a_grown_epoch_is_uniform() {
    // The first element of job 1's grown epoch, beside a job that does not grow, over many
    // seeds: uniform over the 9 elements of the grown dataset.
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let mut counts = [0u64; 9];
        for seed in 0..4500 {
            let mut s = kind.build();
            s.add_job(job(1, 0..6, seed, 2)).unwrap();
            s.add_job(job(2, 0..4, seed ^ 0xabcd, 2)).unwrap();
            let mut got = Epochs::new();
            run_to_end(s.as_mut(), &[1, 2], &mut got, Some(2));
            s.grow_job(1, &(6..9).collect()).unwrap();
            run_to_end(s.as_mut(), &[1, 2], &mut got, None);
            assert_permutation(&got[&(1, 1)], 0..9, "grown epoch");
            counts[got[&(1, 1)][0].1 as usize] += 1;
        }
        let e = counts.iter().sum::<u64>() as f64 / 9.0;
        let stat: f64 = counts.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
        // chi-square, 8 degrees of freedom, p = 0.001.
        assert!(stat < 26.12, "{kind:?}: chi2 {stat:.1}, counts {counts:?}");
    }
}

#[test]
fn a_replayed_order_does_not_grow() {
    let mut s = IndependentSampler::new();
    s.add_replay_job(5, std::sync::Arc::from(vec![2, 0, 1]), Some(1))
        .unwrap();
    let added: RoaringBitmap = (3..5).collect();
    assert_eq!(s.grow_job(5, &added), Err(SamplerError::FixedOrder(5)));
}
