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

from typing import Sequence, Tuple

import numpy as np

__all__ = ["FORMATS", "crop_boxes", "resize_boxes"]

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
