"""Epochs without replacement: each epoch a permutation of a stream's windows, drawn from
counters as the random order's starts are.

Row r of step k is the stream's global row g = k * batch + r: position g mod W of epoch
g // W (W windows an epoch), and its window is that position permuted by a permutation
keyed by the seed and the epoch. Up to `SMALL` windows an epoch, the permutation is a
table: the windows sorted by a 64-bit SplitMix64 draw each, from counters keyed by the
epoch, which puts each of the W! orders equally likely (up to a tie among the draws, under
2**-29 at `SMALL`); a Feistel network over few values cannot (over 4 to 7 windows its orders
were far from uniform, the same for every seed). A table costs O(W) to draw and to hold,
so one epoch's is kept (`_table`) while the stream draws from it, and a call over many
short epochs draws all of theirs at once. Past `SMALL`, no table: a Feistel network over
the smallest power of two of at least W values (six or twelve rounds, a multiply-shift
round function), walked along its cycle until it lands below W (fewer than two passes on
average), a keyed pseudo-random permutation whose memory stays flat however many windows
(grain's global shuffle, `index_shuffle`, is a Feistel network too). Either way a bijection
whatever the key, so every window comes exactly once an epoch; and any position's window
costs what the first one's does, so a stream resumed at step N starts at once, as a random
one does. No JAX here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .sampling import Rows, mixed, stream_key

# Odd multipliers of the round function, one a round (constants of wyhash, xxHash and
# SplitMix64: any odd ones with well-mixed bits do).
_MULTIPLIERS = tuple(
    np.uint64(m)
    for m in (
        0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
        0xA0761D6478BD642F, 0xE7037ED1A0B428DB, 0x8EBC6AF09C88C6E3, 0x589965CC75374CC3,
        0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x27D4EB2F165667C5, 0x85EBCA77C2B2AE63,
    )
)  # fmt: skip


def _rounds(bits: int) -> int:
    """Rounds of the network over `bits`-bit values: a round's function has half of them
    to work with, so small domains need more (at 4 rounds, where 10 windows land across
    epochs was 23 times a uniform shuffle's chi-square; at 12, as uniform's; from 9 bits
    on, 6 rounds were within 0.5% of uniform's)."""
    return 12 if bits <= 8 else 6


_EPOCH_SALT = 1  # the salt of the epochs' keys (`stream_key`)
#: Windows drawn at once, at least (a block of steps, kept until the stream passes it): a
#: numpy call's fixed cost, most of a small group's drawing, is shared by more windows.
BLOCK_WINDOWS = 4096
#: Global rows a shuffled stream can reach: their counters are 64-bit and signed.
LAST_ROW = 2**63
#: The most windows an epoch whose order is a table (exactly uniform): one costs about
#: 20-30 ns a window to draw (70 us at 4096), once an epoch, and 8 bytes a window to keep;
#: the Feistel network, past it, 35 ns a window drawn and no memory.
SMALL = 2**12
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (`sampling`)
#: Epochs of one call whose tables come from the kept ones; more are drawn at once.
_KEPT_AT_ONCE = 4


def epoch_keys(seed: int, epochs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The key of each epoch of `epochs` (uint64) of a stream with `seed`."""
    z = epochs.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z += np.uint64(stream_key(seed, _EPOCH_SALT))
    return mixed(z)


def _feistel(x: np.ndarray[Any, Any], keys: Any, high: int, low: int) -> np.ndarray[Any, Any]:
    """One pass of the network over `high + low`-bit values `x` (uint64), keyed per value
    (or once, a scalar)."""
    for multiplier in _MULTIPLIERS[: _rounds(high + low)]:
        left = x >> np.uint64(low)
        right = x & np.uint64((1 << low) - 1)
        # The top `high` bits of (right + key) * multiplier: every bit of `right` counts.
        mixed_right = right + keys
        mixed_right *= multiplier
        mixed_right >>= np.uint64(64 - high)
        left ^= mixed_right
        x = right << np.uint64(high)
        x |= left
        high, low = low, high
    return x


def _tables(keys: np.ndarray[Any, Any], count: int) -> np.ndarray[Any, Any]:
    """The permutations of [0, count) keyed by `keys` (uint64), one a row: the windows in
    the order of a SplitMix64 draw each (the counters 1, 2, ... keyed by the key), so every
    order is equally likely. Each draw's low bits are its window: the draws are distinct,
    so any sort puts them in one order on every machine, and sorting the values (not
    `argsort`) is several times faster; draws alike in their other bits (under
    count**2 / 2**(65 - bits), 2**-29 at `SMALL`) fall in the windows' order."""
    bits = (count - 1).bit_length()
    z = np.arange(1, count + 1, dtype=np.uint64) * _GAMMA
    z = mixed(z[None, :] + keys.reshape(-1, 1))
    z >>= np.uint64(bits)
    z <<= np.uint64(bits)
    z |= np.arange(count, dtype=np.uint64)
    z.sort(axis=1)
    z &= np.uint64((1 << bits) - 1)
    tables: np.ndarray[Any, Any] = z.astype(np.int64)
    return tables


@lru_cache(maxsize=16)  # 16 tables of up to SMALL windows: at most 512 KiB
def _table(key: int, count: int) -> np.ndarray[Any, Any]:
    """The permutation keyed by `key` (`_tables`), kept: a stream draws an epoch's rows a
    block at a time, and a mixture's sources each have their own. Read-only."""
    table: np.ndarray[Any, Any] = _tables(np.asarray([key], np.uint64), count)[0]
    table.flags.writeable = False
    return table


def _looked_up(
    positions: np.ndarray[Any, Any], keys: np.ndarray[Any, Any], at: Any, count: int
) -> np.ndarray[Any, Any]:
    """The windows at `positions` of the tables keyed by `keys` (uint64, distinct), each
    position's table `keys[at]` (`at` an index array, or 0 where there is one key)."""
    drawn: np.ndarray[Any, Any]
    if keys.size == 1:
        drawn = _table(int(keys[0]), count)[positions]
        return drawn
    if keys.size <= _KEPT_AT_ONCE:
        tables = np.stack([_table(int(key), count) for key in keys.tolist()])
    else:  # many short epochs: drawing all at once costs less than keeping each
        tables = _tables(keys, count)
    drawn = tables[at, positions]
    return drawn


def permuted(positions: np.ndarray[Any, Any], keys: Any, count: int) -> np.ndarray[Any, Any]:
    """The windows at `positions` (uint64, each below `count`) of the permutations keyed by
    `keys` (one a position, or one for all): a bijection of [0, count) for each key, every
    order equally likely up to `SMALL` windows.

    Example:
        >>> keys = np.uint64(7)
        >>> sorted(permuted(np.arange(10, dtype=np.uint64), keys, 10).tolist())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    if count <= 1:
        return np.zeros(positions.shape, np.int64)
    if count <= SMALL:
        if np.ndim(keys) == 0:
            return _looked_up(positions, np.asarray([keys], np.uint64), 0, count)
        distinct, at = np.unique(keys, return_inverse=True)
        return _looked_up(positions, distinct, at.reshape(positions.shape), count)
    bits = max(2, (count - 1).bit_length())
    high = bits // 2
    low = bits - high
    out = _feistel(positions, keys, high, low)
    # Cycle walking: a value at or past `count` is permuted again until it is below; the
    # cycle through a position below `count` comes back below it, so this ends, and the
    # whole stays a bijection of [0, count).
    outside = np.flatnonzero(out >= np.uint64(count))
    while outside.size:
        own = keys if np.ndim(keys) == 0 else keys.reshape(-1)[outside]
        flat = out.reshape(-1)
        flat[outside] = _feistel(flat[outside], own, high, low)
        outside = outside[flat[outside] >= np.uint64(count)]
    return out.astype(np.int64)


def shuffled_windows(
    seed: int, rows: np.ndarray[Any, Any], count: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The windows (of `count` an epoch) and the epochs of global rows `rows` (uint64, in
    increasing order) of a shuffled stream with `seed`."""
    epochs, positions = np.divmod(rows, np.uint64(count))
    if not rows.size:
        return np.zeros(rows.shape, np.int64), epochs
    first, last = int(epochs.reshape(-1)[0]), int(epochs.reshape(-1)[-1])
    if first == last:  # most groups lie in one epoch: one key for all of them
        return permuted(positions, epoch_keys(seed, np.asarray([first]))[0], count), epochs
    if count > SMALL:
        return permuted(positions, epoch_keys(seed, epochs), count), epochs
    # Tables of the epochs the rows reach: every one from first to last where the rows run
    # on (no sort to find them), else those they hold (one process's rows of a large batch).
    if last - first < rows.size:
        span: np.ndarray[Any, Any] = np.arange(first, last + 1, dtype=np.uint64)
        at: np.ndarray[Any, Any] = (epochs - np.uint64(first)).astype(np.intp)
    else:
        span, at = np.unique(epochs, return_inverse=True)
        at = at.reshape(epochs.shape)
    return _looked_up(positions, epoch_keys(seed, span), at, count), epochs


class RowDraws:
    """What a sampler drawing global rows from counters shares: this process's rows of a
    global batch of `per_step`, the steps it can reach (global rows below 2**63), and the
    draws of a block of steps kept until the stream passes it (`_block_from`). A subclass
    says its last step (`_last`) and draws steps (`_drawn`)."""

    __slots__ = ("_base", "_block", "_per_step", "_rows", "steps")

    random = True

    def __init__(self, rows: Rows, steps: int | None) -> None:
        # The draws of a block of steps from its first: (first, (steps, rows)).
        self._block: tuple[int, np.ndarray[Any, Any]] | None = None
        self._rows = rows.own.astype(np.uint64)[None, :]
        self._per_step = per_step = rows.per_step
        self._base = rows.base  # the global row of step 0 (see `Rows`)
        last = self._last(per_step)
        self.steps = last if steps is None else min(steps, last)

    def _last(self, per_step: int) -> int:
        """The steps a stream of global batches of `per_step` rows can reach."""
        return (LAST_ROW - self._base) // per_step

    def _block_from(
        self, first: int, count: int, whole: int, windows: int = BLOCK_WINDOWS
    ) -> np.ndarray[Any, Any]:
        """Steps `first` .. `first + count - 1` of this process's rows, from the block that
        holds them (drawn anew, about `windows` of them up to step `whole`, where none
        does)."""
        block = self._block
        if block is None or not block[0] <= first <= first + count <= block[0] + len(block[1]):
            ahead = min(max(count, windows // self._rows.size), whole - first)
            block = self._block = (first, self._drawn(first, ahead, self._rows))
        at = first - block[0]
        return block[1][at : at + count]

    def _drawn(self, first: int, count: int, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Steps `first` .. `first + count - 1` of `rows`, drawn: each subclass's own."""
        raise NotImplementedError

    def global_rows(
        self, first: int, count: int, rows: np.ndarray[Any, Any]
    ) -> np.ndarray[Any, Any]:
        """The global rows of `rows` of steps `first` .. `first + count - 1` (uint64)."""
        steps = np.arange(first, first + count, dtype=np.uint64)[:, None]
        rows_of_steps: np.ndarray[Any, Any] = steps * np.uint64(self._per_step) + rows
        if self._base:  # wrapping: a negative base gives the right rows, never negative
            rows_of_steps += np.uint64(self._base & (2**64 - 1))
        return rows_of_steps


class Shuffled(RowDraws):
    """`batch` windows a step from epochs of every window (at `stride`) once each, in an
    order drawn anew each epoch; batches run on across an epoch's end. Endless unless
    `steps` or `epochs` is given (with `epochs`, the last batch holds what is left of the
    last epoch). `take` is a pure function of the step, as `Random`'s is; `rows` are the
    rows of the (global) batch this process draws."""

    __slots__ = ("_epochs", "_seed", "_stride", "count")

    def __init__(
        self, starts: int, rows: Rows, stride: int, seed: int, steps: int | None, epochs: int | None
    ) -> None:
        self.count = -(-starts // stride)  # windows an epoch
        self._stride = stride
        self._seed = seed
        self._epochs = epochs
        super().__init__(rows, steps)
        if self.tail() and rows.own.size != rows.per_step:
            raise ValueError(
                f"windows epochs={epochs} of {self.count:,} windows end in a short "
                f"batch of {self.tail()} of the global batch's {rows.per_step} rows, which "
                "several processes cannot share: pass steps= (whole batches), or a batch "
                "that divides the epochs' windows"
            )

    def _last(self, per_step: int) -> int:
        last = super()._last(per_step)
        if self._epochs is None:
            return last
        return max(0, min(last, -(-(self._epochs * self.count - self._base) // per_step)))

    def tail(self) -> int:
        """The rows of the last batch where `epochs` ends it short, else 0."""
        rows = self._epochs * self.count - self._base if self._epochs is not None else 0
        if self._epochs is None or self.steps * self._per_step <= rows:
            return 0
        return rows - (self.steps - 1) * self._per_step

    def epoch_at(self, step: int) -> int:
        """The epoch of the first window of `step`; past the end of `epochs` (after a
        short last batch), `epochs`: the epochs done, never one that was not drawn."""
        rows = self._base + step * self._per_step
        if self._epochs is not None:
            rows = min(rows, self._epochs * self.count)
        return rows // self.count

    def take(self, first: int, most: int) -> np.ndarray[Any, Any] | None:
        """The starts of steps `first` .. (up to `most` of them), shape (k, rows); None past
        the last step. A short last batch (`tail`) comes alone."""
        count = min(most, self.steps - first)
        if count <= 0:
            return None
        tail = self.tail()
        if tail and first == self.steps - 1:
            rows = self._rows[self._rows < np.uint64(tail)][None, :]
            return self._drawn(first, 1, rows)
        whole = self.steps - 1 if tail else self.steps  # the steps of whole batches
        return self._block_from(first, min(count, whole - first), whole)

    def _drawn(self, first: int, count: int, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        drawn, _ = shuffled_windows(self._seed, self.global_rows(first, count, rows), self.count)
        drawn *= self._stride
        return drawn
