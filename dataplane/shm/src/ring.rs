//! Server side of a delivery ring: a bounded single-producer /
//! single-consumer queue of slot references in its own segment.
//!
//! The server never trusts what the client can write (the consumer page):
//! it keeps a private shadow of every record it pushed, validates the
//! acknowledgement position against it, and clears read bits from the shadow.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::futex;
use crate::layout::{
    LAYOUT_VERSION, RING_MAGIC, RecordKind, RingLayout, consumer_state, page_size, rec, ring,
};
use crate::names;
use crate::segment::{Shared, SlotRef};
use crate::shm::{self, Mapping};

/// What the server can tell about the process reading a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderStatus {
    /// No client has attached yet.
    NotAttached,
    /// A live process holds the ring's lock.
    Alive,
    /// The client detached cleanly (dropped its reader).
    Detached,
    /// The client attached and its process is gone without detaching.
    Dead,
}

/// The server's end of one delivery ring (one job, or one rank of a job).
///
/// Dropping it closes the ring (the client drains what was pushed, then gets
/// `ring_closed`), clears its read bit everywhere, frees its reader index and
/// unlinks the segment.
#[derive(Debug)]
pub struct RingWriter {
    shared: Arc<Shared>,
    map: Mapping,
    fd: OwnedFd,
    name: String,
    segment: String,
    reader: u32,
    layout: RingLayout,
    tail: u64,
    acked: u64,
    shadow: VecDeque<Option<SlotRef>>,
    held: HashMap<u32, u32>,
    closed: bool,
}

impl RingWriter {
    pub(crate) fn create(shared: Arc<Shared>, name: &str, capacity: u32) -> Result<RingWriter> {
        names::validate_ring(name)?;
        let layout = RingLayout::compute(capacity, page_size())?;
        if shared.is_shut_down() {
            return Err(Error::ServerGone {
                reason: "the writer was dropped".into(),
            });
        }
        let reader = shared.alloc_reader()?;
        let segment = names::ring_segment(&shared.instance, name);
        let made = (|| {
            let fd =
                shm::create_exclusive(&segment, layout.total_size, shared.reserve, shared.access)?;
            match Mapping::map(&fd, &segment, 0, layout.total_size as usize, true) {
                Ok(map) => Ok((fd, map)),
                Err(e) => {
                    let _ = shm::unlink(&segment);
                    Err(e)
                }
            }
        })();
        let (fd, map) = match made {
            Ok(x) => x,
            Err(e) => {
                shared.release_reader(reader);
                return Err(e);
            }
        };
        map.write_u64(ring::MAGIC, RING_MAGIC);
        map.write_u32(ring::RECORD_SIZE, rec::SIZE as u32);
        map.write_u32(ring::CAPACITY, layout.capacity);
        map.write_u32(ring::READER_INDEX, reader);
        map.write_u64(ring::RECORDS_OFFSET, layout.records_offset);
        map.write_u64(ring::TOTAL_SIZE, layout.total_size);
        map.write_u32(ring::SERVER_PID, std::process::id());
        map.write_u64(ring::BOOT_ID, shared.boot_id);
        map.write_u32(ring::PAGE_SIZE, layout.page_size);
        // Release: publishes the header fields above to openers (Acquire on VERSION).
        map.atomic_u32(ring::VERSION)
            .store(LAYOUT_VERSION, Ordering::Release);
        Ok(RingWriter {
            shared,
            map,
            fd,
            name: name.into(),
            segment,
            reader,
            layout,
            tail: 0,
            acked: 0,
            shadow: VecDeque::new(),
            held: HashMap::new(),
            closed: false,
        })
    }

    /// Ring name (what `Reader::open` takes).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Segment name in `/dev/shm`.
    pub fn segment_name(&self) -> &str {
        &self.segment
    }

    /// This ring's reader index (its bit in every slot's read bits).
    pub fn reader_index(&self) -> u32 {
        self.reader
    }

    /// Maximum number of records in flight (pushed and not acknowledged).
    pub fn capacity(&self) -> u32 {
        self.layout.capacity
    }

    /// Records pushed so far.
    pub fn pushed(&self) -> u64 {
        self.tail
    }

    /// Records whose acknowledgement was processed by [`poll_acks`](Self::poll_acks).
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// The client says it has attached (its consumer-state word; one atomic load, no
    /// syscall). Only the flock probe of [`RingWriter::reader_status`] tells whether it is
    /// still alive; this tells that one came, cheaply enough to check on every poll.
    pub fn reader_attached(&self) -> bool {
        self.map
            .atomic_u32(self.layout.ctl(ring::CONSUMER_STATE))
            .load(Ordering::Acquire)
            == consumer_state::ATTACHED
    }

    /// Records the client has taken (not necessarily acknowledged), as reported by it.
    pub fn consumer_position(&self) -> u64 {
        self.map
            .atomic_u64(self.layout.ctl(ring::HEAD))
            .load(Ordering::Relaxed)
            .min(self.tail)
    }

    fn visible_ack(&self) -> u64 {
        // Acquire: pairs with the client's Release store of ACK, so the
        // client's reads of those records and payloads happen before we
        // overwrite the records (and, via poll_acks, before slots are freed).
        let a = self
            .map
            .atomic_u64(self.layout.ctl(ring::ACK))
            .load(Ordering::Acquire);
        if a < self.acked || a > self.tail {
            self.acked
        } else {
            a
        }
    }

    /// How many more records can be pushed right now. Pushing is limited by
    /// acknowledgements, so a reader can never pin more than `capacity` slots.
    pub fn free_credit(&self) -> u32 {
        if self.closed {
            return 0;
        }
        (self.layout.capacity as u64 - (self.tail - self.visible_ack())) as u32
    }

    fn ensure_room(&self) -> Result<()> {
        if self.closed {
            return Err(Error::RingClosed {
                ring: self.name.clone(),
            });
        }
        if self.tail - self.visible_ack() >= self.layout.capacity as u64 {
            return Err(Error::RingFull {
                ring: self.name.clone(),
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_record(
        &mut self,
        kind: RecordKind,
        slot: u32,
        generation: u32,
        element_id: u32,
        label: i64,
        epoch: u64,
        position: u64,
        error_code: u32,
        flags: u32,
    ) {
        let off = self.layout.record_off(self.tail);
        let m = &self.map;
        m.write_u32(off + rec::KIND, kind as u32);
        m.write_u32(off + rec::SLOT, slot);
        m.write_u32(off + rec::GENERATION, generation);
        m.write_u32(off + rec::ELEMENT_ID, element_id);
        m.write_u64(off + rec::LABEL, label as u64);
        m.write_u64(off + rec::EPOCH, epoch);
        m.write_u64(off + rec::POSITION, position);
        m.write_u32(off + rec::ERROR_CODE, error_code);
        m.write_u32(off + rec::FLAGS, flags);
        self.tail += 1;
        self.publish();
    }

    fn publish(&self) {
        // Release: publishes the records before `tail`, and transitively the
        // slot metadata and payloads written before them (I5).
        self.map
            .atomic_u64(ring::TAIL)
            .store(self.tail, Ordering::Release);
        self.map
            .atomic_u32(ring::TAIL_EVENT)
            .fetch_add(1, Ordering::Release);
        // SeqCst fence pairs with the consumer's fence between setting
        // CONSUMER_WAITING and re-reading TAIL: either it sees our tail or we
        // see its flag (no lost wake-up).
        fence(Ordering::SeqCst);
        if self
            .map
            .atomic_u32(self.layout.ctl(ring::CONSUMER_WAITING))
            .load(Ordering::Relaxed)
            != 0
        {
            futex::wake_all(self.map.atomic_u32(ring::TAIL_EVENT));
        }
    }

    /// Pushes a data record for slot `r`, setting this reader's read bit on the
    /// slot first. `position` is the element's position in the job's epoch.
    /// Fails with `ring_full` (no credit), `stale_slot` or `ring_closed`.
    pub fn push_data(&mut self, r: SlotRef, epoch: u64, position: u64) -> Result<()> {
        self.push_data_with(r, epoch, position, false)
    }

    /// [`push_data`](Self::push_data), marking the record the last data or error record of
    /// its epoch in this ring when `last_of_epoch` (the end of epoch is pushed next).
    pub fn push_data_with(
        &mut self,
        r: SlotRef,
        epoch: u64,
        position: u64,
        last_of_epoch: bool,
    ) -> Result<()> {
        self.ensure_room()?;
        let meta = {
            let st = self.shared.lock();
            let meta = Shared::check_ref(&st, r)?;
            // Set under the state mutex so that Writer::free_slot cannot free
            // the slot between the check and the pin (I3).
            self.shared.set_read_bit(r.slot, self.reader);
            meta
        };
        *self.held.entry(r.slot).or_insert(0) += 1;
        self.shadow.push_back(Some(r));
        self.write_record(
            RecordKind::Data,
            r.slot,
            r.generation,
            meta.element_id,
            meta.label,
            epoch,
            position,
            0,
            flags(last_of_epoch),
        );
        Ok(())
    }

    /// Reports that element `element_id` (at `position` of `epoch`) failed to
    /// load with `error_code` (see [`crate::element_error`]).
    pub fn push_error(
        &mut self,
        element_id: u32,
        error_code: u32,
        epoch: u64,
        position: u64,
    ) -> Result<()> {
        self.push_error_with(element_id, error_code, epoch, position, false)
    }

    /// [`push_error`](Self::push_error), marking the record the last of its epoch in this
    /// ring when `last_of_epoch`.
    pub fn push_error_with(
        &mut self,
        element_id: u32,
        error_code: u32,
        epoch: u64,
        position: u64,
        last_of_epoch: bool,
    ) -> Result<()> {
        self.ensure_room()?;
        self.shadow.push_back(None);
        self.write_record(
            RecordKind::Error,
            u32::MAX,
            0,
            element_id,
            0,
            epoch,
            position,
            error_code,
            flags(last_of_epoch),
        );
        Ok(())
    }

    /// Marks the end of `epoch`; `count` is the number of data and error
    /// records the epoch had (the client can check it got them all).
    pub fn push_end_of_epoch(&mut self, epoch: u64, count: u64) -> Result<()> {
        self.ensure_room()?;
        self.shadow.push_back(None);
        self.write_record(
            RecordKind::EndOfEpoch,
            u32::MAX,
            0,
            0,
            0,
            epoch,
            count,
            0,
            0,
        );
        Ok(())
    }

    /// Marks the end of the job: nothing follows.
    pub fn push_end_of_stream(&mut self) -> Result<()> {
        self.ensure_room()?;
        self.shadow.push_back(None);
        self.write_record(RecordKind::EndOfStream, u32::MAX, 0, 0, 0, 0, 0, 0, 0);
        Ok(())
    }

    /// Processes the client's acknowledgements: for every newly acknowledged
    /// data record, returns its slot reference (one entry per record, so a
    /// slot pushed twice appears twice) and clears this reader's read bit on
    /// the slot once no unacknowledged record of this ring references it.
    ///
    /// Fails with `protocol_violation` when the client's acknowledgement
    /// position is behind the last one or beyond what was pushed; the server
    /// should then [`reclaim_reader`](Self::reclaim_reader) and drop the ring.
    pub fn poll_acks(&mut self) -> Result<Vec<SlotRef>> {
        // Acquire: see visible_ack.
        let ack = self
            .map
            .atomic_u64(self.layout.ctl(ring::ACK))
            .load(Ordering::Acquire);
        if ack < self.acked || ack > self.tail {
            return Err(Error::Protocol(format!(
                "ring {:?}: client acknowledged up to {ack}, but {} were acknowledged and {} pushed",
                self.name, self.acked, self.tail
            )));
        }
        let mut out = Vec::new();
        for _ in self.acked..ack {
            if let Some(Some(r)) = self.shadow.pop_front() {
                self.release_one(r.slot);
                out.push(r);
            }
        }
        self.acked = ack;
        Ok(out)
    }

    fn release_one(&mut self, slot: u32) {
        if let Some(n) = self.held.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&slot);
                self.shared.clear_read_bit(slot, self.reader);
            }
        }
    }

    /// The client's state, probed without blocking: a live client holds an
    /// exclusive `flock` on its open file description of the ring; a dead
    /// process's lock is released by the kernel.
    pub fn reader_status(&self) -> ReaderStatus {
        match shm::try_flock(&self.fd, false) {
            Ok(true) => {
                let _ = shm::unflock(&self.fd);
                match self
                    .map
                    .atomic_u32(self.layout.ctl(ring::CONSUMER_STATE))
                    .load(Ordering::Acquire)
                {
                    consumer_state::NEVER => ReaderStatus::NotAttached,
                    consumer_state::DETACHED => ReaderStatus::Detached,
                    _ => ReaderStatus::Dead,
                }
            }
            // Held by the client (or the probe failed: assume alive, re-check later).
            Ok(false) | Err(_) => ReaderStatus::Alive,
        }
    }

    /// `true` unless the client attached and then died or detached.
    pub fn reader_alive(&self) -> bool {
        matches!(
            self.reader_status(),
            ReaderStatus::Alive | ReaderStatus::NotAttached
        )
    }

    /// Takes back everything the reader holds: closes the ring, clears its
    /// read bit on every slot, and returns the slot reference of every data
    /// record that was pushed and not acknowledged (what the cache must unpin).
    pub fn reclaim_reader(&mut self) -> Vec<SlotRef> {
        self.close();
        let out: Vec<SlotRef> = self.shadow.drain(..).flatten().collect();
        for slot in std::mem::take(&mut self.held).into_keys() {
            self.shared.clear_read_bit(slot, self.reader);
        }
        self.shared.sweep_reader(self.reader);
        self.acked = self.tail;
        out
    }

    /// Closes the ring: no more pushes; the client reads what is left, then
    /// gets `ring_closed`.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        // Release: the closed flag is seen after all records pushed before it.
        self.map
            .atomic_u32(ring::FLAGS)
            .fetch_or(ring::FLAG_CLOSED, Ordering::Release);
        self.map
            .atomic_u32(ring::TAIL_EVENT)
            .fetch_add(1, Ordering::Release);
        futex::wake_all(self.map.atomic_u32(ring::TAIL_EVENT));
    }

    /// Whether the client has acknowledged records not yet processed by
    /// [`poll_acks`](Self::poll_acks).
    pub fn acks_pending(&self) -> bool {
        self.visible_ack() != self.acked
    }

    /// Sleeps until the client acknowledges something new (or detaches), at
    /// most `timeout`. Returns whether acknowledgements are pending.
    pub fn wait_for_acks(&self, timeout: Duration) -> bool {
        let ev = self.map.atomic_u32(self.layout.ctl(ring::ACK_EVENT));
        let seen = ev.load(Ordering::Acquire);
        let waiting = self.map.atomic_u32(ring::PRODUCER_WAITING);
        waiting.store(1, Ordering::Relaxed);
        // Pairs with the client's fence between its ACK store and its read of
        // PRODUCER_WAITING.
        fence(Ordering::SeqCst);
        if !self.acks_pending() {
            futex::wait(ev, seen, timeout);
        }
        waiting.store(0, Ordering::Relaxed);
        self.acks_pending()
    }
}

impl Drop for RingWriter {
    fn drop(&mut self) {
        self.reclaim_reader();
        self.shared.release_reader(self.reader);
        let _ = shm::unlink(&self.segment);
    }
}

/// A data or error record's `flags` word.
fn flags(last_of_epoch: bool) -> u32 {
    if last_of_epoch {
        rec::FLAG_LAST_OF_EPOCH
    } else {
        0
    }
}
