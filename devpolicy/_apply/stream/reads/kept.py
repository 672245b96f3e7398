"""Windows gathered from a file mapping whose pages are kept: a warm file's pages are the
page cache already, and giving them back only makes the next fault map them again. The
stream looks at the memory left every few groups, and gives the pages back once it runs
low; a random stream whose windows each map a large folio turns to reading by position.
No JAX here."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...._base.sizes import format_size
from ...._machine.capacity import host_total_bytes, memory_headroom
from ...._read.pages import Pager
from ...._read.positional import FileWindows
from ..mixing import MixedViews
from ..reading import ReadOptions
from .memory import MemoryGather


class KeptMapping(MemoryGather):
    """A mapping gathered from, its pages kept (`pager`: the view's, which measures what a
    window brings in; None for a mixture's several mappings)."""

    __slots__ = ("_groups", "_length", "_options", "_own", "_pager", "_watch")

    key = "keep"
    reads = "mapping"
    ahead = True

    def __init__(
        self,
        windows: np.ndarray[Any, Any],
        mixture: MixedViews | None,
        pager: Pager | None,
        length: int,
        options: ReadOptions,
        watch: FileWindows | None = None,
        *,
        own: bool = False,
    ) -> None:
        super().__init__(windows, mixture)
        # The files' reader, whose `check_whole` is looked at before each group is
        # gathered (the files its windows read: of a thousand shards, those few): a file
        # truncated between two groups is an error naming it, not SIGBUS
        # (a truncation during a gather still is, as any read of a mapping past its
        # file's end). Closed with this path where `own` (opened for it alone).
        self._watch = watch
        self._own = own
        self._pager = pager
        self._length = length
        self._options = options
        self._groups = 0  # groups gathered: the memory left is looked at every few

    def gather(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if self._watch is not None:
            self._watch.check_whole(offsets)
        return super().gather(offsets)

    def read_into(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]],
                  whole: np.ndarray[Any, Any] | None) -> bool:  # fmt: skip
        if self._watch is not None and self._mixture is not None and whole is not None:
            self._watch.check_whole(offsets)
        return super().read_into(offsets, batches, whole)

    def given_up(self) -> str | None:
        self._groups += 1
        if folios(self._pager, self._length, self._options):
            return "a window was measured to bring in a large folio"
        if self._groups % self._options.keep_check_every:
            return None
        room, total = memory_headroom(), host_total_bytes()
        if room is None or total is None or room >= self._options.low_memory_share * total:
            return None
        return f"the memory this process can still use fell to {format_size(room)}"

    def sweep(self) -> None:
        """Give the mapping's pages back now (a trial settled on another path)."""
        if self._pager is not None:
            self._pager.sweep()

    def close(self, *, sweep: bool = False) -> None:
        pager, self._pager = self._pager, None
        try:
            let_go(pager, sweep=sweep)
        finally:
            self._unwatch()

    def abandon(self, *, child: bool) -> None:
        pager, self._pager = self._pager, None
        try:
            let_go(pager, child=child)
        finally:
            self._unwatch()

    def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and self._own:
            watch.close()


def let_go(pager: Pager | None, *, sweep: bool = False, child: bool = False) -> None:
    """End `pager`'s advice (with `sweep`, its pages given back first), or in a forked
    child (`child`), whose advice and pages are the parent's, only its descriptor."""
    if pager is None:
        return
    if child:
        pager.close_descriptor()
        return
    if sweep:
        pager.sweep()
    pager.close()


def folios(pager: Pager | None, length: int, options: ReadOptions) -> bool:
    """Whether the mapping's windows were measured to bring in far more than small pages
    would: the kernel maps each a large folio (a whole 2 MiB)."""
    return pager is not None and pager.maps_more(length, options.large_footprint)
