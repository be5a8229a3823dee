//! The systems `joader bench e2e` compares on each scenario, all with the training recipe
//! (decode, resize the shorter side to 256, then per job RandomResizedCrop(224) + flip):
//! joader (an in-process server, one Rust consumer thread per job that augments what it
//! reads), the Python client (one `joader.Loader` process per job, same server), independent
//! loading (each job's own order read, decoded and resized by the same code on the same shared
//! threads, augmented on the job's thread) and PyTorch's DataLoader, tuned and with workers =
//! cores per job; and the Python client's training loop from cache.
//!
//! Every system is timed alike (see [`Span`]): each job from its start (joader and the Python
//! client: just before its registration; independent loading: just before its first task;
//! PyTorch: just before `iter()` starts its workers; processes after their imports) to its last
//! sample, and also from the end of its first batch, so that the start-up (registration, the
//! Sampler's start window, the workers' start, the first loads) is counted in the headline
//! figure and shown apart.

use std::process::Command;
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
use super::scenarios::{Scenario, run_processes, wait_start};
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
    /// Each job's samples over its own span, from its start to its last sample.
    pub(super) per_job: Vec<f64>,
    /// Every sample of every job over the span from the first job's start (its registration or
    /// its first task) to the last sample: the headline figure.
    pub(super) aggregate: f64,
    /// The samples after each job's first batch over the span from the first of those batches
    /// to the last sample: what the run gives once every system has started.
    pub(super) from_first: f64,
    /// CPU over the whole span (start-up included) per sample (all samples).
    pub(super) cpu_ms_per_sample: f64,
    pub(super) decodes_per_sample: f64,
    pub(super) hit_ratio: Option<f64>,
    /// Mean time from a job's start to the end of its first batch.
    pub(super) startup_s: f64,
    /// Fraction of the loop's time after the first batch spent waiting for the next batch
    /// (Python client).
    pub(super) wait_frac: Option<f64>,
    /// CPU seconds by stage over the run (`dataplane::stages`), where the system runs in this
    /// process (joader: the in-process server and its consumer threads).
    pub(super) stages: Vec<(&'static str, f64)>,
    /// Every sample of every job.
    pub(super) samples: u64,
}

/// Every stage's CPU seconds in this process so far: the server's, then the client's.
fn stage_seconds() -> Vec<(&'static str, f64)> {
    server::stages::SERVER
        .iter()
        .chain(dataplane::stages::CLIENT.iter())
        .map(|s| (s.name(), s.seconds()))
        .collect()
}

/// One job's timing, in seconds on one clock: `start` is its registration (joader, the Python
/// client), its first task (independent loading) or its DataLoader's start (PyTorch); `first`
/// the end of its first batch, of `first_samples` samples; `end` its last sample; `samples`
/// all its samples, the first batch's included.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) samples: u64,
    pub(super) first_samples: u64,
    pub(super) start: f64,
    pub(super) first: f64,
    pub(super) end: f64,
}

/// The figures of `spans`: see [`Outcome`]. `cpu` and `decodes` are over the whole run.
pub(super) fn summarize(
    system: &'static str,
    spans: &[Span],
    cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let min = |f: fn(&Span) -> f64| spans.iter().map(f).fold(f64::INFINITY, f64::min);
    let total: u64 = spans.iter().map(|s| s.samples).sum();
    let after_first: u64 = spans.iter().map(|s| s.samples - s.first_samples).sum();
    let last = spans
        .iter()
        .map(|s| s.end)
        .fold(f64::NEG_INFINITY, f64::max);
    let rate = |n: u64, from: f64| n as f64 / (last - from).max(1e-9);
    Outcome {
        system,
        per_job: spans
            .iter()
            .map(|s| s.samples as f64 / (s.end - s.start).max(1e-9))
            .collect(),
        aggregate: rate(total, min(|s| s.start)),
        from_first: rate(after_first, min(|s| s.first)),
        cpu_ms_per_sample: cpu * 1e3 / total.max(1) as f64,
        decodes_per_sample: decodes / total.max(1) as f64,
        hit_ratio: hit,
        startup_s: spans.iter().map(|s| s.first - s.start).sum::<f64>() / spans.len().max(1) as f64,
        wait_frac: None,
        stages: Vec::new(),
        samples: total,
    }
}

/// An in-process server with the dataset registered and indexed.
fn start_server(ctx: &Ctx, tag: &str) -> Result<(ServerHandle, Client, tempfile::TempDir)> {
    start_server_with(ctx, tag, ctx.cache_bytes)
}

pub(super) fn start_server_with(
    ctx: &Ctx,
    tag: &str,
    cache_bytes: u64,
) -> Result<(ServerHandle, Client, tempfile::TempDir)> {
    let source = json!({"kind": "image_folder", "path": ctx.root});
    start_server_of(ctx, tag, cache_bytes, &ctx.root, ("d", &source))
}

/// An in-process server of the bench's threads reading under `root`, with the dataset
/// `(name, source)` registered and indexed.
pub(super) fn start_server_of(
    ctx: &Ctx,
    tag: &str,
    cache_bytes: u64,
    root: &std::path::Path,
    (name, source): (&str, &serde_json::Value),
) -> Result<(ServerHandle, Client, tempfile::TempDir)> {
    let state = tempfile::Builder::new().prefix("joader-e2e-").tempdir()?;
    let config = Config {
        bind: "127.0.0.1:0".parse()?,
        data_dir: state.path().to_path_buf(),
        instance: format!("e2e_{}_{tag}", std::process::id()),
        cache_bytes,
        cache_slots: 8192,
        allowed_roots: vec![root.to_path_buf()],
        loader_workers: ctx.workers,
        ..Config::default()
    };
    let server = ServerHandle::spawn(config)?;
    let client = Client::new(server.url.clone());
    client.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": name, "source": source})),
    )?;
    client.wait_ready(name, Duration::from_secs(120))?;
    Ok((server, client, state))
}

pub(super) fn run_joader(sc: &Scenario, ctx: &Ctx, tag: usize) -> Result<Outcome> {
    let (server, client, _state) = start_server(ctx, &format!("r{tag}"))?;
    let cpu0 = process_cpu();
    let stages0 = stage_seconds();
    let runs = run_jobs(&client, sc)?;
    let cpu = process_cpu() - cpu0;
    let stages = stage_seconds()
        .into_iter()
        .zip(stages0)
        .map(|((name, s), (_, s0))| (name, s - s0))
        .collect();
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    let mut o = summarize_runs(
        "joader",
        &runs,
        cpu,
        stats["decodes"].as_f64().unwrap_or(0.0),
        stats["hit_ratio"].as_f64(),
    );
    o.stages = stages;
    Ok(o)
}

/// One job of [`run_jobs`] or [`run_independent`], on the monotonic clock (see [`Span`]).
pub(super) struct JobRun {
    pub(super) samples: u64,
    pub(super) first_samples: u64,
    pub(super) start: Instant,
    /// The end of its first batch (the batch read and augmented).
    pub(super) first: Instant,
    pub(super) end: Instant,
}

/// [`summarize`] of [`JobRun`]s.
pub(super) fn summarize_runs(
    system: &'static str,
    runs: &[JobRun],
    cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let zero = runs
        .iter()
        .map(|r| r.start)
        .min()
        .unwrap_or_else(Instant::now);
    let at = |i: Instant| i.duration_since(zero).as_secs_f64();
    let spans: Vec<Span> = runs
        .iter()
        .map(|r| Span {
            samples: r.samples,
            first_samples: r.first_samples,
            start: at(r.start),
            first: at(r.first),
            end: at(r.end),
        })
        .collect();
    summarize(system, &spans, cpu, decodes, hit)
}

/// Runs the jobs of `sc` on the server of `client` with the training recipe, one consumer
/// thread each (the client's augmentation included), each timed from just before its
/// registration: see [`JobRun`].
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
                    // Job 0 releases the late jobs however it ends.
                    let _release = (i == 0).then(|| Release(lead_done));
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
                    let end = Instant::now();
                    let (first, first_samples) = first.unwrap_or((end, got.samples));
                    Ok(JobRun { samples: got.samples, first_samples, start, first, end })
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
/// turn, and each system has the same threads: `workers` + one per job. A job is timed from
/// just before its first task, its first batch being its first `batch` elements augmented.
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
    let runs = std::thread::scope(|s| -> Result<Vec<JobRun>> {
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
                s.spawn(move || -> Result<JobRun> {
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
                    let first_samples = (sc.batch as u64).min(n);
                    let mut first = None;
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
                        if got + 1 == first_samples {
                            first = Some(Instant::now());
                        }
                        if i == 0 {
                            lead.store(got + 1, Relaxed);
                        }
                    }
                    let end = Instant::now();
                    Ok(JobRun {
                        samples: n,
                        first_samples,
                        start,
                        first: first.unwrap_or(end),
                        end,
                    })
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
    Ok(summarize_runs(
        "independent",
        &runs,
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

/// The figures of the processes' JSON lines (see `joader_python.py`, `torch_baseline.py`).
pub(super) fn outcome_of(
    system: &'static str,
    runs: &[serde_json::Value],
    extra_cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    let spans: Vec<Span> = runs
        .iter()
        .map(|v| Span {
            samples: u(v, "n"),
            first_samples: u(v, "n_first"),
            start: f(v, "start"),
            first: f(v, "first"),
            end: f(v, "end"),
        })
        .collect();
    let cpu = extra_cpu + runs.iter().map(|v| f(v, "cpu")).sum::<f64>();
    let mut o = summarize(system, &spans, cpu, decodes, hit);
    if runs.iter().all(|v| v.get("wait").is_some()) {
        let wait: f64 = runs.iter().map(|v| f(v, "wait")).sum();
        let wall: f64 = runs.iter().map(|v| f(v, "end") - f(v, "first")).sum();
        o.wait_frac = Some(wait / wall.max(1e-9));
    }
    o
}

pub(super) fn python(script: &str, args: &[String]) -> Command {
    let mut c = Command::new("python3");
    c.args(["-c", script]).args(args);
    c
}

/// The Python client: one `joader.Loader` process per job against an in-process server.
/// CPU is the clients' (from their start) plus the server's over the scenario.
pub(super) fn run_python(sc: &Scenario, ctx: &Ctx, tag: usize) -> Result<Outcome> {
    let (server, client, _state) = start_server(ctx, &format!("p{tag}"))?;
    let url = server.url.clone();
    let cpu0 = process_cpu();
    let runs = run_processes(sc, |i, job| {
        python(
            PYTHON_SCRIPT,
            &[
                url.clone(),
                job.subset.start.to_string(),
                job.subset.end.to_string(),
                job.sleep_ms.to_string(),
                sc.batch.to_string(),
                i.to_string(),
                format!("py{i}"),
            ],
        )
    })?;
    let server_cpu = process_cpu() - cpu0;
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    Ok(outcome_of(
        "python",
        &runs,
        server_cpu,
        stats["decodes"].as_f64().unwrap_or(0.0),
        stats["hit_ratio"].as_f64(),
    ))
}

/// The two PyTorch rows: tuned (`cores / K` workers per job, at least one, so that the K jobs
/// together have about a worker per core) and `cores` workers per job (K × cores workers).
pub(super) const TORCH: &str = "pytorch";
pub(super) const TORCH_CORES_PER_JOB: &str = "pytorch, workers = cores per job";

/// PyTorch: one process per job, each with `workers` persistent workers of one torch thread,
/// torchvision's RandomResizedCrop(224) + flip on the full images.
pub(super) fn run_torch(
    sc: &Scenario,
    ctx: &Ctx,
    system: &'static str,
    workers: usize,
) -> Result<Outcome> {
    let runs = run_processes(sc, |i, job| {
        python(
            TORCH_SCRIPT,
            &[
                ctx.root.to_str().unwrap_or(".").into(),
                job.subset.start.to_string(),
                job.subset.end.to_string(),
                job.sleep_ms.to_string(),
                workers.to_string(),
                sc.batch.to_string(),
                i.to_string(),
            ],
        )
    })?;
    let total: u64 = runs.iter().map(|v| v["n"].as_u64().unwrap_or(0)).sum();
    Ok(outcome_of(system, &runs, 0.0, total as f64, None))
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
/// `step_ms` per batch, over the whole dataset from a cache that holds all of it (half as
/// much again as the decoded dataset's bytes, `ctx.decoded_bytes`): a first epoch without a
/// step fills the cache, the second is timed (the share of its time spent waiting in
/// `next()`).
pub(super) fn run_cached_step(ctx: &Ctx, batch: usize, step_ms: f64) -> Result<CachedStep> {
    let images = ctx.index.len() as u64;
    let cache_bytes = (ctx.decoded_bytes * 3 / 2).max(ctx.cache_bytes);
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
    let runs = run_processes(&sc, |_, job| {
        python(
            PYTHON_SCRIPT,
            &[
                server.url.clone(),
                job.subset.start.to_string(),
                job.subset.end.to_string(),
                job.sleep_ms.to_string(),
                batch.to_string(),
                "0".into(),
                "cached".into(),
                "1".into(),
            ],
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The headline counts every sample from the first start; the other figure the samples
    /// after each first batch from the first of those batches.
    #[test]
    fn every_system_is_timed_from_its_start_and_from_its_first_batch() {
        let span = |start, first, end| Span {
            samples: 100,
            first_samples: 10,
            start,
            first,
            end,
        };
        let o = summarize(
            "x",
            &[span(0.0, 1.0, 4.0), span(1.0, 2.0, 5.0)],
            2.0,
            50.0,
            None,
        );
        assert_eq!(o.aggregate, 200.0 / 5.0);
        assert_eq!(o.from_first, 180.0 / 4.0);
        assert_eq!(o.per_job, vec![25.0, 25.0]);
        assert_eq!(o.startup_s, 1.0);
        assert_eq!(o.cpu_ms_per_sample, 10.0);
        assert_eq!(o.decodes_per_sample, 0.25);
    }
}
