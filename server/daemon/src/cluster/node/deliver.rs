//! The leader's placements (and its picks to fetch ahead) handed to the node's Cache, one
//! `Deliver` per local dataset, as a local Sampler would; the credit the Cache returns, and the jobs that fail here, handed
//! back to the stream.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use ::actors::{DatasetId, Deliver, DeliverGroup, DeliverItem, EndAt, JobId, JobSignal, RemoveJob};
use actix::prelude::*;

use super::{NodeAgent, Tracked};
use crate::cluster::{Credit, CreditReport, JobFailure, Placements, WireEnd};

impl NodeAgent {
    /// Hands received placements to the Cache, one `Deliver` per local dataset, in order.
    /// A job whose end (`finished`) is handed over is no longer tracked: the leader forgets it,
    /// and its ranks may read their last records long after. Failures come last, so that a
    /// job that finished in this reply is not failed by the leader's not knowing it any more.
    pub(super) fn apply(&mut self, reply: Placements) {
        self.deliver(&reply);
        for e in reply.ends.iter().filter(|e| e.finished) {
            if let Some(t) = self.jobs.remove(&e.job) {
                self.by_local.remove(&t.local);
                self.credits.remove(&e.job);
                self.keep_finished(e.job, t.progress);
            }
        }
        for f in &reply.failed {
            self.fail_local(f.job, &f.reason);
        }
    }

    fn deliver(&mut self, reply: &Placements) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let mut out: HashMap<DatasetId, Deliver> = HashMap::new();
        let mut ends = reply.ends.iter().peekable();
        let end_to = |out: &mut HashMap<DatasetId, Deliver>,
                      jobs: &mut HashMap<u64, Tracked>,
                      e: &WireEnd| {
            if let Some(t) = jobs.get_mut(&e.job) {
                t.progress.ended(e.epoch);
                let d = out.entry(t.dataset).or_insert_with(|| empty(t.dataset));
                d.ends.push(EndAt {
                    after: d.groups.len(),
                    job: t.local,
                    epoch: e.epoch,
                    finished: e.finished,
                });
            }
        };
        for (gi, g) in reply.groups.iter().enumerate() {
            while let Some(e) = ends.next_if(|e| e.after <= gi) {
                end_to(&mut out, &mut self.jobs, e);
            }
            let mut per: HashMap<DatasetId, DeliverGroup> = HashMap::new();
            for it in &g.items {
                let Some(t) = self.jobs.get_mut(&it.job) else {
                    continue;
                };
                t.progress.placed(it.epoch, g.element, it.position);
                t.stats.sampled.fetch_add(1, Relaxed);
                t.stats.epoch.store(u64::from(it.epoch), Relaxed);
                t.stats.position.store(u64::from(it.position), Relaxed);
                per.entry(t.dataset)
                    .or_insert_with(|| DeliverGroup {
                        element: g.element,
                        need: g.need,
                        items: Vec::new(),
                    })
                    .items
                    .push(DeliverItem {
                        job: t.local,
                        epoch: it.epoch,
                        position: it.position,
                    });
            }
            for (ds, grp) in per {
                out.entry(ds).or_insert_with(|| empty(ds)).groups.push(grp);
            }
        }
        for e in ends {
            end_to(&mut out, &mut self.jobs, e);
        }
        // Picks to fetch ahead, for the Cache to ask its source for (as a local Sampler's).
        for a in &reply.ahead {
            if let Some(t) = self.jobs.get(&a.job) {
                let d = out.entry(t.dataset).or_insert_with(|| empty(t.dataset));
                d.ahead.push((a.element, t.local));
            }
        }
        for (_, d) in out {
            registry.cache().do_send(d);
        }
    }

    /// Hands the credit and failures gathered so far to the stream (credit of jobs not
    /// tracked yet, under placeholder keys, waits for `Joined`; without a stream, all waits
    /// for the next one).
    pub(super) fn send_credits(&mut self) {
        let Some(link) = &self.link else {
            return;
        };
        // Until the leader has the report that follows a registration: the credit returned
        // meanwhile is in the report's room, or in the next one's if this one is sent again.
        if self.report_due {
            return;
        }
        let ready: Vec<u64> = self
            .credits
            .keys()
            .copied()
            .filter(|k| self.jobs.contains_key(k))
            .collect();
        if ready.is_empty() && self.failures.is_empty() {
            return;
        }
        let report = CreditReport {
            credits: ready
                .into_iter()
                .filter_map(|job| self.credits.remove(&job).map(|n| Credit { job, n }))
                .collect(),
            failed: std::mem::take(&mut self.failures),
        };
        // A closed channel means the task ended: its `LinkEnded` fails the jobs this credit
        // was for.
        let _ = link.reports.send(report);
    }

    /// A local job left (its client died or it was deleted): the leader fails it everywhere.
    fn local_gone(&mut self, local: JobId, reason: &str, ctx: &mut Context<Self>) {
        if let Some(cluster) = self.by_local.remove(&local) {
            self.jobs.remove(&cluster);
            self.credits.remove(&cluster);
            self.failures.push(JobFailure {
                job: cluster,
                reason: reason.to_string(),
            });
            self.connect(ctx);
            self.send_credits();
        }
    }
}

fn empty(dataset: DatasetId) -> Deliver {
    Deliver {
        dataset,
        groups: Vec::new(),
        ends: Vec::new(),
        ahead: Vec::new(),
        grown: Vec::new(),
    }
}

impl Handler<JobSignal> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: JobSignal, ctx: &mut Context<Self>) {
        match msg {
            JobSignal::Credit { job, n } => {
                // The Cache may grant credit before the registry tracks the job (its clients
                // attached at once): kept under a placeholder key until `Track`.
                let key = self.by_local.get(&job).copied().unwrap_or(u64::MAX - job);
                *self.credits.entry(key).or_default() += n;
                if let Some(t) = self.jobs.get_mut(&key) {
                    t.progress.granted(n);
                }
                if self.by_local.contains_key(&job) {
                    self.send_credits();
                }
            }
            JobSignal::Gone { job } => self.local_gone(job, "a rank's client left or died", ctx),
        }
    }
}

impl Handler<RemoveJob> for NodeAgent {
    type Result = ();
    fn handle(&mut self, msg: RemoveJob, ctx: &mut Context<Self>) {
        self.local_gone(msg.job, "the job was deleted on a node", ctx);
    }
}
