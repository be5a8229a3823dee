//! joader's integration tests: one binary that runs the real `joader` executable.

mod bench;
mod bounded;
mod cluster;
mod cluster_restart;
mod codemap;
mod common;
mod decode;
mod deploy;
mod disk_tier;
mod fields;
mod flow;
mod layers;
mod observability;
mod openapi;
mod parquet;
mod preload;
mod resume;
mod s3;
mod s3_parquet;
mod server;
mod simulate;
