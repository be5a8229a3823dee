//! Fuzz targets of the header validation a client does on attach
//! (`DataLayout::validate`, `RingLayout::validate`), and of a slot's field block
//! (`fields::parse`): the headers come from
//! another process, so any bytes must give a layout or an error, never a
//! panic, and an accepted layout must keep every offset and length the client
//! later uses inside the object it maps. Under `cargo test` each target runs a
//! bounded random search (bolero's test engine), like those of `actors`; for
//! long runs on nightly, `cargo bolero test -p dataplane fuzz::<name>` drives
//! the same target with libFuzzer.
//!
//! Inputs start from a valid header of random geometry and then overwrite
//! whole fields with arbitrary values and single bytes, so that the search
//! reaches the geometry checks instead of stopping at the magic.

use bolero::check;

use crate::layout::{
    DATA_MAGIC, DataLayout, LAYOUT_VERSION, MAX_PAGE, MIN_PAGE, RING_MAGIC, RingLayout, hdr,
    map_align, rec, ring, slot,
};

/// Inputs tried per target in the test command (well under a second each).
const ITERATIONS: usize = 2_000;

/// A page size from a small number: powers of two from 4 KiB to 1 MiB.
fn page_from(shift: u8) -> u64 {
    1 << (12 + shift % 9)
}

/// A client's page size: mostly one that every layout fits (4 to 64 KiB).
fn local_page_from(x: u8) -> u64 {
    page_from(if x.is_multiple_of(4) { x } else { x % 5 })
}

fn put(h: &mut [u8], off: usize, width: usize, v: u64) {
    h[off..off + width].copy_from_slice(&v.to_ne_bytes()[..width]);
}

/// Field offsets and widths of a data header.
const DATA_FIELDS: [(usize, usize); 13] = [
    (hdr::MAGIC, 8),
    (hdr::VERSION, 4),
    (hdr::HEADER_SIZE, 4),
    (hdr::TOTAL_SIZE, 8),
    (hdr::SLOT_COUNT, 4),
    (hdr::READ_WORDS, 4),
    (hdr::SLOT_TABLE_OFFSET, 8),
    (hdr::SLOT_STRIDE, 4),
    (hdr::MAX_READERS, 4),
    (hdr::ARENA_OFFSET, 8),
    (hdr::ARENA_SIZE, 8),
    (hdr::STATE, 4),
    (hdr::PAGE_SIZE, 4),
];

/// Field offsets and widths of a ring header.
const RING_FIELDS: [(usize, usize); 8] = [
    (ring::MAGIC, 8),
    (ring::VERSION, 4),
    (ring::RECORD_SIZE, 4),
    (ring::CAPACITY, 4),
    (ring::READER_INDEX, 4),
    (ring::RECORDS_OFFSET, 8),
    (ring::TOTAL_SIZE, 8),
    (ring::PAGE_SIZE, 4),
];

/// The header a server writes (see `DataLayout::write_to` and `Writer::create`).
fn data_header(l: &DataLayout) -> [u8; hdr::SIZE] {
    let mut h = [0; hdr::SIZE];
    put(&mut h, hdr::MAGIC, 8, DATA_MAGIC);
    put(&mut h, hdr::VERSION, 4, LAYOUT_VERSION.into());
    put(&mut h, hdr::HEADER_SIZE, 4, hdr::SIZE as u64);
    put(&mut h, hdr::TOTAL_SIZE, 8, l.total_size);
    put(&mut h, hdr::SLOT_COUNT, 4, l.slot_count.into());
    put(&mut h, hdr::READ_WORDS, 4, l.read_words.into());
    put(&mut h, hdr::SLOT_TABLE_OFFSET, 8, l.slot_table_offset);
    put(&mut h, hdr::SLOT_STRIDE, 4, l.slot_stride.into());
    put(&mut h, hdr::MAX_READERS, 4, l.max_readers().into());
    put(&mut h, hdr::ARENA_OFFSET, 8, l.arena_offset);
    put(&mut h, hdr::ARENA_SIZE, 8, l.arena_size);
    put(&mut h, hdr::PAGE_SIZE, 4, l.page_size.into());
    h
}

/// The header a server writes (see `RingWriter::create`).
fn ring_header(l: &RingLayout) -> [u8; ring::HEADER] {
    let mut h = [0; ring::HEADER];
    put(&mut h, ring::MAGIC, 8, RING_MAGIC);
    put(&mut h, ring::VERSION, 4, LAYOUT_VERSION.into());
    put(&mut h, ring::RECORD_SIZE, 4, rec::SIZE as u64);
    put(&mut h, ring::CAPACITY, 4, l.capacity.into());
    put(&mut h, ring::RECORDS_OFFSET, 8, l.records_offset);
    put(&mut h, ring::TOTAL_SIZE, 8, l.total_size);
    put(&mut h, ring::PAGE_SIZE, 4, l.page_size.into());
    h
}

/// Applies `n % 3` field changes (field index, how, value) and `n / 3 % 3`
/// byte edits (index, value). A field is set to `value`, or moved by a small
/// step from its valid value (where off-by-one mistakes hide), or to a power
/// of two (sizes, capacities and pages are powers of two).
fn mutate(
    h: &mut [u8],
    fields: &[(usize, usize)],
    n: u8,
    set: &[(u8, u8, u64)],
    bytes: &[(u8, u8)],
) {
    for &(f, how, v) in set.iter().take(usize::from(n) % 3) {
        let (off, width) = fields[usize::from(f) % fields.len()];
        let mut cur = [0; 8];
        cur[..width].copy_from_slice(&h[off..off + width]);
        let cur = u64::from_ne_bytes(cur);
        let new = match how % 3 {
            0 => v,
            1 => cur.wrapping_add(v % 9).wrapping_sub(4),
            _ => 1 << (v % 64),
        };
        put(h, off, width, new);
    }
    let len = h.len();
    for &(at, v) in bytes.iter().take(usize::from(n) / 3 % 3) {
        h[usize::from(at) % len] = v;
    }
}

/// What every accepted data layout promises the client.
fn check_data(l: &DataLayout, file_size: u64, local_page: u64) {
    let (total, arena) = (l.total_size as u128, l.arena_offset as u128);
    assert_eq!(
        l.total_size, file_size,
        "the header must describe the object"
    );
    assert!(l.page_size as u64 >= MIN_PAGE && l.page_size as u64 <= MAX_PAGE);
    assert!(l.slot_count >= 1 && l.read_words >= 1);
    assert!(
        l.slot_table_offset >= hdr::SIZE as u64,
        "slot table over the header"
    );
    // Every slot, read bits included, lies between the header and the arena.
    assert!(l.slot_stride as usize >= slot::READ_BITS + 8 * l.read_words as usize);
    let table_end = l.slot_table_offset as u128 + l.slot_stride as u128 * l.slot_count as u128;
    assert!(table_end <= arena, "slot table overlaps the arena");
    assert_eq!(
        l.slot_off(l.slot_count - 1) as u128 + l.slot_stride as u128,
        table_end
    );
    assert!(arena + l.arena_size as u128 <= total, "arena past the end");
    let align = map_align(l.page_size as u64);
    assert_eq!(l.arena_offset % align, 0);
    assert_eq!(
        align % local_page,
        0,
        "the client's pages must divide the alignment"
    );
}

/// What every accepted ring layout promises the client.
fn check_ring(l: &RingLayout, file_size: u64, local_page: u64) {
    assert_eq!(
        l.total_size, file_size,
        "the header must describe the object"
    );
    assert!(l.capacity.is_power_of_two());
    // Producer fields, consumer page and records do not overlap, and the
    // consumer page (mapped writable on its own) is whole pages of the client.
    assert!(l.consumer_offset >= (ring::PRODUCER_WAITING + 4) as u64);
    assert!((ring::CONSUMER_STATE + 4) as u64 <= l.consumer_len);
    assert!(l.consumer_offset + l.consumer_len <= l.records_offset);
    assert_eq!(l.consumer_offset % local_page, 0);
    assert_eq!(l.consumer_len % local_page, 0);
    let records_end = l.records_offset as u128 + l.capacity as u128 * rec::SIZE as u128;
    assert!(records_end <= l.total_size as u128, "records past the end");
    for pos in [0, u64::from(l.capacity) - 1, u64::MAX] {
        assert!(l.record_off(pos) + rec::SIZE <= l.total_size as usize);
    }
}

#[test]
fn data_headers_never_panic_and_accepted_ones_fit_the_object() {
    check!()
        .with_type::<(
            (u32, u8, u32, u8),
            (u8, Vec<(u8, u8, u64)>, Vec<(u8, u8)>),
            Option<u64>,
            u8,
        )>()
        .with_iterations(ITERATIONS)
        .for_each(
            |((slots, words, arena_kib, page), (n, set, bytes), size, local)| {
                let page = page_from(*page);
                let seed = DataLayout::compute(
                    slots % 5000 + 1,
                    u32::from(*words % 4) + 1,
                    u64::from(*arena_kib % 8192) * 1024 + 1,
                    page,
                )
                .unwrap();
                let mut h = data_header(&seed);
                mutate(&mut h, &DATA_FIELDS, *n, set, bytes);
                // Mostly the object the header describes, sometimes any size.
                let file_size = size.filter(|s| s % 4 == 0).unwrap_or(seed.total_size);
                let local_page = local_page_from(*local);
                if let Ok(l) = DataLayout::validate(&h, "fuzz", file_size, local_page) {
                    check_data(&l, file_size, local_page);
                }
            },
        );
}

#[test]
fn ring_headers_never_panic_and_accepted_ones_fit_the_object() {
    check!()
        .with_type::<(
            (u32, u8),
            (u8, Vec<(u8, u8, u64)>, Vec<(u8, u8)>),
            Option<u64>,
            u8,
        )>()
        .with_iterations(ITERATIONS)
        .for_each(|((capacity, page), (n, set, bytes), size, local)| {
            let seed = RingLayout::compute(capacity % (1 << 20) + 1, page_from(*page)).unwrap();
            let mut h = ring_header(&seed);
            mutate(&mut h, &RING_FIELDS, *n, set, bytes);
            // Mostly the object the header describes, sometimes any size.
            let file_size = size.filter(|s| s % 4 == 0).unwrap_or(seed.total_size);
            let local_page = local_page_from(*local);
            if let Ok(l) = RingLayout::validate(&h, "fuzz", file_size, local_page) {
                check_ring(&l, file_size, local_page);
            }
        });
}

/// The seeds are what servers write: unmutated, they validate (so the search
/// starts from accepted headers), and the checks above hold for them.
#[test]
fn unmutated_seeds_are_accepted() {
    for page in [4 << 10, 16 << 10, 64 << 10] {
        let d = DataLayout::compute(1000, 2, 1 << 20, page).unwrap();
        let got = DataLayout::validate(&data_header(&d), "seed", d.total_size, page).unwrap();
        assert_eq!(got, d);
        check_data(&got, d.total_size, page);
        let r = RingLayout::compute(1000, page).unwrap();
        let got = RingLayout::validate(&ring_header(&r), "seed", r.total_size, page).unwrap();
        assert_eq!(got, r);
        check_ring(&got, r.total_size, page);
    }
}

/// A slot's field block comes from the server's memory, which a client does not trust: any
/// bytes give fields or `segment_corrupt`, never a panic, and fields that parse are the
/// block's exact bytes (encoding them again gives the block back, an empty block aside).
#[test]
fn field_blocks_parse_or_fail_cleanly() {
    use crate::fields::{Field, FieldKind, encode, parse};
    let mut seed = Vec::new();
    encode(
        &[
            Field {
                name: "caption",
                kind: FieldKind::Text,
                flags: 0,
                value: b"a cat",
            },
            Field {
                name: "emb",
                kind: FieldKind::Npy,
                flags: 1,
                value: &[0x93, b'N', b'U'],
            },
        ],
        &mut seed,
    );
    check!()
        .with_type::<(Vec<(u8, u8)>, u8, bool)>()
        .with_iterations(ITERATIONS)
        .for_each(|(edits, cut, random)| {
            let mut block = if *random {
                edits.iter().map(|(a, _)| *a).collect()
            } else {
                seed.clone()
            };
            if !*random {
                for &(at, v) in edits {
                    let n = block.len();
                    block[usize::from(at) % n] = v;
                }
                block.truncate(block.len() - usize::from(*cut) % 4);
            }
            match parse(&block) {
                // An empty block is "no field" (what a slot without fields has).
                Ok(fields) if block.is_empty() => assert!(fields.is_empty()),
                Ok(fields) => {
                    let mut again = Vec::new();
                    encode(&fields, &mut again);
                    assert_eq!(again, block);
                }
                Err(e) => assert_eq!(e.code(), "segment_corrupt"),
            }
        });
}
