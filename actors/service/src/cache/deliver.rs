//! Deliveries: a Sampler's `Deliver` queues each delivery in its rank's ring, in sampled order,
//! after it takes a reference on its key wherever the key is (cached: a hit; loading or about
//! to load for another job: a hit too; failed; or a miss, now pending), and the ends of epochs
//! after them. Dropping a queued delivery gives its reference back.

use std::sync::atomic::Ordering::Relaxed;

use roaring::RoaringBitmap;

use super::{CacheActor, Pending, RingRecord};
use crate::messages::{CacheKey, DatasetId, Deliver, ElementSource, EndAt, JobId, PipelineId};

impl CacheActor {
    /// Queues a Sampler's deliveries and ends of epochs in their rings, then loads and pushes
    /// what it can.
    pub(super) fn deliver(&mut self, msg: Deliver) {
        // A dataset whose last job closed meanwhile: nothing is left to deliver to.
        if !self.sources.contains_key(&msg.dataset) {
            return;
        }
        let source = self.sources.get(&msg.dataset).cloned();
        for g in &msg.grown {
            if let Some(job) = self.jobs.get_mut(&g.job) {
                job.subsets.grow(g.from_epoch, g.subset.clone());
            }
        }
        let mut ends = msg.ends.iter().peekable();
        for (gi, group) in msg.groups.iter().enumerate() {
            while let Some(end) = ends.next_if(|e| e.after <= gi) {
                self.queue_end(end);
            }
            for item in &group.items {
                let Some(job) = self.jobs.get_mut(&item.job) else {
                    continue;
                };
                let resumed = job.resume.take();
                let (pipeline, stats, subset) = (
                    job.pipeline,
                    job.stats.clone(),
                    job.subsets.at(item.epoch).clone(),
                );
                let rank = (item.position % job.rings.len() as u32) as usize;
                if let Some(remaining) = resumed {
                    // A resumed epoch starts: only what remains of it is needed once more.
                    self.epoch_started(msg.dataset, pipeline, &remaining);
                    if let Some(d) = source.as_ref().and_then(|s| s.demand()) {
                        d.epoch_started(item.job, &remaining);
                    }
                } else if item.position == 0 {
                    self.epoch_started(msg.dataset, pipeline, &subset);
                    if let Some(d) = source.as_ref().and_then(|s| s.demand()) {
                        d.epoch_started(item.job, &subset);
                    }
                }
                if let Some(d) = source.as_ref().and_then(|s| s.demand()) {
                    d.delivered(item.job, group.element);
                }
                let key = CacheKey::new(msg.dataset, pipeline, group.element);
                self.stats.requests.fetch_add(1, Relaxed);
                let hit = self.want(key, group.need);
                let counter = if hit {
                    (&self.stats.hits, &stats.hits)
                } else {
                    self.charged
                        .entry(key)
                        .or_insert_with(|| (stats.clone(), u64::from(item.epoch)));
                    (&self.stats.misses, &stats.misses)
                };
                counter.0.fetch_add(1, Relaxed);
                counter.1.fetch_add(1, Relaxed);
                if let Some(job) = self.jobs.get_mut(&item.job) {
                    job.rings[rank].queue.push_back(RingRecord::Item {
                        key,
                        element: group.element,
                        epoch: item.epoch,
                        position: item.position,
                    });
                }
            }
        }
        for end in ends {
            self.queue_end(end);
        }
        if let Some(s) = &source {
            self.fetch_ahead(s.as_ref(), msg.dataset, &msg.ahead);
        }
        self.issue_loads();
        self.pump();
    }

    /// Asks the source for the bytes of the picks the Sampler holds back (see
    /// `sampler::ahead`) whose key is neither cached, loading nor pending: an element picked
    /// for one job and then for another, or again in a later epoch, while it is cached, is
    /// not fetched again.
    fn fetch_ahead(&self, source: &dyn ElementSource, dataset: DatasetId, ahead: &[(u32, JobId)]) {
        // A source that does not fetch ahead (a cluster node started without a buffer, sent
        // a leader's picks for the other nodes' sake) is asked for nothing.
        let Some(stage) = source.fetching().filter(|s| s.fetch_time().is_some()) else {
            return;
        };
        for &(element, job) in ahead {
            let Some(j) = self.jobs.get(&job) else {
                continue;
            };
            let key = CacheKey::new(dataset, j.pipeline, element);
            if !(self.slots.contains_key(&key)
                || self.loading.contains_key(&key)
                || self.pending.contains_key(&key))
            {
                stage.fetch_ahead(element);
            }
        }
    }

    /// A queued delivery of `key` takes a reference on it wherever it is; returns whether it
    /// is served without a read of its own (cached, loading or about to load for another).
    fn want(&mut self, key: CacheKey, need: u32) -> bool {
        if let Some(e) = self.slots.get_mut(&key) {
            e.queued += 1;
            if e.uses() == 1 {
                self.policy.pin(key.raw());
            }
            self.policy.hit(key.raw());
            self.policy.set_refcount(key.raw(), need);
            self.debug_assert_slot(key);
            true
        } else if let Some(l) = self.loading.get_mut(&key) {
            l.refs += 1;
            l.need = need;
            true
        } else if let Some(p) = self.pending.get_mut(&key) {
            p.refs += 1;
            p.need = need;
            true
        } else if let Some(f) = self.failed.get_mut(&key) {
            f.1 += 1;
            false
        } else {
            self.pending.insert(
                key,
                Pending {
                    refs: 1,
                    need,
                    reload: false,
                },
            );
            self.pending_order.push_back(key);
            false
        }
    }

    /// Drops the reference a queued (never pushed) entry held.
    pub(super) fn unref(&mut self, key: CacheKey) {
        if let Some(e) = self.slots.get_mut(&key) {
            debug_assert!(e.queued > 0, "key {key:#x}: unreferenced, not queued");
            e.queued = e.queued.saturating_sub(1);
            if e.uses() == 0 {
                self.policy.unpin(key.raw());
                self.room_changed = true;
            }
            self.debug_assert_slot(key);
        } else if let Some(l) = self.loading.get_mut(&key) {
            debug_assert!(l.refs > 0, "key {key:#x}: unreferenced, not referenced");
            l.refs = l.refs.saturating_sub(1);
        } else if let Some(p) = self.pending.get_mut(&key) {
            p.refs = p.refs.saturating_sub(1);
            if p.refs == 0 {
                self.pending.remove(&key);
            }
        } else if let Some(f) = self.failed.get_mut(&key) {
            f.1 = f.1.saturating_sub(1);
            if f.1 == 0 {
                self.failed.remove(&key);
            }
        } else {
            debug_assert!(false, "key {key:#x}: a queued delivery held no reference");
        }
    }

    /// A job's epoch starts: every cached element of its subset is needed once more.
    fn epoch_started(&mut self, dataset: DatasetId, pipeline: PipelineId, subset: &RoaringBitmap) {
        for &key in self.slots.keys() {
            let (ds, pl, el) = key.parts();
            if ds == dataset && pl == pipeline && subset.contains(el) {
                let r = self.policy.refcount(key.raw()).unwrap_or(0);
                self.policy.set_refcount(key.raw(), r + 1);
            }
        }
    }

    fn queue_end(&mut self, end: &EndAt) {
        if let Some(j) = self.jobs.get_mut(&end.job) {
            for rr in &mut j.rings {
                rr.queue
                    .push_back(RingRecord::EndOfEpoch { epoch: end.epoch });
                if end.finished {
                    rr.queue.push_back(RingRecord::EndOfStream);
                }
            }
        }
    }
}
