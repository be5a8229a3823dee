"""`joader bench e2e --quick --python --torch` and `joader bench train --quick` (run by
tests/all.sh in its Python environment, with the package installed): every system of each bench
runs, side by side, and each figure is checked against what a broken bench would print: a
system that shares no decode, a baseline that did not run, a cached epoch that decoded again, a
CPU reading of zero."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from conftest import need

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))

#: The systems of `bench e2e --python --torch`: joader's Rust client, independent loaders,
#: joader's Python client, and the PyTorch DataLoader baseline at its two worker settings.
E2E_SYSTEMS = {"joader", "independent", "python", "pytorch", "pytorch, workers = cores per job"}


def e2e_rows(md: str) -> Dict[Tuple[str, str], List[str]]:
    """The main table's rows by (scenario, system)."""
    rows = {}
    for line in md.split("joader's CPU by stage")[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 15 and cells[1] in E2E_SYSTEMS:
            rows[(cells[0], cells[1])] = cells
    return rows


def test_bench_e2e_quick_runs_every_system_and_the_cached_step(tmp_path: Path) -> None:
    need("torch", "the PyTorch baseline")
    need("torchvision", "the PyTorch baseline's transforms")
    need("PIL", "the PyTorch baseline's decoder")
    need("joader", "the Python client's rows")
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    # The bench runs `python3`: this interpreter, which has the package.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    o = subprocess.run([str(BIN), "bench", "e2e", "--quick", "--python", "--torch", "--data",
                        str(tmp_path / "data"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=900, env=env)
    assert o.returncode == 0, o.stderr
    # A baseline that cannot run is said on stderr and left out: here that is a failure.
    assert "skipped" not in o.stderr, o.stderr
    md = (tmp_path / "out" / "e2e.md").read_text()
    rows = e2e_rows(md)
    scenarios = {sc for sc, _ in rows}
    assert {"sync K=1", "sync K=2"} <= scenarios, md
    # A row per system in every scenario, each with samples delivered and CPU spent.
    for sc in scenarios:
        assert {system for s, system in rows if s == sc} == E2E_SYSTEMS, (sc, md)
    for (sc, system), cells in rows.items():
        rate, per_job, cpu = float(cells[2]), [float(v) for v in cells[3].split(" / ")], float(cells[4])
        assert rate > 0 and per_job and all(v > 0 for v in per_job) and cpu > 0, (sc, system, md)
    decodes = {key: float(cells[5]) for key, cells in rows.items()}
    # Loaders that share nothing decode every sample they deliver, once.
    for system in ("independent", "pytorch", "pytorch, workers = cores per job"):
        for sc in scenarios:
            assert decodes[(sc, system)] == 1.0, (sc, system, md)
    # joader (either client) decodes each element once for the two jobs of sync K=2: half
    # of what they deliver, with room for what a small cache evicts, far from 1 (no sharing).
    for system in ("joader", "python"):
        assert decodes[("sync K=2", system)] <= 0.6, (system, md)
        assert decodes[("sync K=1", system)] <= 1.0, (system, md)

    # The cached training step (Python client): a whole second epoch, served from the cache.
    wait = re.search(r"\| wait in next\(\) / loop time \| ([0-9.]+)% \(([0-9.]+) s of ([0-9.]+) s, (\d+) samples\) \|", md)
    assert wait, md
    share, waited, loop, samples = float(wait[1]), float(wait[2]), float(wait[3]), int(wait[4])
    assert samples == 60, md  # --quick: 4 classes of 15 images, the whole second epoch
    assert 0.0 <= waited <= loop and 0.0 <= share <= 100.0, md
    cached = re.search(r"\| server decodes per image over both epochs \| ([0-9.]+) \|", md)
    assert cached, md
    # The cache holds the whole dataset: the second epoch decodes nothing.
    assert float(cached[1]) == 1.0, md


SYSTEMS = ("synthetic", "joader", "joader-device", "pytorch")


def test_bench_train_quick_reports_every_system_over_one_window(tmp_path: Path) -> None:
    need("torch", "the training jobs")
    need("torchvision", "the models and the DataLoader baseline")
    need("joader.torch", "the joader jobs")
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # A ring shorter than a batch is refused before anything is generated.
    o = subprocess.run([str(BIN), "bench", "train", "--quick", "--ring-capacity", "4", "--bench-data",
                        str(tmp_path / "none"), "--out", str(tmp_path / "none-out")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert o.returncode != 0 and "cannot hold one batch of 8" in o.stderr, o.stderr
    assert not (tmp_path / "none").exists()
    # joader's jobs with a deeper prefetch and ring than the defaults (batches of 8).
    o = subprocess.run([str(BIN), "bench", "train", "--quick", "--prefetch", "3", "--ring-capacity", "32",
                        "--bench-data", str(tmp_path / "data"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert o.returncode == 0, o.stderr
    md = (tmp_path / "out" / "train.md").read_text()
    assert "joader's jobs: prefetch 3 batches, rings of 32 records" in md, md
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[1] in SYSTEMS:
            rows[(int(cells[0]), cells[1])] = cells
    assert set(rows) == {(k, s) for k in (1, 2) for s in SYSTEMS}, md
    decodes = {}
    for (k, system), cells in rows.items():
        total, per_job = float(cells[3]), [float(v) for v in cells[4].split(" / ")]
        assert total > 0 and len(per_job) == k and all(v > 0 for v in per_job), md
        cpu = [[float(v) for v in job.split(" + ")] for job in cells[9].split(" / ")]
        assert len(cpu) == k and all(len(c) == 3 and min(c) >= 0 for c in cpu), md
        # Every job trains on its main thread: a CPU reading of zero there is a broken reading.
        assert all(c[0] > 0 for c in cpu), md
        if system == "pytorch":
            # The DataLoader decodes in its worker processes.
            assert all(c[2] > 0 for c in cpu), md
        if system in ("joader", "joader-device"):
            decodes.setdefault(system, {})[k] = float(cells[10])
            assert 0 < decodes[system][k] <= 1.0, md
            assert cells[7].endswith("%") and float(cells[8]) > 0, md
        else:
            assert cells[7] == "-" and cells[8] == "-", md
    # No system outruns the synthetic limit (a ready batch each step) beyond noise.
    for k in (1, 2):
        limit = float(rows[(k, "synthetic")][3])
        for system in ("joader", "joader-device", "pytorch"):
            assert float(rows[(k, system)][3]) <= 1.5 * limit, md
    # Two jobs of one dataset share their decodes: per delivered image, well under what one
    # job alone needs (without sharing the two would be equal).
    for system in ("joader", "joader-device"):
        assert decodes[system][2] <= 0.75 * decodes[system][1], md
    # Without CUDA there is no GPU to read.
    assert all(c[6] == "n/a" for c in rows.values()) or "no CUDA" not in md, md
    # joader's CPU per stage: figures, or a row saying the side does not export them.
    for k in (1, 2):
        for system in ("joader", "joader-device"):
            for side in ("server", "client"):
                assert re.search(rf"^\| {k} \| {system} \| {side} \| ", md, re.M), md
