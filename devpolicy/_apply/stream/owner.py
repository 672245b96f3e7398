"""`WindowStream`: the one owner of a stream's state, and the lock around it.

A stream is a small state machine: open (cutting groups and handing out their batches),
then ended (every step handed out), failed (a cut raised: every later pull raises again)
or closed. Its progress is two things only: the batches cut and placed but not yet handed
out, each with its step (`_ready`), and the next step to hand out (`_next`). Each changes
in one step that an interrupt cannot split (a deque's `extend`, an attribute stored), and
what is handed out is only ever read from `_ready`, so a `KeyboardInterrupt` anywhere
skips nothing and repeats nothing; a hand-out it interrupts after the fact is given back.
Every pull, `state()` aside, runs under one re-entrant lock, so threads may share a
stream, and `close()` from another thread waits for a pull in progress, then ends it.
A forked child's copy refuses to run (its worker thread, ring and device arrays are the
parent's). The contract is written in docs/host-arrays.md ("What a stream promises").

The stream owns its tally (`_machine.streams`) from its first batch to its end: its
counts, and how the caller's loop went (the seconds it waited inside `next()`, the
seconds between pulls), said in `stream_ended`, by `report()`, and every
`report_every` seconds at info (`stream_progress`). The cost of that watch is in
docs/benchmarks.md ("Watching the loop").
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from ..._base.errors import StreamEndedError
from ..._machine.spans import STREAM_NEXT, span, tracing
from .cutting import GroupCutter
from .packstream import PackedCutter
from .prefetch import BatchStream
from .state import StreamState
from .watching import LoopWatch, loop_fields

Status = Literal["open", "ended", "failed", "closed"]


class _Forks:
    """How many times this process is a forked child of the one that imported this module:
    a stream made before a fork sees another count (a pull checks it without a system
    call; under gVisor `getpid` is one)."""

    count = 0

    @classmethod
    def child(cls) -> None:
        cls.count += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Forks.child)


class WindowStream(BatchStream[Any]):
    """The placed batches of `devpolicy.windows`: a `BatchStream` whose batches are cut,
    decided and sent by the stream itself, a group at a time, and that can say where it
    is (`state()`) so that a restarted run resumes it there, and how long its caller
    waited for it (`stream_ended`, `devpolicy.report()`).

    Every batch handed out holds exactly the windows of its own step, each step at most
    once, in order, whatever happens around the stream: a `KeyboardInterrupt` inside
    `next()` skips nothing (the interrupted step comes next); an error ends the stream
    (every later pull raises a `StreamEndedError` naming it); several threads may pull
    one stream, each batch going to one of them; `close()` from any thread never raises
    and leaves no descriptor, ring or thread; a forked child's copy raises
    `StreamEndedError` on its first pull.

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1})
        >>> with devpolicy.windows(np.arange(20), 4, 2, policy=p) as stream:
        ...     shapes = [b.shape for b in stream]
        ...     stream.state()["step"]
        3
        >>> shapes
        [(2, 4), (2, 4), (1, 4)]
    """

    __slots__ = (
        "__weakref__",  # the tally's finaliser: a stream dropped unclosed is not open
        "_closing",
        "_cutter",
        "_cutting",
        "_epoch_at",
        "_failure",
        "_forks",
        "_lock",
        "_name",
        "_next",
        "_owner",
        "_pid",
        "_ready",
        "_size",
        "_state",
        "_status",
        "_watch",
    )

    def __init__(
        self,
        cutter: GroupCutter | PackedCutter,
        state: StreamState,
        *,
        epoch_at: Callable[[int], int | dict[str, int]] | None = None,
        count_sources: Callable[[int], dict[str, int]] | None = None,
        report_every: float | None = None,
    ) -> None:
        self._epoch_at = epoch_at  # a shuffled stream's epoch (a mixture's, each source's)
        self._name = cutter.placer.name
        self._size = cutter.size
        self._failure: Exception | None = None
        packing = cutter.packing if isinstance(cutter, PackedCutter) else None
        self._watch = LoopWatch(
            self._name, cutter.placer.events, count_sources, report_every, packing
        )
        self._cutter = cutter
        self._state = state
        self._status: Status = "open"
        self._cutting = True  # until the last group is cut, or a cut fails
        self._ready: deque[tuple[int, Any]] = deque()  # (step, batch), cut, not yet handed
        self._next = state.step  # the next step to hand out
        self._lock = threading.RLock()
        self._owner: int | None = None  # the thread pulling now
        self._closing = False  # `close()` came from inside a pull on the same thread
        self._pid = os.getpid()
        self._forks = _Forks.count

    def start(self) -> None:
        """Open the read path and start reading the first batch, so that it is read while
        the caller does what comes before the first pull. Raises what opening raised,
        the stream closed."""
        with self._lock:
            try:
                self._cutter.start(self._next)
            except BaseException:
                self._status = "failed"
                self._cutter_closed()
                raise

    # Pulling.

    def __next__(self) -> Any:
        if tracing():  # the wait, a span in the profiler's trace beside the step
            with span(STREAM_NEXT, name=self._name):
                return self._hand_out()
        return self._hand_out()

    def _hand_out(self) -> Any:
        began = time.perf_counter()
        if self._forks != _Forks.count:
            self._forked()
        handed: int | None = None
        try:
            with self._lock:
                self._owner = threading.get_ident()
                try:
                    step, batch = self._pull()
                    # The hand-out: one attribute stored (an interrupt lands before or
                    # after it, never within), then the local that says it happened.
                    self._next = step + 1
                    handed = step
                finally:
                    self._owner = None
                    if self._closing:
                        self._finish("closed")
                self._watch.handed(began)
            return batch
        except BaseException:
            if handed is not None:  # interrupted after the hand-out: it never arrived
                self._give_back(handed)
            raise

    def _pull(self) -> tuple[int, Any]:
        """The next batch and its step, with `size` more placed behind it where the stream
        has them (under the lock; nothing handed out here)."""
        if self._status != "open":
            self._refuse()
        ready = self._ready
        while ready and ready[0][0] < self._next:  # handed out before: let go of them
            ready.popleft()
        # The first pull hands out its batch as soon as it is placed (the batches behind
        # it are cut by the next pull): a fresh stream's first batch waits for no more.
        behind = self._size if self._next > self._state.step else 0
        while self._cutting and len(ready) <= behind:
            if ready:
                if not self._cut_quietly():
                    break
                continue
            try:
                self._cut()
            except Exception:
                self._finish("failed")
                raise
        if not ready:
            self._end()
        return ready[0]

    def _cut(self) -> None:
        """Cut the next group and add its batches to `_ready`; at the end, or on an error,
        stop cutting (the readers closed at once) and, on an error, raise it."""
        first = self._ready[-1][0] + 1 if self._ready else self._next
        try:
            cut = self._cutter.cut(first)
        except Exception as e:
            self._failure = e
            self._stop_cutting()
            raise
        if cut is None:
            self._stop_cutting()
            return
        placed, nbytes = cut
        # The commit: one C call, so an interrupt lands before or after it, never within.
        self._ready.extend(zip(range(first, first + len(placed)), placed, strict=True))
        cutter = self._cutter
        decided = cutter.placer.decided
        assert decided is not None  # a batch was placed
        self._watch.placed(
            self,
            (decided.origin, decided.rule, decided.device_text),
            _arrays(placed),
            nbytes,
            len(placed),
            (cutter.reads, cutter.reads_why),
        )

    def _cut_quietly(self) -> bool:
        """Cut ahead while a batch is ready: an error is kept for the pull that finds
        nothing ready (the batches already placed are still handed out first)."""
        try:
            self._cut()
        except Exception:
            return False
        return self._cutting

    def _end(self) -> None:
        """Nothing is ready and nothing more will be cut: the stream ends, or fails."""
        if self._failure is not None:
            failure = self._failure
            self._finish("failed")
            raise failure
        self._finish("ended")
        raise StopIteration

    def _refuse(self) -> None:
        """A pull of a stream that is no longer open: `StopIteration` once it ended or was
        closed, a `StreamEndedError` naming the error once it failed."""
        failure = self._failure
        if isinstance(failure, StreamEndedError):  # a forked child's copy
            raise StreamEndedError(failure.name, failure.problem, failure.fix)
        if self._status == "failed" and failure is not None:
            raise StreamEndedError(
                self._name,
                f"failed at step {self._next}: {type(failure).__name__}: {failure}",
                "open a new stream (resume=stream.state() goes on from that step)",
            ) from failure
        raise StopIteration

    def _give_back(self, step: int) -> None:
        """Undo the hand-out of `step`, which an interrupt kept from its caller: it is the
        next batch handed out again, unless the stream moved on meanwhile."""
        with self._lock:
            if self._next == step + 1 and self._status == "open":
                self._next = step

    # Ending.

    def _stop_cutting(self) -> None:
        self._cutting = False
        self._cutter_closed()

    def _cutter_closed(self) -> None:
        """Close the cutter's readers, worker and advice; what that raises is not the
        user's concern (the stream's batches are placed or dropped already)."""
        try:
            self._cutter.close()
        except Exception:
            self._cutter.abandon()

    def _finish(self, how: Status) -> None:
        """The stream's one `stream_ended` event, its readers closed and its tally ended;
        once (under the lock)."""
        if self._status != "open":
            return
        self._status = how
        self._closing = False
        self._cutting = False
        dropped = [batch for step, batch in self._ready if step >= self._next]
        self._ready = deque()
        self._cutter_closed()
        cutter = self._cutter
        handed = self._next - self._state.step
        tally = self._watch.ended(handed, cutter.reads_why)
        if tally is None:
            return  # nothing was ever cut: nothing to say
        events = cutter.placer.events
        # Every stream's end at info, also for a name seen before (a warm-up stream):
        # one event a stream, its counts its own.
        if events.enabled("info"):
            failure = self._failure
            events.emit(
                "info",
                "stream_ended",
                {
                    "name": tally.name,
                    "how": how,
                    "batches": handed,
                    "nbytes": tally.nbytes - sum(a.nbytes for a in _arrays(dropped)),
                    "dropped": len(dropped),
                    "device": tally.device,
                    "origin": tally.origin,
                    "reads": cutter.reads,
                    "reads_with": cutter.reads_with,
                    "reads_why": cutter.reads_why,
                    "sources": tally.sources,
                    **(tally.packing or {}),
                    **loop_fields(tally),
                    "error": None if failure is None else f"{type(failure).__name__}: {failure}",
                },
            )

    def close(self) -> None:
        """Drop the batches in flight and end the stream (its paging advice, readers and
        worker thread included). From another thread it waits for a pull in progress;
        it never raises. Closing again does nothing; the stream then yields nothing more."""
        if self._forks != _Forks.count:
            self._leave_parent()
            self._status = "closed"
            return
        if self._owner == threading.get_ident():
            # Inside a pull on this thread (a signal handler): the pull ends it.
            self._closing = True
            return
        with self._lock:
            self._finish("closed")

    def _forked(self) -> None:
        """A forked child's first pull: the copy lets go of the parent's readers and
        refuses, saying why."""
        self._leave_parent()
        if self._status == "open":
            self._status = "failed"
            self._failure = StreamEndedError(
                self._name,
                f"this stream was opened in process {self._pid}, and this is a forked "
                f"child ({os.getpid()})",
                "open a new stream in the child (resume=stream.state() goes on from the "
                "parent's step)",
            )
        self._refuse()

    def _leave_parent(self) -> None:
        """In a forked child: a lock of its own (the parent's may be held by a thread the
        child does not have), and the parent's readers let go, its descriptors closed."""
        self._lock = threading.RLock()
        self._owner = None
        self._forks = _Forks.count
        self._cutting = False
        self._ready = deque()
        self._cutter.abandon(child=True)

    def state(self) -> dict[str, Any]:
        """Where the stream is: the next batch it hands out (`step`) and every argument
        that decides its batches, as plain JSON-able values.

        Save it beside a checkpoint (`json.dumps` it into `save_file`'s metadata); after
        a restart, `devpolicy.windows(tokens, ..., resume=state)` with the same arguments
        yields exactly the batches this stream would have yielded from `step` on.
        Batches already sent ahead but not handed out are not counted: they come again.
        A pull that a `KeyboardInterrupt` stopped handed nothing out.

        Example:
            >>> import devpolicy, numpy as np
            >>> p = devpolicy.load_policy({"version": 1})
            >>> tokens = np.arange(100, dtype=np.uint16)
            >>> stream = devpolicy.windows(tokens, 5, 2, order="random", seed=3, policy=p)
            >>> first, second = next(stream), next(stream)
            >>> saved = stream.state()
            >>> saved["step"]
            2
            >>> resumed = devpolicy.windows(
            ...     tokens, 5, 2, order="random", seed=3, resume=saved, policy=p
            ... )
            >>> bool((np.asarray(next(resumed)) == np.asarray(next(stream))).all())
            True
        """
        epoch_at = self._epoch_at
        step = self._next
        epoch = None if epoch_at is None else epoch_at(step)
        cutter = self._cutter
        packing = cutter.state_at(step) if isinstance(cutter, PackedCutter) else None
        return dataclasses.replace(self._state, step=step).saved(epoch, packing)


def _arrays(batches: list[Any]) -> list[Any]:
    """The arrays of `batches`: each one, or each of its arrays (a batch with its segment
    ids and positions is a dict of three)."""
    if batches and isinstance(batches[0], dict):
        return [array for batch in batches for array in batch.values()]
    return batches
