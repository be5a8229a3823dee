//! The limits a job must fit: ranks per server and per job, records per ring, and a batch
//! that the cache can hold at once. Jobs share the cache by flow control, not reservations:
//! only a job that could never run is refused.

use joader_pipeline::Pipeline;

use super::request::JobRequest;
use crate::config::Config;
use crate::error::{Code, Error, Result};

/// The most ranks a job may have on one server.
pub const MAX_WORLD_SIZE: u32 = 64;
/// The most ranks a multi-node job may have.
pub const MAX_CLUSTER_WORLD_SIZE: u32 = 4096;
/// The most records a delivery ring may hold (64 bytes each: a 4 MiB ring).
pub const MAX_RING_CAPACITY: u32 = 1 << 16;

/// The ring capacity of each of a job's ranks, or a refusal if it can never fit: above
/// [`MAX_RING_CAPACITY`], or all ranks' rings together above the cache's slots (every record
/// of a ring pins a slot).
pub fn ring_capacity(config: &Config, req: &JobRequest) -> Result<u32> {
    let capacity = req
        .ring_capacity
        .filter(|&c| c > 0)
        .unwrap_or(if config.ring_capacity > 0 {
            config.ring_capacity
        } else {
            req.batch_size.saturating_mul(2).max(64)
        });
    if capacity < req.batch_size {
        return Err(Error::new(
            Code::InvalidRequest,
            format!(
                "ring_capacity {capacity} cannot hold one batch of {}: give at least batch_size",
                req.batch_size
            ),
        ));
    }
    if capacity > MAX_RING_CAPACITY {
        return Err(Error::new(
            Code::TooLarge,
            format!(
                "ring_capacity {capacity} is above the limit of {MAX_RING_CAPACITY} records per \
                 ring (a batch_size above {} needs an explicit smaller ring_capacity)",
                MAX_RING_CAPACITY / 2
            ),
        ));
    }
    let world = u64::from(req.local_world_size.or(req.world_size).unwrap_or(1));
    let needed = u64::from(capacity) * world;
    if needed > u64::from(config.cache_slots) {
        return Err(Error::new(
            Code::TooLarge,
            format!(
                "the job's {world} ring(s) of {capacity} records need {needed} cache slots and \
                 the cache has {} (cache_slots): raise --cache-slots or lower ring_capacity or \
                 batch_size",
                config.cache_slots
            ),
        ));
    }
    Ok(capacity)
}

/// The fewest bytes an element of `pipeline` can take in the cache (raw bytes: unknown, 1).
pub fn min_element_bytes(pipeline: &Pipeline) -> u64 {
    match pipeline {
        Pipeline::Raw => 1,
        Pipeline::Decode {
            center_crop: Some([h, w]),
            ..
        } => u64::from(*h) * u64::from(*w) * 3,
        // The shorter side is `s`, the other at least as long.
        Pipeline::Decode {
            resize_shorter: Some(s),
            ..
        } => u64::from(*s) * u64::from(*s) * 3,
        Pipeline::Decode { .. } => 1,
    }
}

/// Refuses a job one batch of which can never be in the cache at once (its client could
/// never take a batch). Everything smaller is admitted: jobs share the cache by flow control,
/// not by reservations.
pub fn batch_fits(config: &Config, pipeline: &Pipeline, batch: u32) -> Result<()> {
    let bytes = min_element_bytes(pipeline).saturating_mul(u64::from(batch));
    if bytes > config.cache_bytes {
        return Err(Error::new(
            Code::TooLarge,
            format!(
                "one batch of {batch} elements takes at least {bytes} bytes and the cache holds \
                 {} (cache_bytes): raise --cache-bytes or lower batch_size",
                config.cache_bytes
            ),
        ));
    }
    Ok(())
}
