//! The training jobs of one run of `joader bench train`, as processes (`train_job.py`), and
//! the aligned window they are measured over.
//!
//! Every job process imports torch, builds its model and says `ready`; when all have (and the
//! GPU monitor, when there is one), each is told `go`, so that no import falls in another
//! job's time. Each job prints its progress after every step on its own wall clock. The
//! window starts when the last job has done its warm-up steps and ends when the first job has
//! done `steps` steps inside it (then every job is told `stop`); each job's rate is the images
//! of its steps that ended in the window over the window, so the jobs' rates add up to the
//! total. CPU is read from `/proc` when the bench sees the window start and end: the server's
//! process, and per job its main thread (the training loop), its other threads (the data
//! loader's, torch's) and its child processes (DataLoader's workers), each over the bench's
//! own measure of that interval.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crossbeam_channel::{Receiver, RecvTimeoutError, unbounded};
use rustix::process::{Pid, Signal, kill_process_group};
use serde_json::Value;

/// The job and monitor script, run with `python3 -c`.
const SCRIPT: &str = include_str!("train_job.py");

/// How long the bench waits for any job to say something before it gives up.
const SILENCE: Duration = Duration::from_secs(300);

/// CPU seconds by stage name.
pub(crate) type Stages = BTreeMap<String, f64>;

/// One progress line of a job: after `step` steps, `images` images, at `t` (seconds of the
/// wall clock), with the client's CPU by stage where the client reports it.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    pub(super) images: u64,
    pub(super) t: f64,
    pub(super) stage: Option<Stages>,
}

/// When the last job has done its `warmup`-th step; `None` until every job has.
pub(super) fn window_start(jobs: &[Vec<Progress>], warmup: usize) -> Option<f64> {
    jobs.iter()
        .map(|p| p.get(warmup.max(1) - 1).map(|l| l.t))
        .try_fold(f64::NEG_INFINITY, |m, t| Some(m.max(t?)))
}

/// The earliest time at which a job has done `steps` steps after `start`; `None` while no
/// job has.
pub(super) fn window_end(jobs: &[Vec<Progress>], start: f64, steps: usize) -> Option<f64> {
    jobs.iter()
        .filter_map(|p| p.iter().filter(|l| l.t > start).nth(steps.max(1) - 1))
        .map(|l| l.t)
        .reduce(f64::min)
}

/// The last line of `p` at or before `t`.
fn at(p: &[Progress], t: f64) -> Option<&Progress> {
    p.iter().take_while(|l| l.t <= t).last()
}

/// The images of the steps of `p` that ended in `(start, end]`.
pub(super) fn images_in(p: &[Progress], start: f64, end: f64) -> u64 {
    let n = |t| at(p, t).map_or(0, |l| l.images);
    n(end).saturating_sub(n(start))
}

/// The client's CPU by stage spent in `(start, end]`, where its lines carry it.
pub(super) fn stages_in(p: &[Progress], start: f64, end: f64) -> Option<Stages> {
    let (a, b) = (at(p, start)?.stage.as_ref()?, at(p, end)?.stage.as_ref()?);
    Some(
        b.iter()
            .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
            .collect(),
    )
}

/// A process's CPU seconds so far: its main thread, all its threads (those that ended
/// included), and each child process.
#[derive(Debug, Clone, Default)]
struct ProcCpu {
    main: f64,
    total: f64,
    children: HashMap<i32, f64>,
}

fn ticks(stat: &procfs::process::Stat) -> f64 {
    (stat.utime + stat.stime) as f64 / procfs::ticks_per_second().max(1) as f64
}

/// CPU of `pid`: the process's `stat` (every thread, ended ones included), its main thread's
/// `task/<pid>/stat`, and its children's `stat` (with `children`).
fn proc_cpu(pid: u32, children: bool) -> Result<ProcCpu> {
    let p = procfs::process::Process::new(pid as i32)?;
    let total = ticks(&p.stat()?);
    let main = p
        .tasks()?
        .flatten()
        .find(|t| t.tid == pid as i32)
        .context("no main thread")?
        .stat()
        .map(|s| ticks(&s))?;
    let mut kids = HashMap::new();
    if children {
        for q in procfs::process::all_processes()?.flatten() {
            if let Ok(s) = q.stat()
                && s.ppid == pid as i32
            {
                kids.insert(s.pid, ticks(&s));
            }
        }
    }
    Ok(ProcCpu {
        main,
        total,
        children: kids,
    })
}

/// A job's CPU over the window, in cores: its training (main) thread, its other threads, its
/// child processes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct JobCpu {
    pub(super) train: f64,
    pub(super) other: f64,
    pub(super) workers: f64,
}

/// What the bench read when it saw the window start or end.
struct Snapshot<T> {
    at: Instant,
    jobs: Vec<ProcCpu>,
    server: Option<f64>,
    extra: T,
}

/// What the server side of a run gives the window: its pid and a reading taken at each end.
pub(super) struct ServerSide<'a, T> {
    pub(super) pid: u32,
    pub(super) read: &'a dyn Fn() -> Result<T>,
}

/// What [`run_jobs`] measured.
#[derive(Debug)]
pub(super) struct Measured<T> {
    /// The window, on the jobs' clock.
    pub(super) window_s: f64,
    /// Each job's images in the window.
    pub(super) images: Vec<u64>,
    pub(super) jobs_cpu: Vec<JobCpu>,
    /// The server's CPU over the window, in cores.
    pub(super) server_cores: Option<f64>,
    /// The server side's readings at the window's start and end.
    pub(super) server_reads: Option<(T, T)>,
    /// The clients' CPU by stage over the window, summed over the jobs (seconds), where every
    /// job reported it.
    pub(super) client_stages: Option<Stages>,
    /// Mean GPU utilization (percent) of the monitor's samples in the window.
    pub(super) gpu_util: Option<f64>,
}

enum Who {
    Job(usize),
    Monitor,
}

enum Said {
    Line(Who, String),
    Closed(Who),
}

/// A job in a process group of its own (its DataLoader workers join it), so that whatever it
/// leaves behind can be ended with it.
fn python(config: &Value) -> Command {
    let mut c = Command::new("python3");
    c.args(["-c", SCRIPT, &config.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    c
}

/// The processes of a run. Dropping it kills what is still running in their groups (an error
/// left them behind, or a job's worker outlived it holding its output open).
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
            if let Some(group) = Pid::from_raw(c.id() as i32) {
                let _ = kill_process_group(group, Signal::KILL);
            }
        }
    }
}

/// Waits up to `limit` for `c` to exit; `None` if it is still running.
fn wait_exit(c: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(s) = c.try_wait()? {
            return Ok(Some(s));
        }
        if start.elapsed() > limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs one job process per config (the last process is the GPU monitor when `monitor` is
/// given), measures them over the aligned window (`warmup` steps, then `steps` steps of the
/// fastest job) and stops them.
pub(super) fn run_jobs<T>(
    configs: &[Value],
    monitor: Option<&Value>,
    warmup: usize,
    steps: usize,
    server: Option<ServerSide<'_, T>>,
) -> Result<Measured<T>> {
    let k = configs.len();
    let mut procs = Procs(Vec::new());
    for c in configs.iter().chain(monitor) {
        procs
            .0
            .push(python(c).spawn().context("cannot start python3")?);
    }
    let pids: Vec<u32> = procs.0.iter().take(k).map(Child::id).collect();
    let (tx, rx) = unbounded();
    let mut stdins: Vec<Option<ChildStdin>> = Vec::new();
    let mut stderrs = Vec::new();
    for (i, child) in procs.0.iter_mut().enumerate() {
        stdins.push(child.stdin.take());
        let (out, mut err) = (child.stdout.take(), child.stderr.take());
        let tx = tx.clone();
        let who = move || if i < k { Who::Job(i) } else { Who::Monitor };
        std::thread::spawn(move || {
            if let Some(out) = out {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(Said::Line(who(), line)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(Said::Closed(who()));
        });
        stderrs.push(std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_string(&mut text);
            }
            text
        }));
    }
    drop(tx);
    let driven = drive(
        &rx,
        &mut stdins,
        &pids,
        monitor.is_some(),
        warmup,
        steps,
        server,
    );
    // Every job has been told to stop (or the run failed): their inputs end.
    drop(stdins);
    if driven.is_err() {
        drop(procs);
        let said: Vec<String> = stderrs
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        return driven.map_err(|e| {
            anyhow::anyhow!(
                "{e:#}; the jobs said:\n{}",
                said.iter()
                    .map(|s| tail(s, 3000))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        });
    }
    for (i, c) in procs.0.iter_mut().enumerate() {
        // A job has said it is done (or closed its output): it only cleans up now.
        let Some(status) = wait_exit(c, Duration::from_secs(60))? else {
            eprintln!("job {i} had not exited 60 s after it stopped: killed");
            continue;
        };
        if !status.success() && i < k {
            let said = stderrs.swap_remove(i).join().unwrap_or_default();
            bail!("job {i} failed ({status}): {}", tail(&said, 3000));
        }
    }
    driven
}

fn tail(s: &str, n: usize) -> &str {
    let from = s.len().saturating_sub(n);
    let from = (from..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    &s[from..]
}

/// Hands out `go`, follows the jobs' progress, reads `/proc` (and the server) at the window's
/// ends and says `stop`; returns once every job has ended.
fn drive<T>(
    rx: &Receiver<Said>,
    stdins: &mut [Option<ChildStdin>],
    pids: &[u32],
    monitored: bool,
    warmup: usize,
    steps: usize,
    server: Option<ServerSide<'_, T>>,
) -> Result<Measured<T>> {
    let k = pids.len();
    let say = |stdins: &mut [Option<ChildStdin>], what: &str| {
        for s in stdins.iter_mut().take(k).flatten() {
            // A job that died is seen when its output closes.
            let _ = writeln!(s, "{what}").and_then(|()| s.flush());
        }
    };
    let snapshot = || -> Result<Snapshot<Option<T>>> {
        let at = Instant::now();
        let jobs = pids
            .iter()
            .map(|&p| proc_cpu(p, true))
            .collect::<Result<Vec<_>>>()?;
        let (server_cpu, extra) = match &server {
            Some(s) => (Some(proc_cpu(s.pid, false)?.total), Some((s.read)()?)),
            None => (None, None),
        };
        Ok(Snapshot {
            at,
            jobs,
            server: server_cpu,
            extra,
        })
    };
    let mut ready = vec![false; k];
    let mut monitor_ready = !monitored;
    // Jobs that said they were done or closed their output.
    let mut closed = vec![false; k];
    let mut progress: Vec<Vec<Progress>> = vec![Vec::new(); k];
    let mut gpu: Vec<(f64, f64)> = Vec::new();
    let mut go = false;
    let mut start: Option<(f64, Snapshot<Option<T>>)> = None;
    let mut end: Option<Snapshot<Option<T>>> = None;
    while !closed.iter().all(|&c| c) {
        if !go && monitor_ready && ready.iter().all(|&r| r) {
            go = true;
            say(stdins, "go");
        }
        let said = match rx.recv_timeout(SILENCE) {
            Ok(s) => s,
            Err(RecvTimeoutError::Timeout) => bail!("no job said anything for {SILENCE:?}"),
            Err(RecvTimeoutError::Disconnected) => bail!("the jobs' output readers stopped"),
        };
        match said {
            Said::Line(Who::Monitor, line) => {
                if line == "ready" {
                    monitor_ready = true;
                } else if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if let (Some(t), Some(u)) = (v["t"].as_f64(), v["gpu"].as_f64()) {
                        gpu.push((t, u));
                    } else if let Some(why) = v["nvml"].as_str() {
                        eprintln!("GPU utilization: n/a (NVML: {why})");
                    }
                }
            }
            Said::Closed(Who::Monitor) => monitor_ready = true,
            Said::Line(Who::Job(i), line) => {
                if line == "ready" {
                    ready[i] = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if v["done"].as_bool() == Some(true) {
                    closed[i] = true;
                    if end.is_none() {
                        bail!(
                            "job {i} ended before the window did ({} steps)",
                            progress[i].len()
                        );
                    }
                    continue;
                }
                let stage = v["stage"].as_object().map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                        .collect()
                });
                progress[i].push(Progress {
                    images: v["images"]
                        .as_u64()
                        .context("a progress line without images")?,
                    t: v["t"].as_f64().context("a progress line without t")?,
                    stage,
                });
                if start.is_none()
                    && let Some(t0) = window_start(&progress, warmup)
                {
                    start = Some((t0, snapshot()?));
                }
                if let Some((t0, _)) = &start
                    && end.is_none()
                    && window_end(&progress, *t0, steps).is_some()
                {
                    end = Some(snapshot()?);
                    say(stdins, "stop");
                }
            }
            Said::Closed(Who::Job(i)) => {
                closed[i] = true;
                if end.is_none() {
                    bail!(
                        "job {i} ended before the window did ({} steps)",
                        progress[i].len()
                    );
                }
            }
        }
    }
    let ((t0, s0), s1) = start.zip(end).context("no window")?;
    let t1 = window_end(&progress, t0, steps).context("no window end")?;
    let secs = s1.at.duration_since(s0.at).as_secs_f64().max(1e-9);
    // Cores, never below zero (`+ 0.0`: an empty sum is -0.0).
    let cores = |cpu: f64| cpu.max(0.0) / secs + 0.0;
    let jobs_cpu = s0
        .jobs
        .iter()
        .zip(&s1.jobs)
        .map(|(a, b)| JobCpu {
            train: cores(b.main - a.main),
            other: cores((b.total - b.main) - (a.total - a.main)),
            workers: cores(
                b.children
                    .iter()
                    .map(|(pid, c)| c - a.children.get(pid).copied().unwrap_or(0.0))
                    .sum::<f64>(),
            ),
        })
        .collect();
    let in_window: Vec<f64> = gpu
        .iter()
        .filter(|(t, _)| (t0..=t1).contains(t))
        .map(|&(_, u)| u)
        .collect();
    let client_stages =
        progress
            .iter()
            .map(|p| stages_in(p, t0, t1))
            .try_fold(Stages::new(), |mut sum, s| {
                for (k, v) in s? {
                    *sum.entry(k).or_default() += v;
                }
                Some(sum)
            });
    Ok(Measured {
        window_s: t1 - t0,
        images: progress.iter().map(|p| images_in(p, t0, t1)).collect(),
        jobs_cpu,
        server_cores: s0.server.zip(s1.server).map(|(a, b)| cores(b - a)),
        server_reads: s0.extra.zip(s1.extra),
        client_stages,
        gpu_util: (!in_window.is_empty())
            .then(|| in_window.iter().sum::<f64>() / in_window.len() as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(times: &[f64], per: u64) -> Vec<Progress> {
        times
            .iter()
            .enumerate()
            .map(|(i, &t)| Progress {
                images: (i as u64 + 1) * per,
                t,
                stage: Some(Stages::from([("decode".into(), i as f64 * 0.5)])),
            })
            .collect()
    }

    /// The window opens when the slowest job has warmed up and closes when the fastest has
    /// done its steps inside it; the jobs' images in it add up to the total over it.
    #[test]
    fn the_window_is_aligned_on_every_job() {
        let fast = job(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 10);
        let slow = job(&[2.0, 4.0, 6.0, 8.0], 10);
        let jobs = vec![fast.clone(), slow.clone()];
        assert_eq!(window_start(&jobs[..1], 2), Some(2.0));
        let t0 = window_start(&jobs, 2).unwrap();
        assert_eq!(t0, 4.0);
        // The fast job's 2nd step after t0 ends at 6.0; the slow one has done one by then.
        let t1 = window_end(&jobs, t0, 2).unwrap();
        assert_eq!(t1, 6.0);
        assert_eq!(images_in(&fast, t0, t1), 20);
        assert_eq!(images_in(&slow, t0, t1), 10);
        assert_eq!(stages_in(&fast, t0, t1).unwrap()["decode"], 1.0);
        // Not every job has warmed up: no window yet.
        assert_eq!(window_start(&[fast, job(&[1.0], 10)], 2), None);
        // No job is past its steps: no end yet.
        assert_eq!(window_end(&[slow], 4.0, 3), None);
    }
}
