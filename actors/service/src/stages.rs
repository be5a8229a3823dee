//! The stages of the daemon's CPU accounting the actors mark (`joader_stage_cpu_seconds_total`;
//! the mechanism is `joader-stages`).

use joader_stages::Stage;

/// A loader worker reading an element's stored bytes (file, tar member; a remote source's
/// bytes arrive already fetched), and a `raw` pipeline's copy of them.
pub static READ: Stage = Stage::new("read");
/// A loader worker between loads: its queue, handing results to the Cache.
pub static LOADER: Stage = Stage::new("loader");
/// Copying a prepared payload into its shared-memory slot (on the Cache's thread).
pub static SLOT_WRITE: Stage = Stage::new("slot_write");
/// The Cache actor's messages and polls (rings, acknowledgements, flow), less the slot
/// writes.
pub static CACHE: Stage = Stage::new("cache");
/// The Sampler actors' messages and passes.
pub static SAMPLER: Stage = Stage::new("sampler");
