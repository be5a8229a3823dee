//! joader's shared-memory data plane.
//!
//! The server prepares every element once into a **data segment** (header,
//! slot table with read bits, arena) and delivers slot references to each
//! reader (a job, or one rank of a job) through that reader's own **delivery
//! ring**. Clients map the data segment read-only, read payloads zero-copy,
//! and acknowledge through the only memory they can write: the consumer page
//! of their own ring. See `DESIGN.md` for the byte-exact format, the memory
//! orderings and the invariants.
//!
//! Server side: [`Writer`] (create, [`Writer::write_slot`],
//! [`Writer::free_slot`], [`Writer::create_ring`]) and [`RingWriter`]
//! ([`RingWriter::push_data`], [`RingWriter::free_credit`],
//! [`RingWriter::poll_acks`], [`RingWriter::reader_status`],
//! [`RingWriter::reclaim_reader`]).
//!
//! Client side: [`Reader::open`], [`Reader::next_batch`] returning a
//! [`Batch`] of zero-copy [`Item`]s (acknowledged when dropped), with
//! [`Batch::collate_into`] / [`Batch::collate_augmented_into`].
#![deny(unsafe_code)]
#![warn(missing_docs)]
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

mod alloc;
pub mod augment;
pub mod collate;
mod copy;
mod error;
pub mod fields;
mod futex;
#[cfg(test)]
mod fuzz;
mod instance;
mod layout;
mod mirror;
pub mod names;
pub mod prefetch;
mod reader;
mod ring;
mod segment;
mod shm;
pub mod stages;

pub use alloc::ArenaStats;
pub use error::{Error, Result};
pub use instance::remove_dead_instance;
pub use layout::{
    DATA_MAGIC, Format, LAYOUT_VERSION, MAP_ALIGN, RING_MAGIC, RecordKind, element_error,
};
pub use reader::{
    Batch, DEFAULT_OPEN_TIMEOUT, DataKeepAlive, ElementError, EpochEnd, Item, ItemMeta,
    LIVENESS_SLICE, RawBatch, RawReader, Reader,
};
pub use ring::{ReaderStatus, RingWriter};
pub use segment::{SegmentConfig, SlotMeta, SlotRef, Writer};
pub use shm::Access;

/// Free bytes in `/dev/shm` (what [`Writer::create`] checks against).
pub fn shm_free_space() -> Result<u64> {
    shm::free_space().map_err(|e| Error::io("statvfs", names::SHM_DIR, e))
}
