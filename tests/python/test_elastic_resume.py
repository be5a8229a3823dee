"""Elastic resume against the real joader server: a checkpoint continues on any number of ranks.

The issue's case as a user meets it: two `joader.Loader` ranks stopped after 5 batches each,
their `state_dict()`s merged with `joader.merge_states`, resumed by one rank: it receives
exactly the rest of the epoch, then a whole one; one rank's state alone is refused, naming the
missing rank (by the client, and by the server for a client that would send it). Then
`torchrun --nproc_per_node 2` saves a state mid-epoch through `JoaderDataset.state_dict()` and
`torchrun --nproc_per_node 1` and `--nproc_per_node 3` resume it: the ids handed out before and
after are the epoch exactly once, the new ranks' shares equal (padded as DistributedSampler
pads), and the next epoch a whole permutation shared by the new ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

import joader
from conftest import need, start_serve

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
N, BATCH = 101, 8


def call(url: str, path: str, body: Any = None, method: str = "GET") -> Dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def wait_for(what: str, probe: Any, deadline_s: float = 120.0) -> Any:
    """Polls ``probe`` until it returns something truthy; fails naming ``what`` after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < end, f"waited {deadline_s} s for {what}"
        time.sleep(0.05)


def job_state(url: str, name: str) -> str:
    try:
        return str(call(url, f"/v1/jobs/{name}")["state"])
    except urllib.error.HTTPError:
        return "absent"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A server over an ImageFolder of N small PNGs (4 classes), dataset ``imgs``."""
    image = need("PIL.Image", "tests/all.sh installs Pillow")
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    tmp = Path(tempfile.mkdtemp(prefix="joader-elastic-"))
    rng = np.random.default_rng(5)
    for i in range(N):
        d = tmp / "imgs" / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(d / f"{i:03d}.png")
    instance = f"pyel_{os.getpid()}"
    proc, url = start_serve(str(BIN), ["--instance", instance, "--data-dir", str(tmp / "state"),
         "--allowed-root", str(tmp / "imgs"), "--cache-bytes", str(32 << 20), "--cache-slots", "1024"])
    call(url, "/v1/datasets", {"name": "imgs", "source": {"kind": "image_folder", "path": str(tmp / "imgs")}}, "POST")
    wait_for("the dataset indexed", lambda: call(url, "/v1/datasets/imgs")["state"] == "ready")
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"joader-{instance}-")], "segments left behind"


def loader(url: str, job: str, **kw: Any) -> joader.Loader:
    return joader.Loader(server=url, dataset="imgs", job=job, batch_size=BATCH, epochs=2, seed=4,
                         pipeline={"kind": "decode"}, timeout=60, **kw)


def test_two_ranks_merged_resume_on_one_rank_and_a_partial_state_is_refused(server: str) -> None:
    # Two ranks stopped after 5 batches each; their states taken while they hold the last one.
    states: List[Dict[str, Any]] = [{}, {}]
    seen: List[List[int]] = [[], []]
    errors: List[BaseException] = []

    def rank(r: int) -> None:
        try:
            ld = loader(server, "elastic-1", rank=r, world_size=2)
            for step, _ in enumerate(ld):
                seen[r] += ld.last_ids.tolist()
                if step == 4:
                    break
            states[r] = ld.state_dict()
            ld.close()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [s["ranks"] for s in states] == [[0], [1]] and states[0]["world_size"] == 2
    before = set(seen[0]) | set(seen[1])
    assert len(seen[0]) == len(seen[1]) == 5 * BATCH and len(before) == 10 * BATCH
    # Its ranks left mid-epoch: the job fails (a job of other ranks may take its name then).
    wait_for("the stopped job to end", lambda: job_state(server, "elastic-1") in ("failed", "finished"))

    # One rank's state alone would deliver its partner's ids again: refused, naming rank 1,
    # by the client before registering, and by the server.
    with pytest.raises(ValueError, match=r"rank\(s\) 1 missing"):
        loader(server, "elastic-1", rank=0, world_size=1, resume=states[0])
    with pytest.raises(joader.ServerError) as refused:
        joader.register_job(server, name="elastic-1", dataset="imgs", batch_size=BATCH, seed=4, epochs=2,
                            pipeline={"kind": "decode"}, resume=states[0])
    assert refused.value.code == "invalid_resume" and "[1] missing" in refused.value.message
    with pytest.raises(ValueError, match="more than one"):
        joader.merge_states([states[0], states[0]])

    merged = joader.merge_states(states)
    assert merged["ranks"] == [0, 1] and merged["world_size"] == 2
    with loader(server, "elastic-1", rank=0, world_size=1, resume=merged) as ld:
        rest = [i for _ in ld for i in ld.last_ids.tolist()]
        assert len(rest) == N - len(before) and not set(rest) & before
        assert sorted(before | set(rest)) == list(range(N)), "before and after: the epoch exactly once"
        nxt = [i for _ in ld for i in ld.last_ids.tolist()]
        assert sorted(nxt) == list(range(N)), "the next epoch is whole"
        assert not list(ld) and ld.finished, "two epochs, counted from epoch 0"


ELASTIC_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import joader.torch as jt
url, n, phase, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo")
ds = jt.JoaderDataset(server=url, dataset="imgs", job="elastic-tr", batch_size=8, epochs=2, seed=4,
                      subset={"start": 0, "end": n}, pipeline={"kind": "decode"})
out = []
if phase == "first":
    ids, steps = [], 0
    for x, y in ds:
        ids += ds.loader.last_ids.tolist()
        steps += 1
        if steps == 3:
            state = ds.state_dict()  # a collective: the ranks' states gathered and merged
            break
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (ids, steps))
    if dist.get_rank() == 0:
        json.dump({"data": state, "seen": every}, open(ckpt, "w"))
        print(json.dumps(every))
    os._exit(0)  # preempted: the clients are gone without closing
ds.load_state_dict(json.load(open(ckpt))["data"])
for epoch in range(2):
    ids, steps = [], 0
    for x, y in ds:
        ids += ds.loader.last_ids.tolist()
        steps += 1
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (ids, steps))
    out.append(every)
ds.close()
if dist.get_rank() == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


def torchrun(script: Path, url: str, nproc: int, phase: str, ckpt: Path) -> Any:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(script), url, str(N), phase, str(ckpt)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_torchrun_state_saved_on_two_ranks_resumes_on_one_and_on_three(server: str, tmp_path: Path) -> None:
    need("torch", "tests/all.sh installs it")
    script, ckpt = tmp_path / "elastic.py", tmp_path / "ckpt.json"
    script.write_text(textwrap.dedent(ELASTIC_SCRIPT))
    first = torchrun(script, server, 2, "first", ckpt)
    (a0, _), (a1, _) = first
    assert len(a0) == len(a1) == 3 * BATCH
    before = set(a0) | set(a1)
    assert len(before) == 6 * BATCH
    state = json.loads(ckpt.read_text())["data"]
    assert state["ranks"] == [0, 1] and state["world_size"] == 2 and state["epoch"] == 0
    rest = set(range(N)) - before
    for nproc in (1, 3):
        # The previous run's job must have ended before this one registers with other ranks.
        wait_for("the previous run's job to end",
                 lambda: job_state(server, "elastic-tr") in ("failed", "finished", "absent"))
        epochs = torchrun(script, server, nproc, "resume", ckpt)
        assert len(epochs) == 2
        share = -(-len(rest) // nproc)
        shares: List[Tuple[List[int], int]] = epochs[0]
        # Equal shares (the short ones padded with their own first id), equal steps.
        assert [len(ids) for ids, _ in shares] == [share] * nproc, (nproc, shares)
        assert len({steps for _, steps in shares}) == 1
        ids = [set(i) for i, _ in shares]
        assert sum(len(s) for s in ids) == len(rest), "the new ranks' shares are disjoint"
        assert set().union(*ids) == rest and not rest & before
        assert sorted(before | set().union(*ids)) == list(range(N)), f"{nproc} rank(s): the epoch exactly once"
        whole = -(-N // nproc)
        nxt = epochs[1]
        assert [len(i) for i, _ in nxt] == [whole] * nproc
        assert set().union(*[set(i) for i, _ in nxt]) == set(range(N)), "the next epoch is whole"
        assert sum(len(set(i)) for i, _ in nxt) == N, "and shared disjointly"


LAST_STEP_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import joader.torch as jt
url, n, phase, ckpt, job = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo")
world = dist.get_world_size()
ds = jt.JoaderDataset(server=url, dataset="imgs", job=job, batch_size=8, epochs=2, seed=4,
                      subset={"start": 0, "end": n}, pipeline={"kind": "decode"})
if phase == "first":
    # Saved at the epoch's last step, inside the loop: before the next batch is asked for.
    last = -(-(-(-n // world)) // 8)
    steps = 0
    for x, y in ds:
        steps += 1
        if steps == last:
            state = ds.state_dict()  # a collective: every rank's state, merged
            break
    if dist.get_rank() == 0:
        json.dump({"data": state}, open(ckpt, "w"))
        print(json.dumps(state))
    os._exit(0)
ds.load_state_dict(json.load(open(ckpt))["data"])
ids, steps = [], 0
for x, y in ds:
    ids += ds.loader.last_ids.tolist()
    steps += 1
every = [None] * world
dist.all_gather_object(every, (ids, steps))
ds.close()
if dist.get_rank() == 0:
    print(json.dumps(every))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("n", [15, 16])
def test_a_state_saved_at_an_epochs_last_step_merges_and_resumes_with_the_next_epoch(
        server: str, tmp_path: Path, n: int) -> None:
    """Two ranks, batches of 8: with 16 elements each rank's share (8) is one whole batch;
    with 15 rank 0's is one whole batch and rank 1's 7 plus its padding. Saved at the epoch's
    last step, every rank's state is in the next epoch, so they merge; resumed on three ranks
    the job gets the next epoch whole."""
    need("torch", "tests/all.sh installs it")
    script, ckpt, job = tmp_path / "last.py", tmp_path / "ckpt.json", f"last-step-{n}"
    script.write_text(textwrap.dedent(LAST_STEP_SCRIPT))

    def run(nproc: int, phase: str) -> Any:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(script), server, str(n), phase, str(ckpt), job]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert p.returncode == 0, p.stderr[-4000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    state = run(2, "first")
    assert state["epoch"] == 1 and state["ranks"] == [0, 1], state
    wait_for("the first run's job to end", lambda: job_state(server, job) in ("failed", "finished", "absent"))
    shares = run(3, "resume")
    whole = -(-n // 3)
    assert [len(ids) for ids, _ in shares] == [whole] * 3, shares
    assert set().union(*[set(ids) for ids, _ in shares]) == set(range(n)), "the next epoch, whole"
    assert sum(len(set(ids)) for ids, _ in shares) == n, "shared disjointly"
