//! The client's prefetch: a thread that reads a ring, collates (and augments) each batch into
//! a pooled buffer and acknowledges it, so that the training loop's `next()` only hands over a
//! batch that is already prepared.
//!
//! - **Order and content** are those of the synchronous path: batches are assembled from the
//!   ring's records in order (each take asks for at most what the batch still lacks, so never
//!   more than `batch_size` records, which flow control's whole-batch credit relies on), and
//!   an item's augmentation depends only on the job's seed, its epoch and its position.
//! - **Acknowledgements** follow the copy: a take is released once its items are written into
//!   the batch buffer, never before.
//! - **Buffers** circulate: a [`Ready`] batch owns its [`BatchBuf`]; whoever consumes it gives
//!   the buffer back with [`Prefetcher::recycle`] when nothing refers to it any more (the
//!   Python package does so when the last NumPy array or tensor over it is collected). With no
//!   free buffer the thread allocates one, so a consumer that keeps every batch never blocks
//!   it; at most `depth` batches are prepared ahead of the consumer.
//! - **Even shares** (`pad_to`): a rank of a multi-rank job whose share of an epoch is one
//!   element short of `pad_to` (`first_pad_to` for the first epoch on the ring, when a job is
//!   resumed in the middle of it) receives the epoch's first element of its share once more at the
//!   end, as `DistributedSampler` pads, so that every rank runs the same number of steps.

use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::augment::{Augmenter, Crop, Output, RandomResizedCrop};
use crate::collate::{BatchOut, restride_padded, write_batch, write_padded};
use crate::error::{Error, Result};
use crate::reader::{ElementError, EpochEnd, RawBatch, RawReader};
use crate::stages::{self, client};

pub use crossbeam_channel::Sender;

/// How often the prefetch thread looks at its stop flag while it waits for records.
const STOP_SLICE: Duration = Duration::from_millis(100);

/// What the prefetch thread prepares.
#[derive(Debug, Clone)]
pub struct PrefetchConfig {
    /// Items per batch (the job's registered batch size).
    pub batch_size: usize,
    /// Batches prepared ahead of the consumer (at least 1).
    pub depth: usize,
    /// Per-job augmentation, if any.
    pub aug: Option<RandomResizedCrop>,
    /// The job's seed (the augmentation's randomness).
    pub seed: u64,
    /// Output layout.
    pub output: Output,
    /// Threads that augment one batch (at least 1).
    pub threads: usize,
    /// Records every epoch must have on this ring; one short is padded (see the module docs).
    pub pad_to: Option<u64>,
    /// What `pad_to` is for the first epoch on this ring when it differs: a job resumed in
    /// the middle of an epoch has a shorter share of it.
    pub first_pad_to: Option<u64>,
}

/// A batch buffer: images in the output's element type, and labels.
#[derive(Debug)]
pub struct BatchBuf {
    /// `uint8` images (for [`Output::U8Nhwc`]).
    pub u8s: Vec<u8>,
    /// `float32` images (for [`Output::F32Nchw`]).
    pub f32s: Vec<f32>,
    /// Labels.
    pub labels: Vec<i64>,
}

/// A prepared batch.
#[derive(Debug)]
pub struct Ready {
    /// Its buffer: the first `len` images and labels are the batch.
    pub buf: BatchBuf,
    /// Images in the batch.
    pub len: usize,
    /// Array shape of the images (`[len, H, W, C]`, or `[len, C, H, W]` for float32).
    pub shape: [usize; 4],
    /// Element ids, epochs and positions of the images, in order.
    pub element_ids: Vec<u32>,
    /// Epoch of each image.
    pub epochs: Vec<u64>,
    /// Position of each image in its epoch.
    pub positions: Vec<u64>,
    /// Elements the server failed to load (not in the images).
    pub errors: Vec<ElementError>,
    /// Set when the batch ends an epoch.
    pub end_of_epoch: Option<EpochEnd>,
    /// Set when the job is finished.
    pub end_of_stream: bool,
    /// Images at the end of the batch that repeat an earlier element to even the ranks' shares.
    pub padded: usize,
    /// With [`Output::U8Padded`]: each image's size, crop window and flip, in order.
    pub crops: Vec<Crop>,
    /// Each image's small fields' block, copied out of shared memory (empty when the dataset
    /// declares none): parse it with [`crate::fields::parse`].
    pub fields: Vec<Vec<u8>>,
    /// Each image's sizes as cached and before the server's pipeline, in order: what carries
    /// annotations of the original image through the pipeline's resize and the crop.
    pub geometry: Vec<Geometry>,
}

impl Ready {
    /// A batch with nothing in it yet, with room for `bs` items' metadata.
    fn empty(bs: usize) -> Ready {
        Ready {
            buf: BatchBuf {
                u8s: Vec::new(),
                f32s: Vec::new(),
                labels: Vec::new(),
            },
            len: 0,
            shape: [0; 4],
            element_ids: Vec::with_capacity(bs),
            epochs: Vec::with_capacity(bs),
            positions: Vec::with_capacity(bs),
            errors: Vec::new(),
            end_of_epoch: None,
            end_of_stream: false,
            padded: 0,
            crops: Vec::new(),
            fields: Vec::with_capacity(bs),
            geometry: Vec::with_capacity(bs),
        }
    }
}

/// An item's image sizes, `(height, width)`: as the server cached it (the image the client's
/// crop is drawn on; `(0, 0)` for raw bytes) and before the server's pipeline resized it (the
/// stored file's; `(0, 0)` when not known).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Geometry {
    /// The cached image's size.
    pub cached: (u32, u32),
    /// The source image's size.
    pub source: (u32, u32),
}

impl Geometry {
    fn of(m: &crate::ItemMeta) -> Geometry {
        Geometry {
            cached: match m.format {
                crate::Format::HwcU8 { height, width, .. } => (height, width),
                crate::Format::Raw => (0, 0),
            },
            source: m.source,
        }
    }
}

/// The handle of a prefetch thread; dropping it stops the thread and detaches from the ring.
#[derive(Debug)]
pub struct Prefetcher {
    ready: Option<Receiver<Result<Ready>>>,
    free: Sender<BatchBuf>,
    stop: Arc<AtomicBool>,
    allocated: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
    done: bool,
    /// The CPU time of the prefetch's threads by stage.
    stages: Arc<stages::StageSink>,
}

impl Prefetcher {
    /// Starts the thread over an open reader.
    pub fn start(reader: RawReader, config: PrefetchConfig) -> Result<Prefetcher> {
        if config.batch_size == 0 || config.depth == 0 || config.threads == 0 {
            return Err(Error::InvalidConfig(format!(
                "batch_size, depth and threads must be positive, got {}, {}, {}",
                config.batch_size, config.depth, config.threads
            )));
        }
        if let Some(a) = &config.aug {
            a.validate()?;
        }
        let (ready_tx, ready) = crossbeam_channel::bounded(config.depth - 1);
        let (free, free_rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let allocated = Arc::new(AtomicUsize::new(0));
        let sink = stages::StageSink::new(&stages::CLIENT);
        let thread_sink = sink.clone();
        let mut worker = Worker {
            reader,
            augmenters: (0..config.threads).map(|_| Augmenter::default()).collect(),
            config,
            ready: ready_tx,
            free: free_rx,
            stop: stop.clone(),
            allocated: allocated.clone(),
            epoch: EpochShare::default(),
            pending_pad: None,
            epochs_ended: 0,
        };
        let thread = std::thread::Builder::new()
            .name("joader-prefetch".into())
            .spawn(move || {
                stages::attach(thread_sink, &client::COLLATE);
                worker.run();
            })
            .map_err(|e| Error::io("spawn", "prefetch thread", e))?;
        Ok(Prefetcher {
            ready: Some(ready),
            free,
            stop,
            allocated,
            thread: Some(thread),
            done: false,
            stages: sink,
        })
    }

    /// The next prepared batch, waiting up to `timeout` (`None`: as long as the server lives;
    /// reaching it is an error with code `timeout`). `Ok(None)` after the end of the stream;
    /// an error of the thread (`server_gone`, `ring_closed`, …) is returned once, then `None`.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<Ready>> {
        if self.done {
            return Ok(None);
        }
        let Some(rx) = &self.ready else {
            return Ok(None);
        };
        let got = match timeout {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => rx.recv_timeout(t),
        };
        match got {
            Ok(Ok(r)) => {
                if r.end_of_stream {
                    self.done = true;
                }
                Ok(Some(r))
            }
            Ok(Err(e)) => {
                self.done = true;
                Err(e)
            }
            Err(RecvTimeoutError::Timeout) => Err(Error::Timeout(timeout.unwrap_or_default())),
            Err(RecvTimeoutError::Disconnected) => {
                self.done = true;
                Ok(None)
            }
        }
    }

    /// Gives a batch's buffer back for reuse (call only when nothing refers to it).
    pub fn recycle(&self, buf: BatchBuf) {
        let _ = self.free.send(buf);
    }

    /// A sender that gives buffers back, for consumers that outlive a borrow of `self`.
    pub fn recycler(&self) -> Sender<BatchBuf> {
        self.free.clone()
    }

    /// Seconds of thread CPU per client stage (`stages::CLIENT`: wait, copy, crop_resize, flip,
    /// normalize, collate, handover) since this prefetch started, over its prefetch thread and
    /// augmentation threads (a running thread's time since its last stage boundary is not in
    /// yet).
    pub fn stage_cpu(&self) -> Vec<(&'static str, f64)> {
        self.stages.seconds()
    }

    /// The sink of [`Prefetcher::stage_cpu`], which outlives the prefetch: once the threads
    /// have ended, `threads_seconds` is their whole CPU time.
    pub fn stage_sink(&self) -> Arc<stages::StageSink> {
        self.stages.clone()
    }

    /// Buffers allocated so far (the pool grows only while the consumer keeps batches).
    pub fn buffers_allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A thread blocked handing over a batch wakes up when the receiver is gone.
        self.ready = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the thread knows of the current epoch on this ring.
#[derive(Debug, Default)]
struct EpochShare {
    /// Data and error records of the epoch so far.
    records: u64,
    /// The epoch's first image as written, kept while the epoch may need padding.
    first: Option<First>,
}

#[derive(Debug)]
struct First {
    /// The image's values in the output layout (with [`Output::U8Padded`], the image alone).
    values: BatchBuf,
    /// Its crop, with [`Output::U8Padded`].
    crop: Option<Crop>,
    /// `[H, W, C]`.
    shape: [usize; 3],
    label: i64,
    element_id: u32,
    epoch: u64,
    position: u64,
    /// Its small fields' block.
    fields: Vec<u8>,
    geometry: Geometry,
}

struct Worker {
    reader: RawReader,
    augmenters: Vec<Augmenter>,
    config: PrefetchConfig,
    ready: Sender<Result<Ready>>,
    free: Receiver<BatchBuf>,
    stop: Arc<AtomicBool>,
    allocated: Arc<AtomicUsize>,
    epoch: EpochShare,
    /// The end of an epoch whose padding did not fit in the batch that reached it.
    pending_pad: Option<EpochEnd>,
    /// Epochs ended on this ring so far.
    epochs_ended: u64,
}

impl Worker {
    /// The records the current epoch must have on this ring, if it is padded.
    fn pad_to(&self) -> Option<u64> {
        if self.epochs_ended == 0 {
            self.config.first_pad_to.or(self.config.pad_to)
        } else {
            self.config.pad_to
        }
    }

    fn run(&mut self) {
        loop {
            let r = self.assemble();
            let last = !matches!(&r, Ok(b) if !b.end_of_stream);
            // Blocks while `depth` batches wait; fails once the consumer dropped its end.
            let handover = stages::enter(&client::HANDOVER);
            let sent = self.ready.send(r);
            drop(handover);
            if sent.is_err() || last {
                return;
            }
        }
    }

    fn buffer(&mut self) -> BatchBuf {
        let _cpu = stages::enter(&client::HANDOVER);
        self.free.try_recv().unwrap_or_else(|_| {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            BatchBuf {
                u8s: Vec::new(),
                f32s: Vec::new(),
                labels: Vec::new(),
            }
        })
    }

    /// Reads records until a whole batch, an end of epoch or the end of the stream.
    fn assemble(&mut self) -> Result<Ready> {
        let bs = self.config.batch_size;
        let mut buf = self.buffer();
        let mut out = Ready::empty(bs);
        let mut item_shape = [0usize; 3];
        if let Some(end) = self.pending_pad.take() {
            self.pad(&mut buf, &mut out, &mut item_shape);
            out.end_of_epoch = Some(end);
            self.epoch = EpochShare::default();
            self.epochs_ended += 1;
        }
        // A full batch whose last record the server marked the last of its epoch also takes
        // the end of the epoch that follows: the batch then ends the epoch, as a short last
        // batch does, and a checkpoint after it is in the next epoch on every rank.
        let mut expect_end = false;
        while (out.len < bs || expect_end) && out.end_of_epoch.is_none() && !out.end_of_stream {
            if self.stop.load(Ordering::Relaxed) {
                return Err(Error::Protocol("the prefetch was stopped".into()));
            }
            let wait = stages::enter(&client::WAIT);
            let b = if out.len < bs {
                self.reader.take(bs - out.len, Some(STOP_SLICE))
            } else {
                self.reader.take_end(Some(STOP_SLICE))
            };
            drop(wait);
            let b = b?;
            if out.len >= bs && b.end_of_epoch.is_none() && !b.end_of_stream {
                if self.reader.has_pending() {
                    // Not an end after all (a server that marked too early): the next batch.
                    break;
                }
                continue;
            }
            expect_end |= b.last_of_epoch;
            if !b.items.is_empty() {
                let written = self.add_items(&b, &mut buf, &mut out, &mut item_shape);
                if let Err(e) = written {
                    self.reader.release(b.start);
                    return Err(e);
                }
            }
            // Copied: now the server may reuse the slots.
            self.reader.release(b.start);
            self.epoch.records += (b.items.len() + b.errors.len()) as u64;
            out.errors.extend_from_slice(&b.errors);
            out.end_of_stream = b.end_of_stream;
            if let Some(end) = b.end_of_epoch
                && self.end_epoch(end, &mut buf, &mut out, &mut item_shape)
            {
                break;
            }
        }
        let [h, w, c] = item_shape;
        out.shape = self.config.output.array_shape([out.len, h, w, c]);
        out.buf = buf;
        Ok(out)
    }

    /// The shape of one item of the batch once `b`'s items join it (the padded mode widens
    /// the items already in `buf` to the largest); an error if it differs from the batch's.
    fn item_shape(
        &self,
        b: &RawBatch,
        buf: &mut BatchBuf,
        out: &Ready,
        item_shape: [usize; 3],
    ) -> Result<[usize; 3]> {
        let padded = self.config.output == Output::U8Padded;
        let s = match &self.config.aug {
            _ if padded => crate::collate::padded_shape(&b.items)?,
            Some(a) => crate::collate::augmented_shape(&b.items, a)?,
            None => crate::collate::batch_shape(&b.items)?,
        };
        let mut shape = [s[1], s[2], s[3]];
        if padded && out.len > 0 && shape[2] == item_shape[2] {
            shape = [
                shape[0].max(item_shape[0]),
                shape[1].max(item_shape[1]),
                shape[2],
            ];
            widen(buf, &self.config, &out.crops, item_shape, shape);
        }
        if out.len > 0 && shape != item_shape {
            return Err(Error::Collate(format!(
                "element shape changed within a batch: {item_shape:?} then {shape:?}; resize every element to one size or augment"
            )));
        }
        Ok(shape)
    }

    /// Copies (collates, augments) `b`'s items into the batch. The caller releases `b`.
    fn add_items(
        &mut self,
        b: &RawBatch,
        buf: &mut BatchBuf,
        out: &mut Ready,
        item_shape: &mut [usize; 3],
    ) -> Result<()> {
        let shape = self.item_shape(b, buf, out, *item_shape)?;
        *item_shape = shape;
        let per: usize = shape.iter().product();
        grow(buf, &self.config, per);
        let n = b.items.len();
        let range = out.len * per..(out.len + n) * per;
        let images = if self.config.output.is_float() {
            BatchOut::F32(&mut buf.f32s[range])
        } else {
            BatchOut::U8(&mut buf.u8s[range])
        };
        let labels = &mut buf.labels[out.len..out.len + n];
        let items: Vec<_> = b.items.iter().map(|m| (*m, self.reader.bytes(m))).collect();
        let padded = self.config.output == Output::U8Padded;
        match images {
            BatchOut::U8(images) if padded => write_padded(
                &items,
                self.config.aug.as_ref(),
                self.config.seed,
                shape,
                images,
                labels,
                &mut out.crops,
                &mut self.augmenters,
            )?,
            images => {
                write_batch(
                    &items,
                    self.config.aug.as_ref(),
                    self.config.seed,
                    &self.config.output,
                    images,
                    labels,
                    &mut self.augmenters,
                )?;
            }
        }
        drop(items);
        if self.pad_to().is_some() && self.epoch.first.is_none() {
            let crop = out.crops.get(out.len).copied();
            let fields = self.reader.field_block(&b.items[0]).to_vec();
            self.keep_first(buf, out.len, shape, &b.items[0], crop, fields);
        }
        for m in &b.items {
            out.fields.push(self.reader.field_block(m).to_vec());
            out.geometry.push(Geometry::of(m));
            out.element_ids.push(m.element_id);
            out.epochs.push(m.epoch);
            out.positions.push(m.position);
        }
        out.len += n;
        Ok(())
    }

    /// The end of an epoch: pads a short last share (the `pad_to` mode) and ends the batch
    /// with it. Returns true when the batch is full, so that the padding and the end go into
    /// a batch of their own (the next one).
    fn end_epoch(
        &mut self,
        end: EpochEnd,
        buf: &mut BatchBuf,
        out: &mut Ready,
        item_shape: &mut [usize; 3],
    ) -> bool {
        let short = self
            .pad_to()
            .is_some_and(|p| self.epoch.records < p && self.epoch.first.is_some());
        if short && out.len >= self.config.batch_size {
            self.pending_pad = Some(end);
            return true;
        }
        if short {
            self.pad(buf, out, item_shape);
        }
        out.end_of_epoch = Some(end);
        self.epoch = EpochShare::default();
        self.epochs_ended += 1;
        false
    }

    fn keep_first(
        &mut self,
        buf: &BatchBuf,
        at: usize,
        mut shape: [usize; 3],
        m: &crate::ItemMeta,
        crop: Option<Crop>,
        fields: Vec<u8>,
    ) {
        let per: usize = shape.iter().product();
        let range = at * per..(at + 1) * per;
        let mut values = BatchBuf {
            u8s: buf.u8s.get(range.clone()).unwrap_or(&[]).to_vec(),
            f32s: buf.f32s.get(range).unwrap_or(&[]).to_vec(),
            labels: Vec::new(),
        };
        if let Some(Crop { image: (h, w), .. }) = crop {
            // The image alone: the place it gets when padding depends on that batch.
            let (h, w, [_, pw, c]) = (h as usize, w as usize, shape);
            values.u8s = values
                .u8s
                .chunks(pw * c)
                .take(h)
                .flat_map(|r| &r[..w * c])
                .copied()
                .collect();
            shape = [h, w, c];
        }
        self.epoch.first = Some(First {
            values,
            crop,
            shape,
            label: m.label,
            element_id: m.element_id,
            epoch: m.epoch,
            position: m.position,
            fields,
            geometry: Geometry::of(m),
        });
    }

    /// Appends the epoch's first image once more.
    fn pad(&mut self, buf: &mut BatchBuf, out: &mut Ready, item_shape: &mut [usize; 3]) {
        let Some(first) = self.epoch.first.take() else {
            return;
        };
        if let Some(crop) = first.crop {
            let [h, w, c] = first.shape;
            let to = match out.len {
                0 => first.shape,
                _ => [item_shape[0].max(h), item_shape[1].max(w), c],
            };
            widen(buf, &self.config, &out.crops, *item_shape, to);
            *item_shape = to;
            let n: usize = to.iter().product();
            let place = &mut buf.u8s[out.len * n..(out.len + 1) * n];
            crate::collate::place(&first.values.u8s, (h, w), place, (to[0], to[1], c), false);
            out.crops.push(crop);
        } else {
            *item_shape = first.shape;
            let n: usize = first.shape.iter().product();
            grow(buf, &self.config, n);
            let at = out.len * n;
            if self.config.output.is_float() {
                buf.f32s[at..at + n].copy_from_slice(&first.values.f32s);
            } else {
                buf.u8s[at..at + n].copy_from_slice(&first.values.u8s);
            }
        }
        buf.labels[out.len] = first.label;
        out.fields.push(first.fields);
        out.geometry.push(first.geometry);
        out.element_ids.push(first.element_id);
        out.epochs.push(first.epoch);
        out.positions.push(first.position);
        out.len += 1;
        out.padded += 1;
    }
}

/// Makes the places of a padded batch, holding `crops`' images in `from` places, `to` places
/// (at least as large).
fn widen(
    buf: &mut BatchBuf,
    config: &PrefetchConfig,
    crops: &[Crop],
    from: [usize; 3],
    to: [usize; 3],
) {
    grow(buf, config, to.iter().product());
    if from != to {
        restride_padded(&mut buf.u8s, crops, from, to);
    }
}

/// Makes `buf` hold a whole batch of `per` values an image.
fn grow(buf: &mut BatchBuf, config: &PrefetchConfig, per: usize) {
    let bs = config.batch_size;
    if config.output.is_float() {
        if buf.f32s.len() < bs * per {
            buf.f32s.resize(bs * per, 0.0);
        }
    } else if buf.u8s.len() < bs * per {
        buf.u8s.resize(bs * per, 0);
    }
    if buf.labels.len() < bs {
        buf.labels.resize(bs, 0);
    }
}
