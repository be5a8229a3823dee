//! The `s3` source's `parquet` layout against a real S3 server (`s3s-fs`, see `s3.rs`):
//! files written by `pyarrow` as Hugging Face's `datasets` writes them (image struct,
//! `ClassLabel` metadata, a caption, a struct and a list-of-boxes column; snappy and zstd),
//! read from the bucket's folder as a local `parquet` source and through the bucket as an
//! `s3` one, give the same elements field by field; an epoch is exact; a truncated or
//! non-Parquet object fails the indexing with `bad_parquet` naming its key; an object
//! changed after indexing is an element error, never other bytes. Through a store 30 ms
//! away, with a disk tier: rows are fetched ahead and taken, an object's footer and each row
//! group's chunk are read once whatever the rows read at once, and the tier keeps every row
//! (with its fields) so that a second epoch fetches nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Value, json};

use crate::common::{DEADLINE, scrape, series};
use crate::parquet::{pyarrow, python};
use crate::s3::{
    Joader, S3Server, assert_permutation, create, credentials, joader, metric, read_raw, s3s_fs,
    settled,
};
use crate::server::dataset;

/// Writes the files (see the script's comments); prints the number of rows.
const WRITER: &str = r#"
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq

images, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(images) if not d.startswith("."))
files = [(os.path.join(c, f), label) for label, c in enumerate(classes)
         for f in sorted(os.listdir(os.path.join(images, c)))]
image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
meta_type = pa.struct([("id", pa.int64()), ("tags", pa.list_(pa.string()))])
features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"},
            "text": {"dtype": "string", "_type": "Value"}}
schema = pa.schema([("image", image_type), ("label", pa.int64()), ("text", pa.string()),
                    ("meta", meta_type), ("objects", pa.list_(pa.list_(pa.float32())))]
                   ).with_metadata({"huggingface": json.dumps({"info": {"features": features}})})
rows = []
for i, (rel, label) in enumerate(files):
    data = open(os.path.join(images, rel), "rb").read()
    rows.append({"image": {"bytes": data, "path": os.path.basename(rel)}, "label": label,
                 "text": f"photo {i}, \"quoted\"", "meta": {"id": i, "tags": ["é", str(i)]},
                 "objects": [[float(i), 1.0, 2.5, 3.0 + k] for k in range(i % 3)]})
def write(rows, path, **kw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, **kw)
# Two files as the Hub shards a split: snappy (the default) and zstd, 8 rows per row group.
half = len(rows) // 2
write(rows[:half], os.path.join(out, "hf", "train-00000-of-00002.parquet"), row_group_size=8)
write(rows[half:], os.path.join(out, "hf", "train-00001-of-00002.parquet"), row_group_size=8,
      compression="zstd")
# A copy to change after indexing.
write(rows[:half], os.path.join(out, "chg", "train.parquet"), row_group_size=8)
# An object cut short (its footer gone), and one that is no Parquet file at all.
whole = open(os.path.join(out, "hf", "train-00000-of-00002.parquet"), "rb").read()
os.makedirs(os.path.join(out, "cut"))
open(os.path.join(out, "cut", "train.parquet"), "wb").write(whole[: len(whole) // 2])
os.makedirs(os.path.join(out, "junk"))
open(os.path.join(out, "junk", "train.parquet"), "wb").write(b"PAR1 but nothing else" * 100)
print(len(rows))
"#;

const FIELDS: &str = r#"{
    "image": {"kind": "image", "from": "image"},
    "label": {"kind": "class", "from": "label"},
    "caption": {"kind": "text", "from": "text"},
    "meta": {"kind": "json", "from": "meta"},
    "boxes": {"kind": "npy", "from": "objects"}
}"#;

/// An element as delivered: label, image bytes, fields (name, value).
type Element = (i64, Vec<u8>, Vec<(String, Vec<u8>)>);

/// One epoch of `dataset` with the raw pipeline, read from its ring: each element with its
/// fields, the ids in delivery order, and the error records (element, code).
fn epoch(j: &Joader, job: &str, dataset: &str) -> (BTreeMap<u32, Element>, Vec<u32>, Vec<u32>) {
    let reg = j
        .server
        .client()
        .ok(
            "POST",
            "/v1/jobs",
            Some(
                &json!({"name": job, "dataset": dataset, "batch_size": 8, "epochs": 1,
                         "pipeline": {"kind": "raw"}}),
            ),
        )
        .unwrap();
    let rank = &reg["ranks"][0];
    let reader = dataplane::Reader::open(
        rank["instance"].as_str().unwrap(),
        rank["ring"].as_str().unwrap(),
    )
    .unwrap();
    let (mut out, mut ids, mut errors) = (BTreeMap::new(), Vec::new(), Vec::new());
    loop {
        let b = reader.next_batch(8, Some(DEADLINE)).unwrap();
        for item in b.items() {
            let fields = item
                .fields()
                .unwrap()
                .iter()
                .map(|f| (f.name.to_owned(), f.value.to_vec()))
                .collect();
            let id = item.meta.element_id;
            ids.push(id);
            out.insert(id, (item.meta.label, item.data.to_vec(), fields));
        }
        errors.extend(b.errors().iter().map(|e| e.element_id));
        if b.end_of_stream() {
            return (out, ids, errors);
        }
    }
}

/// Waits for the disk tier's writer, then restarts `j`'s server on the same data folder and
/// tier (the decoded cache starts empty) and waits for its datasets.
/// (`env`: the server's environment, its store's address and keys.)
fn restarted(j: &mut Joader, root: &Path, args: &[&str], env: &[(&str, String)]) {
    crate::common::wait_for("the disk tier's writer to be idle", || {
        (metric(j, "joader_disk_cache_queued") == 0.0).then_some(())
    });
    assert!(j.server.stop());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    j.server = crate::common::TestServer::start_env(
        &crate::common::unique_instance("s3_parquet_again"),
        &j._state.0,
        root,
        args,
        &env,
    );
}

/// An `s3s-fs` whose bucket holds what `script` wrote there (its arguments: `images` when
/// given, then the bucket's folder), and what the script printed; `None` when `s3s-fs` or
/// pyarrow is missing and not required.
fn store_with(test: &str, script: &str, images: Option<&Path>) -> Option<(S3Server, String)> {
    let bin = s3s_fs(test)?;
    if !pyarrow(test) {
        return None;
    }
    let s3 = S3Server::start(bin, test);
    let bucket = s3.bucket();
    let args: Vec<&Path> = images.into_iter().chain([bucket.as_path()]).collect();
    let printed = python(script, &args);
    Some((s3, printed))
}

#[test]
fn s3_parquet_gives_the_elements_and_fields_of_the_local_files() {
    let test = "s3_parquet_gives_the_elements_and_fields_of_the_local_files";
    let Some((s3, printed)) = store_with(test, WRITER, Some(dataset())) else {
        return;
    };
    let bucket = s3.bucket();
    let n: usize = printed.trim().parse().unwrap();
    let tier = crate::common::TempDir::new("s3_parquet_fields_tier");
    let args = [
        "--allowed-s3",
        "s3://bkt/",
        "--disk-cache",
        tier.0.to_str().unwrap(),
        "--disk-cache-bytes",
        "64MiB",
    ];
    let mut j = joader("s3_parquet", &bucket, &args, &credentials(&s3));
    let fields: Value = serde_json::from_str(FIELDS).unwrap();
    create(
        &j,
        "local",
        json!({"kind": "parquet", "paths": [bucket.join("hf")], "fields": fields}),
    );
    create(
        &j,
        "remote",
        json!({"kind": "s3", "url": "s3://bkt/hf/", "layout": "parquet", "fields": fields}),
    );
    let (local, remote) = (settled(&j, "local"), settled(&j, "remote"));
    assert_eq!(local["state"], "ready", "{local}");
    assert_eq!(remote["state"], "ready", "{remote}");
    assert_eq!(remote["items"], n, "{remote}");
    assert_eq!(remote["classes"], local["classes"], "ClassLabel names");

    let (from_files, _, errors) = epoch(&j, "l", "local");
    assert!(errors.is_empty(), "{errors:?}");
    let (from_store, ids, errors) = epoch(&j, "r", "remote");
    assert!(errors.is_empty(), "{errors:?}");
    // Exact: each element once.
    assert_eq!(ids.len(), n);
    assert_eq!(
        ids.iter().copied().collect::<BTreeSet<_>>(),
        (0..n as u32).collect()
    );
    assert_eq!(from_files.len(), n);
    for (id, (label, image, fields)) in &from_files {
        let (l, i, f) = &from_store[id];
        assert_eq!((l, i), (label, image), "element {id}");
        let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["boxes", "caption", "meta"], "element {id}");
        assert_eq!(f, fields, "element {id}'s fields");
    }
    // The Parquet read metrics count the s3 dataset too.
    let text = scrape(&j.server.url);
    let rows = series(&text, "joader_parquet_rows_read_total{dataset=\"remote\"}")
        .unwrap_or_else(|| panic!("no Parquet metrics for the s3 dataset in\n{text}"));
    assert!(rows >= n as f64, "{rows}");
    let gets = series(&text, "joader_s3_requests_total{op=\"get\"}");
    assert!(gets.is_some_and(|g| g > 0.0), "{text}");
    // The fields' columns (`caption`, a string; `meta`, a struct; `boxes`, a list of lists)
    // are read once per row group and field while kept, not once per row: every other row's
    // value is a hit.
    let groups = (n / 2).div_ceil(8) + (n - n / 2).div_ceil(8);
    for dataset in ["local", "remote"] {
        let m = |name: &str| {
            series(
                &text,
                &format!("joader_parquet_{name}{{dataset=\"{dataset}\"}}"),
            )
            .unwrap_or_else(|| panic!("no {name} for {dataset} in\n{text}"))
        };
        let (read, hits) = (m("field_groups_total"), m("field_hits_total"));
        assert!(
            read >= 3.0 && read <= (3 * groups) as f64,
            "{dataset}: {read}"
        );
        // Each row's three values at least once (a reload reads them again).
        assert!(read + hits >= (3 * n) as f64, "{dataset}: {read} + {hits}");
    }

    // The disk tier kept each row whole (its image and its fields): after a restart (an
    // empty decoded cache), an epoch reads nothing from the store and gives the same
    // elements, field by field.
    restarted(&mut j, &bucket, &args, &credentials(&s3));
    assert!(metric(&j, "joader_disk_cache_objects") >= n as f64);
    let (again, ids, errors) = epoch(&j, "r2", "remote");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(ids.len(), n);
    assert!(
        again == from_files,
        "the tier's rows differ from the files'"
    );
    assert_eq!(
        metric(&j, "joader_s3_requests_total{op=\"get\"}"),
        0.0,
        "the epoch after the restart fetched from the store"
    );
    assert!(metric(&j, "joader_disk_cache_hits_total") >= n as f64);
    // A disk preload of the rows finds every one in the tier: pinned without a fetch.
    let c = j.server.client();
    c.ok(
        "POST",
        "/v1/datasets/remote/preload",
        Some(&json!({"keep": "disk"})),
    )
    .unwrap();
    let p = crate::common::wait_for("the disk preload to settle", || {
        let d = c.ok("GET", "/v1/datasets/remote", None).ok()?;
        (d["preload"]["state"] != "loading").then(|| d["preload"].clone())
    });
    assert_eq!(
        (
            p["state"].as_str(),
            p["pinned"].as_u64(),
            p["loads"].as_u64()
        ),
        (Some("ready"), Some(n as u64), Some(0)),
        "{p}"
    );

    // A truncated object, or one that is no Parquet file, fails the indexing, naming it.
    for (name, key) in [("cut", "cut/train.parquet"), ("junk", "junk/train.parquet")] {
        create(
            &j,
            name,
            json!({"kind": "s3", "url": format!("s3://bkt/{name}/"), "layout": "parquet"}),
        );
        let v = settled(&j, name);
        assert_eq!(v["state"], "failed", "{v}");
        let error = v["error"].as_str().unwrap();
        assert!(error.starts_with("bad_parquet"), "{v}");
        assert!(error.contains(key), "{v}");
    }

    // An object changed after indexing: every element is an error record, no other bytes.
    create(
        &j,
        "chg",
        json!({"kind": "s3", "url": "s3://bkt/chg/train.parquet", "layout": "parquet"}),
    );
    let v = settled(&j, "chg");
    assert_eq!(v["state"], "ready", "{v}");
    let half = v["items"].as_u64().unwrap() as u32;
    // One byte of an image flipped: the same size and footer, another ETag.
    let mut changed = std::fs::read(bucket.join("chg/train.parquet")).unwrap();
    let at = changed.len() / 3;
    changed[at] ^= 0x55;
    std::fs::write(bucket.join("chg/train.parquet"), changed).unwrap();
    let (delivered, _, errors) = epoch(&j, "c", "chg");
    assert!(
        delivered.is_empty(),
        "changed bytes delivered: {:?}",
        delivered.keys()
    );
    assert_eq!(
        errors.iter().copied().collect::<BTreeSet<_>>(),
        (0..half).collect()
    );
    let failures = j
        .server
        .client()
        .ok("GET", "/v1/datasets/chg/failures", None)
        .unwrap();
    // The store's refusal, not a damaged file.
    let first = &failures["failures"][0];
    assert_eq!(first["kind"], "s3_refused", "{failures}");
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .contains("re-index the dataset"),
        "{failures}"
    );
}

/// 300 rows of raw bytes (the raw pipeline never decodes them) in three objects of 100-row
/// groups, as the Hub shapes them; prints nothing.
const ROWS: &str = r#"
import os, sys
import pyarrow as pa
import pyarrow.parquet as pq
out = sys.argv[1]
image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
schema = pa.schema([("image", image_type), ("label", pa.int64())])
rows = [{"image": {"bytes": bytes((b * 31 + i) % 256 for b in range(1000 + i * 7)),
                   "path": f"{i}.jpg"}, "label": i % 3} for i in range(300)]
os.makedirs(os.path.join(out, "far"))
for f in range(3):
    pq.write_table(pa.Table.from_pylist(rows[f * 100:(f + 1) * 100], schema=schema),
                   os.path.join(out, "far", f"train-{f:05}-of-00003.parquet"), row_group_size=100)
"#;

#[test]
fn s3_parquet_rows_through_a_store_30_ms_away_are_fetched_ahead_and_tiered() {
    let test = "s3_parquet_rows_through_a_store_30_ms_away_are_fetched_ahead_and_tiered";
    let Some((s3, _)) = store_with(test, ROWS, None) else {
        return;
    };
    let bucket = s3.bucket();
    let (n, objects) = (300, 3.0);
    let port: u16 = s3.endpoint().rsplit(':').next().unwrap().parse().unwrap();
    let proxy = joader_tools::bench::e2e::proxy::DelayProxy::start(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        std::time::Duration::from_millis(30),
    )
    .unwrap();
    let mut env = credentials(&s3);
    for (k, v) in &mut env {
        if *k == "AWS_ENDPOINT_URL" {
            *v = proxy.endpoint();
        }
    }
    let tier = crate::common::TempDir::new("s3_parquet_tier");
    let args = [
        "--allowed-s3",
        "s3://bkt",
        "--disk-cache",
        tier.0.to_str().unwrap(),
        "--disk-cache-bytes",
        "64MiB",
    ];
    let mut j = joader("s3_parquet_far", &bucket, &args, &env);
    create(
        &j,
        "local",
        json!({"kind": "parquet", "paths": [bucket.join("far")]}),
    );
    create(
        &j,
        "far",
        json!({"kind": "s3", "url": "s3://bkt/far", "layout": "parquet"}),
    );
    assert_eq!(settled(&j, "local")["state"], "ready");
    assert_eq!(settled(&j, "far")["state"], "ready");
    let (want, _) = read_raw(&j, "local-epoch", "local");
    let gets = metric(&j, "joader_s3_requests_total{op=\"get\"}");
    let (got, ids) = read_raw(&j, "far-epoch", "far");
    assert_permutation(&ids, n, "the s3 epoch");
    assert_eq!(got, want, "the s3 rows differ from the local ones");
    // An object's first read takes its footer (once, whatever the rows read at once), a row
    // group's first read its chunk (unless the footer's GET held it), and its later rows are
    // served from the rows it decoded: at most two GETs per object of 100-row groups (no
    // retries: the proxy only delays).
    let gets = metric(&j, "joader_s3_requests_total{op=\"get\"}") - gets;
    assert!(gets <= 2.0 * objects, "{gets} GETs for {n} rows");
    // Loads found rows fetched ahead; each one fetched ahead was taken.
    let ahead = metric(&j, "joader_s3_fetch_ahead_hits_total")
        + metric(&j, "joader_s3_fetch_ahead_joined_total");
    assert!(ahead > 0.0, "no load found its row fetched ahead");
    assert_eq!(metric(&j, "joader_s3_fetch_ahead_requests_total"), ahead);
    assert_eq!(metric(&j, "joader_s3_fetch_ahead_stale_total"), 0.0);
    assert_eq!(
        metric(&j, "joader_parquet_rows_read_total{dataset=\"far\"}"),
        n as f64
    );
    // The disk tier kept every row: after a restart (an empty decoded cache), an epoch
    // through the same 30 ms proxy fetches nothing, reads no row of a file, and gives the
    // same bytes.
    crate::common::wait_for("the disk tier's writer to be idle", || {
        (metric(&j, "joader_disk_cache_queued") == 0.0).then_some(())
    });
    assert_eq!(metric(&j, "joader_disk_cache_objects"), n as f64);
    restarted(&mut j, &bucket, &args, &env);
    assert_eq!(settled(&j, "far")["state"], "ready");
    let (again, ids) = read_raw(&j, "far-epoch-2", "far");
    assert_permutation(&ids, n, "the s3 epoch after the restart");
    assert_eq!(again, want, "the tier's rows differ from the local ones");
    assert_eq!(metric(&j, "joader_s3_requests_total{op=\"get\"}"), 0.0);
    assert!(metric(&j, "joader_disk_cache_hits_total") >= n as f64);
    assert_eq!(
        metric(&j, "joader_parquet_rows_read_total{dataset=\"far\"}"),
        0.0,
        "no row read from its file again"
    );
}

/// Hugging Face dataset folders in the bucket: `beans` as `datasets` uploads one (20 train,
/// 10 test and 5 validation rows in `data/`), and `carded`, whose card's `configs` give the
/// train split as `parts/a-*` (8 rows; `parts/b-0.parquet`, 4 rows, is another config's).
const HUB: &str = r#"
import os, sys
import pyarrow as pa
import pyarrow.parquet as pq
out = sys.argv[1]
image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
schema = pa.schema([("image", image_type), ("label", pa.int64())])
def write(path, n, tag):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rows = [{"image": {"bytes": bytes([tag, i]) * 50, "path": f"{i}.jpg"}, "label": i % 2}
            for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")
write(os.path.join(out, "beans", "data", "train-00000-of-00002.parquet"), 12, 1)
write(os.path.join(out, "beans", "data", "train-00001-of-00002.parquet"), 8, 2)
write(os.path.join(out, "beans", "data", "test-00000-of-00001.parquet"), 10, 3)
write(os.path.join(out, "beans", "data", "validation-00000-of-00001.parquet"), 5, 4)
write(os.path.join(out, "carded", "parts", "a-0.parquet"), 8, 5)
write(os.path.join(out, "carded", "parts", "b-0.parquet"), 4, 6)
card = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: parts/a-*
- config_name: other
  data_files:
  - split: train
    path: parts/b-*
---
# carded
"""
open(os.path.join(out, "carded", "README.md"), "w").write(card)
"#;

#[test]
fn an_s3_hub_folder_is_read_by_split_as_the_hub_lays_it_out() {
    let test = "an_s3_hub_folder_is_read_by_split_as_the_hub_lays_it_out";
    let Some((s3, _)) = store_with(test, HUB, None) else {
        return;
    };
    let j = joader(
        "s3_hub_split",
        &s3.bucket(),
        &["--allowed-s3", "s3://bkt"],
        &credentials(&s3),
    );
    let c = j.server.client();
    let source = |url: &str, layout: &str, split: &str| json!({"kind": "s3", "url": url, "layout": layout, "split": split});
    for (name, url, split, items) in [
        ("train", "s3://bkt/beans", "train", 20),
        ("test", "s3://bkt/beans/", "test", 10),
        ("dev", "s3://bkt/beans", "dev", 5),
        ("carded", "s3://bkt/carded", "train", 8),
    ] {
        create(&j, name, source(url, "parquet", split));
        let v = settled(&j, name);
        assert_eq!(
            (v["state"].as_str(), v["items"].as_u64()),
            (Some("ready"), Some(items)),
            "{name}: {v}"
        );
    }
    // A split found nowhere, or given to another layout: a 400 at once, naming it.
    let (status, body) = c
        .call(
            "POST",
            "/v1/datasets",
            Some(&json!({"name": "none", "source": source("s3://bkt/beans", "parquet", "nope")})),
        )
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("split `nope`"),
        "{body}"
    );
    let (status, body) = c
        .call(
            "POST",
            "/v1/datasets",
            Some(
                &json!({"name": "tars", "source": source("s3://bkt/beans", "tar_shards", "train")}),
            ),
        )
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`parquet` layout"),
        "{body}"
    );
}
