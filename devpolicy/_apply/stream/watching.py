"""A stream's tally, from its first batch to its end, and its caller's loop timed: the
seconds the caller waited inside `next()` (reads, and the cutting and placing done on
its thread) and the seconds between pulls (its own work, the step). Said in
`stream_ended`, listed by `report()` while the stream runs, and every `report_every`
seconds at info (`stream_progress`). Two clock reads and a few stores a batch: the cost
is in docs/benchmarks.md ("Watching the loop"). No JAX here.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from ..._base.events import EventLog
from ..._machine.streams import StreamTally, open_stream, rate, waited_share


class LoopWatch:
    """The tally of one stream named `name` (opened with its first placed batches) and
    its caller's loop; one owner, under its lock."""

    __slots__ = (
        "_count_packing",
        "_count_sources",
        "_end",
        "_events",
        "_first",
        "_name",
        "_report_at",
        "_report_every",
        "tally",
    )

    def __init__(
        self,
        name: str,
        events: EventLog,
        count_sources: Callable[[int], dict[str, int]] | None,
        report_every: float | None,
        count_packing: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._name = name
        self._count_packing = count_packing  # a packed stream's padding and documents
        self._events = events
        self._count_sources = count_sources  # a mixture's windows by source
        self._report_every = report_every  # seconds between `stream_progress` lines
        self._report_at = 0.0  # when the next is due (set at the first hand-out)
        self._first = 0.0  # when the first pull that returned a batch began (0.0: none yet)
        self._end: weakref.finalize[Any, Any] | None = None
        self.tally: StreamTally | None = None

    def placed(
        self,
        owner: object,
        decided: tuple[str, int | None, str],
        arrays: list[Any],
        nbytes: int,
        batches: int,
        reads: tuple[str, str],
    ) -> None:
        """`batches` placed (their `arrays`, `nbytes` in all) by the stream `owner`,
        decided by the rule at (origin, rule, device), read as `reads` (how, why). The
        first opens the tally, which a stream collected unclosed ends."""
        tally = self.tally
        if tally is None:
            origin, rule, device = decided
            tally = self.tally = open_stream(
                self._name, origin, rule, device, self._count_sources, self._count_packing
            )
            end = self._end = weakref.finalize(owner, tally.close)
            end.atexit = False
        tally.add(arrays, nbytes, batches)
        tally.reads, tally.reads_why = reads

    def handed(self, began: float) -> None:
        """A batch handed out by a pull that began at `began` (`time.perf_counter`). Run
        every pull: the seconds between pulls are not counted apart, they are the span
        less the waits (`StreamTally.working`), which is the same for one thread pulling."""
        now = time.perf_counter()
        tally = self.tally
        if tally is None:  # a batch handed out was placed: the tally is open
            return
        if not self._first:
            self._first = began
            every = self._report_every
            self._report_at = now + every if every else float("inf")
        tally.waited += now - began
        tally.handed += 1
        tally.span = now - self._first
        if now >= self._report_at:
            self._report_at = now + (self._report_every or float("inf"))
            if self._events.enabled("info"):
                fields = {"name": tally.name, "batches": tally.handed, **loop_fields(tally)}
                self._events.emit("info", "stream_progress", fields)

    def ended(self, handed: int, reads_why: str) -> StreamTally | None:
        """The stream ended, `handed` batches handed out: its tally closed (None where
        nothing was ever placed)."""
        tally = self.tally
        if tally is None:
            return None
        end = self._end
        if end is not None:
            end.detach()
        tally.reads_why = reads_why
        tally.close(handed)
        return tally


def loop_fields(tally: StreamTally) -> dict[str, Any]:
    """How the caller's loop went, as an event's fields: the seconds it waited inside
    `next()` and spent between pulls, the waited share of the two, and the batches
    handed out a second."""
    share = waited_share(tally.waited, tally.working)
    per_second = rate(tally.handed, tally.span)
    return {
        "waited_s": round(tally.waited, 6),
        "working_s": round(tally.working, 6),
        "waited_share": None if share is None else round(share, 4),
        "batches_per_s": None if per_second is None else round(per_second, 2),
    }
