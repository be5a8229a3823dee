//! joader's algorithms, without a runtime: the dependent sampling tree and DSA, the independent
//! sampler, the cache policies and the cache simulator.
//!
//! Everything here is a plain data structure: no actix, no tokio, no I/O, no clocks. The
//! simulator (`joader simulate`), the benchmarks and the server's actors (the `actors` crate)
//! drive the very same implementations, and a reader can study the algorithm alone.
#![forbid(unsafe_code)]
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

pub mod cache;
pub mod cluster;
pub mod invariants;
pub mod sampling;
pub mod sim;
