//! Acknowledgements and credit: what a client's acknowledgements release (the slots of the
//! records it read, and credit back to its job's Sampler), and a job's first credit, granted
//! only once every rank's client has attached (an unattached job must not pin the cache).

use dataplane::SlotRef;

use super::{CacheActor, CacheJob, RankRing};
use crate::messages::{JobId, JobSignal};

impl RankRing {
    /// Takes the client's new acknowledgements: the slots of the data records they cover (one
    /// per record), and the credit they return (data and error records; ends return none).
    /// Fails when the client broke the ring protocol.
    pub(super) fn take_acks(&mut self) -> Result<(Vec<SlotRef>, u32), dataplane::Error> {
        let released = self.ring.poll_acks()?;
        let acked = self.ring.acked();
        let mut credit = 0;
        for _ in self.acked..acked {
            if self.shadow.pop_front().unwrap_or(false) {
                credit += 1;
            }
        }
        self.acked = acked;
        debug_assert!(
            released.len() as u64 <= self.pinned,
            "{} slots released of {} held",
            released.len(),
            self.pinned
        );
        self.pinned = self.pinned.saturating_sub(released.len() as u64);
        debug_assert_eq!(
            self.shadow.len() as u64,
            self.ring.pushed() - self.acked,
            "one shadow flag per record pushed and not acknowledged"
        );
        Ok((released, credit))
    }
}

impl CacheJob {
    /// Gives the job's Sampler the job's whole credit (its rings' places) the first time every
    /// rank's client is attached. (The registry adds the job to its Sampler before it answers
    /// the client, so the Sampler knows the job before any client can attach.)
    pub(super) fn grant_on_attach(&mut self, id: JobId) {
        if !self.granted && self.rings.iter().all(|rr| rr.ring.reader_attached()) {
            self.granted = true;
            self.stats.note_started();
            tracing::debug!(job = id, "every rank attached: credit granted");
            self.sampler.do_send(JobSignal::Credit {
                job: id,
                n: self.credit,
            });
        }
    }

    /// Returns the credit of acknowledged records to the job's Sampler.
    pub(super) fn return_credit(&self, id: JobId, credit: u32) {
        if credit > 0 {
            self.stats.note_acknowledged(u64::from(credit));
            self.sampler
                .do_send(JobSignal::Credit { job: id, n: credit });
        }
    }
}

impl CacheActor {
    /// A pushed record was acknowledged (or its reader reclaimed): its slot is no longer held
    /// by that ring.
    pub(super) fn release(&mut self, r: SlotRef) {
        let Some(&(cur, key)) = self.by_slot.get(&r.slot) else {
            return;
        };
        if cur != r {
            return;
        }
        if let Some(e) = self.slots.get_mut(&key) {
            debug_assert!(e.pushed > 0, "key {key:#x}: released more than was pushed");
            e.pushed = e.pushed.saturating_sub(1);
            if e.uses() == 0 {
                self.policy.unpin(key.raw());
            }
            // Unpinned, or now only queued (evictable for a sooner need): either may make room.
            self.room_changed = true;
            self.unblock_preloads();
            self.debug_assert_slot(key);
        }
    }
}
