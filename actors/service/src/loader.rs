//! The Loader: reads elements from storage and runs the shared pipelines on a bounded pool of
//! worker threads, never on an actix arbiter thread. A remote source's elements are fetched
//! by the source's own asynchronous stage first and reach the workers with their bytes.
//!
//! The workers run at a lower CPU priority than the rest of the server ([`DECODE_NICE`] above
//! the process's nice value), so that when decoding saturates the cores the sampler, the cache
//! and the HTTP workers still get the CPU at once: control never waits behind a decode.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use actix::prelude::*;
use crossbeam_channel::{Sender, unbounded};

use super::stages::{LOADER, READ};
use dataplane::{SlotMeta, SlotRef, Writer};
use joader_stages as stages;

use super::messages::{Load, LoadFailure, Loaded, Place, Prepared};
use super::stats::CacheStats;

/// How much nicer (lower priority) than the process the decode workers run, on Linux (one
/// nice step is about 1.25× less CPU share under contention; 5 steps ≈ 3×).
pub const DECODE_NICE: i32 = 5;

/// Lowers the calling thread's priority by [`DECODE_NICE`]. On Linux `setpriority` on a thread
/// id changes that thread alone; elsewhere it would change the whole process, so it is not done.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = rustix::thread::gettid();
        let result = getpriority_process(Some(tid))
            .and_then(|nice| setpriority_process(Some(tid), (nice + DECODE_NICE).min(19)));
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not lower the priority of a decode thread");
        }
    }
}

/// See the module docs. The queue is unbounded but its length is bounded by the jobs' credit:
/// a job never has more outstanding deliveries than its rings hold.
pub struct Loader {
    tx: Option<Sender<Work>>,
    workers: Vec<JoinHandle<()>>,
    stats: Arc<CacheStats>,
}

impl Loader {
    /// Starts `workers` threads that send their results to `downstream`.
    pub fn new(workers: usize, downstream: Recipient<Loaded>, stats: Arc<CacheStats>) -> Self {
        Self::placing(workers, downstream, stats, Weak::new())
    }

    /// [`Loader::new`], whose workers write prepared elements straight into new slots of
    /// `writer`'s segment while it has room to spare (see [`SlotPlace`]), instead of handing
    /// the bytes to the Cache to copy.
    pub fn placing(
        workers: usize,
        downstream: Recipient<Loaded>,
        stats: Arc<CacheStats>,
        writer: Weak<Writer>,
    ) -> Self {
        let (tx, rx) = unbounded::<Work>();
        let workers = (0..workers.max(1))
            .map(|i| {
                let rx = rx.clone();
                let downstream = downstream.clone();
                let stats = stats.clone();
                let writer = writer.clone();
                std::thread::Builder::new()
                    .name(format!("joader-loader-{i}"))
                    .spawn(move || {
                        stages::set_base(&LOADER);
                        lower_own_priority();
                        while let Ok((load, fetched)) = rx.recv() {
                            stats.loader_queue.fetch_sub(1, Relaxed);
                            let loaded = run_load(&load, fetched, &stats, &writer);
                            downstream.do_send(loaded);
                        }
                    })
                    .expect("spawn a loader thread")
            })
            .collect();
        Self {
            tx: Some(tx),
            workers,
            stats,
        }
    }
}

/// A load for the workers, with its bytes when a remote source fetched them already.
/// A load, with its bytes and the bytes a store sent for them when its source fetched them.
type Work = (Load, Option<(Result<Vec<u8>, LoadFailure>, u64)>);

/// Reads once (unless fetched), prepares for every pipeline.
fn run_load(
    load: &Load,
    fetched: Option<(Result<Vec<u8>, LoadFailure>, u64)>,
    stats: &CacheStats,
    writer: &Weak<Writer>,
) -> Loaded {
    let start = Instant::now();
    let read_stage = stages::enter(&READ);
    let label = load.source.label(load.element);
    let (read, store_bytes) = fetched.unwrap_or_else(|| (load.source.read(load.element), 0));
    drop(read_stage);
    let bytes_read = read.as_ref().map_or(0, |b| b.len() as u64);
    let split = read.and_then(|stored| load.source.split(load.element, stored));
    let results = match split {
        Ok((bytes, fields)) => load
            .pipelines
            .iter()
            .map(|(id, p)| {
                // The pipeline charges its decode and resize itself; a raw pipeline's
                // copy of the bytes counts as reading them.
                let _raw = if p.decodes() {
                    stats.decodes.fetch_add(1, Relaxed);
                    None
                } else {
                    Some(stages::enter(&READ))
                };
                let prepared = match writer.upgrade() {
                    Some(writer) => {
                        let mut place = SlotPlace {
                            writer: &writer,
                            element: load.element,
                            label,
                            fields: &fields,
                            stats,
                        };
                        p.prepare_placed(&bytes, &mut place)
                    }
                    None => p.prepare(&bytes),
                };
                (*id, prepared.and_then(|p| with_fields(p, &fields)))
            })
            .collect(),
        Err(e) => load
            .pipelines
            .iter()
            .map(|(id, _)| (*id, Err(e.clone())))
            .collect(),
    };
    stats.loads.fetch_add(1, Relaxed);
    stats.bytes_read.fetch_add(bytes_read, Relaxed);
    let busy = start.elapsed();
    stats
        .loader_busy_us
        .fetch_add(busy.as_micros() as u64, Relaxed);
    Loaded {
        dataset: load.dataset,
        element: load.element,
        label,
        results,
        bytes_read,
        store_bytes,
        busy,
    }
}

/// A prepared element with its small fields: a placed one has them already (its
/// [`SlotPlace`] wrote them), bytes for the Cache get them appended.
fn with_fields(mut p: Prepared, fields: &[u8]) -> Result<Prepared, LoadFailure> {
    if p.placed.is_none() && !fields.is_empty() {
        p.fields_len = u32::try_from(fields.len()).map_err(|_| LoadFailure {
            code: dataplane::element_error::TOO_LARGE,
            kind: "too_large".into(),
            message: format!("the element's fields take {} bytes", fields.len()),
        })?;
        p.bytes.extend_from_slice(fields);
    }
    Ok(p)
}

/// A loader thread's place for one element: a new slot of the segment, taken only while the
/// Cache has no payload waiting for room (when memory is short the Cache decides what is
/// evicted for what; the Cache keeps some room free for these writes otherwise).
struct SlotPlace<'a> {
    writer: &'a Writer,
    element: u32,
    label: i64,
    /// The element's small fields' block, written after the payload.
    fields: &'a [u8],
    stats: &'a CacheStats,
}

impl Place for SlotPlace<'_> {
    fn place(
        &mut self,
        format: dataplane::Format,
        source: (u32, u32),
        len: u64,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), LoadFailure>,
    ) -> Option<Result<SlotRef, LoadFailure>> {
        if self.stats.waiting_for_space.load(Relaxed) > 0 {
            return None;
        }
        let fields_len = u32::try_from(self.fields.len()).ok()?;
        let meta = SlotMeta {
            element_id: self.element,
            label: self.label,
            format,
            fields_len,
            source,
        };
        let mut filled = Ok(());
        let (fields, total) = (self.fields, len + u64::from(fields_len));
        match self.writer.write_slot_with(meta, total, |buf| {
            let (payload, block) = buf.split_at_mut(buf.len() - fields.len());
            block.copy_from_slice(fields);
            filled = fill(payload);
        }) {
            Ok(slot) => match filled {
                Ok(()) => Some(Ok(slot)),
                Err(e) => {
                    // Published but referenced by nothing: no reader can hold it.
                    let _ = self.writer.free_slot(slot);
                    Some(Err(e))
                }
            },
            // No room to spare, or a payload the Cache should judge: it gets the bytes.
            Err(_) => None,
        }
    }
}

impl Actor for Loader {
    type Context = Context<Self>;
}

impl Handler<Load> for Loader {
    type Result = ();
    fn handle(&mut self, msg: Load, _: &mut Context<Self>) {
        if let Some(tx) = &self.tx {
            self.stats.loader_queue.fetch_add(1, Relaxed);
            let source = msg.source.clone();
            if let Some(stage) = source.fetching().filter(|f| f.is_remote()) {
                // The bytes come from the source's fetch stage; a send after the Loader
                // stopped finds no worker, and the load is dropped with the server.
                let (tx, element) = (tx.clone(), msg.element);
                stage.fetch(
                    element,
                    Box::new(move |r, n| drop(tx.send((msg, Some((r, n)))))),
                );
            } else {
                // Workers only stop when the sender is dropped, so this cannot fail while we
                // hold it.
                let _ = tx.send((msg, None));
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ElementSource, LoadFailure, Prepare, Prepared};
    use std::sync::Mutex;

    struct Source;
    impl ElementSource for Source {
        fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
            if element == 13 {
                return Err(LoadFailure {
                    code: 1,
                    kind: "read_failed".into(),
                    message: "unlucky".into(),
                });
            }
            Ok(element.to_le_bytes().to_vec())
        }
        fn label(&self, element: u32) -> i64 {
            i64::from(element % 3)
        }
    }
    struct Twice;
    impl Prepare for Twice {
        fn prepare(&self, bytes: &[u8]) -> Result<Prepared, LoadFailure> {
            Ok(Prepared::bytes(bytes.repeat(2), dataplane::Format::Raw))
        }
        fn decodes(&self) -> bool {
            true
        }
    }

    struct Capture(Arc<Mutex<Vec<Loaded>>>);
    impl Actor for Capture {
        type Context = Context<Self>;
    }
    impl Handler<Loaded> for Capture {
        type Result = ();
        fn handle(&mut self, msg: Loaded, _: &mut Context<Self>) {
            self.0.lock().unwrap().push(msg);
        }
    }

    /// The nice value of each thread of this process whose name starts with `prefix`, from
    /// `/proc/self/task/<tid>/stat` (field 19).
    fn nice_of_threads(prefix: &str) -> Vec<i32> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
                continue;
            };
            if !comm.starts_with(prefix) {
                continue;
            }
            // A thread of another test may be exiting meanwhile: its stat is then gone or
            // cut short, and it is not one of the threads looked for.
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
                continue;
            };
            let Some(end) = stat.rfind(')') else {
                continue;
            };
            // Fields from the third (state) on; nice is the 19th field.
            let nice = stat
                .get(end + 2..)
                .and_then(|f| f.split(' ').nth(16)?.parse().ok());
            if let Some(nice) = nice {
                out.push(nice);
            }
        }
        out
    }

    #[cfg(target_os = "linux")]
    #[actix::test]
    async fn decode_threads_run_below_the_server_priority() {
        let capture = Capture(Arc::new(Mutex::new(Vec::new()))).start();
        let stats = Arc::new(CacheStats::default());
        let own = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let _loader = Loader::new(3, capture.recipient(), stats).start();
        // Each worker lowers its priority when it starts: wait for that state.
        let want = (own + DECODE_NICE).min(19);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            // Loader threads of other tests in this binary have the same nice value.
            let nice = nice_of_threads("joader-loader-");
            if nice.len() >= 3 && nice.iter().all(|n| *n == want) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "decode threads' nice values {nice:?}, expected {want} (process: {own})"
            );
            actix::clock::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(want > own || own == 19);
        // The rest of the process is untouched.
        assert_eq!(
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap(),
            own
        );
    }

    #[actix::test]
    async fn loads_once_per_element_for_all_pipelines() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let capture = Capture(got.clone()).start();
        let stats = Arc::new(CacheStats::default());
        let loader = Loader::new(2, capture.recipient(), stats.clone()).start();
        let source: Arc<dyn ElementSource> = Arc::new(Source);
        for element in [1u32, 13, 7] {
            loader
                .send(Load {
                    dataset: 3,
                    element,
                    source: source.clone(),
                    pipelines: vec![
                        (0, Arc::new(Twice) as Arc<dyn Prepare>),
                        (1, Arc::new(Twice)),
                    ],
                })
                .await
                .unwrap();
        }
        // The workers answer asynchronously: wait for the three results (generous deadline).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while got.lock().unwrap().len() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the loader answered {} of 3 loads in 60 s",
                got.lock().unwrap().len()
            );
            actix::clock::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut got = got.lock().unwrap().clone();
        got.sort_by_key(|l| l.element);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].element, 1);
        assert_eq!(got[0].results.len(), 2);
        assert_eq!(
            got[0].results[1].1.as_ref().unwrap().bytes,
            [1, 0, 0, 0, 1, 0, 0, 0]
        );
        assert_eq!(got[0].label, 1);
        assert!(got[1].results.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(got[2].element, 13);
        assert!(
            got[2]
                .results
                .iter()
                .all(|(_, r)| r.as_ref().unwrap_err().kind == "read_failed")
        );
        assert_eq!(stats.loads.load(Relaxed), 3);
        assert_eq!(
            stats.decodes.load(Relaxed),
            4,
            "two pipelines for each element that was read"
        );
    }

    /// A source whose elements carry a small fields' block (`element` 5's is malformed).
    struct WithFields;
    impl ElementSource for WithFields {
        fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
            Ok([element.to_le_bytes().to_vec(), b"|fields".to_vec()].concat())
        }
        fn label(&self, _: u32) -> i64 {
            0
        }
        fn split(&self, element: u32, stored: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>), LoadFailure> {
            if element == 5 {
                return Err(LoadFailure {
                    code: dataplane::element_error::BAD_FIELD,
                    kind: "bad_field".into(),
                    message: "field `caption` is not UTF-8 text".into(),
                });
            }
            Ok((stored[..4].to_vec(), stored[4..].to_vec()))
        }
    }

    /// Writes the stored bytes into a slot the place gives (or as bytes without one).
    struct Placing;
    impl Prepare for Placing {
        fn prepare(&self, bytes: &[u8]) -> Result<Prepared, LoadFailure> {
            Ok(Prepared::bytes(bytes.to_vec(), dataplane::Format::Raw))
        }
        fn prepare_placed(
            &self,
            bytes: &[u8],
            place: &mut dyn Place,
        ) -> Result<Prepared, LoadFailure> {
            let mut fill = |dst: &mut [u8]| {
                dst.copy_from_slice(bytes);
                Ok(())
            };
            match place.place(
                dataplane::Format::Raw,
                (0, 0),
                bytes.len() as u64,
                &mut fill,
            ) {
                Some(slot) => Ok(Prepared {
                    bytes: Vec::new(),
                    format: dataplane::Format::Raw,
                    placed: Some(slot?),
                    fields_len: 0,
                    source: (0, 0),
                }),
                None => self.prepare(bytes),
            }
        }
        fn decodes(&self) -> bool {
            true
        }
    }

    #[actix::test]
    async fn fields_follow_the_image_placed_or_as_bytes() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let capture = Capture(got.clone()).start();
        let stats = Arc::new(CacheStats::default());
        let mut cfg =
            dataplane::SegmentConfig::new(format!("ldfields_{}", std::process::id()), 8, 1 << 20);
        cfg.reserve = false;
        let writer = Arc::new(Writer::create(&cfg).unwrap());
        let loader =
            Loader::placing(1, capture.recipient(), stats, Arc::downgrade(&writer)).start();
        let source: Arc<dyn ElementSource> = Arc::new(WithFields);
        for element in [2u32, 5] {
            loader
                .send(Load {
                    dataset: 0,
                    element,
                    source: source.clone(),
                    pipelines: vec![
                        (0, Arc::new(Placing) as Arc<dyn Prepare>),
                        (1, Arc::new(Twice)),
                    ],
                })
                .await
                .unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while got.lock().unwrap().len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the loader did not answer"
            );
            actix::clock::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut got = got.lock().unwrap().clone();
        got.sort_by_key(|l| l.element);
        // Placed: the slot holds the image, its meta the block's length after it.
        let placed = got[0].results[0].1.as_ref().unwrap();
        let slot = placed.placed.expect("placed");
        assert_eq!(writer.slot_meta(slot).unwrap().fields_len, 7);
        let arena = writer.arena_stats();
        assert_eq!(
            (arena.allocations, arena.size - arena.free),
            (1, 64),
            "4 + 7 bytes, one block"
        );
        // As bytes for the Cache: the prepared image, then the block.
        let bytes = got[0].results[1].1.as_ref().unwrap();
        assert_eq!(
            bytes.bytes,
            [
                2, 0, 0, 0, 2, 0, 0, 0, b'|', b'f', b'i', b'e', b'l', b'd', b's'
            ]
        );
        assert_eq!(bytes.fields_len, 7);
        assert_eq!(got[0].bytes_read, 11);
        // A malformed field fails the element for every pipeline.
        for (_, r) in &got[1].results {
            assert_eq!(r.as_ref().unwrap_err().kind, "bad_field");
        }
        writer.free_slot(slot).unwrap();
    }
}
