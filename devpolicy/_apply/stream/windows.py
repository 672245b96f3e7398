"""Batches of windows sampled from a host array, placed by the policy ahead of use.

The windows are cut from a zero-copy numpy view of the host array (`host_view`), so
offsets past 2**31 work with x64 disabled, and only the batch is ever copied. Everything
that is the same for every batch is done once per stream (`WindowStream`): the decision
(one `placement` event, once per batch shape), the narrowing plan, the ledger's tally, and
one `stream_ended` event with the counts when the stream ends or is closed. Per batch
there is one vectorised gather (a fancy index of a strided 2-D view of the windows), a
copy into a host buffer, and a share of one `device_put`: small batches are sent a group
at a time (up to `GROUP_MAX` batches, `GROUP_BYTES` in all, in one call), which is what
makes the stream faster than a hand loop that sends each batch alone (on this CPU one
`device_put` of 8 batches costs about a third of 8 calls of one; `benchmarks/bench_loop.py`).

Host buffers: `groups` (one per group where the device adopts it, else a small ring).

Where the view is a shared or read-only file mapping, a random stream gathers from it
and gives back what it faulted in with one sweep of the view once about
`RESIDENT_BUDGET` has come in (`paging`; a sequential stream gives back each group's
pages), and the kernel is told a random stream reads at random. On a TPU VM under gVisor
(December 2026), where a `madvise` cost about 100 us, giving pages back block by block
took 84% of a stream's time. Where what a window brings in is measured to be a large
folio (`LARGE_FOOTPRINT`: Linux 6.18, page cache warm, maps a whole 2 MiB folio for each
2 KiB window, and gathers within the budget ran 0.98x the hand loop on the 2-core CPU
machine), the stream reads by position from its second group on, nothing mapped
(`filewindows`). Where io_uring can be had (`batchreads`), a group of up to
`READ_GROUP_MAX` batches is read in one go, straight into its buffer, while the group
before is placed and used: by a polled ring's kernel thread on another core, or in one
call of a plain ring on the worker thread. There the story's 19.09 GiB file fed
21,603-22,013 batches/s, 2.75x the hand loop and 2.76x the double-buffered one, nothing
of the file resident; one `preadv` a window on the stream's thread (the way without
io_uring) fed 9,074-10,379, 1.37-1.64x. The first group stays at `GROUP_MAX` batches: the
first batch waits for its whole group. Where nothing is measured (no statm, or reads of
it dear) windows are counted as small pages bring them in. The TPU VM's statm counts no
file pages, and there one fault maps the whole file (no budget holds; docs/host-arrays.md):
gathering from the mapping ran 3.26x the hand loop, reading by position 1.69x, so it
gathers. The next group is made ready while the current one is used: `ahead`.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import weakref
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeAlias

import jax
import numpy as np

from ..._base.errors import NarrowingError
from ..._base.sizes import format_size
from ..._decide.decider import Decider
from ..._decide.routing import NEVER_MAPPED
from ..._machine.capacity import host_available_bytes
from ..._machine.streams import StreamTally, open_stream
from .ahead import KernelReads, call_weakly
from .filewindows import FileWindows, mapped_file
from .groups import GroupBuffer, GroupPlan
from ..hostview import host_view
from ..narrowing import NARROWER, Narrow, check_mode, narrow_into, narrowed_event
from .paging import Pager
from .prefetch import BatchStream, as_int
from .sampling import Random, Sequential, process_rows
from .state import StreamState, read_state, resumed_step

#: How windows are chosen: in order, or each start drawn at random.
Order: TypeAlias = 'Literal["sequential", "random"]'
ORDERS = ("sequential", "random")

#: Batches sent in one `device_put`, at most, and their bytes at most: a call's fixed cost
#: (about 100 us on this CPU, most of a small batch's time) is shared by the group, and
#: a group stays small beside host and device memory.
GROUP_MAX = 8
GROUP_BYTES = 4 * 2**20
#: Batches read from a file in one group, at most, where a group is read ahead in one
#: system call (`filewindows`, `batchreads`).
READ_GROUP_MAX = 32
#: How windows of a file mapping are copied: "budget" (gathered from the mapping; module
#: docstring) or "file" (read by position: `bench_loop.py --mapped-copy file`).
MAPPED_COPY = "budget"
#: A batch this large or larger is checked against the host's available memory first.
ASK_HOST_FROM = 64 * 2**20
RESIDENT_BUDGET = 256 * 2**20
#: A random stream over a mapping reads by position instead once a window is measured
#: to bring in more than this many times what small pages can (the window and two
#: 64 KiB fault-around blocks): the kernel maps each a large folio (module docstring).
LARGE_FOOTPRINT = 4
#: Whether the next group is made ready while the current one is used (`ahead`; off to measure).
GATHER_AHEAD = True


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
    if number is not None and number < 0:
        raise ValueError(f"windows seed must be >= 0, got {seed!r}")
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
    if first is None or first < 0:
        raise ValueError(f"windows start must be an int >= 0, got {start!r}")
    saved = None if resume is None else read_state(resume)
    if order == "random" and number is None:
        # Drawn here, so that the stream's state can name it and a resume draw the same.
        number = secrets.randbits(63) if saved is None else saved.get("seed")
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
        sampler = Random(starts, batch, number, steps, first)
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
        sampler = Sequential(starts, batch, stride, steps, first)
    return WindowStream(view, length, batch, sampler, decider, name, whole, narrow, state)


class WindowStream(BatchStream[Any]):
    """The placed batches of `devpolicy.windows`: a `BatchStream` whose batches are cut,
    decided and sent by the stream itself, a group at a time, and that can say where it
    is (`state()`) so that a restarted run resumes it there.

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
        "__weakref__",  # the worker thread's work holds the stream weakly
        "_buffers",
        "_dtype",
        "_ended",
        "_gatherer",
        "_group",
        "_handed",
        "_kernel_reads",
        "_length",
        "_narrowed",
        "_pager",
        "_pending",
        "_reader",
        "_reads",
        "_reads_with",
        "_ring",
        "_sampler",
        "_shapes",
        "_state",
        "_tally",
        "_target",
        "_tried_file",
        "_view",
        "_windows",
    )

    def __init__(
        self,
        view: np.ndarray[Any, Any],
        length: int,
        batch: int,
        sampler: Random | Sequential,
        decider: Decider,
        name: str,
        size: int,
        narrow: Narrow,
        state: StreamState,
    ) -> None:
        super().__init__(iter(()), name, size, decider, narrow)
        self._state = state
        self._source = None
        self._in_flight = deque()
        self._view = view
        self._length = length
        self._sampler = sampler
        # Every window as a row of a 2-D (starts, length, ...) view: one fancy index
        # gathers a whole group, with numpy's 64-bit offsets.
        starts = view.shape[0] - length + 1
        self._windows = np.lib.stride_tricks.as_strided(
            view,
            shape=(starts, length, *view.shape[1:]),
            strides=(view.strides[0], *view.strides),
            writeable=False,
        )
        # Narrowed once per batch where x64 is off and the tokens are 64-bit.
        x64 = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
        self._target: np.dtype[Any] | None = None if x64 else NARROWER.get(view.dtype)
        self._dtype: np.dtype[Any] = self._target or view.dtype
        self._group = self._batches_a_group(GROUP_MAX)
        # The next group of a file mapping, being gathered on `_gatherer`'s thread.
        self._pending: tuple[np.ndarray[Any, Any], Future[Any] | KernelReads] | None = None
        self._gatherer: ThreadPoolExecutor | None = None
        self._shapes: dict[tuple[int, ...], GroupPlan] = {}
        self._ring: deque[GroupBuffer] = deque()
        self._buffers = -(-size // self._group) + 2  # groups in flight, in use, being cut
        self._pager: Pager | None = None  # made at the first batch, for a mapped view
        self._reader: FileWindows | None = None  # or this, for a file read by position
        self._reads = "memory"  # how windows are copied: "file", "mapping" or "memory"
        self._reads_with: str | None = None  # for "file": the reader's way, once it closed
        self._tried_file = False  # whether reading by position was tried mid-stream
        self._kernel_reads = False  # whether the next group is read by a polled ring
        self._tally: StreamTally | None = None
        self._narrowed: set[bool] = set()  # the exactness already reported
        self._handed = 0
        self._ended = False

    def _shape(self, shape: tuple[int, ...]) -> GroupPlan:
        found = self._shapes.get(shape)
        if found is None:
            decider = self._decider
            nbytes = math.prod(shape) * self._dtype.itemsize
            # As `put(name, batch)` decides one leaf; a process-local part's shape says
            # nothing of the global one across processes.
            known = None if jax.process_count() > 1 else shape
            (decision,) = decider.resolve_many([(self._name, nbytes, known, NEVER_MAPPED)])
            found = self._shapes[shape] = GroupPlan(decision, nbytes, decider.disabled)
            if self._tally is None:
                self._tally = open_stream(
                    self._name, decision.origin, decision.rule, decision.device_text
                )
        return found

    def _own_rows(self) -> None:
        """Several processes: this process draws its own rows of the global batch (the
        rows its devices hold of it), so one seed gives every process other windows of
        one global batch, and a process resumed at a step draws the rows it drew."""
        batch = self._state.batch
        plan = self._shape((batch, self._length, *self._view.shape[1:]))
        if plan.local:
            assert plan.decision.sharding is not None
            rest = (self._length, *self._view.shape[1:])
            rows, per_step = process_rows(plan.decision.sharding, batch, rest)
            self._sampler.own_rows(rows, per_step)

    def _buffer(self, count: int, shape: tuple[int, ...], reuse: bool) -> GroupBuffer:
        """Host memory for a group: the ring's oldest buffer once its transfers are done,
        or a new one (always, for a device that adopts host buffers)."""
        ring = self._ring
        if reuse and len(ring) >= self._buffers:
            oldest = ring.popleft()
            oldest.ready()
            if oldest.shape == (count, *shape):
                return oldest
        return GroupBuffer(count, shape, self._dtype)

    def _gather(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The windows at `offsets` read from the file by position, or gathered from
        memory (a mapping's pages given back)."""
        reader = self._reader
        if reader is not None:  # batched reads (`_reads_ahead`): the GIL released
            read = np.empty((*offsets.shape, *self._windows.shape[1:]), self._view.dtype)
            reader.read(offsets, read)
            return read
        pager = self._pager
        if pager is None or not pager.active:
            return self._windows[offsets]  # type: ignore[no-any-return]  # one copy
        budgeted = MAPPED_COPY == "budget" and self._sampler.random
        return pager.gather(self._windows, offsets, RESIDENT_BUDGET if budgeted else None)

    def _cut_group(self) -> list[Any] | None:
        """The next group's batches placed (None at the end): from a file, made ready while
        the one before was used (`ahead`), the one after it started before it is placed."""
        pending = self._pending  # kept until done: a stop meanwhile waits for it
        if pending is None:  # the first: its first batch waits for it, so never a large one
            offsets = self._sampler.take(min(self._group, GROUP_MAX))
            if offsets is None:
                return None
            # Before the thread gathers the next: the pager is never used by two at once.
            ahead = self._gatherer is not None or self._kernel_reads
            gathered = self._ahead(offsets, self._into(offsets)) if ahead else None
        else:
            offsets, future = pending
            gathered = future.result()
            self._pending = None
        if self._pager is not None and not self._tried_file and self._folios_mapped():
            self._tried_file = True
            self._read_by_position()  # from the group after this one
        if self._gatherer is not None or self._kernel_reads:
            following = self._sampler.take(self._group)
            if following is not None:
                self._pending = (following, self._start_ahead(following))
        return self._cut(offsets, gathered)

    def _start_ahead(self, offsets: np.ndarray[Any, Any]) -> Future[Any] | KernelReads:
        """Start the group at `offsets`: read by a polled ring's kernel thread straight
        into its buffer, or read or gathered on the worker thread."""
        into = self._into(offsets)
        reader = self._reader
        if self._kernel_reads and reader is not None and into is not None:
            reader.submit_batches(offsets, into.batches)
            return KernelReads(reader, into)
        assert self._gatherer is not None
        # Weakly: a stream dropped unclosed is collected with a group queued.
        ahead = weakref.WeakMethod(self._ahead)
        return self._gatherer.submit(call_weakly, ahead, offsets, into)

    def _into(self, offsets: np.ndarray[Any, Any]) -> GroupBuffer | None:
        """The buffer a group read from the file goes straight into (no copy after), or
        None where it is gathered (a mapping) or narrowed after."""
        if self._reader is None or self._target is not None:
            return None
        count, n = offsets.shape
        shape = (n, self._length, *self._view.shape[1:])
        return self._buffer(count, shape, self._shape(shape).reuse)

    def _ahead(
        self, offsets: np.ndarray[Any, Any], into: GroupBuffer | None
    ) -> np.ndarray[Any, Any] | GroupBuffer:
        """The group at `offsets` read into `into`, or gathered (on the worker thread)."""
        if into is None:
            return self._gather(offsets)
        assert self._reader is not None
        self._reader.read_batches(offsets, into.batches)
        return into

    def _folios_mapped(self) -> bool:
        """Whether the mapping's windows were measured to bring in far more than small
        pages would: the kernel maps each a large folio (a whole 2 MiB)."""
        return self._pager is not None and self._pager.maps_more(self._length, LARGE_FOOTPRINT)

    def _read_by_position(self) -> None:
        """From now on read the windows from the file by position (ahead, where a group is
        one system call): nothing is mapped, so nothing needs giving back. Where the file
        cannot be read so, the stream goes on gathering from the mapping."""
        reader = mapped_file(self._view, self._length)
        if reader is None:
            return
        self._drop_mapping(sweep=True)
        self._reader = reader
        self._reads = "file"
        self._reads_ahead()

    def _reads_ahead(self) -> None:
        """A reader that reads a group in one system call reads the next group while this
        one is placed: by a polled ring's kernel thread, or on a worker thread, the GIL
        released for the call (module docstring)."""
        reader = self._reader
        if reader is None or not reader.batched or not GATHER_AHEAD:
            return
        if reader.polled and self._target is None:
            self._kernel_reads = True
        elif self._gatherer is None:
            self._gatherer = ThreadPoolExecutor(1, "devpolicy-windows")
        # Larger groups: a hand-off, and the waits for the GIL, are paid once for
        # more windows.
        self._group = max(self._group, self._batches_a_group(READ_GROUP_MAX))

    def _batches_a_group(self, most: int) -> int:
        """Batches sent in one group: `most`, fewer where they pass `GROUP_BYTES`."""
        row = self._dtype.itemsize * int(math.prod(self._view.shape[1:]))
        nbytes = self._length * self._state.batch * row
        return max(1, min(most, GROUP_BYTES // max(1, nbytes)))

    def _drop_mapping(self, *, sweep: bool, wait: bool = False) -> None:
        """End the worker thread and the pager (its advice; with `sweep`, its pages)."""
        gatherer, self._gatherer = self._gatherer, None
        if gatherer is not None:
            gatherer.shutdown(wait=wait)
        pager, self._pager = self._pager, None
        if pager is not None:
            if sweep:
                pager.sweep()
            pager.close()

    def _cut(
        self,
        offsets: np.ndarray[Any, Any],
        gathered: np.ndarray[Any, Any] | GroupBuffer | None = None,
    ) -> list[Any]:
        """The batches at `offsets` (k, n): read from the file by position, or gathered
        from memory (a mapping's pages given back) unless `gathered` already (or read into
        its buffer); narrowed, placed."""
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
            elif reader is not None and target is None:  # straight into the buffer
                windows = buffer.batches
                reader.read_batches(offsets, windows)
            else:  # 64-bit tokens of a file read into memory of their dtype first
                windows = self._gather(offsets)
        if target is not None:
            for out, batch in zip(buffer.batches, windows, strict=True):
                self._narrow_into(batch, out, target)
        elif windows is not buffer.batches:
            for out, batch in zip(buffer.batches, windows, strict=True):
                np.copyto(out, batch)
        placed = plan.place(buffer.batches)
        if plan.reuse and (buffer.checked or not buffer.held_by(placed)):
            # Reused once its transfers are done; never if a batch holds it.
            buffer.checked = True
            buffer.placed = [weakref.ref(a) for a in placed]
            self._ring.append(buffer)
        assert self._tally is not None
        self._tally.add(placed, plan.nbytes * count)
        return placed

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

    def _fill(self, in_flight: deque[Any]) -> None:
        if self._tally is None and self._pulling and jax.process_count() > 1:
            self._own_rows()
        if self._pager is None and self._reader is None and self._pulling:
            if MAPPED_COPY == "file":
                self._reader = mapped_file(self._view, self._length)
            if self._reader is not None:
                self._reads = "file"
                self._reads_ahead()
            else:
                self._pager = Pager(self._view, random=self._sampler.random)
                if self._pager.active:
                    self._reads = "mapping"
                    if GATHER_AHEAD:
                        self._gatherer = ThreadPoolExecutor(1, "devpolicy-windows")
        while self._pulling and len(in_flight) < self._size:
            placed = self._cut_group()
            if placed is None:
                self._stop()
                return
            in_flight.extend(placed)

    def _stop(self, *, collected: bool = False) -> None:
        """No more batches will be cut: end the paging advice now (not at collection)."""
        self._pulling = False
        # The group in flight ends before the pager and reader close. Collected, no worker
        # runs for the stream (its work holds it): a queued one is cancelled; `close` waits.
        pending, self._pending = self._pending, None
        try:
            if pending is not None and not pending[1].cancel() and not collected:
                pending[1].exception()  # waited for; what it raised, nobody needs now
            self._drop_mapping(sweep=False, wait=not collected)
        finally:
            reader, self._reader = self._reader, None
            if reader is not None:
                self._reads_with = reader.way
                reader.close()

    def __next__(self) -> Any:
        in_flight = self._in_flight
        assert in_flight is not None
        if len(in_flight) < self._size and self._pulling:
            self._fill(in_flight)
        if in_flight:
            current = in_flight.popleft()
            self._handed += 1
            if len(in_flight) < self._size and self._pulling:
                self._fill(in_flight)
            return current
        self._end("ended", [])
        raise StopIteration

    def _end(self, how: str, dropped: list[Any]) -> None:
        """The stream's one `stream_ended` event, and its tally closed; once."""
        if self._ended:
            return
        self._ended = True
        self._stop()
        tally = self._tally
        if tally is None:
            return  # nothing was ever cut: nothing to say
        tally.close()
        events = self._decider.events
        # Every stream's end at info, also for a name seen before (a warm-up stream):
        # one event a stream, its counts its own.
        if events.enabled("info"):
            events.emit(
                "info",
                "stream_ended",
                {
                    "name": tally.name,
                    "how": how,
                    "batches": self._handed,
                    "nbytes": tally.nbytes - sum(a.nbytes for a in dropped),
                    "dropped": len(dropped),
                    "device": tally.device,
                    "origin": tally.origin,
                    "reads": self._reads,
                    "reads_with": self._reads_with,
                },
            )

    def __del__(self) -> None:
        # A stream dropped unclosed ends its paging advice and closes its file, as its
        # generator's `finally` did (no event: logging from a collection is not safe).
        # No module global here: at interpreter exit they may already be None.
        try:  # noqa: SIM105 - a finaliser never raises; no contextlib (a module global)
            self._stop(collected=True)
        except Exception:
            pass

    def state(self) -> dict[str, Any]:
        """Where the stream is: the next batch it hands out (`step`) and every argument
        that decides its batches, as plain JSON-able values.

        Save it beside a checkpoint (`json.dumps` it into `save_file`'s metadata); after
        a restart, `devpolicy.windows(tokens, ..., resume=state)` with the same arguments
        yields exactly the batches this stream would have yielded from `step` on.
        Batches already sent ahead but not handed out are not counted: they come again.

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
        step = self._state.step + self._handed
        return dataclasses.replace(self._state, step=step).saved()

    def close(self) -> None:
        """Drop the batches in flight and end the stream (its paging advice included).
        Closing again does nothing; the stream then yields nothing more."""
        dropped = list(self._in_flight or ())
        self._in_flight = deque()
        self._ring.clear()
        self._end("closed", dropped)
