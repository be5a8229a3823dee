//! `bench e2e --source s3` with the disk tier of encoded bytes (`--disk-cache`): for each
//! scenario of K = 4 jobs, three rounds of two side-by-side comparisons: the store without a
//! tier, then a first epoch writing a fresh tier; local disk, then a later epoch served from
//! that tier (a fresh server, its decoded cache empty), with the bytes each read from the
//! store. Then once, one job on a tier of half the dataset for three epochs (a server per
//! epoch: each later epoch's share of bytes not read from the store is the tier's hit rate).

use std::path::Path;

use anyhow::{Context, Result};

use super::Ctx;
use super::s3::{Store, Where, server_cpu};
use super::scenarios::{JobPlan, Scenario};
use super::systems::{Outcome, run_jobs, summarize_runs};
use crate::bench::scale::procs::wait_for;
use server::procstat::process_cpu;

/// One round of a K = 4 scenario with the tier, each figure beside its reference measured
/// just before it.
struct Round {
    /// The store without a tier, then a fresh tier's first epoch.
    s3: Outcome,
    first: Outcome,
    first_store: f64,
    /// Local disk, then a later epoch from that tier.
    disk: Outcome,
    later: Outcome,
    later_store: f64,
}

/// A K = 4 scenario's rounds with the tier.
pub(super) struct TierRow {
    scenario: String,
    rounds: Vec<Round>,
    dataset_bytes: u64,
}

/// Rounds of each comparison: the machine is shared, so each ratio is taken side by side and
/// several times; an even number, half in each order.
const ROUNDS: usize = 4;

/// One job on a tier of half the dataset: each epoch's bytes from the store.
pub(super) struct HalfRow {
    capacity: u64,
    dataset_bytes: u64,
    store: Vec<f64>,
}

/// A stored object's header is at most this many bytes (its key, ETag and range).
const HEADER: u64 = 256;

/// A series' value in the server's `/metrics` (0 when absent).
pub(crate) fn scrape(url: &str, series: &str) -> Result<f64> {
    let text = ureq::get(&format!("{url}/metrics"))
        .call()?
        .into_body()
        .read_to_string()?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// Runs `sc` once on a fresh server reading the store with the tier in `dir` of `capacity`
/// bytes; waits for the tier's writer to be idle. Its outcome and the store bytes it read.
fn once(
    store: &Store,
    sc: &Scenario,
    ctx: &Ctx,
    tag: &str,
    system: &'static str,
    dir: &Path,
    capacity: u64,
) -> Result<(Outcome, f64)> {
    let spec =
        serde_json::json!({"kind": "s3", "url": store.images_url(), "layout": "image_folder"});
    once_of(
        store,
        sc,
        ctx,
        (tag, system),
        Some((dir, capacity)),
        (&spec, &[]),
    )
}

/// [`once`] of dataset `spec` (reading `roots` besides the image folder), with a tier when
/// `tier` gives its folder and capacity.
fn once_of(
    store: &Store,
    sc: &Scenario,
    ctx: &Ctx,
    (tag, system): (&str, &'static str),
    tier: Option<(&Path, u64)>,
    spec: (&serde_json::Value, &[std::path::PathBuf]),
) -> Result<(Outcome, f64)> {
    let mut extra = Vec::new();
    if let Some((dir, capacity)) = tier {
        extra = vec![
            "--disk-cache".to_owned(),
            dir.to_str()
                .context("a tier path that is not UTF-8")?
                .to_owned(),
            "--disk-cache-bytes".to_owned(),
            capacity.to_string(),
        ];
    }
    let (server, client) = store.server_of(ctx, tag, &store.routes[0], &extra, spec)?;
    let bytes0 = scrape(&server.url, "joader_s3_read_bytes_total")?;
    let cpu0 = server_cpu(&client)? + process_cpu();
    let runs = run_jobs(&client, sc)?;
    let stats = client.ok("GET", "/v1/stats", None)?;
    let cpu = server_cpu(&client)? + process_cpu() - cpu0;
    let fetched = scrape(&server.url, "joader_s3_read_bytes_total")? - bytes0;
    // The next server opens the tier with everything offered so far written.
    wait_for("the disk tier's writer to be idle", || {
        Ok((scrape(&server.url, "joader_disk_cache_queued")? == 0.0).then_some(()))
    })?;
    let outcome = summarize_runs(
        system,
        &runs,
        cpu,
        stats["decodes"].as_f64().unwrap_or(0.0),
        stats["hit_ratio"].as_f64(),
    );
    drop(server);
    Ok((outcome, fetched))
}

/// A K = 4 scenario with the tier, [`ROUNDS`] times: the store without a tier, then its
/// first epoch writing a fresh tier; local disk, then a later epoch from that tier (a fresh
/// server: its decoded cache empty).
pub(super) fn run_k(store: &Store, sc: &Scenario, ctx: &Ctx, tag: usize) -> Result<TierRow> {
    let dataset_bytes = store.dataset_bytes();
    let capacity = 2 * dataset_bytes + HEADER * ctx.index.len() as u64;
    let mut rounds = Vec::new();
    for r in 0..ROUNDS {
        let dir = tempfile::Builder::new()
            .prefix("joader-e2e-tier-")
            .tempdir()?;
        let t = 1000 + tag * 16 + r * 4;
        let without = || {
            store
                .run(sc, ctx, t, Where::S3, &store.routes[0])
                .map(|(s, _)| s)
        };
        let first = || {
            once(
                store,
                sc,
                ctx,
                &format!("e2e{t}_tier1"),
                "joader serve, s3 + tier (first epoch)",
                dir.path(),
                capacity,
            )
        };
        let disk = || {
            store
                .run(sc, ctx, t + 1, Where::Disk, &store.routes[0])
                .map(|(s, _)| s)
        };
        let later = || {
            once(
                store,
                sc,
                ctx,
                &format!("e2e{t}_tier2"),
                "joader serve, s3 + tier (later epoch)",
                dir.path(),
                capacity,
            )
        };
        // Each pair in one order in even rounds and the other in odd ones, so that neither
        // side always runs second (the later epoch always follows the first, which fills
        // the tier).
        let (s3, (first, first_store), disk, (later, later_store)) = if r % 2 == 0 {
            let s3 = without()?;
            let f = first()?;
            let d = disk()?;
            (s3, f, d, later()?)
        } else {
            let f = first()?;
            let s3 = without()?;
            let l = later()?;
            (s3, f, disk()?, l)
        };
        rounds.push(Round {
            s3,
            first,
            first_store,
            disk,
            later,
            later_store,
        });
    }
    Ok(TierRow {
        scenario: sc.name.clone(),
        rounds,
        dataset_bytes,
    })
}

/// The `parquet` layout with the tier: [`ROUNDS`] rounds of the same Parquet files read from
/// local disk, and from the store through a tier its first epoch filled (a later epoch, on a
/// fresh server: its decoded cache empty), each first in half the rounds. Returns its
/// markdown.
pub(super) fn run_parquet(
    store: &Store,
    sc: &Scenario,
    ctx: &Ctx,
    local: &Path,
    codec: &str,
) -> Result<String> {
    let url = store.put_folder(local, "pq")?;
    let local_spec = serde_json::json!({"kind": "parquet", "paths": [local]});
    let s3_spec = serde_json::json!({"kind": "s3", "url": url, "layout": "parquet"});
    let roots = [local.to_path_buf()];
    let bytes: u64 = std::fs::read_dir(local)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    let capacity = 2 * bytes + HEADER * ctx.index.len() as u64;
    let mut rows = Vec::new();
    for r in 0..ROUNDS {
        let dir = tempfile::Builder::new()
            .prefix("joader-e2e-pq-tier-")
            .tempdir()?;
        let t = 2000 + r * 4;
        let tier = Some((dir.path(), capacity));
        let (_, first_store) = once_of(
            store,
            sc,
            ctx,
            (
                &format!("e2e{t}_pqtier1"),
                "joader serve, s3 parquet + tier (first epoch)",
            ),
            tier,
            (&s3_spec, &[]),
        )?;
        let disk = || {
            once_of(
                store,
                sc,
                ctx,
                (&format!("e2e{t}_pqdisk"), "joader serve, local parquet"),
                None,
                (&local_spec, &roots),
            )
            .map(|(o, _)| o)
        };
        let later = || {
            once_of(
                store,
                sc,
                ctx,
                (
                    &format!("e2e{t}_pqtier2"),
                    "joader serve, s3 parquet + tier (later epoch)",
                ),
                tier,
                (&s3_spec, &[]),
            )
        };
        let (disk, (later, later_store)) = if r % 2 == 0 {
            let d = disk()?;
            (d, later()?)
        } else {
            let l = later()?;
            (disk()?, l)
        };
        rows.push((disk, later, first_store, later_store));
    }
    let mut out = format!(
        "\n### Parquet ({codec}) from the store with the disk tier ({}, {ROUNDS} rounds; {bytes} \
         bytes of files)\n\n\
         | round | local parquet samples/s | s3 + tier, later epoch samples/s | x local | store \
         bytes, first epoch | store bytes, later epoch |\n|---|---|---|---|---|---|\n",
        sc.name
    );
    for (i, (d, l, f, s)) in rows.iter().enumerate() {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.3} | {f:.0} | {s:.0} |\n",
            i + 1,
            d.aggregate,
            l.aggregate,
            l.aggregate / d.aggregate
        ));
    }
    let ratio = super::parquet::mean(rows.iter().map(|(d, l, ..)| l.aggregate / d.aggregate));
    let share = super::parquet::mean(rows.iter().map(|(.., s)| s / bytes.max(1) as f64));
    out.push_str(&format!(
        "\nlater epochs from the tier / local disk, mean of the rounds: {ratio:.3}x; the store \
         sent {:.2}% of the files' bytes in a later epoch\n",
        share * 100.0
    ));
    Ok(out)
}

/// One job reading the whole dataset for `epochs` epochs on a tier of half its bytes.
pub(super) fn run_half(store: &Store, ctx: &Ctx, epochs: usize) -> Result<HalfRow> {
    let dir = tempfile::Builder::new()
        .prefix("joader-e2e-tier-half-")
        .tempdir()?;
    let n = ctx.index.len() as u32;
    let sc = Scenario {
        name: "tier half".into(),
        jobs: vec![JobPlan {
            subset: 0..n,
            sleep_ms: 0.0,
            start_frac: 0.0,
        }],
        batch: 16,
    };
    let dataset_bytes = store.dataset_bytes();
    let capacity = (dataset_bytes + HEADER * u64::from(n)) / 2;
    let mut bytes = Vec::new();
    for e in 0..epochs {
        let (_, fetched) = once(
            store,
            &sc,
            ctx,
            &format!("e2e_half{e}"),
            "joader serve, s3 + half tier",
            dir.path(),
            capacity,
        )?;
        bytes.push(fetched);
    }
    Ok(HalfRow {
        capacity,
        dataset_bytes,
        store: bytes,
    })
}

/// The tier's section of the report.
pub(super) fn report(rows: &[TierRow], half: Option<&HalfRow>) -> String {
    let mut s = String::from(
        "\nS3 with the disk tier (`--disk-cache`, room for the whole dataset), each round side by side: the store without a tier, then a fresh tier's \
         first epoch (written while the jobs read); local disk, then a later epoch from that tier (a fresh server: its decoded cache empty). \
         store bytes: what the server read from the store, over the dataset's bytes\n\n\
         | scenario | round | s3 samples/s | s3 + tier, first epoch | first / s3 | disk samples/s | s3 + tier, later epoch | later / disk | first epoch store bytes / dataset | later epoch store bytes / dataset |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let d = row.dataset_bytes.max(1) as f64;
        let (mut first, mut later) = (0.0, 0.0);
        for (i, r) in row.rounds.iter().enumerate() {
            let f = r.first.aggregate / r.s3.aggregate.max(1e-9);
            let l = r.later.aggregate / r.disk.aggregate.max(1e-9);
            first += f / row.rounds.len() as f64;
            later += l / row.rounds.len() as f64;
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.3} | {:.0} | {:.0} | {:.3} | {:.3} | {:.4} |\n",
                row.scenario,
                i + 1,
                r.s3.aggregate,
                r.first.aggregate,
                f,
                r.disk.aggregate,
                r.later.aggregate,
                l,
                r.first_store / d,
                r.later_store / d,
            ));
        }
        s.push_str(&format!(
            "\n{}: mean of the rounds: first epoch with the tier writing / without a tier {first:.3}x; later epoch from the tier / local disk {later:.3}x\n",
            row.scenario
        ));
    }
    if let Some(h) = half {
        let d = h.dataset_bytes.max(1) as f64;
        s.push_str(&format!(
            "\nOne job, a tier of half the dataset ({} of {} bytes), a server per epoch: the share of each epoch's bytes not read from the store\n\n\
             | epoch | store bytes / dataset | hit (1 - that) |\n|---:|---:|---:|\n",
            h.capacity, h.dataset_bytes
        ));
        for (e, b) in h.store.iter().enumerate() {
            s.push_str(&format!(
                "| {} | {:.3} | {:.3} |\n",
                e + 1,
                b / d,
                1.0 - b / d
            ));
        }
    }
    s
}
