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
pub const LAYOUT_VERSION: u32 = 4;
/// Magic of a data segment: `b"JOADERDS"` as a little-endian `u64`.
pub const DATA_MAGIC: u64 = u64::from_le_bytes(*b"JOADERDS");
/// Magic of a delivery-ring segment: `b"JOADERRG"` as a little-endian `u64`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"JOADERRG");

/// Arena allocations are aligned to and rounded up to this many bytes.
pub const ARENA_GRANULE: u64 = 64;
/// Alignment of every region that is mapped on its own or with its own
/// protection (the ring's consumer page), of the arena and of segment sizes:
/// 64 KiB, a multiple of every page size of the supported targets (x86_64:
/// 4 KiB; aarch64: 4, 16 or 64 KiB), so that one layout serves them all. A
/// creator whose pages are larger aligns to its page size instead and says so
/// in the header (see [`map_align`]).
pub const MAP_ALIGN: u64 = 1 << 16;
/// Page sizes a header may record: powers of two in this range.
pub(crate) const MIN_PAGE: u64 = 1 << 12;
pub(crate) const MAX_PAGE: u64 = 1 << 24;

/// This process's page size.
pub(crate) fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// The alignment of a layout created with pages of `page` bytes.
pub(crate) fn map_align(page: u64) -> u64 {
    page.max(MAP_ALIGN)
}

fn check_page(page: u64) -> Result<()> {
    if !page.is_power_of_two() || !(MIN_PAGE..=MAX_PAGE).contains(&page) {
        return Err(Error::InvalidConfig(format!(
            "page size must be a power of two in {MIN_PAGE}..={MAX_PAGE}, got {page}"
        )));
    }
    Ok(())
}

/// Refuses a segment whose mappings this process cannot make: its own pages
/// must divide the segment's alignment (the page size of the creator is
/// otherwise irrelevant, since the layout does not depend on it below 64 KiB).
fn check_page_fits(name: &str, segment_page: u64, local_page: u64) -> Result<()> {
    let align = map_align(segment_page);
    if !local_page.is_power_of_two() || local_page > align {
        return Err(Error::PageSize {
            name: name.into(),
            segment_page,
            align,
            local_page,
        });
    }
    Ok(())
}

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
    pub const PAGE_SIZE: usize = 88; // u32, the creator's page size
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
    pub const SOURCE_HEIGHT: usize = 44; // u32, the image's rows before the pipeline (0: unknown)
    pub const LABEL: usize = 48; // i64
    pub const FIELDS_LEN: usize = 56; // u32, the field block after the payload (0: none)
    pub const SOURCE_WIDTH: usize = 60; // u32, the image's columns before the pipeline (0: unknown)
    pub const READ_BITS: usize = 64; // [AtomicU64; read_words]
    pub const FIXED: usize = 64;
}

/// Values of a slot's `state` word.
pub(crate) mod slot_state {
    pub const FREE: u32 = 0;
    pub const WRITING: u32 = 1;
    pub const PUBLISHED: u32 = 2;
}

/// Ring-segment field offsets. The producer page (offset 0) is written by
/// the server only, the consumer page (at `RingLayout::consumer_offset`) by
/// the client only, and records start at `RingLayout::records_offset`.
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
    pub const PAGE_SIZE: usize = 56; // u32, the creator's page size
    pub const HEADER: usize = 64; // the fields above, fixed once the version is written
    pub const TAIL: usize = 64; // AtomicU64, Release after records
    pub const TAIL_EVENT: usize = 72; // AtomicU32, futex word the consumer sleeps on
    pub const PRODUCER_WAITING: usize = 76; // AtomicU32
    // consumer page (client writes); offsets from the start of that page
    pub const HEAD: usize = 0; // AtomicU64
    pub const ACK: usize = 8; // AtomicU64, Release after reads
    pub const ACK_EVENT: usize = 16; // AtomicU32, futex word the producer sleeps on
    pub const CONSUMER_WAITING: usize = 20; // AtomicU32
    pub const CONSUMER_PID: usize = 24; // AtomicU32
    pub const CONSUMER_STATE: usize = 28; // AtomicU32
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
    /// Data and error records: [`FLAG_LAST_OF_EPOCH`]; 0 from servers before it.
    pub const FLAGS: usize = 44; // u32
    pub const SIZE: usize = 64;
    /// The record is the last data or error record of its epoch in this ring: the next
    /// record is the epoch's end.
    pub const FLAG_LAST_OF_EPOCH: u32 = 1;
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
    pub page_size: u32,
    pub slot_table_offset: u64,
    pub arena_offset: u64,
    pub arena_size: u64,
    pub total_size: u64,
}

pub(crate) fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

fn u32_at(h: &[u8], off: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&h[off..off + 4]);
    u32::from_ne_bytes(b)
}

fn u64_at(h: &[u8], off: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&h[off..off + 8]);
    u64::from_ne_bytes(b)
}

/// Copies the first `N` bytes of a mapping (a header, fixed once its version
/// word is published) so that validation works on plain bytes.
///
/// Word by word with volatile reads, as every plain shared field is read; the
/// one word that still changes in a data header (`state`, at shutdown) is
/// read again atomically where it matters (`Reader::check_server`).
pub(crate) fn copy_header<const N: usize>(map: &Mapping) -> [u8; N] {
    let mut out = [0; N];
    for (i, word) in out.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&map.read_u64(i * 8).to_ne_bytes());
    }
    out
}

/// The checks every header starts with: magic, then version (a peer of
/// another version lays its bytes out differently, so nothing else is read).
fn check_magic_version(h: &[u8], name: &str, magic: u64, version_off: usize) -> Result<()> {
    let found = u64_at(h, 0);
    if found != magic {
        return Err(Error::BadMagic {
            name: name.into(),
            found,
            expected: magic,
        });
    }
    let version = u32_at(h, version_off);
    if version != LAYOUT_VERSION {
        return Err(Error::VersionMismatch {
            name: name.into(),
            found: version,
            expected: LAYOUT_VERSION,
        });
    }
    Ok(())
}

impl DataLayout {
    pub(crate) const MAX_SLOTS: u32 = 1 << 24;
    pub(crate) const MAX_READ_WORDS: u32 = 64;

    /// The geometry a creator with pages of `page_size` bytes lays out; the
    /// same for every page size up to [`MAP_ALIGN`].
    pub(crate) fn compute(
        slot_count: u32,
        read_words: u32,
        arena_bytes: u64,
        page_size: u64,
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
        check_page(page_size)?;
        let align = map_align(page_size);
        let slot_stride = round_up(slot::FIXED as u64 + 8 * read_words as u64, 64);
        let slot_table_offset = hdr::SIZE as u64;
        let arena_offset = round_up(slot_table_offset + slot_stride * slot_count as u64, align);
        let arena_size = round_up(arena_bytes, align);
        Ok(DataLayout {
            slot_count,
            read_words,
            slot_stride: slot_stride as u32,
            page_size: page_size as u32,
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
        map.write_u32(hdr::PAGE_SIZE, self.page_size);
    }

    /// Validates a data-segment header (`h`, the first [`hdr::SIZE`] bytes of
    /// an object of `file_size` bytes) as a client does on attach: magic,
    /// version, geometry, and that this process's pages (`local_page`) can
    /// map it. Any input gives a layout or an error, never a panic.
    pub(crate) fn validate(
        h: &[u8; hdr::SIZE],
        name: &str,
        file_size: u64,
        local_page: u64,
    ) -> Result<DataLayout> {
        check_magic_version(h, name, DATA_MAGIC, hdr::VERSION)?;
        let corrupt = |reason: String| Error::Corrupt {
            name: name.into(),
            reason,
        };
        let header_size = u32_at(h, hdr::HEADER_SIZE);
        if header_size as usize != hdr::SIZE {
            return Err(corrupt(format!(
                "header size {header_size}, expected {}",
                hdr::SIZE
            )));
        }
        let found = DataLayout {
            slot_count: u32_at(h, hdr::SLOT_COUNT),
            read_words: u32_at(h, hdr::READ_WORDS),
            slot_stride: u32_at(h, hdr::SLOT_STRIDE),
            page_size: u32_at(h, hdr::PAGE_SIZE),
            slot_table_offset: u64_at(h, hdr::SLOT_TABLE_OFFSET),
            arena_offset: u64_at(h, hdr::ARENA_OFFSET),
            arena_size: u64_at(h, hdr::ARENA_SIZE),
            total_size: u64_at(h, hdr::TOTAL_SIZE),
        };
        // Recompute from the primary parameters: any inconsistency is corruption.
        let expected = DataLayout::compute(
            found.slot_count,
            found.read_words,
            found.arena_size.max(1),
            found.page_size as u64,
        )
        .map_err(|e| corrupt(e.to_string()))?;
        if expected != found || u32_at(h, hdr::MAX_READERS) != found.max_readers() {
            return Err(corrupt(format!("inconsistent geometry {found:?}")));
        }
        if found.total_size != file_size {
            return Err(corrupt(format!(
                "header says {} bytes, object has {file_size}",
                found.total_size
            )));
        }
        check_page_fits(name, found.page_size as u64, local_page)?;
        Ok(found)
    }
}

/// Geometry of a ring segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingLayout {
    pub capacity: u32,
    pub page_size: u32,
    /// Start of the consumer page, the only part a client maps writable.
    pub consumer_offset: u64,
    /// Length of the consumer page's mapping.
    pub consumer_len: u64,
    pub records_offset: u64,
    pub total_size: u64,
}

impl RingLayout {
    pub(crate) const MAX_CAPACITY: u32 = 1 << 20;

    /// The geometry of a ring of `capacity` records (rounded up to a power of
    /// two) created with pages of `page_size` bytes; the same for every page
    /// size up to [`MAP_ALIGN`].
    pub(crate) fn compute(capacity: u32, page_size: u64) -> Result<RingLayout> {
        if capacity == 0 || capacity > Self::MAX_CAPACITY {
            return Err(Error::InvalidConfig(format!(
                "ring capacity must be in 1..={}, got {capacity}",
                Self::MAX_CAPACITY
            )));
        }
        check_page(page_size)?;
        let align = map_align(page_size);
        let capacity = capacity.next_power_of_two();
        Ok(RingLayout {
            capacity,
            page_size: page_size as u32,
            consumer_offset: align,
            consumer_len: align,
            records_offset: 2 * align,
            total_size: 2 * align + capacity as u64 * rec::SIZE as u64,
        })
    }

    pub(crate) fn record_off(&self, position: u64) -> usize {
        (self.records_offset + (position & (self.capacity as u64 - 1)) * rec::SIZE as u64) as usize
    }

    /// Offset from the ring start of a consumer-page field (`ring::HEAD`, …).
    pub(crate) fn ctl(&self, field: usize) -> usize {
        self.consumer_offset as usize + field
    }

    /// Validates a ring header (`h`, the first [`ring::HEADER`] bytes of an
    /// object of `file_size` bytes) as a client does on attach; see
    /// [`DataLayout::validate`].
    pub(crate) fn validate(
        h: &[u8; ring::HEADER],
        name: &str,
        file_size: u64,
        local_page: u64,
    ) -> Result<RingLayout> {
        check_magic_version(h, name, RING_MAGIC, ring::VERSION)?;
        let corrupt = |reason: String| Error::Corrupt {
            name: name.into(),
            reason,
        };
        let record_size = u32_at(h, ring::RECORD_SIZE);
        let capacity = u32_at(h, ring::CAPACITY);
        let records_offset = u64_at(h, ring::RECORDS_OFFSET);
        let total = u64_at(h, ring::TOTAL_SIZE);
        let page = u32_at(h, ring::PAGE_SIZE) as u64;
        if record_size as usize != rec::SIZE {
            return Err(corrupt(format!(
                "record size {record_size}, expected {}",
                rec::SIZE
            )));
        }
        if !capacity.is_power_of_two() || capacity > Self::MAX_CAPACITY {
            return Err(corrupt(format!(
                "capacity {capacity} is not a power of two in range"
            )));
        }
        let layout = RingLayout::compute(capacity, page).map_err(|e| corrupt(e.to_string()))?;
        if layout.records_offset != records_offset {
            return Err(corrupt(format!(
                "records offset {records_offset}, expected {} for {page}-byte pages",
                layout.records_offset
            )));
        }
        if layout.total_size != total || total != file_size {
            return Err(corrupt(format!(
                "ring size {total} does not match capacity {capacity} / object size {file_size}"
            )));
        }
        check_page_fits(name, page, local_page)?;
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
    /// A declared field is missing from the element or is not what its kind says (text
    /// that is not UTF-8, JSON that does not parse, a bad `.npy` header).
    pub const BAD_FIELD: u32 = 5;
    /// Any other server-side failure.
    pub const INTERNAL: u32 = 255;

    /// Stable name of an element error code.
    pub fn name(code: u32) -> &'static str {
        match code {
            IO => "io",
            DECODE => "decode",
            NOT_FOUND => "not_found",
            TOO_LARGE => "too_large",
            BAD_FIELD => "bad_field",
            INTERNAL => "internal",
            _ => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    #[test]
    fn data_layout_geometry() {
        let l = DataLayout::compute(1000, 2, 1 << 20, 4 * KIB).unwrap();
        assert_eq!(l.slot_stride, 128);
        assert_eq!(l.slot_table_offset, 256);
        assert_eq!(l.arena_offset, 2 * MAP_ALIGN); // 256 + 128 000 rounded up to 64 KiB
        assert_eq!(l.arena_size, 1 << 20);
        assert_eq!(l.max_readers(), 128);
        assert_eq!(l.slot_off(1) - l.slot_off(0), 128);
        let l1 = DataLayout::compute(1, 1, 1, 4 * KIB).unwrap();
        assert_eq!(l1.slot_stride, 128); // 64 + 8 rounded to 64
        assert_eq!((l1.arena_offset, l1.arena_size), (MAP_ALIGN, MAP_ALIGN));
        let l3 = DataLayout::compute(1, 8, 1, 4 * KIB).unwrap();
        assert_eq!(l3.slot_stride, 128);
        let l4 = DataLayout::compute(1, 9, 1, 4 * KIB).unwrap();
        assert_eq!(l4.slot_stride, 192);
        assert!(DataLayout::compute(0, 2, 1, 4 * KIB).is_err());
        assert!(DataLayout::compute(1, 0, 1, 4 * KIB).is_err());
        assert!(DataLayout::compute(1, 65, 1, 4 * KIB).is_err());
        assert!(DataLayout::compute(1, 1, 1, 3 * KIB).is_err());
        assert!(DataLayout::compute(1, 1, 1, 2 * KIB).is_err());
    }

    #[test]
    fn ring_layout_geometry() {
        let r = RingLayout::compute(100, 4 * KIB).unwrap();
        assert_eq!(r.capacity, 128);
        assert_eq!(r.consumer_offset, 65536);
        assert_eq!(r.records_offset, 131072);
        assert_eq!(r.total_size, 131072 + 128 * 64);
        assert_eq!(r.record_off(0), 131072);
        assert_eq!(r.record_off(129), 131072 + 64);
        assert_eq!(r.ctl(ring::ACK), 65536 + 8);
        assert!(RingLayout::compute(0, 4 * KIB).is_err());
    }

    /// The format is shared by processes of one machine, whatever its page
    /// size: 4, 16 and 64 KiB pages give the same bytes, and every region
    /// mapped on its own starts and ends on a page boundary.
    #[test]
    fn layouts_are_identical_and_page_aligned_for_4_16_and_64_kib_pages() {
        let data: Vec<_> = [4, 16, 64]
            .map(|k| DataLayout::compute(1000, 2, 3 << 20, k * KIB).unwrap())
            .into();
        let rings: Vec<_> = [4, 16, 64]
            .map(|k| RingLayout::compute(1000, k * KIB).unwrap())
            .into();
        for (i, page) in [4, 16, 64].map(|k| k * KIB).into_iter().enumerate() {
            let (d, r) = (data[i], rings[i]);
            assert_eq!(d.page_size as u64, page);
            assert_eq!(
                (d.arena_offset, d.total_size),
                (data[0].arena_offset, data[0].total_size)
            );
            assert_eq!(d.arena_offset % page, 0);
            assert_eq!(d.total_size % page, 0);
            assert_eq!(r.page_size as u64, page);
            assert_eq!(
                (
                    r.consumer_offset,
                    r.consumer_len,
                    r.records_offset,
                    r.total_size
                ),
                (
                    rings[0].consumer_offset,
                    rings[0].consumer_len,
                    rings[0].records_offset,
                    rings[0].total_size
                )
            );
            // The consumer page is mapped writable on its own: whole pages, and
            // nothing the server writes (producer page, records) inside it.
            assert_eq!(r.consumer_offset % page, 0);
            assert_eq!(r.consumer_len % page, 0);
            assert!(r.consumer_offset >= (ring::HEADER + 16) as u64);
            assert!(r.consumer_offset + r.consumer_len <= r.records_offset);
            assert!((ring::CONSUMER_STATE + 4) as u64 <= r.consumer_len);
            // A client with any of these page sizes can map a segment made with another.
            for local in [4, 16, 64].map(|k| k * KIB) {
                assert!(check_page_fits("s", page, local).is_ok());
            }
        }
    }

    #[test]
    fn larger_pages_change_the_alignment_and_are_refused_where_they_do_not_fit() {
        let d = DataLayout::compute(1, 1, 1, 256 * KIB).unwrap();
        assert_eq!((d.arena_offset, d.arena_size), (256 * KIB, 256 * KIB));
        let r = RingLayout::compute(1, 256 * KIB).unwrap();
        assert_eq!(
            (r.consumer_offset, r.records_offset),
            (256 * KIB, 512 * KIB)
        );
        // A client with 256 KiB pages cannot map the 64 KiB regions of a
        // segment made on a 4 KiB machine; the error names both sizes.
        let e = check_page_fits("joader-x-data", 4 * KIB, 256 * KIB).unwrap_err();
        assert_eq!(e.code(), "page_size_mismatch");
        let msg = e.to_string();
        assert!(
            msg.contains("4096-byte pages") && msg.contains("262144 bytes"),
            "{msg}"
        );
        // The other way round works: 4 KiB pages divide 256 KiB.
        assert!(check_page_fits("s", 256 * KIB, 4 * KIB).is_ok());
    }

    #[test]
    fn magics_are_ascii() {
        assert_eq!(&DATA_MAGIC.to_le_bytes(), b"JOADERDS");
        assert_eq!(&RING_MAGIC.to_le_bytes(), b"JOADERRG");
    }
}
