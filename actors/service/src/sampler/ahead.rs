//! Fetch-ahead for a dataset read from an object store: its jobs are sampled further ahead
//! than the Cache is handed their picks, and the source fetches the encoded bytes of what was
//! picked meanwhile, so that when the Cache loads an element its bytes are (nearly) there and
//! decoding never waits on a round trip to the store.
//!
//! Without it a job had at most its rings' credit and its lookahead in flight (64 elements
//! with 16-element batches), each of which spent a GET before its decode: a job read at most
//! 64 elements per GET time plus decode, about 490 samples/s against a store on loopback.
//! Sampling those jobs further ahead and handing the picks to the Cache at once was tried: the
//! Cache then loaded (decoded) what was sampled far ahead, and with six jobs drifting apart
//! the decoded cache evicted elements before the other jobs came for them (the store was read
//! 1.19-1.38 times the union of the subsets). So here the picks beyond the window wait in the
//! Sampler, as encoded bytes in the source's buffer only:
//!
//! - **Depth.** A job of such a dataset is sampled [`Queue::depth`] deliveries beyond what it
//!   would be otherwise (its credit in the Sampler is raised by that much once it has
//!   started): enough that a pick waits at least a fetch's time before the Cache needs it,
//!   with a margin ([`target_depth`]: its rate times the source's fetch time, times
//!   [`MARGIN`], plus its lookahead; its rings' places plus its lookahead before its rate is
//!   known), within [`MAX_DEPTH`]. The depth follows the rate and the
//!   store's time pass by pass; it shrinks only as far as the job's credit allows.
//! - **Held picks.** Each pick of such a job goes into the job's queue of held picks (with its
//!   ends of epochs, in order), and the source is asked for its bytes at once. A queue hands
//!   its picks to the Cache in order while the job's credit *as the Cache sees it* (what came
//!   back, less what was handed over) is above minus its lookahead: the Cache sees exactly what
//!   it would without fetch-ahead, and loads and evicts as before.
//! - **Need counts.** A held pick is a delivery to come: an element's need count (RefCnt)
//!   sent to the Cache counts the other jobs' held picks of it besides the jobs that have yet
//!   to pick it, so that the Cache keeps a shared element for the job whose pick of it is
//!   still held. A job's own held pick of the element (in its next epoch, since a job picks an
//!   element once per epoch) is not counted: as without fetch-ahead, the Cache learns of a
//!   job's next epoch when it starts, and a small cache keeps its room for what is queued.
//! - **On a cluster's leader** the Sampler has no source: its clock is the slowest GET time
//!   the nodes report ([`FetchClock`]), and its downstream is the leader's placement, which
//!   sends each pick to fetch ahead to the node it guesses the pick goes to.
//! - **Finished and removed jobs.** A job that finished its last epoch keeps its queue until
//!   the queue is empty (its credit still comes back); a removed job's queue is dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use joader_core::sampling::SamplerKind;

use crate::messages::{Deliver, DeliverGroup, DeliverItem, EndAt, JobId};

/// A held pick waits at least this many fetch times before the Cache needs it.
pub(super) const MARGIN: f64 = 3.0;

/// The most deliveries a job is sampled beyond its lookahead.
pub(super) const MAX_DEPTH: u32 = 4096;

/// What a queue holds, in the order the Cache must receive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// `hinted`: the Cache was asked to fetch its bytes ahead.
    Pick {
        element: u32,
        item: DeliverItem,
        hinted: bool,
    },
    End {
        epoch: u32,
        finished: bool,
    },
}

/// One job's held picks (see the module docs).
#[derive(Debug)]
pub(super) struct Queue {
    /// The sampler that picks for the job (whose need counts its picks carry).
    kind: SamplerKind,
    held: VecDeque<Held>,
    /// The job's credit as the Cache sees it: what came back less what was handed over.
    credit: i64,
    /// How far below zero that credit may go: the job's lookahead.
    window: i64,
    /// Deliveries the job is sampled beyond what it would be without fetch-ahead.
    pub(super) depth: u32,
    /// Its rings' places (the most credit the Cache has seen it have).
    pub(super) places: u32,
    /// Its last end of stream is held: the queue goes once it is handed over.
    finished: bool,
    /// The epoch of the last pick handed over (the Cache's view of the job's epoch; before
    /// any, that of its first pick).
    cache_epoch: Option<u32>,
}

/// How long fetching an element takes now (`None`: unknown, or no fetch-ahead now): a
/// source's own [`crate::messages::Fetch::fetch_time`], or, on a cluster's leader, the
/// slowest of what the nodes that fetch report.
pub type FetchClock = Arc<dyn Fn() -> Option<Duration> + Send + Sync>;

/// The held picks of a dataset's jobs, and the clock of the fetches of their bytes.
pub(super) struct FetchAhead {
    clock: FetchClock,
    /// By job (ordered: picks are handed over in the same order every time).
    queues: BTreeMap<JobId, Queue>,
    /// The jobs with a held pick of each element (once per pick).
    held: HashMap<u32, Vec<JobId>>,
}

impl FetchAhead {
    pub(super) fn new(clock: FetchClock) -> Self {
        Self {
            clock,
            queues: BTreeMap::new(),
            held: HashMap::new(),
        }
    }

    /// How long a fetch takes now (`None`: the source no longer fetches ahead).
    pub(super) fn fetch_time(&self) -> Option<Duration> {
        (self.clock)()
    }

    /// A job joins with `credit` and `lookahead` (its depth is set once it starts).
    pub(super) fn add(&mut self, job: JobId, kind: SamplerKind, credit: i64, lookahead: u32) {
        self.queues.insert(
            job,
            Queue {
                kind,
                held: VecDeque::new(),
                credit,
                window: i64::from(lookahead),
                depth: 0,
                places: credit.max(0) as u32,
                finished: false,
                cache_epoch: None,
            },
        );
    }

    pub(super) fn queue_mut(&mut self, job: JobId) -> Option<&mut Queue> {
        self.queues.get_mut(&job)
    }

    /// Holds `job`'s pick of `element` if the job has a queue (`None` if not); returns
    /// whether its bytes are to be fetched ahead now: a pick of the epoch the Cache sees the
    /// job in is; one of its next epoch waits until that epoch's first pick is handed over
    /// (see [`Self::release`]).
    pub(super) fn hold(&mut self, element: u32, item: DeliverItem) -> Option<bool> {
        let q = self.queues.get_mut(&item.job)?;
        let hinted = *q.cache_epoch.get_or_insert(item.epoch) == item.epoch;
        q.held.push_back(Held::Pick {
            element,
            item,
            hinted,
        });
        self.held.entry(element).or_default().push(item.job);
        Some(hinted)
    }

    /// Held picks of `element` by jobs other than `job` (deliveries to come, for its need
    /// count; `None`: every job's).
    pub(super) fn held(&self, element: u32, job: Option<JobId>) -> u32 {
        held_by_others(&self.held, element, job)
    }

    /// Holds the end of `job`'s `epoch` if the job has a queue; returns whether it did.
    pub(super) fn hold_end(&mut self, job: JobId, epoch: u32) -> bool {
        let Some(q) = self.queues.get_mut(&job) else {
            return false;
        };
        q.held.push_back(Held::End {
            epoch,
            finished: false,
        });
        true
    }

    /// `job` finished: its last held end is its end of stream. Returns whether it had one.
    pub(super) fn finish(&mut self, job: JobId) -> bool {
        let Some(q) = self.queues.get_mut(&job) else {
            return false;
        };
        let last = q.held.iter_mut().rev().find_map(|h| match h {
            Held::End { finished, .. } => Some(finished),
            Held::Pick { .. } => None,
        });
        match last {
            Some(finished) => {
                *finished = true;
                q.finished = true;
                true
            }
            None => false,
        }
    }

    /// `n` deliveries of `job`'s credit came back.
    pub(super) fn credit(&mut self, job: JobId, n: u32) {
        if let Some(q) = self.queues.get_mut(&job) {
            q.credit += i64::from(n);
            q.places = q.places.max(q.credit.clamp(0, i64::from(u32::MAX)) as u32);
        }
    }

    /// Forgets a removed job's queue.
    pub(super) fn remove(&mut self, job: JobId) {
        if let Some(q) = self.queues.remove(&job) {
            for h in q.held {
                if let Held::Pick { element, .. } = h {
                    unhold(&mut self.held, element, job);
                }
            }
        }
    }

    /// Hands the Cache, into `out`, each queue's picks (and ends) in order while the job's
    /// credit as the Cache sees it is above minus its lookahead; `need` is an element's need
    /// count in the sampler of a kind (the held picks of it are added). Once the first pick of
    /// a job's next epoch is handed over, the Cache (and a remote source's disk tier, whose
    /// admission follows what each job still needs this epoch) knows that epoch: the picks of
    /// it still held are then fetched ahead. Fetched earlier, they looked unneeded to the tier,
    /// which stored them in the place of objects the new epoch needs.
    pub(super) fn release(&mut self, need: impl Fn(u32, SamplerKind) -> u32, out: &mut Deliver) {
        let mut done = Vec::new();
        let mut handed = Vec::new();
        let fetching = (self.clock)().is_some();
        for (&job, q) in &mut self.queues {
            let mut new_epoch = false;
            while let Some(&front) = q.held.front() {
                match front {
                    Held::Pick { element, item, .. } => {
                        if q.credit <= -q.window {
                            break;
                        }
                        q.credit -= 1;
                        new_epoch |= q.cache_epoch.replace(item.epoch) != Some(item.epoch);
                        handed.push((element, item));
                    }
                    Held::End { epoch, finished } => {
                        // An end follows the picks handed over before it.
                        flush(&mut handed, &mut self.held, &|e| need(e, q.kind), out);
                        out.ends.push(EndAt {
                            after: out.groups.len(),
                            job,
                            epoch,
                            finished,
                        });
                    }
                }
                q.held.pop_front();
            }
            flush(&mut handed, &mut self.held, &|e| need(e, q.kind), out);
            if new_epoch {
                for h in &mut q.held {
                    if let Held::Pick {
                        element,
                        item,
                        hinted: hinted @ false,
                    } = h
                        && Some(item.epoch) == q.cache_epoch
                    {
                        *hinted = true;
                        if fetching {
                            out.ahead.push((*element, job));
                        }
                    }
                }
            }
            if q.finished && q.held.is_empty() {
                done.push(job);
            }
        }
        for job in done {
            self.queues.remove(&job);
        }
    }

    /// Checks the queues: no job's Cache-side credit below minus its window, the held counts
    /// those of the queues.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut counted: HashMap<u32, Vec<JobId>> = HashMap::new();
        for (job, q) in &self.queues {
            if q.credit < -q.window {
                return Err(format!(
                    "job {job} was handed to the Cache beyond its credit and lookahead ({} left, \
                     lookahead {})",
                    q.credit, q.window
                ));
            }
            for h in &q.held {
                if let Held::Pick { element, .. } = h {
                    counted.entry(*element).or_default().push(*job);
                }
            }
        }
        let sorted = |m: &HashMap<u32, Vec<JobId>>| -> BTreeMap<u32, Vec<JobId>> {
            m.iter()
                .map(|(&e, jobs)| {
                    let mut jobs = jobs.clone();
                    jobs.sort_unstable();
                    (e, jobs)
                })
                .collect()
        };
        if sorted(&counted) != sorted(&self.held) {
            return Err("the held picks per element are not those of the queues".into());
        }
        Ok(())
    }
}

/// Appends the picks handed over, each as a group of its own with its need count (the
/// sampler's plus the other jobs' picks of it still held).
fn flush(
    handed: &mut Vec<(u32, DeliverItem)>,
    held: &mut HashMap<u32, Vec<JobId>>,
    need: &impl Fn(u32) -> u32,
    out: &mut Deliver,
) {
    for (element, item) in handed.drain(..) {
        unhold(held, element, item.job);
        out.groups.push(DeliverGroup {
            element,
            need: need(element) + held_by_others(held, element, Some(item.job)),
            items: vec![item],
        });
    }
}

/// Forgets one of `job`'s held picks of `element`.
fn unhold(held: &mut HashMap<u32, Vec<JobId>>, element: u32, job: JobId) {
    if let Some(jobs) = held.get_mut(&element) {
        if let Some(i) = jobs.iter().position(|&j| j == job) {
            jobs.swap_remove(i);
        }
        if jobs.is_empty() {
            held.remove(&element);
        }
    }
}

/// Held picks of `element` by jobs other than `job` (`None`: by every job).
fn held_by_others(held: &HashMap<u32, Vec<JobId>>, element: u32, job: Option<JobId>) -> u32 {
    held.get(&element).map_or(0, |jobs| {
        jobs.iter().filter(|&&j| Some(j) != job).count() as u32
    })
}

/// How far beyond its lookahead a job reading `rate` deliveries a second is sampled, when a
/// fetch takes `fetch`: [`MARGIN`] fetch times of its reads, plus its lookahead, within
/// [`MAX_DEPTH`]. Before its rate is known (`None`), its rings' `places` plus its lookahead: a
/// reader starts by taking what its rings hold at once.
pub(super) fn target_depth(rate: Option<f64>, fetch: Duration, lookahead: u32, places: u32) -> u32 {
    let base = match rate {
        Some(r) => (r * fetch.as_secs_f64() * MARGIN).ceil() as u32,
        None => places,
    };
    base.saturating_add(lookahead).clamp(1, MAX_DEPTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_covers_margin_fetch_times_of_reads_plus_the_lookahead() {
        let ms = Duration::from_millis;
        assert_eq!(target_depth(Some(1000.0), ms(45), 32, 64), 135 + 32);
        assert_eq!(target_depth(Some(500.0), ms(10), 32, 64), 15 + 32);
        assert_eq!(target_depth(None, ms(45), 32, 64), 64 + 32);
        assert_eq!(target_depth(Some(1e9), ms(1000), 32, 64), MAX_DEPTH);
        assert_eq!(target_depth(Some(0.0), ms(45), 0, 0), 1);
    }
}
