"""Appending to a dataset while its jobs run (issue 45, item 2), through a real `joader serve`:
a job that follows its dataset covers the appended shard from the epoch the append names (each
epoch an exact permutation of the dataset as it stood when the epoch started), a job with a
subset keeps its own, a state saved before the append resumes over the grown dataset, the
refusals say why, and a restarted server keeps what was appended."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set

import pytest
from conftest import create, get, need, post, start_serve
from test_fields import write_shard

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
SIZES = {"a": 120, "b": 80, "c": 60, "d": 40}
FIELDS = {"text": {"kind": "text", "from": "txt"}, "label": {"kind": "class", "from": "cls"}}


def text(shard: str, k: int) -> str:
    return f"{shard}{k}"


def serve(tmp: Path, instance: str) -> Any:
    return start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
                                  "--allowed-root", str(tmp / "data"), "--cache-bytes", str(16 << 20),
                                  "--cache-slots", "512"])


def stop(proc: Any, instance: str) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    tmp = Path(tempfile.mkdtemp(prefix="joader-append-"))
    data = tmp / "data"
    data.mkdir()
    for shard, n in SIZES.items():
        write_shard(data / f"{shard}.tar", [{"__key__": f"{shard}{k:04d}".encode(), "txt": text(shard, k).encode(),
                                             "cls": str(k % 4).encode()} for k in range(n)])
    # A shard without the declared text field.
    write_shard(data / "bad.tar", [{"__key__": b"z0000", "cls": b"1"}])
    instance = f"pyappend_{os.getpid()}"
    proc, url = serve(tmp, instance)
    view = create(url, "grow", {"kind": "tar_shards", "paths": [str(data / "a.tar"), str(data / "b.tar")],
                                "fields": FIELDS})
    assert view["state"] == "ready" and view["items"] == 200, view
    state = {"url": url, "instance": instance, "tmp": tmp, "data": data, "proc": proc}
    yield state
    stop(state["proc"], instance)


def run_epochs(loader: Any, n: int, first: Dict[int, str]) -> List[Dict[int, str]]:
    """`n` epochs of `loader` (the first already begun with `first`), each its texts by id."""
    out = []
    for e in range(n):
        items = dict(first) if e == 0 else {}
        for batch in loader:
            for k, i in enumerate(loader.last_ids.tolist()):
                assert i not in items, f"element {i} twice in one epoch"
                items[i] = batch["text"][k]
        out.append(items)
    return out


def expected(n: int) -> Dict[int, str]:
    """The texts of the dataset's first `n` items, by id (a, b, then c)."""
    texts = [text(s, k) for s, size in SIZES.items() for k in range(size)]
    return dict(enumerate(texts[:n]))


def test_a_running_job_covers_the_appended_shard_from_its_next_epoch(server: Dict[str, Any]) -> None:
    import joader
    url, data = server["url"], server["data"]
    follow = joader.Loader(server=url, dataset="grow", job="follow", epochs=4, batch_size=8, timeout=60)
    fixed = joader.Loader(server=url, dataset="grow", job="fixed", epochs=2, batch_size=8, timeout=60,
                          subset={"start": 0, "end": 200})
    saver = joader.Loader(server=url, dataset="grow", job="saver", epochs=1, batch_size=8, timeout=60)
    with follow, fixed:
        # Epoch 0 has begun for the follower; the saver keeps a state mid-epoch.
        it = iter(follow)
        batch = next(it)
        first = {i: batch["text"][k] for k, i in enumerate(follow.last_ids.tolist())}
        with saver:
            before: Set[int] = set()
            for _ in range(5):
                next(iter(saver))
                before.update(saver.last_ids.tolist())
            state = saver.state_dict()
        out = joader.append(url, "grow", [str(data / "c.tar")])
        assert out["added"] == SIZES["c"], out
        assert out["dataset"]["items"] == 260 and len(out["dataset"]["appended"]) == 1, out
        assert out["dataset"]["appended"][0]["items"] == SIZES["c"]
        jobs = {j["name"]: j["from_epoch"] for j in out["jobs"]}
        # A second append before that epoch starts joins it too.
        out = joader.append(url, "grow", [str(data / "d.tar")])
        assert out["added"] == SIZES["d"] and out["dataset"]["items"] == 300, out
        assert {j["name"]: j["from_epoch"] for j in out["jobs"]}["follow"] == jobs["follow"], out
        # The job with a subset keeps its own; the follower grows from the next epoch the
        # server starts for it (the one under way, or the next if it was sampled ahead).
        # (The saver may still run: its reader left mid-epoch.)
        assert "follow" in jobs and "fixed" not in jobs, jobs
        assert jobs["follow"] in (1, 2), jobs
        view = get(url, "/v1/jobs/follow")
        assert view["grows"] is True and view["subset_size"] == 300, view
        assert get(url, "/v1/jobs/fixed")["grows"] is False
        # Each epoch an exact permutation of the dataset as it stood when it started.
        for e, items in enumerate(run_epochs(follow, 4, first)):
            assert items == expected(200 if e < jobs["follow"] else 300), f"epoch {e}"
        for items in run_epochs(fixed, 2, {}):
            assert items == expected(200)
    # A state saved before the append resumes: the rest of its epoch over the grown dataset.
    with joader.Loader(server=url, dataset="grow", job="saver", epochs=1, batch_size=8, timeout=60,
                       resume=state) as resumed:
        (rest,) = run_epochs(resumed, 1, {})
    consumed = set(range(300)) - set(rest)
    assert not set(rest) & before and consumed >= before, "an element twice in the resumed epoch"
    assert set(range(200, 300)) <= set(rest)


def test_appends_that_cannot_join_say_why(server: Dict[str, Any]) -> None:
    url, data = server["url"], server["data"]
    status, body = post(url, "/v1/datasets/grow/append", {"paths": [str(data / "a.tar")]})
    assert (status, body["error"]["code"]) == (409, "cannot_append"), body
    assert "a.tar is in the dataset already" in body["error"]["message"], body
    status, body = post(url, "/v1/datasets/grow/append", {"paths": []})
    assert (status, body["error"]["code"]) == (409, "cannot_append"), body
    status, body = post(url, "/v1/datasets/grow/append", {"paths": [str(data / "bad.tar")]})
    assert (status, body["error"]["code"]) == (400, "invalid_request"), body
    assert "missing_field" in body["error"]["message"], body
    status, body = post(url, "/v1/datasets/grow/append", {"paths": ["/etc"]})
    assert (status, body["error"]["code"]) == (403, "path_not_allowed"), body
    status, body = post(url, "/v1/datasets/nothing/append", {"paths": [str(data / "c.tar")]})
    assert (status, body["error"]["code"]) == (404, "dataset_not_found"), body
    import numpy as np
    np.save(data / "x.npy", np.zeros((4, 2), np.float32))
    assert create(url, "arr", {"kind": "array", "paths": [str(data / "x.npy")]})["state"] == "ready"
    status, body = post(url, "/v1/datasets/arr/append", {"paths": [str(data / "x.npy")]})
    assert (status, body["error"]["code"]) == (409, "cannot_append"), body
    assert "does not grow" in body["error"]["message"], body
    # Nothing of the refusals joined.
    assert get(url, "/v1/datasets/grow")["items"] in (200, 300)


def test_parquet_files_append_and_keep_their_classes(server: Dict[str, Any]) -> None:
    import joader
    pa = need("pyarrow", "a Parquet dataset grown by a file")
    import pyarrow.parquet as pq
    url, data = server["url"], server["data"]
    (data / "pq").mkdir()
    label = pa.dictionary(pa.int8(), pa.string())
    pq.write_table(pa.table({"text": [f"p{i}" for i in range(30)],
                             "label": pa.array([["cat", "dog"][i % 2] for i in range(30)]).cast(label)}),
                   data / "pq" / "one.parquet", row_group_size=7)
    pq.write_table(pa.table({"text": [f"q{i}" for i in range(20)],
                             "label": pa.array([["emu", "cat"][i % 2] for i in range(20)]).cast(label)}),
                   data / "two.parquet", row_group_size=6)
    view = create(url, "pq", {"kind": "parquet", "paths": [str(data / "pq")],
                              "fields": {"text": {"kind": "text"}, "label": {"kind": "class"}}})
    assert view["state"] == "ready" and view["items"] == 30, view
    out = joader.append(url, "pq", [str(data / "two.parquet")])
    assert out["added"] == 20 and out["dataset"]["classes"] == view["classes"] + ["emu"], out
    names = out["dataset"]["classes"]
    with joader.Loader(server=url, dataset="pq", job="pq-after", epochs=1, batch_size=8, timeout=60) as ld:
        got: Dict[int, Any] = {}
        for batch in ld:
            for k, i in enumerate(ld.last_ids.tolist()):
                got[i] = (batch["text"][k], names[int(batch["label"][k])])
    assert got == {**{i: (f"p{i}", ["cat", "dog"][i % 2]) for i in range(30)},
                   **{30 + i: (f"q{i}", ["emu", "cat"][i % 2]) for i in range(20)}}


def test_a_restarted_server_keeps_what_was_appended(server: Dict[str, Any]) -> None:
    import subprocess
    url, data = server["url"], server["data"]
    if get(url, "/v1/datasets/grow")["items"] == 200:
        import joader
        joader.append(url, "grow", [str(data / "c.tar")])
        joader.append(url, "grow", [str(data / "d.tar")])
    # The command line's append, of two shards at once.
    assert create(url, "grow2", {"kind": "tar_shards", "paths": [str(data / "a.tar")],
                                 "fields": FIELDS})["items"] == 120
    run = subprocess.run([str(BIN), "append", "grow2", str(data / "b.tar"), str(data / "c.tar"), "--server", url],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "appended 140 items to dataset 'grow2' (260 now)" in run.stderr, run.stderr
    import joader
    stop(server["proc"], server["instance"])
    server["proc"], server["url"] = serve(server["tmp"], server["instance"])
    url = server["url"]
    view = get(url, "/v1/datasets/grow")
    assert view["items"] == 300 and [a["items"] for a in view["appended"]] == [SIZES["c"], SIZES["d"]], view
    for dataset, n in (("grow", 300), ("grow2", 260)):
        with joader.Loader(server=url, dataset=dataset, job=f"after-{dataset}", epochs=1, batch_size=8,
                           timeout=60) as ld:
            (items,) = run_epochs(ld, 1, {})
        assert items == expected(n), dataset
    assert [a["items"] for a in get(url, "/v1/datasets/grow2")["appended"]] == [140]
