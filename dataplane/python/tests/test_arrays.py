"""NumPy arrays across the native boundary: collation checks every output
array (dtype, shape, C-contiguity, writability) and raises ValueError instead of
writing out of bounds; views of shared memory are read-only and own their mapping."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import joader
from conftest import pattern

LONG = 60.0
SHAPE = (4, 4, 5, 3)
CROP = joader.RandomResizedCrop((2, 3))


def read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# Each case: (images, labels, words the message must contain), for the plain
# collate path (aug None, shape SHAPE) and the augmented one (shape (4, 2, 3, 3)).
def bad_cases(shape):
    good_labels = np.zeros(shape[0], np.int64)
    return [
        (np.zeros(shape, np.float32), good_labels, ["images", "dtype"]),
        (np.zeros(shape, np.int8), good_labels, ["images", "dtype"]),
        (np.zeros((shape[0] - 1,) + shape[1:], np.uint8), good_labels, ["images", "shape"]),
        (np.zeros((shape[0] + 1,) + shape[1:], np.uint8), good_labels, ["images", "shape"]),
        (np.zeros((shape[0], int(np.prod(shape[1:]))), np.uint8), good_labels, ["images", "shape"]),
        (np.zeros((shape[0] * 2,) + shape[1:], np.uint8)[::2], good_labels, ["images", "contiguous"]),
        (np.asfortranarray(np.zeros(shape, np.uint8)), good_labels, ["images", "contiguous"]),
        (read_only(np.zeros(shape, np.uint8)), good_labels, ["images", "writeable"]),
        (bytearray(int(np.prod(shape))), good_labels, ["images", "ndarray"]),
        (np.zeros(shape, np.uint8), np.zeros(shape[0], np.int32), ["labels", "dtype"]),
        (np.zeros(shape, np.uint8), np.zeros(shape[0] + 1, np.int64), ["labels", "shape"]),
        (np.zeros(shape, np.uint8), np.zeros((shape[0], 1), np.int64), ["labels", "shape"]),
        (np.zeros(shape, np.uint8), np.zeros(shape[0] * 2, np.int64)[::2], ["labels", "contiguous"]),
        (np.zeros(shape, np.uint8), read_only(np.zeros(shape[0], np.int64)), ["labels", "writeable"]),
    ]


@pytest.mark.parametrize("augmented", [False, True])
def test_native_collate_refuses_unfit_arrays_with_value_error(writer, augmented):
    w = writer(elements=4, height=4, width=5)
    with joader.RingReader(w.instance, "r") as r:
        b = r.next_batch(4, timeout=LONG)
        assert len(b) == 4
        aug = CROP._native() if augmented else None
        shape = (4, 2, 3, 3) if augmented else SHAPE
        for images, labels, words in bad_cases(shape):
            before = images.copy() if isinstance(images, np.ndarray) else None
            with pytest.raises(ValueError) as e:
                r._native.collate_into(b.start, images, labels, aug, 7)
            msg = str(e.value)
            assert all(word in msg for word in words), (words, msg)
            if before is not None:
                np.testing.assert_array_equal(images, before)  # nothing was written
        # The refusals left no borrow behind: the right arrays work.
        images, labels = np.zeros(shape, np.uint8), np.zeros(4, np.int64)
        assert r._native.collate_into(b.start, images, labels, aug, 7) == shape
        assert list(labels) == [1000, 1001, 1002, 1003]
        if augmented:
            np.testing.assert_array_equal(images, b.collate(transform=CROP, seed=7)[0])
        else:
            np.testing.assert_array_equal(images, np.stack([pattern(i, SHAPE[1:]) for i in range(4)]))


def test_batch_collate_refuses_unfit_outputs_with_value_error(writer):
    w = writer(elements=4, height=4, width=5)
    with joader.RingReader(w.instance, "r") as r:
        b = r.next_batch(4, timeout=LONG)
        for out in [
            np.zeros(SHAPE, np.float32),
            np.zeros((8,) + SHAPE[1:], np.uint8)[::2],
            read_only(np.zeros(SHAPE, np.uint8)),
            np.zeros((3,) + SHAPE[1:], np.uint8),
            [0] * 240,
        ]:
            with pytest.raises(ValueError):
                b.collate(out=out)
        for labels_out in [np.zeros(4, np.float64), read_only(np.zeros(4, np.int64)), np.zeros(8, np.int64)[::2]]:
            with pytest.raises(ValueError):
                b.collate(labels_out=labels_out)
        with pytest.raises(ValueError):
            b.collate(out=np.zeros((4, 2, 3, 2), np.uint8), transform=CROP)
        # A larger C-contiguous buffer is fine: the result is a view of its start.
        big, lab = np.zeros(1000, np.uint8), np.zeros(10, np.int64)
        got, got_labels = b.collate(out=big, labels_out=lab)
        assert got.shape == SHAPE and np.shares_memory(got, big)
        np.testing.assert_array_equal(big[:240].reshape(SHAPE), got)
        assert list(lab[:4]) == [1000, 1001, 1002, 1003]


def test_collate_of_a_released_batch_is_refused(writer):
    w = writer(elements=8, height=4, width=5)
    with joader.RingReader(w.instance, "r") as r:
        b = r.next_batch(4, timeout=LONG)
        start = b.start
        r.ack()
        with pytest.raises(joader.JoaderError) as e:
            r._native.collate_into(start, np.zeros(SHAPE, np.uint8), np.zeros(4, np.int64))
        assert e.value.code == "batch_released"
        with pytest.raises(joader.JoaderError) as e:
            r._native.views(start)
        assert e.value.code == "batch_released"


def test_views_are_read_only_and_keep_the_mapping(writer):
    w = writer(elements=3, height=4, width=5)
    r = joader.RingReader(w.instance, "r")
    b = r.next_batch(3, timeout=LONG)
    views = b.views()
    assert [v.shape for v in views] == [(4, 5, 3)] * 3
    for v in views:
        assert not v.flags.writeable
        with pytest.raises(ValueError):
            v[0, 0, 0] = 1
        with pytest.raises(ValueError):
            v.setflags(write=True)  # the base is not a writeable buffer
    first = views[0][1:3]  # a view of a view keeps the mapping too
    del views, b
    r.close()
    gc.collect()
    np.testing.assert_array_equal(first, pattern(0, (4, 5, 3))[1:3])
