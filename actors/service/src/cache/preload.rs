//! Working sets: a dataset's elements preloaded into the cache before (or while) jobs read
//! them, and pinned there until the preload is released (seed 003's explicit working sets).
//!
//! - **Priority.** A preload's loads start only while no job's load is pending, and take at
//!   most half of the load places: a running job's miss never queues behind more than that.
//!   A preloaded payload that finds no room takes only the policy's unneeded victims (never
//!   an element a job still needs in its epoch); without one it is dropped, its element goes
//!   back to the preload's list, and the preload waits until an acknowledgement, an eviction
//!   or a closed job makes room.
//! - **Pins.** A pinned slot counts as used ([`SlotEntry::uses`]), so the policy never picks it
//!   and the liveness rule (evict a queued element needed later) passes over it. Every
//!   preload together may pin at most half the cache's bytes and half its slots: a working set
//!   that cannot fit even at its elements' least size is refused at once
//!   ([`PreloadError::TooLarge`]); one whose decoded elements turn out larger fails when the
//!   next one would cross the budget, and releases its pins.
//! - **Sharing.** A job's delivery of an element being preloaded joins that load (a hit); a
//!   preload of an element a job already cached pins that slot. A job on the same pipeline
//!   as a ready preload decodes nothing of it.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use roaring::RoaringBitmap;

use super::{CacheActor, Loading};
use crate::messages::{
    CacheKey, DatasetId, ElementSource, Load, PipelineId, Preload, PreloadError, Prepare,
};
use crate::stats::{PreloadProgress, PreloadState};

/// One dataset's preload.
pub(super) struct Run {
    pipeline: PipelineId,
    prepare: Arc<dyn Prepare>,
    source: Arc<dyn ElementSource>,
    /// Elements not looked at yet, then those dropped for lack of room (`retry`).
    todo: roaring::bitmap::IntoIter,
    retry: Vec<u32>,
    /// Loads of its own under way.
    loading: u32,
    /// A payload found no room: no load starts until room changes.
    blocked: bool,
    /// It failed (did not fit): it pins nothing more until released.
    stopped: bool,
    progress: Arc<PreloadProgress>,
}

/// What every preload pins together, and the most it may.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Pins {
    bytes: u64,
    slots: u64,
    budget_bytes: u64,
    budget_slots: u64,
}

impl CacheActor {
    /// Starts a preload (see the module docs); answers the pin budget in bytes.
    pub(super) fn preload(&mut self, msg: Preload) -> Result<u64, PreloadError> {
        let Some(writer) = &self.writer else {
            return Err(PreloadError::ShutDown);
        };
        match self.preloads.get(&msg.dataset) {
            // A failed preload pins nothing: a new one replaces it.
            Some(run) if run.stopped => {
                self.preloads.remove(&msg.dataset);
            }
            Some(_) => return Err(PreloadError::Exists),
            None => {}
        }
        self.pins.budget_bytes = writer.arena_stats().size / 2;
        self.pins.budget_slots = u64::from(writer.slot_count() / 2);
        let elements = msg.elements.len();
        let needed = elements.saturating_mul(msg.min_element_bytes.max(1));
        let free_bytes = self.pins.budget_bytes.saturating_sub(self.pins.bytes);
        let free_slots = self.pins.budget_slots.saturating_sub(self.pins.slots);
        if needed > free_bytes || elements > free_slots {
            return Err(PreloadError::TooLarge {
                elements,
                needed,
                free_bytes,
                free_slots,
                fit: (free_bytes / msg.min_element_bytes.max(1)).min(free_slots),
            });
        }
        let p = &msg.progress;
        p.elements.store(elements, Relaxed);
        p.budget_bytes.store(self.pins.budget_bytes, Relaxed);
        p.set_state(PreloadState::Loading);
        let bitmap: RoaringBitmap = (*msg.elements).clone();
        self.preloads.insert(
            msg.dataset,
            Run {
                pipeline: msg.pipeline,
                prepare: msg.prepare,
                source: msg.source,
                todo: bitmap.into_iter(),
                retry: Vec::new(),
                loading: 0,
                blocked: false,
                stopped: false,
                progress: msg.progress,
            },
        );
        tracing::info!(dataset = msg.dataset, elements, "preload started");
        self.issue_loads();
        self.pump();
        Ok(self.pins.budget_bytes)
    }

    /// Releases a dataset's preload: its pins go, its loads under way are no longer its own.
    pub(super) fn unpreload(&mut self, dataset: DatasetId) -> bool {
        let Some(run) = self.preloads.remove(&dataset) else {
            return false;
        };
        self.unpin_all(dataset, run.pipeline);
        tracing::info!(dataset, "preload released");
        true
    }

    /// Takes the preload's pins off every slot of `dataset` prepared by `pipeline`, and its
    /// mark off the loads under way.
    fn unpin_all(&mut self, dataset: DatasetId, pipeline: PipelineId) {
        let keys: Vec<CacheKey> = self
            .slots
            .iter()
            .filter(|(k, e)| e.pinned && same_set(**k, dataset, pipeline))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            let len = self.slot_bytes(key);
            if let Some(e) = self.slots.get_mut(&key) {
                e.pinned = false;
                if e.uses() == 0 {
                    self.policy.unpin(key.raw());
                }
            }
            self.pins.bytes = self.pins.bytes.saturating_sub(len);
            self.pins.slots = self.pins.slots.saturating_sub(1);
            self.debug_assert_slot(key);
        }
        for (k, l) in &mut self.loading {
            if same_set(*k, dataset, pipeline) {
                l.preload = false;
            }
        }
        self.room_changed = true;
    }

    /// Starts the preloads' loads while no job's load waits, on at most half the load places.
    pub(super) fn issue_preloads(&mut self) {
        if self.preloads.is_empty() || !self.pending.is_empty() {
            return;
        }
        let places = (self.max_loading / 2).max(1) as u32;
        let datasets: Vec<DatasetId> = self.preloads.keys().copied().collect();
        for dataset in datasets {
            while self.loading.len() < self.max_loading {
                let Some(run) = self.preloads.get_mut(&dataset) else {
                    break;
                };
                if run.blocked || run.loading >= places {
                    break;
                }
                let Some(element) = run.retry.pop().or_else(|| run.todo.next()) else {
                    break;
                };
                let key = CacheKey::new(dataset, run.pipeline, element);
                self.preload_one(dataset, key);
            }
            self.check_done(dataset);
        }
    }

    /// Pins `key` if cached, marks its load if loading, else loads it for the preload.
    fn preload_one(&mut self, dataset: DatasetId, key: CacheKey) {
        if self.slots.contains_key(&key) {
            self.pin_preloaded(key);
        } else if let Some(l) = self.loading.get_mut(&key) {
            // A job's load (never this preload's: an element is looked at once): pinned
            // when stored, and counted as this preload's until then.
            l.preload = true;
            if let Some(run) = self.preloads.get_mut(&dataset) {
                run.loading += 1;
            }
        } else if self.failed.contains_key(&key) {
            if let Some(run) = self.preloads.get(&dataset) {
                run.progress.failed.fetch_add(1, Relaxed);
            }
        } else if let Some(run) = self.preloads.get_mut(&dataset) {
            run.loading += 1;
            run.progress.loads.fetch_add(1, Relaxed);
            let (_, pipeline, element) = key.parts();
            let load = Load {
                dataset,
                element,
                source: run.source.clone(),
                pipelines: vec![(pipeline, run.prepare.clone())],
            };
            self.loading.insert(
                key,
                Loading {
                    refs: 0,
                    need: 0,
                    preload: true,
                },
            );
            self.loader.do_send(load);
        }
    }

    /// A cached element of a preload is pinned, within the budget; past it, the preload fails.
    pub(super) fn pin_preloaded(&mut self, key: CacheKey) {
        let (dataset, pipeline, _) = key.parts();
        let Some(progress) = self
            .preloads
            .get(&dataset)
            .filter(|r| r.pipeline == pipeline && !r.stopped)
            .map(|r| r.progress.clone())
        else {
            return;
        };
        if self.slots.get(&key).is_none_or(|e| e.pinned) {
            return;
        }
        let len = self.slot_bytes(key);
        if self.pins.bytes + len > self.pins.budget_bytes
            || self.pins.slots >= self.pins.budget_slots
        {
            self.fail_preload(dataset, len);
            return;
        }
        if let Some(e) = self.slots.get_mut(&key) {
            e.pinned = true;
            if e.uses() == 1 {
                self.policy.pin(key.raw());
            }
        }
        self.pins.bytes += len;
        self.pins.slots += 1;
        progress.pinned.fetch_add(1, Relaxed);
        progress.pinned_bytes.fetch_add(len, Relaxed);
        self.debug_assert_slot(key);
    }

    /// The preload's own load of `key` ended (stored, failed or dropped: `retry`).
    pub(super) fn preload_load_ended(&mut self, key: CacheKey, outcome: LoadEnd) {
        let (dataset, pipeline, element) = key.parts();
        let Some(run) = self
            .preloads
            .get_mut(&dataset)
            .filter(|r| r.pipeline == pipeline)
        else {
            return;
        };
        run.loading = run.loading.saturating_sub(1);
        match outcome {
            LoadEnd::Stored => self.pin_preloaded(key),
            LoadEnd::Failed => {
                run.progress.failed.fetch_add(1, Relaxed);
            }
            LoadEnd::NoRoom => {
                run.retry.push(element);
                run.blocked = true;
                run.progress.waiting_for_room.store(true, Relaxed);
            }
        }
        self.check_done(dataset);
    }

    /// Room may have changed (an acknowledgement, an eviction, a closed job): blocked
    /// preloads try again.
    pub(super) fn unblock_preloads(&mut self) {
        for run in self.preloads.values_mut() {
            if run.blocked {
                run.blocked = false;
                run.progress.waiting_for_room.store(false, Relaxed);
            }
        }
    }

    fn check_done(&mut self, dataset: DatasetId) {
        let Some(run) = self.preloads.get_mut(&dataset) else {
            return;
        };
        if run.loading > 0 || !run.retry.is_empty() || run.todo.len() > 0 {
            return;
        }
        if run.progress.state() == PreloadState::Loading {
            let p = &run.progress;
            p.set_state(PreloadState::Ready);
            tracing::info!(
                dataset,
                pinned = p.pinned.load(Relaxed),
                failed = p.failed.load(Relaxed),
                bytes = p.pinned_bytes.load(Relaxed),
                "preload ready"
            );
        }
    }

    /// The working set does not fit: its pins go and it stops, saying how much fit.
    fn fail_preload(&mut self, dataset: DatasetId, next: u64) {
        let Some(run) = self.preloads.get_mut(&dataset) else {
            return;
        };
        let p = run.progress.clone();
        let pipeline = run.pipeline;
        run.todo = RoaringBitmap::new().into_iter();
        run.retry.clear();
        run.stopped = true;
        let reason = format!(
            "the working set does not fit in the pin budget ({} bytes, half the cache, \
             less what other preloads pin): {} of its {} elements fit ({} bytes), the next \
             takes {next} more; preload a smaller subset or raise --cache-bytes",
            self.pins.budget_bytes,
            p.pinned.load(Relaxed),
            p.elements.load(Relaxed),
            p.pinned_bytes.load(Relaxed),
        );
        tracing::warn!(dataset, reason = %reason, "preload failed");
        p.set_state(PreloadState::Failed(reason));
        self.unpin_all(dataset, pipeline);
        p.pinned.store(0, Relaxed);
        p.pinned_bytes.store(0, Relaxed);
    }

    /// Bytes a cached key's slot takes.
    fn slot_bytes(&self, key: CacheKey) -> u64 {
        match (&self.writer, self.slots.get(&key)) {
            (Some(w), Some(e)) => w.slot_len(e.slot).unwrap_or(0),
            _ => 0,
        }
    }

    /// Checks (debug builds, `invariants.rs`) that the pins counted are the pinned slots.
    pub(super) fn check_pins(&self) -> Result<(), String> {
        let pinned = self.slots.values().filter(|e| e.pinned).count() as u64;
        if pinned != self.pins.slots {
            return Err(format!(
                "{pinned} slots pinned by preloads, {} counted",
                self.pins.slots
            ));
        }
        for (&k, e) in &self.slots {
            let (d, p, _) = k.parts();
            if e.pinned && self.preloads.get(&d).is_none_or(|r| r.pipeline != p) {
                return Err(format!("key {k:#x} is pinned by no preload"));
            }
        }
        Ok(())
    }

    /// The cache shuts down: every preload stops.
    pub(super) fn stop_preloads(&mut self) {
        self.pins.bytes = 0;
        self.pins.slots = 0;
        for (_, run) in self.preloads.drain() {
            if run.progress.state() == PreloadState::Loading {
                run.progress
                    .set_state(PreloadState::Failed("the cache shut down".into()));
            }
        }
    }
}

/// How a preload's own load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LoadEnd {
    Stored,
    Failed,
    NoRoom,
}

fn same_set(key: CacheKey, dataset: DatasetId, pipeline: PipelineId) -> bool {
    let (d, p, _) = key.parts();
    d == dataset && p == pipeline
}
