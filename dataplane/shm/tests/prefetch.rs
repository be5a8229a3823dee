//! The prefetch thread against a real ring: order, content, augmentation, acknowledgements
//! after the copy, padding of a short share, buffer reuse.

mod common;

use std::time::Duration;

use common::*;
use dataplane::augment::{Output, RandomResizedCrop, item_key};
use dataplane::prefetch::{PrefetchConfig, Prefetcher};
use dataplane::{RawReader, RingWriter, SlotRef, Writer};

const LONG: Duration = Duration::from_secs(60);

fn config(batch_size: usize) -> PrefetchConfig {
    PrefetchConfig {
        batch_size,
        depth: 2,
        aug: None,
        seed: 0,
        output: Output::U8Nhwc,
        threads: 2,
        pad_to: None,
        first_pad_to: None,
    }
}

/// `n` images of 6×8 pushed as one epoch (positions 0..n), then end of epoch and of stream.
fn one_epoch(w: &Writer, ring: &mut RingWriter, n: u32) -> Vec<SlotRef> {
    let slots: Vec<_> = (0..n).map(|i| write_image(w, i, 6, 8)).collect();
    for (pos, s) in slots.iter().enumerate() {
        ring.push_data(*s, 0, pos as u64).unwrap();
    }
    ring.push_end_of_epoch(0, n as u64).unwrap();
    ring.push_end_of_stream().unwrap();
    slots
}

#[test]
fn batches_come_in_order_with_their_content_and_are_acknowledged_after_the_copy() {
    let w = writer("pf", 32, 1 << 20);
    let mut ring = w.create_ring("job-r0", 32).unwrap();
    let slots = one_epoch(&w, &mut ring, 10);
    let reader = RawReader::open(w.instance(), "job-r0", LONG).unwrap();
    let mut p = Prefetcher::start(reader, config(4)).unwrap();
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    while let Some(b) = p.next(Some(LONG)).unwrap() {
        if b.len > 0 {
            assert_eq!(b.shape, [b.len, 6, 8, 3]);
        }
        for k in 0..b.len {
            let id = b.element_ids[k];
            assert_eq!(b.positions[k], id as u64);
            assert_eq!(b.buf.labels[k], id as i64 + 1000);
            assert_eq!(&b.buf.u8s[k * 144..(k + 1) * 144], &pattern(id, 144)[..]);
            seen.push(id);
        }
        sizes.push((b.len, b.end_of_epoch.map(|e| e.count), b.end_of_stream));
        p.recycle(b.buf);
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!(
        sizes,
        vec![
            (4, None, false),
            (4, None, false),
            (2, Some(10), false),
            (0, None, true)
        ]
    );
    // Every record was acknowledged once copied: the server gets every slot back.
    let mut acked = Vec::new();
    while acked.len() < slots.len() {
        acked.extend(ring.poll_acks().unwrap());
    }
    assert_eq!(acked, slots);
    assert!(
        p.buffers_allocated() <= 4,
        "{} buffers",
        p.buffers_allocated()
    );
}

#[test]
fn augmentation_and_float_output_match_the_per_item_transform() {
    let w = writer("pfaug", 32, 1 << 20);
    let mut ring = w.create_ring("job-r0", 32).unwrap();
    one_epoch(&w, &mut ring, 7);
    let reader = RawReader::open(w.instance(), "job-r0", LONG).unwrap();
    let aug = RandomResizedCrop::new(5, 4);
    let (mean, std) = (vec![0.1, 0.2, 0.3], vec![0.5, 0.25, 2.0]);
    let cfg = PrefetchConfig {
        aug: Some(aug),
        seed: 42,
        output: Output::F32Nchw {
            mean: mean.clone(),
            std: std.clone(),
        },
        threads: 3,
        ..config(3)
    };
    let mut p = Prefetcher::start(reader, cfg).unwrap();
    let mut n = 0;
    while let Some(b) = p.next(Some(LONG)).unwrap() {
        if b.len > 0 {
            assert_eq!(b.shape, [b.len, 3, 5, 4]);
        }
        for k in 0..b.len {
            let id = b.element_ids[k];
            let mut want = vec![0u8; 5 * 4 * 3];
            let key = item_key(42, 0, b.positions[k]);
            aug.apply(&pattern(id, 144), 6, 8, 3, &mut want, key)
                .unwrap();
            let got = &b.buf.f32s[k * 60..(k + 1) * 60];
            for c in 0..3 {
                for px in 0..20 {
                    let v = (want[px * 3 + c] as f32 / 255.0 - mean[c]) / std[c];
                    assert!((got[c * 20 + px] - v).abs() < 1e-6, "item {id}");
                }
            }
            n += 1;
        }
    }
    assert_eq!(n, 7);
}

#[test]
fn a_short_share_is_padded_with_its_first_element() {
    // A rank with 3 records of an epoch whose ranks hold 4: the first comes once more.
    for (bs, want) in [(2, vec![2, 2]), (3, vec![3, 1])] {
        let w = writer("pfpad", 32, 1 << 20);
        let mut ring = w.create_ring("job-r1", 32).unwrap();
        one_epoch(&w, &mut ring, 3);
        let reader = RawReader::open(w.instance(), "job-r1", LONG).unwrap();
        let cfg = PrefetchConfig {
            pad_to: Some(4),
            ..config(bs)
        };
        let mut p = Prefetcher::start(reader, cfg).unwrap();
        let mut lens = Vec::new();
        let mut ids = Vec::new();
        let mut last = None;
        while let Some(b) = p.next(Some(LONG)).unwrap() {
            if b.len > 0 {
                lens.push(b.len);
                let k = b.len - 1;
                last = Some(b.buf.u8s[k * 144..(k + 1) * 144].to_vec());
            }
            ids.extend_from_slice(&b.element_ids);
            if b.end_of_epoch.is_some() {
                assert_eq!(b.padded, 1);
            }
        }
        assert_eq!(lens, want, "batch size {bs}");
        assert_eq!(ids, vec![0, 1, 2, 0]);
        assert_eq!(last.unwrap(), pattern(0, 144));
    }
}

#[test]
fn a_consumer_that_keeps_every_batch_is_never_blocked_and_nothing_changes_under_it() {
    let w = writer("pfkeep", 64, 1 << 20);
    let mut ring = w.create_ring("job-r0", 64).unwrap();
    one_epoch(&w, &mut ring, 20);
    let reader = RawReader::open(w.instance(), "job-r0", LONG).unwrap();
    let mut p = Prefetcher::start(reader, config(2)).unwrap();
    let mut kept = Vec::new();
    while let Some(b) = p.next(Some(LONG)).unwrap() {
        kept.push(b);
    }
    // Ten full batches, the end of the epoch, the end of the stream.
    assert_eq!(kept.len(), 12);
    for b in &kept {
        for k in 0..b.len {
            let id = b.element_ids[k];
            assert_eq!(&b.buf.u8s[k * 144..(k + 1) * 144], &pattern(id, 144)[..]);
        }
    }
}

#[test]
fn a_timeout_is_an_error_and_dropping_stops_the_thread() {
    let w = writer("pfto", 16, 1 << 20);
    let _ring = w.create_ring("job-r0", 16).unwrap();
    let reader = RawReader::open(w.instance(), "job-r0", LONG).unwrap();
    let mut p = Prefetcher::start(reader, config(4)).unwrap();
    let e = p.next(Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(e.code(), "timeout");
    drop(p);
}

#[test]
fn a_resumed_first_epoch_is_padded_to_its_own_share() {
    // A rank of a job resumed mid-epoch: 2 records of the rest of epoch 3 (ranks hold 3 of it),
    // then a whole epoch 4 of 3 records (ranks hold 4).
    let w = writer("pfresume", 32, 1 << 20);
    let mut ring = w.create_ring("job-r1", 32).unwrap();
    let slots: Vec<_> = (0..5).map(|i| write_image(&w, i, 6, 8)).collect();
    for (pos, s) in slots[..2].iter().enumerate() {
        ring.push_data(*s, 3, 7 + pos as u64).unwrap();
    }
    ring.push_end_of_epoch(3, 2).unwrap();
    for (pos, s) in slots[2..].iter().enumerate() {
        ring.push_data(*s, 4, pos as u64).unwrap();
    }
    ring.push_end_of_epoch(4, 3).unwrap();
    ring.push_end_of_stream().unwrap();
    let reader = RawReader::open(w.instance(), "job-r1", LONG).unwrap();
    let cfg = PrefetchConfig {
        pad_to: Some(4),
        first_pad_to: Some(3),
        ..config(8)
    };
    let mut p = Prefetcher::start(reader, cfg).unwrap();
    let mut epochs = Vec::new();
    while let Some(b) = p.next(Some(LONG)).unwrap() {
        if b.len > 0 {
            epochs.push((b.element_ids.clone(), b.padded));
        }
    }
    assert_eq!(epochs, vec![(vec![0, 1, 0], 1), (vec![2, 3, 4, 2], 1)]);
}

#[test]
fn the_prefetch_threads_cpu_time_lands_in_named_stages() {
    // Large enough images that augmentation dominates; both layouts, so that every stage
    // (copy, crop_resize, flip, normalize) has work.
    for (tag, output, aug) in [
        (
            "pfstf",
            Output::F32Nchw {
                mean: vec![0.5; 3],
                std: vec![0.25; 3],
            },
            Some(RandomResizedCrop::new(96, 96)),
        ),
        (
            "pfstu",
            Output::U8Nhwc,
            Some(RandomResizedCrop::new(96, 96)),
        ),
        ("pfstc", Output::U8Nhwc, None),
    ] {
        let n = 48u32;
        let w = writer(tag, 64, 32 << 20);
        let mut ring = w.create_ring("job-r0", 64).unwrap();
        for i in 0..n {
            let s = write_image(&w, i, 160, 200);
            ring.push_data(s, 0, i as u64).unwrap();
        }
        ring.push_end_of_epoch(0, n as u64).unwrap();
        ring.push_end_of_stream().unwrap();
        let reader = RawReader::open(w.instance(), "job-r0", LONG).unwrap();
        let cfg = PrefetchConfig {
            aug,
            seed: 3,
            output: output.clone(),
            threads: 3,
            ..config(8)
        };
        let mut p = Prefetcher::start(reader, cfg).unwrap();
        let sink = p.stage_sink();
        let mut images = 0;
        while let Some(b) = p.next(Some(LONG)).unwrap() {
            images += b.len;
            p.recycle(b.buf);
        }
        assert_eq!(images, n as usize);
        // Dropping joins the prefetch thread: every thread of the prefetch has ended.
        drop(p);
        let stages: std::collections::BTreeMap<_, _> = sink.seconds().into_iter().collect();
        let sum: f64 = stages.values().sum();
        let threads = sink.threads_seconds();
        println!("{tag}: stages {stages:?} add up to {sum} s of the threads' {threads} s");
        assert!(
            threads > 0.0 && sum >= 0.9 * threads && sum <= 1.05 * threads,
            "{tag}: stages {stages:?} add up to {sum} s of the threads' {threads} s"
        );
        let worked = |s: &str| stages[s] > 0.0;
        match (&output, aug.is_some()) {
            (Output::F32Nchw { .. }, _) => assert!(worked("crop_resize") && worked("normalize")),
            (_, true) => assert!(worked("crop_resize") && worked("flip"), "{tag}: {stages:?}"),
            (_, false) => assert!(worked("copy"), "{tag}: {stages:?}"),
        }
        assert!(worked("collate") && worked("wait"), "{tag}: {stages:?}");
    }
}

#[test]
fn fields_and_sizes_are_copied_out_and_padding_repeats_them() {
    let w = writer("pffields", 32, 1 << 20);
    let mut ring = w.create_ring("job-r1", 32).unwrap();
    let mut blocks = Vec::new();
    for i in 0..3u32 {
        let caption = format!("caption {i}");
        let fields = [dataplane::fields::Field {
            name: "caption",
            kind: dataplane::fields::FieldKind::Text,
            flags: 0,
            value: caption.as_bytes(),
        }];
        let mut payload = pattern(i, 144);
        let mut block = Vec::new();
        dataplane::fields::encode(&fields, &mut block);
        payload.extend_from_slice(&block);
        let meta = dataplane::SlotMeta {
            fields_len: block.len() as u32,
            source: (60 + i, 80 + i),
            ..image_meta(i, 6, 8)
        };
        let s = w.write_slot(meta, &payload).unwrap();
        ring.push_data(s, 0, u64::from(i)).unwrap();
        blocks.push(block);
    }
    ring.push_end_of_epoch(0, 3).unwrap();
    ring.push_end_of_stream().unwrap();
    let reader = RawReader::open(w.instance(), "job-r1", LONG).unwrap();
    let cfg = PrefetchConfig {
        pad_to: Some(4),
        ..config(2)
    };
    let mut p = Prefetcher::start(reader, cfg).unwrap();
    let mut got = Vec::new();
    while let Some(b) = p.next(Some(LONG)).unwrap() {
        assert_eq!((b.fields.len(), b.geometry.len()), (b.len, b.len));
        for (k, block) in b.fields.iter().enumerate() {
            got.push((b.element_ids[k], block.clone(), b.geometry[k]));
        }
    }
    let want: Vec<_> = [0u32, 1, 2, 0]
        .iter()
        .map(|&i| {
            let geometry = dataplane::prefetch::Geometry {
                cached: (6, 8),
                source: (60 + i, 80 + i),
            };
            (i, blocks[i as usize].clone(), geometry)
        })
        .collect();
    assert_eq!(got, want);
}
