"""Shard-local range reads: the slices of a sharded tensor that this process's devices hold,
and nothing else it can avoid.

`jax.make_array_from_callback` asks for each device's slice; `ShardReader` answers from
one read of every distinct slice, made on the first call, through the byte source's
range reads (a mapped local file gives zero-copy views instead). No JAX here (numpy
only): the callback is handed to JAX by the loader.
"""

from __future__ import annotations

import itertools
import math
import mmap
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..._apply.narrowing import Narrow, loss_in_pieces, narrow_into
from ..._base.errors import NarrowingError
from ..._base.limits import ALIGN
from ..format.header import Header, TensorEntry
from ..format.layout import slice_runs
from ..format.sources import ByteSource
from .buffers import host_buffer
from .tensor_reads import PIECE_BYTES, THREADED_BYTES, read_pieces, read_range, read_ranges

# A sharded tensor's slices are read through their covering range, in chunks of this
# size, when that costs less than a system call per run; a call costs about as much as
# reading this many more bytes from the page cache (measured: 2.7 us a call, 0.6 ns a byte).
_GATHER_BYTES = 8 * 2**20
_CALL_BYTES = 4096

_Bounds = tuple[tuple[int, int], ...]  # per dimension, [start, stop) of a slice


def slice_bounds(entry: TensorEntry, index: tuple[slice, ...] | None) -> _Bounds:
    """A device's index (from `addressable_devices_indices_map`) as [start, stop) per
    dimension of `entry`."""
    shape = entry.shape
    given = tuple(index or ())
    given += (slice(None),) * (len(shape) - len(given))
    return tuple(s.indices(dim)[:2] for dim, s in zip(shape, given, strict=True))


def slice_ranges(entry: TensorEntry, bounds: _Bounds) -> list[tuple[int, int]]:
    """(file offset, bytes) of each contiguous run of the file that a slice of `entry` is
    made of, in order: one per index of the leading dimensions it does not span whole.

    Example:
        >>> import numpy as np
        >>> from devpolicy._io.format.header import TensorEntry
        >>> e = TensorEntry("w", "U8", np.dtype(np.uint8), (4, 6), 0, 24, 100)
        >>> slice_ranges(e, ((0, 4), (3, 6)))  # the right half: one run per row
        [(103, 3), (109, 3), (115, 3), (121, 3)]
        >>> slice_ranges(e, ((2, 4), (0, 6)))  # the bottom half: one run
        [(112, 12)]
    """
    offsets, run = slice_runs(entry.shape, entry.dtype.itemsize, bounds)
    return [(start, run) for start in (entry.offset + offsets).tolist()]


class ShardReader:
    """`make_array_from_callback`'s callback for one tensor: reads the slices this process's
    devices hold, and nothing else it can avoid.

    A slice is contiguous runs of the file (the trailing dimensions it spans whole, one run
    per index of the leading ones). Devices that hold the same slice share one read. When
    runs are short (a split on a trailing dimension), one system call per run costs far
    more than the bytes: then the range covering every slice is read once, in chunks of
    at most `_GATHER_BYTES`, and each slice cut from it in memory. Which way is cheaper is
    judged from the layout (`_CALL_BYTES`). A single run at an aligned offset of a mapped
    file is a zero-copy view; one at any offset, where the device copies it (`copied`).
    """

    def __init__(
        self,
        source: ByteSource,
        header: Header,
        entry: TensorEntry,
        region: mmap.mmap | None,
        narrow_to: np.dtype[Any] | None,
        narrow: Narrow,
        wanted: Iterable[tuple[slice, ...] | None] = (),
        copied: bool = False,
    ) -> None:
        self._source = source
        # Slices the device copies (an accelerator's) are views of the map at any offset,
        # read by the transfer; else only aligned ones, which a host device adopts.
        self._copied = copied
        self._align = 1 if copied else ALIGN
        self._header = header
        self._entry = entry
        self._region = region
        self._narrow_to = narrow_to
        self._narrow = narrow
        self._done: dict[_Bounds, np.ndarray[Any, Any]] = {}
        # Every distinct slice the process will ask for, so they can be read together.
        self._wanted = list(dict.fromkeys(self._bounds(index) for index in wanted))
        self.bytes_read = 0  # copied out of the file
        self.bytes_mapped = 0  # slices that are views of the mapped file
        self.mapped = 0
        self.lost = False  # some value changed when narrowed (under "lossy")

    def _bounds(self, index: tuple[slice, ...] | None) -> _Bounds:
        return slice_bounds(self._entry, index)

    def __call__(self, index: tuple[slice, ...] | None) -> np.ndarray[Any, Any]:
        bounds = self._bounds(index)
        found = self._done.get(bounds)
        if found is None and self._wanted:  # the first call: read what can be together
            wanted, self._wanted = self._wanted, []
            self._gather(wanted)
            found = self._done.get(bounds)
        if found is None:
            found = self._done[bounds] = self._narrowed(self._read(bounds))
        return found

    def _runs(self, bounds: _Bounds) -> tuple[int, int, int]:
        """(split, run bytes, runs): dimensions after `split` are spanned whole, so each run
        covers them and `bounds[split]`, one run per index of the dimensions before it."""
        shape, itemsize = self._entry.shape, self._entry.dtype.itemsize
        if not shape:
            return 0, itemsize, 1
        extents = [stop - start for start, stop in bounds]
        split = len(shape) - 1
        while split > 0 and extents[split] == shape[split]:
            split -= 1
        return split, math.prod(extents[split:]) * itemsize, math.prod(extents[:split])

    def _gather(self, wanted: list[_Bounds]) -> None:
        """Read every slice in `wanted` through their covering range, where that is cheaper
        than their runs one by one (see the class); else leave them to `_read`. From a
        source without a descriptor (a URL), every run of every slice in one batch."""
        entry, shape = self._entry, self._entry.shape
        wanted = [b for b in wanted if all(stop > start for start, stop in b)]
        if wanted and self._source.fileno() is None:
            self._read_batched(wanted)
            return
        if not shape or not wanted:
            return
        runs = [self._runs(b) for b in wanted]
        if all(count == 1 for _, _, count in runs):
            self._read_together(wanted)  # one run each: read (or mapped) directly
            return
        by_runs = sum(count * (_CALL_BYTES + run) for _, run, count in runs)
        box = tuple(
            (min(b[d][0] for b in wanted), max(b[d][1] for b in wanted)) for d in range(len(shape))
        )
        itemsize = entry.dtype.itemsize
        strides = [math.prod(shape[d + 1 :]) * itemsize for d in range(len(shape))]
        best: tuple[float, int] | None = None
        for d in range(self._runs(box)[0] + 1):
            if strides[d] > _GATHER_BYTES:
                continue  # a chunk must hold one whole index of dimension d
            blocks = math.prod(stop - start for start, stop in box[:d])
            rows = box[d][1] - box[d][0]
            chunks = blocks * -(-rows // max(1, _GATHER_BYTES // strides[d]))
            covered = blocks * (rows * strides[d])
            cost = chunks * _CALL_BYTES * (1 + len(wanted) / 2) + covered
            if best is None or cost < best[0]:
                best = (cost, d)
        if best is None or best[0] >= by_runs:
            return
        self._gather_along(wanted, box, best[1], strides)

    def _gather_along(
        self, wanted: list[_Bounds], box: _Bounds, d: int, strides: list[int]
    ) -> None:
        """Read `box` in chunks of whole indices of dimension `d` (one chunk per index of
        the dimensions before it, or several), copying each slice's part out of each."""
        entry, shape = self._entry, self._entry.shape
        itemsize = entry.dtype.itemsize
        outs = [
            host_buffer(self._header, entry.key, math.prod(b - a for a, b in bounds) * itemsize)
            .view(entry.dtype)
            .reshape(tuple(b - a for a, b in bounds))
            for bounds in wanted
        ]
        # Within one index of dimension d: the bytes from the box's first to its last item.
        inner_start = sum(box[k][0] * strides[k] for k in range(d + 1, len(shape)))
        inner_end = sum((box[k][1] - 1) * strides[k] for k in range(d + 1, len(shape)))
        inner_end += itemsize
        per_chunk = max(1, _GATHER_BYTES // strides[d])
        scratch = np.empty(min(per_chunk, box[d][1] - box[d][0]) * strides[d], np.uint8)
        for outer in itertools.product(*(range(a, b) for a, b in box[:d])):
            base = entry.offset + sum(i * strides[k] for k, i in enumerate(outer))
            for j0 in range(box[d][0], box[d][1], per_chunk):
                j1 = min(j0 + per_chunk, box[d][1])
                length = (j1 - j0 - 1) * strides[d] + inner_end - inner_start
                into = scratch[inner_start : inner_start + length]
                read_range(
                    self._source, self._header, entry, into, base + j0 * strides[d] + inner_start
                )
                self.bytes_read += length
                view = scratch[: (j1 - j0) * strides[d]].view(entry.dtype)
                view = view.reshape((j1 - j0, *shape[d + 1 :]))
                for bounds, out in zip(wanted, outs, strict=True):
                    if not all(a <= i < b for i, (a, b) in zip(outer, bounds, strict=False)):
                        continue
                    lo, hi = max(j0, bounds[d][0]), min(j1, bounds[d][1])
                    if lo >= hi:
                        continue
                    where: tuple[int | slice, ...] = tuple(
                        i - a for i, (a, _) in zip(outer, bounds, strict=False)
                    )
                    part = slice(lo - bounds[d][0], hi - bounds[d][0])
                    inner = tuple(slice(a, b) for a, b in bounds[d + 1 :])
                    out[(*where, part)] = view[(slice(lo - j0, hi - j0), *inner)]
        for bounds, out in zip(wanted, outs, strict=True):
            self._done[bounds] = self._narrowed(out)

    def _read_batched(self, wanted: list[_Bounds]) -> None:
        """Every run of every slice in `wanted`, asked of the source in one `read_many`:
        a remote source joins near neighbours, cuts chunks and fetches them concurrently,
        each run straight into its slice's aligned buffer. Only this process's bytes (and
        the small gaps a joined request spans) are fetched."""
        entry = self._entry
        pieces: list[tuple[np.ndarray[Any, Any], int]] = []
        arrays: list[tuple[_Bounds, np.ndarray[Any, Any]]] = []
        for bounds in wanted:
            runs = slice_ranges(entry, bounds)
            total = sum(length for _, length in runs)
            buffer = host_buffer(self._header, entry.key, max(total, 1))
            at = 0
            for start, length in runs:
                pieces.append((buffer[at : at + length], start))
                at += length
            extents = tuple(stop - first for first, stop in bounds)
            arrays.append((bounds, buffer[:total].view(entry.dtype).reshape(extents)))
            self.bytes_read += total
        read_ranges(self._source, self._header, entry, pieces)
        for bounds, array in arrays:
            self._done[bounds] = self._narrowed(array)

    def _read_together(self, wanted: list[_Bounds]) -> None:
        """Read every slice of `wanted` that is one run and not mapped, on several
        threads where they are large (`read_pieces`); mapped ones are left to `_read`."""
        entry = self._entry
        runs = [(bounds, *self._run_start(bounds)) for bounds in wanted]
        if self._region is not None:
            runs = [r for r in runs if r[1] % self._align]
        if sum(run for _, _, run in runs) < THREADED_BYTES:
            return  # small: each read when asked (nothing to overlap)
        pieces: list[tuple[np.ndarray[Any, Any], int]] = []
        arrays: list[tuple[_Bounds, np.ndarray[Any, Any]]] = []
        for bounds, start, run in runs:
            buffer = host_buffer(self._header, entry.key, run)
            for at in range(0, run, PIECE_BYTES):
                pieces.append((buffer[at : at + PIECE_BYTES], start + at))
            extents = tuple(stop - first for first, stop in bounds)
            arrays.append((bounds, buffer.view(entry.dtype).reshape(extents)))
        read_pieces(self._source, self._header, entry, pieces, lambda _n: None)
        self.bytes_read += sum(run for _, _, run in runs)
        for bounds, array in arrays:
            self._done[bounds] = self._narrowed(array)

    def _run_start(self, bounds: _Bounds) -> tuple[int, int]:
        """(file offset, bytes) of a slice that is one run."""
        return slice_ranges(self._entry, bounds)[0]

    def _read(self, bounds: _Bounds) -> np.ndarray[Any, Any]:
        entry = self._entry
        extents = tuple(stop - start for start, stop in bounds)
        runs = slice_ranges(entry, bounds)
        starts = [start for start, _ in runs]
        run = runs[0][1] if runs else 0
        count = math.prod(extents)
        if count and len(starts) == 1 and self._region is not None and starts[0] % self._align == 0:
            if self._copied:  # copied out of the file by the transfer, not kept mapped
                self.bytes_read += run
            else:
                self.mapped += 1
                self.bytes_mapped += run
            view = np.frombuffer(self._region, entry.dtype, count=count, offset=starts[0])
            return view.reshape(extents)
        buffer = host_buffer(self._header, entry.key, max(run * len(starts), 1))
        for n, start in enumerate(starts):
            read_range(self._source, self._header, entry, buffer[n * run : (n + 1) * run], start)
        self.bytes_read += run * len(starts)
        return buffer[: run * len(starts)].view(entry.dtype).reshape(extents)

    def _narrowed(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """`array` in 32 bits where JAX will hold it so (x64 off); raises on a loss, saying
        what the whole tensor loses (not only this slice)."""
        if self._narrow_to is None:
            return array
        narrowed, problem = narrow_into(array, np.empty(array.shape, self._narrow_to))
        self.lost = self.lost or problem is not None
        if problem is not None and self._narrow == "exact":
            whole = loss_in_pieces(self._pieces(), self._narrow_to) or problem
            raise NarrowingError([(self._entry.key, whole)], str(self._header.path))
        return narrowed

    def _pieces(self) -> Iterator[np.ndarray[Any, Any]]:
        """The whole tensor, flat, in consecutive pieces of at most `_GATHER_BYTES`."""
        entry = self._entry
        step = max(1, _GATHER_BYTES // entry.dtype.itemsize) * entry.dtype.itemsize
        buffer = np.empty(min(step, entry.nbytes), np.uint8)
        for start in range(0, entry.nbytes, step):
            piece = buffer[: min(step, entry.nbytes - start)]
            read_range(self._source, self._header, entry, piece, entry.offset + start)
            yield piece.view(entry.dtype)
