//! Test-only: Algorithm 1 (selecting) and Algorithm 2 (sampling) of the appendix, written as
//! literally as possible over explicit sets, and enumerated exactly in rational arithmetic: the
//! result is the joint distribution of one round's picks. The tree is checked against it, and
//! it is checked itself: every job's marginal must be exactly uniform over its remaining set.
//! One addition to the appendix, as in the tree: the draws of jobs that select their own set
//! (`D − S − I`) are maximally coupled with the first such draw of the round (each stays
//! uniform over its set).

use std::collections::{BTreeSet, HashMap};
use std::ops::{Add, Div, Mul, Sub};

/// Exact distribution of one all-jobs round: `sets[i]` is the remaining set of the i-th job in
/// the order the jobs are considered (ascending size). Maps each outcome (the element picked by
/// each job, in the same order) to its probability.
pub fn exact_round(sets: &[BTreeSet<u32>]) -> HashMap<Vec<u32>, f64> {
    exact_round_with(sets, coupled)
        .outcomes
        .into_iter()
        .map(|(k, p)| (k, p.to_f64()))
        .collect()
}

/// `P(y | x)` for a draw over the own set `b` coupled with the draw `x` over the round's first
/// own set `a`.
pub type Coupling = fn(a: &BTreeSet<u32>, x: u32, b: &BTreeSet<u32>, y: u32) -> Ratio;

/// One round enumerated exactly.
pub struct Enumeration {
    /// Each outcome (the element picked by each job) and its probability.
    pub outcomes: HashMap<Vec<u32>, Ratio>,
    /// Every coupled draw some outcome goes through: which cases of the coupling the round
    /// exercises.
    pub coupled: BTreeSet<CoupledDraw>,
}

/// The sizes of a coupled draw over `b` beside the first own draw, over `a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CoupledDraw {
    /// `|a|`
    pub a: usize,
    /// `|b|`
    pub b: usize,
    /// `|a ∩ b|`
    pub both: usize,
    /// `|b \ a|`
    pub b_only: usize,
}

/// [`exact_round`] in exact arithmetic, with the own-set draws coupled by `coupling`.
pub fn exact_round_with(sets: &[BTreeSet<u32>], coupling: Coupling) -> Enumeration {
    for w in sets.windows(2) {
        assert!(
            w[0].len() <= w[1].len(),
            "the reference needs jobs sorted by size"
        );
    }
    let mut out = Enumeration {
        outcomes: HashMap::new(),
        coupled: BTreeSet::new(),
    };
    let jobs: Vec<usize> = (0..sets.len()).collect();
    let ctx = (sets, coupling);
    select(ctx, jobs, BTreeSet::new(), Vec::new(), Ratio::ONE, &mut out);
    out
}

type Ctx<'a> = (&'a [BTreeSet<u32>], Coupling);

/// One loop of Algorithm 1, branching over every outcome of the chain of random choices.
fn select(
    ctx: Ctx<'_>,
    jobs: Vec<usize>,
    s: BTreeSet<u32>,
    chosen: Vec<Chosen>,
    prob: Ratio,
    out: &mut Enumeration,
) {
    let sets = ctx.0;
    if jobs.is_empty() {
        sample(ctx, &chosen, prob, out);
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
    let mut c = inter.len();
    let mut reach = Ratio::ONE; // probability that the first t jobs all accepted
    for t in 0..=jobs.len() {
        let p_accept = if t < jobs.len() {
            let denom = sets[jobs[t]].len() - s.len();
            if c >= denom {
                Ratio::ONE
            } else {
                Ratio::new(c as i128, denom as i128)
            }
        } else {
            Ratio::ZERO
        };
        let branch = reach * (Ratio::ONE - p_accept);
        if branch > Ratio::ZERO {
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
            select(ctx, rest, new_s.clone(), chosen, prob * branch, out);
        }
        if t < jobs.len() {
            reach = reach * p_accept;
            c = sets[jobs[t]].len() - s.len();
            if reach == Ratio::ZERO {
                break;
            }
        }
    }
}

/// The jobs of a group, the subset they selected, and whether it is a job's own set.
type Chosen = (Vec<usize>, BTreeSet<u32>, bool);

/// Algorithm 2: each group of jobs shares one uniform draw from the subset it selected; an own
/// set after the round's first own set is drawn coupled with that first draw.
fn sample(ctx: Ctx<'_>, chosen: &[Chosen], prob: Ratio, out: &mut Enumeration) {
    fn rec(
        coupling: Coupling,
        chosen: &[Chosen],
        first_own: Option<(&BTreeSet<u32>, u32)>,
        pick: &mut Vec<u32>,
        prob: Ratio,
        out: &mut Enumeration,
    ) {
        let Some(((jobs, subset, own), rest)) = chosen.split_first() else {
            let p = out.outcomes.entry(pick.clone()).or_insert(Ratio::ZERO);
            *p = *p + prob;
            return;
        };
        assert!(!subset.is_empty(), "a job selected an empty subset");
        if let (true, Some((a, _))) = (own, first_own) {
            out.coupled.insert(CoupledDraw {
                a: a.len(),
                b: subset.len(),
                both: a.intersection(subset).count(),
                b_only: subset.difference(a).count(),
            });
        }
        for &e in subset {
            let p = match (own, first_own) {
                (true, Some((a, x))) => coupling(a, x, subset, e),
                _ => Ratio::new(1, subset.len() as i128),
            };
            if p == Ratio::ZERO {
                continue;
            }
            for &j in jobs {
                pick[j] = e;
            }
            let first = match (own, first_own) {
                (true, None) => Some((subset, e)),
                _ => first_own,
            };
            rec(coupling, rest, first, pick, prob * p, out);
        }
    }
    let mut pick = vec![u32::MAX; ctx.0.len()];
    rec(ctx.1, chosen, None, &mut pick, prob, out);
}

/// P(y | x) of the maximal coupling of uniform draws over `b` with a uniform draw `x` over `a`:
/// y = x with probability min(1, |a| / |b|) when x is in b, otherwise y follows the rest of the
/// uniform distribution over b.
pub fn coupled(a: &BTreeSet<u32>, x: u32, b: &BTreeSet<u32>, y: u32) -> Ratio {
    let (la, lb) = (Ratio::from(a.len()), Ratio::from(b.len()));
    let accept = |e: u32| {
        if b.contains(&e) && a.contains(&e) {
            (la / lb).min(Ratio::ONE)
        } else {
            Ratio::ZERO
        }
    };
    // The rest: what uniform over b still needs once the coupled part is given.
    let rest = |e: u32| Ratio::ONE / lb - accept(e) / la;
    let rest_total = b.iter().fold(Ratio::ZERO, |t, &e| t + rest(e));
    let mut p = Ratio::ZERO;
    if y == x {
        p = accept(x);
    }
    let miss = Ratio::ONE - accept(x);
    if miss > Ratio::ZERO && rest_total > Ratio::ZERO {
        p = p + miss * rest(y) / rest_total;
    }
    p
}

/// An exact probability: a fraction in lowest terms with a positive denominator. Arithmetic
/// that leaves `i128` panics rather than wraps (the enumerated rounds are small).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ratio {
    num: i128,
    den: i128,
}

impl Ratio {
    pub const ZERO: Ratio = Ratio { num: 0, den: 1 };
    pub const ONE: Ratio = Ratio { num: 1, den: 1 };

    pub fn new(num: i128, den: i128) -> Ratio {
        assert!(den != 0, "a ratio with a zero denominator");
        let g = gcd(num, den).max(1);
        let sign = den.signum();
        Ratio {
            num: sign * num / g,
            den: sign * den / g,
        }
    }

    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    pub fn min(self, other: Ratio) -> Ratio {
        if self <= other { self } else { other }
    }
}

impl From<usize> for Ratio {
    fn from(n: usize) -> Ratio {
        Ratio::new(n as i128, 1)
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.num, self.den)
    }
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a as i128
}

fn mul(a: i128, b: i128) -> i128 {
    a.checked_mul(b)
        .expect("an exact probability overflows i128")
}

impl Add for Ratio {
    type Output = Ratio;
    fn add(self, o: Ratio) -> Ratio {
        let g = gcd(self.den, o.den);
        let (sa, sb) = (o.den / g, self.den / g);
        let num = mul(self.num, sa)
            .checked_add(mul(o.num, sb))
            .expect("an exact probability overflows i128");
        Ratio::new(num, mul(self.den, sa))
    }
}

impl Sub for Ratio {
    type Output = Ratio;
    fn sub(self, o: Ratio) -> Ratio {
        self + Ratio {
            num: -o.num,
            den: o.den,
        }
    }
}

impl Mul for Ratio {
    type Output = Ratio;
    fn mul(self, o: Ratio) -> Ratio {
        // Cross-reduce first so that the products stay small.
        let (g1, g2) = (gcd(self.num, o.den).max(1), gcd(o.num, self.den).max(1));
        Ratio::new(
            mul(self.num / g1, o.num / g2),
            mul(self.den / g2, o.den / g1),
        )
    }
}

impl Div for Ratio {
    type Output = Ratio;
    fn div(self, o: Ratio) -> Ratio {
        assert!(o.num != 0, "division of a probability by zero");
        self * Ratio::new(o.den, o.num)
    }
}

impl PartialOrd for Ratio {
    fn partial_cmp(&self, o: &Ratio) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Ratio {
    fn cmp(&self, o: &Ratio) -> std::cmp::Ordering {
        mul(self.num, o.den).cmp(&mul(o.num, self.den))
    }
}
