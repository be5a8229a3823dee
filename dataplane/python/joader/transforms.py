"""What the client does to each image of a batch as it collates it: a random resized crop
(or a plain resize), and the padded mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

from . import _native
from . import boxes as boxes_module


@dataclass(frozen=True)
class RandomResizedCrop:
    """Per-job augmentation applied in Rust after the shared cache: a random crop
    (area fraction in ``scale``, aspect ratio in ``ratio``, ten tries then the
    central fallback, as torchvision's RandomResizedCrop) resized to ``size`` by
    fast_image_resize (bilinear, antialiased when downscaling), then a
    horizontal flip with probability ``flip``. The randomness of an element depends only on the
    job's seed, the epoch and the element's position in the epoch."""

    size: Union[int, Tuple[int, int]]
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: float = 0.5

    @property
    def height(self) -> int:
        return self.size if isinstance(self.size, int) else self.size[0]

    @property
    def width(self) -> int:
        return self.size if isinstance(self.size, int) else self.size[1]

    def _native(self) -> Tuple[int, int, float, float, float, float, float, bool]:
        return (self.height, self.width, self.scale[0], self.scale[1], self.ratio[0], self.ratio[1], self.flip,
                False)

    def apply(self, image: np.ndarray, seed: int = 0, epoch: int = 0, position: int = 0) -> np.ndarray:
        """Augments one ``(H, W, C)`` uint8 image exactly as a batch item at
        ``(epoch, position)`` of a job with ``seed`` would be."""
        img = np.ascontiguousarray(image, dtype=np.uint8)
        h, w, c = img.shape
        out = _native.augment_image(img.tobytes(), h, w, c, self._native(), seed, epoch, position)
        return np.frombuffer(bytearray(out), dtype=np.uint8).reshape(self.height, self.width, c)

    def draw(self, height: int, width: int, seed: int = 0, epoch: int = 0,
             position: int = 0) -> Tuple[int, int, int, int, bool]:
        """The crop window ``(top, left, height, width)`` and flip that `apply` uses for a
        ``height × width`` image at ``(epoch, position)`` of a job with ``seed`` (drawn natively:
        the same draws as every other path)."""
        return _native.draw_crop(height, width, self._native(), seed, epoch, position)

    def boxes(self, boxes: np.ndarray, height: int, width: int, seed: int = 0, epoch: int = 0,
              position: int = 0, fmt: str = "xyxy",
              source_size: Optional[Tuple[int, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Moves ``(N, 4)`` boxes of a ``height × width`` image through the crop and flip that
        `apply` makes at ``(epoch, position)`` of a job with ``seed``: returns the boxes that
        keep an area, in the output's coordinates and ``fmt`` (``"xyxy"`` or COCO's
        ``"xywh"``), and their indices in the input (see `joader.boxes.crop_boxes`; with
        ``source_size`` the boxes are on an image of that size, e.g. the original photo, and
        are scaled to ``height × width`` first)."""
        top, left, h, w, flip = self.draw(height, width, seed, epoch, position)
        return boxes_module.crop_boxes(boxes, (top, left, h, w), flip, (self.height, self.width),
                                       fmt=fmt, image_size=(height, width), source_size=source_size)


@dataclass(frozen=True)
class Resize(RandomResizedCrop):
    """The whole cached image resized to ``size`` (the aspect ratio not kept, as torchvision's
    ``Resize((h, w))``), then flipped horizontally with probability ``flip`` (default: never):
    the crop of detection recipes that keep every box. Everywhere a `RandomResizedCrop` is
    taken (``transform=``, ``padded=True``, `joader.torch`), its window being the whole
    image; ``scale`` and ``ratio`` are unused."""

    flip: float = 0.0

    def _native(self) -> Tuple[int, int, float, float, float, float, float, bool]:
        return (self.height, self.width, 1.0, 1.0, 1.0, 1.0, self.flip, True)


@dataclass(frozen=True)
class Padded:
    """A batch of cached images, not cropped, with the crops to make (``Loader(padded=True)``;
    `joader.torch` crops, flips and normalizes it on the device in batched operations).

    ``pixels`` is ``(B, H, W, C)`` uint8 (a view of a pooled buffer, as a Loader's images):
    each image at the top left of its place, its last column and row repeated once beside it
    (bilinear sampling at its edge reads the edge), zeros beyond; ``H``/``W`` are the batch's
    largest. ``sizes`` ``(B, 2)`` int64 gives each image's rows and columns, ``boxes`` ``(B, 4)``
    int64 its crop window ``(top, left, height, width)`` and ``flips`` ``(B,)`` bool its flip,
    drawn natively by the loader's `RandomResizedCrop`, as the Rust crop draws them;
    ``height``/``width`` is the crop's output size."""

    pixels: np.ndarray
    sizes: np.ndarray
    boxes: np.ndarray
    flips: np.ndarray
    height: int
    width: int

    def __len__(self) -> int:
        return len(self.flips)
