"""Shared fixtures: a `dataplane-fixture` writer process per test, unique instance names; and
`need`, the import of a tool that a test cannot run without."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

import numpy as np
import pytest

_counter = itertools.count()

#: Set by tests/all.sh, which installs every tool the tests need (ci.sh installs torch): a
#: missing one is then a failure of the test command, never a skip that would pass unseen.
REQUIRE_TOOLS = os.environ.get("JOADER_REQUIRE_TOOLS") == "1"


def need(module: str, why: str) -> Any:
    """Imports `module` for a test that cannot run without it. When it is missing the test
    skips, saying so, or fails naming it under JOADER_REQUIRE_TOOLS=1."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = f"{module} is not installed ({why}): {e}"
    # Outside the handler: the report says what is missing, not the import's traceback.
    if REQUIRE_TOOLS:
        pytest.fail(f"JOADER_REQUIRE_TOOLS=1 and {missing}", pytrace=False)
    pytest.skip(missing)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: Whether a CUDA device is present (CI never has one).
CUDA = _cuda()
#: The devices the device path's tests run on: the CPU always, CUDA where a GPU is present.
#: Cases that need a GPU are not collected without one (the test command treats a skip as
#: a failure).
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def fixture_binary() -> str:
    env = os.environ.get("JOADER_FIXTURE")
    if env:
        return env
    root = Path(__file__).resolve().parents[3]
    for target in (os.environ.get("CARGO_TARGET_DIR"), str(root / "target")):
        if target:
            for profile in ("debug", "release"):
                p = Path(target) / profile / "dataplane-fixture"
                if p.exists():
                    return str(p)
    raise RuntimeError(
        "dataplane-fixture not found: run `cargo build -p dataplane --bin dataplane-fixture` "
        "or set JOADER_FIXTURE (dataplane/python/ci.sh does both)"
    )


def pattern(element_id: int, shape) -> np.ndarray:
    """Content the fixture writes for an element (byte i = (id*31 + i*7) mod 256)."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64)
    return ((element_id * 31 + i * 7) % 256).astype(np.uint8).reshape(shape)


def shm_objects(instance: str) -> List[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"joader-{instance}-"))


class Writer:
    def __init__(self, instance: str, args: List[str]) -> None:
        self.instance = instance
        self.proc = subprocess.Popen(
            [fixture_binary(), "writer", "--instance", instance, *args, "--hold"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.line()
        assert line.startswith("READY"), line
        self.pid = int(line.split()[-1])

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def instance(request) -> str:
    name = "".join(c for c in request.node.name if c.isalnum())[:24]
    return f"py{name}_{os.getpid()}_{next(_counter)}_{time.monotonic_ns() % 1000000}"


@pytest.fixture
def writer(instance) -> Iterator:
    started: List[Writer] = []

    def start(rings: str = "r", elements: int = 10, height: int = 4, width: int = 5, epochs: int = 1,
              capacity: int = 16, error_every: int = 0, inst: Optional[str] = None, pace_us: int = 0) -> Writer:
        args = ["--rings", rings, "--elements", str(elements), "--height", str(height), "--width", str(width),
                "--epochs", str(epochs), "--capacity", str(capacity), "--error-every", str(error_every),
                "--pace-us", str(pace_us)]
        w = Writer(inst or instance, args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
    for w in started:
        assert shm_objects(w.instance) == [], f"segments left behind: {shm_objects(w.instance)}"
