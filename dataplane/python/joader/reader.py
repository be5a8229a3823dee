"""The low-level reader: one delivery ring, its batches as zero-copy views."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _native
from ._native import JoaderError
from .errors import ElementFailure
from .transforms import RandomResizedCrop


class Batch:
    """A batch taken from a ring. Its views and its bytes are valid until the
    next ``next_batch()``, ``ack()`` or ``close()`` of its reader; after that,
    views still point to mapped memory but may show other elements."""

    def __init__(self, reader: "RingReader", raw: Dict[str, Any]) -> None:
        self._reader = reader
        self._raw = raw
        self.start: int = raw["start"]
        self.element_ids: np.ndarray = np.asarray(raw["element_ids"], dtype=np.int64)
        self.labels: np.ndarray = np.asarray(raw["labels"], dtype=np.int64)
        self.epochs: np.ndarray = np.asarray(raw["epochs"], dtype=np.int64)
        self.positions: np.ndarray = np.asarray(raw["positions"], dtype=np.int64)
        self.errors: List[ElementFailure] = [ElementFailure(*e) for e in raw["errors"]]
        eoe = raw["end_of_epoch"]
        #: ``(epoch, count)`` when this batch ends an epoch, else ``None``.
        self.end_of_epoch: Optional[Tuple[int, int]] = (int(eoe[0]), int(eoe[1])) if eoe is not None else None
        #: True when the job is finished (nothing follows).
        self.end_of_stream: bool = raw["end_of_stream"]

    def __len__(self) -> int:
        return len(self._raw["element_ids"])

    def _check(self) -> None:
        if self._reader._current is not self:
            raise JoaderError("batch_released", "this batch was acknowledged; take a new one")

    def views(self) -> List[np.ndarray]:
        """Zero-copy read-only views: ``(H, W, C)`` uint8 for images, 1-D uint8 for raw payloads."""
        self._check()
        if len(self) == 0:
            return []  # an empty batch holds no records, so the reader keeps nothing of it
        return self._reader._native.views(self.start)

    def shape(self, transform: Optional[RandomResizedCrop] = None) -> Tuple[int, int, int, int]:
        """Shape ``(B, H, W, C)`` that `collate` returns."""
        shapes = self._raw["shapes"]
        if not shapes:
            return (0, 0, 0, 0)
        if shapes[0] is None:
            raise JoaderError("collate", "raw payloads cannot be collated; use views()")
        h, w, c = shapes[0]
        if transform is not None:
            h, w = transform.height, transform.width
        return (len(shapes), h, w, c)

    def collate(
        self,
        out: Optional[np.ndarray] = None,
        labels_out: Optional[np.ndarray] = None,
        transform: Optional[RandomResizedCrop] = None,
        seed: int = 0,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Copies the batch into a contiguous ``(B, H, W, C)`` uint8 array and an
        int64 label array, optionally applying ``transform`` with the job's
        ``seed``. ``out`` / ``labels_out``, if given, must be writeable
        C-contiguous arrays of dtype uint8 / int64 with at least as many
        elements (the result is a view of their start); anything else raises
        ``ValueError``."""
        self._check()
        shape = self.shape(transform)
        out = np.empty(shape, dtype=np.uint8) if out is None else _prefix(out, "out", shape)
        labels_out = np.empty((shape[0],), np.int64) if labels_out is None else _prefix(labels_out, "labels_out", shape[:1])
        if shape[0] == 0:
            return out, labels_out
        aug = transform._native() if transform is not None else None
        # The native side checks dtype, shape, contiguity and writability again.
        self._reader._native.collate_into(self.start, out, labels_out, aug, seed)
        return out, labels_out


def _prefix(a: Any, name: str, shape: Tuple[int, ...]) -> np.ndarray:
    """The first ``prod(shape)`` elements of ``a`` as an array of ``shape``, without
    a copy. Only a C-contiguous array can be reshaped that way: anything else is
    refused here rather than silently copied (the result would not reach ``a``)."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    need = int(np.prod(shape))
    if a.size < need:
        raise ValueError(f"{name} has {a.size} elements, need {need} for shape {shape}")
    if a.shape == shape:
        return a
    return a.reshape(-1)[:need].reshape(shape)


class RingReader:
    """Reader of one delivery ring of a joader server instance.

    ``next_batch`` acknowledges the previous batch before taking the next one,
    so at most one batch is held at a time; its views are valid until then.
    While waiting, the GIL is released and the server's liveness is checked
    every 100 ms: a dead or stopped server raises ``JoaderError`` with code
    ``server_gone`` instead of hanging."""

    def __init__(self, instance: str, ring: str, open_timeout: float = 5.0) -> None:
        self._native = _native.RingReader(instance, ring, open_timeout)
        self._current: Optional[Batch] = None

    def next_batch(self, max_items: int, timeout: Optional[float] = None) -> Batch:
        """Waits for up to ``max_items`` elements. Returns early at the end of an
        epoch or of the stream, when ``timeout`` seconds pass (possibly with an
        empty batch), or when the ring is full. Raises ``JoaderError`` with code
        ``ring_closed`` once the server closed the ring and all was read."""
        self.ack()
        raw = self._native.take(max_items, timeout)
        b = Batch(self, raw)
        self._current = b
        return b

    def ack(self) -> None:
        """Acknowledges the current batch (its views must no longer be used)."""
        if self._current is not None:
            self._native.release(self._current.start)
            self._current = None

    def check_server(self) -> None:
        """Raises ``JoaderError("server_gone")`` if the server stopped or died."""
        self._native.check_server()

    @property
    def reader_index(self) -> int:
        return self._native.reader_index

    @property
    def capacity(self) -> int:
        return self._native.capacity

    @property
    def server_pid(self) -> int:
        return self._native.server_pid

    def close(self) -> None:
        """Detaches from the ring; the server reclaims whatever was not acknowledged."""
        self._current = None
        self._native.close()

    def __enter__(self) -> "RingReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
