"""Detection boxes declared in a dataset move with the pixels, through a real `joader serve`.

Each sample is a PNG with up to three boxes painted on black, box k lit in colour channel k
alone, its boxes twice: an `npy` field in the stored image's pixels (`xyxy`) with its
categories in a `with` field (the category of a box is its channel), and a COCO-style `json`
field (`annotations[].bbox`, `xywh`, `category_id`). The server's pipeline resizes (and, in one
job, center-crops) the image, the job's `RandomResizedCrop` or `Resize` crops and flips it;
the reference is the pixels themselves: each box the loader delivers must bound its channel's
lit region in the delivered image, each box it drops must have left nothing lit, and the two
declarations must agree box for box."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
from conftest import start_serve

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
N = 24

FIELDS = {
    "image": {"kind": "image", "from": "png"},
    "boxes": {"kind": "npy", "from": "boxes.npy", "boxes": {"format": "xyxy", "with": ["cats"]}},
    "cats": {"kind": "npy", "from": "cats.npy"},
    "ann": {"kind": "json", "from": "json", "boxes": {"format": "xywh", "path": "annotations.bbox"}},
}

#: Two bilinear, antialiased resizes (the server's, the crop's) each move a painted edge's
#: mid-grey crossing by up to half a pixel of its output; a wrong scale, offset or flip misses
#: by far more.
EDGE_TOLERANCE = 1.5


def png(img: np.ndarray) -> bytes:
    """An RGB8 PNG of ``img`` (lossless, so that painted edges stay where they were)."""
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def sample(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """An image and its boxes (``xyxy``, box k painted in channel k)."""
    h, w = int(rng.integers(60, 120)), int(rng.integers(60, 140))
    img = np.zeros((h, w, 3), np.uint8)
    boxes = []
    for k in range(int(rng.integers(1, 4))):
        x1, y1 = int(rng.integers(0, w - 12)), int(rng.integers(0, h - 12))
        x2, y2 = int(rng.integers(x1 + 12, w + 1)), int(rng.integers(y1 + 12, h + 1))
        img[y1:y2, x1:x2, k] = 255
        boxes.append([x1, y1, x2, y2])
    return img, np.array(boxes, np.float32)


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    tmp = Path(tempfile.mkdtemp(prefix="joader-detection-"))
    data = tmp / "data"
    data.mkdir()
    rng = np.random.default_rng(20261126)
    truth = []
    with tarfile.open(data / "shard-000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(N):
            img, boxes = sample(rng)
            truth.append(boxes)
            ann = {"image_id": i, "annotations": [
                {"bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)], "category_id": k}
                for k, (x1, y1, x2, y2) in enumerate(boxes.tolist())]}
            members = {"png": png(img), "boxes.npy": npy(boxes), "cats.npy": npy(np.arange(len(boxes))),
                       "json": json.dumps(ann).encode()}
            for ext, body in members.items():
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size, info.mtime = len(body), 1_700_000_000
                tar.addfile(info, io.BytesIO(body))
    instance = f"pydetect_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
                                       "--allowed-root", str(data), "--cache-bytes", str(32 << 20)])
    from test_fields import create
    view = create(url, "det", {"kind": "tar_shards", "paths": [str(data)], "fields": FIELDS})
    assert view["state"] == "ready" and view["items"] == N, view
    yield {"url": url, "truth": truth}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def items(server: Dict[str, Any], job: str, transform: Any, pipeline: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One epoch's items, each a dict of its fields, with its element id."""
    import joader
    out = []
    with joader.Loader(server=server["url"], dataset="det", job=job, epochs=1, batch_size=5, seed=3,
                       transform=transform, pipeline=pipeline, fields=True, timeout=60) as loader:
        for batch in loader:
            for k, i in enumerate(loader.last_ids.tolist()):
                out.append({"id": i, **{name: value[k] for name, value in batch.items()}})
    assert sorted(it["id"] for it in out) == list(range(N))
    return out


def lit_bounds(img: np.ndarray, channel: int) -> Optional[Tuple[int, int, int, int]]:
    """``xyxy`` pixel-edge bounds of the channel's pixels above mid-grey, None when none is."""
    ys, xs = np.nonzero(img[..., channel] > 127)
    if len(xs) == 0:
        return None
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def check_items(got: List[Dict[str, Any]], truth: List[np.ndarray], size: Tuple[int, int]) -> Dict[str, int]:
    counts = {"checked": 0, "dropped": 0, "flipped_or_cut": 0}
    for it in got:
        img, boxes, cats, ann = it["image"], it["boxes"], it["cats"], it["ann"]
        assert img.shape[:2] == size
        assert boxes.dtype == np.float32 and boxes.ndim == 2 and boxes.shape[1] == 4
        assert len(cats) == len(boxes) and cats.tolist() == sorted(cats.tolist())
        # The JSON declaration gives the same boxes (xywh), its dropped items gone whole.
        assert [a["category_id"] for a in ann["annotations"]] == cats.tolist()
        assert ann["image_id"] == it["id"]
        as_xyxy = [[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in ann["annotations"])]
        np.testing.assert_allclose(np.array(as_xyxy, np.float64).reshape(-1, 4), boxes, atol=1e-3)
        for box, c in zip(boxes.tolist(), cats.tolist()):
            x1, y1, x2, y2 = box
            assert 0 <= x1 < x2 <= size[1] and 0 <= y1 < y2 <= size[0], box
            if x2 - x1 < 4 or y2 - y1 < 4:
                continue  # too thin for its painted bounds to be read back
            lit = lit_bounds(img, c)
            assert lit is not None, (it["id"], c, box)
            err = max(abs(a - b) for a, b in zip(lit, box))
            assert err <= EDGE_TOLERANCE, (it["id"], c, box, lit)
            counts["checked"] += 1
            orig = truth[it["id"]][c]
            counts["flipped_or_cut"] += int(abs((x2 - x1) / (y2 - y1) - (orig[2] - orig[0]) / (orig[3] - orig[1])) > 0.05)
        for c in set(range(len(truth[it["id"]]))) - set(cats.tolist()):
            counts["dropped"] += 1
            assert lit_bounds(img, c) is None, (it["id"], c, "dropped, yet lit")
    return counts


def test_boxes_follow_the_server_resize_and_the_random_crop(server: Dict[str, Any]) -> None:
    import joader
    got = items(server, "crop", joader.RandomResizedCrop((40, 40), scale=(0.3, 1.0)),
                {"kind": "decode", "resize_shorter": 48})
    counts = check_items(got, server["truth"], (40, 40))
    assert counts["checked"] >= 20 and counts["dropped"] >= 1, counts


def test_resize_keeps_every_box_through_a_center_crop_pipeline(server: Dict[str, Any]) -> None:
    import joader
    # The server's center crop cuts boxes; the whole-image Resize (always flipped) cuts none.
    pipeline = {"kind": "decode", "resize_shorter": 56, "center_crop": [50, 54]}
    got = items(server, "whole", joader.Resize((32, 36), flip=1.0), pipeline)
    counts = check_items(got, server["truth"], (32, 36))
    assert counts["checked"] >= 20, counts
    # Without a crop the boxes are the cached image's, clipped to it.
    plain = items(server, "plain", None, pipeline)
    counts = check_items(plain, server["truth"], (50, 54))
    assert counts["checked"] >= 20, counts


def test_without_the_boxes_field_its_with_field_still_drops_alike(server: Dict[str, Any]) -> None:
    import joader
    crop = joader.RandomResizedCrop((40, 40), scale=(0.3, 1.0))
    dropped = 0
    with joader.Loader(server=server["url"], dataset="det", job="cats", epochs=1, batch_size=5, seed=3,
                       transform=crop, pipeline={"kind": "decode", "resize_shorter": 48},
                       fields=["image", "cats"], timeout=60) as loader:
        for batch in loader:
            assert set(batch) == {"image", "cats"}
            for k, i in enumerate(loader.last_ids.tolist()):
                img, cats = batch["image"][k], batch["cats"][k].tolist()
                for c in range(len(server["truth"][i])):
                    if c in cats:  # a box left with some area leaves some light
                        assert img[..., c].max() > 0, (i, c)
                    else:
                        assert lit_bounds(img, c) is None, (i, c, "dropped, yet lit")
                        dropped += 1
    assert dropped >= 1
