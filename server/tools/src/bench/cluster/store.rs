//! Part 4 of `joader bench cluster`: a 3-rank job (a rank per node) with its dataset in an
//! object store a fixed latency away (`s3s-fs` on loopback behind the e2e bench's
//! [`DelayProxy`]), beside the same job on the same folder on local disk, on the same
//! cluster. It reads photo-sized JPEGs (500x375) through a decoding pipeline (shorter side
//! 224, centre crop 224), as training does, so that a node's rate is its decoding's and the
//! store's own CPU (`s3s-fs`, which shares this machine's cores) is a small part of it. The
//! followers' caches hold about a third of their share, so every epoch loads again and, for
//! the store, fetches again. The same store job runs once more on a cluster whose nodes do
//! not fetch ahead (`--s3-fetch-ahead-bytes 0`), which is what multi-node jobs had before the
//! leader sent its picks ahead.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use super::{BATCH, Cluster, NODES, job, rank_per_node};
use crate::bench::e2e::pin::Split;
use crate::bench::e2e::proxy::DelayProxy;
use crate::bench::e2e::s3::{S3sFs, copy_folder};
use crate::bench::e2e::tier::scrape;
use crate::bench::scale::procs::cpu_seconds;

const BUCKET: &str = "bench";

/// Part 4's figures.
pub(super) struct Far {
    /// How the CPUs were split between the store and the rest.
    pub(super) cpus: String,
    pub(super) latency_ms: u64,
    pub(super) epochs: u32,
    /// Local disk, the store with fetch-ahead, the store without.
    pub(super) disk: Run,
    pub(super) store: Run,
    pub(super) store_off: Run,
    /// Over the nodes, in the fetch-ahead run: elements fetched ahead, and those of them
    /// taken by their loads; GETs per delivered sample.
    pub(super) ahead_requested: f64,
    pub(super) ahead_taken: f64,
    pub(super) gets_per_sample: f64,
    /// CPU of `s3s-fs` per delivered sample (ms), in the fetch-ahead run.
    pub(super) store_cpu_ms_per_sample: f64,
}

/// The followers' caches: about a third of the 500 decoded 224x224 images of each node's
/// share, above what a rank's ring and lookahead hold (about 100 of them).
const CACHE: u64 = 24 << 20;

/// The decoding pipeline of part 4's jobs.
fn pipeline() -> serde_json::Value {
    json!({"kind": "decode", "resize_shorter": 224, "center_crop": [224, 224]})
}

/// Runs part 4 with `images` photo-sized JPEGs generated under `data`.
pub(super) fn object_store(
    data: &Path,
    s3s_fs: &Path,
    (images, latency_ms, epochs, store_cpus): (u32, u64, u32, usize),
    out: &Path,
) -> Result<Far> {
    let spec = crate::synth::SynthSpec {
        classes: 10,
        per_class: images.div_ceil(10).max(1),
        width: 500,
        height: 375,
        quality: 90,
        seed: 44,
    };
    let images = data.join("photos");
    eprintln!("part 4: generating {} photo-sized images…", spec.images());
    crate::synth::generate_image_folder(&images, &spec, &mut |_| {})?;
    let images = images.as_path();
    let cache = CACHE;
    let dir = tempfile::Builder::new()
        .prefix("joader-bench-cluster-s3")
        .tempdir()?;
    copy_folder(images, &dir.path().join(BUCKET).join("images"))?;
    // The store on CPUs of its own (a real one runs on other machines): the bench and its
    // children, the disk rows' too, on the rest.
    let split = match store_cpus {
        0 => None,
        n => Split::of(n)
            .inspect_err(|e| eprintln!("part 4: {e:#}; the store shares every CPU"))
            .ok(),
    };
    if let Some(split) = &split {
        split.pin_this_process()?;
    }
    let s3 = S3sFs::start(s3s_fs, dir.path())?;
    if let Some(split) = &split {
        split.pin_store_process(s3.pid())?;
    }
    let proxy = DelayProxy::start_pinned(s3.addr(), Duration::from_millis(latency_ms), split)?;
    let env = s3.env(&proxy.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let source = json!({"kind": "s3", "url": format!("s3://{BUCKET}/images"),
                        "layout": "image_folder"});
    let allowed = ["--allowed-s3".to_owned(), format!("s3://{BUCKET}")];

    eprintln!(
        "part 4: a {NODES}-rank job from local disk, then from a store {latency_ms} ms away…"
    );
    let c = Cluster::start_env(images, cache, "cluster4", &env, &allowed)?;
    c.dataset("fardisk")?;
    let disk = ranks(&c, "fardisk", "fard", epochs, out)?;
    c.dataset_of("far", source.clone())?;
    let sum =
        |series: &str| -> Result<f64> { c.nodes.iter().map(|n| scrape(&n.url, series)).sum() };
    let gets0 = sum("joader_s3_requests_total{op=\"get\"}")?;
    let cpu0 = cpu_seconds(s3.pid())?;
    let store = ranks(&c, "far", "fars", epochs, out)?;
    let store_cpu = cpu_seconds(s3.pid())? - cpu0;
    let ahead_requested = sum("joader_s3_fetch_ahead_requests_total")?;
    let ahead_taken =
        sum("joader_s3_fetch_ahead_hits_total")? + sum("joader_s3_fetch_ahead_joined_total")?;
    let gets = sum("joader_s3_requests_total{op=\"get\"}")? - gets0;
    let items = c.leader.client().ok("GET", "/v1/datasets/far", None)?["items"]
        .as_f64()
        .context("no items")?;
    drop(c);

    eprintln!("part 4: the same store job on nodes that do not fetch ahead…");
    let mut off = allowed.to_vec();
    off.extend(["--s3-fetch-ahead-bytes".to_owned(), "0".to_owned()]);
    let c = Cluster::start_env(images, cache, "cluster4off", &env, &off)?;
    c.dataset_of("far", source)?;
    let store_off = ranks(&c, "far", "faro", epochs, out)?;
    Ok(Far {
        cpus: split.map_or_else(|| "shared by every process".to_owned(), |s| s.describe()),
        latency_ms,
        epochs,
        disk,
        store,
        store_off,
        ahead_requested,
        ahead_taken,
        gets_per_sample: gets / (items * f64::from(epochs)).max(1.0),
        store_cpu_ms_per_sample: store_cpu * 1e3 / (items * f64::from(epochs)).max(1.0),
    })
}

/// One run of the job: each rank's samples/s, and the nodes' CPU per delivered sample (ms).
pub(super) struct Run {
    pub(super) rates: Vec<f64>,
    pub(super) node_cpu_ms: f64,
}

/// A job of `epochs` epochs on `dataset`, a rank per node.
fn ranks(c: &Cluster, dataset: &str, name: &str, epochs: u32, out: &Path) -> Result<Run> {
    let cpu = || -> Result<f64> { c.nodes.iter().map(|n| cpu_seconds(n.pid())).sum() };
    let cpu0 = cpu()?;
    let mut body = job(name, dataset, NODES as u32, 1, None, epochs);
    body["pipeline"] = pipeline();
    let (rates, samples) = rank_per_node(c, &body, name, out)?;
    Ok(Run {
        rates,
        node_cpu_ms: (cpu()? - cpu0) * 1e3 / samples.max(1.0),
    })
}

/// Part 4's rows of the table, and its JSON fields.
pub(super) fn report(far: Option<&Far>, why_not: &str) -> (String, serde_json::Value) {
    let Some(f) = far else {
        return (
            format!(
                "| {NODES}-rank job from a store: per-rank samples/s / local disk | not run: {why_not} | | >= 0.8 per node |\n"
            ),
            serde_json::Value::Null,
        );
    };
    let over_disk = |run: &Run| -> Vec<f64> {
        run.rates
            .iter()
            .zip(&f.disk.rates)
            .map(|(s, d)| s / d.max(1e-9))
            .collect()
    };
    let (ratios, off) = (over_disk(&f.store), over_disk(&f.store_off));
    let list = |v: &[f64], digits: usize| -> String {
        let v: Vec<String> = v.iter().map(|x| format!("{x:.digits$}")).collect();
        format!("[{}]", v.join(", "))
    };
    let rows = format!(
        "| {NODES}-rank job from a store +{} ms (s3s-fs; CPUs: {}), 500x375 JPEGs decoded to 224x224, {} epoch(s), batch {BATCH}: per-rank samples/s / local disk, node by node | {} vs {}: {} | nodes without fetch-ahead: {} = {} | >= 0.8 per node |\n\
         | the store job's fetch-ahead; CPU per delivered sample | {:.0} elements fetched ahead on the nodes, {:.0} taken by their loads ({:.1}%); {:.3} GETs per sample; the nodes' CPU {:.3} ms per sample (local disk {:.3}, without fetch-ahead {:.3}); s3s-fs {:.3} ms | | |\n",
        f.latency_ms,
        f.cpus,
        f.epochs,
        list(&f.store.rates, 0),
        list(&f.disk.rates, 0),
        list(&ratios, 2),
        list(&f.store_off.rates, 0),
        list(&off, 2),
        f.ahead_requested,
        f.ahead_taken,
        f.ahead_taken * 100.0 / f.ahead_requested.max(1.0),
        f.gets_per_sample,
        f.store.node_cpu_ms,
        f.disk.node_cpu_ms,
        f.store_off.node_cpu_ms,
        f.store_cpu_ms_per_sample,
    );
    let v = json!({
        "latency_ms": f.latency_ms,
        "cpus": f.cpus,
        "epochs": f.epochs,
        "disk_rank_samples_per_s": f.disk.rates,
        "store_rank_samples_per_s": f.store.rates,
        "store_no_fetch_ahead_rank_samples_per_s": f.store_off.rates,
        "disk_node_cpu_ms_per_sample": f.disk.node_cpu_ms,
        "store_node_cpu_ms_per_sample": f.store.node_cpu_ms,
        "store_no_fetch_ahead_node_cpu_ms_per_sample": f.store_off.node_cpu_ms,
        "store_over_disk": ratios,
        "store_no_fetch_ahead_over_disk": off,
        "fetch_ahead_requested": f.ahead_requested,
        "fetch_ahead_taken": f.ahead_taken,
        "gets_per_sample": f.gets_per_sample,
        "store_cpu_ms_per_sample": f.store_cpu_ms_per_sample,
    });
    (rows, v)
}
