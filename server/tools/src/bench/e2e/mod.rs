//! `joader bench e2e`: the headline claim measured side by side in one run, with the training
//! recipe (the server caches each image decoded and resized to 256 on its shorter side; each
//! job crops it with RandomResizedCrop(224) + flip). Each scenario runs with joader (an
//! in-process server and one Rust consumer thread per job through the shared-memory rings),
//! with independent loading (every job has its own shuffled order read, decoded and resized
//! by the same code on the same number of shared worker threads, and augments on its own
//! thread, as joader's consumers do), and optionally with the Python client (`--python`: one
//! `joader.Loader` process per job, plus the training loop from cache: a 100 ms step per batch
//! of 64 on a cached second epoch) and a tuned PyTorch DataLoader (`--torch`); with
//! `--source s3` also from a local S3 server beside local disk (`s3`). It prints and writes a
//! markdown table and a PNG chart, prints independent loading's aggregate by K (flat on a
//! decode-bound machine), and warns when a ratio exceeds the number of jobs (sharing among K
//! jobs cannot beat K×: the baseline was disturbed). Nothing is asserted: the figures are what
//! this machine did in this run.

mod report;
mod s3;
mod scenarios;
mod systems;

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use joader_pipeline::Pipeline;
use joader_storage::{DatasetIndex, SourceSpec};

use crate::synth::{SynthSpec, generate_image_folder};
use report::{chart, markdown};
use scenarios::{Scenario, scenarios};
use systems::{
    Outcome, python_client_available, run_cached_step, run_independent, run_joader, run_python,
    run_torch, torch_available,
};

#[derive(Debug, Args)]
pub struct E2eArgs {
    /// Dataset folder (generated on first use, reused afterwards).
    #[arg(long, default_value = "joader-bench-data")]
    pub data: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    #[arg(long, default_value_t = 100)]
    pub per_class: u32,
    /// Shared-memory cache size (bytes or 96MiB, 1GiB, …); the default holds about 60% of
    /// the decoded dataset.
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
    /// Also run PyTorch's DataLoader over torchvision's ImageFolder with PIL, tuned (workers =
    /// cores, persistent, one thread each); needs torch, torchvision and pillow in python3.
    #[arg(long)]
    pub torch: bool,
    /// `s3`: also run every scenario with the dataset in a local S3 server (`s3s-fs` over a
    /// copy of it) beside local disk, both served by a `joader serve` child.
    #[arg(long, value_enum, default_value = "disk")]
    pub source: s3::Source,
    /// The `s3s-fs` binary of `--source s3` (default: `JOADER_S3S_FS`).
    #[arg(long)]
    pub s3s_fs: Option<PathBuf>,
    /// Also run the Python client (one `joader.Loader` process per job); needs the `joader`
    /// package in python3 (`pip install ./dataplane/python`).
    #[arg(long)]
    pub python: bool,
    /// Run only the scenarios whose name contains this (`sync`, `overlap`, `cached`, …).
    #[arg(long)]
    pub only: Option<String>,
}

/// What every system of a run shares: the dataset, its index, the threads and the pipeline.
pub(super) struct Ctx {
    pub(super) root: PathBuf,
    pub(super) index: Arc<DatasetIndex>,
    pub(super) workers: usize,
    pub(super) cache_bytes: u64,
    pub(super) pipeline: Pipeline,
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
    // Every system reads the files from the page cache: without this, the first system of the
    // first scenario would pay for cold reads that the others do not.
    let warmed = super::warm_page_cache(&root)?;
    eprintln!("page cache: read {warmed} bytes of the dataset once before the scenarios");
    let index = Arc::new(joader_storage::index(
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
        cache_bytes: args.cache_bytes,
        pipeline: Pipeline::Decode {
            resize_shorter: Some(256),
            center_crop: None,
        },
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
        )?),
    };
    let mut s3_rows = Vec::new();
    let started = Instant::now();
    let mut rows: Vec<(Scenario, Vec<Outcome>)> = Vec::new();
    let mut epoch_alone_s = 0.0;
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    let chosen = scenarios(n, args.quick)
        .into_iter()
        .filter(|sc| wanted(&sc.name));
    for (i, sc) in chosen.enumerate() {
        eprintln!("scenario {}: {} job(s)", sc.name, sc.jobs.len());
        // Interleaved: the systems run one after the other on the same scenario.
        let mut outs = vec![run_joader(&sc, &ctx, i)?, run_independent(&sc, &ctx)?];
        if i == 0 {
            epoch_alone_s = f64::from(n) / outs[1].aggregate.max(1e-9);
        }
        if python {
            outs.push(run_python(&sc, &ctx, i, epoch_alone_s)?);
        }
        if torch {
            outs.push(run_torch(&sc, &ctx, epoch_alone_s)?);
        }
        if let Some(store) = &store {
            let (disk, s3, fetched) = store.run_both(&sc, &ctx, i)?;
            s3_rows.push((sc.name.clone(), disk.clone(), s3.clone(), fetched));
            outs.extend([disk, s3]);
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
    let mut table = if rows.is_empty() {
        String::new()
    } else {
        markdown(&rows, workers, args.cache_bytes, n)
    };
    if let Some(line) = report::independent_by_k(&rows) {
        table.push_str(&line);
    }
    if let Some(c) = &cached {
        table.push_str(&report::cached_step(c));
    }
    if let Some(store) = &store {
        table.push_str(&store.report(&s3_rows));
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
