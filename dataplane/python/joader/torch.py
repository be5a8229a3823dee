"""PyTorch adapter: ``IterableDataset`` over a `joader.Loader`.

Use it with ``torch.utils.data.DataLoader(dataset, batch_size=None)``: joader
already batches and prefetches on its own native thread, so worker processes
are not needed (keep ``num_workers=0``: each reader owns one ring).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import IterableDataset

from . import Loader, merge_states


# type-arg: IterableDataset is generic; misc: without torch installed (ci.sh when its
# install timed out) the base class is Any.
class JoaderDataset(IterableDataset):  # type: ignore[type-arg,misc,unused-ignore]
    """Yields ``(images, labels)`` tensors made with ``torch.from_numpy`` (no
    copy): ``(B, H, W, C)`` uint8 (``(B, C, H, W)`` with ``channels_first=True``,
    a view), or ``(B, C, H, W)`` float32 when the loader normalizes (``mean`` and
    ``std``), and ``(B,)`` int64. Each iteration is one epoch. Pass an existing
    `Loader` or the keyword arguments of one.

    ``pin_memory=True`` (with CUDA present) copies each batch once into
    page-locked memory from torch's pinned-memory allocator, as DataLoader's
    ``pin_memory`` does; that allocator keeps a block until the CUDA copies
    from it have completed, so ``x.cuda(non_blocking=True)`` is safe. Without
    CUDA it warns and changes nothing.

    ``state_dict()`` / ``load_state_dict()`` follow PyTorch's convention (as
    torchdata's ``StatefulDataLoader``): save the state with the model's, and
    a restarted run continues with the rest of the epoch it was in."""

    def __init__(
        self,
        loader: Optional[Loader] = None,
        channels_first: bool = False,
        pin_memory: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        self.loader = loader if loader is not None else Loader(**loader_kwargs)
        self.channels_first = channels_first
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warnings.warn("pin_memory=True without CUDA: tensors stay in pageable memory", stacklevel=2)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            x = torch.from_numpy(images)
            if self.channels_first and x.dtype == torch.uint8:
                x = x.permute(0, 3, 1, 2)
            y = torch.from_numpy(labels)
            if self.pin_memory:
                x, y = x.pin_memory(), y.pin_memory()
            yield x, y

    def state_dict(self) -> Dict[str, Any]:
        """The loader's `Loader.state_dict`; under ``torch.distributed`` with several ranks the
        ranks' states are gathered (a collective: every rank calls it at the same step) and
        merged, so every rank returns the job's state and any rank's copy resumes all of them."""
        state = self.loader.state_dict()
        if self.loader.world_size > 1 and _distributed():
            states: List[Optional[Dict[str, Any]]] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, state)
            state = merge_states([s for s in states if s is not None])
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues the job from ``state`` (call it before iterating; under ``torch.distributed``
        every rank calls it)."""
        def barrier() -> None:
            torch.distributed.barrier()

        self.loader.load_state_dict(state, barrier=barrier if _distributed() else None)

    def close(self) -> None:
        self.loader.close()


def _distributed() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


__all__ = ["JoaderDataset"]
