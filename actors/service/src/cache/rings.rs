//! What goes into the rings: each ring receives its job's queue in order, one unit at a time
//! (a whole batch, or what is left of an epoch before its end), once every element of the
//! unit is cached (or failed, and goes as an error record). And which units wait for room
//! that other jobs hold (`JobStats::waited_for_others`): what "a slow job never holds a fast
//! one back" means, counted.

use crate::messages::CacheKey;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use super::flow::{Need, need_of};
use super::{CacheActor, JobId, RankRing, RingRecord};
use crate::stats::JobState;

impl CacheActor {
    /// The entry can be pushed now.
    pub(super) fn is_ready(&self, entry: &RingRecord) -> bool {
        match entry {
            RingRecord::Item { key, .. } => {
                self.slots.contains_key(key) || self.failed.contains_key(key)
            }
            RingRecord::EndOfEpoch { .. } | RingRecord::EndOfStream => true,
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
                RingRecord::Item { .. } => rr.ready_items += 1,
                RingRecord::EndOfEpoch { .. } | RingRecord::EndOfStream => break,
            }
        }
        rr.ready_items == batch
            || (rr.ready > 0
                && matches!(
                    rr.queue[rr.ready - 1],
                    RingRecord::EndOfEpoch { .. } | RingRecord::EndOfStream
                ))
    }

    /// Pushes what the rings can take (see [`push_units`](Self::push_units)), then counts the
    /// units that wait for room other jobs hold. Returns whether it pushed anything.
    pub(super) fn pump(&mut self) -> bool {
        let pushed = self.push_units();
        self.count_waits();
        pushed
    }

    /// Pushes every complete unit each ring has room for, in order, keeping at most one batch
    /// ahead of its client (pushed, not taken), and none while memory is short (payloads wait
    /// for room) until the client has taken what was pushed. What a stopped reader pins is
    /// then the batch it holds plus at most one, never its whole ring; the rest of what it
    /// was sampled stays evictable for the readers that read.
    fn push_units(&mut self) -> bool {
        let short = !self.waiting.is_empty();
        let mut pushed = false;
        let mut broken: Vec<(JobId, String)> = Vec::new();
        let job_ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in job_ids {
            let Some(mut job) = self.jobs.remove(&id) else {
                continue;
            };
            let batch = job.batch as usize;
            let epoch_end = job
                .own_positions
                .then_some((&job.subsets, job.rings.len() as u64));
            'rings: for rr in &mut job.rings {
                while self.ready_unit(rr, batch)
                    && rr.ring.free_credit() as usize >= rr.ready
                    && (untaken(rr) == 0 || (!short && untaken(rr) < batch as u64))
                {
                    for _ in 0..rr.ready {
                        let Some(front) = rr.queue.pop_front() else {
                            break;
                        };
                        if let Err(e) = self.push(rr, front, &job.stats, epoch_end) {
                            // Nothing else writes the ring and the unit fit: the ring is broken.
                            broken.push((id, format!("delivery failed: {e}")));
                            break 'rings;
                        }
                    }
                    rr.ready = 0;
                    rr.ready_items = 0;
                    rr.waited = false;
                    pushed = true;
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
        pushed
    }

    /// Pushes one ready entry into its ring.
    /// `epoch_end`: `(subsets, ranks)` of a job with its own positions.
    fn push(
        &mut self,
        rr: &mut RankRing,
        entry: RingRecord,
        stats: &crate::stats::JobStats,
        epoch_end: Option<(&super::Subsets, u64)>,
    ) -> Result<(), dataplane::Error> {
        // The epoch's end is queued with its last deliveries (the Sampler's `EndAt` comes in
        // the same message), so the record before it says it is the last: a client that
        // takes a whole batch ending the epoch knows the epoch ended without waiting for the
        // end record (its state moves to the next epoch with the other ranks').
        // With the job's own positions a rank's last position of an epoch is known too (the
        // end may come with a later pass when other ranks' last elements come later).
        let last = matches!(rr.queue.front(), Some(RingRecord::EndOfEpoch { .. }))
            || epoch_end.is_some_and(|(subsets, ranks)| match entry {
                RingRecord::Item {
                    position, epoch, ..
                } => u64::from(position) + ranks >= subsets.at(epoch).len(),
                _ => false,
            });
        match entry {
            RingRecord::Item {
                key,
                element,
                epoch,
                position,
            } => {
                if let Some(e) = self.slots.get_mut(&key) {
                    rr.ring
                        .push_data_with(e.slot, u64::from(epoch), u64::from(position), last)?;
                    e.queued = e.queued.saturating_sub(1);
                    e.pushed += 1;
                    rr.pinned += 1;
                    stats.delivered.fetch_add(1, Relaxed);
                    rr.shadow.push_back(true);
                    rr.epoch_count += 1;
                    // A pushed slot stays pinned until its record is acknowledged.
                    self.debug_assert_slot(key);
                } else if let Some(&(code, _)) = self.failed.get(&key) {
                    rr.ring.push_error_with(
                        element,
                        code,
                        u64::from(epoch),
                        u64::from(position),
                        last,
                    )?;
                    stats.delivered.fetch_add(1, Relaxed);
                    stats.errors.fetch_add(1, Relaxed);
                    rr.shadow.push_back(true);
                    rr.epoch_count += 1;
                    self.unref(key);
                } else {
                    debug_assert!(false, "key {key:#x} pushed neither cached nor failed");
                }
            }
            RingRecord::EndOfEpoch { epoch } => {
                rr.ring
                    .push_end_of_epoch(u64::from(epoch), rr.epoch_count)?;
                rr.shadow.push_back(false);
                rr.epoch_count = 0;
            }
            RingRecord::EndOfStream => {
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

impl CacheActor {
    /// Counts, once per unit, each ring whose next unit could go to its client now (the
    /// client has taken everything pushed, and the ring's credit, as the cache has polled
    /// it, has room for the unit) but for elements that wait for room, when other jobs hold
    /// some of that room: records they have not acknowledged, or cached elements they need
    /// sooner (which `store` in `flow.rs` may not evict).
    ///
    /// Counted on a consistent view only, so that the count says what the jobs held and not
    /// when the cache happened to run: with nothing acknowledged that the cache has not polled
    /// (a slot it thinks held may be free already), and after the waiting payloads tried for
    /// room again with no client moving meanwhile (a payload that last tried before its
    /// client took a batch may wait on a need that is gone). A view that moved is decided at
    /// the next message or poll. Then, when the cache has room for what every reading ring
    /// may hold (the batch its client holds and one more, pushed or being completed: two
    /// batches per ring), no unit ever waits for another job, however slow its reader.
    fn count_waits(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        // Cheap tests first: what follows costs about two rounds of room-making.
        let candidates = self.blocked();
        if !candidates
            .iter()
            .any(|&(id, _, _)| self.others_hold_anything(id))
        {
            return;
        }
        let Some(view) = self.client_view() else {
            return;
        };
        self.room_changed = true;
        self.drain_waiting();
        self.push_units();
        let blocked = self.blocked();
        if blocked.is_empty() || self.client_view().as_ref() != Some(&view) {
            return;
        }
        let times = self.need_times();
        for (id, rank, keys) in blocked {
            if !self.held_by_others(id, &keys, &times) {
                continue;
            }
            if let Some(job) = self.jobs.get_mut(&id) {
                job.rings[rank].waited = true;
                job.stats.waited_for_others.fetch_add(1, Relaxed);
                tracing::debug!(
                    job = id,
                    rank,
                    waiting = keys.len(),
                    "a unit waits for room other jobs hold"
                );
            }
        }
    }

    /// The rings, not counted yet, whose next unit could go to its client now but for its
    /// elements that wait for room: (job, rank, those elements' keys).
    fn blocked(&self) -> Vec<(JobId, usize, Vec<CacheKey>)> {
        let mut out = Vec::new();
        for (&id, job) in &self.jobs {
            if !job.granted {
                continue;
            }
            let batch = job.batch as usize;
            for (rank, rr) in job.rings.iter().enumerate() {
                if rr.waited || untaken(rr) > 0 {
                    continue;
                }
                // The unit: up to a batch of items, or through an end.
                let (mut records, mut items, mut keys) = (0u64, 0usize, Vec::new());
                for entry in &rr.queue {
                    records += 1;
                    let RingRecord::Item { key, .. } = *entry else {
                        break;
                    };
                    if self.waiting.contains_key(&key) {
                        keys.push(key);
                    }
                    items += 1;
                    if items == batch {
                        break;
                    }
                }
                let outstanding = rr.ring.pushed() - rr.acked.min(rr.ring.pushed());
                let credit = u64::from(rr.ring.capacity()).saturating_sub(outstanding);
                if !keys.is_empty() && credit >= records {
                    out.push((id, rank, keys));
                }
            }
        }
        out
    }

    /// Where every client is (its consumer position, ring by ring), or `None` while some
    /// client has acknowledged records the cache has not polled yet.
    fn client_view(&self) -> Option<Vec<(JobId, u64)>> {
        let mut view = Vec::new();
        for (&id, job) in &self.jobs {
            for rr in &job.rings {
                if rr.ring.acks_pending() {
                    return None;
                }
                view.push((id, rr.ring.consumer_position()));
            }
        }
        view.sort_unstable();
        Some(view)
    }

    /// Some other job than `id` has records pushed and not acknowledged, or deliveries queued.
    fn others_hold_anything(&self, id: JobId) -> bool {
        self.jobs.iter().any(|(&other, j)| {
            other != id
                && j.rings
                    .iter()
                    .any(|rr| rr.pinned > 0 || !rr.queue.is_empty())
        })
    }

    /// Other jobs than `id` hold room that the waiting `keys` cannot take: slots their rings
    /// have pushed and not had acknowledged, or cached elements they have queued and need
    /// sooner.
    fn held_by_others(
        &self,
        id: JobId,
        keys: &[CacheKey],
        times: &HashMap<CacheKey, Need>,
    ) -> bool {
        let pinned = self
            .jobs
            .iter()
            .any(|(&other, j)| other != id && j.rings.iter().any(|rr| rr.pinned > 0));
        if pinned {
            return true;
        }
        let Some(mine) = keys
            .iter()
            .map(|&k| need_of(times, k))
            .max_by(|a, b| a.cmp(b))
        else {
            return false;
        };
        self.slots.iter().any(|(&k, e)| {
            let need = need_of(times, k);
            e.pushed == 0 && e.queued > 0 && need.job() != id && need.cmp(&mine).is_lt()
        })
    }
}

/// Records pushed into the ring that its client has not taken yet.
fn untaken(rr: &RankRing) -> u64 {
    let pushed = rr.ring.pushed();
    pushed - rr.ring.consumer_position().min(pushed)
}
