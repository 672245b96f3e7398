"""A stream's next group made ready while the current one is placed and used.

From a file mapping, the next group is gathered on one worker thread (one per stream,
one hand-off a group) while the current group is placed and used: the gather's page
faults (numpy copies with the GIL released) then overlap the transfers and the user's
step, as a double-buffered hand loop overlaps its own. The first group is gathered on the
stream's thread (nothing to overlap yet, and no hand-off before the first batch). On a
TPU v5e VM under gVisor (December 2026) the story's 19.09 GiB file, none of it mapped in
at the start of a run, fed 3,344-3,382 batches/s, 2.8-2.9x the hand loop and 1.45x the
double-buffered hand loop (2,321-2,427), against 2,716 gathered on the stream's thread.
Cutting the next group earlier on the stream's thread instead reached 1.24x on the 2-core
CPU machine, and smaller groups lost. Two to four threads, each gathering part of a
group, lost on both machines (TPU VM 3,177 / 2,867 / 2,700 batches/s, CPU 10,424 / 9,274
/ 8,932): their faults contend for the process's address space. Arrays in memory are
gathered on the stream's thread: a group's gather (about 25 us a batch) costs less than
a hand-off.

Read by position from the file (`filewindows`), the next group is read by a polled
io_uring's kernel thread straight into its buffer (`KernelReads`: no thread of ours, no
GIL), or in one call of a plain ring on the worker thread; `preadv`s stay on the
stream's thread (several threads of them lost: on the TPU VM 792 batches/s against
1,908). The work handed to the worker holds the stream weakly (`call_weakly`), so a
stream dropped unclosed with a group queued is still collected.
"""

from __future__ import annotations

import weakref
from typing import Any

from .filewindows import FileWindows
from .groups import GroupBuffer


class KernelReads:
    """A group a polled ring's kernel thread is reading into its buffer: `result` waits
    for the reads, as a worker thread's future would for its work."""

    __slots__ = ("_into", "_reader")

    def __init__(self, reader: FileWindows, into: GroupBuffer) -> None:
        self._reader = reader
        self._into = into

    def result(self) -> GroupBuffer:
        """The buffer, once every window is in it (a short read redone; see `finish`)."""
        self._reader.finish()
        return self._into

    def cancel(self) -> bool:
        """False: the kernel is reading already."""
        return False

    def exception(self) -> None:
        """Wait for the reads, whatever they returned (a stream being stopped)."""
        self._reader.settle()


def call_weakly(method: weakref.WeakMethod[Any], *args: Any) -> Any:
    """What `method` returns for `args`, or None where its object is gone."""
    bound = method()
    return None if bound is None else bound(*args)
