//! The `joader` binary's tools, apart from the daemon (the `server` crate): the benchmarks,
//! the demo, the synthetic dataset generator, the simulator's command line, the debugging
//! client (`consume`) and `cleanup`. Each subcommand's arguments sit beside its code;
//! `main.rs` only dispatches.
#![forbid(unsafe_code)]

pub mod append;
#[cfg(feature = "bench")]
pub mod bench;
pub mod cleanup;
pub mod client;
pub mod consume;
pub mod demo;
pub mod inprocess;
pub mod preload;
pub mod serve_process;
pub mod simulate;
pub mod synth;
