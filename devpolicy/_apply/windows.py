"""Batches of windows sampled from a host array, placed by the policy ahead of use.

The windows are cut from a zero-copy numpy view of the host array (`host_view`), so
offsets past 2**31 work with x64 disabled, and only the batch is ever copied: into a
64-byte-aligned buffer that a CPU device adopts without a second copy. Each batch then
goes through `prefetch`, decided and logged like any `put`. Where the view is a file
mapping, the pages a batch was copied from are given back once it is copied, and a
random stream tells the kernel not to read ahead (`paging`): resident memory stays flat
however long the stream runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, TypeAlias

import numpy as np

from .._base.limits import ALIGN
from .._base.sizes import format_size
from .._decide.decider import Decider
from .._machine.capacity import host_available_bytes
from .hostview import host_view
from .narrowing import Narrow
from .paging import Pager
from .prefetch import BatchStream, as_int, prefetch

#: How windows are chosen: in order, or each start drawn at random.
Order: TypeAlias = 'Literal["sequential", "random"]'
ORDERS = ("sequential", "random")


def _positive(what: str, value: object) -> int:
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"windows {what} must be an int >= 1, got {value!r}")
    return number


def _batch_fits(view: np.ndarray[Any, Any], length: int, batch: int, windows: int) -> None:
    """Refuse a batch the host cannot hold, before anything is allocated for it."""
    row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
    nbytes = min(batch, windows) * (length * row + 8)  # the batch and its offsets
    available = host_available_bytes()
    if available is not None and nbytes > available:
        raise ValueError(
            f"windows batch={batch} of length={length} needs {format_size(nbytes)} per "
            f"batch ({view.dtype}, {format_size(length * row)} a window), more than the "
            f"{format_size(available)} this host has available: lower batch or length"
        )


def windows(
    tokens: Any,
    decider: Decider,
    name: str,
    length: int,
    batch: int,
    *,
    order: Order = "sequential",
    seed: int | None = None,
    stride: int | None = None,
    steps: int | None = None,
    size: int = 2,
    narrow: Narrow = "exact",
) -> BatchStream[Any]:
    """Batches of windows of `tokens` placed by `decider`. See `devpolicy.windows`."""
    view = host_view(tokens)
    length = _positive("length", length)
    batch = _positive("batch", batch)
    if order not in ORDERS:
        raise ValueError(f"windows order must be one of {ORDERS}, got {order!r}")
    if stride is not None and order == "random":
        # Silently ignored, it would look like it took effect.
        raise ValueError(
            f"windows stride applies to order='sequential' only; order='random' draws "
            f"every start at random, got stride={stride!r}"
        )
    stride = length if stride is None else _positive("stride", stride)
    if steps is not None:
        steps = _positive("steps", steps)
    number = None if seed is None else as_int(seed)
    if seed is not None and number is None:
        raise TypeError(f"windows seed must be an int or None, got {seed!r}")
    if number is not None and number < 0:
        raise ValueError(f"windows seed must be >= 0, got {seed!r}")
    if view.ndim == 0 or view.shape[0] < length:
        rows = view.shape[0] if view.ndim else 0
        raise ValueError(
            f"windows of length {length} need at least {length} rows along the first "
            f"dimension; the array has {rows} (shape {view.shape})"
        )
    starts = view.shape[0] - length + 1  # every offset a window can start at
    if order == "random":
        _batch_fits(view, length, batch, batch)
        source = _random(view, length, batch, starts, number, steps)
    else:
        _batch_fits(view, length, batch, -(-starts // stride))
        source = _sequential(view, length, batch, starts, stride, steps)
    return prefetch(source, decider, name, size, narrow)


def _sequential(
    view: np.ndarray[Any, Any], length: int, batch: int, starts: int, stride: int, steps: int | None
) -> Iterator[np.ndarray[Any, Any]]:
    """Windows at 0, stride, 2*stride, ... in order, `batch` at a time (the last batch may
    be smaller), for one pass or `steps` batches, whichever ends first."""
    count = -(-starts // stride)  # windows in one pass
    pager = Pager(view, random=False)
    try:
        for step, first in enumerate(range(0, count, batch)):
            if steps is not None and step >= steps:
                return
            n = min(batch, count - first)
            offsets = [(first + i) * stride for i in range(n)]
            out = _gather(view, length, offsets)
            pager.release(offsets, length)
            yield out
    finally:
        pager.close()


def _random(
    view: np.ndarray[Any, Any],
    length: int,
    batch: int,
    starts: int,
    seed: int | None,
    steps: int | None,
) -> Iterator[np.ndarray[Any, Any]]:
    """`batch` windows per step, each starting at an offset drawn uniformly (with
    replacement) from every offset a window fits at; endless unless `steps` is given."""
    rng = np.random.default_rng(seed)
    pager = Pager(view, random=True)  # no read-ahead, pages given back: RSS stays flat
    try:
        step = 0
        while steps is None or step < steps:
            offsets = rng.integers(0, starts, size=batch, dtype=np.int64).tolist()
            out = _gather(view, length, offsets)
            pager.release(offsets, length)
            yield out
            step += 1
    finally:
        pager.close()


def _gather(view: np.ndarray[Any, Any], length: int, offsets: list[int]) -> np.ndarray[Any, Any]:
    """The windows at `offsets` stacked, copied into one aligned buffer: only the batch's
    bytes are read, wherever in the (possibly mapped, 64-bit indexed) view they lie."""
    shape = (len(offsets), length, *view.shape[1:])
    nbytes = int(np.prod(shape, dtype=np.int64)) * view.dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN  # aligned: a CPU device adopts it without a copy
    out: np.ndarray[Any, Any] = raw[start : start + nbytes].view(view.dtype).reshape(shape)
    for i, offset in enumerate(offsets):
        out[i] = view[offset : offset + length]
    return out
