//! The systems `joader bench e2e` compares on each scenario, all with the training recipe
//! (decode, resize the shorter side to 256, then per job RandomResizedCrop(224) + flip):
//! joader (an in-process server, one Rust consumer thread per job that augments what it
//! reads), the Python client (one `joader.Loader` process per job, same server), independent
//! loading (each job's own order read, decoded and resized by the same code on the same shared
//! threads, augmented on the job's thread) and PyTorch's DataLoader, tuned; and the Python
//! client's training loop from cache.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::unbounded;
use dataplane::Format;
use dataplane::augment::{Augmenter, ItemOut, Output as AugOutput, RandomResizedCrop, item_key};
use joader_pipeline::{self as pipeline, Limits};
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::Xoshiro256PlusPlus};
use serde_json::json;

use super::Ctx;
use super::scenarios::{Scenario, wait_start};
use crate::client::{Client, ReadOptions, consume};
use crate::inprocess::ServerHandle;
use server::Config;
use server::procstat::process_cpu;

/// The PyTorch job, run with `python3 -c`.
const TORCH_SCRIPT: &str = include_str!("torch_baseline.py");
/// The Python client's job, run with `python3 -c`.
const PYTHON_SCRIPT: &str = include_str!("joader_python.py");

/// The per-job augmentation of the recipe.
fn recipe_aug() -> RandomResizedCrop {
    RandomResizedCrop::new(224, 224)
}

#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub(super) system: &'static str,
    pub(super) per_job: Vec<f64>,
    pub(super) aggregate: f64,
    pub(super) cpu_ms_per_sample: f64,
    pub(super) decodes_per_sample: f64,
    pub(super) hit_ratio: Option<f64>,
    /// Mean time from a job's start to its first batch (processes: after the imports).
    pub(super) startup_s: Option<f64>,
    /// Fraction of the loop's time spent waiting for the next batch (Python client).
    pub(super) wait_frac: Option<f64>,
}

pub(super) fn summarize(
    system: &'static str,
    spans: &[(u64, Instant, Instant)],
    cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let zero = spans.iter().map(|s| s.1).min().unwrap_or_else(Instant::now);
    let secs: Vec<(u64, f64, f64)> = spans
        .iter()
        .map(|s| {
            let at = |i: Instant| i.duration_since(zero).as_secs_f64();
            (s.0, at(s.1), at(s.2))
        })
        .collect();
    summarize_secs(system, &secs, cpu, decodes, hit)
}

/// `spans` are (samples, start, end) in seconds on one clock.
fn summarize_secs(
    system: &'static str,
    spans: &[(u64, f64, f64)],
    cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let total: u64 = spans.iter().map(|s| s.0).sum();
    let first = spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    let last = spans.iter().map(|s| s.2).fold(f64::NEG_INFINITY, f64::max);
    let wall = (last - first).max(1e-9);
    Outcome {
        system,
        per_job: spans
            .iter()
            .map(|s| s.0 as f64 / (s.2 - s.1).max(1e-9))
            .collect(),
        aggregate: total as f64 / wall,
        cpu_ms_per_sample: cpu * 1e3 / total.max(1) as f64,
        decodes_per_sample: decodes / total.max(1) as f64,
        hit_ratio: hit,
        startup_s: None,
        wait_frac: None,
    }
}

/// An in-process server with the dataset registered and indexed.
fn start_server(ctx: &Ctx, tag: &str) -> Result<(ServerHandle, Client, tempfile::TempDir)> {
    start_server_with(ctx, tag, ctx.cache_bytes)
}

fn start_server_with(
    ctx: &Ctx,
    tag: &str,
    cache_bytes: u64,
) -> Result<(ServerHandle, Client, tempfile::TempDir)> {
    let state = tempfile::Builder::new().prefix("joader-e2e-").tempdir()?;
    let config = Config {
        bind: "127.0.0.1:0".parse()?,
        data_dir: state.path().to_path_buf(),
        instance: format!("e2e_{}_{tag}", std::process::id()),
        cache_bytes,
        cache_slots: 8192,
        allowed_roots: vec![ctx.root.clone()],
        loader_workers: ctx.workers,
        ..Config::default()
    };
    let server = ServerHandle::spawn(config)?;
    let client = Client::new(server.url.clone());
    client.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "d", "source": {"kind": "image_folder", "path": ctx.root}})),
    )?;
    client.wait_ready("d", Duration::from_secs(120))?;
    Ok((server, client, state))
}

pub(super) fn run_joader(sc: &Scenario, ctx: &Ctx, tag: usize) -> Result<Outcome> {
    let (server, client, _state) = start_server(ctx, &format!("r{tag}"))?;
    let cpu0 = process_cpu();
    let runs = run_jobs(&client, sc)?;
    let cpu = process_cpu() - cpu0;
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    Ok(summarize_runs(
        "joader",
        &runs,
        cpu,
        stats["decodes"].as_f64().unwrap_or(0.0),
        stats["hit_ratio"].as_f64(),
    ))
}

/// One job of [`run_jobs`], timed like the Python client and PyTorch from its first batch: from
/// the end of it (`samples` counts the samples after it), its start-up (registration, attach,
/// the Sampler's start window, the first loads and that batch) apart.
pub(super) struct JobRun {
    pub(super) samples: u64,
    pub(super) first: Instant,
    pub(super) end: Instant,
    pub(super) startup: Duration,
    /// Every sample it received, the first batch's included.
    pub(super) delivered: u64,
}

/// [`summarize`] of [`JobRun`]s: the server's decodes are scaled to the samples timed (they
/// include the first batches), and the mean start-up is reported.
pub(super) fn summarize_runs(
    system: &'static str,
    runs: &[JobRun],
    cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let spans: Vec<(u64, Instant, Instant)> =
        runs.iter().map(|r| (r.samples, r.first, r.end)).collect();
    let timed: u64 = runs.iter().map(|r| r.samples).sum();
    let delivered: u64 = runs.iter().map(|r| r.delivered).sum();
    let decodes = decodes * timed as f64 / delivered.max(1) as f64;
    let mut o = summarize(system, &spans, cpu, decodes, hit);
    o.startup_s =
        Some(runs.iter().map(|r| r.startup.as_secs_f64()).sum::<f64>() / runs.len().max(1) as f64);
    o
}

/// Runs the jobs of `sc` on the server of `client` with the training recipe, one consumer
/// thread each (the client's augmentation included): see [`JobRun`].
pub(super) fn run_jobs(client: &Client, sc: &Scenario) -> Result<Vec<JobRun>> {
    let lead = AtomicU64::new(0);
    let lead_done = AtomicU64::new(0);
    let runs: Vec<Result<JobRun>> = std::thread::scope(|s| {
        let handles: Vec<_> = sc
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let (lead, lead_done) = (&lead, &lead_done);
                s.spawn(move || -> Result<JobRun> {
                    wait_start(job.start_frac, lead, u64::from(sc.jobs[0].subset.len() as u32), lead_done);
                    let start = Instant::now();
                    let reg = client.ok(
                        "POST",
                        "/v1/jobs",
                        Some(&json!({"name": format!("j{i}"), "dataset": "d", "batch_size": sc.batch, "epochs": 1, "seed": i,
                            "ring_capacity": 2 * sc.batch, "pipeline": recipe_pipeline(),
                            "subset": {"start": job.subset.start, "end": job.subset.end}})),
                    )?;
                    let inst = reg["ranks"][0]["instance"].as_str().context("instance")?.to_string();
                    let ring = reg["ranks"][0]["ring"].as_str().context("ring")?.to_string();
                    let per = Duration::from_secs_f64(job.sleep_ms / 1e3);
                    let (aug, mut augmenter) = (recipe_aug(), Augmenter::default());
                    let mut out = vec![0u8; 224 * 224 * 3];
                    let mut failed = None;
                    let mut first: Option<(Instant, u64)> = None;
                    let got = consume(
                        &inst,
                        &ring,
                        ReadOptions { batch: sc.batch, max_samples: None, hold: Duration::ZERO },
                        |n, _| per * n as u32,
                        |n| {
                            first.get_or_insert_with(|| (Instant::now(), n));
                            if i == 0 {
                                lead.store(n, Relaxed);
                            }
                        },
                        |meta, data| {
                            if let Format::HwcU8 { height, width, channels } = meta.format {
                                let key = item_key(i as u64, meta.epoch, meta.position);
                                let r = augmenter.write(data, (height, width, channels), Some(&aug), key,
                                    &AugOutput::U8Nhwc, ItemOut::U8(&mut out[..(224 * 224 * channels) as usize]), false);
                                if let Err(e) = r {
                                    failed.get_or_insert(e);
                                }
                            }
                        },
                    )?;
                    if let Some(e) = failed {
                        anyhow::bail!("augmentation failed: {e}");
                    }
                    if i == 0 {
                        lead_done.store(1, Relaxed);
                    }
                    let end = Instant::now();
                    let (first, before) = first.unwrap_or((end, got.samples));
                    Ok(JobRun {
                        samples: got.samples - before,
                        first,
                        end,
                        startup: first - start,
                        delivered: got.samples,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a consumer panicked")))
            })
            .collect()
    });
    runs.into_iter().collect()
}

/// Independent loading, built like joader's side of the comparison: each job shuffles its
/// subset and has every element of it read, decoded and resized by `workers` threads that
/// all jobs share (joader's Loader threads), then augments it on its own thread (joader's
/// consumer thread), with at most two batches in flight per job (what its ring holds). The
/// jobs submit to one FIFO queue, so the workers stay busy at any K and serve the jobs in
/// turn, and each system has the same threads: `workers` + one per job.
pub(super) fn run_independent(sc: &Scenario, ctx: &Ctx) -> Result<Outcome> {
    type Prepared = Option<(Vec<u8>, (u32, u32, u32))>;
    let (task_tx, task_rx) = unbounded::<(usize, u32)>();
    let k = sc.jobs.len();
    let done: Vec<_> = (0..k).map(|_| unbounded::<Prepared>()).collect();
    let decodes = AtomicU64::new(0);
    let lead = AtomicU64::new(0);
    let lead_done = AtomicU64::new(0);
    let limits = Limits {
        max_pixels: 100_000_000,
    };
    let cpu0 = process_cpu();
    let spans = std::thread::scope(|s| -> Result<Vec<(u64, Instant, Instant)>> {
        for _ in 0..ctx.workers {
            let (task_rx, done, decodes, limits) = (task_rx.clone(), &done, &decodes, &limits);
            s.spawn(move || {
                while let Ok((job, e)) = task_rx.recv() {
                    let prepared = ctx
                        .index
                        .read(e)
                        .ok()
                        .and_then(|b| pipeline::run(&ctx.pipeline, &b, limits).ok());
                    decodes.fetch_add(1, Relaxed);
                    let out = match prepared {
                        Some(pipeline::Output::Hwc {
                            data,
                            height,
                            width,
                            channels,
                        }) => Some((data, (height, width, channels))),
                        _ => None,
                    };
                    let _ = done[job].0.send(out);
                }
            });
        }
        let handles: Vec<_> = sc
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let (task_tx, done_rx, lead, lead_done) =
                    (task_tx.clone(), done[i].1.clone(), &lead, &lead_done);
                s.spawn(move || -> Result<(u64, Instant, Instant)> {
                    // Job 0 releases the late jobs however it ends.
                    let _release = (i == 0).then(|| Release(lead_done));
                    wait_start(
                        job.start_frac,
                        lead,
                        u64::from(sc.jobs[0].subset.len() as u32),
                        lead_done,
                    );
                    let start = Instant::now();
                    let mut order: Vec<u32> = job.subset.clone().collect();
                    order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(i as u64));
                    let n = order.len() as u64;
                    let mut next = order.into_iter();
                    for e in next.by_ref().take(2 * sc.batch) {
                        task_tx.send((i, e))?;
                    }
                    let (aug, mut augmenter) = (recipe_aug(), Augmenter::default());
                    let mut out = vec![0u8; 224 * 224 * 3];
                    let per = Duration::from_secs_f64(job.sleep_ms / 1e3);
                    for got in 0..n {
                        let (data, (h, w, c)) = done_rx
                            .recv()?
                            .context("an element could not be read or decoded")?;
                        if let Some(e) = next.next() {
                            task_tx.send((i, e))?;
                        }
                        augmenter.write(
                            &data,
                            (h, w, c),
                            Some(&aug),
                            item_key(i as u64, 0, got),
                            &AugOutput::U8Nhwc,
                            ItemOut::U8(&mut out[..(224 * 224 * c) as usize]),
                            false,
                        )?;
                        if !per.is_zero() {
                            std::thread::sleep(per);
                        }
                        if i == 0 {
                            lead.store(got + 1, Relaxed);
                        }
                    }
                    Ok((n, start, Instant::now()))
                })
            })
            .collect();
        drop(task_tx);
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a job panicked")))
            })
            .collect()
    })?;
    let cpu = process_cpu() - cpu0;
    Ok(summarize(
        "independent",
        &spans,
        cpu,
        decodes.load(Relaxed) as f64,
        None,
    ))
}

/// Marks job 0 as done when dropped.
struct Release<'a>(&'a AtomicU64);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.store(1, Relaxed);
    }
}

/// The shared part of the recipe, as a job's `pipeline`.
pub(super) fn recipe_pipeline() -> serde_json::Value {
    json!({"kind": "decode", "resize_shorter": 256})
}

pub(super) fn torch_available() -> bool {
    python_imports("import torch, torchvision, PIL")
}

pub(super) fn python_client_available() -> bool {
    python_imports("import joader")
}

fn python_imports(code: &str) -> bool {
    std::process::Command::new("python3")
        .args(["-c", code])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One Python process per job, started after its scenario delay (a fraction of job 0's epoch
/// time alone, measured first); each prints the JSON line its script documents.
fn run_processes(
    sc: &Scenario,
    epoch_alone_s: f64,
    args: impl Fn(usize, &super::scenarios::JobPlan) -> Vec<String>,
) -> Result<Vec<serde_json::Value>> {
    let t0 = Instant::now();
    let children: Vec<_> = sc
        .jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            std::thread::sleep(Duration::from_secs_f64(
                (job.start_frac * epoch_alone_s - t0.elapsed().as_secs_f64()).max(0.0),
            ));
            std::process::Command::new("python3")
                .args(args(i, job))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        })
        .collect();
    let mut out = Vec::new();
    for child in children {
        let o = child?.wait_with_output()?;
        anyhow::ensure!(
            o.status.success(),
            "a Python job failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let line = String::from_utf8_lossy(&o.stdout);
        let last = line.lines().last().unwrap_or("");
        out.push(serde_json::from_str(last).with_context(|| format!("job output {last:?}"))?);
    }
    Ok(out)
}

fn outcome_of(
    system: &'static str,
    runs: &[serde_json::Value],
    extra_cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let spans: Vec<(u64, f64, f64)> = runs
        .iter()
        .map(|v| (v["n"].as_u64().unwrap_or(0), f(v, "first"), f(v, "end")))
        .collect();
    let cpu = extra_cpu + runs.iter().map(|v| f(v, "cpu")).sum::<f64>();
    let mut o = summarize_secs(system, &spans, cpu, decodes, hit);
    o.startup_s =
        Some(runs.iter().map(|v| f(v, "startup")).sum::<f64>() / runs.len().max(1) as f64);
    if runs.iter().all(|v| v.get("wait").is_some()) {
        let wait: f64 = runs.iter().map(|v| f(v, "wait")).sum();
        let wall: f64 = runs.iter().map(|v| f(v, "end") - f(v, "first")).sum();
        o.wait_frac = Some(wait / wall.max(1e-9));
    }
    o
}

/// The Python client: one `joader.Loader` process per job against an in-process server.
/// CPU is the clients' (from their first batch) plus the server's over the scenario.
pub(super) fn run_python(
    sc: &Scenario,
    ctx: &Ctx,
    tag: usize,
    epoch_alone_s: f64,
) -> Result<Outcome> {
    let (server, client, _state) = start_server(ctx, &format!("p{tag}"))?;
    let url = server.url.clone();
    let cpu0 = process_cpu();
    let runs = run_processes(sc, epoch_alone_s, |i, job| {
        vec![
            "-c".into(),
            PYTHON_SCRIPT.into(),
            url.clone(),
            job.subset.start.to_string(),
            job.subset.end.to_string(),
            job.sleep_ms.to_string(),
            sc.batch.to_string(),
            i.to_string(),
            format!("py{i}"),
        ]
    })?;
    let server_cpu = process_cpu() - cpu0;
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    let total: u64 = runs.iter().map(|v| v["n"].as_u64().unwrap_or(0)).sum();
    // Decodes counted by the server include the first batches, which the timing leaves out.
    let decodes = stats["decodes"].as_f64().unwrap_or(0.0);
    let delivered = sc
        .jobs
        .iter()
        .map(|j| j.subset.len() as f64)
        .sum::<f64>()
        .max(1.0);
    Ok(outcome_of(
        "python",
        &runs,
        server_cpu,
        decodes / delivered * total as f64,
        stats["hit_ratio"].as_f64(),
    ))
}

/// PyTorch, tuned: one process per job, each with workers = cores (persistent, one torch
/// thread each), torchvision's RandomResizedCrop(224) + flip on the full images.
pub(super) fn run_torch(sc: &Scenario, ctx: &Ctx, epoch_alone_s: f64) -> Result<Outcome> {
    let runs = run_processes(sc, epoch_alone_s, |i, job| {
        vec![
            "-c".into(),
            TORCH_SCRIPT.into(),
            ctx.root.to_str().unwrap_or(".").into(),
            job.subset.start.to_string(),
            job.subset.end.to_string(),
            job.sleep_ms.to_string(),
            ctx.workers.to_string(),
            sc.batch.to_string(),
            i.to_string(),
        ]
    })?;
    let total: u64 = runs.iter().map(|v| v["n"].as_u64().unwrap_or(0)).sum();
    Ok(outcome_of("pytorch", &runs, 0.0, total as f64, None))
}

/// The training loop from cache: what [`run_cached_step`] measured.
#[derive(Debug, Clone)]
pub(super) struct CachedStep {
    pub(super) images: u64,
    pub(super) batch: usize,
    pub(super) step_ms: f64,
    pub(super) cache_bytes: u64,
    /// Samples of the timed epoch.
    pub(super) samples: u64,
    /// The timed epoch's wall time, from its first `next()` to its end.
    pub(super) loop_s: f64,
    pub(super) wait_s: f64,
    /// The server's decodes over both epochs, per image of the dataset.
    pub(super) decodes_per_image: f64,
    /// The client's CPU over the timed epoch, per sample (ms).
    pub(super) client_cpu_ms: f64,
}

/// One Python client job, batches of `batch`, with a training step simulated by a sleep of
/// `step_ms` per batch, over the whole dataset from a cache that holds all of it: a first
/// epoch without a step fills the cache, the second is timed (the share of its time spent
/// waiting in `next()`).
pub(super) fn run_cached_step(ctx: &Ctx, batch: usize, step_ms: f64) -> Result<CachedStep> {
    let images = ctx.index.len() as u64;
    // 500x375 resized to 256 on its shorter side is 342x256x3 bytes; room to spare.
    let cache_bytes = (images * 342 * 256 * 3 * 3 / 2).max(ctx.cache_bytes);
    let (server, client, _state) = start_server_with(ctx, "cached", cache_bytes)?;
    let sc = Scenario {
        name: "cached step".into(),
        jobs: vec![super::scenarios::JobPlan {
            subset: 0..images as u32,
            sleep_ms: step_ms / batch as f64,
            start_frac: 0.0,
        }],
        batch,
    };
    let runs = run_processes(&sc, 0.0, |_, job| {
        vec![
            "-c".into(),
            PYTHON_SCRIPT.into(),
            server.url.clone(),
            job.subset.start.to_string(),
            job.subset.end.to_string(),
            job.sleep_ms.to_string(),
            batch.to_string(),
            "0".into(),
            "cached".into(),
            "1".into(),
        ]
    })?;
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    let v = runs.first().context("no output from the Python job")?;
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let samples = v["n"].as_u64().unwrap_or(0);
    Ok(CachedStep {
        images,
        batch,
        step_ms,
        cache_bytes,
        samples,
        loop_s: f("end") - f("first"),
        wait_s: f("wait"),
        decodes_per_image: stats["decodes"].as_f64().unwrap_or(0.0) / images.max(1) as f64,
        client_cpu_ms: f("cpu") * 1e3 / samples.max(1) as f64,
    })
}
