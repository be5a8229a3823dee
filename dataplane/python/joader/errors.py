"""The errors the client raises beyond the native `JoaderError`: the REST API's, and an
element the server could not load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ._native import JoaderError

# JoaderError is created by the native module; give it readable attributes.
setattr(JoaderError, "code", property(lambda self: self.args[0] if self.args else "unknown"))
setattr(JoaderError, "message", property(lambda self: self.args[1] if len(self.args) > 1 else ""))
setattr(JoaderError, "__str__", lambda self: f"[{self.code}] {self.message}")


class ServerError(JoaderError):
    """The REST API answered with an error: ``code`` and ``message`` come from its
    ``{"error": {"code", "message"}}`` body, ``status`` is the HTTP status (0 if unreachable)."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(code, message)
        self.status = status


@dataclass(frozen=True)
class ElementFailure:
    """An element the server could not load (an error record of the ring)."""

    element_id: int
    code: int
    code_name: str
    epoch: int
    position: int


class ElementLoadError(JoaderError):
    """Raised by `Loader` (with ``on_error="raise"``) when the server reports failed elements."""

    def __init__(self, failures: List[ElementFailure]) -> None:
        first = failures[0]
        super().__init__(
            "element_failed",
            f"{len(failures)} element(s) failed to load, first: element {first.element_id} "
            f"({first.code_name}, code {first.code}) at epoch {first.epoch} position {first.position}",
        )
        self.failures = failures
