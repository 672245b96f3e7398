"""Streams (`windows`): a stream's batches counted, not recorded one by one.

Each stream keeps weak references to its last `STREAM_RECENT` batches (the ones in flight
and the few a loop still holds), and the ledger's `report` finds those under the stream's
name; a batch kept longer than that shows as `unplaced`.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: How many of a stream's latest batches `report` can name.
STREAM_RECENT = 64
#: Streams whose counts `streams()` still shows after they ended.
_ENDED_KEPT = 16


@dataclass(slots=True, eq=False)
class StreamTally:
    """One stream's batches, counted: what `add` was given, and weak references to the
    latest (`STREAM_RECENT`) so that `report` names them. Not thread-safe: one stream is
    read by one consumer."""

    name: str
    origin: str
    rule: int | None
    device: str
    batches: int = 0
    nbytes: int = 0
    open: bool = True
    recent: deque[weakref.ref[Any]] = field(default_factory=lambda: deque(maxlen=STREAM_RECENT))

    def add(self, arrays: list[Any], nbytes: int) -> None:
        """Count the batches `arrays` (`nbytes` in all), placed by this stream."""
        self.recent.extend(map(weakref.ref, arrays))
        self.batches += len(arrays)
        self.nbytes += nbytes

    def close(self) -> None:
        """The stream ended: its counts stay readable (`streams()`) for a while."""
        self.open = False


@dataclass(frozen=True, slots=True)
class LedgerStream:
    """One stream's batches (`devpolicy.prefetch`, `devpolicy.windows`).

    Attributes:
        name: The name its batches were placed as.
        origin: Where the rule that placed them was written.
        device: Where they went (`cpu:1`, or a mesh's text).
        batches: How many batches it has placed so far.
        nbytes: Their bytes in all.
        open: Whether the stream is still running (not ended or closed).
    """

    name: str
    origin: str
    device: str
    batches: int
    nbytes: int
    open: bool


_tallies: list[StreamTally] = []


def open_stream(name: str, origin: str, rule: int | None, device: str) -> StreamTally:
    """A new stream's tally, listed by `streams()` (and its recent batches by `report`)."""
    tally = StreamTally(name, origin, rule, device)
    ended = [t for t in _tallies if not t.open]
    if len(ended) > _ENDED_KEPT:  # only the latest ended streams are kept
        dropped = {id(t) for t in ended[: len(ended) - _ENDED_KEPT]}
        _tallies[:] = [t for t in _tallies if id(t) not in dropped]
    _tallies.append(tally)
    return tally


def streams() -> tuple[LedgerStream, ...]:
    """The streams of this process, open ones and the latest that ended, oldest first.

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1})
        >>> batches = list(devpolicy.windows(np.arange(8), 2, 2, name="tally", policy=p))
        >>> [(s.name, s.batches, s.nbytes, s.open) for s in streams() if s.name == "tally"][-1]
        ('tally', 2, 32, False)
    """
    return tuple(
        LedgerStream(t.name, t.origin, t.device, t.batches, t.nbytes, t.open)
        for t in list(_tallies)
    )


def recent_batches() -> Iterator[tuple[Any, weakref.ref[Any], StreamTally]]:
    """Every stream's recent batches still alive, with their reference and their stream."""
    for tally in list(_tallies):
        for ref in list(tally.recent):
            array = ref()
            if array is not None:
                yield array, ref, tally
