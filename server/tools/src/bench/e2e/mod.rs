//! `joader bench e2e`: the headline claim measured side by side in one run, with the training
//! recipe (the server caches each image decoded and resized to 256 on its shorter side; each
//! job crops it with RandomResizedCrop(224) + flip). Each scenario runs with joader (an
//! in-process server and one Rust consumer thread per job through the shared-memory rings),
//! with independent loading (every job has its own shuffled order read, decoded and resized
//! by the same code on the same number of shared worker threads, and augments on its own
//! thread, as joader's consumers do), and optionally with the Python client (`--python`: one
//! `joader.Loader` process per job, plus the training loop from cache: a 100 ms step per batch
//! of 64 on a cached second epoch) and PyTorch's DataLoader (`--torch`: tuned, with cores / K
//! workers per job, and with workers = cores per job); with `--source s3` also from a local S3
//! server beside local disk (`s3`), directly or through a proxy adding a latency to each
//! request (`--s3-latency-ms`, `proxy`); with `--parquet` the `parquet` source against the
//! same images in a folder (`parquet.rs`); with `--fields` samples with a caption and a JSON
//! document against the same images without (`fields.rs`); with `--preload` a working set
//! preloaded before its jobs (`preload.rs`); with `--arrays` the rows of a `.npy` file through
//! an `array` dataset against NumPy memmap readers (`arrays.rs`). Every system is timed
//! alike, from each job's start to its last sample, with the figure from the first batch
//! beside it (`systems.rs`). It prints and writes a markdown table and a PNG chart, the
//! baselines' aggregates by K (flat on a decode-bound machine when the threads are the same at
//! every K), and warns when a ratio against a baseline exceeds what sharing allows (K times the
//! ratio measured at K = 1: beyond it, the baseline lost throughput of its own). It measures
//! the decoded dataset's bytes before the scenarios and prints which fraction of it the cache
//! holds. Nothing is asserted: the figures are what this machine did in this run.

mod arrays;
mod fields;
mod gpu_lock;
mod parquet;
pub(crate) mod pin;
mod preload;
pub mod proxy;
mod report;
pub(crate) mod s3;
mod scenarios;
mod systems;
pub(crate) mod tier;

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use joader_pipeline::Pipeline;
use joader_storage::{DatasetIndex, SourceSpec};

use crate::synth::{SynthSpec, generate_image_folder};
use report::{chart, markdown};
use scenarios::{Scenario, scenarios};
use systems::{
    Outcome, TORCH, TORCH_CORES_PER_JOB, python_client_available, run_cached_step, run_independent,
    run_joader, run_python, run_torch, torch_available,
};

#[derive(Debug, Args)]
pub struct E2eArgs {
    /// Where the dataset is generated (on first use, reused afterwards): its `e2e` folder, or
    /// `e2e-quick` with `--quick`. Only that folder is indexed, so the other benches' datasets
    /// beside it (`cluster`, `scale` under the same default folder) are never read.
    #[arg(long, default_value = "joader-bench-data")]
    pub data: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    #[arg(long, default_value_t = 100)]
    pub per_class: u32,
    /// Shared-memory cache size (bytes or 96MiB, 1GiB, …). The run measures the decoded
    /// dataset (each image decoded and resized to 256 on its shorter side) and prints the
    /// fraction the cache holds: with the default dataset (1000 images, 341×256×3 bytes each
    /// decoded: 262 MB) the default holds about 38% of it.
    #[arg(long, default_value = "96MiB", value_parser = server::config::parse_bytes)]
    pub cache_bytes: u64,
    /// Decode threads of both joader and the independent baseline (default: cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Where the markdown table and the PNG chart go.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// A tiny run (for CI): few images, a subset of the scenarios.
    #[arg(long)]
    pub quick: bool,
    /// Also run PyTorch's DataLoader over torchvision's ImageFolder with PIL: tuned (cores / K
    /// workers per job, at least one, persistent, one thread each) and with workers = cores per
    /// job; needs torch, torchvision and pillow in python3.
    #[arg(long)]
    pub torch: bool,
    /// `s3`: also run every scenario with the dataset in a local S3 server (`s3s-fs` over a
    /// copy of it) beside local disk, both served by a `joader serve` child.
    #[arg(long, value_enum, default_value = "disk")]
    pub source: s3::Source,
    /// The `s3s-fs` binary of `--source s3` (default: `JOADER_S3S_FS`).
    #[arg(long)]
    pub s3s_fs: Option<PathBuf>,
    /// With `--source s3`: read the store through a proxy on loopback that delays each
    /// request by this many ms (a store with a real network's latency); repeat for S3 rows at
    /// several latencies (`--s3-latency-ms 0 --s3-latency-ms 30`). Default: the store directly.
    #[arg(long)]
    pub s3_latency_ms: Vec<u64>,
    /// With `--source s3`: the last N CPUs are the store's (`s3s-fs` and the delay proxy),
    /// everything else of the bench runs on the others, every row alike: a store on other
    /// machines, as a real one is (`pin.rs`). Default 0: all share every CPU.
    #[arg(long, default_value_t = 0)]
    pub store_cpus: usize,
    /// Also run the Python client (one `joader.Loader` process per job); needs the `joader`
    /// package in python3 (`pip install ./dataplane/python`).
    #[arg(long)]
    pub python: bool,
    /// Run only the scenarios whose name contains this (`sync`, `overlap`, `cached`,
    /// `gpu lock`, …).
    #[arg(long)]
    pub only: Option<String>,
    /// The GPU-lock scenario's step per batch, in ms (default 48; 12 with `--quick`).
    #[arg(long)]
    pub gpu_step_ms: Option<f64>,
    /// Also compare the `parquet` source with the image folder on the same JPEGs written as
    /// Hugging Face's `datasets` writes them (needs pyarrow in python3): K = 4 jobs, each
    /// source served by a `joader serve` child (`parquet.rs`).
    #[arg(long)]
    pub parquet: bool,
    /// The codec of `--parquet`'s files: `snappy` (pyarrow's and `datasets`' default),
    /// `zstd` or `gzip`.
    #[arg(long, value_enum, default_value = "snappy")]
    pub parquet_compression: parquet::Codec,
    /// Also compare samples with a caption and a JSON document (WebDataset shards of the same
    /// JPEGs declared with `fields`) with the same shards without them: K = 4 jobs, each
    /// served by a `joader serve` child (`fields.rs`).
    #[arg(long)]
    pub fields: bool,
    /// Also measure a working set preloaded before its jobs (`preload.rs`): the time to
    /// preload the whole dataset against the server's Loader pool decoding the same files in
    /// the same run, then K = 4 jobs started after it (decodes, hit ratio).
    #[arg(long)]
    pub preload: bool,
    /// Also compare samples that are not images (`arrays.rs`): K = 4 jobs over the rows of a
    /// 1 GiB `.npy` file of 224x224x3 uint8 rows (128 rows with `--quick`), through joader's
    /// `array` source and the Python client, against K NumPy processes reading the same file
    /// by `np.load(mmap_mode="r")` in their own shuffled orders; needs the `joader` package and
    /// NumPy in python3.
    #[arg(long)]
    pub arrays: bool,
}

/// What every system of a run shares: the dataset, its index, the threads and the pipeline.
pub(super) struct Ctx {
    pub(super) root: PathBuf,
    pub(super) index: Arc<DatasetIndex>,
    pub(super) workers: usize,
    pub(super) cache_bytes: u64,
    pub(super) pipeline: Pipeline,
    /// The bytes of every image decoded by `pipeline` (what the cache would hold of all of them).
    pub(super) decoded_bytes: u64,
}

pub fn run(args: E2eArgs) -> Result<()> {
    if args.store_cpus > 0 && args.source != s3::Source::S3 {
        bail!("--store-cpus is for --source s3");
    }
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
    let data = args.data.join(if args.quick { "e2e-quick" } else { "e2e" });
    std::fs::create_dir_all(&data)?;
    let root = data.canonicalize()?;
    let t = Instant::now();
    let n = generate_image_folder(&root, &spec, &mut |_| {})? as u32;
    eprintln!(
        "dataset: {n} JPEGs of 500x375 in {} ({:.1} s)",
        root.display(),
        t.elapsed().as_secs_f64()
    );
    // Every system reads the files from the page cache: without this, the first system of the
    // first scenario would pay for cold reads that the others do not.
    let warmed = super::warm_page_cache(&root)?;
    eprintln!("page cache: read {warmed} bytes of the dataset once before the scenarios");
    let index = Arc::new(joader_storage::index(
        &SourceSpec::ImageFolder { path: root.clone() },
        std::slice::from_ref(&root),
        &mut |_| {},
    )?);
    let split = match args.store_cpus {
        0 => None,
        n => {
            let split = pin::Split::of(n)?;
            split.pin_this_process()?;
            eprintln!("{}", split.describe());
            Some(split)
        }
    };
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let pipeline = Pipeline::Decode {
        resize_shorter: Some(256),
        center_crop: None,
    };
    let t = Instant::now();
    let decoded_bytes = super::decoded_bytes(&index, &pipeline, workers)?;
    eprintln!(
        "decoded dataset: {decoded_bytes} bytes ({n} images decoded and resized once, {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let ctx = Ctx {
        root: root.clone(),
        index,
        workers,
        cache_bytes: args.cache_bytes,
        pipeline,
        decoded_bytes,
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
    let python = args.python
        && {
            let ok = python_client_available();
            if !ok {
                eprintln!(
                    "Python client skipped: python3 cannot import joader (pip install ./dataplane/python)"
                );
            }
            ok
        };
    let store = match args.source {
        s3::Source::Disk => None,
        s3::Source::S3 => Some(s3::Store::start(
            &ctx,
            &s3::s3s_fs(args.s3s_fs.as_deref())?,
            &args.s3_latency_ms,
            split,
        )?),
    };
    let mut s3_rows = Vec::new();
    let mut tier_rows = Vec::new();
    let started = Instant::now();
    let mut rows: Vec<(Scenario, Vec<Outcome>)> = Vec::new();
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    let chosen = scenarios(n, args.quick)
        .into_iter()
        .filter(|sc| wanted(&sc.name));
    for (i, sc) in chosen.enumerate() {
        eprintln!("scenario {}: {} job(s)", sc.name, sc.jobs.len());
        // Interleaved: the systems run one after the other on the same scenario.
        let mut outs = vec![run_joader(&sc, &ctx, i)?, run_independent(&sc, &ctx)?];
        if python {
            outs.push(run_python(&sc, &ctx, i)?);
        }
        if torch {
            let k = sc.jobs.len();
            outs.push(run_torch(&sc, &ctx, TORCH, (workers / k).max(1))?);
            outs.push(run_torch(&sc, &ctx, TORCH_CORES_PER_JOB, workers)?);
        }
        if let Some(store) = &store {
            let (disk, s3) = store.run_all(&sc, &ctx, i)?;
            outs.push(disk.clone());
            for (o, fetched) in s3 {
                s3_rows.push((sc.name.clone(), disk.clone(), o.clone(), fetched));
                outs.push(o);
            }
            // The disk tier's rows (`tier.rs`) at K = 4.
            if sc.jobs.len() == 4 {
                tier_rows.push(tier::run_k(store, &sc, &ctx, i)?);
            }
        }
        rows.push((sc, outs));
    }
    // The training loop from cache (the Python client only): cheap, a few seconds.
    let cached = if python && wanted("cached step") {
        eprintln!("scenario cached step: 1 job, 2 epochs");
        Some(run_cached_step(&ctx, 64, 100.0)?)
    } else {
        None
    };
    // K jobs paced by one shared GPU (a lock held for each step), on real photos. `--quick`
    // runs it only when asked for by name.
    let gpu_lock = if wanted("gpu lock") && (!args.quick || args.only.is_some()) {
        let mut shape = gpu_lock::GpuLock::new(args.quick);
        if let Some(ms) = args.gpu_step_ms {
            shape.step_ms = ms;
        }
        eprintln!(
            "scenario gpu lock: {} jobs, {} epochs",
            shape.jobs, shape.epochs
        );
        Some(gpu_lock::run(&args.data, shape, workers)?)
    } else {
        None
    };
    let mut table = if rows.is_empty() {
        String::new()
    } else {
        markdown(&rows, workers, args.cache_bytes, decoded_bytes, n)
    };
    table.push_str(&report::stages(&rows));
    table.push_str(&report::baselines_by_k(&rows));
    if let Some(c) = &cached {
        table.push_str(&report::cached_step(c));
    }
    if let Some(g) = &gpu_lock {
        table.push_str(&gpu_lock::report(g));
    }
    if let Some(store) = &store {
        table.push_str(&store.report(&s3_rows));
        // One job on a tier of half the dataset, three epochs (with the K = 4 rows, or alone
        // with `--only "tier half"`).
        let half = if !tier_rows.is_empty() || wanted("tier half") {
            eprintln!("scenario tier half: 1 job, 3 epochs on a tier of half the dataset");
            Some(tier::run_half(store, &ctx, 3)?)
        } else {
            None
        };
        if !tier_rows.is_empty() || half.is_some() {
            table.push_str(&tier::report(&tier_rows, half.as_ref()));
        }
        // With `--parquet`: the same files as Parquet, from local disk and through the tier.
        if args.parquet {
            let codec = args.parquet_compression;
            let local = parquet::write_parquet(&ctx.root, n, codec)?;
            super::warm_page_cache(&local)?;
            let sc = scenarios::Scenario::together("s3 parquet K=4".into(), 4, n, 16);
            eprintln!("scenario {}: the tier over Parquet objects", sc.name);
            table.push_str(&tier::run_parquet(store, &sc, &ctx, &local, codec.name())?);
        }
    }
    if args.parquet {
        table.push_str(&parquet::run(&ctx, n, args.parquet_compression)?);
    }
    if args.fields {
        table.push_str(&fields::run(&ctx, n)?);
    }
    if args.preload {
        table.push_str(&preload::run(&ctx, n)?);
    }
    if args.arrays {
        // With an s3s-fs at hand, the rows in a bucket too.
        let s3s_fs = s3::s3s_fs(args.s3s_fs.as_deref()).ok();
        table.push_str(&arrays::run(&ctx, args.quick, s3s_fs.as_deref())?);
    }
    println!("{table}");
    for w in report::warnings(&rows) {
        eprintln!("WARNING: {w}");
    }
    std::fs::create_dir_all(&args.out)?;
    let md = args.out.join("e2e.md");
    std::fs::write(&md, &table)?;
    let png = args.out.join("e2e.png");
    if rows.is_empty() {
        eprintln!("wrote {}", md.display());
    } else {
        match chart(&rows, &png) {
            Ok(()) => eprintln!("wrote {} and {}", md.display(), png.display()),
            Err(e) => eprintln!("wrote {}; no chart: {e:#}", md.display()),
        }
    }
    eprintln!("bench e2e took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}
