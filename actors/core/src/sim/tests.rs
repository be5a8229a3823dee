//! Tests of the simulator's semantics.

use super::*;

fn job(d: &str, start: u64, speed: f64, epochs: u32) -> JobScenario {
    JobScenario {
        dataset: DatasetSpec::Text(d.into()),
        start,
        speed,
        epochs,
    }
}

fn scenario(jobs: Vec<JobScenario>) -> Scenario {
    Scenario {
        name: "t".into(),
        jobs,
        samplers: vec![SamplerKind::Dsa, SamplerKind::Isa],
        policies: PolicyKind::ALL.to_vec(),
        cache_sizes: vec![0, 1, 50, 100000],
        seed: 5,
        repetitions: 2,
        lookahead: 8,
    }
}

#[test]
fn trace_respects_start_speed_epochs_and_permutations() {
    let scn = scenario(vec![
        job("range:0:100", 0, 1.0, 2),
        job("range:50:130", 30, 0.5, 1),
        job("ids:1,3,5,7,200", 10, 2.0, 3),
    ]);
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let trace = generate(&scn, kind, 0).unwrap();
        let datasets = scn.datasets(0).unwrap();
        let mut per: std::collections::BTreeMap<(u32, u32), Vec<u32>> = Default::default();
        let mut first_round = [usize::MAX; 3];
        for r in 0..trace.sub_rounds() {
            let mut jobs_here = Vec::new();
            for a in &trace.accesses[trace.starts[r]..trace.starts[r + 1]] {
                assert!(
                    !jobs_here.contains(&a.job),
                    "a job accessed twice in one sub-round"
                );
                jobs_here.push(a.job);
                first_round[a.job as usize] = first_round[a.job as usize].min(r);
                per.entry((a.job, a.epoch)).or_default().push(a.element);
            }
        }
        for (j, epochs) in [(0u32, 2u32), (1, 1), (2, 3)] {
            for e in 0..epochs {
                let got: RoaringBitmap = per[&(j, e)].iter().copied().collect();
                assert_eq!(per[&(j, e)].len() as u64, datasets[j as usize].len());
                assert_eq!(got, datasets[j as usize], "job {j} epoch {e}");
            }
            assert!(
                !per.contains_key(&(j, epochs)),
                "job {j} ran past its epochs"
            );
        }
        // Job 1 starts at round 30; job 0 runs one access per round (one sub-round each) before.
        assert!(
            first_round[1] >= 30,
            "job 1 started at sub-round {}",
            first_round[1]
        );
        // Speed 0.5: job 1 gets 40 accesses per 80 rounds while job 0 is running.
        let n1 = trace.accesses.iter().filter(|a| a.job == 1).count();
        assert_eq!(n1, 80);
    }
}

#[test]
fn misses_are_bounded_by_union_and_sum() {
    let scn = scenario(vec![
        job("sample:0:300:200", 0, 1.0, 1),
        job("range:100:250", 5, 0.7, 2),
        job("range:0:120", 0, 1.3, 1),
    ]);
    let rows = run(&scn, |_, _, _| {}).unwrap();
    assert_eq!(rows.len(), 2 * 5 * 4);
    for r in &rows {
        assert!(r.misses >= r.union_size - 1e-9, "{r:?}");
        assert!(r.misses <= r.accesses + 1e-9, "{r:?}");
        assert_eq!(r.accesses, r.sum_sizes);
        if r.cache_size == 0 {
            assert_eq!(r.misses, r.accesses, "no cache, every access misses");
        }
        if r.cache_size == 100000 {
            assert_eq!(
                r.misses, r.union_size,
                "an unbounded cache misses each element once"
            );
        }
    }
}

#[test]
fn dsa_shares_identical_datasets_with_one_slot() {
    let mut scn = scenario(vec![
        job("range:0:1000", 0, 1.0, 1),
        job("range:0:1000", 0, 1.0, 1),
    ]);
    scn.cache_sizes = vec![1];
    scn.policies = vec![PolicyKind::Lru];
    let rows = run(&scn, |_, _, _| {}).unwrap();
    let dsa = rows.iter().find(|r| r.sampler == SamplerKind::Dsa).unwrap();
    let isa = rows.iter().find(|r| r.sampler == SamplerKind::Isa).unwrap();
    assert_eq!(dsa.misses, 1000.0);
    assert!(
        isa.misses > 1990.0,
        "ISA with one slot almost never shares: {}",
        isa.misses
    );
}

#[test]
fn clairvoyant_with_full_lookahead_is_optimal() {
    // Bélády's rule with the whole future known cannot be beaten by any policy.
    let mut scn = scenario(vec![
        job("sample:0:400:300", 0, 1.0, 2),
        job("range:100:400", 3, 0.6, 1),
        job("range:0:200", 0, 1.5, 1),
    ]);
    scn.lookahead = u64::MAX / 2;
    scn.cache_sizes = vec![1, 10, 40, 100, 200];
    scn.repetitions = 1;
    for kind in [SamplerKind::Dsa, SamplerKind::Isa] {
        let trace = generate(&scn, kind, 0).unwrap();
        for &size in &scn.cache_sizes {
            let best = replay(&trace, PolicyKind::Clairvoyant, size, scn.lookahead, 1).misses;
            for p in [
                PolicyKind::RefCnt,
                PolicyKind::Lru,
                PolicyKind::Fifo,
                PolicyKind::Random,
            ] {
                let m = replay(&trace, p, size, 0, 1).misses;
                assert!(
                    best <= m,
                    "{kind:?} size {size}: clairvoyant {best} > {p:?} {m}"
                );
            }
        }
    }
}

#[test]
fn trace_lines_are_json_orders() {
    let scn = scenario(vec![job("range:0:10", 0, 1.0, 2)]);
    let trace = generate(&scn, SamplerKind::Dsa, 0).unwrap();
    let mut out = Vec::new();
    trace
        .write_orders(&serde_json::Map::new(), &mut out)
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for (e, l) in lines.iter().enumerate() {
        assert_eq!(l["job"], 0);
        assert_eq!(l["epoch"], e);
        let mut ids: Vec<u64> = l["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..10).collect::<Vec<_>>());
    }
}

#[test]
fn bad_scenarios_are_rejected_with_reasons() {
    assert!(
        JobScenario::parse("range:5:5")
            .map(|j| scenario(vec![j]).validate())
            .unwrap()
            .is_err()
    );
    assert!(
        JobScenario::parse("range:0:10,speed=0")
            .map(|j| scenario(vec![j]).validate())
            .unwrap()
            .is_err()
    );
    assert!(JobScenario::parse("range:0:10,colour=red").is_err());
    assert!(
        JobScenario::parse("sample:0:10:11")
            .map(|j| scenario(vec![j]).validate())
            .unwrap()
            .is_err()
    );
    let j = JobScenario::parse("ids:1,2,3,start=4,epochs=2").unwrap();
    assert_eq!(j.dataset, DatasetSpec::Text("ids:1,2,3".into()));
    assert_eq!((j.start, j.epochs), (4, 2));
    assert!(scenario(vec![]).validate().is_err());
}
