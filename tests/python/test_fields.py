"""Samples with several fields (issue 29) through a real `joader serve`: WebDataset shards
written with Python's `tarfile` the way `webdataset.TarWriter` names members (image, txt,
json, cls, npy), a CSV manifest with extra columns and `.npy` files named by its cells, and Parquet written by pyarrow as
Hugging Face's `datasets` writes it (image struct, ClassLabel metadata, a row with only a
path, string, struct and list columns), over the same JPEGs, give the same dict batches field
by field; datasets without `fields`, and jobs that do not ask, get `(images,
labels)` as before; malformed values are element errors (the job goes on, the server lives),
a sample missing a field fails its indexing naming the key; a resumed job and a 2-rank padded
job keep their fields; `joader.torch` yields tensors, also in a `torchrun` 2-rank job."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import numpy as np
import pytest
from conftest import create, get, need, post, start_serve, wait_indexed

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
CLASSES, PER_CLASS = 2, 5
N = CLASSES * PER_CLASS
#: Decoded as they are (gen-dataset writes one size), so the two layouts' pixels compare.
PIPELINE = {"kind": "decode", "resize_shorter": None, "center_crop": None}

WDS_FIELDS = {
    "image": {"kind": "image", "from": "jpg;jpeg;png"},
    "label": {"kind": "class", "from": "cls"},
    "caption": {"kind": "text", "from": "txt"},
    "meta": {"kind": "json", "from": "json"},
    "emb": {"kind": "npy", "from": "npy", "shape": [4]},
}
CSV_FIELDS = {
    "image": {"kind": "image", "from": "path"},
    "label": {"kind": "class", "from": "label"},
    "caption": {"kind": "text", "from": "caption"},
    "meta": {"kind": "json", "from": "meta"},
    # Cells naming files: the `.npy` array, and the same file passed through as bytes.
    "emb": {"kind": "npy", "from": "emb", "shape": [4]},
    "raw": {"kind": "bytes", "from": "raw"},
}
#: An `s3` manifest's cells are values only (`npy`/`bytes` files are refused there).
S3_CSV_FIELDS = {k: v for k, v in CSV_FIELDS.items() if k not in ("emb", "raw")}

PQ_FIELDS = {
    "image": {"kind": "image", "from": "image"},
    "label": {"kind": "class", "from": "label"},
    "caption": {"kind": "text", "from": "text"},
    "meta": {"kind": "json", "from": "meta"},
    "emb": {"kind": "npy", "from": "emb", "shape": [4]},
    "boxes": {"kind": "npy", "from": "objects"},
}


def caption(i: int) -> str:
    return f"photo n°{i}, a \"quoted\", comma"


def meta(i: int) -> Dict[str, Any]:
    return {"id": i, "boxes": [[i, 0, 2.5, 3]], "tags": ["é", str(i)]}


def emb(i: int) -> np.ndarray:
    return np.arange(4, dtype=np.float32) + i


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def boxes(i: int) -> List[List[float]]:
    """COCO xywh boxes, a different count per element (a list column, ragged across rows)."""
    return [[float(i), 1.0, 2.5, 3.0 + k] for k in range(i % 3)]


def write_parquet(data: Path, images: List[Path], classes: List[str]) -> None:
    """The samples as Hugging Face's `datasets` writes them with pyarrow: an image struct
    `{bytes, path}` (element 4 with only a path, relative to the file), ClassLabel metadata, a
    string column, a struct column, a fixed-size list and a list of lists; two files, snappy
    and zstd, 4 rows per row group."""
    pa = need("pyarrow", "the parquet layout")
    pq = need("pyarrow.parquet", "the parquet layout")
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    meta_type = pa.struct([("id", pa.int64()), ("boxes", pa.list_(pa.list_(pa.float64()))),
                           ("tags", pa.list_(pa.string()))])
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"},
                "text": {"dtype": "string", "_type": "Value"}}
    schema = pa.schema([("image", image_type), ("label", pa.int64()), ("text", pa.string()),
                        ("meta", meta_type), ("emb", pa.list_(pa.float32())),
                        ("objects", pa.list_(pa.list_(pa.float32())))]).with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    rows = []
    for i, p in enumerate(images):
        image = ({"bytes": None, "path": os.path.relpath(p, data / "pq")} if i == 4
                 else {"bytes": p.read_bytes(), "path": p.name})
        rows.append({"image": image, "label": classes.index(p.parent.name), "text": caption(i),
                     "meta": meta(i), "emb": emb(i).tolist(), "objects": boxes(i)})
    # Damaged rows: a null caption (row 1), an array of another shape than declared (row 2).
    bad = [dict(r) for r in rows[:4]]
    bad[1]["text"] = None
    bad[2]["emb"] = [1.0, 2.0]
    (data / "pq_bad").mkdir()
    pq.write_table(pa.Table.from_pylist(bad, schema=schema), data / "pq_bad" / "bad.parquet", row_group_size=2)
    (data / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:6], schema=schema), data / "pq" / "train-00000-of-00002.parquet",
                   row_group_size=4, compression="snappy")
    pq.write_table(pa.Table.from_pylist(rows[6:], schema=schema), data / "pq" / "train-00001-of-00002.parquet",
                   row_group_size=4, compression="zstd")


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """A member as webdataset.TarWriter writes one: a regular file named `key.ext`."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, samples: List[Dict[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for s in samples:
            for ext, data in s.items():
                if ext != "__key__":
                    add(tar, f"{s['__key__'].decode()}.{ext}", data)


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    tmp = Path(tempfile.mkdtemp(prefix="joader-fields-"))
    data = tmp / "data"
    subprocess.run([str(BIN), "gen-dataset", "--out", str(data / "imgs"), "--classes", str(CLASSES),
                    "--per-class", str(PER_CLASS), "--width", "40", "--height", "32"], check=True,
                   capture_output=True)
    images = sorted((data / "imgs").rglob("*.jpg"))
    assert len(images) == N
    # Element i of every layout: the i-th image, its class from its folder.
    classes = sorted({p.parent.name for p in images})
    samples = [{"__key__": f"s{i:04d}".encode(), "jpg": p.read_bytes(),
                "cls": str(classes.index(p.parent.name)).encode(), "txt": caption(i).encode(),
                "json": json.dumps(meta(i)).encode(), "npy": npy_bytes(emb(i))}
               for i, p in enumerate(images)]
    (data / "wds").mkdir()
    write_shard(data / "wds" / "shard-000000.tar", samples[:6])
    write_shard(data / "wds" / "shard-000001.tar", samples[6:])
    # The manifest's arrays are files: even elements name them relative to the manifest's
    # folder, odd ones absolutely.
    (data / "emb").mkdir()
    with open(data / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption", "meta", "emb", "raw"])
        for i, p in enumerate(images):
            (data / "emb" / f"{i:04d}.npy").write_bytes(npy_bytes(emb(i)))
            file = f"emb/{i:04d}.npy" if i % 2 == 0 else str(data / "emb" / f"{i:04d}.npy")
            w.writerow([str(p), classes.index(p.parent.name), caption(i), json.dumps(meta(i)), file,
                        f"./{file}" if i % 2 == 0 else file])
    write_parquet(data, images, classes)
    # Damaged values: bad .npy header (element 0), JSON that is not JSON (1), text that is not UTF-8 (2).
    bad = [dict(s) for s in samples[:4]]
    bad[0]["npy"] = b"\x93NUMPY\x01\x00" + b"\x10\x00" + b"{'descr': 'x'}  \n"
    bad[1]["json"] = b"{not json"
    bad[2]["txt"] = b"\xff\xfe caption"
    (data / "bad").mkdir()
    write_shard(data / "bad" / "bad.tar", bad)
    # A key without its .txt: the indexing fails naming it.
    # A manifest whose element 1 names an array of another shape than declared, and whose
    # element 3's file is removed once indexed.
    (data / "emb_bad").mkdir()
    with open(data / "bad.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption", "meta", "emb", "raw"])
        for i, p in enumerate(images[:4]):
            (data / "emb_bad" / f"{i}.npy").write_bytes(npy_bytes(emb(i)[:3] if i == 1 else emb(i)))
            w.writerow([str(p), classes.index(p.parent.name), caption(i), json.dumps(meta(i)),
                        f"emb_bad/{i}.npy", f"emb_bad/{i}.npy"])
    missing = [dict(s) for s in samples[:3]]
    del missing[1]["txt"]
    (data / "missing").mkdir()
    write_shard(data / "missing" / "m.tar", missing)

    instance = f"pyfields_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
                                       "--allowed-root", str(data), "--cache-bytes", str(64 << 20),
                                       "--cache-slots", "1024"])
    views = {
        "wds": create(url, "wds", {"kind": "tar_shards", "paths": [str(data / "wds")], "fields": WDS_FIELDS}),
        "wds_plain": create(url, "wds_plain", {"kind": "tar_shards", "paths": [str(data / "wds")]}),
        # No class: a small text field that happens to be named "label".
        "wds_text_label": create(url, "wds_text_label", {"kind": "tar_shards", "paths": [str(data / "wds")],
                                                         "fields": {"image": {"kind": "image", "from": "jpg"},
                                                                    "label": {"kind": "text", "from": "txt"}}}),
        "csv": create(url, "csv", {"kind": "manifest", "path": str(data / "manifest.csv"), "fields": CSV_FIELDS}),
        "pq": create(url, "pq", {"kind": "parquet", "paths": [str(data / "pq")], "fields": PQ_FIELDS}),
        "bad": create(url, "bad", {"kind": "tar_shards", "paths": [str(data / "bad")], "fields": WDS_FIELDS}),
        "pq_bad": create(url, "pq_bad", {"kind": "parquet", "paths": [str(data / "pq_bad")], "fields": PQ_FIELDS}),
        "missing": create(url, "missing", {"kind": "tar_shards", "paths": [str(data / "missing")],
                                           "fields": WDS_FIELDS}),
        "csv_bad": create(url, "csv_bad", {"kind": "manifest", "path": str(data / "bad.csv"),
                                           "fields": CSV_FIELDS}),
    }
    (data / "emb_bad" / "3.npy").unlink()
    yield {"url": url, "instance": instance, "views": views, "data": data, "classes": classes,
           "images": images}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def epoch(server: Dict[str, Any], dataset: str, job: str, **kw: Any) -> List[Dict[str, Any]]:
    """Every item of one epoch, by element id: the dict batches cut into items."""
    import joader
    kw.setdefault("batch_size", 4)
    with joader.Loader(server=server["url"], dataset=dataset, job=job, epochs=1, pipeline=PIPELINE,
                       timeout=60, **kw) as loader:
        items: Dict[int, Dict[str, Any]] = {}
        for batch in loader:
            assert isinstance(batch, dict), type(batch)
            for k, i in enumerate(loader.last_ids.tolist()):
                items[i] = {name: value[k] for name, value in batch.items()}
    return [items[i] for i in sorted(items)]


def test_the_layouts_give_the_same_fields(server: Dict[str, Any]) -> None:
    views = server["views"]
    assert views["wds"]["state"] == "ready" and views["wds"]["items"] == N, views["wds"]
    assert views["csv"]["state"] == "ready" and views["csv"]["items"] == N, views["csv"]
    assert views["pq"]["state"] == "ready" and views["pq"]["items"] == N, views["pq"]
    assert views["pq"]["classes"] == server["classes"]
    wds = epoch(server, "wds", "wds-all", fields=True)
    csv_items = epoch(server, "csv", "csv-all", fields=True)
    pq = epoch(server, "pq", "pq-all", fields=True)
    assert len(wds) == len(csv_items) == len(pq) == N
    for i, (a, b, c) in enumerate(zip(wds, csv_items, pq)):
        assert sorted(a) == ["caption", "emb", "image", "label", "meta"]
        assert sorted(b) == ["caption", "emb", "image", "label", "meta", "raw"]
        assert sorted(c) == ["boxes", "caption", "emb", "image", "label", "meta"]
        assert a["caption"] == b["caption"] == c["caption"] == caption(i)
        assert a["meta"] == b["meta"] == c["meta"] == meta(i)
        assert int(a["label"]) == int(b["label"]) == int(c["label"]) == i // PER_CLASS
        assert a["image"].shape == (32, 40, 3)
        assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["image"], c["image"])
        assert a["emb"].dtype == b["emb"].dtype == c["emb"].dtype == np.float32
        assert np.array_equal(a["emb"], emb(i)) and np.array_equal(b["emb"], emb(i))
        assert np.array_equal(c["emb"], emb(i))
        assert b["raw"] == npy_bytes(emb(i))
        # A list of lists: an (n, 4) array per element, n varying (not stacked); an empty
        # list keeps its two dimensions.
        assert c["boxes"].dtype == np.float32
        assert c["boxes"].shape == ((i % 3, 4) if i % 3 else (0, 0))
        assert np.array_equal(c["boxes"].reshape(-1, 4), np.array(boxes(i), np.float32).reshape(-1, 4))


def test_batches_hold_each_kind(server: Dict[str, Any]) -> None:
    import joader
    with joader.Loader(server=server["url"], dataset="wds", job="wds-kinds", batch_size=N, epochs=1,
                       pipeline=PIPELINE, fields=["caption", "emb", "image", "meta"], timeout=60) as loader:
        batch = next(iter(loader))
        ids = loader.last_ids.tolist()
    assert sorted(batch) == ["caption", "emb", "image", "meta"]
    assert isinstance(batch["caption"], list) and batch["caption"] == [caption(i) for i in ids]
    assert batch["meta"] == [meta(i) for i in ids]
    # A fixed shape is stacked.
    assert batch["emb"].shape == (N, 4) and np.array_equal(batch["emb"], np.stack([emb(i) for i in ids]))
    assert batch["image"].shape == (N, 32, 40, 3)
    # Crops left to the consumer: the image is a `Padded` batch, the fields as before.
    with joader.Loader(server=server["url"], dataset="wds", job="wds-padded", batch_size=N, epochs=1,
                       pipeline=PIPELINE, fields=True, transform=joader.RandomResizedCrop(16), padded=True,
                       timeout=60) as loader:
        batch = next(iter(loader))
        ids = loader.last_ids.tolist()
    assert isinstance(batch["image"], joader.Padded) and len(batch["image"]) == N
    assert batch["caption"] == [caption(i) for i in ids]


def test_without_asking_a_job_gets_images_and_labels(server: Dict[str, Any]) -> None:
    import joader
    for dataset in ("wds", "wds_plain"):
        with joader.Loader(server=server["url"], dataset=dataset, job=f"{dataset}-pairs", batch_size=N,
                           epochs=1, pipeline=PIPELINE, timeout=60) as loader:
            images, labels = next(iter(loader))
            assert images.shape == (N, 32, 40, 3)
            assert sorted(labels.tolist()) == [i // PER_CLASS for i in range(N)]
    # The plain dataset has only its image and label.
    plain = epoch(server, "wds_plain", "plain-dict", fields=True)
    assert sorted(plain[0]) == ["image", "label"]
    with pytest.raises(ValueError, match="no field 'caption'"):
        joader.Loader(server=server["url"], dataset="wds_plain", job="plain-caption", fields=["caption"])


def test_a_field_named_label_is_its_values_not_a_class(server: Dict[str, Any]) -> None:
    """A dataset that declares no class has none: its text field `label` comes back with its
    own values, once, never as the class's numbers (zeros here)."""
    import joader
    with joader.Loader(server=server["url"], dataset="wds_text_label", job="text-label-names",
                       fields=True) as loader:
        assert loader.fields == ["image", "label"]
    items = epoch(server, "wds_text_label", "text-label", fields=True)
    assert [sorted(it) for it in items] == [["image", "label"]] * N
    assert [it["label"] for it in items] == [caption(i) for i in range(N)]
    torch = need("torch", "joader.torch's dict batches")
    import joader.torch
    ds = joader.torch.JoaderDataset(server=server["url"], dataset="wds_text_label", job="text-label-torch",
                                    batch_size=N, epochs=1, pipeline=PIPELINE, fields=True, timeout=60)
    (batch,) = list(ds)
    assert isinstance(batch["image"], torch.Tensor) and batch["image"].shape[0] == N
    assert sorted(batch["label"]) == sorted(caption(i) for i in range(N))


#: Every Arrow integer and float type, as a Parquet list column, and the dtype its `.npy`
#: values keep (pyarrow stores the small integers as INT32 with their logical type).
NUMBER_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64"]


def number_values(dtype: str, i: int) -> np.ndarray:
    """Three values of `dtype` for row i, at the type's limits where it has any."""
    info = np.iinfo(dtype) if dtype.startswith(("int", "uint")) else np.finfo(dtype)
    return np.array([info.min if dtype.startswith("int") else 0, i, info.max], dtype=dtype)


def test_parquet_number_columns_keep_their_dtype(server: Dict[str, Any]) -> None:
    """Each integer and float column comes back as an array of its own dtype and values
    (Hugging Face's `Sequence(Value("uint8"))` columns among them); columns of integers that
    are not numbers (dates, timestamps, decimals) are refused at indexing, naming what they
    hold."""
    import decimal
    import joader
    pa = need("pyarrow", "the parquet layout")
    pq = need("pyarrow.parquet", "the parquet layout")
    data: Path = server["data"]
    folder = data / "pq_types"
    folder.mkdir(exist_ok=True)
    images = server["images"]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image_type)] + [(t, pa.list_(getattr(pa, t)())) for t in NUMBER_TYPES])
    rows = [{"image": {"bytes": p.read_bytes(), "path": p.name},
             **{t: number_values(t, i) for t in NUMBER_TYPES}} for i, p in enumerate(images)]
    table = pa.Table.from_pydict({name: [r[name] for r in rows] for name in schema.names}, schema=schema)
    pq.write_table(table, folder / "numbers.parquet", row_group_size=4)
    fields = {"image": {"kind": "image", "from": "image"}, **{t: {"kind": "npy", "from": t} for t in NUMBER_TYPES}}
    create(server["url"], "pq_types", {"kind": "parquet", "paths": [str(folder)], "fields": fields})
    items = epoch(server, "pq_types", "pq-types", fields=True)
    assert len(items) == N
    for i, item in enumerate(items):
        for t in NUMBER_TYPES:
            got = item[t]
            assert got.dtype == np.dtype(t), (t, got.dtype)
            np.testing.assert_array_equal(got, number_values(t, i), err_msg=t)
    # Integers that are not numbers: refused when the dataset is indexed.
    for name, typ, value, what in [("day", pa.date32(), 19000, "dates"),
                                   ("at", pa.timestamp("ms"), 1_700_000_000_000, "timestamps"),
                                   ("price", pa.decimal128(9, 2), decimal.Decimal("1.25"), "decimals")]:
        bad_folder = data / f"pq_{name}"
        bad_folder.mkdir(exist_ok=True)
        bad_schema = pa.schema([("image", image_type), (name, pa.list_(typ))])
        pq.write_table(pa.Table.from_pydict({"image": [rows[0]["image"]], name: [[value]]}, schema=bad_schema),
                       bad_folder / "bad.parquet")
        status, body = post(server["url"], "/v1/datasets", {
            "name": f"pq_{name}", "source": {"kind": "parquet", "paths": [str(bad_folder)], "fields": {
                "image": {"kind": "image", "from": "image"}, name: {"kind": "npy", "from": name}}}})
        if status < 300:
            body = wait_indexed(server["url"], f"pq_{name}")
        text = json.dumps(body)
        assert "failed" in text or status >= 400, body
        assert f"column `{name}`" in text and what in text, body


@pytest.mark.parametrize("dataset,bad", [
    ("bad", {0: "bad_field", 1: "bad_field", 2: "bad_field"}),
    ("pq_bad", {1: "bad_field", 2: "bad_field"}),
    # A manifest's array file of another shape than declared, and one removed after indexing.
    ("csv_bad", {1: "bad_field", 3: "not_found"}),
])
def test_bad_values_are_element_errors(server: Dict[str, Any], dataset: str, bad: Dict[int, str]) -> None:
    import joader
    with joader.Loader(server=server["url"], dataset=dataset, job=f"{dataset}-values", batch_size=2, epochs=1,
                       pipeline=PIPELINE, fields=True, on_error="skip", timeout=60) as loader:
        got = []
        for batch in loader:
            got += loader.last_ids.tolist()
            assert len(batch["caption"]) == len(batch["label"])
            assert batch["caption"] == [caption(i) for i in loader.last_ids.tolist()]
        failures = sorted(loader.failures, key=lambda f: f.element_id)
    assert sorted(got) == [i for i in range(4) if i not in bad]
    assert [(f.element_id, f.code_name) for f in failures] == sorted(bad.items())
    # The server is alive, and lists why each failed.
    listed = get(server["url"], f"/v1/datasets/{dataset}/failures")
    text = json.dumps(listed)
    assert all(code in text for code in bad.values()), text
    assert get(server["url"], "/v1/datasets")


def test_a_missing_field_fails_the_indexing_naming_the_key(server: Dict[str, Any]) -> None:
    view = server["views"]["missing"]
    assert view["state"] == "failed", view
    assert "s0001" in view["error"] and "`caption`" in view["error"], view["error"]


def test_declarations_a_source_cannot_hold_are_refused(server: Dict[str, Any]) -> None:
    # An `s3` manifest's cells cannot name files (checked before anything is fetched).
    status, body = post(server["url"], "/v1/datasets", {"name": "s3-csv-npy", "source": {
        "kind": "s3", "url": "s3://bkt/m/manifest.csv", "layout": "manifest",
        "fields": {"image": {"kind": "image"}, "emb": {"kind": "npy"}}}})
    assert status == 400 and body["error"]["code"] == "invalid_request", body
    assert "`emb`" in body["error"]["message"] and "s3" in body["error"]["message"], body
    # A sample needs an image or a small field (samples of small fields only: test_arrays.py).
    status, body = post(server["url"], "/v1/datasets", {"name": "no-image", "source": {
        "kind": "tar_shards", "paths": [str(server["data"] / "wds")],
        "fields": {"label": {"kind": "class"}}}})
    assert status == 400 and "no field of kind `image` and no small field" in body["error"]["message"], body


def test_a_resumed_job_keeps_its_fields(server: Dict[str, Any]) -> None:
    import joader
    kw = dict(server=server["url"], dataset="wds", batch_size=3, epochs=1, pipeline=PIPELINE, fields=True,
              timeout=60)
    first = joader.Loader(job="resume-a", **kw)  # type: ignore[arg-type]
    batch = next(iter(first))
    seen = first.last_ids.tolist()
    assert batch["caption"] == [caption(i) for i in seen]
    state = first.state_dict()
    first.close()
    with joader.Loader(job="resume-b", resume=state, **kw) as second:  # type: ignore[arg-type]
        rest = []
        for b in second:
            ids = second.last_ids.tolist()
            assert b["caption"] == [caption(i) for i in ids]
            assert np.array_equal(b["emb"], np.stack([emb(i) for i in ids]))
            rest += ids
    assert sorted(seen + rest) == list(range(N))


def test_padded_ranks_repeat_the_fields(server: Dict[str, Any]) -> None:
    # 9 elements on 2 ranks (one job, its ranks in two threads): rank 1's share is one short
    # and repeats its first element, fields included.
    outs: Dict[int, List[Tuple[int, str]]] = {}

    def rank(r: int) -> None:
        import joader
        with joader.Loader(server=server["url"], dataset="wds", job="padded", rank=r, world_size=2,
                           subset=list(range(9)), batch_size=2, epochs=1, pipeline=PIPELINE,
                           fields=["caption", "label"], timeout=60) as loader:
            got = []
            for batch in loader:
                assert len(batch["caption"]) == len(batch["label"])
                got += list(zip(loader.last_ids.tolist(), batch["caption"]))
            outs[r] = got

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(outs) == [0, 1], "a rank did not finish"
    assert len(outs[0]) == len(outs[1]) == 5
    assert sorted({i for r in outs.values() for i, _ in r}) == list(range(9))
    for got in outs.values():
        assert all(c == caption(i) for i, c in got)


def test_torch_yields_tensors(server: Dict[str, Any]) -> None:
    torch = need("torch", "the torch adapter")
    from joader.torch import JoaderDataset
    ds = JoaderDataset(server=server["url"], dataset="wds", job="torch-fields", batch_size=N, epochs=1,
                       pipeline=PIPELINE, fields=True, timeout=60)
    batch = next(iter(ds))
    ids = ds.loader.last_ids.tolist()
    ds.close()
    assert isinstance(batch["image"], torch.Tensor) and batch["image"].shape == (N, 32, 40, 3)
    assert isinstance(batch["label"], torch.Tensor) and batch["label"].dtype == torch.int64
    assert isinstance(batch["emb"], torch.Tensor) and batch["emb"].shape == (N, 4)
    assert torch.equal(batch["emb"], torch.from_numpy(np.stack([emb(i) for i in ids])))
    assert batch["caption"] == [caption(i) for i in ids]


DDP_FIELDS = """
import json, sys
import numpy as np
import torch
import torch.distributed as dist
import joader.torch as jt
url = sys.argv[1]
dist.init_process_group("gloo")
ds = jt.JoaderDataset(server=url, dataset="wds", job="ddp-fields", batch_size=2, epochs=1,
                      pipeline={"kind": "decode", "resize_shorter": None, "center_crop": None},
                      fields=["image", "caption", "emb"], timeout=60)
got = []
for b in ds:
    assert isinstance(b["image"], torch.Tensor) and isinstance(b["emb"], torch.Tensor)
    assert b["emb"].shape == (len(b["caption"]), 4)
    for i, c, e in zip(ds.loader.last_ids.tolist(), b["caption"], b["emb"].tolist()):
        got.append([i, c, e])
every = [None] * dist.get_world_size()
dist.all_gather_object(every, got)
ds.close()
if dist.get_rank() == 0:
    print(json.dumps(every))
dist.destroy_process_group()
"""


def test_torchrun_ranks_get_dict_batches(server: Dict[str, Any], tmp_path: Path) -> None:
    need("torch", "torchrun and the torch adapter")
    script = tmp_path / "ddp_fields.py"
    script.write_text(textwrap.dedent(DDP_FIELDS))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    p = subprocess.run([*torchrun, str(script), server["url"]], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-4000:]
    ranks = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(ranks) == 2 and len(ranks[0]) == len(ranks[1]) == N // 2
    ids = [i for r in ranks for i, _, _ in r]
    assert sorted(ids) == list(range(N)), "the ranks' shares are disjoint and together the epoch"
    for r in ranks:
        for i, c, e in r:
            assert c == caption(i) and e == emb(i).tolist()


@pytest.fixture(scope="module")
def s3(server: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The module's WebDataset shards and a manifest of its images in a real S3 server
    (`s3s-fs`, the binary JOADER_S3S_FS names), read by a second `joader serve`."""
    from conftest import s3_store
    import shutil
    data: Path = server["data"]
    root = Path(tempfile.mkdtemp(prefix="joader-fields-s3-"))
    bucket = root / "bkt"
    shutil.copytree(data / "wds", bucket / "wds")
    # The manifest's paths are keys relative to its own prefix.
    (bucket / "m" / "imgs").mkdir(parents=True)
    with open(bucket / "m" / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption", "meta"])
        for i, p in enumerate(server["images"]):
            shutil.copy(p, bucket / "m" / "imgs" / f"{i:04d}.jpg")
            w.writerow([f"imgs/{i:04d}.jpg", server["classes"].index(p.parent.name), caption(i),
                        json.dumps(meta(i))])
    store, env = s3_store(str(root), "fieldskey", "fieldssecret0123456789")
    instance = f"pyfields3_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(root / "state"),
                                       "--allowed-s3", "s3://bkt", "--cache-slots", "1024"], env)
    try:
        views = {
            "s3_wds": create(url, "s3_wds", {"kind": "s3", "url": "s3://bkt/wds/", "layout": "tar_shards",
                                             "fields": WDS_FIELDS}),
            # The same shards read as samples without an image: the caption and the class.
            "s3_text": create(url, "s3_text", {"kind": "s3", "url": "s3://bkt/wds/", "layout": "tar_shards",
                                               "fields": {"caption": {"kind": "text", "from": "txt"},
                                                          "label": {"kind": "class", "from": "cls"}}}),
            "s3_csv": create(url, "s3_csv", {"kind": "s3", "url": "s3://bkt/m/manifest.csv",
                                             "layout": "manifest", "fields": S3_CSV_FIELDS}),
        }
        yield {"url": url, "views": views}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        store.kill()
        store.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_s3_layouts_give_the_fields_of_local_ones(server: Dict[str, Any], s3: Dict[str, Any]) -> None:
    for name in ("s3_wds", "s3_csv"):
        assert s3["views"][name]["state"] == "ready" and s3["views"][name]["items"] == N, s3["views"][name]
    local = epoch(server, "wds", "wds-for-s3", fields=True)
    remote_wds = epoch(s3, "s3_wds", "s3-wds-all", fields=True)
    remote_csv = epoch(s3, "s3_csv", "s3-csv-all", fields=True)
    assert len(remote_wds) == len(remote_csv) == N
    for i, (a, b, c) in enumerate(zip(local, remote_wds, remote_csv)):
        assert sorted(b) == sorted(a)
        for name in ("caption", "meta", "label"):
            assert b[name] == a[name] and c[name] == a[name], (i, name)
        assert np.array_equal(b["emb"], a["emb"])
        assert np.array_equal(b["image"], a["image"]) and np.array_equal(c["image"], a["image"])


def test_s3_shards_read_as_samples_without_an_image(server: Dict[str, Any], s3: Dict[str, Any]) -> None:
    import joader
    assert s3["views"]["s3_text"]["state"] == "ready", s3["views"]["s3_text"]
    local = epoch(server, "wds", "wds-for-s3-text", fields=True)
    items: Dict[int, Dict[str, Any]] = {}
    with joader.Loader(server=s3["url"], dataset="s3_text", job="s3-text", epochs=1, batch_size=4,
                       timeout=60) as loader:
        for batch in loader:
            assert set(batch) == {"caption", "label"}, batch.keys()
            for k, i in enumerate(loader.last_ids.tolist()):
                items[i] = {name: value[k] for name, value in batch.items()}
    assert sorted(items) == list(range(N))
    for i, a in enumerate(local):
        assert items[i]["caption"] == a["caption"] and items[i]["label"] == a["label"], i
    # A manifest's entries are images: an s3 manifest without one is refused.
    status, body = post(s3["url"], "/v1/datasets", {"name": "s3_csv_text", "source": {
        "kind": "s3", "url": "s3://bkt/m/manifest.csv", "layout": "manifest",
        "fields": {"caption": {"kind": "text"}}}})
    assert status == 400 and "declare its field of kind `image`" in body["error"]["message"], body


def test_an_s3_image_folder_declares_no_fields(s3: Dict[str, Any]) -> None:
    status, body = post(s3["url"], "/v1/datasets", {"name": "s3_folder_fields", "source": {
        "kind": "s3", "url": "s3://bkt/wds/", "layout": "image_folder", "fields": WDS_FIELDS}})
    assert status == 400 and body["error"]["code"] == "invalid_request", body
    assert "image_folder" in body["error"]["message"], body


def test_optional_fields_are_none_where_a_sample_lacks_them(server: Dict[str, Any]) -> None:
    """`"optional": true`: a missing member (WebDataset), an empty cell (CSV) or a null cell
    (Parquet) is None in its place, where a required field fails the indexing or the
    element; a fixed-shape array field is then a list, not a stacked array. Only small fields
    may be optional."""
    data: Path = server["data"]
    images: List[Path] = server["images"]
    classes = server["classes"]
    lacks = {1: "txt", 2: "npy", 3: "txt"}
    samples = []
    for i, p in enumerate(images[:4]):
        s = {"__key__": f"o{i:04d}".encode(), "jpg": p.read_bytes(), "cls": str(classes.index(p.parent.name)).encode(),
             "txt": caption(i).encode(), "json": json.dumps(meta(i)).encode(), "npy": npy_bytes(emb(i))}
        if i in lacks:
            del s[lacks[i]]
        samples.append(s)
    folder = data / "optional_wds"
    folder.mkdir(exist_ok=True)
    write_shard(folder / "o.tar", samples)

    def optional(fields: Dict[str, Any], names: Set[str]) -> Dict[str, Any]:
        return {n: {**f, "optional": True} if n in names else f for n, f in fields.items()}

    create(server["url"], "opt_wds", {"kind": "tar_shards", "paths": [str(folder)],
                                      "fields": optional(WDS_FIELDS, {"caption", "emb"})})
    items = epoch(server, "opt_wds", "opt-wds", fields=True, batch_size=4)
    assert [it["caption"] for it in items] == [caption(0), None, caption(2), None]
    assert [it["meta"] for it in items] == [meta(i) for i in range(4)]
    assert items[2]["emb"] is None
    for i in (0, 1, 3):
        np.testing.assert_array_equal(items[i]["emb"], emb(i))
    # CSV: an empty caption cell.
    with open(data / "optional.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption", "meta", "emb", "raw"])
        for i, p in enumerate(images[:3]):
            w.writerow([str(p), classes.index(p.parent.name), "" if i == 1 else caption(i), json.dumps(meta(i)),
                        f"emb/{i:04d}.npy", f"emb/{i:04d}.npy"])
    create(server["url"], "opt_csv", {"kind": "manifest", "path": str(data / "optional.csv"),
                                      "fields": optional(CSV_FIELDS, {"caption"})})
    assert [it["caption"] for it in epoch(server, "opt_csv", "opt-csv", fields=True)] == [caption(0), None, caption(2)]
    # Parquet: a null string cell (required, it is the element's bad_field: test_bad_values...).
    pq = need("pyarrow.parquet", "the parquet layout")
    table = pq.read_table(data / "pq_bad" / "bad.parquet").slice(0, 2)  # row 1's caption is null
    (data / "optional_pq").mkdir(exist_ok=True)
    pq.write_table(table, data / "optional_pq" / "o.parquet")
    assert table.column("text").null_count == 1
    create(server["url"], "opt_pq", {"kind": "parquet", "paths": [str(data / "optional_pq")],
                                     "fields": optional(PQ_FIELDS, {"caption"})})
    assert [it["caption"] for it in epoch(server, "opt_pq", "opt-pq", fields=True)] == [caption(0), None]
    # The image and the class cannot be optional.
    status, body = post(server["url"], "/v1/datasets", {"name": "opt_image", "source": {
        "kind": "tar_shards", "paths": [str(folder)], "fields": optional(WDS_FIELDS, {"image"})}})
    assert status == 400 and "only small fields" in body["error"]["message"], body
