"""Many positional reads of one file in one system call, or none (Linux io_uring).

Reading by position (`positional`) one `preadv` a window, each call entered and left holding
the GIL, overlaps nothing of the stream's own work (a worker thread of them lost). io_uring
queues a group's reads in a ring shared with the kernel (a few numpy assignments): a polled
ring's kernel thread reads them on another core while the stream places the group before (the
cost: a core busy `POLL_IDLE_MS` after the last read), a plain ring in one `io_uring_enter`
through ctypes with the GIL released
(measured: docs/benchmarks.md#the-stream-wings-choices-as-measured).

No library: the ABI is four structures and two system calls, stable since Linux 5.6, and its
Python bindings are compiled extensions. Where io_uring cannot be had (another OS or
architecture, a kernel before 5.6, `kernel.io_uring_disabled`, seccomp, gVisor),
`BatchReads.open` returns None and the caller uses `preadv`; where a polled ring cannot (before
5.11, aarch64's store order, one core), a plain one; a ring whose features say it could not
read is not used. A short or failed read is the caller's to redo (`wait` returns each result),
as a `preadv` would report it. Reads in flight write into the caller's buffers: nothing leaves
`submit` or `wait` with reads in flight (a signal only restarts the wait), `close` waits for
them, and a ring that could not wait keeps the buffer alive for good. One thread at a time
(`close` waits for a `wait`), and only in the process that opened it: a forked child's copy
refuses to read (`usable`) and its reader uses `preadv`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._base.libc import linux_function

# System call numbers: io_uring came after the generic syscall table was unified, so they
# are the same on x86_64 and aarch64 (not on every architecture: those are left out).
_SETUP, _ENTER = 425, 426
_MACHINES = frozenset({"x86_64", "amd64", "aarch64", "arm64"})
# A polled ring's kernel thread reads the queue while this thread writes it: x86's stores
# reach other CPUs in program order (SQEs before the tail); elsewhere a barrier would be
# needed that Python cannot issue, so only plain rings (the system call orders them).
_POLLED_MACHINES = frozenset({"x86_64", "amd64"})
_OP_READ = 22  # IORING_OP_READ, Linux 5.6
_SETUP_SQPOLL = 2
_ENTER_GETEVENTS, _ENTER_SQ_WAKEUP = 1, 2
_SQ_NEED_WAKEUP = 1
_FEAT_SINGLE_MMAP = 1
_FEAT_RW_CUR_POS = 8  # Linux 5.6, with IORING_OP_READ
_FEAT_SQPOLL_NONFIXED = 128  # Linux 5.11: a polled ring reads descriptors not registered
# Consecutive calls that failed with EAGAIN (no memory for the work, under a cgroup's
# limit) before the ring gives up and raises.
_RETRIES = 10_000
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_U32 = 0xFFFFFFFF
#: Reads queued at once, at most (the ring's size); more are queued as these finish.
ENTRIES = 1024
#: How long a polled ring's kernel thread looks for more reads before it sleeps (ms;
#: 0 would be the kernel's default, a second of a busy core).
POLL_IDLE_MS = 1

_SQE = np.dtype(
    {
        "names": ["opcode", "flags", "ioprio", "fd", "off", "addr", "len", "rw_flags", "user_data"],
        "formats": ["u1", "u1", "<u2", "<i4", "<u8", "<u8", "<u4", "<u4", "<u8"],
        "offsets": [0, 1, 2, 4, 8, 16, 24, 28, 32],
        "itemsize": 64,
    }
)
_CQE = np.dtype(
    {"names": ["user_data", "res"], "formats": ["<u8", "<i4"], "offsets": [0, 8], "itemsize": 16}
)


class _Params(ctypes.Structure):
    """`struct io_uring_params`: the ring's sizes and flags in, its layout out."""

    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        # io_sqring_offsets: head, tail, ring_mask, ring_entries, flags, dropped, array, resv1,
        # user_addr (u64); io_cqring_offsets: head, tail, ring_mask, ring_entries, overflow,
        # cqes, flags, resv1, user_addr (u64).
        ("sq_off", ctypes.c_uint32 * 10),
        ("cq_off", ctypes.c_uint32 * 10),
    ]


#: libc's `syscall`, or None where io_uring is not tried (not Linux, another CPU).
_SYSCALL: Any = (
    linux_function("syscall", ctypes.c_long) if platform.machine().lower() in _MACHINES else None
)


def _cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Buffers a broken ring could not wait for: kept alive, so late reads land in them.
_ABANDONED: list[Any] = []


@dataclass
class _Job:
    """The reads of one `submit`: queued a ring's worth at a time."""

    fd: int | np.ndarray[Any, Any]  # one file, or one a read
    positions: np.ndarray[Any, Any]
    addresses: np.ndarray[Any, Any]
    size: int | np.ndarray[Any, Any]  # one size for all, or one a read
    into: object  # what holds the memory read into, alive until the reads are done
    results: np.ndarray[Any, Any]
    queued: int = 0  # reads queued so far
    done: int = 0  # reads completed so far
    failures: int = 0  # calls in a row that failed with EAGAIN or EBUSY


class BatchReads:
    """One io_uring: many positional reads of a file in one system call, or none.

    `submit` queues the reads and returns; `wait` returns their results once all are
    done. On a polled ring (`polled`) a kernel thread takes the reads
    from the queue and does them on another core while this thread goes on; on a plain
    one, `submit` does them in its system call.

    Example:
        >>> import tempfile, numpy as np
        >>> out = np.zeros(4, np.uint8)
        >>> with tempfile.TemporaryFile() as f:
        ...     _ = f.write(bytes(range(10)))
        ...     f.flush()
        ...     reads = BatchReads.open()
        ...     if reads is None:  # no io_uring here: what the reads would have given
        ...         out[:] = [0, 1, 7, 8]
        ...     else:
        ...         at = np.array([out.ctypes.data, out.ctypes.data + 2], np.uint64)
        ...         reads.submit(f.fileno(), np.array([0, 7]), at, 2, out)
        ...         results = reads.wait()
        ...         reads.close()
        >>> out.tolist()
        [0, 1, 7, 8]
    """

    __slots__ = (
        "_cq",
        "_cq_head",
        "_cq_tail",
        "_done",
        "_fd",
        "_job",
        "_lock",
        "_maps",
        "_pid",
        "_sq_array",
        "_sq_flags",
        "_sq_head",
        "_sq_tail",
        "_sqes",
        "_tail",
        "polled",
    )

    def __init__(self, fd: int, params: _Params) -> None:
        self._fd = fd
        self._maps: list[mmap.mmap] = []
        self._job: _Job | None = None
        # The last job waited for, or waited out by an interrupted `wait`: `wait` gives its
        # results again until the next `submit` (a signal may land just after `wait`
        # returned, before its caller kept them).
        self._done: _Job | None = None
        # One thread at a time: `close` from another waits for a `wait` in progress.
        self._lock = threading.RLock()
        # A forked child shares the ring's memory (and a polled ring's thread reads in the
        # parent's address space): only the process that opened it uses it.
        self._pid = os.getpid()
        self.polled = bool(params.flags & _SETUP_SQPOLL)
        sq, cq = list(params.sq_off), list(params.cq_off)
        sq_bytes = sq[6] + params.sq_entries * 4
        cq_bytes = cq[5] + params.cq_entries * _CQE.itemsize
        shared = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        both = mmap.PROT_READ | mmap.PROT_WRITE
        if params.features & _FEAT_SINGLE_MMAP:
            sq_map = cq_map = self._map(max(sq_bytes, cq_bytes), shared, both, _OFF_SQ_RING)
        else:
            sq_map = self._map(sq_bytes, shared, both, _OFF_SQ_RING)
            cq_map = self._map(cq_bytes, shared, both, _OFF_CQ_RING)
        sqe_map = self._map(params.sq_entries * _SQE.itemsize, shared, both, _OFF_SQES)
        self._sq_head = np.frombuffer(sq_map, np.uint32, 1, sq[0])
        self._sq_tail = np.frombuffer(sq_map, np.uint32, 1, sq[1])
        self._sq_flags = np.frombuffer(sq_map, np.uint32, 1, sq[4])
        self._sq_array = np.frombuffer(sq_map, np.uint32, params.sq_entries, sq[6])
        self._cq_head = np.frombuffer(cq_map, np.uint32, 1, cq[0])
        self._cq_tail = np.frombuffer(cq_map, np.uint32, 1, cq[1])
        self._cq = np.frombuffer(cq_map, _CQE, params.cq_entries, cq[5])
        self._sqes = np.frombuffer(sqe_map, _SQE, params.sq_entries)
        self._sqes["opcode"] = _OP_READ
        self._tail = int(self._sq_tail[0])

    def _map(self, size: int, flags: int, prot: int, offset: int) -> mmap.mmap:
        # Each map holds a descriptor of its own (Python's mmap duplicates it), which keeps
        # the ring alive after `close`: `_unmap` closes them.
        mapped = mmap.mmap(self._fd, size, flags, prot, offset=offset)
        self._maps.append(mapped)
        return mapped

    def _unmap(self) -> None:
        """Let go of the arrays over the ring's maps, then the maps (and their descriptors)."""
        empty = np.empty(0, np.uint32)
        self._sq_head = self._sq_tail = self._sq_flags = self._sq_array = empty
        self._cq_head = self._cq_tail = empty
        self._cq = np.empty(0, _CQE)
        self._sqes = np.empty(0, _SQE)
        maps, self._maps = self._maps, []
        for mapped in maps:
            # A view of it still held: it closes when that goes.
            with contextlib.suppress(BufferError):
                mapped.close()

    @classmethod
    def open(cls, entries: int = ENTRIES, *, polled: bool = True) -> BatchReads | None:
        """A ring of `entries` reads, polled by a kernel thread where the kernel allows
        (Linux 5.11 for a process without privileges) and `polled`; None where io_uring
        cannot be had here."""
        if _SYSCALL is None:
            return None
        # A polled ring's thread needs a core of its own: with one, it would take turns
        # with the reader it serves.
        polled = polled and platform.machine().lower() in _POLLED_MACHINES and _cores() > 1
        kinds = [_SETUP_SQPOLL, 0] if polled else [0]
        for flags in kinds:
            params = _Params()
            params.flags = flags
            params.sq_thread_idle = POLL_IDLE_MS
            fd = int(_SYSCALL(_SETUP, ctypes.c_uint(entries), ctypes.byref(params)))
            if fd < 0:
                continue  # ENOSYS, EPERM (disabled, seccomp, old kernel), ENOMEM...
            # A ring that could not read: before 5.6 no IORING_OP_READ (every read would
            # fail with EINVAL); a polled one before 5.11 reads only registered files.
            needed = _FEAT_RW_CUR_POS | (_FEAT_SQPOLL_NONFIXED if flags else 0)
            if params.features & needed != needed:
                os.close(fd)
                continue
            try:
                return cls(fd, params)
            except (OSError, ValueError):
                os.close(fd)
        return None

    @property
    def usable(self) -> bool:
        """Whether this process may read with it (open, and not a forked child's copy)."""
        return self._fd >= 0 and self._pid == os.getpid()

    def submit(
        self,
        fd: int | np.ndarray[Any, Any],
        positions: np.ndarray[Any, Any],
        addresses: np.ndarray[Any, Any],
        size: int | np.ndarray[Any, Any],
        into: object,
    ) -> None:
        """Start reading `size` bytes (one size, or one a read) at each of `positions`
        (file offsets) of `fd` (one descriptor, or one a read) to the memory at the same
        index of `addresses`, which
        `into` holds (kept alive until the reads are done). One submission at a time:
        `wait` for it before the next."""
        with self._lock:
            if not self.usable:
                raise ValueError("this ring is closed, or was opened by another process")
            if self._job is not None:
                raise RuntimeError("reads are in flight: wait() for them first")
            self._done = None
            count = int(positions.size)
            if addresses.size != count:
                raise ValueError(f"{count} positions but {addresses.size} addresses")
            # Any read never completed reads as cancelled, never as done.
            results = np.full(count, -errno.ECANCELED, np.int64)
            job = _Job(fd, positions, addresses, size, into, results)
            self._job = job
            try:
                self._queue(job)
                self._enter(0)
            except BaseException:
                self._settle()  # an interrupt must not leave reads writing into freed memory
                raise

    def wait(self) -> np.ndarray[Any, Any]:
        """Wait for the reads submitted; each one's result: its size, fewer bytes (the file
        ended there), or `-errno` (`-ECANCELED` for a read an interrupted wait never
        queued). Until the next `submit`, `wait` again gives the same results (after an
        interrupted `wait`, what its reads gave)."""
        with self._lock:
            job = self._job
            if job is None:
                if self._done is None:
                    raise RuntimeError("no reads were submitted")
                return self._done.results
            count = job.results.size
            try:
                while job.done < count:
                    if job.done == job.queued:  # a ring's worth done: queue the next
                        self._queue(job)
                    self._enter(job.queued - job.done)
            except BaseException:
                self._settle()
                raise
            self._done = job
            self._job = None
            return job.results

    def _queue(self, job: _Job) -> None:
        """Queue the job's next reads, as many as the ring holds (all before are done)."""
        first = job.queued
        count = min(len(self._sqes), job.results.size - first)
        if count <= 0:
            return
        # SQEs 0 to count - 1, named by the submission array's next `count` slots.
        numbers = np.arange(count, dtype=np.uint32)
        self._sq_array[(self._tail + numbers) & (len(self._sq_array) - 1)] = numbers
        sqes = self._sqes[:count]
        sqes["fd"] = job.fd if isinstance(job.fd, int) else job.fd[first : first + count]
        sqes["off"] = job.positions[first : first + count]
        sqes["addr"] = job.addresses[first : first + count]
        sqes["len"] = job.size if isinstance(job.size, int) else job.size[first : first + count]
        sqes["user_data"] = numbers + np.uint64(first)
        # Program order: the SQEs are written before the tail (x86 keeps stores in order
        # for a polled ring's thread; a plain ring reads them in this thread's call).
        self._tail = (self._tail + count) & _U32
        self._sq_tail[0] = self._tail
        job.queued += count

    def _enter(self, wait_for: int) -> None:
        """Submit what is queued (wake a polled ring's thread), wait for `wait_for` reads
        to complete (0: none), and take the results of those that did."""
        job = self._job
        assert job is not None
        unsubmitted = 0 if self.polled else (self._tail - int(self._sq_head[0])) & _U32
        flags = _ENTER_GETEVENTS if wait_for else 0
        if self.polled:
            # Always: the thread's NEED_WAKEUP flag, read after the tail was written, may
            # be stale (x86 lets a load pass an earlier store); a wake of an awake thread
            # costs one cheap call a group.
            flags |= _ENTER_SQ_WAKEUP
        if flags or unsubmitted:
            # The kernel waits only once everything is submitted.
            entered = _SYSCALL(
                _ENTER,
                ctypes.c_int(self._fd),
                ctypes.c_uint(unsubmitted),
                ctypes.c_uint(wait_for),
                ctypes.c_uint(flags),
                None,
                ctypes.c_size_t(0),
            )
            if entered < 0:
                code = ctypes.get_errno()
                job.failures = 0 if code == errno.EINTR else job.failures + 1
                if code not in (errno.EINTR, errno.EAGAIN, errno.EBUSY) or job.failures > _RETRIES:
                    raise OSError(code, f"io_uring_enter: {os.strerror(code)}")
        head, tail = int(self._cq_head[0]), int(self._cq_tail[0])
        ready = (tail - head) & _U32
        if ready:
            slots = (head + np.arange(ready)) & (len(self._cq) - 1)
            completed = self._cq[slots]
            job.results[completed["user_data"].astype(np.intp)] = completed["res"]
            self._cq_head[0] = tail
            job.done += ready

    def _settle(self) -> None:
        """Wait out the reads queued (none more). A ring that cannot keeps their memory
        alive for good, and the job: it takes no other (`close` tries again)."""
        job = self._job
        if job is None:
            return
        try:
            while job.done < job.queued:
                self._enter(job.queued - job.done)
        except BaseException:
            _ABANDONED.append(job.into)
            raise
        self._done = job
        self._job = None

    @property
    def in_flight(self) -> bool:
        """Whether reads were submitted and not yet waited for (nor waited out)."""
        return self._job is not None

    def close(self) -> None:
        """Wait out anything in flight and release the ring. Safe to call twice; in a
        forked child, only its descriptor is closed (the reads are the parent's)."""
        if self._pid != os.getpid():
            # A forked child's copy: the lock may be held for good by a thread of the
            # parent's that the child does not have (reading ahead when it forked).
            fd, self._fd = self._fd, -1
            if fd >= 0:
                os.close(fd)
            return
        with self._lock:
            if self._fd < 0:
                return
            try:
                if self._pid == os.getpid():
                    self._settle()
            finally:
                fd, self._fd = self._fd, -1
                try:
                    os.close(fd)
                finally:
                    if self._job is None:  # no read left that writes through the maps
                        self._unmap()

    def __del__(self) -> None:
        # Dropped unclosed: its reads waited out (or, where that failed, their memory kept
        # by `_settle`), its descriptor closed.
        try:  # noqa: SIM105 - a finaliser never raises; no contextlib (a module global)
            self.close()
        except BaseException:
            pass
