//! The data-plane benchmark behind `joader bench dataplane`.
//!
//! 1. Copy throughput: a batch of images is written into a fresh data
//!    segment, pushed through a ring, taken by a [`Reader`] and collated
//!    into one contiguous `(B, H, W, C)` buffer; the time is compared with a
//!    plain `memcpy` of the same number of bytes between two warm process
//!    buffers, interleaved in the same run (alternating which goes first).
//!    Target ratio: at least 0.7.
//! 2. Delivery latency: a producer thread pushes one record at a time at
//!    random-ish intervals while the consumer sleeps in the futex; the
//!    latency is from just before the push to the consumer's return from
//!    `next_batch`. Target p99: at most 200 µs.
//! 3. Client augmentation: one thread's CPU time per image for RandomResizedCrop(224) + flip from a
//!    341×256 image (what the training recipe caches), to uint8 NHWC and to normalized
//!    float32 NCHW. Target: at most 0.15 ms. Beside it, the device path's CPU share: copying
//!    each cached image into a padded uint8 batch (its crop drawn, not made: the GPU crops).
//!    Target: at most 0.10 ms.
//! 4. The same crop + flip over what a training loop gives it: batches of 64 distinct cached
//!    images (the next 64 of 512 each time, so that they come from memory, not from a cache)
//!    into a batch buffer, as the prefetch thread writes one (`collate::write_batch`, one
//!    augmentation thread), back to back, and one batch every `pace` (100 ms, the loop
//!    waiting for its GPU), alternating: whether distinct images, and a core that sleeps
//!    between batches, cost more than the one hot image of 3. This is the figure to hold a
//!    paced training loop's client CPU against.

use std::fmt;
use std::time::{Duration, Instant};

use dataplane::Format;
use dataplane::ItemMeta;
use dataplane::Reader;
use dataplane::Result;
use dataplane::augment::{Augmenter, ItemOut, Output, RandomResizedCrop};
use dataplane::collate::{BatchOut, write_batch, write_padded};
use dataplane::{SegmentConfig, SlotMeta, Writer};

/// Benchmark parameters.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Images per batch (default 256).
    pub batch: usize,
    /// Image height (default 224).
    pub height: u32,
    /// Image width (default 224).
    pub width: u32,
    /// Channels (default 3).
    pub channels: u32,
    /// Timed copy iterations (default 21).
    pub iterations: usize,
    /// Latency samples (default 2000).
    pub latency_samples: usize,
    /// Instance name (default: a unique `bench<pid>_<nanos>`).
    pub instance: Option<String>,
    /// The pause between batches of the paced crop (default 100 ms, a training step).
    pub pace: Duration,
    /// Batches of the paced crop, and as many back to back (default 8).
    pub paced_batches: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            batch: 256,
            height: 224,
            width: 224,
            channels: 3,
            iterations: 21,
            latency_samples: 2000,
            instance: None,
            pace: Duration::from_millis(100),
            paced_batches: 8,
        }
    }
}

/// Benchmark results.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// The options used.
    pub options: BenchOptions,
    /// Bytes per batch.
    pub batch_bytes: u64,
    /// Median time of take + collate + acknowledge of one batch.
    pub reader_time: Duration,
    /// Median time of a plain memcpy of the same bytes.
    pub memcpy_time: Duration,
    /// `memcpy_time / reader_time` (1.0 = as fast as memcpy).
    pub ratio: f64,
    /// Median push-to-wake latency.
    pub latency_p50: Duration,
    /// 99th percentile push-to-wake latency.
    pub latency_p99: Duration,
    /// Worst push-to-wake latency.
    pub latency_max: Duration,
    /// One thread's CPU time per image for RandomResizedCrop(224) + flip from a 341×256 image
    /// (a cached 256-shorter image) into uint8 NHWC, and into normalized float32 NCHW.
    pub augment_per_image: (Duration, Duration),
    /// One thread's CPU time per image for copying cached images (three 341×256 for one
    /// 256×341) into a padded batch with their crops drawn: the device path's CPU work.
    pub padded_per_image: Duration,
    /// One thread's CPU time per image for crop + flip to uint8 of batches of 64 distinct
    /// images: back to back, and one batch every [`BenchOptions::pace`].
    pub paced_per_image: (Duration, Duration),
}

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "dataplane bench: batch of {} images {}x{}x{} u8 ({:.1} MB)",
            o.batch,
            o.height,
            o.width,
            o.channels,
            self.batch_bytes as f64 / 1e6
        )?;
        writeln!(
            f,
            "  reader (take + collate + ack): {:>7.2} GB/s  ({:.2} ms/batch, median of {})",
            gbps(self.batch_bytes, self.reader_time),
            self.reader_time.as_secs_f64() * 1e3,
            o.iterations
        )?;
        writeln!(
            f,
            "  plain memcpy:                  {:>7.2} GB/s  ({:.2} ms/batch)",
            gbps(self.batch_bytes, self.memcpy_time),
            self.memcpy_time.as_secs_f64() * 1e3
        )?;
        writeln!(f, "  ratio to memcpy: {:.2} (target >= 0.70)", self.ratio)?;
        write!(
            f,
            "  push->wake latency over {} samples: p50 {} us, p99 {} us, max {} us (target p99 <= 200 us)",
            o.latency_samples,
            self.latency_p50.as_micros(),
            self.latency_p99.as_micros(),
            self.latency_max.as_micros()
        )?;
        write!(
            f,
            "\n  RandomResizedCrop(224) + flip from 341x256, one thread's CPU: {:.3} ms/image to uint8 NHWC, \
             {:.3} ms/image to normalized float32 NCHW (target <= 0.15 ms)",
            self.augment_per_image.0.as_secs_f64() * 1e3,
            self.augment_per_image.1.as_secs_f64() * 1e3
        )?;
        write!(
            f,
            "\n  padded copy for device augmentation (341x256 and 256x341 into 341x341 places + crop draws), \
             one thread's CPU: {:.3} ms/image (target <= 0.10 ms)",
            self.padded_per_image.as_secs_f64() * 1e3
        )?;
        let (busy, paced) = self.paced_per_image;
        write!(
            f,
            "\n  the crop + flip to uint8 over batches of 64 distinct images (of 512), one thread's CPU: {:.3} ms/image \
             back to back, {:.3} ms/image with a batch every {} ms as a training loop paces it ({:.2}x)",
            busy.as_secs_f64() * 1e3,
            paced.as_secs_f64() * 1e3,
            self.options.pace.as_millis(),
            paced.as_secs_f64() / busy.as_secs_f64().max(1e-12)
        )
    }
}

/// This thread's CPU time (`dataplane::stages`' clock).
fn thread_cpu() -> Duration {
    Duration::from_nanos(dataplane::stages::thread_cpu_ns())
}

/// Median CPU time per image of `rounds` rounds of RandomResizedCrop(224) + flip over 64 images,
/// into uint8 NHWC and into normalized float32 NCHW. The two outputs alternate round by round,
/// so that both see the same clock speed, caches and neighbours: measured one after the
/// other, whatever changes between the two runs (a core clocking up, another process) would
/// read as a difference between the outputs.
fn augment_bench(rounds: usize) -> Result<(Duration, Duration)> {
    let (h, w) = (256u32, 341u32);
    let src = cached_image(h, w, 0);
    let aug = RandomResizedCrop::new(224, 224);
    let float = Output::F32Nchw {
        mean: vec![0.485, 0.456, 0.406],
        std: vec![0.229, 0.224, 0.225],
    };
    let mut a = Augmenter::default();
    let mut u8s = vec![0u8; 224 * 224 * 3];
    let mut f32s = vec![0f32; 224 * 224 * 3];
    let (mut u8_times, mut f32_times) = (Vec::new(), Vec::new());
    // One round of each first, untimed: buffers and the resizer's state are allocated.
    for r in 0..=rounds.max(1) {
        for output in [&Output::U8Nhwc, &float] {
            let t = thread_cpu();
            for k in 0..64u64 {
                let key = dataplane::augment::item_key(1, r as u64, k);
                let dst = if output.is_float() {
                    ItemOut::F32(&mut f32s)
                } else {
                    ItemOut::U8(&mut u8s)
                };
                a.write(&src, (h, w, 3), Some(&aug), key, output, dst, false)?;
            }
            let per_image = thread_cpu().saturating_sub(t) / 64;
            if r > 0 {
                if output.is_float() {
                    f32_times.push(per_image);
                } else {
                    u8_times.push(per_image);
                }
            }
        }
    }
    Ok((median(u8_times), median(f32_times)))
}

/// Median CPU time per image of `rounds` padded copies of a batch of 64 cached images, one in
/// four portrait, so that the places are 341×341 as in a batch of mixed photos; 64 images of
/// about 260 KB each, more than the caches hold, as a real batch.
fn padded_bench(rounds: usize) -> Result<Duration> {
    let sizes: Vec<(u32, u32)> = (0..64)
        .map(|k| if k % 4 == 3 { (341, 256) } else { (256, 341) })
        .collect();
    let imgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &(h, w))| cached_image(h, w, k))
        .collect();
    let aug = RandomResizedCrop::new(224, 224);
    let mut augmenters = [Augmenter::default()];
    let mut out = vec![0u8; 64 * 341 * 341 * 3];
    let mut labels = vec![0i64; 64];
    let mut crops = Vec::with_capacity(64);
    let mut times = Vec::new();
    for r in 0..rounds.max(1) + 1 {
        let items: Vec<(ItemMeta, &[u8])> = sizes
            .iter()
            .zip(&imgs)
            .enumerate()
            .map(|(k, (&(h, w), img))| (cached_item(h, w, r as u64, k), &img[..]))
            .collect();
        crops.clear();
        let t = thread_cpu();
        write_padded(
            &items,
            Some(&aug),
            1,
            [341, 341, 3],
            &mut out,
            &mut labels,
            &mut crops,
            &mut augmenters,
        )?;
        let spent = thread_cpu().saturating_sub(t) / 64;
        std::hint::black_box(&out);
        // The first round faults the output's pages in.
        if r > 0 {
            times.push(spent);
        }
    }
    Ok(median(times))
}

/// Median CPU time per image of crop + flip to uint8 over batches of 64 distinct 341×256
/// images into a 64-image batch (9.6 MB), written as the prefetch thread writes one
/// (`collate::write_batch`, one augmentation thread). Each batch takes the next 64 of 512
/// images (134 MB: an image is read again only after 117 MB of others, so from memory, as a
/// loop's cached epoch reads them; 64 images, 17 MB, fit in a 32 MiB L3). `batches` batches
/// back to back and `batches` with `pace` of sleep before each, interleaved (a paced batch,
/// then one back to back), so that both see the same machine.
fn paced_bench(batches: usize, pace: Duration) -> Result<(Duration, Duration)> {
    const N: usize = 64;
    const IMAGES: usize = 8 * N;
    let (h, w) = (256u32, 341u32);
    let imgs: Vec<Vec<u8>> = (0..IMAGES).map(|k| cached_image(h, w, k)).collect();
    let aug = RandomResizedCrop::new(224, 224);
    let mut augmenters = [Augmenter::default()];
    let mut out = vec![0u8; N * 224 * 224 * 3];
    let mut labels = [0i64; N];
    let mut batch = |r: u64| -> Result<Duration> {
        let first = r as usize % (IMAGES / N) * N;
        let items: Vec<_> = imgs[first..first + N]
            .iter()
            .enumerate()
            .map(|(k, img)| (cached_item(h, w, r, k), &img[..]))
            .collect();
        let t = thread_cpu();
        write_batch(
            &items,
            Some(&aug),
            2,
            &Output::U8Nhwc,
            BatchOut::U8(&mut out),
            &mut labels,
            &mut augmenters,
        )?;
        Ok(thread_cpu().saturating_sub(t) / N as u32)
    };
    // One untimed batch: the output's pages and the resizer's buffers.
    batch(0)?;
    let (mut busy, mut paced) = (Vec::new(), Vec::new());
    for r in 0..batches.max(1) as u64 {
        std::thread::sleep(pace);
        paced.push(batch(2 * r + 1)?);
        busy.push(batch(2 * r + 2)?);
    }
    Ok((median(busy), median(paced)))
}

/// What a ring record says of the `k`-th image of epoch `epoch`'s batch: an `h × w` RGB image.
fn cached_item(h: u32, w: u32, epoch: u64, k: usize) -> ItemMeta {
    ItemMeta {
        element_id: k as u32,
        label: k as i64,
        epoch,
        position: k as u64,
        slot: k as u32,
        generation: 1,
        format: Format::HwcU8 {
            height: h,
            width: w,
            channels: 3,
        },
        offset: 0,
        len: u64::from(h * w * 3),
        fields_len: 0,
        source: (0, 0),
    }
}

/// A stand-in for a cached `h × w` RGB image, different for each `k`.
fn cached_image(h: u32, w: u32, k: usize) -> Vec<u8> {
    (0..(h * w * 3) as usize)
        .map(|i| ((i * 7) ^ (i >> 9) ^ k) as u8)
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[v.len() / 2]
}

/// Runs the benchmark (a few seconds). Creates and removes its own segments.
pub fn run(opts: &BenchOptions) -> Result<BenchReport> {
    let instance = opts.instance.clone().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("bench{}_{nanos}", std::process::id())
    });
    let per = opts.height as usize * opts.width as usize * opts.channels as usize;
    let total = per * opts.batch;
    let mut cfg = SegmentConfig::new(
        instance.clone(),
        opts.batch as u32 + 8,
        (total + opts.batch * 64 + 4096) as u64,
    );
    cfg.reserve = true;
    let w = Writer::create(&cfg)?;
    let format = Format::HwcU8 {
        height: opts.height,
        width: opts.width,
        channels: opts.channels,
    };
    let img: Vec<u8> = (0..per).map(|i| (i * 13) as u8).collect();
    let slots = (0..opts.batch)
        .map(|i| {
            w.write_slot(
                SlotMeta {
                    fields_len: 0,
                    source: (0, 0),
                    element_id: i as u32,
                    label: i as i64,
                    format,
                },
                &img,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut ring = w.create_ring("copy", opts.batch as u32)?;
    let reader = Reader::open(&instance, "copy")?;
    let mut dst = vec![1u8; total];
    let mut labels = vec![0i64; opts.batch];
    let src = vec![2u8; total];
    let mut reader_times = Vec::new();
    let mut memcpy_times = Vec::new();
    for it in 0..opts.iterations + 2 {
        for (p, s) in slots.iter().enumerate() {
            ring.push_data(*s, it as u64, p as u64)?;
        }
        // Alternate the order: whichever copy runs second may find part of
        // its source in the last-level cache.
        let mut t_memcpy = Duration::ZERO;
        let mut t_reader = Duration::ZERO;
        for step in [it % 2, 1 - it % 2] {
            if step == 0 {
                let t0 = Instant::now();
                dst.copy_from_slice(&src);
                t_memcpy = t0.elapsed();
            } else {
                let t0 = Instant::now();
                let b = reader.next_batch(opts.batch, Some(Duration::from_secs(10)))?;
                b.collate_into(&mut dst, &mut labels)?;
                drop(b);
                t_reader = t0.elapsed();
            }
            std::hint::black_box(&dst);
        }
        ring.poll_acks()?;
        // The first two rounds warm caches and page tables.
        if it >= 2 {
            memcpy_times.push(t_memcpy);
            reader_times.push(t_reader);
        }
    }
    drop(reader);
    drop(ring);
    let reader_time = median(reader_times);
    let memcpy_time = median(memcpy_times);

    let (p50, p99, max) = latency(&w, &instance, opts.latency_samples.max(1), slots[0])?;
    drop(w);
    Ok(BenchReport {
        options: opts.clone(),
        batch_bytes: total as u64,
        reader_time,
        memcpy_time,
        ratio: memcpy_time.as_secs_f64() / reader_time.as_secs_f64(),
        latency_p50: p50,
        latency_p99: p99,
        latency_max: max,
        augment_per_image: augment_bench(opts.iterations)?,
        padded_per_image: padded_bench(opts.iterations)?,
        paced_per_image: paced_bench(opts.paced_batches, opts.pace)?,
    })
}

fn latency(
    w: &Writer,
    instance: &str,
    samples: usize,
    slot: dataplane::SlotRef,
) -> Result<(Duration, Duration, Duration)> {
    let mut ring = w.create_ring("latency", 64)?;
    let inst = instance.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let consumer = std::thread::spawn(move || -> Result<Vec<Instant>> {
        let reader = Reader::open(&inst, "latency")?;
        let _ = ready_tx.send(());
        let mut wakes = Vec::with_capacity(samples);
        while wakes.len() < samples {
            let b = reader.next_batch(1, Some(Duration::from_secs(5)))?;
            let now = Instant::now();
            for _ in 0..b.len() {
                wakes.push(now);
            }
        }
        Ok(wakes)
    });
    let _ = ready_rx.recv_timeout(Duration::from_secs(5));
    let mut pushes = Vec::with_capacity(samples);
    let mut x = 0x2545f4914f6cdd1du64;
    for i in 0..samples {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // 50..250 µs apart: the consumer is asleep in the futex when we push.
        std::thread::sleep(Duration::from_micros(50 + x % 200));
        ring.poll_acks()?;
        while ring.free_credit() == 0 {
            ring.wait_for_acks(Duration::from_millis(10));
            ring.poll_acks()?;
        }
        pushes.push(Instant::now());
        ring.push_data(slot, 0, i as u64)?;
    }
    let wakes = consumer
        .join()
        .map_err(|_| dataplane::Error::Protocol("latency consumer panicked".into()))??;
    let mut lat: Vec<Duration> = pushes
        .iter()
        .zip(&wakes)
        .map(|(p, w)| w.saturating_duration_since(*p))
        .collect();
    lat.sort();
    let pick = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    Ok((pick(0.5), pick(0.99), lat[lat.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bench_runs_and_reports() {
        let opts = BenchOptions {
            batch: 8,
            height: 16,
            width: 16,
            channels: 3,
            iterations: 3,
            latency_samples: 50,
            instance: None,
            pace: Duration::from_millis(5),
            paced_batches: 2,
        };
        let r = run(&opts).unwrap();
        assert_eq!(r.batch_bytes, 8 * 16 * 16 * 3);
        assert!(r.ratio > 0.0 && r.latency_p50 <= r.latency_p99 && r.latency_p99 <= r.latency_max);
        let s = r.to_string();
        assert!(s.contains("ratio to memcpy") && s.contains("p99"), "{s}");
        assert!(s.contains("padded copy"), "{s}");
        assert!(r.paced_per_image.0 > Duration::ZERO && r.paced_per_image.1 > Duration::ZERO);
        assert!(s.contains("with a batch every 5 ms"), "{s}");
    }
}
