//! Deciding and drawing (Algorithm 1 and 2, and the coupled leaf draws): who takes which
//! merged spine vertex or leaf in a round, and the element each group of jobs receives. See
//! the parent module's docs ("Deciding and sampling") for the rules and why they are uniform.

use rand::RngExt;

use super::DependentSamplingTree;
use crate::sampling::{ElementId, uniform_element};

/// Uniform draws tried before the residual of a coupled leaf draw is computed exactly.
const REJECTION_TRIES: usize = 64;

/// Tests only: the uniform draws a coupled leaf draw tries before its exact fallback (a test
/// sets none, so that every draw that does not take `x` is the fallback's, whose law it then
/// checks), and how many times the fallback ran.
#[cfg(test)]
#[derive(Debug, Clone)]
pub(super) struct Rejection {
    tries: usize,
    fallbacks: u64,
}

#[cfg(test)]
impl Default for Rejection {
    fn default() -> Self {
        Self {
            tries: REJECTION_TRIES,
            fallbacks: 0,
        }
    }
}

/// Where a group of jobs draws its shared element from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Source {
    /// The merged spine vertices `V_lo ..= V_hi`, of total size `len`.
    Spine { lo: usize, hi: usize, len: u64 },
    /// The leaf of the job at this position.
    Leaf(usize),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Group {
    pub(super) source: Source,
    /// Range into the active positions.
    pub(super) first: usize,
    pub(super) end: usize,
}

impl DependentSamplingTree {
    /// Tests only: coupled leaf draws give up the rejection loop at once, so that the exact
    /// fallback draws whatever does not take the first leaf's element.
    #[cfg(test)]
    pub(crate) fn give_up_rejection_at_once(&mut self) {
        self.rejection.tries = 0;
    }

    /// Tests only: how many coupled leaf draws have come from the exact fallback.
    #[cfg(test)]
    pub(crate) fn exact_fallbacks(&self) -> u64 {
        self.rejection.fallbacks
    }

    /// Draws an element uniformly from a source.
    fn draw(&mut self, source: Source) -> ElementId {
        match source {
            Source::Spine { lo, hi, len } => {
                let mut r = self.rng.random_range(0..len);
                for k in lo..=hi {
                    if r < self.spine_len[k] {
                        return uniform_element(&self.spine[k], self.spine_len[k], &mut self.rng);
                    }
                    r -= self.spine_len[k];
                }
                unreachable!("rank beyond the merged vertices' total size")
            }
            Source::Leaf(p) => {
                let job = &self.jobs[p];
                uniform_element(&job.leaf, job.leaf_len, &mut self.rng)
            }
        }
    }

    /// Draws from the leaf of position `b`, maximally coupled with `x`, the element drawn from
    /// the leaf of position `a` in this round: the result is uniform over `L_b` (as an
    /// independent draw would be) and equals `x` with probability `|L_a ∩ L_b| / max(|L_a|,
    /// |L_b|)`, so jobs with identical leaves share their pick. See the module docs.
    fn draw_leaf_coupled(&mut self, a: usize, x: ElementId, b: usize) -> ElementId {
        let (la, lb) = (self.jobs[a].leaf_len, self.jobs[b].leaf_len);
        // Take x with probability min(1, la / lb) when it is in L_b: each y of L_a ∩ L_b gets
        // min(1/la, 1/lb) this way.
        if self.jobs[b].leaf.contains(x) && (la >= lb || self.rng.random_range(0..lb) < la) {
            return x;
        }
        // Otherwise the rest of the uniform distribution over L_b: y outside L_a weighs 1/lb,
        // y in L_a ∩ L_b weighs 1/lb - 1/la when la > lb and nothing otherwise. By rejection
        // from uniform draws over L_b (one draw on average over all rounds), then exactly.
        #[cfg(not(test))]
        let tries = REJECTION_TRIES;
        #[cfg(test)]
        let tries = self.rejection.tries;
        for _ in 0..tries {
            let y = uniform_element(&self.jobs[b].leaf, lb, &mut self.rng);
            if !self.jobs[a].leaf.contains(y) || (la > lb && self.rng.random_range(0..la) >= lb) {
                return y;
            }
        }
        #[cfg(test)]
        {
            self.rejection.fallbacks += 1;
        }
        let (leaf_a, leaf_b) = (&self.jobs[a].leaf, &self.jobs[b].leaf);
        let outside = leaf_b - leaf_a;
        let (n_out, n_in) = (outside.len(), lb - outside.len());
        // Masses in units of 1 / (la · lb): outside la each, inside la - lb each (if la > lb).
        let w_out = n_out * la;
        let w_in = if la > lb { n_in * (la - lb) } else { 0 };
        if self.rng.random_range(0..w_out + w_in) < w_out {
            uniform_element(&outside, n_out, &mut self.rng)
        } else {
            let inside = leaf_b & leaf_a;
            uniform_element(&inside, n_in, &mut self.rng)
        }
    }

    /// Algorithm 1 over the active positions (in `self.active`, ascending): fills `self.groups`.
    pub(super) fn decide(&mut self) {
        self.groups.clear();
        let mut offered_to: Option<usize> = None; // S = V_0 ..= V_s
        let mut s_size = 0u64;
        let mut i = 0;
        while i < self.active.len() {
            let m = self.active[i];
            let lo = offered_to.map_or(0, |s| s + 1);
            let c: u64 = self.spine_len[lo..=m].iter().sum();
            // The chain: the first job takes I with probability c / (|R| - |S|), each next one
            // with (|R_prev| - |S|) / (|R_next| - |S|) given that its predecessor took it.
            let mut k = i;
            let mut prev = c;
            while k < self.active.len() && prev > 0 {
                let denom = self.jobs[self.active[k]].remaining_len - s_size;
                debug_assert!(prev <= denom || k == i, "positions out of order");
                if prev >= denom || self.rng.random_range(0..denom) < prev {
                    prev = denom;
                    k += 1;
                } else {
                    break;
                }
            }
            if k == i {
                self.groups.push(Group {
                    source: Source::Leaf(m),
                    first: i,
                    end: i + 1,
                });
                i += 1;
            } else {
                self.groups.push(Group {
                    source: Source::Spine { lo, hi: m, len: c },
                    first: i,
                    end: k,
                });
                i = k;
            }
            offered_to = Some(m);
            s_size += c;
        }
    }

    /// Draws one element per group of `self.groups` (Algorithm 2), in group order: the first
    /// leaf drawn is uniform, later leaf draws are coupled with it.
    pub(super) fn draw_groups(&mut self) -> Vec<ElementId> {
        self.picked.clear();
        let groups = std::mem::take(&mut self.groups);
        let mut by_group = Vec::with_capacity(groups.len());
        // The first leaf drawn this round: later leaf draws are coupled with it.
        let mut first_leaf: Option<(usize, ElementId)> = None;
        for g in &groups {
            let element = match (g.source, first_leaf) {
                (Source::Leaf(b), Some((a, x))) => self.draw_leaf_coupled(a, x, b),
                (source, _) => self.draw(source),
            };
            if let (Source::Leaf(a), None) = (g.source, first_leaf) {
                first_leaf = Some((a, element));
            }
            by_group.push(element);
        }
        self.groups = groups;
        by_group
    }
}
