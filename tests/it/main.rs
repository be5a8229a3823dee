//! joader's integration tests: one binary that runs the real `joader` executable.

mod common;
mod server;
mod simulate;
