//! Per-stage CPU accounting: the thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) that a process
//! spends in each stage of its work, summed over threads in process-wide relaxed counters.
//!
//! Each thread has a *current* stage; at every stage boundary ([`enter`], the drop of its
//! guard, [`set_base`]) the thread reads its CPU clock once and charges what it used since the
//! previous boundary to the stage it is leaving. A thread's clock starts at zero, so from its
//! first boundary on, every nanosecond it runs is charged to some stage: what a thread does
//! outside any [`enter`] goes to its *base* stage ([`RUNTIME`] until [`set_base`] names
//! another), and what is left when the thread exits is charged then. Time since a thread's
//! last boundary is not yet counted (an idle thread's is about zero).
//!
//! The mechanism lives here, a small crate under every crate that marks a boundary (storage,
//! the pipeline, the actors, the daemon, the clients' prefetch), so that one clock per thread
//! serves them all; each crate defines the stages it marks (`joader_pipeline::stage`,
//! `actors::stages`, `joader_storage::stage`, `dataplane::stages`), and the
//! daemon lists its own (`server::stages::SERVER`, `joader_stage_cpu_seconds_total`).
//!
//! A thread may also be [`attach`]ed to a [`StageSink`]: its time is then counted there too,
//! and so is its whole CPU time while attached, so that one prefetch's figures are its own
//! whatever else the process runs.

// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// A stage: a name and the thread CPU nanoseconds charged to it in this process.
#[derive(Debug)]
pub struct Stage {
    name: &'static str,
    ns: AtomicU64,
}

impl Stage {
    /// A stage named `name` (a `static`: its counter is process-wide; each name once).
    pub const fn new(name: &'static str) -> Stage {
        Stage {
            name,
            ns: AtomicU64::new(0),
        }
    }

    /// The stage's name (a metric label value).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Thread CPU nanoseconds charged so far, summed over the process's threads.
    pub fn nanos(&self) -> u64 {
        self.ns.load(Relaxed)
    }

    /// [`Stage::nanos`] in seconds.
    pub fn seconds(&self) -> f64 {
        self.nanos() as f64 / 1e9
    }
}

/// What a thread runs outside any other stage: the actix arbiters' and tokio's event loops
/// (timers, mailboxes, I/O readiness), start-up, and threads that name no stage of their own.
pub static RUNTIME: Stage = Stage::new("runtime");

/// CPU time of the calling thread, in nanoseconds since the thread started.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// Stage times of the threads attached to it (one prefetch's threads), beside the process's.
#[derive(Debug)]
pub struct StageSink {
    stages: &'static [&'static Stage],
    ns: Box<[AtomicU64]>,
    /// Whole CPU time of the attached threads while attached (counted when they detach).
    threads_ns: AtomicU64,
}

impl StageSink {
    /// A sink for `stages` (time in other stages is counted by the process alone).
    pub fn new(stages: &'static [&'static Stage]) -> Arc<StageSink> {
        Arc::new(StageSink {
            stages,
            ns: stages.iter().map(|_| AtomicU64::new(0)).collect(),
            threads_ns: AtomicU64::new(0),
        })
    }

    fn add(&self, stage: &'static Stage, ns: u64) {
        if let Some(i) = self.stages.iter().position(|s| std::ptr::eq(*s, stage)) {
            self.ns[i].fetch_add(ns, Relaxed);
        }
    }

    /// Seconds charged to each stage by the attached threads, in the order of the stages.
    pub fn seconds(&self) -> Vec<(&'static str, f64)> {
        self.stages
            .iter()
            .zip(&self.ns)
            .map(|(s, n)| (s.name(), n.load(Relaxed) as f64 / 1e9))
            .collect()
    }

    /// Whole CPU seconds of the threads that were attached and have detached (or exited):
    /// what [`StageSink::seconds`] should add up to once they all have.
    pub fn threads_seconds(&self) -> f64 {
        self.threads_ns.load(Relaxed) as f64 / 1e9
    }
}

/// A thread's place in the stages.
struct ThreadStages {
    base: Cell<&'static Stage>,
    current: Cell<&'static Stage>,
    /// The thread's CPU clock at its last boundary.
    last: Cell<u64>,
    /// The sink the thread is attached to, and its clock when it attached.
    sink: RefCell<Option<(Arc<StageSink>, u64)>>,
}

impl ThreadStages {
    /// Charges the time since the last boundary to the current stage, then makes `next`
    /// current; returns the clock.
    fn switch(&self, next: &'static Stage) -> u64 {
        let now = thread_cpu_ns();
        let used = now.saturating_sub(self.last.replace(now));
        let left = self.current.replace(next);
        left.ns.fetch_add(used, Relaxed);
        if let Some((sink, _)) = &*self.sink.borrow() {
            sink.add(left, used);
        }
        now
    }

    fn detach(&self) {
        let now = self.switch(self.current.get());
        if let Some((sink, since)) = self.sink.borrow_mut().take() {
            sink.threads_ns
                .fetch_add(now.saturating_sub(since), Relaxed);
        }
    }
}

impl Drop for ThreadStages {
    /// The thread is exiting: its last stretch goes to the stage it was in.
    fn drop(&mut self) {
        self.detach();
    }
}

thread_local! {
    static THREAD: ThreadStages = const {
        ThreadStages {
            base: Cell::new(&RUNTIME),
            current: Cell::new(&RUNTIME),
            last: Cell::new(0),
            sink: RefCell::new(None),
        }
    };
}

/// Counts the calling thread's time in `sink` too from now on, with `base` as its base stage,
/// until [`detach`] or the thread's end.
pub fn attach(sink: Arc<StageSink>, base: &'static Stage) {
    let _ = THREAD.try_with(|t| {
        t.detach();
        let now = t.switch(t.current.get());
        *t.sink.borrow_mut() = Some((sink, now));
    });
    set_base(base);
}

/// Ends the calling thread's [`attach`]: its time so far is in the sink, its whole time while
/// attached in [`StageSink::threads_seconds`].
pub fn detach() {
    let _ = THREAD.try_with(ThreadStages::detach);
}

/// The sink the calling thread is attached to, if any (for threads it starts to attach to).
pub fn sink() -> Option<Arc<StageSink>> {
    THREAD
        .try_with(|t| t.sink.borrow().as_ref().map(|(s, _)| s.clone()))
        .ok()
        .flatten()
}

/// While alive, the thread is in the stage [`enter`] named; dropping it returns the thread
/// to the stage it was in before (its base if that was the base).
#[must_use = "the stage ends when this guard is dropped"]
pub struct Entered {
    /// `None`: the thread was in its base stage.
    prev: Option<&'static Stage>,
}

/// Charges the calling thread's time from now on to `stage`, until the guard is dropped.
/// Stages nest: the inner one's time is not charged to the outer one.
pub fn enter(stage: &'static Stage) -> Entered {
    THREAD
        .try_with(|t| {
            let was = t.current.get();
            t.switch(stage);
            Entered {
                prev: (!std::ptr::eq(was, t.base.get())).then_some(was),
            }
        })
        // Never built unless the thread is exiting: dropping a guard is a boundary.
        .unwrap_or_else(|_| Entered { prev: None })
}

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = THREAD.try_with(|t| t.switch(self.prev.unwrap_or_else(|| t.base.get())));
    }
}

/// Makes `stage` the calling thread's base stage (what it runs outside any [`enter`]); the
/// time since its last boundary goes to the stage it was in.
pub fn set_base(stage: &'static Stage) {
    let _ = THREAD.try_with(|t| {
        if std::ptr::eq(t.base.get(), stage) {
            return;
        }
        let at_base = std::ptr::eq(t.current.get(), t.base.get());
        t.base.set(stage);
        if at_base {
            t.switch(stage);
        }
    });
}

/// Charges the calling thread's time so far to its current stage (a boundary with no change
/// of stage), so that a reader of the counters sees this thread's time up to now.
pub fn flush() {
    let _ = THREAD.try_with(|t| {
        t.switch(t.current.get());
    });
}

/// The nanoseconds of each of `stages`, in order.
pub fn snapshot<const N: usize>(stages: &[&'static Stage; N]) -> [u64; N] {
    stages.map(Stage::nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: Stage = Stage::new("a");
    static B: Stage = Stage::new("b");
    static C: Stage = Stage::new("c");

    fn burn(ms: u64) {
        let start = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() - start < ms * 1_000_000 {
            for i in 0..10_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
    }

    #[test]
    fn a_thread_s_whole_cpu_time_lands_in_its_stages() {
        // A fresh thread: its clock starts at zero, so the stages must add up to all of it.
        let (total, a, b, c) = std::thread::spawn(|| {
            set_base(&C);
            burn(5);
            {
                let _a = enter(&A);
                burn(20);
                {
                    let _b = enter(&B);
                    burn(10);
                }
                burn(5);
            }
            burn(5);
            flush();
            (thread_cpu_ns(), A.nanos(), B.nanos(), C.nanos())
        })
        .join()
        .unwrap();
        // Only this test uses A, B and C.
        assert!(
            a >= 25_000_000 && b >= 10_000_000 && c >= 10_000_000,
            "{a} {b} {c}"
        );
        // Everything up to the flush is charged, nothing twice; the clock reads after the
        // flush are all that is missing.
        let sum = a + b + c;
        assert!(sum <= total && total - sum < 1_000_000, "{sum} of {total}");
    }

    #[test]
    fn a_guard_returns_to_a_base_set_while_it_was_alive() {
        static D: Stage = Stage::new("d");
        static E: Stage = Stage::new("e");
        static F: Stage = Stage::new("f");
        std::thread::spawn(|| {
            let g = enter(&D);
            set_base(&E);
            drop(g);
            burn(5);
            flush();
            assert!(E.nanos() >= 5_000_000, "{}", E.nanos());
            let _f = enter(&F);
            // Setting the base inside a stage keeps the stage.
            set_base(&D);
            burn(2);
            flush();
            assert!(F.nanos() >= 2_000_000);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_sink_counts_its_threads_alone() {
        static G: Stage = Stage::new("g");
        static H: Stage = Stage::new("h");
        static BOTH: [&Stage; 2] = [&G, &H];
        let sink = StageSink::new(&BOTH);
        // Time before attaching, and another thread's time in the same stages, stay out.
        let other = std::thread::spawn(|| {
            let _g = enter(&G);
            burn(10);
        });
        let s = sink.clone();
        std::thread::spawn(move || {
            burn(5);
            attach(s, &H);
            burn(5);
            let _g = enter(&G);
            burn(10);
            // No detach: the thread's end counts its time.
        })
        .join()
        .unwrap();
        other.join().unwrap();
        let got = sink.seconds();
        let (g, h, threads) = (got[0].1, got[1].1, sink.threads_seconds());
        assert!((0.010..0.0105).contains(&g), "{g}");
        assert!((0.005..0.0055).contains(&h), "{h}");
        assert!(
            threads >= g + h && threads - (g + h) < 0.0005,
            "{g} + {h} of {threads}"
        );
        assert!(G.seconds() >= 0.020);
    }
}
