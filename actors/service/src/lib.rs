//! joader's actix actors: the Sampler, the Cache and the Loader, and the messages between them.
//!
//! The algorithms the actors schedule (the dependent sampling tree, DSA, the cache policies)
//! live in the runtime-free `joader-core` crate (`actors/core`); the simulator drives the
//! same code. What the Loader reads and how it prepares an element come in through two seams
//! (`ElementSource`, `Prepare`), which the server fills with the
//! `joader-storage` (`actors/storage`) and `joader-pipeline` (`actors/pipeline`) crates: the
//! actors import neither.
//!
//! The actors and what flows between them:
//!
//! ```text
//!   Sampler (one per base dataset) --Deliver--> Cache --Load--> Loader (worker pool)
//!        ^                                        |  ^               |
//!        +-------------JobSignal (credit, gone)---+  +----Loaded-----+
//! ```
//! Each actor receives its downstream as an injected `Recipient<M>`, so a test can run one
//! actor alone and capture what it sends. The sampling and caching decisions are the plain data
//! structures of [`joader_core::sampling`] and [`joader_core::cache`]; the actors only schedule them.
#![forbid(unsafe_code)]
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

pub mod cache;
pub mod loader;
pub mod messages;
pub mod sampler;
pub mod stages;
pub mod stats;

pub use cache::{CacheActor, CacheConfig};
pub use loader::Loader;
pub use messages::*;
pub use sampler::{FetchClock, SamplerActor};
pub use stats::{CacheStats, JobState, JobStats, PreloadProgress, PreloadState};

#[cfg(test)]
mod tests;

/// Test-only: what an actor's periodic invariant check did, asked the same way of the Cache and
/// the Sampler (each answers [`probe::Inspect`] in its `invariants.rs`).
#[cfg(test)]
pub(crate) mod probe {
    use actix::prelude::*;

    /// Asks an actor for its message count, its full checks so far and a full check now.
    #[derive(Message)]
    #[rtype(result = "Inspection")]
    pub(crate) struct Inspect;

    #[derive(Debug)]
    pub(crate) struct Inspection {
        pub(crate) messages: u64,
        pub(crate) full_checks: u64,
        pub(crate) check: Result<(), String>,
    }
}
