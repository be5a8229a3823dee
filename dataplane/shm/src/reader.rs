//! Client side: opens the data segment read-only and its own ring, waits for
//! records without busy polling, hands out zero-copy views, acknowledges.
//!
//! [`Reader`] is the Rust API. The Python package drives the same machinery
//! through [`RawReader`], which has no borrows (batches are identified by
//! their record range) so that it can live inside a Python object and release
//! the GIL while waiting.
//!
//! (Longer than this codebase's usual 600 lines on purpose: this is the client's half of the
//! ring protocol, and every acquire here pairs with a release in `ring.rs`/`segment.rs` as
//! `DESIGN.md` lists them; one file keeps the pairs readable together.)

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use crate::collate;
use crate::error::{Error, Result};
use crate::futex;
use crate::layout::{
    DataLayout, Format, RecordKind, RingLayout, consumer_state, copy_header, hdr, page_size, rec,
    ring, seg_state, slot, slot_state,
};
use crate::names;
use crate::shm::{self, Mapping};

/// How often a waiting client re-checks that the server is alive.
pub const LIVENESS_SLICE: Duration = Duration::from_millis(100);
/// Default time `Reader::open` waits for the segments to exist and be ready.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// One element of a batch, without the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemMeta {
    /// Element id.
    pub element_id: u32,
    /// Label.
    pub label: i64,
    /// Epoch the element was delivered in.
    pub epoch: u64,
    /// Position of the element in the job's epoch.
    pub position: u64,
    /// Slot holding the payload.
    pub slot: u32,
    /// Slot generation.
    pub generation: u32,
    /// Payload format.
    pub format: Format,
    /// Payload offset from the start of the data segment.
    pub offset: u64,
    /// Payload length.
    pub len: u64,
    /// Length of the small fields' block right after the payload (0: none; see
    /// [`crate::fields`]).
    pub fields_len: u64,
    /// The image's `(height, width)` before the server's pipeline resized it, `(0, 0)` when
    /// not known ([`crate::SlotMeta::source`]).
    pub source: (u32, u32),
}

/// An element the server failed to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementError {
    /// Element id.
    pub element_id: u32,
    /// Error code (see [`crate::element_error`]).
    pub code: u32,
    /// Epoch.
    pub epoch: u64,
    /// Position in the epoch.
    pub position: u64,
}

/// End-of-epoch marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEnd {
    /// The epoch that ended.
    pub epoch: u64,
    /// Number of data and error records the server sent in that epoch.
    pub count: u64,
}

/// A batch identified by its record range `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawBatch {
    /// First record.
    pub start: u64,
    /// One past the last record.
    pub end: u64,
    /// Data items, in delivery order.
    pub items: Vec<ItemMeta>,
    /// Failed elements, in delivery order.
    pub errors: Vec<ElementError>,
    /// Set when the batch ends an epoch.
    pub end_of_epoch: Option<EpochEnd>,
    /// Set when the job is finished.
    pub end_of_stream: bool,
    /// The batch holds its epoch's last data or error record in this ring (the server
    /// marks it): the next record is the epoch's end.
    pub last_of_epoch: bool,
}

/// Immutable part of an open reader: the mappings and what was validated at open.
#[derive(Debug)]
pub(crate) struct Maps {
    instance: String,
    ring: String,
    data_name: String,
    ring_name: String,
    data: Arc<Mapping>,
    data_layout: DataLayout,
    data_fd: OwnedFd,
    ring_ro: Mapping,
    /// The consumer page (offsets `ring::HEAD`, … from its start).
    ring_ctl: Mapping,
    _ring_fd: OwnedFd,
    ring_layout: RingLayout,
    server_pid: u32,
    boot_id: u64,
    reader_index: u32,
}

/// Mutable consumer state.
#[derive(Debug, Default)]
struct Cursor {
    head: u64,
    ack: u64,
    outstanding: BTreeMap<u64, u64>,
    end_of_stream: bool,
}

/// Client of one ring without borrow-tracked batches (used by the Python
/// bindings): [`take`](Self::take) returns record ranges; the caller must
/// stop using a batch's bytes before [`release`](Self::release)ing it.
#[derive(Debug)]
pub struct RawReader {
    maps: Maps,
    cur: Cursor,
}

fn wait_until<T>(deadline: Instant, mut f: impl FnMut() -> Result<Option<T>>) -> Result<Option<T>> {
    loop {
        if let Some(v) = f()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Opens `name` and waits until it is sized and its version word is
/// non-zero; the caller validates the header. Returns the fd, the mapping
/// and the size.
fn open_ready(
    name: &str,
    writable: bool,
    version_off: usize,
    deadline: Instant,
    started: Instant,
) -> Result<(OwnedFd, Mapping, u64)> {
    let fd = wait_until(deadline, || match shm::open_existing(name, writable) {
        Ok(fd) => Ok(Some(fd)),
        Err(Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })?
    .ok_or_else(|| Error::NotFound { name: name.into() })?;
    let not_ready = || Error::NotReady {
        name: name.into(),
        waited_ms: started.elapsed().as_millis() as u64,
    };
    // The creator sizes the object right after creating it.
    let size = wait_until(deadline, || {
        let s = shm::size_of(&fd, name)?;
        Ok((s >= hdr::SIZE as u64).then_some(s))
    })?
    .ok_or_else(not_ready)?;
    let map = Mapping::map(&fd, name, 0, size as usize, false)?;
    // Acquire: pairs with the creator's Release store of the version, which
    // it writes after every other header field (I1).
    wait_until(deadline, || {
        let v = map.atomic_u32(version_off).load(Ordering::Acquire);
        Ok((v != 0).then_some(v))
    })?
    .ok_or_else(not_ready)?;
    Ok((fd, map, size))
}

/// The ring's reader index, once the ring is checked to belong to the same server start as
/// the data segment (not a stale ring of a restarted server) and its index is in range.
fn ring_reader_index(
    ring_ro: &Mapping,
    ring_name_full: &str,
    boot_id: u64,
    data_layout: &DataLayout,
) -> Result<u32> {
    let ring_boot = ring_ro.read_u64(ring::BOOT_ID);
    if ring_boot != boot_id {
        return Err(Error::Corrupt {
            name: ring_name_full.into(),
            reason: format!(
                "ring belongs to server start {ring_boot:#x}, data segment to {boot_id:#x} (stale ring of a restarted server)"
            ),
        });
    }
    let reader_index = ring_ro.read_u32(ring::READER_INDEX);
    if reader_index >= data_layout.max_readers() {
        return Err(Error::Corrupt {
            name: ring_name_full.into(),
            reason: format!("reader index {reader_index} out of range"),
        });
    }
    Ok(reader_index)
}

/// Attaches to the ring as its one consumer: takes its exclusive lock (a live client holds
/// it; the server's liveness probe takes a shared one for an instant, hence the short retry),
/// requires a ring never attached before, records our pid and marks it attached. Returns the
/// acknowledged position to read from.
fn attach(
    ring_fd: &std::os::fd::OwnedFd,
    ring_ctl: &Mapping,
    ring_name_full: &str,
    ring_name: &str,
) -> Result<u64> {
    let locked = wait_until(Instant::now() + Duration::from_millis(300), || {
        shm::try_flock(ring_fd, true)
            .map(|ok| ok.then_some(()))
            .map_err(|e| Error::io("flock", ring_name_full, e))
    })?;
    if locked.is_none() {
        return Err(Error::RingInUse {
            ring: ring_name.into(),
        });
    }
    let ctl_state = ring_ctl.atomic_u32(ring::CONSUMER_STATE);
    if ctl_state.load(Ordering::Acquire) != consumer_state::NEVER {
        return Err(Error::RingAbandoned {
            ring: ring_name.into(),
        });
    }
    let ack = ring_ctl.atomic_u64(ring::ACK).load(Ordering::Relaxed);
    ring_ctl
        .atomic_u32(ring::CONSUMER_PID)
        .store(std::process::id(), Ordering::Relaxed);
    ctl_state.store(consumer_state::ATTACHED, Ordering::Release);
    Ok(ack)
}

impl RawReader {
    /// Opens ring `ring` of `instance`, waiting up to `timeout` for both
    /// segments to exist and be ready.
    pub fn open(instance: &str, ring_name: &str, timeout: Duration) -> Result<RawReader> {
        names::validate_instance(instance)?;
        names::validate_ring(ring_name)?;
        let started = Instant::now();
        let deadline = started + timeout;
        let data_name = names::data_segment(instance);
        let page = page_size();
        let (data_fd, data, data_size) =
            open_ready(&data_name, false, hdr::VERSION, deadline, started)?;
        let data_layout = DataLayout::validate(&copy_header(&data), &data_name, data_size, page)?;
        let server_pid = data.read_u32(hdr::SERVER_PID);
        let boot_id = data.read_u64(hdr::BOOT_ID);

        let ring_name_full = names::ring_segment(instance, ring_name);
        let (ring_fd, ring_ro, ring_size) =
            open_ready(&ring_name_full, true, ring::VERSION, deadline, started)?;
        let ring_layout =
            RingLayout::validate(&copy_header(&ring_ro), &ring_name_full, ring_size, page)?;
        let reader_index = ring_reader_index(&ring_ro, &ring_name_full, boot_id, &data_layout)?;
        // Only the consumer page is writable for us (I6).
        let ring_ctl = Mapping::map(
            &ring_fd,
            &ring_name_full,
            ring_layout.consumer_offset,
            ring_layout.consumer_len as usize,
            true,
        )?;
        let ack = attach(&ring_fd, &ring_ctl, &ring_name_full, ring_name)?;

        let r = RawReader {
            maps: Maps {
                instance: instance.into(),
                ring: ring_name.into(),
                data_name,
                ring_name: ring_name_full,
                data: Arc::new(data),
                data_layout,
                data_fd,
                ring_ro,
                ring_ctl,
                _ring_fd: ring_fd,
                ring_layout,
                server_pid,
                boot_id,
                reader_index,
            },
            cur: Cursor {
                head: ack,
                ack,
                ..Cursor::default()
            },
        };
        r.check_server()?;
        Ok(r)
    }

    /// Instance name.
    pub fn instance(&self) -> &str {
        &self.maps.instance
    }

    /// Ring name.
    pub fn ring(&self) -> &str {
        &self.maps.ring
    }

    /// This ring's reader index.
    pub fn reader_index(&self) -> u32 {
        self.maps.reader_index
    }

    /// Name of the ring segment in `/dev/shm`.
    pub fn segment_name(&self) -> &str {
        &self.maps.ring_name
    }

    /// Pid of the server that created the segment.
    pub fn server_pid(&self) -> u32 {
        self.maps.server_pid
    }

    /// Boot id of the server start that created the segment.
    pub fn boot_id(&self) -> u64 {
        self.maps.boot_id
    }

    /// Ring capacity.
    pub fn capacity(&self) -> u32 {
        self.maps.ring_layout.capacity
    }

    /// Fails with `server_gone` when the server shut down, died or restarted.
    pub fn check_server(&self) -> Result<()> {
        let m = &self.maps;
        if m.data.atomic_u32(hdr::STATE).load(Ordering::Acquire) == seg_state::SHUT_DOWN {
            return Err(Error::ServerGone {
                reason: format!(
                    "server (pid {}) shut down segment {:?}",
                    m.server_pid, m.data_name
                ),
            });
        }
        // The server holds an exclusive flock on the data segment for its
        // whole life; if we can take a shared one, it is dead.
        match shm::try_flock(&m.data_fd, false) {
            Ok(true) => {
                let _ = shm::unflock(&m.data_fd);
                Err(Error::ServerGone {
                    reason: format!(
                        "server process {} that owned {:?} has exited",
                        m.server_pid, m.data_name
                    ),
                })
            }
            Ok(false) => Ok(()),
            Err(e) => Err(Error::io("flock", &m.data_name, e)),
        }
    }

    fn closed(&self) -> bool {
        self.maps
            .ring_ro
            .atomic_u32(ring::FLAGS)
            .load(Ordering::Acquire)
            & ring::FLAG_CLOSED
            != 0
    }

    fn load_tail(&self) -> Result<u64> {
        // Acquire: pairs with the server's Release store in RingWriter::publish;
        // makes the records before `tail`, their slots' metadata and payloads visible.
        let tail = self
            .maps
            .ring_ro
            .atomic_u64(ring::TAIL)
            .load(Ordering::Acquire);
        if tail < self.cur.head || tail - self.cur.ack > self.maps.ring_layout.capacity as u64 {
            return Err(Error::Protocol(format!(
                "ring {:?}: server tail {tail} inconsistent with head {} / ack {}",
                self.maps.ring, self.cur.head, self.cur.ack
            )));
        }
        Ok(tail)
    }

    /// Sleeps until the tail moves past `head`, the ring closes or `until`.
    fn wait_tail(&self, until: Instant) {
        let ro = &self.maps.ring_ro;
        let ev = ro.atomic_u32(ring::TAIL_EVENT);
        let seen = ev.load(Ordering::Acquire);
        let waiting = self.maps.ring_ctl.atomic_u32(ring::CONSUMER_WAITING);
        waiting.store(1, Ordering::Relaxed);
        // Pairs with the fence in RingWriter::publish (no lost wake-up).
        fence(Ordering::SeqCst);
        let tail = ro.atomic_u64(ring::TAIL).load(Ordering::Acquire);
        if tail == self.cur.head && !self.closed() {
            let now = Instant::now();
            if until > now {
                futex::wait(ev, seen, until - now);
            }
        }
        waiting.store(0, Ordering::Relaxed);
    }

    /// Records have been pushed that this reader has not taken.
    pub fn has_pending(&self) -> bool {
        self.load_tail().is_ok_and(|t| t > self.cur.head)
    }

    /// The record at `pos` ends the epoch or the stream.
    fn is_end_record(&self, pos: u64) -> bool {
        let off = self.maps.ring_layout.record_off(pos);
        matches!(
            RecordKind::from_u32(self.maps.ring_ro.read_u32(off + rec::KIND)),
            Some(RecordKind::EndOfEpoch | RecordKind::EndOfStream)
        )
    }

    fn read_record(&self, pos: u64, out: &mut RawBatch) -> Result<()> {
        let m = &self.maps;
        let off = m.ring_layout.record_off(pos);
        let r = &m.ring_ro;
        let kind = r.read_u32(off + rec::KIND);
        let epoch = r.read_u64(off + rec::EPOCH);
        let position = r.read_u64(off + rec::POSITION);
        let element_id = r.read_u32(off + rec::ELEMENT_ID);
        // Data and error records only: the ends write 0 there.
        out.last_of_epoch |= r.read_u32(off + rec::FLAGS) & rec::FLAG_LAST_OF_EPOCH != 0;
        match RecordKind::from_u32(kind) {
            Some(RecordKind::Data) => {
                let s = r.read_u32(off + rec::SLOT);
                let generation = r.read_u32(off + rec::GENERATION);
                let label = r.read_u64(off + rec::LABEL) as i64;
                out.items
                    .push(self.validate_slot(s, generation, element_id, label, epoch, position)?);
            }
            Some(RecordKind::Error) => out.errors.push(ElementError {
                element_id,
                code: r.read_u32(off + rec::ERROR_CODE),
                epoch,
                position,
            }),
            Some(RecordKind::EndOfEpoch) => {
                out.end_of_epoch = Some(EpochEnd {
                    epoch,
                    count: position,
                })
            }
            Some(RecordKind::EndOfStream) => out.end_of_stream = true,
            None => {
                return Err(Error::Protocol(format!(
                    "ring {:?}: record {pos} has unknown kind {kind}",
                    m.ring
                )));
            }
        }
        Ok(())
    }

    /// Checks a data record's slot against the (untrusted) slot table, so a
    /// server bug surfaces as an error rather than an out-of-bounds read.
    fn validate_slot(
        &self,
        s: u32,
        generation: u32,
        element_id: u32,
        label: i64,
        epoch: u64,
        position: u64,
    ) -> Result<ItemMeta> {
        let m = &self.maps;
        let l = &m.data_layout;
        let bad = |reason: String| Error::Protocol(format!("ring {:?}: {reason}", m.ring));
        if s >= l.slot_count {
            return Err(bad(format!("slot {s} out of range")));
        }
        let base = l.slot_off(s);
        let d = &m.data;
        let current = d
            .atomic_u32(base + slot::GENERATION)
            .load(Ordering::Relaxed);
        let state = d.atomic_u32(base + slot::STATE).load(Ordering::Relaxed);
        if current != generation || state != slot_state::PUBLISHED {
            return Err(bad(format!(
                "slot {s} has generation {current} state {state}, record expects generation {generation} published"
            )));
        }
        let offset = d.read_u64(base + slot::OFFSET);
        let len = d.read_u64(base + slot::LENGTH);
        let fields_len = u64::from(d.read_u32(base + slot::FIELDS_LEN));
        if offset
            .checked_add(len)
            .and_then(|e| e.checked_add(fields_len))
            .is_none_or(|e| e > l.arena_size)
        {
            return Err(bad(format!(
                "slot {s} payload {offset}+{len}+{fields_len} outside the arena"
            )));
        }
        let format = Format::decode(
            d.read_u32(base + slot::FORMAT),
            d.read_u32(base + slot::HEIGHT),
            d.read_u32(base + slot::WIDTH),
            d.read_u32(base + slot::CHANNELS),
        )
        .ok_or_else(|| bad(format!("slot {s} has an unknown format")))?;
        if format.expected_len().is_some_and(|e| e != len) {
            return Err(bad(format!(
                "slot {s} format {format:?} does not match length {len}"
            )));
        }
        Ok(ItemMeta {
            element_id,
            label,
            epoch,
            position,
            slot: s,
            generation,
            format,
            offset: l.arena_offset + offset,
            len,
            fields_len,
            source: (
                d.read_u32(base + slot::SOURCE_HEIGHT),
                d.read_u32(base + slot::SOURCE_WIDTH),
            ),
        })
    }

    /// Takes up to `max_items` data records.
    ///
    /// Returns when it has `max_items` data items, when it reaches an
    /// end-of-epoch or end-of-stream record (which ends the batch), when the
    /// ring is full from the consumer's side (the server cannot push more
    /// until something is acknowledged), or when `timeout` elapses (`None`:
    /// wait as long as the server lives). The batch may then be partial or
    /// empty. While waiting it re-checks every 100 ms that the server is
    /// alive and fails with `server_gone` if not; after the server closed the
    /// ring and everything was read, fails with `ring_closed`.
    pub fn take(&mut self, max_items: usize, timeout: Option<Duration>) -> Result<RawBatch> {
        self.take_inner(max_items, timeout, false)
    }

    /// Takes the next record only if it ends the epoch or the stream, waiting for it as
    /// [`take`](Self::take) waits: after a record marked the last of its epoch
    /// ([`RawBatch::last_of_epoch`]) the end follows, and a client whose batch is full reads
    /// it with that batch. A data or error record is left in place (the batch is empty).
    pub fn take_end(&mut self, timeout: Option<Duration>) -> Result<RawBatch> {
        self.take_inner(1, timeout, true)
    }

    /// Reads the records published up to `tail` into `out`, until `max_items` items, an end
    /// of epoch or of the stream. With `ends_only`, stops before a record that is not an end
    /// and returns true.
    fn read_available(
        &mut self,
        tail: u64,
        max_items: usize,
        ends_only: bool,
        out: &mut RawBatch,
    ) -> Result<bool> {
        while self.cur.head < tail
            && out.items.len() < max_items
            && out.end_of_epoch.is_none()
            && !out.end_of_stream
        {
            if ends_only && !self.is_end_record(self.cur.head) {
                return Ok(true);
            }
            self.read_record(self.cur.head, out)?;
            self.cur.head += 1;
        }
        Ok(false)
    }

    fn take_inner(
        &mut self,
        max_items: usize,
        timeout: Option<Duration>,
        ends_only: bool,
    ) -> Result<RawBatch> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let mut out = RawBatch {
            start: self.cur.head,
            end: self.cur.head,
            ..RawBatch::default()
        };
        let max_items = max_items.max(1);
        if self.cur.end_of_stream {
            return Ok(out);
        }
        let cap = self.maps.ring_layout.capacity as u64;
        let result = loop {
            let tail = match self.load_tail() {
                Ok(t) => t,
                Err(e) => break Err(e),
            };
            let not_an_end = match self.read_available(tail, max_items, ends_only, &mut out) {
                Ok(n) => n,
                Err(e) => break Err(e),
            };
            if not_an_end
                || out.items.len() >= max_items
                || out.end_of_epoch.is_some()
                || out.end_of_stream
            {
                break Ok(());
            }
            // Everything in the ring is ours and unacknowledged: waiting would deadlock.
            if self.cur.head - self.cur.ack >= cap {
                break Ok(());
            }
            if self.cur.head == tail && self.closed() {
                // Re-read the tail: records pushed before the close are visible now.
                match self.load_tail() {
                    Ok(t) if t > self.cur.head => continue,
                    Ok(_) => {}
                    Err(e) => break Err(e),
                }
                if self.cur.head == out.start {
                    // A ring closed because the server shut down says so.
                    if let Err(gone) = self.check_server() {
                        break Err(gone);
                    }
                    break Err(Error::RingClosed {
                        ring: self.maps.ring.clone(),
                    });
                }
                break Ok(());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break Ok(());
            }
            // Before blocking, say how far we have read: the server fills a ring at most one
            // batch ahead of its client and must see that this one waits for more.
            self.publish_head();
            let slice_end = now + LIVENESS_SLICE;
            let until = deadline.map_or(slice_end, |d| d.min(slice_end));
            self.wait_tail(until);
            if self.load_tail().is_ok_and(|t| t == self.cur.head)
                && let Err(e) = self.check_server()
            {
                break Err(e);
            }
        };
        out.end = self.cur.head;
        if out.end_of_stream {
            self.cur.end_of_stream = true;
        }
        self.publish_head();
        if out.end > out.start {
            self.cur.outstanding.insert(out.start, out.end);
        }
        match result {
            // Records consumed before a failure are still handed out.
            Err(e) if out.end == out.start => Err(e),
            _ => Ok(out),
        }
    }

    /// Lets the server see how far the client has read (it paces pushes by it; nothing of
    /// the protocol's safety depends on it: acknowledgements free records and slots).
    fn publish_head(&self) {
        self.maps
            .ring_ctl
            .atomic_u64(ring::HEAD)
            .store(self.cur.head, Ordering::Release);
    }

    /// Releases the batch that started at record `start`. Acknowledgements
    /// are contiguous: the acknowledged position only moves past batches that
    /// were all released, whatever the release order.
    pub fn release(&mut self, start: u64) {
        if self.cur.outstanding.remove(&start).is_none() {
            return;
        }
        let new_ack = self
            .cur
            .outstanding
            .keys()
            .next()
            .copied()
            .unwrap_or(self.cur.head);
        if new_ack > self.cur.ack {
            self.cur.ack = new_ack;
            let ctl = &self.maps.ring_ctl;
            // Release: our reads of those records and payloads happen before
            // the server's Acquire load of ACK lets it reuse them (I4).
            ctl.atomic_u64(ring::ACK).store(new_ack, Ordering::Release);
            ctl.atomic_u32(ring::ACK_EVENT)
                .fetch_add(1, Ordering::Release);
            // Pairs with the fence in RingWriter::wait_for_acks.
            fence(Ordering::SeqCst);
            if self
                .maps
                .ring_ro
                .atomic_u32(ring::PRODUCER_WAITING)
                .load(Ordering::Relaxed)
                != 0
            {
                futex::wake_all(ctl.atomic_u32(ring::ACK_EVENT));
            }
        }
    }

    /// Number of records taken and not yet acknowledged.
    pub fn unacknowledged(&self) -> u64 {
        self.cur.head - self.cur.ack
    }

    /// The payload bytes of `item` (zero-copy).
    ///
    /// Valid while the batch containing `item` is not released: the read bit
    /// pins the slot until the server processes our acknowledgement.
    pub fn bytes(&self, item: &ItemMeta) -> &[u8] {
        self.maps
            .data
            .bytes(item.offset as usize, item.len as usize)
    }

    /// The small fields' block of `item` (zero-copy; empty when it has none): parse it
    /// with [`crate::fields::parse`]. Valid as long as [`RawReader::bytes`].
    pub fn field_block(&self, item: &ItemMeta) -> &[u8] {
        self.maps
            .data
            .bytes((item.offset + item.len) as usize, item.fields_len as usize)
    }

    /// A handle that keeps the data mapping alive (not the ring) after this
    /// reader is dropped, so that foreign views never point to unmapped memory.
    pub fn keep_alive(&self) -> DataKeepAlive {
        DataKeepAlive(self.maps.data.clone())
    }
}

/// Keeps a reader's read-only data mapping mapped while it exists.
#[derive(Debug, Clone)]
pub struct DataKeepAlive(#[allow(dead_code)] Arc<Mapping>);

impl Drop for RawReader {
    fn drop(&mut self) {
        let ctl = &self.maps.ring_ctl;
        // Release: everything we did happens before the server sees us detached.
        ctl.atomic_u32(ring::CONSUMER_STATE)
            .store(consumer_state::DETACHED, Ordering::Release);
        ctl.atomic_u32(ring::ACK_EVENT)
            .fetch_add(1, Ordering::Release);
        futex::wake_all(ctl.atomic_u32(ring::ACK_EVENT));
        // Closing the ring fd releases our flock.
    }
}

/// Reader of one ring with borrow-checked zero-copy batches.
///
/// ```no_run
/// # fn main() -> dataplane::Result<()> {
/// let reader = dataplane::Reader::open("default", "job1-r0")?;
/// loop {
///     let batch = reader.next_batch(256, Some(std::time::Duration::from_secs(1)))?;
///     for item in batch.items() {
///         let _pixels: &[u8] = item.data; // zero-copy view into shared memory
///     }
///     if batch.end_of_stream() { break; }
///     // dropping `batch` (or `reader.ack(batch)`) acknowledges it
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Reader {
    data: Arc<Mapping>,
    raw: RefCell<RawReader>,
}

impl Reader {
    /// Opens ring `ring` of `instance`, waiting up to 5 s for it to be ready.
    pub fn open(instance: &str, ring: &str) -> Result<Reader> {
        Self::open_with_timeout(instance, ring, DEFAULT_OPEN_TIMEOUT)
    }

    /// Opens ring `ring` of `instance`, waiting up to `timeout`.
    pub fn open_with_timeout(instance: &str, ring: &str, timeout: Duration) -> Result<Reader> {
        let raw = RawReader::open(instance, ring, timeout)?;
        Ok(Reader {
            data: raw.maps.data.clone(),
            raw: RefCell::new(raw),
        })
    }

    /// See [`RawReader::take`]. The batch's views stay valid until it is
    /// dropped or passed to [`ack`](Self::ack), which acknowledges it.
    pub fn next_batch(&self, max_items: usize, timeout: Option<Duration>) -> Result<Batch<'_>> {
        let raw = self.raw.borrow_mut().take(max_items, timeout)?;
        Ok(Batch { reader: self, raw })
    }

    /// Acknowledges a batch (same as dropping it).
    pub fn ack(&self, batch: Batch<'_>) {
        drop(batch);
    }

    /// Fails with `server_gone` when the server shut down or died.
    pub fn check_server(&self) -> Result<()> {
        self.raw.borrow().check_server()
    }

    /// This ring's reader index.
    pub fn reader_index(&self) -> u32 {
        self.raw.borrow().reader_index()
    }

    /// Ring capacity (maximum unacknowledged records).
    pub fn capacity(&self) -> u32 {
        self.raw.borrow().capacity()
    }

    fn bytes(&self, item: &ItemMeta) -> &[u8] {
        self.data.bytes(item.offset as usize, item.len as usize)
    }

    fn field_block(&self, item: &ItemMeta) -> &[u8] {
        self.data
            .bytes((item.offset + item.len) as usize, item.fields_len as usize)
    }
}

/// A batch borrowed from a [`Reader`]; dropping it acknowledges it.
#[derive(Debug)]
pub struct Batch<'r> {
    reader: &'r Reader,
    raw: RawBatch,
}

/// One element of a [`Batch`].
#[derive(Debug, Clone, Copy)]
pub struct Item<'b> {
    /// Metadata (id, label, epoch, position, slot, format).
    pub meta: ItemMeta,
    /// The payload, zero-copy.
    pub data: &'b [u8],
    /// The small fields' block, zero-copy (empty when none): see [`Item::fields`].
    pub field_block: &'b [u8],
}

impl<'b> Item<'b> {
    /// The item's small fields (text, JSON, `.npy`, bytes), in name order.
    pub fn fields(&self) -> Result<Vec<crate::fields::Field<'b>>> {
        crate::fields::parse(self.field_block)
    }
}

impl<'r> Batch<'r> {
    /// Number of data items.
    pub fn len(&self) -> usize {
        self.raw.items.len()
    }

    /// Whether the batch has no data item.
    pub fn is_empty(&self) -> bool {
        self.raw.items.is_empty()
    }

    /// Item metadata and record range.
    pub fn raw(&self) -> &RawBatch {
        &self.raw
    }

    /// The data items with zero-copy views.
    pub fn items(&self) -> impl ExactSizeIterator<Item = Item<'_>> + '_ {
        self.raw.items.iter().map(|m| Item {
            meta: *m,
            data: self.reader.bytes(m),
            field_block: self.reader.field_block(m),
        })
    }

    /// Elements that failed to load.
    pub fn errors(&self) -> &[ElementError] {
        &self.raw.errors
    }

    /// Set when this batch ends an epoch.
    pub fn end_of_epoch(&self) -> Option<EpochEnd> {
        self.raw.end_of_epoch
    }

    /// Whether the job is finished.
    pub fn end_of_stream(&self) -> bool {
        self.raw.end_of_stream
    }

    /// Copies all items (HWC u8 of one shape) into `images` as a contiguous
    /// `(B, H, W, C)` array and their labels into `labels`; returns the shape.
    pub fn collate_into(&self, images: &mut [u8], labels: &mut [i64]) -> Result<[usize; 4]> {
        let items: Vec<_> = self.items().map(|i| (i.meta, i.data)).collect();
        collate::collate_into(&items, images, labels)
    }

    /// Allocating version of [`collate_into`](Self::collate_into).
    pub fn collate(&self) -> Result<collate::Collated> {
        let items: Vec<_> = self.items().map(|i| (i.meta, i.data)).collect();
        collate::collate(&items)
    }

    /// Like [`collate_into`](Self::collate_into), applying `aug` to each item
    /// with randomness derived from `seed`, the item's epoch and position.
    pub fn collate_augmented_into(
        &self,
        aug: &crate::augment::RandomResizedCrop,
        seed: u64,
        images: &mut [u8],
        labels: &mut [i64],
    ) -> Result<[usize; 4]> {
        let items: Vec<_> = self.items().map(|i| (i.meta, i.data)).collect();
        collate::collate_augmented_into(&items, aug, seed, images, labels)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if self.raw.end > self.raw.start {
            self.reader.raw.borrow_mut().release(self.raw.start);
        }
    }
}
