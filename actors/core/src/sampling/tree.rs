//! The dependent sampling tree and DSA (seed 001 §3–§4, appendix §B–§C).
//!
//! # Shape
//! Jobs are kept in *positions* `0..n` sorted by the size of their remaining sets `R_j`
//! (ascending; ties keep their current order). Let `T_m = R_m ∩ R_{m+1} ∩ … ∩ R_{n-1}` be the
//! suffix intersections, so `T_0 ⊆ T_1 ⊆ … ⊆ T_{n-1} = R_{n-1}`. The tree stores
//! - the *spine* `V_m = T_m \ T_{m-1}` (`V_0 = T_0` is the root, the intersection of every
//!   dataset; `V_m` for `0 < m < n-1` are the internal vertices; `V_{n-1}` is the largest
//!   job's leaf), and
//! - one *leaf* per job, `L_m = R_m \ T_m`.
//!
//! The path of job `m` is `V_0, …, V_m, L_m` and its vertices partition `R_m`. This is the
//! paper's tree (its Definition 1 read with remaining sets), with one difference that fixes the
//! prototype's known failure: an element shared by a pair of jobs that is not on the spine
//! (`A ∩ C \ B`) is present in the leaf of every job that needs it, so every job's path is
//! exactly its remaining set, for nested and non-nested overlaps alike. The tree also keeps
//! every job's `R_m` explicitly, which makes restructuring a few bitmap operations.
//!
//! # Deciding and sampling (Algorithm 1 and 2)
//! The active jobs are visited in position order. With `S = T_s` the spine prefix already
//! offered and `m` the first undecided active job, the intersection offered is the merged set
//! `I = V_{s+1} ∪ … ∪ V_m` (several vertices when jobs between them are inactive or decided).
//! The first job takes `I` with probability `|I| / (|R_m| - |S|)`, each next job with
//! probability `(|R_prev| - |S|) / (|R_next| - |S|)` given that its predecessor took it (exact
//! integer draws), and the chain stops at the first refusal. If nobody takes `I`, job `m` takes
//! its leaf `L_m = R_m \ S \ I`. Then `S ← S ∪ I` and the loop goes on with the refusing jobs.
//! Jobs that took the same set share one uniform draw from it (united sampling). Jobs that
//! take their leaves draw coupled (an addition to the appendix): the round's first leaf draw
//! `x` is uniform, and each later leaf `L_b` takes `x` with probability `min(1, |L_a|/|L_b|)`
//! when `x ∈ L_b`, otherwise the rest of the uniform law over `L_b` (by rejection, then
//! exactly). Each pick keeps its law, and identical jobs beside a job that differs (their
//! leaves are equal) keep sharing instead of drawing apart. That coupling aside, over all
//! active jobs this is exactly Algorithm 1 + 2 (with the conditional probability written
//! `c ← |D| - |S|`, which is what the appendix's Lemma 1 needs); a masked round (partial
//! sampling) runs the same chain over the active jobs only, on the full tree's vertices, and
//! each job's pick stays uniform over its remaining set (Lemma 2's induction does not depend
//! on which jobs take part).
//!
//! # Updates
//! - A picked element leaves the picker's `R`. Its vertex follows from the set of positions
//!   that still need it (`N`): it lies in `V_k` for the smallest `k` such that all positions
//!   `k..n` are in `N`, and in `L_j` for every `j ∈ N` below that `k`. Moving it accordingly
//!   is the paper's *compensation* (an element taken by one job moves down to the leaves of
//!   the jobs that still need it).
//! - A job whose `R` became smaller than its predecessor's is swapped with it (partial sampling
//!   reorders the tree): only `T` at the swapped position changes, a few bitmap operations.
//! - Insertion (smaller or larger dataset), deletion (the vertex merges with its neighbour) and
//!   the start of a job's next epoch recompute `T` below the highest position that changed.
//!
//! # Randomness
//! The tree has one random stream. It is seeded from the first job's seed, and each later job
//! mixes its seed into it, so a run is reproducible when the same jobs join in the same order
//! and request in the same rounds; any change in cross-job timing changes the orders.
//!
//! Split: this file holds the tree's shape and its updates; `tree/draw.rs` deciding and
//! drawing (Algorithm 1 and 2).

mod draw;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, SeedableRng};
use roaring::RoaringBitmap;

use super::{ElementId, JobEvent, JobKey, JobSpec, KeyMap, Round, Sampler, SamplerError, mix64};
use crate::invariants::Periodic;
use draw::Group;

#[derive(Debug, Clone)]
struct Job {
    key: JobKey,
    dataset: RoaringBitmap,
    dataset_len: u64,
    /// `R`: what the job still needs in its current epoch.
    remaining: RoaringBitmap,
    remaining_len: u64,
    /// `L`: the part of `R` outside the spine.
    leaf: RoaringBitmap,
    leaf_len: u64,
    epoch: u32,
    epochs: Option<u32>,
    /// What joins `dataset` when the job's next epoch starts ([`Sampler::grow_job`]).
    grown: RoaringBitmap,
}

/// The dependent sampling tree; see the module docs.
#[derive(Debug, Clone)]
pub struct DependentSamplingTree {
    jobs: Vec<Job>,
    spine: Vec<RoaringBitmap>,
    spine_len: Vec<u64>,
    position: KeyMap<usize>,
    rng: Xoshiro256PlusPlus,
    seeded: bool,
    /// Rounds sampled, and the full checks run after every 1024th (debug builds; sparse: the
    /// statistical tests build trees by the thousand for a few rounds each, and check them
    /// after every step themselves; see [`crate::invariants`]).
    checks: Periodic,
    // Scratch buffers reused across rounds.
    active: Vec<usize>,
    groups: Vec<Group>,
    picked: Vec<(ElementId, u32)>,
    need: Vec<bool>,
    pickers: Vec<usize>,
    /// Tests only: the rejection tries of a coupled leaf draw, and its exact fallbacks run.
    #[cfg(test)]
    rejection: draw::Rejection,
}

impl Default for DependentSamplingTree {
    fn default() -> Self {
        Self::new()
    }
}

impl DependentSamplingTree {
    pub fn new() -> Self {
        Self {
            jobs: Vec::new(),
            spine: Vec::new(),
            spine_len: Vec::new(),
            position: KeyMap::default(),
            rng: Xoshiro256PlusPlus::seed_from_u64(0),
            seeded: false,
            checks: Periodic::sparse(),
            active: Vec::new(),
            groups: Vec::new(),
            picked: Vec::new(),
            need: Vec::new(),
            pickers: Vec::new(),
            #[cfg(test)]
            rejection: draw::Rejection::default(),
        }
    }

    /// Replaces the random stream (tests draw many independent rounds from one state).
    #[cfg(test)]
    pub(crate) fn reseed(&mut self, seed: u64) {
        self.rng = Xoshiro256PlusPlus::seed_from_u64(mix64(seed));
    }

    /// Full checks run so far (a test reads it to see that they run).
    #[cfg(test)]
    pub(crate) fn full_checks(&self) -> u64 {
        self.checks.checks()
    }

    /// Breaks the tree's definition on purpose: `ids` leave the job's dataset (and not its
    /// remaining set, which is then no longer within it). Sampling goes on unaffected.
    #[cfg(test)]
    pub(crate) fn shrink_dataset(&mut self, key: JobKey, ids: std::ops::Range<ElementId>) {
        let p = self.position[&key];
        self.jobs[p].dataset.remove_range(ids);
    }

    /// Number of registered jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The job keys in tree order (ascending remaining size).
    pub fn order(&self) -> Vec<JobKey> {
        self.jobs.iter().map(|j| j.key).collect()
    }

    /// Recomputes the whole tree from the remaining sets and compares it with the maintained
    /// one (linear in the data: the tests run it after every step, the Sampler actor's debug
    /// builds every so often); returns a description of the first difference.
    fn check_tree(&self) -> Result<(), String> {
        let n = self.jobs.len();
        if self.spine.len() != n || self.spine_len.len() != n {
            return Err(format!(
                "spine has {} vertices for {n} jobs",
                self.spine.len()
            ));
        }
        for (p, j) in self.jobs.iter().enumerate() {
            if self.position.get(&j.key) != Some(&p) {
                return Err(format!("position map is wrong for job {}", j.key));
            }
            if j.remaining.len() != j.remaining_len {
                return Err(format!("job {} remaining_len drifted", j.key));
            }
            if j.leaf.len() != j.leaf_len {
                return Err(format!("job {} leaf_len drifted", j.key));
            }
            if !j.remaining.is_subset(&j.dataset) {
                return Err(format!("job {} remaining is not within its dataset", j.key));
            }
            if p > 0 && self.jobs[p - 1].remaining_len > j.remaining_len {
                return Err(format!("positions {} and {p} are out of order", p - 1));
            }
        }
        let mut t: Option<RoaringBitmap> = None;
        let mut ts = vec![RoaringBitmap::new(); n];
        for m in (0..n).rev() {
            let tm = match &t {
                Some(u) => &self.jobs[m].remaining & u,
                None => self.jobs[m].remaining.clone(),
            };
            ts[m] = tm.clone();
            t = Some(tm);
        }
        for m in 0..n {
            let v = if m == 0 {
                ts[0].clone()
            } else {
                &ts[m] - &ts[m - 1]
            };
            if v != self.spine[m] {
                return Err(format!("spine vertex {m} differs from its definition"));
            }
            if self.spine[m].len() != self.spine_len[m] {
                return Err(format!("spine_len[{m}] drifted"));
            }
            let l = &self.jobs[m].remaining - &ts[m];
            if l != self.jobs[m].leaf {
                return Err(format!("leaf of position {m} differs from its definition"));
            }
        }
        Ok(())
    }

    fn pos(&self, key: JobKey) -> Result<usize, SamplerError> {
        self.position
            .get(&key)
            .copied()
            .ok_or(SamplerError::UnknownJob(key))
    }

    /// Inserts `job` at its sorted position, the vertex of that position starting empty.
    /// Leaves `T` of the higher positions unchanged; the caller rebuilds the prefix.
    fn insert_at_sorted(&mut self, job: Job) -> usize {
        let p = self
            .jobs
            .partition_point(|j| j.remaining_len <= job.remaining_len);
        self.jobs.insert(p, job);
        self.spine.insert(p, RoaringBitmap::new());
        self.spine_len.insert(p, 0);
        p
    }

    /// Takes the job at `p` out; its spine vertex merges into the next one so that the spine
    /// prefixes of the higher positions still union to their `T`.
    fn take_at(&mut self, p: usize) -> Job {
        let v = std::mem::take(&mut self.spine[p]);
        if p + 1 < self.spine.len() {
            self.spine[p + 1] |= v;
            self.spine_len[p + 1] = self.spine[p + 1].len();
        }
        self.spine.remove(p);
        self.spine_len.remove(p);
        self.jobs.remove(p)
    }

    fn reindex(&mut self) {
        self.position.clear();
        for (p, j) in self.jobs.iter().enumerate() {
            self.position.insert(j.key, p);
        }
    }

    /// Recomputes `T_0..=T_hi` from the remaining sets, and with them `V_0..=V_{hi+1}` and
    /// `L_0..=L_hi`. Requires that `V_0 ∪ … ∪ V_{hi+1}` already equals `T_{hi+1}`.
    fn rebuild_prefix(&mut self, hi: usize) {
        let n = self.jobs.len();
        if n == 0 {
            return;
        }
        let hi = hi.min(n - 1);
        let upper: Option<RoaringBitmap> = (hi + 1 < n).then(|| {
            let mut u = RoaringBitmap::new();
            for v in &self.spine[..=hi + 1] {
                u |= v;
            }
            u
        });
        let mut ts: Vec<RoaringBitmap> = Vec::with_capacity(hi + 1);
        for m in (0..=hi).rev() {
            let tm = match ts.last().or(upper.as_ref()) {
                Some(above) => &self.jobs[m].remaining & above,
                None => self.jobs[m].remaining.clone(),
            };
            ts.push(tm);
        }
        ts.reverse();
        for m in 0..=hi {
            let v = if m == 0 {
                ts[0].clone()
            } else {
                &ts[m] - &ts[m - 1]
            };
            self.spine_len[m] = v.len();
            self.spine[m] = v;
            let job = &mut self.jobs[m];
            job.leaf = &job.remaining - &ts[m];
            job.leaf_len = job.leaf.len();
        }
        if let Some(u) = upper {
            let v = u - &ts[hi];
            self.spine_len[hi + 1] = v.len();
            self.spine[hi + 1] = v;
        }
    }

    /// Swaps positions `j` and `j + 1` (the job at `j + 1` became smaller). Only `T_{j+1}`
    /// changes; with `b` moving up and `a` moving down and `X = V_{j+1} ∪ V_{j+2}`:
    /// `V'_{j+1} = L_b ∩ X`, `V'_{j+2} = X \ L_b`, `L'_a = L_a ∪ V_{j+1}`, `L'_b = L_b \ X`.
    /// When `j + 1` is the last position, `X` is everything outside `T_j`: the old last vertex
    /// becomes `a`'s leaf and `b`'s leaf becomes the last vertex.
    fn swap_down(&mut self, j: usize) {
        let n = self.jobs.len();
        if j + 2 == n {
            let old_last = std::mem::take(&mut self.spine[j + 1]);
            let b_leaf = std::mem::take(&mut self.jobs[j].leaf);
            self.spine_len[j + 1] = self.jobs[j].leaf_len;
            self.spine[j + 1] = b_leaf;
            self.jobs[j].leaf_len = 0;
            let a = &mut self.jobs[j + 1];
            a.leaf |= old_last;
            a.leaf_len = a.leaf.len();
        } else {
            let x = &self.spine[j + 1] | &self.spine[j + 2];
            let v1 = &self.jobs[j].leaf & &x;
            let v2 = &x - &v1;
            let old_v1 = std::mem::replace(&mut self.spine[j + 1], v1);
            self.spine_len[j + 1] = self.spine[j + 1].len();
            self.spine[j + 2] = v2;
            self.spine_len[j + 2] = self.spine[j + 2].len();
            let b = &mut self.jobs[j];
            b.leaf -= &x;
            b.leaf_len = b.leaf.len();
            let a = &mut self.jobs[j + 1];
            a.leaf |= old_v1;
            a.leaf_len = a.leaf.len();
        }
        self.jobs.swap(j, j + 1);
        self.position.insert(self.jobs[j].key, j);
        self.position.insert(self.jobs[j + 1].key, j + 1);
    }

    /// Restores the ascending order after remaining sizes shrank (insertion sort by adjacent
    /// swaps; a job only ever moves towards position 0 here).
    fn restore_order(&mut self) {
        for p in 1..self.jobs.len() {
            let mut q = p;
            while q > 0 && self.jobs[q - 1].remaining_len > self.jobs[q].remaining_len {
                self.swap_down(q - 1);
                q -= 1;
            }
        }
    }

    /// Where an element needed by the positions in `need` lives: the spine index (or `n` for
    /// none); it is also in the leaf of every needing position below that index.
    fn spine_index(need: &[bool]) -> usize {
        let mut k = need.len();
        while k > 0 && need[k - 1] {
            k -= 1;
        }
        k
    }

    /// Removes `element` from the remaining sets of the positions in `pickers` and moves it to
    /// the vertices that match the positions that still need it (compensation).
    fn take_element(&mut self, element: ElementId, pickers: &[usize]) {
        let n = self.jobs.len();
        self.need.clear();
        self.need
            .extend(self.jobs.iter().map(|j| j.remaining.contains(element)));
        let old_k = Self::spine_index(&self.need);
        for &p in pickers {
            debug_assert!(self.need[p], "a job picked an element it did not need");
            self.need[p] = false;
            let job = &mut self.jobs[p];
            job.remaining.remove(element);
            job.remaining_len -= 1;
        }
        let new_k = Self::spine_index(&self.need);
        if old_k != new_k {
            if old_k < n && self.spine[old_k].remove(element) {
                self.spine_len[old_k] -= 1;
            }
            if new_k < n && self.spine[new_k].insert(element) {
                self.spine_len[new_k] += 1;
            }
        }
        // Leaves: the element is in L_p iff p needs it and p < k.
        for p in 0..old_k.max(new_k) {
            let was = p < old_k && (self.need[p] || pickers.contains(&p));
            let is = p < new_k && self.need[p];
            if was != is {
                let job = &mut self.jobs[p];
                if is {
                    job.leaf.insert(element);
                    job.leaf_len += 1;
                } else {
                    job.leaf.remove(element);
                    job.leaf_len -= 1;
                }
            }
        }
    }

    /// Starts the next epoch of the job at `p`, or removes it when its budget is spent.
    fn end_epoch(&mut self, p: usize, events: &mut Vec<JobEvent>) {
        let key = self.jobs[p].key;
        let epoch = self.jobs[p].epoch;
        events.push(JobEvent::EpochEnded { job: key, epoch });
        let mut job = self.take_at(p);
        if job.epochs.is_some_and(|e| epoch + 1 >= e) {
            events.push(JobEvent::Finished { job: key });
            self.position.remove(&key);
            self.reindex();
            self.rebuild_prefix(p);
            return;
        }
        job.epoch += 1;
        if !job.grown.is_empty() {
            job.dataset |= std::mem::take(&mut job.grown);
            job.dataset_len = job.dataset.len();
        }
        job.remaining = job.dataset.clone();
        job.remaining_len = job.dataset_len;
        let q = self.insert_at_sorted(job);
        self.reindex();
        self.rebuild_prefix(p.max(q));
    }

    /// The positions of the active jobs (`self.active`), ascending, each once.
    fn activate(&mut self, active: &[JobKey]) -> Result<(), SamplerError> {
        self.active.clear();
        for &key in active {
            let p = self.pos(key)?;
            self.active.push(p);
        }
        self.active.sort_unstable();
        self.active.dedup();
        Ok(())
    }

    /// Writes the round's deliveries: each group's jobs receive its element (coincidences
    /// across groups merge into one group of `out`).
    fn hand_out(&mut self, picks: &[ElementId], out: &mut Round) {
        for (g, &element) in self.groups.iter().zip(picks) {
            out.push_group(
                element,
                self.active[g.first..g.end].iter().map(|&p| {
                    let j = &self.jobs[p];
                    debug_assert!(j.remaining_len > 0, "a job with nothing left is sampled");
                    (j.key, j.epoch, (j.dataset_len - j.remaining_len) as u32)
                }),
            );
        }
    }

    /// Removes the picked elements from the pickers' remaining sets (compensation).
    fn compensate(&mut self, out: &Round) {
        let mut pickers = std::mem::take(&mut self.pickers);
        for range in &out.groups {
            pickers.clear();
            pickers.extend(
                out.deliveries[range.clone()]
                    .iter()
                    .map(|d| self.position[&d.job]),
            );
            self.take_element(out.deliveries[range.start].element, &pickers);
        }
        self.pickers = pickers;
    }

    /// Ends the epochs that are over: a finished job is at position 0 (its remaining set is
    /// empty), after [`Self::restore_order`].
    fn end_epochs(&mut self, events: &mut Vec<JobEvent>) {
        while let Some(job) = self.jobs.first() {
            if job.remaining_len > 0 {
                break;
            }
            self.end_epoch(0, events);
        }
    }
}

impl Sampler for DependentSamplingTree {
    fn insert_job(
        &mut self,
        spec: JobSpec,
        epoch: u32,
        remaining: RoaringBitmap,
    ) -> Result<(), SamplerError> {
        if self.position.contains_key(&spec.key) {
            return Err(SamplerError::DuplicateJob(spec.key));
        }
        if spec.dataset.is_empty() {
            return Err(SamplerError::EmptyDataset(spec.key));
        }
        if spec.epochs == Some(0) {
            return Err(SamplerError::ZeroEpochs(spec.key));
        }
        let seed = if self.seeded {
            mix64(self.rng.next_u64() ^ mix64(spec.seed))
        } else {
            self.seeded = true;
            mix64(spec.seed)
        };
        self.rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let len = spec.dataset.len();
        let job = Job {
            key: spec.key,
            remaining_len: remaining.len(),
            remaining,
            dataset: spec.dataset,
            dataset_len: len,
            leaf: RoaringBitmap::new(),
            leaf_len: 0,
            epoch,
            epochs: spec.epochs,
            grown: RoaringBitmap::new(),
        };
        let p = self.insert_at_sorted(job);
        self.reindex();
        self.rebuild_prefix(p);
        Ok(())
    }

    fn remove_job(&mut self, key: JobKey) -> Result<(), SamplerError> {
        let p = self.pos(key)?;
        self.take_at(p);
        self.reindex();
        self.rebuild_prefix(p);
        Ok(())
    }

    fn grow_job(
        &mut self,
        key: JobKey,
        added: &RoaringBitmap,
    ) -> Result<(u32, RoaringBitmap), SamplerError> {
        let p = self.pos(key)?;
        let job = &mut self.jobs[p];
        job.grown |= added - &job.dataset;
        Ok((job.epoch + 1, &job.dataset | &job.grown))
    }

    fn sample(&mut self, active: &[JobKey], out: &mut Round) -> Result<(), SamplerError> {
        out.clear();
        self.activate(active)?;
        if self.active.is_empty() {
            return Ok(());
        }
        self.decide();
        let picks = self.draw_groups();
        self.hand_out(&picks, out);
        self.compensate(out);
        self.restore_order();
        self.end_epochs(&mut out.events);
        debug_assert!(
            self.position.len() == self.jobs.len() && self.spine.len() == self.jobs.len(),
            "{} positions and {} spine vertices for {} jobs",
            self.position.len(),
            self.spine.len(),
            self.jobs.len()
        );
        if self.checks.count() {
            self.checks
                .verify("dependent sampling tree", self.check_tree());
        }
        Ok(())
    }

    fn remaining(&self, key: JobKey) -> Option<&RoaringBitmap> {
        self.position.get(&key).map(|&p| &self.jobs[p].remaining)
    }

    fn dataset(&self, key: JobKey) -> Option<&RoaringBitmap> {
        self.position.get(&key).map(|&p| &self.jobs[p].dataset)
    }

    fn epoch(&self, key: JobKey) -> Option<u32> {
        self.position.get(&key).map(|&p| self.jobs[p].epoch)
    }

    fn jobs(&self) -> Vec<JobKey> {
        self.order()
    }

    fn need_count(&self, element: ElementId) -> u32 {
        self.jobs
            .iter()
            .filter(|j| j.remaining.contains(element))
            .count() as u32
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.check_tree()
    }
}
