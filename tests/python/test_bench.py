"""`joader bench e2e --python` and `joader bench train --quick` (run by tests/all.sh after the
package is installed): the Python client's training loop from cache runs and reports itself, and
the training bench reports every system. The figures are the benchmarks' business; what is
asserted is that the timed epoch is whole and came from the cache, and that the training bench's
table is complete and consistent (every job measured over one window)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import need

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))


def test_bench_e2e_times_a_cached_epoch_of_the_python_client(tmp_path: Path) -> None:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    # The bench runs `python3`: this interpreter, which has the package.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    o = subprocess.run([str(BIN), "bench", "e2e", "--quick", "--python", "--only", "cached", "--data",
                        str(tmp_path / "data"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert o.returncode == 0, o.stderr
    md = (tmp_path / "out" / "e2e.md").read_text()
    wait = re.search(r"\| wait in next\(\) / loop time \| ([0-9.]+)% \(([0-9.]+) s of ([0-9.]+) s, (\d+) samples\) \|", md)
    assert wait, md
    share, waited, loop, samples = float(wait[1]), float(wait[2]), float(wait[3]), int(wait[4])
    assert samples == 60, md  # --quick: 4 classes of 15 images, the whole second epoch
    assert 0.0 <= waited <= loop and 0.0 <= share <= 100.0, md
    decodes = re.search(r"\| server decodes per image over both epochs \| ([0-9.]+) \|", md)
    assert decodes, md
    # The cache holds the whole dataset: the second epoch decodes nothing.
    assert float(decodes[1]) == 1.0, md
    # Only the chosen scenario ran.
    assert "| sync K=1 |" not in md, md


SYSTEMS = ("synthetic", "joader", "pytorch")


def test_bench_train_quick_reports_every_system_over_one_window(tmp_path: Path) -> None:
    need("torch", "the training jobs")
    need("torchvision", "the models and the DataLoader baseline")
    need("joader.torch", "the joader jobs")
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The photos the decode tests fetched (pip download of two wheels, once) into cargo's tmp dir.
    photos = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "tmp" / "joader-photos"
    o = subprocess.run([str(BIN), "bench", "train", "--quick", "--bench-data", str(tmp_path / "data"),
                        "--photo-cache", str(photos), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert o.returncode == 0, o.stderr
    md = (tmp_path / "out" / "train.md").read_text()
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[1] in SYSTEMS:
            rows[(int(cells[0]), cells[1])] = cells
    assert set(rows) == {(k, s) for k in (1, 2) for s in SYSTEMS}, md
    for (k, system), cells in rows.items():
        total, per_job = float(cells[3]), [float(v) for v in cells[4].split(" / ")]
        assert total > 0 and len(per_job) == k and all(v > 0 for v in per_job), md
        # Every job is measured over the same window: their rates add up to the total.
        assert abs(sum(per_job) - total) <= 0.05 * (k + 1), md
        cpu = [[float(v) for v in job.split(" + ")] for job in cells[9].split(" / ")]
        assert len(cpu) == k and all(len(c) == 3 and min(c) >= 0 for c in cpu), md
        if system == "joader":
            decodes = float(cells[10])
            assert 0 < decodes <= 1.0, md
            assert cells[7].endswith("%") and float(cells[8]) >= 0, md
        else:
            assert cells[7] == "-" and cells[8] == "-", md
    # Without CUDA there is no GPU to read.
    assert all(c[6] == "n/a" for c in rows.values()) or "no CUDA" not in md, md
    # joader's CPU per stage: figures, or a row saying the side does not export them.
    for k in (1, 2):
        for side in ("server", "client"):
            assert re.search(rf"^\| {k} \| {side} \| ", md, re.M), md
