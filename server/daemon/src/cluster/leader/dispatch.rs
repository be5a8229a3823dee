//! Placement: the [`Dispatch`] actor receives the cluster Samplers' passes and places each
//! delivery on a node (`joader_core::cluster`) into that node's outbox, padding a node's
//! share at the end of an epoch, and sends the picks to fetch ahead to the nodes that will
//! most likely receive them; it also runs the watch of the nodes' heartbeats.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ::actors::Deliver;
use actix::prelude::*;

use super::{Inner, Leader};
use crate::cluster::{WireAhead, WireEnd, WireGroup, WireItem};

impl Leader {
    /// Starts the dispatcher (and its watch of the nodes' heartbeats) on the cluster
    /// Samplers' arbiter: a pass's `Deliver` reaches it without waking another thread.
    pub fn start(self: &Arc<Self>, samplers: actix::ArbiterHandle) {
        if let Ok(mut a) = self.arbiter.lock() {
            *a = Some(samplers.clone());
        }
        let leader = self.clone();
        let addr = Dispatch::start_in_arbiter(&samplers, move |_| Dispatch { leader });
        if let Ok(mut d) = self.dispatch.lock() {
            *d = Some(addr);
        }
    }

    /// Places the deliveries of one pass of a cluster Sampler.
    pub(super) fn place(&self, msg: Deliver) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let all = inner.live_keys();
        let mut credit_back: Vec<u64> = Vec::new();
        let mut ends = msg.ends.iter().peekable();
        for (gi, group) in msg.groups.iter().enumerate() {
            while let Some(end) = ends.next_if(|e| e.after <= gi) {
                end_epoch(&mut inner, end);
            }
            let mut per_node: BTreeMap<String, WireGroup> = BTreeMap::new();
            // Records a node received before the leader restarted are not placed again
            // (`journal`): their credit goes back, and they need the element no more.
            let mut skipped = 0u32;
            for item in &group.items {
                let Some(job) = inner.jobs.get_mut(&item.job).filter(|j| j.live()) else {
                    continue;
                };
                if job
                    .restored
                    .get(&item.epoch)
                    .is_some_and(|r| r.skip.contains(group.element))
                {
                    credit_back.push(item.job);
                    skipped += 1;
                    continue;
                }
                let Some((placer, names)) = job.placer.as_mut() else {
                    continue;
                };
                match placer.assign(&all, group.element) {
                    Some(p) => per_node
                        .entry(names[p.node].clone())
                        .or_insert_with(|| WireGroup {
                            element: group.element,
                            need: group.need,
                            items: Vec::new(),
                        })
                        .items
                        .push(WireItem {
                            job: item.job,
                            epoch: item.epoch,
                            position: p.position,
                        }),
                    // drop_last's tail: never delivered, its credit goes back.
                    None => credit_back.push(item.job),
                }
            }
            for (node, mut g) in per_node {
                g.need = g.need.saturating_sub(skipped);
                if let Some(n) = inner.nodes.get_mut(&node) {
                    n.outbox.groups.push(g);
                }
            }
        }
        for end in ends {
            end_epoch(&mut inner, end);
        }
        ahead(&mut inner, &all, &msg.ahead);
        for id in credit_back {
            inner.give_credit(id, 1);
        }
        for n in inner.nodes.values() {
            n.notify.notify_one();
        }
    }
}

/// The picks of an object-store dataset's jobs that the Sampler holds back (`sampler::ahead`):
/// each goes to the node its job's placer would place it on now ([`EpochPlacer::guess`],
/// which places nothing), whose Cache asks its source to fetch the bytes meanwhile. The
/// guess is the placement itself but near an epoch's end, where a node's quota may fill
/// first: the element is then fetched on one node and read on another (one GET more).
///
/// [`EpochPlacer::guess`]: joader_core::cluster::EpochPlacer::guess
fn ahead(inner: &mut Inner, all: &[u64], picks: &[(u32, ::actors::JobId)]) {
    for &(element, id) in picks {
        let Some(job) = inner.jobs.get(&id).filter(|j| j.live()) else {
            continue;
        };
        let Some((placer, names)) = job.placer.as_ref() else {
            continue;
        };
        let Some(node) = placer.guess(all, element).map(|i| names[i].clone()) else {
            continue;
        };
        if let Some(n) = inner.nodes.get_mut(&node) {
            n.outbox.ahead.push(WireAhead { element, job: id });
        }
    }
}

/// A job's epoch ended: pad its nodes to their quota, then end the epoch on each (but on the
/// nodes that had its end before the leader restarted, `journal`); the next epoch's placement
/// goes on where such nodes had it.
pub(super) fn end_epoch(inner: &mut Inner, end: &::actors::EndAt) {
    let Some(job) = inner.jobs.get_mut(&end.job).filter(|j| j.live()) else {
        return;
    };
    let Some((placer, names)) = job.placer.as_mut() else {
        return;
    };
    let pad = placer.end_epoch();
    if let Some(next) = job.restored.get(&(end.epoch + 1)) {
        placer.restore(&next.filled, &next.first);
    }
    let had_end = job
        .restored
        .get(&end.epoch)
        .map(|r| r.ended.clone())
        .unwrap_or_default();
    job.restored.retain(|&e, _| e > end.epoch);
    let pad: Vec<_> = pad
        .into_iter()
        .filter(|p| !had_end.contains(&names[p.node]))
        .collect();
    job.debt += pad.len() as u64;
    let names = names.clone();
    if end.finished {
        job.finished = true;
        job.ended_at = Some(std::time::Instant::now());
        let name = job.name.clone();
        inner.names.remove(&name);
        inner.journal(end.job);
    }
    for p in pad {
        if let Some(n) = inner.nodes.get_mut(&names[p.node]) {
            n.outbox.groups.push(WireGroup {
                element: p.element,
                need: 0,
                items: vec![WireItem {
                    job: end.job,
                    epoch: end.epoch,
                    position: p.position,
                }],
            });
        }
    }
    for name in names.iter().filter(|n| !had_end.contains(*n)) {
        if let Some(n) = inner.nodes.get_mut(name) {
            n.outbox.ends.push(WireEnd {
                after: n.outbox.groups.len(),
                job: end.job,
                epoch: end.epoch,
                finished: end.finished,
            });
        }
    }
}

/// Receives the cluster Samplers' passes and places them; watches the heartbeats.
pub struct Dispatch {
    leader: Arc<Leader>,
}

impl Actor for Dispatch {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every = (self.leader.heartbeat / 2).max(Duration::from_millis(50));
        ctx.run_interval(every, |act, _| act.leader.watch());
    }
}

impl Handler<Deliver> for Dispatch {
    type Result = ();
    fn handle(&mut self, msg: Deliver, _: &mut Context<Self>) {
        self.leader.place(msg);
    }
}
