//! The real server end to end: datasets of every kind, jobs in separate processes, pixels and
//! bytes, bad input, a killed client, a restart.

use server::http::views::DatasetView;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{
    DEADLINE, TempDir, TestServer, consumer, finish, joader, shm_objects, unique_instance, wait_for,
};

pub(crate) const CLASSES: u32 = 4;
pub(crate) const PER_CLASS: u32 = 12;

/// A small ImageFolder dataset shared by the tests (generated once per test process).
pub(crate) fn dataset() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("joader-it-data-{}", std::process::id()));
        let spec = joader_tools::synth::SynthSpec {
            classes: CLASSES,
            per_class: PER_CLASS,
            width: 80,
            height: 60,
            quality: 90,
            seed: 7,
        };
        joader_tools::synth::generate_image_folder(&dir, &spec, &mut |_| {})
            .expect("generate the test dataset");
        dir
    })
}

/// The files of the dataset in index order (ImageFolder: sorted class folders, sorted files).
fn files(root: &Path) -> Vec<(PathBuf, i64)> {
    let mut classes: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    classes.sort();
    let mut out = Vec::new();
    for (label, c) in classes.iter().enumerate() {
        let mut fs: Vec<PathBuf> = std::fs::read_dir(c)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        fs.sort();
        out.extend(fs.into_iter().map(|f| (f, label as i64)));
    }
    out
}

pub(crate) struct Env {
    pub(crate) server: TestServer,
    _state: TempDir,
}

pub(crate) fn start(tag: &str, root: &Path) -> Env {
    start_with(tag, root, &[])
}

/// A server with `extra` flags (they override the test defaults of `TestServer`).
pub(crate) fn start_with(tag: &str, root: &Path, extra: &[&str]) -> Env {
    let state = TempDir::new(tag);
    let server = TestServer::start(&unique_instance(tag), &state.0, root, extra);
    Env {
        server,
        _state: state,
    }
}

pub(crate) fn create_folder_dataset(env: &Env, name: &str, root: &Path) -> DatasetView {
    let c = env.server.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": name, "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    c.wait_ready(name, DEADLINE).unwrap()
}

pub(crate) fn epoch_ids(summary: &Value, epoch: usize) -> Vec<u32> {
    summary["epochs"][epoch]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn jobs_in_separate_processes_get_exactly_their_subsets() {
    let root = dataset();
    let env = start("jobs", root);
    create_folder_dataset(&env, "imgs", root);
    let labels: Vec<i64> = files(root).iter().map(|f| f.1).collect();
    let n = labels.len() as u32;
    // Non-nested overlaps: A∩B, B∩C and A∩C all differ.
    let jobs = [
        (
            json!({"name": "a", "dataset": "imgs", "batch_size": 5, "epochs": 2, "subset": {"start": 0, "end": 30}}),
            (0..30).collect::<BTreeSet<u32>>(),
            &[][..],
        ),
        (
            json!({"name": "b", "dataset": "imgs", "batch_size": 7, "epochs": 2, "seed": 3, "subset": {"ranges": [[20, 40]]}}),
            (20..40).collect(),
            &["--sample-us", "2000"][..],
        ),
        (
            json!({"name": "c", "dataset": "imgs", "batch_size": 4, "epochs": 2, "subset": {"classes": ["class_00", "class_03"]}}),
            (0..12).chain(36..48).collect(),
            &[][..],
        ),
        (
            json!({"name": "d", "dataset": "imgs", "batch_size": 8, "epochs": 1, "sampler": "independent"}),
            (0..n).collect(),
            &[][..],
        ),
    ];
    let mut running = Vec::new();
    for (i, (job, want, extra)) in jobs.iter().enumerate() {
        if i == 2 {
            std::thread::sleep(Duration::from_millis(300)); // a staggered start
        }
        running.push((
            consumer(&env.server.url, job, extra),
            want.clone(),
            job["epochs"].as_u64().unwrap(),
        ));
    }
    for (child, want, epochs) in running {
        let s = finish(child);
        assert_eq!(s["epochs"].as_array().unwrap().len() as u64, epochs);
        for e in 0..epochs as usize {
            let ids = epoch_ids(&s, e);
            let set: BTreeSet<u32> = ids.iter().copied().collect();
            assert_eq!(set.len(), ids.len(), "an element repeats within an epoch");
            assert_eq!(set, want, "epoch {e} is not the job's subset");
            for p in s["epochs"][e].as_array().unwrap() {
                assert_eq!(
                    p[1].as_i64().unwrap(),
                    labels[p[0].as_u64().unwrap() as usize],
                    "wrong label"
                );
            }
        }
    }
    let c = env.server.client();
    let jobs = c.ok("GET", "/v1/jobs", None).unwrap();
    for j in jobs["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "finished", "{j}");
    }
    let stats = c.ok("GET", "/v1/stats", None).unwrap();
    // 48 images fit in the cache: across 4 jobs and 7 epochs each element is decoded once.
    assert_eq!(stats["decodes"].as_u64().unwrap(), u64::from(n), "{stats}");
}

#[test]
fn raw_bytes_are_the_files_and_pixels_match_the_pipeline() {
    let root = dataset();
    let env = start("pixels", root);
    create_folder_dataset(&env, "imgs", root);
    let files = files(root);
    let raw_dir = TempDir::new("raw");
    let dec_dir = TempDir::new("dec");
    let pipeline = json!({"kind": "decode", "resize_shorter": 32, "center_crop": [24, 28]});
    let raw = consumer(
        &env.server.url,
        &json!({"name": "raw", "dataset": "imgs", "batch_size": 6, "epochs": 1, "pipeline": {"kind": "raw"}}),
        &["--dump", raw_dir.0.to_str().unwrap()],
    );
    let dec = consumer(
        &env.server.url,
        &json!({"name": "dec", "dataset": "imgs", "batch_size": 6, "epochs": 1, "pipeline": pipeline}),
        &["--dump", dec_dir.0.to_str().unwrap()],
    );
    finish(raw);
    finish(dec);
    let p: joader_pipeline::Pipeline = serde_json::from_value(pipeline).unwrap();
    let limits = joader_pipeline::Limits {
        max_pixels: 100_000_000,
    };
    let mut seen = 0;
    for (dir, is_raw) in [(&raw_dir.0, true), (&dec_dir.0, false)] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let element: usize = name.rsplit('-').next().unwrap().parse().unwrap();
            let got = std::fs::read(&path).unwrap();
            let file = std::fs::read(&files[element].0).unwrap();
            if is_raw {
                assert_eq!(got, file, "raw element {element} differs from its file");
            } else {
                let want = match joader_pipeline::run(&p, &file, &limits).unwrap() {
                    joader_pipeline::Output::Hwc {
                        data,
                        height,
                        width,
                        channels,
                    } => {
                        assert_eq!((height, width, channels), (24, 28, 3));
                        data
                    }
                    other => panic!("unexpected output {other:?}"),
                };
                assert_eq!(
                    got, want,
                    "decoded element {element} differs from the in-process pipeline"
                );
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 2 * files.len());
}

#[test]
fn every_source_kind_indexes_and_the_catalog_survives_a_restart() {
    let root = TempDir::new("kinds");
    let src = dataset();
    let list = files(src);
    // tar shards (WebDataset: key.jpg + key.cls), two shards
    let shards = root.0.join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    for (s, chunk) in list.chunks(list.len() / 2 + 1).enumerate() {
        let f = std::fs::File::create(shards.join(format!("part-{s:03}.tar"))).unwrap();
        let mut b = tar::Builder::new(f);
        for (i, (path, label)) in chunk.iter().enumerate() {
            let key = format!("s{s}_{i:04}");
            b.append_path_with_name(path, format!("{key}.jpg")).unwrap();
            let cls = label.to_string();
            let mut h = tar::Header::new_gnu();
            h.set_size(cls.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, format!("{key}.cls"), cls.as_bytes())
                .unwrap();
        }
        b.finish().unwrap();
    }
    // a CSV manifest with relative paths
    let images = root.0.join("images");
    std::fs::create_dir_all(&images).unwrap();
    let mut csv = String::from("path,label\n");
    for (i, (path, label)) in list.iter().enumerate().take(10) {
        std::fs::copy(path, images.join(format!("{i}.jpg"))).unwrap();
        csv.push_str(&format!("images/{i}.jpg,{label}\n"));
    }
    std::fs::write(root.0.join("list.csv"), csv).unwrap();
    let folder = root.0.join("folder");
    copy_tree(src, &folder);

    let state = TempDir::new("kinds-state");
    let instance = unique_instance("kinds");
    let mut server = TestServer::start(&instance, &state.0, &root.0, &[]);
    let c = server.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "f", "source": {"kind": "image_folder", "path": folder}})),
    )
    .unwrap();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "t", "source": {"kind": "tar_shards", "paths": [shards]}})),
    )
    .unwrap();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(
            &json!({"name": "m", "source": {"kind": "manifest", "path": root.0.join("list.csv")}}),
        ),
    )
    .unwrap();
    let f = c.wait_ready("f", DEADLINE).unwrap();
    let t = c.wait_ready("t", DEADLINE).unwrap();
    let m = c.wait_ready("m", DEADLINE).unwrap();
    assert_eq!(f.items, Some(list.len() as u64));
    assert_eq!(
        f.classes.unwrap(),
        ["class_00", "class_01", "class_02", "class_03"]
    );
    assert_eq!(t.items, Some(list.len() as u64));
    assert_eq!(m.items, Some(10));
    // Read the tar dataset through a job: labels come from the .cls members.
    let s = finish(consumer(
        &server.url,
        &json!({"name": "tj", "dataset": "t", "batch_size": 8, "epochs": 1, "pipeline": {"kind": "raw"}}),
        &[],
    ));
    assert_eq!(epoch_ids(&s, 0).len(), list.len());
    assert!(server.stop(), "the server exits cleanly on SIGTERM");
    assert!(
        shm_objects(&instance).is_empty(),
        "a stopped server leaves no segment: {:?}",
        shm_objects(&instance)
    );

    let server2 = TestServer::start(&instance, &state.0, &root.0, &[]);
    let c2 = server2.client();
    let listed = c2.ok("GET", "/v1/datasets", None).unwrap();
    let names: BTreeSet<&str> = listed["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["f", "m", "t"].into());
    assert_eq!(
        c2.ok("GET", "/v1/datasets/t", None).unwrap()["state"],
        "ready"
    );
    let s = finish(consumer(
        &server2.url,
        &json!({"name": "again", "dataset": "m", "batch_size": 3, "epochs": 1}),
        &[],
    ));
    assert_eq!(epoch_ids(&s, 0).len(), 10);
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

#[test]
fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let root = dataset();
    let env = start("bad", root);
    create_folder_dataset(&env, "imgs", root);
    let c = env.server.client();
    let outside = std::env::temp_dir().join("definitely-not-allowed");
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "POST",
            "/v1/datasets",
            json!({"name": "x", "source": {"kind": "image_folder", "path": outside}}),
            403,
            "path_not_allowed",
        ),
        (
            "POST",
            "/v1/datasets",
            json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}}),
            409,
            "dataset_exists",
        ),
        (
            "POST",
            "/v1/datasets",
            json!({"name": "y", "source": {"kind": "floppy"}}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/datasets",
            json!({"name": "bad/name", "source": {"kind": "image_folder", "path": root}}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "nope", "batch_size": 4}),
            404,
            "dataset_not_found",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 0}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "colour": "red"}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "subset": []}),
            400,
            "empty_subset",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "subset": {"classes": ["zebra"]}}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "subset": [1, 99999]}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "rank": 2, "world_size": 2}),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "client": {"layout_version": 99}}),
            409,
            "version_mismatch",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "pipeline": {"kind": "decode", "resize_shorter": 0}}),
            400,
            "invalid_request",
        ),
        // Requests that can never fit are 422 naming the limit, not a transient 503.
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "ring_capacity": 1_000_000_000}),
            422,
            "too_large",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 1_000_000_000}),
            422,
            "too_large",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "world_size": 100_000}),
            422,
            "too_large",
        ),
        (
            "POST",
            "/v1/jobs",
            // 8 ranks × 4096 records: more than the test server's 4096 cache slots.
            json!({"name": "j", "dataset": "imgs", "batch_size": 4, "world_size": 8, "ring_capacity": 4096}),
            422,
            "too_large",
        ),
        (
            "POST",
            "/v1/jobs",
            // 2000 crops of 224×224×3 bytes: more than the whole 256 MiB cache.
            json!({"name": "j", "dataset": "imgs", "batch_size": 2000,
                   "pipeline": {"kind": "decode", "resize_shorter": 256, "center_crop": [224, 224]}}),
            422,
            "too_large",
        ),
        (
            "POST",
            "/v1/jobs",
            json!({"name": "j", "dataset": "imgs", "batch_size": 64, "ring_capacity": 16}),
            400,
            "invalid_request",
        ),
        ("GET", "/v1/jobs/ghost", Value::Null, 404, "job_not_found"),
        (
            "DELETE",
            "/v1/jobs/ghost",
            Value::Null,
            404,
            "job_not_found",
        ),
        (
            "GET",
            "/v1/datasets/ghost",
            Value::Null,
            404,
            "dataset_not_found",
        ),
        ("GET", "/v1/nothing-here", Value::Null, 404, "not_found"),
    ];
    for (method, path, body, status, code) in cases {
        let (got, v) = c
            .call(method, path, (!body.is_null()).then_some(&body))
            .unwrap();
        assert_eq!(
            (got, v["error"]["code"].as_str().unwrap_or("")),
            (status, code),
            "{method} {path} {body}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(!message.is_empty());
        if code == "too_large" {
            assert!(
                [
                    "ring_capacity",
                    "world_size",
                    "cache_slots",
                    "cache_bytes",
                    "limit"
                ]
                .iter()
                .any(|l| message.contains(l)),
                "a refusal names the limit: {message}"
            );
        }
    }
    // Malformed JSON.
    let resp = ureq::post(format!("{}/v1/jobs", env.server.url))
        .config()
        .http_status_as_error(false)
        .build()
        .header("content-type", "application/json")
        .send("{not json")
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // Nothing changed: one dataset, no job.
    assert_eq!(
        c.ok("GET", "/v1/datasets", None).unwrap()["datasets"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        c.ok("GET", "/v1/jobs", None).unwrap()["jobs"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // A dataset in use is not deleted unless forced; a job name is not reused with other parameters.
    let (s, _) = c
        .call(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": "held", "dataset": "imgs", "batch_size": 4})),
        )
        .unwrap();
    assert_eq!(s, 201);
    let (s, same) = c
        .call(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": "held", "dataset": "imgs", "batch_size": 4, "rank": 0})),
        )
        .unwrap();
    assert_eq!(
        s, 200,
        "the same job again (another rank) is not an error: {same}"
    );
    let (s, v) = c
        .call(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": "held", "dataset": "imgs", "batch_size": 8})),
        )
        .unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str().unwrap()),
        (409, "job_exists")
    );
    let (s, v) = c.call("DELETE", "/v1/datasets/imgs", None).unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str().unwrap()),
        (409, "dataset_in_use")
    );
    let (s, _) = c
        .call("DELETE", "/v1/datasets/imgs?force=true", None)
        .unwrap();
    assert_eq!(s, 204);
    assert_eq!(
        c.ok("GET", "/v1/jobs", None).unwrap()["jobs"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn a_killed_client_is_reclaimed_while_the_others_finish() {
    let root = dataset();
    let env = start("kill", root);
    create_folder_dataset(&env, "imgs", root);
    let c = env.server.client();
    let victim = consumer(
        &env.server.url,
        &json!({"name": "victim", "dataset": "imgs", "batch_size": 4, "epochs": 3}),
        &["--stop-after", "8"],
    );
    let survivor = consumer(
        &env.server.url,
        &json!({"name": "survivor", "dataset": "imgs", "batch_size": 4, "epochs": 3}),
        &["--sample-us", "500"],
    );
    // Wait until the victim has read two batches (and holds the second), then kill it.
    wait_for("the victim to read a batch", || {
        let j = c.ok("GET", "/v1/jobs/victim", None).ok()?;
        (j["acknowledged"].as_u64().unwrap_or(0) >= 4).then_some(())
    });
    let mut victim = victim;
    victim.kill().unwrap();
    victim.wait().unwrap();
    let s = finish(survivor);
    for e in 0..3 {
        let set: BTreeSet<u32> = epoch_ids(&s, e).into_iter().collect();
        assert_eq!(
            set.len(),
            (CLASSES * PER_CLASS) as usize,
            "the survivor's epoch {e} is complete"
        );
    }
    let j = wait_for("the dead client to be noticed", || {
        let j = c.ok("GET", "/v1/jobs/victim", None).unwrap();
        (j["state"] == "failed").then_some(j)
    });
    assert!(j["reason"].as_str().unwrap().contains("died"), "{j}");
    // Everything the victim held is released: the cache can be filled again.
    let s = finish(consumer(
        &env.server.url,
        &json!({"name": "victim", "dataset": "imgs", "batch_size": 4, "epochs": 1}),
        &[],
    ));
    assert_eq!(
        epoch_ids(&s, 0).len(),
        (CLASSES * PER_CLASS) as usize,
        "a failed job's name can be reused"
    );
}

#[test]
fn unreadable_elements_are_reported_not_fatal() {
    let root = TempDir::new("corrupt");
    copy_tree(dataset(), &root.0);
    let bad = root.0.join("class_01");
    std::fs::write(bad.join("zz_not_an_image.jpg"), b"hello, I am text").unwrap();
    let good = std::fs::read(files(&root.0)[0].0.clone()).unwrap();
    std::fs::write(bad.join("zz_truncated.jpg"), &good[..good.len() / 3]).unwrap();
    std::fs::write(bad.join("zz_empty.jpg"), b"").unwrap();
    // Decompression bombs: headers claiming 30000x30000 (JPEG) and 20000x20000 (PNG), far
    // above the pixel limit: refused from the header, never allocated.
    let mut jpeg_bomb = good.clone();
    let sof = jpeg_bomb
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("a baseline JPEG");
    jpeg_bomb[sof + 5..sof + 9].copy_from_slice(&[0x75, 0x30, 0x75, 0x30]);
    std::fs::write(bad.join("zz_bomb.jpg"), &jpeg_bomb).unwrap();
    std::fs::write(bad.join("zz_bomb.png"), png_header_only(20_000, 20_000)).unwrap();
    let env = start("corrupt", &root.0);
    create_folder_dataset(&env, "imgs", &root.0);
    let s = finish(consumer(
        &env.server.url,
        &json!({"name": "j", "dataset": "imgs", "batch_size": 5, "epochs": 2}),
        &[],
    ));
    let total = (CLASSES * PER_CLASS + 5) as usize;
    for e in 0..2 {
        let errors = s["errors"][e].as_array().unwrap();
        let ok = epoch_ids(&s, e).len();
        assert!(
            !errors.is_empty(),
            "the corrupt elements come back as error records"
        );
        assert_eq!(
            ok + errors.len(),
            total,
            "every element is delivered or reported, once"
        );
    }
    let c = env.server.client();
    let failures = c.ok("GET", "/v1/datasets/imgs/failures", None).unwrap();
    let mut kinds: Vec<&str> = failures["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds.len(), 5, "{failures}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "image_too_large").count(),
        2,
        "both bombs are refused by the pixel limit: {failures}"
    );
    assert!(
        kinds
            .iter()
            .all(|k| ["image_too_large", "corrupt_image", "not_an_image"].contains(k)),
        "{failures}"
    );
    assert_eq!(
        c.ok("GET", "/healthz", None).unwrap()["status"],
        "ok",
        "the server is still up"
    );
    // Decoding either bomb would take gigabytes; the server's peak resident memory stays
    // that of a server with a 256 MiB cache.
    let pid = env.server.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(peak_kib < 600 * 1024, "peak RSS {peak_kib} KiB");
}

/// A PNG that is only a valid signature, IHDR (8-bit RGB, `w`×`h`) and IEND: a header
/// claiming a huge image.
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = 0xFFFF_FFFFu32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend((data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend(kind);
        out.extend(data);
        let crc = crc32(&out[start..]);
        out.extend(crc.to_be_bytes());
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend(w.to_be_bytes());
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IEND", &[]);
    out
}

#[test]
fn ranks_registering_at_once_create_each_job_once_and_join_it() {
    // 15 jobs of world size 2 and 5 of world size 4: all 50 ranks POST at the same moment, as
    // torchrun starts them. Jobs 0-9 have one epoch of 48 elements, which fits in their rings:
    // its end of stream may be pushed before the last rank arrives, which must still join.
    // Jobs 10-19 run until deleted.
    let root = dataset();
    let env = start("ddp", root);
    create_folder_dataset(&env, "imgs", root);
    let ranks: Vec<(String, u32, u32, Value)> = (0..20u32)
        .flat_map(|j| {
            let world = if j < 15 { 2 } else { 4 };
            let epochs = if j < 10 { json!(1) } else { Value::Null };
            (0..world).map(move |r| (format!("ddp{j}"), world, r, epochs.clone()))
        })
        .collect();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(ranks.len()));
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|(name, world, rank, epochs)| {
            let url = env.server.url.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let c = joader_tools::client::Client::new(url);
                let body = json!({"name": name, "dataset": "imgs", "batch_size": 4, "epochs": epochs,
                                  "world_size": world, "rank": rank});
                barrier.wait();
                let (status, v) = c.call("POST", "/v1/jobs", Some(&body)).unwrap();
                (name, world, status, v)
            })
        })
        .collect();
    let mut by_job: std::collections::BTreeMap<String, Vec<(u32, u16, Value)>> = Default::default();
    for h in handles {
        let (name, world, status, v) = h.join().unwrap();
        assert!(
            status == 200 || status == 201,
            "rank of {name} refused: {status} {v}"
        );
        by_job.entry(name).or_default().push((world, status, v));
    }
    assert_eq!(by_job.len(), 20);
    for (name, regs) in &by_job {
        let world = regs[0].0 as usize;
        assert_eq!(regs.len(), world);
        assert_eq!(
            regs.iter().filter(|r| r.1 == 201).count(),
            1,
            "job {name} was created exactly once"
        );
        let rings: BTreeSet<String> = regs[0].2["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["ring"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(rings.len(), world, "job {name}: one ring per rank");
        for r in regs {
            assert_eq!(
                r.2["ranks"], regs[0].2["ranks"],
                "job {name}: every rank sees the same rings"
            );
        }
    }
    // A rank whose parameters differ is refused, naming the field.
    let c = env.server.client();
    let (status, v) = c
        .call(
            "POST",
            "/v1/jobs",
            Some(
                &json!({"name": "ddp10", "dataset": "imgs", "batch_size": 8, "epochs": null,
                         "world_size": 2, "rank": 1}),
            ),
        )
        .unwrap();
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "job_exists", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batch_size"),
        "{v}"
    );
}

#[test]
fn the_api_answers_while_a_large_manifest_is_indexed_and_persisted() {
    // 200,000 manifest lines (the dataset's 48 files, repeated): indexing and the catalog
    // commit of the whole index happen while the API is probed from two threads.
    const LINES: usize = 200_000;
    let root = dataset();
    let scratch = TempDir::new("manifest-200k");
    let list = files(root);
    let mut text = String::from("path,label\n");
    for i in 0..LINES {
        let (path, label) = &list[i % list.len()];
        text.push_str(&format!("{},{label}\n", path.display()));
    }
    let manifest = scratch.0.join("big.csv");
    std::fs::write(&manifest, text).unwrap();
    let state = TempDir::new("manifest-200k-state");
    let mut server = TestServer::start(
        &unique_instance("big"),
        &state.0,
        &scratch.0,
        &["--allowed-root", root.to_str().unwrap()],
    );
    let c = server.client();
    create_folder_dataset_at(&c, "small", root);
    c.ok(
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "running", "dataset": "small", "batch_size": 4})),
    )
    .unwrap();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "big", "source": {"kind": "manifest", "path": manifest}})),
    )
    .unwrap();
    let probes = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for path in ["/healthz", "/v1/jobs"] {
            let (c, probes, done) = (server.client(), &probes, &done);
            s.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, body) = c.call("GET", path, None).unwrap();
                    assert_eq!(status, 200, "GET {path} while indexing: {body}");
                    probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        let ready = c.wait_ready("big", DEADLINE);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let ready = ready.unwrap();
        assert_eq!(ready.items, Some(LINES as u64), "{ready:?}");
    });
    assert!(probes.into_inner() > 0);
    // The job on the other dataset is still there, and the index survived the commit.
    let jobs = c.ok("GET", "/v1/jobs", None).unwrap();
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 1, "{jobs}");
    server.stop();
}

fn create_folder_dataset_at(c: &joader_tools::client::Client, name: &str, root: &Path) {
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": name, "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    c.wait_ready(name, DEADLINE).unwrap();
}

/// SIGTERM with a grace that cannot end during the test: new work is refused while a running
/// job goes on, and the drain ends on the event that ends it, the job finished and read, not
/// on the grace (the test says when the job may finish, after it has seen the refusal).
#[test]
fn sigterm_drains_refusing_new_jobs_until_the_running_ones_finish() {
    let root = dataset();
    let state = TempDir::new("drain");
    let instance = unique_instance("drain");
    let mut server = TestServer::start(&instance, &state.0, root, &["--drain-grace-s", "3600"]);
    let c = server.client();
    create_folder_dataset_at(&c, "imgs", root);
    let job = c
        .ok(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": "last", "dataset": "imgs", "batch_size": 4, "epochs": 1})),
        )
        .unwrap();
    let ring = job["ranks"][0]["ring"].as_str().unwrap().to_string();
    let inst = instance.clone();
    let (attached_tx, attached) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    // A client that reads a batch, waits until told, then reads the epoch to its end and
    // leaves; returns how many samples it read.
    let reader = std::thread::spawn(move || {
        let r = dataplane::Reader::open(&inst, &ring).unwrap();
        let first = r.next_batch(4, Some(DEADLINE)).unwrap();
        let mut got = first.len();
        r.ack(first);
        attached_tx.send(()).unwrap();
        let _ = go_rx.recv(); // told, or the test ended
        let start = std::time::Instant::now();
        loop {
            let b = r.next_batch(4, Some(Duration::from_secs(1))).unwrap();
            got += b.len();
            let end = b.end_of_stream();
            r.ack(b);
            if end {
                return got;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "waited {DEADLINE:?} in vain for the end of the job ({got} samples read)"
            );
        }
    });
    attached.recv().unwrap();
    server.sigterm();
    // Draining: new work is refused as a transient condition, the API still answers. A job
    // registered before the signal landed would run (and hold the drain) for ever: it is
    // deleted, and the next try made.
    let refused = wait_for("new jobs to be refused", || {
        let (status, v) = c
            .call(
                "POST",
                "/v1/jobs",
                Some(&json!({"name": "late", "dataset": "imgs", "batch_size": 4})),
            )
            .ok()?;
        if (200..300).contains(&status) {
            c.ok("DELETE", "/v1/jobs/late", None).unwrap();
        }
        (status == 503).then_some(v)
    });
    assert_eq!(refused["error"]["code"], "shutting_down", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{refused}"
    );
    // Running (or finished, if its whole epoch fits in its ring) but not ended: its client
    // has not read it yet.
    let j = c.ok("GET", "/v1/jobs/last", None).unwrap();
    assert!(
        matches!(j["state"].as_str(), Some("running" | "finished")),
        "the running job goes on: {j}"
    );
    // The job reads to its end; then nothing runs and the server stops (with an hour of grace
    // left: a server that waited it out would fail the wait below).
    go.send(()).unwrap();
    let got = reader.join().unwrap();
    assert_eq!(
        got,
        (CLASSES * PER_CLASS) as usize,
        "the whole epoch was read"
    );
    server.exits_cleanly("the server to exit once its last job ended");
}

/// A server whose stderr is a pipe nobody reads any more (the program that started it died)
/// goes on serving, and stops on SIGTERM. The log lines it cannot write are dropped; they
/// used to panic the thread that logged, the SIGTERM handler's task among them, and the server
/// then never stopped.
#[test]
fn a_server_whose_log_reader_is_gone_serves_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let root = dataset();
    let state = TempDir::new("log-gone");
    let instance = unique_instance("log_gone");
    /// Killed, and its instance's segments removed, however the test ends.
    struct Serve(std::process::Child, String);
    impl Drop for Serve {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = dataplane::remove_dead_instance(&self.1);
        }
    }
    let child = std::process::Command::new(crate::common::joader_bin())
        .args(["serve", "--instance", &instance, "--bind", "127.0.0.1:0"])
        .args([
            "--cache-bytes",
            "64MiB",
            "--drain-grace-s",
            "1",
            "--data-dir",
        ])
        .arg(&state.0)
        .arg("--allowed-root")
        .arg(root)
        .env("JOADER_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn joader serve");
    let mut serve = Serve(child, instance.clone());
    let mut lines = BufReader::new(serve.0.stderr.take().expect("stderr")).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            let at = l.find("addr=")?;
            Some(l[at + 5..].split_whitespace().next()?.to_string())
        })
        .expect("the server logs its address");
    drop(lines); // the read end closes: every later log line fails to write
    let c = joader_tools::client::Client::new(format!("http://{addr}"));
    // Registering and indexing a dataset logs at info level, on several threads.
    create_folder_dataset_at(&c, "imgs", root);
    c.wait_ready("imgs", DEADLINE)
        .expect("the dataset is indexed");
    let s = finish(consumer(
        &format!("http://{addr}"),
        &json!({"name": "j", "dataset": "imgs", "batch_size": 8, "epochs": 1, "pipeline": {"kind": "raw"}}),
        &[],
    ));
    assert_eq!(epoch_ids(&s, 0).len(), (CLASSES * PER_CLASS) as usize);
    let pid = rustix::process::Pid::from_raw(serve.0.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let status = wait_for("the server to exit after SIGTERM", || {
        serve.0.try_wait().expect("wait")
    });
    assert!(status.success(), "{status:?}");
    assert!(shm_objects(&instance).is_empty(), "no segment is left");
}

/// SIGTERM with a job that never ends: the server stops once the grace is over (the test
/// observes nothing within the grace, only what follows it), and the job's client gets an
/// error that says so, never a hang.
#[test]
fn sigterm_drains_for_the_grace_then_ends_running_jobs_with_a_clear_error() {
    let root = dataset();
    let state = TempDir::new("drain-grace");
    let instance = unique_instance("drain_grace");
    let mut server = TestServer::start(&instance, &state.0, root, &["--drain-grace-s", "1"]);
    let c = server.client();
    create_folder_dataset_at(&c, "imgs", root);
    let job = c
        .ok(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": "endless", "dataset": "imgs", "batch_size": 4, "epochs": null})),
        )
        .unwrap();
    let ring = job["ranks"][0]["ring"].as_str().unwrap().to_string();
    let inst = instance.clone();
    // A client reading an endless job: it must end with a clear error, never hang.
    let reader = std::thread::spawn(move || {
        let r = dataplane::Reader::open(&inst, &ring).unwrap();
        let mut got = 0u64;
        loop {
            match r.next_batch(4, Some(Duration::from_secs(60))) {
                Ok(b) => {
                    got += b.len() as u64;
                    r.ack(b);
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return (got, e),
            }
        }
    });
    wait_for("the client to read", || {
        let j = c.ok("GET", "/v1/jobs/endless", None).ok()?;
        (j["acknowledged"].as_u64()? > 0).then_some(())
    });
    server.sigterm();
    // After the grace the server stops; the client gets an error that says so.
    let (got, err) = reader.join().unwrap();
    assert!(got > 0);
    assert_eq!(
        err.code(),
        "server_gone",
        "a clear end-of-service error: {err}"
    );
    assert!(err.to_string().contains("shut down"), "{err}");
    server.exits_cleanly("the server to exit");
}

#[test]
fn a_killed_server_is_noticed_by_its_clients_and_a_restart_cleans_up() {
    let root = dataset();
    let state = TempDir::new("killed");
    let instance = unique_instance("killed");
    let mut server = TestServer::start(&instance, &state.0, root, &[]);
    let c = server.client();
    create_folder_dataset_at(&c, "imgs", root);
    let job = c
        .ok(
            "POST",
            "/v1/jobs",
            Some(&json!({"name": "reading", "dataset": "imgs", "batch_size": 4, "epochs": null})),
        )
        .unwrap();
    let ring = job["ranks"][0]["ring"].as_str().unwrap().to_string();
    let inst = instance.clone();
    let (attached_tx, attached) = std::sync::mpsc::channel();
    // A client that reads a little, then blocks waiting (it stops acknowledging, so the
    // ring fills and nothing new comes) when the server is killed.
    let reader = std::thread::spawn(move || {
        let r = dataplane::Reader::open(&inst, &ring).unwrap();
        let first = r.next_batch(4, Some(Duration::from_secs(60))).unwrap();
        attached_tx.send(()).unwrap();
        let mut held = vec![first];
        loop {
            match r.next_batch(4, Some(Duration::from_secs(60))) {
                Ok(b) => held.push(b),
                Err(e) => return e,
            }
        }
    });
    attached.recv().unwrap();
    let mut child = server.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL: no drain, no clean-up
    child.wait().unwrap();
    let err = reader.join().unwrap();
    assert_eq!(err.code(), "server_gone", "{err}");
    assert!(
        !shm_objects(&instance).is_empty(),
        "a killed server leaves its segments behind"
    );
    // The same instance restarted: stale segments removed, the catalog kept.
    let mut again = TestServer::start(&instance, &state.0, root, &[]);
    let c = again.client();
    let d = c.wait_ready("imgs", DEADLINE).unwrap();
    assert_eq!(d.items, Some(u64::from(CLASSES * PER_CLASS)));
    let left: Vec<String> = shm_objects(&instance)
        .into_iter()
        .filter(|n| n.contains("-ring-"))
        .collect();
    assert!(left.is_empty(), "stale rings removed at start-up: {left:?}");
    assert!(
        c.ok("GET", "/v1/jobs", None).unwrap()["jobs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(again.stop());
    assert!(shm_objects(&instance).is_empty());
}

/// `joader cleanup`: refused while the server runs; after a SIGKILL (nothing drained, nothing
/// removed) it removes what the server left in /dev/shm, without restarting it.
#[test]
fn cleanup_removes_a_killed_servers_segments_and_refuses_a_live_one() {
    let root = dataset();
    let state = TempDir::new("cleanup");
    let instance = unique_instance("cleanup");
    let mut server = TestServer::start(&instance, &state.0, root, &[]);
    let c = server.client();
    create_folder_dataset_at(&c, "imgs", root);
    c.ok(
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "j", "dataset": "imgs", "batch_size": 4})),
    )
    .unwrap();
    let live = joader(&["cleanup", "--instance", &instance]);
    assert!(!live.status.success());
    let err = String::from_utf8_lossy(&live.stderr);
    assert!(
        err.contains("instance_in_use") || err.contains("in use"),
        "{err}"
    );
    let before = shm_objects(&instance);
    assert!(
        before.iter().any(|n| n.ends_with("-data")) && before.iter().any(|n| n.contains("-ring-")),
        "{before:?}"
    );
    let mut child = server.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        shm_objects(&instance),
        before,
        "a killed server leaves them"
    );
    let out = joader(&["cleanup", "--instance", &instance]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in &before {
        assert!(text.contains(name.as_str()), "{name} not in {text}");
    }
    assert!(
        shm_objects(&instance).is_empty(),
        "{:?}",
        shm_objects(&instance)
    );
    let again = joader(&["cleanup", "--instance", &instance]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing left"));
}
