"""PyTorch adapter: ``IterableDataset`` over a `joader.Loader`.

Use it with ``torch.utils.data.DataLoader(dataset, batch_size=None)``: joader
already batches, and the data is prepared by the server, so worker
processes are not needed (keep ``num_workers=0``: each reader owns one ring).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch
from torch.utils.data import IterableDataset

from . import Loader


# type-arg: IterableDataset is generic; misc: without torch installed (ci.sh when its
# install timed out) the base class is Any.
class JoaderDataset(IterableDataset):  # type: ignore[type-arg,misc,unused-ignore]
    """Yields ``(images, labels)`` tensors: ``(B, H, W, C)`` uint8 (or
    ``(B, C, H, W)`` with ``channels_first=True``, a view, no copy) and ``(B,)``
    int64, created with ``torch.from_numpy`` (no copy). Each iteration is one
    epoch. Pass an existing `Loader` or the keyword arguments of one."""

    def __init__(self, loader: Optional[Loader] = None, channels_first: bool = False, **loader_kwargs: Any) -> None:
        super().__init__()
        self.loader = loader if loader is not None else Loader(**loader_kwargs)
        self.channels_first = channels_first

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            x = torch.from_numpy(images)
            if self.channels_first:
                x = x.permute(0, 3, 1, 2)
            yield x, torch.from_numpy(labels)

    def close(self) -> None:
        self.loader.close()


__all__ = ["JoaderDataset"]
