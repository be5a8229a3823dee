//! Part 5 of `joader bench cluster`: a leader restart. A 3-rank job (a rank per follower,
//! the whole dataset, a few epochs) runs twice on part 1's cluster: once undisturbed, once
//! with the `--leader-only` leader SIGKILLed about a third into the run (mid-epoch) and
//! started again at once on its address, instance and data folder (well within the
//! followers' grace period, five node timeouts). The followers keep the job paused, register
//! again, and the restarted leader resumes it exactly. Side by side: each rank's pause, the
//! job's wall time, and the followers' decodes per epoch against the union (the dataset);
//! every epoch of the restart run must be exact (each rank's share disjoint and equal,
//! together the dataset), or the bench fails. Part 1's caches hold about a quarter of each
//! node's share, so every epoch decodes most of it again.
//!
//! A rank's pause is the longest it waited for a batch (`joader consume`'s `longest_wait_s`):
//! what the rank saw of the restart, from the last record it had before to the first after.
//! It may be shorter than the time from the kill by what the ring held then: the job's rings
//! hold two batches, and ranks sleep a fixed step per sample (a training step), so that the
//! run lasts about two seconds. The row also gives the time from the kill to the leader
//! listening again and to the leader's view of the job `running` again.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{BATCH, Cluster, ClusterArgs, NODES, job};
use crate::bench::scale::procs::wait_for;

/// About how long a rank's steps last over the run, when `--restart-step-us` is not given.
const RUN: Duration = Duration::from_secs(2);

/// One run of the job.
pub(super) struct Run {
    /// Each rank's longest wait for a batch (s).
    pub(super) waits: Vec<f64>,
    /// From the ranks' start to the last one's end (s).
    pub(super) wall_s: f64,
    /// The followers' loads, summed.
    pub(super) loads: u64,
    /// Whether every epoch was exact, or why not.
    pub(super) exact: std::result::Result<(), String>,
}

/// The restart: node-0's rank's acknowledged samples at the kill, and the ms from the kill to
/// the restarted leader listening and to the job running again.
pub(super) struct Kill {
    pub(super) acked: u64,
    pub(super) listening_ms: f64,
    pub(super) resumed_ms: f64,
}

/// Part 5's figures.
pub(super) struct Restart {
    pub(super) epochs: u32,
    /// The dataset's elements the job reads (all of them, less the remainder of a division
    /// by the ranks).
    pub(super) union: u64,
    pub(super) step_us: u64,
    pub(super) steady: Run,
    pub(super) restarted: Run,
    /// Each rank's samples over the run.
    pub(super) per_rank: u64,
    pub(super) kill: Kill,
}

/// Runs part 5 on `c`: `--restart-epochs` epochs, `--restart-step-us` per sample (default:
/// a rank's steps last about [`RUN`] over the run).
pub(super) fn leader_restart(c: &mut Cluster, args: &ClusterArgs, out: &Path) -> Result<Restart> {
    let (epochs, step_us) = (args.restart_epochs, args.restart_step_us);
    let n = c.dataset("restart0")?;
    c.dataset("restart1")?;
    let union = n - n % NODES as u64;
    let per_rank = u64::from(epochs) * union / NODES as u64;
    if per_rank == 0 {
        bail!("part 5 needs at least {NODES} images and one epoch");
    }
    let step_us = step_us.unwrap_or_else(|| (RUN.as_micros() as u64 / per_rank).max(1));
    let body = |dataset: &str| {
        let mut j = job(dataset, dataset, NODES as u32, 1, None, epochs);
        j["ring_capacity"] = json!(2 * BATCH);
        if union < n {
            j["subset"] = json!({"start": 0, "end": union});
        }
        j
    };
    let want: BTreeSet<u64> = (0..union).collect();
    eprintln!("part 5: a {NODES}-rank job of {epochs} epochs, undisturbed…");
    let (steady, _) = run(c, &body("restart0"), (epochs, &want, step_us), None, out)?;
    eprintln!("part 5: the same job, its leader killed and restarted a third into the run…");
    let (restarted, kill) = run(
        c,
        &body("restart1"),
        (epochs, &want, step_us),
        // A third into the run, and a quarter epoch on: mid-epoch whatever the epochs.
        Some(per_rank / 3 + union / NODES as u64 / 4),
        out,
    )?;
    let kill = kill.context("the leader was not restarted")?;
    if let Err(e) = &restarted.exact {
        bail!("part 5: an epoch of the job whose leader restarted was not exact: {e}");
    }
    Ok(Restart {
        epochs,
        union,
        step_us,
        steady,
        restarted,
        per_rank,
        kill,
    })
}

/// A run of `body` (its name is its dataset's), a rank per node; with `kill_after`, the
/// leader is restarted once node-0's rank has acknowledged that many samples (then also
/// returned, with the restart's ms).
fn run(
    c: &mut Cluster,
    body: &Value,
    (epochs, want, step_us): (u32, &BTreeSet<u64>, u64),
    kill_after: Option<u64>,
    out: &Path,
) -> Result<(Run, Option<Kill>)> {
    let name = body["name"].as_str().context("a job without a name")?;
    let before = c.loads()?;
    let start = Instant::now();
    let mut consumers = super::start_ranks(c, body, name, step_us, out)?;
    let kill = match kill_after {
        Some(at) => Some(kill_leader(c, name, at)?),
        None => None,
    };
    let summaries = (0..NODES)
        .map(|r| consumers.finish(&format!("{name}-{r}")))
        .collect::<Result<Vec<_>>>()?;
    let wall_s = start.elapsed().as_secs_f64();
    let waits = summaries
        .iter()
        .map(|s| s["longest_wait_s"].as_f64().context("no longest_wait_s"))
        .collect::<Result<Vec<_>>>()?;
    let run = Run {
        waits,
        wall_s,
        loads: c.loads()? - before,
        exact: exact(&summaries, epochs, want),
    };
    Ok((run, kill))
}

/// Once node-0's rank of job `name` has acknowledged `at` samples, restarts the leader and
/// waits for it to resume the job: the samples acknowledged then, and the ms from the kill to
/// the leader listening again and to the job running again.
fn kill_leader(c: &mut Cluster, name: &str, at: u64) -> Result<Kill> {
    let node0 = c.nodes[0].client();
    let path = format!("/v1/jobs/{name}");
    let acked = wait_for(&format!("job {name} past {at} samples on node-0"), || {
        let v = node0.ok("GET", &path, None).ok();
        Ok(v.and_then(|v| v["acknowledged"].as_u64())
            .filter(|&a| a >= at))
    })?;
    let killed = c.leader.restart()?;
    let listening_ms = killed.elapsed().as_secs_f64() * 1e3;
    let leader = c.leader.client();
    wait_for(
        &format!("the restarted leader to resume job {name}"),
        || {
            let Ok(v) = leader.ok("GET", "/v1/nodes", None) else {
                return Ok(None);
            };
            let jobs = v["jobs"].as_array().map_or(&[][..], Vec::as_slice);
            match jobs.iter().find(|j| j["name"] == name).map(|j| &j["state"]) {
                Some(s) if s == "failed" => bail!("the restarted leader failed job {name}: {v}"),
                Some(s) if s == "running" || s == "finished" => Ok(Some(())),
                _ => Ok(None),
            }
        },
    )?;
    let resumed_ms = killed.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "part 5: leader killed at {acked} samples on node-0, listening again in \
         {listening_ms:.0} ms, the job running again in {resumed_ms:.0} ms"
    );
    Ok(Kill {
        acked,
        listening_ms,
        resumed_ms,
    })
}

/// Whether each of the `epochs` epochs the ranks' `summaries` (`joader consume`'s) received
/// was exact: each rank's share of it as large as the others', no element twice, no error,
/// together `want`.
fn exact(
    summaries: &[Value],
    epochs: u32,
    want: &BTreeSet<u64>,
) -> std::result::Result<(), String> {
    for (r, s) in summaries.iter().enumerate() {
        let got = s["epochs"].as_array().map_or(0, Vec::len);
        if got != epochs as usize {
            return Err(format!("rank {r} received {got} epochs, not {epochs}"));
        }
        let errors = s["errors"].as_array().into_iter().flatten();
        if errors
            .flat_map(|e| e.as_array().into_iter().flatten())
            .next()
            .is_some()
        {
            return Err(format!("rank {r} received errors: {}", s["errors"]));
        }
    }
    for e in 0..epochs as usize {
        let mut all = BTreeSet::new();
        let mut shares = Vec::new();
        for s in summaries {
            let ids = s["epochs"][e].as_array().map_or(&[][..], Vec::as_slice);
            shares.push(ids.len());
            for id in ids.iter().filter_map(|p| p[0].as_u64()) {
                if !all.insert(id) {
                    return Err(format!("epoch {e}: element {id} delivered twice"));
                }
            }
        }
        if shares.iter().any(|&k| k != shares[0]) {
            return Err(format!(
                "epoch {e}: the ranks' shares are {shares:?} elements"
            ));
        }
        if &all != want {
            return Err(format!(
                "epoch {e}: {} distinct elements, not the {} of the dataset",
                all.len(),
                want.len()
            ));
        }
    }
    Ok(())
}

fn ms(v: &[f64]) -> String {
    let v: Vec<String> = v.iter().map(|x| format!("{:.0}", x * 1e3)).collect();
    format!("[{}] ms", v.join(", "))
}

/// Part 5's row and JSON.
pub(super) fn report(r: &Restart) -> (String, Value) {
    let per_epoch = |run: &Run| run.loads as f64 / f64::from(r.epochs.max(1));
    let ratio = |run: &Run| per_epoch(run) / r.union.max(1) as f64;
    let side = |run: &Run| {
        let exact = match &run.exact {
            Ok(()) => "yes".to_string(),
            Err(e) => format!("NO ({e})"),
        };
        format!(
            "longest wait per rank {}; wall {:.2} s; decodes per epoch / union {:.0} / {} = {:.3}; every epoch exact: {exact}",
            ms(&run.waits),
            run.wall_s,
            per_epoch(run),
            r.union,
            ratio(run),
        )
    };
    let k = &r.kill;
    let row = format!(
        "| leader restart: {NODES}-rank job, {} epochs ({} µs steps, rings of {}), its leader SIGKILLed at {}/{} samples of node-0's rank and restarted at once: listening again in {:.0} ms, the job running again in {:.0} ms; a rank's pause is its longest wait for a batch | {} | without a restart: {} | every epoch exact |\n",
        r.epochs,
        r.step_us,
        2 * BATCH,
        k.acked,
        r.per_rank,
        k.listening_ms,
        k.resumed_ms,
        side(&r.restarted),
        side(&r.steady),
    );
    let side = |run: &Run| {
        json!({
            "rank_pause_s": run.waits,
            "wall_s": run.wall_s,
            "loads": run.loads,
            "loads_per_epoch_over_union": ratio(run),
            "exact": run.exact.is_ok(),
        })
    };
    let v = json!({
        "epochs": r.epochs,
        "union": r.union,
        "step_us": r.step_us,
        "per_rank": r.per_rank,
        "killed_at": k.acked,
        "listening_ms": k.listening_ms,
        "resumed_ms": k.resumed_ms,
        "restarted": side(&r.restarted),
        "steady": side(&r.steady),
    });
    (row, v)
}
