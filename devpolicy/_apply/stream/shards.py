"""Shards as one source: a list or tuple of 1-D token arrays (in memory, mapped by
`load_file`, any file-backed `np.memmap`: nanoGPT's raw `.bin`, `.npy`) is their
concatenation, in order, never copied.

A window may span shards, as it would in the concatenated file: it is cut into pieces,
one a shard (`_read.parts.pieces`, the arithmetic the reads by position share), and a
group's whole windows are gathered a shard at a time, one fancy index each. An empty
shard adds nothing to the concatenation, as `np.concatenate` has it: it is skipped, yet
counted in the shards a saved state names (`fingerprint`). No JAX here.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import numpy as np

from ..._read.parts import pieces


class Shards:
    """1-D token arrays of one dtype as one array of `shape` (their rows end to end): the
    non-empty ones (`views`), where each starts and ends in the one range (`edges`), and
    every shard's rows as given (`sizes`).

    Example:
        >>> shards = Shards([np.arange(3), np.arange(0), np.arange(3, 5)])
        >>> shards.shape, shards.edges.tolist(), shards.sizes
        ((5,), [0, 3, 5], (3, 0, 2))
    """

    __slots__ = ("dtype", "edges", "shape", "sizes", "views")

    ndim = 1

    def __init__(self, views: list[np.ndarray[Any, Any]]) -> None:
        # `len`: the rows of an array of one dimension or more, mapped in C over a thousand.
        self.sizes = tuple(map(len, views))  # as given, empty ones too
        rows = np.fromiter(self.sizes, np.int64, len(self.sizes))
        if all(self.sizes):
            self.views = list(views)
        else:
            self.views = [v for v in views if v.shape[0]]
            rows = rows[rows > 0]
        # Filled in place: a list of a thousand ints made an array is twice the time.
        self.edges = np.zeros(rows.size + 1, np.int64)
        np.cumsum(rows, out=self.edges[1:])
        self.dtype: np.dtype[Any] = views[0].dtype
        self.shape: tuple[int, ...] = (int(self.edges[-1]),)

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.itemsize

    def fingerprint(self) -> str:
        """The shards' count and a digest of their sizes, in order: what a saved state
        holds of them (a changed list of shards is refused on resume, this field named).

        Example:
            >>> Shards([np.arange(3), np.arange(2)]).fingerprint()
            '2 shards, sizes sha256 b38c612d3a2f2d9b'
        """
        sizes = np.fromiter(self.sizes, "<i8", len(self.sizes)).tobytes()
        return f"{len(self.sizes)} shards, sizes sha256 {hashlib.sha256(sizes).hexdigest()[:16]}"


def shards_of(what: str, views: list[np.ndarray[Any, Any]]) -> Shards:
    """`views` (each a checked host view, `what[i]`) as one source, refused unless each is
    1-D and all share the first one's dtype: an error naming the shard."""
    first = views[0]
    # Every shard 1-D of the first one's dtype, asked in one pass (the loop names a fault).
    if {1}.issuperset(map(attrgetter("ndim"), views)) and {first.dtype}.issuperset(
        map(attrgetter("dtype"), views)
    ):
        return Shards(views)
    for index, view in enumerate(views):
        if view.ndim != 1:
            raise ValueError(
                f"{what}[{index}] has shape {view.shape}: each shard of a list is a 1-D "
                "array of token ids (their concatenation is the source)"
            )
        if view.dtype != first.dtype:
            raise ValueError(
                f"{what}[{index}] is {view.dtype}, and {what}[0] is {first.dtype}: the shards "
                f"of one source share a dtype (their concatenation's): make every shard "
                f"{first.dtype}"
            )
    return Shards(views)


def gather_parts(
    parts: list[np.ndarray[Any, Any]],
    windows: Callable[[int], np.ndarray[Any, Any]],
    edges: np.ndarray[Any, Any],
    length: int,
    offsets: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """The windows of `length` rows at `offsets` (any shape) of `parts` as one range of
    rows (part i's from `edges[i]`; `windows(i)`: its every window, asked only of a part
    a whole window lies in), in `out` (C-contiguous, of their shape and dtype) or a new
    array.

    Example:
        >>> from devpolicy._apply.stream.groups import every_window
        >>> parts = [np.arange(2), np.arange(2, 7)]
        >>> windows = lambda i: every_window(parts[i], 3)
        >>> gather_parts(parts, windows, np.array([0, 2, 7]), 3, np.array([1, 4])).tolist()
        [[1, 2, 3], [4, 5, 6]]
    """
    first = parts[0]
    shape = (*offsets.shape, length, *first.shape[1:])
    if out is None:
        out = np.empty(shape, first.dtype)
    whole = out.reshape(offsets.size, length, *first.shape[1:])
    window, part, within, rows, at = pieces(edges, offsets.reshape(-1), length)
    one = rows == length  # a window within one part: a fancy index of that part's windows
    if one.all():
        split = np.ones(window.size, bool)
    else:
        split = ~one
        for w, p, f, r, a in zip(*(c[split].tolist() for c in (window, part, within, rows, at)),
                                 strict=True):  # fmt: skip
            whole[w, a : a + r] = parts[p][f : f + r]
        split = one
    window, part, within = window[split], part[split], within[split]
    if not window.size:
        return out.reshape(shape)
    # A part at a time (found once for all parts, in order of their part).
    order = np.argsort(part, kind="stable")
    ordered = part[order]
    bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), order.size]
    for low, high in itertools.pairwise(bounds):
        where = order[low:high]
        whole[window[where]] = windows(int(ordered[low]))[within[where]]
    return out.reshape(shape)
