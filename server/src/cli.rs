//! The command line of the `joader` binary.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use actors::cache::PolicyKind;
use actors::sampling::SamplerKind;

use crate::{bench, simulate};

#[derive(Debug, Parser)]
#[command(name = "joader", version, about = "Prepare training data once, serve it to many jobs through shared memory")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Simulate samplers and cache policies on synthetic datasets and count cache misses.
    Simulate(SimulateArgs),
    /// Benchmarks that print measured figures and ratios.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Sampling tree: insertion time of large datasets and sampling throughput.
    Sampler(bench::SamplerBenchArgs),
}

/// Simulate samplers and cache policies.
///
/// Semantics of a round: a job registers at its start round and earns `speed` credits per
/// round; within a round, sub-rounds are sampled until no job holds a whole credit; in each
/// sub-round every job with a credit is active, spends it and receives one element (jobs
/// without credit are masked). Accesses are served in sampling order: the first access to an
/// element that is not cached is a miss and inserts it (the policy evicts when the cache is
/// full); later accesses while it is cached are hits, including the other jobs of a shared pick.
/// Misses lie between |D1 ∪ … ∪ Dn| and Σ|Di| per epoch.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SimulateArgs {
    /// Run a preset instead of a scenario: `paper-a2` (the appendix's Table 1, cache sizes 1 to
    /// 10000, the series behind its Figures 4, 5 and 6).
    #[arg(long, value_parser = ["paper-a2"])]
    pub preset: Option<String>,
    /// Scenario file (TOML, or JSON when it ends in .json): `jobs = [{dataset = "range:0:100",
    /// start = 0, speed = 1.0, epochs = 1}]`, `samplers`, `policies`, `cache_sizes`, `seed`,
    /// `repetitions`, `lookahead`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A job: `DATASET[,start=ROUND][,speed=REQUESTS_PER_ROUND][,epochs=N]` where DATASET is
    /// `range:A:B` (ids A..B, B excluded), `sample:A:B:K` (K ids drawn from A..B) or
    /// `ids:1,2,3`. Repeat for several jobs.
    #[arg(long = "job")]
    pub jobs: Vec<String>,
    /// Samplers to compare.
    #[arg(long, value_delimiter = ',')]
    pub sampler: Vec<SamplerKind>,
    /// Cache policies to compare: refcnt, lru, fifo, random, clairvoyant.
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<PolicyKind>,
    /// Cache sizes, in elements.
    #[arg(long, value_delimiter = ',')]
    pub cache_sizes: Vec<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Repetitions to average over (`sample:` datasets are drawn again each time).
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Rounds the clairvoyant policy sees ahead.
    #[arg(long)]
    pub lookahead: Option<u64>,
    /// Print one JSON object per sampler × policy × cache size instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write every job's delivered order as JSON lines {"job","epoch","ids"} (plus the
    /// scenario, sampler and repetition) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(BenchCommand::Sampler(args)) => bench::sampler(args),
    }
}

/// Reads a scenario file (TOML or JSON).
pub fn read_scenario(path: &std::path::Path) -> Result<actors::sim::Scenario> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let scn = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).with_context(|| format!("invalid scenario {}", path.display()))?
    } else {
        toml::from_str(&text).with_context(|| format!("invalid scenario {}", path.display()))?
    };
    Ok(scn)
}

pub fn check_exclusive(args: &SimulateArgs) -> Result<()> {
    let sources = usize::from(args.preset.is_some()) + usize::from(args.config.is_some()) + usize::from(!args.jobs.is_empty());
    if sources != 1 {
        bail!("give exactly one of --preset, --config or --job (one or more)");
    }
    Ok(())
}
