"""Samples that are not images (issue 45, item 3) through a real `joader serve`: an `array`
dataset over `.npy` files written by NumPy (element i is row i of each array), read field by
field against NumPy by concurrent jobs, each epoch an exact permutation, its rows decoded never;
text-only WebDataset shards and Parquet rows without an image column as dict batches;
`joader.torch` tensors; and the refusals (a crop or a decoding pipeline on samples without an
image, a bad array naming its file)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
from conftest import create, get, need, post, start_serve
from test_fields import write_shard

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
ROWS = 37


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    tmp = Path(tempfile.mkdtemp(prefix="joader-arrays-"))
    data = tmp / "data"
    data.mkdir()
    rng = np.random.default_rng(45)
    arrays: Dict[str, np.ndarray] = {
        "pixels": rng.integers(0, 256, size=(ROWS, 8, 6, 3), dtype=np.uint8),
        "emb": rng.standard_normal((ROWS, 5)).astype(np.float32),
        "y": rng.integers(0, 4, size=ROWS).astype(np.int64),
        # Fortran order is refused for more than one dimension (its rows are not contiguous).
        "fortran": np.asfortranarray(rng.standard_normal((ROWS, 3))),
        # Rows of no dimension (a scalar each) and rows of no data.
        "scalar": (np.arange(ROWS) / 3).astype(">f8"),
        "empty": np.zeros((ROWS, 0), np.int16),
    }
    for name, a in arrays.items():
        np.save(data / f"{name}.npy", a)
    np.save(data / "short.npy", np.zeros((ROWS - 1, 2), np.float32))
    texts = [f"sample {i}: « {'x' * i} »" for i in range(ROWS)]
    (data / "wds").mkdir()
    write_shard(data / "wds" / "t-000000.tar",
                [{"__key__": f"k{i:04d}".encode(), "txt": texts[i].encode(), "cls": str(i % 3).encode(),
                  "json": json.dumps({"i": i}).encode()} for i in range(ROWS)])
    pa = need("pyarrow", "Parquet rows without an image column")
    import pyarrow.parquet as pq
    (data / "pq").mkdir()
    pq.write_table(pa.table({"text": texts, "label": [i % 3 for i in range(ROWS)]}), data / "pq" / "t.parquet",
                   row_group_size=10)

    instance = f"pyarrays_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
                                       "--allowed-root", str(data), "--cache-bytes", str(32 << 20),
                                       "--cache-slots", "512"])
    views = {
        "arr": create(url, "arr", {"kind": "array", "paths": [str(data / "pixels.npy"), str(data / "emb.npy")]}),
        "arr_y": create(url, "arr_y", {"kind": "array",
                                       "paths": [str(data / "pixels.npy"), str(data / "y.npy")],
                                       "fields": {"x": {"kind": "npy", "from": "pixels"},
                                                  "label": {"kind": "class", "from": "y"}}}),
        "text": create(url, "text", {"kind": "tar_shards", "paths": [str(data / "wds")],
                                     "fields": {"text": {"kind": "text", "from": "txt"},
                                                "meta": {"kind": "json", "from": "json"},
                                                "label": {"kind": "class", "from": "cls"}}}),
        "pq_text": create(url, "pq_text", {"kind": "parquet", "paths": [str(data / "pq")],
                                           "fields": {"text": {"kind": "text"}, "label": {"kind": "class"}}}),
        "arr_edge": create(url, "arr_edge", {"kind": "array",
                                             "paths": [str(data / "scalar.npy"), str(data / "empty.npy")]}),
        "fortran": create(url, "fortran", {"kind": "array", "paths": [str(data / "fortran.npy")]}),
        "short": create(url, "short", {"kind": "array", "paths": [str(data / "emb.npy"), str(data / "short.npy")]}),
    }
    yield {"url": url, "instance": instance, "views": views, "data": data, "arrays": arrays, "texts": texts}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def epochs(server: Dict[str, Any], dataset: str, job: str, n: int, **kw: Any) -> List[Dict[int, Dict[str, Any]]]:
    """`n` epochs of a job, each its items by element id (the dict batches cut into items),
    checking that every epoch is an exact permutation of the dataset."""
    import joader
    out = []
    with joader.Loader(server=server["url"], dataset=dataset, job=job, epochs=n, batch_size=8, timeout=60,
                       **kw) as loader:
        for _ in range(n):
            items: Dict[int, Dict[str, Any]] = {}
            for batch in loader:
                assert isinstance(batch, dict), type(batch)
                ids = loader.last_ids.tolist()
                for k, i in enumerate(ids):
                    assert i not in items, f"element {i} twice in one epoch"
                    items[i] = {name: value[k] for name, value in batch.items()}
            assert sorted(items) == list(range(ROWS))
            out.append(items)
    return out


def test_array_rows_arrive_field_by_field_as_numpy_has_them(server: Dict[str, Any]) -> None:
    a = server["arrays"]
    view = server["views"]["arr"]
    assert view["state"] == "ready", view
    assert view["items"] == ROWS
    # The default declaration (each file an `npy` field named by it) is the dataset's.
    assert view["source"]["fields"] == {"emb": {"kind": "npy"}, "pixels": {"kind": "npy"}}
    results: Dict[str, Any] = {}

    def run(job: str) -> None:
        results[job] = epochs(server, "arr", job, 2)

    # Two jobs at once share the rows; each gets its own exact permutation every epoch.
    threads = [threading.Thread(target=run, args=(f"arr-{k}",)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(results) == {"arr-0", "arr-1"}
    for job_epochs in results.values():
        for items in job_epochs:
            for i, item in items.items():
                assert set(item) == {"emb", "pixels"}
                assert item["pixels"].dtype == np.uint8 and item["pixels"].shape == (8, 6, 3)
                np.testing.assert_array_equal(item["pixels"], a["pixels"][i])
                assert item["emb"].dtype == np.float32
                np.testing.assert_array_equal(item["emb"], a["emb"][i])
    # Nothing was decoded: rows are kept as read (the `raw` pipeline).
    job = get(server["url"], "/v1/jobs/arr-0")
    assert job["pipeline"] == {"kind": "raw"}, job


def test_a_class_array_gives_the_labels(server: Dict[str, Any]) -> None:
    a = server["arrays"]
    view = server["views"]["arr_y"]
    assert view["state"] == "ready", view
    assert view["classes"] == ["0", "1", "2", "3"]
    (items,) = epochs(server, "arr_y", "arr-y", 1)
    for i, item in items.items():
        assert set(item) == {"x", "label"}
        assert item["label"] == a["y"][i]
        np.testing.assert_array_equal(item["x"], a["pixels"][i])
    # Fields asked by name.
    (items,) = epochs(server, "arr_y", "arr-y-label", 1, fields=["label"])
    assert {i: int(item["label"]) for i, item in items.items()} == {i: int(a["y"][i]) for i in range(ROWS)}


def test_rows_of_scalars_and_of_no_data_stack(server: Dict[str, Any]) -> None:
    import joader
    a = server["arrays"]
    with joader.Loader(server=server["url"], dataset="arr_edge", job="arr-edge", epochs=1, batch_size=8,
                       timeout=60) as loader:
        seen = 0
        for batch in loader:
            ids = loader.last_ids.tolist()
            assert batch["scalar"].shape == (len(ids),) and batch["scalar"].dtype == np.dtype(">f8")
            np.testing.assert_array_equal(batch["scalar"], a["scalar"][ids])
            assert batch["empty"].shape == (len(ids), 0) and batch["empty"].dtype == np.int16
            seen += len(ids)
    assert seen == ROWS


def test_text_only_shards_and_parquet_rows_without_an_image(server: Dict[str, Any]) -> None:
    texts = server["texts"]
    for dataset in ("text", "pq_text"):
        view = server["views"][dataset]
        assert view["state"] == "ready", view
        (items,) = epochs(server, dataset, f"{dataset}-job", 1)
        for i, item in items.items():
            assert item["text"] == texts[i]
            assert item["label"] == i % 3
            if dataset == "text":
                assert item["meta"] == {"i": i}


def test_torch_yields_tensors_of_array_rows(server: Dict[str, Any]) -> None:
    torch = need("torch", "joader.torch over an array dataset")
    from joader.torch import JoaderDataset
    a = server["arrays"]
    ds = JoaderDataset(server=server["url"], dataset="arr_y", job="arr-torch", batch_size=8, epochs=1,
                       timeout=60)
    seen = 0
    for batch in ds:
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].dtype == torch.uint8
        assert batch["x"].shape[1:] == (8, 6, 3)
        assert isinstance(batch["label"], torch.Tensor)
        ids = ds.loader.last_ids.tolist()
        np.testing.assert_array_equal(batch["x"].numpy(), a["pixels"][ids])
        np.testing.assert_array_equal(batch["label"].numpy(), a["y"][ids])
        seen += len(ids)
    assert seen == ROWS


def test_what_samples_without_an_image_cannot_take_is_refused(server: Dict[str, Any]) -> None:
    import joader
    url = server["url"]
    for kw in ({"transform": joader.RandomResizedCrop(4)}, {"mean": [0.5] * 3, "std": [0.2] * 3},
               {"pipeline": {"kind": "decode", "resize_shorter": 4}}):
        with pytest.raises(ValueError, match="no images"):
            joader.Loader(server=url, dataset="arr", job="refused", **kw)
    # The server refuses a decoding pipeline itself.
    status, body = post(url, "/v1/jobs", {"name": "refused", "dataset": "arr", "batch_size": 4,
                                          "pipeline": {"kind": "decode", "resize_shorter": 4}})
    assert status == 400 and "no image" in body["error"]["message"], body
    # Bad arrays fail the indexing naming the file; bad declarations are refused at once.
    for name, says in (("fortran", "Fortran-ordered"), ("short", "36 rows, but")):
        view = server["views"][name]
        assert view["state"] == "failed", view
        assert view["error"].startswith("bad_array") and says in view["error"], view
    status, body = post(url, "/v1/datasets", {"name": "unnamed", "source": {
        "kind": "array", "paths": [str(server["data"] / "emb.npy")], "fields": {"e": {"kind": "npy"}}}})
    assert status == 400 and "no path is named `e.npy`" in body["error"]["message"], body
    status, body = post(url, "/v1/datasets", {"name": "manifest_text", "source": {
        "kind": "manifest", "path": str(server["data"] / "m.csv"), "fields": {"t": {"kind": "text"}}}})
    assert status == 400 and "declare its field of kind `image`" in body["error"]["message"], body


@pytest.fixture(scope="module")
def s3(server: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The module's arrays as `.npy` objects in a real S3 server (`s3s-fs`), read by a second
    `joader serve` as `s3` datasets of the `array` layout."""
    import shutil
    from conftest import s3_store
    data: Path = server["data"]
    root = Path(tempfile.mkdtemp(prefix="joader-arrays-s3-"))
    for prefix, names in (("arr", ("pixels", "emb")), ("arr_y", ("pixels", "y")), ("bad", ("fortran",))):
        (root / "bkt" / prefix).mkdir(parents=True)
        for n in names:
            shutil.copy(data / f"{n}.npy", root / "bkt" / prefix / f"{n}.npy")
    store, env = s3_store(str(root), "arrkey", "arrsecret0123456789")
    instance = f"pyarrays3_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(root / "state"),
                                       "--allowed-s3", "s3://bkt", "--cache-bytes", str(32 << 20),
                                       "--cache-slots", "512"], env)
    try:
        views = {
            "s3_arr": create(url, "s3_arr", {"kind": "s3", "url": "s3://bkt/arr/", "layout": "array"}),
            "s3_arr_y": create(url, "s3_arr_y", {"kind": "s3", "url": "s3://bkt/arr_y/*.npy", "layout": "array",
                                                 "fields": {"x": {"kind": "npy", "from": "pixels"},
                                                            "label": {"kind": "class", "from": "y"}}}),
            "s3_bad": create(url, "s3_bad", {"kind": "s3", "url": "s3://bkt/bad/", "layout": "array"}),
        }
        yield {"url": url, "views": views}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        store.kill()
        store.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_arrays_in_an_object_store_read_as_local_ones(server: Dict[str, Any], s3: Dict[str, Any]) -> None:
    a = server["arrays"]
    view = s3["views"]["s3_arr"]
    assert view["state"] == "ready" and view["items"] == ROWS, view
    # The default declaration, filled in once the objects were listed.
    assert view["source"]["fields"] == {"emb": {"kind": "npy"}, "pixels": {"kind": "npy"}}, view
    remote = {"url": s3["url"]}
    results: Dict[str, Any] = {}

    def run(job: str) -> None:
        results[job] = epochs(remote, "s3_arr", job, 2)

    threads = [threading.Thread(target=run, args=(f"s3-arr-{k}",)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(results) == {"s3-arr-0", "s3-arr-1"}
    for job_epochs in results.values():
        for items in job_epochs:
            for i, item in items.items():
                np.testing.assert_array_equal(item["pixels"], a["pixels"][i])
                assert item["emb"].dtype == np.float32
                np.testing.assert_array_equal(item["emb"], a["emb"][i])
    assert get(s3["url"], "/v1/jobs/s3-arr-0")["pipeline"] == {"kind": "raw"}
    # A class array's labels, the objects named by a pattern.
    view = s3["views"]["s3_arr_y"]
    assert view["state"] == "ready" and view["classes"] == ["0", "1", "2", "3"], view
    (items,) = epochs({"url": s3["url"]}, "s3_arr_y", "s3-arr-y", 1)
    for i, item in items.items():
        assert item["label"] == a["y"][i]
        np.testing.assert_array_equal(item["x"], a["pixels"][i])
    # A bad array fails the indexing naming its object.
    view = s3["views"]["s3_bad"]
    assert view["state"] == "failed" and "Fortran-ordered" in view["error"], view
    assert "bad/fortran.npy" in view["error"], view
    # A declaration of another kind is refused before anything is listed.
    status, body = post(s3["url"], "/v1/datasets", {"name": "s3_text", "source": {
        "kind": "s3", "url": "s3://bkt/arr/", "layout": "array", "fields": {"t": {"kind": "text"}}}})
    assert status == 400 and "`npy` arrays and at most one `class`" in body["error"]["message"], body
