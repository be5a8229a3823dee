//! The local-disk tier of encoded bytes (`--disk-cache`) against a real S3 server (`s3s-fs`,
//! see `s3.rs`): what a later epoch fetches from the store, a restart, damaged and changed
//! objects, the size limit with its hit rate, the tier's folder removed under a running job,
//! and the store killed with everything in the tier.
//!
//! The decoded cache in shared memory is kept small ([`SLOTS`] slots, rings of 8 records) so
//! that later epochs reach the tier; store traffic is read from the server's own counters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::common::{TempDir, TestServer, consumer, finish, unique_instance, wait_for};
use crate::s3::{
    Joader, Payloads, S3Server, assert_permutation, create, credentials, joader, metric, no_errors,
    s3s_fs, settled, write_layouts,
};
use crate::server::epoch_ids;

const GETS: &str = "joader_s3_requests_total{op=\"get\"}";

/// The decoded cache's slots: a job's rings (8) and lookahead (two batches of 4), and a
/// batch more. With fewer, the Cache holds less than a job's window and evicts queued
/// elements to store sooner-needed ones that arrive first (fetch-ahead's bytes make arrival
/// order differ from need order), then loads them again.
const SLOTS: u32 = 20;
const SLOTS_ARG: &str = "20";

/// The flags of a server with a small decoded cache and a disk tier of `bytes` in `dir`.
fn tier_args<'a>(allowed: &'a str, dir: &'a Path, bytes: &'a str) -> Vec<&'a str> {
    vec![
        "--allowed-s3",
        allowed,
        "--cache-slots",
        SLOTS_ARG,
        "--disk-cache",
        dir.to_str().unwrap(),
        "--disk-cache-bytes",
        bytes,
    ]
}

/// Reads one epoch of `dataset` with the raw pipeline and small rings: the summary and the
/// payloads.
fn read(j: &Joader, job: &str, dataset: &str) -> (Value, Payloads) {
    let dump = TempDir::new(job);
    let s = finish(consumer(
        &j.server.url,
        &json!({"name": job, "dataset": dataset, "batch_size": 4, "ring_capacity": 8,
                "epochs": 1, "pipeline": {"kind": "raw"}}),
        &["--dump", dump.0.to_str().unwrap()],
    ));
    let mut labels = BTreeMap::new();
    for e in s["epochs"].as_array().unwrap() {
        for p in e.as_array().unwrap() {
            labels.insert(p[0].as_u64().unwrap() as u32, p[1].as_i64().unwrap());
        }
    }
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dump.0).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let element: u32 = stem.rsplit('-').next().unwrap().parse().unwrap();
        let label = labels.get(&element).copied().unwrap_or(-1);
        out.insert(element, (label, std::fs::read(&path).unwrap()));
    }
    (s, out)
}

/// Waits until the tier's writer has taken everything offered to it (every fetch of a
/// finished job was offered before its element was delivered).
fn writer_idle(j: &Joader) {
    wait_for("the disk tier's writer to be idle", || {
        (metric(j, "joader_disk_cache_queued") == 0.0).then_some(())
    });
}

/// Writes `n` objects of `len` distinct bytes each as an image folder of two classes under
/// `bucket/prefix`.
fn write_objects(bucket: &Path, prefix: &str, n: u32, len: usize) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in 0..n {
        let dir = bucket.join(prefix).join(format!("c{}", i % 2));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        std::fs::write(dir.join(format!("img{i:04}.jpg")), bytes).unwrap();
    }
}

/// Every stored object's file under the tier's folder.
fn stored_files(tier: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for fan in std::fs::read_dir(tier.join("objects")).unwrap().flatten() {
        for f in std::fs::read_dir(fan.path()).unwrap().flatten() {
            out.push(f.path());
        }
    }
    out
}

fn folder_source(prefix: &str) -> Value {
    json!({"kind": "s3", "url": format!("s3://bkt/{prefix}"), "layout": "image_folder"})
}

#[test]
fn a_dataset_that_fits_the_tier_is_fetched_once_in_every_layout_and_after_a_restart() {
    let test = "a_dataset_that_fits_the_tier_is_fetched_once_in_every_layout_and_after_a_restart";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_fits");
    let n = write_layouts(&s3.bucket());
    let disk = TempDir::new("tier_fits_disk");
    let dir = disk.0.join("tier");
    let args = tier_args("s3://bkt", &dir, "64MiB");
    let mut j = joader("tier_fits", &s3.bucket(), &args, &credentials(&s3));
    let layouts = [
        ("folder", folder_source("folder")),
        (
            "shards",
            json!({"kind": "s3", "url": "s3://bkt/shards", "layout": "tar_shards"}),
        ),
        (
            "manifest",
            json!({"kind": "s3", "url": "s3://bkt/lists/list.csv", "layout": "manifest"}),
        ),
    ];
    for (name, source) in &layouts {
        create(&j, name, source.clone());
    }
    let mut first = BTreeMap::new();
    for (name, _) in &layouts {
        assert_eq!(settled(&j, name)["state"], "ready");
        let (s, p) = read(&j, &format!("e1-{name}"), name);
        no_errors(&s, name);
        assert_permutation(&epoch_ids(&s, 0), n, name);
        first.insert(*name, p);
    }
    writer_idle(&j);
    assert!(metric(&j, "joader_disk_cache_writes_total") > 0.0);
    assert!(
        metric(&j, "joader_disk_cache_bytes") <= metric(&j, "joader_disk_cache_capacity_bytes")
    );
    // Epoch 2 of every layout: nothing from the store, the same bytes.
    let (gets, hits) = (metric(&j, GETS), metric(&j, "joader_disk_cache_hits_total"));
    for (name, _) in &layouts {
        let (s, p) = read(&j, &format!("e2-{name}"), name);
        no_errors(&s, name);
        assert_permutation(&epoch_ids(&s, 0), n, name);
        assert!(p == first[name], "{name}: epoch 2's bytes differ");
    }
    assert_eq!(metric(&j, GETS), gets, "epoch 2 fetched from the store");
    assert!(metric(&j, "joader_disk_cache_hits_total") > hits);
    // A restarted server rebuilds the tier's index and serves epoch 3 from it.
    assert!(j.server.stop());
    let env: Vec<(&str, String)> = credentials(&s3);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    j.server = TestServer::start_env(
        &unique_instance("tier_fits"),
        &j._state.0,
        &s3.bucket(),
        &args,
        &env,
    );
    assert!(metric(&j, "joader_disk_cache_objects") > 0.0);
    for (name, _) in &layouts {
        assert_eq!(settled(&j, name)["state"], "ready");
        let (s, p) = read(&j, &format!("e3-{name}"), name);
        no_errors(&s, name);
        assert_permutation(&epoch_ids(&s, 0), n, name);
        assert!(p == first[name], "{name}: epoch 3's bytes differ");
    }
    assert_eq!(metric(&j, GETS), 0.0, "epoch 3 fetched from the store");
    assert!(metric(&j, "joader_disk_cache_hits_total") >= (3 * n - 3 * SLOTS as usize) as f64);
    // The dashboard's view of it.
    let stats = j.server.client().ok("GET", "/v1/stats", None).unwrap();
    assert!(stats["disk_cache"]["hits"].as_u64().unwrap() > 0, "{stats}");
}

#[test]
fn a_flipped_byte_in_a_stored_object_is_fetched_again_and_the_batch_is_right() {
    let test = "a_flipped_byte_in_a_stored_object_is_fetched_again_and_the_batch_is_right";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_flip");
    write_objects(&s3.bucket(), "d", 40, 4000);
    let disk = TempDir::new("tier_flip_disk");
    let dir = disk.0.join("tier");
    let args = tier_args("s3://bkt/d", &dir, "64MiB");
    let j = joader("tier_flip", &s3.bucket(), &args, &credentials(&s3));
    create(&j, "d", folder_source("d"));
    assert_eq!(settled(&j, "d")["state"], "ready");
    let (s, want) = read(&j, "a", "d");
    no_errors(&s, "a");
    writer_idle(&j);
    let files = stored_files(&dir);
    assert_eq!(files.len(), 40);
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        let at = bytes.len() - 100;
        bytes[at] ^= 0x01;
        std::fs::write(f, bytes).unwrap();
    }
    let gets = metric(&j, GETS);
    let (s, got) = read(&j, "b", "d");
    no_errors(&s, "b");
    assert_permutation(&epoch_ids(&s, 0), 40, "the epoch");
    assert!(
        got == want,
        "the bytes differ after damaged objects were read"
    );
    let corrupt = metric(&j, "joader_disk_cache_corrupt_total");
    // At most the elements the decoded cache kept were not read from the tier.
    assert!(
        corrupt >= f64::from(40 - SLOTS),
        "{corrupt} damaged objects found"
    );
    assert_eq!(metric(&j, GETS) - gets, corrupt, "each one fetched again");
    // No damaged object was served: what the tier served after the flips are the objects
    // it stored again meanwhile, read again by reloads (elements the decoded cache evicted
    // while queued).
    let hits = metric(&j, "joader_disk_cache_hits_total");
    let reloads = metric(&j, "joader_cache_reloads_total");
    assert!(hits <= reloads, "{hits} tier hits, {reloads} reloads");
}

#[test]
fn an_object_changed_in_the_store_after_indexing_is_an_element_error_never_stale() {
    let test = "an_object_changed_in_the_store_after_indexing_is_an_element_error_never_stale";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_changed");
    write_objects(&s3.bucket(), "d", 20, 3000);
    let disk = TempDir::new("tier_changed_disk");
    let dir = disk.0.join("tier");
    let args = tier_args("s3://bkt/d", &dir, "64MiB");
    let j = joader("tier_changed", &s3.bucket(), &args, &credentials(&s3));
    create(&j, "d", folder_source("d"));
    assert_eq!(settled(&j, "d")["state"], "ready");
    // Element 4: the fifth object of class c0 (ids follow the folder order).
    let changed = s3.bucket().join("d/c0/img0008.jpg");
    std::fs::write(&changed, b"another version of the object").unwrap();
    for job in ["a", "b"] {
        let (s, _) = read(&j, job, "d");
        let errors = s["errors"][0].as_array().unwrap();
        assert_eq!(errors.len(), 1, "{s}");
        assert_eq!(errors[0][0], 4, "{s}");
        let mut ids = epoch_ids(&s, 0);
        ids.push(4);
        assert_permutation(&ids, 20, "the epoch with its error record");
        writer_idle(&j);
        assert_eq!(
            metric(&j, "joader_disk_cache_objects"),
            19.0,
            "the changed object is not stored"
        );
    }
    let failures = j
        .server
        .client()
        .ok("GET", "/v1/datasets/d/failures", None)
        .unwrap();
    assert!(
        failures
            .to_string()
            .contains("changed since the dataset was indexed"),
        "{failures}"
    );
}

#[test]
fn with_twice_the_tier_the_size_holds_and_later_epochs_hit_half() {
    let test = "with_twice_the_tier_the_size_holds_and_later_epochs_hit_half";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_half");
    let (n, len) = (200u32, 32 << 10);
    write_objects(&s3.bucket(), "d", n, len);
    let disk = TempDir::new("tier_half_disk");
    let dir = disk.0.join("tier");
    // Room for exactly half of the objects (a stored object's header is under 200 bytes).
    let capacity = (n as usize / 2 * (len + 200)).to_string();
    let args = tier_args("s3://bkt/d", &dir, &capacity);
    let j = joader("tier_half", &s3.bucket(), &args, &credentials(&s3));
    create(&j, "d", folder_source("d"));
    assert_eq!(settled(&j, "d")["state"], "ready");
    let epochs = 4;
    let s = finish(consumer(
        &j.server.url,
        &json!({"name": "one", "dataset": "d", "batch_size": 4, "ring_capacity": 8,
                "epochs": epochs, "pipeline": {"kind": "raw"}}),
        &[],
    ));
    no_errors(&s, "one");
    for e in 0..epochs as usize {
        assert_permutation(&epoch_ids(&s, e), n as usize, &format!("epoch {e}"));
    }
    writer_idle(&j);
    let bytes = metric(&j, "joader_disk_cache_bytes");
    assert!(bytes <= capacity.parse::<f64>().unwrap(), "{bytes} stored");
    assert!(stored_files(&dir).len() <= n as usize / 2);
    // Epoch 1 fetched every element once; the later epochs fetched what neither cache held.
    let later = metric(&j, GETS) - f64::from(n);
    let hit = 1.0 - later / f64::from(n * (epochs - 1));
    let (hits, misses) = (
        metric(&j, "joader_disk_cache_hits_total"),
        metric(&j, "joader_disk_cache_misses_total"),
    );
    eprintln!(
        "later epochs: {hit:.3} of the elements not fetched from the store; tier hits {hits}, misses {misses}"
    );
    assert!(hit >= 0.45, "later epochs hit {hit:.3} of their elements");
}

#[test]
fn the_tier_folder_removed_or_replaced_by_a_file_mid_run_keeps_jobs_running() {
    let test = "the_tier_folder_removed_or_replaced_by_a_file_mid_run_keeps_jobs_running";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_gone");
    write_objects(&s3.bucket(), "d", 60, 3000);
    for (case, replace) in [("removed", false), ("replaced", true)] {
        let disk = TempDir::new(&format!("tier_gone_{case}"));
        let dir = disk.0.join("tier");
        let args = tier_args("s3://bkt/d", &dir, "64MiB");
        let j = joader("tier_gone", &s3.bucket(), &args, &credentials(&s3));
        create(&j, "d", folder_source("d"));
        assert_eq!(settled(&j, "d")["state"], "ready");
        let (s, want) = read(&j, "fill", "d");
        no_errors(&s, "fill");
        writer_idle(&j);
        let dump = TempDir::new(case);
        let reader = consumer(
            &j.server.url,
            &json!({"name": "r", "dataset": "d", "batch_size": 4, "ring_capacity": 8,
                    "epochs": 2, "pipeline": {"kind": "raw"}}),
            &["--sample-us", "3000", "--dump", dump.0.to_str().unwrap()],
        );
        let c = j.server.client();
        wait_for("the reader to have acknowledged 8 samples", || {
            let v = c.ok("GET", "/v1/jobs/r", None).ok()?;
            (v["acknowledged"].as_u64()? >= 8).then_some(())
        });
        // The tier's writer may be writing meanwhile: removed once nothing is left.
        wait_for("the tier's folder to be removed", || {
            let _ = std::fs::remove_dir_all(&dir);
            (!dir.exists()).then_some(())
        });
        if replace {
            std::fs::write(&dir, b"not a folder").unwrap();
        }
        let s = finish(reader);
        no_errors(&s, case);
        for e in 0..2 {
            assert_permutation(&epoch_ids(&s, e), 60, &format!("{case}: epoch {e}"));
        }
        for entry in std::fs::read_dir(&dump.0).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let element: u32 = stem.rsplit('-').next().unwrap().parse().unwrap();
            assert!(
                std::fs::read(&path).unwrap() == want[&element].1,
                "{case}: element {element}'s bytes differ"
            );
        }
        writer_idle(&j);
        assert!(
            metric(&j, "joader_disk_cache_write_errors_total") >= 1.0,
            "{case}: no write failed"
        );
        assert_eq!(metric(&j, "joader_disk_cache_writing"), 0.0, "{case}");
    }
}

#[test]
fn the_store_killed_mid_epoch_with_everything_in_the_tier_loses_nothing() {
    let test = "the_store_killed_mid_epoch_with_everything_in_the_tier_loses_nothing";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let mut s3 = S3Server::start(bin, "tier_killed");
    write_objects(&s3.bucket(), "d", 48, 3000);
    let disk = TempDir::new("tier_killed_disk");
    let dir = disk.0.join("tier");
    let args = tier_args("s3://bkt/d", &dir, "64MiB");
    let j = joader("tier_killed", &s3.bucket(), &args, &credentials(&s3));
    create(&j, "d", folder_source("d"));
    assert_eq!(settled(&j, "d")["state"], "ready");
    let (s, want) = read(&j, "fill", "d");
    no_errors(&s, "fill");
    writer_idle(&j);
    let gets = metric(&j, GETS);
    let dump = TempDir::new("killed");
    let reader = consumer(
        &j.server.url,
        &json!({"name": "r", "dataset": "d", "batch_size": 4, "ring_capacity": 8,
                "epochs": 2, "pipeline": {"kind": "raw"}}),
        &["--sample-us", "2000", "--dump", dump.0.to_str().unwrap()],
    );
    let c = j.server.client();
    wait_for("the reader to have acknowledged 8 samples", || {
        let v = c.ok("GET", "/v1/jobs/r", None).ok()?;
        (v["acknowledged"].as_u64()? >= 8).then_some(())
    });
    s3.kill();
    let s = finish(reader);
    no_errors(&s, "r");
    for e in 0..2 {
        assert_permutation(&epoch_ids(&s, e), 48, &format!("epoch {e}"));
    }
    for entry in std::fs::read_dir(&dump.0).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let element: u32 = stem.rsplit('-').next().unwrap().parse().unwrap();
        assert!(std::fs::read(&path).unwrap() == want[&element].1);
    }
    assert_eq!(metric(&j, GETS), gets, "nothing was asked of the store");
    assert_eq!(
        metric(&j, "joader_s3_errors_total{kind=\"unavailable\"}"),
        0.0
    );
}

#[test]
fn a_second_server_on_the_same_tier_folder_is_refused() {
    let test = "a_second_server_on_the_same_tier_folder_is_refused";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_lock");
    let disk = TempDir::new("tier_lock_disk");
    let dir = disk.0.join("tier");
    let args = tier_args("s3://bkt", &dir, "64MiB");
    let _first = joader("tier_lock", &s3.bucket(), &args, &credentials(&s3));
    let state = TempDir::new("tier_lock_second");
    let instance = unique_instance("tier_lock_second");
    let mut second = vec![
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--instance",
        &instance,
        "--data-dir",
        state.0.to_str().unwrap(),
    ];
    second.extend_from_slice(&args);
    let out = crate::common::joader(&second);
    assert!(!out.status.success(), "a second server started on the tier");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another joader serve uses this folder"),
        "{err}"
    );
}

/// Reads `dataset` as `job` for `epochs` epochs with the raw pipeline and small rings.
fn job(j: &Joader, job: &str, dataset: &str, epochs: u32) -> std::process::Child {
    consumer(
        &j.server.url,
        &json!({"name": job, "dataset": dataset, "batch_size": 4, "ring_capacity": 8,
                "epochs": epochs, "pipeline": {"kind": "raw"}}),
        &[],
    )
}

#[test]
fn each_job_is_charged_the_store_bytes_of_its_misses_per_epoch_and_the_sums_add_up() {
    let test = "each_job_is_charged_the_store_bytes_of_its_misses_per_epoch_and_the_sums_add_up";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "store_bytes");
    // 40 objects of 1000 bytes: a miss's load costs exactly 1000 store bytes (a whole object,
    // no tier: every load goes to the store).
    let (n, len) = (40u32, 1000u64);
    write_objects(&s3.bucket(), "objs", n, len as usize);
    let j = joader(
        "store_bytes",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt", "--cache-slots", SLOTS_ARG],
        &credentials(&s3),
    );
    create(&j, "objs", folder_source("objs"));
    assert_eq!(settled(&j, "objs")["state"], "ready");
    let view = |name: &str| {
        j.server
            .client()
            .ok("GET", &format!("/v1/jobs/{name}"), None)
            .unwrap()
    };
    let store = || metric(&j, "joader_s3_read_bytes_total");

    // One job, two epochs: its first epoch missed every element once.
    let s = finish(job(&j, "alone", "objs", 2));
    no_errors(&s, "alone");
    let v = view("alone");
    let total = v["store_read_bytes"].as_u64().unwrap();
    assert_eq!(
        total as f64,
        store(),
        "one job: its bytes are the store's: {v}"
    );
    let (this, last) = (
        v["store_read_bytes_epoch"].as_u64().unwrap(),
        v["store_read_bytes_last_epoch"].as_u64().unwrap(),
    );
    assert_eq!(
        last,
        u64::from(n) * len,
        "epoch 1 loaded every element once: {v}"
    );
    assert_eq!(this + last, total, "{v}");
    assert!(
        this >= u64::from(n - SLOTS) * len,
        "epoch 2 reloaded what {SLOTS} slots could not keep: {v}"
    );

    // Two jobs at once: a load one job's miss issued is not charged to the other too.
    let before = store();
    let (a, b) = (job(&j, "a", "objs", 1), job(&j, "b", "objs", 1));
    no_errors(&finish(a), "a");
    no_errors(&finish(b), "b");
    let (va, vb) = (view("a"), view("b"));
    let charged = ["store_read_bytes", "store_read_bytes_epoch"]
        .map(|f| va[f].as_u64().unwrap() + vb[f].as_u64().unwrap());
    assert_eq!(
        charged[0] as f64,
        store() - before,
        "the jobs' sums are the store's: {va} {vb}"
    );
    assert_eq!(charged[0], charged[1], "all in their only epoch: {va} {vb}");
    assert!(
        charged[0] >= u64::from(n - SLOTS) * len,
        "every element the {SLOTS} slots did not keep loaded at least once: {va} {vb}"
    );
    assert!(
        charged[0] < 2 * u64::from(n) * len,
        "two jobs at once share loads: {va} {vb}"
    );
    // The per-job counter of `/metrics` agrees with the view.
    let text = ureq::get(&format!("{}/metrics", j.server.url))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    let series = text
        .lines()
        .find(|l| {
            l.starts_with("joader_job_store_read_bytes_total{") && l.contains("job_name=\"a\"")
        })
        .unwrap_or_else(|| panic!("no store bytes series of job a in /metrics"));
    let value: f64 = series.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(value, va["store_read_bytes"].as_u64().unwrap() as f64);
}

/// Waits for `dataset`'s preload to leave `loading`; returns its view.
fn preload_settled(j: &Joader, dataset: &str) -> Value {
    let c = j.server.client();
    wait_for("the preload to settle", || {
        let d = c.ok("GET", &format!("/v1/datasets/{dataset}"), None).ok()?;
        (d["preload"]["state"] != "loading").then(|| d["preload"].clone())
    })
}

#[test]
fn a_disk_preload_keeps_its_objects_through_other_jobs_and_a_restart_until_released() {
    let test = "a_disk_preload_keeps_its_objects_through_other_jobs_and_a_restart_until_released";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "tier_preload");
    // 80 objects of 20 KB (1.6 MB) for a tier of 1 MiB: pins may take 512 KiB.
    write_objects(&s3.bucket(), "pre", 80, 20_000);
    let disk = TempDir::new("tier_preload_disk");
    let dir = disk.0.join("tier");
    let args = tier_args("s3://bkt", &dir, "1MiB");
    let mut j = joader("tier_preload", &s3.bucket(), &args, &credentials(&s3));
    create(&j, "pre", folder_source("pre"));
    assert_eq!(settled(&j, "pre")["state"], "ready");
    let c = j.server.client();
    // A pipeline is refused: the tier keeps stored bytes.
    let (status, body) = c
        .call(
            "POST",
            "/v1/datasets/pre/preload",
            Some(&json!({"keep": "disk", "pipeline": {"kind": "raw"}})),
        )
        .unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    // Everything does not fit half the tier: it stops, saying how much did, and pins nothing.
    c.ok(
        "POST",
        "/v1/datasets/pre/preload",
        Some(&json!({"keep": "disk"})),
    )
    .unwrap();
    let p = preload_settled(&j, "pre");
    assert_eq!(p["state"], "failed", "{p}");
    assert!(
        p["reason"].as_str().unwrap().contains("does not fit"),
        "{p}"
    );
    assert_eq!(p["pinned"], 0);
    // The first 20 fit (about 400 KB), preloaded by the CLI, which waits.
    let gets = metric(&j, GETS);
    let out = std::process::Command::new(crate::common::joader_bin())
        .args(["preload", "pre", "--server", &j.server.url, "--disk"])
        .args(["--subset", r#"{"start": 0, "end": 20}"#])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (p["state"].as_str(), p["pinned"].as_u64()),
        (Some("ready"), Some(20)),
        "{p}"
    );
    assert!(
        metric(&j, GETS) - gets <= 20.0,
        "each preloaded object fetched at most once"
    );
    // Another job's 60 objects (1.2 MB) pass through the rest of the tier: they evict each
    // other, never the pinned ones.
    no_errors(&finish(job(&j, "others", "pre", 2)), "others");
    writer_idle(&j);
    assert!(
        metric(&j, "joader_disk_cache_bytes") <= metric(&j, "joader_disk_cache_capacity_bytes")
    );
    let gets = metric(&j, GETS);
    let subset_job = json!({"name": "pinned", "dataset": "pre", "batch_size": 4, "ring_capacity": 8,
        "epochs": 1, "pipeline": {"kind": "raw"}, "subset": {"start": 0, "end": 20}});
    no_errors(&finish(consumer(&j.server.url, &subset_job, &[])), "pinned");
    assert_eq!(
        metric(&j, GETS),
        gets,
        "the pinned objects came from the tier"
    );

    // A restart: the catalog keeps the preload, the tier its files; nothing is fetched again.
    assert!(j.server.stop());
    let env: Vec<(&str, String)> = credentials(&s3);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    j.server = TestServer::start_env(
        &unique_instance("tier_preload"),
        &j._state.0,
        &s3.bucket(),
        &args,
        &env,
    );
    let p = preload_settled(&j, "pre");
    assert_eq!(
        (
            p["state"].as_str(),
            p["pinned"].as_u64(),
            p["loads"].as_u64()
        ),
        (Some("ready"), Some(20), Some(0)),
        "{p}"
    );
    let subset_job = json!({"name": "after", "dataset": "pre", "batch_size": 4, "ring_capacity": 8,
        "epochs": 1, "pipeline": {"kind": "raw"}, "subset": {"start": 0, "end": 20}});
    no_errors(&finish(consumer(&j.server.url, &subset_job, &[])), "after");
    assert_eq!(
        metric(&j, GETS),
        0.0,
        "after the restart, the working set came from the tier"
    );
    let c = j.server.client();
    c.ok("DELETE", "/v1/datasets/pre/preload", None).unwrap();
    assert!(c.ok("GET", "/v1/datasets/pre", None).unwrap()["preload"].is_null());
}
