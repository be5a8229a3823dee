//! `joader bench train`: K concurrent training jobs (one process each) on one GPU, per system:
//! `synthetic` (each job copies a ready pinned uint8 batch to the device and trains: the GPU's
//! own limit), `joader` (a `joader serve` child; each job reads `joader.torch.JoaderDataset`
//! with the README's recipe: the server caches the shorter side resized to 256, the client
//! crops RandomResizedCrop(224) + flip, pinned uint8 batches normalized on the device) and
//! `pytorch` (a DataLoader per job over torchvision's ImageFolder, cores/K workers, persistent,
//! pinned, prefetch 4, PIL's RandomResizedCrop(224) + flip, uint8 normalized on the device).
//! With CUDA the jobs train under bf16 autocast in channels_last; without it they train `tiny`
//! (a small conv net) on the CPU with one torch thread each (the CPU stands in for the GPU; two
//! intra-op threads per job on a busy machine made the step several times slower), so that the
//! bench runs everywhere.
//!
//! Every job of a run is measured over the same window (`jobs.rs`): from the moment the last
//! job has done its warm-up steps to the moment the first has done `--steps` more. It prints
//! per system the images/s of all jobs and of each, their share of the synthetic limit, GPU
//! utilization (NVML, else n/a), the cache's share of the decoded set, CPU cores of the server
//! and of each job (training thread, other threads, worker processes), decodes per delivered
//! image, and, where the server and the client export them, CPU per stage per delivered image.
//! Nothing is asserted: the figures are what this machine did in this run.

pub(crate) mod data;
pub(crate) mod jobs;
pub(crate) mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use crate::bench::scale::procs::ServerProc;
use jobs::{JobCpu, ServerSide, Stages, run_jobs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum System {
    /// A ready pinned batch copied to the device every step: the GPU's own limit.
    Synthetic,
    /// `joader.torch.JoaderDataset` against a `joader serve` child, cropping in the client.
    Joader,
    /// The same with `device=` the training device: padded batches cropped, flipped and
    /// resized there (`joader.torch.augment_padded`, `roi_align`).
    JoaderDevice,
    /// PyTorch's DataLoader over torchvision's ImageFolder with PIL.
    Pytorch,
}

impl System {
    pub(super) fn name(self) -> &'static str {
        match self {
            System::Synthetic => "synthetic",
            System::Joader => "joader",
            System::JoaderDevice => "joader-device",
            System::Pytorch => "pytorch",
        }
    }

    /// Reads from a `joader serve` child.
    pub(super) fn is_joader(self) -> bool {
        matches!(self, System::Joader | System::JoaderDevice)
    }
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// torchvision models (any name of `torchvision.models.get_model`), or `tiny` (a small conv
    /// net, the default without CUDA; with CUDA resnet18). Several, comma-separated, make a
    /// mix: job i trains model i mod their number.
    #[arg(long = "model", visible_alias = "models", value_delimiter = ',')]
    pub models: Vec<String>,
    /// How many concurrent jobs, one run per value (default 1,2,4; with --quick 1,2).
    #[arg(long, value_delimiter = ',')]
    pub jobs: Vec<usize>,
    /// The systems to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "synthetic,joader,joader-device,pytorch"
    )]
    pub systems: Vec<System>,
    /// An ImageFolder to train on (only read). Without it the bench generates `--images`
    /// JPEGs of 500x375, quality 90, from real photos, in `--bench-data`.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Where the generated dataset goes (its `train` folder, `train-quick` with --quick).
    #[arg(long, default_value = "joader-bench-data")]
    pub bench_data: PathBuf,
    /// Images of the generated dataset (default 3600; with --quick 120).
    #[arg(long)]
    pub images: Option<u32>,
    /// Classes of the generated dataset (default 10; with --quick 4).
    #[arg(long)]
    pub classes: Option<u32>,
    /// Each job's batch size (default 128 with CUDA, 32 without; with --quick 8).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Steps every job does before the window opens (default 10 with CUDA, 3 without).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Steps of the fastest job in the window (default 200 with CUDA, 40 without).
    #[arg(long)]
    pub steps: Option<usize>,
    /// joader's cache (bytes or 1GiB, …); default 36% of the decoded set (every image decoded
    /// and resized to 256 on its shorter side, measured before the runs).
    #[arg(long, value_parser = server::config::parse_bytes)]
    pub cache_bytes: Option<u64>,
    /// joader's jobs: batches each job's loader prepares ahead (`prefetch`, default 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefetch: u32,
    /// joader's jobs: records of each job's delivery ring (`ring_capacity`; default the
    /// server's, twice the batch). How far the server may deliver ahead of the prefetch.
    #[arg(long)]
    pub ring_capacity: Option<u32>,
    /// Train on the CPU even when CUDA is there.
    #[arg(long)]
    pub cpu: bool,
    /// Where `train.md` and `train.png` go.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// A tiny run (for CI): 120 images, K = 1, 2, batches of 8, 2 warm-up and 10 window steps.
    #[arg(long)]
    pub quick: bool,
}

/// What the Python side has, asked once.
struct Probe {
    cuda: bool,
    gpu: Option<String>,
    joader: bool,
}

fn probe() -> Result<Probe> {
    const CODE: &str = "import importlib.util, json, torch, torchvision\n\
        c = torch.cuda.is_available()\n\
        print(json.dumps({'cuda': c, 'gpu': torch.cuda.get_device_name(0) if c else None,\n\
                          'joader': importlib.util.find_spec('joader') is not None}))";
    let out = std::process::Command::new("python3")
        .args(["-c", CODE])
        .output()
        .context("run python3")?;
    if !out.status.success() {
        bail!(
            "python3 cannot import torch and torchvision (pip install torch torchvision pillow): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("the probe's output")?;
    Ok(Probe {
        cuda: v["cuda"].as_bool() == Some(true),
        gpu: v["gpu"].as_str().map(str::to_owned),
        joader: v["joader"].as_bool() == Some(true),
    })
}

/// What every run of the bench shares.
struct Setup {
    pub(super) root: PathBuf,
    pub(super) images: usize,
    pub(super) classes: usize,
    pub(super) decoded_bytes: u64,
    pub(super) cache_bytes: u64,
    pub(super) batch: usize,
    pub(super) warmup: usize,
    pub(super) steps: usize,
    pub(super) models: Vec<String>,
    pub(super) cuda: bool,
    pub(super) cores: usize,
    /// The GPU's name, or how the jobs train without one.
    pub(super) device: String,
    pub(super) generated: bool,
    /// joader's jobs' prefetch depth, in batches.
    pub(super) prefetch: u32,
    /// joader's jobs' ring capacity (`None`: the server's default).
    pub(super) ring_capacity: Option<u32>,
}

/// One system at one K.
#[derive(Debug)]
struct Row {
    pub(super) k: usize,
    pub(super) system: System,
    /// Each job's model.
    pub(super) models: Vec<String>,
    pub(super) window_s: f64,
    /// Images of every job in the window over the window.
    pub(super) total: f64,
    pub(super) per_job: Vec<f64>,
    pub(super) gpu_util: Option<f64>,
    pub(super) server_cores: Option<f64>,
    pub(super) jobs_cpu: Vec<JobCpu>,
    pub(super) decodes_per_image: Option<f64>,
    /// CPU ms per delivered image by stage: the server's and the clients' (`None`: not
    /// exported); only for joader.
    pub(super) server_stages: Option<Stages>,
    pub(super) client_stages: Option<Stages>,
}

pub fn run(args: TrainArgs) -> Result<()> {
    let started = Instant::now();
    let probe = probe()?;
    if args.systems.iter().any(|s| s.is_joader()) && !probe.joader {
        bail!("python3 cannot import joader: pip install ./dataplane/python");
    }
    let cuda = probe.cuda && !args.cpu;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pick = |q: usize, gpu: usize, cpu: usize| {
        if args.quick {
            q
        } else if cuda {
            gpu
        } else {
            cpu
        }
    };
    let batch = args.batch.unwrap_or(pick(8, 128, 32));
    if let Some(c) = args.ring_capacity
        && (c as usize) < batch
    {
        bail!("--ring-capacity {c} cannot hold one batch of {batch}: give at least the batch");
    }
    let root = match &args.data {
        Some(d) => d
            .canonicalize()
            .with_context(|| format!("--data {}", d.display()))?,
        None => {
            let root = args
                .bench_data
                .join(if args.quick { "train-quick" } else { "train" });
            let (n, classes) = if args.quick { (120, 4) } else { (3600, 10) };
            let t = Instant::now();
            data::generate(
                &root,
                args.images.unwrap_or(n),
                args.classes.unwrap_or(classes),
            )?;
            eprintln!(
                "dataset: {} ({:.1} s)",
                root.display(),
                t.elapsed().as_secs_f64()
            );
            root.canonicalize()?
        }
    };
    let warmed = super::warm_page_cache(&root)?;
    eprintln!("page cache: read {warmed} bytes of the dataset once before the runs");
    let index = data::index(&root)?;
    if index.is_empty() {
        bail!("{} holds no image", root.display());
    }
    let t = Instant::now();
    let decoded_bytes = data::decoded_bytes(&index)?;
    eprintln!(
        "decoded set: {decoded_bytes} bytes ({} images decoded and resized to 256 once, {:.1} s)",
        index.len(),
        t.elapsed().as_secs_f64()
    );
    let models = if args.models.is_empty() {
        vec![if cuda { "resnet18" } else { "tiny" }.to_owned()]
    } else {
        args.models.clone()
    };
    let setup = Setup {
        images: index.len(),
        classes: index.classes().len().max(1),
        decoded_bytes,
        cache_bytes: args.cache_bytes.unwrap_or(decoded_bytes * 36 / 100),
        batch,
        warmup: args.warmup.unwrap_or(pick(2, 10, 3)).max(1),
        steps: args.steps.unwrap_or(pick(10, 200, 40)).max(1),
        models,
        cuda,
        cores,
        device: match (&probe.gpu, cuda) {
            (Some(g), true) => g.clone(),
            _ => "no CUDA: the CPU".to_owned(),
        },
        generated: args.data.is_none(),
        prefetch: args.prefetch,
        ring_capacity: args.ring_capacity,
        root,
    };

    let ks = if !args.jobs.is_empty() {
        args.jobs.clone()
    } else if args.quick {
        vec![1, 2]
    } else {
        vec![1, 2, 4]
    };
    eprintln!("{}", report::header(&setup));
    let mut rows = Vec::new();
    for &k in ks.iter().filter(|&&k| k > 0) {
        for &system in &args.systems {
            eprintln!("run: K={k} {}", system.name());
            let row = run_system(&setup, system, k)
                .with_context(|| format!("K={k} {}", system.name()))?;
            eprintln!(
                "  {:.1} images/s in a window of {:.2} s",
                row.total, row.window_s
            );
            rows.push(row);
        }
    }
    let table = report::markdown(&setup, &rows);
    println!("{table}");
    std::fs::create_dir_all(&args.out)?;
    let md = args.out.join("train.md");
    std::fs::write(&md, &table)?;
    let png = args.out.join("train.png");
    match report::chart(&rows, &png) {
        Ok(()) => eprintln!("wrote {} and {}", md.display(), png.display()),
        Err(e) => eprintln!("wrote {}; no chart: {e:#}", md.display()),
    }
    eprintln!("bench train took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The NVML index of the GPU the jobs train on (CUDA device 0): the first entry of
/// `CUDA_VISIBLE_DEVICES` when it is a number.
fn nvml_index() -> u32 {
    std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .and_then(|v| v.split(',').next()?.trim().parse().ok())
        .unwrap_or(0)
}

fn run_system(setup: &Setup, system: System, k: usize) -> Result<Row> {
    let server = match system {
        System::Joader | System::JoaderDevice => {
            let s = ServerProc::start(
                "train",
                std::slice::from_ref(&setup.root),
                setup.cache_bytes,
            )?;
            let c = s.client();
            c.ok(
                "POST",
                "/v1/datasets",
                Some(&json!({"name": "d", "source": {"kind": "image_folder", "path": setup.root}})),
            )?;
            c.wait_ready("d", Duration::from_secs(600))?;
            Some(s)
        }
        _ => None,
    };
    let client = server.as_ref().map(ServerProc::client);
    let share = (setup.cores / k).max(1);
    let models: Vec<String> = (0..k)
        .map(|i| setup.models[i % setup.models.len()].clone())
        .collect();
    let configs: Vec<Value> = models
        .iter()
        .enumerate()
        .map(|(i, model)| {
            json!({"role": "job", "system": system.name(), "model": model, "batch": setup.batch,
                "classes": setup.classes, "seed": i, "job": format!("train-k{k}-{i}"),
                "server": server.as_ref().map_or(String::new(), |s| s.url.clone()),
                "root": setup.root, "workers": share, "threads": 1, "cuda": setup.cuda,
                "prefetch": setup.prefetch, "ring_capacity": setup.ring_capacity})
        })
        .collect();
    let monitor = setup
        .cuda
        .then(|| json!({"role": "monitor", "gpu": nvml_index()}));
    // The server's CPU by stage at each end of the window, where it exports it.
    let read = || -> Result<Option<Stages>> {
        let c = client.as_ref().context("no server")?;
        let (_, metrics) = c.call("GET", "/metrics", None)?;
        Ok(report::stage_cpu(metrics.as_str().unwrap_or("")))
    };
    let side = server.as_ref().map(|s| ServerSide {
        pid: s.pid(),
        read: &read,
    });
    let m = run_jobs(&configs, monitor.as_ref(), setup.warmup, setup.steps, side)?;
    let images: u64 = m.images.iter().sum();
    let window = m.window_s.max(1e-9);
    let per_image = |s: &Stages| -> Stages {
        s.iter()
            .map(|(k, v)| (k.clone(), v * 1e3 / images.max(1) as f64))
            .collect()
    };
    let decodes_per_image = match &client {
        Some(c) => {
            let stats = c.ok("GET", "/v1/stats", None)?;
            let f = |k: &str| {
                stats[k]
                    .as_f64()
                    .with_context(|| format!("no {k} in /v1/stats"))
            };
            Some(f("decodes")? / f("requests")?.max(1.0))
        }
        None if system == System::Pytorch => Some(1.0),
        None => None,
    };
    let server_stages = m.server_reads.as_ref().and_then(|(a, b)| {
        let (a, b) = (a.as_ref()?, b.as_ref()?);
        Some(per_image(
            &b.iter()
                .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
                .collect(),
        ))
    });
    Ok(Row {
        k,
        system,
        models,
        window_s: m.window_s,
        total: images as f64 / window,
        per_job: m.images.iter().map(|&n| n as f64 / window).collect(),
        gpu_util: m.gpu_util,
        server_cores: m.server_cores,
        jobs_cpu: m.jobs_cpu,
        decodes_per_image,
        server_stages,
        client_stages: m.client_stages.as_ref().map(per_image),
    })
}
