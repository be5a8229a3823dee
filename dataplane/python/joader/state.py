"""Resuming: one state for every rank from the ranks' ``state_dict()``s, and the check that
a state can resume at a given world size."""

from __future__ import annotations

import base64
from typing import Any, Dict, Sequence

from . import _native


def merge_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One state for every rank from the ranks' `Loader.state_dict()` (each holds its own share
    of the epoch's handed-over ids): the union of their ids, and of their ``ranks``. The ranks
    must be in one epoch of one job, each rank given once and every rank of the job's
    ``world_size`` given (``ValueError`` naming the missing ones): the merged state then
    resumes on any number of ranks."""
    if not states:
        raise ValueError("no state to merge")
    epochs = {int(s["epoch"]) for s in states}
    if len(epochs) != 1:
        raise ValueError(f"the ranks' states are in different epochs {sorted(epochs)}")
    worlds = {int(s.get("world_size", 1)) for s in states}
    if len(worlds) != 1:
        raise ValueError(f"the states were saved with different world sizes {sorted(worlds)}")
    jobs = {s.get("job") for s in states}
    if len(jobs) != 1:
        raise ValueError(f"the states are of different jobs {sorted(str(j) for j in jobs)}")
    prints = {str(s["dataset_fingerprint"]) for s in states if s.get("dataset_fingerprint") is not None}
    if len(prints) > 1:
        raise ValueError(f"the states were saved on different versions of the dataset {sorted(prints)}")
    ids = _native.IdSet()
    for s in states:
        if s.get("consumed"):
            ids.update(_native.IdSet.from_bytes(base64.b64decode(s["consumed"])))
    merged = {**states[0], "consumed": base64.b64encode(ids.to_bytes()).decode()}
    if any("ranks" not in s for s in states):
        # States saved before states named their ranks: their coverage cannot be checked.
        merged.pop("ranks", None)
        return merged
    ranks = [int(r) for s in states for r in s["ranks"]]
    repeated = sorted({r for r in ranks if ranks.count(r) > 1})
    if repeated:
        raise ValueError(f"rank(s) {repeated} are in more than one of the states: merge each rank's state once")
    world = worlds.pop()
    _check_covered(ranks, world, "the states to merge")
    merged["ranks"] = sorted(ranks)
    return merged


def _check_covered(ranks: Sequence[int], world: int, what: str) -> None:
    """Raises ``ValueError`` unless ``ranks`` are exactly the ranks ``0..world``."""
    outside = sorted({r for r in ranks if not 0 <= r < world})
    if outside:
        raise ValueError(f"{what} name rank(s) {outside}, not below the world_size {world} they were saved with")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        names = ", ".join(str(r) for r in missing)
        raise ValueError(
            f"{what} cover rank(s) {sorted(set(ranks))} of the {world} ranks they were saved with: rank(s) "
            f"{names} missing, whose handed-over ids would be delivered again: merge every rank's "
            f"state_dict() with joader.merge_states (joader.torch.JoaderDataset.state_dict() gathers them)")


def check_resumable(state: Dict[str, Any], world_size: int) -> None:
    """Raises ``ValueError`` unless ``state`` can resume a job of ``world_size`` ranks: a state
    that names the ranks it covers (``"ranks"``) must cover every rank of the job it was saved
    from, and then resumes at any world size; an older state without ``"ranks"`` only at its
    own world size (whether it was merged cannot be told)."""
    saved = int(state.get("world_size", world_size))
    if state.get("ranks") is not None:
        _check_covered([int(r) for r in state["ranks"]], saved, "the state's ranks")
    elif saved != world_size:
        raise ValueError(f"the state was saved with world_size {saved} and names no ranks (an older "
                         f"client's): it resumes only at world_size {saved}, this loader has {world_size}")
