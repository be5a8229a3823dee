//! `joader bench cluster`: many nodes on one machine (loopback), as real processes: a
//! `--leader-only` leader and three followers (`node-0`, `node-1`, `node-2`), each with its own
//! port, instance and cache, over one generated ImageFolder; ranks are `joader consume`
//! processes registered with their node's server. Printed side by side in one run:
//!
//! 1. **Same nodes:** `--jobs` multi-node jobs, one rank per node, on overlapping halves of
//!    the dataset, one epoch together: the decodes (loads) of every node, summed, against the
//!    union of their subsets (the target: ≤ 1.1 × the union) and the sum (what independent
//!    loaders decode). This part runs on followers whose caches hold a quarter of what each
//!    loads (the third of the dataset placed on it): with caches that held the dataset, each
//!    node would load each element once whatever the order of the jobs' reads, and the
//!    figure could not fail; with a quarter, it holds only if the jobs read each element
//!    while it is cached, together.
//! 2. **Different node sets:** a job on `node-0, node-1` and a job on `node-1, node-2` over the
//!    whole dataset: the decodes against what the placement rule predicts, element by element
//!    (`joader_core::cluster::place`: an element is decoded on one node when both jobs hash it
//!    there), and the expectation `N × (2 − |S1∩S2| / |S1∪S2|)`.
//! 3. **Throughput:** a 3-rank job alone on the cluster (a rank per node) against the same job
//!    (the same 3 ranks) on one standalone server: samples/s per rank, and the leader's CPU per
//!    10k samples/s it dispatched.
//!
//! 4. **From an object store:** a 3-rank job reading photo-sized JPEGs through a decoding
//!    pipeline from `s3s-fs` behind a delay proxy (30 ms by default), beside the same job on
//!    local disk, and again on nodes that do not fetch ahead: samples/s per rank, the leader's
//!    picks fetched ahead on the nodes and taken by their loads, CPU per sample (`store.rs`).
//! 5. **Leader restart:** a 3-rank job (a rank per node) of a few epochs, undisturbed, and
//!    again with the leader SIGKILLed a third into the run and restarted at once on its
//!    address, instance and data folder: each rank's pause, the wall times, decodes per epoch
//!    against the union, and every epoch of the restart run checked exact (`restart.rs`).
//!
//! Part 5 runs on part 1's cluster, after part 1 (its caches hold less than each node's
//! share, so that every epoch decodes again). Parts 2 and 3 run on a second cluster whose
//! followers' caches hold the dataset (part 2 compares with the rule, which counts an element
//! once per node that any job places it on).
//! Every part uses a dataset of its own (the same folder), so that no part is served from
//! another's cache. The machine's cores are shared by every process: the figures are the
//! cluster's overhead on one machine, not a network's.

mod restart;
mod store;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use super::scale::procs::{Consumers, ServerProc, cpu_seconds, wait_for};
use crate::client::Client;
use joader_core::cluster::{node_key, place};

const NODES: usize = 3;
/// Every job's batch size.
const BATCH: u64 = 16;
/// The followers' caches in parts 2 and 3, and the standalone server's: they hold the dataset.
const BIG_CACHE: u64 = 512 << 20;

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Images of the generated dataset (160×120 JPEGs).
    #[arg(long, default_value_t = 3000)]
    pub images: u32,
    /// Multi-node jobs on the same nodes in part 1 (K).
    #[arg(long, default_value_t = 4)]
    pub jobs: u32,
    /// Epochs of the throughput part (enough for the leader's CPU time to be measured over
    /// seconds).
    #[arg(long, default_value_t = 20)]
    pub epochs: u32,
    /// Where the generated images are written and reused by later runs.
    #[arg(long, default_value = "joader-bench-data/cluster")]
    pub data: PathBuf,
    /// A tiny run (CI): 120 images, 1 epoch.
    #[arg(long)]
    pub quick: bool,
    /// Part 1's follower caches (bytes or 2MiB, …); default: a quarter of the third of the
    /// dataset placed on each node, at least two batches of the largest file per job.
    #[arg(long, value_parser = server::config::parse_bytes)]
    pub part1_cache_bytes: Option<u64>,
    /// The `s3s-fs` binary of part 4 (default: `JOADER_S3S_FS`; without one, part 4 says it
    /// was not run).
    #[arg(long)]
    pub s3s_fs: Option<PathBuf>,
    /// Part 4's store latency (ms), added to every request by a delaying proxy.
    #[arg(long, default_value_t = 30)]
    pub s3_latency_ms: u64,
    /// Part 4's epochs (every one read from the store again: the followers' caches hold
    /// about a third of their share).
    #[arg(long, default_value_t = 2)]
    pub s3_epochs: u32,
    /// Part 4's photo-sized images (500x375 JPEGs).
    #[arg(long, default_value_t = 1500)]
    pub s3_images: u32,
    /// Part 4: the last N CPUs are the store's (`s3s-fs` and the delay proxy), the rest the
    /// cluster's and its ranks' (the disk rows' too), as a store on other machines would be;
    /// 0: every process shares every CPU (the store's work then slows the nodes).
    #[arg(long, default_value_t = 1)]
    pub store_cpus: usize,
    /// Part 5's epochs (the leader is restarted about a third into the run).
    #[arg(long, default_value_t = 3)]
    pub restart_epochs: u32,
    /// Part 5's training step per sample (µs) each rank sleeps; default: a rank's steps
    /// last about 2 s over the run.
    #[arg(long)]
    pub restart_step_us: Option<u64>,
}

struct Cluster {
    leader: ServerProc,
    nodes: Vec<ServerProc>,
    images: PathBuf,
}

fn job(
    name: &str,
    dataset: &str,
    world: u32,
    local: u32,
    subset: Option<Value>,
    epochs: u32,
) -> Value {
    let mut j = json!({
        "name": name, "dataset": dataset, "batch_size": BATCH, "world_size": world,
        "local_world_size": local, "epochs": epochs, "pipeline": {"kind": "raw"},
    });
    if let Some(s) = subset {
        j["subset"] = s;
    }
    j
}

/// `job` as rank `rank` registers it.
fn ranked(job: &Value, rank: usize) -> Value {
    let mut j = job.clone();
    j["rank"] = json!(rank);
    j
}

fn loads(c: &Client) -> Result<u64> {
    c.ok("GET", "/v1/stats", None)?["loads"]
        .as_u64()
        .context("no loads in /v1/stats")
}

impl Cluster {
    /// A leader and [`NODES`] followers, each follower with a cache of `node_cache` bytes;
    /// `tag` tells the clusters of one run apart.
    fn start(images: &Path, node_cache: u64, tag: &str) -> Result<Self> {
        Self::start_env(images, node_cache, tag, &[], &[])
    }

    /// [`Cluster::start`] with `env` and `more` flags for every server.
    fn start_env(
        images: &Path,
        node_cache: u64,
        tag: &str,
        env: &[(&str, &str)],
        more: &[String],
    ) -> Result<Self> {
        let roots = [images.to_owned()];
        let common = |name: &str| -> Vec<String> {
            let mut flags: Vec<String> = vec![
                "--node-name".into(),
                name.into(),
                // The bench is about placement and speed, not faults: a loaded machine must
                // not lose a node.
                "--node-timeout-ms".into(),
                "20000".into(),
                "--cache-slots".into(),
                "16384".into(),
            ];
            flags.extend_from_slice(more);
            flags
        };
        let mut extra = common("leader");
        extra.push("--leader-only".into());
        let leader =
            ServerProc::start_with(&format!("{tag}_leader"), &roots, 64 << 20, &extra, env)?;
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let mut extra = common(&format!("node-{i}"));
            extra.extend(["--leader".into(), leader.url.clone()]);
            nodes.push(ServerProc::start_with(
                &format!("{tag}_node{i}"),
                &roots,
                node_cache,
                &extra,
                env,
            )?);
        }
        Ok(Cluster {
            leader,
            nodes,
            images: images.to_owned(),
        })
    }

    /// A dataset of the folder on the leader, ready on every node.
    fn dataset(&self, name: &str) -> Result<u64> {
        self.dataset_of(name, json!({"kind": "image_folder", "path": self.images}))
    }

    /// A dataset of `source` on the leader, ready on every node.
    fn dataset_of(&self, name: &str, source: Value) -> Result<u64> {
        let c = self.leader.client();
        c.ok(
            "POST",
            "/v1/datasets",
            Some(&json!({"name": name, "source": source})),
        )?;
        let d = c.wait_ready(name, super::scale::procs::DEADLINE)?;
        wait_for(&format!("dataset {name} ready on every node"), || {
            let v = c.ok("GET", "/v1/nodes", None)?;
            let ready = v["nodes"].as_array().map_or(0, |nodes| {
                nodes
                    .iter()
                    .filter(|n| {
                        n["state"] == "alive"
                            && n["datasets"].as_array().is_some_and(|ds| {
                                ds.iter()
                                    .any(|d| d["name"] == name && d["state"] == "ready")
                            })
                    })
                    .count()
            });
            Ok((ready == NODES).then_some(()))
        })?;
        d.items.context("no items")
    }

    fn loads(&self) -> Result<u64> {
        self.nodes.iter().map(|n| loads(&n.client())).sum()
    }
}

/// Part 1's caches: `node` bytes per follower, the larger of `quarter` (a quarter of the
/// third of the dataset's `dataset` bytes placed on each node) and two batches of the
/// largest file per job.
struct Caches {
    node: u64,
    quarter: u64,
    dataset: u64,
}

/// Part 1's figures.
struct Shared {
    union: u64,
    sum: u64,
    loads: u64,
}

/// Part 2's figures.
struct Sets {
    n: u64,
    rule: u64,
    expected: f64,
    loads: u64,
}

/// Part 3's figures.
struct Speed {
    cluster: Vec<f64>,
    alone: Vec<f64>,
    dispatched: f64,
    leader_cpu: f64,
}

pub fn run(mut args: ClusterArgs) -> Result<()> {
    if args.quick {
        (args.images, args.epochs, args.s3_epochs, args.s3_images) = (120, 1, 1, 60);
    }
    if args.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    std::fs::create_dir_all(&args.data)?;
    let data = std::fs::canonicalize(&args.data)?;
    let images = data.join("images");
    let spec = crate::synth::SynthSpec {
        classes: 10,
        per_class: args.images.div_ceil(10).max(1),
        width: 160,
        height: 120,
        quality: 90,
        seed: 16,
    };
    eprintln!("generating {} images…", spec.images());
    crate::synth::generate_image_folder(&images, &spec, &mut |_| {})?;
    let out = tempfile::Builder::new()
        .prefix("joader-bench-cluster")
        .tempdir()?;
    let (dataset_bytes, largest) = folder_bytes(&images)?;
    // Part 1's caches: a quarter of what each node loads (the third of the dataset placed on
    // it), so that loading each element once per epoch needs the jobs to read it together,
    // not a cache that keeps it until the last job comes; but at least two batches of the
    // largest file for each job's rank on the node, so that no rank waits for room.
    let quarter = dataset_bytes / (4 * NODES as u64);
    let floor = 2 * u64::from(args.jobs) * BATCH * largest;
    let small = args.part1_cache_bytes.unwrap_or(quarter.max(floor));
    eprintln!("part 1: a leader and {NODES} followers with {small}-byte caches…");
    let mut cluster = Cluster::start(&images, small, "cluster1")?;
    let shared = same_nodes(&cluster, &args, out.path())?;
    let restart = restart::leader_restart(&mut cluster, &args, out.path())?;
    let caches = Caches {
        node: small,
        quarter,
        dataset: dataset_bytes,
    };
    drop(cluster);
    eprintln!("parts 2 and 3: a leader and {NODES} followers with {BIG_CACHE}-byte caches…");
    let cluster = Cluster::start(&images, BIG_CACHE, "cluster")?;
    let sets = node_sets(&cluster, out.path())?;
    let (cluster_rates, dispatched, leader_cpu) = throughput_cluster(&cluster, &args, out.path())?;
    drop(cluster);
    let alone = throughput_alone(&images, &args, out.path())?;
    let far = match crate::bench::e2e::s3::s3s_fs(args.s3s_fs.as_deref()) {
        Ok(bin) => Ok(store::object_store(
            &data,
            &bin,
            (
                args.s3_images,
                args.s3_latency_ms,
                args.s3_epochs.max(1),
                args.store_cpus,
            ),
            out.path(),
        )?),
        Err(e) => Err(format!("{e:#}")),
    };
    report(
        &args,
        &caches,
        &shared,
        &sets,
        &Speed {
            cluster: cluster_rates,
            alone,
            dispatched,
            leader_cpu,
        },
        &far,
        &restart,
    );
    Ok(())
}

fn rate(summary: &Value) -> Result<f64> {
    let samples = summary["samples"].as_f64().context("no samples")?;
    let secs = summary["elapsed_s"].as_f64().context("no elapsed_s")?;
    Ok(samples / secs.max(1e-9))
}

/// Part 1: K jobs, a rank on every node, on overlapping halves of the dataset.
fn same_nodes(c: &Cluster, args: &ClusterArgs, out: &Path) -> Result<Shared> {
    let n = c.dataset("same")?;
    let (half, step) = (n / 2, n / 8);
    let ranges: Vec<(u64, u64)> = (0..u64::from(args.jobs))
        .map(|k| {
            let start = (k * step) % (n - half + 1);
            (start, start + half)
        })
        .collect();
    let union: BTreeSet<u64> = ranges.iter().flat_map(|&(a, b)| a..b).collect();
    let sum: u64 = ranges.iter().map(|&(a, b)| b - a).sum();
    eprintln!("part 1: {} jobs on the same {NODES} nodes…", args.jobs);
    let before = c.loads()?;
    let mut consumers = Consumers::default();
    for (k, &(a, b)) in ranges.iter().enumerate() {
        let body = job(
            &format!("same{k}"),
            "same",
            NODES as u32,
            1,
            Some(json!({"start": a, "end": b})),
            1,
        );
        for r in 0..NODES {
            consumers.start_rank(
                &format!("same{k}-{r}"),
                &c.nodes[r].url,
                &ranked(&body, r),
                r as u32,
                0,
                out,
            )?;
        }
    }
    for k in 0..ranges.len() {
        for r in 0..NODES {
            consumers.finish(&format!("same{k}-{r}"))?;
        }
    }
    Ok(Shared {
        union: union.len() as u64,
        sum,
        loads: c.loads()? - before,
    })
}

/// Part 2: a job on nodes 0 and 1, a job on nodes 1 and 2, the whole dataset each.
fn node_sets(c: &Cluster, out: &Path) -> Result<Sets> {
    let n = c.dataset("sets")?;
    let keys: Vec<u64> = (0..NODES).map(|i| node_key(&format!("node-{i}"))).collect();
    let (x, y) = ([keys[0], keys[1]], [keys[1], keys[2]]);
    let mut rule = 0u64;
    for e in 0..n as u32 {
        let nx = place(&keys, &x, e).map(|i| x[i]);
        let ny = place(&keys, &y, e).map(|i| y[i]);
        rule += if nx == ny { 1 } else { 2 };
    }
    eprintln!("part 2: jobs on node sets {{0, 1}} and {{1, 2}}…");
    let before = c.loads()?;
    let mut consumers = Consumers::default();
    for (name, first) in [("setx", 0usize), ("sety", 1)] {
        let body = job(name, "sets", 2, 1, None, 1);
        for r in 0..2 {
            consumers.start_rank(
                &format!("{name}-{r}"),
                &c.nodes[first + r].url,
                &ranked(&body, r),
                r as u32,
                0,
                out,
            )?;
        }
    }
    for name in ["setx-0", "setx-1", "sety-0", "sety-1"] {
        consumers.finish(name)?;
    }
    Ok(Sets {
        n,
        rule,
        expected: n as f64 * (2.0 - 1.0 / 3.0),
        loads: c.loads()? - before,
    })
}

/// Part 3 on the cluster: per-rank samples/s, dispatched samples/s, leader CPU (cores).
fn throughput_cluster(c: &Cluster, args: &ClusterArgs, out: &Path) -> Result<(Vec<f64>, f64, f64)> {
    c.dataset("speed")?;
    eprintln!("part 3: a {NODES}-rank job on the cluster…");
    let body = job("speedc", "speed", NODES as u32, 1, None, args.epochs);
    let cpu0 = cpu_seconds(c.leader.pid())?;
    let start = Instant::now();
    let (rates, samples) = rank_per_node(c, &body, "speedc", out)?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = (cpu_seconds(c.leader.pid())? - cpu0) / secs;
    Ok((rates, samples / secs, cpu))
}

/// A rank of the job `body` on each node (`{name}-{r}`), read to its end: each rank's
/// samples/s, and the samples the ranks read together.
fn rank_per_node(c: &Cluster, body: &Value, name: &str, out: &Path) -> Result<(Vec<f64>, f64)> {
    let mut consumers = start_ranks(c, body, name, 0, out)?;
    let (mut rates, mut samples) = (Vec::new(), 0.0);
    for r in 0..NODES {
        let s = consumers.finish(&format!("{name}-{r}"))?;
        samples += s["samples"].as_f64().context("no samples")?;
        rates.push(rate(&s)?);
    }
    Ok((rates, samples))
}

/// Starts a rank of the job `body` on each node (`{name}-{r}`), each sleeping `step_us` per
/// sample.
fn start_ranks(
    c: &Cluster,
    body: &Value,
    name: &str,
    step_us: u64,
    out: &Path,
) -> Result<Consumers> {
    let mut consumers = Consumers::default();
    for r in 0..NODES {
        consumers.start_rank(
            &format!("{name}-{r}"),
            &c.nodes[r].url,
            &ranked(body, r),
            r as u32,
            step_us,
            out,
        )?;
    }
    Ok(consumers)
}

/// Part 3 on one standalone server: the same job, every rank local.
fn throughput_alone(images: &Path, args: &ClusterArgs, out: &Path) -> Result<Vec<f64>> {
    eprintln!("part 3: the same job on one standalone server…");
    let server = ServerProc::start_with(
        "cluster_alone",
        &[images.to_owned()],
        BIG_CACHE,
        &["--cache-slots".into(), "16384".into()],
        &[],
    )?;
    let c = server.client();
    let source = json!({"kind": "image_folder", "path": images});
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "speed", "source": source})),
    )?;
    c.wait_ready("speed", super::scale::procs::DEADLINE)?;
    let body = job(
        "speeda",
        "speed",
        NODES as u32,
        NODES as u32,
        None,
        args.epochs,
    );
    let mut consumers = Consumers::default();
    for r in 0..NODES {
        consumers.start_rank(
            &format!("speeda-{r}"),
            &server.url,
            &ranked(&body, r),
            r as u32,
            0,
            out,
        )?;
    }
    (0..NODES)
        .map(|r| rate(&consumers.finish(&format!("speeda-{r}"))?))
        .collect()
}

fn list(v: &[f64]) -> String {
    let v: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
    format!("[{}]", v.join(", "))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The bytes of the files under `dir` (the raw pipeline's elements), and the largest file's.
fn folder_bytes(dir: &Path) -> Result<(u64, u64)> {
    let (mut total, mut largest) = (0, 0);
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            let (t, l) = folder_bytes(&e.path())?;
            (total, largest) = (total + t, largest.max(l));
        } else {
            let len = e.metadata()?.len();
            (total, largest) = (total + len, largest.max(len));
        }
    }
    Ok((total, largest))
}

fn report(
    args: &ClusterArgs,
    c: &Caches,
    s: &Shared,
    p: &Sets,
    t: &Speed,
    far: &std::result::Result<store::Far, String>,
    restart: &restart::Restart,
) {
    let min_cluster = t.cluster.iter().copied().fold(f64::INFINITY, f64::min);
    let per_rank = min_cluster / mean(&t.alone).max(1e-9);
    let leader_per_10k = t.leader_cpu * 100.0 / (t.dispatched / 1e4).max(1e-9);
    println!(
        "joader bench cluster: a --leader-only leader and {NODES} followers on this machine \
         (loopback), {} images (160x120 JPEG, raw pipeline), batch {BATCH}\n",
        args.images
    );
    let pct = c.node as f64 * 100.0 / c.dataset.max(1) as f64;
    let rule = if c.node == c.quarter {
        "a quarter of the third of the dataset placed on each node"
    } else if c.node > c.quarter && args.part1_cache_bytes.is_none() {
        "two batches of the largest file per job: more than a quarter of each node's third of this small dataset"
    } else {
        "--part1-cache-bytes"
    };
    println!(
        "Part 1 runs on followers whose caches hold {} bytes each, {pct:.1}% of the {}-byte dataset \
         (the raw pipeline caches the files; {rule}): an element is loaded once per epoch only if the \
         jobs that need it read it while it is cached, so decodes / union measures placement and \
         sharing, not caching alone. Parts 2 and 3 run on followers with {} MiB caches, which hold \
         the dataset; part 4's (24 MiB) hold about a third of their share of its photos, so that \
         every epoch reads its store again.\n",
        c.node,
        c.dataset,
        BIG_CACHE >> 20
    );
    println!("| what | measured | reference | target |\n|---|---|---|---|");
    println!(
        "| {} multi-node jobs on the same nodes: decodes per epoch / union | {} / {} = {:.3} | sum of subsets {} ({:.2} x union); node caches {pct:.1}% of the dataset | <= 1.1 |",
        args.jobs,
        s.loads,
        s.union,
        s.loads as f64 / s.union as f64,
        s.sum,
        s.sum as f64 / s.union as f64
    );
    println!(
        "| jobs on nodes {{0,1}} and {{1,2}}: decodes per epoch | {} ({:.3} per element) | placement rule {} ({:.3}); expectation N(2 - 1/3) = {:.0} | = the rule, up to quota overflows |",
        p.loads,
        p.loads as f64 / p.n as f64,
        p.rule,
        p.rule as f64 / p.n as f64,
        p.expected
    );
    println!(
        "| per-rank samples/s: {NODES}-rank job on {NODES} nodes / on one server | {} vs {}: {per_rank:.2} (slowest rank / mean alone) | | >= 0.9 |",
        list(&t.cluster),
        list(&t.alone)
    );
    println!(
        "| leader CPU | {:.2}% of a core at {:.0} samples/s dispatched = {leader_per_10k:.2}% per 10k samples/s | | <= 5% per 10k samples/s |",
        t.leader_cpu * 100.0,
        t.dispatched
    );
    let (far_rows, far_json) =
        store::report(far.as_ref().ok(), far.as_ref().err().map_or("", |e| e));
    print!("{far_rows}");
    let (restart_row, restart_json) = restart::report(restart);
    print!("{restart_row}");
    println!(
        "{}",
        json!({
            "bench": "cluster",
            "store": far_json,
            "restart": restart_json,
            "images": args.images,
            "jobs": args.jobs,
            "same_nodes_loads": s.loads,
            "same_nodes_union": s.union,
            "same_nodes_sum": s.sum,
            "same_nodes_node_cache_bytes": c.node,
            "dataset_bytes": c.dataset,
            "node_sets_loads": p.loads,
            "node_sets_rule": p.rule,
            "node_sets_expected": p.expected,
            "cluster_rank_samples_per_s": t.cluster,
            "alone_rank_samples_per_s": t.alone,
            "per_rank_ratio": per_rank,
            "dispatched_samples_per_s": t.dispatched,
            "leader_cpu_cores": t.leader_cpu,
            "leader_cpu_percent_per_10k": leader_per_10k,
        })
    );
}
