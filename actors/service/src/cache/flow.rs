//! Loads and room: which keys are loaded when (bounded), where a prepared payload goes, and
//! what is evicted when memory is short (see the parent module's docs for the rules).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use dataplane::{SlotMeta, SlotRef, element_error};

use super::preload::LoadEnd;
use super::{CacheActor, Loading, Pending, RingRecord, SlotEntry};
use crate::messages::{CacheKey, JobId, Load, Loaded, PipelineId, Prepare, Prepared};

/// A prepared payload that found no room yet.
pub(super) struct Waiting {
    element: u32,
    label: i64,
    prepared: Prepared,
}

/// Below this rate (records a second) a job counts as paused when ranking need times.
const MIN_RATE: f64 = 1e-3;

impl CacheActor {
    /// Sends pending keys to the Loader, oldest first, while fewer than `max_loading` keys
    /// are being loaded or wait for room. One read serves every pipeline that needs the
    /// element.
    pub(super) fn issue_loads(&mut self) {
        while self.loading.len() < self.max_loading {
            let Some(key) = self.pending_order.pop_front() else {
                break;
            };
            self.issue(key);
        }
        self.displace_waiting();
        self.issue_preloads();
    }

    /// Every place for a load is taken and some are payloads waiting for room: a pending key
    /// needed sooner than the latest-needed waiting payload takes that payload's place (the
    /// payload is dropped and loaded again later). Without this, payloads of units that
    /// cannot get room could keep the unit that can from ever loading.
    fn displace_waiting(&mut self) {
        if self.loading.len() < self.max_loading
            || self.waiting.is_empty()
            || self.pending.is_empty()
        {
            return;
        }
        let times = self.need_times();
        loop {
            let first = self
                .pending
                .keys()
                .map(|&k| (k, need_of(&times, k)))
                .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
            let last = self
                .waiting
                .keys()
                .map(|&k| (k, need_of(&times, k)))
                .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
            let (Some((p, pn)), Some((w, wn))) = (first, last) else {
                return;
            };
            if pn.cmp(&wn).is_ge() {
                return;
            }
            self.waiting.remove(&w);
            let l = self.loading.remove(&w).unwrap_or_default();
            if l.preload {
                self.preload_load_ended(w, LoadEnd::NoRoom);
            }
            if l.refs > 0 {
                self.pending.insert(
                    w,
                    Pending {
                        refs: l.refs,
                        need: l.need,
                        reload: true,
                    },
                );
                self.pending_order.push_back(w);
            }
            self.issue(p);
        }
    }

    /// Starts the load of a pending key (with the other pipelines pending for its element).
    fn issue(&mut self, key: CacheKey) {
        let Some(p) = self.pending.remove(&key) else {
            return; // no longer needed, or already loading
        };
        let (dataset, _, element) = key.parts();
        let Some(source) = self.sources.get(&dataset).cloned() else {
            return;
        };
        let mut pipelines: Vec<(PipelineId, Arc<dyn Prepare>)> = Vec::new();
        let mut others: Vec<(CacheKey, Pending)> = Vec::new();
        for job in self.jobs.values().filter(|j| j.dataset == dataset) {
            if pipelines.iter().any(|(pl, _)| *pl == job.pipeline) {
                continue;
            }
            let k = CacheKey::new(dataset, job.pipeline, element);
            if k == key {
                pipelines.push((job.pipeline, job.prepare.clone()));
            } else if let Some(other) = self.pending.remove(&k) {
                others.push((k, other));
                pipelines.push((job.pipeline, job.prepare.clone()));
            }
        }
        for (k, other) in others {
            self.start_loading(k, other);
        }
        if pipelines.is_empty() {
            return; // every job that needed it is gone
        }
        self.start_loading(key, p);
        self.loader.do_send(Load {
            dataset,
            element,
            source,
            pipelines,
        });
    }

    fn start_loading(&mut self, key: CacheKey, p: Pending) {
        if p.reload {
            self.stats.reloads.fetch_add(1, Relaxed);
            // A reload reads the element again for a queued delivery: that job pays for it,
            // as for a miss (its first load's payer was charged already).
            if !self.charged.contains_key(&key)
                && let Some(payer) = self.queued_by(key)
            {
                self.charged.insert(key, payer);
            }
        }
        self.loading.insert(
            key,
            Loading {
                refs: p.refs,
                need: p.need,
                preload: false,
            },
        );
    }

    /// The job (and the epoch of its delivery) of the first queued delivery of `key`.
    fn queued_by(&self, key: CacheKey) -> Option<(Arc<crate::stats::JobStats>, u64)> {
        self.jobs.values().find_map(|job| {
            job.rings.iter().find_map(|rr| {
                rr.queue.iter().find_map(|entry| match *entry {
                    RingRecord::Item { key: k, epoch, .. } if k == key => {
                        Some((job.stats.clone(), u64::from(epoch)))
                    }
                    _ => None,
                })
            })
        })
    }

    pub(super) fn loaded(&mut self, msg: Loaded) {
        // The store bytes go to the job whose miss issued the load (once per element, whatever
        // its pipelines).
        let mut payer = None;
        for (pipeline, _) in &msg.results {
            let key = CacheKey::new(msg.dataset, *pipeline, msg.element);
            if let Some(p) = self.charged.remove(&key) {
                payer.get_or_insert(p);
            }
        }
        if let Some((stats, epoch)) = payer
            && msg.store_bytes > 0
        {
            stats.store_read_bytes.fetch_add(msg.store_bytes, Relaxed);
            if let Ok(mut e) = stats.store_epochs.lock() {
                e.charge(epoch, msg.store_bytes);
            }
        }
        for (pipeline, result) in msg.results {
            let key = CacheKey::new(msg.dataset, pipeline, msg.element);
            if !self.loading.contains_key(&key) {
                // No longer needed (its jobs closed, or displaced): a slot a loader thread
                // wrote it into is freed (nothing references it).
                if let (
                    Ok(Prepared {
                        placed: Some(slot), ..
                    }),
                    Some(w),
                ) = (&result, &self.writer)
                {
                    let _ = w.free_slot(*slot);
                }
                continue;
            }
            match result {
                Ok(Prepared {
                    placed: Some(slot),
                    format,
                    ..
                }) => {
                    self.stats.placed.fetch_add(1, Relaxed);
                    let len = format.expected_len().unwrap_or(0);
                    self.largest_payload = self.largest_payload.max(len);
                    self.stored(key, slot);
                }
                Ok(prepared) => {
                    self.waiting.insert(
                        key,
                        Waiting {
                            element: msg.element,
                            label: msg.label,
                            prepared,
                        },
                    );
                    self.room_changed = true;
                }
                Err(f) => {
                    tracing::debug!(element = msg.element, kind = %f.kind, message = %f.message, "element failed to load");
                    self.stats
                        .record_failure(msg.dataset, msg.element, &f.kind, &f.message);
                    self.fail(key, f.code);
                }
            }
        }
        self.drain_waiting();
        self.keep_headroom();
        self.issue_loads();
        self.pump();
    }

    pub(super) fn fail(&mut self, key: CacheKey, code: u32) {
        let l = self.loading.remove(&key).unwrap_or_default();
        self.waiting.remove(&key);
        self.stats.load_errors.fetch_add(1, Relaxed);
        if l.refs > 0 {
            self.failed.insert(key, (code, l.refs));
        }
        if l.preload {
            self.preload_load_ended(key, LoadEnd::Failed);
        }
    }

    fn evict(&mut self, key: CacheKey) -> Option<SlotEntry> {
        let e = self.slots.remove(&key)?;
        debug_assert_eq!(
            e.pushed, 0,
            "key {key:#x}: a slot a ring holds is never evicted"
        );
        debug_assert!(
            !self.policy.contains(key.raw()),
            "key {key:#x}: evicted, still tracked"
        );
        self.by_slot.remove(&e.slot.slot);
        self.stats.evictions.fetch_add(1, Relaxed);
        self.room_changed = true;
        self.unblock_preloads();
        if let Some(w) = &self.writer
            && let Err(err) = w.free_slot(e.slot)
        {
            tracing::error!(error = %err, key = key.raw(), "evicted key's slot could not be freed");
        }
        Some(e)
    }

    /// Evicts a key that rings have queued but not pushed (no read bit is set on its slot):
    /// its queued deliveries wait for it to be loaded again.
    fn evict_needed(&mut self, key: CacheKey) {
        let need = self.policy.refcount(key.raw()).unwrap_or(0);
        self.policy.remove(key.raw());
        let Some(e) = self.evict(key) else { return };
        self.stats.evictions_needed.fetch_add(1, Relaxed);
        self.pending.insert(
            key,
            Pending {
                refs: e.queued,
                need,
                reload: true,
            },
        );
        self.pending_order.push_back(key);
        // Rings whose ready prefix held the key must look again.
        for job in self.jobs.values_mut() {
            for rr in &mut job.rings {
                rr.ready = 0;
                rr.ready_items = 0;
            }
        }
    }

    /// When each queued key is needed, as a [`Need`]: the whole units ahead of it in its ring
    /// (pushed but not taken, then queued) divided by its job's reading rate per rank, the
    /// soonest over rings. Unmeasured jobs count as fast; paused ones as needing it last.
    /// Every element of a unit has the same need, and needs are totally ordered by (time,
    /// job), so that room always goes to one unit first: two units each half cached would
    /// otherwise wait for each other.
    pub(super) fn need_times(&self) -> HashMap<CacheKey, Need> {
        let fastest = self
            .jobs
            .values()
            .filter_map(|j| j.rate)
            .fold(1.0f64, f64::max);
        let mut times: HashMap<CacheKey, Need> = HashMap::new();
        for (&id, job) in &self.jobs {
            let rate = job.rate.unwrap_or(fastest).max(MIN_RATE) / job.rings.len() as f64;
            let batch = u64::from(job.batch.max(1));
            for rr in &job.rings {
                let ahead = rr.ring.pushed() - rr.ring.consumer_position().min(rr.ring.pushed());
                for (i, entry) in rr.queue.iter().enumerate() {
                    if let RingRecord::Item { key, .. } = *entry {
                        let unit = (ahead + i as u64) / batch;
                        let need = Need {
                            time: (unit * batch) as f64 / rate,
                            job: id,
                        };
                        times
                            .entry(key)
                            .and_modify(|cur| {
                                if need.cmp(cur).is_lt() {
                                    *cur = need;
                                }
                            })
                            .or_insert(need);
                    }
                }
            }
        }
        times
    }

    /// A loading key's payload is in `slot` now: cached, pinned if rings wait for it.
    fn stored(&mut self, key: CacheKey, slot: SlotRef) {
        let l = self.loading.remove(&key).unwrap_or_default();
        self.slots.insert(
            key,
            SlotEntry {
                slot,
                queued: l.refs,
                pushed: 0,
                pinned: false,
            },
        );
        self.by_slot.insert(slot.slot, (slot, key));
        self.policy.insert(key.raw(), l.need, None);
        if l.refs > 0 {
            self.policy.pin(key.raw());
        }
        self.debug_assert_slot(key);
        if l.preload {
            self.preload_load_ended(key, LoadEnd::Stored);
        }
    }

    /// Keeps room free for the loads under way, so that the loader threads can write them
    /// straight into slots (`Loader::placing`): while less than `max_loading` of the largest
    /// payloads (and as many slots) are free, or no free block holds the largest, evicts the
    /// policy's victims that no job needs
    /// (never a needed one: when only those are left, payloads come to the Cache as bytes
    /// and wait for room by the usual rules). At most a sixteenth of the arena and of the
    /// slots is kept free this way.
    pub(super) fn keep_headroom(&mut self) {
        let Some(writer) = self.writer.clone() else {
            return;
        };
        if self.largest_payload == 0 || !self.waiting.is_empty() {
            return;
        }
        let mut a = writer.arena_stats();
        let bytes = (self.largest_payload * self.max_loading as u64).min(a.size / 16);
        let slots = (self.max_loading as u32).min(writer.slot_count() / 16);
        let mut evicted = false;
        while a.free < bytes || a.largest_free < self.largest_payload || writer.free_slots() < slots
        {
            let Some(victim) = self.policy.unneeded_victim() else {
                break;
            };
            self.evict_victim(CacheKey::from_raw(victim), 0);
            evicted = true;
            a = writer.arena_stats();
        }
        if evicted {
            self.update_gauges();
        }
    }

    /// Evicts the policy's victim (already taken out of the policy), counted by whether some
    /// job still needed it (`refcount`).
    fn evict_victim(&mut self, victim: CacheKey, refcount: u32) {
        let reason = if refcount == 0 {
            &self.stats.evictions_unneeded
        } else {
            &self.stats.evictions_needed
        };
        reason.fetch_add(1, Relaxed);
        debug_assert!(
            self.slots.get(&victim).is_none_or(|e| e.uses() == 0),
            "key {victim:#x}: the policy's victim is used"
        );
        self.evict(victim);
    }

    /// Stores the payloads that wait for room, soonest needed first. Room comes from the
    /// policy's victims (keys nobody holds), then, when memory is short, from keys that
    /// are only queued and needed later than the payload. What still finds no room waits.
    pub(super) fn drain_waiting(&mut self) {
        if self.waiting.is_empty() || !self.room_changed {
            return;
        }
        self.room_changed = false;
        let mut times: Option<HashMap<CacheKey, Need>> = None;
        let mut keys: Vec<CacheKey> = self.waiting.keys().copied().collect();
        if keys.len() > 1 {
            let t = times.insert(self.need_times());
            keys.sort_by(|a, b| need_of(t, *a).cmp(&need_of(t, *b)).then(a.cmp(b)));
        }
        for key in keys {
            let Some(w) = self.waiting.remove(&key) else {
                continue;
            };
            if let Some(w) = self.store(key, w, &mut times) {
                self.waiting.insert(key, w);
            }
        }
        self.update_gauges();
    }

    /// Stores one payload, making room as the rules allow; gives it back if it must wait.
    fn store(
        &mut self,
        key: CacheKey,
        w: Waiting,
        times: &mut Option<HashMap<CacheKey, Need>>,
    ) -> Option<Waiting> {
        loop {
            let writer = self.writer.as_ref()?;
            let meta = SlotMeta {
                element_id: w.element,
                label: w.label,
                format: w.prepared.format,
                fields_len: w.prepared.fields_len,
                source: w.prepared.source,
            };
            let copy = joader_stages::enter(&crate::stages::SLOT_WRITE);
            let written = writer.write_slot(meta, &w.prepared.bytes);
            drop(copy);
            match written {
                Ok(slot) => {
                    let len = w.prepared.bytes.len() as u64;
                    self.largest_payload = self.largest_payload.max(len);
                    self.stored(key, slot);
                    return None;
                }
                Err(dataplane::Error::Full { .. } | dataplane::Error::NoFreeSlot { .. }) => {
                    if self
                        .loading
                        .get(&key)
                        .is_some_and(|l| l.preload && l.refs == 0)
                    {
                        if self.room_for_preloaded(key) {
                            continue;
                        }
                        return None;
                    }
                    if let Some((victim, refcount)) = self.policy.victim_with_refcount() {
                        self.evict_victim(CacheKey::from_raw(victim), refcount);
                        continue;
                    }
                    if self.slots.is_empty() {
                        // Nothing cached and still no room: the element cannot fit at all.
                        self.fail(key, element_error::TOO_LARGE);
                        return None;
                    }
                    if self.loading.get(&key).is_none_or(|l| l.refs == 0) {
                        // No ring needs it any more (its jobs closed): not worth a needed
                        // element's place.
                        self.loading.remove(&key);
                        return None;
                    }
                    let t = times.get_or_insert_with(|| self.need_times());
                    let mine = need_of(t, key);
                    let victim = self
                        .slots
                        .iter()
                        .filter(|(_, e)| e.pushed == 0 && e.queued > 0 && !e.pinned)
                        .map(|(&k, _)| (k, need_of(t, k)))
                        .filter(|(_, tk)| tk.cmp(&mine).is_gt())
                        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
                    match victim {
                        Some((v, _)) => self.evict_needed(v),
                        // Everything cached is held by rings or needed sooner: wait for
                        // acknowledgements.
                        None => return Some(w),
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, element = w.element, "cannot store a prepared element");
                    self.fail(key, element_error::INTERNAL);
                    return None;
                }
            }
        }
    }
}

impl CacheActor {
    /// A payload only a preload wants found no room: it may take the policy's unneeded
    /// victims (returns true: write it again), never what a job needs; without one it is
    /// dropped and its element goes back to the preload (`preload.rs`).
    fn room_for_preloaded(&mut self, key: CacheKey) -> bool {
        if let Some(victim) = self.policy.unneeded_victim() {
            self.evict_victim(CacheKey::from_raw(victim), 0);
            return true;
        }
        if self.slots.is_empty() {
            self.fail(key, element_error::TOO_LARGE);
            return false;
        }
        self.loading.remove(&key);
        self.preload_load_ended(key, LoadEnd::NoRoom);
        false
    }
}

/// When a key is needed: ordered by time, then by job (see [`CacheActor::need_times`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Need {
    time: f64,
    job: JobId,
}

impl Need {
    const NEVER: Need = Need {
        time: f64::INFINITY,
        job: JobId::MAX,
    };

    pub(super) fn cmp(&self, other: &Need) -> std::cmp::Ordering {
        self.time
            .total_cmp(&other.time)
            .then(self.job.cmp(&other.job))
    }

    /// The job that needs the key soonest.
    pub(super) fn job(&self) -> JobId {
        self.job
    }
}

/// A key's need; a key no ring has queued is needed never.
pub(super) fn need_of(times: &HashMap<CacheKey, Need>, key: CacheKey) -> Need {
    times.get(&key).copied().unwrap_or(Need::NEVER)
}
