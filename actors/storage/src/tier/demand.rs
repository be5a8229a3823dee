//! What the tier knows of the jobs: per dataset source, each active job's elements not yet
//! read in its current epoch. The Cache tells a source through the `ElementSource` seam
//! (`epoch_started`, `delivered`, `job_closed`), the source forwards it here, and the tier's
//! admission asks [`Demand::needed`] of an object's element.
//!
//! "Read" is "delivered by the Cache": from then on the decoded cache serves the job, and
//! the element's encoded bytes are needed by it again only in its next epoch.

use std::collections::HashMap;
use std::sync::Mutex;

use roaring::RoaringBitmap;

/// The elements each active job of one dataset still needs this epoch.
#[derive(Debug, Default)]
pub struct Demand {
    jobs: Mutex<HashMap<u64, JobDemand>>,
}

#[derive(Debug, Default)]
struct JobDemand {
    /// What the current epoch started needing (as the Cache said).
    expected: RoaringBitmap,
    /// Not yet delivered in the current epoch.
    remaining: RoaringBitmap,
    /// Delivered in the current epoch.
    delivered: RoaringBitmap,
}

impl Demand {
    /// `job` starts an epoch in which it needs `remaining` (its subset, or a resumed epoch's
    /// rest), less what its previous epoch expected and this server never delivered: on a
    /// cluster node, a multi-node job receives the elements placed on the node, nearly the
    /// same ones every epoch, and an element placed elsewhere must not be kept as needed
    /// here. (On one server every epoch delivers all it expected: nothing is taken out.)
    pub fn epoch_started(&self, job: u64, remaining: &RoaringBitmap) {
        if let Ok(mut jobs) = self.jobs.lock() {
            let d = jobs.entry(job).or_default();
            let missed = &d.expected - &d.delivered;
            d.remaining = remaining - &missed;
            d.expected = remaining.clone();
            d.delivered.clear();
        }
    }

    /// `job` has been handed `element` in its current epoch.
    pub fn delivered(&self, job: u64, element: u32) {
        if let Ok(mut jobs) = self.jobs.lock()
            && let Some(d) = jobs.get_mut(&job)
        {
            d.remaining.remove(element);
            d.delivered.insert(element);
        }
    }

    /// `job` ended: it needs nothing more.
    pub fn job_closed(&self, job: u64) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.remove(&job);
        }
    }

    /// Whether some active job has not yet read `element` in its current epoch.
    pub fn needed(&self, element: u32) -> bool {
        self.jobs
            .lock()
            .map(|jobs| jobs.values().any(|d| d.remaining.contains(element)))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_element_is_needed_until_every_job_read_it_this_epoch() {
        let d = Demand::default();
        assert!(!d.needed(3), "no job");
        d.epoch_started(1, &(0..10).collect());
        d.epoch_started(2, &(0..5).collect());
        assert!(d.needed(3));
        d.delivered(1, 3);
        assert!(d.needed(3), "job 2 has not read it");
        d.delivered(2, 3);
        assert!(!d.needed(3));
        assert!(d.needed(7));
        d.epoch_started(1, &(0..10).collect());
        assert!(d.needed(3), "a new epoch needs it again");
        d.job_closed(1);
        assert!(!d.needed(7), "job 2 never needs 7, job 1 is gone");
    }

    #[test]
    fn later_epochs_need_what_this_server_delivered_in_the_previous_one() {
        // A node's share of a multi-node job: 0..5 of the subset 0..10.
        let d = Demand::default();
        d.epoch_started(1, &(0..10).collect());
        for e in 0..5 {
            d.delivered(1, e);
        }
        d.epoch_started(1, &(0..10).collect());
        assert!(d.needed(3));
        assert!(!d.needed(7), "placed on another node last epoch");
        for e in 0..5 {
            d.delivered(1, e);
        }
        d.epoch_started(1, &(0..10).collect());
        assert!(d.needed(4) && !d.needed(7), "the same share again");
        // A resumed job's first epoch needs its rest; the next one, its whole subset.
        let d = Demand::default();
        d.epoch_started(2, &(6..10).collect());
        assert!(!d.needed(1));
        for e in 6..10 {
            d.delivered(2, e);
        }
        d.epoch_started(2, &(0..10).collect());
        assert!(
            d.needed(1),
            "an element consumed before the resume is needed again"
        );
    }
}
