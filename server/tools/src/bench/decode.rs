//! `joader bench decode`: the shared pipeline (decode + resize shorter side 256 + center crop
//! 224) against Pillow, Pillow with `draft()` and Pillow tuned (`draft()` plus its fused crop +
//! resize, `resize(size, box=…, reducing_gap=2.0)`) on the same files in the same run, one
//! thread each; joader's full-size decode path beside it (what the DCT scaling saves, and what
//! a DCT scale left out of the default must beat: `--eighths`); and the Loader's real worker
//! pool with one thread and with all cores. Every contender's output is
//! kept (Pillow's `tobytes()`, joader's through `std::hint::black_box`), so no compiler or
//! library can skip the work.
//!
//! By default the files are real photos ([`super::photos`]), kept in a cache folder; with
//! `--from DIR` they are the user's own images, only read. Nothing is written into any dataset
//! folder.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, Addr, Handler};
use actors::{CacheStats, ElementSource, Load, LoadFailure, Loaded, Loader, Prepare};
use anyhow::{Context as _, Result, bail};
use clap::Args;
use joader_pipeline::{self as pipeline, Limits, Pipeline};
use serde_json::{Value, json};

use super::photos;
use server::loading::PipelinePrepare;

#[derive(Debug, Args)]
pub struct DecodeBenchArgs {
    /// Benchmark the JPEG and PNG files under this folder (searched recursively; only read)
    /// instead of the photos.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Where the downloaded photos and their re-encoded sizes are kept and reused (default:
    /// $XDG_CACHE_HOME/joader or ~/.cache/joader).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Print, as the last line, one JSON object with the figures.
    #[arg(long)]
    pub json: bool,
    /// Seconds each figure is timed over: whole passes over the files, in rounds taken in turn
    /// by every contender, each keeping its best round.
    #[arg(long, default_value_t = 3.0)]
    pub min_seconds: f64,
    /// Loader threads of the all-cores figure (default: number of cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The DCT scales, in eighths (M of M/8, e.g. `1,2,4,7`), that the joader column may
    /// decode a JPEG at, instead of the pipeline's default (1, 2, 4 and 5): how a scale left out
    /// of the default is measured against the full decode beside it. The Loader's columns
    /// always run the default.
    #[arg(long, value_delimiter = ',')]
    pub eighths: Option<Vec<u32>>,
}

const PIPELINE: Pipeline = Pipeline::Decode {
    resize_shorter: Some(256),
    center_crop: Some([224, 224]),
};

/// The figures of one set of files.
struct Row {
    label: String,
    images: usize,
    skipped: usize,
    bits_per_pixel: Option<f64>,
    joader: f64,
    joader_full: f64,
    pillow: Option<f64>,
    pillow_draft: Option<f64>,
    pillow_tuned: Option<f64>,
    loader_one: f64,
    loader_all: f64,
}

pub fn decode(args: DecodeBenchArgs) -> Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let pillow = std::process::Command::new("python3")
        .args(["-c", "import PIL"])
        .output()
        .is_ok_and(|o| o.status.success());
    let sets: Vec<(String, Vec<PathBuf>)> = match &args.from {
        Some(dir) => vec![(dir.display().to_string(), images_under(dir)?)],
        None => {
            let cache = args.cache.clone().unwrap_or_else(photos::default_cache);
            eprintln!(
                "photos: scikit-image's and scikit-learn's data files, re-encoded into {}",
                cache.display()
            );
            let sources = photos::fetch()?;
            photos::corpus(&cache, &sources)?
                .into_iter()
                .map(|s| (format!("{}x{}", s.width, s.height), s.files))
                .collect()
        }
    };
    println!(
        "joader bench decode: decode + resize shorter side 256 (bilinear) + center crop 224; \
         each figure is the best of {ROUNDS} rounds (taken in turn) of >= {:.2} s of whole passes",
        args.min_seconds / ROUNDS as f64
    );
    if args.from.is_none() {
        println!(
            "files: real photos, quality 90; per size each photo as 4:2:0 and 4:4:4, plus one \
             progressive and one grayscale (sizes above a photo's are mosaics of native crops)"
        );
    }
    println!(
        "Pillow: convert(RGB), resize, crop; + draft(): a DCT-scaled decode first; tuned: draft(), \
         then one resize((224, 224), BILINEAR, box=the crop, reducing_gap=2.0) (its fused crop + \
         resize) on the decoded mode"
    );
    if !pillow {
        println!("Pillow is not installed (pip install pillow): Pillow's columns are empty");
    }
    let eighths = args
        .eighths
        .clone()
        .unwrap_or_else(|| pipeline::DCT_EIGHTHS.to_vec());
    if eighths != pipeline::DCT_EIGHTHS {
        println!(
            "joader img/s: DCT scales {eighths:?}/8 (the default is {:?}/8, which the Loader's \
             columns run)",
            pipeline::DCT_EIGHTHS
        );
    }
    let header = format!(
        "| files | images | bits/px | joader img/s | joader full decode | Pillow | Pillow + draft() | Pillow tuned | vs Pillow | vs Pillow + draft() | vs Pillow tuned | Loader 1 thread | Loader {threads} threads | scaling |"
    );
    println!("\n{header}");
    println!("|{}", "---|".repeat(14));
    let mut rows = Vec::new();
    for (label, paths) in sets {
        let row = measure(&label, &paths, pillow, threads, args.min_seconds, &eighths)?;
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
        let ratio =
            |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:.2}×", row.joader / x));
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2}× |",
            row.label,
            row.images,
            row.bits_per_pixel.map_or("-".into(), |b| format!("{b:.2}")),
            row.joader,
            row.joader_full,
            opt(row.pillow),
            opt(row.pillow_draft),
            opt(row.pillow_tuned),
            ratio(row.pillow),
            ratio(row.pillow_draft),
            ratio(row.pillow_tuned),
            row.loader_one,
            row.loader_all,
            row.loader_all / row.loader_one,
        );
        if row.skipped > 0 {
            println!(
                "  ({} files of {} could not be prepared and are left out)",
                row.skipped, row.label
            );
        }
        rows.push(row);
    }
    println!(
        "\ntargets: >= 2× Pillow everywhere; >= 2× Pillow + draft() at 500x375, 1.5× at \
         1000x750, 1.1× at 2000x1500 and 4000x3000; Loader scaling >= 1.8× on 2 cores"
    );
    if args.json {
        println!("{}", summary(&rows, threads));
    }
    Ok(())
}

/// One JSON object: totals over every file (`images`, `joader_images_per_s`, …) and one entry
/// per set of files.
fn summary(rows: &[Row], threads: usize) -> Value {
    // Images per second over all sets: total images over the total time one image of each set
    // takes, weighted by the set's size.
    let total: usize = rows.iter().map(|r| r.images).sum();
    let rate = |f: &dyn Fn(&Row) -> Option<f64>| -> Option<f64> {
        let mut secs = 0.0;
        for r in rows {
            secs += r.images as f64 / f(r)?;
        }
        (secs > 0.0).then(|| total as f64 / secs)
    };
    let sets: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "files": r.label,
                "images": r.images,
                "skipped": r.skipped,
                "bits_per_pixel": r.bits_per_pixel,
                "joader_images_per_s": r.joader,
                "joader_full_decode_images_per_s": r.joader_full,
                "pillow_images_per_s": r.pillow,
                "pillow_draft_images_per_s": r.pillow_draft,
                "pillow_tuned_images_per_s": r.pillow_tuned,
                "loader_1_thread_images_per_s": r.loader_one,
                "loader_all_threads_images_per_s": r.loader_all,
            })
        })
        .collect();
    json!({
        "images": total,
        "joader_images_per_s": rate(&|r| Some(r.joader)),
        "joader_full_decode_images_per_s": rate(&|r| Some(r.joader_full)),
        "pillow_images_per_s": rate(&|r| r.pillow),
        "pillow_draft_images_per_s": rate(&|r| r.pillow_draft),
        "pillow_tuned_images_per_s": rate(&|r| r.pillow_tuned),
        "loader_threads": threads,
        "loader_1_thread_images_per_s": rate(&|r| Some(r.loader_one)),
        "loader_all_threads_images_per_s": rate(&|r| Some(r.loader_all)),
        "sets": sets,
    })
}

/// Every `.jpg`, `.jpeg` and `.png` file under `dir`, sorted.
pub(crate) fn images_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let path = e?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| {
                ["jpg", "jpeg", "png"].contains(&x.to_string_lossy().to_lowercase().as_str())
            }) {
                out.push(path);
            }
        }
    }
    if out.is_empty() {
        bail!("no .jpg, .jpeg or .png file under {}", dir.display());
    }
    out.sort();
    Ok(out)
}

/// Rounds of each measurement (see [`measure`]).
const ROUNDS: usize = 3;

/// Pillow's images per second (`mode`: `plain`, `draft` or `tuned`, see `pillow_decode.py`)
/// on `paths`, in a Python process.
fn pillow_rate(has_pillow: bool, mode: &str, min: f64, paths: &[PathBuf]) -> Option<f64> {
    if !has_pillow {
        return None;
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            include_str!("pillow_decode.py"),
            mode,
            &min.to_string(),
        ])
        .args(paths)
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["images_per_s"].as_f64()
}

fn measure(
    label: &str,
    paths: &[PathBuf],
    has_pillow: bool,
    threads: usize,
    min: f64,
    eighths: &[u32],
) -> Result<Row> {
    let limits = Limits::default();
    let mut files = Vec::new();
    let (mut bits, mut pixels, mut skipped) = (0u64, 0u64, 0usize);
    let mut kept = Vec::new();
    for p in paths {
        let bytes = std::fs::read(p).with_context(|| format!("read {}", p.display()))?;
        match (
            pipeline::dimensions(&bytes),
            pipeline::run(&PIPELINE, &bytes, &limits),
        ) {
            (Ok((w, h)), Ok(_)) => {
                bits += bytes.len() as u64 * 8;
                pixels += u64::from(w) * u64::from(h);
                files.push(bytes);
                kept.push(p.clone());
            }
            _ => skipped += 1,
        }
    }
    if files.is_empty() {
        bail!(
            "none of the {} files of {label} could be prepared",
            paths.len()
        );
    }
    // Load from other processes comes and goes: every contender runs in each of ROUNDS
    // rounds, one after the other, and keeps its best round, so that all of them had the same
    // chances of a quiet moment.
    let slice = min / ROUNDS as f64;
    let files = Arc::new(files);
    let (mut joader, mut joader_full, mut loader_one, mut loader_all) = (0f64, 0f64, 0f64, 0f64);
    let (mut pillow, mut pillow_draft, mut pillow_tuned) = (None::<f64>, None::<f64>, None::<f64>);
    let best = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    for _ in 0..ROUNDS {
        joader = joader.max(one_thread(&files, slice, |b| {
            pipeline::run_with_scales(&PIPELINE, b, &limits, eighths)
        }));
        joader_full = joader_full.max(one_thread(&files, slice, |b| {
            pipeline::run_full_decode(&PIPELINE, b, &limits)
        }));
        pillow = best(pillow, pillow_rate(has_pillow, "plain", slice, &kept));
        pillow_draft = best(pillow_draft, pillow_rate(has_pillow, "draft", slice, &kept));
        pillow_tuned = best(pillow_tuned, pillow_rate(has_pillow, "tuned", slice, &kept));
        loader_one = loader_one.max(loader_pool(&files, 1, slice, &PIPELINE)?);
        loader_all = loader_all.max(loader_pool(&files, threads, slice, &PIPELINE)?);
    }
    Ok(Row {
        label: label.to_string(),
        images: files.len(),
        skipped,
        bits_per_pixel: Some(bits as f64 / pixels as f64),
        joader,
        joader_full,
        pillow,
        pillow_draft,
        pillow_tuned,
        loader_one,
        loader_all,
    })
}

/// Images per second of `f` on this thread, over whole passes for at least `min` seconds
/// (one image first, untimed, to warm up); every result goes through `black_box`, so that
/// none of the work can be optimized away.
fn one_thread<T>(files: &[Vec<u8>], min: f64, f: impl Fn(&[u8]) -> T) -> f64 {
    std::hint::black_box(f(&files[0]));
    let start = Instant::now();
    let mut n = 0usize;
    loop {
        for b in files {
            std::hint::black_box(f(b));
        }
        n += files.len();
        let secs = start.elapsed().as_secs_f64();
        if secs >= min {
            return n as f64 / secs;
        }
    }
}

/// The in-memory files as a dataset.
struct Blobs(Arc<Vec<Vec<u8>>>);

impl ElementSource for Blobs {
    fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
        Ok(self.0[element as usize].clone())
    }
    fn label(&self, _: u32) -> i64 {
        0
    }
}

/// Counts what the Loader sends back.
struct Count(tokio::sync::mpsc::UnboundedSender<bool>);

impl Actor for Count {
    type Context = actix::Context<Self>;
}

impl Handler<Loaded> for Count {
    type Result = ();
    fn handle(&mut self, msg: Loaded, _: &mut actix::Context<Self>) {
        let _ = self.0.send(msg.results.iter().all(|(_, r)| r.is_ok()));
    }
}

/// Images per second through the server's real Loader (its worker pool, `workers` threads, at
/// the decode priority) preparing `files` by `pipeline`, over whole passes for at least `min`
/// seconds.
pub(crate) fn loader_pool(
    files: &Arc<Vec<Vec<u8>>>,
    workers: usize,
    min: f64,
    pipeline: &Pipeline,
) -> Result<f64> {
    let files = files.clone();
    actix::System::new().block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let count = Count(tx).start();
        let stats = Arc::new(CacheStats::default());
        let loader = Loader::new(workers, count.recipient(), stats).start();
        let source: Arc<dyn ElementSource> = Arc::new(Blobs(files.clone()));
        let prepare: Arc<dyn Prepare> = Arc::new(PipelinePrepare {
            pipeline: pipeline.clone(),
            limits: Limits::default(),
        });
        let pass = |loader: &Addr<Loader>| {
            for element in 0..files.len() as u32 {
                loader.do_send(Load {
                    dataset: 0,
                    element,
                    source: source.clone(),
                    pipelines: vec![(0, prepare.clone())],
                });
            }
        };
        let start = Instant::now();
        let mut n = 0usize;
        loop {
            pass(&loader);
            for _ in 0..files.len() {
                match rx.recv().await {
                    Some(true) => {}
                    Some(false) => bail!("the loader failed to prepare a file"),
                    None => bail!("the loader stopped"),
                }
            }
            n += files.len();
            let secs = start.elapsed().as_secs_f64();
            if secs >= min {
                return Ok(n as f64 / secs);
            }
        }
    })
}
