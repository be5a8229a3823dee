//! Test-only: Algorithm 1 (selecting) and Algorithm 2 (sampling) of the appendix, written as
//! literally as possible over explicit sets, and enumerated exactly: the result is the joint
//! distribution of one round's picks. The tree is checked against it. One addition to the
//! appendix, as in the tree: the draws of jobs that select their own set (`D − S − I`) are
//! maximally coupled with the first such draw of the round (each stays uniform over its set).

use std::collections::{BTreeSet, HashMap};

/// Exact distribution of one all-jobs round: `sets[i]` is the remaining set of the i-th job in
/// the order the jobs are considered (ascending size). Maps each outcome (the element picked by
/// each job, in the same order) to its probability.
pub fn exact_round(sets: &[BTreeSet<u32>]) -> HashMap<Vec<u32>, f64> {
    for w in sets.windows(2) {
        assert!(
            w[0].len() <= w[1].len(),
            "the reference needs jobs sorted by size"
        );
    }
    let mut out = HashMap::new();
    let jobs: Vec<usize> = (0..sets.len()).collect();
    select(sets, jobs, BTreeSet::new(), Vec::new(), 1.0, &mut out);
    out
}

/// One loop of Algorithm 1, branching over every outcome of the chain of random choices.
fn select(
    sets: &[BTreeSet<u32>],
    jobs: Vec<usize>,
    s: BTreeSet<u32>,
    chosen: Vec<Chosen>,
    prob: f64,
    out: &mut HashMap<Vec<u32>, f64>,
) {
    if jobs.is_empty() {
        sample(sets.len(), &chosen, prob, out);
        return;
    }
    // Line 5: I = ∩ D_i − S over the remaining jobs.
    let mut inter: BTreeSet<u32> = sets[jobs[0]].clone();
    for &j in &jobs[1..] {
        inter = inter.intersection(&sets[j]).copied().collect();
    }
    let inter: BTreeSet<u32> = inter.difference(&s).copied().collect();
    let new_s: BTreeSet<u32> = s.union(&inter).copied().collect();
    // Lines 7–15: the chain. p_k = c / (|D| − |S|), with c ← |D| − |S| after each acceptance.
    let mut c = inter.len() as f64;
    let mut reach = 1.0; // probability that the first t jobs all accepted
    for t in 0..=jobs.len() {
        let p_accept = if t < jobs.len() {
            let denom = (sets[jobs[t]].len() - s.len()) as f64;
            (c / denom).min(1.0)
        } else {
            0.0
        };
        let branch = reach * (1.0 - p_accept);
        if branch > 0.0 {
            let mut chosen = chosen.clone();
            let rest = if t == 0 {
                // Lines 16–19: the first job selects D[0] − S − I.
                let own: BTreeSet<u32> = sets[jobs[0]].difference(&new_s).copied().collect();
                chosen.push((vec![jobs[0]], own, true));
                jobs[1..].to_vec()
            } else {
                chosen.push((jobs[..t].to_vec(), inter.clone(), false));
                jobs[t..].to_vec()
            };
            select(sets, rest, new_s.clone(), chosen, prob * branch, out);
        }
        if t < jobs.len() {
            reach *= p_accept;
            c = (sets[jobs[t]].len() - s.len()) as f64;
            if reach == 0.0 {
                break;
            }
        }
    }
}

/// The jobs of a group, the subset they selected, and whether it is a job's own set.
type Chosen = (Vec<usize>, BTreeSet<u32>, bool);

/// Algorithm 2: each group of jobs shares one uniform draw from the subset it selected; an own
/// set after the round's first own set is drawn coupled with that first draw.
fn sample(n: usize, chosen: &[Chosen], prob: f64, out: &mut HashMap<Vec<u32>, f64>) {
    fn rec(
        chosen: &[Chosen],
        first_own: Option<(&BTreeSet<u32>, u32)>,
        pick: &mut Vec<u32>,
        prob: f64,
        out: &mut HashMap<Vec<u32>, f64>,
    ) {
        let Some(((jobs, subset, own), rest)) = chosen.split_first() else {
            *out.entry(pick.clone()).or_insert(0.0) += prob;
            return;
        };
        assert!(!subset.is_empty(), "a job selected an empty subset");
        for &e in subset {
            let p = match (own, first_own) {
                (true, Some((a, x))) => coupled(a, x, subset, e),
                _ => 1.0 / subset.len() as f64,
            };
            if p == 0.0 {
                continue;
            }
            for &j in jobs {
                pick[j] = e;
            }
            let first = match (own, first_own) {
                (true, None) => Some((subset, e)),
                _ => first_own,
            };
            rec(rest, first, pick, prob * p, out);
        }
    }
    let mut pick = vec![u32::MAX; n];
    rec(chosen, None, &mut pick, prob, out);
}

/// P(y | x) of the maximal coupling of uniform draws over `b` with a uniform draw `x` over `a`:
/// y = x with probability min(1, |a| / |b|) when x is in b, otherwise y follows the rest of the
/// uniform distribution over b.
fn coupled(a: &BTreeSet<u32>, x: u32, b: &BTreeSet<u32>, y: u32) -> f64 {
    let (la, lb) = (a.len() as f64, b.len() as f64);
    let accept = |e: u32| {
        if b.contains(&e) && a.contains(&e) {
            (la / lb).min(1.0)
        } else {
            0.0
        }
    };
    // The rest: what uniform over b still needs once the coupled part is given.
    let rest = |e: u32| 1.0 / lb - accept(e) / la;
    let rest_total: f64 = b.iter().map(|&e| rest(e)).sum();
    let mut p = 0.0;
    if y == x {
        p += accept(x);
    }
    let miss = 1.0 - accept(x);
    if miss > 0.0 && rest_total > 1e-15 {
        p += miss * rest(y) / rest_total;
    }
    p
}
