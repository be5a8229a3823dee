//! Cache replacement policies over cached keys: RefCnt, LRU, FIFO, Random and Clairvoyant.
//!
//! A policy only orders the *evictable* cached keys; the driver (the simulator or the Cache
//! actor) owns the cached data and tells the policy what happens:
//! [`Policy::insert`], [`Policy::hit`], [`Policy::remove`], [`Policy::set_refcount`],
//! [`Policy::set_next_use`], [`Policy::pin`] / [`Policy::unpin`], and asks for a
//! [`Policy::victim`] when it needs room.
//!
//! - **RefCnt** (seed 001 §3.2, appendix §E.3): the reference count of a key is the number of
//!   jobs that still need it in their current epoch; the lowest count is evicted first (ties:
//!   least recently used first).
//! - **Clairvoyant**: the sampler decides a window of rounds ahead, so the driver knows each
//!   cached key's next use within the window; the key used furthest in the future (or not at
//!   all within the window) is evicted first — Bélády's rule within the window (seed 004 §3.1).
//!   Ties (several keys unused within the window) go to the lowest reference count, then to
//!   the least recently used.
//! - **LRU**, **FIFO**, **Random**: the generic policies the paper compares against.
//!
//! A *pinned* key (handed to a job that has not read it yet) is never a victim: pinning takes
//! it out of the candidates until it is unpinned. Keys are `u64` so that the server can combine
//! an element id with its pipeline.

use std::collections::{BTreeSet, HashMap};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// The replacement policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    RefCnt,
    Lru,
    Fifo,
    Random,
    Clairvoyant,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::RefCnt,
        PolicyKind::Lru,
        PolicyKind::Fifo,
        PolicyKind::Random,
        PolicyKind::Clairvoyant,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::RefCnt => "refcnt",
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
            PolicyKind::Random => "random",
            PolicyKind::Clairvoyant => "clairvoyant",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "refcnt" | "refcount" => Ok(PolicyKind::RefCnt),
            "lru" => Ok(PolicyKind::Lru),
            "fifo" => Ok(PolicyKind::Fifo),
            "random" | "rr" => Ok(PolicyKind::Random),
            "clairvoyant" | "belady" => Ok(PolicyKind::Clairvoyant),
            other => Err(format!(
                "unknown cache policy '{other}' (expected refcnt, lru, fifo, random or clairvoyant)"
            )),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    inserted: u64,
    used: u64,
    refcount: u32,
    next_use: Option<u64>,
    pinned: bool,
}

type Rank = (u64, u64, u64);

/// One replacement policy over the keys of one cache; see the module docs.
#[derive(Debug, Clone)]
pub struct Policy {
    kind: PolicyKind,
    entries: HashMap<u64, Tracked>,
    /// Evictable keys by eviction priority (smallest first); unused by Random.
    order: BTreeSet<(Rank, u64)>,
    /// Evictable keys for Random, with each key's index in the vector.
    pool: Vec<u64>,
    pool_index: HashMap<u64, usize>,
    clock: u64,
    rng: Xoshiro256PlusPlus,
}

impl Policy {
    pub fn new(kind: PolicyKind, seed: u64) -> Self {
        Self {
            kind,
            entries: HashMap::new(),
            order: BTreeSet::new(),
            pool: Vec::new(),
            pool_index: HashMap::new(),
            clock: 0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
        }
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Number of keys the policy tracks (pinned or not).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.entries.contains_key(&key)
    }

    /// Number of keys that could be evicted now.
    pub fn evictable(&self) -> usize {
        match self.kind {
            PolicyKind::Random => self.pool.len(),
            _ => self.order.len(),
        }
    }

    fn rank(&self, e: &Tracked) -> Rank {
        match self.kind {
            PolicyKind::Fifo => (e.inserted, 0, 0),
            PolicyKind::Lru => (e.used, 0, 0),
            PolicyKind::RefCnt => (u64::from(e.refcount), e.used, 0),
            PolicyKind::Clairvoyant => (
                u64::MAX - e.next_use.unwrap_or(u64::MAX),
                u64::from(e.refcount),
                e.used,
            ),
            PolicyKind::Random => (0, 0, 0),
        }
    }

    fn add_candidate(&mut self, key: u64, e: Tracked) {
        if self.kind == PolicyKind::Random {
            self.pool_index.insert(key, self.pool.len());
            self.pool.push(key);
        } else {
            let r = self.rank(&e);
            self.order.insert((r, key));
        }
    }

    fn drop_candidate(&mut self, key: u64, e: Tracked) {
        if self.kind == PolicyKind::Random {
            if let Some(i) = self.pool_index.remove(&key) {
                self.pool.swap_remove(i);
                if let Some(&moved) = self.pool.get(i) {
                    self.pool_index.insert(moved, i);
                }
            }
        } else {
            let r = self.rank(&e);
            self.order.remove(&(r, key));
        }
    }

    /// Changes an entry, keeping the candidate order in step.
    fn update(&mut self, key: u64, f: impl FnOnce(&mut Tracked)) {
        let Some(&old) = self.entries.get(&key) else {
            return;
        };
        let mut new = old;
        f(&mut new);
        if !old.pinned {
            self.drop_candidate(key, old);
        }
        if !new.pinned {
            self.add_candidate(key, new);
        }
        self.entries.insert(key, new);
    }

    /// A key entered the cache. `refcount` and `next_use` matter to RefCnt and Clairvoyant.
    /// Inserting a key that is already tracked counts as a hit (its counters are not added
    /// twice).
    pub fn insert(&mut self, key: u64, refcount: u32, next_use: Option<u64>) {
        self.clock += 1;
        let now = self.clock;
        if self.entries.contains_key(&key) {
            self.update(key, |e| {
                e.used = now;
                e.refcount = refcount;
                e.next_use = next_use;
            });
            return;
        }
        let e = Tracked {
            inserted: now,
            used: now,
            refcount,
            next_use,
            pinned: false,
        };
        self.entries.insert(key, e);
        self.add_candidate(key, e);
    }

    /// A cached key was read again.
    pub fn hit(&mut self, key: u64) {
        self.clock += 1;
        let now = self.clock;
        self.update(key, |e| e.used = now);
    }

    /// The key left the cache for another reason than [`Policy::victim`].
    pub fn remove(&mut self, key: u64) {
        if let Some(e) = self.entries.remove(&key)
            && !e.pinned
        {
            self.drop_candidate(key, e);
        }
    }

    pub fn set_refcount(&mut self, key: u64, refcount: u32) {
        self.update(key, |e| e.refcount = refcount);
    }

    pub fn refcount(&self, key: u64) -> Option<u32> {
        self.entries.get(&key).map(|e| e.refcount)
    }

    /// The key's next use (a round number) if it falls within the lookahead window.
    pub fn set_next_use(&mut self, key: u64, next_use: Option<u64>) {
        self.update(key, |e| e.next_use = next_use);
    }

    /// The key's known next use, if any.
    pub fn next_use(&self, key: u64) -> Option<u64> {
        self.entries.get(&key).and_then(|e| e.next_use)
    }

    /// The key must not be evicted until [`Policy::unpin`].
    pub fn pin(&mut self, key: u64) {
        self.update(key, |e| e.pinned = true);
    }

    pub fn unpin(&mut self, key: u64) {
        self.update(key, |e| e.pinned = false);
    }

    pub fn is_pinned(&self, key: u64) -> bool {
        self.entries.get(&key).is_some_and(|e| e.pinned)
    }

    /// Like [`Policy::victim`], also returning the victim's reference count (how many jobs still
    /// needed it in their current epoch), for eviction metrics.
    pub fn victim_with_refcount(&mut self) -> Option<(u64, u32)> {
        let key = self.peek_victim()?;
        let refcount = self.refcount(key).unwrap_or(0);
        self.remove(key);
        Some((key, refcount))
    }

    /// [`Policy::victim_with_refcount`] when its victim is needed by nobody (reference count
    /// 0), else `None` and nothing changes: eviction ahead of need (the Cache keeping room free)
    /// never takes an element some job still needs.
    pub fn unneeded_victim(&mut self) -> Option<u64> {
        let key = self.peek_victim()?;
        if self.refcount(key).unwrap_or(0) > 0 {
            return None;
        }
        self.remove(key);
        Some(key)
    }

    /// Chooses the key to evict and stops tracking it; `None` when every key is pinned.
    pub fn victim(&mut self) -> Option<u64> {
        let key = self.peek_victim()?;
        self.remove(key);
        Some(key)
    }

    /// The key [`Policy::victim`] would evict now (Random draws it, so two peeks may differ).
    fn peek_victim(&mut self) -> Option<u64> {
        let key = if self.kind == PolicyKind::Random {
            if self.pool.is_empty() {
                return None;
            }
            let i = self.rng.random_range(0..self.pool.len());
            self.pool[i]
        } else {
            self.order.first()?.1
        };
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lru_fifo_order() {
        let mut lru = Policy::new(PolicyKind::Lru, 0);
        let mut fifo = Policy::new(PolicyKind::Fifo, 0);
        for p in [&mut lru, &mut fifo] {
            p.insert(1, 0, None);
            p.insert(2, 0, None);
            p.insert(3, 0, None);
            p.hit(1);
        }
        assert_eq!(lru.victim(), Some(2));
        assert_eq!(fifo.victim(), Some(1));
    }

    #[test]
    fn an_unneeded_victim_is_taken_only_when_nobody_needs_it() {
        let mut p = Policy::new(PolicyKind::RefCnt, 0);
        p.insert(10, 2, None);
        p.insert(11, 1, None);
        // The victim (11) is still needed: nothing is taken, nothing forgotten.
        assert_eq!(p.unneeded_victim(), None);
        assert_eq!(p.len(), 2);
        p.set_refcount(11, 0);
        assert_eq!(p.unneeded_victim(), Some(11));
        assert!(!p.contains(11));
        assert_eq!(p.unneeded_victim(), None, "10 is needed");
        p.set_refcount(10, 0);
        p.pin(10);
        assert_eq!(p.unneeded_victim(), None, "a pinned key is never a victim");
    }

    #[test]
    fn refcnt_evicts_lowest_count_never_pinned() {
        let mut p = Policy::new(PolicyKind::RefCnt, 0);
        p.insert(10, 3, None);
        p.insert(11, 1, None);
        p.insert(12, 2, None);
        p.pin(11);
        assert_eq!(p.victim_with_refcount(), Some((12, 2)));
        p.set_refcount(10, 0);
        assert_eq!(p.victim_with_refcount(), Some((10, 0)));
        assert_eq!(p.victim(), None, "only a pinned key is left");
        p.unpin(11);
        assert_eq!(p.victim(), Some(11));
        assert!(p.is_empty());
    }

    #[test]
    fn clairvoyant_evicts_furthest_next_use() {
        let mut p = Policy::new(PolicyKind::Clairvoyant, 0);
        p.insert(1, 5, Some(10));
        p.insert(2, 5, Some(30));
        p.insert(3, 5, Some(20));
        assert_eq!(p.victim(), Some(2));
        p.insert(4, 2, None);
        p.insert(5, 1, None);
        assert_eq!(
            p.victim(),
            Some(5),
            "unused in the window, lowest refcount first"
        );
        assert_eq!(p.victim(), Some(4));
        assert_eq!(p.victim(), Some(3));
    }

    #[test]
    fn reinserting_does_not_double_count() {
        let mut p = Policy::new(PolicyKind::RefCnt, 0);
        p.insert(1, 1, None);
        p.insert(1, 4, None);
        assert_eq!(p.len(), 1);
        assert_eq!(p.evictable(), 1);
        assert_eq!(p.refcount(1), Some(4));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u8),
        Hit(u8),
        Remove(u8),
        Pin(u8),
        Unpin(u8),
        Ref(u8, u8),
        Victim,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..16, 0u8..4).prop_map(|(k, r)| Op::Insert(k, r)),
            (0u8..16).prop_map(Op::Hit),
            (0u8..16).prop_map(Op::Remove),
            (0u8..16).prop_map(Op::Pin),
            (0u8..16).prop_map(Op::Unpin),
            (0u8..16, 0u8..4).prop_map(|(k, r)| Op::Ref(k, r)),
            Just(Op::Victim),
        ]
    }

    proptest! {
        /// Against a model: the victim is tracked, unpinned, and minimal for the policy's
        /// order; counts never drift.
        #[test]
        fn policies_follow_the_model(ops in proptest::collection::vec(op(), 1..200), kind in 0usize..5) {
            let kind = PolicyKind::ALL[kind];
            let mut p = Policy::new(kind, 7);
            // model: key -> (inserted, used, refcount, pinned)
            let mut m: HashMap<u64, (u64, u64, u32, bool)> = HashMap::new();
            let mut clock = 0u64;
            for op in ops {
                match op {
                    Op::Insert(k, r) => {
                        clock += 1;
                        let e = m.entry(u64::from(k)).or_insert((clock, clock, 0, false));
                        e.1 = clock;
                        e.2 = u32::from(r);
                        p.insert(u64::from(k), u32::from(r), None);
                    }
                    Op::Hit(k) => {
                        clock += 1;
                        if let Some(e) = m.get_mut(&u64::from(k)) { e.1 = clock; }
                        p.hit(u64::from(k));
                    }
                    Op::Remove(k) => { m.remove(&u64::from(k)); p.remove(u64::from(k)); }
                    Op::Pin(k) => { if let Some(e) = m.get_mut(&u64::from(k)) { e.3 = true; } p.pin(u64::from(k)); }
                    Op::Unpin(k) => { if let Some(e) = m.get_mut(&u64::from(k)) { e.3 = false; } p.unpin(u64::from(k)); }
                    Op::Ref(k, r) => { if let Some(e) = m.get_mut(&u64::from(k)) { e.2 = u32::from(r); } p.set_refcount(u64::from(k), u32::from(r)); }
                    Op::Victim => {
                        let v = p.victim();
                        let cands: Vec<(u64, (u64, u64, u32, bool))> = m.iter().filter(|(_, e)| !e.3).map(|(k, e)| (*k, *e)).collect();
                        match v {
                            None => prop_assert!(cands.is_empty()),
                            Some(k) => {
                                let e = m.remove(&k).expect("victim must be tracked");
                                prop_assert!(!e.3, "pinned key evicted");
                                let key = |e: &(u64, u64, u32, bool)| match kind {
                                    PolicyKind::Fifo => (e.0, 0),
                                    PolicyKind::Lru => (e.1, 0),
                                    PolicyKind::RefCnt | PolicyKind::Clairvoyant => (u64::from(e.2), e.1),
                                    PolicyKind::Random => (0, 0),
                                };
                                for (_, c) in &cands {
                                    prop_assert!(key(&e) <= key(c), "{kind:?} evicted a non-minimal key");
                                }
                            }
                        }
                    }
                }
                prop_assert_eq!(p.len(), m.len());
                prop_assert_eq!(p.evictable(), m.values().filter(|e| !e.3).count());
            }
        }
    }
}
