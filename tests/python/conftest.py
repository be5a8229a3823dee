"""Shared by the tests of the Python client against the real server: `need`, the import of a
tool that a test cannot run without, and `start_serve`, a `joader serve` child."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import pytest

#: Set by tests/all.sh, which installs every tool the tests need: a missing one is then a
#: failure of the test command, never a skip that would pass unseen.
REQUIRE_TOOLS = os.environ.get("JOADER_REQUIRE_TOOLS") == "1"


def need(module: str, why: str) -> Any:
    """Imports `module` for a test that cannot run without it. When it is missing the test
    skips, saying so, or fails naming it under JOADER_REQUIRE_TOOLS=1."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = f"{module} is not installed ({why}): {e}"
    # Outside the handler: the report says what is missing, not the import's traceback.
    if REQUIRE_TOOLS:
        pytest.fail(f"JOADER_REQUIRE_TOOLS=1 and {missing}", pytrace=False)
    pytest.skip(missing)


def start_serve(binary: str, args: List[str],
                env: Optional[Dict[str, str]] = None) -> Tuple["subprocess.Popen[str]", str]:
    """Starts `binary serve --bind 127.0.0.1:0 ARGS` (with `env` added to the environment) and
    returns the process and its URL, read from the `addr=` of its log; the rest of the log is
    drained so that the server never blocks on a full pipe. The caller stops it (SIGTERM) and
    checks its exit."""
    proc = subprocess.Popen([binary, "serve", "--bind", "127.0.0.1:0", *args], stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "JOADER_LOG": "info", **(env or {})})
    assert proc.stderr is not None
    url = None
    for line in proc.stderr:
        m = re.search(r"addr=(\S+)", line)
        if m:
            url = f"http://{m.group(1)}"
            break
    assert url, "joader serve did not start"
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, url


def post(url: str, path: str, body: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
    """POSTs `body` as JSON: the status and the JSON answer (an error's too)."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(url: str, path: str) -> Dict[str, Any]:
    """GETs a JSON answer."""
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def wait_indexed(url: str, dataset: str) -> Dict[str, Any]:
    """The dataset's view once it has left `indexing` (ready or failed)."""
    deadline = time.monotonic() + 120
    while True:
        view = get(url, f"/v1/datasets/{dataset}")
        if view["state"] != "indexing":
            return view
        assert time.monotonic() < deadline, f"dataset {dataset} still indexing after 120 s"
        time.sleep(0.05)


def create(url: str, name: str, source: Dict[str, Any]) -> Dict[str, Any]:
    """Creates a dataset and returns its view once indexed (ready or failed)."""
    status, body = post(url, "/v1/datasets", {"name": name, "source": source})
    assert status in (200, 201, 202), body
    return wait_indexed(url, name)


def s3_store(root: str, key: str, secret: str) -> Tuple["subprocess.Popen[bytes]", Dict[str, str]]:
    """Starts a real S3 server (`s3s-fs`, the binary JOADER_S3S_FS names) over the folder
    `root` (each of its folders a bucket) on a free port; returns it and the environment a
    `joader serve` reads it with. The test skips without the binary, or fails under
    JOADER_REQUIRE_TOOLS=1. The caller kills it."""
    import socket
    s3s_fs = os.environ.get("JOADER_S3S_FS", "")
    if not os.access(s3s_fs, os.X_OK):
        missing = f"JOADER_S3S_FS={s3s_fs!r} names no s3s-fs binary (tests/all.sh builds one)"
        if REQUIRE_TOOLS:
            pytest.fail(f"JOADER_REQUIRE_TOOLS=1 and {missing}", pytrace=False)
        pytest.skip(missing)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = subprocess.Popen([s3s_fs, "--host", "127.0.0.1", "--port", str(port), "--access-key", key,
                              "--secret-key", secret, root],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert store.poll() is None and time.monotonic() < deadline, "s3s-fs did not start"
            time.sleep(0.05)
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true"}
    return store, env
