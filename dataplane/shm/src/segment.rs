//! Server side of the data segment: creation and lifecycle, slot table,
//! arena allocation and read bits.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::alloc::{Arena, ArenaStats};
use crate::error::{Error, Result};
use crate::instance::{InstanceLock, remove_stale_objects};
use crate::layout::{
    DATA_MAGIC, DataLayout, Format, LAYOUT_VERSION, hdr, page_size, seg_state, slot, slot_state,
};
use crate::names;
use crate::ring::RingWriter;
use crate::shm::{self, Mapping};

/// Parameters of a data segment.
#[derive(Debug, Clone)]
pub struct SegmentConfig {
    /// Instance name (see [`names::validate_instance`]); all objects are named `joader-<instance>-…`.
    pub instance: String,
    /// Number of slots in the slot table (maximum number of cached elements).
    pub slots: u32,
    /// Arena size in bytes (rounded up to 64 KiB, see [`crate::MAP_ALIGN`]).
    pub arena_bytes: u64,
    /// Read-bit words per slot; the segment supports `64 × read_words` readers. Default 2 (128 readers).
    pub read_words: u32,
    /// Allocate all pages at creation (`fallocate`), so that a full `/dev/shm`
    /// is an error at start-up rather than a `SIGBUS` later. Default true.
    pub reserve: bool,
    /// Mode and group of the data segment and the rings (clients open them). Default 0600,
    /// the server's group.
    pub access: shm::Access,
}

impl SegmentConfig {
    /// A config with the default read words (2) and page reservation on.
    pub fn new(instance: impl Into<String>, slots: u32, arena_bytes: u64) -> SegmentConfig {
        SegmentConfig {
            instance: instance.into(),
            slots,
            arena_bytes,
            read_words: 2,
            reserve: true,
            access: shm::Access::default(),
        }
    }
}

/// A reference to the current contents of a slot. The generation makes a
/// reference to an older use of the same slot detectably stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotRef {
    /// Slot index in the slot table.
    pub slot: u32,
    /// Generation of the slot when the reference was made.
    pub generation: u32,
}

/// What the server knows about an element it stores in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMeta {
    /// Element (data tuple) id.
    pub element_id: u32,
    /// Label, copied into every ring record that references the slot.
    pub label: i64,
    /// Payload format.
    pub format: Format,
    /// Bytes of the small fields' block stored right after the payload (0: none; see
    /// [`crate::fields`]). The payload given to [`Writer::write_slot_with`] ends with them.
    pub fields_len: u32,
    /// The image's `(height, width)` before the server's pipeline decoded and resized it (the
    /// stored file's), `(0, 0)` when not known (raw bytes): what annotations made on the
    /// original image are scaled from.
    pub source: (u32, u32),
}

#[derive(Debug, Clone, Copy)]
struct SlotInfo {
    generation: u32,
    state: u32,
    offset: u64,
    len: u64,
    meta: Option<SlotMeta>,
}

#[derive(Debug)]
pub(crate) struct State {
    slots: Vec<SlotInfo>,
    free_slots: Vec<u32>,
    arena: Arena,
    readers: Vec<u64>,
}

/// State shared by the [`Writer`] and its [`RingWriter`]s.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) instance: String,
    pub(crate) name: String,
    pub(crate) map: Mapping,
    pub(crate) layout: DataLayout,
    pub(crate) boot_id: u64,
    pub(crate) reserve: bool,
    pub(crate) access: shm::Access,
    state: Mutex<State>,
    // Held with an exclusive flock for the server's lifetime: clients probe it
    // with a shared non-blocking flock to detect a dead server.
    _data_fd: OwnedFd,
    // Dropped last (field order): unlinks the lock object after everything else.
    _lock: InstanceLock,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough state (each
        // critical section is a few field updates); keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bits_off(&self, s: u32, reader: u32) -> (usize, u64) {
        let off = self.layout.slot_off(s) + slot::READ_BITS + 8 * (reader / 64) as usize;
        (off, 1u64 << (reader % 64))
    }

    pub(crate) fn set_read_bit(&self, s: u32, reader: u32) {
        let (off, mask) = self.bits_off(s, reader);
        // AcqRel: orders with other server threads clearing bits / freeing.
        self.map.atomic_u64(off).fetch_or(mask, Ordering::AcqRel);
    }

    pub(crate) fn clear_read_bit(&self, s: u32, reader: u32) -> bool {
        let (off, mask) = self.bits_off(s, reader);
        self.map.atomic_u64(off).fetch_and(!mask, Ordering::AcqRel) & mask != 0
    }

    pub(crate) fn read_bits(&self, s: u32) -> Vec<u64> {
        let base = self.layout.slot_off(s) + slot::READ_BITS;
        (0..self.layout.read_words as usize)
            .map(|w| self.map.atomic_u64(base + 8 * w).load(Ordering::Acquire))
            .collect()
    }

    fn pinned(&self, s: u32) -> Option<u64> {
        let bits = self.read_bits(s);
        bits.iter().any(|&b| b != 0).then(|| bits[0])
    }

    /// Validates `r` against the current slot table; returns the slot's metadata.
    pub(crate) fn check_ref(st: &State, r: SlotRef) -> Result<SlotMeta> {
        let info = st.slots.get(r.slot as usize).ok_or(Error::StaleSlot {
            slot: r.slot,
            expected: r.generation,
            current: 0,
        })?;
        match info.meta {
            Some(meta)
                if info.generation == r.generation && info.state == slot_state::PUBLISHED =>
            {
                Ok(meta)
            }
            _ => Err(Error::StaleSlot {
                slot: r.slot,
                expected: r.generation,
                current: info.generation,
            }),
        }
    }

    pub(crate) fn alloc_reader(&self) -> Result<u32> {
        let mut st = self.lock();
        let max = self.layout.max_readers();
        for (w, word) in st.readers.iter_mut().enumerate() {
            if *word != u64::MAX {
                let bit = (!*word).trailing_zeros();
                *word |= 1 << bit;
                return Ok(w as u32 * 64 + bit);
            }
        }
        Err(Error::TooManyReaders { max })
    }

    pub(crate) fn release_reader(&self, reader: u32) {
        self.sweep_reader(reader);
        let mut st = self.lock();
        st.readers[(reader / 64) as usize] &= !(1u64 << (reader % 64));
    }

    /// Clears `reader`'s bit in every slot; returns how many were set.
    pub(crate) fn sweep_reader(&self, reader: u32) -> usize {
        (0..self.layout.slot_count)
            .filter(|&s| self.clear_read_bit(s, reader))
            .count()
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.map.atomic_u32(hdr::STATE).load(Ordering::Acquire) == seg_state::SHUT_DOWN
    }
}

/// The server's handle on a data segment: creates it, writes slots into the
/// arena and creates the delivery rings. Dropping it marks the segment shut
/// down (clients fail with `server_gone`) and unlinks it.
///
/// `Writer` is `Send + Sync`; its methods take `&self` and serialise on an
/// internal mutex held only for a few field updates (never while copying
/// payloads).
#[derive(Debug)]
pub struct Writer {
    shared: Arc<Shared>,
    stale_removed: Vec<String>,
}

fn boot_id() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ ((std::process::id() as u64) << 32) ^ (&nanos as *const u64 as u64);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    (x ^ (x >> 31)) | 1
}

impl Writer {
    /// Creates the data segment of `cfg.instance`.
    ///
    /// Takes the instance lock first (fails with `instance_in_use` when a live
    /// server holds it), then removes every stale object of the instance left
    /// by a dead server, checks `/dev/shm` free space, creates the segment
    /// exclusively with `cfg.access` (mode 0600 by default) and publishes its header, layout version last.
    pub fn create(cfg: &SegmentConfig) -> Result<Writer> {
        names::validate_instance(&cfg.instance)?;
        let layout = DataLayout::compute(cfg.slots, cfg.read_words, cfg.arena_bytes, page_size())?;
        let lock = InstanceLock::acquire(&cfg.instance)?;
        let stale_removed = remove_stale_objects(&cfg.instance, &lock.name);
        let name = names::data_segment(&cfg.instance);
        let fd = shm::create_exclusive(&name, layout.total_size, cfg.reserve, cfg.access)?;
        let created = (|| {
            // Fresh object: nobody else can hold its lock yet.
            shm::try_flock(&fd, true).map_err(|e| Error::io("flock", &name, e))?;
            Mapping::map(&fd, &name, 0, layout.total_size as usize, true)
        })();
        let map = match created {
            Ok(m) => m,
            Err(e) => {
                let _ = shm::unlink(&name);
                return Err(e);
            }
        };
        let boot_id = boot_id();
        map.write_u64(hdr::MAGIC, DATA_MAGIC);
        layout.write_to(&map);
        map.write_u32(hdr::SERVER_PID, std::process::id());
        map.write_u64(hdr::BOOT_ID, boot_id);
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        map.write_u64(hdr::CREATED_UNIX_MS, ms);
        map.atomic_u32(hdr::STATE)
            .store(seg_state::RUNNING, Ordering::Relaxed);
        // The slot table is all zeroes (ftruncate): generation 0, state FREE, no read bits.
        // Release: publishes every header field above to openers that load the version with Acquire.
        map.atomic_u32(hdr::VERSION)
            .store(LAYOUT_VERSION, Ordering::Release);
        let state = State {
            slots: vec![
                SlotInfo {
                    generation: 0,
                    state: slot_state::FREE,
                    offset: 0,
                    len: 0,
                    meta: None,
                };
                layout.slot_count as usize
            ],
            free_slots: (0..layout.slot_count).rev().collect(),
            arena: Arena::new(layout.arena_size),
            readers: vec![0; layout.read_words as usize],
        };
        Ok(Writer {
            shared: Arc::new(Shared {
                instance: cfg.instance.clone(),
                name,
                map,
                layout,
                boot_id,
                reserve: cfg.reserve,
                access: cfg.access,
                state: Mutex::new(state),
                _data_fd: fd,
                _lock: lock,
            }),
            stale_removed,
        })
    }

    /// Instance name.
    pub fn instance(&self) -> &str {
        &self.shared.instance
    }

    /// Name of the data segment in `/dev/shm`.
    pub fn segment_name(&self) -> &str {
        &self.shared.name
    }

    /// Random id of this server start, also written into every ring.
    pub fn boot_id(&self) -> u64 {
        self.shared.boot_id
    }

    /// Names of stale objects removed at creation (left by a dead server of the same instance).
    pub fn stale_removed(&self) -> &[String] {
        &self.stale_removed
    }

    /// Number of slots.
    pub fn slot_count(&self) -> u32 {
        self.shared.layout.slot_count
    }

    /// Number of free slots.
    pub fn free_slots(&self) -> u32 {
        self.shared.lock().free_slots.len() as u32
    }

    /// Maximum number of readers (rings) at once.
    pub fn max_readers(&self) -> u32 {
        self.shared.layout.max_readers()
    }

    /// Arena counters.
    pub fn arena_stats(&self) -> ArenaStats {
        self.shared.lock().arena.stats()
    }

    /// Copies `payload` into a new slot and publishes it.
    ///
    /// Fails with `arena_full` or `no_free_slot` (evict or back off), or
    /// `invalid_config` when the payload length contradicts the format.
    pub fn write_slot(&self, meta: SlotMeta, payload: &[u8]) -> Result<SlotRef> {
        self.write_slot_with(meta, payload.len() as u64, |buf| {
            buf.copy_from_slice(payload)
        })
    }

    /// Takes a free slot and `len` bytes of the arena for it, in state `WRITING` with its
    /// next generation. Returns (slot, generation, offset).
    fn reserve_slot(&self, len: u64) -> Result<(u32, u32, u64)> {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let Some(s) = st.free_slots.pop() else {
            return Err(Error::NoFreeSlot {
                slots: sh.layout.slot_count,
            });
        };
        let offset = match st.arena.alloc(len) {
            Ok(o) => o,
            Err(e) => {
                st.free_slots.push(s);
                return Err(e);
            }
        };
        let info = &mut st.slots[s as usize];
        // Generation 0 means "never used"; skip it on wrap-around.
        info.generation = info.generation.wrapping_add(1).max(1);
        info.state = slot_state::WRITING;
        info.offset = offset;
        info.len = len;
        info.meta = None;
        Ok((s, info.generation, offset))
    }

    /// Allocates a slot of `len` bytes, lets `fill` write the payload in place
    /// (e.g. a decoder writing straight into shared memory), then publishes it.
    /// `len` counts the field block of `meta.fields_len` bytes that ends the payload.
    pub fn write_slot_with(
        &self,
        meta: SlotMeta,
        len: u64,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<SlotRef> {
        let image_len = image_len(&meta, len)?;
        let sh = &*self.shared;
        let (s, generation, offset) = self.reserve_slot(len)?;
        let base = sh.layout.slot_off(s);
        sh.map
            .atomic_u32(base + slot::STATE)
            .store(slot_state::WRITING, Ordering::Relaxed);
        // If `fill` panics, give the slot and its block back before unwinding on.
        struct Undo<'a>(&'a Shared, u32, u64, u64, bool);
        impl Drop for Undo<'_> {
            fn drop(&mut self) {
                if self.4 {
                    let mut st = self.0.lock();
                    st.slots[self.1 as usize].state = slot_state::FREE;
                    st.arena.free(self.2, self.3);
                    st.free_slots.push(self.1);
                }
            }
        }
        let mut undo = Undo(sh, s, offset, len, true);
        self.fill_block(offset, len, fill);
        undo.4 = false;
        let (h, w, c) = match meta.format {
            Format::Raw => (0, 0, 0),
            Format::HwcU8 {
                height,
                width,
                channels,
            } => (height, width, channels),
        };
        let m = &sh.map;
        m.write_u64(base + slot::OFFSET, offset);
        m.write_u64(base + slot::LENGTH, image_len);
        m.write_u32(base + slot::FIELDS_LEN, meta.fields_len);
        m.write_u32(base + slot::ELEMENT_ID, meta.element_id);
        m.write_u32(base + slot::FORMAT, meta.format.code());
        m.write_u32(base + slot::HEIGHT, h);
        m.write_u32(base + slot::WIDTH, w);
        m.write_u32(base + slot::CHANNELS, c);
        m.write_u32(base + slot::SOURCE_HEIGHT, meta.source.0);
        m.write_u32(base + slot::SOURCE_WIDTH, meta.source.1);
        m.write_u64(base + slot::LABEL, meta.label as u64);
        m.atomic_u32(base + slot::GENERATION)
            .store(generation, Ordering::Relaxed);
        // Readers synchronise on the ring tail (Release in RingWriter::publish),
        // which is stored after this; this Release only orders debug tools.
        m.atomic_u32(base + slot::STATE)
            .store(slot_state::PUBLISHED, Ordering::Release);
        let mut st = sh.lock();
        let info = &mut st.slots[s as usize];
        info.state = slot_state::PUBLISHED;
        info.meta = Some(meta);
        Ok(SlotRef {
            slot: s,
            generation,
        })
    }

    #[allow(unsafe_code)]
    fn fill_block(&self, offset: u64, len: u64, fill: impl FnOnce(&mut [u8])) {
        let start = (self.shared.layout.arena_offset + offset) as usize;
        // SAFETY: the block [offset, offset+len) was just allocated to slot `s`
        // under the state mutex, so no other allocation overlaps it; the slot
        // is in state WRITING and referenced by no ring record, so no reader
        // reads it (I3/I4); and this is the only reference to it in the server.
        let buf = unsafe { self.shared.map.bytes_mut(start, len as usize) };
        fill(buf);
    }

    /// Frees a slot and its arena block. Fails with `slot_pinned` while any
    /// reader still holds it (a read bit is set), `stale_slot` when the
    /// reference is not current.
    pub fn free_slot(&self, r: SlotRef) -> Result<()> {
        let sh = &*self.shared;
        let mut st = sh.lock();
        Shared::check_ref(&st, r)?;
        // Bits are only set under this mutex (RingWriter::push_data), so a
        // zero here cannot race with a new pin.
        if let Some(bits) = sh.pinned(r.slot) {
            return Err(Error::SlotPinned { slot: r.slot, bits });
        }
        let (offset, len) = {
            let info = &mut st.slots[r.slot as usize];
            info.state = slot_state::FREE;
            info.meta = None;
            (info.offset, info.len)
        };
        st.arena.free(offset, len);
        st.free_slots.push(r.slot);
        sh.map
            .atomic_u32(sh.layout.slot_off(r.slot) + slot::STATE)
            .store(slot_state::FREE, Ordering::Release);
        Ok(())
    }

    /// Whether any reader's read bit is set on the slot.
    pub fn is_pinned(&self, r: SlotRef) -> bool {
        self.shared.pinned(r.slot).is_some()
    }

    /// Reader indices whose read bit is set on the slot.
    pub fn readers_of(&self, r: SlotRef) -> Vec<u32> {
        let bits = self.shared.read_bits(r.slot);
        let mut out = Vec::new();
        for (w, word) in bits.iter().enumerate() {
            for b in 0..64 {
                if word & (1 << b) != 0 {
                    out.push(w as u32 * 64 + b);
                }
            }
        }
        out
    }

    /// Metadata of a live slot.
    pub fn slot_meta(&self, r: SlotRef) -> Result<SlotMeta> {
        Shared::check_ref(&self.shared.lock(), r)
    }

    /// Bytes a live slot takes in the arena: its payload (fields included), rounded up to
    /// the arena's block.
    pub fn slot_len(&self, r: SlotRef) -> Result<u64> {
        let st = self.shared.lock();
        Shared::check_ref(&st, r)?;
        Ok(Arena::rounded(st.slots[r.slot as usize].len))
    }

    /// Creates the delivery ring `name` (segment `joader-<instance>-ring-<name>`)
    /// with room for `capacity` records (rounded up to a power of two), and
    /// assigns it a reader index (its read bit).
    pub fn create_ring(&self, name: &str, capacity: u32) -> Result<RingWriter> {
        RingWriter::create(self.shared.clone(), name, capacity)
    }

    /// Clears `reader`'s read bit in every slot; returns the number of slots it
    /// held. [`RingWriter::reclaim_reader`] is the usual entry point (it also
    /// reports which slots); this sweep is the belt-and-braces version.
    pub fn reclaim_reader(&self, reader: u32) -> usize {
        self.shared.sweep_reader(reader)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Release: clients that see SHUT_DOWN stop waiting on this segment.
        self.shared
            .map
            .atomic_u32(hdr::STATE)
            .store(seg_state::SHUT_DOWN, Ordering::Release);
        let _ = shm::unlink(&self.shared.name);
    }
}
/// The image's bytes of a payload of `len` bytes (the field block of `meta.fields_len` bytes
/// ends it), checked against the format.
fn image_len(meta: &SlotMeta, len: u64) -> Result<u64> {
    let fields_len = u64::from(meta.fields_len);
    let Some(image_len) = len.checked_sub(fields_len) else {
        return Err(Error::InvalidConfig(format!(
            "payload of {len} bytes is shorter than its field block ({fields_len} bytes)"
        )));
    };
    if let Some(expected) = meta.format.expected_len()
        && expected != image_len
    {
        return Err(Error::InvalidConfig(format!(
            "payload of {image_len} bytes does not match format {:?} ({expected} bytes)",
            meta.format
        )));
    }
    Ok(image_len)
}
