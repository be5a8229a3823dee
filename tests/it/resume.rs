//! Resume: a job checkpointed mid-epoch (its client killed) and registered again with the
//! epoch and the ids already consumed receives exactly the rest of that epoch, then whole
//! epochs; with two ranks, their shares of the rest are disjoint and together exactly it; a
//! state saved on two ranks resumed on three beside a running job shares its decodes; a
//! state that does not fit the job (or covers only some of its ranks) is refused with
//! `invalid_resume`. A multi-node job resumed on other nodes: `cluster.rs`.

use std::collections::BTreeSet;
use std::path::Path;

use base64::Engine;
use roaring::RoaringBitmap;
use serde_json::{Value, json};

use crate::common::{TempDir, consumer, finish, wait_for};
use crate::server::{CLASSES, PER_CLASS, create_folder_dataset, dataset, epoch_ids, start};

const N: u32 = CLASSES * PER_CLASS;

/// A bitmap as `resume.consumed` carries it.
pub(crate) fn encode(ids: impl IntoIterator<Item = u32>) -> String {
    let b: RoaringBitmap = ids.into_iter().collect();
    let mut bytes = Vec::new();
    b.serialize_into(&mut bytes).unwrap();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `(epoch, element)` of each item `joader consume --dump` wrote.
pub(crate) fn dumped(dir: &Path) -> Vec<(u32, u32)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let parts: Vec<u32> = name
                .trim_end_matches(".bin")
                .split('-')
                .map(|p| p.parse().unwrap())
                .collect();
            (parts[0], parts[2])
        })
        .collect()
}

#[test]
fn a_killed_job_resumed_from_its_state_gets_exactly_the_rest_of_its_epoch() {
    let root = dataset();
    let env = start("resume", root);
    create_folder_dataset(&env, "imgs", root);
    let c = env.server.client();
    // Another job reads beside it, so that the resumed job joins a populated sampler.
    let other = consumer(
        &env.server.url,
        &json!({"name": "other", "dataset": "imgs", "batch_size": 4, "epochs": 3}),
        &["--sample-us", "300"],
    );
    let job = json!({"name": "train", "dataset": "imgs", "batch_size": 4, "epochs": 2,
                     "seed": 5});
    let dump = TempDir::new("resume-dump");
    let dump_arg = dump.0.to_str().unwrap().to_string();
    let mut first = consumer(
        &env.server.url,
        &job,
        &["--stop-after", "20", "--dump", &dump_arg],
    );
    wait_for("the first part to read 20 samples", || {
        (dumped(&dump.0).len() >= 20).then_some(())
    });
    first.kill().unwrap(); // preempted
    first.wait().unwrap();
    let part1 = dumped(&dump.0);
    assert_eq!(part1.len(), 20);
    assert!(part1.iter().all(|&(e, _)| e == 0));
    let consumed: BTreeSet<u32> = part1.iter().map(|&(_, id)| id).collect();
    assert_eq!(consumed.len(), 20, "no duplicate in the first part");
    wait_for("the dead client to be noticed", || {
        let j = c.ok("GET", "/v1/jobs/train", None).ok()?;
        (j["state"] == "failed").then_some(())
    });

    let mut resumed = job.clone();
    resumed["resume"] = json!({"epoch": 0, "consumed": encode(consumed.iter().copied())});
    let s = finish(consumer(&env.server.url, &resumed, &[]));
    let rest = epoch_ids(&s, 0);
    let rest_set: BTreeSet<u32> = rest.iter().copied().collect();
    assert_eq!(rest.len(), rest_set.len(), "no duplicate in the rest");
    assert!(
        consumed.is_disjoint(&rest_set),
        "nothing consumed comes again"
    );
    let union: BTreeSet<u32> = consumed.union(&rest_set).copied().collect();
    assert_eq!(union, (0..N).collect(), "both parts are exactly one epoch");
    let next: BTreeSet<u32> = epoch_ids(&s, 1).into_iter().collect();
    assert_eq!(epoch_ids(&s, 1).len(), N as usize);
    assert_eq!(next, (0..N).collect(), "the next epoch is whole");
    assert_eq!(
        s["epochs"].as_array().unwrap().len(),
        2,
        "the budget counts from epoch 0"
    );
    finish(other);
}

#[test]
fn two_ranks_resumed_share_exactly_the_rest_of_the_epoch() {
    let root = dataset();
    let env = start("resume_ddp", root);
    create_folder_dataset(&env, "imgs", root);
    // Resumed at epoch 1 of 2 with 14 of the subset's 40 ids consumed: 26 remain.
    let consumed: BTreeSet<u32> = (0..40).filter(|i| i % 3 == 0).collect();
    let job = json!({"name": "ddp", "dataset": "imgs", "batch_size": 4, "epochs": 2,
        "world_size": 2, "subset": {"start": 0, "end": 40},
        "resume": {"epoch": 1, "consumed": encode(consumed.iter().copied())}});
    let ranks: Vec<_> = (0..2)
        .map(|r| consumer(&env.server.url, &job, &["--rank", &r.to_string()]))
        .collect();
    let shares: Vec<Value> = ranks.into_iter().map(finish).collect();
    let mut all = BTreeSet::new();
    let mut total = 0;
    for s in &shares {
        assert!(epoch_ids(s, 0).is_empty(), "nothing of epoch 0: {s}");
        let ids = epoch_ids(s, 1);
        total += ids.len();
        all.extend(ids);
        assert_eq!(s["epochs"].as_array().unwrap().len(), 2);
    }
    let lens: Vec<usize> = shares.iter().map(|s| epoch_ids(s, 1).len()).collect();
    assert_eq!(lens.iter().sum::<usize>(), 26);
    assert!(lens[0].abs_diff(lens[1]) <= 1, "even shares: {lens:?}");
    assert_eq!(total, all.len(), "the ranks' shares are disjoint");
    let want: BTreeSet<u32> = (0..40).filter(|i| !consumed.contains(i)).collect();
    assert_eq!(all, want, "together exactly the rest of the epoch");
}

/// A job checkpointed on 2 ranks, resumed on 3 while another job of the dataset runs: the
/// new ranks share the rest of the epoch (together exactly it, even shares), and the resumed
/// job reads what the other decoded (every element decoded once: the cache holds the dataset).
#[test]
fn a_job_saved_on_two_ranks_resumed_on_three_shares_decodes_with_a_running_job() {
    let root = dataset();
    let env = start("resume_elastic", root);
    create_folder_dataset(&env, "imgs", root);
    let c = env.server.client();
    let other = consumer(
        &env.server.url,
        &json!({"name": "other", "dataset": "imgs", "batch_size": 4, "epochs": 1}),
        &["--sample-us", "300"],
    );
    // What the two ranks had handed over: 22 of 48 ids, 26 remain (shares 9, 9, 8).
    let consumed: BTreeSet<u32> = (0..N).filter(|i| i % 2 == 0 && *i < 44).collect();
    assert_eq!(consumed.len(), 22);
    let job = json!({"name": "elastic", "dataset": "imgs", "batch_size": 4, "epochs": 2,
        "world_size": 3, "resume": {"epoch": 0, "consumed": encode(consumed.iter().copied()),
        "ranks": [0, 1], "world_size": 2}});
    let ranks: Vec<Value> = (0..3)
        .map(|r| consumer(&env.server.url, &job, &["--rank", &r.to_string()]))
        .collect::<Vec<_>>()
        .into_iter()
        .map(finish)
        .collect();
    let other = finish(other);
    let mut rest = BTreeSet::new();
    let mut lens = Vec::new();
    for s in &ranks {
        let ids = epoch_ids(s, 0);
        lens.push(ids.len());
        rest.extend(ids);
    }
    assert_eq!(lens.iter().sum::<usize>(), 26, "{lens:?}");
    assert!(
        lens.iter().all(|&l| l.abs_diff(lens[0]) <= 1),
        "even shares {lens:?}"
    );
    let want: BTreeSet<u32> = (0..N).filter(|i| !consumed.contains(i)).collect();
    assert_eq!(rest, want, "the new ranks' shares are exactly the rest");
    let mut next = BTreeSet::new();
    for s in &ranks {
        next.extend(epoch_ids(s, 1));
    }
    assert_eq!(next, (0..N).collect(), "the next epoch is whole");
    let delivered = (epoch_ids(&other, 0).len() + 26 + N as usize) as u64;
    let loads = wait_for("the loads counted", || {
        c.ok("GET", "/v1/stats", None).ok()?["loads"].as_u64()
    });
    eprintln!(
        "decodes {loads} for {delivered} delivered: {:.3} per image",
        loads as f64 / delivered as f64
    );
    assert!(
        loads <= u64::from(N),
        "an element decoded twice: {loads} loads"
    );
    assert!(loads < delivered);
}

#[test]
fn a_resume_state_that_does_not_fit_the_job_is_refused() {
    let root = dataset();
    let env = start("resume_bad", root);
    create_folder_dataset(&env, "imgs", root);
    let c = env.server.client();
    let job = |resume: Value| {
        json!({"name": "bad", "dataset": "imgs", "batch_size": 4, "epochs": 2,
               "subset": {"start": 0, "end": 10}, "resume": resume})
    };
    for (resume, says) in [
        (json!({"epoch": 0, "consumed": "not base64!"}), "base64"),
        (json!({"epoch": 0, "consumed": "aGVsbG8="}), "roaring"),
        (
            json!({"epoch": 0, "consumed": encode([3, 10, 11])}),
            "id 10",
        ),
        (json!({"epoch": 2, "consumed": ""}), "epoch 2"),
        (json!({"epoch": 1, "consumed": encode(0..10)}), "epoch 2"),
        // One rank's state of two: its partner's ids would come again.
        (
            json!({"epoch": 0, "consumed": encode([1]), "ranks": [0], "world_size": 2}),
            "rank(s) [1] missing",
        ),
        (
            json!({"epoch": 0, "consumed": "", "ranks": [0, 0, 1], "world_size": 2}),
            "twice",
        ),
        (
            json!({"epoch": 0, "consumed": "", "ranks": [0, 2], "world_size": 2}),
            "rank 2",
        ),
        (
            json!({"epoch": 0, "consumed": "", "ranks": [0]}),
            "world_size",
        ),
    ] {
        let (status, body) = c
            .call("POST", "/v1/jobs", Some(&job(resume.clone())))
            .unwrap();
        assert_eq!(status, 400, "{resume}: {body}");
        assert_eq!(body["error"]["code"], "invalid_resume", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{resume}: {body}"
        );
    }
    let (status, _) = c.call("GET", "/v1/jobs/bad", None).unwrap();
    assert_eq!(status, 404, "a refused job is not registered");
}

#[test]
fn a_recorded_epoch_is_served_per_rank_and_replayed_exactly() {
    let root = dataset();
    let env = start("record", root);
    create_folder_dataset(&env, "imgs", root);
    let c = env.server.client();
    let job = json!({"name": "rec", "dataset": "imgs", "batch_size": 4, "epochs": 2,
                     "world_size": 2, "record": true});
    let ranks: Vec<Value> = (0..2)
        .map(|r| consumer(&env.server.url, &job, &["--rank", &r.to_string()]))
        .collect::<Vec<_>>()
        .into_iter()
        .map(finish)
        .collect();
    for epoch in 0..2 {
        let rec = wait_for("the record of the epoch", || {
            let r = c
                .ok("GET", &format!("/v1/jobs/rec/record/{epoch}"), None)
                .ok()?;
            (r["order"].as_array()?.len() == N as usize).then_some(r)
        });
        assert_eq!(rec["world_size"], 2);
        for (r, s) in ranks.iter().enumerate() {
            let got: Vec<u64> = epoch_ids(s, epoch).into_iter().map(u64::from).collect();
            let want: Vec<u64> = rec["ranks"][r]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(got, want, "rank {r}'s ring received the recorded order");
        }
    }
    let (status, body) = c.call("GET", "/v1/jobs/rec/record/2", None).unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("record_not_found"))
    );

    // Replay epoch 1 in a job of its own, beside another job: exactly that order, every epoch.
    let rec = c.ok("GET", "/v1/jobs/rec/record/1", None).unwrap();
    let order: Vec<u32> = rec["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let other = consumer(
        &env.server.url,
        &json!({"name": "beside", "dataset": "imgs", "batch_size": 4, "epochs": 1}),
        &[],
    );
    let s = finish(consumer(
        &env.server.url,
        &json!({"name": "again", "dataset": "imgs", "batch_size": 5, "epochs": 2,
                "replay": {"job": "rec", "epoch": 1}}),
        &[],
    ));
    assert_eq!(epoch_ids(&s, 0), order);
    assert_eq!(epoch_ids(&s, 1), order);
    finish(other);
    for (replay, code) in [
        (json!({"job": "rec", "epoch": 5}), "invalid_replay"),
        (json!({"job": "nobody", "epoch": 0}), "invalid_replay"),
    ] {
        let body = json!({"name": "again2", "dataset": "imgs", "batch_size": 4, "replay": replay});
        let (status, v) = c.call("POST", "/v1/jobs", Some(&body)).unwrap();
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some(code)),
            "{v}"
        );
    }
    let body = json!({"name": "again3", "dataset": "imgs", "batch_size": 4,
                      "subset": [1, 2], "replay": {"job": "rec", "epoch": 0}});
    let (status, v) = c.call("POST", "/v1/jobs", Some(&body)).unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("invalid_replay"))
    );
}

/// Copies the test dataset's class folders into `to`.
fn copy_dataset(to: &Path) {
    for class in std::fs::read_dir(dataset()).unwrap() {
        let class = class.unwrap().path();
        if !class.is_dir() {
            continue;
        }
        let dst = to.join(class.file_name().unwrap());
        std::fs::create_dir_all(&dst).unwrap();
        for f in std::fs::read_dir(&class).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, dst.join(f.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn a_state_saved_on_another_version_of_the_dataset_is_refused_unless_allowed() {
    let tmp = TempDir::new("resume_changed_data");
    let root = tmp.0.join("imgs");
    copy_dataset(&root);
    let env = start("resume_changed", &tmp.0);
    let c = env.server.client();
    let index_again = || {
        let (status, body) = c.call("DELETE", "/v1/datasets/d", None).unwrap();
        assert!(status == 200 || status == 204 || status == 404, "{body}");
        create_folder_dataset(&env, "d", &root);
    };
    let register = |name: &str, resume: Value| {
        let body = json!({"name": name, "dataset": "d", "batch_size": 4, "epochs": 1,
                          "resume": resume});
        let (status, got) = c.call("POST", "/v1/jobs", Some(&body)).unwrap();
        if status < 300 {
            let view = c.ok("GET", &format!("/v1/jobs/{name}"), None).unwrap();
            c.ok("DELETE", &format!("/v1/jobs/{name}"), None).unwrap();
            return (status, view);
        }
        (status, got)
    };
    create_folder_dataset(&env, "d", &root);
    let (_, first) = register("a", json!({"epoch": 0, "consumed": ""}));
    let saved = first["dataset_fingerprint"].as_str().unwrap().to_owned();
    assert_eq!(saved.split(':').next().unwrap(), N.to_string(), "{saved}");
    let state = |allow: bool| {
        json!({"epoch": 0, "consumed": encode([1, 2]), "dataset_fingerprint": saved,
               "allow_changed_dataset": allow})
    };

    // The same files indexed again: the same fingerprint.
    index_again();
    let (status, same) = register("b", state(false));
    assert_eq!(status, 201, "{same}");
    assert_eq!(same["dataset_fingerprint"], saved.as_str());

    // Files appended at the end (a class folder sorted last): the first items are those of
    // the state, which resumes.
    let last = root.join("zzz");
    std::fs::create_dir_all(&last).unwrap();
    let mut classes: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    classes.sort();
    let any = std::fs::read_dir(&classes[0]).unwrap().next();
    let any = any.unwrap().unwrap().path();
    std::fs::copy(&any, last.join("appended.jpg")).unwrap();
    index_again();
    let (status, grown) = register("c", state(false));
    assert_eq!(status, 201, "{grown}");
    let now = grown["dataset_fingerprint"].as_str().unwrap().to_owned();
    assert_ne!(now, saved);
    assert!(now.starts_with(&format!("{}:", N + 1)), "{now}");

    // A file of the first class gone: every id after it names another file.
    std::fs::remove_file(&any).unwrap();
    index_again();
    let (status, body) = register("d", state(false));
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "dataset_changed", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&saved) && message.contains("allow_changed_dataset"),
        "{message}"
    );
    let (status, _) = c.call("GET", "/v1/jobs/d", None).unwrap();
    assert_eq!(status, 404, "a refused job is not registered");
    // Asked for explicitly: the rest is computed on the new index.
    let (status, allowed) = register("e", state(true));
    assert_eq!(status, 201, "{allowed}");
    // A state without a fingerprint (an older client's) resumes unchecked.
    let (status, old) = register("f", json!({"epoch": 0, "consumed": encode([1, 2])}));
    assert_eq!(status, 201, "{old}");
}
