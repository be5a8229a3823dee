//! A working set kept on disk (`"keep": "disk"`): an object-store dataset's stored bytes
//! fetched into the server's disk tier (`--disk-cache`) and pinned there until released, so
//! that no job reads them from the store again, whatever the decoded cache holds.
//!
//! The tier keeps what its dataset's jobs still need (the source's `Demand`); the preload is
//! one more job of that demand ([`DISK_PRELOAD_JOB`]) whose epoch never ends, registered
//! before its thread starts and removed when it is released: what it fetched is admitted, and
//! never evicted meanwhile. Its thread fetches the elements the tier does not hold, 32 at a
//! time, waits for the tier's writer, and counts what the tier holds; pins are bounded by half
//! the tier, less what other disk preloads pin. After a restart the tier's files are adopted
//! by the dataset's source again, so the same preload pins them without a fetch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use actors::{DISK_PRELOAD_JOB, ElementSource, PreloadProgress, PreloadState};
use roaring::RoaringBitmap;

use crate::error::{Code, Error, Result};

/// Fetches a preload keeps under way.
const IN_FLIGHT: usize = 32;

/// Starts a disk preload of `elements`: pins them by the source's demand now, fetches on a
/// thread of its own. Returns its cancel flag (set by the release).
pub(super) fn start(
    name: &str,
    source: Arc<dyn ElementSource>,
    elements: RoaringBitmap,
    progress: Arc<PreloadProgress>,
    others: u64,
) -> Result<Arc<AtomicBool>> {
    let not_here = |why: &str| {
        Error::new(
            Code::InvalidRequest,
            format!(
                "\"keep\": \"disk\" keeps an object-store dataset's stored bytes in the \
                 server's disk tier: {why}; keep it in memory instead"
            ),
        )
    };
    let (Some(disk), Some(_), Some(demand)) = (source.disk(), source.fetching(), source.demand())
    else {
        return Err(not_here(&format!(
            "dataset '{name}' is not read from an object store, the server has no disk tier \
             (--disk-cache), or its layout (Parquet rows) is not kept there"
        )));
    };
    let budget = (disk.capacity() / 2).saturating_sub(others);
    progress.elements.store(elements.len(), Relaxed);
    progress.budget_bytes.store(disk.capacity() / 2, Relaxed);
    progress.set_state(PreloadState::Loading);
    demand.epoch_started(DISK_PRELOAD_JOB, &elements);
    let cancel = Arc::new(AtomicBool::new(false));
    let stop = cancel.clone();
    let dataset = name.to_owned();
    std::thread::Builder::new()
        .name("joader-preload".into())
        .spawn(move || {
            let run = Run {
                source: source.as_ref(),
                progress: &progress,
                cancel: &stop,
                budget,
            };
            let end = run.fetch_all(&elements);
            if let Err(reason) = end {
                tracing::warn!(dataset = %dataset, reason = %reason, "disk preload failed");
                if let Some(d) = source.demand() {
                    d.job_closed(DISK_PRELOAD_JOB);
                }
                progress.pinned.store(0, Relaxed);
                progress.pinned_bytes.store(0, Relaxed);
                progress.set_state(PreloadState::Failed(reason));
            } else if !stop.load(Relaxed) {
                tracing::info!(dataset = %dataset, pinned = progress.pinned.load(Relaxed),
                    bytes = progress.pinned_bytes.load(Relaxed), "disk preload ready");
                progress.set_state(PreloadState::Ready);
            }
        })
        .map_err(Error::internal)?;
    Ok(cancel)
}

/// Releases a disk preload: its thread stops, its elements are no longer needed by it.
pub(super) fn release(source: Option<&Arc<dyn ElementSource>>, cancel: &AtomicBool) {
    cancel.store(true, Relaxed);
    if let Some(d) = source.and_then(|s| s.demand()) {
        d.job_closed(DISK_PRELOAD_JOB);
    }
}

struct Run<'a> {
    source: &'a dyn ElementSource,
    progress: &'a PreloadProgress,
    cancel: &'a AtomicBool,
    budget: u64,
}

impl Run<'_> {
    /// Pins every element: held already, or fetched (then written by the tier's writer).
    /// `Err`: why it stopped (it did not fit, or the tier did not keep what it fetched).
    fn fetch_all(&self, elements: &RoaringBitmap) -> std::result::Result<(), String> {
        let (Some(disk), Some(fetch)) = (self.source.disk(), self.source.fetching()) else {
            return Err("the source no longer keeps anything on disk".into());
        };
        let ids: Vec<u32> = elements.iter().collect();
        let mut not_kept = 0u64;
        for chunk in ids.chunks(IN_FLIGHT) {
            if self.cancel.load(Relaxed) {
                return Ok(());
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let mut asked = 0;
            for &e in chunk {
                if let Some(len) = disk.holds(e) {
                    self.pin(len)?;
                    continue;
                }
                asked += 1;
                self.progress.loads.fetch_add(1, Relaxed);
                let tx = tx.clone();
                fetch.fetch(
                    e,
                    Box::new(move |r, _| {
                        let _ = tx.send((e, r.is_ok()));
                    }),
                );
            }
            drop(tx);
            let fetched: Vec<u32> = rx
                .iter()
                .take(asked)
                .filter_map(|(e, ok)| {
                    if !ok {
                        self.progress.failed.fetch_add(1, Relaxed);
                    }
                    ok.then_some(e)
                })
                .collect();
            disk.flush();
            for e in fetched {
                match disk.holds(e) {
                    Some(len) => self.pin(len)?,
                    None => not_kept += 1,
                }
            }
        }
        if not_kept > 0 {
            return Err(format!(
                "the disk tier did not keep {not_kept} of the elements fetched (what it \
                 holds beside them is needed by running jobs, or its writer fell behind: \
                 joader_disk_cache_dropped_total); preload again when they end, or raise \
                 --disk-cache-bytes"
            ));
        }
        Ok(())
    }

    /// Counts one element pinned, within the budget.
    fn pin(&self, len: u64) -> std::result::Result<(), String> {
        let p = self.progress;
        let now = p.pinned_bytes.load(Relaxed);
        if now + len > self.budget {
            return Err(format!(
                "the working set does not fit in the disk tier's pin budget ({} bytes: half \
                 the tier, less what other disk preloads pin): {} of its {} elements fit ({now} \
                 bytes); preload a smaller subset or raise --disk-cache-bytes",
                self.budget,
                p.pinned.load(Relaxed),
                p.elements.load(Relaxed),
            ));
        }
        p.pinned_bytes.fetch_add(len, Relaxed);
        p.pinned.fetch_add(1, Relaxed);
        Ok(())
    }
}
