//! `joader bench …`: commands that measure and print figures side by side in one run.
//! Benchmarks never assert timings; they print what they measured and the targets.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use joader_pipeline::Pipeline;
use joader_storage::DatasetIndex;

pub mod cluster;
pub mod dataplane;
pub mod decode;
pub mod e2e;
pub mod parquet_index;
pub mod photos;
pub mod sampler;
pub mod scale;
pub mod train;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Sampling tree: insertion time of large datasets and sampling throughput.
    Sampler(sampler::SamplerBenchArgs),
    /// Shared memory: collate throughput against memcpy, push-to-wake latency.
    Dataplane,
    /// End to end: joader against independent loading (and PyTorch with --torch).
    E2e(e2e::E2eArgs),
    /// Decode pipeline against Pillow on the same files, one core each.
    Decode(decode::DecodeBenchArgs),
    /// An ImageNet-size manifest and 64 jobs on real `joader serve` processes: index time and
    /// memory, memory per job, idle CPU, and fast jobs beside slow, paused and idle ones.
    Scale(scale::ScaleArgs),
    /// An ImageNet-size `parquet` dataset shaped like Hugging Face's (1,281,167 rows, 100 per
    /// row group) indexed by a `joader serve` process: time until ready and memory.
    ParquetIndex(parquet_index::ParquetIndexArgs),
    /// A leader and three followers as processes on this machine: decodes per epoch of
    /// multi-node jobs against the union of their subsets, jobs on different node sets against
    /// the placement rule, per-rank throughput against one standalone server, leader CPU.
    Cluster(cluster::ClusterArgs),
    /// K concurrent training jobs (one process each) on one GPU (or the CPU): a synthetic
    /// batch (the GPU's limit), joader and PyTorch's DataLoader, over one aligned window.
    Train(train::TrainArgs),
}

/// Runs one benchmark.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Sampler(args) => sampler::sampler(args),
        BenchCommand::Dataplane => {
            let report = dataplane::run(&dataplane::BenchOptions::default())?;
            println!("{report}");
            Ok(())
        }
        BenchCommand::E2e(args) => e2e::run(args),
        BenchCommand::Decode(args) => decode::decode(args),
        BenchCommand::Scale(args) => scale::run(args),
        BenchCommand::ParquetIndex(args) => parquet_index::run(args),
        BenchCommand::Cluster(args) => cluster::run(args),
        BenchCommand::Train(args) => train::run(args),
    }
}

/// Reads every file under `dir` once (so that it sits in the page cache); returns the bytes read.
pub(crate) fn warm_page_cache(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += warm_page_cache(&entry.path())?;
        } else if kind.is_file() {
            total += std::io::copy(
                &mut std::fs::File::open(entry.path())?,
                &mut std::io::sink(),
            )?;
        }
    }
    Ok(total)
}

/// The bytes of every element of `index` prepared by `pipeline` (`workers` threads): the
/// decoded dataset as the cache would hold it (each element's bytes; the cache rounds each up to
/// 64).
pub(crate) fn decoded_bytes(
    index: &DatasetIndex,
    pipeline: &Pipeline,
    workers: usize,
) -> Result<u64> {
    let next = AtomicU32::new(0);
    let limits = joader_pipeline::Limits {
        max_pixels: 100_000_000,
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers.max(1))
            .map(|_| {
                s.spawn(|| -> Result<u64> {
                    let mut bytes = 0u64;
                    loop {
                        let e = next.fetch_add(1, Relaxed);
                        if e as usize >= index.len() {
                            return Ok(bytes);
                        }
                        let file = index.read(e).with_context(|| format!("read element {e}"))?;
                        let out = joader_pipeline::run(pipeline, &file, &limits)
                            .with_context(|| format!("decode element {e}"))?;
                        bytes += out.len() as u64;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a decoding thread panicked"))
            })
            .sum()
    })
}

/// Registers a TrueType font of the system as plotters' "sans-serif", for the benches' charts.
pub(crate) fn chart_font() -> Result<()> {
    let font = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok())
    .context("no TrueType font found (install fonts-dejavu-core)")?;
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("the font could not be loaded"))
}
