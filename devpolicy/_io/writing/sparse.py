"""Runs of zeros left out of a file as holes, only where a reader can read them back.

A hole costs nothing on disk, and a disk filesystem (ext4, XFS, btrfs, ...) reads one
through a mapping as zeros it takes no space for. A filesystem held in memory (tmpfs,
ramfs) takes a page for each page of a hole read through a mapping: where it has none
left, the reader of a mapped file dies of SIGBUS, long after the save succeeded. So the
zeros a file leaves out (`SparseSink`) are given their space once written
(`posix_fallocate`, which takes no time to write them) on such a filesystem, and on any
filesystem not known either way unless its free space covers them; where the space is
not there, the save fails, saying so. No JAX here.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.libc import linux_function
from ..._base.sizes import format_size

#: Runs of zeros this long, at file offsets that are multiples of it, are left as holes.
HOLE_BYTES = 2**20

#: Filesystems (`statfs` magic numbers) that read a hole through a mapping as zeros
#: without taking space for it: holes are kept however full they are.
_HOLES_READ_FREE = {
    0xEF53: "ext4",
    0x58465342: "XFS",
    0x9123683E: "btrfs",
    0xF2F52010: "F2FS",
    0x2FC12FC1: "ZFS",
    0xCA451A4E: "bcachefs",
    0x3153464A: "JFS",
    0x6969: "NFS",
}
#: Filesystems held in memory, which take a page for each page of a hole read through a
#: mapping: the zeros are always given their space.
_HOLES_TAKE_MEMORY = {0x01021994: "tmpfs", 0x858458F6: "ramfs", 0x958458F6: "hugetlbfs"}

_fstatfs = linux_function("fstatfs", ctypes.c_int, [ctypes.c_int, ctypes.c_void_p])


def filesystem_type(fd: int) -> int | None:
    """The `statfs` magic number of the filesystem `fd` is on; None where it cannot be had
    (not Linux, or the call failed)."""
    if _fstatfs is None:
        return None
    buffer = ctypes.create_string_buffer(512)  # struct statfs is 120 bytes on 64-bit Linux
    if _fstatfs(fd, buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF  # f_type, its first field


class SparseSink:
    """Writes bytes one after another from file offset `start` of `out` (a file open for
    writing), leaving out each `HOLE_BYTES` span (aligned in the file) that holds only
    zeros; `finish` ends the file there and gives the holes their space where a reader
    could not read them back (the module's rule). `advance` is told each count of bytes
    taken, holes included (a progress bar's)."""

    def __init__(
        self,
        out: Any,
        start: int,
        path: str | os.PathLike[str],
        advance: Callable[[int], object] = lambda _n: None,
    ) -> None:
        self._out = out
        self._path = path
        self._advance = advance
        self._start = start
        self._position = start  # the file offset the next byte goes to
        self._at = start  # where the file object is
        self._holes = 0  # bytes left out

    def write(self, data: np.ndarray[Any, Any]) -> None:
        """Append `data` (any array, taken as its bytes in C order)."""
        data = data.reshape(-1).view(np.uint8)
        done = 0
        while done < data.size:
            end = min(data.size, done + HOLE_BYTES - self._position % HOLE_BYTES)
            piece = data[done:end]
            if _nonzero(piece):
                if self._at != self._position:
                    self._out.seek(self._position)
                self._out.write(piece.data)
                self._at = self._position + piece.size
            else:
                self._holes += piece.size
            self._position += piece.size
            self._advance(piece.size)
            done = end

    def finish(self) -> int:
        """End the file after the last byte written (where it ends in a hole) and give the
        holes their space where the rule says; return the file's length.

        Raises:
            SafetensorsFileError: the filesystem has no space for zeros that must have it.
            OSError: the file cannot be written.
        """
        self._out.truncate(self._position)  # flushes first
        if self._holes and not self._holes_readable():
            try:
                os.posix_fallocate(self._out.fileno(), self._start, self._position - self._start)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise SafetensorsFileError(
                    self._path, f"cannot write: {self._no_space()}; nothing written"
                ) from None
        return self._position

    def _holes_readable(self) -> bool:
        """Whether a reader can read this file's holes through a mapping, however full
        the filesystem gets: a disk filesystem, or any other not held in memory whose
        free space covers them now."""
        kind = filesystem_type(self._out.fileno())
        if kind in _HOLES_READ_FREE:
            return True
        if kind in _HOLES_TAKE_MEMORY:
            return False
        return _free(self._out.fileno()) >= self._holes

    def _no_space(self) -> str:
        kind = filesystem_type(self._out.fileno())
        zeros = format_size(self._holes)
        free = format_size(_free(self._out.fileno()))
        if kind in _HOLES_TAKE_MEMORY:
            return (
                f"no space for its {zeros} of zeros ({free} free on {_HOLES_TAKE_MEMORY[kind]}): "
                "a filesystem held in memory takes a page for each page of a hole read through "
                "a mapping, so the zeros are written, not left as holes that would kill the "
                "reader (SIGBUS)"
            )
        return (
            f"no space for its {zeros} of zeros ({free} free on a filesystem devpolicy does "
            "not know to read holes without taking space): they are written, not left as "
            "holes that could kill a reader of the mapped file (SIGBUS)"
        )


def _free(fd: int) -> int:
    """Bytes an unprivileged writer may still take on `fd`'s filesystem."""
    try:
        info = os.fstatvfs(fd)
    except OSError:
        return 0
    return info.f_bavail * info.f_frsize


def _nonzero(piece: np.ndarray[Any, Any]) -> bool:
    """Whether any byte of `piece` is not zero (eight at a time where they divide)."""
    if piece.size % 8 == 0:
        return bool(piece.view(np.uint64).any())
    return bool(piece.any())
