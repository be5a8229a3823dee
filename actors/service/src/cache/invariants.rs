//! The Cache's invariants, checked in debug builds: each handler asserts in constant time what
//! it changed (`debug_assert!`s beside the code, and [`CacheActor::debug_assert_slot`]), and
//! [`CacheActor::check_invariants`] checks everything the cache holds (linear in it) after
//! the messages that [`joader_core::invariants`] says are due.
//!
//! What is checked (see the Invariants of ARCHITECTURE.md):
//! - a slot that some ring holds (pushed, not acknowledged) or has queued is pinned in the
//!   policy, and only such a slot is: a held slot is never evicted or freed; the policy tracks
//!   exactly the cached keys, and `by_slot` is their inverse;
//! - a key is in one place at a time (cached, loading, pending or failed); payloads waiting
//!   for room are loading; every pending key is in the load order;
//! - the references a key holds are exactly the deliveries queued for it in the rings;
//! - each ring's shadow has one flag per record pushed and not acknowledged, its ready prefix
//!   is ready and at most one unit, and the slots' pushed counts are at most its outstanding
//!   records and exactly the data records the rings hold (their `pinned` counts);
//! - the cache keeps the source of exactly the datasets of its jobs.

use crate::messages::CacheKey;
use std::collections::{HashMap, HashSet};

use super::{CacheActor, RingRecord};

impl CacheActor {
    /// Counts a handled message (or poll) and runs the full check when it is due (debug
    /// builds only; see [`joader_core::invariants`]).
    pub(super) fn after_message(&mut self) {
        if self.checks.count() {
            self.checks.verify("cache", self.check_invariants());
        }
    }

    /// Asserts (debug builds) that a cached key is pinned exactly while a ring holds or has
    /// queued it, and that its slot maps back to it: what a handler that changed the key's
    /// uses must leave. Constant time.
    #[track_caller]
    pub(super) fn debug_assert_slot(&self, key: CacheKey) {
        if !cfg!(debug_assertions) || self.writer.is_none() {
            return;
        }
        if let Some(e) = self.slots.get(&key) {
            debug_assert_eq!(
                self.policy.is_pinned(key.raw()),
                e.uses() > 0,
                "key {key:#x} ({} queued, {} pushed): pinned exactly while used",
                e.queued,
                e.pushed
            );
            debug_assert_eq!(
                self.by_slot.get(&e.slot.slot),
                Some(&(e.slot, key)),
                "key {key:#x}: its slot maps back to it"
            );
        }
    }

    /// Checks every invariant of the module docs against the cache's whole state; returns the
    /// first that fails. Linear in the cached keys, the loads and the queued deliveries.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        self.check_slots()?;
        self.check_places()?;
        self.check_references()?;
        self.check_rings()?;
        self.check_pins()?;
        let datasets: HashSet<_> = self.jobs.values().map(|j| j.dataset).collect();
        let sources: HashSet<_> = self.sources.keys().copied().collect();
        if datasets != sources {
            return Err(format!(
                "sources of datasets {sources:?} kept for the jobs' datasets {datasets:?}"
            ));
        }
        Ok(())
    }

    /// Cached keys: `by_slot` is their inverse, and (until shutdown, which drops the slots and
    /// not the policy) the policy tracks exactly them, pinned exactly while used.
    fn check_slots(&self) -> Result<(), String> {
        if self.by_slot.len() != self.slots.len() {
            return Err(format!(
                "{} slots mapped back for {} cached keys",
                self.by_slot.len(),
                self.slots.len()
            ));
        }
        for (&key, e) in &self.slots {
            if self.by_slot.get(&e.slot.slot) != Some(&(e.slot, key)) {
                return Err(format!("key {key:#x}: its slot does not map back to it"));
            }
            if self.writer.is_none() {
                continue;
            }
            if !self.policy.contains(key.raw()) {
                return Err(format!("key {key:#x} is cached but not in the policy"));
            }
            if self.policy.is_pinned(key.raw()) != (e.uses() > 0) {
                return Err(format!(
                    "key {key:#x} ({} queued, {} pushed) is {}pinned",
                    e.queued,
                    e.pushed,
                    if e.uses() > 0 { "not " } else { "" }
                ));
            }
        }
        if self.writer.is_some() && self.policy.len() != self.slots.len() {
            return Err(format!(
                "the policy tracks {} keys for {} cached",
                self.policy.len(),
                self.slots.len()
            ));
        }
        Ok(())
    }

    /// A key is in one place at a time; waiting payloads are loading; pending keys are in the
    /// load order; pending and failed keys are referenced.
    fn check_places(&self) -> Result<(), String> {
        for &key in self.loading.keys() {
            if self.slots.contains_key(&key) {
                return Err(format!("key {key:#x} is both cached and loading"));
            }
        }
        for (&key, p) in &self.pending {
            if self.slots.contains_key(&key) || self.loading.contains_key(&key) {
                return Err(format!("pending key {key:#x} is also cached or loading"));
            }
            if p.refs == 0 {
                return Err(format!("pending key {key:#x} is referenced by nobody"));
            }
        }
        for (&key, f) in &self.failed {
            if self.slots.contains_key(&key)
                || self.loading.contains_key(&key)
                || self.pending.contains_key(&key)
            {
                return Err(format!(
                    "failed key {key:#x} is also cached, loading or pending"
                ));
            }
            if f.1 == 0 {
                return Err(format!("failed key {key:#x} is referenced by nobody"));
            }
        }
        if let Some(key) = self.waiting.keys().find(|k| !self.loading.contains_key(k)) {
            return Err(format!("key {key:#x} waits for room but is not loading"));
        }
        let ordered: HashSet<CacheKey> = self.pending_order.iter().copied().collect();
        if let Some(key) = self.pending.keys().find(|k| !ordered.contains(k)) {
            return Err(format!("pending key {key:#x} is not in the load order"));
        }
        Ok(())
    }

    /// The references each key holds are exactly the deliveries of it queued in the rings.
    fn check_references(&self) -> Result<(), String> {
        let mut queued: HashMap<CacheKey, u32> = HashMap::new();
        for rr in self.jobs.values().flat_map(|j| &j.rings) {
            for entry in &rr.queue {
                if let RingRecord::Item { key, .. } = *entry {
                    *queued.entry(key).or_default() += 1;
                }
            }
        }
        let held = self
            .slots
            .iter()
            .map(|(&k, e)| (k, e.queued))
            .chain(self.loading.iter().map(|(&k, l)| (k, l.refs)))
            .chain(self.pending.iter().map(|(&k, p)| (k, p.refs)))
            .chain(self.failed.iter().map(|(&k, f)| (k, f.1)));
        let mut seen = 0;
        for (key, refs) in held {
            let want = queued.get(&key).copied().unwrap_or(0);
            if refs != want {
                return Err(format!(
                    "key {key:#x} holds {refs} references for {want} queued deliveries"
                ));
            }
            seen += usize::from(want > 0);
        }
        if seen != queued.len() {
            return Err(format!(
                "{} keys are queued in rings, {seen} of them cached, loading, pending or failed",
                queued.len()
            ));
        }
        Ok(())
    }

    /// Each ring's shadow and ready prefix; the slots' pushed counts against the records
    /// outstanding in the rings.
    fn check_rings(&self) -> Result<(), String> {
        let (mut outstanding, mut pinned) = (0u64, 0u64);
        for (id, job) in &self.jobs {
            for (rank, rr) in job.rings.iter().enumerate() {
                let at = format!("job {id} rank {rank}");
                if rr.acked != rr.ring.acked() || rr.ring.acked() > rr.ring.pushed() {
                    return Err(format!(
                        "{at}: acknowledged {} (the ring says {}) of {} pushed",
                        rr.acked,
                        rr.ring.acked(),
                        rr.ring.pushed()
                    ));
                }
                if rr.shadow.len() as u64 != rr.ring.pushed() - rr.acked {
                    return Err(format!(
                        "{at}: {} shadow flags for {} records outstanding",
                        rr.shadow.len(),
                        rr.ring.pushed() - rr.acked
                    ));
                }
                if rr.ready > rr.queue.len()
                    || rr.ready_items > rr.ready
                    || rr.ready_items > job.batch as usize
                {
                    return Err(format!(
                        "{at}: a ready prefix of {} ({} items) in a queue of {}, batch {}",
                        rr.ready,
                        rr.ready_items,
                        rr.queue.len(),
                        job.batch
                    ));
                }
                if let Some(e) = rr.queue.iter().take(rr.ready).find(|e| !self.is_ready(e)) {
                    return Err(format!("{at}: {e:?} in the ready prefix is not ready"));
                }
                outstanding += rr.shadow.iter().filter(|&&credit| credit).count() as u64;
                pinned += rr.pinned;
            }
        }
        let pushed: u64 = self.slots.values().map(|e| u64::from(e.pushed)).sum();
        if pushed > outstanding {
            return Err(format!(
                "the slots count {pushed} pushed records, the rings {outstanding} outstanding"
            ));
        }
        if self.writer.is_some() && pushed != pinned {
            return Err(format!(
                "the slots count {pushed} pushed records, the rings hold {pinned} data records"
            ));
        }
        Ok(())
    }
}

/// Test-only messages: what the periodic check did, and a way to break an invariant.
#[cfg(test)]
pub(crate) mod probe {
    use actix::prelude::*;

    use super::super::CacheActor;

    pub(crate) use crate::probe::{Inspect, Inspection};

    impl Handler<Inspect> for CacheActor {
        type Result = MessageResult<Inspect>;
        fn handle(&mut self, _: Inspect, _: &mut Context<Self>) -> Self::Result {
            MessageResult(Inspection {
                messages: self.checks.operations(),
                full_checks: self.checks.checks(),
                check: self.check_invariants(),
            })
        }
    }

    /// Leaks a reference (a failed key that no ring has queued), then runs the full check
    /// directly and through the periodic path (messages counted until a check is due), and
    /// takes the leak back. Answers the direct check's result and the periodic check's panic.
    #[derive(Message)]
    #[rtype(result = "(Result<(), String>, Option<String>)")]
    pub(crate) struct LeakReference;

    impl Handler<LeakReference> for CacheActor {
        type Result = MessageResult<LeakReference>;
        fn handle(&mut self, _: LeakReference, _: &mut Context<Self>) -> Self::Result {
            let key = crate::messages::CacheKey::from_raw(u64::MAX);
            self.failed.insert(key, (0, 1));
            let direct = self.check_invariants();
            let panicked = crate::tests::until_panic(|| self.after_message());
            self.failed.remove(&key);
            MessageResult((direct, panicked))
        }
    }
}
