//! The tier's index in memory: every stored object's name and length, its last use, and the
//! element it holds for whom (its *owner*, when known), and the admission rule.
//!
//! **Admission** (issue 31): an object some active job has not yet read in its current epoch
//! (a *needed* one) is kept; a new object is admitted into free room, or by evicting objects
//! nobody needs (every job needing it has read it this epoch, or no job needs it), least
//! recently used first; when those do not make room, it is not stored. For one job reading a
//! dataset twice the tier's size in random order, this keeps the objects of the tier until
//! they are read, so every later epoch finds half of its elements there (plain LRU: about an
//! eighth).
//!
//! The search for victims walks from the least recently used end and looks at most
//! [`SCAN`] objects per admission; a needed object met there goes to the recent end (a second
//! chance: it will be read this epoch, which would make it recent anyway). So an admission
//! costs a bounded number of need checks even when everything is needed.

use std::collections::{BTreeMap, HashMap};

/// Objects looked at, at most, to find room for one admission.
pub const SCAN: usize = 256;

#[derive(Debug, Clone)]
struct StoredObject<O> {
    len: u64,
    used: u64,
    owner: Option<O>,
    /// Its file is complete (an admitted object is counted from its admission, and read once
    /// written).
    ready: bool,
}

/// What an admission decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Stored already (its use was noted).
    Present,
    /// Admitted after these objects were evicted (their files must go).
    Yes(Vec<u128>),
    /// Not stored: it is larger than the tier, or no object nobody needs makes room.
    No,
}

/// See the module docs. `O` says whose element an object is (the need check's input).
#[derive(Debug)]
pub struct TierIndex<O> {
    capacity: u64,
    used_bytes: u64,
    clock: u64,
    entries: HashMap<u128, StoredObject<O>>,
    /// Objects by last use, least recent first.
    order: BTreeMap<u64, u128>,
}

impl<O: Clone> TierIndex<O> {
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used_bytes: 0,
            clock: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of the stored objects (files, headers included).
    pub fn bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `name` is stored or being written.
    pub fn contains(&self, name: u128) -> bool {
        self.entries.contains_key(&name)
    }

    /// The bytes `name`'s complete file takes (header included), `None` when it is not ready.
    pub fn ready_len(&self, name: u128) -> Option<u64> {
        self.entries.get(&name).filter(|e| e.ready).map(|e| e.len)
    }

    /// Whether `name`'s file is complete: it may be read.
    pub fn is_ready(&self, name: u128) -> bool {
        self.entries.get(&name).is_some_and(|e| e.ready)
    }

    /// The admitted object `name` is written: it may be read from now on.
    pub fn mark_ready(&mut self, name: u128) {
        if let Some(e) = self.entries.get_mut(&name) {
            e.ready = true;
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Adds an object found at start-up (no owner yet). Returns false, adding nothing, when
    /// it does not fit (the caller deletes its file).
    pub fn restore(&mut self, name: u128, len: u64) -> bool {
        if self.entries.contains_key(&name) || self.used_bytes + len > self.capacity {
            return false;
        }
        self.insert(name, len, None, true);
        true
    }

    fn insert(&mut self, name: u128, len: u64, owner: Option<O>, ready: bool) {
        let used = self.tick();
        self.entries.insert(
            name,
            StoredObject {
                len,
                used,
                owner,
                ready,
            },
        );
        self.order.insert(used, name);
        self.used_bytes += len;
    }

    /// Notes a use of `name` (a read), and whose element it is; false if it is not stored.
    pub fn touch(&mut self, name: u128, owner: Option<O>) -> bool {
        let now = self.tick();
        let Some(e) = self.entries.get_mut(&name) else {
            return false;
        };
        self.order.remove(&e.used);
        e.used = now;
        if owner.is_some() {
            e.owner = owner;
        }
        self.order.insert(now, name);
        true
    }

    /// Says whose element a stored object holds, without counting a use; false if it is
    /// not stored.
    pub fn set_owner(&mut self, name: u128, owner: O) -> bool {
        match self.entries.get_mut(&name) {
            Some(e) => {
                e.owner = Some(owner);
                true
            }
            None => false,
        }
    }

    /// Forgets an object (its file is damaged or gone); returns whether it was stored.
    pub fn remove(&mut self, name: u128) -> bool {
        match self.entries.remove(&name) {
            Some(e) => {
                self.order.remove(&e.used);
                self.used_bytes -= e.len;
                true
            }
            None => false,
        }
    }

    /// Decides whether a new object of `len` bytes is stored, by the rule of the module docs;
    /// `needed` says whether some active job still needs an owner's element this epoch (an
    /// object without an owner is needed by nobody). An admitted object is in the index on
    /// return, not ready: its file is the caller's to write, then [`TierIndex::mark_ready`]
    /// (or [`TierIndex::remove`] if that fails).
    pub fn admit(
        &mut self,
        name: u128,
        len: u64,
        owner: Option<O>,
        mut needed: impl FnMut(&O) -> bool,
    ) -> Admit {
        if self.contains(name) {
            self.touch(name, owner);
            return Admit::Present;
        }
        if len > self.capacity {
            return Admit::No;
        }
        let free = self.capacity - self.used_bytes;
        let mut victims = Vec::new();
        let mut room = free;
        let mut looked = 0;
        let mut again = Vec::new();
        let mut cursor = 0u64;
        while room < len && looked < SCAN.min(self.entries.len()) {
            let Some((&used, &victim)) = self.order.range(cursor..).next() else {
                break;
            };
            cursor = used + 1;
            looked += 1;
            let e = &self.entries[&victim];
            if !e.ready || e.owner.as_ref().is_some_and(&mut needed) {
                again.push(victim);
            } else {
                room += e.len;
                victims.push(victim);
            }
        }
        for v in again {
            self.touch(v, None);
        }
        if room < len {
            return Admit::No;
        }
        for v in &victims {
            self.remove(*v);
        }
        self.insert(name, len, owner, false);
        Admit::Yes(victims)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Admits `name`, its file then written.
    fn admit_written(
        t: &mut TierIndex<u32>,
        name: u128,
        len: u64,
        needed: impl FnMut(&u32) -> bool,
    ) -> Admit {
        let a = t.admit(name, len, Some(name as u32), needed);
        t.mark_ready(name);
        a
    }

    #[test]
    fn free_room_admits_and_the_size_limit_holds() {
        let mut t = TierIndex::<u32>::new(100);
        assert_eq!(t.admit(1, 60, Some(1), |_| false), Admit::Yes(vec![]));
        assert!(t.contains(1) && !t.is_ready(1), "being written");
        assert_eq!(
            t.admit(2, 50, Some(2), |_| false),
            Admit::No,
            "an object being written is no victim"
        );
        t.mark_ready(1);
        assert!(t.is_ready(1));
        assert_eq!(t.admit(1, 60, Some(1), |_| true), Admit::Present);
        assert_eq!(
            t.admit(2, 101, Some(2), |_| false),
            Admit::No,
            "larger than the tier"
        );
        assert_eq!(t.admit(2, 50, Some(2), |_| true), Admit::No, "1 is needed");
        assert_eq!(t.bytes(), 60);
        assert_eq!(admit_written(&mut t, 2, 50, |_| false), Admit::Yes(vec![1]));
        assert_eq!(t.bytes(), 50);
        assert!(!t.contains(1));
    }

    #[test]
    fn victims_are_the_least_recently_used_of_the_unneeded() {
        let mut t = TierIndex::<u32>::new(30);
        for n in 1..=3 {
            assert_eq!(admit_written(&mut t, n, 10, |_| false), Admit::Yes(vec![]));
        }
        t.touch(1, None);
        // 2 is needed, 3 is the least recently used of the rest.
        assert_eq!(
            admit_written(&mut t, 4, 10, |o| *o == 2),
            Admit::Yes(vec![3])
        );
        // Objects without an owner (found at start-up) are needed by nobody.
        assert!(t.remove(4));
        assert!(t.restore(5, 10));
        assert_eq!(
            admit_written(&mut t, 6, 10, |o| *o != 5),
            Admit::Yes(vec![5])
        );
    }

    /// One job reads a dataset twice the tier's size in random order, epoch after epoch: the
    /// rule keeps about half of every later epoch in the tier; plain LRU (everything
    /// evictable) keeps about an eighth.
    #[test]
    fn one_job_on_twice_the_tier_hits_half_of_later_epochs() {
        let (n, tier) = (2000u32, 1000u64);
        let rate = |rule: bool| {
            let mut t = TierIndex::<u32>::new(tier);
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let (mut hits, mut reads) = (0u64, 0u64);
            for epoch in 0..6 {
                let mut order: Vec<u32> = (0..n).collect();
                for i in (1..order.len()).rev() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    order.swap(i, (state % (i as u64 + 1)) as usize);
                }
                let mut read = HashSet::new();
                for e in order {
                    read.insert(e);
                    let name = u128::from(e);
                    let hit = t.touch(name, Some(e));
                    if epoch >= 1 {
                        reads += 1;
                        hits += u64::from(hit);
                    }
                    if !hit && t.admit(name, 1, Some(e), |o| rule && !read.contains(o)) != Admit::No
                    {
                        t.mark_ready(name);
                    }
                    assert!(t.bytes() <= tier);
                }
            }
            hits as f64 / reads as f64
        };
        let (with_rule, lru) = (rate(true), rate(false));
        assert!(with_rule >= 0.45, "rule: {with_rule}");
        assert!(lru < 0.2, "lru: {lru}");
    }
}
