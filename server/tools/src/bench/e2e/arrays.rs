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
//!
//! With an `s3s-fs` (`--s3s-fs` or `JOADER_S3S_FS`), the same file as an object in a local S3
//! server, read by a `joader serve` child as an `s3` dataset of the `array` layout by K jobs,
//! dependent sampling (DSA: each row fetched once for the K jobs) against independent (ISA:
//! each job its own order, as K readers would be), side by side: the store's bytes per row and
//! GETs, throughput and CPU per sample (the server's and the clients').

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng, rngs::Xoshiro256PlusPlus};
use serde_json::json;

use super::Ctx;
use super::s3::{S3sFs, Scrape, server_cpu};
use super::scenarios::{Scenario, run_processes};
use super::systems::{Outcome, outcome_of, python, start_server_of};
use crate::bench::scale::procs::{DEADLINE, ServerProc};
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

/// What one S3 run gave: its outcome, and what the server read from the store.
struct S3Run {
    outcome: Outcome,
    /// Bytes read from the store, and GET requests.
    store_bytes: f64,
    gets: f64,
    /// Elements loaded (rows the server prepared).
    loads: u64,
}

/// Uploads `file` to the store as `bkt/arr/x.npy` with one PUT, so that the store keeps its
/// ETag as a real store does (`s3s-fs` hashes a file it did not receive again on every GET).
fn upload(store: &S3sFs, file: &Path) -> Result<()> {
    use object_store::ObjectStoreExt;
    let env = store.env(&store.endpoint());
    let var = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(store.endpoint())
        .with_allow_http(true)
        .with_bucket_name("bkt")
        .with_region("us-east-1")
        .with_access_key_id(var("AWS_ACCESS_KEY_ID"))
        .with_secret_access_key(var("AWS_SECRET_ACCESS_KEY"))
        .build()?;
    let bytes = std::fs::read(file)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(s3.put(
            &object_store::path::Path::from("arr/x.npy"),
            object_store::PutPayload::from(bytes),
        ))?;
    Ok(())
}

/// The file in a local S3 server, and a `joader serve` child reading it as dataset `arr`.
fn s3_server(
    s3s_fs: &Path,
    file: &Path,
    tag: &str,
) -> Result<(S3sFs, ServerProc, tempfile::TempDir)> {
    let root = tempfile::Builder::new()
        .prefix("joader-e2e-arrays-s3-")
        .tempdir()?;
    let folder = file.parent().context("the array's folder")?;
    std::fs::create_dir_all(root.path().join("bkt"))?;
    let store = S3sFs::start(s3s_fs, root.path())?;
    upload(&store, file)?;
    let env = store.env(&store.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = [
        "--allowed-s3".to_owned(),
        "s3://bkt".to_owned(),
        "--cache-slots".to_owned(),
        "8192".to_owned(),
    ];
    let server = ServerProc::start_with(tag, &[folder.to_owned()], 256 << 20, &args, &env)?;
    let client = server.client();
    let source = json!({"kind": "s3", "url": "s3://bkt/arr/", "layout": "array"});
    client.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "arr", "source": source})),
    )?;
    client.wait_ready("arr", DEADLINE)?;
    Ok((store, server, root))
}

/// K jobs over the file in the store, sampled by `sampler` (`dsa` or `isa`).
fn run_s3(sc: &Scenario, s3s_fs: &Path, file: &Path, sampler: &str, tag: usize) -> Result<S3Run> {
    let (_store, server, _root) = s3_server(s3s_fs, file, &format!("arrs3{tag}{sampler}"))?;
    let client = server.client();
    let before = Scrape::of(&server.url)?;
    let cpu0 = server_cpu(&client)?;
    let url = server.url.clone();
    let runs = run_processes(sc, |i, _| {
        python(
            SCRIPT,
            &[
                "joader".into(),
                url.clone(),
                sc.batch.to_string(),
                i.to_string(),
                format!("arr{i}"),
                sampler.to_owned(),
            ],
        )
    })?;
    let cpu = server_cpu(&client)? - cpu0;
    let after = Scrape::of(&server.url)?;
    let stats = client.ok("GET", "/v1/stats", None)?;
    Ok(S3Run {
        outcome: outcome_of(
            if sampler == "dsa" {
                "joader, s3, dsa"
            } else {
                "joader, s3, isa"
            },
            &runs,
            cpu,
            stats["decodes"].as_f64().unwrap_or(0.0),
            stats["hit_ratio"].as_f64(),
        ),
        store_bytes: after.bytes - before.bytes,
        gets: after.gets - before.gets,
        loads: stats["loads"].as_u64().context("loads")?,
    })
}

/// The S3 section: DSA and ISA over the file in the store, per round.
fn s3_report(sc: &Scenario, rows: u64, runs: &[(S3Run, S3Run)]) -> String {
    let mut out = format!(
        "\n#### The same rows in an S3 bucket (s3s-fs on loopback; {}, {rows} rows)\n\n\
         | round | system | samples/s | CPU ms per sample (server's + clients') | store bytes \
         per row | GETs per row | rows loaded per row |\n|---:|---|---:|---:|---:|---:|---:|\n",
        sc.name
    );
    for (r, (dsa, isa)) in runs.iter().enumerate() {
        for run in [dsa, isa] {
            let o = &run.outcome;
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.3} | {:.2} | {:.2} | {:.2} |\n",
                r + 1,
                o.system,
                o.aggregate,
                o.cpu_ms_per_sample,
                run.store_bytes / (rows * ROW) as f64,
                run.gets / rows as f64,
                run.loads as f64 / rows as f64,
            ));
        }
    }
    let mean = |f: &dyn Fn(&(S3Run, S3Run)) -> f64| {
        runs.iter().map(f).sum::<f64>() / runs.len().max(1) as f64
    };
    out.push_str(&format!(
        "\nDSA / ISA, mean of the rounds: store bytes {:.3}x, throughput {:.3}x, CPU per \
         sample {:.3}x. The store serves from its own page cache on this machine, so the bytes \
         are what a remote store would bill and the network would carry.\n",
        mean(&|(d, _)| d.store_bytes) / mean(&|(_, i)| i.store_bytes).max(1.0),
        mean(&|(d, _)| d.outcome.aggregate) / mean(&|(_, i)| i.outcome.aggregate).max(1e-9),
        mean(&|(d, _)| d.outcome.cpu_ms_per_sample)
            / mean(&|(_, i)| i.outcome.cpu_ms_per_sample).max(1e-9),
    ));
    out
}

/// Runs the comparison and returns its markdown (with the S3 rows when `s3s_fs` is given).
pub(super) fn run(ctx: &Ctx, quick: bool, s3s_fs: Option<&Path>) -> Result<String> {
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
    let mut s3 = Vec::new();
    for r in 0..rounds {
        eprintln!("scenario {} round {}: numpy memmap", sc.name, r + 1);
        numpy.push(run_numpy(&sc, &file)?);
        eprintln!("scenario {} round {}: joader", sc.name, r + 1);
        joader.push(run_joader(&sc, ctx, &dir, &file, r)?);
        if let Some(bin) = s3s_fs {
            eprintln!(
                "scenario {} round {}: joader, s3 (dsa, then isa)",
                sc.name,
                r + 1
            );
            let dsa = run_s3(&sc, bin, &file, "dsa", r)?;
            s3.push((dsa, run_s3(&sc, bin, &file, "isa", r)?));
        }
    }
    let mut out = report(&sc, rows, &numpy, &joader);
    if !s3.is_empty() {
        out.push_str(&s3_report(&sc, rows, &s3));
    }
    Ok(out)
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
