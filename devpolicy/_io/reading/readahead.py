"""What the loader reads next, read while what it read last is placed: a run of small
tensors, or a large tensor read whole.

Small tensors that lie back to back in the file are read as one run: one scattered
`preadv` of a local file, each tensor into its own aligned slot of one buffer (a source
without a descriptor reads the same slots with `read_many`). A large tensor that is
neither mapped, sharded nor packed is read whole (`whole.read_tensor`). The next run or
large tensor is read on a second thread while this one is sent to its device, so the disk
(or the network) and the link to the device are busy at once. Each run or large tensor
read is a `devpolicy.load_file.read` span in the profiler's trace, on the thread that
read it (`_machine/spans`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.limits import ALIGN, CHUNK_BYTES
from ..._decide.decision import Decision
from ..._machine.spans import LOAD_READ, span
from ..._read.exact import read_at
from ..format.header import Header, TensorEntry
from ..format.sources import ByteSource, SourceEndedError, os_error
from .buffers import MAP_THRESHOLD, host_buffer
from .map_or_read import NARROW, may_map, sends_from_map
from .tensor_reads import read_tensor

_READ_BATCH = 1024  # tensors per scattered read (Linux's IOV_MAX)


def _read_in_runs(entry: TensorEntry, decision: Decision, mmap: bool | None, x64: bool) -> bool:
    """Whether the loader reads a tensor as part of a run of small ones: small, and
    neither packed (unpacked on its own), sharded (read slice by slice) nor mapped."""
    narrowed = not x64 and entry.dtype_name in NARROW  # narrowing reads, never maps
    return (
        entry.nbytes < MAP_THRESHOLD
        and not entry.packed
        and decision.mesh is None
        and (narrowed or not may_map(entry, decision, mmap))
        and not sends_from_map(entry, decision, mmap, x64)
    )


def reads_whole(entry: TensorEntry, decision: Decision, mmap: bool | None, x64: bool) -> bool:
    """Whether the loader reads a tensor whole, on its own: large, and neither packed
    (unpacked on its own), sharded (read slice by slice) nor mapped."""
    narrowed = not x64 and entry.dtype_name in NARROW  # narrowing reads, never maps
    return (
        entry.nbytes >= MAP_THRESHOLD
        and not entry.packed
        and decision.mesh is None
        and (narrowed or not may_map(entry, decision, mmap))
        and not sends_from_map(entry, decision, mmap, x64)
    )


def small_run(
    header: Header,
    decisions: list[Decision],
    order: list[int],
    start: int,
    mmap: bool | None,
    x64: bool,
) -> list[int]:
    """Tensors from `order[start]` on that are small, not mapped and back to back in the
    file, up to one batch: they are read with one system call."""
    run = [order[start]]
    end = header.tensors[order[start]].offset + header.tensors[order[start]].nbytes
    nbytes = header.tensors[order[start]].nbytes
    # Indexed, not `order[start + 1:]`: a slice copies the rest of the file's order on
    # every run, which made many small tensors quadratic (400,000 took 197 s).
    for position in range(start + 1, len(order)):
        i = order[position]
        entry = header.tensors[i]
        if (
            not _read_in_runs(entry, decisions[i], mmap, x64)
            or entry.offset != end
            or len(run) >= _READ_BATCH
            or nbytes + entry.nbytes > CHUNK_BYTES
        ):
            break
        run.append(i)
        end += entry.nbytes
        nbytes += entry.nbytes
    return run


class ReadAhead:
    """Runs of small tensors and large tensors read whole, each read while the one before
    it is placed: the next one's read is started on a second thread as one is handed out.

    A read into fresh memory is mostly the kernel faulting in pages (the GIL released);
    placing is JAX's per-array work in Python and, for an accelerator, the transfer. On
    two cores they overlap: 10,000 tensors of 1-64 KiB loaded in 1.10-1.36 s against
    1.62-1.93 s without (interleaved runs). At most one run or tensor is read ahead, so
    host staging grows by at most one large tensor (or one run, up to `CHUNK_BYTES`).
    `advance` moves the progress bar as a large tensor is read (from the reading thread).
    """

    def __init__(
        self,
        source: ByteSource,
        header: Header,
        decisions: list[Decision],
        order: list[int],
        mmap: bool | None,
        x64: bool,
        advance: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self._source, self._header, self._decisions = source, header, decisions
        self._order, self._mmap, self._x64 = order, mmap, x64
        self._advance = advance
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future[Any]] | None = None

    def run_at(self, position: int) -> _Run:
        """The run of small tensors starting at `order[position]`, read."""
        found = cast("_Run", self._take(position, self._read))
        self._ahead(position + len(found[0]))
        return found

    def tensor_at(self, position: int) -> np.ndarray[Any, Any]:
        """The large tensor at `order[position]`, read whole (`reads_whole`)."""
        found = cast("np.ndarray[Any, Any]", self._take(position, self._read_whole))
        self._ahead(position + 1)
        return found

    def _take(self, position: int, read: Callable[[int], Any]) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == position:
            return pending[1].result()  # a read error is raised here, where it belongs
        if pending is not None:
            _settled(pending[1])
        return read(position)

    def _ahead(self, following: int) -> None:
        """Start reading what is at `order[following]`, if the loader reads it here."""
        if following >= len(self._order):
            return
        i = self._order[following]
        entry, decision = self._header.tensors[i], self._decisions[i]
        if _read_in_runs(entry, decision, self._mmap, self._x64):
            read: Callable[[int], Any] = self._read
        elif reads_whole(entry, decision, self._mmap, self._x64):
            read = self._read_whole
        else:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "devpolicy-read-ahead")
        self._pending = (following, self._pool.submit(read, following))

    def _read(self, position: int) -> _Run:
        header, order = self._header, self._order
        run = small_run(header, self._decisions, order, position, self._mmap, self._x64)
        nbytes = sum(header.tensors[i].nbytes for i in run)
        with span(LOAD_READ, file=header.path.name, tensors=len(run), bytes=nbytes):
            return run, _read_run(self._source, header, run)

    def _read_whole(self, position: int) -> np.ndarray[Any, Any]:
        header = self._header
        entry = header.tensors[self._order[position]]
        with span(LOAD_READ, file=header.path.name, tensors=1, bytes=entry.nbytes):
            return read_tensor(self._source, header, entry, self._advance)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        # The file is closed after this: no read may still be running on it.
        if self._pending is not None:
            _settled(self._pending[1])
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)


#: A run of small tensors: their positions in the header, and their arrays.
_Run = tuple[list[int], list[np.ndarray[Any, Any]]]


def _settled(future: Future[Any]) -> None:
    """Wait for a read ahead that is no longer wanted; its error, if any, is not ours."""
    if not future.cancel():
        with contextlib.suppress(Exception):
            future.result()


def _read_run(source: ByteSource, header: Header, run: list[int]) -> list[np.ndarray[Any, Any]]:
    """Read back-to-back tensors, each into its own 64-byte-aligned slot of one buffer (so
    host-bound ones are adopted without a copy): one scattered read of a local file."""
    entries = [header.tensors[i] for i in run]
    starts = []
    size = 0
    for entry in entries:
        starts.append(size)
        size += -(-entry.nbytes // ALIGN) * ALIGN
    buffer = host_buffer(header, entries[0].key, max(size, 1))
    whole = memoryview(buffer)  # type: ignore[arg-type]
    views = [whole[s : s + e.nbytes] for s, e in zip(starts, entries, strict=True)]
    fd = source.fileno()
    if fd is not None:
        _scattered_read(fd, header, entries, views)
    else:
        _read_slots(source, header, entries, views)
    # One constructor per tensor over the shared buffer: no intermediate views.
    return [
        np.ndarray(e.shape, e.dtype, buffer=buffer, offset=s)
        for s, e in zip(starts, entries, strict=True)
    ]


def _scattered_read(
    fd: int, header: Header, entries: list[TensorEntry], views: list[memoryview]
) -> None:
    """Fill `views` from the file's bytes of back-to-back `entries` with `preadv` calls,
    resuming after a partial read."""
    total = sum(e.nbytes for e in entries)
    try:
        done = read_at(fd, views, entries[0].offset)
    except OSError as e:
        raise os_error(header.path, e, "cannot read", tensor=entries[0].key) from None
    if done < total:
        raise _run_ended(header, entries, done, total)


def _read_slots(
    source: ByteSource, header: Header, entries: list[TensorEntry], views: list[memoryview]
) -> None:
    """Fill `views` through a source without a descriptor: one batch of its own reads (it
    may join the adjacent ranges into one request)."""
    try:
        source.read_many([(e.offset, v) for e, v in zip(entries, views, strict=True)])
    except SourceEndedError as e:
        total = sum(e.nbytes for e in entries)
        raise _run_ended(header, entries, e.end - entries[0].offset, total) from None
    except OSError as e:
        raise os_error(header.path, e, "cannot read", tensor=entries[0].key) from None


def _run_ended(
    header: Header, entries: list[TensorEntry], done: int, total: int
) -> SafetensorsFileError:
    return SafetensorsFileError(
        header.path,
        f"file ended after {done} of {total} bytes of a run of tensors: truncated?",
        tensor=entries[0].key,
    )
