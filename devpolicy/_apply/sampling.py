"""Which windows each batch of a `windows` stream holds: the starts of its windows, step
by step, in order or at random, and under several processes the rows each one draws.

Random order is counter-based: step k's starts come from SplitMix64 over counters keyed
by the seed, k and the (global) row, never from drawing the steps before it, so a stream
started or resumed at step N costs what step 0 does, a group of batches is the same
however batches are grouped, and one seed gives each process other rows of one global
batch. The starts are numpy arrays (numpy's 64-bit offsets, past 2**31 included).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _mixed(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """SplitMix64's finaliser over uint64 values (wrapping arithmetic): each counter to a
    well-mixed 64-bit number, independently of every other."""
    z = values.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment: odd, so every counter differs


def random_starts(
    seed: int, first: int, count: int, rows: np.ndarray[Any, Any], per_step: int, starts: int
) -> np.ndarray[Any, Any]:
    """The window starts of steps `first` .. `first + count - 1` of a random stream, shape
    (count, len(rows)): row `r` of step `k` is drawn from counter `k * per_step + r`
    alone (counter-based: SplitMix64 over the counter, keyed by the seed), so any step's
    draws cost the same whatever came before, and a stream resumed at step N draws what
    an uninterrupted one does from N on. Uniform over [0, starts) up to 2**-53 relative.

    Example:
        >>> rows = np.arange(3, dtype=np.uint64)
        >>> whole = random_starts(7, 0, 4, rows, 3, 1000)
        >>> bool((random_starts(7, 2, 2, rows, 3, 1000) == whole[2:]).all())
        True
    """
    with np.errstate(over="ignore"):
        key = _mixed(np.array([seed % 2**64], dtype=np.uint64) * _GAMMA)[0]
        steps = np.arange(first, first + count, dtype=np.uint64)
        counters = steps[:, None] * np.uint64(per_step) + rows[None, :]
        z = _mixed((counters + np.uint64(1)) * _GAMMA + key)
    fractions = (z >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
    drawn = (fractions * starts).astype(np.int64)
    return np.minimum(drawn, starts - 1, out=drawn)  # a product rounded up to `starts`


class Random:
    """`batch` starts per step, each drawn uniformly (with replacement) from every offset a
    window fits at; endless unless `steps` is given. Counter-based (`random_starts`):
    step k's draws depend on the seed, k and the row alone, so a group of k batches is
    the same however batches are grouped, and a stream can start at any step at once.
    `rows` are the rows of the (global) batch this process draws, `per_step` the global
    batch's rows: under several processes each draws its own rows of one global batch."""

    __slots__ = ("_left", "_per_step", "_rows", "_seed", "_starts", "_step", "random")

    def __init__(self, starts: int, batch: int, seed: int, steps: int | None, start: int) -> None:
        self._seed = seed
        self._starts = starts
        self._rows = np.arange(batch, dtype=np.uint64)
        self._per_step = batch
        self._step = start
        self._left = None if steps is None else steps - start
        self.random = True

    def own_rows(self, rows: np.ndarray[Any, Any], per_step: int) -> None:
        """Draw `rows` of a global batch of `per_step` rows (before the first take)."""
        self._rows = rows.astype(np.uint64)
        self._per_step = per_step

    def take(self, count: int) -> np.ndarray[Any, Any] | None:
        """The starts of up to `count` more batches, shape (k, batch); None when done."""
        if self._left is not None:
            count = min(count, self._left)
            if count == 0:
                return None
            self._left -= count
        first, self._step = self._step, self._step + count
        return random_starts(self._seed, first, count, self._rows, self._per_step, self._starts)


class Sequential:
    """Windows at 0, stride, 2*stride, ... in order, `batch` at a time (the last batch may
    be smaller), for one pass or `steps` batches, whichever ends first; from batch
    `start` on."""

    __slots__ = ("_batch", "_count", "_left", "_next", "_stride", "random")

    def __init__(self, starts: int, batch: int, stride: int, steps: int | None, start: int) -> None:
        self._count = -(-starts // stride)  # windows in one pass
        self._next = min(start * batch, self._count)  # the next window's index
        self._batch = batch
        self._stride = stride
        self._left = None if steps is None else steps - start
        self.random = False

    def own_rows(self, rows: np.ndarray[Any, Any], per_step: int) -> None:
        """A pass is the same in every process."""

    def take(self, count: int) -> np.ndarray[Any, Any] | None:
        """The starts of up to `count` more batches of one size, shape (k, n); None when
        done. The last, smaller batch comes alone."""
        remaining = self._count - self._next
        if remaining <= 0 or self._left == 0:
            return None
        full = remaining // self._batch
        k, n = (min(count, full), self._batch) if full else (1, remaining)
        if self._left is not None:
            k = min(k, self._left)
            self._left -= k
        first = self._next
        self._next += k * n
        return (np.arange(first, first + k * n, dtype=np.int64) * self._stride).reshape(k, n)


def process_rows(
    sharding: Any, local: int, rest: tuple[int, ...]
) -> tuple[np.ndarray[Any, Any], int]:
    """The rows of a global batch this process holds under `sharding`, given that it
    holds `local` of them, and the global batch's rows.

    Worked out on a trial shape: each distinct row slice of the sharding, over all
    devices and over this process's devices; rows replicated across processes are the
    same rows in each (every process then draws the same windows, as it must).
    """
    devices = sharding.device_set
    trial = len(devices)  # every row split divides the device count
    spans = sharding.devices_indices_map((trial, *rest))
    every = sorted({spans[d][0].indices(trial)[:2] for d in devices})
    mine = sorted(
        {spans[d][0].indices(trial)[:2] for d in devices if d.process_index == jax.process_index()}
    )
    if not mine or local % len(mine):
        return np.arange(local, dtype=np.int64), local
    per_slice = local // len(mine)
    per_step = per_slice * len(every)
    position = {span: i for i, span in enumerate(every)}
    rows = [position[span] * per_slice + r for span in mine for r in range(per_slice)]
    return np.asarray(rows, dtype=np.int64), per_step
