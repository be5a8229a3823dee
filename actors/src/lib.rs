//! joader's core: the dependent sampling tree and DSA, the independent sampler, the cache
//! policies and the cache simulator.
//!
//! Everything in [`sampling`], [`cache`] and [`sim`] is a plain data structure: no actix, no
//! I/O, no clocks. The simulator (`joader simulate`) and the server's actors drive the very
//! same implementations.
#![forbid(unsafe_code)]

pub mod cache;
pub mod pipeline;
pub mod sampling;
pub mod service;
pub mod sim;
pub mod storage;
pub mod synth;
