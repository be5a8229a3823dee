//! `joader simulate`: runs scenarios through the simulator and prints tables or JSON.

use std::io::{BufWriter, Write};
use std::time::Instant;

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use joader_core::cache::PolicyKind;
use joader_core::sampling::SamplerKind;

use joader_core::sim::{self, JobScenario, ResultRow, Scenario};

pub fn run(args: SimulateArgs) -> Result<()> {
    check_exclusive(&args)?;
    let mut scenarios: Vec<Scenario> = if args.preset.is_some() {
        sim::preset_paper_a2(args.seed.unwrap_or(2022), args.repetitions.unwrap_or(1))
    } else if let Some(path) = &args.config {
        vec![read_scenario(path)?]
    } else {
        let jobs = args
            .jobs
            .iter()
            .map(|j| JobScenario::parse(j))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!(e))?;
        let mut scn: Scenario = serde_json::from_value(serde_json::json!({ "jobs": [] }))?;
        scn.name = "cli".into();
        scn.jobs = jobs;
        vec![scn]
    };
    // Flags override the preset's or the file's settings.
    for scn in &mut scenarios {
        if !args.sampler.is_empty() {
            scn.samplers = args.sampler.clone();
        }
        if !args.policy.is_empty() {
            scn.policies = args.policy.clone();
        }
        if !args.cache_sizes.is_empty() {
            scn.cache_sizes = args.cache_sizes.clone();
        }
        if let Some(s) = args.seed {
            scn.seed = s;
        }
        if let Some(r) = args.repetitions {
            scn.repetitions = r;
        }
        if let Some(w) = args.lookahead {
            scn.lookahead = w;
        }
        scn.validate()
            .map_err(|e| anyhow!("scenario '{}': {e}", scn.name))?;
    }

    let mut trace_out = match &args.trace {
        Some(p) => Some(BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let started = Instant::now();
    for scn in &scenarios {
        let mut trace_err = None;
        let rows = sim::run(scn, |sampler, rep, trace| {
            if let Some(w) = trace_out.as_mut() {
                let mut extra = serde_json::Map::new();
                extra.insert("scenario".into(), scn.name.clone().into());
                extra.insert("sampler".into(), sampler.name().into());
                extra.insert("rep".into(), rep.into());
                if let Err(e) = trace.write_orders(&extra, w) {
                    trace_err.get_or_insert(e);
                }
            }
        })
        .map_err(|e| anyhow!("scenario '{}': {e}", scn.name))?;
        if let Some(e) = trace_err {
            return Err(e).context("cannot write the trace");
        }
        if args.json {
            for r in &rows {
                serde_json::to_writer(&mut out, r)?;
                writeln!(out)?;
            }
        } else {
            print_table(&mut out, scn, &rows)?;
        }
    }
    if let Some(mut w) = trace_out {
        w.flush()?;
    }
    if !args.json {
        writeln!(
            out,
            "simulated {} scenario(s) in {:.2} s",
            scenarios.len(),
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(())
}

fn print_table(out: &mut impl Write, scn: &Scenario, rows: &[ResultRow]) -> Result<()> {
    let first = &rows[0];
    writeln!(
        out,
        "== {}",
        if scn.name.is_empty() {
            "scenario"
        } else {
            &scn.name
        }
    )?;
    let jobs: Vec<String> = scn
        .jobs
        .iter()
        .map(|j| {
            let d = match &j.dataset {
                sim::DatasetSpec::Text(t) => t.clone(),
                sim::DatasetSpec::Ids(ids) => format!("{} ids", ids.len()),
            };
            format!(
                "{d} (start {}, speed {}, epochs {})",
                j.start, j.speed, j.epochs
            )
        })
        .collect();
    writeln!(out, "   jobs: {}", jobs.join("; "))?;
    writeln!(
        out,
        "   accesses {:.0}; fewest possible misses |∪D| = {:.0}; misses without sharing Σ|D| = {:.0}; repetitions {}",
        first.accesses, first.union_size, first.sum_sizes, first.repetitions
    )?;
    let mut cols: Vec<(
        joader_core::sampling::SamplerKind,
        joader_core::cache::PolicyKind,
    )> = Vec::new();
    for r in rows {
        if !cols.contains(&(r.sampler, r.policy)) {
            cols.push((r.sampler, r.policy));
        }
    }
    write!(out, "   {:>10}", "cache")?;
    for (s, p) in &cols {
        write!(out, " {:>16}", format!("{}/{}", s.name(), p.name()))?;
    }
    writeln!(out)?;
    for &size in &scn.cache_sizes {
        write!(out, "   {size:>10}")?;
        for &(s, p) in &cols {
            let r = rows
                .iter()
                .find(|r| r.sampler == s && r.policy == p && r.cache_size == size)
                .expect("complete grid");
            write!(out, " {:>16.0}", r.misses)?;
        }
        writeln!(out)?;
    }
    writeln!(out)?;
    Ok(())
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

/// Reads a scenario file (TOML or JSON).
pub fn read_scenario(path: &std::path::Path) -> Result<joader_core::sim::Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let scn = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text)
            .with_context(|| format!("invalid scenario {}", path.display()))?
    } else {
        toml::from_str(&text).with_context(|| format!("invalid scenario {}", path.display()))?
    };
    Ok(scn)
}

pub fn check_exclusive(args: &SimulateArgs) -> Result<()> {
    let sources = usize::from(args.preset.is_some())
        + usize::from(args.config.is_some())
        + usize::from(!args.jobs.is_empty());
    if sources != 1 {
        bail!("give exactly one of --preset, --config or --job (one or more)");
    }
    Ok(())
}
