"""`windows`: the arguments of a stream of batches of windows checked, its state built
(or read back from a saved one), and the stream made.

Everything that can be refused is refused here, before anything is opened, read or
placed: a bad length, batch, order, seed, step or saved state is an error naming the
argument and what it accepts. The stream itself (`owner.WindowStream`) owns what happens
after; how it cuts its groups is `cutting`. Why it is built this way, and what it costs,
is in docs/host-arrays.md and docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import numpy as np

from ..._base.sizes import format_size
from ..._decide.decider import Decider
from ..._machine.capacity import host_available_bytes
from ..hostview import host_view
from ..narrowing import Narrow, check_mode
from .cutting import GroupCutter
from .owner import WindowStream
from .prefetch import as_int
from .sampling import Random, Sequential
from .state import LAST_STEP, SEEDS, StreamState, read_state, resumed_step

#: How windows are chosen: in order, or each start drawn at random.
Order: TypeAlias = 'Literal["sequential", "random"]'
ORDERS = ("sequential", "random")

#: A batch this large or larger is checked against the host's available memory first.
ASK_HOST_FROM = 64 * 2**20


def _positive(what: str, value: object) -> int:
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"windows {what} must be an int >= 1, got {value!r}")
    return number


def _batch_fits(view: np.ndarray[Any, Any], length: int, batch: int, windows: int) -> None:
    """Refuse a batch the host cannot hold, before anything is allocated for it. The host
    is asked only for a batch of `ASK_HOST_FROM` or more: reading its available memory
    cost 9 ms on a TPU VM under gVisor (more than a small stream's whole first group),
    and a smaller batch that does not fit fails in numpy as it would by hand."""
    row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
    nbytes = min(batch, windows) * (length * row + 8)  # the batch and its offsets
    if nbytes < ASK_HOST_FROM:
        return
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
    start: int = 0,
    resume: Mapping[str, Any] | str | None = None,
) -> WindowStream:
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
    # A stride past the last start gives one window a pass, as that last start does
    # (and keeps the offsets within int64).
    stride = min(stride, max(1, (view.shape[0] if view.ndim else 0) - length + 1))
    if steps is not None:
        steps = _positive("steps", steps)
    number = None if seed is None else as_int(seed)
    if seed is not None and number is None:
        raise TypeError(f"windows seed must be an int or None, got {seed!r}")
    if number is not None and not 0 <= number < SEEDS:
        raise ValueError(f"windows seed must be an int from 0 to 2**64 - 1, got {seed!r}")
    whole = as_int(size)
    if whole is None or whole < 1:
        raise ValueError(f"prefetch size must be an int >= 1, got {size!r}")
    if not isinstance(name, str):
        raise TypeError(f"windows name must be a str, got {type(name).__name__} {name!r}")
    check_mode(narrow)
    if view.ndim == 0 or view.shape[0] < length:
        rows = view.shape[0] if view.ndim else 0
        raise ValueError(
            f"windows of length {length} need at least {length} rows along the first "
            f"dimension; the array has {rows} (shape {view.shape})"
        )
    starts = view.shape[0] - length + 1  # every offset a window can start at
    first = as_int(start)
    if first is None or not 0 <= first < LAST_STEP:
        raise ValueError(f"windows start must be an int from 0 to 2**63 - 1, got {start!r}")
    if steps is not None and steps > LAST_STEP:
        raise ValueError(f"windows steps must be an int from 1 to 2**63, got {steps!r}")
    saved = None if resume is None else read_state(resume)
    if order == "random" and number is None:
        # Drawn here, so that the stream's state can name it and a resume draw the same.
        number = secrets.randbits(63) if saved is None else saved["seed"]
    state = StreamState(
        first,
        order,
        number,
        length,
        batch,
        stride if order == "sequential" else None,
        steps,
        int(view.shape[0]),
        tuple(int(n) for n in view.shape[1:]),
        str(view.dtype),
    )
    if saved is not None:
        if first:
            raise ValueError(
                f"windows takes start= or resume=, not both (start={first}, and the "
                f"state saved at step {saved['step']})"
            )
        first = resumed_step(saved, state)
        state = dataclasses.replace(state, step=first)
    sampler: Random | Sequential
    if order == "random":
        _batch_fits(view, length, batch, batch)
        assert number is not None
        if steps is not None and first > steps:
            raise ValueError(f"windows start={first} is past steps={steps}")
        sampler = Random(starts, batch, number, steps)
    else:
        _batch_fits(view, length, batch, -(-starts // stride))
        in_pass = -(-starts // stride)  # windows in one pass
        batches = -(-in_pass // batch)
        last = batches if steps is None else min(steps, batches)
        if first > last:
            raise ValueError(
                f"windows start={first} is past the end: a sequential pass of this stream "
                f"has {last} batches"
            )
        sampler = Sequential(starts, batch, stride, steps)
    cutter = GroupCutter(view, length, batch, sampler, decider, name, whole, narrow)
    stream = WindowStream(cutter, state, decider, name, whole, narrow)
    stream.start()
    return stream
