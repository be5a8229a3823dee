//! `joader bench e2e`'s GPU-lock scenario: K training jobs paced by one shared GPU, on 2 cores.
//!
//! On a GPU machine the jobs' steps run one after the other on the one GPU, so each job's
//! batches return at a different moment of a common period, and the jobs' credits reach the
//! Sampler apart. Here the GPU is one lock that each job holds for its step (`--gpu-step-ms`)
//! on each batch, the jobs read through the same prefetch as the Python client
//! (`dataplane::prefetch`: the batch is copied out, augmented with RandomResizedCrop(224) +
//! flip and acknowledged on a prefetch thread, two batches ahead), the dataset is real-photo
//! JPEGs of 500×375 (crops of the `bench decode` photos), and the cache holds about 36% of the
//! decoded set. The server is a `joader serve` child, so that its CPU is its own.
//!
//! Printed: decodes per delivered image (perfect sharing among K jobs of one dataset: 1/K),
//! the server's CPU per decode beside the bare pipeline's (read + decode + resize of the same
//! files on one thread of this process, thread CPU time, in the same run), each job's rate and
//! the total pace against the lock's limit (one batch per step).

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dataplane::RawReader;
use dataplane::augment::{Output as AugOutput, RandomResizedCrop};
use dataplane::prefetch::{PrefetchConfig, Prefetcher};
use joader_pipeline::{self as pipeline, Limits, Pipeline};
use joader_storage::DatasetIndex;
use serde_json::json;

use super::systems::recipe_pipeline;
use crate::bench::scale::procs::{ServerProc, cpu_seconds};
use crate::bench::train::jobs::Stages;
use crate::bench::train::report::stage_cpu;

/// The scenario's shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct GpuLock {
    pub(super) images: u32,
    pub(super) jobs: usize,
    pub(super) batch: usize,
    pub(super) step_ms: f64,
    pub(super) epochs: u64,
    /// Fraction of the decoded set the cache holds.
    pub(super) cache_frac: f64,
}

impl GpuLock {
    pub(super) fn new(quick: bool) -> Self {
        if quick {
            GpuLock {
                images: 240,
                jobs: 2,
                batch: 16,
                step_ms: 12.0,
                epochs: 2,
                cache_frac: 0.36,
            }
        } else {
            GpuLock {
                images: 3600,
                jobs: 4,
                batch: 64,
                step_ms: 48.0,
                epochs: 3,
                cache_frac: 0.36,
            }
        }
    }
}

/// The GPU: one step at a time, in the order the jobs asked (a GPU shared by several
/// processes time-slices between them; an unfair lock would let a job that just stepped step
/// again at once, which no GPU does).
#[derive(Default)]
struct Gpu {
    /// The next ticket to hand out, and the ticket whose step runs.
    tickets: Mutex<(u64, u64)>,
    turn: Condvar,
}

impl Gpu {
    /// Waits for this job's turn, then holds the GPU for `d`.
    fn step(&self, d: Duration) {
        let mut t = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let mine = t.0;
        t.0 += 1;
        while t.1 != mine {
            t = self.turn.wait(t).unwrap_or_else(|e| e.into_inner());
        }
        drop(t);
        std::thread::sleep(d);
        self.tickets.lock().unwrap_or_else(|e| e.into_inner()).1 += 1;
        self.turn.notify_all();
    }
}

/// What one run of the scenario measured.
#[derive(Debug, Clone)]
pub(super) struct GpuLockOutcome {
    pub(super) shape: GpuLock,
    pub(super) delivered: u64,
    pub(super) decodes: u64,
    pub(super) per_job: Vec<f64>,
    pub(super) total_rate: f64,
    pub(super) server_cpu_ms_per_decode: f64,
    /// The bare pipeline's CPU per image, measured before and after the jobs (the machine's
    /// speed drifts; the ratio uses their mean).
    pub(super) bare_cpu_ms_per_image: (f64, f64),
    /// The same on as many threads at once as the server's loader workers (sharing the
    /// caches and the memory bus as the workers do), before and after the jobs.
    pub(super) bare_threads_cpu_ms_per_image: (f64, f64),
    pub(super) workers: usize,
    pub(super) cache_bytes: u64,
    pub(super) decoded_bytes: u64,
    pub(super) waits_for_others: u64,
    /// The server's CPU by stage over the jobs' run (`joader_stage_cpu_seconds_total`).
    pub(super) stages: Stages,
}

/// A folder of `n` real-photo JPEGs of 500×375 (quality 90, 4:2:0) in 10 class folders under
/// `dir`, made as `bench train` makes its dataset (written once; reused when complete).
pub(super) fn photo_folder(dir: &Path, n: u32) -> Result<PathBuf> {
    let root = dir.join(format!("e2e-photos-{n}"));
    crate::bench::train::data::generate(&root, n, 10)?;
    Ok(root)
}

/// This thread's CPU time (`dataplane::stages`' clock).
fn thread_cpu() -> Duration {
    Duration::from_nanos(dataplane::stages::thread_cpu_ns())
}

/// The bare pipeline over every element of `index` on this thread: (CPU ms per image, decoded
/// bytes).
fn bare_pipeline(index: &DatasetIndex, pipeline: &Pipeline) -> Result<(f64, u64)> {
    let limits = Limits {
        max_pixels: 100_000_000,
    };
    let mut bytes = 0u64;
    let t0 = thread_cpu();
    for e in 0..index.len() as u32 {
        let file = index.read(e).with_context(|| format!("read element {e}"))?;
        bytes += pipeline::run(pipeline, &file, &limits)?.len() as u64;
    }
    let ms = (thread_cpu() - t0).as_secs_f64() * 1e3 / index.len().max(1) as f64;
    Ok((ms, bytes))
}

/// The bare pipeline over every element of `index` on `threads` threads at once (element `e`
/// on thread `e % threads`): their CPU summed, per image.
fn bare_pipeline_threads(index: &DatasetIndex, pipeline: &Pipeline, threads: usize) -> Result<f64> {
    let threads = threads.max(1);
    let limits = Limits {
        max_pixels: 100_000_000,
    };
    let cpu: Result<Vec<Duration>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<Duration> {
                    let t0 = thread_cpu();
                    for e in (t..index.len()).step_by(threads) {
                        let file = index
                            .read(e as u32)
                            .with_context(|| format!("read element {e}"))?;
                        pipeline::run(pipeline, &file, &limits)?;
                    }
                    Ok(thread_cpu() - t0)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a bare pipeline thread panicked"))?
            })
            .collect()
    });
    let total: Duration = cpu?.into_iter().sum();
    Ok(total.as_secs_f64() * 1e3 / index.len().max(1) as f64)
}

/// Runs the scenario on the photos under `data`.
pub(super) fn run(data: &Path, shape: GpuLock, workers: usize) -> Result<GpuLockOutcome> {
    if !(shape.step_ms.is_finite() && shape.step_ms >= 0.0) {
        bail!(
            "--gpu-step-ms must be a number of milliseconds, not {}",
            shape.step_ms
        );
    }
    let t = Instant::now();
    let root = photo_folder(data, shape.images)?.canonicalize()?;
    eprintln!(
        "gpu-lock: {} real-photo JPEGs of 500x375 in {} ({:.1} s)",
        shape.images,
        root.display(),
        t.elapsed().as_secs_f64()
    );
    super::super::warm_page_cache(&root)?;
    let index = crate::bench::train::data::index(&root)?;
    let pipe = Pipeline::Decode {
        resize_shorter: Some(256),
        center_crop: None,
    };
    // Twice: the first pass also warms the allocator and the code.
    bare_pipeline(&index, &pipe)?;
    let (bare_ms, decoded_bytes) = bare_pipeline(&index, &pipe)?;
    let bare_threads = bare_pipeline_threads(&index, &pipe, workers)?;
    let cache_bytes = (decoded_bytes as f64 * shape.cache_frac) as u64;
    let server = ServerProc::start_with(
        &format!("gpulock{}", std::process::id()),
        std::slice::from_ref(&root),
        cache_bytes,
        &["--loader-workers".into(), workers.to_string()],
        &[],
    )?;
    let client = server.client();
    client.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "photos", "source": {"kind": "image_folder", "path": root}})),
    )?;
    client.wait_ready("photos", Duration::from_secs(300))?;
    let regs: Vec<(String, String)> = (0..shape.jobs)
        .map(|i| -> Result<(String, String)> {
            let reg = client.ok(
                "POST",
                "/v1/jobs",
                Some(
                    &json!({"name": format!("g{i}"), "dataset": "photos", "batch_size": shape.batch,
                    "epochs": shape.epochs, "seed": 100 + i, "ring_capacity": 2 * shape.batch,
                    "pipeline": recipe_pipeline()}),
                ),
            )?;
            let r = &reg["ranks"][0];
            Ok((
                r["instance"].as_str().context("instance")?.to_string(),
                r["ring"].as_str().context("ring")?.to_string(),
            ))
        })
        .collect::<Result<_>>()?;
    let gpu = Gpu::default();
    let step = Duration::from_secs_f64(shape.step_ms / 1e3);
    let stages_now = || -> Result<Stages> {
        let (_, metrics) = client.call("GET", "/metrics", None)?;
        Ok(stage_cpu(metrics.as_str().unwrap_or("")).unwrap_or_default())
    };
    let stages0 = stages_now()?;
    let cpu0 = cpu_seconds(server.pid())?;
    let started = Instant::now();
    let counts: Vec<Result<(u64, Duration)>> = std::thread::scope(|s| {
        let handles: Vec<_> = regs
            .iter()
            .enumerate()
            .map(|(i, (inst, ring))| {
                let gpu = &gpu;
                s.spawn(move || -> Result<(u64, Duration)> {
                    let reader = RawReader::open(inst, ring, Duration::from_secs(30))?;
                    let mut pre = Prefetcher::start(
                        reader,
                        PrefetchConfig {
                            batch_size: shape.batch,
                            depth: 2,
                            aug: Some(RandomResizedCrop::new(224, 224)),
                            seed: 100 + i as u64,
                            output: AugOutput::U8Nhwc,
                            threads: 1,
                            pad_to: None,
                            first_pad_to: None,
                        },
                    )?;
                    let t0 = Instant::now();
                    let mut n = 0u64;
                    while let Some(b) = pre.next(Some(Duration::from_secs(120)))? {
                        n += b.len as u64;
                        if !b.errors.is_empty() {
                            bail!("job {i}: {} element errors", b.errors.len());
                        }
                        pre.recycle(b.buf);
                        gpu.step(step);
                    }
                    Ok((n, t0.elapsed()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a job panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(server.pid())? - cpu0;
    let stages = stages_now()?
        .into_iter()
        .map(|(k, v)| {
            let was = stages0.get(&k).copied().unwrap_or(0.0);
            (k, v - was)
        })
        .collect();
    let counts: Vec<(u64, Duration)> = counts.into_iter().collect::<Result<_>>()?;
    let stats = client.ok("GET", "/v1/stats", None)?;
    let decodes = stats["decodes"].as_u64().unwrap_or(0);
    let jobs = client.ok("GET", "/v1/jobs", None)?;
    let waits_for_others = jobs["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j["waited_for_others"].as_u64())
        .sum();
    let delivered: u64 = counts.iter().map(|c| c.0).sum();
    let expected = u64::from(shape.images) * shape.epochs * shape.jobs as u64;
    if delivered != expected {
        bail!("gpu-lock: the jobs received {delivered} images, expected {expected}");
    }
    drop(server);
    let bare_threads_after = bare_pipeline_threads(&index, &pipe, workers)?;
    let (bare_after, _) = bare_pipeline(&index, &pipe)?;
    Ok(GpuLockOutcome {
        shape,
        delivered,
        decodes,
        per_job: counts
            .iter()
            .map(|(n, d)| *n as f64 / d.as_secs_f64().max(1e-9))
            .collect(),
        total_rate: delivered as f64 / elapsed.max(1e-9),
        server_cpu_ms_per_decode: cpu * 1e3 / decodes.max(1) as f64,
        bare_cpu_ms_per_image: (bare_ms, bare_after),
        bare_threads_cpu_ms_per_image: (bare_threads, bare_threads_after),
        workers,
        cache_bytes,
        decoded_bytes,
        waits_for_others,
        stages,
    })
}

/// One row per server stage: its CPU per decode, and its share of the stages' sum.
fn stage_rows(stages: &Stages, decodes: u64) -> String {
    let total: f64 = stages.values().sum();
    if stages.is_empty() {
        return "| server CPU by stage | not exported |\n".into();
    }
    let mut rows: Vec<(&String, &f64)> = stages.iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(a.1));
    rows.iter()
        .map(|(stage, s)| {
            format!(
                "| server stage {stage}: CPU ms per decode (share) | {:.3} ({:.0}%) |\n",
                *s * 1e3 / decodes.max(1) as f64,
                *s * 100.0 / total.max(1e-12)
            )
        })
        .collect()
}

/// The scenario's markdown section.
pub(super) fn report(o: &GpuLockOutcome) -> String {
    let s = o.shape;
    let bare = (o.bare_cpu_ms_per_image.0 + o.bare_cpu_ms_per_image.1) / 2.0;
    let (t0, t1) = o.bare_threads_cpu_ms_per_image;
    let bare_threads = (t0 + t1) / 2.0;
    let limit = s.batch as f64 / (s.step_ms / 1e3);
    let per: Vec<String> = o.per_job.iter().map(|r| format!("{r:.0}")).collect();
    format!(
        "\n### GPU lock: {k} jobs paced by one shared GPU\n\n\
         {n} real-photo JPEGs 500x375, {k} jobs x {e} epochs, batch {b}, each job holds one lock (the GPU) for a {step} ms step per batch \
         (limit: {limit:.0} images/s of all jobs), prefetch as the Python client (2 batches, crop + flip), cache {cache} = {frac:.0}% of the decoded set ({decoded}), \
         server: a `joader serve` child.\n\n\
         | figure | value |\n|---|---:|\n\
         | images/s, all jobs (of the lock's limit) | {rate:.0} ({share:.2}) |\n\
         | per job images/s | {per} |\n\
         | decodes per delivered image (1/K = {ideal:.2}) | {dpi:.3} |\n\
         | server CPU ms per decode | {srv:.3} |\n\
         | bare pipeline CPU ms per image (one thread, same files, this run: mean of before and after the jobs) | {bare:.3} ({b0:.3}, {b1:.3}) |\n\
         | server CPU per decode / bare pipeline | {ratio:.2}x |\n\
         | bare pipeline on {w} threads at once (as many as the server's loader workers): CPU ms per image (before, after) | {bare_threads:.3} ({t0:.3}, {t1:.3}) |\n\
         | server CPU per decode / bare pipeline on {w} threads | {ratio_threads:.2}x |\n\
         | server CPU per decode beyond its read, decode and resize stages | {beyond} |\n\
         | batches that waited for room another job holds | {waits} |\n{stages}",
        k = s.jobs,
        n = s.images,
        e = s.epochs,
        b = s.batch,
        step = s.step_ms,
        cache = bytesize::ByteSize(o.cache_bytes).display().iec(),
        frac = o.cache_bytes as f64 * 100.0 / o.decoded_bytes.max(1) as f64,
        decoded = bytesize::ByteSize(o.decoded_bytes).display().iec(),
        rate = o.total_rate,
        share = o.total_rate / limit,
        per = per.join(" / "),
        ideal = 1.0 / s.jobs as f64,
        dpi = o.decodes as f64 / o.delivered.max(1) as f64,
        srv = o.server_cpu_ms_per_decode,
        bare = bare,
        b0 = o.bare_cpu_ms_per_image.0,
        b1 = o.bare_cpu_ms_per_image.1,
        ratio = o.server_cpu_ms_per_decode / bare.max(1e-9),
        w = o.workers,
        ratio_threads = o.server_cpu_ms_per_decode / bare_threads.max(1e-9),
        beyond = if o.stages.is_empty() {
            "-".to_string()
        } else {
            let pipeline: f64 = ["read", "decode", "resize"]
                .iter()
                .filter_map(|k| o.stages.get(*k))
                .sum();
            let all: f64 = o.stages.values().sum();
            format!("{:.3} ms", (all - pipeline) * 1e3 / o.decodes.max(1) as f64)
        },
        waits = o.waits_for_others,
        stages = stage_rows(&o.stages, o.decodes),
    )
}
