"""`Loader`: a job's registration, prefetch, collation and state in one iterable, one epoch
per iteration."""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from . import _native
from . import boxes as boxes_module
from ._native import JoaderError
from .errors import ServerError, ElementFailure, ElementLoadError
from .transforms import RandomResizedCrop, Resize, Padded
from .reader import Batch
from .rest import _post_json, register_job
from .state import merge_states, check_resumable


class Loader:
    """Registers a job with a joader server and iterates its batches.

    Each ``for`` loop over the loader is one epoch and yields
    ``(images, labels)``: ``(B, H, W, C)`` uint8 (or, with ``mean`` and ``std``,
    ``(B, C, H, W)`` float32 normalized as torchvision's ``Normalize``) and
    ``(B,)`` int64 NumPy arrays, safe to keep.

    A native thread prefetches: it reads the ring, collates and augments
    ``prefetch`` batches ahead (on ``threads`` threads, default the cores) into
    pooled buffers with the GIL released, and acknowledges each batch once it
    is copied out of shared memory; iterating only hands over a ready batch.
    The images array is a view of a pooled buffer that is rewritten only after
    every Python object referring to it (the array, its views, a tensor made by
    ``torch.from_numpy``) is gone, so nothing changes under the user.

    ``transform`` is a `RandomResizedCrop` applied in Rust with the job's
    ``seed`` (an element's crop and flip depend only on the seed, its epoch and
    its position), or any callable ``(images, labels) -> anything`` applied to
    each batch. With a `RandomResizedCrop`, ``padded=True`` leaves the crop to
    the consumer: the loader yields `Padded` batches (the cached images in one
    padded uint8 array, with each item's crop window and flip drawn as the Rust
    crop draws them) and keeps ``mean``/``std`` as attributes for it instead
    of normalizing (``joader.torch.JoaderDataset(device="cuda")`` does this).
    ``server`` defaults to ``$JOADER_SERVER``, else
    ``http://127.0.0.1:7480``. ``rank`` / ``world_size`` default to the
    ``RANK`` / ``WORLD_SIZE`` environment variables (as set by torchrun), else
    0 / 1; with several ranks each receives a disjoint share of every epoch,
    and a share one element short of the others is padded with its first
    element (``pad``, default on), as ``DistributedSampler`` pads.
    ``ring_capacity`` is the number of records each rank's delivery ring holds
    (rounded up to a power of two; default twice the batch size, at least 64):
    how far the server may deliver ahead of the prefetch.
    A job that reads much faster than a batch's elements load (one fast model
    alone on a GPU) can ask for more; each record holds a cache slot.
    ``on_error`` is ``"raise"`` (raise `ElementLoadError` when the server
    reports elements it failed to load) or ``"skip"`` (count them in
    ``failures`` and go on). ``timeout`` (seconds) bounds each wait for a
    batch (``JoaderError("timeout")``).

    Checkpoints: ``state_dict()`` is ``{"job", "epoch", "consumed", "world_size",
    "ranks", "dataset_fingerprint"}``, the epoch in progress and the ids of it already handed over by
    iteration (a base64 roaring bitmap; batches merely prefetched do not count)
    by the ranks listed in ``ranks`` (this rank alone) of the ``world_size`` the job
    ran with, small and self-contained, to save in the training checkpoint. A job
    built with ``resume=state`` (or given it by ``load_state_dict`` before
    iterating) receives the rest of that epoch, a uniform random permutation of
    what remains, then whole epochs; ``epochs`` still counts from epoch 0. With
    several ranks each rank's state holds its own share: merge them with
    `merge_states` (``joader.torch.JoaderDataset`` gathers them itself). A state
    that covers every rank of its job resumes on any number of ranks and nodes
    (elastic): the rest of the epoch is shared equally among the new ranks
    (padded as ``DistributedSampler`` pads), later epochs are whole; a state
    missing some ranks is refused (``ValueError`` naming them), as its rest
    would repeat what they handed over. ``dataset_fingerprint`` names the dataset's
    items (their locations and labels, in id order) when the state was saved: resuming on a
    dataset whose first items differ (files added in its middle, replaced or relabelled, a
    re-index of other files) raises ``ServerError("dataset_changed")`` naming both, unless
    ``allow_changed_dataset=True`` (the rest of the epoch is then computed on the new
    index); a dataset that only grew at its end resumes as it is. States saved before states
    carried it resume unchecked.
    ``record=True`` keeps every epoch's delivery order on the server
    (``GET /v1/jobs/{job}/record/{epoch}``, per rank) to trace a bad batch;
    ``replay={"job": name, "epoch": e}`` (without ``subset``) receives exactly
    a recorded epoch's order, every epoch.

    Samples without an image (an ``array`` source's rows, shards or Parquet rows whose
    ``fields`` declare no ``image``) always yield dicts of their fields (``fields=True``
    unless a list is given; an ``array``'s ``npy`` fields stacked into one array each), with
    the class field when one is declared; a `RandomResizedCrop`, ``padded``, ``mean``/``std``
    or a pipeline other than ``raw`` is refused (``ValueError``) before registering.

    Fields: a dataset whose source declares ``fields`` (text, JSON, ``.npy``, bytes beside
    the image and class) still yields ``(images, labels)`` unless the job asks:
    ``fields=True`` (every declared field) or ``fields=["image", "caption", ...]`` yields a
    dict keyed by field name: the image field's name (``"image"`` unless declared otherwise)
    holds the images array (or `Padded`), the class field's (``"label"``) the int64 labels,
    a ``text`` field a ``list[str]``, a ``json`` field a list of parsed documents, an ``npy``
    field one stacked array when it declares a ``shape`` (else a list of arrays), a ``bytes``
    field a ``list[bytes]``, in the batch's order (a padded item repeats its fields). A
    callable ``transform`` then receives the dict. A field declared as boxes (``"boxes":
    "xyxy"``, or ``{"format", "path", "with"}`` on a ``json`` field) comes in the delivered
    image's pixels: moved from the stored image through the server's pipeline and the item's
    crop and flip (a `RandomResizedCrop` or `Resize`; without one, the cached image's, clipped
    to it), the boxes left without area dropped with their JSON items and their entries in
    the ``with`` fields (see `joader.boxes.move_field`)."""

    def __init__(
        self,
        server: Optional[str] = None,
        dataset: str = "",
        job: Optional[str] = None,
        batch_size: int = 32,
        subset: Any = None,
        transform: Union[RandomResizedCrop, Callable[[np.ndarray, np.ndarray], Any], None] = None,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        epochs: Optional[int] = None,
        pipeline: Optional[Dict[str, Any]] = None,
        drop_last: bool = False,
        on_error: str = "raise",
        timeout: Optional[float] = None,
        open_timeout: float = 10.0,
        request_timeout: float = 10.0,
        token: Optional[str] = None,
        prefetch: int = 2,
        threads: Optional[int] = None,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        pad: bool = True,
        sampler: Optional[str] = None,
        resume: Optional[Dict[str, Any]] = None,
        record: bool = False,
        replay: Optional[Dict[str, Any]] = None,
        padded: bool = False,
        fields: Union[bool, Sequence[str], None] = None,
        allow_changed_dataset: bool = False,
        ring_capacity: Optional[int] = None,
    ) -> None:
        if not dataset:
            raise ValueError("dataset is required")
        if isinstance(fields, str):
            raise ValueError("fields is True or a list of field names, not a string")
        server = server or os.environ.get("JOADER_SERVER", "http://127.0.0.1:7480")
        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1 batch")
        if threads is not None and threads < 1:
            raise ValueError("threads must be positive")
        if ring_capacity is not None and ring_capacity < batch_size:
            raise ValueError(f"ring_capacity must hold one batch: at least batch_size ({batch_size})")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std (float32 NCHW output), or neither (uint8 NHWC)")
        if padded and not isinstance(transform, RandomResizedCrop):
            raise ValueError("padded=True needs transform=RandomResizedCrop(...): it hands over that crop's draws")
        if on_error not in ("raise", "skip"):
            raise ValueError('on_error must be "raise" or "skip"')
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} out of range for world size {self.world_size}")
        self.job = job or f"job-{os.getpid()}"
        self.batch_size = batch_size
        self.seed = seed
        self.transform = transform
        #: Whether batches are `Padded` (the crop and normalization left to the consumer).
        self.padded = padded
        #: The normalization asked for (applied natively unless ``padded``).
        self.mean: Optional[Tuple[float, ...]] = None if mean is None else tuple(float(m) for m in mean)
        self.std: Optional[Tuple[float, ...]] = None if std is None else tuple(float(v) for v in std)
        self.drop_last = drop_last
        self.on_error = on_error
        self.timeout = timeout
        self.failures: List[ElementFailure] = []
        self._server, self._token, self._request_timeout = server, token, request_timeout
        self._classes: Optional[List[str]] = None
        self._register = dict(
            name=self.job,
            dataset=dataset,
            batch_size=batch_size,
            subset=subset,
            seed=seed,
            rank=self.rank,
            world_size=self.world_size,
            epochs=epochs,
            pipeline=pipeline,
            timeout=request_timeout,
            token=token,
            sampler=sampler,
            record=record,
            replay=replay,
            allow_changed_dataset=allow_changed_dataset,
            ring_capacity=ring_capacity,
        )
        #: The field names of the dataset's image and class, and the small fields yielded
        #: (``fields``), or None for ``(images, labels)`` batches.
        self.fields: Optional[List[str]] = None
        #: The image's and the class's field names: "image" and "label" for a dataset that
        #: declares no fields; a declaration's own names, and no class unless it declares one;
        #: no image for a dataset whose samples have none.
        self._image_name: Optional[str] = "image"
        self._label_name: Optional[str] = "label"
        #: The declared boxes fields, by name (their declarations), moved with the pixels.
        self._boxes: Dict[str, Dict[str, Any]] = {}
        self._optional: Set[str] = set()
        if resume is not None:
            # Refused before anything is sent to the server.
            check_resumable(resume, self.world_size)
        view = _post_json(f"{self._server.rstrip('/')}/v1/datasets/{urllib.parse.quote(dataset)}", None,
                          self._request_timeout, self._token, method="GET")
        source: Dict[str, Any] = view.get("source") or {}
        declared: Dict[str, Any] = source.get("fields") or {}
        #: Whether the dataset's samples have an image: not an ``array`` source's rows, nor
        #: samples whose ``fields`` declare no ``image`` (text-only shards).
        self.has_image = "array" not in (source.get("kind"), source.get("layout")) and (
            not declared or any(spec.get("kind") == "image" for spec in declared.values()))
        if not self.has_image:
            if isinstance(transform, (RandomResizedCrop, Resize)):
                raise ValueError(f"dataset {dataset!r} has no images (its samples are fields only): "
                                 "give no RandomResizedCrop (a callable transform receives the dict)")
            if padded or mean is not None:
                raise ValueError(f"dataset {dataset!r} has no images (its samples are fields only): "
                                 "padded, mean and std are for images")
            if pipeline is not None and pipeline.get("kind") != "raw":
                raise ValueError(f"dataset {dataset!r} has no images (its samples are fields only): "
                                 "give no pipeline, there is nothing to decode")
            # Its batches are dicts of its fields.
            fields = fields or True
        if fields:
            self._choose_fields(dataset, declared, fields)
        # A padded batch is normalized by its consumer, after the crop.
        self._native_args = (transform, prefetch, threads, None if padded else mean,
                             None if padded else std, pad, open_timeout)
        #: CPU seconds by stage of the prefetches this loader replaced (``load_state_dict``).
        self._stage_cpu_before: Dict[str, float] = {}
        self._start(resume)

    def _choose_fields(self, dataset: str, declared: Dict[str, Any], fields: Union[bool, Sequence[str]]) -> None:
        """The names ``fields`` asks for, checked against the dataset's declaration."""
        if declared:
            # A field named "label" that is not the class is a field like any other.
            self._label_name = None
        if not self.has_image:
            self._image_name = None
        for name, spec in declared.items():
            if spec.get("kind") == "image":
                self._image_name = name
            elif spec.get("kind") == "class":
                self._label_name = name
        small = [n for n, spec in sorted(declared.items()) if spec.get("kind") not in ("image", "class")]
        self._boxes = {n: spec for n, spec in declared.items() if spec.get("boxes") is not None}
        #: Small fields a sample may lack (``"optional": true``): ``None`` in its place.
        self._optional = {n for n, spec in declared.items() if spec.get("optional")}
        known = (([self._image_name] if self._image_name else []) + ([self._label_name] if self._label_name else [])
                 + small)
        if fields is True:
            self.fields = known
            return
        wanted = [str(f) for f in fields]  # type: ignore[union-attr]
        unknown = [f for f in wanted if f not in known]
        if unknown:
            raise ValueError(f"dataset {dataset!r} has no field {unknown[0]!r}; its fields: {known}")
        self.fields = wanted

    def _as_dict(self, images: Any, labels: np.ndarray, d: Dict[str, Any]) -> Dict[str, Any]:
        """The batch as a dict of the fields asked for (see the class docs)."""
        assert self.fields is not None
        small: Dict[str, Any] = d.get("fields") or {}
        values: Dict[str, Any] = {}
        for name in self.fields:
            if name in small:
                kind, fixed, raw = small[name]
                values[name] = _field_values(kind, fixed, raw)
        moved = self._move_boxes(small, values, d)
        out: Dict[str, Any] = {}
        for name in self.fields:
            if self._image_name is not None and name == self._image_name:
                out[name] = images
            elif self._label_name is not None and name == self._label_name:
                out[name] = labels
            elif name in values:
                out[name] = moved.get(name, values[name])
            elif name in self._optional:
                out[name] = [None] * len(labels)  # no item of the batch has it
            else:
                raise JoaderError("bad_response", f"the batch carries no field {name!r}")
        return out

    def _move_boxes(self, small: Dict[str, Any], values: Dict[str, Any],
                    d: Dict[str, Any]) -> Dict[str, Any]:
        """The declared boxes fields asked for, and the ``with`` fields asked for, of a batch,
        each item's boxes moved from the stored image to the delivered one (see
        `joader.boxes.move_field`)."""
        moved: Dict[str, Any] = {}
        crops: Optional[List[Tuple[Any, bool, Any]]] = None
        for name, spec in self._boxes.items():
            boxes_spec = spec["boxes"]
            with_ = [] if isinstance(boxes_spec, str) else [w for w in boxes_spec.get("with") or []
                                                            if self.fields and w in self.fields]
            if name not in small or (name not in values and not with_):
                continue
            items = values[name] if name in values else _field_values(*small[name])
            if crops is None:
                crops = self._crops(d, len(items))
            sources, cached = d["source_sizes"], d["cached_sizes"]
            new_items: List[Any] = []
            keeps: List[Tuple[Any, int]] = []
            for i, item in enumerate(items):
                if item is None:  # an optional boxes field the item lacks
                    new_items.append(None)
                    keeps.append((None, 0))
                    continue
                window, flip, size = crops[i]
                new, keep, n = boxes_module.move_field(item, spec, sources[i], cached[i], self._pipeline,
                                                       window, flip, size)
                new_items.append(new)
                keeps.append((keep, n))
            if name in values:
                moved[name] = new_items
            for w in with_:
                vals = moved.get(w, values.get(w, [None] * len(items)))
                moved[w] = [v if k is None or v is None else boxes_module.keep_entries(v, k, n, w)
                            for v, (k, n) in zip(vals, keeps)]
        return moved

    def _crops(self, d: Dict[str, Any], n: int) -> List[Tuple[Any, bool, Any]]:
        """Each item's crop window, flip and output size (``(None, False, None)`` without a
        crop): a padded batch's own, else drawn natively as the crop drew them, once per batch
        for every boxes field."""
        aug = self.transform if isinstance(self.transform, RandomResizedCrop) else None
        if aug is None:
            return [(None, False, None)] * n
        size = (aug.height, aug.width)
        if "boxes" in d and "flips" in d:
            return [(tuple(int(v) for v in d["boxes"][i]), bool(d["flips"][i]), size) for i in range(n)]
        cached = d["cached_sizes"]
        out = []
        for i in range(n):
            top, left, h, w, flip = aug.draw(int(cached[i][0]), int(cached[i][1]), self.seed,
                                             int(d["epochs"][i]), int(d["positions"][i]))
            out.append(((top, left, h, w), flip, size))
        return out

    def _start(self, resume: Optional[Dict[str, Any]]) -> None:
        """Registers the job (resumed from ``resume``) and starts the prefetch of this rank's ring."""
        transform, prefetch, threads, mean, std, pad, open_timeout = self._native_args
        if resume is not None:
            check_resumable(resume, self.world_size)
        self.info = register_job(self._server, resume=resume, **self._register)
        mine = [r for r in self.info.get("ranks", []) if r.get("rank") == self.rank]
        if not mine:
            raise ServerError("bad_response", f"registration response has no entry for rank {self.rank}: {self.info}")
        self.instance: str = mine[0]["instance"]
        self.ring: str = mine[0]["ring"]
        size = self.info.get("job", {}).get("subset_size")
        #: The dataset's fingerprint at registration (kept by ``state_dict``).
        self.dataset_fingerprint: Optional[str] = self.info.get("job", {}).get("dataset_fingerprint")
        #: The job's server pipeline (what boxes are scaled through).
        self._pipeline: Optional[Dict[str, Any]] = self.info.get("job", {}).get("pipeline")
        #: Records every rank receives per epoch (its share, padded), when known.
        self.share: Optional[int] = -(-int(size) // self.world_size) if size is not None else None
        pad_to = self.share if pad and self.world_size > 1 else None
        #: The epoch in progress and the ids of it handed over so far (see ``state_dict``).
        self._epoch = 0
        self._consumed = _native.IdSet()
        first_pad_to = None
        if resume is not None:
            self._epoch = int(resume["epoch"])
            consumed = resume.get("consumed") or ""
            self._consumed = _native.IdSet.from_bytes(base64.b64decode(consumed)) if consumed else _native.IdSet()
            left = int(size) - len(self._consumed) if size is not None else None
            if left is not None and left <= 0:  # the whole epoch was handed over: the server starts the next one
                self._epoch += 1
                self._consumed = _native.IdSet()
            elif pad_to is not None and left is not None:
                first_pad_to = -(-left // self.world_size)
        aug = transform._native() if isinstance(transform, RandomResizedCrop) else None
        old = getattr(self, "_prefetch", None)
        if old is not None:
            for stage, seconds in old.stage_cpu().items():
                self._stage_cpu_before[stage] = self._stage_cpu_before.get(stage, 0.0) + seconds
        self._prefetch = _native.Prefetcher(
            self.instance, self.ring, self.batch_size, prefetch, aug, self.seed,
            None if mean is None else [float(m) for m in mean],
            None if std is None else [float(s) for s in std],
            threads, pad_to, open_timeout, first_pad_to, self.padded,
        )
        self._handed = False
        self._finished = False
        #: Element ids, epochs and positions of the batch yielded last (int64 arrays); a padded
        #: element appears with its own id and position again.
        self.last_ids: np.ndarray = np.empty((0,), np.int64)
        self.last_epochs: np.ndarray = np.empty((0,), np.int64)
        self.last_positions: np.ndarray = np.empty((0,), np.int64)

    def __iter__(self) -> Iterator[Any]:
        """Iterates one epoch. Breaking out of the loop and iterating again
        continues the same epoch (the server's order cannot be rewound)."""
        while not self._finished:
            d = self._prefetch.next(self.timeout)
            if d is None:
                self._finished = True
                return
            if d["errors"]:
                failures = [ElementFailure(*e) for e in d["errors"]]
                if self.on_error == "raise":
                    raise ElementLoadError(failures)
                self.failures.extend(failures)
            if d["end_of_stream"]:
                self._finished = True
            ended = d["end_of_epoch"] is not None or d["end_of_stream"]
            images, labels = d["images"], d["labels"]
            if len(labels):
                epoch = int(d["epochs"][0])
                if epoch != self._epoch:
                    self._epoch, self._consumed = epoch, _native.IdSet()
            if ended:
                self._epoch, self._consumed = self._epoch + 1, _native.IdSet()
            if len(labels) and not (ended and self.drop_last and len(labels) < self.batch_size):
                self._handed = True
                if not ended:
                    # Handed over now: a checkpoint taken while the user holds it counts it.
                    self._consumed.add(list(d["element_ids"]))
                self.last_ids = np.asarray(d["element_ids"], dtype=np.int64)
                self.last_epochs = np.asarray(d["epochs"], dtype=np.int64)
                self.last_positions = np.asarray(d["positions"], dtype=np.int64)
                if self.padded and isinstance(self.transform, RandomResizedCrop):
                    images = Padded(images, d["sizes"], d["boxes"], d["flips"],
                                    self.transform.height, self.transform.width)
                if self.fields is not None:
                    batch = self._as_dict(images, labels, d)
                    if self.transform is not None and not isinstance(self.transform, RandomResizedCrop):
                        yield self.transform(batch)  # type: ignore[call-arg,arg-type]
                    else:
                        yield batch
                elif self.transform is not None and not isinstance(self.transform, RandomResizedCrop):
                    yield self.transform(images, labels)
                else:
                    yield images, labels
            if ended:
                return

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank is: the epoch in progress and the ids of it handed over (see the
        class docs). A plain dict of str and int, for ``torch.save`` or JSON."""
        state: Dict[str, Any] = {
            "job": self.job,
            "epoch": self._epoch,
            "consumed": base64.b64encode(self._consumed.to_bytes()).decode(),
            "world_size": self.world_size,
            "ranks": [self.rank],
        }
        if self.dataset_fingerprint is not None:
            state["dataset_fingerprint"] = self.dataset_fingerprint
        return state

    def load_state_dict(self, state: Dict[str, Any], barrier: Optional[Callable[[], None]] = None) -> None:
        """Continues from ``state`` (a `state_dict`, merged over the ranks with `merge_states`):
        before the first batch is taken, the job is registered again, resumed. With several
        ranks pass ``barrier`` (e.g. ``torch.distributed.barrier``; `joader.torch` does), so
        that every rank has let go of the job before any registers it again; or build the
        loader with ``resume=state`` instead."""
        if self._handed:
            raise ValueError("load_state_dict must come before the first batch is taken")
        check_resumable(state, self.world_size)  # before the job is let go
        if self.world_size > 1 and barrier is None:
            raise ValueError("with several ranks, pass barrier= or build the Loader with resume=state")
        if barrier is not None:
            barrier()  # every rank has registered and opened its ring: none is cut off below
        self._prefetch.close()
        try:
            _post_json(f"{self._server.rstrip('/')}/v1/jobs/{self.job}", None, self._request_timeout,
                       self._token, method="DELETE")
        except ServerError as e:
            if e.code != "job_not_found":  # another rank deleted it first
                raise
        if barrier is not None:
            barrier()
        self._start(state)

    @property
    def finished(self) -> bool:
        """True once the server sent the end of the stream."""
        return self._finished

    @property
    def classes(self) -> List[str]:
        """The dataset's class names, label ``i`` the ``i``-th, as ``GET /v1/datasets/{name}``
        gives them: an image folder's class folders, Hugging Face's ``ClassLabel`` names, the
        sorted texts of a string class column, member or manifest cell, or ``"0"`` to the
        largest numeric label. Asked of the server once."""
        if self._classes is None:
            dataset = str(self._register["dataset"])
            view = _post_json(f"{self._server.rstrip('/')}/v1/datasets/{urllib.parse.quote(dataset)}", None,
                              self._request_timeout, self._token, method="GET")
            self._classes = [str(c) for c in view.get("classes") or []]
        return list(self._classes)

    @property
    def buffers_allocated(self) -> int:
        """Batch buffers the prefetch has allocated (its depth plus the batches you hold)."""
        return int(self._prefetch.buffers_allocated)

    def stage_cpu(self) -> Dict[str, float]:
        """Seconds of thread CPU per stage of the prefetch since the loader started, over its
        prefetch thread and augmentation threads: ``wait`` (for records; about zero, a spinning
        wait would show here), ``copy`` (images out of their slots unchanged), ``crop_resize``,
        ``flip`` (uint8; a float32 image is mirrored in ``normalize``), ``normalize``,
        ``collate`` (the batch around the images: shapes, labels, ids, acknowledgements,
        padding) and ``handover`` (a prepared batch to your loop, buffers back). Their sum is
        the prefetch threads' CPU time; a thread's time since its last stage boundary is not in
        yet. Readable after ``close``."""
        now = self._prefetch.stage_cpu()
        return {k: v + self._stage_cpu_before.get(k, 0.0) for k, v in now.items()}

    def close(self) -> None:
        """Stops the prefetch and detaches from the ring; arrays already handed out stay valid."""
        self._prefetch.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _field_values(kind: str, fixed: bool, values: Any) -> Any:
    """A small field's values of a batch as Python values: text as ``str``, JSON parsed,
    ``.npy`` as arrays (stacked when the field declares a fixed shape and every item has
    it: the prefetch hands those over stacked, ``(first item, every item's data, n)``), bytes as
    they are; ``None`` where an item lacks an optional field."""
    if kind == "text":
        return [None if v is None else v.decode("utf-8") for v in values]
    if kind == "json":
        return [None if v is None else json.loads(v) for v in values]
    if kind == "npy" and isinstance(values, tuple):
        # Stacked natively: the first item's .npy (its header gives dtype and shape), then
        # every item's data end to end, a uint8 array of its own (viewed, not copied).
        first, data, n = values
        one = np.load(io.BytesIO(first), allow_pickle=False)
        return data.view(one.dtype).reshape((n,) + one.shape)
    if kind == "npy":
        arrays = [None if v is None else np.load(io.BytesIO(v), allow_pickle=False) for v in values]
        if fixed and arrays and all(a is not None for a in arrays):
            return np.stack(arrays)  # type: ignore[arg-type]
        return arrays
    return list(values)
