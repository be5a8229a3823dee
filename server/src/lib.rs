//! The `joader` binary's library: command line, `simulate` and `bench` subcommands.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod simulate;
