"""Packed rows read: each row described by its spans of the tokens (start, count), the
rest of it padding, and a batch of such rows gathered into a (rows, length) buffer with
its segment ids and positions.

The layout says where each document lies in its row, so the ids and positions come from
it directly (no scan for separators): segment id 1, 2, ... for a row's documents in
order and 0 for its padding (grain's and MaxText's), position 0 at each document's first
token and 0 over the padding; padding tokens are the `pad` token. A read path that reads
by position reads each span into its place (`placed`: source start, count, place in the
buffer). No JAX here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Layout:
    """Rows `first` .. `first + rows - 1` of a packed stream, each `length` tokens: row
    r's spans are `starts[bounds[r]:bounds[r + 1]]` (token offsets into the source) and
    as many `counts`, in the order they lie in the row, from column 0; the rest of the
    row is padding.

    Example:
        >>> layout = Layout(0, 4, np.array([0, 2, 3]), np.array([10, 0, 5]), np.array([2, 2, 3]))
        >>> layout.rows, layout.used.tolist()
        (2, [4, 3])
    """

    first: int
    length: int
    bounds: np.ndarray[Any, Any]
    starts: np.ndarray[Any, Any]
    counts: np.ndarray[Any, Any]

    @property
    def rows(self) -> int:
        return int(self.bounds.shape[0] - 1)

    @property
    def used(self) -> np.ndarray[Any, Any]:
        """The tokens of documents in each row (the rest is padding)."""
        sums = np.concatenate(([0], np.cumsum(self.counts)))
        used: np.ndarray[Any, Any] = sums[self.bounds[1:]] - sums[self.bounds[:-1]]
        return used

    def taken(self, rows: np.ndarray[Any, Any]) -> Layout:
        """The layout of `rows` of these (indices from 0, in the order given): a process's
        own rows of a global batch."""
        lo, hi = self.bounds[rows], self.bounds[rows + 1]
        sizes = hi - lo
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        picked = np.repeat(lo - bounds[:-1], sizes) + np.arange(bounds[-1])
        return Layout(-1, self.length, bounds, self.starts[picked], self.counts[picked])

    @staticmethod
    def joined(parts: list[Layout], first: int, length: int) -> Layout:
        """Consecutive layouts as one from row `first`."""
        if len(parts) == 1:
            only = parts[0]
            return Layout(first, length, only.bounds, only.starts, only.counts)
        bounds = [np.zeros(1, np.int64)]
        at = 0
        for part in parts:
            bounds.append(part.bounds[1:] + at)
            at += int(part.bounds[-1])
        return Layout(
            first,
            length,
            np.concatenate(bounds),
            np.concatenate([p.starts for p in parts]),
            np.concatenate([p.counts for p in parts]),
        )


def placed(layout: Layout) -> tuple[np.ndarray[Any, Any], ...]:
    """Each span's source start, count and place in a (rows, length) buffer, flat: what a
    read by position reads where (each count at most `length`)."""
    row = np.repeat(np.arange(layout.rows, dtype=np.int64), np.diff(layout.bounds))
    ends = np.cumsum(layout.counts)
    row_begins = np.concatenate(([0], ends))[layout.bounds[:-1]]
    columns = ends - layout.counts - np.repeat(row_begins, np.diff(layout.bounds))
    return layout.starts, layout.counts, row * layout.length + columns


def gather(
    tokens: np.ndarray[Any, Any] | list[np.ndarray[Any, Any]],
    layout: Layout,
    pad: int,
    out: np.ndarray[Any, Any] | None = None,
    edges: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """The rows of `layout` read from `tokens` (1-D, in memory or mapped; or shards, a
    list of 1-D arrays, shard i from place `edges[i]` of their concatenation) into `out`
    (rows, length), made where not given; padding is `pad`.

    Every span and every row's padding is one slice of one `np.concatenate` straight
    into `out`: a copy a span in Python cost twice this (measured: docs/benchmarks.md,
    "Documents kept whole"). A span that runs on into the next shards is a slice of
    each. A `np.memmap` is sliced as the plain array it maps (a memmap's slices cost a
    Python object each).

    Example:
        >>> layout = Layout(0, 4, np.array([0, 2, 3]), np.array([10, 0, 5]), np.array([2, 2, 3]))
        >>> gather(np.arange(20), layout, -1).tolist()
        [[10, 11, 0, 1], [5, 6, 7, -1]]
        >>> shards = [np.arange(6), np.arange(6, 20)]
        >>> gather(shards, layout, -1, edges=np.array([0, 6, 20])).tolist()
        [[10, 11, 0, 1], [5, 6, 7, -1]]
    """
    length = layout.length
    first = tokens[0] if isinstance(tokens, list) else tokens
    if out is None:
        out = np.empty((layout.rows, length), first.dtype)
    if not layout.rows:
        return out
    padding = _padding(pad, np.dtype(first.dtype), length)
    if isinstance(tokens, list):
        assert edges is not None
        spans = _shard_spans(tokens, edges, layout)
    else:
        plain = tokens.view(np.ndarray) if isinstance(tokens, np.memmap) else tokens
        starts, counts = layout.starts.tolist(), layout.counts.tolist()
        spans = [plain[start : start + count] for start, count in zip(starts, counts, strict=True)]
    bounds, used = layout.bounds.tolist(), layout.used.tolist()
    parts: list[np.ndarray[Any, Any]] = []
    add = parts.append
    k = 0
    for row in range(layout.rows):
        end = bounds[row + 1]
        parts += spans[k:end]
        k = end
        rest = length - used[row]
        if rest:
            add(padding[:rest])
    np.concatenate(parts, out=out.reshape(-1))
    return out


def _shard_spans(
    shards: list[np.ndarray[Any, Any]], edges: np.ndarray[Any, Any], layout: Layout
) -> list[Any]:
    """Each span of `layout` as a slice of the shard it lies in, or, where it runs on into
    the next shards, one array of its slices joined (rare: a document cut by a shard's
    end)."""
    starts = layout.starts.astype(np.int64)
    counts = layout.counts.astype(np.int64)
    shard = np.searchsorted(edges, starts, "right") - 1
    within = starts - edges[shard]
    crossing = counts > edges[shard + 1] - starts
    spans = [
        shards[s][w : w + c]
        for s, w, c in zip(shard.tolist(), within.tolist(), counts.tolist(), strict=True)
    ]
    for k in np.flatnonzero(crossing).tolist():
        s, w, c = int(shard[k]), int(within[k]), int(counts[k])
        pieces = []
        while c:
            take = min(c, shards[s].shape[0] - w)
            pieces.append(shards[s][w : w + take])
            s, w, c = s + 1, 0, c - take
        spans[k] = np.concatenate(pieces)
    return spans


@functools.lru_cache(maxsize=8)
def _padding(pad: int, dtype: np.dtype[Any], length: int) -> np.ndarray[Any, Any]:
    """A row of `pad` (read-only): a row's padding is a slice of it."""
    row = np.full(length, pad, dtype)
    row.flags.writeable = False
    return row


def segments(
    layout: Layout, out: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The segment ids and positions (int32, (rows, length)) of the rows of `layout`:
    from the spans, never from the tokens. Written into `out` where given.

    Each row is its spans then one run of padding: each run's id (1, 2, ... within its
    row; 0 for the padding) and first flat place repeated over its tokens, as
    `documents.segments` does with the runs it finds by scanning.

    Example:
        >>> layout = Layout(0, 4, np.array([0, 2, 3]), np.array([10, 0, 5]), np.array([2, 2, 3]))
        >>> [a.tolist() for a in segments(layout)]
        [[[1, 1, 2, 2], [1, 1, 1, 0]], [[0, 1, 0, 1], [0, 1, 2, 0]]]
    """
    rows, length = layout.rows, layout.length
    sizes = np.diff(layout.bounds)
    used = layout.used
    runs = sizes + 1  # a row's spans and its padding (perhaps empty)
    pads = np.cumsum(runs) - 1  # where each row's padding run is
    counts = np.empty(int(pads[-1]) + 1 if rows else 0, np.int64)
    real = np.ones(counts.size, bool)
    real[pads] = False
    counts[real] = layout.counts
    counts[pads] = length - used
    ids = np.arange(counts.size, dtype=np.int32) - np.repeat((pads - sizes).astype(np.int32), runs)
    ids += 1
    ids[pads] = 0
    if out is None:
        out = (np.empty((rows, length), np.int32), np.empty((rows, length), np.int32))
    segment_ids, positions = out
    segment_ids.reshape(-1)[:] = np.repeat(ids, counts)
    begins = (np.cumsum(counts) - counts).astype(np.int32)
    flat = positions.reshape(-1)
    np.subtract(_places(rows * length), np.repeat(begins, counts), out=flat)
    for row, start in enumerate(used.tolist()):
        if start < length:
            positions[row, start:] = 0
    return segment_ids, positions


#: Tokens a word of `start_words` (the device's block: `documents.BLOCK`).
WORD_BITS = 32


def start_words(layout: Layout, out: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
    """The rows of `layout` as the device works their segment ids and positions out
    (`documents.on_device_packed`): uint32 (rows, words + 1), bit i of word w set where
    column w * `WORD_BITS` + i starts a span after the row's first, the last word the
    row's tokens of documents (the rest is padding). Written into `out` where given. A
    few numpy calls on the spans, none on the tokens: a sixteenth of the bytes of uint16
    tokens where the ids and positions are four times them.

    Example:
        >>> layout = Layout(0, 40, np.array([0, 2, 3]), np.array([10, 0, 5]), np.array([33, 2, 3]))
        >>> start_words(layout).tolist()
        [[0, 2, 35], [0, 0, 3]]
    """
    rows, length = layout.rows, layout.length
    words = -(-length // WORD_BITS)
    if out is None:
        out = np.empty((rows, words + 1), np.uint32)
    out.fill(0)
    if not rows:
        return out
    sizes = np.diff(layout.bounds)
    ends = np.cumsum(layout.counts)
    row_begins = np.concatenate(([0], ends))[layout.bounds[:-1]]
    columns = ends - layout.counts - np.repeat(row_begins, sizes)
    later = columns > 0  # a row's first span starts at column 0, as every row does
    rows_of = np.repeat(np.arange(rows, dtype=np.int64), sizes)[later]
    columns = columns[later]
    flat = out.reshape(-1)
    bits = np.left_shift(np.uint32(1), (columns % WORD_BITS).astype(np.uint32))
    # Two spans can start in one word: their bits are or-ed in, not one written over.
    np.bitwise_or.at(flat, rows_of * (words + 1) + columns // WORD_BITS, bits)
    out[:, words] = layout.used
    return out


@functools.lru_cache(maxsize=4)
def _places(count: int) -> np.ndarray[Any, Any]:
    """0 .. count - 1 (int32, read-only): each token's flat place in a batch."""
    places = np.arange(count, dtype=np.int32)
    places.flags.writeable = False
    return places
