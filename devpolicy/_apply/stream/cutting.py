"""A stream's groups of batches: the windows copied by one of its read paths, narrowed,
placed, and the next group made ready while the current one is used.

The read paths (`reads`: memory, a mapping kept or within a budget, the file by position
with `preadv`, a plain io_uring or a polled one) are opened when the stream starts, by
the rules' first guess (`reads.opening`); where more than one is safe for the file, the
stream times them on its own groups and keeps the fastest (`choosing`). It says which it
reads by, and why, in `stream_ended` (`reads`, `reads_with`, `reads_why`;
docs/host-arrays.md, "Which read path runs, and why").

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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..._decide.decider import Decider
from ..._machine.streams import StreamTally
from ..narrowing import Narrow
from .ahead import KernelReads, call_weakly
from .choosing import PathTrials
from .documents import SeparatorIs
from .groups import GroupBuffer, every_window
from .interrupts import deferred_interrupts
from .mixing import Mixed, MixedViews
from .placing import GroupPlacer
from .reading import ReadOptions
from .reads import ReadPath
from .reads.kept import KeptMapping
from .reads.opening import Source, file_path, file_reader, open_paths
from .sampling import Random, Sequential, process_rows
from .shuffling import Shuffled

#: What draws a stream's windows, step by step.
Sampler = Random | Sequential | Shuffled | Mixed

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
    """Cuts a stream's groups of batches from `view` and places them (one owner, one
    thread at a time: the stream's lock; the worker thread only reads ahead)."""

    __slots__ = (
        "__weakref__",  # the worker thread's work holds the cutter weakly
        "_ahead",
        "_batch",
        "_batch_bytes",
        "_gatherer",
        "_group",
        "_length",
        "_mixture",
        "_opened",
        "_options",
        "_paths",
        "_pid",
        "_placer",
        "_read",
        "_sampler",
        "_trial_step",
        "_trials",
        "_tried_file",
        "_view",
        "_why",
        "_windows",
        "reads_with",
    )

    def __init__(
        self,
        view: np.ndarray[Any, Any],
        length: int,
        batch: int,
        sampler: Sampler,
        decider: Decider,
        name: str,
        size: int,
        narrow: Narrow,
        *,
        mixture: MixedViews | None = None,
        separator: tuple[int, SeparatorIs] | None = None,
        fields: tuple[str, str, str] | None = None,
        reads: ReadOptions | None = None,
    ) -> None:
        self._options = ReadOptions() if reads is None else reads
        self._view = view  # a mixture's first source (its dtype and row shape are all's)
        self._mixture = mixture
        self._length = length
        self._batch = batch
        self._sampler = sampler
        self._windows = every_window(view, length)
        self._placer = placer = GroupPlacer(
            decider,
            name,
            narrow,
            view.dtype,
            self._windows.shape[1:],
            separator=separator,
            fields=fields,
        )
        row = placer.dtype.itemsize * int(math.prod(view.shape[1:]))
        self._batch_bytes = length * batch * row
        self._group = _batches_a_group(self._batch_bytes, GROUP_MAX)
        placer.buffers = -(-size // self._group) + 2  # groups in flight, in use, being cut
        self._ahead: _Ahead | None = None
        self._gatherer: ThreadPoolExecutor | None = None
        self._paths: dict[str, ReadPath] = {}  # opened at the start, by key
        self._read: ReadPath | None = None  # the path that reads the next group
        self._opened = False
        self._pid = os.getpid()
        self._tried_file = False  # whether reading by position was tried mid-stream
        self.reads_with: str | None = None  # for "file": the reader's way
        self._why = "the tokens are in memory"  # why `reads`, for `stream_ended`
        self._trials: PathTrials | None = None  # where several paths are safe: timed
        self._trial_step = 0  # the step a trial last ended at

    @property
    def tally(self) -> StreamTally | None:
        """The stream's counts, opened with its first batch shape's decision."""
        return self._placer.tally

    @property
    def reads(self) -> str:
        """How windows are copied: "file", "mapping" or "memory"."""
        read = self._read
        return "memory" if read is None else read.reads

    @property
    def reads_why(self) -> str:
        """Why the stream reads as it does (`reads`), and what its trials measured."""
        trials = self._trials
        if trials is None or not trials.why:
            return self._why
        if not trials.decisions:
            return f"{self._why}; started on {trials.path}, {trials.why}"
        return (
            f"{self._why}; timed on its own groups ({', '.join(trials.candidates)}), "
            f"{trials.decisions} time(s), the last at step {self._trial_step}: {trials.why}"
        )

    # The plan of a batch shape, and the read path.

    def _source(self) -> Source:
        return Source(self._view, self._windows, self._mixture, self._length, self._sampler.random)

    def _open(self) -> None:
        """The read paths (`reads.opening`), opened with Ctrl-C held back, so no
        descriptor is ever left without an owner that closes it; where more than one is
        safe, the trials that time them (`choosing`)."""
        options = self._options
        with deferred_interrupts():
            opened = open_paths(self._source(), options)
            self._paths = opened.paths
            self._opened = True
        self._why = opened.why
        first = opened.first
        if len(opened.candidates) > 1:
            reader = getattr(self._paths.get("file"), "reader", None)
            trials = self._trials = PathTrials(
                opened.candidates,
                first,
                groups=options.trial_groups,
                rounds=options.trial_rounds,
                recheck=options.recheck_seconds,
                source=None if reader is None else (reader.identity, reader.way),
            )
            first = trials.path  # where an earlier stream of these files settled lately
        for path in self._paths.values():
            if path.grouped and options.ahead:
                # Larger groups: a system call, a hand-off and the waits for the GIL are
                # paid once for more windows.
                self._group = max(self._group, _batches_a_group(self._batch_bytes, READ_GROUP_MAX))
        self._read = self._paths[first]

    def _reads_ahead(self, read: ReadPath) -> bool:
        """Whether `read` makes the next group ready while this one is placed: on a polled
        ring's kernel thread, or on the worker thread (made here the first time)."""
        if not read.ahead or not self._options.ahead:
            return False
        if (read.kernel and self._placer.target is None) or self._gatherer is not None:
            return True
        self._gatherer = ThreadPoolExecutor(1, "devpolicy-windows")
        return True

    def _read_by_position(self, why: str, first: int) -> None:
        """The path in use can no longer serve (`why`): from the group after this one read
        the windows from the file by position (nothing is mapped, so nothing needs giving
        back), its pages given back. Where the file cannot be read so, the stream goes on
        as it was."""
        self._tried_file = True
        with deferred_interrupts():
            if "file" not in self._paths:
                reader = file_reader(self._source(), self._options)
                if reader is None:
                    return
                self._paths["file"] = file_path(reader, self._source())
        self._why = self.reads_why + f"; at step {first} {why}: read by position from then on"
        self._trials = None  # no path but this one is safe now
        old = self._read
        self._read = read = self._paths["file"]
        if old is not None and old is not read:
            del self._paths[old.key]
            old.close(sweep=True)
        if read.grouped and self._options.ahead:
            self._group = max(self._group, _batches_a_group(self._batch_bytes, READ_GROUP_MAX))

    def count_sources(self, counts: Callable[[int], dict[str, int]]) -> None:
        """How the stream's tally counts a mixture's windows of each source in its first
        n batches (see `StreamTally.count_sources`)."""
        self._placer.count_sources(counts)

    def own_rows(self) -> int:
        """The rows of a step's global batch, this process's drawn from now on: under
        several processes the rows its devices hold of the global batch, so one seed
        gives every process other windows of one global batch, and a process resumed at a
        step draws the rows it drew. Every process draws the same windows in order."""
        batch = self._batch
        if jax.process_count() == 1 or isinstance(self._sampler, Sequential):
            return batch
        plan = self._placer.plan((batch, *self._windows.shape[1:]))
        if not plan.local:
            return batch
        assert plan.decision.sharding is not None
        rest = (self._length, *self._view.shape[1:])
        rows, per_step = process_rows(plan.decision.sharding, batch, rest)
        self._sampler.own_rows(rows, per_step)
        return per_step

    # Cutting a group.

    def start(self, first: int) -> None:
        """Open the read paths and start reading the group from step `first` (one batch:
        the first pull waits for no more), so that it is read while the caller does
        whatever comes before that pull."""
        if not self._opened:
            self._open()
        read = self._read
        if self._ahead is not None or read is None or not self._reads_ahead(read):
            return  # tokens in memory: the first cut is a copy
        offsets = self._sampler.take(first, 1)
        if offsets is not None:
            ahead = self._ahead = _Ahead(first, offsets, read, None)
            ahead.work = self._start_ahead(offsets, read)

    def cut(self, first: int) -> tuple[list[Any], int] | None:
        """The batches of the group from step `first`, placed, and their bytes; None past
        the last step.

        The group read ahead is used where it is this one, else waited out and dropped;
        the group after this one is started before this one is placed."""
        if not self._opened:
            self._open()
        trials = self._trials
        began = time.perf_counter() if trials is not None else 0.0
        read = self._read
        assert read is not None
        ahead = self._ahead
        if ahead is not None and (ahead.first != first or ahead.work is None):
            self.settle()  # an interrupted or abandoned cut's group: never trusted
            ahead = None
        if ahead is None:
            # The first: its first batch waits for it, so never a large one.
            offsets = self._sampler.take(first, min(self._group, GROUP_MAX))
            if offsets is None:
                return None
            # Before the thread reads the next: a path is never used by two threads at once.
            early = self._reads_ahead(read)
            gathered = self._made_ready(offsets, self._into(offsets, read), read) if early else None
        else:
            assert ahead.work is not None
            offsets = ahead.offsets
            read = ahead.read
            gathered = ahead.work.result()  # what the read raised, raised here
            self._ahead = None
        current = self._read
        assert current is not None
        why = None if self._tried_file else current.given_up()
        if why is not None:
            self._read_by_position(why, first)  # from the group after this one
        elif trials is not None:
            self._next_path(trials, first)
        following = self._read
        assert following is not None
        if self._reads_ahead(following):
            after = first + offsets.shape[0]
            # After a first group (one batch, or a few), a group of a few: the first
            # pulls wait for no large read.
            ramp = self._group if offsets.shape[0] >= GROUP_MAX else GROUP_MAX
            starts = self._sampler.take(after, min(self._group, ramp))
            if starts is not None:
                # Recorded before it starts: a Ctrl-C just after the start returns leaves
                # the record without its work, and `settle` then waits for whatever the
                # start began (no signal held back here: under gVisor each change of a
                # handler is a system call, and this runs every group).
                ahead = self._ahead = _Ahead(after, starts, following, None)
                ahead.work = self._start_ahead(starts, following)
        placed = self._placer.place(offsets, gathered, read)
        if trials is not None and self._trials is trials:
            trials.timed(read.key, offsets.shape[0], time.perf_counter() - began)
        return placed

    def _next_path(self, trials: PathTrials, first: int) -> None:
        """Between two groups, nothing read ahead: the path its trials say reads the
        next; once a trial settles on reading by position, the mapping's pages the trial
        brought in are given back."""
        before = trials.decisions
        read = self._paths[trials.next_path()]
        if trials.decisions != before:
            self._trial_step = first
            for path in self._paths.values():
                if path is not read and isinstance(path, KeptMapping):
                    path.sweep()
        self._read = read

    def _start_ahead(
        self, offsets: np.ndarray[Any, Any], read: ReadPath
    ) -> Future[Any] | KernelReads:
        """Start the group at `offsets` by `read`: by a polled ring's kernel thread straight
        into its buffer, or read or gathered on the worker thread."""
        into = self._into(offsets, read)
        if read.kernel and into is not None:
            read.submit(offsets, into.batches)
            return KernelReads(read, into)
        assert self._gatherer is not None
        # Weakly: a stream dropped unclosed is collected with a group queued.
        made_ready = weakref.WeakMethod(self._made_ready)
        return self._gatherer.submit(call_weakly, made_ready, offsets, into, read)

    def _into(self, offsets: np.ndarray[Any, Any], read: ReadPath) -> GroupBuffer | None:
        """The buffer a group read from the file goes straight into (no copy after), or
        None where it is gathered (a mapping, memory) or narrowed after."""
        if read.reads != "file" or self._placer.target is not None:
            return None
        return self._placer.buffer_for(offsets)

    def _made_ready(
        self, offsets: np.ndarray[Any, Any], into: GroupBuffer | None, read: ReadPath
    ) -> np.ndarray[Any, Any] | GroupBuffer:
        """The group at `offsets` read into `into`, or gathered, by `read` (on the worker
        thread: the path the group was started with)."""
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

    def _close_paths(self, *, child: bool | None) -> None:
        """Close every path (`child` not None: abandoned, in a forked child or not),
        keeping how the file was read, where the stream read it last, for the event."""
        paths, self._paths = self._paths, {}
        for path in paths.values():
            try:
                if path is self._read and path.way is not None:
                    self.reads_with = path.way
                if child is None:
                    path.close()
                else:
                    path.abandon(child=child)
            except Exception:
                if child is None:
                    raise

    def close(self) -> None:
        """Wait out the group read ahead, end the worker thread and every path (their
        descriptors, rings and advice). Nothing is cut after. Safe to call twice."""
        self._opened = True  # never opened again
        try:
            self.settle()
            self._end_worker(wait=True)
        finally:
            self._placer.clear()
            self._close_paths(child=None)

    def abandon(self, *, child: bool = False) -> None:
        """Let go of everything without waiting for anything: for a collected stream (its
        worker holds it weakly, so none runs for it) or a forked child's copy (`child`:
        the worker thread, the ring's reads and the advice are the parent's). This
        process's descriptors are closed."""
        self._opened = True
        self._ahead = None
        self._placer.clear()
        try:
            self._end_worker(wait=False)
        finally:
            self._close_paths(child=child)

    def __del__(self) -> None:
        # Collected: no worker runs for it (a running one holds it), so nothing is waited
        # for; its descriptors are closed and its paging advice ended.
        try:  # a finaliser never raises; no contextlib (a module global)
            tally = self.tally
            if tally is not None and tally.open:  # a stream dropped unclosed is not open
                tally.close()
            self.abandon(child=self._pid != os.getpid())
        except Exception:
            pass


def _batches_a_group(batch_bytes: int, most: int) -> int:
    """Batches sent in one group: `most`, fewer where they pass `GROUP_BYTES`."""
    return max(1, min(most, GROUP_BYTES // max(1, batch_bytes)))
