//! A lost leader as a pause: the node keeps its multi-node jobs (rings open, ranks waiting)
//! for `leader_grace`, registers again, and reports to a leader of a newer generation what it
//! received of each job's last epochs ([`Progress`]); the leader resumes them
//! (`leader::journal`). A leader of an older generation than one the node has seen is refused
//! (a stale leader); a grace period that ends fails the jobs, saying why.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use actix::prelude::*;
use roaring::RoaringBitmap;

use super::NodeAgent;
use super::call::post;
use crate::cluster::{EpochSeen, JobSeen, NodeRegistered, ResumeReply, ResumeReport};

/// Epochs of a job a node keeps what it received of (enough for a leader that restarts while
/// the nodes are an epoch apart).
const EPOCHS_KEPT: usize = 3;
/// Finished jobs a node keeps reporting after a restart of the leader (their last end may not
/// have reached every node).
const FINISHED_KEPT: usize = 16;

/// What a node received of a multi-node job, for its report to a restarted leader.
#[derive(Debug, Default)]
pub(super) struct Progress {
    epochs: VecDeque<Seen>,
    /// Credit the node's Cache returned for the job.
    granted: u64,
    /// Records placed on the node.
    received: u64,
}

#[derive(Debug)]
struct Seen {
    epoch: u32,
    count: u32,
    elements: RoaringBitmap,
    ended: bool,
}

impl Progress {
    fn epoch_mut(&mut self, epoch: u32) -> &mut Seen {
        let at = match self.epochs.iter().position(|s| s.epoch == epoch) {
            Some(i) => i,
            None => {
                self.epochs.push_back(Seen {
                    epoch,
                    count: 0,
                    elements: RoaringBitmap::new(),
                    ended: false,
                });
                self.epochs
                    .make_contiguous()
                    .sort_unstable_by_key(|s| s.epoch);
                while self.epochs.len() > EPOCHS_KEPT {
                    self.epochs.pop_front();
                }
                self.epochs
                    .iter()
                    .position(|s| s.epoch == epoch)
                    .unwrap_or(self.epochs.len() - 1)
            }
        };
        &mut self.epochs[at]
    }

    /// A record placed on the node: `element` at `position` of its share of `epoch`.
    pub(super) fn placed(&mut self, epoch: u32, element: u32, position: u32) {
        self.received += 1;
        let s = self.epoch_mut(epoch);
        s.count = s.count.max(position.saturating_add(1));
        s.elements.insert(element);
    }

    /// The end of `epoch` reached the node.
    pub(super) fn ended(&mut self, epoch: u32) {
        self.epoch_mut(epoch).ended = true;
    }

    pub(super) fn granted(&mut self, n: u32) {
        self.granted += u64::from(n);
    }

    pub(super) fn report(&self, job: u64, finished: bool) -> JobSeen {
        JobSeen {
            job,
            epochs: self
                .epochs
                .iter()
                .map(|s| EpochSeen {
                    epoch: s.epoch,
                    count: s.count,
                    elements: crate::cluster::encode_ids(&s.elements),
                    ended: s.ended,
                })
                .collect(),
            room: self.granted.saturating_sub(self.received),
            granted: self.granted,
            attached: self.granted > 0,
            finished,
        }
    }
}

/// Why the node's multi-node jobs are paused, and since when.
pub(super) struct Paused {
    since: Instant,
    why: String,
}

impl NodeAgent {
    /// The leader is lost (`why`): the node's multi-node jobs pause for the grace period (or
    /// fail at once without one), and the node registers again.
    pub(super) fn leader_lost(&mut self, why: &str, ctx: &mut Context<Self>) {
        // Frames held back while a rank joins were never applied: they are not in the report,
        // and a restarted leader places their records again.
        self.held.clear();
        if !self.jobs.is_empty() {
            if self.grace.is_zero() {
                self.fail_all(why);
            } else if self.paused.is_none() {
                tracing::warn!(why, grace = ?self.grace, jobs = self.jobs.len(),
                    "lost the leader: multi-node jobs paused until it comes back");
                self.paused = Some(Paused {
                    since: Instant::now(),
                    why: why.to_string(),
                });
            }
        }
        self.unregistered();
        self.retry_soon(ctx);
    }

    /// While jobs are paused, a failed registration is tried again after a fifth of a
    /// heartbeat (at least 50 ms) rather than a heartbeat: the ranks' pause is the leader's
    /// restart plus this.
    pub(super) fn retry_soon(&mut self, ctx: &mut Context<Self>) {
        if self.paused.is_none() || self.retrying {
            return;
        }
        self.retrying = true;
        let after = (self.heartbeat / 5).max(Duration::from_millis(50));
        ctx.run_later(after, |act, ctx| {
            act.retrying = false;
            if !act.registered {
                act.tick(ctx);
            }
        });
    }

    /// Fails the paused jobs once the grace period is over.
    pub(super) fn check_grace(&mut self) {
        let Some(p) = &self.paused else {
            return;
        };
        if p.since.elapsed() <= self.grace {
            return;
        }
        let mut reason = format!(
            "the leader {} did not come back within the grace period ({:?}): {}",
            self.leader, self.grace, p.why
        );
        if let Some(stale) = &self.stale {
            reason = format!("{reason}; {stale}");
        }
        self.paused = None;
        // The leader hears of it on the next stream (it may be waiting for this node's report).
        self.failures
            .extend(self.jobs.keys().map(|&job| crate::cluster::JobFailure {
                job,
                reason: reason.clone(),
            }));
        self.fail_all(&reason);
    }

    /// The leader answered a registration: refused if its generation is older than one seen
    /// (`false`), else the node is registered and its paused jobs are reported to it.
    pub(super) fn registered_with(
        &mut self,
        reg: &NodeRegistered,
        ctx: &mut Context<Self>,
    ) -> bool {
        if reg.generation < self.generation {
            let stale = format!(
                "the leader at {} answers as generation {}, older than generation {} this node \
                 has seen: a stale leader is refused",
                self.leader, reg.generation, self.generation
            );
            tracing::error!("{stale}");
            self.stale = Some(stale);
            return false;
        }
        self.stale = None;
        self.generation = reg.generation;
        self.registered = true;
        self.last_contact = Instant::now();
        if self.paused.is_none() {
            // Registered again without having lost the leader: the leader lost this node, and
            // its jobs with it.
            self.fail_all("the node registered again with the leader");
        }
        // Every registration is followed by a report, empty or not: a restarted leader
        // learns at once which of its journaled jobs this node no longer has.
        self.report_due = true;
        self.resume(ctx);
        self.connect(ctx);
        true
    }

    /// Reports the paused jobs to the leader after a registration (again at each heartbeat
    /// until it answers).
    pub(super) fn resume(&mut self, ctx: &mut Context<Self>) {
        if !self.report_due || self.resuming || !self.registered {
            return;
        }
        let mut jobs: Vec<JobSeen> = self
            .jobs
            .iter()
            .map(|(id, t)| t.progress.report(*id, false))
            .collect();
        jobs.extend(self.finished.iter().map(|(id, p)| p.report(*id, true)));
        // The credit returned so far is in each job's room.
        for j in &jobs {
            self.credits.remove(&j.job);
        }
        let report = ResumeReport {
            generation: self.generation,
            jobs,
        };
        self.resuming = true;
        let (client, token) = (self.client.clone(), self.token.clone());
        let url = self.url(&format!("/v1/nodes/{}/resume", self.name));
        let timeout = self.timeout.max(Duration::from_secs(10));
        let fut = async move {
            post::<ResumeReply>(&client, url, token.as_deref(), timeout, &report).await
        };
        ctx.spawn(fut.into_actor(self).map(|res, act, ctx| {
            act.resuming = false;
            match res {
                Ok(reply) => {
                    act.report_due = false;
                    for f in reply.failed {
                        act.fail_local(
                            f.job,
                            &format!("the leader cannot resume it: {}", f.reason),
                        );
                    }
                    if let Some(p) = act.paused.take() {
                        tracing::info!(paused = ?p.since.elapsed(), jobs = act.jobs.len(),
                            "multi-node jobs resumed with the leader");
                    }
                    act.connect(ctx);
                    act.send_credits();
                }
                Err(e) => {
                    tracing::info!(error = %e.message, "the leader cannot take the report yet");
                    if e.status == Some(404) || e.code.as_deref() == Some("stale_generation") {
                        act.unregistered();
                    }
                }
            }
        }));
    }

    /// A job whose last end reached the node: kept a while for a restarted leader.
    pub(super) fn keep_finished(&mut self, job: u64, progress: Progress) {
        self.finished.push_back((job, progress));
        while self.finished.len() > FINISHED_KEPT {
            self.finished.pop_front();
        }
    }
}
