"""Boxes that move with the pixels: detection boxes carried through the same
RandomResizedCrop window and horizontal flip that joader applied to their image.

Coordinates are pixel edges (a box ``x1 = 0, x2 = 10`` covers the first ten columns), as in
COCO and torchvision. The crop window is the one `joader.RandomResizedCrop.draw` returns for
the item (drawn natively, the same draws as the loader's crop), on the image the crop was
taken from: the cached image, e.g. shorter side resized to 256. Boxes given in another image's
coordinates (the original photo's, as annotations are) are scaled to it first with
``source_size``.

A box is clipped to the window and then scaled to the output; a box left with no area (wholly
outside the window, or clipped to a line) is dropped, and ``keep`` says which input boxes
remain so that their categories can be dropped with them (``categories[keep]``)::

    top, left, h, w, flip = crop.draw(cached_h, cached_w, seed, epoch, position)
    out, keep = joader.boxes.crop_boxes(boxes, (top, left, h, w), flip, (224, 224),
                                        image_size=(cached_h, cached_w),
                                        source_size=(orig_h, orig_w), fmt="xywh")

`resize_boxes` scales boxes for recipes that keep the whole image (resize only).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["FORMATS", "crop_boxes", "resize_boxes", "source_to_cached", "move"]

#: Box formats: ``xyxy`` (left, top, right, bottom) and ``xywh`` (left, top, width, height:
#: COCO's ``bbox``).
FORMATS = ("xyxy", "xywh")


def _to_xyxy(boxes: np.ndarray, fmt: str) -> np.ndarray:
    if fmt not in FORMATS:
        raise ValueError(f"box format must be one of {FORMATS}, not {fmt!r}")
    b = np.array(boxes, dtype=np.float64, copy=True)
    if b.size == 0:
        b = b.reshape(0, 4)
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"boxes must be an (N, 4) array, got shape {np.shape(boxes)}")
    if not np.isfinite(b).all():
        raise ValueError("boxes must be finite")
    if fmt == "xywh":
        b[:, 2] += b[:, 0]
        b[:, 3] += b[:, 1]
    return b


def _from_xyxy(b: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "xywh":
        b = b.copy()
        b[:, 2] -= b[:, 0]
        b[:, 3] -= b[:, 1]
    return b


def _size(size: Sequence[int], what: str) -> Tuple[int, int]:
    if len(size) != 2 or min(int(size[0]), int(size[1])) <= 0:
        raise ValueError(f"{what} must be (height, width) with both positive, got {tuple(size)}")
    return int(size[0]), int(size[1])


def resize_boxes(boxes: np.ndarray, source_size: Sequence[int], size: Sequence[int],
                 fmt: str = "xyxy") -> np.ndarray:
    """Scales ``(N, 4)`` boxes on a ``source_size`` ``(height, width)`` image to the same image
    resized to ``size``; float64, in ``fmt``."""
    sh, sw = _size(source_size, "source_size")
    th, tw = _size(size, "size")
    b = _to_xyxy(boxes, fmt)
    b[:, [0, 2]] = b[:, [0, 2]] * tw / sw
    b[:, [1, 3]] = b[:, [1, 3]] * th / sh
    return _from_xyxy(b, fmt)


def crop_boxes(boxes: np.ndarray, window: Sequence[int], flip: bool, size: Sequence[int],
               fmt: str = "xyxy", image_size: Sequence[int] | None = None,
               source_size: Sequence[int] | None = None) -> Tuple[np.ndarray, np.ndarray]:
    """Moves ``(N, 4)`` boxes through a crop ``window`` ``(top, left, height, width)``, resized
    to ``size`` ``(height, width)``, then flipped horizontally when ``flip``.

    Returns ``(boxes, keep)``: the boxes that keep an area, float64 in ``fmt`` and in the
    output's coordinates, and the indices of those boxes in the input (int64). With
    ``source_size``, the input boxes are on an image of that size and are first scaled to
    ``image_size``, the image the window was drawn on (required then)."""
    top, left, wh, ww = (int(v) for v in window)
    if wh <= 0 or ww <= 0:
        raise ValueError(f"window must have a positive height and width, got {tuple(window)}")
    oh, ow = _size(size, "size")
    b = _to_xyxy(boxes, fmt)
    if source_size is not None:
        if image_size is None:
            raise ValueError("source_size needs image_size, the size of the image the window was drawn on")
        b = resize_boxes(b, source_size, image_size)
    # Clipped after scaling, so that the window's edges land exactly on the output's.
    b[:, [0, 2]] = np.clip((b[:, [0, 2]] - left) * ow / ww, 0.0, ow)
    b[:, [1, 3]] = np.clip((b[:, [1, 3]] - top) * oh / wh, 0.0, oh)
    keep = np.flatnonzero((b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])).astype(np.int64)
    b = b[keep]
    if flip:
        b[:, [0, 2]] = ow - b[:, [2, 0]]
    return _from_xyxy(b, fmt), keep


def _resized_size(sh: int, sw: int, target: int) -> Tuple[int, int]:
    """``(height, width)`` of a ``sh × sw`` image whose shorter side the server resized to
    ``target`` (its rule: the other side rounded half away from zero, at least 1)."""
    def other(long: int, short: int) -> int:
        return max(1, int(math.floor(long * target / short + 0.5)))
    if sw <= sh:
        return other(sh, sw), target
    return target, other(sw, sh)


def source_to_cached(boxes: np.ndarray, source_size: Sequence[int], cached_size: Sequence[int],
                     pipeline: Optional[Dict[str, Any]], fmt: str = "xyxy") -> np.ndarray:
    """Moves ``(N, 4)`` boxes on the stored image (``source_size``, as the server read it)
    to the image the server cached (``cached_size``) with ``pipeline`` (the job's, e.g.
    ``{"kind": "decode", "resize_shorter": 256, "center_crop": [224, 224]}``): scaled as the
    pipeline resized, shifted by its center crop. Not clipped; float64 ``xyxy``. A raw
    pipeline, or an unknown source size (0), leaves the boxes as they are."""
    b = _to_xyxy(boxes, fmt)
    sh, sw = (int(v) for v in source_size)
    ch, cw = (int(v) for v in cached_size)
    if not pipeline or pipeline.get("kind") != "decode" or min(sh, sw, ch, cw) <= 0:
        return b
    target = pipeline.get("resize_shorter")
    if pipeline.get("center_crop"):
        rh, rw = _resized_size(sh, sw, int(target)) if target else (sh, sw)
    else:
        rh, rw = ch, cw
    top, left = (rh - ch) // 2, (rw - cw) // 2
    b[:, [0, 2]] = b[:, [0, 2]] * rw / sw - left
    b[:, [1, 3]] = b[:, [1, 3]] * rh / sh - top
    return b


def move(boxes: np.ndarray, fmt: str, source_size: Sequence[int], cached_size: Sequence[int],
         pipeline: Optional[Dict[str, Any]], window: Optional[Sequence[int]] = None,
         flip: bool = False, size: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Moves ``(N, 4)`` boxes of the stored image to the delivered one: through the server's
    pipeline (`source_to_cached`), then through the crop ``window`` of the cached image,
    resized to ``size`` and flipped when ``flip`` (`crop_boxes`); without a window, clipped
    to the cached image. Returns ``(boxes, keep)`` as `crop_boxes` does, float64 in ``fmt``."""
    b = source_to_cached(boxes, source_size, cached_size, pipeline, fmt)
    ch, cw = (int(v) for v in cached_size)
    if window is None:
        if min(ch, cw) <= 0:  # raw bytes: no image to clip to
            return _from_xyxy(b, fmt), np.arange(len(b), dtype=np.int64)
        window, flip, size = (0, 0, ch, cw), False, (ch, cw)
    assert size is not None
    out, keep = crop_boxes(b, window, flip, size)
    return _from_xyxy(out, fmt), keep


class _Drop:
    """A list item whose box was dropped (see `_rebuild`)."""


_DROP = _Drop()


def _collect(doc: Any, path: Sequence[str], one: bool, out: List[Any]) -> None:
    """Appends the boxes ``doc`` holds at ``path`` to ``out``: a list of boxes at its end, or
    one box per item when a list was gone through (``one``)."""
    if path and isinstance(doc, list):
        for item in doc:
            _collect(item, path, True, out)
    elif path:
        _collect(doc[path[0]], path[1:], one, out)
    elif one:
        out.append(doc)
    else:
        out.extend(doc)


def _rebuild(doc: Any, path: Sequence[str], one: bool, moved: List[Any]) -> Any:
    """``doc`` with its boxes replaced by the next of ``moved`` (in `_collect`'s order; None:
    dropped): a list item whose box is dropped is dropped, and lists beside a list of boxes,
    with as many items, lose the same items. A list of boxes at the path's end comes back
    with None in the places of the dropped boxes (its object filters it)."""
    if path and isinstance(doc, list):
        items = (_rebuild(item, path, True, moved) for item in doc)
        return [item for item in items if item is not _DROP]
    if path:
        inner = _rebuild(doc[path[0]], path[1:], one, moved)
        if inner is _DROP:
            return _DROP
        new = dict(doc)
        if not one and len(path) == 1:
            keep = [k for k, b in enumerate(inner) if b is not None]
            n = len(inner)
            for key, value in doc.items():
                if key != path[0] and isinstance(value, list) and len(value) == n:
                    new[key] = [value[k] for k in keep]
            inner = [b for b in inner if b is not None]
        new[path[0]] = inner
        return new
    if one:
        b = moved.pop(0)
        return _DROP if b is None else b
    taken = moved[:len(doc)]
    del moved[:len(doc)]
    return taken


def _moved_list(boxes: np.ndarray, keep: np.ndarray, n: int) -> List[Any]:
    """The boxes of ``n`` inputs as lists of floats, None where dropped."""
    out: List[Any] = [None] * n
    for b, k in zip(boxes.tolist(), keep.tolist()):
        out[k] = b
    return out


def move_field(value: Any, declared: Dict[str, Any], source_size: Sequence[int],
               cached_size: Sequence[int], pipeline: Optional[Dict[str, Any]],
               window: Optional[Sequence[int]] = None, flip: bool = False,
               size: Optional[Sequence[int]] = None) -> Tuple[Any, np.ndarray, int]:
    """One item's value of a declared boxes field (an ``(N, 4)`` array, or a parsed JSON
    document), its boxes moved by `move`; returns it with ``keep``, the indices of the boxes
    left, and the number of boxes it had (for the ``with`` fields). An array keeps its dtype when it is a float, else becomes
    float32; JSON boxes become lists of floats."""
    spec = declared["boxes"]
    spec = {"format": spec} if isinstance(spec, str) else spec
    fmt = spec["format"]
    if isinstance(value, np.ndarray):
        out, keep = move(value, fmt, source_size, cached_size, pipeline, window, flip, size)
        dtype = value.dtype if value.dtype.kind == "f" else np.float32
        return out.astype(dtype), keep, len(value)
    path = [k for k in (spec.get("path") or "").split(".") if k]
    found: List[Any] = []
    _collect(value, path, False, found)
    arr = np.asarray(found, dtype=np.float64).reshape(-1, 4)
    out, keep = move(arr, fmt, source_size, cached_size, pipeline, window, flip, size)
    moved = _moved_list(out, keep, len(found))
    if not path:
        return [b for b in moved if b is not None], keep, len(found)
    return _rebuild(value, path, False, moved), keep, len(found)


def keep_entries(value: Any, keep: np.ndarray, boxes: int, name: str) -> Any:
    """A ``with`` field's value (an array whose first axis, or a list, has an entry per box)
    reduced to the entries of the boxes left (``keep`` of ``boxes``)."""
    if not isinstance(value, list) and not getattr(value, "ndim", 0):
        raise ValueError(f"field {name!r} is {type(value).__name__}: a `with` field lists one entry per box")
    n = len(value) if isinstance(value, list) else int(value.shape[0])
    if n != boxes:
        raise ValueError(f"field {name!r} has {n} entries for {boxes} boxes: a `with` field lists one per box")
    if isinstance(value, list):
        return [value[k] for k in keep.tolist()]
    return value[keep]
