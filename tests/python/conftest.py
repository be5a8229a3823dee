"""Shared by the tests of the Python client against the real server: `need`, the import of a
tool that a test cannot run without."""

from __future__ import annotations

import importlib
import os
from typing import Any

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
