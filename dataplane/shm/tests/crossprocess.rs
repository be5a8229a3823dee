//! Cross-process tests with the `dataplane-fixture` binary: a reader killed
//! with SIGKILL mid-batch is detected and reclaimed while another reader of
//! the same segment is unaffected; a killed server is noticed by its readers.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use dataplane::Reader;

const FIXTURE: &str = env!("CARGO_BIN_EXE_dataplane-fixture");

struct Proc {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(FIXTURE)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc { child, out }
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s.trim().to_string()
    }

    fn expect(&mut self, prefix: &str) -> String {
        let l = self.line();
        assert!(l.starts_with(prefix), "expected {prefix:?}, got {l:?}");
        l
    }

    fn kill9(&mut self) {
        let pid = self.child.id() as i32;
        // SIGKILL: no destructor runs, exactly like a crashed trainer.
        let st = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        self.child.wait().unwrap();
    }

    fn finish(mut self) {
        drop(self.child.stdin.take());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "{st:?}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // On a failed assertion, let a `--hold` writer exit cleanly (and
        // unlink its segments) before resorting to SIGKILL.
        drop(self.child.stdin.take());
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn killed_reader_is_reclaimed_and_others_are_unaffected() {
    let inst = instance("kill");
    let mut w = Proc::spawn(&[
        "writer",
        "--instance",
        &inst,
        "--rings",
        "victim,survivor",
        "--elements",
        "32",
        "--epochs",
        "3",
        "--capacity",
        "16",
        "--hold",
    ]);
    w.expect("READY");
    let mut victim = Proc::spawn(&[
        "reader",
        "--instance",
        &inst,
        "--ring",
        "victim",
        "--take",
        "8",
        "--hold",
    ]);
    assert_eq!(victim.line(), "TOOK 8");

    // The survivor reads concurrently in this process.
    let survivor = Reader::open(&inst, "survivor").unwrap();
    let mut seen = Vec::new();
    let mut epochs = 0;
    let mut killed = false;
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the survivor did not finish its epochs within 120 s"
        );
        let b = survivor
            .next_batch(5, Some(Duration::from_secs(5)))
            .unwrap();
        for it in b.items() {
            assert_eq!(it.data, &pattern(it.meta.element_id, 8 * 8 * 3)[..]);
            assert_eq!(it.meta.label, it.meta.element_id as i64 + 1000);
            assert_eq!(
                it.meta.element_id as u64,
                (it.meta.position + it.meta.epoch) % 32
            );
            seen.push((it.meta.epoch, it.meta.element_id));
        }
        if let Some(e) = b.end_of_epoch() {
            assert_eq!(e.count, 32);
            epochs += 1;
        }
        let done = b.end_of_stream();
        drop(b);
        if !killed && seen.len() > 20 {
            victim.kill9();
            killed = true;
        }
        if done {
            break;
        }
    }
    assert!(killed);
    assert_eq!(epochs, 3);
    assert_eq!(seen.len(), 96);
    for e in 0..3 {
        let mut ids: Vec<u32> = seen.iter().filter(|s| s.0 == e).map(|s| s.1).collect();
        ids.sort();
        assert_eq!(
            ids,
            (0..32).collect::<Vec<_>>(),
            "epoch {e} is the whole dataset once"
        );
    }
    // The writer noticed the dead reader, got back the 16 records it had in
    // flight (8 taken, 8 pushed but not taken), and no slot keeps its bit.
    let l = w.expect("RECLAIMED");
    assert_eq!(l, "RECLAIMED victim status=Dead slots=16 still_pinned=0");
    drop(survivor);
    w.expect("DONE");
    assert!(!objects(&inst).is_empty());
    w.finish();
    assert!(
        objects(&inst).is_empty(),
        "segments left: {:?}",
        objects(&inst)
    );
}

#[test]
fn killed_server_is_noticed_by_a_waiting_reader() {
    let inst = instance("srvkill");
    let mut w = Proc::spawn(&[
        "writer",
        "--instance",
        &inst,
        "--rings",
        "r",
        "--elements",
        "4",
        "--epochs",
        "1",
        "--capacity",
        "4",
    ]);
    w.expect("READY");
    let reader = Reader::open(&inst, "r").unwrap();
    let b = reader.next_batch(4, Some(Duration::from_secs(60))).unwrap();
    assert_eq!(b.len(), 4);
    // Keep the batch: the writer cannot finish; kill it.
    w.kill9();
    drop(b);
    let e = reader
        .next_batch(4, Some(Duration::from_secs(60)))
        .expect_err("the reader did not notice the dead writer before its timeout");
    assert_eq!(e.code(), "server_gone", "{e}");
    assert!(e.to_string().contains("has exited"), "{e}");
    drop(reader);
    // A new server with the same instance removes the dead one's segments.
    let cfg = dataplane::SegmentConfig::new(inst.clone(), 4, 1 << 16);
    let w2 = dataplane::Writer::create(&cfg).unwrap();
    assert_eq!(
        w2.stale_removed(),
        &[
            format!("joader-{inst}-data"),
            format!("joader-{inst}-ring-r")
        ]
    );
    drop(w2);
    assert!(objects(&inst).is_empty());
}

#[test]
fn second_server_with_a_live_owner_is_refused() {
    let inst = instance("live");
    let mut w = Proc::spawn(&[
        "writer",
        "--instance",
        &inst,
        "--rings",
        "r",
        "--elements",
        "2",
        "--hold",
    ]);
    w.expect("READY");
    let e = dataplane::Writer::create(&dataplane::SegmentConfig::new(inst.clone(), 4, 1 << 16))
        .unwrap_err();
    assert_eq!(e.code(), "instance_in_use");
    // Its segments are untouched and readable.
    let r = Reader::open(&inst, "r").unwrap();
    assert_eq!(
        r.next_batch(8, Some(Duration::from_secs(60)))
            .unwrap()
            .len(),
        2
    );
    drop(r);
    w.expect("RECLAIMED r status=Detached");
    w.expect("DONE");
    let mut stdin = w.child.stdin.take().unwrap();
    stdin.flush().unwrap();
    drop(stdin);
    w.finish();
}
