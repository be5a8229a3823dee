//! Many nodes on one machine: a leader and followers as separate `joader serve` processes
//! (distinct ports, instances and node names) over one shared ImageFolder; ranks are
//! `joader consume` processes registered with their own node's server. A multi-node job
//! checkpointed on three nodes resumes on two.

use std::collections::BTreeSet;
use std::time::Instant;

use serde_json::{Value, json};

use crate::common::{
    TempDir, TestServer, consumer, finish, shm_objects, unique_instance, wait_for,
};
use crate::server::{dataset, epoch_ids};

pub(crate) struct Node {
    pub(crate) server: TestServer,
    pub(crate) _dir: TempDir,
}

/// A node timeout far above any stall of a loaded machine, for the tests that do not lose a
/// node by its silence: a node killed (or a leader) is lost at once through its broken
/// stream, and a process starved for a few seconds must not be lost (its multi-node jobs
/// would fail). Only the frozen follower's test is about the timeout, and sets its own.
pub(crate) const NO_TIMEOUT: [&str; 2] = ["--node-timeout-ms", "60000"];

/// A leader (`node-0`) and `followers` followers (`node-1`, …), the leader's dataset `imgs`
/// indexed by every node. Nodes time out after [`NO_TIMEOUT`] unless `extra` sets
/// `--node-timeout-ms`.
fn cluster(tag: &str, followers: usize, extra: &[&str]) -> Vec<Node> {
    cluster_with(tag, followers, extra, &[])
}

/// [`cluster`], the leader started with `leader_extra` too (`--leader-only`: it is not a node).
pub(crate) fn cluster_with(
    tag: &str,
    followers: usize,
    extra: &[&str],
    leader_extra: &[&str],
) -> Vec<Node> {
    let root = dataset();
    let start = |i: usize, leader: Option<&str>| {
        let dir = TempDir::new(&format!("{tag}{i}"));
        let name = format!("node-{i}");
        let mut args = vec!["--node-name", name.as_str()];
        match leader {
            Some(l) => args.extend(["--leader", l]),
            None => args.extend(leader_extra),
        }
        if !extra.contains(&NO_TIMEOUT[0]) {
            args.extend(NO_TIMEOUT);
        }
        args.extend(extra);
        let server = TestServer::start(&unique_instance(&format!("{tag}{i}")), &dir.0, root, &args);
        Node { server, _dir: dir }
    };
    let mut nodes = vec![start(0, None)];
    let leader = nodes[0].server.url.clone();
    for i in 1..=followers {
        nodes.push(start(i, Some(&leader)));
    }
    let c = nodes[0].server.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    c.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    let count = followers + usize::from(!leader_extra.contains(&"--leader-only"));
    ready_everywhere(&c, count, |_| true);
    nodes
}

/// Waits until `count` nodes are alive at the leader (client `c`) with dataset `imgs` ready
/// and `also` true of the node's view of it.
pub(crate) fn ready_everywhere(
    c: &joader_tools::client::Client,
    count: usize,
    also: impl Fn(&Value) -> bool,
) {
    wait_for(
        "every node alive at the leader with the dataset ready",
        || {
            let v = c.ok("GET", "/v1/nodes", None).ok()?;
            let ready = v["nodes"].as_array()?.iter().filter(|n| {
                n["state"] == "alive"
                    && n["datasets"].as_array().is_some_and(|d| {
                        d.iter()
                            .any(|d| d["name"] == "imgs" && d["state"] == "ready" && also(d))
                    })
            });
            (ready.count() == count).then_some(())
        },
    );
}

pub(crate) fn job(name: &str, world: u32, local: u32, rank: u32, extra: Value) -> Value {
    let mut j = json!({"name": name, "dataset": "imgs", "batch_size": 4, "world_size": world,
        "local_world_size": local, "rank": rank, "pipeline": {"kind": "raw"}});
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    j
}

pub(crate) fn loads(nodes: &[Node]) -> u64 {
    nodes
        .iter()
        .map(|n| {
            n.server.client().ok("GET", "/v1/stats", None).unwrap()["loads"]
                .as_u64()
                .unwrap()
        })
        .sum()
}

/// The first test: a 6-rank job, 2 ranks on each of 3 nodes, for 3 epochs: every
/// rank receives ⌈N/W⌉ elements, the shares are disjoint and together are the epoch.
#[test]
fn a_six_rank_job_on_three_nodes_gets_equal_disjoint_shares_of_each_epoch() {
    let nodes = cluster("ddp", 2, &[]);
    let n = (crate::server::CLASSES * crate::server::PER_CLASS) as usize;
    let ranks: Vec<_> = (0..6u32)
        .map(|r| {
            let url = &nodes[(r / 2) as usize].server.url;
            consumer(
                url,
                &job("ddp", 6, 2, r, json!({"epochs": 3})),
                &["--rank", &r.to_string()],
            )
        })
        .collect();
    let got: Vec<Value> = ranks.into_iter().map(finish).collect();
    for e in 0..3 {
        let mut all = Vec::new();
        for (r, s) in got.iter().enumerate() {
            let ids = epoch_ids(s, e);
            assert_eq!(ids.len(), n / 6, "rank {r} epoch {e}: {ids:?}");
            all.extend(ids);
        }
        let set: BTreeSet<u32> = all.iter().copied().collect();
        assert_eq!(all.len(), n, "epoch {e}");
        assert_eq!(
            set,
            (0..n as u32).collect(),
            "epoch {e}: an exact permutation"
        );
    }
    // Each element was read once per node that received it: at most once per epoch.
    assert!(loads(&nodes) <= 3 * n as u64);
    // The leader's metrics: three nodes alive, and each node's 2 ranks × n/6 × 3 epochs
    // placed on it (n is a multiple of 6: no padding).
    let url = format!("{}/metrics", nodes[0].server.url);
    let (status, text) = crate::observability::get_text(&url, None);
    assert_eq!(status, 200, "{text}");
    let (types, samples) = crate::observability::parse_prometheus(&text);
    assert_eq!(types["joader_cluster_nodes"], "gauge");
    assert_eq!(types["joader_cluster_placements_total"], "counter");
    let v = |name: &str, labels: &[(&str, &str)]| {
        crate::observability::value(&samples, name, labels).unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(v("joader_cluster_nodes", &[("state", "alive")]), 3.0);
    assert_eq!(v("joader_cluster_nodes", &[("state", "lost")]), 0.0);
    for i in 0..3 {
        let node = format!("node-{i}");
        assert_eq!(
            v("joader_cluster_placements_total", &[("node", &node)]),
            n as f64,
            "{node}"
        );
    }
}

/// Two multi-node jobs on overlapping subsets, on the same three nodes: each element is
/// loaded about once cluster-wide (the union), not once per job (the sum); exactly, at most
/// the union plus the placements that overflowed a node's quota.
#[test]
fn overlapping_multi_node_jobs_load_each_element_about_once_cluster_wide() {
    let nodes = cluster("overlap", 2, &[]);
    let subsets = [(0u32, 36u32), (12, 48)];
    let mut children = Vec::new();
    for (j, (a, b)) in subsets.iter().enumerate() {
        for r in 0..3u32 {
            let body = job(
                &format!("ov{j}"),
                3,
                1,
                r,
                json!({"epochs": 1, "subset": {"start": a, "end": b}}),
            );
            children.push(consumer(
                &nodes[r as usize].server.url,
                &body,
                &["--rank", &r.to_string()],
            ));
        }
    }
    for c in children {
        let s = finish(c);
        assert_eq!(epoch_ids(&s, 0).len(), 12);
    }
    // Hash placement is a function of the ids and node names: the overflows (a node's
    // hashed elements above its quota of 12) are known.
    let keys: Vec<u64> = (0..3)
        .map(|i| joader_core::cluster::node_key(&format!("node-{i}")))
        .collect();
    let overflow: u64 = subsets
        .iter()
        .map(|&(a, b)| {
            let mut per = [0u64; 3];
            for e in a..b {
                per[joader_core::cluster::place(&keys, &keys, e).unwrap()] += 1;
            }
            per.iter().map(|&c| c.saturating_sub(12)).sum::<u64>()
        })
        .sum();
    let total = wait_for("the loads counted", || Some(loads(&nodes)));
    eprintln!("loads {total}, union 48, sum 72, bound {}", 48 + overflow);
    assert!(
        total >= 48,
        "every element of the union was loaded: {total}"
    );
    assert!(
        total <= 48 + overflow,
        "loads {total} above the union + overflows {}",
        48 + overflow
    );
}

/// A follower killed mid-epoch: the leader loses it through its broken stream (not a
/// timeout: the nodes' is [`NO_TIMEOUT`]), fails the job, and the ranks on the other nodes
/// end with `job_failed` (printed: how long after the kill).
#[test]
fn a_killed_follower_fails_the_multi_node_job_on_the_other_nodes() {
    let mut nodes = cluster("kill", 2, &[]);
    let mut ranks: Vec<_> = (0..3u32)
        .map(|r| {
            consumer(
                &nodes[r as usize].server.url,
                &job("k", 3, 1, r, json!({})),
                &["--rank", &r.to_string(), "--sample-us", "2000"],
            )
        })
        .collect();
    let c0 = nodes[0].server.client();
    wait_for("the job to run on the leader's node", || {
        let j = c0.ok("GET", "/v1/jobs/k", None).ok()?;
        (j["acknowledged"].as_u64()? > 0).then_some(())
    });
    let mut victim = nodes[2].server.child.take().unwrap();
    victim.kill().unwrap();
    victim.wait().unwrap();
    let killed = Instant::now();
    let _ = ranks[2].kill();
    let _ = ranks.pop().unwrap().wait();
    for (r, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {r} went on");
        assert!(
            err.contains("job_failed") && err.contains("node-2"),
            "rank {r}: {err}"
        );
        eprintln!("rank {r} failed {:?} after the kill", killed.elapsed());
    }
    wait_for("node-2 lost at the leader", || {
        let v = c0.ok("GET", "/v1/nodes", None).ok()?;
        let n = v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == "node-2")?;
        (n["state"] == "lost").then_some(())
    });
}

/// The leader killed mid-epoch and not restarted: the followers pause their multi-node job,
/// fail it when their grace period ends (`job_failed`, saying so) and keep serving a
/// single-node job throughout.
#[test]
fn a_killed_leader_fails_multi_node_jobs_and_single_node_jobs_go_on() {
    // A grace period that ends: the leader does not come back.
    let mut nodes = cluster("lead", 2, &["--leader-grace-ms", "1500"]);
    let multi: Vec<_> = (0..2u32)
        .map(|r| {
            consumer(
                &nodes[1 + r as usize].server.url,
                &job("m", 2, 1, r, json!({})),
                &["--rank", &r.to_string(), "--sample-us", "2000"],
            )
        })
        .collect();
    let mut single = consumer(
        &nodes[1].server.url,
        &json!({"name": "solo", "dataset": "imgs", "batch_size": 4, "pipeline": {"kind": "raw"}}),
        &["--sample-us", "1000"],
    );
    let c1 = nodes[1].server.client();
    wait_for("the multi-node job to run", || {
        let j = c1.ok("GET", "/v1/jobs/m", None).ok()?;
        (j["acknowledged"].as_u64()? > 0).then_some(())
    });
    let mut leader = nodes[0].server.child.take().unwrap();
    leader.kill().unwrap();
    leader.wait().unwrap();
    let killed = Instant::now();
    for (r, child) in multi.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("job_failed"),
            "rank {r}: {err}"
        );
        assert!(
            err.contains("did not come back within the grace period"),
            "rank {r}: {err}"
        );
        eprintln!(
            "rank {r} failed {:?} after the leader was killed",
            killed.elapsed()
        );
    }
    // The single-node job reads on with the leader gone: another epoch after the failures.
    let acked = |c: &joader_tools::client::Client| {
        c.ok("GET", "/v1/jobs/solo", None).ok()?["acknowledged"].as_u64()
    };
    let before = acked(&c1).unwrap();
    wait_for("the single-node job to read another epoch", || {
        (acked(&c1)? >= before + 48).then_some(())
    });
    let j = c1.ok("GET", "/v1/jobs/solo", None).unwrap();
    assert_eq!(j["state"], "running", "{j}");
    single.kill().unwrap();
    single.wait().unwrap();
}

/// The leader killed and restarted on its address (same catalog, same instance): its start-up
/// removes the segments the killed process left, the follower registers again by itself, and a
/// new multi-node job across both nodes reads an exact epoch.
#[test]
fn a_restarted_leader_cleans_its_stale_segments_and_the_follower_rejoins() {
    // The leader also serves ranks: its own ranks die with it, and the follower's fail at the
    // end of its grace period.
    let mut nodes = cluster("rejoin", 1, &["--leader-grace-ms", "1500"]);
    let n = (crate::server::CLASSES * crate::server::PER_CLASS) as usize;
    // A multi-node job running when the leader dies: its rings are in /dev/shm.
    let before: Vec<_> = (0..2u32)
        .map(|r| {
            consumer(
                &nodes[r as usize].server.url,
                &job("old", 2, 1, r, json!({})),
                &["--rank", &r.to_string(), "--sample-us", "2000"],
            )
        })
        .collect();
    let c0 = nodes[0].server.client();
    wait_for("the job to run", || {
        let j = c0.ok("GET", "/v1/jobs/old", None).ok()?;
        (j["acknowledged"].as_u64()? > 0).then_some(())
    });
    let instance = {
        let log = nodes[0].server.log.text();
        let i = log.find("instance=").expect("the server logs its instance") + 9;
        log[i..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
            .collect::<String>()
    };
    let stale: Vec<String> = shm_objects(&instance)
        .into_iter()
        .filter(|o| o.contains("-ring-old"))
        .collect();
    assert!(!stale.is_empty(), "{:?}", shm_objects(&instance));
    let addr = nodes[0]
        .server
        .url
        .trim_start_matches("http://")
        .to_string();
    let mut leader = nodes[0].server.child.take().unwrap();
    leader.kill().unwrap();
    leader.wait().unwrap();
    for (r, child) in before.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "rank {r} of the old job went on");
    }
    assert!(
        stale
            .iter()
            .all(|o| std::path::Path::new(&format!("/dev/shm/{o}")).exists()),
        "a killed server leaves its segments"
    );
    // Restarted on the same address, catalog and instance.
    let root = dataset();
    let restarted = TestServer::start(
        &instance,
        &nodes[0]._dir.0,
        root,
        &[&["--node-name", "node-0", "--bind", &addr][..], &NO_TIMEOUT].concat(),
    );
    assert!(
        stale
            .iter()
            .all(|o| !std::path::Path::new(&format!("/dev/shm/{o}")).exists()),
        "stale segments left: {:?}",
        shm_objects(&instance)
    );
    nodes[0].server = restarted;
    let c0 = nodes[0].server.client();
    c0.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    wait_for("both nodes registered with the restarted leader", || {
        let v = c0.ok("GET", "/v1/nodes", None).ok()?;
        let alive = v["nodes"]
            .as_array()?
            .iter()
            .filter(|n| n["state"] == "alive")
            .count();
        (alive == 2).then_some(())
    });
    let ranks: Vec<_> = (0..2u32)
        .map(|r| {
            consumer(
                &nodes[r as usize].server.url,
                &job("new", 2, 1, r, json!({"epochs": 1})),
                &["--rank", &r.to_string()],
            )
        })
        .collect();
    let mut all: Vec<u32> = ranks
        .into_iter()
        .flat_map(|c| epoch_ids(&finish(c), 0))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
}

/// A follower that cannot read a dataset's source (here: outside its `--allowed-root`) reports
/// the dataset as failed, with the reason, in the leader's `GET /v1/nodes`.
#[test]
fn a_follower_that_cannot_read_the_source_reports_the_dataset_failed() {
    let root = dataset();
    let (d0, d1) = (TempDir::new("srcfail0"), TempDir::new("srcfail1"));
    let elsewhere = TempDir::new("srcfail-root");
    let leader = TestServer::start(
        &unique_instance("srcfail0"),
        &d0.0,
        root,
        &[&["--node-name", "node-0"][..], &NO_TIMEOUT].concat(),
    );
    let _follower = TestServer::start(
        &unique_instance("srcfail1"),
        &d1.0,
        &elsewhere.0,
        &[
            &["--node-name", "node-1", "--leader", &leader.url][..],
            &NO_TIMEOUT,
        ]
        .concat(),
    );
    let c = leader.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    let failed = wait_for("node-1 to report the dataset", || {
        let v = c.ok("GET", "/v1/nodes", None).ok()?;
        let node = v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == "node-1")?
            .clone();
        node["datasets"]
            .as_array()?
            .iter()
            .find(|d| d["name"] == "imgs" && d["state"] == "failed")
            .cloned()
    });
    let reason = failed["error"].as_str().unwrap_or_default();
    assert!(reason.contains("allowed"), "{failed}");
}

/// Ranks of one job on one server at different speeds: the fast rank reads its share, leaves,
/// and the slow ranks still read theirs to the end (a rank that left after the end of its
/// share used to close the job's every ring).
#[test]
fn a_fast_rank_that_leaves_first_does_not_cut_the_slow_ranks_short() {
    let dir = TempDir::new("ranks");
    let root = dataset();
    let server = TestServer::start(&unique_instance("ranks"), &dir.0, root, &[]);
    let c = server.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    c.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    let n = (crate::server::CLASSES * crate::server::PER_CLASS) as usize;
    let ranks: Vec<_> = (0..3u32)
        .map(|r| {
            let pace = if r == 0 { "0" } else { "20000" };
            consumer(
                &server.url,
                &job("speeds", 3, 3, r, json!({"epochs": 1})),
                &["--rank", &r.to_string(), "--sample-us", pace],
            )
        })
        .collect();
    let mut all: Vec<u32> = ranks
        .into_iter()
        .flat_map(|c| epoch_ids(&finish(c), 0))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
}

/// The node timeout of the frozen follower's test (see there), in milliseconds.
const FROZEN_TIMEOUT: &str = "10000";

/// A follower that stops heartbeating without dying (SIGSTOP): the leader marks it lost and the
/// ranks on the other nodes end with `job_failed`; resumed, the follower learns that the leader
/// lost it (404), fails its own rank of the job and registers again.
///
/// Only silence can lose a frozen node (its connections stay open), so this test keeps a
/// timeout, [`FROZEN_TIMEOUT`]: long enough that no node that merely runs slowly on a loaded
/// machine is lost (which would fail the job in another node's name), waited for as a state.
#[test]
fn a_frozen_follower_is_lost_then_rejoins_when_it_resumes() {
    use rustix::process::{Pid, Signal, kill_process};
    let nodes = cluster("frozen", 2, &["--node-timeout-ms", FROZEN_TIMEOUT]);
    let mut ranks: Vec<_> = (0..3u32)
        .map(|r| {
            consumer(
                &nodes[r as usize].server.url,
                &job("fz", 3, 1, r, json!({})),
                &["--rank", &r.to_string(), "--sample-us", "2000"],
            )
        })
        .collect();
    let c0 = nodes[0].server.client();
    wait_for("the job to run on the leader's node", || {
        let j = c0.ok("GET", "/v1/jobs/fz", None).ok()?;
        (j["acknowledged"].as_u64()? > 0).then_some(())
    });
    let frozen = nodes[2].server.child.as_ref().unwrap().id();
    let pid = Pid::from_raw(frozen as i32).unwrap();
    kill_process(pid, Signal::STOP).unwrap();
    let stopped = Instant::now();
    let third = ranks.pop().unwrap();
    for (r, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {r} went on");
        assert!(
            err.contains("job_failed") && err.contains("node-2"),
            "rank {r}: {err}"
        );
        eprintln!("rank {r} failed {:?} after the stop", stopped.elapsed());
    }
    let state = |name: &str| {
        let v = c0.ok("GET", "/v1/nodes", None).ok()?;
        let n = v["nodes"].as_array()?.iter().find(|n| n["name"] == name)?;
        n["state"].as_str().map(String::from)
    };
    wait_for("node-2 lost at the leader", || {
        (state("node-2")?.as_str() == "lost").then_some(())
    });
    kill_process(pid, Signal::CONT).unwrap();
    let out = third.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("job_failed"),
        "rank 2: {err}"
    );
    wait_for("node-2 alive again", || {
        (state("node-2")?.as_str() == "alive").then_some(())
    });
}

/// With a bearer token, the follower sends it to the leader (`--token`): it registers, learns
/// the dataset and serves a multi-node job; a follower with another token never registers.
#[test]
fn followers_send_the_token_to_the_leader() {
    let root = dataset();
    let dirs: Vec<TempDir> = (0..3).map(|i| TempDir::new(&format!("tok{i}"))).collect();
    let start = |i: usize, token: &str, leader: Option<&str>| {
        let name = format!("node-{i}");
        let mut args = vec!["--node-name", name.as_str(), "--token", token];
        args.extend(NO_TIMEOUT);
        if let Some(l) = leader {
            args.extend(["--leader", l]);
        }
        TestServer::start(
            &unique_instance(&format!("tok{i}")),
            &dirs[i].0,
            root,
            &args,
        )
    };
    let leader = start(0, "s3cret", None);
    let follower = start(1, "s3cret", Some(&leader.url));
    let _impostor = start(2, "wrong", Some(&leader.url));
    let anonymous = leader.client();
    let (status, _) = anonymous.call("GET", "/v1/nodes", None).unwrap();
    assert_eq!(status, 401);
    let c = leader.client().with_token(Some("s3cret".into()));
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    wait_for("node-1 ready with the dataset", || {
        let v = c.ok("GET", "/v1/nodes", None).ok()?;
        v["nodes"]
            .as_array()?
            .iter()
            .any(|n| {
                n["name"] == "node-1"
                    && n["datasets"]
                        .as_array()
                        .is_some_and(|d| d.iter().any(|d| d["state"] == "ready"))
            })
            .then_some(())
    });
    let n = (crate::server::CLASSES * crate::server::PER_CLASS) as usize;
    let urls = [&leader.url, &follower.url];
    let ranks: Vec<_> = (0..2u32)
        .map(|r| {
            consumer(
                urls[r as usize],
                &job("tk", 2, 1, r, json!({"epochs": 1})),
                &["--rank", &r.to_string(), "--token", "s3cret"],
            )
        })
        .collect();
    let mut all: Vec<u32> = ranks
        .into_iter()
        .flat_map(|c| epoch_ids(&finish(c), 0))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
    let v = c.ok("GET", "/v1/nodes", None).unwrap();
    let names: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert!(!names.contains(&"node-2"), "{v}");
}

/// A multi-node job whose ranks read their last records slowly, long after the leader sampled
/// the end of the job (and forgot it): they read the whole epoch, no failure.
#[test]
fn slow_ranks_read_a_multi_node_job_to_its_end() {
    let nodes = cluster("slowend", 1, &[]);
    let n = (crate::server::CLASSES * crate::server::PER_CLASS) as usize;
    let ranks: Vec<_> = (0..2u32)
        .map(|r| {
            consumer(
                &nodes[r as usize].server.url,
                &job("slow", 2, 1, r, json!({"epochs": 1})),
                &["--rank", &r.to_string(), "--sample-us", "60000"],
            )
        })
        .collect();
    let mut all: Vec<u32> = ranks
        .into_iter()
        .flat_map(|c| epoch_ids(&finish(c), 0))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
}

/// Runs a 6-rank multi-node job (`body(rank)`, two ranks per node) until every rank has read
/// `per_rank` samples of epoch 0, then kills its ranks (preempted) and waits for job `name` to
/// fail on every node: what the ranks read, their shares disjoint.
fn preempt(
    nodes: &[Node],
    name: &str,
    per_rank: usize,
    body: impl Fn(u32) -> Value,
) -> BTreeSet<u32> {
    use crate::resume::dumped;
    let dumps: Vec<TempDir> = (0..6)
        .map(|r| TempDir::new(&format!("{name}-preempted-dump{r}")))
        .collect();
    let first: Vec<_> = (0..6u32)
        .map(|r| {
            let dir = dumps[r as usize].0.to_str().unwrap().to_string();
            consumer(
                &nodes[(r / 2) as usize].server.url,
                &body(r),
                &[
                    "--rank",
                    &r.to_string(),
                    "--stop-after",
                    &per_rank.to_string(),
                    "--dump",
                    &dir,
                ],
            )
        })
        .collect();
    wait_for(&format!("every rank to read {per_rank} samples"), || {
        dumps
            .iter()
            .all(|d| dumped(&d.0).len() >= per_rank)
            .then_some(())
    });
    for mut c in first {
        c.kill().unwrap(); // preempted
        c.wait().unwrap();
    }
    let mut consumed = BTreeSet::new();
    for d in &dumps {
        let got = dumped(&d.0);
        assert_eq!(got.len(), per_rank);
        assert!(got.iter().all(|&(e, _)| e == 0));
        consumed.extend(got.iter().map(|&(_, id)| id));
    }
    assert_eq!(
        consumed.len(),
        6 * per_rank,
        "the ranks' shares are disjoint"
    );
    for (i, node) in nodes.iter().enumerate() {
        let c = node.server.client();
        wait_for(&format!("the job failed on node-{i}"), || {
            let j = c.ok("GET", &format!("/v1/jobs/{name}"), None).ok()?;
            (j["state"] == "failed").then_some(())
        });
    }
    consumed
}

/// Resumes a 6-rank job that [`preempt`] stopped after `consumed` as 4 ranks, two on each of
/// the first two nodes (`body(rank, resume)`: the registration with that `resume`), and
/// returns each rank's summary once it has ended.
fn resume_on_four_ranks(
    nodes: &[Node],
    consumed: &BTreeSet<u32>,
    body: impl Fn(u32, Value) -> Value,
) -> Vec<Value> {
    let resume = json!({"epoch": 0, "consumed": crate::resume::encode(consumed.iter().copied()),
                        "ranks": [0, 1, 2, 3, 4, 5], "world_size": 6});
    let resumed: Vec<_> = (0..4u32)
        .map(|r| {
            consumer(
                &nodes[(r / 2) as usize].server.url,
                &body(r, resume.clone()),
                &["--rank", &r.to_string()],
            )
        })
        .collect();
    resumed.into_iter().map(finish).collect()
}

/// The second epoch of the resumed ranks `got`: `per_rank` each, together every one of the
/// dataset's `n` elements once.
fn the_next_epoch_is_whole(got: &[Value], per_rank: usize, n: u32) {
    let mut next = Vec::new();
    for (r, s) in got.iter().enumerate() {
        let ids = epoch_ids(s, 1);
        assert_eq!(ids.len(), per_rank, "rank {r}: a whole epoch's share");
        next.extend(ids);
    }
    next.sort_unstable();
    assert_eq!(next, (0..n).collect::<Vec<_>>(), "the next epoch is whole");
}

/// Elastic resume: a 6-rank job on three nodes, stopped after a batch of 5 samples per rank
/// (its ranks killed, as if preempted), resumed from the union of what they read on two nodes with 4
/// ranks: the new ranks share the rest of the epoch equally (18 left: 5 each, 2 of them
/// padded by the leader), their shares together are exactly that rest, and the next epoch is
/// whole, 12 per rank.
#[test]
fn a_six_rank_job_saved_mid_epoch_resumes_on_two_nodes_with_four_ranks() {
    let nodes = cluster("elastic", 2, &[]);
    let n = crate::server::CLASSES * crate::server::PER_CLASS;
    let settings = json!({"epochs": 2, "seed": 3, "batch_size": 5});
    let consumed = preempt(&nodes, "el", 5, |r| job("el", 6, 2, r, settings.clone()));
    let got = resume_on_four_ranks(&nodes, &consumed, |r, resume| {
        let mut j = job("el", 4, 2, r, settings.clone());
        j["resume"] = resume;
        j
    });
    let rest: BTreeSet<u32> = (0..n).filter(|i| !consumed.contains(i)).collect();
    let mut all = Vec::new();
    for (r, s) in got.iter().enumerate() {
        let ids = epoch_ids(s, 0);
        assert_eq!(ids.len(), 5, "rank {r}: ⌈18/4⌉ of the rest: {ids:?}");
        all.extend(ids);
    }
    let seen: BTreeSet<u32> = all.iter().copied().collect();
    // 20 records: the 18 ids of the rest once each, and 2 of them again as padding.
    assert_eq!(seen, rest, "the new ranks' shares are exactly the rest");
    assert_eq!(all.len() - seen.len(), 2, "two records of padding");
    the_next_epoch_is_whole(&got, 12, n);
}

/// A leader (`node-0`) and `followers` followers over dataset `imgs` of `n` raw elements in
/// `s3s-fs` behind the bench's delay proxy (30 ms), every node reporting its fetch time.
struct S3Cluster {
    nodes: Vec<Node>,
    _proxy: joader_tools::bench::e2e::proxy::DelayProxy,
    _s3: crate::s3::S3Server,
}

fn s3_cluster(tag: &str, followers: usize, n: u32) -> Option<S3Cluster> {
    use crate::s3::{S3Server, credentials, s3s_fs};
    let bin = s3s_fs(tag)?;
    let s3 = S3Server::start(bin, tag);
    let folder = s3.bucket().join("far");
    for i in 0..n {
        let class = folder.join(format!("c{}", i % 3));
        std::fs::create_dir_all(&class).unwrap();
        let bytes: Vec<u8> = (0..(1000 + i * 7)).map(|b| (b * 31 + i) as u8).collect();
        std::fs::write(class.join(format!("{i:04}.jpg")), bytes).unwrap();
    }
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], s3.port()));
    let proxy = joader_tools::bench::e2e::proxy::DelayProxy::start(
        upstream,
        std::time::Duration::from_millis(30),
    )
    .unwrap();
    let env: Vec<(&str, String)> = credentials(&s3)
        .into_iter()
        .map(|(k, v)| match k {
            "AWS_ENDPOINT_URL" => (k, proxy.endpoint()),
            _ => (k, v),
        })
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let bucket = s3.bucket();
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..=followers {
        let dir = TempDir::new(&format!("{tag}{i}"));
        let name = format!("node-{i}");
        let mut args = vec!["--node-name", name.as_str(), "--allowed-s3", "s3://bkt"];
        args.extend(NO_TIMEOUT);
        let leader = nodes.first().map(|l| l.server.url.clone());
        if let Some(l) = &leader {
            args.extend(["--leader", l.as_str()]);
        }
        let instance = unique_instance(&format!("{tag}{i}"));
        let server = TestServer::start_env(&instance, &dir.0, &bucket, &args, &env);
        nodes.push(Node { server, _dir: dir });
    }
    let c = nodes[0].server.client();
    let source = json!({"kind": "s3", "url": "s3://bkt/far", "layout": "image_folder"});
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": source})),
    )
    .unwrap();
    c.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    // Every node reports the dataset ready, and how long a fetch of it takes there.
    ready_everywhere(&c, followers + 1, |d| {
        d["fetch_ms"].as_f64().is_some_and(|ms| ms > 0.0)
    });
    Some(S3Cluster {
        nodes,
        _proxy: proxy,
        _s3: s3,
    })
}

/// A multi-node job over an object store 30 ms away (`s3s-fs` behind the bench's delay
/// proxy): the leader samples ahead by the fetch time its nodes report, and sends each node
/// the picks it will place there, whose bytes the node fetches before their placement. Every
/// node's loads find bytes fetched ahead, few fetched ahead go unused (a guess misses only
/// where a quota fills near an epoch's end), and the epochs stay exact.
#[test]
fn a_multi_node_job_on_an_object_store_fetches_ahead_on_every_node() {
    let n = 300u32;
    let Some(cl) = s3_cluster("cluster_ahead", 2, n) else {
        return;
    };
    let nodes = &cl.nodes;
    let ranks: Vec<_> = (0..6u32)
        .map(|r| {
            let url = &nodes[(r / 2) as usize].server.url;
            consumer(
                url,
                &job("far", 6, 2, r, json!({"epochs": 2, "ring_capacity": 8})),
                &["--rank", &r.to_string()],
            )
        })
        .collect();
    let got: Vec<Value> = ranks.into_iter().map(finish).collect();
    for e in 0..2 {
        let mut all = Vec::new();
        for (r, s) in got.iter().enumerate() {
            let ids = epoch_ids(s, e);
            assert_eq!(ids.len(), n as usize / 6, "rank {r} epoch {e}");
            all.extend(ids);
        }
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "epoch {e}: exact");
    }
    let (mut requested, mut taken) = (0.0, 0.0);
    for (i, node) in nodes.iter().enumerate() {
        let text = crate::common::scrape(&node.server.url);
        let m = |name: &str| {
            crate::common::series(&text, name).unwrap_or_else(|| panic!("node-{i}: no {name}"))
        };
        let r = m("joader_s3_fetch_ahead_requests_total");
        let t = m("joader_s3_fetch_ahead_hits_total") + m("joader_s3_fetch_ahead_joined_total");
        assert!(t > 0.0, "node-{i}: no load found its bytes fetched ahead");
        (requested, taken) = (requested + r, taken + t);
    }
    assert!(
        taken >= 0.9 * requested,
        "{requested} elements fetched ahead, {taken} of them taken by their loads"
    );
}

/// Elastic resume of a multi-node job whose dataset is fetched ahead: a 6-rank job on three
/// nodes over an object store 30 ms away, stopped after a batch per rank, resumed with 4 ranks
/// on two nodes: the leader's held picks of the first run are gone with it, and the resumed
/// job's shares are exactly the rest of the epoch, then a whole epoch.
#[test]
fn a_multi_node_job_fetched_ahead_resumes_on_fewer_nodes_exactly() {
    let n = 300u32;
    let Some(cl) = s3_cluster("cluster_ahead_resume", 2, n) else {
        return;
    };
    let nodes = &cl.nodes;
    let settings = json!({"epochs": 2, "seed": 5, "batch_size": 10, "ring_capacity": 10});
    let consumed = preempt(nodes, "far", 10, |r| job("far", 6, 2, r, settings.clone()));
    let got = resume_on_four_ranks(nodes, &consumed, |r, resume| {
        let mut j = job("far", 4, 2, r, settings.clone());
        j["resume"] = resume;
        j
    });
    // 240 left: 60 per rank, no padding.
    let rest: Vec<u32> = (0..n).filter(|i| !consumed.contains(i)).collect();
    let mut all = Vec::new();
    for (r, s) in got.iter().enumerate() {
        let ids = epoch_ids(s, 0);
        assert_eq!(ids.len(), 60, "rank {r}: a quarter of the rest");
        all.extend(ids);
    }
    all.sort_unstable();
    assert_eq!(all, rest, "the new ranks' shares are exactly the rest");
    the_next_epoch_is_whole(&got, 75, n);
}
