"""Type stubs of the native extension (Rust, PyO3)."""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str
LAYOUT_VERSION: int

class JoaderError(Exception):
    """``args`` is ``(code, message)``; `joader` adds ``.code`` and ``.message``."""

    code: str
    message: str

class KeepAlive: ...

class RingReader:
    def __init__(self, instance: str, ring: str, open_timeout: float = 5.0) -> None: ...
    def take(self, max_items: int, timeout: Optional[float] = None) -> Dict[str, Any]: ...
    def release(self, start: int) -> None: ...
    def views(self, start: int) -> List[npt.NDArray[np.uint8]]: ...
    def collate_into(
        self,
        start: int,
        images: npt.NDArray[np.uint8],
        labels: npt.NDArray[np.int64],
        aug: Optional[Tuple[int, int, float, float, float, float, float]] = None,
        seed: int = 0,
    ) -> Tuple[int, int, int, int]: ...
    def check_server(self) -> None: ...
    def keepalive(self) -> KeepAlive: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def instance(self) -> str: ...
    @property
    def ring(self) -> str: ...
    @property
    def reader_index(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def server_pid(self) -> int: ...

def element_error_name(code: int) -> str: ...
def augment_image(
    image: bytes,
    height: int,
    width: int,
    channels: int,
    aug: Tuple[int, int, float, float, float, float, float],
    seed: int,
    epoch: int,
    position: int,
) -> bytes: ...

class Lease: ...

class Prefetcher:
    def __init__(
        self,
        instance: str,
        ring: str,
        batch_size: int,
        depth: int = 2,
        aug: Optional[Tuple[int, int, float, float, float, float, float]] = None,
        seed: int = 0,
        mean: Optional[List[float]] = None,
        std: Optional[List[float]] = None,
        threads: Optional[int] = None,
        pad_to: Optional[int] = None,
        open_timeout: float = 10.0,
    ) -> None: ...
    def next(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]: ...
    @property
    def buffers_allocated(self) -> int: ...
    def close(self) -> None: ...
