"""A local checkpoint file opened again for its data, and mapped: the same file, unchanged.

The first opening (for the header) is `sources.LocalFile.open`. A checkpoint's files are
opened one at a time, so each is opened twice; the second must find the file its header
came from, at the size it had, or the load stops with an error naming it. No JAX here.
"""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

from ..._base.errors import SafetensorsFileError
from ..format.header import Header
from ..format.sources import ByteSource, LocalFile, file_identity, open_tensor_file, os_error


def reopen_tensor_file(header: Header) -> LocalFile:
    """Open again the file `header` was read from, to read its data.

    A checkpoint's files are opened one at a time (a checkpoint may hold more files than a
    process may open), so each is opened twice: once for its header, once for its data.
    The second must find the same file, unchanged: one replaced in between (as atomic
    writers do) or rewritten in place is refused, never read against the other's header.

    Raises:
        SafetensorsFileError: the file cannot be opened, or is not the file it was.
    """
    if not isinstance(header.path, Path):
        raise SafetensorsFileError(header.path, "cannot open again: not a local file")
    source = open_tensor_file(header.path)
    try:
        info = os.fstat(source.fileno())
        if info.st_size != header.file_size:
            raise SafetensorsFileError(
                header.path,
                f"file changed size while loading ({header.file_size} bytes when its header "
                f"was read, {info.st_size} now): is something rewriting it in place?",
            )
        if header.identity and file_identity(info) != header.identity:
            raise SafetensorsFileError(
                header.path,
                "file was replaced or rewritten after its header was read: load it again "
                "once whatever is writing it has finished",
            )
    except BaseException:
        source.close()
        raise
    return source


def map_tensor_file(source: ByteSource, header: Header) -> mmap.mmap:
    """One read-only map of the whole of an open local file whose header is `header`.

    The file must still be the size its header was read at: a file that shrank (being
    rewritten in place) would otherwise give short buffers or, later, SIGBUS.

    Raises:
        SafetensorsFileError: the source is not a local file, the file changed size, or
            the map failed (address space exhausted, too many open files), naming the file.
    """
    fd = source.fileno()
    if fd is None:
        raise SafetensorsFileError(header.path, "cannot map: not a local file")
    try:
        size = os.fstat(fd).st_size
    except OSError as e:
        raise SafetensorsFileError(header.path, f"cannot read: {e.strerror}") from None
    if size != header.file_size:
        raise SafetensorsFileError(
            header.path,
            f"file changed size while loading ({header.file_size} bytes when its header was "
            f"read, {size} now): is something rewriting it in place?",
        )
    try:
        if sys.version_info >= (3, 13):
            # The map alone keeps the pages: no descriptor held for as long as arrays live.
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ, trackfd=False)
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except ValueError as e:  # "cannot mmap an empty file"
        raise SafetensorsFileError(header.path, f"cannot map: {e}") from None
    except OSError as e:
        raise os_error(header.path, e, "cannot map the file") from None
