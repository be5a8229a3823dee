"""joader client: batches prepared once by the joader server, read zero-copy from shared memory.

Low level::

    with joader.RingReader(instance, ring) as r:
        b = r.next_batch(256, timeout=1.0)
        views = b.views()                  # zero-copy (H, W, C) uint8, valid until the next call
        images, labels = b.collate()       # contiguous (B, H, W, C) uint8 and (B,) int64

High level::

    loader = joader.Loader(server="http://127.0.0.1:7480", dataset="imagenet", job="resnet",
                           batch_size=256, transform=joader.RandomResizedCrop(224),
                           pipeline={"kind": "decode", "resize_shorter": 256},
                           mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    for epoch in range(3):
        for images, labels in loader:      # one epoch per iteration
            ...

`joader.torch` adapts a Loader to ``torch.utils.data.IterableDataset``; it is
imported only when used, so ``import joader`` works without torch.
"""

from __future__ import annotations

from typing import Any

from . import _native
from . import boxes
from ._native import JoaderError, LAYOUT_VERSION

from .errors import ElementFailure, ElementLoadError, ServerError
from .loader import Loader
from .reader import Batch, RingReader
from .rest import append, preload, register_job, release_preload
from .state import check_resumable, merge_states
from .transforms import Padded, RandomResizedCrop, Resize

__version__: str = _native.__version__

__all__ = [
    "JoaderError",
    "ServerError",
    "ElementLoadError",
    "ElementFailure",
    "RandomResizedCrop",
    "Resize",
    "Padded",
    "RingReader",
    "Batch",
    "Loader",
    "register_job",
    "append",
    "preload",
    "release_preload",
    "merge_states",
    "check_resumable",
    "LAYOUT_VERSION",
]


def __getattr__(name: str) -> Any:
    # `joader.torch` is imported lazily so that `import joader` needs no torch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'joader' has no attribute {name!r}")
