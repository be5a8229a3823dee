//! `joader bench …`: commands that measure and print figures side by side in one run.
//! Benchmarks never assert timings; they print what they measured and the targets.

pub mod cluster;
pub mod decode;
pub mod e2e;
pub mod photos;
pub mod sampler;
pub mod scale;
