//! End-to-end tests of the data plane within one process: writer, ring,
//! reader, acknowledgements, read bits, header protocol and lifecycle.

mod common;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::*;
use dataplane::{Error, Reader, ReaderStatus, SegmentConfig, SlotMeta, Writer};

/// Timeouts for data that is already there or about to be: generous, because reaching one is a
/// failure of the code, never something a test waits out (tests wait for states, not times).
const LONG: Duration = Duration::from_secs(60);
const T: Option<Duration> = Some(LONG);

#[test]
fn push_read_ack_end_to_end() {
    let w = writer("e2e", 16, 1 << 20);
    let mut ring = w.create_ring("job1-r0", 8).unwrap();
    let slots: Vec<_> = (0..4).map(|i| write_image(&w, i, 4, 5)).collect();
    for (pos, s) in slots.iter().enumerate() {
        ring.push_data(*s, 0, pos as u64).unwrap();
    }
    ring.push_end_of_epoch(0, 4).unwrap();
    assert_eq!(ring.free_credit(), 3);
    for s in &slots {
        assert_eq!(w.readers_of(*s), vec![ring.reader_index()]);
    }

    let reader = Reader::open(w.instance(), "job1-r0").unwrap();
    assert_eq!(ring.reader_status(), ReaderStatus::Alive);
    let batch = reader.next_batch(10, T).unwrap();
    assert_eq!(batch.len(), 4);
    assert_eq!(batch.end_of_epoch().unwrap().count, 4);
    for (i, item) in batch.items().enumerate() {
        assert_eq!(item.meta.element_id, i as u32);
        assert_eq!(item.meta.label, i as i64 + 1000);
        assert_eq!(item.meta.position, i as u64);
        assert_eq!(item.data, &pattern(i as u32, 60)[..]);
    }
    let c = batch.collate().unwrap();
    assert_eq!(c.shape, [4, 4, 5, 3]);
    assert_eq!(&c.images[60..120], &pattern(1, 60)[..]);
    assert_eq!(c.labels, vec![1000, 1001, 1002, 1003]);

    // Not acknowledged yet: nothing to poll, slots pinned.
    assert!(ring.poll_acks().unwrap().is_empty());
    assert_eq!(w.free_slot(slots[0]).unwrap_err().code(), "slot_pinned");
    reader.ack(batch);
    let acked = ring.poll_acks().unwrap();
    assert_eq!(acked, slots);
    for s in &slots {
        assert!(!w.is_pinned(*s));
        w.free_slot(*s).unwrap();
    }
    assert_eq!(w.free_slots(), 16);
    assert_eq!(w.arena_stats().allocations, 0);
    // A freed slot reference is stale.
    assert_eq!(
        ring.push_data(slots[0], 1, 0).unwrap_err().code(),
        "stale_slot"
    );
}

#[test]
fn ring_credit_bounds_pinned_slots() {
    let w = writer("credit", 64, 1 << 20);
    let mut ring = w.create_ring("r", 4).unwrap();
    let s = write_image(&w, 1, 2, 2);
    for p in 0..4 {
        ring.push_data(s, 0, p).unwrap();
    }
    assert_eq!(ring.free_credit(), 0);
    assert_eq!(ring.push_data(s, 0, 4).unwrap_err().code(), "ring_full");
    let reader = Reader::open(w.instance(), "r").unwrap();
    // Asking for more than the ring can hold returns what there is instead of deadlocking.
    let b = reader.next_batch(100, None).unwrap();
    assert_eq!(b.len(), 4);
    drop(b);
    assert_eq!(ring.free_credit(), 4);
}

#[test]
fn duplicate_slot_stays_pinned_until_last_ack() {
    let w = writer("dup", 8, 1 << 16);
    let mut ring = w.create_ring("r", 8).unwrap();
    let s = write_image(&w, 7, 2, 2);
    ring.push_data(s, 0, 0).unwrap();
    ring.push_end_of_epoch(0, 1).unwrap();
    ring.push_data(s, 1, 0).unwrap();
    let reader = Reader::open(w.instance(), "r").unwrap();
    let b1 = reader.next_batch(10, T).unwrap();
    assert_eq!((b1.len(), b1.end_of_epoch().is_some()), (1, true));
    let b2 = reader
        .next_batch(10, Some(Duration::from_millis(50)))
        .unwrap();
    assert_eq!(b2.len(), 1);
    drop(b1);
    assert_eq!(ring.poll_acks().unwrap(), vec![s]);
    assert!(w.is_pinned(s), "second record still references the slot");
    drop(b2);
    assert_eq!(ring.poll_acks().unwrap(), vec![s]);
    assert!(!w.is_pinned(s));
}

#[test]
fn acknowledgements_are_contiguous_whatever_the_drop_order() {
    let w = writer("order", 8, 1 << 16);
    let mut ring = w.create_ring("r", 8).unwrap();
    let a = write_image(&w, 1, 2, 2);
    let b = write_image(&w, 2, 2, 2);
    ring.push_data(a, 0, 0).unwrap();
    ring.push_data(b, 0, 1).unwrap();
    let reader = Reader::open(w.instance(), "r").unwrap();
    let b1 = reader.next_batch(1, T).unwrap();
    let b2 = reader.next_batch(1, T).unwrap();
    drop(b2);
    assert!(
        ring.poll_acks().unwrap().is_empty(),
        "batch 1 still outstanding"
    );
    assert!(w.is_pinned(b));
    drop(b1);
    assert_eq!(ring.poll_acks().unwrap(), vec![a, b]);
}

#[test]
fn errors_epochs_and_end_of_stream() {
    let w = writer("eos", 8, 1 << 16);
    let mut ring = w.create_ring("r", 16).unwrap();
    let a = write_image(&w, 1, 2, 2);
    ring.push_data(a, 0, 0).unwrap();
    ring.push_error(99, dataplane::element_error::DECODE, 0, 1)
        .unwrap();
    ring.push_end_of_epoch(0, 2).unwrap();
    ring.push_end_of_stream().unwrap();
    let reader = Reader::open(w.instance(), "r").unwrap();
    let b = reader.next_batch(10, T).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b.errors().len(), 1);
    assert_eq!(b.errors()[0].element_id, 99);
    assert_eq!(b.errors()[0].code, 2);
    assert_eq!(b.end_of_epoch().unwrap().epoch, 0);
    assert!(!b.end_of_stream());
    drop(b);
    let b = reader.next_batch(10, T).unwrap();
    assert!(b.end_of_stream() && b.is_empty());
    drop(b);
    // After the end of the stream, batches are empty and do not wait for the timeout.
    let t0 = Instant::now();
    assert!(reader.next_batch(10, Some(LONG)).unwrap().is_empty());
    assert!(t0.elapsed() < LONG, "waited for the timeout after the end");
    assert_eq!(ring.poll_acks().unwrap(), vec![a]);
}

#[test]
fn the_last_record_of_an_epoch_says_so_and_the_end_is_taken_alone() {
    let w = writer("last", 8, 1 << 16);
    let mut ring = w.create_ring("r", 16).unwrap();
    let (a, b, c) = (
        write_image(&w, 1, 2, 2),
        write_image(&w, 2, 2, 2),
        write_image(&w, 3, 2, 2),
    );
    ring.push_data(a, 0, 0).unwrap();
    ring.push_data_with(b, 0, 1, true).unwrap();
    let mut reader = dataplane::RawReader::open(w.instance(), "r", LONG).unwrap();
    let first = reader.take(1, T).unwrap();
    assert!(!first.last_of_epoch && first.items.len() == 1);
    let last = reader.take(1, T).unwrap();
    assert!(last.last_of_epoch && last.items.len() == 1 && last.end_of_epoch.is_none());
    // The end is not pushed yet: `take_end` waits for it (here: until its timeout).
    let none = reader.take_end(Some(Duration::from_millis(50))).unwrap();
    assert!(none.items.is_empty() && none.end_of_epoch.is_none());
    ring.push_end_of_epoch(0, 2).unwrap();
    let end = reader.take_end(T).unwrap();
    assert_eq!(end.end_of_epoch.unwrap().count, 2);
    assert!(end.items.is_empty());
    // A data record is left in place for `take`.
    ring.push_error_with(9, dataplane::element_error::DECODE, 1, 0, false)
        .unwrap();
    ring.push_data(c, 1, 1).unwrap();
    let left = reader.take_end(T).unwrap();
    assert!(left.items.is_empty() && left.errors.is_empty() && left.end_of_epoch.is_none());
    assert!(reader.has_pending());
    let rest = reader.take(1, T).unwrap();
    assert_eq!((rest.errors.len(), rest.items.len()), (1, 1));
    assert!(!rest.last_of_epoch);
    for batch in [first, last, end, rest] {
        reader.release(batch.start);
    }
}

#[test]
fn timeout_returns_an_empty_batch() {
    let w = writer("timeout", 8, 1 << 16);
    let _ring = w.create_ring("r", 8).unwrap();
    let reader = Reader::open(w.instance(), "r").unwrap();
    let t0 = Instant::now();
    let b = reader
        .next_batch(4, Some(Duration::from_millis(150)))
        .unwrap();
    assert!(b.is_empty());
    // A timeout never fires early (the monotonic clock makes this exact).
    let e = t0.elapsed();
    assert!(e >= Duration::from_millis(150), "{e:?}");
}

#[test]
fn blocked_reader_wakes_on_push() {
    let w = writer("wake", 8, 1 << 16);
    let mut ring = w.create_ring("r", 8).unwrap();
    let s = write_image(&w, 3, 2, 2);
    let inst = w.instance().to_string();
    let h = std::thread::spawn(move || {
        let reader = Reader::open(&inst, "r").unwrap();
        let b = reader.next_batch(1, Some(LONG)).unwrap();
        assert_eq!(b.len(), 1, "no item arrived before the timeout");
        b.items().next().unwrap().meta.element_id
    });
    // Most likely the reader is asleep by then; either way it must get the item.
    std::thread::sleep(Duration::from_millis(100));
    ring.push_data(s, 0, 0).unwrap();
    assert_eq!(h.join().unwrap(), 3);
}

#[test]
fn reader_notices_server_shutdown() {
    let w = writer("gone", 8, 1 << 16);
    let ring = w.create_ring("r", 8).unwrap();
    let inst = w.instance().to_string();
    let reader = Reader::open(&inst, "r").unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(w);
        ring
    });
    let err = reader
        .next_batch(1, Some(LONG))
        .expect_err("the reader did not notice the server's end before its timeout");
    assert_eq!(err.code(), "server_gone", "{err}");
    drop(h.join().unwrap());
}

#[test]
fn closed_ring_is_drained_then_reported() {
    let w = writer("closed", 8, 1 << 16);
    let mut ring = w.create_ring("r", 8).unwrap();
    let s = write_image(&w, 1, 2, 2);
    ring.push_data(s, 0, 0).unwrap();
    let reader = Reader::open(w.instance(), "r").unwrap();
    ring.close();
    assert_eq!(ring.push_data(s, 0, 1).unwrap_err().code(), "ring_closed");
    let b = reader.next_batch(8, T).unwrap();
    assert_eq!(b.len(), 1);
    drop(b);
    assert_eq!(reader.next_batch(8, T).unwrap_err().code(), "ring_closed");
}

#[test]
fn reclaim_clears_everything_the_reader_held() {
    let w = writer("reclaim", 8, 1 << 16);
    let mut r1 = w.create_ring("a", 8).unwrap();
    let mut r2 = w.create_ring("b", 8).unwrap();
    assert_ne!(r1.reader_index(), r2.reader_index());
    let s: Vec<_> = (0..3).map(|i| write_image(&w, i, 2, 2)).collect();
    for (p, x) in s.iter().enumerate() {
        r1.push_data(*x, 0, p as u64).unwrap();
        r2.push_data(*x, 0, p as u64).unwrap();
    }
    assert_eq!(w.readers_of(s[0]).len(), 2);
    let back = r1.reclaim_reader();
    assert_eq!(back, s);
    for x in &s {
        assert_eq!(w.readers_of(*x), vec![r2.reader_index()]);
    }
    let idx = r1.reader_index();
    drop(r1);
    // The freed reader index is reused by the next ring.
    let r3 = w.create_ring("c", 8).unwrap();
    assert_eq!(r3.reader_index(), idx);
    assert_eq!(w.reclaim_reader(r2.reader_index()), 3);
    assert_eq!(r2.reclaim_reader().len(), 3);
}

#[test]
fn reader_status_follows_attach_and_detach() {
    let w = writer("status", 8, 1 << 16);
    let ring = w.create_ring("r", 8).unwrap();
    assert_eq!(ring.reader_status(), ReaderStatus::NotAttached);
    let reader = Reader::open(w.instance(), "r").unwrap();
    assert_eq!(ring.reader_status(), ReaderStatus::Alive);
    assert!(ring.reader_alive());
    // A second reader cannot attach to the same ring.
    let e = Reader::open(w.instance(), "r").unwrap_err();
    assert_eq!(e.code(), "ring_in_use", "{e}");
    drop(reader);
    assert_eq!(ring.reader_status(), ReaderStatus::Detached);
    assert!(!ring.reader_alive());
    let e = Reader::open(w.instance(), "r").unwrap_err();
    assert_eq!(e.code(), "ring_abandoned", "{e}");
}

#[test]
fn bogus_acknowledgement_is_a_protocol_violation() {
    let w = writer("bogus", 8, 1 << 16);
    let mut ring = w.create_ring("r", 8).unwrap();
    let s = write_image(&w, 1, 2, 2);
    ring.push_data(s, 0, 0).unwrap();
    // A misbehaving client writes an acknowledgement beyond what was pushed.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{}", ring.segment_name()))
        .unwrap();
    // The consumer page is at 64 KiB; `ack` is its second word (DESIGN.md).
    f.write_all_at(&1000u64.to_le_bytes(), 65536 + 8).unwrap();
    assert_eq!(ring.poll_acks().unwrap_err().code(), "protocol_violation");
    // The slot stays pinned and the credit is not inflated.
    assert!(w.is_pinned(s));
    assert_eq!(ring.free_credit(), 7);
}

#[test]
fn open_waits_for_the_version_word_and_checks_it() {
    let inst = instance("hdr");
    let path = format!("/dev/shm/joader-{inst}-data");
    // Not ready: a zero version word.
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&vec![0u8; 8192]).unwrap();
    let t0 = Instant::now();
    let e = Reader::open_with_timeout(&inst, "r", Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.code(), "segment_not_ready", "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(200));
    // Wrong version.
    f.write_all_at(&dataplane::DATA_MAGIC.to_le_bytes(), 0)
        .unwrap();
    f.write_all_at(&99u32.to_le_bytes(), 8).unwrap();
    let e = Reader::open_with_timeout(&inst, "r", Duration::from_millis(200)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::VersionMismatch {
                found: 99,
                expected: dataplane::LAYOUT_VERSION,
                ..
            }
        ),
        "{e}"
    );
    // Wrong magic.
    f.write_all_at(b"NOTJOADR", 0).unwrap();
    f.write_all_at(&dataplane::LAYOUT_VERSION.to_le_bytes(), 8)
        .unwrap();
    let e = Reader::open_with_timeout(&inst, "r", Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.code(), "bad_magic", "{e}");
    std::fs::remove_file(&path).unwrap();
    // Missing altogether.
    let e = Reader::open_with_timeout(&inst, "r", Duration::from_millis(100)).unwrap_err();
    assert_eq!(e.code(), "segment_not_found", "{e}");
}

/// A server of another layout version (its version word says so) is refused
/// at attach, for the data segment and for the ring, with both versions named;
/// with the right word back the same objects open.
#[test]
fn another_layout_version_is_refused_at_attach_naming_both_versions() {
    let w = writer("ver", 4, 1 << 16);
    let _ring = w.create_ring("r", 8).unwrap();
    let ours = dataplane::LAYOUT_VERSION;
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm/{name}"))
            .unwrap()
    };
    let data = open(w.segment_name());
    let ring = open(_ring.segment_name());
    for (file, other) in [(&data, ours - 1), (&ring, ours + 1)] {
        file.write_all_at(&other.to_le_bytes(), 8).unwrap();
        let e = Reader::open(w.instance(), "r").unwrap_err();
        assert_eq!(e.code(), "version_mismatch", "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("layout version {other}"))
                && msg.contains(&format!("reads version {ours}")),
            "{msg}"
        );
        file.write_all_at(&ours.to_le_bytes(), 8).unwrap();
    }
    Reader::open(w.instance(), "r").unwrap();
}

#[test]
fn open_waits_for_a_segment_created_later() {
    let inst = instance("late");
    let i2 = inst.clone();
    let (done, until_done) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let w = Writer::create(&SegmentConfig::new(i2, 4, 1 << 16)).unwrap();
        let ring = w.create_ring("r", 4).unwrap();
        // The segment lives until the reader has opened it.
        let _ = until_done.recv();
        (w, ring)
    });
    let reader = Reader::open_with_timeout(&inst, "r", LONG).unwrap();
    assert_eq!(reader.capacity(), 4);
    drop(reader);
    done.send(()).unwrap();
    drop(h.join().unwrap());
}

#[test]
fn lifecycle_stale_removal_exclusivity_and_unlink() {
    let inst = instance("life");
    // Leftovers of a dead server (nobody holds the instance lock).
    for suffix in ["data", "ring-old"] {
        std::fs::write(format!("/dev/shm/joader-{inst}-{suffix}"), b"stale").unwrap();
    }
    let w = Writer::create(&SegmentConfig::new(inst.clone(), 4, 1 << 16)).unwrap();
    assert_eq!(
        w.stale_removed(),
        &[
            format!("joader-{inst}-data"),
            format!("joader-{inst}-ring-old")
        ]
    );
    // A second server with the same instance name is refused.
    let e = Writer::create(&SegmentConfig::new(inst.clone(), 4, 1 << 16)).unwrap_err();
    assert_eq!(e.code(), "instance_in_use", "{e}");
    // Another instance coexists.
    let other = writer("life", 4, 1 << 16);
    let ring = w.create_ring("r", 4).unwrap();
    assert_eq!(
        objects(&inst),
        vec![
            format!("joader-{inst}-data"),
            format!("joader-{inst}-lock"),
            format!("joader-{inst}-ring-r")
        ]
    );
    // Exclusive creation: the same ring name twice fails.
    assert_eq!(w.create_ring("r", 4).unwrap_err().code(), "segment_exists");
    // Permissions are owner-only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(format!("/dev/shm/joader-{inst}-data"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(ring);
    drop(w);
    assert!(objects(&inst).is_empty(), "{:?}", objects(&inst));
    // The instance can be started again.
    let w2 = Writer::create(&SegmentConfig::new(inst.clone(), 4, 1 << 16)).unwrap();
    assert!(w2.stale_removed().is_empty());
    drop(w2);
    drop(other);
    assert!(objects(&inst).is_empty());
}

#[test]
fn a_dead_instance_is_removed_and_a_live_one_refused() {
    let inst = instance("dead");
    let w = Writer::create(&SegmentConfig::new(inst.clone(), 4, 1 << 16)).unwrap();
    let ring = w.create_ring("r", 4).unwrap();
    let e = dataplane::remove_dead_instance(&inst).unwrap_err();
    assert_eq!(e.code(), "instance_in_use", "{e}");
    assert_eq!(objects(&inst).len(), 3, "a live instance keeps everything");
    // Its lock file removed (by hand, or by a logout's IPC clean-up): the server still holds
    // its data segment exclusively, and that is enough to refuse.
    std::fs::remove_file(format!("/dev/shm/joader-{inst}-lock")).unwrap();
    let e = dataplane::remove_dead_instance(&inst).unwrap_err();
    assert_eq!(e.code(), "instance_in_use", "{e}");
    assert!(objects(&inst).iter().any(|n| n.ends_with("-data")));
    drop(ring);
    drop(w);
    // What a server killed by SIGKILL leaves: its objects and its lock file, unlocked.
    let dead = instance("dead");
    for suffix in ["data", "ring-r", "lock"] {
        std::fs::write(format!("/dev/shm/joader-{dead}-{suffix}"), b"left").unwrap();
    }
    let mut removed = dataplane::remove_dead_instance(&dead).unwrap();
    removed.sort();
    assert_eq!(
        removed,
        vec![
            format!("joader-{dead}-data"),
            format!("joader-{dead}-lock"),
            format!("joader-{dead}-ring-r")
        ]
    );
    assert!(objects(&dead).is_empty(), "{:?}", objects(&dead));
    assert_eq!(
        dataplane::remove_dead_instance("bad/name")
            .unwrap_err()
            .code(),
        "invalid_name"
    );
}

#[test]
fn shm_space_is_checked_with_a_helpful_message() {
    let free = dataplane::shm_free_space().unwrap();
    let cfg = SegmentConfig::new(instance("space"), 4, free + (1 << 30));
    let e = Writer::create(&cfg).unwrap_err();
    assert_eq!(e.code(), "shm_space");
    let msg = e.to_string();
    assert!(
        msg.contains("--shm-size") && msg.contains(&format!("{free}")) || msg.contains("free"),
        "{msg}"
    );
    assert!(objects(&cfg.instance).is_empty());
}

#[test]
fn allocation_failures_are_errors() {
    let w = writer("full", 2, 4096);
    let a = w
        .write_slot(image_meta(1, 10, 10), &pattern(1, 300))
        .unwrap();
    // The arena is rounded up to 64 KiB, of which the image takes 320 bytes.
    let e = w.write_slot(raw(2), &[0u8; 65536 - 256]).unwrap_err();
    assert_eq!(e.code(), "arena_full", "{e}");
    let _b = w.write_slot(raw(3), &[1u8; 10]).unwrap();
    let e = w.write_slot(raw(4), &[1u8; 10]).unwrap_err();
    assert_eq!(e.code(), "no_free_slot");
    let e = w.write_slot(image_meta(5, 10, 10), &[0u8; 10]).unwrap_err();
    assert_eq!(e.code(), "invalid_config");
    w.free_slot(a).unwrap();
    assert_eq!(w.free_slot(a).unwrap_err().code(), "stale_slot");
}

fn raw(id: u32) -> dataplane::SlotMeta {
    dataplane::SlotMeta {
        fields_len: 0,
        source: (0, 0),
        element_id: id,
        label: 0,
        format: dataplane::Format::Raw,
    }
}

#[test]
fn too_many_readers() {
    let mut cfg = SegmentConfig::new(instance("readers"), 4, 1 << 16);
    cfg.read_words = 1;
    let w = Writer::create(&cfg).unwrap();
    assert_eq!(w.max_readers(), 64);
    let rings: Vec<_> = (0..64)
        .map(|i| w.create_ring(&format!("r{i}"), 2).unwrap())
        .collect();
    assert_eq!(
        w.create_ring("extra", 2).unwrap_err().code(),
        "too_many_readers"
    );
    drop(rings);
    assert!(w.create_ring("extra", 2).is_ok());
}

#[test]
fn a_panicking_fill_gives_the_slot_back() {
    let w = writer("panic", 2, 4096);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.write_slot_with(raw(1), 100, |_| panic!("decoder failed"))
            .unwrap();
    }));
    assert!(r.is_err());
    assert_eq!(w.free_slots(), 2);
    assert_eq!(w.arena_stats().allocations, 0);
    let s = w.write_slot_with(raw(2), 4096, |b| b.fill(9)).unwrap();
    assert_eq!(w.slot_meta(s).unwrap().element_id, 2);
}

#[test]
fn handles_can_move_between_threads() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Writer>();
    sync::<Writer>();
    send::<dataplane::RingWriter>();
    send::<Reader>();
    send::<dataplane::RawReader>();
    sync::<dataplane::RawReader>();
}

/// An image followed by its small fields' block, as the server's Loader writes it.
fn write_with_fields(w: &Writer, id: u32, caption: &str) -> dataplane::SlotRef {
    let fields = [dataplane::fields::Field {
        name: "caption",
        kind: dataplane::fields::FieldKind::Text,
        flags: 0,
        value: caption.as_bytes(),
    }];
    let mut payload = pattern(id, 4 * 5 * 3);
    dataplane::fields::encode(&fields, &mut payload);
    let meta = SlotMeta {
        fields_len: dataplane::fields::encoded_len(&fields) as u32,
        source: (375, 500),
        ..image_meta(id, 4, 5)
    };
    w.write_slot(meta, &payload).unwrap()
}

#[test]
fn small_fields_travel_after_the_image() {
    let w = writer("fields", 8, 1 << 20);
    let mut ring = w.create_ring("f-r0", 8).unwrap();
    let with = write_with_fields(&w, 0, "un chat");
    let without = write_image(&w, 1, 4, 5);
    ring.push_data(with, 0, 0).unwrap();
    ring.push_data(without, 0, 1).unwrap();
    let reader = Reader::open(w.instance(), "f-r0").unwrap();
    let batch = reader.next_batch(2, T).unwrap();
    let items: Vec<_> = batch.items().collect();
    // The image is the payload alone, whatever follows it; collation is unchanged.
    assert_eq!(items[0].data, &pattern(0, 60)[..]);
    assert_eq!(items[0].meta.len, 60);
    let f = items[0].fields().unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].name, f[0].value), ("caption", "un chat".as_bytes()));
    assert!(items[1].field_block.is_empty() && items[1].fields().unwrap().is_empty());
    // The source image's size travels in the slot; unknown is (0, 0).
    assert_eq!(
        (items[0].meta.source, items[1].meta.source),
        ((375, 500), (0, 0))
    );
    assert_eq!(batch.collate().unwrap().shape, [2, 4, 5, 3]);
    reader.ack(batch);
    assert_eq!(ring.poll_acks().unwrap(), vec![with, without]);
    // Stored once, freed with the image: the arena holds nothing after.
    w.free_slot(with).unwrap();
    w.free_slot(without).unwrap();
    assert_eq!(w.arena_stats().allocations, 0);
    // A block longer than the payload is refused.
    let meta = SlotMeta {
        fields_len: 100,
        source: (0, 0),
        ..image_meta(2, 4, 5)
    };
    assert_eq!(
        w.write_slot(meta, &pattern(2, 60)).unwrap_err().code(),
        "invalid_config"
    );
}
