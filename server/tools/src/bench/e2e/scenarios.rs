//! The scenarios of `joader bench e2e`: how many jobs, on which subsets, at which speeds and
//! with which staggered starts.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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
