"""The REST client: a job's registration (`register_job`), and the JSON requests under it."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from . import _native
from ._native import LAYOUT_VERSION
from .errors import ServerError


def _post_json(url: str, body: Optional[Dict[str, Any]], timeout: float, token: Optional[str],
               method: str = "POST") -> Dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer: Dict[str, Any] = json.loads(resp.read().decode() or "{}")
            return answer
    except urllib.error.HTTPError as e:
        raw = e.read().decode(errors="replace")
        try:
            err = json.loads(raw)["error"]
            raise ServerError(str(err.get("code", "http_error")), str(err.get("message", raw)), e.code) from None
        except (ValueError, KeyError, TypeError):
            raise ServerError("http_error", f"HTTP {e.code} from {url}: {raw[:200]}", e.code) from None
    except urllib.error.URLError as e:
        raise ServerError("server_unreachable", f"cannot reach joader server at {url}: {e.reason}", 0) from None


def _subset_json(subset: Any) -> Any:
    """``None``, a ``range`` (sent as ``{"start", "end"}``), a mapping of server-side filters
    (``{"classes": [...]}``, ``{"ranges": [[a, b]]}``, ``{"fraction": f, "seed": s}``, …,
    passed as they are) or any iterable of element ids."""
    if subset is None:
        return None
    if isinstance(subset, dict):
        return subset
    if isinstance(subset, range) and subset.step == 1:
        return {"start": subset.start, "end": subset.stop}
    return [int(i) for i in subset]


def register_job(
    server: str,
    *,
    name: str,
    dataset: str,
    batch_size: int,
    subset: Any = None,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    epochs: Optional[int] = None,
    pipeline: Optional[Dict[str, Any]] = None,
    timeout: float = 10.0,
    token: Optional[str] = None,
    sampler: Optional[str] = None,
    resume: Optional[Dict[str, Any]] = None,
    record: bool = False,
    replay: Optional[Dict[str, Any]] = None,
    local_world_size: Optional[int] = None,
    allow_changed_dataset: bool = False,
    ring_capacity: Optional[int] = None,
) -> Dict[str, Any]:
    """``POST {server}/v1/jobs`` (see dataplane/DESIGN.md, "Job registration") and returns the response.
    ``resume`` is ``{"epoch", "consumed"}`` of a `Loader.state_dict()`; ``record`` keeps the
    job's delivery orders (``GET /v1/jobs/{name}/record/{epoch}``); ``replay`` is
    ``{"job", "epoch"}`` of a recorded epoch to receive again, in its order. A ``resume``
    state's ``dataset_fingerprint`` is checked by the server: a dataset whose first items
    differ from those the state was saved on is refused (``ServerError("dataset_changed")``)
    unless ``allow_changed_dataset``.

    ``local_world_size`` (default: ``$LOCAL_WORLD_SIZE`` as torchrun sets it, else all
    ranks) is the number of the job's ranks on this node; below ``world_size`` the job is a
    multi-node job, sampled by the cluster's leader (README, "Running a cluster").
    ``ring_capacity`` is the records of each rank's delivery ring (default: the server's)."""
    if local_world_size is None and "LOCAL_WORLD_SIZE" in os.environ:
        local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    body = {
        "name": name,
        "dataset": dataset,
        "subset": _subset_json(subset),
        "batch_size": batch_size,
        "seed": seed,
        "rank": rank,
        "world_size": world_size,
        "local_world_size": local_world_size,
        "epochs": epochs,
        "pipeline": pipeline,
        "client": {"pid": os.getpid(), "version": _native.__version__, "layout_version": LAYOUT_VERSION},
    }
    if sampler is not None:
        body["sampler"] = sampler
    if ring_capacity is not None:
        body["ring_capacity"] = int(ring_capacity)
    if resume is not None:
        body["resume"] = {"epoch": int(resume["epoch"]), "consumed": str(resume.get("consumed", ""))}
        if resume.get("ranks") is not None:
            # The server checks the coverage again (any client, not only this one).
            body["resume"]["ranks"] = [int(r) for r in resume["ranks"]]
            body["resume"]["world_size"] = int(resume["world_size"])
        if resume.get("dataset_fingerprint") is not None:
            body["resume"]["dataset_fingerprint"] = str(resume["dataset_fingerprint"])
        if allow_changed_dataset:
            body["resume"]["allow_changed_dataset"] = True
    if record:
        body["record"] = True
    if replay is not None:
        body["replay"] = {"job": str(replay["job"]), "epoch": int(replay["epoch"])}
    return _post_json(server.rstrip("/") + "/v1/jobs", body, timeout, token)


def _get_json(url: str, timeout: float, token: Optional[str]) -> Dict[str, Any]:
    return _post_json(url, None, timeout, token, method="GET")


def preload(
    server: str,
    dataset: str,
    *,
    subset: Any = None,
    pipeline: Optional[Dict[str, Any]] = None,
    keep: str = "memory",
    wait: bool = True,
    timeout: Optional[float] = None,
    token: Optional[str] = None,
) -> Dict[str, Any]:
    """Preloads a working set of ``dataset`` into the server's cache and pins it there
    (``POST {server}/v1/datasets/{dataset}/preload``): ``subset`` in `register_job`'s forms
    (``None``: the whole dataset), prepared by ``pipeline`` (``None``: the server's default;
    jobs share the preloaded elements only with the same pipeline). ``keep="disk"`` keeps an
    object-store dataset's stored bytes in the server's disk tier instead (no pipeline). With
    ``wait``, returns
    once the preload is ready (every element pinned or failed); raises ``ServerError`` with
    code ``pin_budget`` when it does not fit (preloads pin half the cache at most),
    ``preload_failed`` when it stopped, ``timeout`` after ``timeout`` seconds. Returns the
    dataset's ``preload`` view (``state``, ``elements``, ``pinned``, ``failed``,
    ``pinned_bytes``, ...). Release it with `release_preload`."""
    import time

    base = server.rstrip("/") + f"/v1/datasets/{dataset}"
    body = {"subset": _subset_json(subset), "pipeline": pipeline, "keep": keep}
    view: Dict[str, Any] = _post_json(base + "/preload", body, 30.0, token)["preload"]
    deadline = None if timeout is None else time.monotonic() + timeout
    while wait and view["state"] == "loading":
        if deadline is not None and time.monotonic() > deadline:
            raise ServerError(
                "timeout",
                f"the preload of {dataset!r} is not ready after {timeout} s "
                f"({view['pinned']} of {view['elements']} elements pinned); it goes on in the server",
                0,
            )
        time.sleep(0.1)
        got = _get_json(base, 30.0, token).get("preload")
        if got is None:
            raise ServerError("preload_not_found", f"the preload of {dataset!r} was released", 404)
        view = got
    if view["state"] == "failed":
        raise ServerError("preload_failed", str(view.get("reason")), 0)
    return view


def append(server: str, dataset: str, paths: List[str], *, timeout: float = 600.0,
           token: Optional[str] = None) -> Dict[str, Any]:
    """Appends ``paths`` to a ready local dataset (``POST {server}/v1/datasets/{dataset}/append``),
    read as its source reads its own: shard files or folders (``tar_shards``), Parquet files or
    folders (``parquet``), manifest files (``manifest``), folders of class folders
    (``image_folder``). The new items take the next ids; running jobs of one rank registered
    without ``subset`` or ``replay`` cover them from their next epoch. Returns ``added``, the
    ``jobs`` that follow (each with its ``from_epoch``) and the ``dataset``'s view; raises
    ``ServerError`` (``cannot_append`` with the reason, ``dataset_not_ready``, ...)."""
    url = server.rstrip("/") + f"/v1/datasets/{dataset}/append"
    return _post_json(url, {"paths": [str(p) for p in paths]}, timeout, token)


def release_preload(server: str, dataset: str, *, token: Optional[str] = None) -> None:
    """Releases ``dataset``'s preload (``DELETE .../preload``): its elements stay cached,
    evictable like any other."""
    _post_json(server.rstrip("/") + f"/v1/datasets/{dataset}/preload", None, 30.0, token, method="DELETE")
