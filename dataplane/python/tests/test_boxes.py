"""Boxes move with the pixels: `joader.boxes` against the native crop itself.

The reference is independent of the box arithmetic: a box is painted white on a black image,
the image goes through the native RandomResizedCrop + flip (`RandomResizedCrop.apply`, the
loader's own crop), and the painted region's bounds in the output are compared with the
transformed box. Random images, boxes, output sizes and draws, boxes partly and wholly outside
the crop included."""

from __future__ import annotations

import numpy as np
import pytest

import joader
from joader.boxes import crop_boxes, resize_boxes

#: The painted edge lands within half a pixel of the box edge (the threshold at mid-grey of a
#: bilinear, antialiased resize); a wrong scale, offset or flip misses by far more.
EDGE_TOLERANCE = 0.75


def _painted(h: int, w: int, box: tuple[int, int, int, int]) -> np.ndarray:
    x1, y1, x2, y2 = box
    img = np.zeros((h, w, 3), np.uint8)
    img[y1:y2, x1:x2] = 255
    return img


def test_boxes_follow_the_native_crop_and_flip() -> None:
    rng = np.random.default_rng(20261125)
    checked = dropped = flipped = partly_outside = 0
    for trial in range(600):
        h, w = (int(v) for v in rng.integers(40, 200, 2))
        oh, ow = (int(v) for v in rng.integers(20, 80, 2))
        x1, x2 = sorted(int(v) for v in rng.integers(0, w + 1, 2))
        y1, y2 = sorted(int(v) for v in rng.integers(0, h + 1, 2))
        if x2 - x1 < 1 or y2 - y1 < 1:
            continue
        crop = joader.RandomResizedCrop((oh, ow))
        out = crop.apply(_painted(h, w, (x1, y1, x2, y2)), seed=7, epoch=1, position=trial)
        lit = out[..., 0] > 127
        boxes, keep = crop.boxes(np.array([[x1, y1, x2, y2]]), h, w, seed=7, epoch=1, position=trial)
        top, left, wh, ww, flip = crop.draw(h, w, seed=7, epoch=1, position=trial)
        if len(keep) == 0:
            # Wholly outside the window (or clipped to a line): nothing of it is in the output.
            assert min(x2, left + ww) - max(x1, left) <= 0 or min(y2, top + wh) - max(y1, top) <= 0
            assert not lit.any(), (trial, (x1, y1, x2, y2), (top, left, wh, ww))
            dropped += 1
            continue
        assert keep.tolist() == [0]
        bx1, by1, bx2, by2 = boxes[0]
        assert 0 <= bx1 < bx2 <= ow and 0 <= by1 < by2 <= oh
        if bx2 - bx1 < 3 or by2 - by1 < 3:
            continue  # too thin for its painted bounds to be read back
        ys, xs = np.nonzero(lit)
        assert len(xs) > 0, (trial, boxes)
        err = max(abs(xs.min() - bx1), abs(xs.max() + 1 - bx2), abs(ys.min() - by1), abs(ys.max() + 1 - by2))
        assert err <= EDGE_TOLERANCE, (trial, (x1, y1, x2, y2), (top, left, wh, ww, flip), boxes, err)
        checked += 1
        flipped += bool(flip)
        partly_outside += x1 < left or y1 < top or x2 > left + ww or y2 > top + wh
    # The draws covered every case the test is about.
    assert checked >= 200 and dropped >= 10 and flipped >= 50 and partly_outside >= 50, \
        (checked, dropped, flipped, partly_outside)


def test_several_boxes_keep_their_order_and_drop_with_their_categories() -> None:
    # Window rows 10..50, columns 20..80 of a 100 x 100 image, resized to 20 x 30, flipped.
    boxes = np.array([
        [0, 0, 10, 10],      # wholly outside (left of and above the window)
        [30, 20, 50, 40],    # inside
        [70, 40, 95, 60],    # partly outside (right, bottom)
        [20, 50, 80, 70],    # touches the window's bottom edge only: no area left
    ], dtype=np.float64)
    cats = np.array([3, 1, 4, 1])
    out, keep = crop_boxes(boxes, (10, 20, 40, 60), True, (20, 30))
    assert keep.tolist() == [1, 2]
    assert cats[keep].tolist() == [1, 4]
    # x scale 30/60 = 0.5, y scale 20/40 = 0.5, then x -> 30 - x.
    np.testing.assert_allclose(out, [[30 - 15, 5, 30 - 5, 15], [30 - 30, 15, 30 - 25, 20]])


def test_xywh_equals_xyxy_and_source_size_scales_first() -> None:
    rng = np.random.default_rng(3)
    xy = rng.uniform(0, 300, (50, 2))
    wh = rng.uniform(1, 200, (50, 2))
    xywh = np.hstack([xy, wh])
    xyxy = np.hstack([xy, xy + wh])
    window, size = (30, 40, 150, 120), (64, 48)
    a, ka = crop_boxes(xyxy, window, False, size)
    b, kb = crop_boxes(xywh, window, False, size, fmt="xywh")
    assert ka.tolist() == kb.tolist()
    np.testing.assert_allclose(a[:, 2:] - a[:, :2], b[:, 2:])
    # Boxes on a 500 x 400 photo whose cached copy is 250 x 200: halved, then cropped.
    c, kc = crop_boxes(xyxy * 2, window, False, size, image_size=(250, 200), source_size=(500, 400))
    assert kc.tolist() == ka.tolist()
    np.testing.assert_allclose(c, a)
    np.testing.assert_allclose(resize_boxes(xywh, (300, 400), (150, 100), fmt="xywh"),
                               xywh * [0.25, 0.5, 0.25, 0.5])


def test_empty_and_malformed_boxes() -> None:
    out, keep = crop_boxes(np.zeros((0, 4)), (0, 0, 10, 10), True, (5, 5))
    assert out.shape == (0, 4) and keep.shape == (0,)
    out, keep = crop_boxes([], (0, 0, 10, 10), False, (5, 5))
    assert out.shape == (0, 4)
    with pytest.raises(ValueError, match="shape"):
        crop_boxes(np.zeros((3, 5)), (0, 0, 10, 10), False, (5, 5))
    with pytest.raises(ValueError, match="format"):
        crop_boxes(np.zeros((1, 4)), (0, 0, 10, 10), False, (5, 5), fmt="cxcywh")
    with pytest.raises(ValueError, match="finite"):
        crop_boxes(np.array([[0, 0, np.nan, 1]]), (0, 0, 10, 10), False, (5, 5))
    with pytest.raises(ValueError, match="window"):
        crop_boxes(np.zeros((1, 4)), (0, 0, 0, 10), False, (5, 5))
    with pytest.raises(ValueError, match="image_size"):
        crop_boxes(np.zeros((1, 4)), (0, 0, 10, 10), False, (5, 5), source_size=(20, 20))


def test_declared_json_boxes_drop_their_items_and_parallel_lists() -> None:
    from joader.boxes import keep_entries, move_field
    # A 100 x 100 image cached as it is; the window keeps the left half, no flip, same size.
    window, size = (0, 0, 100, 50), (100, 50)
    coco = {"image_id": 9, "annotations": [
        {"bbox": [60, 10, 20, 20], "category_id": 1},   # wholly right of the window: dropped
        {"bbox": [10, 10, 20, 20], "category_id": 2},   # inside
        {"bbox": [40, 0, 20, 10], "category_id": 3},    # cut at the window's right edge
    ]}
    spec = {"kind": "json", "boxes": {"format": "xywh", "path": "annotations.bbox"}}
    out, keep, n = move_field(coco, spec, (100, 100), (100, 100), None, window, False, size)
    assert (keep.tolist(), n) == ([1, 2], 3)
    assert out["image_id"] == 9 and [a["category_id"] for a in out["annotations"]] == [2, 3]
    np.testing.assert_allclose([a["bbox"] for a in out["annotations"]], [[10, 10, 20, 20], [40, 0, 10, 10]])
    assert len(coco["annotations"]) == 3  # the input is not changed
    # Hugging Face's `objects` struct: lists beside the boxes with as many items lose the same.
    hf = {"bbox": [[60, 10, 20, 20], [10, 10, 20, 20]], "category": [1, 2], "area": [400, 400], "note": "x"}
    spec = {"kind": "json", "boxes": {"format": "xywh", "path": "bbox"}}
    out, keep, _ = move_field(hf, spec, (100, 100), (100, 100), None, window, True, size)
    assert out["category"] == [2] and out["area"] == [400] and out["note"] == "x"
    np.testing.assert_allclose(out["bbox"], [[50 - 30, 10, 20, 20]])  # flipped in the 50-wide output
    # A bare list of boxes.
    out, keep, _ = move_field([[60, 10, 80, 30], [0, 0, 5, 5]], {"boxes": "xyxy"}, (100, 100), (100, 100),
                              None, window, False, size)
    assert out == [[0.0, 0.0, 5.0, 5.0]] and keep.tolist() == [1]
    # A `with` field lists one entry per box.
    assert keep_entries(np.array([7, 8]), keep, 2, "cats").tolist() == [8]
    assert keep_entries(["a", "b"], keep, 2, "names") == ["b"]
    with pytest.raises(ValueError, match="'cats' has 3 entries for 2 boxes"):
        keep_entries(np.array([7, 8, 9]), keep, 2, "cats")
    with pytest.raises(ValueError, match="'meta' is dict"):
        keep_entries({"a": 1}, keep, 2, "meta")


def test_source_boxes_are_scaled_and_shifted_as_the_pipeline_resized_and_cropped() -> None:
    from joader.boxes import source_to_cached
    box = np.array([[100, 50, 300, 150]], np.float64)
    # 400 x 300 (w x h) resized to shorter 150: 200 x 150, then a center crop of 100 x 120.
    got = source_to_cached(box, (300, 400), (100, 120), {"kind": "decode", "resize_shorter": 150,
                                                         "center_crop": [100, 120]})
    np.testing.assert_allclose(got, [[50 - 40, 25 - 25, 150 - 40, 75 - 25]])
    # Without a center crop the cached size gives the scale; raw bytes or an unknown source move nothing.
    got = source_to_cached(box, (300, 400), (150, 200), {"kind": "decode", "resize_shorter": 150})
    np.testing.assert_allclose(got, [[50, 25, 150, 75]])
    np.testing.assert_allclose(source_to_cached(box, (0, 0), (150, 200), {"kind": "decode"}), box)
    np.testing.assert_allclose(source_to_cached(box, (300, 400), (0, 0), {"kind": "raw"}), box)


def test_resize_is_a_whole_image_crop() -> None:
    r = joader.Resize((20, 30), flip=1.0)
    assert r.draw(50, 70, seed=1, epoch=0, position=3) == (0, 0, 50, 70, True)
    assert joader.Resize((20, 30)).draw(50, 70)[4] is False
    img = np.zeros((50, 70, 3), np.uint8)
    img[:, :7] = 255  # the leftmost tenth, flipped to the rightmost tenth
    out = r.apply(img, seed=1)
    assert out.shape == (20, 30, 3) and out[:, -2:].min() == 255 and out[:, :20].max() == 0
