//! Placement of a multi-node job's sampled elements on nodes (seed 000, §E.4): the leader
//! samples a job's epoch (a uniform permutation, DSA across every job of the dataset) and
//! sends each element to one node, where the follower loads it once for every job placed
//! there.
//!
//! **Hashing twice.** The first hash places an element over *all* the nodes of the cluster, so
//! that every job wanting the element is sent to the same node; if that node runs no rank of
//! the job, the second hash places it over the job's own nodes. Both hashes are rendezvous
//! (highest random weight) hashes with one weight per (node, element): the second hash is then
//! the job's node of highest weight, and two jobs on node sets `S1`, `S2` receive an element on
//! the same node exactly when the highest-weight node of `S1 ∪ S2` lies in `S1 ∩ S2`, with
//! probability `|S1 ∩ S2| / |S1 ∪ S2|` over elements (1 for jobs on the same nodes). A
//! weight is a 64-bit mix (splitmix64's finalizer) of the node's name hash and the element id:
//! a few arithmetic operations, no crate needed.
//!
//! **Equal counts per rank** ([`EpochPlacer`]). `DistributedSampler` gives each of `W` ranks
//! `⌈N/W⌉` elements of an `N`-element epoch (the permutation padded with its own first
//! elements) or `⌊N/W⌋` with `drop_last` (its tail dropped): a DDP rank that received fewer
//! would wait forever at the next collective. Each node of the job has a quota of its ranks
//! times that count. An element goes to its hashed node while that node has quota left,
//! otherwise to the job's node of highest weight that still has some (an overflow); once
//! every quota is full, the rest of the epoch is dropped (`drop_last`). At the end of the
//! epoch, nodes below quota are padded with the epoch's first elements, in order. Within a
//! node, positions are numbered 0, 1, … in arrival order and a node's local rank `r` receives
//! the positions `≡ r (mod local ranks)`: every rank receives exactly its count.

/// A node's key for hashing: FNV-1a of its name (stable across processes and versions).
pub fn node_key(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// splitmix64's finalizer: a bijective 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rendezvous weight of `node` (a [`node_key`]) for `element`.
pub fn weight(node: u64, element: u32) -> u64 {
    mix(node ^ mix(u64::from(element).wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// The node of highest weight for `element` among `nodes` (keys); `None` if there is none.
pub fn rendezvous(nodes: &[u64], element: u32) -> Option<usize> {
    (0..nodes.len()).max_by_key(|&i| (weight(nodes[i], element), nodes[i]))
}

/// Hashing twice: the index into `job_nodes` of the node `element` goes to for a job on
/// `job_nodes`, given every node of the cluster `all_nodes` (keys). The first hash over all
/// nodes wins when the job has a rank there; otherwise the second, over the job's nodes.
pub fn place(all_nodes: &[u64], job_nodes: &[u64], element: u32) -> Option<usize> {
    if let Some(first) = rendezvous(all_nodes, element)
        && let Some(i) = job_nodes.iter().position(|&n| n == all_nodes[first])
    {
        return Some(i);
    }
    rendezvous(job_nodes, element)
}

/// Elements each rank receives per epoch, as `DistributedSampler` counts them.
pub fn per_rank(n: u64, world: u32, drop_last: bool) -> u64 {
    let w = u64::from(world.max(1));
    if drop_last { n / w } else { n.div_ceil(w) }
}

/// Where an element goes: a node of the job (an index into its nodes) and its position in
/// that node's share of the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub node: usize,
    pub position: u32,
    pub element: u32,
}

/// One multi-node job's placement, epoch after epoch (see the module docs).
#[derive(Debug, Clone)]
pub struct EpochPlacer {
    /// The job's nodes (keys) and how many ranks each runs.
    nodes: Vec<u64>,
    ranks: Vec<u32>,
    /// Elements per rank in this epoch, and in a whole one (they differ in the rest of a
    /// resumed epoch).
    quota_per_rank: u64,
    whole_per_rank: u64,
    drop_last: bool,
    /// Elements placed on each node this epoch.
    filled: Vec<u64>,
    /// The epoch's first elements, in order (padding repeats them).
    first: Vec<u32>,
    keep_first: usize,
}

impl EpochPlacer {
    /// A job of `n` elements per epoch on `nodes` (keys), node `i` running `ranks[i]` ranks.
    pub fn new(n: u64, nodes: Vec<u64>, ranks: Vec<u32>, drop_last: bool) -> Self {
        assert_eq!(nodes.len(), ranks.len(), "one rank count per node");
        let world: u32 = ranks.iter().sum();
        let quota_per_rank = per_rank(n, world, drop_last);
        let len = nodes.len();
        Self {
            nodes,
            ranks,
            quota_per_rank,
            whole_per_rank: quota_per_rank,
            drop_last,
            filled: vec![0; len],
            first: Vec::new(),
            keep_first: world as usize,
        }
    }

    /// A job resumed in the middle of an epoch with `left` elements of it to deliver: each
    /// rank receives its `DistributedSampler` count of that rest in this epoch, then of whole
    /// epochs.
    pub fn resumed(mut self, left: u64) -> Self {
        let world: u32 = self.ranks.iter().sum();
        self.quota_per_rank = per_rank(left, world, self.drop_last);
        self
    }

    /// Takes up the epoch under way where a previous placer of the same job left it (a
    /// leader that restarted): `filled[i]` records already placed on node `i` this epoch (its
    /// positions `0..filled[i]`), `first` elements of the epoch already placed (padding
    /// repeats them). Assignments go on at the next position of each node, within the same
    /// quotas.
    pub fn restore(&mut self, filled: &[u64], first: &[u32]) {
        for (f, &n) in self.filled.iter_mut().zip(filled) {
            *f = n;
        }
        self.first = first.iter().copied().take(self.keep_first).collect();
    }

    /// The job's nodes (keys).
    pub fn nodes(&self) -> &[u64] {
        &self.nodes
    }

    /// Elements each rank receives in this epoch.
    pub fn per_rank(&self) -> u64 {
        self.quota_per_rank
    }

    fn quota(&self, i: usize) -> u64 {
        u64::from(self.ranks[i]) * self.quota_per_rank
    }

    /// Places the next element of the epoch; `None`: every quota is full (`drop_last`'s tail).
    pub fn assign(&mut self, all_nodes: &[u64], element: u32) -> Option<Placed> {
        if self.first.len() < self.keep_first {
            self.first.push(element);
        }
        let hashed = place(all_nodes, &self.nodes, element)?;
        let node = if self.filled[hashed] < self.quota(hashed) {
            hashed
        } else {
            // Overflow: the job's node of highest weight with quota left.
            (0..self.nodes.len())
                .filter(|&i| self.filled[i] < self.quota(i))
                .max_by_key(|&i| (weight(self.nodes[i], element), self.nodes[i]))?
        };
        let position = self.filled[node] as u32;
        self.filled[node] += 1;
        Some(Placed {
            node,
            position,
            element,
        })
    }

    /// Where [`Self::assign`] would place `element` if it were placed now, without placing it
    /// (a guess for fetching its bytes ahead on that node: quotas fill meanwhile, so near an
    /// epoch's end an overflow may send it elsewhere); `None`: every quota is full.
    pub fn guess(&self, all_nodes: &[u64], element: u32) -> Option<usize> {
        let hashed = place(all_nodes, &self.nodes, element)?;
        if self.filled[hashed] < self.quota(hashed) {
            return Some(hashed);
        }
        (0..self.nodes.len())
            .filter(|&i| self.filled[i] < self.quota(i))
            .max_by_key(|&i| (weight(self.nodes[i], element), self.nodes[i]))
    }

    /// Ends the epoch: the padding that brings every node to its quota (the epoch's first
    /// elements again, in order), then a fresh epoch.
    pub fn end_epoch(&mut self) -> Vec<Placed> {
        let mut pad = Vec::new();
        let mut next = 0usize;
        for node in 0..self.nodes.len() {
            while self.filled[node] < self.quota(node) && !self.first.is_empty() {
                pad.push(Placed {
                    node,
                    position: self.filled[node] as u32,
                    element: self.first[next % self.first.len()],
                });
                next += 1;
                self.filled[node] += 1;
            }
        }
        self.filled.iter_mut().for_each(|f| *f = 0);
        self.first.clear();
        self.quota_per_rank = self.whole_per_rank;
        pad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{SeedableRng, rngs::Xoshiro256PlusPlus as StdRng};
    use std::collections::BTreeMap;

    fn keys(names: &[&str]) -> Vec<u64> {
        names.iter().map(|n| node_key(n)).collect()
    }

    /// A placer restored in the middle of an epoch (a leader that restarted) with the records
    /// each node had received goes on at their next positions: every rank still receives
    /// exactly its count of the epoch, and each node's positions run `0..` without a gap.
    #[test]
    fn a_restored_placer_completes_the_epoch_exactly() {
        let all = keys(&["a", "b", "c"]);
        for drop_last in [false, true] {
            for cut in [0usize, 1, 17, 40, 99] {
                let (n, ranks) = (100u32, vec![2u32, 1, 3]);
                let mut rng = StdRng::seed_from_u64(cut as u64);
                let mut order: Vec<u32> = (0..n).collect();
                order.shuffle(&mut rng);
                let mut before =
                    EpochPlacer::new(u64::from(n), all.clone(), ranks.clone(), drop_last);
                let placed: Vec<Placed> = order[..cut]
                    .iter()
                    .filter_map(|&e| before.assign(&all, e))
                    .collect();
                let mut filled = vec![0u64; 3];
                for p in &placed {
                    filled[p.node] = filled[p.node].max(u64::from(p.position) + 1);
                }
                let first: Vec<u32> = placed.iter().map(|p| p.element).collect();
                let mut after =
                    EpochPlacer::new(u64::from(n), all.clone(), ranks.clone(), drop_last);
                after.restore(&filled, &first);
                let mut rest: Vec<Placed> = order[cut..]
                    .iter()
                    .filter_map(|&e| after.assign(&all, e))
                    .collect();
                rest.extend(after.end_epoch());
                let mut per_rank: BTreeMap<(usize, u32), usize> = BTreeMap::new();
                let mut positions: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
                for p in placed.iter().chain(&rest) {
                    *per_rank
                        .entry((p.node, p.position % ranks[p.node]))
                        .or_default() += 1;
                    positions.entry(p.node).or_default().push(p.position);
                }
                let want = per_rank_count(n, 6, drop_last) as usize;
                assert!(per_rank.values().all(|&c| c == want), "{per_rank:?}");
                for (node, mut pos) in positions {
                    pos.sort_unstable();
                    let len = pos.len() as u32;
                    assert_eq!(pos, (0..len).collect::<Vec<_>>(), "node {node}");
                }
            }
        }
    }

    /// Every rank receives exactly ⌈N/W⌉ (or ⌊N/W⌋), the ranks' shares together are the epoch
    /// (plus the padding, which repeats its first elements), for N around multiples of W.
    #[test]
    fn every_rank_receives_the_distributed_sampler_count() {
        let all = keys(&["a", "b", "c", "d"]);
        for drop_last in [false, true] {
            for n in [1u32, 5, 6, 7, 11, 12, 13, 100, 997] {
                for ranks in [vec![2u32, 2, 2], vec![1, 3], vec![4]] {
                    let nodes = all[..ranks.len()].to_vec();
                    let world: u32 = ranks.iter().sum();
                    let mut p = EpochPlacer::new(u64::from(n), nodes, ranks.clone(), drop_last);
                    let mut rng = StdRng::seed_from_u64(u64::from(n));
                    for _epoch in 0..3 {
                        let mut order: Vec<u32> = (0..n).collect();
                        order.shuffle(&mut rng);
                        let mut per_rank: BTreeMap<(usize, u32), Vec<u32>> = BTreeMap::new();
                        let mut placed: Vec<Placed> =
                            order.iter().filter_map(|&e| p.assign(&all, e)).collect();
                        let kept = placed.len();
                        placed.extend(p.end_epoch());
                        for x in &placed {
                            let local = x.position % ranks[x.node];
                            per_rank.entry((x.node, local)).or_default().push(x.element);
                        }
                        let want = per_rank_count(n, world, drop_last);
                        if want > 0 {
                            assert_eq!(per_rank.len() as u32, world, "every rank receives");
                        }
                        assert!(
                            per_rank.values().all(|v| v.len() as u64 == want),
                            "{per_rank:?}"
                        );
                        let mut got: Vec<u32> = placed[..kept].iter().map(|x| x.element).collect();
                        got.sort_unstable();
                        if drop_last {
                            // The epoch's first W·⌊N/W⌋ elements, each once.
                            let mut head = order[..(want * u64::from(world)) as usize].to_vec();
                            head.sort_unstable();
                            assert_eq!(got, head);
                        } else {
                            assert_eq!(got, (0..n).collect::<Vec<_>>(), "the whole epoch, once");
                            // The padding repeats the epoch's first elements.
                            for x in &placed[kept..] {
                                assert!(
                                    order[..(world as usize).min(order.len())].contains(&x.element)
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    fn per_rank_count(n: u32, w: u32, drop_last: bool) -> u64 {
        per_rank(u64::from(n), w, drop_last)
    }

    /// Jobs on the same nodes place every element on the same node; jobs on different node
    /// sets agree with probability |S1 ∩ S2| / |S1 ∪ S2|.
    #[test]
    fn hashing_twice_meets_on_the_same_node() {
        let all = keys(&["n1", "n2", "n3", "n4", "n5"]);
        let same = (0..10_000u32)
            .filter(|&e| {
                place(&all, &all[..3], e).map(|i| all[i])
                    == place(&all, &all[..3], e).map(|i| all[i])
            })
            .count();
        assert_eq!(same, 10_000);
        // The paper's example: [n1..n4] and [n2..n5]: |∩| / |∪| = 3/5.
        let (s1, s2) = (&all[..4], &all[1..]);
        let agree = (0..100_000u32)
            .filter(|&e| s1[place(&all, s1, e).unwrap()] == s2[place(&all, s2, e).unwrap()])
            .count() as f64
            / 100_000.0;
        assert!((agree - 0.6).abs() < 0.01, "agreement {agree}");
        // A job's elements spread evenly over its nodes: counts within 5 sigma of N/k.
        let mut count = [0u32; 4];
        for e in 0..100_000u32 {
            count[place(&all, s1, e).unwrap()] += 1;
        }
        for c in count {
            assert!(
                (f64::from(c) - 25_000.0).abs() < 5.0 * (100_000.0f64 * 0.25 * 0.75).sqrt(),
                "{count:?}"
            );
        }
    }

    /// Under hash placement a node receives (nearly) the same elements every epoch (those
    /// hashed to it; only overflows move), and which of its ranks receives one is uniform.
    #[test]
    fn a_nodes_share_is_stable_and_its_ranks_split_it_uniformly() {
        let all = keys(&["a", "b", "c"]);
        let n = 600u32;
        let mut p = EpochPlacer::new(u64::from(n), all.clone(), vec![2, 2, 2], false);
        let mut rng = StdRng::seed_from_u64(7);
        let epochs = 2000;
        // (element, node) placements and element 0's local rank counts.
        let mut on_hashed = 0u64;
        let mut rank_of_0 = [0u32; 2];
        for _ in 0..epochs {
            let mut order: Vec<u32> = (0..n).collect();
            order.shuffle(&mut rng);
            for &e in &order {
                let x = p.assign(&all, e).unwrap();
                if Some(x.node) == place(&all, &all, e) {
                    on_hashed += 1;
                }
                if e == 0 {
                    rank_of_0[(x.position % 2) as usize] += 1;
                }
            }
            p.end_epoch();
        }
        let frac = on_hashed as f64 / f64::from(n * epochs);
        assert!(frac > 0.9, "only {frac} of placements on the hashed node");
        // Element 0's local rank: binomial(2000, 1/2), within 4 sigma (seeded).
        let dev = (f64::from(rank_of_0[0]) - 1000.0).abs();
        assert!(dev < 4.0 * (2000.0f64 * 0.25).sqrt(), "{rank_of_0:?}");
    }

    /// A resumed epoch's rest is shared with the rest's count per rank (padded, or its tail
    /// dropped), the epochs after it with the whole epoch's.
    #[test]
    fn a_resumed_epoch_shares_its_rest_then_whole_epochs() {
        let all = keys(&["a", "b", "c"]);
        for drop_last in [false, true] {
            for left in [1u32, 17, 18, 19, 40] {
                let n = 48u32;
                let ranks = vec![2u32, 2];
                let mut p =
                    EpochPlacer::new(u64::from(n), all[..2].to_vec(), ranks.clone(), drop_last)
                        .resumed(u64::from(left));
                let mut rng = StdRng::seed_from_u64(u64::from(left));
                for (epoch, len) in [(0, left), (1, n)] {
                    let mut order: Vec<u32> = (n - len..n).collect();
                    order.shuffle(&mut rng);
                    let mut placed: Vec<Placed> =
                        order.iter().filter_map(|&e| p.assign(&all, e)).collect();
                    let kept = placed.len() as u64;
                    placed.extend(p.end_epoch());
                    let want = per_rank_count(len, 4, drop_last);
                    let mut per: BTreeMap<(usize, u32), u64> = BTreeMap::new();
                    for x in &placed {
                        *per.entry((x.node, x.position % ranks[x.node])).or_default() += 1;
                    }
                    assert!(
                        per.values().all(|&c| c == want),
                        "epoch {epoch} left {left} drop_last {drop_last}: {per:?}"
                    );
                    if !drop_last {
                        assert_eq!(kept, u64::from(len), "the whole rest, once");
                    } else {
                        assert_eq!(kept, want * 4, "the rest's tail dropped");
                    }
                }
            }
        }
    }

    /// The first hash wins whenever the job runs on the element's node of the cluster.
    #[test]
    fn a_guess_is_where_the_element_goes_and_places_nothing() {
        let all = keys(&["a", "b", "c"]);
        let mut p = EpochPlacer::new(100, all.clone(), vec![1, 2, 1], false);
        let mut order: Vec<u32> = (0..100).collect();
        order.shuffle(&mut StdRng::seed_from_u64(7));
        for e in order {
            // Guessed twice: the guess changes nothing.
            let g = p.guess(&all, e);
            assert_eq!(p.guess(&all, e), g);
            assert_eq!(p.assign(&all, e).map(|x| x.node), g, "element {e}");
        }
        // Every quota is full: nothing to guess, as nothing is placed.
        let mut q = EpochPlacer::new(4, all.clone(), vec![1, 1, 1], true);
        for e in 0..3 {
            q.assign(&all, e).unwrap();
        }
        assert_eq!(q.guess(&all, 3), None);
        assert_eq!(q.assign(&all, 3), None);
    }

    #[test]
    fn the_first_hash_wins_on_the_jobs_nodes() {
        let all = keys(&["a", "b", "c"]);
        for e in 0..1000u32 {
            let first = rendezvous(&all, e).unwrap();
            let job = [all[first], all[(first + 1) % 3]];
            assert_eq!(place(&all, &job, e), Some(0));
        }
    }
}
