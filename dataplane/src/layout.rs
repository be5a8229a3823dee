//! Byte offsets of the shared-memory formats (see `DESIGN.md` for diagrams)
//! and the validation of headers read from a peer.
//!
//! All integers are native-endian, which on every supported target
//! (x86_64, aarch64 Linux) is little-endian; the magic numbers are the ASCII
//! strings `JOADERDS` / `JOADERRG` read as little-endian `u64`, so a
//! big-endian reader would see a bad magic rather than garbage.

use crate::error::{Error, Result};
use crate::shm::Mapping;

/// Layout version implemented by this library (see "Version history" in `DESIGN.md`).
pub const LAYOUT_VERSION: u32 = 1;
/// Magic of a data segment: `b"JOADERDS"` as a little-endian `u64`.
pub const DATA_MAGIC: u64 = u64::from_le_bytes(*b"JOADERDS");
/// Magic of a delivery-ring segment: `b"JOADERRG"` as a little-endian `u64`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"JOADERRG");

/// Arena allocations are aligned to and rounded up to this many bytes.
pub const ARENA_GRANULE: u64 = 64;
/// Alignment of the arena start and of ring pages.
pub const PAGE: u64 = 4096;

/// Data-segment header field offsets.
pub(crate) mod hdr {
    pub const MAGIC: usize = 0; // u64
    pub const VERSION: usize = 8; // AtomicU32, written last (Release)
    pub const HEADER_SIZE: usize = 12; // u32
    pub const TOTAL_SIZE: usize = 16; // u64
    pub const SLOT_COUNT: usize = 24; // u32
    pub const READ_WORDS: usize = 28; // u32
    pub const SLOT_TABLE_OFFSET: usize = 32; // u64
    pub const SLOT_STRIDE: usize = 40; // u32
    pub const MAX_READERS: usize = 44; // u32
    pub const ARENA_OFFSET: usize = 48; // u64
    pub const ARENA_SIZE: usize = 56; // u64
    pub const SERVER_PID: usize = 64; // u32
    pub const STATE: usize = 68; // AtomicU32
    pub const BOOT_ID: usize = 72; // u64
    pub const CREATED_UNIX_MS: usize = 80; // u64
    pub const SIZE: usize = 256;
}

/// Values of the data-segment `state` word.
pub(crate) mod seg_state {
    pub const RUNNING: u32 = 1;
    pub const SHUT_DOWN: u32 = 2;
}

/// Slot field offsets, relative to the slot start.
pub(crate) mod slot {
    pub const GENERATION: usize = 0; // AtomicU32
    pub const STATE: usize = 4; // AtomicU32
    pub const OFFSET: usize = 8; // u64, relative to the arena start
    pub const LENGTH: usize = 16; // u64
    pub const ELEMENT_ID: usize = 24; // u32
    pub const FORMAT: usize = 28; // u32
    pub const HEIGHT: usize = 32; // u32
    pub const WIDTH: usize = 36; // u32
    pub const CHANNELS: usize = 40; // u32
    pub const LABEL: usize = 48; // i64
    pub const READ_BITS: usize = 64; // [AtomicU64; read_words]
    pub const FIXED: usize = 64;
}

/// Values of a slot's `state` word.
pub(crate) mod slot_state {
    pub const FREE: u32 = 0;
    pub const WRITING: u32 = 1;
    pub const PUBLISHED: u32 = 2;
}

/// Ring-segment field offsets. Page 0 is written by the server only,
/// page 1 by the client only, records start at page 2.
pub(crate) mod ring {
    // producer page (server writes, client maps read-only)
    pub const MAGIC: usize = 0; // u64
    pub const VERSION: usize = 8; // AtomicU32, written last (Release)
    pub const RECORD_SIZE: usize = 12; // u32
    pub const CAPACITY: usize = 16; // u32, power of two
    pub const READER_INDEX: usize = 20; // u32
    pub const RECORDS_OFFSET: usize = 24; // u64
    pub const TOTAL_SIZE: usize = 32; // u64
    pub const SERVER_PID: usize = 40; // u32
    pub const FLAGS: usize = 44; // AtomicU32 (bit 0: closed)
    pub const BOOT_ID: usize = 48; // u64
    pub const TAIL: usize = 64; // AtomicU64, Release after records
    pub const TAIL_EVENT: usize = 72; // AtomicU32, futex word the consumer sleeps on
    pub const PRODUCER_WAITING: usize = 76; // AtomicU32
    // consumer page (client writes)
    pub const CONSUMER_PAGE: usize = 4096;
    pub const HEAD: usize = 4096; // AtomicU64
    pub const ACK: usize = 4096 + 8; // AtomicU64, Release after reads
    pub const ACK_EVENT: usize = 4096 + 16; // AtomicU32, futex word the producer sleeps on
    pub const CONSUMER_WAITING: usize = 4096 + 20; // AtomicU32
    pub const CONSUMER_PID: usize = 4096 + 24; // AtomicU32
    pub const CONSUMER_STATE: usize = 4096 + 28; // AtomicU32
    pub const RECORDS: usize = 8192;
    pub const FLAG_CLOSED: u32 = 1;
}

/// Values of the ring's `consumer_state` word.
pub(crate) mod consumer_state {
    pub const NEVER: u32 = 0;
    pub const ATTACHED: u32 = 1;
    pub const DETACHED: u32 = 2;
}

/// Ring record field offsets (records are 64 bytes).
pub(crate) mod rec {
    pub const KIND: usize = 0; // u32
    pub const SLOT: usize = 4; // u32
    pub const GENERATION: usize = 8; // u32
    pub const ELEMENT_ID: usize = 12; // u32
    pub const LABEL: usize = 16; // i64
    pub const EPOCH: usize = 24; // u64
    pub const POSITION: usize = 32; // u64
    pub const ERROR_CODE: usize = 40; // u32
    pub const SIZE: usize = 64;
}

/// Kinds of ring records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RecordKind {
    /// A slot to read.
    Data = 1,
    /// The epoch is complete; `position` holds the number of data and error records of the epoch.
    EndOfEpoch = 2,
    /// An element failed to load; carries its id and an error code.
    Error = 3,
    /// The job is finished; nothing follows.
    EndOfStream = 4,
}

impl RecordKind {
    pub(crate) fn from_u32(v: u32) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Data,
            2 => RecordKind::EndOfEpoch,
            3 => RecordKind::Error,
            4 => RecordKind::EndOfStream,
            _ => return None,
        })
    }
}

/// Payload format of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Opaque bytes.
    Raw,
    /// An image of `height × width × channels` bytes, row-major, channels last.
    HwcU8 {
        /// Rows.
        height: u32,
        /// Columns.
        width: u32,
        /// Channels (3 for RGB).
        channels: u32,
    },
}

impl Format {
    pub(crate) fn code(self) -> u32 {
        match self {
            Format::Raw => 0,
            Format::HwcU8 { .. } => 1,
        }
    }

    /// Payload length implied by the format (`None` for raw).
    pub fn expected_len(self) -> Option<u64> {
        match self {
            Format::Raw => None,
            Format::HwcU8 {
                height,
                width,
                channels,
            } => Some(height as u64 * width as u64 * channels as u64),
        }
    }

    pub(crate) fn decode(code: u32, h: u32, w: u32, c: u32) -> Option<Format> {
        match code {
            0 => Some(Format::Raw),
            1 => Some(Format::HwcU8 {
                height: h,
                width: w,
                channels: c,
            }),
            _ => None,
        }
    }
}

/// Geometry of a data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataLayout {
    pub slot_count: u32,
    pub read_words: u32,
    pub slot_stride: u32,
    pub slot_table_offset: u64,
    pub arena_offset: u64,
    pub arena_size: u64,
    pub total_size: u64,
}

pub(crate) fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl DataLayout {
    pub(crate) const MAX_SLOTS: u32 = 1 << 24;
    pub(crate) const MAX_READ_WORDS: u32 = 64;

    pub(crate) fn compute(
        slot_count: u32,
        read_words: u32,
        arena_bytes: u64,
    ) -> Result<DataLayout> {
        if slot_count == 0 || slot_count > Self::MAX_SLOTS {
            return Err(Error::InvalidConfig(format!(
                "slots must be in 1..={}, got {slot_count}",
                Self::MAX_SLOTS
            )));
        }
        if read_words == 0 || read_words > Self::MAX_READ_WORDS {
            return Err(Error::InvalidConfig(format!(
                "read_words must be in 1..={}, got {read_words}",
                Self::MAX_READ_WORDS
            )));
        }
        if arena_bytes == 0 || arena_bytes > (1 << 46) {
            return Err(Error::InvalidConfig(format!(
                "arena_bytes must be in 1..=2^46, got {arena_bytes}"
            )));
        }
        let slot_stride = round_up(slot::FIXED as u64 + 8 * read_words as u64, 64);
        let slot_table_offset = hdr::SIZE as u64;
        let arena_offset = round_up(slot_table_offset + slot_stride * slot_count as u64, PAGE);
        let arena_size = round_up(arena_bytes, PAGE);
        Ok(DataLayout {
            slot_count,
            read_words,
            slot_stride: slot_stride as u32,
            slot_table_offset,
            arena_offset,
            arena_size,
            total_size: arena_offset + arena_size,
        })
    }

    pub(crate) fn max_readers(&self) -> u32 {
        self.read_words * 64
    }

    /// Offset of slot `i` from the segment start.
    pub(crate) fn slot_off(&self, i: u32) -> usize {
        (self.slot_table_offset + self.slot_stride as u64 * i as u64) as usize
    }

    pub(crate) fn write_to(&self, map: &Mapping) {
        map.write_u32(hdr::HEADER_SIZE, hdr::SIZE as u32);
        map.write_u64(hdr::TOTAL_SIZE, self.total_size);
        map.write_u32(hdr::SLOT_COUNT, self.slot_count);
        map.write_u32(hdr::READ_WORDS, self.read_words);
        map.write_u64(hdr::SLOT_TABLE_OFFSET, self.slot_table_offset);
        map.write_u32(hdr::SLOT_STRIDE, self.slot_stride);
        map.write_u32(hdr::MAX_READERS, self.max_readers());
        map.write_u64(hdr::ARENA_OFFSET, self.arena_offset);
        map.write_u64(hdr::ARENA_SIZE, self.arena_size);
    }

    /// Reads and validates the geometry of a ready header against the file size.
    pub(crate) fn read_from(map: &Mapping, name: &str, file_size: u64) -> Result<DataLayout> {
        let corrupt = |reason: String| Error::Corrupt {
            name: name.into(),
            reason,
        };
        let header_size = map.read_u32(hdr::HEADER_SIZE);
        if header_size as usize != hdr::SIZE {
            return Err(corrupt(format!(
                "header size {header_size}, expected {}",
                hdr::SIZE
            )));
        }
        let found = DataLayout {
            slot_count: map.read_u32(hdr::SLOT_COUNT),
            read_words: map.read_u32(hdr::READ_WORDS),
            slot_stride: map.read_u32(hdr::SLOT_STRIDE),
            slot_table_offset: map.read_u64(hdr::SLOT_TABLE_OFFSET),
            arena_offset: map.read_u64(hdr::ARENA_OFFSET),
            arena_size: map.read_u64(hdr::ARENA_SIZE),
            total_size: map.read_u64(hdr::TOTAL_SIZE),
        };
        // Recompute from the primary parameters: any inconsistency is corruption.
        let expected =
            DataLayout::compute(found.slot_count, found.read_words, found.arena_size.max(1))
                .map_err(|e| corrupt(e.to_string()))?;
        if expected != found {
            return Err(corrupt(format!("inconsistent geometry {found:?}")));
        }
        if found.total_size != file_size {
            return Err(corrupt(format!(
                "header says {} bytes, object has {file_size}",
                found.total_size
            )));
        }
        Ok(found)
    }
}

/// Geometry of a ring segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingLayout {
    pub capacity: u32,
    pub total_size: u64,
}

impl RingLayout {
    pub(crate) const MAX_CAPACITY: u32 = 1 << 20;

    pub(crate) fn compute(capacity: u32) -> Result<RingLayout> {
        if capacity == 0 || capacity > Self::MAX_CAPACITY {
            return Err(Error::InvalidConfig(format!(
                "ring capacity must be in 1..={}, got {capacity}",
                Self::MAX_CAPACITY
            )));
        }
        let capacity = capacity.next_power_of_two();
        Ok(RingLayout {
            capacity,
            total_size: ring::RECORDS as u64 + capacity as u64 * rec::SIZE as u64,
        })
    }

    pub(crate) fn record_off(&self, position: u64) -> usize {
        ring::RECORDS + (position & (self.capacity as u64 - 1)) as usize * rec::SIZE
    }

    pub(crate) fn read_from(map: &Mapping, name: &str, file_size: u64) -> Result<RingLayout> {
        let corrupt = |reason: String| Error::Corrupt {
            name: name.into(),
            reason,
        };
        let record_size = map.read_u32(ring::RECORD_SIZE);
        let capacity = map.read_u32(ring::CAPACITY);
        let records_offset = map.read_u64(ring::RECORDS_OFFSET);
        let total = map.read_u64(ring::TOTAL_SIZE);
        if record_size as usize != rec::SIZE || records_offset as usize != ring::RECORDS {
            return Err(corrupt(format!(
                "record size {record_size} / records offset {records_offset} unexpected"
            )));
        }
        if !capacity.is_power_of_two() || capacity > Self::MAX_CAPACITY {
            return Err(corrupt(format!(
                "capacity {capacity} is not a power of two in range"
            )));
        }
        let layout = RingLayout::compute(capacity).map_err(|e| corrupt(e.to_string()))?;
        if layout.total_size != total || total != file_size {
            return Err(corrupt(format!(
                "ring size {total} does not match capacity {capacity} / object size {file_size}"
            )));
        }
        Ok(layout)
    }
}

/// Codes carried by error records. The server may use other values; these
/// are the ones the clients know by name.
pub mod element_error {
    /// Reading the element from storage failed.
    pub const IO: u32 = 1;
    /// Decoding the element failed.
    pub const DECODE: u32 = 2;
    /// The element does not exist in storage.
    pub const NOT_FOUND: u32 = 3;
    /// The element is larger than the cache can hold.
    pub const TOO_LARGE: u32 = 4;
    /// Any other server-side failure.
    pub const INTERNAL: u32 = 255;

    /// Stable name of an element error code.
    pub fn name(code: u32) -> &'static str {
        match code {
            IO => "io",
            DECODE => "decode",
            NOT_FOUND => "not_found",
            TOO_LARGE => "too_large",
            INTERNAL => "internal",
            _ => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_layout_geometry() {
        let l = DataLayout::compute(1000, 2, 1 << 20).unwrap();
        assert_eq!(l.slot_stride, 128);
        assert_eq!(l.slot_table_offset, 256);
        assert_eq!(l.arena_offset % PAGE, 0);
        assert!(l.arena_offset >= 256 + 128 * 1000);
        assert_eq!(l.max_readers(), 128);
        assert_eq!(l.slot_off(1) - l.slot_off(0), 128);
        let l1 = DataLayout::compute(1, 1, 1).unwrap();
        assert_eq!(l1.slot_stride, 128); // 64 + 8 rounded to 64
        let l3 = DataLayout::compute(1, 8, 1).unwrap();
        assert_eq!(l3.slot_stride, 128);
        let l4 = DataLayout::compute(1, 9, 1).unwrap();
        assert_eq!(l4.slot_stride, 192);
        assert!(DataLayout::compute(0, 2, 1).is_err());
        assert!(DataLayout::compute(1, 0, 1).is_err());
        assert!(DataLayout::compute(1, 65, 1).is_err());
    }

    #[test]
    fn ring_layout_geometry() {
        let r = RingLayout::compute(100).unwrap();
        assert_eq!(r.capacity, 128);
        assert_eq!(r.total_size, 8192 + 128 * 64);
        assert_eq!(r.record_off(0), 8192);
        assert_eq!(r.record_off(129), 8192 + 64);
        assert!(RingLayout::compute(0).is_err());
    }

    #[test]
    fn magics_are_ascii() {
        assert_eq!(&DATA_MAGIC.to_le_bytes(), b"JOADERDS");
        assert_eq!(&RING_MAGIC.to_le_bytes(), b"JOADERRG");
    }
}
