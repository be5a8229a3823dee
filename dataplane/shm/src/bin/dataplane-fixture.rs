//! Test fixture: a small writer (server stand-in) or reader process for the
//! cross-process tests of the Rust crate and of the Python package.
//!
//! ```text
//! dataplane-fixture writer --instance I --rings a,b [--elements 32] [--height 8] [--width 8]
//!                          [--epochs 1] [--capacity 16] [--error-every 0] [--pace-us 0] [--hold]
//! dataplane-fixture reader --instance I --ring a [--take 8] [--hold]
//! ```
//!
//! The writer stores element `id` as an HWC u8 image whose byte `i` is
//! `(id * 31 + i * 7) mod 256`, label `id + 1000`, and delivers to every
//! ring `epochs` epochs in which position `p` holds element `(p + epoch) mod
//! elements` (every `error-every`-th position is an error record instead).
//! It reclaims rings whose reader died or detached, prints one line per
//! event on stdout (`READY`, `RECLAIMED`, `DONE`), and with `--hold` waits
//! for stdin to close before exiting (and unlinking its segments).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dataplane::{Format, ReaderStatus, RingWriter, SegmentConfig, SlotMeta, Writer, element_error};

fn args() -> (String, HashMap<String, String>) {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_default();
    let mut m = HashMap::new();
    let rest: Vec<String> = it.collect();
    let mut i = 0;
    while i < rest.len() {
        let k = rest[i].trim_start_matches("--").to_string();
        if i + 1 < rest.len() && !rest[i + 1].starts_with("--") {
            m.insert(k, rest[i + 1].clone());
            i += 2;
        } else {
            m.insert(k, "true".into());
            i += 1;
        }
    }
    (mode, m)
}

fn num(m: &HashMap<String, String>, k: &str, default: u64) -> u64 {
    m.get(k).map_or(default, |v| v.parse().expect("number"))
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

static STDIN_CLOSED: AtomicBool = AtomicBool::new(false);

/// With `--hold`, the process lives until its stdin closes (whatever it is doing).
fn watch_stdin() {
    std::thread::spawn(|| {
        let stdin = std::io::stdin();
        for _ in stdin.lock().lines() {}
        STDIN_CLOSED.store(true, Ordering::SeqCst);
    });
}

fn hold() {
    while !STDIN_CLOSED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pattern(id: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id as usize * 31 + i * 7) as u8).collect()
}

struct Feed {
    ring: RingWriter,
    epoch: u64,
    pos: u64,
    finished: bool,
    reclaimed: bool,
}

fn writer(m: &HashMap<String, String>) -> dataplane::Result<()> {
    let instance = m.get("instance").expect("--instance").clone();
    let rings: Vec<String> = m
        .get("rings")
        .expect("--rings")
        .split(',')
        .map(String::from)
        .collect();
    let n = num(m, "elements", 32) as u32;
    let (h, w) = (num(m, "height", 8) as u32, num(m, "width", 8) as u32);
    let epochs = num(m, "epochs", 1);
    let capacity = num(m, "capacity", 16) as u32;
    let error_every = num(m, "error-every", 0);
    // Benchmark mode: pace data pushes (50..250 µs apart when 0 < pace) and
    // send CLOCK_MONOTONIC nanoseconds of the push as the position.
    let pace = num(m, "pace-us", 0);
    let mut jitter = 0x2545f4914f6cdd1du64;
    let len = (h * w * 3) as u64;
    let mut cfg = SegmentConfig::new(
        instance.clone(),
        n.max(1),
        (len.div_ceil(64) * 64) * n as u64 + 4096,
    );
    cfg.reserve = true;
    let writer = Writer::create(&cfg)?;
    let slots: Vec<_> = (0..n)
        .map(|id| {
            let meta = SlotMeta {
                fields_len: 0,
                source: (0, 0),
                element_id: id,
                label: id as i64 + 1000,
                format: Format::HwcU8 {
                    height: h,
                    width: w,
                    channels: 3,
                },
            };
            writer.write_slot(meta, &pattern(id, len as usize))
        })
        .collect::<Result<_, _>>()?;
    let mut feeds: Vec<Feed> = rings
        .iter()
        .map(|r| {
            writer.create_ring(r, capacity).map(|ring| Feed {
                ring,
                epoch: 0,
                pos: 0,
                finished: false,
                reclaimed: false,
            })
        })
        .collect::<Result<_, _>>()?;
    say(&format!(
        "READY {instance} {} {}",
        rings.join(","),
        std::process::id()
    ));
    let holding = m.contains_key("hold");
    loop {
        if holding && STDIN_CLOSED.load(Ordering::SeqCst) {
            say("STOPPED");
            return Ok(());
        }
        let mut all_done = true;
        for f in feeds.iter_mut() {
            if f.reclaimed {
                continue;
            }
            let status = f.ring.reader_status();
            let acks = f.ring.poll_acks();
            if acks.is_ok() && f.finished && f.ring.acked() == f.ring.pushed() {
                continue;
            }
            if acks.is_err() || matches!(status, ReaderStatus::Dead | ReaderStatus::Detached) {
                let back = f.ring.reclaim_reader();
                let idx = f.ring.reader_index();
                let still = slots
                    .iter()
                    .filter(|s| writer.readers_of(**s).contains(&idx))
                    .count();
                f.reclaimed = true;
                say(&format!(
                    "RECLAIMED {} status={status:?} slots={} still_pinned={still}",
                    f.ring.name(),
                    back.len()
                ));
                continue;
            }
            while !f.finished && f.ring.free_credit() > 0 {
                if f.epoch == epochs {
                    f.ring.push_end_of_stream()?;
                    f.finished = true;
                } else if f.pos == n as u64 {
                    f.ring.push_end_of_epoch(f.epoch, n as u64)?;
                    f.epoch += 1;
                    f.pos = 0;
                } else {
                    let id = ((f.pos + f.epoch) % n as u64) as usize;
                    if error_every > 0 && f.pos % error_every == error_every - 1 {
                        f.ring
                            .push_error(id as u32, element_error::DECODE, f.epoch, f.pos)?;
                    } else if pace > 0 {
                        jitter ^= jitter << 13;
                        jitter ^= jitter >> 7;
                        jitter ^= jitter << 17;
                        std::thread::sleep(Duration::from_micros(pace / 2 + jitter % (pace * 2)));
                        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
                        let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                        f.ring.push_data(slots[id], f.epoch, now)?;
                        f.pos += 1;
                        break;
                    } else {
                        f.ring.push_data(slots[id], f.epoch, f.pos)?;
                    }
                    f.pos += 1;
                }
            }
            if !(f.finished && f.ring.acked() == f.ring.pushed()) {
                all_done = false;
            }
        }
        if all_done {
            break;
        }
        if let Some(f) = feeds.iter().find(|f| !f.reclaimed && !f.finished) {
            f.ring.wait_for_acks(Duration::from_millis(20));
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    say("DONE");
    if holding {
        hold();
    }
    drop(feeds);
    drop(writer);
    Ok(())
}

fn reader(m: &HashMap<String, String>) -> dataplane::Result<()> {
    let instance = m.get("instance").expect("--instance");
    let ring = m.get("ring").expect("--ring");
    let take = num(m, "take", 8) as usize;
    let reader = dataplane::Reader::open(instance, ring)?;
    let batch = reader.next_batch(take, Some(Duration::from_secs(10)))?;
    say(&format!("TOOK {}", batch.len()));
    if m.contains_key("hold") {
        hold();
    }
    drop(batch);
    Ok(())
}

fn main() {
    let (mode, m) = args();
    if m.contains_key("hold") {
        watch_stdin();
    }
    let r = match mode.as_str() {
        "writer" => writer(&m),
        "reader" => reader(&m),
        _ => {
            eprintln!("usage: dataplane-fixture writer|reader --instance I ...");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        say(&format!("ERROR {} {e}", e.code()));
        std::process::exit(1);
    }
}
