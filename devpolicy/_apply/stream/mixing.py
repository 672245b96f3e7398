"""Weighted mixtures: one stream over several token arrays, each row of a global batch
allotted to a source by weight, and a window drawn from that source.

The weights become whole counts over a period of rows (the shortest period, up to
`PERIOD_MOST` rows, that holds them exactly; else `PERIOD_MOST` rows by largest
remainders), each source's rows spread evenly over the period. Global row g (step *
global batch + row) is then row g mod P of period g // P: its source, and how many rows of
that source came before it (its k), are two lookups. So each source's share is exact over
every period and within two rows of it in every batch, and a source's k-th window is
drawn from counters as a random or shuffled stream's are (with replacement, or from its
own epochs): any step costs what the first does, a stream resumes at once, and every
process draws its own rows. A draw per row at random could not say k without counting
every row before it: no resume in O(1), no epochs per source.

A mixture's windows are numbered in one range, source after source (`bases`), so the rest
of the stream cuts them as it cuts one array's. No JAX here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .groups import every_window
from .sampling import Rows, mixed, stream_key, uniform_below
from .shards import Shards, gather_parts
from .shuffling import BLOCK_WINDOWS, RowDraws, shuffled_windows

#: The longest period of an allotment, in rows: weights no period up to it holds exactly
#: are held to within 1/PERIOD_MOST of their share.
PERIOD_MOST = 2**16
#: How near a period's counts must come to the weights to count as exact.
_EXACT = 1e-9
#: Parts (shards) whose every-window views are kept for the next gather, at most.
_WINDOWS_KEPT = 64


def allotment(weights: list[float]) -> np.ndarray[Any, Any]:
    """Rows of each source in one period: the shortest period that holds the weights'
    shares exactly, or `PERIOD_MOST` rows by largest remainders.

    Any finite positive weights: they are scaled by the largest before they are summed,
    so weights near float64's largest keep their shares (their plain sum is inf).

    Example:
        >>> allotment([0.7, 0.3]).tolist(), allotment([1, 2]).tolist()
        ([7, 3], [1, 2])
        >>> allotment([1.5e308, 0.5e308]).tolist()
        [3, 1]
    """
    scaled = np.asarray(weights, np.float64) / max(weights)
    shares: np.ndarray[Any, Any] = scaled / scaled.sum()
    most = max(1, 2**18 // shares.size)  # periods tried at once: memory stays small
    low, chunk = 1, 64  # short periods first (most weights are held by one): then more
    while low <= PERIOD_MOST:
        high = min(low + chunk, PERIOD_MOST + 1)
        periods = np.arange(low, high, dtype=np.float64)[:, None]
        low, chunk = high, min(most, chunk * 8)
        counts = np.rint(periods * shares)
        exact = (counts.sum(axis=1) == periods[:, 0]) & (
            np.abs(counts / periods - shares).max(axis=1) <= _EXACT
        )
        found = np.flatnonzero(exact & (counts > 0).all(axis=1))
        if found.size:
            exact_counts: np.ndarray[Any, Any] = counts[found[0]].astype(np.int64)
            return exact_counts
    wanted = shares * PERIOD_MOST
    whole: np.ndarray[Any, Any] = np.floor(wanted).astype(np.int64)
    short = PERIOD_MOST - int(whole.sum())
    whole[np.argsort(whole - wanted, kind="stable")[:short]] += 1
    return whole


def spread(counts: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Each row of a period: its source, and the rows of that source before it in the
    period. Source s's j-th row sits at (j + 1/2) / counts[s] of the period.

    Example:
        >>> [a.tolist() for a in spread(np.array([2, 1]))]
        [[0, 1, 0], [0, 0, 1]]
    """
    sources = np.repeat(np.arange(counts.size), counts)
    ranks = np.concatenate([np.arange(n) for n in counts.tolist()])
    order = np.argsort((ranks + 0.5) / counts[sources], kind="stable")
    return sources[order], ranks[order]


class Mixed(RowDraws):
    """Windows of several sources by weight (`allotment`), each source's windows drawn at
    random (with replacement) or from its own shuffled epochs; endless unless `steps`.
    Offsets are in the mixture's one range (source s's rows from `bases[s]`). `take` is a
    pure function of the step, as `Random`'s is."""

    __slots__ = (
        "_keys",
        "_ranks",
        "_shuffled",
        "_sources",
        "_stride",
        "bases",
        "counts",
        "starts",
        "windows",
    )

    def __init__(
        self,
        starts: list[int],
        bases: np.ndarray[Any, Any],
        weights: list[float],
        rows: Rows,
        seed: int,
        steps: int | None,
        shuffled_stride: int | None,
    ) -> None:
        self.starts = starts  # offsets a window fits at, a source
        self.bases = bases  # where each source's rows start in the mixture's one range
        self.counts = allotment(weights)
        self._sources, self._ranks = spread(self.counts)
        self._shuffled = shuffled_stride is not None
        self._stride = shuffled_stride or 1
        # A shuffled source's epoch: its windows at `stride`; a random one draws starts.
        self.windows = [-(-n // self._stride) for n in starts]
        self._keys = [np.uint64(stream_key(seed, 2 + s)) for s in range(len(starts))]
        super().__init__(rows, steps)

    def drawn_before(self, step: int) -> list[int]:
        """Windows of each source in the global batches before `step`, as Python ints:
        near step 2**63 a source's count times the periods passes int64."""
        rows = self._base + step * self._per_step
        period = int(self.counts.sum())
        cycles, within = divmod(rows, period)
        partial = np.bincount(self._sources[:within], minlength=self.counts.size).tolist()
        return [n * cycles + k for n, k in zip(self.counts.tolist(), partial, strict=True)]

    def counted(self, names: tuple[str, ...], first: int, steps: int) -> dict[str, int]:
        """The windows of each source (by name) in the global batches of steps `first` ..
        `first + steps - 1`."""
        after, before = self.drawn_before(first + steps), self.drawn_before(first)
        return {name: a - b for name, a, b in zip(names, after, before, strict=True)}

    def epoch_at(self, names: tuple[str, ...], step: int) -> dict[str, int]:
        """Each source's epoch (by name) at `step`, for a shuffled mixture."""
        drawn = self.drawn_before(step)
        return {name: n // w for name, n, w in zip(names, drawn, self.windows, strict=True)}

    def take(self, first: int, most: int) -> np.ndarray[Any, Any] | None:
        """The offsets of steps `first` .. (up to `most` of them), shape (k, rows); None
        past the last step."""
        count = min(most, self.steps - first)
        if count <= 0:
            return None
        # A block drawn a source at a time: as many windows again for each source, so
        # that each source's draws share a numpy call's fixed cost as one stream's do.
        return self._block_from(first, count, self.steps, BLOCK_WINDOWS * self.counts.size)

    def _drawn(self, first: int, count: int, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        rows = self.global_rows(first, count, rows)
        period = np.uint64(self.counts.sum())
        cycles, within = np.divmod(rows, period)
        sources = self._sources[within]
        nth = cycles.astype(np.int64) * self.counts[sources] + self._ranks[within]
        offsets = np.empty(rows.shape, np.int64)
        for source in range(self.counts.size):
            where = sources == source
            k = nth[where].astype(np.uint64)
            if not k.size:  # no row of this block from this source
                continue
            if self._shuffled:
                drawn, _ = shuffled_windows(int(self._keys[source]), k, self.windows[source])
                drawn *= self._stride
            else:
                z = k * np.uint64(0x9E3779B97F4A7C15)
                z += self._keys[source]
                drawn = uniform_below(mixed(z), self.starts[source])
            offsets[where] = drawn + self.bases[source]
        return offsets


class MixedViews:
    """Token arrays as one range of rows: a mixture's sources, source after source
    (`bases`: where each starts), a sharded source's shards, shard after shard. `views`
    are the arrays read from (every shard of every source), `edges` where each starts and
    ends; a group of windows at offsets in that range is gathered from each one's own
    array, a window that spans shards of one source piece by piece (`shards`).

    Example:
        >>> views = MixedViews([np.arange(10), np.arange(100, 105)], 3)
        >>> views.gather(np.array([[0, 10], [12, 7]])).tolist()
        [[[0, 1, 2], [100, 101, 102]], [[102, 103, 104], [7, 8, 9]]]
        >>> shards = MixedViews([Shards([np.arange(2), np.arange(2, 5)])], 3)
        >>> shards.gather(np.array([1, 2])).tolist()
        [[1, 2, 3], [2, 3, 4]]
    """

    __slots__ = ("bases", "edges", "length", "stand_in", "views", "windows")

    def __init__(self, sources: list[np.ndarray[Any, Any] | Shards], length: int) -> None:
        self.views: list[np.ndarray[Any, Any]] = []
        for source in sources:
            self.views.extend(source.views if isinstance(source, Shards) else [source])
        rows = [source.shape[0] for source in sources]
        self.bases = np.cumsum([0, *rows[:-1]], dtype=np.int64)
        # Each part's rows, a source's shards' from their own edges (not a loop over a
        # thousand shards' shapes in Python: 0.3-0.5 ms of a fresh stream's first batch).
        ends = [
            source.edges[1:] + base if isinstance(source, Shards) else [base + source.shape[0]]
            for source, base in zip(sources, self.bases.tolist(), strict=True)
        ]
        self.edges = np.concatenate([[0], *ends]).astype(np.int64, copy=False)
        self.length = length
        # Each part's every window, made the first time a window is gathered from it (of
        # a thousand shards, a stream reading by position makes none), at most
        # `_WINDOWS_KEPT` kept: memory stays flat however many shards a stream reads.
        self.windows: dict[int, np.ndarray[Any, Any]] = {}
        # A window's shape and dtype, and no memory: what the read paths ask of "the
        # view" of a source that is several.
        first = self.views[0]
        self.stand_in = np.broadcast_to(np.zeros((), first.dtype), (length, *first.shape[1:]))

    def gather(
        self, offsets: np.ndarray[Any, Any], out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """The windows at `offsets` (any shape), in `out` (C-contiguous, of their shape
        and dtype) or a new array."""
        return gather_parts(self.views, self._windows, self.edges, self.length, offsets, out)

    def _windows(self, part: int) -> np.ndarray[Any, Any]:
        """Every window of part `part` (one it is at least a window long)."""
        kept = self.windows
        found = kept.get(part)
        if found is None:  # two threads may make it at once: the same view either way
            if len(kept) >= _WINDOWS_KEPT:
                kept.clear()
            found = kept[part] = every_window(self.views[part], self.length)
        return found
