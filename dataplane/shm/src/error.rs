//! Errors of the data plane, each with a stable machine-readable code.
//!
//! The codes (`Error::code`) are part of the public contract: the server maps
//! them into its REST error model and the Python package exposes them as
//! `JoaderError.code`. Never rename one; add new variants instead.

use std::io;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the data plane.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An instance or ring name is not usable in a shared-memory name.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// `/dev/shm` has less free space than the segment needs.
    #[error(
        "not enough shared memory in {path}: segment {name:?} needs {requested} bytes but only {free} bytes are free; \
         free some space or enlarge it (in Docker: `docker run --shm-size=<size>`, e.g. --shm-size=8g)"
    )]
    ShmSpace {
        /// The shared-memory directory that was checked.
        path: &'static str,
        /// The segment that was being created.
        name: String,
        /// Bytes requested.
        requested: u64,
        /// Bytes available to us.
        free: u64,
    },
    /// Another live server already owns this instance name.
    #[error(
        "instance {instance:?} is in use by a live server; choose another instance name or stop that server"
    )]
    InstanceInUse {
        /// The instance name.
        instance: String,
    },
    /// Exclusive creation failed because the segment exists.
    #[error("shared-memory segment {name:?} already exists")]
    AlreadyExists {
        /// Segment name.
        name: String,
    },
    /// A segment could not be opened because it does not exist.
    #[error(
        "shared-memory segment {name:?} does not exist (is the server running with this instance name?)"
    )]
    NotFound {
        /// Segment name.
        name: String,
    },
    /// The segment exists but its layout version word stayed 0.
    #[error("timed out after {waited_ms} ms waiting for segment {name:?} to become ready")]
    NotReady {
        /// Segment name.
        name: String,
        /// How long we waited.
        waited_ms: u64,
    },
    /// The segment is not a joader segment of the expected kind.
    #[error(
        "segment {name:?} has magic {found:#018x}, expected {expected:#018x}: not a joader segment of this kind"
    )]
    BadMagic {
        /// Segment name.
        name: String,
        /// Magic found.
        found: u64,
        /// Magic expected.
        expected: u64,
    },
    /// The segment was written by an incompatible layout version.
    #[error(
        "segment {name:?} has layout version {found}, this library reads version {expected}; upgrade the client or the server so that they match"
    )]
    VersionMismatch {
        /// Segment name.
        name: String,
        /// Version found.
        found: u32,
        /// Version this library implements.
        expected: u32,
    },
    /// The segment's mappings need a finer page size than this machine's.
    #[error(
        "segment {name:?} was created with {segment_page}-byte pages and aligns its mappings to {align} bytes, \
         but this machine's pages are {local_page} bytes; run the client on a machine whose page size divides {align}"
    )]
    PageSize {
        /// Segment name.
        name: String,
        /// Page size of the process that created the segment.
        segment_page: u64,
        /// Alignment of the segment's separately mapped regions.
        align: u64,
        /// Page size of this process.
        local_page: u64,
    },
    /// Header fields are inconsistent or out of bounds.
    #[error("segment {name:?} is corrupt: {reason}")]
    Corrupt {
        /// Segment name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The arena has no free block large enough: evict or apply back-pressure.
    #[error(
        "arena full: cannot allocate {requested} bytes ({free} bytes free, largest free block {largest} bytes)"
    )]
    Full {
        /// Bytes requested (rounded up to the arena granule).
        requested: u64,
        /// Free bytes in total.
        free: u64,
        /// Largest free block.
        largest: u64,
    },
    /// Every slot of the slot table is in use: evict or apply back-pressure.
    #[error("no free slot: all {slots} slots are in use")]
    NoFreeSlot {
        /// Number of slots of the segment.
        slots: u32,
    },
    /// Every reader index (read bit) is taken.
    #[error("too many readers: all {max} reader indices are in use")]
    TooManyReaders {
        /// Maximum number of readers of the segment.
        max: u32,
    },
    /// The slot still has read bits set and cannot be freed.
    #[error("slot {slot} is still being read (read bits {bits:#x} in its first word)")]
    SlotPinned {
        /// Slot index.
        slot: u32,
        /// First read-bit word, for diagnostics.
        bits: u64,
    },
    /// A slot reference whose generation is no longer current.
    #[error("stale slot reference: slot {slot} has generation {current}, reference has {expected}")]
    StaleSlot {
        /// Slot index.
        slot: u32,
        /// Generation in the reference.
        expected: u32,
        /// Generation in the table.
        current: u32,
    },
    /// The delivery ring has no free credit.
    #[error("delivery ring {ring:?} is full")]
    RingFull {
        /// Ring name.
        ring: String,
    },
    /// Another live process is attached to this ring.
    #[error("ring {ring:?} is already attached to a live reader")]
    RingInUse {
        /// Ring name.
        ring: String,
    },
    /// The ring was already used by a reader that has gone away.
    #[error("ring {ring:?} was attached to a reader that has gone; register the job again")]
    RingAbandoned {
        /// Ring name.
        ring: String,
    },
    /// The server stopped, died or was restarted.
    #[error("server is gone: {reason}")]
    ServerGone {
        /// What was observed.
        reason: String,
    },
    /// The server closed this ring (job removed) and everything was read.
    #[error("ring {ring:?} was closed by the server")]
    RingClosed {
        /// Ring name.
        ring: String,
    },
    /// The peer broke the protocol (e.g. acknowledged records it never got).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// No batch arrived within the consumer's timeout.
    #[error("no data from the server within {0:?}")]
    Timeout(std::time::Duration),
    /// Items of a batch cannot be collated together.
    #[error("cannot collate: {0}")]
    Collate(String),
    /// An operating-system call failed.
    #[error("{op} {name:?}: {source}")]
    Io {
        /// The operation (e.g. "mmap").
        op: &'static str,
        /// The object it was applied to.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Stable machine-readable code (snake_case), e.g. `"arena_full"`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidName { .. } => "invalid_name",
            Error::InvalidConfig(_) => "invalid_config",
            Error::ShmSpace { .. } => "shm_space",
            Error::InstanceInUse { .. } => "instance_in_use",
            Error::AlreadyExists { .. } => "segment_exists",
            Error::NotFound { .. } => "segment_not_found",
            Error::NotReady { .. } => "segment_not_ready",
            Error::BadMagic { .. } => "bad_magic",
            Error::VersionMismatch { .. } => "version_mismatch",
            Error::PageSize { .. } => "page_size_mismatch",
            Error::Corrupt { .. } => "segment_corrupt",
            Error::Full { .. } => "arena_full",
            Error::NoFreeSlot { .. } => "no_free_slot",
            Error::TooManyReaders { .. } => "too_many_readers",
            Error::SlotPinned { .. } => "slot_pinned",
            Error::StaleSlot { .. } => "stale_slot",
            Error::RingFull { .. } => "ring_full",
            Error::RingInUse { .. } => "ring_in_use",
            Error::RingAbandoned { .. } => "ring_abandoned",
            Error::ServerGone { .. } => "server_gone",
            Error::RingClosed { .. } => "ring_closed",
            Error::Protocol(_) => "protocol_violation",
            Error::Timeout(_) => "timeout",
            Error::Collate(_) => "collate",
            Error::Io { .. } => "io",
        }
    }

    pub(crate) fn io(
        op: &'static str,
        name: impl Into<String>,
        source: impl Into<io::Error>,
    ) -> Self {
        Error::Io {
            op,
            name: name.into(),
            source: source.into(),
        }
    }
}
