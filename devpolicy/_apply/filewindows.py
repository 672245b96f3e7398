"""Windows of a file-backed host array read by position from the file, not through its map.

A host array that `load_file` mapped (or any `np.memmap`) is a view of a file mapping.
Copying a window out of the mapping faults its pages in, and keeping resident memory
flat then needs the pages given back (`paging`: `MADV_DONTNEED` by blocks or sweeps).
Both cost system calls the copy itself does not need, and their price depends on the
machine: on a TPU VM under gVisor (December 2026) `madvise` cost about 100 us a call and
a stream that gave its pages back spent 84% of its time doing so (292 batches/s), where
one `preadv` per window into the batch's own buffer ran 1,262 batches/s, 2.49x a hand
loop of memmap slices (8,189 and 4.23x on the 2-core CPU machine): nothing is mapped by
the read, so nothing is left to give back, and resident memory is the batch buffers.

So a stream over such a view finds the file it maps (`mapped_file`: the mapping that
holds the view, in `/proc/self/maps`, opened through `/proc/self/map_files` or by its
path, and kept only if it is the same inode on the same device) and reads each window
with one positional read. A private writable mapping is never read this way (its pages
may differ from the file's), nor anything that is not one regular file's mapping: those
keep the mapped path. No JAX here.
"""

from __future__ import annotations

import os
import stat
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .._base.errors import HostViewError

#: Reader threads a stream reads its windows on: none, by the figures. A positional read
#: releases the GIL for its system call, so several threads could overlap reads where
#: system calls are dear; measured on a TPU v5e VM under gVisor (13 cores, the 19.09 GiB
#: story file, page cache warm), 6 reader threads with the next group read ahead fed
#: 792 batches/s against 1,908 with the reads on the stream's own thread: the hand-offs
#: cost more than the overlap saves there, as on the 2-core CPU machine. Kept settable
#: (`benchmarks/bench_loop.py --readers N`) to measure other machines.
READERS = 0


class FileWindows:
    """Positional reads of windows of one file-backed view: an open descriptor of the file,
    where the view starts in it, and the bytes of one row.

    Reads go straight into the caller's buffers: `submit(rows, outs)` fills each batch of
    `outs` (C-contiguous, `len(starts)` windows of `length` rows) with the windows at
    its row of `rows`, one `preadv` each, split over `READERS` threads where there are
    any; `wait` on what it returned waits until all are read. A file that shrank under
    the stream is an error naming it (a mapping would have raised SIGBUS instead). One
    stream, one reader: `submit` and `close` are called from the stream's thread.
    """

    __slots__ = ("_fd", "_name", "_offset", "_pending", "_pool", "_readers", "_row", "length")

    def __init__(
        self, fd: int, name: str, offset: int, row: int, length: int, readers: int
    ) -> None:
        self._fd = fd
        self._name = name
        self._offset = offset  # the file offset of the view's first row
        self._row = row  # bytes of one row of the view
        self.length = length  # rows per window
        self._readers = readers
        self._pool = (
            ThreadPoolExecutor(readers, thread_name_prefix="devpolicy-windows")
            if readers > 0
            else None
        )
        self._pending: list[Future[None]] = []  # reads submitted, not yet waited for

    @property
    def name(self) -> str:
        """The file read, as `/proc/self/maps` names it."""
        return self._name

    def submit(self, rows: list[list[int]], outs: list[np.ndarray[Any, Any]]) -> list[Future[None]]:
        """Start reading the windows at `rows` (one list of starts per batch) into `outs`;
        `wait` on what it returns. Without reader threads they are read here and now."""
        size = self.length * self._row
        slots = []
        for starts, out in zip(rows, outs, strict=True):
            target = out.reshape(-1).view(np.uint8).data
            slots += [(target[i * size : (i + 1) * size], s) for i, s in enumerate(starts)]
        pool = self._pool
        if pool is None:
            self._read(slots)
            return []
        parts = max(1, min(self._readers, len(slots) // 8))  # 8 windows a hand-off at least
        step = -(-len(slots) // parts)
        futures = [pool.submit(self._read, slots[i : i + step]) for i in range(0, len(slots), step)]
        self._pending = futures
        return futures

    def wait(self, futures: list[Future[None]]) -> None:
        """Wait until the reads of one `submit` are done; raise the first one's error."""
        for future in futures:
            future.result()

    def _read(self, slots: list[tuple[memoryview, int]]) -> None:
        fd, offset, row = self._fd, self._offset, self._row
        preadv = os.preadv
        for slot, start in slots:
            got = preadv(fd, [slot], offset + start * row)
            if got != len(slot):
                self._short(start, got, slot)

    def _short(self, start: int, got: int, slot: memoryview) -> None:
        """A read that came back short: the rest read again, or the file ended."""
        size = len(slot)
        position = self._offset + start * self._row
        while 0 < got < size:  # a signal may cut a read short: go on where it stopped
            more = os.preadv(self._fd, [slot[got:]], position + got)
            if more == 0:
                break
            got += more
        if got != size:
            raise HostViewError(
                self._name,
                f"the file ended at byte {position + got:,} while reading a window of "
                f"{size:,} bytes at byte {position:,}: it was truncated after it was mapped",
                "do not rewrite a token file while a stream reads it; load it again",
            )

    def close(self) -> None:
        """Wait for reads in flight, then close the descriptor (never under a read: its
        number could be reused by another file). Safe to call twice."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.exception()  # waited for; what it raised no longer matters
        pool, self._pool = self._pool, None
        if pool is not None:
            # Its reads are done: the threads only need telling to end. Not joined, so a
            # close from a finaliser that runs on one of them cannot wait on itself.
            pool.shutdown(wait=False)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _maps_line(address: int) -> list[str] | None:
    """The fields of the line of `/proc/self/maps` whose range holds `address`."""
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


def _same_file(fd: int, inode: int, device: str, needed: int) -> bool:
    """Whether `fd` is a regular file with this inode on this device (maps' `MM:mm`, in
    hex), holding at least `needed` bytes."""
    info = os.fstat(fd)
    major, _, minor = device.partition(":")
    try:
        same_device = (os.major(info.st_dev), os.minor(info.st_dev)) == (
            int(major, 16),
            int(minor, 16),
        )
    except ValueError:
        return False
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_ino == inode
        and same_device
        and info.st_size >= needed
    )


def _open_checked(path: str, inode: int, device: str, needed: int) -> int | None:
    """`path` opened read-only, if it is the file described; else None."""
    try:
        # Non-blocking: a FIFO planted where the file was must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if _same_file(fd, inode, device, needed):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def mapped_file(view: np.ndarray[Any, Any], length: int) -> FileWindows | None:
    """A positional reader of the file `view` is a mapping of, or None where there is
    none to read by position (memory, a private writable map, several mappings).

    Args:
        view: The host array windows are cut from (rows along the first axis).
        length: Rows per window.

    Returns:
        The reader (its descriptor open until `close`), or None.

    Example:
        >>> import numpy as np
        >>> mapped_file(np.arange(10), 3) is None  # memory, not a file
        True
    """
    if not sys.platform.startswith("linux") or not view.size or not view.flags.c_contiguous:
        return None
    start = view.ctypes.data
    fields = _maps_line(start)
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
    fd = _open_checked(f"/proc/self/map_files/{low}-{high}", inode, device, needed)
    if fd is None and path.startswith("/") and not path.endswith(" (deleted)"):
        fd = _open_checked(path, inode, device, needed)
    if fd is None:
        return None
    row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
    return FileWindows(fd, path, file_offset, row, length, READERS)
