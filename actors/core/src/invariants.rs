//! When a debug build runs a full invariant check: the structures and the actors over them
//! assert what each operation changed in constant time (`debug_assert!`), and check everything
//! they hold (linear in the data) only every so often, counted by a [`Periodic`].
//!
//! The full check runs after the 1st, 2nd, 4th, … operation up to the [`EVERY`]th, then after
//! every [`EVERY`]th: a short test checks early, a long one pays about `1 / EVERY` of a check per
//! operation. A [`Periodic::sparse`] counter skips the early checks: for a structure that tests
//! build by the thousand for a few operations each (the sampling tree of a statistical trial),
//! where they would cost more than the operations. Release builds count the operations and
//! never check.

/// After this many operations a full check runs again (see the module docs).
pub const EVERY: u64 = 1024;

/// Whether a full check is due after the `operations`th operation (debug builds or not).
pub fn due_after(operations: u64) -> bool {
    operations.is_power_of_two() || operations.is_multiple_of(EVERY)
}

/// Counts operations and the full checks run after them; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct Periodic {
    operations: u64,
    checks: u64,
    /// Checks early (after the powers of two) too.
    early: bool,
}

impl Default for Periodic {
    fn default() -> Self {
        Self {
            operations: 0,
            checks: 0,
            early: true,
        }
    }
}

impl Periodic {
    /// A counter that checks after every [`EVERY`]th operation only (see the module docs).
    pub fn sparse() -> Self {
        Self {
            early: false,
            ..Self::default()
        }
    }

    /// Counts one operation; returns whether the full check is due now (never in release
    /// builds). A caller that gets `true` runs its check and hands the result to
    /// [`Periodic::verify`].
    pub fn count(&mut self) -> bool {
        self.operations += 1;
        let due = cfg!(debug_assertions)
            && if self.early {
                due_after(self.operations)
            } else {
                self.operations.is_multiple_of(EVERY)
            };
        self.checks += u64::from(due);
        due
    }

    /// Operations counted so far.
    pub fn operations(&self) -> u64 {
        self.operations
    }

    /// Full checks that were due so far (what a test reads to see that they run).
    pub fn checks(&self) -> u64 {
        self.checks
    }

    /// Panics, naming `what` and the operation, when a full check failed.
    #[track_caller]
    pub fn verify(&self, what: &str, result: Result<(), String>) {
        if let Err(e) = result {
            panic!(
                "{what}: invariant broken after operation {}: {e}",
                self.operations
            );
        }
    }
}

/// How many full checks a debug build has run after `operations` operations (of a counter
/// that is not sparse).
pub fn checks_after(operations: u64) -> u64 {
    if !cfg!(debug_assertions) {
        return 0;
    }
    let powers = u64::from(operations.checked_ilog2().map_or(0, |l| l + 1));
    // Powers of two from EVERY on are multiples of EVERY: count them once.
    powers.min(u64::from(EVERY.ilog2())) + operations / EVERY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_run_at_powers_of_two_then_every_1024th_operation() {
        let mut p = Periodic::default();
        let due: Vec<u64> = (1..=5000u64).filter(|_| p.count()).collect();
        if cfg!(debug_assertions) {
            let want: Vec<u64> = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
                .into_iter()
                .chain((1..=4).map(|k| k * EVERY))
                .collect();
            assert_eq!(due, want);
        } else {
            assert!(due.is_empty(), "release builds never run the full check");
        }
        assert_eq!(p.operations(), 5000);
        assert_eq!(p.checks(), due.len() as u64);
        let mut sparse = Periodic::sparse();
        let due: Vec<u64> = (1..=5000u64).filter(|_| sparse.count()).collect();
        if cfg!(debug_assertions) {
            assert_eq!(due, (1..=4).map(|k| k * EVERY).collect::<Vec<_>>());
        } else {
            assert!(due.is_empty());
        }
        for n in [0, 1, 3, 1023, 1024, 1025, 4096, 5000] {
            let mut q = Periodic::default();
            (0..n).for_each(|_| {
                q.count();
            });
            assert_eq!(checks_after(n), q.checks(), "checks after {n} operations");
        }
    }

    #[test]
    #[should_panic(expected = "the thing: invariant broken after operation 0: it drifted")]
    fn a_failed_check_panics_naming_what_broke() {
        Periodic::default().verify("the thing", Err("it drifted".into()));
    }
}
