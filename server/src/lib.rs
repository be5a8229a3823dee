//! The `joader` binary's library: command line, `simulate` and `bench` subcommands.
#![forbid(unsafe_code)]

pub mod cli;
