//! `bench e2e --source s3 --store-cpus N`: the store on CPUs of its own. A real object store
//! runs on other machines; a local `s3s-fs` and the delay proxy otherwise take CPU from the
//! same cores as the server and the jobs, and an S3 row then measures the store's work as
//! much as joader's waiting. With `N`, the last `N` CPUs this process may use are the store's
//! (`s3s-fs` and the proxy's threads) and everything else of the bench (the `joader serve`
//! children, the jobs, the other systems' rows, the disk rows too) runs on the rest, so every
//! row has the same cores.

use anyhow::{Context, Result, bail};
use rustix::process::Pid;
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// The CPUs of the store and those of the rest of the bench.
#[derive(Clone, Copy)]
pub struct Split {
    pub store: CpuSet,
    pub rest: CpuSet,
}

impl Split {
    /// The last `n` of the CPUs this process may use for the store, the others for the rest.
    pub fn of(n: usize) -> Result<Split> {
        let allowed = sched_getaffinity(None).context("sched_getaffinity")?;
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .collect();
        if n == 0 || n >= cpus.len() {
            bail!(
                "--store-cpus {n}: this process may use {} CPU(s); the store takes 1 to {} of them",
                cpus.len(),
                cpus.len().saturating_sub(1)
            );
        }
        let (mut store, mut rest) = (CpuSet::new(), CpuSet::new());
        let (r, s) = cpus.split_at(cpus.len() - n);
        r.iter().for_each(|&c| rest.set(c));
        s.iter().for_each(|&c| store.set(c));
        Ok(Split { store, rest })
    }

    /// Puts every thread of this process on the rest's CPUs (threads and processes started
    /// later inherit it).
    pub fn pin_this_process(&self) -> Result<()> {
        pin_threads("self", &self.rest)?;
        sched_setaffinity(None, &self.rest).context("sched_setaffinity")?;
        Ok(())
    }

    /// Puts every thread of the store's process `pid` on the store's CPUs, once it serves
    /// (threads it starts later inherit it from the thread that starts them).
    pub fn pin_store_process(&self, pid: u32) -> Result<()> {
        pin_threads(&pid.to_string(), &self.store)
    }

    /// Puts the calling thread on the store's CPUs (the delay proxy's threads).
    pub fn pin_store_thread(&self) {
        if let Err(e) = sched_setaffinity(None, &self.store) {
            tracing::warn!(error = %e, "cannot put a delay proxy thread on the store's CPUs");
        }
    }

    /// The two sets, for the report: `store 1, rest 0`.
    pub fn describe(&self) -> String {
        let list = |s: &CpuSet| {
            (0..CpuSet::MAX_CPU)
                .filter(|&c| s.is_set(c))
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "store (s3s-fs, delay proxy) on CPU {}, joader and the jobs on CPU {}",
            list(&self.store),
            list(&self.rest)
        )
    }
}

/// Puts every thread of process `pid` (`self`: this one) on `cpus`.
fn pin_threads(pid: &str, cpus: &CpuSet) -> Result<()> {
    let dir = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(&dir).with_context(|| dir.clone())? {
        let tid: i32 = task?.file_name().to_string_lossy().parse()?;
        // A thread that ended since the listing is no error.
        if let Some(tid) = Pid::from_raw(tid) {
            let _ = sched_setaffinity(Some(tid), cpus);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_takes_the_last_cpus_and_a_child_runs_there() {
        let allowed = sched_getaffinity(None).unwrap();
        if allowed.count() < 2 {
            return; // one CPU: nothing to split (the bench refuses, tested below)
        }
        let split = Split::of(1).unwrap();
        assert_eq!(split.store.count(), 1);
        assert_eq!(split.rest.count() + 1, allowed.count());
        let last = (0..CpuSet::MAX_CPU)
            .rev()
            .find(|&c| allowed.is_set(c))
            .unwrap();
        assert!(split.store.is_set(last) && !split.rest.is_set(last));
        // A child pinned as the store runs on its CPU alone, each of its threads.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        split.pin_store_process(child.id()).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list"))
            .unwrap();
        assert_eq!(
            line.split_whitespace().last(),
            Some(last.to_string().as_str()),
            "{line}"
        );
        assert!(Split::of(allowed.count() as usize).is_err());
        assert!(Split::of(0).is_err());
    }
}
