"""Training parity against the real joader server (run by tests/all.sh, which installs torch,
scikit-learn and Pillow): scikit-learn's digits (1797 real 8x8 scans, shipped in its wheel)
written as an ImageFolder of upscaled PNGs; a small CNN trained on CPU with joader, beside two
concurrent jobs on overlapping subsets (so that DSA's correlated orders are what is tested),
and with a plain DataLoader over the same files: the mean test accuracies over 3 seeds are
within 1.5 points. Then `torchrun --nproc_per_node 2` (gloo) with `joader.torch.JoaderDataset`:
the ranks' shares of every epoch are disjoint, equal and together exactly the epoch, padded as
DistributedSampler pads. And a torchrun run checkpointed mid-epoch (the ranks' states gathered
by `JoaderDataset.state_dict`), left without closing, and resumed by a second torchrun run: the
two parts are exactly one epoch, the resumed shares equal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

import joader
from conftest import need, start_serve

# Every test here needs them: imported by `tools` (skipped, or failed under
# JOADER_REQUIRE_TOOLS=1, when one is missing).
torch: Any = None
datasets: Any = None
PIL: Any = None


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    global torch, datasets, PIL
    torch = need("torch", "tests/all.sh installs it")
    datasets = need("sklearn.datasets", "tests/all.sh installs scikit-learn")
    PIL = need("PIL.Image", "tests/all.sh installs Pillow")


ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
SIDE, EPOCHS, BATCH, SEEDS = 32, 6, 32, (0, 1, 2)
MEAN, STD = (0.2, 0.2, 0.2), (0.3, 0.3, 0.3)


def post(url: str, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def get(url: str, path: str) -> Dict[str, Any]:
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def upscale(img8: np.ndarray) -> np.ndarray:
    """An 8x8 scan (0..16) as a SIDE x SIDE RGB uint8 image."""
    g = np.kron(img8, np.ones((SIDE // 8, SIDE // 8))) * (255.0 / 16.0)
    return np.repeat(g.round().astype(np.uint8)[:, :, None], 3, axis=2)


@pytest.fixture(scope="module")
def digits() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    d = datasets.load_digits()
    images, labels = d.images, d.target
    test = np.arange(len(labels)) % 5 == 0
    tmp = Path(tempfile.mkdtemp(prefix="joader-digits-"))
    train_dir = tmp / "train"
    files: List[Tuple[str, int]] = []
    for i in np.flatnonzero(~test):
        cls = train_dir / f"d{labels[i]}"
        cls.mkdir(parents=True, exist_ok=True)
        path = cls / f"{i:04d}.png"
        PIL.fromarray(upscale(images[i])).save(path)
    # ImageFolder order (classes sorted, files sorted): the server's ids and the DataLoader's.
    for cls in sorted(os.listdir(train_dir)):
        for f in sorted(os.listdir(train_dir / cls)):
            files.append((str(train_dir / cls / f), int(cls[1:])))
    x_test = np.stack([upscale(images[i]) for i in np.flatnonzero(test)])
    instance = f"pyt_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
         "--allowed-root", str(train_dir), "--cache-bytes", str(64 << 20), "--cache-slots", "4096"])
    post(url, "/v1/datasets", {"name": "digits", "source": {"kind": "image_folder", "path": str(train_dir)}})
    deadline = time.monotonic() + 120
    while get(url, "/v1/datasets/digits")["state"] != "ready":
        assert time.monotonic() < deadline, "the dataset was not indexed within 120 s"
        time.sleep(0.05)
    yield {"url": url, "files": files, "x_test": x_test, "y_test": labels[test]}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def model() -> "torch.nn.Module":
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (SIDE // 4) ** 2, 10))


def normalize(x: np.ndarray) -> "torch.Tensor":
    """(B, H, W, 3) uint8 as the loaders deliver it with MEAN/STD: (B, 3, H, W) float32."""
    t = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
    return (t - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def train(batches_per_epoch: Any, seed: int, x_test: np.ndarray, y_test: np.ndarray) -> float:
    torch.manual_seed(seed)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    for epoch in range(EPOCHS):
        for x, y in batches_per_epoch(epoch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    with torch.no_grad():
        pred = net(normalize(x_test)).argmax(1).numpy()
    return float((pred == y_test).mean())


def test_training_with_joader_matches_a_dataloader(digits: Dict[str, Any]) -> None:
    torch.set_num_threads(1)
    url, files = digits["url"], digits["files"]
    n = len(files)

    class Files(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> Tuple["torch.Tensor", int]:
            with PIL.open(files[i][0]) as im:
                x = np.array(im.convert("RGB"))
            return normalize(x[None])[0], files[i][1]

    joader_acc, plain_acc = [], []
    for seed in SEEDS:
        # Two other jobs on overlapping subsets read beside the one that trains.
        others = [joader.Loader(server=url, dataset="digits", job=f"other{k}-{seed}", batch_size=BATCH, seed=10 + k,
                                epochs=EPOCHS, subset={"fraction": f, "seed": k}, pipeline={"kind": "decode"})
                  for k, f in ((1, 0.6), (2, 0.8))]
        loader = joader.Loader(server=url, dataset="digits", job=f"train-{seed}", batch_size=BATCH, seed=seed,
                               epochs=EPOCHS, pipeline={"kind": "decode"}, mean=MEAN, std=STD)
        errors: List[BaseException] = []

        def read(o: joader.Loader) -> None:
            try:
                for _ in range(EPOCHS):
                    for _x, _y in o:
                        pass
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=read, args=(o,)) for o in others]
        for t in threads:
            t.start()
        seen: List[List[int]] = []

        def joader_epoch(epoch: int) -> Iterator[Tuple["torch.Tensor", "torch.Tensor"]]:
            seen.append([])
            for x, y in loader:
                assert x.dtype == np.float32 and x.shape[1:] == (3, SIDE, SIDE)
                seen[-1].extend(loader.last_ids.tolist())
                yield torch.from_numpy(x), torch.from_numpy(y)

        joader_acc.append(train(joader_epoch, seed, digits["x_test"], digits["y_test"]))
        for t in threads:
            t.join()
        assert not errors, errors
        for o in others + [loader]:
            o.close()
        # Each epoch of the training job is an exact permutation of its dataset.
        assert [sorted(s) for s in seen] == [list(range(n))] * EPOCHS
        assert seen[0] != seen[1]

        g = torch.Generator().manual_seed(seed)
        dl = torch.utils.data.DataLoader(Files(), batch_size=BATCH, shuffle=True, generator=g)
        plain_acc.append(train(lambda _e: iter(dl), seed, digits["x_test"], digits["y_test"]))
    jm, pm = float(np.mean(joader_acc)), float(np.mean(plain_acc))
    print(f"test accuracy over seeds {SEEDS}: joader {joader_acc} (mean {jm:.4f}), DataLoader {plain_acc} (mean {pm:.4f})")
    assert min(jm, pm) > 0.9, (joader_acc, plain_acc)
    assert abs(jm - pm) <= 0.015, (joader_acc, plain_acc)
    # The helper jobs shared decodes with the training job (DSA correlates their orders).
    assert get(url, "/v1/stats")["hits"] > 0


DDP_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import joader.torch as jt
url, n, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
ds = jt.JoaderDataset(server=url, dataset="digits", job="ddp", batch_size=8, epochs=epochs,
                      subset={"start": 0, "end": n}, pipeline={"kind": "decode"}, channels_first=True)
out = []
for epoch in range(epochs):
    ids, steps = [], 0
    for x, y in ds:
        assert tuple(x.shape[1:]) == (3, 32, 32), x.shape
        ids += ds.loader.last_ids.tolist()
        steps += 1
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (ids, steps))
    out.append(every)
ds.close()
if dist.get_rank() == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


DDP_RESUME_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import joader.torch as jt
url, n, phase, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo")
ds = jt.JoaderDataset(server=url, dataset="digits", job="ddp-resume", batch_size=8, epochs=1,
                      subset={"start": 0, "end": n}, pipeline={"kind": "decode"})
if phase == "resume":
    ds.load_state_dict(json.load(open(ckpt))["data"])
ids, steps = [], 0
for x, y in ds:
    ids += ds.loader.last_ids.tolist()
    steps += 1
    if phase == "first" and steps == 3:
        state = ds.state_dict()  # a collective: the ranks' states gathered and merged
        break
every = [None] * dist.get_world_size()
dist.all_gather_object(every, (ids, steps))
if dist.get_rank() == 0:
    if phase == "first":
        json.dump({"data": state, "seen": every}, open(ckpt, "w"))
    print(json.dumps(every))
# The first phase leaves without closing: the clients are gone as if preempted.
os._exit(0) if phase == "first" else dist.destroy_process_group()
"""


def test_torchrun_ranks_resume_the_rest_of_the_epoch_from_a_gathered_state(digits: Dict[str, Any],
                                                                           tmp_path: Path) -> None:
    script, ckpt = tmp_path / "ddp_resume.py", tmp_path / "ckpt.json"
    script.write_text(textwrap.dedent(DDP_RESUME_SCRIPT))
    n = 101
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    runs = []
    for phase in ("first", "resume"):
        p = subprocess.run([*torchrun, str(script), digits["url"], str(n), phase, str(ckpt)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert p.returncode == 0, p.stderr[-4000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    (a0, _), (a1, _) = runs[0]
    assert len(a0) == len(a1) == 24, "three batches of 8 per rank before the checkpoint"
    seen = set(a0) | set(a1)
    assert len(seen) == 48
    assert json.loads(ckpt.read_text())["data"]["epoch"] == 0
    (b0, steps0), (b1, steps1) = runs[1]
    # 53 remain: shares of 27 and 26, the short one padded to 27 (not to the epoch's 51).
    assert len(b0) == len(b1) == 27 and steps0 == steps1 == 4
    assert not set(b0) & set(b1) and not (set(b0) | set(b1)) & seen
    assert sorted(seen | set(b0) | set(b1)) == list(range(n)), "the two parts are exactly one epoch"


def test_torchrun_ranks_get_disjoint_equal_shares(digits: Dict[str, Any], tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    n, epochs = 101, 2
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    p = subprocess.run([*torchrun, str(script), digits["url"], str(n), str(epochs)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out) == epochs
    for every in out:
        (ids0, steps0), (ids1, steps1) = every
        share = -(-n // 2)
        assert len(ids0) == len(ids1) == share and steps0 == steps1
        # Together exactly the epoch; the shorter share repeats its own first element once.
        assert sorted(set(ids0) | set(ids1)) == list(range(n))
        assert not set(ids0) & set(ids1)
        assert len(set(ids0)) + len(set(ids1)) == n
