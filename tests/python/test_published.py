"""Datasets as they are published (issue 44), through a real `joader serve`: a Hugging Face
dataset folder written by pyarrow as `datasets` uploads it (`data/<split>-NNNNN-of-NNNNN.parquet`,
ClassLabel metadata, a dataset card) read by `split`, WebDataset shards named by brace ranges
and glob patterns, and the 400 a pattern or split that matches nothing gets, naming it."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import conftest
from conftest import get, need, post, start_serve

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
CLASSES = ["angular_leaf_spot", "bean_rust", "healthy"]
#: Rows per file of the Hub folder: train in two files, validation and test in one each.
FILES = {"train-00000-of-00002": 5, "train-00001-of-00002": 4, "validation-00000-of-00001": 3,
         "test-00000-of-00001": 2}
SHARDS, PER_SHARD = 6, 3


def create(url: str, name: str, source: Dict[str, Any]) -> Dict[str, Any]:
    """Creates a dataset and returns its view once ready."""
    view = conftest.create(url, name, source)
    assert view["state"] == "ready", view
    return view


def labels_of_an_epoch(url: str, dataset: str, job: str) -> List[int]:
    import joader
    labels: List[int] = []
    with joader.Loader(server=url, dataset=dataset, job=job, batch_size=4,
                       transform=joader.RandomResizedCrop(16)) as loader:
        for _, y in loader:
            labels += [int(v) for v in y]
    return sorted(labels)


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    pa = need("pyarrow", "a Hugging Face dataset folder")
    pq = need("pyarrow.parquet", "a Hugging Face dataset folder")
    tmp = Path(tempfile.mkdtemp(prefix="joader-published-"))
    data = tmp / "data"
    subprocess.run([str(BIN), "gen-dataset", "--out", str(data / "imgs"), "--classes", "3", "--per-class", "6",
                    "--width", "40", "--height", "32"], check=True, capture_output=True)
    images = sorted((data / "imgs").rglob("*.jpg"))
    # The Hub folder, as `datasets.push_to_hub` lays it out and `snapshot_download` fetches it.
    beans = data / "beans"
    (beans / "data").mkdir(parents=True)
    (beans / "README.md").write_text("---\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n---\n# beans\n")
    features = {"image": {"_type": "Image"}, "labels": {"names": CLASSES, "_type": "ClassLabel"}}
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("labels", pa.int64())]).with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    expected: Dict[str, List[int]] = {}
    i = 0
    for name, rows in FILES.items():
        table = [{"image": {"bytes": images[i + r].read_bytes(), "path": images[i + r].name}, "labels": (i + r) % 3}
                 for r in range(rows)]
        expected.setdefault(name.split("-")[0], []).extend(r["labels"] for r in table)  # type: ignore[misc]
        pq.write_table(pa.Table.from_pylist(table, schema=schema), beans / "data" / f"{name}.parquet",
                       compression="zstd")
        i += rows
    # WebDataset shards as webdataset.TarWriter names members.
    wds = data / "wds"
    wds.mkdir()
    for s in range(SHARDS):
        with tarfile.open(wds / f"shards-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(PER_SHARD):
                for ext, payload in [("jpg", images[(s * PER_SHARD + k) % len(images)].read_bytes()),
                                     ("cls", str(s).encode())]:
                    info = tarfile.TarInfo(f"s{s:02d}k{k}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    instance = f"published_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"), "--allowed-root",
                                       str(data), "--cache-bytes", str(32 << 20)])
    yield {"url": url, "data": data, "expected": {k: sorted(v) for k, v in expected.items()}}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def test_a_hub_folder_is_read_by_split(server: Dict[str, Any]) -> None:
    url, beans = server["url"], server["data"] / "beans"
    for split in ["train", "validation", "test"]:
        view = create(url, f"beans-{split}", {"kind": "parquet", "paths": [str(beans)], "split": split})
        want = server["expected"][split]
        assert view["items"] == len(want), view
        assert view["classes"] == CLASSES
        assert labels_of_an_epoch(url, f"beans-{split}", f"j-{split}") == want
    # `val` is a name the Hub gives the validation split too; a glob names the same files.
    assert create(url, "beans-val", {"kind": "parquet", "paths": [str(beans)], "split": "val"})["items"] == 3
    view = create(url, "beans-glob", {"kind": "parquet", "paths": [str(beans / "data" / "train-*.parquet")]})
    assert view["items"] == len(server["expected"]["train"])


def test_shards_are_named_by_ranges_and_patterns(server: Dict[str, Any]) -> None:
    url, wds = server["url"], server["data"] / "wds"
    view = create(url, "wds-range", {"kind": "tar_shards", "paths": [str(wds / "shards-{000001..000004}.tar")]})
    assert view["items"] == 4 * PER_SHARD
    assert labels_of_an_epoch(url, "wds-range", "j-range") == sorted(s for s in range(1, 5) for _ in range(PER_SHARD))
    view = create(url, "wds-glob", {"kind": "tar_shards", "paths": [str(wds / "shards-*.tar")]})
    assert view["items"] == SHARDS * PER_SHARD


def test_what_matches_nothing_is_a_400_naming_it(server: Dict[str, Any]) -> None:
    url, data = server["url"], server["data"]
    cases = [
        ({"kind": "tar_shards", "paths": [str(data / "wds" / "train-*.tar")]}, "train-*.tar"),
        ({"kind": "parquet", "paths": [str(data / "beans")], "split": "unlabeled"}, "split `unlabeled`"),
        ({"kind": "tar_shards", "paths": [str(data / "wds" / "shards-{000003..000001}.tar")]}, "expand to no path"),
    ]
    for source, named in cases:
        status, body = post(url, "/v1/datasets", {"name": "nothing", "source": source})
        assert status == 400, body
        assert body["error"]["code"] == "invalid_request", body
        assert named in body["error"]["message"], body
    status, body = post(url, "/v1/datasets", {"name": "nothing", "source": {
        "kind": "tar_shards", "paths": ["/etc/*.tar"]}})
    assert status == 403, body


def test_manifests_quote_as_csv_does_and_tab_separated_ones_are_read(server: Dict[str, Any]) -> None:
    import csv
    url, data = server["url"], server["data"]
    images = sorted((data / "imgs").rglob("*.jpg"))[:4]
    odd = data / "odd"
    odd.mkdir(exist_ok=True)
    # File names a CSV must quote: a comma, a quote, a line break.
    names = ["a, b.jpg", 'say "cheese".jpg', "two\nlines.jpg", "plain.jpg"]
    for name, src in zip(names, images):
        (odd / name).write_bytes(src.read_bytes())
    with open(data / "odd.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        w.writerows([[f"odd/{n}", i] for i, n in enumerate(names)])
    with open(data / "odd.tsv", "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["path", "label"])
        w.writerows([[f"odd/{n}", i] for i, n in enumerate(names)])
    (data / "odd.txt").write_bytes((data / "odd.tsv").read_bytes())
    for name, source in [("csv", {"kind": "manifest", "path": str(data / "odd.csv")}),
                         ("tsv", {"kind": "manifest", "path": str(data / "odd.tsv")}),
                         ("txt", {"kind": "manifest", "path": str(data / "odd.txt"), "format": "tsv"})]:
        view = create(url, f"manifest-{name}", source)
        assert view["items"] == len(names), view
        assert labels_of_an_epoch(url, f"manifest-{name}", f"j-{name}") == list(range(len(names)))


def test_classes_stored_as_names(server: Dict[str, Any]) -> None:
    import joader
    pa = need("pyarrow", "a string class column")
    pq = need("pyarrow.parquet", "a string class column")
    url, data = server["url"], server["data"]
    images = sorted((data / "imgs").rglob("*.jpg"))
    names: List[Any] = ["dog", "cat", "dog", "bird", "cat", None]
    folder = data / "named"
    folder.mkdir()
    rows = [{"image": {"bytes": p.read_bytes(), "path": p.name}, "label": n} for p, n in zip(images, names)]
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "a.parquet", row_group_size=2)
    classes = sorted({n for n in names if n is not None})
    view = create(url, "named-parquet", {"kind": "parquet", "paths": [str(folder / "a.parquet")]})
    assert view["classes"] == classes, view
    # A null cell is an unlabelled row: -1.
    want = sorted(-1 if n is None else classes.index(n) for n in names)
    assert labels_of_an_epoch(url, "named-parquet", "j-named") == want
    with joader.Loader(server=url, dataset="named-parquet", job="j-classes", batch_size=6) as loader:
        assert loader.classes == classes
    # Integers in one file, texts in another: refused, naming both.
    ints = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.int64())])
    pq.write_table(pa.Table.from_pylist([{"image": rows[0]["image"], "label": 1}], schema=ints), folder / "b.parquet")
    status, body = post(url, "/v1/datasets", {"name": "mixed", "source": {"kind": "parquet", "paths": [str(folder)]}})
    assert status in (200, 201, 202), body
    while (view := get(url, "/v1/datasets/mixed"))["state"] == "indexing":
        time.sleep(0.05)
    assert view["state"] == "failed" and "holds integers" in view["error"], view
    # WebDataset class members that hold names.
    with tarfile.open(data / "named.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for k, (p, n) in enumerate(zip(images, names[:5])):
            for ext, payload in [("jpg", p.read_bytes()), ("cls", n.encode())]:
                info = tarfile.TarInfo(f"k{k}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    view = create(url, "named-shards", {"kind": "tar_shards", "paths": [str(data / "named.tar")]})
    assert view["classes"] == classes, view
    assert labels_of_an_epoch(url, "named-shards", "j-named-shards") == sorted(classes.index(n) for n in names[:5])
