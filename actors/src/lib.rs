//! joader's moving parts: the actix actors (Sampler, Cache, Loader) and their messages in
//! [`service`], dataset sources in [`storage`] and the shared, deterministic preparation of an
//! element in [`pipeline`].
//!
//! The algorithms the actors schedule (the dependent sampling tree, DSA, the cache policies)
//! live in the runtime-free `joader-core` crate (`actors/core`); the simulator drives the
//! same code.
#![forbid(unsafe_code)]

pub mod pipeline;
pub mod service;
pub mod storage;

#[cfg(test)]
mod fuzz;
