"""A stream's groups of batches: the windows copied by one of its read paths, narrowed,
placed, and the next group made ready while the current one is used.

The read paths (`reads`: memory, a mapping kept or within a budget, the file by position
with `preadv`, a plain io_uring or a polled one) are the stream's `paths`: opened when it
starts, and which reads each group chosen by rule and by timing (`paths`, `choosing`).
The stream says which it read by, and why, in `stream_ended` (`reads`, `reads_with`,
`reads_why`; docs/host-arrays.md, "Which read path runs, and why").

`GroupCutter.cut(first)` is a function of the step: it returns the group of batches from
step `first`, whatever was cut before. The group read ahead is used only where it is that
group; any other is waited out and dropped. So an interrupt or an error anywhere inside a
cut leaves nothing a later cut would trust. A path is changed only between two groups,
with nothing read ahead, and every path gives the same windows: a switch never skips or
repeats a step. The cutter keeps no step of its own: the stream that owns it
(`owner.WindowStream`) does, under its lock, and calls the cutter only while it holds
that lock.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._machine.spans import STREAM_PLACE, STREAM_READ, span
from .ahead import KernelReads, call_weakly
from .groups import GroupBuffer, every_window
from .mixing import MixedViews
from .paths import StreamPaths
from .placing import GroupPlacer
from .reading import ReadOptions
from .reads import ReadPath
from .reads.opening import Source
from .sampling import Sampler

#: Batches sent in one `device_put`, at most, and their bytes at most: a call's fixed cost
#: (about 100 us on this CPU, most of a small batch's time) is shared by the group, and
#: a group stays small beside host and device memory.
GROUP_MAX = 8
GROUP_BYTES = 4 * 2**20
#: Batches read from a file in one group, at most, where a group is one system call.
READ_GROUP_MAX = 32


@dataclass(slots=True)
class _Ahead:
    """The group from step `first` (its window starts `offsets`), being made ready by
    `read`."""

    first: int
    offsets: np.ndarray[Any, Any]
    read: ReadPath
    work: Future[Any] | KernelReads | None  # None until the start returned


class GroupCutter:
    """Cuts a stream's groups of batches from `view` and places them by `placer` (one
    owner, one thread at a time: the stream's lock; the worker thread only reads ahead).
    `size` is the batches the stream places ahead of use."""

    __slots__ = (
        "__weakref__",  # the worker thread's work holds the cutter weakly
        "_ahead",
        "_batch_bytes",
        "_cut_before",
        "_gatherer",
        "_group",
        "_options",
        "_pid",
        "_sampler",
        "paths",
        "placer",
        "size",
    )

    def __init__(
        self,
        view: np.ndarray[Any, Any],
        length: int,
        batch: int,
        sampler: Sampler,
        placer: GroupPlacer,
        size: int,
        *,
        mixture: MixedViews | None = None,
        reads: ReadOptions | None = None,
    ) -> None:
        self._options = options = ReadOptions() if reads is None else reads
        self._sampler = sampler
        windows = every_window(view, length)  # a mixture's first source: its dtype, rows
        self.paths = StreamPaths(Source(view, windows, mixture, length, sampler.random), options)
        self.placer = placer
        self.size = size
        row = placer.dtype.itemsize * int(math.prod(view.shape[1:]))
        self._batch_bytes = length * batch * row
        self._group = batches_a_group(self._batch_bytes, GROUP_MAX)
        placer.buffers = -(-size // self._group) + 2  # groups in flight, in use, being cut
        self._ahead: _Ahead | None = None
        self._cut_before = False  # whether a group was cut (the first is one batch)
        self._gatherer: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    @property
    def reads(self) -> str:
        """How windows are copied: "file", "mapping" or "memory"."""
        return self.paths.reads

    @property
    def reads_why(self) -> str:
        """Why the stream reads as it does (`reads`), and what its trials measured."""
        return self.paths.reads_why

    @property
    def reads_with(self) -> str | None:
        """For "file": the reader's way, once the stream ended."""
        return self.paths.reads_with

    def _open(self) -> None:
        """The read paths, opened (`paths`); larger groups where a path reads a group in
        one system call (a call, a hand-off and the waits for the GIL are paid once for
        more windows)."""
        paths = self.paths
        paths.open()
        if paths.grouped():
            self._grow()

    def _grow(self) -> None:
        if self._options.ahead:
            self._group = max(self._group, batches_a_group(self._batch_bytes, READ_GROUP_MAX))

    def _reads_ahead(self, read: ReadPath) -> bool:
        """Whether `read` makes the next group ready while this one is placed: on a polled
        ring's kernel thread, or on the worker thread (made here the first time)."""
        if not read.ahead or not self._options.ahead:
            return False
        kernel = read.kernel and self.placer.target is None
        if (kernel and not read.opens) or self._gatherer is not None:
            return True
        # A kernel path that opens files queues its groups on the worker (`_start_ahead`).
        self._gatherer = ThreadPoolExecutor(1, "devpolicy-windows")
        return True

    # Cutting a group.

    def start(self, first: int) -> None:
        """Open the read paths and start reading the group from step `first` (one batch:
        the first pull waits for no more), so that it is read while the caller does
        whatever comes before that pull."""
        if not self.paths.opened:
            self._open()
        read = self.paths.read
        if (
            self._ahead is not None
            or read is None
            or read.kernel
            or read.first_now
            or not self._reads_ahead(read)
        ):
            # Tokens in memory: the first cut is a copy. A polled ring: its kernel thread,
            # made or woken now, may wait for a core; the first cut reads by `preadv`.
            # A thousand shards: the first cut copies from their mappings, opening none.
            if read is not None and read.first_now and read.opens and self._reads_ahead(read):
                self._start_worker()
            return
        offsets = self._sampler.take(first, 1)
        if offsets is not None:
            ahead = self._ahead = _Ahead(first, offsets, read, None)
            ahead.work = self._start_ahead(offsets, read)

    def _start_worker(self) -> None:
        """The worker thread started now, idle, where the first batch is copied from a
        thousand shards' mappings and the group after it opens their files on the worker
        (`cut`): a thread started there, with its work queued, took the GIL from the
        caller's thread for its opens before that pull returned (0.8-3.6 ms of the first
        batch; started idle, a tenth of that, the caller holding the GIL meanwhile)."""
        gatherer = self._gatherer
        if gatherer is not None:
            gatherer.submit(int)

    def cut(self, first: int) -> tuple[list[Any], int] | None:
        """The batches of the group from step `first`, placed, and their bytes; None past
        the last step.

        The group read ahead is used where it is this one, else waited out and dropped;
        the group after this one is started before this one is placed."""
        paths = self.paths
        if not paths.opened:
            self._open()
        trials = paths.timing
        began = time.perf_counter() if trials is not None else 0.0
        read = paths.read
        assert read is not None
        ahead = self._ahead
        if ahead is not None and (ahead.first != first or ahead.work is None):
            self.settle()  # an interrupted or abandoned cut's group: never trusted
            ahead = None
        if ahead is None:
            # Not read ahead: its first batch waits for it, so never a large one, and the
            # stream's very first (a fresh stream's first batch) is one batch alone.
            very_first = not self._cut_before
            most = 1 if very_first else min(self._group, GROUP_MAX)
            self._cut_before = True
            offsets = self._sampler.take(first, most)
            if offsets is None:
                return None
            # Before the thread reads the next: a path is never used by two threads at once.
            early = self._reads_ahead(read)
            into = self._into(offsets, read) if early or very_first else None
            gathered: np.ndarray[Any, Any] | GroupBuffer | None = None
            read_now = False
            # Copied from the shards' mappings: opening none, it leaves their opens to the
            # next group, read ahead once this one is placed (below).
            mapped = very_first and read.first_now
            if very_first and into is not None and read.read_now(offsets, into.batches):
                gathered = into  # read on this thread, at once
                # Nothing started behind it: waking a polled ring's kernel thread handed
                # it this core for milliseconds on a busy host before the first batch was
                # placed. The next pull reads its group, then starts the one after.
                read_now = True
            elif early:
                gathered = self._made_ready(offsets, into, read)
        else:
            assert ahead.work is not None
            offsets = ahead.offsets
            read = ahead.read
            gathered = ahead.work.result()  # what the read raised, raised here
            self._ahead = None
        paths.next_path(first)  # the path that reads the group after this one
        following = paths.read
        assert following is not None
        if following.grouped:
            self._grow()
        if ahead is None and read_now:
            pass  # a fresh stream's first batch: see above
        elif self._reads_ahead(following):
            self._read_after(first + offsets.shape[0], offsets.shape[0], following)
        with span(STREAM_PLACE, name=self.placer.name, batches=offsets.shape[0]):
            placed = self.placer.place(offsets, gathered, read)
        if trials is not None and paths.timing is trials:
            trials.timed(read.key, offsets.shape[0], time.perf_counter() - began)
        first_mapped = ahead is None and read_now and mapped
        if first_mapped and following.opens and self._reads_ahead(following):
            # The first batch is placed: the next group's opens (and the descriptor
            # table's growth past the caller's memmaps', an RCU grace period) are the
            # worker's while the caller uses it, not the second pull's.
            self._read_after(first + offsets.shape[0], offsets.shape[0], following)
        return placed

    def _read_after(self, after: int, before: int, read: ReadPath) -> None:
        """Start reading ahead the group from step `after` (the group before it: `before`
        batches) by `read`."""
        # After a first group (one batch, or a few), a group of a few: the first pulls
        # wait for no large read.
        ramp = self._group if before >= GROUP_MAX else GROUP_MAX
        starts = self._sampler.take(after, min(self._group, ramp))
        if starts is not None:
            # Recorded before it starts: a Ctrl-C just after the start returns leaves the
            # record without its work, and `settle` then waits for whatever the start began
            # (no signal held back here: under gVisor each change of a handler is a system
            # call, and this runs every group).
            ahead = self._ahead = _Ahead(after, starts, read, None)
            ahead.work = self._start_ahead(starts, read)

    def _start_ahead(
        self, offsets: np.ndarray[Any, Any], read: ReadPath
    ) -> Future[Any] | KernelReads:
        """Start the group at `offsets` by `read`: by a polled ring's kernel thread straight
        into its buffer, or read or gathered on the worker thread."""
        into = self._into(offsets, read)
        if read.kernel and into is not None and not read.opens:
            read.submit(offsets, into.batches)
            return KernelReads(read, into)
        assert self._gatherer is not None
        # Weakly: a stream dropped unclosed is collected with a group queued.
        if read.kernel and into is not None:
            # Its reads queued by the worker, which opens the files first: a group of a
            # thousand shards opens hundreds (measured: 100-190 ms a group of 32 batches
            # on the caller's thread, busy host).
            queue = weakref.WeakMethod(self._queue)
            return KernelReads(read, into, self._gatherer.submit(call_weakly, queue, offsets,
                                                                 into, read))  # fmt: skip
        made_ready = weakref.WeakMethod(self._made_ready)
        return self._gatherer.submit(call_weakly, made_ready, offsets, into, read)

    def _queue(self, offsets: np.ndarray[Any, Any], into: GroupBuffer, read: ReadPath) -> None:
        """The group at `offsets` queued on `read`'s ring (on the worker thread: its files
        opened first), the kernel reading it into `into` meanwhile."""
        with span(STREAM_READ, reads=read.key, batches=offsets.shape[0]):
            read.submit(offsets, into.batches)

    def _into(self, offsets: np.ndarray[Any, Any], read: ReadPath) -> GroupBuffer | None:
        """The buffer a group read from the file goes straight into (no copy after), or
        None where it is gathered (a mapping, memory) or narrowed after."""
        if read.reads != "file" or self.placer.target is not None:
            return None
        return self.placer.buffer_for(offsets)

    def _made_ready(
        self, offsets: np.ndarray[Any, Any], into: GroupBuffer | None, read: ReadPath
    ) -> np.ndarray[Any, Any] | GroupBuffer:
        """The group at `offsets` read into `into`, or gathered, by `read` (on the worker
        thread: the path the group was started with)."""
        with span(STREAM_READ, reads=read.key, batches=offsets.shape[0]):
            if into is None:
                return read.gather(offsets)
            read.read_into(offsets, into.batches, None)
            return into

    # Ending.

    def settle(self) -> None:
        """Wait out the group being read ahead, whatever its reads gave, and drop it. Until
        it is waited out it stays, so an interrupted wait is waited for again."""
        ahead = self._ahead
        if ahead is None:
            return
        work = ahead.work
        if work is None:  # a start a Ctrl-C cut short: what it began, if anything
            gatherer = self._gatherer
            if gatherer is not None:  # one worker, in order: done once this is
                gatherer.submit(int).result()
            ahead.read.settle()  # a polled ring's reads
        elif not work.cancel():
            work.exception()  # waited for; what it raised, nobody needs now
        self._ahead = None

    def _end_worker(self, *, wait: bool) -> None:
        gatherer, self._gatherer = self._gatherer, None
        if gatherer is not None:
            gatherer.shutdown(wait=wait)

    def close(self) -> None:
        """Wait out the group read ahead, end the worker thread and every path (their
        descriptors, rings and advice). Nothing is cut after. Safe to call twice."""
        try:
            self.settle()
            self._end_worker(wait=True)
        finally:
            self.placer.clear()
            self.paths.close(child=None)

    def abandon(self, *, child: bool = False) -> None:
        """Let go of everything without waiting for anything: for a collected stream (its
        worker holds it weakly, so none runs for it) or a forked child's copy (`child`:
        the worker thread, the ring's reads and the advice are the parent's). This
        process's descriptors are closed."""
        self._ahead = None
        self.placer.clear()
        try:
            self._end_worker(wait=False)
        finally:
            self.paths.close(child=child)

    def __del__(self) -> None:
        # Collected: no worker runs for it (a running one holds it), so nothing is waited
        # for; its descriptors are closed and its paging advice ended.
        try:  # noqa: SIM105 - a finaliser never raises; no contextlib (a module global)
            self.abandon(child=self._pid != os.getpid())
        except Exception:
            pass


def batches_a_group(batch_bytes: int, most: int) -> int:
    """Batches sent in one group: `most`, fewer where they pass `GROUP_BYTES`."""
    return max(1, min(most, GROUP_BYTES // max(1, batch_bytes)))
