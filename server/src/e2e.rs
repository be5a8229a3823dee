//! `joader bench e2e`: the headline claim measured side by side in one run. Each scenario runs
//! with joader (an in-process server and one consumer thread per job through the shared-memory
//! rings) and with independent loading (every job reads, decodes and resizes its own shuffled
//! order with the same storage and pipeline code on the same number of worker threads), and
//! optionally with PyTorch's DataLoader (`--torch`). It prints and writes a markdown table and a
//! PNG chart. Nothing is asserted: the figures are what this machine did in this run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use actors::pipeline::{self, Limits, Pipeline};
use actors::storage::{DatasetIndex, SourceSpec};
use actors::synth::{SynthSpec, generate_image_folder};
use anyhow::{Context, Result};
use clap::Args;
use crossbeam_channel::{bounded, unbounded};
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::Xoshiro256PlusPlus};
use serde_json::json;

use crate::client::{Client, ReadOptions, consume};
use crate::{Config, ServerHandle};

#[derive(Debug, Args)]
pub struct E2eArgs {
    /// Dataset folder (generated on first use, reused afterwards).
    #[arg(long, default_value = "joader-bench-data")]
    pub data: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    #[arg(long, default_value_t = 100)]
    pub per_class: u32,
    /// Shared-memory cache in MiB; the default holds about 60% of the decoded dataset.
    #[arg(long, default_value_t = 96)]
    pub cache_mib: u64,
    /// Decode threads of both joader and the independent baseline (default: cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Where the markdown table and the PNG chart go.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// A tiny run (for CI): few images, a subset of the scenarios.
    #[arg(long)]
    pub quick: bool,
    /// Also run PyTorch's DataLoader over torchvision's ImageFolder with PIL (installs torch,
    /// torchvision and pillow from PyPI with pip when they are missing).
    #[arg(long)]
    pub torch: bool,
}

#[derive(Debug, Clone)]
struct JobPlan {
    subset: std::ops::Range<u32>,
    sleep_ms: f64,
    /// Starts when job 0 has consumed this fraction of its epoch.
    start_frac: f64,
}

#[derive(Debug, Clone)]
struct Scenario {
    name: String,
    jobs: Vec<JobPlan>,
}

#[derive(Debug, Clone)]
struct Outcome {
    system: &'static str,
    per_job: Vec<f64>,
    aggregate: f64,
    cpu_ms_per_sample: f64,
    decodes_per_sample: f64,
    hit_ratio: Option<f64>,
}

/// CPU seconds (user + system) of this process so far.
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = rustix::param::clock_ticks_per_second() as f64;
    (ticks(11) + ticks(12)) / hz
}

fn scenarios(n: u32, quick: bool) -> Vec<Scenario> {
    let all = |k: usize| {
        (0..k)
            .map(|_| JobPlan {
                subset: 0..n,
                sleep_ms: 0.0,
                start_frac: 0.0,
            })
            .collect()
    };
    let mut out = Vec::new();
    let ks: &[usize] = if quick { &[1, 2] } else { &[1, 2, 4, 6] };
    for &k in ks {
        out.push(Scenario {
            name: format!("sync K={k}"),
            jobs: all(k),
        });
    }
    if !quick {
        out.push(Scenario {
            name: "speeds 0/1/3/7 ms".into(),
            jobs: [0.0, 1.0, 3.0, 7.0]
                .iter()
                .map(|&s| JobPlan {
                    subset: 0..n,
                    sleep_ms: s,
                    start_frac: 0.0,
                })
                .collect(),
        });
        out.push(Scenario {
            name: "staggered 0/25/50/75%".into(),
            jobs: [0.0, 0.25, 0.5, 0.75]
                .iter()
                .map(|&f| JobPlan {
                    subset: 0..n,
                    sleep_ms: 0.0,
                    start_frac: f,
                })
                .collect(),
        });
    }
    let overlaps: &[f64] = if quick {
        &[0.5]
    } else {
        &[0.25, 0.5, 0.75, 1.0]
    };
    for &p in overlaps {
        let s = n / 2;
        let shift = ((1.0 - p) * f64::from(s)).round() as u32;
        out.push(Scenario {
            name: format!("overlap {:.0}%", p * 100.0),
            jobs: vec![
                JobPlan {
                    subset: 0..s,
                    sleep_ms: 0.0,
                    start_frac: 0.0,
                },
                JobPlan {
                    subset: shift..shift + s,
                    sleep_ms: 0.0,
                    start_frac: 0.0,
                },
            ],
        });
    }
    out
}

/// Waits until job 0 has consumed `frac` of its epoch (or finished).
fn wait_start(frac: f64, lead: &AtomicU64, lead_len: u64, lead_done: &AtomicU64) {
    while frac > 0.0
        && (lead.load(Relaxed) as f64) < frac * lead_len as f64
        && lead_done.load(Relaxed) == 0
    {
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct Ctx {
    root: PathBuf,
    index: Arc<DatasetIndex>,
    workers: usize,
    cache_mib: u64,
    pipeline: Pipeline,
}

fn summarize(
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

fn run_joader(sc: &Scenario, ctx: &Ctx, tag: usize) -> Result<Outcome> {
    let state = tempfile::Builder::new().prefix("joader-e2e-").tempdir()?;
    let config = Config {
        bind: "127.0.0.1:0".parse()?,
        data_dir: state.path().to_path_buf(),
        instance: format!("e2e_{}_{tag}", std::process::id()),
        cache_bytes: ctx.cache_mib << 20,
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
    let lead = AtomicU64::new(0);
    let lead_done = AtomicU64::new(0);
    let cpu0 = process_cpu();
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
    let cpu = process_cpu() - cpu0;
    let spans = spans.into_iter().collect::<Result<Vec<_>>>()?;
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

/// Independent loading: each job shuffles its subset and decodes every element itself; all
/// jobs share `workers` threads, each job keeps at most 32 elements in flight (like its ring).
fn run_independent(sc: &Scenario, ctx: &Ctx) -> Result<Outcome> {
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

const TORCH_SCRIPT: &str = r#"
import json, os, resource, sys, time
import torch, torchvision
from torchvision import transforms
from torch.utils.data import DataLoader, Subset
root, start, end, sleep_ms, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
ds = torchvision.datasets.ImageFolder(root, transform=transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()]))
dl = DataLoader(Subset(ds, range(start, end)), batch_size=16, shuffle=True, num_workers=workers)
t = time.time(); n = 0
for x, y in dl:
    n += len(y)
    if sleep_ms: time.sleep(sleep_ms * len(y) / 1000)
wall = time.time() - t
ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"n": n, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime}))
"#;

fn torch_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import torch, torchvision, PIL"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// PyTorch: one process per job, the decode workers split between them. Staggered starts use
/// fixed delays (a quarter of job 0's epoch time alone, measured first).
fn run_torch(sc: &Scenario, ctx: &Ctx, epoch_alone_s: f64) -> Result<Outcome> {
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

pub fn run(args: E2eArgs) -> Result<()> {
    let (classes, per_class) = if args.quick {
        (4, 15)
    } else {
        (args.classes, args.per_class)
    };
    let spec = SynthSpec {
        classes,
        per_class,
        width: 500,
        height: 375,
        quality: 90,
        seed: 2022,
    };
    let data = if args.quick {
        args.data.join("quick")
    } else {
        args.data.clone()
    };
    std::fs::create_dir_all(&data)?;
    let root = data.canonicalize()?;
    let t = Instant::now();
    let n = generate_image_folder(&root, &spec, &mut |_| {})? as u32;
    eprintln!(
        "dataset: {n} JPEGs of 500x375 in {} ({:.1} s)",
        root.display(),
        t.elapsed().as_secs_f64()
    );
    let index = Arc::new(actors::storage::index(
        &SourceSpec::ImageFolder { path: root.clone() },
        std::slice::from_ref(&root),
        &mut |_| {},
    )?);
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let ctx = Ctx {
        root: root.clone(),
        index,
        workers,
        cache_mib: args.cache_mib,
        pipeline: Config::default().default_pipeline,
    };
    let torch = args.torch
        && {
            let ok = torch_available();
            if !ok {
                eprintln!(
                    "PyTorch baseline skipped: python3 cannot import torch, torchvision and PIL (pip install torch torchvision pillow)"
                );
            }
            ok
        };
    let started = Instant::now();
    let mut rows: Vec<(Scenario, Vec<Outcome>)> = Vec::new();
    let mut epoch_alone_s = 0.0;
    for (i, sc) in scenarios(n, args.quick).into_iter().enumerate() {
        eprintln!("scenario {}: {} job(s)", sc.name, sc.jobs.len());
        // Interleaved: the systems run one after the other on the same scenario.
        let mut outs = vec![run_joader(&sc, &ctx, i)?, run_independent(&sc, &ctx)?];
        if i == 0 {
            epoch_alone_s = f64::from(n) / outs[1].aggregate.max(1e-9);
        }
        if torch {
            outs.push(run_torch(&sc, &ctx, epoch_alone_s)?);
        }
        rows.push((sc, outs));
    }
    let table = markdown(&rows, workers, args.cache_mib, n);
    println!("{table}");
    std::fs::create_dir_all(&args.out)?;
    let md = args.out.join("e2e.md");
    std::fs::write(&md, &table)?;
    let png = args.out.join("e2e.png");
    match chart(&rows, &png) {
        Ok(()) => eprintln!("wrote {} and {}", md.display(), png.display()),
        Err(e) => eprintln!("wrote {}; no chart: {e:#}", md.display()),
    }
    eprintln!("bench e2e took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn markdown(rows: &[(Scenario, Vec<Outcome>)], workers: usize, cache_mib: u64, n: u32) -> String {
    let mut s = format!(
        "joader bench e2e: {n} images 500x375 -> decode, resize 256, center crop 224; {workers} decode threads; \
         cache {cache_mib} MiB\n\n| scenario | system | samples/s (all jobs) | per job samples/s | CPU ms/sample | decodes/sample | hit ratio | throughput vs independent | CPU vs independent |\n|---|---|---:|---|---:|---:|---:|---:|---:|\n"
    );
    for (sc, outs) in rows {
        let base = outs.iter().find(|o| o.system == "independent");
        for o in outs {
            let per: Vec<String> = o.per_job.iter().map(|r| format!("{r:.0}")).collect();
            let (tr, cr) = base.map_or((f64::NAN, f64::NAN), |b| {
                (
                    o.aggregate / b.aggregate.max(1e-9),
                    o.cpu_ms_per_sample / b.cpu_ms_per_sample.max(1e-9),
                )
            });
            s.push_str(&format!(
                "| {} | {} | {:.0} | {} | {:.2} | {:.2} | {} | {:.2}x | {:.2}x |\n",
                sc.name,
                o.system,
                o.aggregate,
                per.join(" / "),
                o.cpu_ms_per_sample,
                o.decodes_per_sample,
                o.hit_ratio
                    .map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
                tr,
                cr
            ));
        }
    }
    s
}

fn chart(rows: &[(Scenario, Vec<Outcome>)], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let font = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok())
    .context("no TrueType font found (install fonts-dejavu-core)")?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("the font could not be loaded"))?;
    let systems: Vec<&str> = rows
        .first()
        .map(|r| r.1.iter().map(|o| o.system).collect())
        .unwrap_or_default();
    let max = rows
        .iter()
        .flat_map(|r| r.1.iter().map(|o| o.aggregate))
        .fold(1.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption("aggregate delivered samples/s", ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..max)?;
    let names: Vec<String> = rows.iter().map(|r| r.0.name.clone()).collect();
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 12).into_font())
        .y_desc("samples/s")
        .draw()?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
    ];
    let w = 0.8 / systems.len().max(1) as f64;
    for (si, sys) in systems.iter().enumerate() {
        let color = palette[si % palette.len()];
        c.draw_series(rows.iter().enumerate().filter_map(|(i, r)| {
            let o = r.1.iter().find(|o| o.system == *sys)?;
            let x0 = i as f64 + 0.1 + si as f64 * w;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + w * 0.95, o.aggregate)],
                color.filled(),
            ))
        }))?
        .label(*sys)
        .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
