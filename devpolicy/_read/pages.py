"""The pages that windows of a mapped host array leave behind: advised and given back.

A window copied out of a file mapping faults in far more than it copies (read-ahead around it,
fault-around's cached neighbours): file cache the kernel could reclaim, but it counts in the
process's RSS and a container's memory limit, so a long run looks like a leak and can be killed
for one. So a random stream's view gets `MADV_RANDOM` (no read-ahead: random windows from a file
not in the page cache read what they copy), and the pages a stream's windows touched are given
back with `MADV_DONTNEED`: by the 64 KiB blocks fault-around works in (a window's own pages
would leave its neighbours mapped), or the whole view in one sweep, whichever has cost less
(`Pager.release`); each call's cost is why a group of batches is given back at once (measured:
docs/benchmarks.md#the-stream-wings-choices-as-measured). `MADV_DONTNEED` only unmaps: on a
shared or read-only file mapping the next read faults the same bytes back. On anonymous memory
or a private writable mapping it would throw data away, so those are left alone.

Where a stream keeps a warm file's pages instead (chosen in `cutting`), none of this runs;
`cached_share` samples how much of a view the page cache holds, for that choice.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import threading
import time
from typing import Any, Literal

import numpy as np

from .._base.libc import linux_function

#: Fault-around's span: the kernel maps cached pages around a fault in aligned blocks of
#: this size (its `fault_around_bytes`, 64 KiB by default since Linux 3.15), so a window's
#: pages are given back by the blocks they lie in.
_BLOCK = FAULT_AROUND = max(65_536, mmap.PAGESIZE)
#: The most one fault maps: a PMD-sized large folio (2 MiB with 4 KiB pages); a random
#: stream gathers this few windows at a time until it has measured what one brings in.
_LARGEST_FAULT = 2 * 2**20
#: A resident-memory read dearer than this (seconds) is not used: windows are counted.
_MEASURE_MOST = 200e-6
#: Every this many releases the way not taken is taken once: a sweep of the whole view
#: where blocks are cheaper (what a kernel maps beyond the blocks, a larger fault-around
#: or a large folio mapped at once, cannot pile up), the blocks where sweeps are (their
#: cost is measured again).
_SWEEP_EVERY = 64

#: Where this process's memory counts are read (the third field: file-backed pages).
STATM = "/proc/self/statm"

# Re-entrant: a stream collected (its pager closed) while this thread holds it.
_lock = threading.RLock()
#: Views with random-access advice, by (start, end): how many streams asked for it.
_random_advised: dict[tuple[int, int], int] = {}


#: libc's `madvise`, or None where there is none to call (not Linux).
_MADVISE = linux_function("madvise", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])

#: libc's `mincore`, or None where there is none to call.
_MINCORE = linux_function(
    "mincore", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
)
#: Pages `cached_share` looks at, evenly spread over the view: one `mincore` each (about
#: 10 us), paid by every stream over a mapping when it starts; 64 tell a warm file from a
#: cold one within about 6% (the rules ask for half).
_CACHE_SAMPLES = 64


def cached_share(view: np.ndarray[Any, Any]) -> float | None:
    """The share of `view`'s pages in the page cache, from `_CACHE_SAMPLES` pages evenly
    spread over it (one `mincore` each: nothing is read or faulted in), or None where
    it cannot be told (not a mapping, no `mincore`).

    Linux answers for the file's page cache where this process may write the file (its
    owner, root); for another account's read-only file, only for the pages this process
    has mapped in, so such a file looks cold until read.

    Example:
        >>> import mmap, tempfile, numpy as np
        >>> with tempfile.TemporaryFile() as f:
        ...     _ = f.write(b"x" * 4 * mmap.PAGESIZE)
        ...     f.flush()
        ...     share = cached_share(np.memmap(f, np.uint8, mode="r"))
        >>> share in (None, 1.0)  # just written: all in the page cache (None: not Linux)
        True
    """
    if _MINCORE is None or not view.size:
        return None
    page = mmap.PAGESIZE
    first = view.ctypes.data // page * page
    pages = -(-(view.ctypes.data + view.nbytes - first) // page)
    count = min(pages, _CACHE_SAMPLES)
    found = ctypes.create_string_buffer(1)
    cached = 0
    for index in np.linspace(0, pages - 1, count).astype(np.int64).tolist():
        if _MINCORE(first + index * page, page, found) != 0:
            return None
        cached += found.raw[0] & 1
    return cached / count


def in_numpy_memory(view: np.ndarray[Any, Any]) -> bool:
    """Whether `view` lies in memory numpy allocated (its last base an array that owns its
    data, not a memmap): anonymous memory, never a file's mapping, known without reading
    `/proc/self/maps` (a millisecond or more a read, where a process has many mappings).

    Example:
        >>> in_numpy_memory(np.arange(10)[2:])
        True
    """
    base: Any = view
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return (
        isinstance(base, np.ndarray)
        and bool(base.flags.owndata)
        and not isinstance(base, np.memmap)
    )


def maps_line(address: int) -> list[str] | None:
    """The fields of the line of `/proc/self/maps` whose range holds `address` (address,
    perms, offset, device, inode and, where there is one, path), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) < 5:
                    continue
                low, _, high = fields[0].partition("-")
                try:
                    if int(low, 16) <= address < int(high, 16):
                        return fields
                except ValueError:
                    continue
    except OSError:
        return None
    return None


def maps_lines(addresses: list[int]) -> list[list[str] | None]:
    """`maps_line` of each of `addresses`, from one read of `/proc/self/maps` (a sharded
    source's thousand views cost one read, not a thousand): the lines are in address
    order, so one walk of them meets the addresses sorted, and only a line that holds one
    is split into its fields."""
    found: list[list[str] | None] = [None] * len(addresses)
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return found
    order = sorted(range(len(addresses)), key=addresses.__getitem__)
    k, count = 0, len(order)
    for line in text.splitlines():
        if k >= count:
            break
        low, _, rest = line.partition("-")
        try:
            lo, hi = int(low, 16), int(rest.partition(" ")[0], 16)
        except ValueError:
            continue
        while k < count and addresses[order[k]] < lo:  # in no line
            k += 1
        fields = None
        while k < count and addresses[order[k]] < hi:
            if fields is None:
                fields = line.split(maxsplit=5)
            found[order[k]] = fields if len(fields) >= 5 else None
            k += 1
    return found


def _one_mapping(
    line: list[str] | None, start: int, end: int
) -> tuple[int, int] | Literal[False] | None:
    """From the maps line holding `start` (`maps_line`): the mapping's range where it
    holds all of [start, end) and giving its pages back is safe, None where it holds it
    all and is not safe, False where it does not hold it all (read the whole map)."""
    if line is None:
        return False
    low, _, high = line[0].partition("-")
    try:
        lo, hi = int(low, 16), int(high, 16)
    except ValueError:
        return False
    if not lo <= start or hi < end:
        return False
    perms = line[1]
    safe = line[4] != "0" and (perms[3:4] == "s" or perms[1:2] != "w")
    return (lo, hi) if safe else None


def releasable_range(
    view: np.ndarray[Any, Any], line: list[str] | None = None
) -> tuple[int, int] | None:
    """The page-aligned address range of the file mapping(s) `view` lies in, if giving
    its pages back is safe; else None.

    Safe means: `view` is C-contiguous and every mapping it spans is file-backed and
    either shared or not writable, so a page dropped from this process reads back the
    same bytes. Anonymous memory, private writable mappings and systems without
    `/proc/self/maps` get None. `line`, the maps line holding the view's first byte where
    the caller read it already (`maps_line`), spares a read of the whole map where that
    one mapping holds the view.
    """
    if _MADVISE is None or not view.size or not view.flags.c_contiguous or in_numpy_memory(view):
        return None
    start = view.ctypes.data
    end = start + view.nbytes
    one = _one_mapping(line, start, end)
    if one is not False:
        return one
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    spans: list[tuple[int, int, bool]] = []
    for text in lines:
        # address perms offset dev inode [path]: inode 0 is anonymous memory. Only the
        # address is read of most lines (a TPU process has over a thousand).
        low, _, rest = text.partition("-")
        try:
            lo, hi = int(low, 16), int(rest.partition(" ")[0], 16)
        except ValueError:
            continue
        if hi <= start or lo >= end:
            continue
        fields = text.split(maxsplit=5)
        if len(fields) < 5:
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

    One per stream. `release` is called with the offsets of the windows just copied (a
    batch, or a group of batches); `close` ends the random-access advice when the last
    random stream over the view ends. On anything that is not a safe file mapping it does
    nothing.

    Two ways to give them back, the cheaper one taken, by what each has cost this
    stream: the 64 KiB blocks the windows lie in, one `madvise` per run of blocks, or the
    whole view in one call (its cost grows with the page tables the view has). 256 random
    windows (8 batches of 32) are 256 calls, or one sweep for less time; 32 windows in a
    row are one call (measured: docs/benchmarks.md#the-stream-wings-choices-as-measured).
    Each way is timed when taken; the first release takes the blocks, the second the
    sweep, and every `_SWEEP_EVERY`-th sweeps (the backstop) or, where sweeping won,
    takes the blocks again, so a change of costs is seen.

    Example:
        >>> import numpy as np
        >>> pager = Pager(np.arange(10), random=True)  # anonymous memory: left alone
        >>> pager.active
        False
        >>> pager.release([0, 5], 3)
        >>> pager.close()
    """

    def __init__(
        self, view: np.ndarray[Any, Any], *, random: bool, line: list[str] | None = None
    ) -> None:
        self._range = releasable_range(view, line)
        self._advised: tuple[int, int] | None = None  # the range given MADV_RANDOM
        self._batches = 0  # releases so far
        self._resident = 0  # bytes counted in since the last sweep (`release_over_budget`)
        self._data = view.ctypes.data
        self._row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
        self._per_call: float | None = None  # seconds a block madvise has cost
        self._sweep: float | None = None  # seconds a sweep of the view has cost
        # Random streams measure what their windows bring in (`release_over_budget`).
        self._statm: int | None = None  # /proc/self/statm, open while it is measured
        self._baseline = 0  # resident bytes just after the last sweep, or at the start
        self._since = 0  # windows gathered since then
        self._footprint: float | None = None  # the most a window has brought in, measured
        self._reads = 0  # resident-memory reads, and the seconds they took
        self._read_time = 0.0
        #: Whether this kernel's statm counts no file-backed page at all (gVisor): no
        #: measure, and a sweep there gives back nothing the next fault does not map again.
        self.blind = False
        if self._range is None:
            return
        self._open_statm()
        if not random:  # only a random stream measures what its windows bring in
            self._close_statm()
            return
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

    @property
    def footprint(self) -> float | None:
        """The most resident memory a window has been measured to bring in, or None."""
        return self._footprint

    def maps_more(self, length: int, times: float) -> bool:
        """Whether a window of `length` rows was measured to bring in more than `times`
        what small pages can (the window and two fault-around blocks)."""
        footprint = self._footprint
        return footprint is not None and footprint > times * (length * self._row + 2 * _BLOCK)

    def sweep(self) -> None:
        """Give the whole view back now."""
        if self._range is not None:
            self._advise(self._range[0], self._range[1], mmap.MADV_DONTNEED)

    def window_chunk(self, budget: int) -> int | None:
        """How many windows one gather may copy before `release_over_budget` looks again,
        so that resident memory stays within `budget`; None for no limit (what the
        windows bring in is not measured here, and the count allows for fault-around)."""
        if self._range is None or self._statm is None:
            return None
        # The worst until measured; after, the most measured, and never below a quarter
        # of the worst (a cold page cache brings in small pages; once warm, large folios).
        footprint = max(self._footprint or _LARGEST_FAULT, _LARGEST_FAULT / 4)
        return max(1, int(budget // 8 // footprint))

    def release_over_budget(self, windows: int, length: int, budget: int) -> None:
        """`windows` more windows of `length` rows were copied: give the whole view back
        in one sweep once what they brought in passes `budget` bytes. No system call for
        most groups.

        What they brought in is measured where that is cheap: the growth of the process's
        resident file-backed memory since the last sweep (`/proc/self/statm`, one read).
        A fault maps what the kernel holds around the window: two 64 KiB fault-around
        blocks of small pages, or a whole large folio, where windows counted as small pages
        would let many times the budget in (measured on Linux 6.18:
        docs/benchmarks.md#the-stream-wings-choices-as-measured). Elsewhere (no statm, or
        reads dearer than `_MEASURE_MOST`) each window is counted with the two fault-around
        blocks, as small pages bring in, or with what the last measure found, if more.
        """
        bounds = self._range
        if bounds is None:
            return
        self._since += windows
        resident = self._resident_bytes()
        if resident is not None:
            grown = resident - self._baseline
            measured = max(float(length * self._row), grown / self._since)
            self._footprint = max(self._footprint or 0.0, measured)
            # The process's count: another mapping given back meanwhile hides this view's
            # growth, so the windows are also counted at the most one was measured at.
            grown = max(grown, int(self._since * self._footprint))
            if grown <= budget * 3 // 4:  # room for the next gather (`window_chunk`)
                return
        else:
            # What a window was last measured to bring in, if more than small pages do.
            counted = max(float(length * self._row + 2 * _BLOCK), self._footprint or 0.0)
            self._resident += int(windows * counted)
            if self._resident <= budget:
                return
        self._resident = self._since = 0
        self.sweep()
        self._baseline = self._resident_bytes() or 0

    def _open_statm(self) -> None:
        try:
            self._statm = os.open(STATM, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        self._baseline = self._resident_bytes() or 0
        if not self._baseline:  # no file-backed pages at all (the libraries): not measured
            self.blind = self._statm is not None
            self._close_statm()

    def _resident_bytes(self) -> int | None:
        """This process's resident file-backed memory (its anonymous memory comes and goes
        with its arrays, none of it from the view), or None where it is not measured (no
        statm, a read failed, or reads cost more than `_MEASURE_MOST` on average: windows
        are then counted, for good)."""
        fd = self._statm
        if fd is None:
            return None
        clock = time.perf_counter()
        try:
            pages = int(os.pread(fd, 128, 0).split()[2])  # file-backed (and shared) pages
        except (OSError, ValueError, IndexError):
            self._close_statm()
            return None
        self._reads += 1
        self._read_time += time.perf_counter() - clock
        if self._reads >= 16 and self._read_time > _MEASURE_MOST * self._reads:
            self._close_statm()  # dear on average (one slow read on a busy host is not)
        return pages * mmap.PAGESIZE

    def _close_statm(self) -> None:
        fd, self._statm = self._statm, None
        if fd is not None:
            os.close(fd)

    def gather(
        self, windows: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], budget: int | None
    ) -> np.ndarray[Any, Any]:
        """`windows[offsets]` (rows of a strided view of windows over this pager's view),
        their pages given back: the group's pages in one go, or with a `budget`, in one
        sweep once what came in nears it (`release_over_budget`)."""
        length = windows.shape[1]
        if budget is None:
            gathered: np.ndarray[Any, Any] = windows[offsets]
            self.release(offsets, length)
            return gathered
        chunk = self.window_chunk(budget)
        if chunk is None or chunk >= offsets.size:
            gathered = windows[offsets]
            self.release_over_budget(offsets.size, length, budget)
            return gathered
        # A few windows at a time, each part's pages counted (and swept) before the next:
        # where a window brings in a large folio, a whole group would pass the budget.
        gathered = np.empty((*offsets.shape, *windows.shape[1:]), windows.dtype)
        flat, into = offsets.reshape(-1), gathered.reshape(-1, *windows.shape[1:])
        for first in range(0, flat.size, chunk):
            part = flat[first : first + chunk]
            into[first : first + part.size] = windows[part]
            self.release_over_budget(part.size, length, budget)
        return gathered

    def release(self, offsets: Any, length: int) -> None:
        """Give back the blocks that the windows at `offsets` (`length` rows each; a
        sequence or an integer array of any shape) lie in, or the whole view where that
        has cost less."""
        bounds = self._range
        if bounds is None:
            return
        self._batches += 1
        starts = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if not starts.size:
            return
        per_call, sweep = self._per_call, self._sweep
        probe = self._batches % _SWEEP_EVERY == 0
        if sweep is None and per_call is not None:
            swept = True  # the second release: learn what a sweep costs
        elif sweep is None or per_call is None:
            swept = False  # the first: learn what the blocks cost
        else:
            swept = sweep < starts.size * per_call
            if probe:  # the backstop sweep, or a look at the blocks where sweeps won
                swept = not swept
        clock = time.perf_counter()
        if swept:
            self._advise(bounds[0], bounds[1], mmap.MADV_DONTNEED)
            spent = time.perf_counter() - clock
            self._sweep = spent if sweep is None else (sweep + spent) / 2
            return
        calls = self._release_blocks(bounds, starts, length)
        if calls:
            spent = (time.perf_counter() - clock) / calls
            self._per_call = spent if per_call is None else (per_call + spent) / 2

    def _release_blocks(
        self, bounds: tuple[int, int], starts: np.ndarray[Any, Any], length: int
    ) -> int:
        """madvise the runs of 64 KiB blocks the windows lie in; returns the calls made."""
        low, high = bounds
        row, data = self._row, self._data
        starts = np.sort(starts)
        los = np.maximum(low, (data + starts * row) // _BLOCK * _BLOCK)
        his = np.minimum(high, -(-(data + (starts + length) * row) // _BLOCK) * _BLOCK)
        reach = np.maximum.accumulate(his)
        # A new run starts where a block begins past everything before it.
        breaks = np.flatnonzero(los[1:] > reach[:-1]) + 1
        firsts = np.concatenate(([0], breaks))
        lasts = np.concatenate((breaks - 1, [starts.size - 1]))
        calls = 0
        for lo, hi in zip(los[firsts].tolist(), reach[lasts].tolist(), strict=True):
            calls += 1
            if not self._advise(lo, hi, mmap.MADV_DONTNEED):
                break
        return calls

    def close_descriptor(self) -> None:
        """Close only what this process holds open (a forked child's copy of the pager: the
        advice and its count are the parent's, and the count's lock may be held there)."""
        self._close_statm()

    def close(self) -> None:
        """End this stream's random-access advice (the last stream over a view restores
        the kernel's default, read-ahead included). Safe to call twice."""
        self._close_statm()
        key, self._advised = self._advised, None
        if key is None:
            return
        with _lock:
            _random_advised[key] -= 1
            if not _random_advised[key]:
                del _random_advised[key]
                _MADVISE(key[0], key[1] - key[0], mmap.MADV_NORMAL)
