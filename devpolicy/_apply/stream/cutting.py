"""A stream's groups of batches: the windows copied by one of three read paths, narrowed,
placed, and the next group made ready while the current one is used.

The read paths: gathered from memory (tokens in memory, or a file mapping whose touched
pages are given back: `paging`), or read by position from the file a view maps
(`filewindows`; a group in one io_uring call where Linux allows: `batchreads`), the next
group read ahead (`ahead`). The path is chosen once, when the stream is made
(`GroupCutter._choose`: by io_uring, the tokens' size against the memory left, and the
share of their pages in the page cache) and said in `stream_ended` (`reads_why`); why, is
in docs/host-arrays.md ("Which read path runs, and why"); the figures behind the choices
are in docs/benchmarks.md#the-stream-wings-choices-as-measured.

`GroupCutter.cut(first)` is a function of the step: it returns the group of batches from
step `first`, whatever was cut before. The group read ahead is used only where it is that
group; any other is waited out and dropped. So an interrupt or an error anywhere inside a
cut leaves nothing a later cut would trust. The cutter keeps no step of its own: the
stream that owns it (`owner.WindowStream`) does, under its lock, and calls the cutter only
while it holds that lock.

Why this is one concept, past 600 lines: every read path (one array, a mixture, a file, a
mapping kept or given back) fills the same group buffers, reads ahead through the same
record, and is switched mid-stream (memory falling, large folios) between two cuts; the
invariant above holds only where one object sees all of them. What each path does alone
lives below it (`filewindows`, `paging`, `groups`, `mixing`).
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

from ..._base.errors import NarrowingError
from ..._base.sizes import format_size
from ..._decide.decider import Decider
from ..._decide.routing import NEVER_MAPPED
from ..._machine.capacity import host_total_bytes, memory_headroom
from ..._machine.streams import StreamTally, open_stream
from ..._read.pages import Pager, cached_share
from ..._read.positional import FileWindows, mapped_file, mapped_files
from ..narrowing import NARROWER, Narrow, narrow_into, narrowed_event
from .ahead import KernelReads, call_weakly
from .choosing import PathTrials
from .documents import FIELDS, SEGMENT_BYTES, SeparatorIs
from .groups import GroupBuffer, GroupPlan, every_window, place_documents
from .interrupts import deferred_interrupts
from .mixing import Mixed, MixedViews
from .reading import ReadOptions
from .sampling import Random, Sequential, process_rows
from .shuffling import Shuffled

#: What draws a stream's windows, step by step.
Sampler = Random | Sequential | Shuffled | Mixed

#: Batches sent in one `device_put`, at most, and their bytes at most: a call's fixed cost
#: (about 100 us on this CPU, most of a small batch's time) is shared by the group, and
#: a group stays small beside host and device memory.
GROUP_MAX = 8
GROUP_BYTES = 4 * 2**20
#: Batches read from a file in one group, at most, where a group is read ahead in one
#: system call (`positional`, `uring`).
READ_GROUP_MAX = 32


@dataclass(slots=True)
class _Ahead:
    """The group from step `first` (its window starts `offsets`), being made ready by
    `path` ("file": read by position; "gather": gathered from memory or a mapping)."""

    first: int
    offsets: np.ndarray[Any, Any]
    path: str
    work: Future[Any] | KernelReads | None  # None until the start returned


class GroupCutter:
    """Cuts a stream's groups of batches from `view` and places them (one owner, one
    thread at a time: the stream's lock; the worker thread only reads ahead)."""

    __slots__ = (
        "__weakref__",  # the worker thread's work holds the cutter weakly
        "_ahead",
        "_batch",
        "_batch_bytes",
        "_budgeted",
        "_buffers",
        "_count_sources",
        "_decider",
        "_dtype",
        "_fields",
        "_gatherer",
        "_group",
        "_groups",
        "_keep",
        "_kernel_reads",
        "_length",
        "_mixture",
        "_name",
        "_narrow",
        "_narrowed",
        "_opened",
        "_options",
        "_pager",
        "_path",
        "_pid",
        "_reader",
        "_ring",
        "_sampler",
        "_separator",
        "_shapes",
        "_target",
        "_trial_step",
        "_trials",
        "_tried_file",
        "_view",
        "_why",
        "_windows",
        "reads",
        "reads_with",
        "tally",
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
        self._separator = separator  # (token, "eos" or "bos"): segment ids with each batch
        self._fields = fields  # a batch's keys (tokens, segment ids, positions): a dict
        self._count_sources: Callable[[int], dict[str, int]] | None = None
        self._length = length
        self._batch = batch
        self._sampler = sampler
        self._decider = decider
        self._name = name
        self._narrow = narrow
        self._windows = every_window(view, length)
        # Narrowed once per batch where x64 is off and the tokens are 64-bit.
        x64 = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
        self._target: np.dtype[Any] | None = None if x64 else NARROWER.get(view.dtype)
        self._dtype: np.dtype[Any] = self._target or view.dtype
        row = self._dtype.itemsize * int(math.prod(view.shape[1:]))
        self._batch_bytes = length * batch * row
        self._group = _batches_a_group(self._batch_bytes, GROUP_MAX)
        self._ahead: _Ahead | None = None
        self._gatherer: ThreadPoolExecutor | None = None
        self._shapes: dict[tuple[int, ...], GroupPlan] = {}
        self._ring: list[GroupBuffer] = []
        self._buffers = -(-size // self._group) + 2  # groups in flight, in use, being cut
        self._pager: Pager | None = None  # made at the first cut, for a mapped view
        self._reader: FileWindows | None = None  # or this, for a file read by position
        self._opened = False
        self._pid = os.getpid()
        self._tried_file = False  # whether reading by position was tried mid-stream
        self._kernel_reads = False  # whether the next group is read by a polled ring
        self._narrowed: set[bool] = set()  # the exactness already reported
        self._keep = False  # whether a mapping's pages are kept (not given back)
        self._budgeted = False  # or given back past the budget (else each group's)
        self._groups = 0  # groups cut (a kept mapping looks at the memory left every few)
        self.reads = "memory"  # how windows are copied: "file", "mapping" or "memory"
        self.reads_with: str | None = None  # for "file": the reader's way
        self._why = "the tokens are in memory"  # why `reads`, for `stream_ended`
        self._path = "gather"  # what reads the next group: "file" (by position) or "gather"
        self._trials: PathTrials | None = None  # where several paths are safe: timed
        self._trial_step = 0  # the step a trial last ended at
        self.tally: StreamTally | None = None

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

    @reads_why.setter
    def reads_why(self, why: str) -> None:
        self._why = why

    # The plan of a batch shape, and the read path.

    def _shape(self, shape: tuple[int, ...]) -> GroupPlan:
        found = self._shapes.get(shape)
        if found is None:
            decider = self._decider
            nbytes = math.prod(shape) * self._dtype.itemsize
            if self._separator is not None:  # placed with the tokens: decided with them
                nbytes += math.prod(shape[:2]) * SEGMENT_BYTES
            # As `put(name, batch)` decides one leaf; a process-local part's shape says
            # nothing of the global one across processes.
            known = None if jax.process_count() > 1 else shape
            (decision,) = decider.resolve_many([(self._name, nbytes, known, NEVER_MAPPED)])
            found = self._shapes[shape] = GroupPlan(decision, nbytes, decider.disabled)
            if self.tally is None:
                self.tally = open_stream(
                    self._name,
                    decision.origin,
                    decision.rule,
                    decision.device_text,
                    self._count_sources,
                )
        return found

    def _open(self) -> None:
        """The read path, chosen when the stream starts (`_choose`): a file read by
        position, a mapping gathered from (its pages kept, or given back), or memory;
        where both reading by position and keeping the mapping are safe, both stay open
        and the stream times them (`choosing`). Opened with Ctrl-C held back, so no
        descriptor is ever left without an owner that closes it."""
        options = self._options
        copy: str = options.path
        why = f"held to reads={copy!r}"
        candidates: list[str] = [copy]
        mixture = self._mixture
        with deferred_interrupts():
            if copy in ("auto", "file"):
                self._reader = self._file_reader()
            if copy == "auto":
                copy, why, candidates = self._choose(self._reader)
                if not options.measure:
                    candidates = [copy]
                if "file" not in candidates:
                    self._drop_reader()
            if mixture is None and (self._reader is None or "keep" in candidates):
                self._pager = Pager(self._view, random=self._sampler.random)
            self._opened = True
        pager = self._pager
        if pager is not None and pager.active:
            if copy == "file" and self._reader is None:  # no file to read by position
                why += "; the file cannot be read by position here: gathered instead"
            self._keep = copy == "keep" or "keep" in candidates
            self._budgeted = copy == "budget" and self._sampler.random
            if not self._keep and pager.blind:
                # gVisor: statm sees no file page, and a sweep gives nothing back that
                # the next fault would not map again whole (measured on a TPU VM).
                self._keep = True
                why += (
                    "; this kernel does not count a mapping's pages (/proc/self/statm), so "
                    "nothing is measured or given back"
                )
        elif mixture is not None and (self._reader is None or "keep" in candidates):
            # No pager watches a mixture's several mappings: their pages are kept.
            self._keep = copy == "keep" or "keep" in candidates
            if not self._keep:
                why = (
                    "a mixture whose sources are not all files that can be read by "
                    "position: gathered from each array (a mapping's pages kept)"
                )
        elif self._reader is None:
            why = "the tokens are in memory, not a file mapping"
        self.reads_why = why
        self.reads_with = None
        if self._reader is not None:
            self._reads_ahead()
        mapped = (self._pager is not None and self._pager.active) or self._keep
        if mapped and options.ahead and self._gatherer is None:
            self._gatherer = ThreadPoolExecutor(1, "devpolicy-windows")
        if len(candidates) > 1:
            reader = self._reader
            trials = self._trials = PathTrials(
                candidates,
                copy,
                groups=options.trial_groups,
                rounds=options.trial_rounds,
                recheck=options.recheck_seconds,
                source=None if reader is None else (reader.identity, reader.way),
            )
            copy = trials.path  # where an earlier stream of these files settled lately
        self._use("file" if copy == "file" and self._reader is not None else "gather")

    def _use(self, path: str) -> None:
        """Read the groups from now on by `path` ("file" or "gather"); both stay open."""
        self._path = path
        if path == "file":
            self.reads = "file"
        elif (self._pager is not None and self._pager.active) or self._keep:
            self.reads = "mapping"
        else:
            self.reads = "memory"

    def _choose(self, reader: FileWindows | None) -> tuple[str, str, list[str]]:
        """How a file mapping's windows are best copied first, why, and the paths safe
        for it (`reader`: the file opened to read by position, or None where it cannot
        be).

        Reading by position is always safe. Keeping the mapping is safe where the tokens
        fit in the page cache, most of their pages are there (warm), and what they lack
        fits the memory left: a cold file's pages faulted in through a mapping wait on
        the disk one at a time. The first guess: read by position where a group is one
        io_uring call (it outran a kept mapping on an idle host, warm or cold), else keep
        the mapping where that is safe; where both are safe, the stream times both
        (`choosing`). Tokens in memory stay "memory"; a mapping that cannot be read by
        position is gathered within the budget."""
        if reader is None:  # memory (`_open` says so once its pager has looked) or this:
            return (
                "budget",
                "the file this mapping shows cannot be opened to read by position: gathered "
                "from the mapping, its pages given back within the budget",
                ["budget"],
            )
        files = "file" if self._mixture is None else "files"
        by_position = (
            f"read from the {files} by position, a group's windows in one io_uring call"
            if reader.batched
            else f"read from the {files} by position (preadv: no io_uring here)"
        )
        unsafe = self._keep_unsafe(by_position)
        if reader.batched:
            why = f"{by_position} (faster on an idle host than a mapping, warm or cold)"
            return "file", why, ["file"] if unsafe is not None else ["file", "keep"]
        if unsafe is not None:
            return "file", unsafe, ["file"]
        views = [self._view] if self._mixture is None else self._mixture.views
        nbytes = sum(view.nbytes for view in views)
        cached = self._cached(views, nbytes)
        known = "" if cached is None else f", {cached:.0%} of their pages in the page cache"
        return (
            "keep",
            f"the tokens ({format_size(nbytes)}{known}) fit in memory and reading by "
            "position is a system call a window here (no io_uring): gathered from the "
            "mapping, its pages kept while memory allows",
            ["keep", "file"],
        )

    def _keep_unsafe(self, by_position: str) -> str | None:
        """Why keeping the mapping is not safe for these tokens (and they are read
        `by_position`), or None where it is."""
        options = self._options
        views = [self._view] if self._mixture is None else self._mixture.views
        nbytes = sum(view.nbytes for view in views)
        size = format_size(nbytes)
        total = host_total_bytes()
        if total is not None and nbytes > options.keep_of_ram * total:
            return (
                f"the tokens ({size}) are more than {options.keep_of_ram:.0%} of the host's "
                f"{format_size(total)} of RAM: {by_position}"
            )
        cached = self._cached(views, nbytes)
        if cached is not None and cached < options.warm_share:
            return (
                f"{cached:.0%} of the tokens' pages ({size}) are in the page cache: {by_position}"
            )
        room = memory_headroom()
        missing = nbytes * (1.0 - (cached or 0.0))
        if room is not None and missing > options.keep_share * room:
            return (
                f"the {format_size(int(missing))} of the tokens not in the page cache are more "
                f"than {options.keep_share:.0%} of the {format_size(room)} this process can "
                f"still use: {by_position}"
            )
        return None

    @staticmethod
    def _cached(views: list[np.ndarray[Any, Any]], nbytes: int) -> float | None:
        """The share of all the views' pages in the page cache (sampled), or None where
        any file's is unknown."""
        cached: float | None = 0.0
        for view in views:
            share = cached_share(view)
            if share is None or cached is None:
                cached = None
                continue
            cached += share * view.nbytes / max(1, nbytes)
        return cached

    def _memory_allows(self, first: int) -> None:
        """Every `KEEP_CHECK_EVERY` groups of a kept mapping: where the memory the process
        can still use has fallen under `LOW_MEMORY_SHARE` of the host's RAM, give the
        pages back and read by position from now on (or gather within the budget)."""
        self._groups += 1
        if not self._keep or self._groups % self._options.keep_check_every:
            return
        room, total = memory_headroom(), host_total_bytes()
        if room is None or total is None or room >= self._options.low_memory_share * total:
            return
        self._keep = False
        self.reads_why += (
            f"; at step {first} the memory this process can still use fell to "
            f"{format_size(room)}: the mapping's pages given back"
        )
        self._tried_file = True
        self._read_by_position()

    def _file_reader(self) -> FileWindows | None:
        """A reader of the file the tokens map (of every file, for a mixture), or None."""
        mixture, options = self._mixture, self._options
        ring = {"io_uring": options.io_uring, "polled": options.polled}
        if mixture is None:
            return mapped_file(self._view, self._length, **ring)
        return mapped_files(mixture.views, self._length, mixture.bases, **ring)

    def count_sources(self, counts: Callable[[int], dict[str, int]]) -> None:
        """How the stream's tally counts a mixture's windows of each source in its first
        n batches (see `StreamTally.count_sources`)."""
        self._count_sources = counts
        if self.tally is not None:
            self.tally.count_sources = counts

    def own_rows(self) -> int:
        """The rows of a step's global batch, this process's drawn from now on: under
        several processes the rows its devices hold of the global batch, so one seed
        gives every process other windows of one global batch, and a process resumed at a
        step draws the rows it drew. Every process draws the same windows in order."""
        batch = self._batch
        if jax.process_count() == 1 or isinstance(self._sampler, Sequential):
            return batch
        plan = self._shape((batch, self._length, *self._view.shape[1:]))
        if not plan.local:
            return batch
        assert plan.decision.sharding is not None
        rest = (self._length, *self._view.shape[1:])
        rows, per_step = process_rows(plan.decision.sharding, batch, rest)
        self._sampler.own_rows(rows, per_step)
        return per_step

    def _read_by_position(self) -> None:
        """From now on read the windows from the file by position (ahead, where a group is
        one system call): nothing is mapped, so nothing needs giving back. Where the file
        cannot be read so, the stream goes on gathering from the mapping."""
        trials, self._trials = self._trials, None  # no path but this one is safe now
        if trials is not None and trials.decisions:
            self._why = self.reads_why  # what the trials measured, kept
        with deferred_interrupts():
            reader = self._reader or self._file_reader()
            if reader is None:
                return
            self._reader = reader
        self._drop_mapping(sweep=True)
        self._use("file")
        self._reads_ahead()

    def _reads_ahead(self) -> None:
        """A reader that reads a group in one system call reads the next group while this
        one is placed: by a polled ring's kernel thread, or on a worker thread, the GIL
        released for the call."""
        reader = self._reader
        if reader is None or not reader.batched or not self._options.ahead:
            return
        if reader.polled and self._target is None:
            self._kernel_reads = True
        elif self._gatherer is None:
            self._gatherer = ThreadPoolExecutor(1, "devpolicy-windows")
        # Larger groups: a hand-off, and the waits for the GIL, are paid once for
        # more windows.
        self._group = max(self._group, _batches_a_group(self._batch_bytes, READ_GROUP_MAX))

    def _folios_mapped(self) -> bool:
        """Whether the mapping's windows were measured to bring in far more than small
        pages would: the kernel maps each a large folio (a whole 2 MiB)."""
        pager, footprint = self._pager, self._options.large_footprint
        return (
            pager is not None and self._path != "file" and pager.maps_more(self._length, footprint)
        )

    # Cutting a group.

    def start(self, first: int) -> None:
        """Open the read path and start reading the group from step `first` (one batch:
        the first pull waits for no more), so that it is read while the caller does
        whatever comes before that pull."""
        if not self._opened:
            self._open()
        if self._ahead is not None or (self._gatherer is None and not self._kernel_reads):
            return  # tokens in memory: the first cut is a copy
        offsets = self._sampler.take(first, 1)
        if offsets is not None:
            ahead = self._ahead = _Ahead(first, offsets, self._path, None)
            ahead.work = self._start_ahead(offsets)

    def cut(self, first: int) -> tuple[list[Any], int] | None:
        """The batches of the group from step `first`, placed, and their bytes; None past
        the last step.

        The group read ahead is used where it is this one, else waited out and dropped;
        the group after this one is started before this one is placed."""
        if not self._opened:
            self._open()
        trials = self._trials
        began = time.perf_counter() if trials is not None else 0.0
        read_by = self._path
        ahead = self._ahead
        if ahead is not None and (ahead.first != first or ahead.work is None):
            self.settle()  # an interrupted or abandoned cut's group: never trusted
            ahead = None
        if ahead is None:
            # The first: its first batch waits for it, so never a large one.
            offsets = self._sampler.take(first, min(self._group, GROUP_MAX))
            if offsets is None:
                return None
            # Before the thread reads the next: the reader and the pager are never used
            # by two threads at once.
            early = self._gatherer is not None or self._kernel_reads
            into = self._into(offsets)
            gathered = self._made_ready(offsets, into, read_by) if early else None
        else:
            assert ahead.work is not None
            offsets = ahead.offsets
            read_by = ahead.path
            gathered = ahead.work.result()  # what the read raised, raised here
            self._ahead = None
        if self._pager is not None and not self._tried_file and self._folios_mapped():
            self._tried_file = True
            self.reads_why += (
                f"; at step {first} a window was measured to bring in a large folio: "
                "read by position from then on"
            )
            self._read_by_position()  # from the group after this one
        self._memory_allows(first)
        trials = self._trials
        if trials is not None:
            self._next_path(trials, first)
        if self._gatherer is not None or self._kernel_reads:
            following = first + offsets.shape[0]
            # After a first group (one batch, or a few), a group of a few: the first
            # pulls wait for no large read.
            ramp = self._group if offsets.shape[0] >= GROUP_MAX else GROUP_MAX
            starts = self._sampler.take(following, min(self._group, ramp))
            if starts is not None:
                # Recorded before it starts: a Ctrl-C just after the start returns leaves
                # the record without its work, and `settle` then waits for whatever the
                # start began (no signal held back here: under gVisor each change of a
                # handler is a system call, and this runs every group).
                ahead = self._ahead = _Ahead(following, starts, self._path, None)
                ahead.work = self._start_ahead(starts)
        placed = self._cut(offsets, gathered, read_by)
        if trials is not None:  # the trials' names: "file", or "keep" for a gathered group
            way = "file" if read_by == "file" else "keep"
            trials.timed(way, offsets.shape[0], time.perf_counter() - began)
        return placed

    def _next_path(self, trials: PathTrials, first: int) -> None:
        """Between two groups, nothing read ahead: the path its trials say reads the
        next; once a trial settles on reading by position, the mapping's pages the trial
        brought in are given back."""
        before = trials.decisions
        path = "file" if trials.next_path() == "file" else "gather"
        if trials.decisions != before:
            self._trial_step = first
            if path == "file" and self._pager is not None and self._pager.active:
                self._pager.sweep()
        if path != self._path:
            self._use(path)

    def _start_ahead(self, offsets: np.ndarray[Any, Any]) -> Future[Any] | KernelReads:
        """Start the group at `offsets`: read by a polled ring's kernel thread straight
        into its buffer, or read or gathered on the worker thread."""
        into = self._into(offsets)
        reader, path = self._reader, self._path
        if self._kernel_reads and path == "file" and reader is not None and into is not None:
            reader.submit_batches(offsets, into.batches)
            return KernelReads(reader, into)
        assert self._gatherer is not None
        # Weakly: a stream dropped unclosed is collected with a group queued.
        made_ready = weakref.WeakMethod(self._made_ready)
        return self._gatherer.submit(call_weakly, made_ready, offsets, into, path)

    def _into(self, offsets: np.ndarray[Any, Any]) -> GroupBuffer | None:
        """The buffer a group read from the file goes straight into (no copy after), or
        None where it is gathered (a mapping) or narrowed after."""
        if self._path != "file" or self._reader is None or self._target is not None:
            return None
        count, n = offsets.shape
        shape = (n, self._length, *self._view.shape[1:])
        return self._buffer(count, shape, self._shape(shape).reuse)

    def _made_ready(
        self, offsets: np.ndarray[Any, Any], into: GroupBuffer | None, path: str
    ) -> np.ndarray[Any, Any] | GroupBuffer:
        """The group at `offsets` read into `into`, or gathered by `path` (on the worker
        thread: the path is the one the group was started with)."""
        if into is None:
            return self._gather(offsets, path)
        assert self._reader is not None
        self._reader.read_batches(offsets, into.batches)
        return into

    def _gather(self, offsets: np.ndarray[Any, Any], path: str) -> np.ndarray[Any, Any]:
        """The windows at `offsets` read from the file by position ("file"), or gathered
        from memory (a mapping's pages kept, or given back)."""
        reader = self._reader
        if path == "file" and reader is not None:  # batched reads: the GIL released
            read = np.empty((*offsets.shape, *self._windows.shape[1:]), self._view.dtype)
            reader.read(offsets, read)
            return read
        if self._mixture is not None:
            return self._mixture.gather(offsets)
        pager = self._pager
        if pager is None or not pager.active or self._keep:
            return self._windows[offsets]  # type: ignore[no-any-return]  # one copy
        budget = self._options.resident_budget if self._budgeted else None
        return pager.gather(self._windows, offsets, budget)

    def _buffer(self, count: int, shape: tuple[int, ...], reuse: bool) -> GroupBuffer:
        """Host memory for a group: the ring's oldest buffer once its transfers are done,
        or a new one (always, for a device that adopts host buffers)."""
        ring = self._ring
        if reuse and len(ring) >= self._buffers:
            oldest = ring.pop(0)
            oldest.ready()
            if oldest.shape == (count, *shape):
                return oldest
        return GroupBuffer(count, shape, self._dtype)

    def _cut(
        self,
        offsets: np.ndarray[Any, Any],
        gathered: np.ndarray[Any, Any] | GroupBuffer | None,
        path: str,
    ) -> tuple[list[Any], int]:
        """The batches at `offsets` (k, n): read from the file by position or gathered
        from memory by `path`, unless `gathered` already (or read into its buffer);
        narrowed, placed."""
        count, n = offsets.shape
        shape = (n, self._length, *self._view.shape[1:])
        plan = self._shape(shape)
        target, reader = self._target, self._reader
        windows: Any  # the group's windows, each batch as it came from the tokens
        if isinstance(gathered, GroupBuffer):  # read ahead straight into its buffer
            buffer = gathered
            windows = buffer.batches
        else:
            buffer = self._buffer(count, shape, plan.reuse)
            if gathered is not None:  # gathered (or read) ahead on the worker thread
                windows = gathered
            elif path == "file" and reader is not None and target is None:  # into the buffer
                windows = buffer.batches
                reader.read_batches(offsets, windows)
            elif (
                self._mixture is not None
                and target is None
                and (whole := buffer.whole()) is not None
            ):
                windows = buffer.batches  # a mixture's sources gathered straight into it
                self._mixture.gather(offsets, whole)
            else:  # 64-bit tokens of a file read into memory of their dtype first
                windows = self._gather(offsets, path)
        if target is not None:
            for out, batch in zip(buffer.batches, windows, strict=True):
                self._narrow_into(batch, out, target)
        elif windows is not buffer.batches:
            for out, batch in zip(buffer.batches, windows, strict=True):
                np.copyto(out, batch)
        nbytes = plan.nbytes * count
        if self._separator is not None:
            placed, tokens = place_documents(plan, buffer, self._separator, self._fields or FIELDS)
        else:
            placed = tokens = plan.place(buffer.batches)
            if self._fields is not None:
                key = self._fields[0]
                placed = [{key: batch} for batch in tokens]
        if plan.reuse and (buffer.checked or not buffer.held_by(tokens)):
            # Reused once its transfers are done; never if a batch holds it.
            buffer.checked = True
            buffer.placed = [weakref.ref(a) for a in tokens]
            self._ring.append(buffer)
        return placed, nbytes

    def _narrow_into(
        self, batch: np.ndarray[Any, Any], out: np.ndarray[Any, Any], target: np.dtype[Any]
    ) -> None:
        """Narrow one 64-bit batch into `out`: refused where values would change (exact),
        else one `narrowed` event per stream (and one more the first time a batch loses)."""
        _, problem = narrow_into(batch, out)
        if problem is not None and self._narrow == "exact":
            raise NarrowingError([(self._name, problem)])
        exact = problem is None
        if not self._narrowed or (not exact and False not in self._narrowed):
            narrowed_event(self._decider.events, self._name, batch, target, exact)
            self._narrowed.add(exact)

    # Ending.

    def settle(self) -> None:
        """Wait out the group being read ahead, whatever its reads gave, and drop it. Until
        it is waited out it stays, so an interrupted wait is waited for again."""
        ahead = self._ahead
        if ahead is None:
            return
        work = ahead.work
        if work is None:  # a start a Ctrl-C cut short: what it began, if anything
            gatherer, reader = self._gatherer, self._reader
            if gatherer is not None:  # one worker, in order: done once this is
                gatherer.submit(int).result()
            if reader is not None:  # a polled ring's reads
                reader.settle()
        elif not work.cancel():
            work.exception()  # waited for; what it raised, nobody needs now
        self._ahead = None

    def _drop_mapping(self, *, sweep: bool, wait: bool = True, child: bool = False) -> None:
        """End the worker thread (waiting for it, with `wait`) and the pager: its advice
        (with `sweep`, its pages too), or in a forked child (`child`) only its descriptor."""
        gatherer, self._gatherer = self._gatherer, None
        if gatherer is not None:
            gatherer.shutdown(wait=wait)
        pager, self._pager = self._pager, None
        if pager is not None:
            if child:
                pager.close_descriptor()
                return
            if sweep:
                pager.sweep()
            pager.close()

    def _drop_reader(self) -> None:
        """Close the reader (its descriptor and ring), keeping how it read for the event."""
        reader, self._reader = self._reader, None
        if reader is not None:
            self.reads_with = reader.way
            reader.close()

    def close(self) -> None:
        """Wait out the group read ahead, end the worker thread, the pager and the reader
        (its descriptor and ring). Nothing is cut after. Safe to call twice."""
        self._opened = True  # never opened again
        try:
            self.settle()
            self._drop_mapping(sweep=False)
        finally:
            self._ring.clear()
            self._drop_reader()

    def abandon(self, *, child: bool = False) -> None:
        """Let go of everything without waiting for anything: for a collected stream (its
        worker holds it weakly, so none runs for it) or a forked child's copy (`child`:
        the worker thread, the ring's reads and the advice are the parent's). This
        process's descriptors are closed."""
        self._opened = True
        self._ahead = None
        self._ring.clear()
        try:
            self._drop_mapping(sweep=False, wait=False, child=child)
        finally:
            self._drop_reader()

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
