//! Property test of rings and read bits against a reference model, and a
//! multi-threaded stress test of push / take / acknowledge with slot reuse.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use dataplane::{Batch, Format, Reader, SlotMeta, SlotRef, Writer};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Write,
    Free(usize),
    Push(usize, usize),
    Take(usize, usize),
    Release(usize, usize),
    Poll(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Write),
        1 => (0..8usize).prop_map(Op::Free),
        4 => (0..2usize, 0..8usize).prop_map(|(r, k)| Op::Push(r, k)),
        3 => (0..2usize, 1..5usize).prop_map(|(r, n)| Op::Take(r, n)),
        2 => (0..2usize, 0..4usize).prop_map(|(r, i)| Op::Release(r, i)),
        2 => (0..2usize).prop_map(Op::Poll),
    ]
}

/// The model of one ring: records pushed (slot refs), the client's head,
/// the batches it holds, its acknowledged position, and what the server processed.
#[derive(Default, Debug)]
struct RingModel {
    records: Vec<SlotRef>,
    head: usize,
    batches: Vec<(usize, usize)>,
    ack: usize,
    processed: usize,
}

impl RingModel {
    fn holds(&self, s: SlotRef) -> bool {
        self.records[self.processed..].contains(&s)
    }
}

const CAP: usize = 4;

fn payload(id: u32) -> Vec<u8> {
    pattern(id, 12)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let w = writer("model", 6, 1 << 16);
    let mut rings = [
        w.create_ring("a", CAP as u32).unwrap(),
        w.create_ring("b", CAP as u32).unwrap(),
    ];
    let readers = [
        Reader::open(w.instance(), "a").unwrap(),
        Reader::open(w.instance(), "b").unwrap(),
    ];
    let mut held: [Vec<Batch<'_>>; 2] = [Vec::new(), Vec::new()];
    let mut model: [RingModel; 2] = Default::default();
    let mut live: Vec<SlotRef> = Vec::new();
    let mut next_id = 0u32;
    for op in ops {
        match op {
            Op::Write => {
                let meta = SlotMeta {
                    fields_len: 0,
                    source: (0, 0),
                    element_id: next_id,
                    label: next_id as i64,
                    format: Format::HwcU8 {
                        height: 2,
                        width: 2,
                        channels: 3,
                    },
                };
                match w.write_slot(meta, &payload(next_id)) {
                    Ok(s) => {
                        prop_assert!(live.len() < 6);
                        live.push(s);
                    }
                    Err(e) => prop_assert_eq!(e.code(), "no_free_slot"),
                }
                next_id += 1;
            }
            Op::Free(k) if !live.is_empty() => {
                let s = live[k % live.len()];
                let pinned = model.iter().any(|m| m.holds(s));
                match w.free_slot(s) {
                    Ok(()) => {
                        prop_assert!(!pinned, "freed a pinned slot");
                        live.retain(|x| *x != s);
                    }
                    Err(e) => {
                        prop_assert!(pinned, "refused to free an unpinned slot: {}", e);
                        prop_assert_eq!(e.code(), "slot_pinned");
                    }
                }
            }
            Op::Push(r, k) if !live.is_empty() => {
                let s = live[k % live.len()];
                let m = &mut model[r];
                match rings[r].push_data(s, 0, m.records.len() as u64) {
                    Ok(()) => {
                        prop_assert!(m.records.len() - m.ack < CAP);
                        m.records.push(s);
                    }
                    Err(e) => {
                        prop_assert_eq!(e.code(), "ring_full");
                        prop_assert_eq!(m.records.len() - m.ack, CAP);
                    }
                }
            }
            Op::Take(r, n) => {
                let m = &mut model[r];
                let b = readers[r].next_batch(n, Some(Duration::ZERO)).unwrap();
                let expect = n.min(m.records.len() - m.head);
                prop_assert_eq!(b.len(), expect);
                for (i, it) in b.items().enumerate() {
                    let s = m.records[m.head + i];
                    prop_assert_eq!(it.meta.slot, s.slot);
                    prop_assert_eq!(it.meta.generation, s.generation);
                    prop_assert_eq!(it.meta.position, (m.head + i) as u64);
                    prop_assert_eq!(it.data, &payload(it.meta.element_id)[..]);
                }
                if expect > 0 {
                    m.batches.push((m.head, m.head + expect));
                    m.head += expect;
                    held[r].push(b);
                }
            }
            Op::Release(r, i) if !held[r].is_empty() => {
                let i = i % held[r].len();
                drop(held[r].remove(i));
                let m = &mut model[r];
                m.batches.remove(i);
                m.ack = m.batches.iter().map(|b| b.0).min().unwrap_or(m.head);
            }
            Op::Poll(r) => {
                let got = rings[r].poll_acks().unwrap();
                let m = &mut model[r];
                prop_assert_eq!(&got[..], &m.records[m.processed..m.ack]);
                m.processed = m.ack;
            }
            _ => {}
        }
        // Read bits are exactly "some unprocessed record of that ring references the slot".
        for s in &live {
            let expect: Vec<u32> = (0..2)
                .filter(|&r| model[r].holds(*s))
                .map(|r| rings[r].reader_index())
                .collect();
            let mut got = w.readers_of(*s);
            got.sort();
            let mut e = expect.clone();
            e.sort();
            prop_assert_eq!(got, e, "slot {:?}", s);
        }
        for r in 0..2 {
            let m = &model[r];
            prop_assert_eq!(
                rings[r].free_credit() as usize,
                CAP - (m.records.len() - m.ack)
            );
        }
    }
    drop(held);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn rings_and_read_bits_follow_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

#[test]
fn stress_producer_consumer_with_slot_reuse() {
    const N: u64 = 60_000;
    let w = writer("stress", 32, 256 * 1024);
    let inst = w.instance().to_string();
    let mut ring = w.create_ring("r", 16).unwrap();
    let consumer = std::thread::spawn(move || {
        let reader = Reader::open(&inst, "r").unwrap();
        let mut next = 0u64;
        let mut rng = 12345u64;
        let mut kept: Option<Batch<'_>> = None;
        let t0 = Instant::now();
        while next < N {
            assert!(t0.elapsed() < Duration::from_secs(300), "stalled at {next}");
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let want = 1 + (rng >> 60) as usize;
            let want = want.min((N - next) as usize);
            let b = reader
                .next_batch(want, Some(Duration::from_secs(5)))
                .unwrap();
            for it in b.items() {
                assert_eq!(it.meta.position, next);
                assert_eq!(it.meta.element_id, next as u32);
                assert_eq!(
                    it.data,
                    &pattern(it.meta.element_id, it.data.len())[..],
                    "torn payload"
                );
                next += 1;
            }
            // Sometimes hold a batch across the next call, releasing out of order.
            if rng >> 63 == 1 {
                let old = kept.replace(b);
                drop(old);
            } else {
                drop(b);
            }
        }
        drop(kept);
        next
    });
    let mut free: Vec<SlotRef> = Vec::new();
    let mut live = 0usize;
    let mut pushed = 0u64;
    let mut distinct = BTreeSet::new();
    let t0 = Instant::now();
    while pushed < N {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "producer stalled at {pushed}"
        );
        for s in ring.poll_acks().unwrap() {
            free.push(s);
        }
        for s in free.drain(..) {
            w.free_slot(s).unwrap();
            live -= 1;
        }
        if ring.free_credit() == 0 || live == 32 {
            ring.wait_for_acks(Duration::from_millis(50));
            continue;
        }
        let len = 1 + (pushed * 7919 % 3000) as usize;
        let meta = SlotMeta {
            fields_len: 0,
            source: (0, 0),
            element_id: pushed as u32,
            label: 0,
            format: Format::Raw,
        };
        let s = match w.write_slot(meta, &pattern(pushed as u32, len)) {
            Ok(s) => s,
            Err(e) if e.code() == "arena_full" => {
                ring.wait_for_acks(Duration::from_millis(50));
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        distinct.insert(s.slot);
        live += 1;
        ring.push_data(s, 0, pushed).unwrap();
        pushed += 1;
    }
    assert_eq!(consumer.join().unwrap(), N);
    assert!(distinct.len() <= 32);
    let _ = Writer::instance(&w);
}
