"""Windows gathered from tokens in memory: one array's strided view of every window, or
a mixture's arrays (each source's windows straight into the group's buffer). No JAX here."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..mixing import MixedViews
from . import ReadPath


class MemoryGather(ReadPath):
    """Gathers windows with one fancy index (`windows`: every window of the tokens, a
    read-only strided view), or from a mixture's sources.

    Example:
        >>> from devpolicy._apply.stream.groups import every_window
        >>> path = MemoryGather(every_window(np.arange(10), 3), None)
        >>> path.gather(np.array([[0, 7]])).tolist()
        [[[0, 1, 2], [7, 8, 9]]]
    """

    __slots__ = ("_mixture", "_windows")

    def __init__(self, windows: np.ndarray[Any, Any], mixture: MixedViews | None) -> None:
        self._windows = windows
        self._mixture = mixture

    def gather(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if self._mixture is not None:
            return self._mixture.gather(offsets)
        return self._windows[offsets]  # type: ignore[no-any-return]  # one copy

    def read_into(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]],
                  whole: np.ndarray[Any, Any] | None) -> bool:  # fmt: skip
        if self._mixture is None or whole is None:
            return False
        self._mixture.gather(offsets, whole)  # each source's windows straight into it
        return True
