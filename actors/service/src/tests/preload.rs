//! Working sets (`cache/preload.rs`): a preload loads once and pins, a job on it reads nothing,
//! pins outlast other jobs' pressure until released, and the pin budget is kept.

use super::*;

fn preload_of(
    w: &World,
    elements: std::ops::Range<u32>,
    min_bytes: u64,
) -> (Preload, Arc<PreloadProgress>) {
    let progress = Arc::new(PreloadProgress::default());
    let msg = Preload {
        dataset: 1,
        source: w.source.clone(),
        pipeline: 0,
        prepare: Arc::new(Identity),
        elements: Arc::new(elements.collect()),
        min_element_bytes: min_bytes,
        progress: progress.clone(),
    };
    (msg, progress)
}

async fn preload_ready(w: &World, elements: std::ops::Range<u32>) -> Arc<PreloadProgress> {
    let (msg, progress) = preload_of(w, elements, 1);
    w.cache.send(msg).await.unwrap().unwrap();
    wait_until("the preload to be ready", || {
        progress.state() == PreloadState::Ready
    })
    .await;
    progress
}

/// Runs one epoch of a job over `subset` to its end.
async fn one_epoch(
    w: &World,
    job: JobId,
    subset: std::ops::Range<u32>,
    capacity: u32,
) -> Arc<JobStats> {
    let subset: RoaringBitmap = subset.collect();
    let n = subset.len();
    let (s, r) = w.job(job, subset.clone(), 1, capacity).await;
    let seen = join(read_all(w.instance.clone(), r, Duration::ZERO)).await;
    check_epochs(&seen, &subset, 1);
    wait_until("the epoch's acknowledgements", || {
        s.acknowledged.load(Relaxed) >= n
    })
    .await;
    s
}

#[actix::test]
async fn a_job_on_a_preloaded_working_set_reads_nothing_but_what_failed() {
    let w = world("preload", 64, 1 << 20);
    let p = preload_ready(&w, 0..20).await;
    // Element 7 cannot be read (the test source's bad sector): it is counted, not pinned.
    assert_eq!(p.pinned.load(Relaxed), 19);
    assert_eq!(p.failed.load(Relaxed), 1);
    assert_eq!(p.loads.load(Relaxed), 20);
    // Each slot takes an arena block of 64 bytes for its 32.
    assert_eq!(p.pinned_bytes.load(Relaxed), 19 * 64);
    let reads = w.source.reads.load(Relaxed);
    assert_eq!(reads, 20);
    let s = one_epoch(&w, 1, 0..20, 16).await;
    assert_eq!(
        w.source.reads.load(Relaxed),
        reads + 1,
        "only the failed element is read again"
    );
    assert_eq!(s.misses.load(Relaxed), 1);
    assert_eq!(s.hits.load(Relaxed), 19);
    // A second preload of the dataset is refused while the first holds.
    let (again, _) = preload_of(&w, 0..4, 1);
    assert_eq!(
        w.cache.send(again).await.unwrap(),
        Err(PreloadError::Exists)
    );
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn pins_outlast_other_jobs_pressure_until_the_preload_is_released() {
    // 24 slots: 12 may be pinned; the other job's 80 elements pass through the rest.
    let w = world("pinned", 24, 1 << 20);
    preload_ready(&w, 0..10).await;
    let after_preload = w.source.reads.load(Relaxed);
    one_epoch(&w, 1, 100..180, 8).await;
    assert!(w.stats.evictions.load(Relaxed) > 0, "the other job evicted");
    let before = w.source.reads.load(Relaxed);
    assert_eq!(
        before - after_preload,
        80,
        "the other job read its own elements"
    );
    one_epoch(&w, 2, 0..10, 8).await;
    assert_eq!(
        w.source.reads.load(Relaxed),
        before + 1,
        "the pinned working set survived; only its failed element is read"
    );
    assert!(w.cache.send(Unpreload { dataset: 1 }).await.unwrap());
    assert!(
        !w.cache.send(Unpreload { dataset: 1 }).await.unwrap(),
        "released once"
    );
    one_epoch(&w, 3, 100..180, 8).await;
    let before = w.source.reads.load(Relaxed);
    one_epoch(&w, 4, 0..10, 8).await;
    assert!(
        w.source.reads.load(Relaxed) >= before + 5,
        "released, the working set was evicted by the other job"
    );
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}

#[actix::test]
async fn a_working_set_beyond_the_pin_budget_is_refused_or_stops_and_unpins() {
    // 4096 slots and 64 KiB: pins may take 2048 slots and 32 KiB.
    let w = world("budget", 4096, 64 * 1024);
    let (msg, _) = preload_of(&w, 0..3000, 1);
    match w.cache.send(msg).await.unwrap() {
        Err(PreloadError::TooLarge { elements, fit, .. }) => {
            assert_eq!(
                (elements, fit),
                (3000, 2048),
                "refused at once for the slots"
            );
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let (msg, _) = preload_of(&w, 0..200, 200);
    let r = w.cache.send(msg).await.unwrap();
    assert!(
        matches!(r, Err(PreloadError::TooLarge { fit: 163, .. })),
        "200 x 200 bytes is more than 32 KiB: {r:?}"
    );
    // 1,500 elements of 32 bytes (64 in the arena) fit the slots, not the bytes: it stops.
    let (msg, p) = preload_of(&w, 0..1500, 1);
    assert_eq!(w.cache.send(msg).await.unwrap(), Ok(32 * 1024));
    wait_until("the preload to fail", || {
        matches!(p.state(), PreloadState::Failed(_))
    })
    .await;
    let PreloadState::Failed(reason) = p.state() else {
        unreachable!()
    };
    assert!(reason.contains("does not fit"), "{reason}");
    assert_eq!(p.pinned.load(Relaxed), 0, "its pins are released");
    assert_invariants(&w).await;
    // A failed preload is replaced by a new one that fits.
    let p = preload_ready(&w, 0..8).await;
    assert_eq!(p.pinned.load(Relaxed), 7);
    assert_invariants(&w).await;
    w.cache.send(Shutdown).await.unwrap();
}
