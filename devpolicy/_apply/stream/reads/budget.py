"""Windows gathered from a file mapping, its pages given back once they near a budget
(a random stream), or after each group: where the file cannot be read by position (a
view over several mappings, a file gone from its path). No JAX here."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...._read.pages import Pager
from ..reading import ReadOptions
from . import ReadPath
from .kept import folios, let_go


class BudgetMapping(ReadPath):
    """A mapping gathered from through `pager`, which gives the pages back past `budget`
    bytes (None: each group's)."""

    __slots__ = ("_budget", "_length", "_options", "_pager", "_windows")

    key = "budget"
    reads = "mapping"
    ahead = True

    def __init__(
        self,
        windows: np.ndarray[Any, Any],
        pager: Pager,
        budget: int | None,
        length: int,
        options: ReadOptions,
    ) -> None:
        self._windows = windows
        self._pager: Pager | None = pager
        self._budget = budget
        self._length = length
        self._options = options

    def gather(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        pager = self._pager
        if pager is None:  # closed under a worker's feet: the windows all the same
            return self._windows[offsets]  # type: ignore[no-any-return]
        return pager.gather(self._windows, offsets, self._budget)

    def given_up(self) -> str | None:
        if folios(self._pager, self._length, self._options):
            return "a window was measured to bring in a large folio"
        return None

    def close(self, *, sweep: bool = False) -> None:
        pager, self._pager = self._pager, None
        let_go(pager, sweep=sweep)

    def abandon(self, *, child: bool) -> None:
        pager, self._pager = self._pager, None
        let_go(pager, child=child)
