"""Streams (`windows`): a stream's batches counted, not recorded one by one.

Each stream keeps weak references to its last `STREAM_RECENT` batches (the ones in flight
and the few a loop still holds), and the ledger's `report` finds those under the stream's
name; a batch kept longer than that shows as `unplaced`.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
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
    #: A mixture's windows of each source in its first n batches (while open), and in the
    #: batches it handed out (once ended).
    count_sources: Callable[[int], dict[str, int]] | None = None
    sources: dict[str, int] | None = None
    #: A packed stream's packing so far (rows, padding share, documents a row): what
    #: tells it (while open), and what it told at the end.
    count_packing: Callable[[], dict[str, Any]] | None = None
    packing: dict[str, Any] | None = None
    #: How the stream reads its windows, and why (`windows`; None for `prefetch`).
    reads: str | None = None
    reads_why: str | None = None
    #: The caller's loop, timed by the stream: batches handed out, seconds spent inside
    #: `next()`, and the seconds from the start of the first pull to the last hand-out.
    handed: int = 0
    waited: float = 0.0
    span: float = 0.0

    @property
    def working(self) -> float:
        """Seconds between pulls (the caller's own work): the span less the waits (where
        several threads pull at once, their waits overlap, and this is less)."""
        return max(0.0, self.span - self.waited)

    def add(self, arrays: list[Any], nbytes: int, batches: int | None = None) -> None:
        """Count the batches `arrays` (`nbytes` in all), placed by this stream: one a batch,
        or `batches` of them (a batch of several arrays)."""
        self.recent.extend(map(weakref.ref, arrays))
        self.batches += len(arrays) if batches is None else batches
        self.nbytes += nbytes

    def close(self, handed: int | None = None) -> None:
        """The stream ended, `handed` batches handed out: its counts stay readable
        (`streams()`) for a while (a mixture's, of those batches)."""
        self.open = False
        count = self.count_sources
        if count is not None:
            self.sources = count(self.batches if handed is None else handed)
            self.count_sources = None  # what counted them (the stream's draws) let go of
        tell = self.count_packing
        if tell is not None:
            self.packing = tell()
            self.count_packing = None

    def source_counts(self) -> dict[str, int] | None:
        """A mixture's windows of each source (see `count_sources`), else None."""
        count = self.count_sources
        return count(self.batches) if count is not None else self.sources

    def packing_now(self) -> dict[str, Any] | None:
        """A packed stream's packing so far (see `count_packing`), else None."""
        tell = self.count_packing
        return tell() if tell is not None else self.packing


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
        sources: A mixture's windows from each source, in the batches placed (once it
            ended, in those handed out), over every process's rows; None for one array.
        reads: How its windows are read (`memory`, `mapping`, `file`); None for
            `prefetch`.
        reads_why: Why it reads so, and what its trials measured.
        handed: Batches handed to the caller so far.
        waited: Seconds the caller waited inside `next()` for a batch that was not ready.
        working: Seconds between pulls: the caller's own work (its step).
        span: Seconds from the first pull to the latest hand-out.
        packing: A packed stream's rows packed so far (every process's, those packed
            ahead included), the share of their tokens that is padding, and the
            documents (pieces of longer ones counted apart) a row; None for windows.
    """

    name: str
    origin: str
    device: str
    batches: int
    nbytes: int
    open: bool
    sources: Mapping[str, int] | None = None
    reads: str | None = None
    reads_why: str | None = None
    handed: int = 0
    waited: float = 0.0
    working: float = 0.0
    span: float = 0.0
    packing: Mapping[str, Any] | None = None

    @property
    def waited_share(self) -> float | None:
        """The share of the loop's time spent waiting for batches (0 to 1); None before
        a batch was handed out."""
        return waited_share(self.waited, self.working)

    @property
    def rate(self) -> float | None:
        """Batches handed out per second, from the start of the first pull to the latest
        hand-out; None before a batch was handed out."""
        return rate(self.handed, self.span)


def waited_share(waited: float, working: float) -> float | None:
    """The share of a loop's time spent inside `next()` (0 to 1), or None before any."""
    total = waited + working
    return None if total <= 0 else waited / total


def rate(handed: int, span: float) -> float | None:
    """Batches handed out a second over `span` seconds, or None before any."""
    return None if handed < 1 or span <= 0 else handed / span


_tallies: list[StreamTally] = []


def open_stream(
    name: str,
    origin: str,
    rule: int | None,
    device: str,
    count_sources: Callable[[int], dict[str, int]] | None = None,
    count_packing: Callable[[], dict[str, Any]] | None = None,
) -> StreamTally:
    """A new stream's tally, listed by `streams()` (and its recent batches by `report`)."""
    tally = StreamTally(
        name, origin, rule, device, count_sources=count_sources, count_packing=count_packing
    )
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
        LedgerStream(
            t.name,
            t.origin,
            t.device,
            t.batches,
            t.nbytes,
            t.open,
            t.source_counts(),
            t.reads,
            t.reads_why,
            t.handed,
            t.waited,
            t.working,
            t.span,
            t.packing_now(),
        )
        for t in list(_tallies)
    )


def recent_batches() -> Iterator[tuple[Any, weakref.ref[Any], StreamTally]]:
    """Every stream's recent batches still alive, with their reference and their stream."""
    for tally in list(_tallies):
        for ref in list(tally.recent):
            array = ref()
            if array is not None:
                yield array, ref, tally


def stream_lines(listed: tuple[LedgerStream, ...]) -> list[str]:
    """The report's lines for mixtures: each one's windows from each source, and their
    shares (a stream of one array has no line: `stream_ended` says its counts)."""
    lines = []
    for stream in listed:
        state = "open" if stream.open else "ended"
        packing = stream.packing
        if packing:
            lines.append(
                f"stream {printable(stream.name)} ({state}, {stream.batches:,} batches): "
                f"packed rows {packing['rows']:,}, padding {packing['padding_share']:.2%}, "
                f"{packing['documents_per_row']:.2f} documents a row"
            )
        sources = stream.sources
        if not sources:
            continue
        total = sum(sources.values()) or 1
        shares = ", ".join(
            f"{printable(name)} {count:,} ({count / total:.1%})" for name, count in sources.items()
        )
        lines.append(
            f"stream {printable(stream.name)} ({state}, {stream.batches:,} batches): "
            f"windows by source: {shares}"
        )
    return lines


def printable(name: str) -> str:
    """`name` as shown in a report: control characters escaped (names come from files and
    callers)."""
    return name if name.isprintable() else repr(name)[1:-1]
