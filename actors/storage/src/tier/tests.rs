//! The tier as a whole over a real folder: restart, damage, the lock, the size limit, write
//! errors that only stop writing.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use roaring::RoaringBitmap;

use super::*;

fn key(n: u32) -> TierKey {
    TierKey {
        store: "http://127.0.0.1:1/bkt".into(),
        object: format!("img/{n}.jpg"),
        etag: format!("\"etag-{n}\""),
        range: None,
        part: None,
    }
}

fn payload(n: u32) -> Bytes {
    Bytes::from(vec![n as u8; 1000 + n as usize])
}

#[test]
fn the_writer_threads_cpu_is_the_fetch_stages() {
    let dir = tempfile::tempdir().unwrap();
    let before = crate::stage::FETCH.nanos();
    let t = DiskTier::open(dir.path(), 64 << 20).unwrap();
    for n in 0..2000 {
        t.offer(key(n), payload(n % 200), None);
    }
    t.flush();
    // The writer thread's time is charged when it ends (the tier's drop joins it).
    drop(t);
    assert!(crate::stage::FETCH.nanos() > before);
}

#[test]
fn stored_objects_are_read_back_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = DiskTier::open(dir.path(), 1 << 20).unwrap();
        for n in 0..10 {
            t.offer(key(n), payload(n), None);
        }
        t.flush();
        assert_eq!(t.stats().writes.load(Relaxed), 10);
        assert_eq!(t.read(&key(3), None).as_deref(), Some(&payload(3)[..]));
        assert_eq!(t.read(&key(11), None), None);
        assert_eq!(t.stats().hits.load(Relaxed), 1);
        assert_eq!(t.stats().misses.load(Relaxed), 1);
        // A second server on the same folder is refused.
        assert!(matches!(
            DiskTier::open(dir.path(), 1 << 20),
            Err(TierError::Locked { .. })
        ));
    }
    // An unfinished write left behind is removed at start-up.
    std::fs::write(dir.path().join("tmp").join("leftover"), b"x").unwrap();
    let t = DiskTier::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(t.stats().objects.load(Relaxed), 10);
    for n in 0..10 {
        assert_eq!(t.read(&key(n), None).as_deref(), Some(&payload(n)[..]));
    }
    assert!(!dir.path().join("tmp").join("leftover").exists());
}

#[test]
fn a_damaged_object_is_dropped_at_read_or_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    {
        let t = DiskTier::open(dir.path(), 1 << 20).unwrap();
        for n in 0..3 {
            t.offer(key(n), payload(n), None);
        }
        t.flush();
        let path = format::object_path(&objects, key(0).name());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(t.read(&key(0), None), None, "a flipped byte is a miss");
        assert_eq!(t.stats().corrupt.load(Relaxed), 1);
        assert!(!path.exists());
        // Stored again after the refetch.
        t.offer(key(0), payload(0), None);
        t.flush();
        assert_eq!(t.read(&key(0), None).as_deref(), Some(&payload(0)[..]));
        // A torn one (shorter than its header says).
        let path = format::object_path(&objects, key(1).name());
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    }
    let t = DiskTier::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(
        t.stats().corrupt.load(Relaxed),
        1,
        "found by the header check"
    );
    assert_eq!(t.stats().objects.load(Relaxed), 2);
    assert_eq!(t.read(&key(1), None), None);
}

#[test]
fn the_size_limit_holds_and_needed_objects_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let one = format::encoded_len(&key(0), 1000);
    let t = DiskTier::open(dir.path(), one * 4 + 100).unwrap();
    let demand = Arc::new(Demand::default());
    demand.epoch_started(1, &(0..4).collect::<RoaringBitmap>());
    let owner = |n| {
        Some(Owner {
            demand: Arc::downgrade(&demand),
            element: n,
        })
    };
    let k = |n: u32| TierKey {
        object: format!("o{n}"),
        ..key(0)
    };
    for n in 0..4 {
        t.offer(k(n), Bytes::from(vec![1u8; 1000]), owner(n));
    }
    t.flush();
    assert_eq!(t.stats().objects.load(Relaxed), 4);
    // Everything stored is needed: a new object is not stored.
    t.offer(k(9), Bytes::from(vec![1u8; 1000]), owner(9));
    t.flush();
    assert_eq!(t.stats().not_admitted.load(Relaxed), 1);
    assert!(!t.contains(&k(9)));
    // Once element 2 is read this epoch, it makes room.
    demand.delivered(1, 2);
    t.offer(k(9), Bytes::from(vec![1u8; 1000]), owner(9));
    t.flush();
    assert!(t.contains(&k(9)) && !t.contains(&k(2)));
    assert_eq!(t.stats().evictions.load(Relaxed), 1);
    assert!(t.stats().bytes.load(Relaxed) <= one * 4 + 100);
    // A restart with a smaller size keeps the most recently written that fit.
    drop(t);
    let t = DiskTier::open(dir.path(), one * 2).unwrap();
    assert_eq!(t.stats().objects.load(Relaxed), 2);
    assert!(t.contains(&k(9)));
}

#[test]
fn a_write_error_stops_writing_and_reads_still_miss_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let t = DiskTier::open(dir.path(), 1 << 20).unwrap();
    t.offer(key(1), payload(1), None);
    t.flush();
    // The folder replaced by a file under the running tier.
    std::fs::remove_dir_all(dir.path().join("objects")).unwrap();
    std::fs::remove_dir_all(dir.path().join("tmp")).unwrap();
    std::fs::write(dir.path().join("objects"), b"not a folder").unwrap();
    assert_eq!(t.read(&key(1), None), None);
    t.offer(key(2), payload(2), None);
    t.flush();
    assert_eq!(t.stats().write_errors.load(Relaxed), 1);
    assert_eq!(t.stats().writing.load(Relaxed), 0);
    t.offer(key(3), payload(3), None);
    t.flush();
    assert_eq!(t.stats().write_errors.load(Relaxed), 1, "writing stopped");
    assert_eq!(t.read(&key(2), None), None);
}

#[test]
fn a_folder_that_cannot_be_created_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let e = DiskTier::open(&file.join("tier"), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("--disk-cache"), "{e}");
    assert!(matches!(
        DiskTier::open(dir.path(), 0),
        Err(TierError::Empty)
    ));
}

#[test]
fn after_a_restart_adopted_objects_are_kept_while_needed() {
    let dir = tempfile::tempdir().unwrap();
    let one = format::encoded_len(&key(0), 1000);
    let k = |n: u32| TierKey {
        object: format!("o{n}"),
        ..key(0)
    };
    {
        let t = DiskTier::open(dir.path(), one * 2).unwrap();
        for n in 0..2 {
            t.offer(k(n), Bytes::from(vec![1u8; 1000]), None);
        }
        t.flush();
    }
    let t = DiskTier::open(dir.path(), one * 2).unwrap();
    let demand = Arc::new(Demand::default());
    demand.epoch_started(1, &(0..3).collect::<RoaringBitmap>());
    let owner = |n| Owner {
        demand: Arc::downgrade(&demand),
        element: n,
    };
    assert_eq!(t.adopt((0..3).map(|n| (k(n).name(), owner(n)))), 2);
    // Both stored objects are needed by job 1: element 2 is not stored.
    t.offer(k(2), Bytes::from(vec![1u8; 1000]), Some(owner(2)));
    t.flush();
    assert!(t.contains(&k(0)) && t.contains(&k(1)) && !t.contains(&k(2)));
}
