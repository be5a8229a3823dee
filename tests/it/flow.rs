//! Flow control under a sweep's conditions, against the real server with clients in their own
//! processes: many jobs admitted, registered-but-unread jobs holding nothing, slow and
//! stopped readers never stalling the others, every epoch exact; and a job that cannot be
//! served failing at its client's deadline, not hanging.

use std::collections::BTreeSet;
use std::process::{Child, Command};

use serde_json::{Value, json};

use crate::common::{consumer, finish, finish_within, outcome, wait_for};
use crate::server::{
    CLASSES, Env, PER_CLASS, create_folder_dataset, dataset, epoch_ids, start_with,
};

/// A cache of 4 MiB holds 27 elements of the default pipeline (224×224×3 bytes): fewer than
/// the 48 of the test dataset, and far fewer than the places of a dozen rings (64 records
/// each by default).
const SMALL_CACHE: &[&str] = &["--cache-bytes", "4MiB"];

/// A server with the test dataset `imgs` indexed.
fn server(tag: &str, extra: &[&str]) -> Env {
    let env = start_with(tag, dataset(), extra);
    create_folder_dataset(&env, "imgs", dataset());
    env
}

fn all() -> BTreeSet<u32> {
    (0..CLASSES * PER_CLASS).collect()
}

/// Every epoch of a consumer's summary is the whole dataset, each element once.
fn assert_exact(summary: &Value, epochs: usize, who: &str) {
    assert_eq!(
        summary["epochs"].as_array().unwrap().len(),
        epochs,
        "{who}: epochs"
    );
    for e in 0..epochs {
        let ids = epoch_ids(summary, e);
        let set: BTreeSet<u32> = ids.iter().copied().collect();
        assert_eq!(
            set.len(),
            ids.len(),
            "{who}: an element repeats in epoch {e}"
        );
        assert_eq!(set, all(), "{who}: epoch {e} is not the dataset");
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

#[test]
fn a_sweep_of_64_jobs_of_batch_256_is_admitted_and_holds_nothing_until_read() {
    // 256 MiB and 16,384 slots: reserving 512 places per job refused the 33rd job.
    let env = server("sweep", &["--cache-slots", "16384"]);
    let server = &env.server;
    let c = server.client();
    for i in 0..64 {
        let (status, v) = c
            .call(
                "POST",
                "/v1/jobs",
                Some(&json!({"name": format!("trial-{i}"), "dataset": "imgs", "batch_size": 256})),
            )
            .unwrap();
        assert_eq!(status, 201, "trial {i}: {v}");
    }
    let jobs = c.ok("GET", "/v1/jobs", None).unwrap();
    let jobs = jobs["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 64);
    for j in jobs {
        assert_eq!(j["state"], "waiting", "{j}");
        assert_eq!(j["sampled"], 0, "an unattached job gets no samples: {j}");
    }
    let stats = c.ok("GET", "/v1/stats", None).unwrap();
    assert_eq!(
        stats["loads"], 0,
        "nothing is loaded for unread jobs: {stats}"
    );
    // A 65th job is read as usual beside them.
    let s = finish(consumer(
        &server.url,
        &json!({"name": "reader", "dataset": "imgs", "batch_size": 16, "epochs": 1}),
        &[],
    ));
    assert_exact(&s, 1, "reader");
    for i in 0..64 {
        c.ok("DELETE", &format!("/v1/jobs/trial-{i}"), None)
            .unwrap();
    }
}

#[test]
fn unattached_and_slow_jobs_do_not_stall_fast_ones_on_a_small_cache() {
    // Three readers of batches of 4: a ring pins two batches at most (the one its client
    // holds, and one more), 24 elements, and the cache holds 27. So no job's batch ever waits
    // for room another job holds, however slowly the slow one reads: the server counts every
    // such wait (`waited_for_others`), and finishing alone would not show that the fast jobs
    // went at their own pace.
    let env = server("stall", SMALL_CACHE);
    let server = &env.server;
    let c = server.client();
    for i in 0..12 {
        c.ok(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": format!("idle-{i}"), "dataset": "imgs", "batch_size": 8})),
        )
        .unwrap();
    }
    let slow = consumer(
        &server.url,
        &json!({"name": "slow", "dataset": "imgs", "batch_size": 4, "epochs": 1}),
        &["--sample-us", "50000"],
    );
    let fast: Vec<Child> = (0..2)
        .map(|i| {
            consumer(
                &server.url,
                &json!({"name": format!("fast-{i}"), "dataset": "imgs", "batch_size": 4,
                        "epochs": 2, "seed": i}),
                &[],
            )
        })
        .collect();
    for (i, f) in fast.into_iter().enumerate() {
        assert_exact(&finish(f), 2, &format!("fast-{i}"));
    }
    assert_exact(&finish(slow), 1, "slow");
    // Counted before each batch went to its ring: final once the clients are done.
    for name in ["fast-0", "fast-1", "slow"] {
        let j = c.ok("GET", &format!("/v1/jobs/{name}"), None).unwrap();
        assert_eq!(
            j["waited_for_others"], 0,
            "{name}: a batch waited for room another job held: {j}"
        );
    }
    for i in 0..12 {
        let j = c.ok("GET", &format!("/v1/jobs/idle-{i}"), None).unwrap();
        assert_eq!(
            (j["state"].as_str(), j["sampled"].as_u64()),
            (Some("waiting"), Some(0)),
            "{j}"
        );
    }
}

#[test]
fn a_stopped_client_pins_two_batches_at_most_and_resumes_its_epoch_exactly() {
    let env = server("sigstop", SMALL_CACHE);
    let server = &env.server;
    let c = server.client();
    let paused = consumer(
        &server.url,
        &json!({"name": "paused", "dataset": "imgs", "batch_size": 8, "epochs": 1}),
        &["--sample-us", "20000"],
    );
    wait_for("the paused job to read a batch", || {
        let j = c.ok("GET", "/v1/jobs/paused", None).ok()?;
        (j["acknowledged"].as_u64().unwrap_or(0) >= 8).then_some(())
    });
    // As a debugger, an evaluation pass or a preempting scheduler would (SIGSTOP).
    signal(&paused, "-STOP");
    let before = c.ok("GET", "/v1/jobs/paused", None).unwrap()["acknowledged"].clone();
    let fast: Vec<Child> = (0..2)
        .map(|i| {
            consumer(
                &server.url,
                &json!({"name": format!("busy-{i}"), "dataset": "imgs", "batch_size": 8,
                        "epochs": 3, "seed": i + 10}),
                &[],
            )
        })
        .collect();
    for (i, f) in fast.into_iter().enumerate() {
        assert_exact(&finish(f), 3, &format!("busy-{i}"));
    }
    let j = c.ok("GET", "/v1/jobs/paused", None).unwrap();
    assert_eq!(
        j["acknowledged"], before,
        "the stopped client read nothing: {j}"
    );
    assert_eq!(j["state"], "running", "a stopped client is alive: {j}");
    signal(&paused, "-CONT");
    assert_exact(&finish(paused), 1, "paused");
}

#[test]
fn a_batch_waiting_for_room_another_job_holds_is_counted() {
    // The holder takes its whole epoch (26 elements, one batch) and keeps it, never
    // acknowledged: 26 of the 27 elements the cache holds. The other job (a disjoint subset:
    // nothing of the holder's is its own) needs 8 for its first batch and cannot have them
    // until the holder is gone: that wait is counted, once.
    let env = server("waits", SMALL_CACHE);
    let server = &env.server;
    let c = server.client();
    let mut holder = consumer(
        &server.url,
        &json!({"name": "holder", "dataset": "imgs", "batch_size": 26, "epochs": 1,
                "subset": {"start": 0, "end": 26}}),
        &["--stop-after", "26"],
    );
    wait_for("the holder's batch pushed", || {
        let j = c.ok("GET", "/v1/jobs/holder", None).ok()?;
        (j["delivered"] == 26).then_some(())
    });
    let other = consumer(
        &server.url,
        &json!({"name": "other", "dataset": "imgs", "batch_size": 8, "epochs": 1,
                "subset": {"start": 26, "end": 48}}),
        &[],
    );
    let j = wait_for(
        "the other job's batch counted as waiting for the holder",
        || {
            let j = c.ok("GET", "/v1/jobs/other", None).ok()?;
            (j["waited_for_others"].as_u64()? > 0).then_some(j)
        },
    );
    assert_eq!(j["delivered"], 0, "a batch went through: {j}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let s = finish(other);
    let mut ids = epoch_ids(&s, 0);
    ids.sort_unstable();
    assert_eq!(ids, (26..48).collect::<Vec<u32>>());
    let j = c.ok("GET", "/v1/jobs/other", None).unwrap();
    assert_eq!(
        j["waited_for_others"], 1,
        "one batch waited, counted once however long it waited: {j}"
    );
}

#[test]
fn a_client_that_gets_nothing_fails_at_its_deadline_naming_its_job_and_state() {
    // Rank 0 of a two-rank job whose rank 1 never comes: the job gets no credit, rank 0's ring
    // stays empty for good. `joader consume` fails at its deadline, and `finish` at its own.
    let env = server("deadline", &[]);
    let server = &env.server;
    let c = server.client();
    let half =
        |name: &str| json!({"name": name, "dataset": "imgs", "batch_size": 4, "world_size": 2});
    let out = outcome(consumer(
        &server.url,
        &half("lonely"),
        &["--deadline-s", "2"],
    ));
    assert!(!out.status.success(), "rank 0 alone read to the end");
    let out = String::from_utf8_lossy(&out.stderr);
    for want in [
        "job lonely rank 0",
        "gave no record for",
        "after 0 samples",
        "--deadline-s 2",
        "the server says: state ",
        "sampled 0",
    ] {
        assert!(out.contains(want), "{want:?} missing from: {out}");
    }
    let waiting = consumer(&server.url, &half("forgotten"), &[]);
    wait_for("rank 0 of job forgotten to attach", || {
        let j = c.ok("GET", "/v1/jobs/forgotten", None).ok()?;
        (j["state"] == "running").then_some(())
    });
    let failed = std::panic::catch_unwind(|| {
        finish_within(waiting, std::time::Duration::from_secs(1));
    })
    .expect_err("a consumer that never ends fails its deadline");
    let msg = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    for want in [
        "job forgotten rank 0",
        "has not finished after 1s",
        "the server says: state running",
        "sampled 0",
    ] {
        assert!(msg.contains(want), "{want:?} missing from: {msg}");
    }
}
