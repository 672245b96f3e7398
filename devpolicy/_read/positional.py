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
import stat
import sys
from typing import Any

import numpy as np

from .._base.errors import HostViewError
from .exact import read_at
from .pages import in_numpy_memory, maps_line
from .uring import BatchReads


class FileWindows:
    """Positional reads of windows of one file-backed view: an open descriptor of the file,
    where the view starts in it, and the bytes of one row.

    `read(starts, out)` fills `out` (a C-contiguous batch of `len(starts)` windows of
    `length` rows) with the windows at `starts`, on the caller's thread: where io_uring
    can be had (`uring`), all of them in one system call with the GIL released
    (`batched`), else one `preadv` each. `submit_batches` starts a group and `finish`
    waits for it: on a polled ring (`polled`) the kernel reads meanwhile. `preadv`s stay
    on the caller's thread: on other threads the hand-offs cost more than the overlap
    saves (measured: docs/benchmarks.md#the-stream-wings-choices-as-measured). A file
    that shrank under the stream is an error naming it (a mapping would have raised
    SIGBUS instead). One stream, one reader, one thread at a time.
    """

    __slots__ = (
        "_bases",
        "_batch",
        "_ends",
        "_fds",
        "_names",
        "_offsets",
        "_results",
        "_row",
        "_submitted",
        "length",
    )

    def __init__(
        self,
        fd: int,
        name: str,
        offset: int,
        row: int,
        length: int,
        *,
        io_uring: bool = True,
        polled: bool = True,
        end: int = 0,
    ) -> None:
        # The bytes of each file the view needs (`check_whole`).
        self._ends = np.asarray([end], np.int64)
        # The files read, one unless `joined` (a mixture's): each one's descriptor, name,
        # file offset of its first row, and where its rows start in the one range of rows.
        self._fds = np.asarray([fd], np.int32)
        self._names = [name]
        self._offsets = np.asarray([offset], np.int64)
        self._bases = np.zeros(1, np.int64)
        self._row = row  # bytes of one row of the view
        self.length = length  # rows per window
        self._batch = BatchReads.open(polled=polled) if io_uring else None
        # The windows `submit_batches` started reading: (starts, batches), and, once waited
        # for, what each read gave (kept until every short read is read again, so that a
        # `finish` an interrupt cut short is done again whole).
        self._submitted: tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]]] | None = None
        self._results: np.ndarray[Any, Any] | None = None

    @classmethod
    def joined(
        cls,
        readers: list[FileWindows],
        bases: np.ndarray[Any, Any],
        *,
        io_uring: bool = True,
        polled: bool = True,
    ) -> FileWindows:
        """One reader of several files' windows (a mixture's), numbered in one range of
        rows: reader i's rows from `bases[i]`, with one ring (`io_uring`, `polled`). It
        takes over their descriptors (each reader given is left closed); a window never
        spans two files."""
        first = readers[0]
        joined = cls(-1, "", 0, first._row, first.length, io_uring=io_uring, polled=polled)
        joined._fds = np.concatenate([r._fds for r in readers])
        joined._names = [name for r in readers for name in r._names]
        joined._offsets = np.concatenate([r._offsets for r in readers])
        joined._ends = np.concatenate([r._ends for r in readers])
        joined._bases = np.asarray(bases, np.int64)
        for reader in readers:
            reader._fds = np.asarray([], np.int32)  # now the joined reader's
            reader.close()
        return joined

    def _part(self, starts: Any) -> Any:
        """Which file each window at `starts` is in (0 for all where there is one)."""
        if len(self._names) == 1:
            return 0
        return np.searchsorted(self._bases, starts, side="right") - 1

    def _located(self, starts: np.ndarray[Any, Any]) -> tuple[Any, np.ndarray[Any, Any]]:
        """The descriptor (one, or one a window) and file offset of each window at
        `starts` (a flat integer array)."""
        part = self._part(starts)
        fds = int(self._fds[0]) if isinstance(part, int) else self._fds[part]
        return fds, self._offsets[part] + (starts - self._bases[part]) * self._row

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
    def identity(self) -> tuple[tuple[int, int], ...]:
        """The files read, each as (device, inode): the same files whatever their names."""
        found = []
        for fd in self._fds.tolist():
            status = os.fstat(fd)
            found.append((status.st_dev, status.st_ino))
        return tuple(found)

    @property
    def way(self) -> str:
        """How windows are read: "io_uring polled" (a kernel thread reads), "io_uring"
        (one call a group) or "preadv" (one call a window)."""
        return "io_uring polled" if self.polled else "io_uring" if self.batched else "preadv"

    @property
    def name(self) -> str:
        """The file read, as `/proc/self/maps` names it (a mixture's, each one)."""
        return ", ".join(self._names)

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
        window on this thread, never the ring (a polled ring's kernel thread may wait for
        a core: a stream's very first batch is read so)."""
        if not direct and self._ring() is not None:
            self.submit_batches(starts, batches)
            self.finish()
            return
        size = self.length * self._row
        preadv = os.preadv
        fds, positions = self._located(starts.reshape(-1))
        fd_rows = np.broadcast_to(fds, positions.shape).reshape(starts.shape).tolist()
        for batch, row_fds, row_positions, row_starts in zip(
            batches, fd_rows, positions.reshape(starts.shape).tolist(), starts.tolist(), strict=True
        ):
            target = batch.reshape(-1).view(np.uint8).data
            for i, (fd, position) in enumerate(zip(row_fds, row_positions, strict=True)):
                slot = target[i * size : (i + 1) * size]
                got = preadv(fd, [slot], position)
                if got != size:
                    self._short(row_starts[i], got, slot)

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
        within = np.arange(windows, dtype=np.uint64) * np.uint64(size)
        addresses = np.concatenate([within + np.uint64(b.ctypes.data) for b in batches])
        fds, positions = self._located(starts.reshape(-1))
        ring.submit(fds, positions, addresses, size, batches)
        self._submitted = (starts, batches)

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
        starts, batches = submitted
        size = self.length * self._row
        windows = starts.shape[1]
        for index in np.flatnonzero(results != size).tolist():
            which, at = divmod(index, windows)
            target = batches[which].reshape(-1).view(np.uint8).data
            self._short(int(starts[which, at]), None, target[at * size : (at + 1) * size])
        self._submitted = self._results = None

    def settle(self) -> None:
        """Wait for the windows `submit_batches` started, whatever the reads returned."""
        ring = self._ring()
        self._submitted = self._results = None
        if ring is not None and ring.in_flight:
            ring.wait()

    def _short(self, start: int, got: int | None, slot: memoryview) -> None:
        """A window a read brought `got` bytes of: the rest read (a signal may cut a read
        short), all of it where `got` is None (a batch's read that failed), or the file
        ended."""
        size = len(slot)
        part = int(self._part(start))
        fd = int(self._fds[part])
        position = int(self._offsets[part] + (start - self._bases[part]) * self._row)
        if got is None:  # read it all again
            got = read_at(fd, [slot], position)
        elif 0 < got < size:  # a signal may cut a read short: go on where it stopped
            got += read_at(fd, [slot[got:]], position + got)
        if got != size:
            raise HostViewError(
                self._names[part],
                f"the file ended at byte {position + got:,} while reading a window of "
                f"{size:,} bytes at byte {position:,}: it was truncated after it was mapped",
                "do not rewrite a token file while a stream reads it; load it again",
            )

    def check_whole(self) -> None:
        """Raise where a file is shorter now than the view mapped from it needs: read
        through the mapping, its missing pages would kill the process (SIGBUS), so a
        mapping's reader looks first (one `fstat` a file).

        Raises:
            HostViewError: naming the file, as a read by position that ran past its end.
        """
        # strict=False: a closed reader has no descriptor left, and checks nothing.
        fds, ends = self._fds.tolist(), self._ends.tolist()
        for fd, end, name in zip(fds, ends, self._names, strict=False):
            size = os.fstat(fd).st_size
            if size < end:
                raise HostViewError(
                    name,
                    f"the file is {size:,} bytes, and the array mapped from it needs "
                    f"{end:,}: it was truncated after it was mapped",
                    "do not rewrite a token file while a stream reads it; load it again",
                )

    def close(self) -> None:
        """Close the descriptor (and the ring); reading again raises. Safe to call twice."""
        batch, self._batch = self._batch, None
        try:
            if batch is not None:
                batch.close()
        finally:
            fds, self._fds = self._fds.tolist(), np.asarray([], np.int32)
            for fd in fds:
                if fd >= 0:
                    os.close(fd)

    def __del__(self) -> None:
        # Dropped unclosed (a stream collected, or one an error left): its descriptor and
        # ring closed. No module global here: at interpreter exit they may be None.
        try:  # noqa: SIM105 - a finaliser never raises; no contextlib (a module global)
            self.close()
        except BaseException:
            pass


def _same_file(fd: int, inode: int, device: str) -> bool:
    """Whether `fd` is a regular file with this inode on this device (maps' `MM:mm`, in
    hex)."""
    info = os.fstat(fd)
    major, _, minor = device.partition(":")
    try:
        same_device = (os.major(info.st_dev), os.minor(info.st_dev)) == (
            int(major, 16),
            int(minor, 16),
        )
    except ValueError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_ino == inode and same_device


def _open_checked(path: str, inode: int, device: str) -> int | None:
    """`path` opened read-only, if it is the file described; else None."""
    try:
        # Non-blocking: a FIFO planted where the file was must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if _same_file(fd, inode, device):
            # A regular file: reads may block again (io_uring fails a non-blocking
            # read of a page not in the cache where a read would wait for it).
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


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
        io_uring: Whether the reader opens an io_uring of its own where Linux allows (a
            mixture's parts do not: the reader they are joined into does).
        polled: Whether that ring is polled by a kernel thread, where the host allows.
        line: The maps line holding the view's first byte (`pages.maps_line`), where the
            caller read it already.

    Returns:
        The reader (its descriptor open until `close`), or None.

    Example:
        >>> import numpy as np
        >>> mapped_file(np.arange(10), 3) is None  # memory, not a file
        True
    """
    if (
        not sys.platform.startswith("linux")
        or not view.size
        or not view.flags.c_contiguous
        or in_numpy_memory(view)
    ):
        return None
    start = view.ctypes.data
    fields = maps_line(start) if line is None else line
    if fields is None or len(fields) < 6:  # no path: anonymous memory
        return None
    address, perms, offset, device, inode_text, path = fields
    low, _, high = address.partition("-")
    try:
        lo, hi, inode = int(low, 16), int(high, 16), int(inode_text)
        file_offset = int(offset, 16) + (start - lo)
    except ValueError:
        return None
    # The whole view in this one mapping; read-only or shared, so the file holds what the
    # pages hold (a private writable map may have been written to).
    if inode == 0 or start + view.nbytes > hi or (perms[1:2] == "w" and perms[3:4] != "s"):
        return None
    needed = file_offset + view.nbytes
    fd = _open_checked(f"/proc/self/map_files/{low}-{high}", inode, device)
    if fd is None and path.startswith("/") and not path.endswith(" (deleted)"):
        fd = _open_checked(path, inode, device)
    if fd is None:
        return None
    size = os.fstat(fd).st_size
    if size < needed:
        # The mapping's own file, cut short: reading the view through the mapping would
        # kill the process (SIGBUS), so the stream refuses to start.
        os.close(fd)
        raise HostViewError(
            path,
            f"the file is {size:,} bytes, and the array mapped from it needs {needed:,}: "
            "it was truncated after it was mapped",
            "do not rewrite a token file while it is loaded; load it again",
        )
    row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
    try:
        return FileWindows(
            fd, path, file_offset, row, length, io_uring=io_uring, polled=polled, end=needed
        )
    except BaseException:
        os.close(fd)
        raise


def mapped_files(
    views: list[np.ndarray[Any, Any]],
    length: int,
    bases: np.ndarray[Any, Any],
    *,
    io_uring: bool = True,
    polled: bool = True,
) -> FileWindows | None:
    """One positional reader of a mixture's files (`FileWindows.joined`: view i's rows
    from `bases[i]`), or None unless every view maps a file that can be read so (nothing
    is left open then)."""
    readers: list[FileWindows] = []
    try:
        for view in views:
            reader = mapped_file(view, length, io_uring=False)
            if reader is None:
                return None
            readers.append(reader)
        joined = FileWindows.joined(readers, bases, io_uring=io_uring, polled=polled)
        readers = []
        return joined
    finally:
        for reader in readers:
            reader.close()
