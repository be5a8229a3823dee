//! A job's rings: opening them for a new job (one ring per rank, nothing reserved), closing
//! them (what the job held is released and its dataset's source forgotten with its last job),
//! and the cache's shutdown.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::{CacheActor, CacheJob, RankRing, RingRecord};
use crate::messages::{JobId, JobSignal, OpenJob, OpenJobError, RingInfo};
use crate::stats::JobState;

impl CacheActor {
    /// Opens one ring per rank for a new job. Its credit waits for every rank's client to
    /// attach (see `acks.rs`).
    pub(super) fn open_job(&mut self, msg: OpenJob) -> Result<Vec<RingInfo>, OpenJobError> {
        let Some(writer) = &self.writer else {
            return Err(OpenJobError::ShutDown);
        };
        if self.jobs.contains_key(&msg.job) {
            return Err(OpenJobError::AlreadyOpen(msg.job));
        }
        if msg.ranks == 0 || msg.capacity == 0 || msg.batch == 0 || msg.batch > msg.capacity {
            return Err(OpenJobError::Empty);
        }
        // No reservation against the other jobs: a job costs cache memory only while its
        // client reads (credit is granted on attach), so a sweep of many jobs is admitted.
        let mut rings = Vec::new();
        let mut infos = Vec::new();
        for rank in 0..msg.ranks {
            let name = format!("{}-r{rank}", msg.ring_prefix);
            match writer.create_ring(&name, msg.capacity) {
                Ok(ring) => {
                    infos.push(RingInfo {
                        rank,
                        ring: name,
                        segment: ring.segment_name().to_string(),
                        reader_index: ring.reader_index(),
                        capacity: ring.capacity(),
                    });
                    rings.push(RankRing {
                        ring,
                        queue: VecDeque::new(),
                        ready: 0,
                        ready_items: 0,
                        shadow: VecDeque::new(),
                        pinned: 0,
                        waited: false,
                        acked: 0,
                        epoch_count: 0,
                        alive: false,
                        probed: false,
                    });
                }
                Err(e) => {
                    return Err(OpenJobError::Ring {
                        ring: name,
                        message: e.to_string(),
                    });
                }
            }
        }
        // The sampler's credit is what the rings hold in total.
        let credit = rings.iter().map(|r| r.ring.capacity()).sum();
        self.sources.insert(msg.dataset, msg.source);
        let now = Instant::now();
        self.jobs.insert(
            msg.job,
            CacheJob {
                dataset: msg.dataset,
                pipeline: msg.pipeline,
                prepare: msg.prepare,
                subsets: super::Subsets::new(msg.subset),
                rings,
                batch: msg.batch,
                credit,
                granted: false,
                opened: now,
                rate: None,
                rate_mark: (now, 0),
                stats: msg.stats,
                sampler: msg.sampler,
                resume: msg.resume,
                own_positions: msg.own_positions,
            },
        );
        self.update_gauges();
        Ok(infos)
    }

    /// Drops a job's rings and everything it held; tells its sampler when it failed.
    pub(super) fn close_job(&mut self, id: JobId, failure: Option<String>) {
        let Some(mut job) = self.jobs.remove(&id) else {
            return;
        };
        for rr in &mut job.rings {
            for r in rr.ring.reclaim_reader() {
                self.release(r);
            }
        }
        for rr in job.rings.drain(..) {
            for entry in rr.queue {
                if let RingRecord::Item { key, .. } = entry {
                    self.unref(key);
                }
            }
            drop(rr.ring);
        }
        self.room_changed = true;
        self.unblock_preloads();
        job.stats.closed.store(true, Relaxed);
        self.charged
            .retain(|_, (stats, _)| !std::sync::Arc::ptr_eq(stats, &job.stats));
        if let Some(d) = self.sources.get(&job.dataset).and_then(|s| s.demand()) {
            d.job_closed(id);
        }
        // The last job of a dataset forgets its source (the dataset may be deleted: its index
        // must not live on here). Loads in flight hold their own reference.
        if !self.jobs.values().any(|j| j.dataset == job.dataset) {
            self.sources.remove(&job.dataset);
        }
        if let Some(reason) = failure {
            tracing::warn!(job = id, reason = %reason, "job stopped");
            job.stats.set_state(JobState::Failed(reason));
            job.sampler.do_send(JobSignal::Gone { job: id });
        }
        self.update_gauges();
    }

    /// Closes every job and forgets every slot (the data segment goes with the writer).
    pub(super) fn shutdown(&mut self) {
        // The data segment is marked shut down first, so that a client whose ring is closed
        // next learns why (`server_gone`: "server shut down"), not merely `ring_closed`.
        self.writer.take();
        self.stop_preloads();
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.close_job(id, None);
        }
        self.slots.clear();
        self.by_slot.clear();
        self.waiting.clear();
        self.pending.clear();
        self.pending_order.clear();
    }
}
