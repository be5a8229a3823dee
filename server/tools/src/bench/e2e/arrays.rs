//! `joader bench e2e --arrays`: samples that are not images (issue 45), K = 4 jobs reading
//! every row of one `.npy` file of 224×224×3 uint8 rows (150,528 bytes each; 1 GiB, 128 rows
//! with `--quick`), side by side in one run, interleaved and repeated:
//!
//! - `joader`: an in-process server with the file as an `array` dataset, one `joader.Loader`
//!   process per job (dict batches, the field's rows stacked): each row read once for the K
//!   jobs (a positioned read), kept in the cache and shared;
//! - `numpy memmap`: one process per job mapping the file (`np.load(mmap_mode="r")`) and
//!   reading its own shuffled order, each batch the rows of its permutation (`arr[perm[i:i+b]]`:
//!   one copy out of the page cache, which the K processes share).
//!
//! Both read the file from the page cache (warmed before the runs), so the comparison is CPU
//! per delivered sample (the clients' and, for joader, the server's) and memory: each client's
//! own (`RssAnon`), what it maps of the file (`RssFile`: the page cache, largest after a batch)
//! and joader's cache in `/dev/shm`. The file is written once (random bytes) next to the bench's image folder.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng, rngs::Xoshiro256PlusPlus};
use serde_json::json;

use super::Ctx;
use super::scenarios::{Scenario, run_processes};
use super::systems::{Outcome, outcome_of, python, start_server_of};
use server::procstat::process_cpu;

/// The jobs.
const K: usize = 4;
/// One row: 224 × 224 × 3 bytes.
const ROW: u64 = 224 * 224 * 3;
const SCRIPT: &str = include_str!("arrays.py");

/// The `.npy` file of `rows` random rows, written once at `path` (kept when it has that size).
fn write_array(path: &Path, rows: u64) -> Result<()> {
    let header =
        format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({rows}, 224, 224, 3), }}");
    let mut h = header;
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let len = 10 + h.len() as u64 + rows * ROW;
    if std::fs::metadata(path).is_ok_and(|m| m.len() == len) {
        return Ok(());
    }
    let tmp = path.with_extension("npy.part");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(h.len() as u16).to_le_bytes())?;
    f.write_all(h.as_bytes())?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(45);
    let mut row = vec![0u8; ROW as usize];
    for _ in 0..rows {
        rng.fill_bytes(&mut row);
        f.write_all(&row)?;
    }
    f.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// What one system's run gave: its outcome, and the clients' memory.
struct Run {
    outcome: Outcome,
    /// The clients' largest `RssAnon` (after a batch), summed.
    rss_anon: u64,
    /// The largest `RssFile` of a client (the file's pages it mapped: page cache, shared by
    /// the processes).
    rss_file: u64,
    /// joader only: elements loaded (rows read), the cache's bytes and the server's CPU ms
    /// per delivered sample.
    loads: Option<(u64, u64, f64)>,
}

fn memory(runs: &[serde_json::Value]) -> (u64, u64) {
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    (
        runs.iter().map(|v| u(v, "rss_anon")).sum(),
        runs.iter().map(|v| u(v, "rss_file")).max().unwrap_or(0),
    )
}

fn rows_delivered(runs: &[serde_json::Value]) -> u64 {
    runs.iter().map(|v| v["n"].as_u64().unwrap_or(0)).sum()
}

fn run_numpy(sc: &Scenario, file: &Path) -> Result<Run> {
    let runs = run_processes(sc, |i, _| {
        python(
            SCRIPT,
            &[
                "numpy".into(),
                file.display().to_string(),
                sc.batch.to_string(),
                i.to_string(),
                format!("np{i}"),
            ],
        )
    })?;
    let (rss_anon, rss_file) = memory(&runs);
    Ok(Run {
        outcome: outcome_of("numpy memmap", &runs, 0.0, 0.0, None),
        rss_anon,
        rss_file,
        loads: None,
    })
}

fn run_joader(sc: &Scenario, ctx: &Ctx, dir: &Path, file: &Path, tag: usize) -> Result<Run> {
    let cache_bytes = ctx.cache_bytes.max(256 << 20);
    let source = json!({"kind": "array", "paths": [file]});
    let (server, client, _state) = start_server_of(
        ctx,
        &format!("arr{tag}"),
        cache_bytes,
        dir,
        ("arr", &source),
    )?;
    let url = server.url.clone();
    let cpu0 = process_cpu();
    let runs = run_processes(sc, |i, _| {
        python(
            SCRIPT,
            &[
                "joader".into(),
                url.clone(),
                sc.batch.to_string(),
                i.to_string(),
                format!("arr{i}"),
            ],
        )
    })?;
    let server_cpu = process_cpu() - cpu0;
    let stats = client.ok("GET", "/v1/stats", None)?;
    server.stop()?;
    let (rss_anon, rss_file) = memory(&runs);
    let loads = stats["loads"].as_u64().context("loads")?;
    Ok(Run {
        outcome: outcome_of(
            "joader",
            &runs,
            server_cpu,
            stats["decodes"].as_f64().unwrap_or(0.0),
            stats["hit_ratio"].as_f64(),
        ),
        rss_anon,
        rss_file,
        loads: Some((
            loads,
            cache_bytes,
            server_cpu * 1e3 / (rows_delivered(&runs) as f64).max(1.0),
        )),
    })
}

/// Runs the comparison and returns its markdown.
pub(super) fn run(ctx: &Ctx, quick: bool) -> Result<String> {
    let rows = if quick { 128 } else { (1 << 30) / ROW };
    let dir: PathBuf = ctx
        .root
        .parent()
        .context("the bench's data folder")?
        .join(if quick {
            "e2e-arrays-quick"
        } else {
            "e2e-arrays"
        });
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    let file = dir.join("x.npy");
    eprintln!(
        "arrays: {rows} rows of 224x224x3 uint8 in {}",
        file.display()
    );
    write_array(&file, rows)?;
    super::super::warm_page_cache(&dir)?;
    let n = rows as u32;
    let sc = Scenario::together(format!("arrays K={K}"), K, n, 32);
    let rounds = if quick { 1 } else { 2 };
    let mut numpy = Vec::new();
    let mut joader = Vec::new();
    for r in 0..rounds {
        eprintln!("scenario {} round {}: numpy memmap", sc.name, r + 1);
        numpy.push(run_numpy(&sc, &file)?);
        eprintln!("scenario {} round {}: joader", sc.name, r + 1);
        joader.push(run_joader(&sc, ctx, &dir, &file, r)?);
    }
    Ok(report(&sc, rows, &numpy, &joader))
}

fn report(sc: &Scenario, rows: u64, numpy: &[Run], joader: &[Run]) -> String {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let mut out = format!(
        "\n### Rows of a `.npy` file, not images ({}, {rows} rows of 224x224x3 uint8 = {:.0} \
         MiB, batch {}, {} rounds interleaved)\n\n",
        sc.name,
        mib(rows * ROW),
        sc.batch,
        numpy.len()
    );
    out.push_str(
        "| round | system | samples/s | CPU ms per sample (server's) | clients' RssAnon (MiB, \
         sum of peaks) | a client's RssFile (MiB, peak) | rows read per row | cache (MiB) |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (r, (np, jo)) in numpy.iter().zip(joader).enumerate() {
        for run in [np, jo] {
            let o = &run.outcome;
            let (reads, cache, server) = match run.loads {
                Some((loads, cache, server)) => (
                    format!("{:.2}", loads as f64 / rows as f64),
                    format!("{:.0}", mib(cache)),
                    format!(" ({server:.3})"),
                ),
                None => (format!("{K} (each job its own)"), "-".into(), String::new()),
            };
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.3}{server} | {:.0} | {:.0} | {reads} | {cache} |\n",
                r + 1,
                o.system,
                o.aggregate,
                o.cpu_ms_per_sample,
                mib(run.rss_anon),
                mib(run.rss_file),
            ));
        }
    }
    let mean = |runs: &[Run], f: &dyn Fn(&Outcome) -> f64| {
        runs.iter().map(|r| f(&r.outcome)).sum::<f64>() / runs.len().max(1) as f64
    };
    out.push_str(&format!(
        "\njoader / numpy memmap, mean of the rounds: throughput {:.3}x, CPU per sample \
         {:.3}x. Both read the file from the page cache (one copy of it, shared by the \
         processes); joader's CPU includes its server's.\n",
        mean(joader, &|o| o.aggregate) / mean(numpy, &|o| o.aggregate).max(1e-9),
        mean(joader, &|o| o.cpu_ms_per_sample) / mean(numpy, &|o| o.cpu_ms_per_sample).max(1e-9),
    ));
    out
}
