//! `joader bench scale`: what an ImageNet-size dataset and 64 jobs cost the server, measured
//! from outside on real `joader serve` processes (`/proc/<pid>`: `RssAnon`, CPU time), and
//! whether fast jobs keep their pace beside slow, paused and never-attached ones on a small
//! cache.
//!
//! 1. A manifest of `--items` entries (1,281,167: ImageNet-1k train), each a distinct hard
//!    link to one of a few small JPEGs, is indexed: time until `ready` (indexing and
//!    persisting), `RssAnon` growth per item.
//! 2. `--jobs` jobs with `{"fraction": …}` subsets are registered one after the other: total
//!    time, `RssAnon` growth per job; then the server's CPU over `--idle-seconds` (by default
//!    5,000 clock ticks: the kernel counts CPU time in whole ticks, so that the 1% target is
//!    50 of them and the figure's resolution 0.02%).
//! 3. On a generated dataset of 500×375 JPEGs with the decode pipeline (resize 256, center
//!    crop 224) and batches of 32: one fast job alone, then the mix (fast, 1/10-speed, paused
//!    mid-epoch, never attached) on a server whose cache holds the paused jobs' rings plus two
//!    batches per attached job, then the fast job alone again. Each fast job's rate is compared
//!    with the mean of the two rates alone (measured before and after, so that a change in the
//!    machine's load during the run shows as a difference between the two).

pub(crate) mod procs;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::client::Client;
use procs::{Consumers, ServerProc, cpu_seconds, wait_for};

/// Bytes of one prepared element: 224 × 224 × 3.
const ELEMENT_BYTES: u64 = 224 * 224 * 3;
const BATCH: u64 = 32;
/// The server's default ring capacity for a batch of 32: `max(2 × batch, 64)`.
const RING: u64 = 64;

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Entries of the generated manifest (ImageNet-1k train has 1,281,167).
    #[arg(long, default_value_t = 1_281_167)]
    pub items: u64,
    /// Index this manifest (CSV or JSON lines) instead of a generated one; its folder is the
    /// allowed root.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Jobs registered on the large dataset, with fractions 1/8, 2/8, …, 8/8 in turn.
    #[arg(long, default_value_t = 64)]
    pub jobs: u32,
    /// Seconds over which the idle server's CPU is measured (default: 5,000 clock ticks, so that
    /// the 1% target is 50 ticks; 50 s at 100 ticks per second).
    #[arg(long)]
    pub idle_seconds: Option<f64>,
    /// Images (500×375 JPEGs) of the mix's dataset: by default about four times what the
    /// mix's cache holds, so that a job alone is not served from a cache holding its whole
    /// dataset.
    #[arg(long, default_value_t = 8000)]
    pub mix_images: u32,
    /// Jobs of the mix: fast, slow (1/10 of the fast rate alone), paused mid-epoch, never
    /// attached.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 8, 8, 40])]
    pub mix: Vec<u32>,
    /// Epochs each fast job reads, alone and in the mix.
    #[arg(long, default_value_t = 2)]
    pub epochs: u32,
    /// Where generated data is written and reused by later runs.
    #[arg(long, default_value = "joader-bench-data/scale")]
    pub data: PathBuf,
    /// A tiny run (CI): 5,000 entries, 8 jobs, 1 s idle, a mix of 1/1/1/2 jobs on 40 small
    /// images for 2 epochs.
    #[arg(long)]
    pub quick: bool,
}

/// Figures of the index and job-state part.
struct StateFigures {
    items: u64,
    ready_s: f64,
    rss_per_item: f64,
    index_per_item: f64,
    jobs: u32,
    register_s: f64,
    register_max_ms: f64,
    rss_per_job: f64,
    idle_cpu_percent: f64,
    /// The idle window, seconds, and the server's CPU over it in clock ticks.
    idle_seconds: f64,
    idle_ticks: u64,
}

/// One run of a fast job alone.
struct AloneRun {
    samples_per_s: f64,
    hit_ratio: f64,
    /// Its wait for its first batch, seconds.
    first_wait: f64,
    /// Its longest wait for one later batch, seconds.
    longest_wait: f64,
    /// Its time attached with nothing to read (the server's count), seconds of `secs`.
    stall: f64,
    secs: f64,
}

/// Figures of the mix.
struct MixFigures {
    cache_bytes: u64,
    alone: f64,
    alone_before_after: (f64, f64),
    /// The job alone's first run (before the mix).
    first_alone: AloneRun,
    fast: Vec<f64>,
    /// Each fast job's longest wait for one batch after its first, seconds.
    longest_wait: Vec<f64>,
    /// Each fast job's wait for its first batch, seconds.
    first_wait: Vec<f64>,
    fast_hits: Vec<f64>,
    /// Seconds from the start of the slow and fast jobs to the end of the last fast one.
    mix_s: f64,
    /// Each fast job's time attached with nothing to read (the server's count).
    stall: Vec<f64>,
    slow: Vec<f64>,
    slow_hits: Vec<f64>,
    slow_target: f64,
    reloads: u64,
    evictions_needed: u64,
    /// Deliveries (cache requests) and decodes during the mix.
    deliveries: u64,
    decodes: u64,
}

pub fn run(mut args: ScaleArgs) -> Result<()> {
    if args.quick {
        (args.items, args.jobs, args.idle_seconds) = (5_000, 8, Some(1.0));
        (args.mix_images, args.mix, args.epochs) = (40, vec![1, 1, 1, 2], 2);
    }
    if args.mix.len() != 4 {
        bail!("--mix takes four numbers: fast,slow,paused,never");
    }
    std::fs::create_dir_all(&args.data)?;
    let data = std::fs::canonicalize(&args.data)?;
    let state = index_and_jobs(&args, &data)?;
    let mix = mix(&args, &data)?;
    report(&args, &state, &mix);
    Ok(())
}

fn index_and_jobs(args: &ScaleArgs, data: &Path) -> Result<StateFigures> {
    let manifest = match &args.manifest {
        Some(m) => std::fs::canonicalize(m)?,
        None => {
            eprintln!("generating a manifest of {} hard links…", args.items);
            procs::generate_manifest(&data.join("manifest"), args.items)?
        }
    };
    let root = manifest.parent().context("the manifest has no folder")?;
    let server = ServerProc::start("index", &[root.to_owned()], 64 << 20)?;
    let c = server.client();
    c.ok("GET", "/healthz", None)?;
    let rss0 = server.settled_rss()?;
    eprintln!("indexing {}…", manifest.display());
    let start = Instant::now();
    let source = json!({"kind": "manifest", "path": manifest});
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "large", "source": source})),
    )?;
    let ds = c.wait_ready("large", procs::DEADLINE)?;
    let ready_s = start.elapsed().as_secs_f64();
    let items = ds.items.context("no items")?;
    let index_bytes = ds.index_bytes.context("no index_bytes")?;
    let rss1 = server.settled_rss()?;

    eprintln!("registering {} jobs…", args.jobs);
    let (mut register_s, mut register_max_ms) = (0.0f64, 0.0f64);
    let mut last_registration = Instant::now();
    for i in 0..args.jobs {
        let fraction = f64::from(i % 8 + 1) / 8.0;
        let job = json!({
            "name": format!("large-{i}"), "dataset": "large", "batch_size": BATCH,
            "seed": i, "subset": {"fraction": fraction, "seed": i},
        });
        let t = Instant::now();
        c.ok("POST", "/v1/jobs", Some(&job))?;
        let s = t.elapsed().as_secs_f64();
        register_s += s;
        register_max_ms = register_max_ms.max(s * 1e3);
        last_registration = Instant::now();
    }
    let rss2 = server.settled_rss()?;

    // Idle means settled: for its first 2 s a new job's attach is watched at the Cache's fast
    // tick (so that a client attaching at once is served at once).
    let settle = (last_registration + IDLE_SETTLE).saturating_duration_since(Instant::now());
    std::thread::sleep(settle);
    let window = args
        .idle_seconds
        .unwrap_or(IDLE_TICKS as f64 / ticks_per_second());
    eprintln!("idle CPU over {window} s…");
    let cpu0 = cpu_seconds(server.pid())?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(window));
    let used = cpu_seconds(server.pid())? - cpu0;
    let idle_seconds = t.elapsed().as_secs_f64();
    let idle = used / idle_seconds;
    Ok(StateFigures {
        items,
        ready_s,
        rss_per_item: rss1.saturating_sub(rss0) as f64 / items as f64,
        index_per_item: index_bytes as f64 / items as f64,
        jobs: args.jobs,
        register_s,
        register_max_ms,
        rss_per_job: rss2.saturating_sub(rss1) as f64 / f64::from(args.jobs.max(1)),
        idle_cpu_percent: idle * 100.0,
        idle_seconds,
        idle_ticks: (used * ticks_per_second()).round() as u64,
    })
}

fn pipeline() -> Value {
    json!({"kind": "decode", "resize_shorter": 256, "center_crop": [224, 224]})
}

fn mix_job(name: &str, seed: u64, epochs: Option<u32>) -> Value {
    json!({
        "name": name, "dataset": "mix", "batch_size": BATCH, "seed": seed,
        "epochs": epochs, "pipeline": pipeline(),
    })
}

/// A server with the mix's dataset indexed.
fn mix_server(tag: &str, images: &Path, cache_bytes: u64) -> Result<ServerProc> {
    let server = ServerProc::start(tag, &[images.to_owned()], cache_bytes)?;
    let source = json!({"kind": "image_folder", "path": images});
    server.client().ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "mix", "source": source})),
    )?;
    server.client().wait_ready("mix", procs::DEADLINE)?;
    Ok(server)
}

/// How long after the last registration the idle CPU is measured from (the Cache watches a
/// new job's attach at its fast tick for 2 s).
const IDLE_SETTLE: Duration = Duration::from_secs(3);

/// The default idle window in clock ticks: the 1% target is 50 of them.
const IDLE_TICKS: u64 = 5_000;

fn ticks_per_second() -> f64 {
    procfs::ticks_per_second().max(1) as f64
}

fn job_field(c: &Client, name: &str, field: &str) -> Result<f64> {
    let j = c.ok("GET", &format!("/v1/jobs/{name}"), None)?;
    j[field]
        .as_f64()
        .with_context(|| format!("job {name} has no {field}: {j}"))
}

/// `field` of each job of `names`.
fn job_fields(c: &Client, names: &[String], field: &str) -> Result<Vec<f64>> {
    names.iter().map(|n| job_field(c, n, field)).collect()
}

fn wait(summary: &Value, key: &str) -> Result<f64> {
    summary[key]
        .as_f64()
        .with_context(|| format!("no {key} in {summary}"))
}

fn rate(summary: &Value) -> Result<f64> {
    let samples = summary["samples"].as_f64().context("no samples")?;
    let secs = summary["elapsed_s"].as_f64().context("no elapsed_s")?;
    Ok(samples / secs.max(1e-9))
}

fn mix(args: &ScaleArgs, data: &Path) -> Result<MixFigures> {
    let [fast, slow, paused, never] = [args.mix[0], args.mix[1], args.mix[2], args.mix[3]];
    let images = data.join("mix");
    let (w, h) = if args.quick { (160, 120) } else { (500, 375) };
    let spec = crate::synth::SynthSpec {
        classes: 10,
        per_class: args.mix_images.div_ceil(10).max(1),
        width: w,
        height: h,
        quality: 90,
        seed: 2022,
    };
    eprintln!("generating {} images of {w}x{h}…", spec.images());
    crate::synth::generate_image_folder(&images, &spec, &mut |_| {})?;
    // From the page cache in every run: the first run alone would otherwise pay cold reads.
    super::warm_page_cache(&images)?;
    let attached = u64::from(fast + slow + paused);
    let cache_bytes = (u64::from(paused) * RING + 2 * BATCH * attached) * ELEMENT_BYTES;
    let out = tempfile::Builder::new()
        .prefix("joader-bench-scale-consumers")
        .tempdir()?;

    let run_alone = || -> Result<AloneRun> {
        eprintln!("one fast job alone…");
        let server = mix_server("alone", &images, cache_bytes)?;
        let mut consumers = Consumers::default();
        consumers.start(
            &server.url,
            &mix_job("alone", 0, Some(args.epochs)),
            0,
            out.path(),
        )?;
        let summary = consumers.finish("alone")?;
        let c = server.client();
        Ok(AloneRun {
            samples_per_s: rate(&summary)?,
            hit_ratio: job_field(&c, "alone", "hit_ratio")?,
            first_wait: wait(&summary, "first_wait_s")?,
            longest_wait: wait(&summary, "longest_wait_s")?,
            stall: job_field(&c, "alone", "stall_s")?,
            secs: summary["elapsed_s"].as_f64().context("no elapsed_s")?,
        })
    };
    let first_alone = run_alone()?;

    eprintln!("the mix: {fast} fast, {slow} slow, {paused} paused, {never} never attached…");
    let server = mix_server("mix", &images, cache_bytes)?;
    let c = server.client();
    for i in 0..never {
        let reg = c.ok(
            "POST",
            "/v1/jobs",
            Some(&mix_job(&format!("never-{i}"), 100 + u64::from(i), None)),
        )?;
        if reg["ranks"][0]["capacity"].as_u64() != Some(RING) {
            bail!("the ring capacity is not {RING}: {reg}");
        }
    }
    let mut consumers = Consumers::default();
    let paused_names: Vec<String> = (0..paused).map(|i| format!("paused-{i}")).collect();
    for (i, name) in paused_names.iter().enumerate() {
        consumers.start(
            &server.url,
            &mix_job(name, 200 + i as u64, None),
            0,
            out.path(),
        )?;
    }
    // Each paused job stops once it has read two batches: mid-epoch, its ring full.
    let mut running = paused_names.clone();
    wait_for("the paused jobs to read two batches each", || {
        let mut still = Vec::new();
        for name in running.drain(..) {
            match job_field(&c, &name, "acknowledged") {
                Ok(a) if a >= (2 * BATCH) as f64 => consumers.pause(&name)?,
                _ => still.push(name),
            }
        }
        running = still;
        Ok(running.is_empty().then_some(()))
    })?;
    let stats0 = c.ok("GET", "/v1/stats", None)?;
    let sample_us = (10.0 * 1e6 / first_alone.samples_per_s.max(1e-3)) as u64;
    let slow_names: Vec<String> = (0..slow).map(|i| format!("slow-{i}")).collect();
    let fast_names: Vec<String> = (0..fast).map(|i| format!("fast-{i}")).collect();
    let start = Instant::now();
    for (i, name) in slow_names.iter().enumerate() {
        let job = mix_job(name, 300 + i as u64, None);
        consumers.start(&server.url, &job, sample_us, out.path())?;
    }
    for (i, name) in fast_names.iter().enumerate() {
        let job = mix_job(name, 400 + i as u64, Some(args.epochs));
        consumers.start(&server.url, &job, 0, out.path())?;
    }
    let mut fast_rates = Vec::new();
    let mut longest_waits = Vec::new();
    let mut first_waits = Vec::new();
    for name in &fast_names {
        let summary = consumers.finish(name)?;
        fast_rates.push(rate(&summary)?);
        longest_waits.push(wait(&summary, "longest_wait_s")?);
        first_waits.push(wait(&summary, "first_wait_s")?);
    }
    let secs = start.elapsed().as_secs_f64();
    let stats1 = c.ok("GET", "/v1/stats", None)?;
    let stall = job_fields(&c, &fast_names, "stall_s")?;
    let fast_hits = job_fields(&c, &fast_names, "hit_ratio")?;
    let slow_hits = job_fields(&c, &slow_names, "hit_ratio")?;
    let slow_rates = slow_names
        .iter()
        .map(|n| Ok(job_field(&c, n, "acknowledged")? / secs))
        .collect::<Result<Vec<_>>>()?;
    let delta = |k: &str| {
        let get = |s: &Value| {
            s[k].as_u64()
                .with_context(|| format!("no {k} in /v1/stats"))
        };
        Ok::<u64, anyhow::Error>(get(&stats1)?.saturating_sub(get(&stats0)?))
    };
    drop(consumers);
    drop(server);
    let (alone, after) = (first_alone.samples_per_s, run_alone()?.samples_per_s);
    let mean = (alone + after) / 2.0;
    for r in &mut fast_rates {
        *r /= mean.max(1e-9);
    }
    Ok(MixFigures {
        cache_bytes,
        alone: mean,
        alone_before_after: (alone, after),
        first_alone,
        fast: fast_rates,
        longest_wait: longest_waits,
        first_wait: first_waits,
        fast_hits,
        mix_s: secs,
        stall,
        slow: slow_rates,
        slow_hits,
        slow_target: 1e6 / sample_us.max(1) as f64,
        reloads: delta("reloads")?,
        evictions_needed: delta("evictions_needed")?,
        deliveries: delta("requests")?,
        decodes: delta("decodes")?,
    })
}

fn list(v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter()
        .map(|x| format!("{x:.digits$}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn report(args: &ScaleArgs, s: &StateFigures, m: &MixFigures) {
    let [fast, slow, paused, never] = [args.mix[0], args.mix[1], args.mix[2], args.mix[3]];
    let attached = fast + slow + paused;
    let mb = |b: f64| b / 1e6;
    let rss_total = s.rss_per_item * s.items as f64;
    println!(
        "joader bench scale: {} manifest entries, {} jobs; mix of {fast} fast, {slow} slow, \
         {paused} paused, {never} never-attached jobs on {} images, decode -> resize 256, \
         center crop 224 ({ELEMENT_BYTES} B an element), batch {BATCH}, {} epochs\n",
        s.items, s.jobs, args.mix_images, args.epochs
    );
    println!("| what | measured | target |\n|---|---|---|");
    println!(
        "| index: time until ready (index + persist) | {:.1} s | <= 10 s |",
        s.ready_s
    );
    println!(
        "| index: RssAnon growth | {:.1} B/item ({:.1} MB); the index's columns {:.1} B/item | <= 120 MB for 1,281,167 (93.7 B/item) |",
        s.rss_per_item,
        mb(rss_total),
        s.index_per_item
    );
    println!(
        "| registration of {} jobs (fractions 1/8..8/8) | {:.2} s in total, slowest {:.0} ms | <= 10 s in total |",
        s.jobs, s.register_s, s.register_max_ms
    );
    println!(
        "| RssAnon growth per registered job | {:.2} MB ({} jobs: {:.1} MB) | 64 jobs <= 150 MB |",
        mb(s.rss_per_job),
        s.jobs,
        mb(s.rss_per_job * f64::from(s.jobs))
    );
    println!(
        "| idle CPU with {} registered jobs (from 3 s after the last registration) | {:.2}% of a core ({} clock ticks of 1/{:.0} s over {:.1} s; 1% is {:.0} ticks) | <= 1% |",
        s.jobs,
        s.idle_cpu_percent,
        s.idle_ticks,
        ticks_per_second(),
        s.idle_seconds,
        s.idle_seconds * ticks_per_second() / 100.0
    );
    println!(
        "| mix: cache bytes | {} = ({paused} paused rings x {RING} + 2 x {BATCH} x {attached} attached jobs) x {ELEMENT_BYTES} | |",
        m.cache_bytes
    );
    println!(
        "| mix: a fast job alone | {:.0} samples/s (before the mix {:.0}, after {:.0}; hit ratio {:.2}) | |",
        m.alone, m.alone_before_after.0, m.alone_before_after.1, m.first_alone.hit_ratio
    );
    println!(
        "| mix: fast jobs' rate / rate alone | {} (min {:.2}) | >= 0.9 |",
        list(&m.fast, 2),
        min(&m.fast)
    );
    println!(
        "| mix: fast jobs' wait for their first batch | {} s (alone: {:.2} s; the server's start window included) | |",
        list(&m.first_wait, 2),
        m.first_alone.first_wait,
    );
    println!(
        "| mix: fast jobs' longest wait for one later batch | {} s (alone: {:.2} s) | |",
        list(&m.longest_wait, 2),
        m.first_alone.longest_wait
    );
    println!(
        "| mix: fast jobs' time attached with nothing to read | {} s of {:.1} s (alone: {:.1} s of {:.1} s; a reader faster than the server always waits) | |",
        list(&m.stall, 1),
        m.mix_s,
        m.first_alone.stall,
        m.first_alone.secs
    );
    println!(
        "| mix: fast jobs' hit ratio | {} | |",
        list(&m.fast_hits, 2)
    );
    println!(
        "| mix: slow jobs (1/10 speed) | {} samples/s (their pace allows {:.0}); hit ratio {} | |",
        list(&m.slow, 0),
        m.slow_target,
        list(&m.slow_hits, 2)
    );
    println!(
        "| mix: reloads / evictions_needed | {} / {} | |",
        m.reloads, m.evictions_needed
    );
    println!(
        "| mix: decodes / deliveries | {} / {} = {:.3} (1: no sharing) | |",
        m.decodes,
        m.deliveries,
        m.decodes as f64 / m.deliveries.max(1) as f64,
    );
    println!(
        "{}",
        json!({
            "bench": "scale",
            "items": s.items,
            "ready_s": s.ready_s,
            "rss_bytes_per_item": s.rss_per_item,
            "index_bytes_per_item": s.index_per_item,
            "jobs": s.jobs,
            "register_total_s": s.register_s,
            "register_max_ms": s.register_max_ms,
            "rss_bytes_per_job": s.rss_per_job,
            "idle_cpu_percent": s.idle_cpu_percent,
            "idle_seconds": s.idle_seconds,
            "idle_ticks": s.idle_ticks,
            "cache_bytes": m.cache_bytes,
            "alone_samples_per_s": m.alone,
            "alone_before_after_samples_per_s": [m.alone_before_after.0, m.alone_before_after.1],
            "alone_hit_ratio": m.first_alone.hit_ratio,
            "fast_hit_ratio": m.fast_hits,
            "fast_fraction_of_alone": m.fast,
            "fast_stall_s": m.stall,
            "fast_longest_wait_s": m.longest_wait,
            "alone_longest_wait_s": m.first_alone.longest_wait,
            "fast_first_wait_s": m.first_wait,
            "alone_first_wait_s": m.first_alone.first_wait,
            "alone_stall_s": m.first_alone.stall,
            "mix_s": m.mix_s,
            "slow_samples_per_s": m.slow,
            "slow_hit_ratio": m.slow_hits,
            "reloads": m.reloads,
            "evictions_needed": m.evictions_needed,
            "mix_deliveries": m.deliveries,
            "mix_decodes": m.decodes,
        })
    );
}
