"""Shared by the tests of the Python client against the real server: `need`, the import of a
tool that a test cannot run without, and `start_serve`, a `joader serve` child."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import threading
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
