//! joader's integration tests: one binary that runs the real `joader` executable.

mod bench;
mod bounded;
mod common;
mod decode;
mod flow;
mod observability;
mod openapi;
mod resume;
mod s3;
mod server;
mod simulate;
