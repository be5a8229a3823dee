//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use dataplane::{Format, SegmentConfig, SlotMeta, SlotRef, Writer};

/// A unique instance name per test (tests run in parallel, and in several processes).
pub fn instance(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "t{}_{}_{}_{}",
        tag,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// Objects of `instance` present in /dev/shm.
pub fn objects(instance: &str) -> Vec<String> {
    let prefix = format!("joader-{instance}-");
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    v.sort();
    v
}

pub fn writer(tag: &str, slots: u32, arena: u64) -> Writer {
    Writer::create(&SegmentConfig::new(instance(tag), slots, arena)).unwrap()
}

/// Deterministic image content of element `id`.
pub fn pattern(id: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id as usize * 31 + i * 7) as u8).collect()
}

pub fn image_meta(id: u32, h: u32, w: u32) -> SlotMeta {
    SlotMeta {
        fields_len: 0,
        source: (0, 0),
        element_id: id,
        label: id as i64 + 1000,
        format: Format::HwcU8 {
            height: h,
            width: w,
            channels: 3,
        },
    }
}

pub fn write_image(w: &Writer, id: u32, h: u32, wd: u32) -> SlotRef {
    w.write_slot(image_meta(id, h, wd), &pattern(id, (h * wd * 3) as usize))
        .unwrap()
}
