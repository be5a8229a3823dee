//! The scenarios of `joader bench e2e`: how many jobs, on which subsets, at which speeds and
//! with which staggered starts, and how jobs are started by their plan (threads by a shared
//! counter, processes through their standard input).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use anyhow::{Context, Result, bail};

#[derive(Debug, Clone)]
pub(super) struct JobPlan {
    pub(super) subset: std::ops::Range<u32>,
    pub(super) sleep_ms: f64,
    /// Starts when job 0 has consumed this fraction of its epoch.
    pub(super) start_frac: f64,
}

#[derive(Debug, Clone)]
pub(super) struct Scenario {
    pub(super) name: String,
    pub(super) jobs: Vec<JobPlan>,
    /// Every job's batch size.
    pub(super) batch: usize,
}

impl Scenario {
    /// `k` jobs reading elements `0..n` together, from the start, at full speed, in batches
    /// of `batch`.
    pub(super) fn together(name: String, k: usize, n: u32, batch: usize) -> Scenario {
        Scenario {
            name,
            jobs: (0..k)
                .map(|_| JobPlan {
                    subset: 0..n,
                    sleep_ms: 0.0,
                    start_frac: 0.0,
                })
                .collect(),
            batch,
        }
    }
}

pub(super) fn scenarios(n: u32, quick: bool) -> Vec<Scenario> {
    let all = |k: usize| {
        (0..k)
            .map(|_| JobPlan {
                subset: 0..n,
                sleep_ms: 0.0,
                start_frac: 0.0,
            })
            .collect()
    };
    let mut out = Vec::new();
    let ks: &[usize] = if quick { &[1, 2] } else { &[1, 2, 4, 6] };
    for &k in ks {
        out.push(Scenario {
            name: format!("sync K={k}"),
            jobs: all(k),
            batch: 16,
        });
    }
    // A training loop: one job, batches of 64, a step of 100 ms per batch (the GPU's time).
    out.push(Scenario {
        name: "step 100 ms/64".into(),
        jobs: vec![JobPlan {
            subset: 0..n,
            sleep_ms: 100.0 / 64.0,
            start_frac: 0.0,
        }],
        batch: 64,
    });
    if !quick {
        out.push(Scenario {
            name: "speeds 0/1/3/7 ms".into(),
            jobs: [0.0, 1.0, 3.0, 7.0]
                .iter()
                .map(|&s| JobPlan {
                    subset: 0..n,
                    sleep_ms: s,
                    start_frac: 0.0,
                })
                .collect(),
            batch: 16,
        });
        out.push(Scenario {
            name: "staggered 0/25/50/75%".into(),
            jobs: [0.0, 0.25, 0.5, 0.75]
                .iter()
                .map(|&f| JobPlan {
                    subset: 0..n,
                    sleep_ms: 0.0,
                    start_frac: f,
                })
                .collect(),
            batch: 16,
        });
    }
    let overlaps: &[f64] = if quick {
        &[0.5]
    } else {
        &[0.25, 0.5, 0.75, 1.0]
    };
    for &p in overlaps {
        let s = n / 2;
        let shift = ((1.0 - p) * f64::from(s)).round() as u32;
        out.push(Scenario {
            name: format!("overlap {:.0}%", p * 100.0),
            jobs: vec![
                JobPlan {
                    subset: 0..s,
                    sleep_ms: 0.0,
                    start_frac: 0.0,
                },
                JobPlan {
                    subset: shift..shift + s,
                    sleep_ms: 0.0,
                    start_frac: 0.0,
                },
            ],
            batch: 16,
        });
    }
    out
}

/// Waits until job 0 has consumed `frac` of its epoch (or finished).
pub(super) fn wait_start(frac: f64, lead: &AtomicU64, lead_len: u64, lead_done: &AtomicU64) {
    while frac > 0.0
        && (lead.load(Relaxed) as f64) < frac * lead_len as f64
        && lead_done.load(Relaxed) == 0
    {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What a job process says on its standard output.
enum Said {
    Line(usize, String),
    Closed(usize),
}

/// Runs one process per job of `sc`, `command(i, job)` each: a script that prints `ready` once
/// imported, starts its job when it reads `go` on its standard input (and exits if it reads
/// anything else), prints `progress N` after each batch (N samples so far) and its figures as
/// JSON last. Every process is started and has done its imports before any job starts, so that
/// neither an interpreter's start-up nor its imports fall in a job's time or compete with
/// another job; job i starts when job 0 has reported `start_frac` of its epoch (or has ended),
/// as the Rust systems' threads do ([`wait_start`]). Returns each job's last line, parsed.
pub(super) fn run_processes(
    sc: &Scenario,
    command: impl Fn(usize, &JobPlan) -> Command,
) -> Result<Vec<serde_json::Value>> {
    let mut children = Vec::new();
    for (i, job) in sc.jobs.iter().enumerate() {
        let child = command(i, job)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start python3");
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e);
            }
        }
    }
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::scope(|s| {
        let mut stdins = Vec::new();
        let mut stderrs = Vec::new();
        for (i, child) in children.iter_mut().enumerate() {
            stdins.push(child.stdin.take());
            let (out, err) = (child.stdout.take(), child.stderr.take());
            let tx = tx.clone();
            s.spawn(move || {
                if let Some(out) = out {
                    for line in BufReader::new(out).lines() {
                        let Ok(line) = line else { break };
                        if tx.send(Said::Line(i, line)).is_err() {
                            break;
                        }
                    }
                }
                let _ = tx.send(Said::Closed(i));
            });
            stderrs.push(s.spawn(move || {
                let mut text = String::new();
                if let Some(mut err) = err {
                    let _ = err.read_to_string(&mut text);
                }
                text
            }));
        }
        drop(tx);
        let driven = drive(sc, &rx, &mut stdins);
        // A job not started yet reads the end of its input and exits.
        drop(stdins);
        if driven.is_err() {
            for c in &mut children {
                let _ = c.kill();
            }
        }
        let mut failed = None;
        for (i, c) in children.iter_mut().enumerate() {
            let status = c.wait()?;
            if !status.success() && failed.is_none() {
                failed = Some((i, status));
            }
        }
        let stderrs: Vec<String> = stderrs
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        if let Some((i, status)) = failed
            && driven.is_ok()
        {
            bail!("job {i}'s process failed ({status}): {}", stderrs[i]);
        }
        let last =
            driven.map_err(|e| anyhow::anyhow!("{e:#}; the jobs said: {}", stderrs.join("\n")))?;
        last.iter()
            .map(|l| serde_json::from_str(l).with_context(|| format!("job output {l:?}")))
            .collect()
    })
}

/// Starts the jobs of [`run_processes`] as their plan says, by what they print; returns each
/// job's last line once every one has closed its output.
fn drive(
    sc: &Scenario,
    rx: &crossbeam_channel::Receiver<Said>,
    stdins: &mut [Option<ChildStdin>],
) -> Result<Vec<String>> {
    let k = sc.jobs.len();
    let lead_len = sc.jobs.first().map_or(0, |j| j.subset.len()) as f64;
    let (mut ready, mut started, mut closed) = (vec![false; k], vec![false; k], vec![false; k]);
    let mut last = vec![String::new(); k];
    let (mut lead, mut lead_done) = (0u64, false);
    while !closed.iter().all(|&c| c) {
        if ready.iter().all(|&r| r) {
            for (i, job) in sc.jobs.iter().enumerate() {
                let due =
                    job.start_frac <= 0.0 || lead as f64 >= job.start_frac * lead_len || lead_done;
                if !started[i] && due {
                    started[i] = true;
                    // A process that died is seen when it closes its output.
                    if let Some(stdin) = stdins[i].as_mut() {
                        let _ = writeln!(stdin, "go").and_then(|()| stdin.flush());
                    }
                }
            }
        }
        match rx.recv().context("the jobs' output readers stopped")? {
            Said::Line(i, line) => {
                if line == "ready" {
                    ready[i] = true;
                } else if let Some(n) = line.strip_prefix("progress ") {
                    if i == 0 {
                        lead = n.trim().parse().unwrap_or(lead);
                    }
                } else {
                    last[i] = line;
                }
            }
            Said::Closed(i) => {
                closed[i] = true;
                if !started[i] {
                    bail!("job {i} ended before it was started");
                }
                lead_done |= i == 0;
            }
        }
    }
    Ok(last)
}
