"""Reading whole tensors from a byte source, and the range reads every reader shares.

A large tensor is read in pieces, on several threads where it pays (the progress bar
moves by every piece, in order); every read goes through the source's `read_into`, so a
source elsewhere reads as a local file does. Errors name the file and the tensor. No JAX
here (numpy only).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.limits import CHUNK_BYTES
from ..format.header import Header, TensorEntry, as_array
from ..format.sources import ByteSource, SourceEndedError, os_error
from .buffers import host_buffer

# Threads reading one large tensor (or a sharded tensor's slices) at once. A read into
# fresh memory is mostly the kernel faulting in pages and copying from the page cache,
# with the GIL released: on two cores two readers take about half the time of one.
_READERS = min(4, os.cpu_count() or 1)
#: A reader's piece: large enough that a call costs nothing.
PIECE_BYTES = 16 * 2**20
#: Below this one thread reads.
THREADED_BYTES = 2 * PIECE_BYTES
#: A tensor read from a source without a descriptor (a URL) is asked for in groups of this
#: many bytes: the source runs each group's requests concurrently within its in-flight
#: budget, and the progress bar moves per group.
GROUP_BYTES = 64 * 2**20


def remote_groups(entry: TensorEntry) -> list[tuple[int, int]]:
    """(file offset, bytes) of each group a tensor is read in from a source without a
    descriptor, in order (`plan` counts the requests from them)."""
    return [
        (entry.offset + start, min(GROUP_BYTES, entry.nbytes - start))
        for start in range(0, entry.nbytes, GROUP_BYTES)
    ]


def read_range(
    source: ByteSource, header: Header, entry: TensorEntry, into: np.ndarray[Any, Any], offset: int
) -> None:
    """Fill `into` with the bytes of `entry` at file offset `offset`.

    Raises:
        SafetensorsFileError: the file ends first (saying how much of the tensor it
            holds) or the read fails, naming the file and the tensor.
    """
    read_ranges(source, header, entry, [(into, offset)], batch=False)


def read_ranges(
    source: ByteSource,
    header: Header,
    entry: TensorEntry,
    pieces: list[tuple[np.ndarray[Any, Any], int]],
    *,
    batch: bool = True,
) -> None:
    """Fill each (buffer, file offset) piece of `entry`: with `batch`, as one `read_many`
    (a remote source joins neighbours and runs the requests concurrently), else one
    `read_into`.

    Raises:
        SafetensorsFileError: as `read_range`.
    """
    try:
        if batch:
            source.read_many([(offset, memoryview(into)) for into, offset in pieces])  # type: ignore[arg-type]
        else:
            ((into, offset),) = pieces
            source.read_into(offset, memoryview(into))  # type: ignore[arg-type]
    except SourceEndedError as e:
        reached = e.end - entry.offset  # bytes of the tensor the file holds
        raise SafetensorsFileError(
            header.path,
            f"file ended after {reached} of {entry.nbytes} bytes: truncated?",
            tensor=entry.key,
        ) from None
    except OSError as e:
        raise os_error(header.path, e, "cannot read", tensor=entry.key) from None


def read_tensor(
    source: ByteSource, header: Header, entry: TensorEntry, advance: Callable[[int], None]
) -> np.ndarray[Any, Any]:
    """One tensor read whole into an aligned buffer, as its array (F4 unpacked)."""
    buffer = host_buffer(header, entry.key, entry.nbytes)
    if source.fileno() is None:
        # A remote source: each group is one batch of its own concurrent, chunked requests.
        for offset, length in remote_groups(entry):
            start = offset - entry.offset
            read_ranges(source, header, entry, [(buffer[start : start + length], offset)])
            advance(length)
        return as_array(entry, buffer)
    # Piece by piece, so the progress bar moves within a large tensor.
    step = PIECE_BYTES if entry.nbytes >= THREADED_BYTES and _READERS > 1 else CHUNK_BYTES
    pieces = [
        (buffer[start : start + step], entry.offset + start)
        for start in range(0, entry.nbytes, step)
    ]
    read_pieces(source, header, entry, pieces, advance)
    return as_array(entry, buffer)


def read_pieces(
    source: ByteSource,
    header: Header,
    entry: TensorEntry,
    pieces: list[tuple[np.ndarray[Any, Any], int]],
    advance: Callable[[int], None],
) -> None:
    """Read each (buffer, file offset) piece of `entry`; on several threads when the
    pieces are many and large (`THREADED_BYTES`), `advance` called here, in order."""
    total = sum(len(into) for into, _ in pieces)
    if len(pieces) < 2 or _READERS < 2 or total < THREADED_BYTES:
        for into, offset in pieces:
            read_range(source, header, entry, into, offset)
            advance(len(into))
        return
    with ThreadPoolExecutor(min(_READERS, len(pieces)), "devpolicy-read") as pool:
        futures = [
            pool.submit(read_range, source, header, entry, into, offset) for into, offset in pieces
        ]
        try:
            for future, (into, _) in zip(futures, pieces, strict=True):
                future.result()  # an error (truncated file, EIO) is raised here, as it is
                advance(len(into))
        finally:
            for future in futures:
                future.cancel()  # nothing more is read once one piece failed
