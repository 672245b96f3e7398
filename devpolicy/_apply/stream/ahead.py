"""A stream's next group made ready while the current one is placed and used.

From a file mapping, the next group is gathered on one worker thread (one hand-off a group),
so its page faults (numpy copies, the GIL released) overlap the transfers and the user's step,
as a double-buffered hand loop overlaps its own. The first group (nothing to overlap yet) and
arrays in memory (a gather costs less than a hand-off) stay on the stream's thread. Read by
position, the next group is read by a polled io_uring's kernel thread (`reads.polled`,
`KernelReads`: no thread of ours, no GIL) or in one plain-ring call on the worker; `preadv`s
stay on the stream's thread. Cutting earlier on the stream's thread, smaller groups, several
gathering threads (their faults contend for the address space) and threads of `preadv`s all
lost (measured: docs/benchmarks.md#the-stream-wings-choices-as-measured). The work holds the
stream weakly (`call_weakly`), so a stream dropped unclosed with a group queued is collected.
"""

from __future__ import annotations

import weakref
from concurrent.futures import Future
from typing import Any, Protocol

from .groups import GroupBuffer


class _Kernel(Protocol):
    """What a polled ring's path offers: wait for the group it started, or settle it."""

    def finish(self) -> None: ...

    def settle(self) -> None: ...


class KernelReads:
    """A group a polled ring's kernel thread is reading into its buffer: `result` waits
    for the reads, as a worker thread's future would for its work.

    `queued` is the worker thread's work that queued the reads, where the stream's thread
    did not: a group of a thousand shards opens hundreds of their files first (tens of
    milliseconds, and the process's descriptor table grown once: an RCU grace period),
    which the stream's thread would pay on the pull that starts the group."""

    __slots__ = ("_into", "_queued", "_reader")

    def __init__(
        self, reader: _Kernel, into: GroupBuffer, queued: Future[Any] | None = None
    ) -> None:
        self._reader = reader
        self._into = into
        self._queued = queued

    def result(self) -> GroupBuffer:
        """The buffer, once every window is in it (a short read redone; see `finish`);
        what queueing the reads raised (a shard's file truncated or gone), raised here."""
        if self._queued is not None:
            self._queued.result()
        self._reader.finish()
        return self._into

    def cancel(self) -> bool:
        """Whether the reads were never queued (the worker had not begun): nothing to
        wait for then. False once the kernel may be reading."""
        return self._queued is not None and self._queued.cancel()

    def exception(self) -> None:
        """Wait for the reads, whatever they returned (a stream being stopped)."""
        if self._queued is not None and not self._queued.cancelled():
            self._queued.exception()
        self._reader.settle()


def call_weakly(method: weakref.WeakMethod[Any], *args: Any) -> Any:
    """What `method` returns for `args`, or None where its object is gone."""
    bound = method()
    return None if bound is None else bound(*args)
