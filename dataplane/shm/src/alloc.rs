//! Server-private allocator of the data arena.
//!
//! Best fit with immediate coalescing over 64-byte granules. Free blocks are
//! indexed twice: by offset (to merge with neighbours on free) and by
//! `(size, offset)` (to find the smallest block that fits, lowest address
//! first). Both operations are `O(log n)` in the number of free blocks.
//!
//! Fragmentation bounds: internal fragmentation is below one granule (63
//! bytes) per allocation; no two free blocks are ever adjacent (coalescing),
//! so the number of free blocks is at most the number of live allocations
//! plus one. For a cache of decoded images that are mostly of one size
//! (resized by the shared pipeline), best fit reuses a freed block of the
//! same size exactly, so external fragmentation stays near zero; for mixed
//! sizes best fit is the classic policy with the lowest measured
//! fragmentation (Johnstone & Wilson). `Full` is returned, never a panic,
//! and carries the free total and the largest block so the cache can decide
//! whether evicting helps.
//!
//! The allocator's state never lives in shared memory: clients cannot
//! corrupt it.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::layout::ARENA_GRANULE;

/// Counters describing the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Arena size in bytes.
    pub size: u64,
    /// Free bytes.
    pub free: u64,
    /// Largest free block in bytes (the largest allocation that can succeed).
    pub largest_free: u64,
    /// Number of free blocks.
    pub free_blocks: usize,
    /// Number of live allocations.
    pub allocations: usize,
}

/// Best-fit allocator with coalescing over `[0, size)`.
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    size: u64,
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    free: u64,
    allocations: usize,
}

impl Arena {
    pub(crate) fn new(size: u64) -> Arena {
        let size = size / ARENA_GRANULE * ARENA_GRANULE;
        let mut a = Arena {
            size,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free: 0,
            allocations: 0,
        };
        if size > 0 {
            a.insert(0, size);
        }
        a
    }

    /// Bytes actually reserved for a request of `len` bytes.
    pub(crate) fn rounded(len: u64) -> u64 {
        len.max(1).div_ceil(ARENA_GRANULE) * ARENA_GRANULE
    }

    fn insert(&mut self, off: u64, len: u64) {
        self.by_offset.insert(off, len);
        self.by_size.insert((len, off));
        self.free += len;
    }

    fn remove(&mut self, off: u64, len: u64) {
        self.by_offset.remove(&off);
        self.by_size.remove(&(len, off));
        self.free -= len;
    }

    /// Allocates `len` bytes; returns the offset of a block of `rounded(len)` bytes.
    pub(crate) fn alloc(&mut self, len: u64) -> Result<u64> {
        let need = Self::rounded(len);
        let Some(&(blen, boff)) = self.by_size.range((need, 0)..).next() else {
            return Err(Error::Full {
                requested: need,
                free: self.free,
                largest: self.largest_free(),
            });
        };
        self.remove(boff, blen);
        if blen > need {
            self.insert(boff + need, blen - need);
        }
        self.allocations += 1;
        Ok(boff)
    }

    /// Frees a block returned by `alloc(len)`.
    pub(crate) fn free(&mut self, off: u64, len: u64) {
        let mut off = off;
        let mut len = Self::rounded(len);
        debug_assert!(off + len <= self.size);
        if let Some((&poff, &plen)) = self.by_offset.range(..off).next_back() {
            debug_assert!(poff + plen <= off, "double free or overlap at {off}");
            if poff + plen == off {
                self.remove(poff, plen);
                off = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = self.by_offset.get(&(off + len)) {
            self.remove(off + len, nlen);
            len += nlen;
        }
        self.insert(off, len);
        self.allocations -= 1;
    }

    pub(crate) fn largest_free(&self) -> u64 {
        self.by_size.iter().next_back().map_or(0, |&(l, _)| l)
    }

    pub(crate) fn stats(&self) -> ArenaStats {
        ArenaStats {
            size: self.size,
            free: self.free,
            largest_free: self.largest_free(),
            free_blocks: self.by_offset.len(),
            allocations: self.allocations,
        }
    }

    #[cfg(test)]
    fn check(&self) {
        let mut prev_end = None;
        let mut total = 0;
        for (&off, &len) in &self.by_offset {
            assert!(len > 0 && off % ARENA_GRANULE == 0 && len % ARENA_GRANULE == 0);
            assert!(self.by_size.contains(&(len, off)));
            if let Some(e) = prev_end {
                assert!(off > e, "adjacent or overlapping free blocks at {off}");
            }
            prev_end = Some(off + len);
            total += len;
        }
        assert!(prev_end.unwrap_or(0) <= self.size);
        assert_eq!(total, self.free);
        assert_eq!(self.by_size.len(), self.by_offset.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_is_an_error_with_numbers() {
        let mut a = Arena::new(1024);
        let x = a.alloc(1000).unwrap();
        assert_eq!(x, 0);
        match a.alloc(1) {
            Err(Error::Full {
                requested,
                free,
                largest,
            }) => {
                assert_eq!((requested, free, largest), (64, 0, 0));
            }
            other => panic!("{other:?}"),
        }
        a.free(x, 1000);
        assert_eq!(a.stats().free, 1024);
        assert_eq!(a.stats().free_blocks, 1);
    }

    #[test]
    fn best_fit_prefers_the_smallest_hole() {
        let mut a = Arena::new(64 * 10);
        let b: Vec<u64> = (0..5)
            .map(|i| a.alloc(if i % 2 == 0 { 64 } else { 128 }).unwrap())
            .collect();
        // holes: free b[1] (128 bytes) and b[3] (128 bytes) and b[0] (64 bytes)
        a.free(b[0], 64);
        a.free(b[3], 128);
        let got = a.alloc(64).unwrap();
        assert_eq!(got, b[0], "64-byte request fills the 64-byte hole");
        a.check();
    }

    proptest! {
        #[test]
        fn random_alloc_free_keeps_invariants(ops in proptest::collection::vec((any::<bool>(), 1u64..5000, any::<prop::sample::Index>()), 1..300)) {
            let size = 64 * 1024;
            let mut a = Arena::new(size);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (is_alloc, len, idx) in ops {
                if is_alloc || live.is_empty() {
                    match a.alloc(len) {
                        Ok(off) => {
                            let r = Arena::rounded(len);
                            prop_assert!(off + r <= size);
                            for &(o, l) in &live {
                                let lr = Arena::rounded(l);
                                prop_assert!(off + r <= o || o + lr <= off, "overlap");
                            }
                            live.push((off, len));
                        }
                        Err(Error::Full { requested, largest, .. }) => {
                            prop_assert!(largest < requested);
                        }
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                } else {
                    let (off, len) = live.swap_remove(idx.index(live.len()));
                    a.free(off, len);
                }
                a.check();
                let used: u64 = live.iter().map(|&(_, l)| Arena::rounded(l)).sum();
                prop_assert_eq!(used + a.stats().free, size);
                prop_assert!(a.stats().free_blocks <= live.len() + 1);
            }
            for (off, len) in live.drain(..) {
                a.free(off, len);
            }
            prop_assert_eq!(a.stats().free_blocks, 1);
            prop_assert_eq!(a.stats().largest_free, size);
        }
    }
}
