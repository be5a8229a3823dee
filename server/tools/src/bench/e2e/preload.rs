//! `joader bench e2e --preload`: a working set preloaded before its jobs (issue 45). In one
//! run: the server's own Loader pool (its worker threads, as `bench decode` measures it)
//! decoding the dataset's files from memory by the recipe's pipeline, then an in-process
//! server preloading the whole dataset by that pipeline (`POST /v1/datasets/d/preload`,
//! timed to `ready`), then K = 4 jobs on it started after the preload: the decodes they caused
//! (0 when the working set held) and their hit ratio (1.0). The server's cache is sized so
//! that the whole decoded dataset fits in the pin budget (half the cache).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::Ctx;
use super::scenarios::Scenario;
use super::systems::{recipe_pipeline, run_jobs, start_server_with};
use crate::bench::decode::{images_under, loader_pool};

/// The jobs started after the preload.
const K: usize = 4;

pub(super) fn run(ctx: &Ctx, n: u32) -> Result<String> {
    let paths = images_under(&ctx.root)?;
    let files: Vec<Vec<u8>> = paths
        .iter()
        .map(std::fs::read)
        .collect::<std::io::Result<_>>()?;
    let files = Arc::new(files);
    eprintln!(
        "preload: the Loader pool alone ({} threads, {} files)",
        ctx.workers,
        files.len()
    );
    let pool_rate = loader_pool(&files, ctx.workers, 3.0, &ctx.pipeline)?;
    // The pin budget is half the cache: twice the decoded dataset, plus room for the rings.
    let cache_bytes = (ctx.decoded_bytes * 2 + (64 << 20)).max(ctx.cache_bytes);
    let (server, client, _state) = start_server_with(ctx, "preload", cache_bytes)?;
    eprintln!(
        "preload: the whole dataset into a cache of {} MiB",
        cache_bytes >> 20
    );
    let decodes = || -> Result<u64> {
        client.ok("GET", "/v1/stats", None)?["decodes"]
            .as_u64()
            .context("decodes")
    };
    let before = decodes()?;
    let start = Instant::now();
    client.ok(
        "POST",
        "/v1/datasets/d/preload",
        Some(&json!({"pipeline": recipe_pipeline()})),
    )?;
    let view = loop {
        let d = client.ok("GET", "/v1/datasets/d", None)?;
        let p = d["preload"].clone();
        match p["state"].as_str() {
            Some("ready") => break p,
            Some("loading") => std::thread::sleep(Duration::from_millis(10)),
            _ => bail!("the preload did not become ready: {p}"),
        }
    };
    let secs = start.elapsed().as_secs_f64();
    let preloaded = decodes()?;
    let sc = Scenario::together(format!("after preload K={K}"), K, n, 16);
    eprintln!("scenario {}", sc.name);
    let job_start = Instant::now();
    let runs = run_jobs(&client, &sc)?;
    let job_secs = job_start.elapsed().as_secs_f64();
    let after = decodes()?;
    let (mut hits, mut misses) = (0u64, 0u64);
    for i in 0..K {
        let j = client.ok("GET", &format!("/v1/jobs/j{i}"), None)?;
        hits += j["hits"].as_u64().unwrap_or(0);
        misses += j["misses"].as_u64().unwrap_or(0);
    }
    server.stop()?;
    let samples: u64 = runs.iter().map(|r| r.samples).sum();
    let rate = n as f64 / secs;
    let mut out = format!(
        "\n### A working set preloaded before its jobs ({n} images, pipeline {}, {} loader \
         threads, cache {} MiB)\n\n",
        recipe_pipeline(),
        ctx.workers,
        cache_bytes >> 20
    );
    out.push_str("| what | figure |\n|---|---|\n");
    out.push_str(&format!(
        "| the Loader pool alone, files in memory | {pool_rate:.0} images/s |\n\
         | preload of the whole dataset to `ready` | {secs:.2} s, {rate:.0} images/s ({:.2}x \
         the pool), {} decodes, {} elements pinned, {} MiB |\n\
         | {K} jobs started after it | {samples} samples in {job_secs:.2} s, {} decodes, hit \
         ratio {:.3} |\n",
        rate / pool_rate,
        preloaded - before,
        view["pinned"],
        view["pinned_bytes"].as_u64().unwrap_or(0) >> 20,
        after - preloaded,
        hits as f64 / (hits + misses).max(1) as f64,
    ));
    out.push_str(
        "\nThe preload reads each file from disk (the page cache, warmed) where the pool \
         reads it from memory; its loads run on the same Loader threads.\n",
    );
    Ok(out)
}
