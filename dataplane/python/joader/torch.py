"""PyTorch adapter: ``IterableDataset`` over a `joader.Loader`.

Use it with ``torch.utils.data.DataLoader(dataset, batch_size=None)``: joader
already batches and prefetches on its own native thread, so worker processes
are not needed (keep ``num_workers=0``: each reader owns one ring).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import IterableDataset

from . import Loader, Padded, RandomResizedCrop, merge_states

#: roi_align's samples per output pixel and axis: 0 is torchvision's adaptive choice,
#: ceil(crop size / output size) per box, which spreads the samples of a bin over the source
#: pixels it covers: an average of bilinear samples a pixel apart, which follows the
#: antialiased (support widened by the scale) bilinear resize of the CPU path within a
#: fraction of a level on photos (tests/test_device.py); a fixed 1 aliases when shrinking, a
#: fixed 2 or more blurs crops that are enlarged.
SAMPLING_RATIO = 0


def pinned(t: torch.Tensor) -> torch.Tensor:
    """A copy of CPU tensor ``t`` (same shape and strides) in page-locked memory from torch's
    pinned-memory allocator, copied on the calling thread alone. ``t.pin_memory()`` copies on
    torch's intra-op threads, whose OpenMP workers then spin-wait for the next parallel region:
    on a 16-core H100 machine that spin cost 2-4 cores per training process at 20-40 batches a
    second, CPU the server's decoders needed (`joader bench train`, docs/benchmarks.md). The
    allocator keeps the block until the CUDA copies from it have completed, so
    ``x.to("cuda", non_blocking=True)`` is safe whatever happens to ``x`` afterwards."""
    out = torch.empty_like(t, pin_memory=True)  # preserve_format: a dense tensor's strides
    np.copyto(out.numpy(), t.numpy())
    return out


# type-arg: IterableDataset is generic; misc: without torch installed (ci.sh when its
# install timed out) the base class is Any.
class JoaderDataset(IterableDataset):  # type: ignore[type-arg,misc,unused-ignore]
    """Yields ``(images, labels)`` tensors (a dict of the fields with ``fields=``, see
    `Loader`; arrays as tensors) made with ``torch.from_numpy`` (no
    copy): ``(B, H, W, C)`` uint8 (``(B, C, H, W)`` with ``channels_first=True``,
    a view), or ``(B, C, H, W)`` float32 when the loader normalizes (``mean`` and
    ``std``), and ``(B,)`` int64. Each iteration is one epoch. Pass an existing
    `Loader` or the keyword arguments of one.

    ``pin_memory=True`` (with CUDA present) copies each batch once into
    page-locked memory from torch's pinned-memory allocator, as DataLoader's
    ``pin_memory`` does, on the iterating thread alone (`pinned`); that allocator keeps a block until the CUDA copies
    from it have completed, so ``x.cuda(non_blocking=True)`` is safe. Without
    CUDA it warns and changes nothing.

    ``state_dict()`` / ``load_state_dict()`` follow PyTorch's convention (as
    torchdata's ``StatefulDataLoader``): save the state with the model's, and
    a restarted run continues with the rest of the epoch it was in.

    ``device`` (e.g. ``"cuda"``) delivers batches on that device, labels too. With a
    `RandomResizedCrop` transform the crop, flip and normalization run there in batched
    operations (`augment_padded`): the native thread only copies the cached images into a
    padded uint8 batch and draws the crops (``Loader(padded=True)``), so the CPU does a copy
    per image instead of a resize, and the float batch never crosses PCIe. The output is the
    CPU path's: ``(B, C, H, W)`` float32 normalized with ``mean``/``std``, else uint8
    ``(B, H, W, C)`` (``(B, C, H, W)`` with ``channels_first``). Without a transform the
    batch is sent as uint8 and normalized on the device. ``device="cpu"`` runs the same
    torch code on the CPU (to compare it with the native path)."""

    def __init__(
        self,
        loader: Optional[Loader] = None,
        channels_first: bool = False,
        pin_memory: bool = False,
        device: Union[str, torch.device, None] = None,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        self.device = torch.device(device) if device is not None else None
        #: Normalization done here (on the device), not natively.
        self._norm: Optional[Tuple[Sequence[float], Sequence[float]]] = None
        if loader is None:
            transform = loader_kwargs.get("transform")
            if self.device is not None and transform is not None and not isinstance(transform, RandomResizedCrop):
                raise ValueError("device= needs transform=None or a joader.RandomResizedCrop, not a callable")
            if self.device is not None and isinstance(transform, RandomResizedCrop):
                loader_kwargs["padded"] = True
            elif self.device is not None and loader_kwargs.get("mean") is not None:
                self._norm = (loader_kwargs.pop("mean"), loader_kwargs.pop("std", None) or ())
            loader = Loader(**loader_kwargs)
        self.loader = loader
        if loader.padded:
            self.device = self.device or torch.device("cpu")
            if loader.mean is not None and loader.std is not None:
                self._norm = (loader.mean, loader.std)
        if self._norm is not None and len(self._norm[0]) != len(self._norm[1]):
            raise ValueError("give mean and std with one value per channel each")
        self.channels_first = channels_first
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warnings.warn("pin_memory=True without CUDA: tensors stay in pageable memory", stacklevel=2)

    def __iter__(self) -> Iterator[Any]:
        """Yields ``(images, labels)``, or with the loader's ``fields`` a dict of them: the
        image and label tensors as without fields, ``npy`` fields as tensors (one stacked
        tensor with a declared shape, else a list), the others as the `Loader` gives them."""
        for batch in self.loader:
            if isinstance(batch, dict):
                yield self._dict(batch)
            else:
                yield self._pair(*batch)

    def _pair(self, images: Any, labels: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.device is not None:
            return self._on_device(images, labels, self.device)
        x = torch.from_numpy(images)
        if self.channels_first and x.dtype == torch.uint8:
            x = x.permute(0, 3, 1, 2)
        y = torch.from_numpy(labels)
        if self.pin_memory:
            x, y = pinned(x), pinned(y)
        return x, y

    def _dict(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """A dict batch with tensors: the images and labels through `_pair`, arrays as tensors."""
        image, label = self.loader._image_name, self.loader._label_name
        has_label = label is not None and label in batch
        has_image = image is not None and image in batch
        out: Dict[str, Any] = {}
        if has_image or has_label:
            n = len(batch[label]) if label is not None and has_label else len(batch[image or ""])
            labels = batch[label] if label is not None and has_label else np.zeros((n,), np.int64)
            images = batch[image] if image is not None and has_image else None
            if images is None:
                assert label is not None
                y = torch.from_numpy(labels)
                out[label] = self._send(y, self.device) if self.device is not None else y
            else:
                assert image is not None
                x, y = self._pair(images, labels)
                out[image] = x
                if label is not None and has_label:
                    out[label] = y
        for name, value in batch.items():
            if name in (image, label):
                continue
            if isinstance(value, np.ndarray):
                value = self._tensor(value)
            elif isinstance(value, list) and any(isinstance(v, np.ndarray) for v in value):
                # An optional field's missing items stay None.
                value = [None if v is None else self._tensor(v) for v in value]
            out[name] = value
        return out

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        return self._send(t, self.device) if self.device is not None else t

    def _on_device(self, images: Any, labels: np.ndarray, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        mean, std = self._norm if self._norm is not None else (None, None)
        y = self._send(torch.from_numpy(labels), device)
        if isinstance(images, Padded):
            x = augment_padded(images, device, mean, std, self.channels_first, self.pin_memory)
        else:
            x = self._send(torch.from_numpy(images), device)
            if mean is not None and std is not None:
                x = _normalize(x.permute(0, 3, 1, 2).float(), mean, std)
            elif self.channels_first and x.dtype == torch.uint8:
                x = x.permute(0, 3, 1, 2)
        return x, y

    def _send(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        if self.pin_memory and device.type == "cuda":
            return pinned(t).to(device, non_blocking=True)
        return t.to(device)

    def state_dict(self) -> Dict[str, Any]:
        """The loader's `Loader.state_dict`; under ``torch.distributed`` with several ranks the
        ranks' states are gathered (a collective: every rank calls it at the same step) and
        merged, so every rank returns the job's state and any rank's copy resumes all of them,
        on this number of ranks or any other (``torchrun --nproc_per_node``, nodes)."""
        state = self.loader.state_dict()
        if self.loader.world_size > 1 and _distributed():
            states: List[Optional[Dict[str, Any]]] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, state)
            state = merge_states([s for s in states if s is not None])
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues the job from ``state`` (call it before iterating; under ``torch.distributed``
        every rank calls it). The state may come from a run on another number of ranks if it
        covers all of them (`state_dict` does): the rest of its epoch is shared by these ones."""
        def barrier() -> None:
            torch.distributed.barrier()

        self.loader.load_state_dict(state, barrier=barrier if _distributed() else None)

    def close(self) -> None:
        self.loader.close()


def augment_padded(
    batch: Padded,
    device: Union[str, torch.device],
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    channels_first: bool = False,
    pin_memory: bool = False,
) -> torch.Tensor:
    """Crops, resizes, flips and normalizes a `Padded` batch on ``device`` in batched
    operations, with the crops and flips it carries (drawn natively): one uint8 copy to the
    device, ``torchvision.ops.roi_align`` (``aligned=True``: a box edge is a pixel edge, as in
    the CPU resize; `SAMPLING_RATIO`) over the float batch, a flip of the items drawn for it.
    Returns ``(B, C, H, W)`` float32 ``(x / 255 - mean) / std`` with ``mean``/``std``, else
    uint8 rounded ``(B, H, W, C)`` (``(B, C, H, W)`` with ``channels_first``), as the native
    path. ``pin_memory`` (CUDA) copies the pixels through page-locked memory."""
    from torchvision.ops import roi_align

    device = torch.device(device)
    x = torch.from_numpy(batch.pixels)
    if pin_memory and device.type == "cuda":
        x = pinned(x).to(device, non_blocking=True)
    else:
        x = x.to(device)
    b = np.asarray(batch.boxes, dtype=np.float32)
    # (index, x1, y1, x2, y2) in pixel-edge coordinates: the window's columns and rows.
    rois = np.stack([np.arange(len(b), dtype=np.float32), b[:, 1], b[:, 0], b[:, 1] + b[:, 3], b[:, 0] + b[:, 2]], 1)
    out = roi_align(x.permute(0, 3, 1, 2).float(), torch.from_numpy(rois).to(device),
                    (batch.height, batch.width), spatial_scale=1.0, sampling_ratio=SAMPLING_RATIO, aligned=True)
    flips = torch.from_numpy(np.asarray(batch.flips, dtype=np.bool_)).to(device)
    out = torch.where(flips[:, None, None, None], out.flip(-1), out)
    if mean is not None and std is not None:
        return _normalize(out, mean, std)
    u8 = out.round_().clamp_(0, 255).to(torch.uint8)
    return u8 if channels_first else u8.permute(0, 2, 3, 1).contiguous()


def _normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x / 255 - mean) / std`` per channel of an NCHW float batch of byte values."""
    m = torch.tensor(mean, dtype=torch.float32, device=x.device)[None, :, None, None]
    s = torch.tensor(std, dtype=torch.float32, device=x.device)[None, :, None, None]
    return (x / 255.0 - m) / s


def _distributed() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


__all__ = ["JoaderDataset", "augment_padded", "SAMPLING_RATIO"]
