//! joader's actix actors: the Sampler, the Cache and the Loader, and the messages between them,
//! in [`service`].
//!
//! The algorithms the actors schedule (the dependent sampling tree, DSA, the cache policies)
//! live in the runtime-free `joader-core` crate (`actors/core`); the simulator drives the
//! same code. What the Loader reads and how it prepares an element come in through two seams
//! (`service::ElementSource`, `service::Prepare`), which the server fills with the
//! `joader-storage` (`actors/storage`) and `joader-pipeline` (`actors/pipeline`) crates: the
//! actors import neither.
#![forbid(unsafe_code)]
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

pub mod service;
