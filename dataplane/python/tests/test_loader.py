"""joader.Loader against a fake REST server that hands out a fixture writer's ring."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import joader
from conftest import pattern


class FakeServer:
    def __init__(self, reply: Tuple[int, Dict[str, Any]]) -> None:
        self.reply = reply
        self.requests: List[Tuple[str, Dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                outer.requests.append((self.path, json.loads(self.rfile.read(n))))
                self.answer(*outer.reply)

            def do_GET(self) -> None:  # noqa: N802
                # The dataset's view (the Loader reads its source's fields): an image folder,
                # or the reply's error, as a server without the dataset answers both.
                status, body = outer.reply
                if status < 400:
                    name = self.path.rsplit("/", 1)[-1]
                    body = {"name": name, "state": "ready", "source": {"kind": "image_folder", "path": "/d"}}
                self.answer(status, body)

            def answer(self, status: int, body: Dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def registration(instance: str, ring: str, rank: int = 0, world: int = 1) -> Dict[str, Any]:
    return {
        "job": {"name": "j", "dataset": "d", "batch_size": 4, "seed": 3, "world_size": world},
        "layout_version": joader.LAYOUT_VERSION,
        "ranks": [
            {"rank": rank, "instance": instance, "data_segment": f"joader-{instance}-data",
             "ring": ring, "ring_segment": f"joader-{instance}-ring-{ring}"}
        ],
    }


@pytest.fixture
def fake():
    servers: List[FakeServer] = []

    def make(reply):
        s = FakeServer(reply)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_loader_registers_and_iterates_epochs(writer, fake, monkeypatch):
    w = writer(rings="j.r1", elements=10, height=4, width=5, epochs=2, capacity=8)
    srv = fake((201, registration(w.instance, "j.r1", rank=1, world=2)))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = joader.Loader(server=srv.url, dataset="d", job="j", batch_size=4, seed=3,
                           subset=range(0, 10), pipeline={"resize": [4, 5]}, epochs=2)
    path, body = srv.requests[0]
    assert path == "/v1/jobs"
    assert body["name"] == "j" and body["dataset"] == "d" and body["batch_size"] == 4 and body["seed"] == 3
    assert body["rank"] == 1 and body["world_size"] == 2 and body["epochs"] == 2
    assert body["subset"] == {"start": 0, "end": 10}
    assert body["pipeline"] == {"resize": [4, 5]}
    assert body["client"]["layout_version"] == joader.LAYOUT_VERSION
    for epoch in range(2):
        sizes, ids = [], []
        for images, labels in loader:
            assert images.dtype == np.uint8 and labels.dtype == np.int64
            assert images.shape[1:] == (4, 5, 3)
            sizes.append(len(labels))
            for img, lab in zip(images, labels):
                ids.append(int(lab) - 1000)
                np.testing.assert_array_equal(img, pattern(int(lab) - 1000, (4, 5, 3)))
        assert sizes == [4, 4, 2], f"epoch {epoch}"
        assert sorted(ids) == list(range(10))
    assert list(loader) == [] and loader.finished
    loader.close()


def test_loader_drop_last_and_transform(writer, fake):
    w = writer(rings="t", elements=10, height=8, width=8, capacity=16)
    srv = fake((200, registration(w.instance, "t")))
    loader = joader.Loader(server=srv.url, dataset="d", job="t", batch_size=4, drop_last=True,
                           transform=joader.RandomResizedCrop(3), rank=0, world_size=1)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(4, 3, 3, 3), (4, 3, 3, 3)]
    loader.close()


def test_loader_callable_transform(writer, fake):
    w = writer(rings="c", elements=3)
    srv = fake((200, registration(w.instance, "c")))
    with joader.Loader(server=srv.url, dataset="d", job="c", batch_size=8,
                       transform=lambda x, y: (x.astype(np.float32) / 255, y)) as loader:
        (x, y), = list(loader)
        assert x.dtype == np.float32 and x.shape == (3, 4, 5, 3)


def test_loader_reports_server_errors(fake):
    srv = fake((404, {"error": {"code": "dataset_not_found", "message": "no dataset 'x'"}}))
    with pytest.raises(joader.ServerError) as e:
        joader.Loader(server=srv.url, dataset="x", job="j", batch_size=4)
    assert e.value.code == "dataset_not_found"
    assert e.value.status == 404
    assert "no dataset" in e.value.message
    assert isinstance(e.value, joader.JoaderError)


def test_loader_unreachable_server():
    with pytest.raises(joader.ServerError) as e:
        joader.Loader(server="http://127.0.0.1:9", dataset="x", job="j", batch_size=4, request_timeout=2)
    assert e.value.code == "server_unreachable"


def test_loader_element_errors(writer, fake):
    w = writer(rings="e", elements=6, error_every=3)
    srv = fake((200, registration(w.instance, "e")))
    loader = joader.Loader(server=srv.url, dataset="d", job="e", batch_size=2)
    with pytest.raises(joader.ElementLoadError) as e:
        list(loader)
    assert e.value.code == "element_failed"
    assert e.value.failures[0].element_id == 2
    loader.close()

    w2 = writer(rings="s", elements=6, error_every=3, inst=w.instance + "b")
    srv2 = fake((200, registration(w2.instance, "s")))
    with joader.Loader(server=srv2.url, dataset="d", job="s", batch_size=2, on_error="skip") as loader:
        labels = np.concatenate([y for _, y in loader])
        assert sorted(labels - 1000) == [0, 1, 3, 4]
        assert [f.element_id for f in loader.failures] == [2, 5]


def test_loader_validates_arguments():
    with pytest.raises(ValueError):
        joader.Loader(server="http://x", dataset="", batch_size=1)
    with pytest.raises(ValueError):
        joader.Loader(server="http://x", dataset="d", batch_size=1, rank=2, world_size=2)


def test_prefetched_batches_never_change_under_the_user(writer, fake):
    # Every batch is kept while the prefetch thread goes on: each must still hold its own
    # elements at the end (a pooled buffer is reused only once nothing refers to it).
    w = writer(rings="k", elements=30, height=4, width=5, capacity=16)
    srv = fake((200, registration(w.instance, "k")))
    with joader.Loader(server=srv.url, dataset="d", job="k", batch_size=3, prefetch=2) as loader:
        kept = list(loader)
        assert sum(len(y) for _, y in kept) == 30
        assert type(kept[0][0].base).__name__ == "Lease"
        for images, labels in kept:
            for img, lab in zip(images, labels):
                np.testing.assert_array_equal(img, pattern(int(lab) - 1000, (4, 5, 3)))
        assert loader.buffers_allocated >= 10


def test_prefetch_reuses_buffers_that_were_released(writer, fake):
    w = writer(rings="u", elements=40, height=4, width=5, capacity=16)
    srv = fake((200, registration(w.instance, "u")))
    with joader.Loader(server=srv.url, dataset="d", job="u", batch_size=4, prefetch=2) as loader:
        seen = []
        for images, labels in loader:
            for img, lab in zip(images, labels):
                np.testing.assert_array_equal(img, pattern(int(lab) - 1000, (4, 5, 3)))
            seen.extend(int(v) for v in labels)
            del images, img
        assert sorted(seen) == list(range(1000, 1040))
        # The prefetch depth, the batch being handed over and the one just released.
        assert loader.buffers_allocated <= 4


def test_float_output_is_normalized_nchw(writer, fake):
    w = writer(rings="f", elements=6, height=4, width=5, capacity=16)
    srv = fake((200, registration(w.instance, "f")))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    with joader.Loader(server=srv.url, dataset="d", job="f", batch_size=4, mean=mean, std=std) as loader:
        n = 0
        for images, labels in loader:
            assert images.dtype == np.float32 and images.shape[1:] == (3, 4, 5)
            for img, lab in zip(images, labels):
                ref = pattern(int(lab) - 1000, (4, 5, 3)).astype(np.float32) / 255
                ref = ((ref - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)
                np.testing.assert_allclose(img, ref, rtol=0, atol=1e-6)
                n += 1
        assert n == 6
    with pytest.raises(ValueError):
        joader.Loader(server=srv.url, dataset="d", job="f", batch_size=4, mean=mean)


def test_augmented_batches_equal_the_per_item_transform(writer, fake):
    w = writer(rings="a", elements=9, height=12, width=16, capacity=16)
    srv = fake((200, registration(w.instance, "a")))
    aug = joader.RandomResizedCrop((6, 7))
    with joader.Loader(server=srv.url, dataset="d", job="a", batch_size=4, seed=11, transform=aug,
                       threads=2) as loader:
        n = 0
        for images, labels in loader:
            assert images.shape[1:] == (6, 7, 3)
            for position, (img, lab) in enumerate(zip(images, labels), start=n):
                src = pattern(int(lab) - 1000, (12, 16, 3))
                np.testing.assert_array_equal(img, aug.apply(src, seed=11, epoch=0, position=position))
            n += len(labels)
        assert n == 9


def test_stage_cpu_names_where_the_prefetch_spent_its_cpu(writer, fake):
    """``Loader.stage_cpu()``: the prefetch threads' CPU by stage, growing as batches are
    prepared, with the crop and the normalization charged to their own stages."""
    w = writer(rings="s", elements=64, height=96, width=128, capacity=64)
    srv = fake((200, registration(w.instance, "s")))
    aug = joader.RandomResizedCrop((64, 64))
    with joader.Loader(server=srv.url, dataset="d", job="s", batch_size=16, transform=aug,
                       mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)) as loader:
        before = loader.stage_cpu()
        n = sum(len(labels) for _, labels in loader)
        after = loader.stage_cpu()
    assert n == 64
    assert isinstance(after, dict) and all(isinstance(v, float) for v in after.values())
    for stage in ("wait", "copy", "crop_resize", "normalize", "handover"):
        assert stage in after, after
        assert after[stage] >= before.get(stage, 0.0), (stage, before, after)
    # 64 crops of 64x64 and their normalization took some CPU each.
    assert after["crop_resize"] > 0.0 and after["normalize"] > 0.0, after


def test_states_name_their_ranks_and_only_complete_ones_resume_elsewhere():
    def state(ranks, world=3, epoch=1):
        return {"job": "j", "epoch": epoch, "consumed": "", "world_size": world, "ranks": ranks}

    merged = joader.merge_states([state([2]), state([0]), state([1])])
    assert merged["ranks"] == [0, 1, 2] and merged["world_size"] == 3
    for world in (1, 2, 3, 7):  # a complete state resumes at any world size
        joader.check_resumable(merged, world)
    with pytest.raises(ValueError, match=r"rank\(s\) 1 missing"):
        joader.merge_states([state([0]), state([2])])
    with pytest.raises(ValueError, match="more than one"):
        joader.merge_states([state([0]), state([0]), state([1, 2])])
    with pytest.raises(ValueError, match="different epochs"):
        joader.merge_states([state([0], epoch=0), state([1, 2])])
    with pytest.raises(ValueError, match="different world sizes"):
        joader.merge_states([state([0], world=2), state([1, 2])])
    with pytest.raises(ValueError, match=r"rank\(s\) 0, 2 missing"):
        joader.check_resumable(state([1]), 3)
    # Refused before anything is registered (the server is not reachable here).
    with pytest.raises(ValueError, match=r"rank\(s\) 1, 2 missing"):
        joader.Loader(server="http://127.0.0.1:9", dataset="d", batch_size=1, rank=0, world_size=1,
                      resume=state([0]))
    # An older client's state, without ranks: only at its own world size.
    old = {"job": "j", "epoch": 0, "consumed": "", "world_size": 2}
    joader.check_resumable(old, 2)
    with pytest.raises(ValueError, match="names no ranks"):
        joader.check_resumable(old, 3)


def test_states_carry_the_dataset_fingerprint_to_the_server(writer):
    w = writer(rings="fp,fa,fb", elements=6, epochs=1)

    def reg(ring: str) -> Dict[str, Any]:
        r = registration(w.instance, ring)
        r["job"]["dataset_fingerprint"] = "6:00112233aabbccdd"
        return r

    srv = FakeServer((200, reg("fp")))
    try:
        loader = joader.Loader(server=srv.url, dataset="d", job="fp", batch_size=3)
        state = loader.state_dict()
        assert state["dataset_fingerprint"] == "6:00112233aabbccdd"
        loader.close()
        # Sent back with a resume, and the explicit permission only when asked for.
        for allow, ring in ((False, "fa"), (True, "fb")):
            srv.reply = (200, reg(ring))
            again = joader.Loader(server=srv.url, dataset="d", job="fp", batch_size=3, resume=state,
                                  allow_changed_dataset=allow)
            again.close()
            body = srv.requests[-1][1]
            assert body["resume"]["dataset_fingerprint"] == "6:00112233aabbccdd"
            assert body["resume"].get("allow_changed_dataset", False) is allow
    finally:
        srv.close()
    # Ranks saved on different versions of the dataset do not merge.
    a = {**state, "ranks": [0], "world_size": 2}
    b = {**state, "ranks": [1], "world_size": 2, "dataset_fingerprint": "7:ffeeddccbbaa9988"}
    with pytest.raises(ValueError, match="different versions of the dataset"):
        joader.merge_states([a, b])
    assert joader.merge_states([a, {**b, "dataset_fingerprint": a["dataset_fingerprint"]}])["ranks"] == [0, 1]


def test_a_forked_child_allocates_in_the_extension_while_the_prefetch_runs(writer, fake):
    # The extension allocates with mimalloc 2 (lib.rs), which registers no fork handlers; a
    # process may fork while the Loader's augmentation threads start, crop and end (a
    # DataLoader's workers, `multiprocessing`), and the child's own crops must then allocate and
    # free in the extension without hanging.
    w = writer(rings="f", elements=64, height=64, width=80, epochs=4, capacity=16)
    srv = fake((200, registration(w.instance, "f")))
    aug = joader.RandomResizedCrop(32)
    image = pattern(7, (64, 80, 3))
    expected = aug.apply(image, seed=5, position=2)
    with joader.Loader(server=srv.url, dataset="d", job="f", batch_size=4, epochs=4,
                       transform=aug, rank=0, world_size=1) as loader:
        batches = iter(loader)
        for _ in range(12):
            next(batches)  # the prefetch keeps cropping the next batches meanwhile
            pid = os.fork()
            if pid == 0:
                ok = all(np.array_equal(aug.apply(image, seed=5, position=2), expected) for _ in range(20))
                os._exit(0 if ok else 3)
            deadline = time.monotonic() + 20
            while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)
            if done == (0, 0):
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("a forked child hung in the extension")
            assert os.waitstatus_to_exitcode(done[1]) == 0
