#!/usr/bin/env python3
"""The data-plane benchmark through Python (the Rust one is `joader bench dataplane`).

    python3 dataplane/python/bench.py [--fixture PATH] [--batch 256] [--iterations 15] [--samples 2000]

1. Copy: a `dataplane-fixture` writer process serves a batch of images
   (224x224x3 by default) over and over; once `RingReader.next_batch` has
   it, `Batch.collate(out=...)` + `ack()` copies it into one contiguous
   preallocated (B, H, W, C) array (timed). Compared with `np.copyto` of the same
   number of bytes between two warm arrays, interleaved in the same run.
   Target ratio: >= 0.7.
2. Latency: a paced writer stamps each push with CLOCK_MONOTONIC; the
   latency is from the push to `next_batch` returning in Python (GIL
   released while waiting). Target p99: <= 200 us (Python adds its own
   overhead to the Rust figure).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Import the installed package, not the source folder next to this script.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
import joader  # noqa: E402


def find_fixture(arg: str | None) -> str:
    if arg:
        return arg
    if os.environ.get("JOADER_FIXTURE"):
        return os.environ["JOADER_FIXTURE"]
    root = Path(__file__).resolve().parents[2]
    for target in (os.environ.get("CARGO_TARGET_DIR"), str(root / "target")):
        for profile in ("release", "debug"):
            if target and (Path(target) / profile / "dataplane-fixture").exists():
                return str(Path(target) / profile / "dataplane-fixture")
    sys.exit("dataplane-fixture not found: cargo build --release -p dataplane --bin dataplane-fixture")


def writer(fixture: str, instance: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([fixture, "writer", "--instance", instance, "--rings", "r", *args, "--hold"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()  # type: ignore[union-attr]
    if not line.startswith("READY"):
        sys.exit(f"fixture failed: {line}")
    return p


def stop(p: subprocess.Popen) -> None:
    p.stdin.close()  # type: ignore[union-attr]
    p.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--iterations", type=int, default=21)
    ap.add_argument("--samples", type=int, default=2000)
    a = ap.parse_args()
    fixture = find_fixture(a.fixture)
    base = f"pybench{os.getpid()}"
    h = w = a.size
    n = a.batch
    p = writer(fixture, base + "_copy", "--elements", str(n), "--height", str(h), "--width", str(w),
               "--epochs", str(a.iterations + 3), "--capacity", str(n))
    r = joader.RingReader(base + "_copy", "r")
    out = np.ones((n, h, w, 3), np.uint8)
    labels = np.zeros(n, np.int64)
    src = np.full_like(out, 2)
    t_reader, t_copy = [], []
    for it in range(a.iterations + 2):
        # Wait for the writer process outside the timed region (its
        # scheduling is not the reader's cost); then time the copy.
        while True:
            b = r.next_batch(n, timeout=30)
            if len(b) == n:
                break
        # Alternate the order: the second copy may find its source in cache.
        tc = td = 0.0
        for step in ((0, 1) if it % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            if step == 0:
                np.copyto(out, src)
                tc = time.perf_counter() - t0
            else:
                b.collate(out=out, labels_out=labels)
                r.ack()
                td = time.perf_counter() - t0
        if it >= 2:
            t_copy.append(tc)
            t_reader.append(td)
    r.close()
    stop(p)
    nbytes = out.nbytes
    tr, tc = float(np.median(t_reader)), float(np.median(t_copy))
    print(f"python dataplane bench: batch of {n} images {h}x{w}x3 u8 ({nbytes / 1e6:.1f} MB)")
    print(f"  reader (collate + ack):              {nbytes / tr / 1e9:7.2f} GB/s  ({tr * 1e3:.2f} ms/batch)")
    print(f"  np.copyto:                           {nbytes / tc / 1e9:7.2f} GB/s  ({tc * 1e3:.2f} ms/batch)")
    print(f"  ratio to memcpy: {tc / tr:.2f} (target >= 0.70)")

    p = writer(fixture, base + "_lat", "--elements", "1", "--height", "1", "--width", "1",
               "--epochs", str(a.samples), "--capacity", "64", "--pace-us", "100")
    r = joader.RingReader(base + "_lat", "r")
    lat = []
    while len(lat) < a.samples:
        b = r.next_batch(1, timeout=10)
        now = time.monotonic_ns()
        if len(b):
            lat.append((now - int(b.positions[0])) / 1e3)
        if b.end_of_stream:
            break
    r.close()
    stop(p)
    lat_a = np.sort(np.array(lat))
    print(f"  push->wake latency over {len(lat_a)} samples: p50 {np.percentile(lat_a, 50):.0f} us, "
          f"p99 {np.percentile(lat_a, 99):.0f} us, max {lat_a[-1]:.0f} us (target p99 <= 200 us)")


if __name__ == "__main__":
    main()
