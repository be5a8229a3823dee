//! What goes into the rings: each ring receives its job's queue in order, one unit at a time
//! (a whole batch, or what is left of an epoch before its end), once every element of the
//! unit is cached (or failed, and goes as an error record).

use std::sync::atomic::Ordering::Relaxed;

use super::{CacheActor, Entry, JobId, RankRing};
use crate::service::stats::JobState;

impl CacheActor {
    /// The entry can be pushed now.
    pub(super) fn is_ready(&self, entry: &Entry) -> bool {
        match entry {
            Entry::Item { key, .. } => {
                self.slots.contains_key(key) || self.failed.contains_key(key)
            }
            Entry::EndOfEpoch { .. } | Entry::EndOfStream => true,
        }
    }

    /// Extends the ring's ready prefix up to one unit; returns whether the unit is complete.
    fn ready_unit(&self, rr: &mut RankRing, batch: usize) -> bool {
        while rr.ready < rr.queue.len() && rr.ready_items < batch {
            let entry = rr.queue[rr.ready];
            if !self.is_ready(&entry) {
                break;
            }
            rr.ready += 1;
            match entry {
                Entry::Item { .. } => rr.ready_items += 1,
                Entry::EndOfEpoch { .. } | Entry::EndOfStream => break,
            }
        }
        rr.ready_items == batch
            || (rr.ready > 0
                && matches!(
                    rr.queue[rr.ready - 1],
                    Entry::EndOfEpoch { .. } | Entry::EndOfStream
                ))
    }

    /// Pushes every complete unit each ring has room for, in order, keeping at most one batch
    /// ahead of its client (pushed, not taken), and none while memory is short (payloads wait
    /// for room) until the client has taken what was pushed. What a stopped reader pins is
    /// then the batch it holds plus at most one, never its whole ring; the rest of what it
    /// was sampled stays evictable for the readers that read.
    pub(super) fn pump(&mut self) {
        let short = !self.waiting.is_empty();
        let mut broken: Vec<(JobId, String)> = Vec::new();
        let job_ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in job_ids {
            let Some(mut job) = self.jobs.remove(&id) else {
                continue;
            };
            let batch = job.batch as usize;
            'rings: for rr in &mut job.rings {
                while self.ready_unit(rr, batch)
                    && rr.ring.free_credit() as usize >= rr.ready
                    && (untaken(rr) == 0 || (!short && untaken(rr) < batch as u64))
                {
                    for _ in 0..rr.ready {
                        let Some(front) = rr.queue.pop_front() else {
                            break;
                        };
                        if let Err(e) = self.push(rr, front, &job.stats) {
                            // Nothing else writes the ring and the unit fit: the ring is broken.
                            broken.push((id, format!("delivery failed: {e}")));
                            break 'rings;
                        }
                    }
                    rr.ready = 0;
                    rr.ready_items = 0;
                }
                debug_assert!(
                    rr.ready <= rr.queue.len() && rr.ready_items <= rr.ready.min(batch),
                    "job {id}: a ready prefix of {} ({} items) in a queue of {}",
                    rr.ready,
                    rr.ready_items,
                    rr.queue.len()
                );
            }
            self.jobs.insert(id, job);
        }
        for (id, reason) in broken {
            self.close_job(id, Some(reason));
        }
        self.update_gauges();
    }

    /// Pushes one ready entry into its ring.
    fn push(
        &mut self,
        rr: &mut RankRing,
        entry: Entry,
        stats: &crate::service::stats::JobStats,
    ) -> Result<(), dataplane::Error> {
        match entry {
            Entry::Item {
                key,
                element,
                epoch,
                position,
            } => {
                if let Some(e) = self.slots.get_mut(&key) {
                    rr.ring
                        .push_data(e.slot, u64::from(epoch), u64::from(position))?;
                    e.queued = e.queued.saturating_sub(1);
                    e.pushed += 1;
                    stats.delivered.fetch_add(1, Relaxed);
                    rr.shadow.push_back(true);
                    rr.epoch_count += 1;
                    // A pushed slot stays pinned until its record is acknowledged.
                    self.debug_assert_slot(key);
                } else if let Some(&(code, _)) = self.failed.get(&key) {
                    rr.ring
                        .push_error(element, code, u64::from(epoch), u64::from(position))?;
                    stats.delivered.fetch_add(1, Relaxed);
                    stats.errors.fetch_add(1, Relaxed);
                    rr.shadow.push_back(true);
                    rr.epoch_count += 1;
                    self.unref(key);
                } else {
                    debug_assert!(false, "key {key:#x} pushed neither cached nor failed");
                }
            }
            Entry::EndOfEpoch { epoch } => {
                rr.ring
                    .push_end_of_epoch(u64::from(epoch), rr.epoch_count)?;
                rr.shadow.push_back(false);
                rr.epoch_count = 0;
            }
            Entry::EndOfStream => {
                // Finished before the client can see the end: a client that reads it and then
                // asks the API about its job finds it finished, not still running.
                let before = stats.state();
                stats.set_state(JobState::Finished);
                if let Err(e) = rr.ring.push_end_of_stream() {
                    stats.replace_state(before);
                    return Err(e);
                }
                rr.shadow.push_back(false);
            }
        }
        Ok(())
    }
}

/// Records pushed into the ring that its client has not taken yet.
fn untaken(rr: &RankRing) -> u64 {
    let pushed = rr.ring.pushed();
    pushed - rr.ring.consumer_position().min(pushed)
}
