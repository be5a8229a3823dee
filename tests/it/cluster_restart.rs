//! A leader restart is a pause (issue 47): a `--leader-only` leader SIGKILLed mid-epoch and
//! restarted on its address and data folder within the followers' grace period, with a
//! 6-rank job on three nodes and an overlapping 2-node job, finishes every epoch exactly; a
//! leader back after the grace period finds its jobs failed and says why; a stale leader (an
//! older generation) is refused; a job whose ranks were still joining starts once the last
//! one joins the restarted leader (registered while its node had not seen the restart yet).

use std::collections::BTreeSet;
use std::time::Instant;

use serde_json::{Value, json};

use crate::cluster::{NO_TIMEOUT, Node, cluster_with, job, loads, ready_everywhere};
use crate::common::{TempDir, TestServer, consumer, finish, outcome, wait_for};
use crate::server::{dataset, epoch_ids};

/// Kills the leader (`nodes[0]`, SIGKILL) and starts it again on its address and instance,
/// with the data folder `dir` (its own when `None`); returns when it was killed.
fn restart_leader(nodes: &mut [Node], dir: Option<&std::path::Path>, grace: &str) -> Instant {
    let mut leader = nodes[0].server.child.take().unwrap();
    leader.kill().unwrap();
    leader.wait().unwrap();
    let killed = Instant::now();
    start_leader(nodes, dir, grace);
    killed
}

/// Starts the (killed) leader `nodes[0]` again on its address and instance, `--leader-only`,
/// with the data folder `dir` (its own when `None`).
fn start_leader(nodes: &mut [Node], dir: Option<&std::path::Path>, grace: &str) {
    let addr = nodes[0]
        .server
        .url
        .trim_start_matches("http://")
        .to_string();
    let instance = nodes[0].server.instance.clone();
    let dir = dir.unwrap_or(&nodes[0]._dir.0).to_path_buf();
    let args = [
        &["--node-name", "node-0", "--bind", &addr, "--leader-only"][..],
        &NO_TIMEOUT,
        &["--leader-grace-ms", grace],
    ]
    .concat();
    nodes[0].server = TestServer::start(&instance, &dir, dataset(), &args);
}

/// A 2-rank job `name` (a rank on each of `node-1` and `node-2`, small rings, slow readers),
/// once it runs.
fn slow_two_rank_job(nodes: &[Node], name: &str) -> Vec<std::process::Child> {
    let ranks = (0..2u32)
        .map(|r| {
            consumer(
                &nodes[1 + r as usize].server.url,
                &job(name, 2, 1, r, json!({"batch_size": 2, "ring_capacity": 4})),
                &["--rank", &r.to_string(), "--sample-us", "20000"],
            )
        })
        .collect();
    let c1 = nodes[1].server.client();
    wait_for("the job to run", || {
        let j = c1.ok("GET", &format!("/v1/jobs/{name}"), None).ok()?;
        (j["acknowledged"].as_u64()? > 0).then_some(())
    });
    ranks
}

/// Every rank of `ranks` fails, saying each of `why`.
fn every_rank_fails(ranks: Vec<std::process::Child>, why: &[&str]) {
    for (r, child) in ranks.into_iter().enumerate() {
        let out = outcome(child);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {r} went on");
        assert!(why.iter().all(|w| err.contains(w)), "rank {r}: {err}");
    }
}

/// The leader's view of its multi-node jobs, by name.
fn leader_jobs(nodes: &[Node]) -> Option<(u64, Vec<Value>)> {
    let v = nodes[0].server.client().ok("GET", "/v1/nodes", None).ok()?;
    Some((v["generation"].as_u64()?, v["jobs"].as_array()?.clone()))
}

/// Each epoch of a job's ranks `got`: `per_rank` elements each, disjoint, together `want`.
fn exact_epochs(got: &[Value], epochs: usize, per_rank: usize, want: &BTreeSet<u32>) {
    for e in 0..epochs {
        let mut all = Vec::new();
        for (r, s) in got.iter().enumerate() {
            let ids = epoch_ids(s, e);
            assert_eq!(ids.len(), per_rank, "rank {r} epoch {e}: {ids:?}");
            all.extend(ids);
        }
        let set: BTreeSet<u32> = all.iter().copied().collect();
        assert_eq!(all.len(), set.len(), "epoch {e}: an element twice");
        assert_eq!(&set, want, "epoch {e}: not the dataset");
    }
}

#[test]
fn a_leader_killed_mid_epoch_and_restarted_within_the_grace_period_is_a_pause() {
    let grace = "60000";
    let mut nodes = cluster_with(
        "pause",
        3,
        &["--leader-grace-ms", grace],
        &["--leader-only"],
    );
    let n = crate::server::CLASSES * crate::server::PER_CLASS;
    // Small rings, slow readers: the leader places a few records ahead of each rank, so that
    // it dies in the middle of an epoch with placements in flight.
    let small = json!({"batch_size": 2, "ring_capacity": 4});
    let with = |extra: Value| {
        let mut v = small.clone();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let slow = |r: u32| {
        vec![
            "--rank".to_string(),
            r.to_string(),
            "--sample-us".into(),
            "25000".into(),
        ]
    };
    let a: Vec<_> = (0..6u32)
        .map(|r| {
            let args = slow(r);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            consumer(
                &nodes[1 + (r / 2) as usize].server.url,
                &job("pa", 6, 2, r, with(json!({"epochs": 3}))),
                &args,
            )
        })
        .collect();
    let b: Vec<_> = (0..2u32)
        .map(|r| {
            let args = slow(r);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            consumer(
                &nodes[1 + r as usize].server.url,
                &job(
                    "pb",
                    2,
                    1,
                    r,
                    with(json!({"epochs": 2, "subset": {"start": 12, "end": 48}})),
                ),
                &args,
            )
        })
        .collect();
    let c1 = nodes[1].server.client();
    let acked =
        |name: &str| c1.ok("GET", &format!("/v1/jobs/{name}"), None).ok()?["acknowledged"].as_u64();
    wait_for("both jobs to run", || {
        (acked("pa")? >= 4 && acked("pb")? >= 2).then_some(())
    });
    let (at_a, at_b) = (acked("pa").unwrap(), acked("pb").unwrap());
    let killed = restart_leader(&mut nodes, None, grace);
    eprintln!(
        "leader killed with pa at {at_a} and pb at {at_b} acknowledged on node-1, restarted in {:?}",
        killed.elapsed()
    );
    let got_a: Vec<Value> = a.into_iter().map(finish).collect();
    let got_b: Vec<Value> = b.into_iter().map(finish).collect();
    exact_epochs(&got_a, 3, (n / 6) as usize, &(0..n).collect());
    exact_epochs(&got_b, 2, 18, &(12..48).collect());
    // Both were resumed from what the nodes reported (not started again).
    let log = nodes[0].server.log.text();
    assert_eq!(
        log.matches("multi-node job resumed after the leader's restart")
            .count(),
        2,
        "{log}"
    );
    let (generation, jobs) = leader_jobs(&nodes).unwrap();
    assert_eq!(generation, 2, "a new generation at the restart");
    for name in ["pa", "pb"] {
        let j = jobs.iter().find(|j| j["name"] == name).unwrap();
        assert_eq!(j["state"], "finished", "{j}");
    }
    // The same in the leader's metrics.
    let url = format!("{}/metrics", nodes[0].server.url);
    let (status, text) = crate::observability::get_text(&url, None);
    assert_eq!(status, 200, "{text}");
    let (_, samples) = crate::observability::parse_prometheus(&text);
    let v = |name: &str, labels: &[(&str, &str)]| {
        crate::observability::value(&samples, name, labels).unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(v("joader_cluster_generation", &[]), 2.0);
    assert_eq!(v("joader_cluster_jobs", &[("state", "finished")]), 2.0);
    assert_eq!(v("joader_cluster_jobs", &[("state", "failed")]), 0.0);
    eprintln!(
        "loads {} for the union of {n} over 3 epochs (the sum of the jobs' epochs: {})",
        loads(&nodes[1..]),
        3 * n + 2 * 36
    );
}

#[test]
fn a_leader_back_after_the_grace_period_finds_its_jobs_failed() {
    let grace = "1500";
    let mut nodes = cluster_with("late", 2, &["--leader-grace-ms", grace], &["--leader-only"]);
    let ranks = slow_two_rank_job(&nodes, "late");
    let mut leader = nodes[0].server.child.take().unwrap();
    leader.kill().unwrap();
    leader.wait().unwrap();
    every_rank_fails(
        ranks,
        &["job_failed", "did not come back within the grace period"],
    );
    // Back too late: its journaled job is failed, the reason given.
    start_leader(&mut nodes, None, grace);
    let job = wait_for("the leader to list the job failed", || {
        let (_, jobs) = leader_jobs(&nodes)?;
        jobs.into_iter()
            .find(|j| j["name"] == "late" && j["state"] == "failed")
    });
    let reason = job["reason"].as_str().unwrap();
    assert!(reason.contains("came back without it"), "{job}");
}

#[test]
fn a_stale_leader_is_refused() {
    let grace = "3000";
    let mut nodes = cluster_with(
        "stale",
        2,
        &["--leader-grace-ms", grace],
        &["--leader-only"],
    );
    // A restart: generation 2, which both followers register with.
    restart_leader(&mut nodes, None, grace);
    let c0 = nodes[0].server.client();
    c0.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    ready_everywhere(&c0, 2, |_| true);
    assert_eq!(leader_jobs(&nodes).unwrap().0, 2);
    let ranks = slow_two_rank_job(&nodes, "st");
    // Replaced by a leader of an older journal (a fresh data folder: generation 1).
    let old = TempDir::new("stale-old");
    restart_leader(&mut nodes, Some(&old.0), grace);
    assert_eq!(leader_jobs(&nodes).unwrap().0, 1);
    every_rank_fails(ranks, &["a stale leader is refused"]);
}

#[test]
fn a_leader_restarted_while_ranks_join_starts_the_job_once_the_last_one_joins() {
    let grace = "60000";
    let mut nodes = cluster_with(
        "joining",
        2,
        &["--leader-grace-ms", grace],
        &["--leader-only"],
    );
    let n = crate::server::CLASSES * crate::server::PER_CLASS;
    let body = |r: u32| job("jn", 2, 1, r, json!({"epochs": 2}));
    let first = consumer(&nodes[1].server.url, &body(0), &["--rank", "0"]);
    wait_for("the leader to hold the job, joining", || {
        let (_, jobs) = leader_jobs(&nodes)?;
        jobs.iter()
            .any(|j| j["name"] == "jn" && j["state"] == "joining")
            .then_some(())
    });
    restart_leader(&mut nodes, None, grace);
    let second = consumer(&nodes[2].server.url, &body(1), &["--rank", "1"]);
    let got = [finish(first), finish(second)];
    exact_epochs(&got, 2, (n / 2) as usize, &(0..n).collect());
    let (_, jobs) = leader_jobs(&nodes).unwrap();
    let j = jobs.iter().find(|j| j["name"] == "jn").unwrap();
    assert_eq!(j["state"], "finished", "{j}");
}
