"""The Python client against the real joader server (run by tests/all.sh after the package is
installed): Loader and RingReader jobs in separate processes beside a Rust client, exact
epochs and labels, the torch adapter, and errors carrying the server's code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from conftest import need, start_serve

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
CLASSES, PER_CLASS = 3, 8
N = CLASSES * PER_CLASS


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    tmp = Path(tempfile.mkdtemp(prefix="joader-py-"))
    data = tmp / "data"
    (tmp / "more").mkdir()
    subprocess.run([str(BIN), "gen-dataset", "--out", str(data), "--classes", str(CLASSES), "--per-class",
                    str(PER_CLASS), "--width", "64", "--height", "48"], check=True, capture_output=True)
    instance = f"py_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
         "--allowed-root", str(data), "--allowed-root", str(tmp / "more"), "--cache-bytes", str(64 << 20), "--cache-slots", "1024"])
    post(url, "/v1/datasets", {"name": "imgs", "source": {"kind": "image_folder", "path": str(data)}})
    wait_ready(url, "imgs")
    yield {"url": url, "instance": instance, "more": tmp / "more"}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def post(url: str, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
    import urllib.request
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def get(url: str, path: str) -> Dict[str, Any]:
    import urllib.request
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def wait_ready(url: str, dataset: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while get(url, f"/v1/datasets/{dataset}")["state"] != "ready":
        assert time.monotonic() < deadline, f"the dataset was not indexed within {seconds:.0f} s"
        time.sleep(0.05)


def run_python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def result(p: subprocess.Popen[str]) -> Any:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_python_and_rust_clients_get_exact_epochs(server: Dict[str, Any]) -> None:
    url = server["url"]
    # Low-level: element ids and labels of every epoch.
    ids_job = run_python(f"""
        import json, joader
        info = joader.register_job({url!r}, name="py-ids", dataset="imgs", batch_size=5, subset={{"start": 0, "end": 16}}, epochs=2)
        r = joader.RingReader(info["ranks"][0]["instance"], info["ranks"][0]["ring"])
        epochs = {{}}
        while True:
            b = r.next_batch(5, 30.0)
            for e, i, l in zip(b.epochs.tolist(), b.element_ids.tolist(), b.labels.tolist()):
                epochs.setdefault(e, []).append([i, l])
            done = b.end_of_stream
            r.ack()
            if done:
                break
        print(json.dumps(epochs))
    """)
    # High level: the Loader with a client-side RandomResizedCrop.
    loader_job = run_python(f"""
        import json, joader
        loader = joader.Loader(server={url!r}, dataset="imgs", job="py-loader", batch_size=4,
                               subset=list(range(8, 24)), epochs=2, transform=joader.RandomResizedCrop(32), seed=5)
        out = []
        for epoch in range(2):
            n, labels = 0, []
            for images, lab in loader:
                assert images.shape[1:] == (32, 32, 3) and images.dtype.name == "uint8", images.shape
                n += len(lab)
                labels += lab.tolist()
            out.append([n, sorted(labels)])
        print(json.dumps(out))
    """)
    rust_job = subprocess.Popen([str(BIN), "consume", "--server", url, "--job",
                                 json.dumps({"name": "rust", "dataset": "imgs", "batch_size": 3, "epochs": 2,
                                             "subset": {"ranges": [[4, 20]]}})],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ids = result(ids_job)
    loader = result(loader_job)
    rust = result(rust_job)
    for e in ("0", "1"):
        got = ids[e]
        assert sorted(i for i, _ in got) == list(range(16))
        assert all(label == i // PER_CLASS for i, label in got)
    for n, labels in loader:
        assert n == 16
        assert labels == sorted(i // PER_CLASS for i in range(8, 24))
    for epoch in rust["epochs"]:
        assert sorted(i for i, _ in epoch) == list(range(4, 20))
    stats = get(url, "/v1/stats")
    assert stats["decodes"] <= N, stats


def test_torch_adapter(server: Dict[str, Any]) -> None:
    torch = need("torch", "tests/all.sh installs it")
    import joader.torch as jt
    ds = jt.JoaderDataset(server=server["url"], dataset="imgs", job="torch-job", batch_size=6, epochs=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=None)
    seen = 0
    for images, labels in dl:
        assert isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.shape[1:] == (224, 224, 3)
        assert labels.dtype == torch.int64
        seen += len(labels)
    assert seen == N


def test_errors_carry_the_server_code(server: Dict[str, Any]) -> None:
    import joader
    with pytest.raises(joader.ServerError) as e:
        joader.Loader(server=server["url"], dataset="nope", batch_size=2)
    assert e.value.code == "dataset_not_found"
    with pytest.raises(joader.ServerError) as e:
        joader.Loader(server=server["url"], dataset="imgs", batch_size=2, subset=[])
    assert e.value.code == "empty_subset"


def test_a_loader_asks_for_its_ring_capacity(server: Dict[str, Any]) -> None:
    import joader
    deep = joader.Loader(server=server["url"], dataset="imgs", job="ring-deep", batch_size=4, epochs=1,
                         ring_capacity=100)
    plain = joader.Loader(server=server["url"], dataset="imgs", job="ring-plain", batch_size=4, epochs=1)
    # Rounded up to a power of two; the server's default is twice the batch, at least 64 records.
    assert [r["capacity"] for r in deep.info["ranks"]] == [128]
    assert [r["capacity"] for r in plain.info["ranks"]] == [64]
    for loader in (deep, plain):
        labels = [int(v) for _, y in loader for v in y]
        assert len(labels) == N and sorted(labels) == sorted(i // PER_CLASS for i in range(N))
        loader.close()
    with pytest.raises(ValueError, match="ring_capacity must hold one batch"):
        joader.Loader(server=server["url"], dataset="imgs", batch_size=4, ring_capacity=3)
    with pytest.raises(joader.ServerError) as e:
        joader.Loader(server=server["url"], dataset="imgs", batch_size=4, ring_capacity=1 << 17)
    assert e.value.code == "too_large"


def test_a_killed_run_resumes_from_its_state_dict(server: Dict[str, Any], tmp_path: Path) -> None:
    """Checkpoint mid-epoch, SIGKILL the client (preemption), restart from the saved state with
    the torch adapter's load_state_dict: the two parts are exactly one epoch, no duplicate."""
    need("torch", "tests/all.sh installs it")
    ckpt = tmp_path / "ckpt.json"
    common = f'server={server["url"]!r}, dataset="imgs", job="preempted", batch_size=4, epochs=2, seed=11'
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import json, os, sys, time, joader
        loader = joader.Loader({common}, prefetch=3)
        it = iter(loader)
        seen = []
        for _ in range(3):
            next(it)
            seen += [int(i) for i in loader.last_ids]
        # The prefetch holds later batches too: only the three handed over count.
        with open({str(ckpt)!r} + ".tmp", "w") as f:
            json.dump({{"data": loader.state_dict(), "seen": seen}}, f)
        os.rename({str(ckpt)!r} + ".tmp", {str(ckpt)!r})
        time.sleep(3600)
    """)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ckpt.exists():
        assert first.poll() is None, first.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint within 60 s"
        time.sleep(0.05)
    first.kill()
    first.wait()
    saved = json.loads(ckpt.read_text())
    seen = saved["seen"]
    assert len(seen) == 12 and len(set(seen)) == 12
    assert saved["data"]["epoch"] == 0
    second = run_python(f"""
        import json, torch, joader, joader.torch as jt
        state = json.load(open({str(ckpt)!r}))["data"]
        ds = jt.JoaderDataset(None, {common})
        ds.load_state_dict(state)
        rest = []
        for x, y in torch.utils.data.DataLoader(ds, batch_size=None):
            rest.append([int(i) for i in ds.loader.last_ids])
        epoch1 = []
        for x, y in torch.utils.data.DataLoader(ds, batch_size=None):
            epoch1 += [int(i) for i in ds.loader.last_ids]
        after = ds.state_dict()
        print(json.dumps({{"rest": sum(rest, []), "epoch1": epoch1, "after": after["epoch"]}}))
    """)
    r = result(second)
    rest = r["rest"]
    assert len(rest) == len(set(rest)) == N - 12, rest
    assert not set(rest) & set(seen), "nothing handed over before the kill comes again"
    assert sorted(rest + seen) == list(range(N)), "both parts are exactly one epoch"
    assert sorted(r["epoch1"]) == list(range(N)), "the next epoch is whole"
    assert r["after"] == 2


def test_state_dicts_of_ranks_merge_and_resume_every_rank(server: Dict[str, Any]) -> None:
    """Two ranks (no torch.distributed: the states are merged by hand) resumed with
    resume=state: their shares of the rest are disjoint, even (the short one padded once, to
    the resumed epoch's share) and together exactly the rest."""
    import base64
    import joader
    job = f'server={server["url"]!r}, dataset="imgs", batch_size=4, epochs=1, subset=range(23), world_size=2'
    first = [run_python(f"""
        import json, joader
        loader = joader.Loader({job}, job="ddp-ck", rank={r})
        next(iter(loader))
        print(json.dumps(loader.state_dict()))
        loader.close()
    """) for r in range(2)]
    states = [result(p) for p in first]
    merged = joader.merge_states(states)
    consumed = joader._native.IdSet.from_bytes(base64.b64decode(merged["consumed"])).to_list()
    assert len(consumed) == 8 and merged["epoch"] == 0
    second = [run_python(f"""
        import json, joader
        state = json.loads({json.dumps(json.dumps(merged))})
        loader = joader.Loader({job}, job="ddp-ck2", rank={r}, resume=state)
        ids = []
        for x, y in loader:
            ids += [int(i) for i in loader.last_ids]
        print(json.dumps(ids))
    """) for r in range(2)]
    shares = [result(p) for p in second]
    # 15 remain: 8 and 7, the 7 padded to 8 (not to the whole epoch's share of 12).
    assert [len(s) for s in shares] == [8, 8], shares
    assert not set(shares[0]) & set(shares[1])
    assert sorted(set(shares[0]) | set(shares[1])) == sorted(set(range(23)) - set(consumed))


def test_a_recorded_epoch_is_traced_and_replayed_by_the_loader(server: Dict[str, Any]) -> None:
    import joader
    with joader.Loader(server=server["url"], dataset="imgs", job="traced", batch_size=5, epochs=1,
                       record=True) as loader:
        batches = [[int(i) for i in loader.last_ids] for _ in loader]
    deadline = time.monotonic() + 30
    while True:  # written by the server's recorder thread, a moment after the deliveries
        try:
            rec = get(server["url"], "/v1/jobs/traced/record/0")
            if len(rec["order"]) == N:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the epoch was not recorded within 30 s"
        time.sleep(0.05)
    assert rec["ranks"][0] == sum(batches, []), "the record is what the loader received, in order"
    assert rec["ranks"][0][5:10] == batches[1], "batch k is ranks[r][k*B:(k+1)*B]"
    with joader.Loader(server=server["url"], dataset="imgs", job="replayed", batch_size=7, epochs=1,
                       replay={"job": "traced", "epoch": 0}) as again:
        order = sum(([int(i) for i in again.last_ids] for _ in again), [])
    assert order == rec["order"]


def test_webp_lossy_and_lossless_decode_like_pillow(server: Dict[str, Any]) -> None:
    """WebP (image-webp) on a real photo: lossless exactly, lossy within 2 levels of Pillow's libwebp."""
    import numpy as np
    Image = need("PIL.Image", "tests/all.sh installs Pillow")
    load_sample_image = need("sklearn.datasets", "tests/all.sh installs scikit-learn").load_sample_image
    photo = load_sample_image("china.jpg")[:240, :320]  # a real photo, 320x240
    folder = server["more"] / "webp"
    (folder / "c").mkdir(parents=True)
    Image.fromarray(photo).save(folder / "c" / "lossless.webp", lossless=True)
    Image.fromarray(photo).save(folder / "c" / "lossy.webp", quality=80)
    url = server["url"]
    post(url, "/v1/datasets", {"name": "webp", "source": {"kind": "image_folder", "path": str(folder)}})
    wait_ready(url, "webp", 60)
    job = run_python(f"""
        import json, joader
        import numpy as np
        info = joader.register_job({url!r}, name="webp", dataset="webp", batch_size=2, epochs=1,
                                   pipeline={{"kind": "decode", "resize_shorter": None, "center_crop": None}})
        r = joader.RingReader(info["ranks"][0]["instance"], info["ranks"][0]["ring"])
        out = {{}}
        while True:
            b = r.next_batch(2, 30.0)
            assert not b.errors, b.errors
            for i, v in zip(b.element_ids.tolist(), b.views()):
                out[i] = np.asarray(v).reshape(-1).tolist()
            done = b.end_of_stream
            r.ack()
            if done:
                break
        print(json.dumps(out))
    """)
    got = result(job)
    # ImageFolder order: ids by sorted path (lossless.webp, lossy.webp).
    lossless = np.array(got["0"], dtype=np.uint8)
    lossy = np.array(got["1"], dtype=np.uint8)
    assert lossless.size == photo.size and lossy.size == photo.size
    assert np.array_equal(lossless, photo.reshape(-1))
    pillow = np.asarray(Image.open(folder / "c" / "lossy.webp").convert("RGB")).reshape(-1)
    diff = float(np.abs(lossy.astype(np.int16) - pillow.astype(np.int16)).mean())
    assert diff <= 2.0, diff
    assert float(np.abs(lossy.astype(np.int16) - photo.reshape(-1).astype(np.int16)).mean()) > 0  # really lossy


def test_a_preloaded_working_set_serves_a_loader_without_decoding(server: Dict[str, Any]) -> None:
    import joader
    url = server["url"]
    view = joader.preload(url, "imgs", subset=range(0, 12), timeout=60)
    assert (view["state"], view["elements"], view["pinned"], view["failed"]) == ("ready", 12, 12, 0), view
    decodes = get(url, "/v1/stats")["decodes"]
    loader = joader.Loader(server=url, dataset="imgs", job="after-preload", batch_size=4, subset=range(0, 12), epochs=1)
    seen: List[int] = []
    for _images, _labels in loader:
        seen.extend(int(i) for i in loader.last_ids)
    seen.sort()
    assert seen == list(range(12))
    job = get(url, "/v1/jobs/after-preload")
    assert (job["hits"], job["misses"]) == (12, 0), job
    assert get(url, "/v1/stats")["decodes"] == decodes, "the job decoded nothing"
    with pytest.raises(joader.ServerError) as e:
        joader.preload(url, "imgs", subset=range(0, 4))
    assert e.value.code == "preload_exists"
    joader.release_preload(url, "imgs")
    with pytest.raises(joader.ServerError) as e:
        joader.release_preload(url, "imgs")
    assert e.value.code == "preload_not_found"
    with pytest.raises(joader.ServerError) as e:
        joader.preload(url, "imgs", pipeline={"kind": "decode", "resize_shorter": 4096, "center_crop": [4096, 4096]})
    assert e.value.code == "pin_budget" and "fit" in e.value.message, e.value.message
