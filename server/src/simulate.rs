//! `joader simulate`: runs scenarios through the simulator and prints tables or JSON.

use std::io::{BufWriter, Write};
use std::time::Instant;

use anyhow::{Context, Result, anyhow};

use joader_core::sim::{self, JobScenario, ResultRow, Scenario};

use crate::cli::{SimulateArgs, check_exclusive, read_scenario};

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
