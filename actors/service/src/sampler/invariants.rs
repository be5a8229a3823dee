//! The Sampler actor's invariants, checked in debug builds: each handler asserts in constant
//! time what it changed (`debug_assert!`s beside the code: a round gives each of its jobs one
//! element, within its credit and lookahead; an added job is known to its sampler, a removed
//! one to none), and [`SamplerActor::check_invariants`] checks everything (linear in the data,
//! the dependent sampling tree's own check included) after the messages that
//! [`joader_core::invariants`] says are due.
//!
//! What is checked (see the Invariants of ARCHITECTURE.md):
//! - flow control: no job is sampled beyond its credit plus its lookahead (its credit never
//!   falls below minus its lookahead);
//! - the actor and its two samplers know the same jobs, each in the sampler of its kind;
//! - only DSA jobs join passes or wait for a start window, and only once started;
//! - fetch-ahead: no job's picks are handed to the Cache beyond its credit there plus its
//!   lookahead, and the held picks counted per element are those of the queues (see `ahead`);
//! - the tree equals its definition, and the independent sampler's jobs are consistent
//!   ([`joader_core::sampling::Sampler::check_invariants`]).

use std::collections::BTreeSet;

use joader_core::sampling::{Sampler, SamplerKind};

use super::SamplerActor;
use crate::messages::JobId;

impl SamplerActor {
    /// Counts a handled message (or timed pass) and runs the full check when it is due (debug
    /// builds only; see [`joader_core::invariants`]).
    pub(super) fn after_message(&mut self) {
        if self.checks.count() {
            self.checks.verify("sampler", self.check_invariants());
        }
    }

    /// Checks every invariant of the module docs; returns the first that fails.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        for (id, j) in &self.jobs {
            if j.credit < -i64::from(j.lookahead) {
                return Err(format!(
                    "job {id} was sampled beyond its credit and lookahead ({} left, lookahead {})",
                    j.credit, j.lookahead
                ));
            }
            if (j.joins || j.held_until.is_some()) && j.kind != SamplerKind::Dsa {
                return Err(format!(
                    "job {id} is not DSA but joins or waits for a window"
                ));
            }
            if j.held_until.is_some() && !j.started {
                return Err(format!(
                    "job {id} waits for a start window before its start"
                ));
            }
        }
        for (kind, sampler) in [
            (SamplerKind::Dsa, &self.dsa as &dyn Sampler),
            (SamplerKind::Isa, &self.isa as &dyn Sampler),
        ] {
            let mine: BTreeSet<JobId> = self
                .jobs
                .iter()
                .filter(|(_, j)| j.kind == kind)
                .map(|(&id, _)| id)
                .collect();
            let known: BTreeSet<JobId> = sampler.jobs().into_iter().collect();
            if mine != known {
                return Err(format!(
                    "the {} sampler knows jobs {known:?}, the actor {mine:?}",
                    kind.name()
                ));
            }
            sampler
                .check_invariants()
                .map_err(|e| format!("{} sampler: {e}", kind.name()))?;
        }
        if let Some(a) = &self.ahead {
            a.check()?;
        }
        if let Some((_, timer)) = self.scheduled
            && timer > self.timers
        {
            return Err(format!(
                "timer {timer} scheduled of {} started",
                self.timers
            ));
        }
        Ok(())
    }
}

/// Test-only messages: what the periodic check did, and a way to break an invariant.
#[cfg(test)]
pub(crate) mod probe {
    use actix::prelude::*;

    use super::super::SamplerActor;
    use crate::messages::JobId;

    pub(crate) use crate::probe::{Inspect, Inspection};

    impl Handler<Inspect> for SamplerActor {
        type Result = MessageResult<Inspect>;
        fn handle(&mut self, _: Inspect, _: &mut Context<Self>) -> Self::Result {
            MessageResult(Inspection {
                messages: self.checks.operations(),
                full_checks: self.checks.checks(),
                check: self.check_invariants(),
            })
        }
    }

    /// Overdraws a job (its credit below minus its lookahead), then runs the full check
    /// directly and through the periodic path (messages counted until a check is due), and
    /// restores the credit. Answers the direct check's result and the periodic check's panic.
    #[derive(Message)]
    #[rtype(result = "(Result<(), String>, Option<String>)")]
    pub(crate) struct Overdraw(pub(crate) JobId);

    impl Handler<Overdraw> for SamplerActor {
        type Result = MessageResult<Overdraw>;
        fn handle(&mut self, msg: Overdraw, _: &mut Context<Self>) -> Self::Result {
            let j = self.jobs.get_mut(&msg.0).expect("the job to overdraw");
            let credit = std::mem::replace(&mut j.credit, -i64::from(j.lookahead) - 1);
            let direct = self.check_invariants();
            let panicked = crate::tests::until_panic(|| self.after_message());
            if let Some(j) = self.jobs.get_mut(&msg.0) {
                j.credit = credit;
            }
            MessageResult((direct, panicked))
        }
    }
}
