"""Functions of the C library this process runs on, for the few calls Python lacks.

`madvise` on an address range (`_read.pages`) and `syscall` for io_uring (`_read.uring`): Linux
only, through ctypes, each loaded once with errno kept for the caller to read
(`ctypes.get_errno`).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any


def linux_function(name: str, restype: Any, argtypes: list[Any] | None = None) -> Any:
    """libc's `name`, returning `restype` (and taking `argtypes`, where given), or None
    where it cannot be had: not Linux, no C library to load, or no such function."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    if argtypes is not None:
        function.argtypes = argtypes
    function.restype = restype
    return function
