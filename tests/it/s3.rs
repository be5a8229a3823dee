//! `s3` sources against a real S3 server: `s3s-fs` (the s3s project's file-system backed
//! S3 server), one per test on a free port over a folder of its own. A bucket is a folder of
//! that root, so a test writes files once and reads them both from local disk and from S3.
//!
//! `tests/all.sh` installs `s3s-fs` and sets `JOADER_S3S_FS` (and `JOADER_REQUIRE_TOOLS=1`,
//! which turns a missing server into a failure); a plain `cargo test` without it says that it
//! skips these tests.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::common::{TempDir, TestServer, consumer, finish, unique_instance, wait_for};
use crate::server::{dataset, epoch_ids};

const BUCKET: &str = "bkt";
const KEY: &str = "joader-test-key";
const SECRET: &str = "joader-test-secret-0123456789";

/// The `s3s-fs` binary, or `None` (after saying so) when it is missing and not required.
pub(crate) fn s3s_fs(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("JOADER_S3S_FS")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    match found {
        Some(p) => Some(p),
        None if std::env::var("JOADER_REQUIRE_TOOLS").is_ok_and(|v| v == "1") => panic!(
            "{test} needs s3s-fs: set JOADER_S3S_FS to its path (tests/all.sh installs it); \
             JOADER_REQUIRE_TOOLS=1 forbids skipping"
        ),
        None => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: JOADER_S3S_FS names no s3s-fs binary (tests/all.sh installs it)"
            );
            None
        }
    }
}

/// An `s3s-fs` process serving the folder `root` (buckets are its sub-folders).
pub(crate) struct S3Server {
    bin: PathBuf,
    child: Option<Child>,
    port: u16,
    root: TempDir,
}

impl S3Server {
    pub(crate) fn start(bin: PathBuf, tag: &str) -> S3Server {
        let root = TempDir::new(tag);
        std::fs::create_dir_all(root.0.join(BUCKET)).unwrap();
        let mut server = S3Server {
            bin,
            child: None,
            port: 0,
            root,
        };
        // s3s-fs takes a port, not a listener: take a free one, and another if someone else
        // bound it meanwhile (the child then exits).
        for _ in 0..10 {
            server.port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            if server.spawn() {
                return server;
            }
        }
        panic!("s3s-fs found no free port in 10 tries");
    }

    /// Starts the process on `self.port`; true once it accepts connections, false if it
    /// exited (the port was taken).
    fn spawn(&mut self) -> bool {
        let mut child = Command::new(&self.bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", KEY, "--secret-key", SECRET])
            .arg(&self.root.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn s3s-fs");
        let up = wait_for("s3s-fs to accept connections or exit", || {
            if let Ok(Some(_)) = child.try_wait() {
                return Some(false);
            }
            TcpStream::connect(("127.0.0.1", self.port))
                .is_ok()
                .then_some(true)
        });
        if up {
            self.child = Some(child);
        }
        up
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the process and starts another on the same port over the same folder.
    pub(crate) fn restart(&mut self) {
        self.kill();
        wait_for("s3s-fs to take its port back", || {
            self.spawn().then_some(())
        });
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn bucket(&self) -> PathBuf {
        self.root.0.join(BUCKET)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The environment of a server that may read `s3`.
pub(crate) fn credentials(s3: &S3Server) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
        ("AWS_ENDPOINT_URL", s3.endpoint()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ]
}

pub(crate) struct Joader {
    pub(crate) server: TestServer,
    pub(crate) _state: TempDir,
}

pub(crate) fn joader(
    tag: &str,
    root: &Path,
    extra: &[&str],
    env: &[(&'static str, String)],
) -> Joader {
    let state = TempDir::new(tag);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = TestServer::start_env(&unique_instance(tag), &state.0, root, extra, &env);
    Joader {
        server,
        _state: state,
    }
}

pub(crate) fn create(j: &Joader, name: &str, source: Value) {
    j.server
        .client()
        .ok(
            "POST",
            "/v1/datasets",
            Some(&json!({"name": name, "source": source})),
        )
        .unwrap();
}

/// The dataset once it has left `indexing`.
pub(crate) fn settled(j: &Joader, name: &str) -> Value {
    let c = j.server.client();
    wait_for(&format!("dataset {name} to be ready or failed"), || {
        let v = c.ok("GET", &format!("/v1/datasets/{name}"), None).ok()?;
        (v["state"] != "indexing").then_some(v)
    })
}

/// Element → (label, stored bytes).
pub(crate) type Payloads = BTreeMap<u32, (i64, Vec<u8>)>;

/// Reads one epoch of `dataset` with the raw pipeline: its payloads, and the epoch's ids in
/// delivery order.
pub(crate) fn read_raw(j: &Joader, job: &str, dataset: &str) -> (Payloads, Vec<u32>) {
    let dump = TempDir::new(job);
    let s = finish(consumer(
        &j.server.url,
        &json!({"name": job, "dataset": dataset, "batch_size": 8, "epochs": 1,
                "pipeline": {"kind": "raw"}}),
        &["--dump", dump.0.to_str().unwrap()],
    ));
    no_errors(&s, &format!("job {job}"));
    let labels: BTreeMap<u32, i64> = s["epochs"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_i64().unwrap()))
        .collect();
    let out = dumped_payloads(&dump.0)
        .into_iter()
        .map(|(element, bytes)| (element, (labels[&element], bytes)))
        .collect();
    (out, epoch_ids(&s, 0))
}

/// Element → payload of what `joader consume --dump DIR` wrote.
fn dumped_payloads(dir: &Path) -> BTreeMap<u32, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let element: u32 = stem.rsplit('-').next().unwrap().parse().unwrap();
        out.insert(element, std::fs::read(&path).unwrap());
    }
    out
}

/// Each layout of [`write_layouts`]' objects: (name, the local source, the same objects as
/// an `s3` source).
fn layout_pairs(bucket: &Path, s3: &S3Server) -> [(&'static str, Value, Value); 3] {
    [
        (
            "folder",
            json!({"kind": "image_folder", "path": bucket.join("folder")}),
            json!({"kind": "s3", "url": "s3://bkt/folder/", "layout": "image_folder"}),
        ),
        (
            "shards",
            json!({"kind": "tar_shards", "paths": [bucket.join("shards")]}),
            json!({"kind": "s3", "url": "s3://bkt/shards", "layout": "tar_shards",
                   "endpoint": s3.endpoint(), "region": "us-east-1"}),
        ),
        (
            "manifest",
            json!({"kind": "manifest", "path": bucket.join("lists/list.csv")}),
            json!({"kind": "s3", "url": "s3://bkt/lists/list.csv", "layout": "manifest"}),
        ),
    ]
}

/// One epoch is exactly the ids `0..n`, each once.
pub(crate) fn assert_permutation(ids: &[u32], n: usize, what: &str) {
    let set: BTreeSet<u32> = ids.iter().copied().collect();
    assert_eq!(
        ids.len(),
        n,
        "{what}: {} deliveries for {n} elements",
        ids.len()
    );
    assert_eq!(set, (0..n as u32).collect(), "{what} is not a permutation");
}

/// Asserts that a consumer's summary has no error record.
pub(crate) fn no_errors(s: &Value, what: &str) {
    assert!(
        s["errors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e.as_array().unwrap().is_empty()),
        "{what} got error records: {}",
        s["errors"]
    );
}

/// A metric's value as `/metrics` renders it (`name{labels}` exactly).
pub(crate) fn metric(j: &Joader, name: &str) -> f64 {
    crate::common::series(&crate::common::scrape(&j.server.url), name)
        .unwrap_or_else(|| panic!("no series {name} in /metrics"))
}

/// Writes the ImageFolder of the shared test dataset, WebDataset shards of it and a CSV
/// manifest into `bucket`.
pub(crate) fn write_layouts(bucket: &Path) -> usize {
    let src = dataset();
    let mut list = Vec::new();
    let mut classes: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    classes.sort();
    let folder = bucket.join("folder");
    for (label, class) in classes.iter().enumerate() {
        let to = folder.join(class.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        let mut files: Vec<PathBuf> = std::fs::read_dir(class)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
            list.push((f, label));
        }
    }
    let shards = bucket.join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    for (s, chunk) in list.chunks(list.len() / 3 + 1).enumerate() {
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
    let lists = bucket.join("lists");
    std::fs::create_dir_all(&lists).unwrap();
    let mut csv = String::from("path,label\n");
    for (i, (path, label)) in list.iter().enumerate().rev() {
        // Relative to the manifest's prefix, climbing out of it: keys, not paths.
        let rel = path
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        csv.push_str(&format!("../folder/{rel},{}\n", (label + i) % 5));
    }
    std::fs::write(lists.join("list.csv"), csv).unwrap();
    list.len()
}

#[test]
fn every_s3_layout_reads_the_same_bytes_as_local_disk() {
    let Some(bin) = s3s_fs("every_s3_layout_reads_the_same_bytes_as_local_disk") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_layouts");
    let n = write_layouts(&s3.bucket());
    let bucket = s3.bucket();
    let j = joader(
        "s3_layouts",
        &bucket,
        &["--allowed-s3", "s3://bkt"],
        &credentials(&s3),
    );
    let pairs = layout_pairs(&bucket, &s3);
    for (name, local, remote) in &pairs {
        create(&j, &format!("local-{name}"), local.clone());
        create(&j, &format!("s3-{name}"), remote.clone());
    }
    for (name, _, _) in &pairs {
        let local = settled(&j, &format!("local-{name}"));
        let remote = settled(&j, &format!("s3-{name}"));
        assert_eq!(local["state"], "ready", "{local}");
        assert_eq!(remote["state"], "ready", "{remote}");
        assert_eq!(remote["items"], n, "{remote}");
        assert_eq!(remote["classes"], local["classes"], "{name}");
        let (want, _) = read_raw(&j, &format!("lj-{name}"), &format!("local-{name}"));
        let (got, ids) = read_raw(&j, &format!("sj-{name}"), &format!("s3-{name}"));
        assert_permutation(&ids, n, &format!("the s3 {name} epoch"));
        assert_eq!(got.len(), want.len());
        for (element, (label, bytes)) in &want {
            let (l, b) = &got[element];
            assert_eq!(l, label, "{name}: element {element}'s label differs");
            assert!(
                b == bytes,
                "{name}: element {element}'s bytes differ from local disk"
            );
        }
    }
    assert!(metric(&j, "joader_s3_requests_total{op=\"get\"}") >= (2 * n) as f64 / 8.0);
    assert!(metric(&j, "joader_s3_read_bytes_total") > 0.0);
    assert_eq!(
        metric(&j, "joader_s3_errors_total{kind=\"access_denied\"}"),
        0.0
    );
}

#[test]
fn an_s3_image_folder_of_1000_objects_is_listed_across_pages() {
    let Some(bin) = s3s_fs("an_s3_image_folder_of_1000_objects_is_listed_across_pages") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_pages");
    let folder = s3.bucket().join("many");
    for i in 0..1000 {
        // Four classes, some images one folder deeper, plus objects that are no images.
        let dir = folder.join(format!("c{}", i % 4));
        let dir = if i % 3 == 0 { dir.join("deep") } else { dir };
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("img{i:04}.jpg")), format!("object {i}")).unwrap();
    }
    std::fs::write(folder.join("c0/notes.txt"), "not an image").unwrap();
    std::fs::create_dir_all(folder.join(".hidden")).unwrap();
    std::fs::write(folder.join(".hidden/x.jpg"), "hidden").unwrap();
    let j = joader(
        "s3_pages",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt/many", "--s3-list-page", "100"],
        &credentials(&s3),
    );
    create(&j, "local", json!({"kind": "image_folder", "path": folder}));
    create(
        &j,
        "remote",
        json!({"kind": "s3", "url": "s3://bkt/many", "layout": "image_folder"}),
    );
    let local = settled(&j, "local");
    let remote = settled(&j, "remote");
    assert_eq!(remote["state"], "ready", "{remote}");
    assert_eq!(remote["items"], 1000);
    assert_eq!(remote["classes"], json!(["c0", "c1", "c2", "c3"]));
    assert_eq!(remote["classes"], local["classes"]);
    // Pages of 100 keys: each class of 250 objects takes 3 pages.
    assert!(metric(&j, "joader_s3_requests_total{op=\"list\"}") >= 13.0);
    // The same items in the same order: each id's bytes name the same object.
    let (want, _) = read_raw(&j, "lj", "local");
    let (got, ids) = read_raw(&j, "sj", "remote");
    assert_permutation(&ids, 1000, "the epoch");
    assert_eq!(got, want);
}

#[test]
fn the_s3_server_killed_and_restarted_mid_epoch_loses_nothing() {
    let Some(bin) = s3s_fs("the_s3_server_killed_and_restarted_mid_epoch_loses_nothing") else {
        return;
    };
    let mut s3 = S3Server::start(bin, "s3_restart");
    let n = 200;
    for i in 0..n {
        let dir = s3.bucket().join("d").join(format!("c{}", i % 2));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{i:03}.jpg")), format!("payload {i}")).unwrap();
    }
    let j = joader(
        "s3_restart",
        &s3.bucket(),
        // A budget far beyond the restart: nothing may fail for good.
        &["--allowed-s3", "s3://bkt/d", "--s3-retry-budget-s", "120"],
        &credentials(&s3),
    );
    create(
        &j,
        "d",
        json!({"kind": "s3", "url": "s3://bkt/d", "layout": "image_folder"}),
    );
    assert_eq!(settled(&j, "d")["state"], "ready");
    // A slow reader: its ring (64 records) holds a fraction of the epoch, so most elements
    // are fetched after the kill.
    let reader = consumer(
        &j.server.url,
        &json!({"name": "r", "dataset": "d", "batch_size": 4, "epochs": 1,
                "pipeline": {"kind": "raw"}}),
        &["--sample-us", "5000"],
    );
    let c = j.server.client();
    wait_for("the reader to have acknowledged 8 samples", || {
        let v = c.ok("GET", "/v1/jobs/r", None).ok()?;
        (v["acknowledged"].as_u64()? >= 8).then_some(())
    });
    s3.kill();
    wait_for("a fetch to fail while the store is down", || {
        (metric(&j, "joader_s3_errors_total{kind=\"unavailable\"}") > 0.0).then_some(())
    });
    s3.restart();
    let s = finish(reader);
    assert_permutation(&epoch_ids(&s, 0), n, "the epoch across the restart");
    assert!(
        s["errors"][0].as_array().is_none_or(|e| e.is_empty()),
        "error records: {}",
        s["errors"]
    );
    assert!(metric(&j, "joader_s3_retries_total") > 0.0);
}

#[test]
fn s3_sources_outside_the_allowed_list_or_without_credentials_are_refused() {
    let Some(bin) =
        s3s_fs("s3_sources_outside_the_allowed_list_or_without_credentials_are_refused")
    else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_refused");
    std::fs::create_dir_all(s3.bucket().join("x/c")).unwrap();
    std::fs::write(s3.bucket().join("x/c/a.jpg"), "a").unwrap();
    let source = json!({"kind": "s3", "url": "s3://bkt/x", "layout": "image_folder"});

    // No --allowed-s3: refused, naming the flag.
    let plain = joader("s3_none", &s3.bucket(), &[], &credentials(&s3));
    let body = json!({"name": "d", "source": source});
    let (status, v) = plain
        .server
        .client()
        .call("POST", "/v1/datasets", Some(&body))
        .unwrap();
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "path_not_allowed");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allowed-s3"),
        "{v}"
    );

    // Outside the allowed prefixes.
    let allowed = joader(
        "s3_outside",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt/y"],
        &credentials(&s3),
    );
    let outside = json!({"name": "d", "source": source});
    let (status, v) = allowed
        .server
        .client()
        .call("POST", "/v1/datasets", Some(&outside))
        .unwrap();
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("s3://bkt/y"),
        "{v}"
    );

    // No credentials in the environment: the dataset fails at once, saying what to set.
    let bare = joader(
        "s3_nocreds",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt"],
        &[
            ("AWS_ENDPOINT_URL", s3.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ],
    );
    create(&bare, "d", source.clone());
    let d = settled(&bare, "d");
    assert_eq!(d["state"], "failed", "{d}");
    let error = d["error"].as_str().unwrap();
    assert!(
        error.starts_with("no_credentials") && error.contains("AWS_ACCESS_KEY_ID"),
        "{d}"
    );

    // Wrong credentials: access denied, not retried, and the secret never echoed.
    let mut wrong = credentials(&s3);
    wrong[1].1 = "not-the-secret-at-all".into();
    let denied = joader(
        "s3_denied",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt"],
        &wrong,
    );
    create(&denied, "d", source.clone());
    let d = settled(&denied, "d");
    assert_eq!(d["state"], "failed", "{d}");
    assert!(
        d["error"].as_str().unwrap().starts_with("access_denied"),
        "{d}"
    );
    assert_eq!(metric(&denied, "joader_s3_retries_total"), 0.0);
    let everything = format!("{d}{}", denied.server.log.text());
    assert!(
        !everything.contains("not-the-secret-at-all"),
        "a secret was echoed"
    );

    // A wrong endpoint: retried within the budget, then the dataset fails naming it.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://127.0.0.1:{}", down.local_addr().unwrap().port());
    drop(down);
    let unreachable = joader(
        "s3_unreachable",
        &s3.bucket(),
        &[
            "--allowed-s3",
            "s3://bkt",
            "--s3-retry-budget-s",
            "1",
            "--allowed-s3-endpoint",
            &closed,
        ],
        &credentials(&s3),
    );
    create(
        &unreachable,
        "d",
        json!({"kind": "s3", "url": "s3://bkt/x", "layout": "image_folder", "endpoint": closed}),
    );
    let d = settled(&unreachable, "d");
    assert_eq!(d["state"], "failed", "{d}");
    assert!(
        d["error"].as_str().unwrap().starts_with("s3_unavailable"),
        "{d}"
    );
}

#[test]
fn an_object_deleted_after_indexing_is_an_element_error_not_a_failed_epoch() {
    let Some(bin) =
        s3s_fs("an_object_deleted_after_indexing_is_an_element_error_not_a_failed_epoch")
    else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_deleted");
    for i in 0..20 {
        let dir = s3.bucket().join("d/c");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{i:02}.jpg")), format!("payload {i}")).unwrap();
    }
    let j = joader(
        "s3_deleted",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt/d"],
        &credentials(&s3),
    );
    create(
        &j,
        "d",
        json!({"kind": "s3", "url": "s3://bkt/d", "layout": "image_folder"}),
    );
    assert_eq!(settled(&j, "d")["state"], "ready");
    std::fs::remove_file(s3.bucket().join("d/c/07.jpg")).unwrap();
    let s = finish(consumer(
        &j.server.url,
        &json!({"name": "r", "dataset": "d", "batch_size": 4, "epochs": 1,
                "pipeline": {"kind": "raw"}}),
        &[],
    ));
    let errors = s["errors"][0].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{s}");
    assert_eq!(errors[0][0], 7, "{s}");
    let mut ids = epoch_ids(&s, 0);
    ids.push(7);
    assert_permutation(&ids, 20, "the epoch with its error record");
    let failures = j
        .server
        .client()
        .ok("GET", "/v1/datasets/d/failures", None)
        .unwrap();
    assert!(failures.to_string().contains("not_found"), "{failures}");
}

/// `POST /v1/datasets` with `source`: (status, body).
fn try_create(j: &Joader, name: &str, source: &Value) -> (u16, Value) {
    j.server
        .client()
        .call(
            "POST",
            "/v1/datasets",
            Some(&json!({"name": name, "source": source})),
        )
        .unwrap()
}

#[test]
fn a_request_may_name_only_the_endpoints_the_configuration_names() {
    let Some(bin) = s3s_fs("a_request_may_name_only_the_endpoints_the_configuration_names") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_endpoints");
    std::fs::create_dir_all(s3.bucket().join("x/c")).unwrap();
    std::fs::write(s3.bucket().join("x/c/a.jpg"), "a").unwrap();
    // Anything that listens: the server must not send it a single request.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let trap_url = format!("http://127.0.0.1:{}", trap.local_addr().unwrap().port());
    trap.set_nonblocking(true).unwrap();
    let with = |endpoint: &str| json!({"kind": "s3", "url": "s3://bkt/x", "layout": "image_folder", "endpoint": endpoint});
    // The environment's AWS_ENDPOINT_URL only.
    let j = joader(
        "s3_endpoints",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt"],
        &credentials(&s3),
    );
    let (status, v) = try_create(&j, "elsewhere", &with(&trap_url));
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "endpoint_not_allowed", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("--allowed-s3-endpoint") && message.contains("AWS_ENDPOINT_URL"),
        "{v}"
    );
    assert!(
        !message.contains(SECRET) && !message.contains(KEY),
        "credentials echoed: {v}"
    );
    // The environment's endpoint, spelled with a trailing slash, is the same endpoint.
    create(&j, "same", with(&format!("{}/", s3.endpoint())));
    assert_eq!(settled(&j, "same")["state"], "ready");
    // A region is part of AWS host names: only a-z 0-9 - are taken.
    let (status, v) = try_create(
        &j,
        "region",
        &json!({"kind": "s3", "url": "s3://bkt/x", "layout": "image_folder",
                "region": "evil.example/"}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    assert!(
        matches!(trap.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the server connected to an endpoint no configuration names"
    );

    // A server whose configuration lists another endpoint takes it (and no other).
    let listed = joader(
        "s3_endpoints_listed",
        &s3.bucket(),
        &[
            "--allowed-s3",
            "s3://bkt",
            "--allowed-s3-endpoint",
            &s3.endpoint(),
        ],
        &credentials(&s3)
            .into_iter()
            .filter(|(k, _)| *k != "AWS_ENDPOINT_URL")
            .collect::<Vec<_>>(),
    );
    create(&listed, "listed", with(&s3.endpoint()));
    assert_eq!(settled(&listed, "listed")["state"], "ready");
    let (status, v) = try_create(&listed, "other", &with(&trap_url));
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&s3.endpoint()),
        "the refusal lists the allowed endpoints: {v}"
    );
}

#[test]
fn a_malformed_s3_url_is_an_invalid_request() {
    let Some(bin) = s3s_fs("a_malformed_s3_url_is_an_invalid_request") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_malformed");
    let allowed = joader(
        "s3_malformed",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt"],
        &credentials(&s3),
    );
    let plain = joader("s3_malformed_plain", &s3.bucket(), &[], &credentials(&s3));
    for url in [
        "s3:/bkt/x",
        "https://bkt/x",
        "s3://B/x",
        "s3://bkt/a/../b",
        "s3://",
    ] {
        for j in [&allowed, &plain] {
            let (status, v) = try_create(
                j,
                "bad",
                &json!({"kind": "s3", "url": url, "layout": "image_folder"}),
            );
            assert_eq!(status, 400, "{url}: {v}");
            assert_eq!(v["error"]["code"], "invalid_request", "{url}: {v}");
        }
    }
    let (status, v) = try_create(
        &allowed,
        "bad",
        &json!({"kind": "s3", "url": "s3://bkt/x", "layout": "image_folder",
                "endpoint": "ftp://127.0.0.1"}),
    );
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("invalid_request")),
        "{v}"
    );
}

#[test]
fn a_reindex_reports_the_objects_changed_added_and_removed() {
    let Some(bin) = s3s_fs("a_reindex_reports_the_objects_changed_added_and_removed") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_reindex");
    let dir = s3.bucket().join("r/c");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..10 {
        std::fs::write(dir.join(format!("{i:02}.jpg")), format!("payload {i}")).unwrap();
    }
    let j = joader(
        "s3_reindex",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt/r"],
        &credentials(&s3),
    );
    create(
        &j,
        "d",
        json!({"kind": "s3", "url": "s3://bkt/r", "layout": "image_folder"}),
    );
    let first = settled(&j, "d");
    assert_eq!(first["state"], "ready", "{first}");
    assert_eq!(
        first["changes"],
        Value::Null,
        "a first index compares nothing"
    );
    let c = j.server.client();
    // A job uses the dataset: its element ids may not change under it.
    let reader = consumer(
        &j.server.url,
        &json!({"name": "r", "dataset": "d", "batch_size": 2, "epochs": 1,
                "pipeline": {"kind": "raw"}}),
        &[],
    );
    wait_for("the job to be registered", || {
        c.ok("GET", "/v1/jobs/r", None).ok()
    });
    let (status, v) = c.call("POST", "/v1/datasets/d/reindex", None).unwrap();
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("dataset_in_use")),
        "{v}"
    );
    finish(reader);
    c.ok("DELETE", "/v1/jobs/r", None).unwrap();

    // One object modified (another size), one deleted, one added.
    std::fs::write(dir.join("03.jpg"), "payload 3, rewritten longer").unwrap();
    std::fs::remove_file(dir.join("05.jpg")).unwrap();
    std::fs::write(dir.join("10.jpg"), "payload 10").unwrap();
    let (status, v) = c.call("POST", "/v1/datasets/d/reindex", None).unwrap();
    assert_eq!(status, 202, "{v}");
    let d = settled(&j, "d");
    assert_eq!(d["state"], "ready", "{d}");
    assert_eq!(d["items"], 10, "{d}");
    let changes = &d["changes"];
    assert_eq!(
        (
            &changes["changed"],
            &changes["added"],
            &changes["removed"],
            &changes["unchanged"]
        ),
        (&json!(1), &json!(1), &json!(1), &json!(8)),
        "{d}"
    );
    assert_eq!(changes["changed_keys"], json!(["r/c/03.jpg"]), "{d}");
    assert_eq!(changes["added_keys"], json!(["r/c/10.jpg"]), "{d}");
    assert_eq!(changes["removed_keys"], json!(["r/c/05.jpg"]), "{d}");
    // The new index serves the new bytes (nothing cached from the old one).
    let (got, ids) = read_raw(&j, "after", "d");
    assert_permutation(&ids, 10, "the re-indexed epoch");
    let bytes: BTreeSet<Vec<u8>> = got.into_values().map(|(_, b)| b).collect();
    assert!(bytes.contains(b"payload 3, rewritten longer".as_slice()));
    assert!(bytes.contains(b"payload 10".as_slice()));
    assert!(!bytes.contains(b"payload 5".as_slice()));
    c.ok("DELETE", "/v1/jobs/after", None).unwrap();

    // Nothing changed since: a re-index says so.
    c.ok("POST", "/v1/datasets/d/reindex", None).unwrap();
    let d = settled(&j, "d");
    assert_eq!(
        (
            &d["changes"]["changed"],
            &d["changes"]["added"],
            &d["changes"]["removed"]
        ),
        (&json!(0), &json!(0), &json!(0)),
        "{d}"
    );
    // Local datasets have no ETags to compare: refused, saying so.
    create(
        &j,
        "local",
        json!({"kind": "image_folder", "path": s3.bucket().join("r")}),
    );
    assert_eq!(settled(&j, "local")["state"], "ready");
    let (status, v) = c.call("POST", "/v1/datasets/local/reindex", None).unwrap();
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("invalid_request")),
        "{v}"
    );
}

#[test]
fn neighbouring_tar_members_are_read_with_one_request_and_the_bytes_stay_right() {
    let Some(bin) =
        s3s_fs("neighbouring_tar_members_are_read_with_one_request_and_the_bytes_stay_right")
    else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_coalesce");
    // One shard of 300 small members (the whole shard is well inside the coalescing gap), each
    // member's bytes naming it.
    let shards = s3.bucket().join("t");
    std::fs::create_dir_all(&shards).unwrap();
    let n = 300;
    {
        let f = std::fs::File::create(shards.join("part-000.tar")).unwrap();
        let mut b = tar::Builder::new(f);
        for i in 0..n {
            let mut add = |name: String, data: &[u8]| {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, name, data).unwrap();
            };
            add(
                format!("k{i:04}.jpg"),
                format!("member {i} {}", "x".repeat(i % 7)).as_bytes(),
            );
            add(format!("k{i:04}.cls"), (i % 3).to_string().as_bytes());
        }
        b.finish().unwrap();
    }
    // One request in flight at a time: the loads due meanwhile (the Cache keeps at least 16
    // under way) queue up, and are grouped when the request ends.
    let j = joader(
        "s3_coalesce",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt/t", "--s3-max-in-flight", "1"],
        &credentials(&s3),
    );
    create(
        &j,
        "d",
        json!({"kind": "s3", "url": "s3://bkt/t", "layout": "tar_shards"}),
    );
    assert_eq!(settled(&j, "d")["state"], "ready");
    let gets_before = metric(&j, "joader_s3_requests_total{op=\"get\"}");
    let (got, ids) = read_raw(&j, "r", "d");
    assert_permutation(&ids, n, "the epoch");
    for (element, (label, bytes)) in &got {
        let i = *element as usize;
        assert_eq!(
            String::from_utf8_lossy(bytes),
            format!("member {i} {}", "x".repeat(i % 7)),
            "element {element}'s bytes"
        );
        assert_eq!(*label, (i % 3) as i64, "element {element}'s label");
    }
    let coalesced = metric(&j, "joader_s3_coalesced_requests_total");
    let gets = metric(&j, "joader_s3_requests_total{op=\"get\"}") - gets_before;
    assert!(coalesced > 0.0, "no request served several members");
    assert!(
        gets < n as f64,
        "{gets} GETs for {n} members: neighbours were not read together"
    );
}

/// `joader bench e2e --quick --source s3`: the scenarios against a local s3s-fs beside local
/// disk, and the bytes the store served. The bench's figures are its business; the test checks
/// that the rows are there and that, with a cache holding the whole dataset, each object was
/// read from the store exactly once per scenario (the union of the jobs' subsets).
#[test]
fn bench_e2e_with_source_s3_prints_the_s3_rows_beside_the_disk_rows() {
    let Some((dir, o)) = bench_s3(
        "bench_e2e_with_source_s3_prints_the_s3_rows_beside_the_disk_rows",
        &[],
    ) else {
        return;
    };
    let out = dir.0.join("out");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("e2e.md")).unwrap();
    for row in [
        "| sync K=2 | joader serve, disk |",
        "| sync K=2 | joader serve, s3 |",
        "| overlap 50% | joader serve, s3 |",
    ] {
        assert!(md.contains(row), "missing {row} in\n{md}");
    }
    let section = md
        .split("S3 beside local disk")
        .nth(1)
        .unwrap_or_else(|| panic!("no S3 section in\n{md}"));
    let mut scenarios = 0;
    for line in section
        .lines()
        .filter(|l| l.starts_with("| sync") || l.starts_with("| overlap"))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | scenario | latency | disk | s3 | s3/disk | disk CPU | s3 CPU | CPU ratio | read
        // from the store | union | read/union | GET ms | queued ms | limit | ready | on its
        // way |
        assert_eq!(cells[9], cells[10], "bytes read from the store: {line}");
        let ahead: f64 = cells[15].parse::<f64>().unwrap() + cells[16].parse::<f64>().unwrap();
        assert!((0.0..=1.0).contains(&ahead), "{line}");
        assert!(cells[10].parse::<u64>().unwrap() > 0, "{line}");
        scenarios += 1;
    }
    assert_eq!(scenarios, 3, "{section}");
}

/// Runs `joader bench e2e --quick --source s3` with `extra` flags, its data and output in a
/// temporary folder (`data`, `out`): the folder and the command's output, or `None` when the
/// test is skipped for want of `s3s-fs`.
fn bench_s3(test: &str, extra: &[&str]) -> Option<(TempDir, std::process::Output)> {
    let bin = s3s_fs(test)?;
    let dir = TempDir::new("bench-s3");
    let (data, out) = (dir.0.join("data"), dir.0.join("out"));
    let mut args = vec![
        "bench",
        "e2e",
        "--quick",
        "--source",
        "s3",
        "--s3s-fs",
        bin.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = crate::common::joader(&args);
    Some((dir, o))
}

/// `joader bench e2e --quick --source s3 --only "sync K=1" --s3-latency-ms 5 --store-cpus 1`:
/// the S3 rows measured through the delay proxy with the store on a CPU of its own, every
/// figure present, the store read exactly once per element of the union; on a machine of one
/// CPU the flag is refused, saying why.
#[test]
fn bench_e2e_s3_with_the_store_on_its_own_cpu() {
    let extra = [
        "--only",
        "sync K=1",
        "--s3-latency-ms",
        "5",
        "--store-cpus",
        "1",
    ];
    let Some((dir, o)) = bench_s3("bench_e2e_s3_with_the_store_on_its_own_cpu", &extra) else {
        return;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("--store-cpus 1"));
        return;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(dir.0.join("out").join("e2e.md")).unwrap();
    assert!(
        md.contains("store (s3s-fs, delay proxy) on CPU ")
            && md.contains("joader and the jobs on CPU "),
        "{md}"
    );
    let row = crate::parquet::cells(&md, "| sync K=1 | 5 ms |");
    let figures: Vec<f64> = row[3..row.len() - 1]
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    // disk and s3 samples/s, CPU per sample, bytes read = the union (read / union 1.00).
    assert!(figures[0] > 0.0 && figures[1] > 0.0, "{row:?}");
    assert!(figures[3] > 0.0 && figures[4] > 0.0, "{row:?}");
    assert_eq!(figures[6], figures[7], "{row:?}");
    // --store-cpus is for --source s3 (refused before any data is made).
    let refused = dir.0.join("refused");
    let o = crate::common::joader(&[
        "bench",
        "e2e",
        "--quick",
        "--store-cpus",
        "1",
        "--data",
        refused.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--store-cpus is for --source s3"));
    assert!(!refused.exists());
}

/// A store 30 ms away (the bench's delaying proxy between the server and `s3s-fs`, every
/// request held 30 ms, keep-alive connections and requests in flight at once): an epoch of
/// 300 objects is still exactly the objects' bytes, each once, and every element was asked
/// for once. Two datasets over the same objects: the second's job is registered after the
/// first's measured the store's latency, so its fetches run deeper ahead; the figures of speed
/// are the bench's business. Loads find their bytes fetched ahead (waiting in the buffer or on
/// their way), each element fetched ahead is taken by its load, and none is fetched twice.
#[test]
fn an_epoch_through_a_store_30_ms_away_is_exact() {
    let Some(bin) = s3s_fs("an_epoch_through_a_store_30_ms_away_is_exact") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_latency");
    let folder = s3.bucket().join("far");
    let n = 300;
    for i in 0..n {
        let class = folder.join(format!("c{}", i % 3));
        std::fs::create_dir_all(&class).unwrap();
        let bytes: Vec<u8> = (0..(1000 + i * 7)).map(|b| (b * 31 + i) as u8).collect();
        // Raw bytes under an image extension: the raw pipeline never decodes them.
        std::fs::write(class.join(format!("{i:04}.jpg")), bytes).unwrap();
    }
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], s3.port));
    let proxy = joader_tools::bench::e2e::proxy::DelayProxy::start(
        upstream,
        std::time::Duration::from_millis(30),
    )
    .unwrap();
    let mut env = credentials(&s3);
    for (k, v) in &mut env {
        if *k == "AWS_ENDPOINT_URL" {
            *v = proxy.endpoint();
        }
    }
    let bucket = s3.bucket();
    let j = joader("s3_latency", &bucket, &["--allowed-s3", "s3://bkt"], &env);
    create(&j, "local", json!({"kind": "image_folder", "path": folder}));
    for name in ["far", "far-again"] {
        create(
            &j,
            name,
            json!({"kind": "s3", "url": "s3://bkt/far", "layout": "image_folder"}),
        );
        assert_eq!(settled(&j, name)["state"], "ready");
    }
    assert_eq!(settled(&j, "local")["state"], "ready");
    let (want, _) = read_raw(&j, "local-epoch", "local");
    assert_eq!(
        metric(&j, "joader_s3_fetch_ahead_capacity_bytes"),
        (64u64 << 20) as f64,
        "the default buffer"
    );
    let ahead = |j: &Joader| {
        metric(j, "joader_s3_fetch_ahead_hits_total")
            + metric(j, "joader_s3_fetch_ahead_joined_total")
    };
    for (job, dataset) in [("first", "far"), ("second", "far-again")] {
        let gets = metric(&j, "joader_s3_requests_total{op=\"get\"}");
        let served = ahead(&j);
        let (got, ids) = read_raw(&j, job, dataset);
        assert_permutation(&ids, n as usize, &format!("job {job}'s epoch"));
        assert_eq!(got.len(), want.len());
        for (element, (label, bytes)) in &want {
            let (l, b) = &got[element];
            assert_eq!(l, label, "{job}: element {element}'s label differs");
            assert!(b == bytes, "{job}: element {element}'s bytes differ");
        }
        assert_eq!(
            metric(&j, "joader_s3_requests_total{op=\"get\"}") - gets,
            n as f64,
            "{job}: one GET per element (no retries: the proxy only delays)"
        );
        // The first picks go to the Cache at once (its rings and lookahead), the later ones
        // are held by the Sampler and fetched ahead.
        let served = ahead(&j) - served;
        assert!(served > 0.0, "{job}: no load found its bytes fetched ahead");
    }
    // Every element fetched ahead was taken by its load: no request was wasted, and nothing
    // is left in the buffer.
    assert_eq!(
        metric(&j, "joader_s3_fetch_ahead_requests_total"),
        ahead(&j),
        "fetched ahead, taken"
    );
    assert_eq!(metric(&j, "joader_s3_fetch_ahead_bytes"), 0.0);
    assert_eq!(metric(&j, "joader_s3_fetch_ahead_stale_total"), 0.0);
    let stats = j.server.client().ok("GET", "/v1/stats", None).unwrap();
    let a = &stats["fetch_ahead"];
    assert_eq!(a["capacity_bytes"], 64u64 << 20, "{stats}");
    assert!(a["requests"].as_u64().unwrap() > 0, "{stats}");
    assert!(metric(&j, "joader_s3_in_flight_limit") >= 1.0);
    // The last request's place is given back just after its element was handed over.
    wait_for("no object-store request in flight", || {
        (metric(&j, "joader_s3_in_flight") == 0.0).then_some(())
    });
}

/// Reads one epoch of `dataset` with the raw pipeline: the summary and the payloads delivered.
fn read_with_errors(j: &Joader, job: &str, dataset: &str) -> (Value, BTreeMap<u32, Vec<u8>>) {
    let dump = TempDir::new(job);
    let s = finish(consumer(
        &j.server.url,
        &json!({"name": job, "dataset": dataset, "batch_size": 8, "epochs": 1,
                "pipeline": {"kind": "raw"}}),
        &["--dump", dump.0.to_str().unwrap()],
    ));
    let out = dumped_payloads(&dump.0);
    (s, out)
}

#[test]
fn an_object_rewritten_in_place_is_an_element_error_in_every_layout_with_or_without_a_tier() {
    let test =
        "an_object_rewritten_in_place_is_an_element_error_in_every_layout_with_or_without_a_tier";
    let Some(bin) = s3s_fs(test) else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_rewritten");
    let bucket = s3.bucket();
    let n = write_layouts(&bucket);
    let disk = TempDir::new("s3_rewritten_disk");
    let tier_dir = disk.0.join("tier");
    let tier = [
        "--allowed-s3",
        "s3://bkt",
        "--disk-cache",
        tier_dir.to_str().unwrap(),
        "--disk-cache-bytes",
        "64MiB",
    ];
    let servers = [
        (
            "plain",
            joader(
                "s3_rewritten_plain",
                &bucket,
                &["--allowed-s3", "s3://bkt"],
                &credentials(&s3),
            ),
        ),
        (
            "tier",
            joader("s3_rewritten_tier", &bucket, &tier, &credentials(&s3)),
        ),
    ];
    let layouts = layout_pairs(&bucket, &s3);
    // What each element holds as indexed (local copies of the same objects, read before the
    // rewrite), and every dataset indexed before it.
    let mut want = BTreeMap::new();
    for (name, local, remote) in &layouts {
        let (_, j) = &servers[0];
        create(j, &format!("local-{name}"), local.clone());
        assert_eq!(settled(j, &format!("local-{name}"))["state"], "ready");
        want.insert(
            *name,
            read_raw(j, &format!("lj-{name}"), &format!("local-{name}")).0,
        );
        for (_, j) in &servers {
            create(j, &format!("s3-{name}"), remote.clone());
            assert_eq!(settled(j, &format!("s3-{name}"))["state"], "ready");
        }
    }
    // Rewritten in place with the same length: the first image of the folder (read by the
    // folder and the manifest) and a byte inside the first member of the first shard.
    let mut first_class: Vec<PathBuf> = std::fs::read_dir(bucket.join("folder"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    first_class.sort();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&first_class[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let image = std::fs::read(&files[0]).unwrap();
    std::fs::write(
        &files[0],
        image.iter().map(|b| b ^ 0x5a).collect::<Vec<u8>>(),
    )
    .unwrap();
    let shard = bucket.join("shards/part-000.tar");
    let mut tar = std::fs::read(&shard).unwrap();
    tar[600] ^= 0x5a;
    std::fs::write(&shard, &tar).unwrap();
    let shard0 = n / 3 + 1;
    for (server, j) in &servers {
        for (name, _, _) in &layouts {
            let what = format!("{server} server, {name}");
            let (s, got) =
                read_with_errors(j, &format!("r-{server}-{name}"), &format!("s3-{name}"));
            // Every element delivered holds what was indexed; the others are error records
            // that say why.
            for (element, bytes) in &got {
                assert!(
                    bytes == &want[name][element].1,
                    "{what}: element {element} was delivered with other bytes than indexed"
                );
            }
            let errors: Vec<u32> = s["errors"][0]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e[0].as_u64().unwrap() as u32)
                .collect();
            let expected = if *name == "shards" { shard0 } else { 1 };
            assert_eq!(errors.len(), expected, "{what}: {s}");
            let mut ids = epoch_ids(&s, 0);
            ids.extend(&errors);
            assert_permutation(&ids, n, &what);
            let failures = j
                .server
                .client()
                .ok("GET", &format!("/v1/datasets/s3-{name}/failures"), None)
                .unwrap();
            assert!(
                failures
                    .to_string()
                    .contains("changed since the dataset was indexed"),
                "{what}: {failures}"
            );
        }
    }
}

#[test]
fn s3_shards_are_named_by_brace_ranges_and_glob_patterns() {
    let Some(bin) = s3s_fs("s3_shards_are_named_by_brace_ranges_and_glob_patterns") else {
        return;
    };
    let s3 = S3Server::start(bin, "s3_patterns");
    let n = write_layouts(&s3.bucket());
    // Shards part-000..part-002 of n elements in all; a fourth object no pattern below takes.
    std::fs::write(s3.bucket().join("shards/part-000.tar.md5"), "checksum").unwrap();
    let j = joader(
        "s3_patterns",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt/shards"],
        &credentials(&s3),
    );
    let local =
        json!({"kind": "tar_shards", "paths": [s3.bucket().join("shards/part-{000..002}.tar")]});
    create(&j, "local", local);
    for (name, url) in [
        ("range", "s3://bkt/shards/part-{000..002}.tar"),
        ("glob", "s3://bkt/shards/part-*.tar"),
        ("both", "s3://bkt/shards/part-{000,00[12]}.tar"),
    ] {
        create(
            &j,
            name,
            json!({"kind": "s3", "url": url, "layout": "tar_shards"}),
        );
        let v = settled(&j, name);
        assert_eq!(v["state"], "ready", "{url}: {v}");
        assert_eq!(v["items"], n, "{url}");
    }
    // A key that holds pattern characters and matches nothing as a pattern is the object
    // of that name.
    std::fs::copy(
        s3.bucket().join("shards/part-000.tar"),
        s3.bucket().join("shards/odd[0].tar"),
    )
    .unwrap();
    create(
        &j,
        "literal",
        json!({"kind": "s3", "url": "s3://bkt/shards/odd[0].tar", "layout": "tar_shards"}),
    );
    let v = settled(&j, "literal");
    assert_eq!(v["state"], "ready", "{v}");
    assert!(v["items"].as_u64().unwrap() > 0, "{v}");
    let (want, _) = read_raw(&j, "lj", "local");
    let (got, ids) = read_raw(&j, "gj", "glob");
    assert_permutation(&ids, n, "the epoch");
    assert_eq!(got, want);
    // A pattern matching nothing is refused when the dataset is created, naming it.
    let (status, body) = try_create(
        &j,
        "none",
        &json!({"kind": "s3", "url": "s3://bkt/shards/train-*.tar", "layout": "tar_shards"}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("s3://bkt/shards/train-*.tar"), "{message}");
}
