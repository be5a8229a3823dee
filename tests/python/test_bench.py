"""`joader bench e2e --python` (run by tests/all.sh after the package is installed): the Python
client's training loop from cache runs and reports itself. The figures are the benchmark's
business; what is asserted is that the timed epoch is whole and came from the cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
