//! Caching: replacement policies shared by the simulator and the Cache actor.

pub mod policy;

pub use policy::{Policy, PolicyKind};
