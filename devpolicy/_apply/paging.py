"""The pages that windows of a mapped host array leave behind: advised and given back.

A window copied out of a file mapping faults in far more than it copies. Measured on
Linux 6.18 (a 19.09 GiB token file mapped read-only, 10,000 steps of 32 random windows of
1,025 uint16 tokens, about 650 MB copied), the process's resident memory grew by:

- 12.4 GiB with the kernel's defaults: read-ahead reads 128 KiB and more around each
  2 KiB window, and fault-around maps up to 64 KiB of cached neighbours with it;
- 1.7 GiB with `MADV_RANDOM` alone (no read-ahead; the pages touched stay mapped);
- 0.6 GiB with `MADV_RANDOM` and `MADV_DONTNEED` on each window's own pages (fault-around
  still maps cached neighbours, which nobody gives back);
- 0.2 MiB with `MADV_RANDOM` and `MADV_DONTNEED` on the 64 KiB-aligned blocks each window
  lies in (fault-around works in such blocks): what this module does.

The pages are file cache: the kernel could reclaim them, but they count in the process's
RSS and in a container's memory limit, so a long run looks like a leak and can be killed
for one. `MADV_DONTNEED` only unmaps them from this process: for a file mapping that is
shared or read-only, the next read faults the same bytes back from the page cache or the
file. It is never used on anything else: on anonymous memory (a buffer a tensor was read
into) or a private writable mapping it would throw data away, so those are left alone.
`MADV_RANDOM` also saves the disk the read-ahead: random windows from a file not in the
page cache read what they copy, not 64 times as much.

Giving back costs about 0.5 ms a step of 32 windows in a JAX process (one `madvise` a
block, about 15-25 us each; `benchmarks/bench_windows.py`, paired). Sweeping the whole
view instead (one call) costs as much or more once its page tables are spread over the
file (the kernel walks all of them), so the sweep is only the rare backstop.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import sys
import threading
from typing import Any

import numpy as np

#: Fault-around's span: the kernel maps cached pages around a fault in aligned blocks of
#: this size (its `fault_around_bytes`, 64 KiB by default since Linux 3.15), so a window's
#: pages are given back by the blocks they lie in.
_BLOCK = max(65_536, mmap.PAGESIZE)
#: Every this many batches the whole view is given back too: what a kernel maps beyond
#: the blocks (a larger fault-around, a large folio mapped at once) cannot pile up. It
#: costs one walk of the view's page tables (about 0.4 ms for 19 GiB).
_SWEEP_EVERY = 64

_lock = threading.Lock()
#: Views with random-access advice, by (start, end): how many streams asked for it.
_random_advised: dict[tuple[int, int], int] = {}


def _madvise() -> Any:
    """libc's `madvise`, or None where there is none to call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_MADVISE = _madvise()


def releasable_range(view: np.ndarray[Any, Any]) -> tuple[int, int] | None:
    """The page-aligned address range of the file mapping(s) `view` lies in, if giving
    its pages back is safe; else None.

    Safe means: `view` is C-contiguous and every mapping it spans is file-backed and
    either shared or not writable, so a page dropped from this process reads back the
    same bytes. Anonymous memory, private writable mappings and systems without
    `/proc/self/maps` get None.
    """
    if _MADVISE is None or not view.size or not view.flags.c_contiguous:
        return None
    start = view.ctypes.data
    end = start + view.nbytes
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    spans: list[tuple[int, int, bool]] = []
    for line in lines:
        # address perms offset dev inode [path]: inode 0 is anonymous memory.
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        low, _, high = fields[0].partition("-")
        try:
            lo, hi = int(low, 16), int(high, 16)
        except ValueError:
            continue
        if hi <= start or lo >= end:
            continue
        perms = fields[1]
        safe = fields[4] != "0" and (perms[3:4] == "s" or perms[1:2] != "w")
        spans.append((lo, hi, safe))
    spans.sort()
    if not spans or spans[0][0] > start or not all(safe for _, _, safe in spans):
        return None
    for (_, hi, _), (lo, _, _) in itertools.pairwise(spans):
        if hi != lo:  # a hole in the view's range: not one mapping
            return None
    if spans[-1][1] < end:
        return None
    return spans[0][0], spans[-1][1]


class Pager:
    """Gives back the pages that windows of one mapped view were copied from.

    One per stream. `release` is called with each batch's offsets once the batch is
    copied; `close` ends the random-access advice when the last random stream over the
    view ends. On anything that is not a safe file mapping it does nothing.

    Example:
        >>> import numpy as np
        >>> pager = Pager(np.arange(10), random=True)  # anonymous memory: left alone
        >>> pager.active
        False
        >>> pager.release([0, 5], 3)
        >>> pager.close()
    """

    def __init__(self, view: np.ndarray[Any, Any], *, random: bool) -> None:
        self._range = releasable_range(view)
        self._advised: tuple[int, int] | None = None  # the range given MADV_RANDOM
        self._batches = 0
        self._data = view.ctypes.data
        self._row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
        if self._range is not None and random:
            with _lock:
                count = _random_advised.get(self._range, 0)
                if count or self._advise(*self._range, mmap.MADV_RANDOM):
                    _random_advised[self._range] = count + 1
                    self._advised = self._range

    @property
    def active(self) -> bool:
        """Whether pages are given back (the view is a safe file mapping)."""
        return self._range is not None

    def _advise(self, start: int, end: int, advice: int) -> bool:
        """madvise over [start, end); on failure, stop giving pages back for good."""
        if _MADVISE(start, end - start, advice) == 0:
            return True
        self._range = None  # e.g. a device mapping that refuses the advice
        return False

    def release(self, offsets: list[int], length: int) -> None:
        """Give back the blocks that the windows at `offsets` (`length` rows each) lie in."""
        bounds = self._range
        if bounds is None:
            return
        low, high = bounds
        self._batches += 1
        if self._batches % _SWEEP_EVERY == 0:
            self._advise(low, high, mmap.MADV_DONTNEED)
            return
        row, data = self._row, self._data
        blocks = sorted(
            (
                max(low, (data + offset * row) // _BLOCK * _BLOCK),
                min(high, -(-(data + (offset + length) * row) // _BLOCK) * _BLOCK),
            )
            for offset in offsets
        )
        start, end = blocks[0]
        for lo, hi in blocks[1:]:
            if lo > end:
                if not self._advise(start, end, mmap.MADV_DONTNEED):
                    return
                start = lo
            end = max(end, hi)
        self._advise(start, end, mmap.MADV_DONTNEED)

    def close(self) -> None:
        """End this stream's random-access advice (the last stream over a view restores
        the kernel's default, read-ahead included). Safe to call twice."""
        key, self._advised = self._advised, None
        if key is None:
            return
        with _lock:
            _random_advised[key] -= 1
            if not _random_advised[key]:
                del _random_advised[key]
                _MADVISE(key[0], key[1] - key[0], mmap.MADV_NORMAL)
