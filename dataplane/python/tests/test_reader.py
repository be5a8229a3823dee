"""The low-level reader against a writer process (the Rust fixture)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import joader
from conftest import pattern

# Timeouts for data that is there or about to be: reaching one is a failure, never waited out.
LONG = 60.0


def test_views_are_zero_copy_and_collate_matches(writer):
    w = writer(elements=10, height=4, width=5)
    with joader.RingReader(w.instance, "r") as r:
        assert r.server_pid == w.pid
        b = r.next_batch(4, timeout=LONG)
        assert len(b) == 4
        assert list(b.element_ids) == [0, 1, 2, 3]
        assert list(b.labels) == [1000, 1001, 1002, 1003]
        assert list(b.positions) == [0, 1, 2, 3]
        views = b.views()
        for i, v in enumerate(views):
            assert v.shape == (4, 5, 3) and v.dtype == np.uint8
            assert not v.flags.writeable
            np.testing.assert_array_equal(v, pattern(i, (4, 5, 3)))
        # Zero-copy: two views of one item share the same address.
        assert b.views()[0].ctypes.data == views[0].ctypes.data
        images, labels = b.collate()
        assert images.shape == (4, 4, 5, 3) and images.flags.c_contiguous
        np.testing.assert_array_equal(images, np.stack(views))
        assert labels.dtype == np.int64 and list(labels) == [1000, 1001, 1002, 1003]
        # Into a caller-provided buffer.
        out = np.zeros((8, 4, 5, 3), np.uint8)
        lab = np.zeros(8, np.int64)
        got, _ = b.collate(out=out, labels_out=lab)
        assert np.shares_memory(got, out)
        np.testing.assert_array_equal(out[:4], images)
        with pytest.raises(ValueError):
            b.collate(out=np.zeros((2, 4, 5, 3), np.uint8))
        with pytest.raises(ValueError):
            b.collate(out=np.zeros((4, 4, 5, 3), np.float32))
        b2 = r.next_batch(100, timeout=LONG)
        assert list(b2.element_ids) == list(range(4, 10))
        assert b2.end_of_epoch == (0, 10)
        # The previous batch was acknowledged by next_batch.
        with pytest.raises(joader.JoaderError) as e:
            b.views()
        assert e.value.code == "batch_released"
        b3 = r.next_batch(10, timeout=LONG)
        assert len(b3) == 0 and b3.end_of_stream


def test_epochs_cover_the_dataset_and_views_survive_close(writer):
    w = writer(elements=7, epochs=3, capacity=4)
    r = joader.RingReader(w.instance, "r")
    seen = {0: [], 1: [], 2: []}
    ends = []
    while True:
        b = r.next_batch(3, timeout=LONG)
        for e, i in zip(b.epochs, b.element_ids):
            seen[int(e)].append(int(i))
        if b.end_of_epoch:
            ends.append(b.end_of_epoch)
        if b.end_of_stream:
            break
    assert ends == [(0, 7), (1, 7), (2, 7)]
    for e in range(3):
        assert sorted(seen[e]) == list(range(7))
    keep = r.next_batch(1, timeout=0.05).views()
    r.close()
    assert keep == [] or keep[0].sum() >= 0  # still mapped, no crash
    with pytest.raises(joader.JoaderError) as e:
        r.next_batch(1)
    assert e.value.code == "reader_closed"


def test_error_records_are_reported(writer):
    w = writer(elements=6, error_every=3)
    with joader.RingReader(w.instance, "r") as r:
        b = r.next_batch(10, timeout=LONG)
        assert list(b.element_ids) == [0, 1, 3, 4]
        assert [(f.element_id, f.code_name, f.position) for f in b.errors] == [(2, "decode", 2), (5, "decode", 5)]
        assert b.end_of_epoch == (0, 6)


def test_timeout_returns_empty_batch_and_releases_the_gil(writer):
    # A writer that waits at least 30 s before its first push: its ring stays empty meanwhile.
    w = writer(elements=1, capacity=1, pace_us=60_000_000)
    r = joader.RingReader(w.instance, "r")
    # A timeout never fires early (monotonic clock), and an empty ring gives an empty batch.
    t0 = time.monotonic()
    assert len(r.next_batch(4, timeout=0.3)) == 0
    assert time.monotonic() - t0 >= 0.29

    # The GIL is released while a reader waits: another thread finishes Python work while the
    # waiter is still blocked. Had the waiter held the GIL, that work could only finish after
    # the wait returned (when the killed writer is noticed), so a GIL held while waiting fails
    # this check whatever the machine's load.
    entered = threading.Event()
    outcome: list = []

    def waiter():
        entered.set()
        try:
            outcome.append(len(r.next_batch(4, timeout=LONG)))
        except joader.JoaderError as e:
            outcome.append(e.code)

    t = threading.Thread(target=waiter)
    t.start()
    entered.wait()
    total = sum(range(2_000_000))  # Python bytecode: needs the GIL
    still_waiting = t.is_alive()
    w.kill()  # ends the wait with server_gone
    t.join()
    r.close()
    assert total > 0
    assert still_waiting, f"the waiter returned ({outcome}) before other Python code could run"
    assert outcome == ["server_gone"], outcome
    # Clean the killed writer's segments the way a restarted server would.
    writer(elements=1, inst=w.instance)


def test_dead_server_is_reported(writer):
    w = writer(elements=4, capacity=4)
    r = joader.RingReader(w.instance, "r")
    assert len(r.next_batch(4, timeout=LONG)) == 4
    w.kill()
    # A reader notices a dead server by itself (liveness is checked while it waits); a generous
    # timeout turns a reader that never notices into a clear failure instead of a hang.
    with pytest.raises(joader.JoaderError) as e:
        r.next_batch(4, timeout=LONG)
        r.next_batch(4, timeout=LONG)
        pytest.fail("the dead server was not noticed before the timeout")
    assert e.value.code == "server_gone"
    assert "exited" in e.value.message
    r.close()
    # Clean the dead writer's segments the way a restarted server would.
    w2 = writer(elements=1, inst=w.instance)
    assert w2.pid != w.pid


def test_open_errors_have_codes(instance):
    with pytest.raises(joader.JoaderError) as e:
        joader.RingReader(instance, "r", open_timeout=0.05)
    assert e.value.code == "segment_not_found"
    with pytest.raises(joader.JoaderError) as e:
        joader.RingReader("bad-name", "r", open_timeout=0.05)
    assert e.value.code == "invalid_name"


def test_augmentation_is_per_seed_and_position(writer):
    w = writer(elements=6, height=12, width=10)
    crop = joader.RandomResizedCrop((6, 5))
    with joader.RingReader(w.instance, "r") as r:
        b = r.next_batch(6, timeout=LONG)
        views = b.views()
        a1, _ = b.collate(transform=crop, seed=1)
        a2, _ = b.collate(transform=crop, seed=1)
        a3, _ = b.collate(transform=crop, seed=2)
        assert a1.shape == (6, 6, 5, 3)
        np.testing.assert_array_equal(a1, a2)
        assert not np.array_equal(a1, a3)
        for k in range(6):
            ref = crop.apply(views[k], seed=1, epoch=int(b.epochs[k]), position=int(b.positions[k]))
            np.testing.assert_array_equal(a1[k], ref)


def test_import_does_not_need_torch():
    code = "import sys, joader; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_killed_python_reader_is_reclaimed_and_others_continue(writer):
    w = writer(rings="victim,other", elements=12, capacity=8, epochs=2)
    code = (
        "import sys, time, joader\n"
        f"r = joader.RingReader({w.instance!r}, 'victim')\n"
        "b = r.next_batch(5, timeout=60)\n"
        "print('TOOK', len(b), flush=True)\n"
        "time.sleep(60)\n"
    )
    victim = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout.readline().strip() == "TOOK 5"
        victim.kill()  # SIGKILL mid-batch
        victim.wait()
        # 5 taken + 3 pushed and not taken: all 8 records' slots come back, no bit stays set.
        assert w.line() == "RECLAIMED victim status=Dead slots=8 still_pinned=0"
    finally:
        victim.kill()
        victim.wait()
    with joader.RingReader(w.instance, "other") as r:
        ids = []
        while True:
            b = r.next_batch(5, timeout=LONG)
            ids += [int(i) for i in b.element_ids]
            if b.end_of_stream:
                break
    assert sorted(ids) == sorted(list(range(12)) * 2)
