"""The wheel as a user installs it (issue 43): `dataplane/python/build-wheel.sh --native` makes
the one wheel (the extension and the `joader` command) from the test build, and it is
installed into a new virtual environment that is all a process sees: its PATH is that
environment's bin folder alone, so no Rust toolchain, C compiler or nasm can be reached. From
there `joader serve` runs, a dataset is indexed, an epoch is read through `joader.Loader` and
through `joader.torch.JoaderDataset`, and `joader demo` runs at a small size."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
CLASSES, PER_CLASS = 3, 8
N = CLASSES * PER_CLASS
#: What a machine without build tools lacks; none may be reachable from the environment.
BUILD_TOOLS = ["cargo", "rustc", "cc", "gcc", "clang", "nasm", "maturin"]


def workspace_version() -> str:
    with open(ROOT / "Cargo.toml", "rb") as f:
        return str(tomllib.load(f)["workspace"]["package"]["version"])


@pytest.fixture(scope="module")
def installed() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    uv = os.environ.get("JOADER_UV")
    assert uv, "JOADER_UV is not set: run under tests/all.sh or after sourcing tests/pyenv.sh"
    tmp = Path(tempfile.mkdtemp(prefix="joader-wheel-"))
    build = subprocess.run(["bash", str(ROOT / "dataplane/python/build-wheel.sh"), "--native", "--daemon", str(BIN),
                            "-o", str(tmp / "dist")], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    wheel = Path(build.stdout.strip().splitlines()[-1])
    assert wheel.parent == tmp / "dist" and wheel.exists(), build.stdout
    venv = tmp / "venv"
    # The base interpreter of the test environment, not the environment itself.
    base = subprocess.run([sys.executable, "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([uv, "venv", "--quiet", "--python", base, str(venv)], check=True)
    t0 = time.time()
    # The wheel and torch (for JoaderDataset); numpy comes as the wheel's dependency. The lock
    # constrains their versions to the ones the rest of the tests use.
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "-c",
                    str(ROOT / "tests/requirements.lock"), str(wheel), "torch"], check=True)
    env = {"PATH": str(venv / "bin"), "HOME": str(tmp), "LANG": "C.UTF-8", "TMPDIR": str(tmp)}
    yield {"tmp": tmp, "venv": venv, "wheel": wheel, "env": env, "installed_at": t0}
    shutil.rmtree(tmp, ignore_errors=True)


def run(inst: Dict[str, Any], args: List[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs a command of the environment with only the environment's bin folder on PATH."""
    exe = inst["venv"] / "bin" / args[0]
    return subprocess.run([str(exe), *args[1:]], env=inst["env"], capture_output=True, text=True,
                          timeout=timeout, cwd=inst["tmp"])


def test_the_environment_reaches_no_build_tool(installed: Dict[str, Any]) -> None:
    path = installed["env"]["PATH"]
    assert [t for t in BUILD_TOOLS if shutil.which(t, path=path)] == []
    # The command is the stripped daemon the wheel carries, not a script that calls another.
    joader = installed["venv"] / "bin" / "joader"
    assert joader.read_bytes()[:4] == b"\x7fELF"
    # Both stripped: no symbol table, no debug sections (binutils' readelf, beside the strip
    # that build-wheel.sh runs).
    native = list((installed["venv"] / "lib").glob("python3*/site-packages/joader/_native*.so"))
    assert len(native) == 1, native
    for elf in [joader, native[0]]:
        sections = subprocess.run(["readelf", "-S", "-W", str(elf)], capture_output=True, text=True,
                                  check=True).stdout
        assert ".text" in sections
        assert ".symtab" not in sections and ".debug_info" not in sections, (elf, sections)


def test_versions_agree_with_cargo_toml(installed: Dict[str, Any]) -> None:
    version = workspace_version()
    cli = run(installed, ["joader", "--version"])
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.split() == ["joader", version]
    py = run(installed, ["python", "-c", "import joader; print(joader.__version__)"])
    assert py.returncode == 0, py.stderr
    assert py.stdout.strip() == version
    name = installed["wheel"].name
    assert name.startswith(f"joader-{version}-cp39-abi3-manylinux_"), name
    with zipfile.ZipFile(installed["wheel"]) as z:
        meta = z.read(f"joader-{version}.dist-info/METADATA").decode()
        assert f"\nVersion: {version}\n" in meta
        assert f"joader-{version}.data/scripts/joader" in z.namelist()


def test_serve_index_and_read_epochs_from_the_wheel(installed: Dict[str, Any]) -> None:
    tmp = installed["tmp"]
    data = tmp / "images"
    gen = run(installed, ["joader", "gen-dataset", "--out", str(data), "--classes", str(CLASSES),
                          "--per-class", str(PER_CLASS), "--width", "64", "--height", "48"])
    assert gen.returncode == 0, gen.stderr
    instance = f"wheel_{os.getpid()}"
    proc = subprocess.Popen([str(installed["venv"] / "bin" / "joader"), "serve", "--bind", "127.0.0.1:0",
                             "--instance", instance, "--data-dir", str(tmp / "state"), "--allowed-root",
                             str(data), "--cache-bytes", str(64 << 20)],
                            env={**installed["env"], "JOADER_LOG": "info"}, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            if "addr=" in line:
                url = "http://" + line.split("addr=")[1].split()[0]
                break
        assert url, "joader serve (from the wheel) did not start"
        code = textwrap.dedent(f"""
            import json, time, urllib.request
            import joader
            from joader.torch import JoaderDataset
            url = {url!r}
            req = urllib.request.Request(url + "/v1/datasets", method="POST",
                data=json.dumps({{"name": "imgs", "source": {{"kind": "image_folder", "path": {str(data)!r}}}}}).encode(),
                headers={{"Content-Type": "application/json"}})
            urllib.request.urlopen(req, timeout=10).read()
            while json.loads(urllib.request.urlopen(url + "/v1/datasets/imgs", timeout=10).read())["state"] != "ready":
                time.sleep(0.05)
            first = None
            labels = []
            with joader.Loader(server=url, dataset="imgs", job="loader", batch_size=5,
                               transform=joader.RandomResizedCrop(32)) as loader:
                for x, y in loader:
                    first = first or time.time()
                    assert x.shape[1:] == (32, 32, 3), x.shape
                    labels += [int(v) for v in y]
            torch_labels = []
            for x, y in JoaderDataset(server=url, dataset="imgs", job="torch", batch_size=5,
                                      pipeline={{"kind": "decode", "resize_shorter": 48}},
                                      transform=joader.RandomResizedCrop(40)):
                assert tuple(x.shape[1:]) == (40, 40, 3) and str(x.dtype) == "torch.uint8", (x.shape, x.dtype)
                torch_labels += [int(v) for v in y]
            print(json.dumps({{"labels": labels, "torch_labels": torch_labels, "first": first}}))
        """)
        out = run(installed, ["python", "-c", code], timeout=120)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.strip().splitlines()[-1])
        want = sorted(c for c in range(CLASSES) for _ in range(PER_CLASS))
        assert sorted(got["labels"]) == want
        assert sorted(got["torch_labels"]) == want
        # Printed for the record (pytest -s): from the start of the install to the first batch,
        # making and indexing the small dataset included.
        print(f"install to first batch: {got['first'] - installed['installed_at']:.2f} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def test_demo_runs_from_the_wheel(installed: Dict[str, Any]) -> None:
    demo = run(installed, ["joader", "demo", "--data", str(installed["tmp"] / "demo"), "--classes", "2",
                           "--per-class", "12", "--epochs", "1", "--batch-size", "8", "--cache-bytes", "64MiB",
                           "--quiet"])
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "decodes performed:" in demo.stdout and "demo finished" in demo.stdout, demo.stdout
