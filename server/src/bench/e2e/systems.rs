//! The systems `joader bench e2e` compares on each scenario: joader (an in-process server, one
//! consumer thread per job), independent loading (each job reads, decodes and resizes its own
//! order with the same code and threads) and PyTorch's DataLoader.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use actors::pipeline::{self, Limits};
use anyhow::{Context, Result};
use crossbeam_channel::{bounded, unbounded};
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::Xoshiro256PlusPlus};
use serde_json::json;

use super::Ctx;
use super::scenarios::{Scenario, wait_start};
use crate::client::{Client, ReadOptions, consume};
use crate::procstat::process_cpu;
use crate::{Config, ServerHandle};

/// The PyTorch job, run with `python3 -c`.
const TORCH_SCRIPT: &str = include_str!("torch_baseline.py");

#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub(super) system: &'static str,
    pub(super) per_job: Vec<f64>,
    pub(super) aggregate: f64,
    pub(super) cpu_ms_per_sample: f64,
    pub(super) decodes_per_sample: f64,
    pub(super) hit_ratio: Option<f64>,
}

pub(super) fn summarize(
    system: &'static str,
    spans: &[(u64, Instant, Instant)],
    cpu: f64,
    decodes: f64,
    hit: Option<f64>,
) -> Outcome {
    let total: u64 = spans.iter().map(|s| s.0).sum();
    let first = spans.iter().map(|s| s.1).min().unwrap_or_else(Instant::now);
    let last = spans.iter().map(|s| s.2).max().unwrap_or_else(Instant::now);
    let wall = last.duration_since(first).as_secs_f64().max(1e-9);
    Outcome {
        system,
        per_job: spans
            .iter()
            .map(|s| s.0 as f64 / s.2.duration_since(s.1).as_secs_f64().max(1e-9))
            .collect(),
        aggregate: total as f64 / wall,
        cpu_ms_per_sample: cpu * 1e3 / total.max(1) as f64,
        decodes_per_sample: decodes / total.max(1) as f64,
        hit_ratio: hit,
    }
}

pub(super) fn run_joader(sc: &Scenario, ctx: &Ctx, tag: usize) -> Result<Outcome> {
    let state = tempfile::Builder::new().prefix("joader-e2e-").tempdir()?;
    let config = Config {
        bind: "127.0.0.1:0".parse()?,
        data_dir: state.path().to_path_buf(),
        instance: format!("e2e_{}_{tag}", std::process::id()),
        cache_bytes: ctx.cache_bytes,
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
    let cpu0 = process_cpu();
    let spans = run_jobs(&client, sc)?;
    let cpu = process_cpu() - cpu0;
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    Ok(summarize(
        "joader",
        &spans,
        cpu,
        stats["decodes"].as_f64().unwrap_or(0.0),
        stats["hit_ratio"].as_f64(),
    ))
}

/// Runs the jobs of `sc` on the server of `client`, one consumer thread each: every job's
/// samples, start and end.
pub(super) fn run_jobs(client: &Client, sc: &Scenario) -> Result<Vec<(u64, Instant, Instant)>> {
    let lead = AtomicU64::new(0);
    let lead_done = AtomicU64::new(0);
    let spans: Vec<Result<(u64, Instant, Instant)>> = std::thread::scope(|s| {
        let handles: Vec<_> = sc
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let (client, lead, lead_done) = (&client, &lead, &lead_done);
                s.spawn(move || -> Result<(u64, Instant, Instant)> {
                    wait_start(job.start_frac, lead, u64::from(sc.jobs[0].subset.len() as u32), lead_done);
                    let start = Instant::now();
                    let reg = client.ok(
                        "POST",
                        "/v1/jobs",
                        Some(&json!({"name": format!("j{i}"), "dataset": "d", "batch_size": 16, "epochs": 1, "seed": i,
                            "ring_capacity": 32, "subset": {"start": job.subset.start, "end": job.subset.end}})),
                    )?;
                    let inst = reg["ranks"][0]["instance"].as_str().context("instance")?.to_string();
                    let ring = reg["ranks"][0]["ring"].as_str().context("ring")?.to_string();
                    let per = Duration::from_secs_f64(job.sleep_ms / 1e3);
                    let got = consume(
                        &inst,
                        &ring,
                        ReadOptions { batch: 16, max_samples: None, hold: Duration::ZERO },
                        |n, _| per * n as u32,
                        |n| {
                            if i == 0 {
                                lead.store(n, Relaxed);
                            }
                        },
                        |_, _| {},
                    )?;
                    if i == 0 {
                        lead_done.store(1, Relaxed);
                    }
                    Ok((got.samples, start, Instant::now()))
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
    spans.into_iter().collect()
}

/// Independent loading: each job shuffles its subset and decodes every element itself; all
/// jobs share `workers` threads, each job keeps at most 32 elements in flight (like its ring).
pub(super) fn run_independent(sc: &Scenario, ctx: &Ctx) -> Result<Outcome> {
    let (task_tx, task_rx) = unbounded::<(usize, u32)>();
    let k = sc.jobs.len();
    let done_tx: Vec<_> = (0..k).map(|_| unbounded::<bool>()).collect();
    let decodes = AtomicU64::new(0);
    let lead = AtomicU64::new(0);
    let lead_done = AtomicU64::new(0);
    let limits = Limits {
        max_pixels: 100_000_000,
    };
    let cpu0 = process_cpu();
    let spans = std::thread::scope(|s| -> Result<Vec<(u64, Instant, Instant)>> {
        for _ in 0..ctx.workers {
            let (task_rx, done_tx, decodes, limits) =
                (task_rx.clone(), &done_tx, &decodes, &limits);
            s.spawn(move || {
                while let Ok((job, e)) = task_rx.recv() {
                    let ok = ctx
                        .index
                        .read(e)
                        .ok()
                        .and_then(|b| pipeline::run(&ctx.pipeline, &b, limits).ok())
                        .is_some();
                    decodes.fetch_add(1, Relaxed);
                    let _ = done_tx[job].0.send(ok);
                }
            });
        }
        let handles: Vec<_> = sc
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let (task_tx, done_rx, lead, lead_done) =
                    (task_tx.clone(), done_tx[i].1.clone(), &lead, &lead_done);
                s.spawn(move || -> (u64, Instant, Instant) {
                    wait_start(
                        job.start_frac,
                        lead,
                        u64::from(sc.jobs[0].subset.len() as u32),
                        lead_done,
                    );
                    let start = Instant::now();
                    let mut order: Vec<u32> = job.subset.clone().collect();
                    order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(i as u64));
                    let (tokens_tx, tokens_rx) = bounded::<()>(32);
                    for _ in 0..32 {
                        let _ = tokens_tx.send(());
                    }
                    let n = order.len() as u64;
                    // The feeder keeps at most 32 elements of this job in flight.
                    std::thread::scope(|f| {
                        f.spawn(|| {
                            for e in order {
                                if tokens_rx.recv().is_err() || task_tx.send((i, e)).is_err() {
                                    break;
                                }
                            }
                        });
                        let per = Duration::from_secs_f64(job.sleep_ms / 1e3);
                        for got in 1..=n {
                            if done_rx.recv().is_err() {
                                break;
                            }
                            if !per.is_zero() {
                                std::thread::sleep(per);
                            }
                            let _ = tokens_tx.send(());
                            if i == 0 {
                                lead.store(got, Relaxed);
                            }
                        }
                    });
                    if i == 0 {
                        lead_done.store(1, Relaxed);
                    }
                    (n, start, Instant::now())
                })
            })
            .collect();
        drop(task_tx);
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("a job panicked")))
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

pub(super) fn torch_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import torch, torchvision, PIL"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// PyTorch: one process per job, the decode workers split between them. Staggered starts use
/// fixed delays (a quarter of job 0's epoch time alone, measured first).
pub(super) fn run_torch(sc: &Scenario, ctx: &Ctx, epoch_alone_s: f64) -> Result<Outcome> {
    let per_job_workers = (ctx.workers / sc.jobs.len()).max(1);
    let t0 = Instant::now();
    let children: Vec<_> = sc
        .jobs
        .iter()
        .map(|job| {
            std::thread::sleep(Duration::from_secs_f64(
                (job.start_frac * epoch_alone_s - t0.elapsed().as_secs_f64()).max(0.0),
            ));
            let start = Instant::now();
            let child = std::process::Command::new("python3")
                .args([
                    "-c",
                    TORCH_SCRIPT,
                    ctx.root.to_str().unwrap_or("."),
                    &job.subset.start.to_string(),
                    &job.subset.end.to_string(),
                ])
                .arg(job.sleep_ms.to_string())
                .arg(per_job_workers.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn();
            (start, child)
        })
        .collect();
    let mut spans = Vec::new();
    let mut cpu = 0.0;
    for (start, child) in children {
        let out = child?.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "the PyTorch job failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        cpu += v["cpu"].as_f64().unwrap_or(0.0);
        spans.push((v["n"].as_u64().unwrap_or(0), start, Instant::now()));
    }
    let total: u64 = spans.iter().map(|s| s.0).sum();
    Ok(summarize("pytorch", &spans, cpu, total as f64, None))
}
