"""The regression guard: two builds of joader measured side by side in one run, alternating.

    python3 server/tools/regress/regress.py --side old=BIN,PYTHON --side new=BIN,PYTHON

Each side is a `joader` binary and a Python interpreter that imports the matching `joader`
package (`regress.sh` builds both for two commits). Every round runs each measurement once per
side, the sides in turn (their order swapped every round), each on a `joader serve` of its own
with the server's default settings (nothing in its environment that a user's lacks):

- the training loop: one `joader.Loader` job (decode and resize 256 on the server,
  RandomResizedCrop(224) + flip in the client, batches of 64) over a generated dataset that the
  cache holds whole; a first epoch without a step fills the cache (the server's decode rate and
  CPU per decode), the second and third have a 100 ms step per batch: the training process's
  CPU per delivered image in the third (steady) and in the second with its page faults (the
  pacing makes the prefetch allocate one more batch buffer there, once), and the server's CPU
  per delivered image in the third;
- the isolated crop: `BIN bench dataplane`'s RandomResizedCrop(224) + flip, one thread's CPU per
  image, and the paced loop's client CPU over it in the same round;
- indexing: a manifest of `--items` entries (ImageNet's 1,281,167 by default: hard links to a
  few small JPEGs, made once in the work folder) indexed by a fresh server: seconds until ready,
  and the growth of the server's RssAnon once it has settled.

It prints one table, a row per figure with each side's median and every round's value; the
ratio column is the second side over the first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

TICK = os.sysconf("SC_CLK_TCK")

LOOP = r"""
import json, resource, sys, time
import joader
url, batch, step_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def usage():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_minflt
loader = joader.Loader(server=url, dataset="d", job="j", batch_size=batch, epochs=3, seed=0,
                       pipeline={"kind": "decode", "resize_shorter": 256},
                       transform=joader.RandomResizedCrop(224))
print("mark warm", flush=True)
n0 = 0
for x, y in loader:
    n0 += len(y)
out = {"warm": n0}
for mark in ("paced", "steady"):
    print(f"mark {mark}", flush=True)
    (c, f), n = usage(), 0
    for x, y in loader:
        n += len(y)
        time.sleep(step_ms / 1000)
    c1, f1 = usage()
    out[mark] = {"n": n, "cpu": c1 - c, "faults": f1 - f}
print("mark done", flush=True)
print(json.dumps(out), flush=True)
loader.close()
"""


# The training process's CPU per image in its second paced epoch. In the first, the pacing
# holds batches longer than the unpaced epoch did, so the prefetch allocates one more batch
# buffer (9.6 MB) and faults its pages in once: a cost per loader, not per image, shown in
# the rows of the first paced epoch.
STEADY = "client CPU ms per delivered image (paced, cached, steady)"


def proc_cpu(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_anon(pid: int) -> int:
    m = re.search(r"^RssAnon:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert m, f"no RssAnon for {pid}"
    return int(m[1]) * 1024


def settled_rss(pid: int) -> int:
    """RssAnon once it moves by less than 64 KiB over 300 ms (at most 10 s)."""
    start, last = time.time(), rss_anon(pid)
    while True:
        time.sleep(0.3)
        now = rss_anon(pid)
        if abs(now - last) <= 64 << 10 or time.time() - start > 10:
            return now
        last = now


def call(url: str, method: str = "GET", body: Optional[dict] = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read()
    return json.loads(text) if text else {}


class Server:
    """`BIN serve` on a free port, its own data folder and shared-memory instance."""

    def __init__(self, binary: str, work: Path, roots: List[Path], cache_bytes: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="serve-", dir=work))
        self.instance = f"regress_{os.getpid()}_{self.dir.name[-6:]}"
        args = [binary, "serve", "--bind", "127.0.0.1:0", "--instance", self.instance,
                "--cache-bytes", str(cache_bytes), "--data-dir", str(self.dir / "data")]
        for r in roots:
            args += ["--allowed-root", str(r)]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "JOADER_LOG": "info"})
        assert self.proc.stderr is not None
        self.url = ""
        for line in self.proc.stderr:
            m = re.search(r"addr=(\S+)", line)
            if m:
                self.url = f"http://{m[1]}"
                break
        if not self.url:
            raise SystemExit(f"{binary} serve did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def ready(self, name: str, source: dict, deadline_s: float = 600) -> float:
        """Registers a dataset and waits until it is ready: the seconds it took."""
        t = time.time()
        call(f"{self.url}/v1/datasets", "POST", {"name": name, "source": source})
        while time.time() - t < deadline_s:
            state = call(f"{self.url}/v1/datasets/{name}").get("state")
            if state == "ready":
                return time.time() - t
            if state == "failed":
                raise SystemExit(f"dataset {name} failed: {call(f'{self.url}/v1/datasets/{name}')}")
            time.sleep(0.02)
        raise SystemExit(f"dataset {name} not ready after {deadline_s} s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in Path("/dev/shm").glob(f"joader-{self.instance}-*"):
            f.unlink(missing_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def training_loop(binary: str, python: str, work: Path, images: Path, n: int) -> Dict[str, float]:
    # The decoded set is about n * 256 * 341 * 3 bytes: a cache of twice that holds it whole.
    server = Server(binary, work, [images], cache_bytes=max(n * 256 * 400 * 3 * 2, 256 << 20))
    try:
        server.ready("d", {"kind": "image_folder", "path": str(images)})
        p = subprocess.Popen([python, "-c", LOOP, server.url, "64", "100"], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None
        marks: Dict[str, Tuple[float, float]] = {}
        result = None
        for line in p.stdout:
            if line.startswith("mark "):
                marks[line.split()[1]] = (time.time(), proc_cpu(server.proc.pid))
            elif line.startswith("{"):
                result = json.loads(line)
        if p.wait() != 0 or result is None:
            raise SystemExit(f"the training loop failed ({python})")
        stats = call(f"{server.url}/v1/stats")
    finally:
        server.stop()
    (tw, cw), (tp, cp), (_, cs), (_, cd) = (marks[m] for m in ("warm", "paced", "steady", "done"))
    decodes = float(stats.get("decodes", 0))
    first, steady = result["paced"], result["steady"]
    return {
        STEADY: steady["cpu"] * 1e3 / steady["n"],
        "client CPU ms per delivered image (first paced epoch)": first["cpu"] * 1e3 / first["n"],
        "client page faults (first paced epoch)": first["faults"],
        "client page faults (second paced epoch)": steady["faults"],
        "server CPU ms per delivered image (paced, cached)": (cd - cs) * 1e3 / steady["n"],
        "server CPU ms per decode (first epoch)": (cp - cw) * 1e3 / max(decodes, 1),
        "decodes per second (first epoch)": result["warm"] / (tp - tw),
    }


def isolated_crop(binary: str) -> Dict[str, float]:
    """`BIN bench dataplane`'s RandomResizedCrop(224) + flip to uint8, one thread's CPU per image
    on one hot image (the same Rust code as the package's, without the loop around it): what the
    issue's bound on the paced loop is relative to."""
    out = subprocess.run([binary, "bench", "dataplane"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"RandomResizedCrop\(224\) \+ flip from 341x256, one thread's CPU: ([0-9.]+) ms/image", out)
    if not m:
        raise SystemExit(f"{binary} bench dataplane printed no crop figure")
    return {"isolated crop + flip ms per image (bench dataplane)": float(m[1])}


def manifest(binary: str, work: Path, items: int) -> Path:
    """A CSV manifest of `items` distinct hard links to a few small JPEGs (made once)."""
    root = work / f"manifest-{items}"
    csv = root / "train.csv"
    if (root / ".complete").exists():
        return csv
    shutil.rmtree(root, ignore_errors=True)
    base = root / "base"
    per = max(8, -(-items // 60_000))
    subprocess.run([binary, "gen-dataset", "--out", str(base), "--classes", "1", "--per-class",
                    str(per), "--width", "160", "--height", "120"], check=True,
                   stdout=subprocess.DEVNULL)
    sources = sorted(p for p in base.rglob("*") if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg"))
    per_class = -(-items // 1000)
    with open(csv, "w") as out:
        out.write("path,label\n")
        for i in range(items):
            c, k = divmod(i, per_class)
            rel = f"train/n{1440764 + c:08}/n{1440764 + c:08}_{k}.JPEG"
            if k == 0:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(sources[i % len(sources)], root / rel)
            out.write(f"{rel},{c}\n")
    (root / ".complete").touch()
    return csv


def indexing(binary: str, work: Path, csv: Path) -> Dict[str, float]:
    server = Server(binary, work, [csv.parent], cache_bytes=64 << 20)
    try:
        rss0 = settled_rss(server.proc.pid)
        ready_s = server.ready("large", {"kind": "manifest", "path": str(csv)})
        rss1 = settled_rss(server.proc.pid)
        # What the index's columns take (the view has it since the columnar index).
        columns = call(f"{server.url}/v1/datasets/large").get("index_bytes") or 0
    finally:
        server.stop()
    return {"indexing s (until ready)": ready_s, "RssAnon growth MB after indexing": (rss1 - rss0) / 1e6,
            "the index's columns MB": columns / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", action="append", required=True, help="NAME=BIN,PYTHON (twice)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--images", type=int, default=1280, help="images of the training loop's dataset")
    ap.add_argument("--items", type=int, default=1_281_167, help="entries of the indexed manifest")
    ap.add_argument("--work", type=Path, default=Path("target/regress/work"))
    a = ap.parse_args()
    sides = []
    for s in a.side:
        name, _, rest = s.partition("=")
        binary, _, python = rest.partition(",")
        if not (name and binary and python):
            ap.error(f"--side {s!r}: NAME=BIN,PYTHON")
        sides.append((name, binary, python))
    if len(sides) != 2:
        ap.error("two --side")
    a.work.mkdir(parents=True, exist_ok=True)
    work = a.work.resolve()
    images = work / f"images-{a.images}"
    if not (images / ".complete").exists():
        shutil.rmtree(images, ignore_errors=True)
        subprocess.run([sides[1][1], "gen-dataset", "--out", str(images), "--classes", "10",
                        "--per-class", str(a.images // 10)], check=True, stdout=subprocess.DEVNULL)
        (images / ".complete").touch()
    csv = manifest(sides[1][1], work, a.items) if a.items else None
    values: Dict[str, Dict[str, List[float]]] = {}
    for r in range(a.rounds):
        for name, binary, python in (sides if r % 2 == 0 else sides[::-1]):
            print(f"round {r + 1}: {name}", file=sys.stderr, flush=True)
            got = training_loop(binary, python, work, images, a.images)
            got.update(isolated_crop(binary))
            got["the paced loop's client CPU (steady) / the isolated crop"] = (
                got[STEADY] / got["isolated crop + flip ms per image (bench dataplane)"])
            if csv:
                got.update(indexing(binary, work, csv))
            for k, v in got.items():
                values.setdefault(k, {}).setdefault(name, []).append(v)
    (n0, _, _), (n1, _, _) = sides
    print(f"joader regression guard: {a.rounds} rounds alternating, {a.images} images of 500x375 for the "
          f"training loop, {a.items} manifest entries; median (every round)\n")
    print(f"| figure | {n0} | {n1} | {n1} / {n0} |")
    print("|---|---:|---:|---:|")
    for k, by in values.items():
        m0, m1 = statistics.median(by[n0]), statistics.median(by[n1])
        cells = [f"{statistics.median(by[n]):.3f} ({', '.join(f'{v:.3f}' for v in by[n])})" for n in (n0, n1)]
        print(f"| {k} | {cells[0]} | {cells[1]} | {m1 / m0 if m0 else float('nan'):.2f}x |")


if __name__ == "__main__":
    main()
