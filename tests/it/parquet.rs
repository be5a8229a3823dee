//! The `parquet` source against files written by `pyarrow` the way Hugging Face's `datasets`
//! library writes them (image struct `{bytes, path}`, `ClassLabel` metadata, snappy and zstd,
//! small row groups; and v2 pages with an offset index and no dictionary): the same images as
//! an image folder give the same decoded pixels and labels through a real `joader serve`;
//! damaged files and rows are error records or failed
//! indexing, and the server lives on.
//!
//! `pyarrow` comes from the test command's Python environment (`tests/requirements.in`); no
//! test installs it. `tests/all.sh` sets `JOADER_REQUIRE_TOOLS=1`, under which a missing
//! `pyarrow` fails the test (never skips it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::common::{
    DEADLINE, TempDir, TestServer, consumer, finish, joader, unique_instance, wait_for,
};

/// Writes the Parquet files of the test (see the comments of the script).
const WRITER: &str = r#"
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq

images, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(images) if not d.startswith("."))
rows = []  # ImageFolder's order: sorted class folders, sorted files
for label, c in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(images, c))):
        rows.append((os.path.join(c, f), label))

image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
schema = pa.schema([("image", image_type), ("label", pa.int64())]).with_metadata(
    {"huggingface": json.dumps({"info": {"features": features}})})

def table(items):
    return pa.Table.from_pylist(items, schema=schema)

def item(rel, label, path_only=False):
    data = open(os.path.join(images, rel), "rb").read()
    if path_only:
        # Only a path, relative to the Parquet file's folder.
        return {"image": {"bytes": None, "path": os.path.join("..", "imgs", rel)}, "label": label}
    return {"image": {"bytes": data, "path": os.path.basename(rel)}, "label": label}

# Two files, as the Hub shards a split: snappy (the default) and zstd, 4 rows per row group;
# row 5 holds only a path.
items = [item(rel, label, path_only=(i == 5)) for i, (rel, label) in enumerate(rows)]
half = len(items) // 2
os.makedirs(os.path.join(out, "pq"))
pq.write_table(table(items[:half]), os.path.join(out, "pq", "train-00000-of-00002.parquet"),
               row_group_size=4, compression="snappy")
pq.write_table(table(items[half:]), os.path.join(out, "pq", "train-00001-of-00002.parquet"),
               row_group_size=4, compression="zstd")

# The same rows laid out as other writers do: no dictionary, v2 data pages of two rows, an
# offset index.
os.makedirs(os.path.join(out, "pq2"))
pq.write_table(table(items), os.path.join(out, "pq2", "train.parquet"), row_group_size=8,
               use_dictionary=False, data_page_version="2.0", write_page_index=True,
               data_page_size=1, write_batch_size=2)

# A file cut short (its footer is gone).
os.makedirs(os.path.join(out, "cut"))
whole = open(os.path.join(out, "pq", "train-00000-of-00002.parquet"), "rb").read()
open(os.path.join(out, "cut", "train.parquet"), "wb").write(whole[: len(whole) // 2])

# Row 2 holds bytes that are no image; row 3 a path outside the allowed roots.
os.makedirs(os.path.join(out, "junk"))
junk = [item(rel, label) for rel, label in rows[:6]]
junk[2] = {"image": {"bytes": b"not an image at all", "path": None}, "label": junk[2]["label"]}
junk[3] = {"image": {"bytes": None, "path": "/etc/hostname"}, "label": junk[3]["label"]}
pq.write_table(table(junk), os.path.join(out, "junk", "data.parquet"), row_group_size=4)

# A test split as the Hub publishes one: row 1 labelled -1, row 4's label null.
os.makedirs(os.path.join(out, "unlabelled"))
unl = [item(rel, label) for rel, label in rows[:6]]
unl[1]["label"], unl[4]["label"] = -1, None
pq.write_table(table(unl), os.path.join(out, "unlabelled", "test-00000-of-00001.parquet"), row_group_size=4)
print(len(rows))
"#;

/// True when `python3` imports `pyarrow`. Without it the test fails under
/// `JOADER_REQUIRE_TOOLS=1`, else says that it skips.
pub(crate) fn pyarrow(test: &str) -> bool {
    let import = Command::new("python3")
        .args(["-c", "import pyarrow"])
        .output();
    if import.as_ref().is_ok_and(|o| o.status.success()) {
        return true;
    }
    let why = format!(
        "{test} needs pyarrow, which python3 cannot import (source tests/pyenv.sh for the test \
         command's environment): {}",
        match &import {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        }
    );
    if std::env::var("JOADER_REQUIRE_TOOLS").is_ok_and(|v| v == "1") {
        panic!("{why}; JOADER_REQUIRE_TOOLS=1 forbids skipping");
    }
    eprintln!("SKIPPED {why}");
    false
}

/// The dataset once it has left `indexing`.
fn settled(server: &TestServer, name: &str) -> Value {
    let c = server.client();
    wait_for(&format!("dataset {name} to be ready or failed"), || {
        let v = c.ok("GET", &format!("/v1/datasets/{name}"), None).ok()?;
        (v["state"] != "indexing").then_some(v)
    })
}

fn create(server: &TestServer, name: &str, source: Value) -> (u16, Value) {
    server
        .client()
        .call(
            "POST",
            "/v1/datasets",
            Some(&json!({"name": name, "source": source})),
        )
        .unwrap()
}

/// Element → (label, pixels).
type Delivered = BTreeMap<u32, (i64, Vec<u8>)>;

/// One epoch of `dataset`, decoded: what was delivered, and element → error code.
fn read_decoded(server: &TestServer, job: &str, dataset: &str) -> (Delivered, BTreeMap<u32, u64>) {
    let dump = TempDir::new(job);
    let s = finish(consumer(
        &server.url,
        &json!({"name": job, "dataset": dataset, "batch_size": 4, "epochs": 1,
                "pipeline": {"kind": "decode", "resize_shorter": 32, "center_crop": [24, 28]}}),
        &["--dump", dump.0.to_str().unwrap()],
    ));
    let labels: BTreeMap<u32, i64> = s["epochs"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_i64().unwrap()))
        .collect();
    let errors: BTreeMap<u32, u64> = s["errors"][0]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dump.0).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let element: u32 = stem.rsplit('-').next().unwrap().parse().unwrap();
        out.insert(element, (labels[&element], std::fs::read(&path).unwrap()));
    }
    assert_eq!(out.len(), labels.len(), "{s}");
    (out, errors)
}

fn write_files(root: &Path) -> usize {
    let spec = joader_tools::synth::SynthSpec {
        classes: 3,
        per_class: 7,
        width: 64,
        height: 48,
        quality: 90,
        seed: 11,
    };
    joader_tools::synth::generate_image_folder(&root.join("imgs"), &spec, &mut |_| {})
        .expect("generate the image folder");
    python(WRITER, &[&root.join("imgs"), root])
        .trim()
        .parse()
        .unwrap()
}

/// Runs a Python `script` with `args` and returns what it printed; fails when it failed.
pub(crate) fn python(script: &str, args: &[&Path]) -> String {
    let out = Command::new("python3")
        .args(["-c", script])
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the pyarrow writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_parquet_dataset_gives_the_batches_of_the_same_image_folder() {
    if !pyarrow("a_parquet_dataset_gives_the_batches_of_the_same_image_folder") {
        return;
    }
    let root = TempDir::new("parquet_same");
    let n = write_files(&root.0);
    let state = TempDir::new("parquet_same_state");
    let server = TestServer::start(&unique_instance("parquet_same"), &state.0, &root.0, &[]);
    let (status, body) = create(
        &server,
        "folder",
        json!({"kind": "image_folder", "path": root.0.join("imgs")}),
    );
    assert_eq!(status, 202, "{body}");
    let (status, body) = create(
        &server,
        "pq",
        json!({"kind": "parquet", "paths": [root.0.join("pq")]}),
    );
    assert_eq!(status, 202, "{body}");
    let folder = server.client().wait_ready("folder", DEADLINE).unwrap();
    let pq = settled(&server, "pq");
    assert_eq!(pq["state"], "ready", "{pq}");
    assert_eq!(pq["items"], n, "{pq}");
    // The ClassLabel names are the class folders' names.
    assert_eq!(pq["classes"], json!(folder.classes), "{pq}");

    let (from_folder, errors) = read_decoded(&server, "a", "folder");
    assert!(errors.is_empty(), "{errors:?}");
    // pyarrow's defaults (dictionary pages, Snappy; zstd in the second file), then v2 pages
    // with an offset index and no dictionary.
    let (status, body) = create(
        &server,
        "pq2",
        json!({"kind": "parquet", "paths": [root.0.join("pq2")]}),
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(settled(&server, "pq2")["state"], "ready");
    for (job, dataset) in [("b", "pq"), ("c", "pq2")] {
        let (from_parquet, errors) = read_decoded(&server, job, dataset);
        assert!(errors.is_empty(), "{dataset}: {errors:?}");
        assert_eq!(from_parquet.len(), n, "{dataset}");
        assert_eq!(
            from_parquet.keys().collect::<Vec<_>>(),
            from_folder.keys().collect::<Vec<_>>()
        );
        for (element, (label, pixels)) in &from_folder {
            let (pq_label, pq_pixels) = &from_parquet[element];
            assert_eq!(pq_label, label, "{dataset}: element {element}");
            assert!(
                pq_pixels == pixels,
                "{dataset}: element {element}: other pixels"
            );
        }
    }
    // What the reads cost, per parquet dataset (none for the folder): every row was read,
    // each row group decoded whole at least once, and bytes were read and decompressed.
    let text = crate::common::scrape(&server.url);
    for dataset in ["pq", "pq2"] {
        let m = |name: &str| {
            let s = format!("joader_parquet_{name}{{dataset=\"{dataset}\"}}");
            crate::common::series(&text, &s).unwrap_or_else(|| panic!("no series {s} in\n{text}"))
        };
        assert!(m("rows_read_total") >= n as f64, "{dataset}");
        assert!(m("row_groups_decoded_total") >= 1.0, "{dataset}");
        assert!(m("read_bytes_total") > 0.0, "{dataset}");
        assert!(m("decompressed_bytes_total") > 0.0, "{dataset}");
        assert!(m("decoded_row_hits_total") >= 0.0, "{dataset}");
    }
    assert!(!text.contains("joader_parquet_rows_read_total{dataset=\"folder\"}"));
}

#[test]
fn damaged_parquet_files_and_rows_are_errors_and_the_server_lives_on() {
    if !pyarrow("damaged_parquet_files_and_rows_are_errors_and_the_server_lives_on") {
        return;
    }
    let root = TempDir::new("parquet_bad");
    write_files(&root.0);
    let state = TempDir::new("parquet_bad_state");
    let server = TestServer::start(&unique_instance("parquet_bad"), &state.0, &root.0, &[]);

    // A declaration that cannot be followed is refused with the error model, naming the
    // field; a field whose column the files lack fails the indexing, naming both.
    let (status, body) = create(
        &server,
        "shaped",
        json!({"kind": "parquet", "paths": [root.0.join("pq")], "fields": {
            "image": {"kind": "image"}, "caption": {"kind": "text", "shape": [2]}}}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert!(
        body.to_string().contains("field `caption`"),
        "the error names the field: {body}"
    );
    let (status, body) = create(
        &server,
        "captions",
        json!({"kind": "parquet", "paths": [root.0.join("pq")], "fields": {
            "image": {"kind": "image"}, "label": {"kind": "class"},
            "caption": {"kind": "text", "from": "text"}}}),
    );
    assert_eq!(status, 202, "{body}");
    let captions = settled(&server, "captions");
    assert_eq!(captions["state"], "failed", "{captions}");
    assert!(
        captions["error"]
            .as_str()
            .unwrap()
            .contains("field `caption`: no column `text`"),
        "{captions}"
    );
    // Paths outside the allowed roots are refused before indexing.
    let (status, body) = create(
        &server,
        "outside",
        json!({"kind": "parquet", "paths": ["/etc"]}),
    );
    assert_eq!(status, 403, "{body}");

    // A file cut short fails its indexing, saying why.
    let (status, body) = create(
        &server,
        "cut",
        json!({"kind": "parquet", "paths": [root.0.join("cut")]}),
    );
    assert_eq!(status, 202, "{body}");
    let cut = settled(&server, "cut");
    assert_eq!(cut["state"], "failed", "{cut}");
    assert!(
        cut["error"].as_str().unwrap().starts_with("bad_parquet"),
        "{cut}"
    );

    // Rows whose image is no image, or whose path lies outside the roots, are error
    // records; the other rows are delivered.
    let (status, body) = create(
        &server,
        "junk",
        json!({"kind": "parquet", "paths": [root.0.join("junk/data.parquet")]}),
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(settled(&server, "junk")["state"], "ready");
    let (delivered, errors) = read_decoded(&server, "j", "junk");
    assert_eq!(
        errors.keys().copied().collect::<Vec<_>>(),
        [2, 3],
        "{errors:?}"
    );
    assert_eq!(delivered.keys().copied().collect::<Vec<_>>(), [0, 1, 4, 5]);
    assert_ne!(errors[&2], errors[&3], "a decode error and a read error");
    let failures = server
        .client()
        .ok("GET", "/v1/datasets/junk/failures", None)
        .unwrap();
    let mut kinds: Vec<&str> = failures["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds.len(), 2, "{failures}");
    assert!(kinds.contains(&"outside_roots"), "{failures}");
    assert!(
        kinds.contains(&"not_an_image") || kinds.contains(&"corrupt_image"),
        "{failures}"
    );

    // The server lives on.
    let (status, _) = server.client().call("GET", "/healthz", None).unwrap();
    assert_eq!(status, 200);
}

/// The cells of the markdown row of `md` that starts with `start`.
pub(crate) fn cells<'a>(md: &'a str, start: &str) -> Vec<&'a str> {
    md.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no row {start:?} in\n{md}"))
        .split('|')
        .map(str::trim)
        .collect()
}

/// `joader bench e2e --parquet` and `joader bench parquet-index`, tiny, so that the benches
/// cannot rot: each prints its rows with every figure. The figures are the benches' business;
/// what is exact is checked: a row read from its location reads and decompresses bytes, and
/// the index holds every generated row.
#[test]
fn the_parquet_benches_print_their_rows() {
    if !pyarrow("the_parquet_benches_print_their_rows") {
        return;
    }
    let dir = TempDir::new("bench-parquet");
    let out = dir.0.join("out");
    let o = joader(&[
        "bench",
        "e2e",
        "--quick",
        "--parquet",
        "--only",
        "parquet",
        "--data",
        dir.0.join("data").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("e2e.md")).unwrap();
    for source in ["image folder", "parquet"] {
        let row = cells(&md, &format!("| joader serve, {source} | 1 |"));
        let figures: Vec<f64> = row[3..8].iter().map(|c| c.parse().unwrap()).collect();
        assert!(figures.iter().all(|f| *f > 0.0), "{source}: {row:?}");
        // Four jobs of one dataset: no element is decoded for more than one of them.
        assert!(figures[2] <= 1.0, "{source}: {row:?}");
    }
    assert!(md.contains("mean of the rounds: throughput"), "{md}");
    let located = cells(&md, "| parquet, rows located |");
    let read: f64 = located[3].parse().unwrap();
    let decompressed: f64 = located[4].parse().unwrap();
    assert!(read > 0.0 && decompressed > 0.0, "{located:?}");

    let o = joader(&[
        "bench",
        "parquet-index",
        "--items",
        "5000",
        "--rows-per-file",
        "1000",
        "--data",
        dir.0.join("index").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("5000 rows in 5 files"), "{table}");
    let ready = cells(&table, "| time until ready");
    assert!(ready[2].ends_with(" s"), "{ready:?}");
    let rss = cells(&table, "| RssAnon growth");
    assert!(rss[2].contains("B/item"), "{rss:?}");
}

#[test]
fn unlabelled_rows_of_a_test_split_are_delivered_as_minus_one() {
    if !pyarrow("unlabelled_rows_of_a_test_split_are_delivered_as_minus_one") {
        return;
    }
    let tmp = TempDir::new("pq_unlabelled");
    write_files(&tmp.0);
    let state = TempDir::new("pq_unlabelled_state");
    let server = TestServer::start(&unique_instance("pq_unl"), &state.0, &tmp.0, &[]);
    let (code, body) = create(
        &server,
        "t",
        json!({"kind": "parquet", "paths": [tmp.0.join("unlabelled")]}),
    );
    assert_eq!(code, 202, "{body}");
    let d = settled(&server, "t");
    assert_eq!(d["state"], "ready", "{d}");
    assert_eq!(d["items"], 6, "{d}");
    let (got, errors) = read_decoded(&server, "tj", "t");
    assert!(errors.is_empty(), "{errors:?}");
    // Rows 0-5 of the image folder's order: 3 classes of 7, so all of class 0 but row 1 and 4.
    let labels: Vec<i64> = (0..6).map(|e| got[&e].0).collect();
    assert_eq!(labels, vec![0, -1, 0, 0, -1, 0]);
}

#[test]
fn the_parquet_budgets_are_the_servers_settings() {
    if !pyarrow("the_parquet_budgets_are_the_servers_settings") {
        return;
    }
    let root = TempDir::new("parquet_budgets");
    let n = write_files(&root.0);
    // Three servers over the same files: the defaults, one that keeps no decoded row (but
    // spills), and one that keeps none and spills nothing.
    let mut hits = Vec::new();
    let mut spill = Vec::new();
    for (tag, extra) in [
        ("parquet_budgets_default", &[][..]),
        (
            "parquet_budgets_none",
            &[
                "--parquet-decoded-bytes",
                "1",
                "--parquet-field-bytes",
                "3MiB",
            ][..],
        ),
        (
            "parquet_budgets_nothing",
            &["--parquet-decoded-bytes", "1", "--parquet-spill-bytes", "1"][..],
        ),
    ] {
        let state = TempDir::new(tag);
        let server = TestServer::start(&unique_instance(tag), &state.0, &root.0, extra);
        let (status, body) = create(
            &server,
            "pq",
            json!({"kind": "parquet", "paths": [root.0.join("pq")]}),
        );
        assert_eq!(status, 202, "{body}");
        assert_eq!(settled(&server, "pq")["state"], "ready");
        let (rows, errors) = read_decoded(&server, "a", "pq");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(rows.len(), n);
        let text = crate::common::scrape(&server.url);
        let m = |s: &str| {
            crate::common::series(&text, s).unwrap_or_else(|| panic!("no series {s} in\n{text}"))
        };
        let budget = |kind: &str| m(&format!("joader_parquet_budget_bytes{{kind=\"{kind}\"}}"));
        if extra.is_empty() {
            // An eighth of the test server's cache is below 64 MiB: 64 MiB.
            assert_eq!(budget("decoded"), f64::from(64u32 << 20));
            assert_eq!(budget("directories"), f64::from(64u32 << 20));
            assert_eq!(budget("fields"), f64::from(32u32 << 20));
            // The smaller of 16 GiB and half the data folder's free space.
            assert!(budget("spill") > 0.0 && budget("spill") <= 16.0 * f64::from(1u32 << 30));
        } else {
            assert_eq!(budget("decoded"), 1.0);
        }
        if tag == "parquet_budgets_none" {
            assert_eq!(budget("fields"), f64::from(3u32 << 20));
        }
        if tag == "parquet_budgets_nothing" {
            assert_eq!(budget("spill"), 1.0);
        }
        hits.push(m("joader_parquet_decoded_row_hits_total{dataset=\"pq\"}"));
        spill.push((
            m("joader_parquet_spill_hits_total{dataset=\"pq\"}"),
            m("joader_parquet_row_groups_decoded_total{dataset=\"pq\"}"),
        ));
    }
    // The zstd file's rows come from the decoded rows kept, unless none may be kept.
    assert!(hits[0] > 0.0, "{hits:?}");
    assert_eq!(hits[1], 0.0, "{hits:?}");
    // Without decoded rows kept, they come from its groups spilled to disk: each group
    // decoded once, not once per row.
    assert!(spill[1].0 > 0.0, "{spill:?}");
    assert_eq!(spill[2].0, 0.0, "{spill:?}");
    assert!(
        spill[1].1 < spill[2].1,
        "fewer groups decoded with the spill: {spill:?}"
    );
}
