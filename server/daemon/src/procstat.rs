//! CPU time, resident memory and threads of this process, read from `/proc/self/stat` with the
//! `procfs` crate; the metrics, the dashboard and the benchmarks share it.

use procfs::WithCurrentSystemInfo;

/// What `/proc/self/stat` says of this process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessStats {
    /// User and system CPU time.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub threads: u64,
}

/// `None` where `/proc` is not available.
pub fn process_stats() -> Option<ProcessStats> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second().max(1) as f64;
    Some(ProcessStats {
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        rss_bytes: stat.rss_bytes().get(),
        threads: u64::try_from(stat.num_threads).unwrap_or(0),
    })
}

/// CPU seconds (user + system) of this process so far; 0 where `/proc` is not available.
pub fn process_cpu() -> f64 {
    process_stats().map_or(0.0, |p| p.cpu_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let p = process_stats().expect("/proc/self is readable on linux");
        assert!(p.rss_bytes > 0 && p.threads >= 1, "{p:?}");
        // Burn some CPU: the figure only grows.
        let before = p.cpu_seconds;
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu() >= before);
    }
}
