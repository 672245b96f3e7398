"""Windows of a file-backed host array read by position from the file, not through its map.

Copying a window out of a mapping (`load_file`'s, any `np.memmap`) faults its pages in, and
keeping resident memory flat then needs them given back (`pages`): system calls the copy does
not need, whose price depends on the machine (under gVisor, most of a stream's time). One
positional read a window into the batch's own buffer maps nothing, so nothing is left to give
back, resident memory is the batch buffers, and it outran a hand loop of memmap slices on both
machines measured (docs/benchmarks.md#the-stream-wings-choices-as-measured). So a stream finds
the file its view maps (`mapped_file`: the mapping that holds the view in `/proc/self/maps`,
opened through `/proc/self/map_files` or by its path, kept only if it is the same inode on the
same device) and reads from it. A private writable mapping (its pages may differ from the
file's), or anything not one regular file's mapping, keeps the mapped path. No JAX here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from .._base.errors import HostViewError
from .exact import read_at
from .pages import in_numpy_memory, maps_line, maps_lines
from .parts import (
    OPEN_MOST,
    Descriptors,
    MemmapPart,
    MemmapParts,
    PartFile,
    described,
    memmap_part,
    memmap_parts,
    pieces,
    truncated,
)
from .uring import BatchReads


class FileWindows:
    """Positional reads of windows of file-backed views: the files (`Descriptors`: one, or
    a sharded source's or a mixture's several, opened as reads need them), where each
    part's rows lie in one range of rows (`edges`), and the bytes of one row.

    `read(starts, out)` fills `out` (a C-contiguous batch of `len(starts)` windows of
    `length` rows) with the windows at `starts`, on the caller's thread: where io_uring
    can be had (`uring`), all of them in one system call with the GIL released
    (`batched`), else one `preadv` each. A window that spans two parts (a sharded
    source's files) is two reads, one a piece (`parts.pieces`). `submit_batches` starts a
    group and `finish` waits for it: on a polled ring (`polled`) the kernel reads
    meanwhile. `preadv`s stay on the caller's thread: on other threads the hand-offs cost
    more than the overlap saves (measured:
    docs/benchmarks.md#the-stream-wings-choices-as-measured). A file that shrank under the
    stream is an error naming it (a mapping would have raised SIGBUS instead). One stream,
    one reader, one thread at a time.
    """

    __slots__ = (
        "_batch",
        "_edges",
        "_files",
        "_fresh",
        "_offsets",
        "_results",
        "_row",
        "_submitted",
        "length",
    )

    def __init__(
        self,
        files: Descriptors,
        edges: np.ndarray[Any, Any],
        row: int,
        length: int,
        *,
        io_uring: bool = True,
        polled: bool = True,
    ) -> None:
        self._files = files
        self._edges = np.asarray(edges, np.int64)  # part i's rows: edges[i] to edges[i + 1]
        # Part i's byte 0 (memmaps': their column; a thousand shards' start pays it).
        found = files.files
        offsets = found.offsets if isinstance(found, MemmapParts) else map(_offset, found)
        self._offsets = np.fromiter(offsets, np.int64, len(found))
        self._row = row  # bytes of one row of the views
        self.length = length  # rows per window
        self._batch = BatchReads.open(polled=polled) if io_uring else None
        # Whether no read was asked yet of a reader whose files are not all open (a
        # thousand shards'): a first read `direct` (a stream's first batch) is copied
        # from the memmaps' mappings where it can be (`_from_mappings`).
        self._fresh = bool((files.fds < 0).any())
        # The reads `submit_batches` started: (pieces, batches), and, once waited for,
        # what each read gave (kept until every short read is read again, so that a
        # `finish` an interrupt cut short is done again whole).
        self._submitted: tuple[_Pieces, list[np.ndarray[Any, Any]]] | None = None
        self._results: np.ndarray[Any, Any] | None = None

    def _pieces(self, starts: np.ndarray[Any, Any], windows: int) -> _Pieces:
        """Every read of the windows at `starts` (a (batches, windows) array): each one's
        batch, byte in its batch, part, file offset and bytes, the parts' files opened."""
        flat = starts.reshape(-1)
        size = self.length * self._row
        row = self._row
        if len(self._files.files) == 1:  # one file: a read a window
            index = np.arange(flat.size, dtype=np.int64)
            part = np.zeros(flat.size, np.int64)
            offset = self._offsets[0] + flat * row
            nbytes = np.full(flat.size, size, np.int64)
            within = np.zeros(flat.size, np.int64)
        else:
            index, part, first, rows, at = pieces(self._edges, flat, self.length)
            offset = self._offsets[part] + first * row
            nbytes = rows * row
            within = at * row
        which, slot = np.divmod(index, windows)
        fds = self._files.opened(part)
        return _Pieces(which, slot * size + within, part, fds, offset, nbytes)

    def _ring(self) -> BatchReads | None:
        """The ring, where this process may use it (not in a forked child)."""
        ring = self._batch
        return ring if ring is not None and ring.usable else None

    @property
    def batched(self) -> bool:
        """Whether a call reads all its windows in one system call, the GIL released."""
        return self._ring() is not None

    @property
    def polled(self) -> bool:
        """Whether `submit_batches` returns at once, a kernel thread reading meanwhile."""
        ring = self._ring()
        return ring is not None and ring.polled

    @property
    def identity(self) -> Hashable:
        """The files read, each as (device, inode) (the same files whatever their names),
        or, for an `np.memmap`'s (its identity looked up only when it is opened), as its
        path and the part's offset (of memmaps alone, their paths and their offsets:
        `MemmapParts.key`)."""
        files = self._files.files
        if isinstance(files, MemmapParts):
            return files.key()
        return tuple(f.key for f in files)

    @property
    def way(self) -> str:
        """How windows are read: "io_uring polled" (a kernel thread reads), "io_uring"
        (one call a group) or "preadv" (one call a window)."""
        return "io_uring polled" if self.polled else "io_uring" if self.batched else "preadv"

    @property
    def name(self) -> str:
        """The file read, as `/proc/self/maps` names it (of several, the first and how
        many)."""
        files = self._files.files
        more = f" and {len(files) - 1:,} more" if len(files) > 1 else ""
        return files[0].path + more

    @property
    def first_from_mappings(self) -> bool:
        """Whether the first read, where it is `direct`, may be copied from the parts'
        mappings (nothing read yet, and some part's file not open: a thousand shards')."""
        return self._fresh

    @property
    def opens_files(self) -> bool:
        """Whether a read may open files (more files than are kept open between reads: a
        thousand shards'), not only read from descriptors open already."""
        return self._files.lazy

    @property
    def open_descriptors(self) -> int:
        """How many of the files' descriptors are open now."""
        return self._files.open_count

    def read(self, starts: Any, out: np.ndarray[Any, Any]) -> None:
        """Fill `out` (C-contiguous) with the windows at `starts` (rows of the view: a
        sequence or an integer array of any shape, in `out`'s order)."""
        self.read_batches(np.asarray(starts, dtype=np.int64).reshape(1, -1), [out])

    def read_batches(
        self,
        starts: np.ndarray[Any, Any],
        batches: list[np.ndarray[Any, Any]],
        *,
        direct: bool = False,
    ) -> None:
        """Fill each of `batches` (C-contiguous) with the windows at its row of `starts`
        (a (batches, windows) integer array of rows of the view); `direct`: a `preadv` a
        piece on this thread, never the ring (a polled ring's kernel thread may wait for
        a core: a stream's very first batch is read so), and, as a fresh reader's first
        read, copied from the parts' mappings where it can be (`first_from_mappings`)."""
        if direct and self._fresh and self._from_mappings(starts, batches):
            return
        self._fresh = False
        if not direct and self._ring() is not None:
            self.submit_batches(starts, batches)
            self.finish()
            return
        try:
            found = self._pieces(starts, starts.shape[1])
            preadv = os.preadv
            targets = [batch.reshape(-1).view(np.uint8).data for batch in batches]
            for which, at, part, fd, position, size in zip(*found.lists(), strict=True):
                slot = targets[which][at : at + size]
                got = preadv(fd, [slot], position)
                if got != size:
                    self._short(part, position, got, slot)
        finally:
            self._files.trim()

    def submit_batches(
        self, starts: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]]
    ) -> None:
        """Start filling `batches` as `read_batches` does (a batched reader only); `finish`
        waits for them. The batches must not be used, nor dropped, before."""
        ring = self._ring()
        if ring is None:  # a forked child's copy of the reader: read here and now
            self.read_batches(starts, batches)
            return
        if ring.in_flight:  # reads an interrupt left behind (their batches unused): done first
            ring.wait()
        self._submitted = self._results = None
        self._fresh = False
        size = self.length * self._row
        windows = starts.shape[1]
        # The kernel writes where it is told: every batch exactly its windows' bytes.
        for batch in batches:
            if batch.nbytes != windows * size or not (
                batch.flags.c_contiguous and batch.flags.writeable
            ):
                raise ValueError(
                    f"a batch of {batch.nbytes:,} bytes (C-contiguous "
                    f"{batch.flags.c_contiguous}, writeable {batch.flags.writeable}) for "
                    f"{windows} windows of {size:,} bytes"
                )
        if len(batches) != starts.shape[0]:
            raise ValueError(f"{len(batches)} batches for {starts.shape[0]} rows of starts")
        found = self._pieces(starts, windows)
        bases = np.asarray([b.ctypes.data for b in batches], np.uint64)
        addresses = bases[found.batch] + found.at.astype(np.uint64)
        whole = found.nbytes.size == starts.size  # one read a window: one size for all
        ring.submit(found.fds, found.offset, addresses, size if whole else found.nbytes, batches)
        self._submitted = (found, batches)

    def finish(self) -> None:
        """Wait for the windows `submit_batches` started; any read that came back short or
        failed (the file ended, a read error) is read again alone, so the error is what
        a single read reports."""
        ring = self._ring()
        submitted = self._submitted
        if ring is None or submitted is None:
            return
        if self._results is None:
            self._results = ring.wait()
        results = self._results
        found, batches = submitted
        for index in np.flatnonzero(results != found.nbytes).tolist():
            at, size = int(found.at[index]), int(found.nbytes[index])
            target = batches[int(found.batch[index])].reshape(-1).view(np.uint8).data
            self._short(int(found.part[index]), int(found.offset[index]), None,
                        target[at : at + size])  # fmt: skip
        self._submitted = self._results = None
        self._files.trim()

    def settle(self) -> None:
        """Wait for the windows `submit_batches` started, whatever the reads returned."""
        ring = self._ring()
        self._submitted = self._results = None
        if ring is not None and ring.in_flight:
            ring.wait()
        self._files.trim()

    def _from_mappings(
        self, starts: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]]
    ) -> bool:
        """A fresh reader's first read (a stream's first batch) copied from the parts'
        own mappings, where each part it reads is an `np.memmap`'s whose mapped file is
        whole (`MemmapPart.whole`: asked of the mapping's own descriptor); False, and
        nothing copied, where one is not. Once only: later groups are read by position.

        Why: nothing is opened for it. The caller's thousand memmaps hold about a
        thousand descriptors, and the first batch's opens took the process's 1,024th,
        whose open grows the descriptor table: in a process with threads (JAX's) that
        waits for an RCU grace period, 17 ms for that one open; later groups pay it,
        read ahead (docs/benchmarks.md#the-first-batch-from-1000-shards).

        Raises:
            HostViewError: naming the file, where one is shorter than its part needs.
        """
        self._fresh = False
        files = self._files.files
        index, part, first, rows, at = pieces(self._edges, starts.reshape(-1), self.length)
        # Each part read, checked whole, as a plain array (a memmap's slice is a Python
        # call of numpy's, seven times a plain one's).
        views: dict[int, np.ndarray[Any, Any]] = {}
        for used in dict.fromkeys(part.tolist()):
            file = files[used]
            if not (isinstance(file, MemmapPart) and file.whole()):
                return False
            views[used] = file.view.view(np.ndarray)
        which, slot = np.divmod(index, starts.shape[1])
        columns = (which, slot, part, first, rows, at)
        for w, s, p, f, r, a in zip(*(c.tolist() for c in columns), strict=True):
            batches[w][s, a : a + r] = views[p][f : f + r]
        return True

    def _short(self, part: int, position: int, got: int | None, slot: memoryview) -> None:
        """A read of part `part` at `position` that brought `got` bytes of `slot`: the rest
        read (a signal may cut a read short), all of it where `got` is None (a batch's
        read that failed), or the file ended."""
        size = len(slot)
        fd = int(self._files.fds[part])
        if got is None:  # read it all again
            got = read_at(fd, [slot], position)
        elif 0 < got < size:  # a signal may cut a read short: go on where it stopped
            got += read_at(fd, [slot[got:]], position + got)
        if got != size:
            raise HostViewError(
                self._files.files[part].path,
                f"the file ended at byte {position + got:,} while reading a window of "
                f"{size:,} bytes at byte {position:,}: it was truncated after it was mapped",
                "do not rewrite a token file while a stream reads it; load it again",
            )

    def check_whole(self, starts: np.ndarray[Any, Any] | None = None) -> None:
        """Raise where a file is shorter now than the view mapped from it needs: read
        through the mapping, its missing pages would kill the process (SIGBUS), so a
        mapping's reader looks first (one `fstat` a file: with `starts`, the files the
        windows there read, an `np.memmap`'s asked of its own mapping's descriptor
        (`MemmapPart.whole`), the rest opened where they were not; else the files open
        now).

        Why a memmap's file is not opened: a kept mapping of a thousand shards opened
        hundreds of them a group for this look alone (each open 30-120 us on a busy host,
        and the descriptor table grown once past the caller's memmaps').

        Raises:
            HostViewError: naming the file, as a read by position that ran past its end.
        """
        files = self._files
        parts: list[int] = np.flatnonzero(files.fds >= 0).tolist()
        if starts is not None and len(files.files) > 1:
            flat = np.asarray(starts, np.int64).reshape(-1)
            found = pieces(self._edges, flat, self.length)[1] if flat.size else flat
            every = files.files
            parts = [
                part
                for part in dict.fromkeys(found.tolist())
                if not (isinstance(file := every[part], MemmapPart) and file.whole())
            ]
            files.opened(np.asarray(parts, np.int64))
        try:
            for part in parts:
                fd = int(files.fds[part])
                if fd < 0:  # closed (the reader was)
                    continue
                size, end = os.fstat(fd).st_size, files.files[part].end
                if size < end:
                    raise HostViewError(files.files[part].path, *truncated(size, end))
        finally:
            if starts is not None and len(files.files) > 1:
                files.trim()

    def close(self) -> None:
        """Close the descriptors (and the ring); reading again raises. Safe to call twice."""
        batch, self._batch = self._batch, None
        try:
            if batch is not None:
                batch.close()
        finally:
            self._files.close()

    def __del__(self) -> None:
        # Dropped unclosed (a stream collected, or one an error left): its descriptors and
        # ring closed. No module global here: at interpreter exit they may be None.
        try:  # noqa: SIM105 - a finaliser never raises; no contextlib (a module global)
            self.close()
        except BaseException:
            pass


@dataclass(frozen=True, slots=True)
class _Pieces:
    """The reads of a group: each one's batch, byte in that batch, part, descriptor, file
    offset and bytes."""

    batch: np.ndarray[Any, Any]
    at: np.ndarray[Any, Any]
    part: np.ndarray[Any, Any]
    fds: np.ndarray[Any, Any]
    offset: np.ndarray[Any, Any]
    nbytes: np.ndarray[Any, Any]

    def lists(self) -> tuple[list[int], ...]:
        """The columns as lists of Python ints (a `preadv` loop's)."""
        return (
            self.batch.tolist(),
            self.at.tolist(),
            self.part.tolist(),
            np.broadcast_to(self.fds, self.offset.shape).tolist(),
            self.offset.tolist(),
            self.nbytes.tolist(),
        )


_offset = attrgetter("offset")


def _file_backed(view: np.ndarray[Any, Any]) -> bool:
    """Whether `view` may be a file's mapping, read by position (Linux, C-contiguous, not
    empty, not memory numpy allocated)."""
    return (
        sys.platform.startswith("linux")
        and bool(view.size)
        and view.flags.c_contiguous
        and not in_numpy_memory(view)
    )


def _row_bytes(view: np.ndarray[Any, Any]) -> int:
    return view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))


def mapped_file(
    view: np.ndarray[Any, Any],
    length: int,
    *,
    io_uring: bool = True,
    polled: bool = True,
    line: list[str] | None = None,
) -> FileWindows | None:
    """A positional reader of the file `view` is a mapping of, or None where there is
    none to read by position (memory, a private writable map, several mappings).

    Args:
        view: The host array windows are cut from (rows along the first axis).
        length: Rows per window.
        io_uring: Whether the reader opens an io_uring of its own where Linux allows.
        polled: Whether that ring is polled by a kernel thread, where the host allows.
        line: The maps line holding the view's first byte (`pages.maps_line`), where the
            caller read it already.

    Returns:
        The reader (its descriptor open until `close`), or None.

    Raises:
        HostViewError: the file is shorter than the view needs (truncated after it was
            mapped: reading the view through the mapping would kill the process), or no
            descriptor is left to open it (the process's limit: `parts.out_of_descriptors`).

    Example:
        >>> import numpy as np
        >>> mapped_file(np.arange(10), 3) is None  # memory, not a file
        True
    """
    if not _file_backed(view):
        return None
    start = view.ctypes.data
    part = described(view.nbytes, start, maps_line(start) if line is None else line)
    fd = None if part is None else part.open()
    if part is None or fd is None:
        return None
    try:
        files = Descriptors([part], [fd])
        edges = np.asarray([0, view.shape[0]], np.int64)
        row = _row_bytes(view)
        return FileWindows(files, edges, row, length, io_uring=io_uring, polled=polled)
    except BaseException:
        os.close(fd)
        raise


def mapped_files(
    views: list[np.ndarray[Any, Any]],
    length: int,
    edges: np.ndarray[Any, Any],
    *,
    io_uring: bool = True,
    polled: bool = True,
    guard: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> FileWindows | None:
    """One positional reader of several views' files (a sharded source's, a mixture's:
    view i's rows from `edges[i]` to `edges[i + 1]` of one range), or None unless every
    view maps a file that can be read so (nothing is left open then).

    Where a view lies in an `np.memmap` (nanoGPT's shards), its file and offset are the
    memmap's own, its identity checked against its mapping when it is first opened
    (`parts.MemmapPart`); for the rest `/proc/self/maps` is read once for all of them.
    Where there are more than `parts.OPEN_MOST`, only the first file is opened now (the
    rest as reads need them, a few kept open at a time: `parts.Descriptors`, each opened
    or closed inside `guard()`: the caller's Ctrl-C held back); else every one, each
    checked whole.

    Raises:
        HostViewError: a file opened now is shorter than its view needs, or no descriptor
            is left to open it (the process's limit: `parts.out_of_descriptors`).
    """
    # Memory numpy allocated is found at once where the first view is; any other view not
    # a file's mapping has an anonymous maps line.
    if not _file_backed(views[0]):
        return None
    found: Sequence[PartFile | MemmapPart] | None = memmap_parts(views)  # nanoGPT's shards
    if found is None:
        found = _parts(views)
        if found is None:
            return None
    files = Descriptors(found, np.full(len(found), -1, np.int32), guard=guard)
    if not files.open_first(len(found) if len(found) <= OPEN_MOST else 1):
        return None
    try:
        row = _row_bytes(views[0])
        return FileWindows(files, edges, row, length, io_uring=io_uring, polled=polled)
    except BaseException:
        files.close()
        raise


def _parts(views: list[np.ndarray[Any, Any]]) -> list[PartFile | MemmapPart] | None:
    """Where each view lies in its file (an `np.memmap`'s from the memmap, the rest's from
    `/proc/self/maps`, read once for them all), or None where one is no file's mapping
    that can be read by position."""
    if not all(v.flags.c_contiguous and v.size for v in views):
        return None
    parts: list[PartFile | MemmapPart | None] = [memmap_part(view) for view in views]
    rest = [index for index, part in enumerate(parts) if part is None]
    starts = [views[index].__array_interface__["data"][0] for index in rest]
    lines = maps_lines(starts) if starts else []  # read only where a view is no memmap's
    for index, start, line in zip(rest, starts, lines, strict=True):
        parts[index] = part = described(views[index].nbytes, start, line)
        if part is None:
            return None
    return [part for part in parts if part is not None]  # every one, by now
