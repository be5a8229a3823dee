//! Flow control under a sweep's conditions, against the real server with clients in their own
//! processes: many jobs admitted, registered-but-unread jobs holding nothing, slow and
//! stopped readers never stalling the others, every epoch exact.

use std::collections::BTreeSet;
use std::process::{Child, Command};

use serde_json::{Value, json};

use crate::common::{consumer, finish, wait_for};
use crate::server::{
    CLASSES, Env, PER_CLASS, create_folder_dataset, dataset, epoch_ids, start_with,
};

/// A cache of 4 MiB holds 27 elements of the default pipeline (224×224×3 bytes): fewer than
/// the 48 of the test dataset, and fewer than what a dozen rings of 16 records would pin.
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
        &json!({"name": "slow", "dataset": "imgs", "batch_size": 8, "epochs": 1}),
        &["--sample-us", "50000"],
    );
    let fast: Vec<Child> = (0..2)
        .map(|i| {
            consumer(
                &server.url,
                &json!({"name": format!("fast-{i}"), "dataset": "imgs", "batch_size": 8,
                        "epochs": 2, "seed": i}),
                &[],
            )
        })
        .collect();
    for (i, f) in fast.into_iter().enumerate() {
        assert_exact(&finish(f), 2, &format!("fast-{i}"));
    }
    assert_exact(&finish(slow), 1, "slow");
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
