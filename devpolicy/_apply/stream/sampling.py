"""Which windows each batch of a `windows` stream holds: the starts of its windows, step
by step, in order or at random, and under several processes the rows each one draws.

Random order is counter-based: step k's starts come from SplitMix64 over counters keyed
by the seed, k and the (global) row, never from drawing the steps before it, so a stream
started or resumed at step N costs what step 0 does, a group of batches is the same
however batches are grouped, and one seed gives each process other rows of one global
batch. The starts are numpy arrays (numpy's 64-bit offsets, past 2**31 included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import jax
import numpy as np

from .state import LAST_STEP


class Sampler(Protocol):
    """What draws a stream's windows, step by step: made whole (its process's rows
    included) and never changed after; `take` is a pure function of the step."""

    @property
    def steps(self) -> int | None:
        """The steps it draws; None for an endless stream."""

    @property
    def random(self) -> bool:
        """Whether its windows are drawn at random (in no order a reader can follow)."""

    def take(self, first: int, most: int) -> np.ndarray[Any, Any] | None:
        """The window starts of steps `first` .. (up to `most` of them), shape (k, n);
        None past the last step."""


@dataclass(frozen=True, slots=True)
class Rows:
    """The rows of a step's global batch of `per_step` rows this process draws (`own`):
    under several processes each draws its own rows of one global batch. Step s's global
    batch holds the global rows from `base + s * per_step` (`base`: not 0 for a stream
    resumed at another global batch, where it may be negative).

    Example:
        >>> Rows.every(3)
        Rows(own=array([0, 1, 2]), per_step=3, base=0)
    """

    own: np.ndarray[Any, Any]
    per_step: int
    base: int = 0

    @property
    def base_word(self) -> np.uint64:
        """`base` as a uint64 word (two's complement where negative): added in wrapping
        uint64 arithmetic, it gives the rows the stream draws, which are never negative."""
        return np.uint64(self.base & _MASK)

    @classmethod
    def every(cls, batch: int) -> Rows:
        """Every row of a batch of `batch`: one process."""
        return cls(np.arange(batch, dtype=np.int64), batch)


_MASK = 2**64 - 1
_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment: odd, so every counter differs
_SALT = 0xD1B54A32D192ED03  # another odd constant: a salted key is no seed's key
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11))


def _mixed_int(z: int) -> int:
    """SplitMix64's finaliser on one Python int (the key, once a stream)."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class CounterDraws:
    """Window starts drawn from counters: row `r` of step `k` from counter
    `k * per_step + r` alone, SplitMix64 over it keyed by the seed. So any step's draws
    cost the same whatever came before, and a stream resumed at step N draws what an
    uninterrupted one does from N on. Uniform over [0, starts) up to 2**-53 relative.

    What is the same for every step (the key, each row's offset) is worked out once;
    a group of steps is then one multiply-add and the mixing, in place (wrapping uint64
    arithmetic: numpy does not check it on arrays).

    Example:
        >>> draws = CounterDraws(7, np.arange(3), 3, 1000)
        >>> bool((draws.steps(2, 2) == draws.steps(0, 4)[2:]).all())
        True
    """

    __slots__ = ("_base", "_stride", "starts")

    def __init__(
        self, seed: int, rows: np.ndarray[Any, Any], per_step: int, starts: int, base: int = 0
    ) -> None:
        # Counter c = base + k * per_step + r: its (c + 1) * GAMMA + key, wrapping.
        key = (stream_key(seed) + base * _GAMMA) & _MASK
        offsets = ((rows.astype(np.uint64) + np.uint64(1)) * np.uint64(_GAMMA)) + np.uint64(key)
        self._base = offsets[None, :]
        self._stride = np.uint64((per_step * _GAMMA) & _MASK)
        self.starts = starts

    def steps(self, first: int, count: int) -> np.ndarray[Any, Any]:
        """The starts of steps `first` .. `first + count - 1`, shape (count, rows)."""
        z = np.arange(first, first + count, dtype=np.uint64)[:, None] * self._stride + self._base
        return uniform_below(mixed(z), self.starts)


def mixed(z: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """SplitMix64's finaliser on a uint64 array, in place (and returned)."""
    one, two, three, _ = _SHIFTS
    z ^= z >> one
    z *= _MIX1
    z ^= z >> two
    z *= _MIX2
    z ^= z >> three
    return z


def uniform_below(z: np.ndarray[Any, Any], count: int) -> np.ndarray[Any, Any]:
    """Mixed uint64 values (`mixed`, changed in place) as ints uniform over [0, count), up
    to 2**-53 relative: their top 53 bits scaled."""
    z >>= _SHIFTS[3]
    fractions = z.astype(np.float64)
    fractions *= count / 2**53
    drawn: np.ndarray[Any, Any] = fractions.astype(np.int64)
    np.minimum(drawn, count - 1, out=drawn)  # a product rounded up
    return drawn


def stream_key(seed: int, salt: int = 0) -> int:
    """The 64-bit key a stream's draws are keyed by: `seed` (and `salt`, one per source of
    a mixture, or per use) mixed once."""
    return _mixed_int((seed * _GAMMA + salt * _SALT) & _MASK)


def random_starts(
    seed: int, first: int, count: int, rows: np.ndarray[Any, Any], per_step: int, starts: int
) -> np.ndarray[Any, Any]:
    """The window starts of steps `first` .. `first + count - 1` of a random stream with
    `seed`, for `rows` of a batch of `per_step` rows (`CounterDraws`).

    Example:
        >>> rows = np.arange(3, dtype=np.uint64)
        >>> whole = random_starts(7, 0, 4, rows, 3, 1000)
        >>> bool((random_starts(7, 2, 2, rows, 3, 1000) == whole[2:]).all())
        True
    """
    return CounterDraws(seed, rows, per_step, starts).steps(first, count)


class Random:
    """`batch` starts per step, each drawn uniformly (with replacement) from every offset a
    window fits at; endless unless `steps` is given. Counter-based (`random_starts`):
    step k's draws depend on the seed, k and the row alone, so `take` is a pure function
    of the step: a group of k batches is the same however batches are grouped, a stream
    can start at any step at once, and a group cut again (after an interrupt) is the same.
    `rows` are the rows of the (global) batch this process draws."""

    __slots__ = ("_draws", "steps")

    random = True

    def __init__(self, starts: int, rows: Rows, seed: int, steps: int | None) -> None:
        self._draws = CounterDraws(seed, rows.own, rows.per_step, starts, rows.base)
        self.steps = steps

    def take(self, first: int, most: int) -> np.ndarray[Any, Any] | None:
        """The starts of steps `first` .. (up to `most` of them), shape (k, batch); None
        past the last step."""
        # An endless stream ends where its 64-bit counters would run out (2**63 steps).
        last = LAST_STEP if self.steps is None else self.steps
        count = min(most, last - first)
        if count <= 0:
            return None
        return self._draws.steps(first, count)


class Sequential:
    """Windows at 0, stride, 2*stride, ... in order, `batch` at a time (the last batch may
    be smaller), for one pass or `steps` batches, whichever ends first. `take` is a pure
    function of the step, as `Random`'s is."""

    __slots__ = ("_batch", "_count", "_stride", "steps")

    random = False

    def __init__(self, starts: int, batch: int, stride: int, steps: int | None) -> None:
        self._count = -(-starts // stride)  # windows in one pass
        self._batch = batch
        self._stride = stride
        passes = -(-self._count // batch)  # batches in one pass
        self.steps = passes if steps is None else min(steps, passes)

    def take(self, first: int, most: int) -> np.ndarray[Any, Any] | None:
        """The starts of steps `first` .. (up to `most` of them, all of one size), shape
        (k, n); None past the last step. The last, smaller batch comes alone."""
        count = min(most, self.steps - first)
        if count <= 0:
            return None
        full = self._count // self._batch  # the batches of `batch` windows
        k, n = (
            (min(count, full - first), self._batch)
            if first < full
            else (1, self._count - first * self._batch)
        )
        at = first * self._batch
        return (np.arange(at, at + k * n, dtype=np.int64) * self._stride).reshape(k, n)


def process_rows(sharding: Any, local: int, rest: tuple[int, ...]) -> Rows:
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
        return Rows.every(local)
    per_slice = local // len(mine)
    per_step = per_slice * len(every)
    position = {span: i for i, span in enumerate(every)}
    rows = [position[span] * per_slice + r for span in mine for r in range(per_slice)]
    return Rows(np.asarray(rows, dtype=np.int64), per_step)
