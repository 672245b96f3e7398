"""One range of rows laid over several parts (a sharded source's files or arrays, a
mixture's sources): where each window of rows lies, piece by piece, and the parts' files
opened on demand, a few at a time.

A window may span parts (shards are one source: their concatenation), so a window is one
piece or several, each within one part (`pieces`): the stream's gather from memory and
its reads by position cut windows by this one arithmetic. A sharded corpus may be a
thousand files: their descriptors are opened when a read first needs them and at most
`OPEN_MOST` stay open past a group (`Descriptors`, least recently used closed first), so a
stream holds a bounded number of descriptors and opens nothing at its start. An
`np.memmap`'s file and offset are its own (`MemmapPart`), checked against its mapping when
it is opened; other parts' come from `/proc/self/maps` (`PartFile`). No JAX here.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from itertools import repeat
from operator import attrgetter
from pathlib import PurePath
from typing import Any, NamedTuple, overload

import numpy as np

from .._base.errors import HostViewError
from .._base.files import DescriptorLimit
from .pages import maps_line

#: Descriptors a reader of several files keeps open between groups, at most (a group's
#: reads may need more at once: those are closed once it is read).
OPEN_MOST = 32


def pieces(
    edges: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], length: int
) -> tuple[np.ndarray[Any, Any], ...]:
    """The pieces of windows of `length` rows at `starts` (a flat int64 array of rows of
    the one range) over parts whose rows are `edges[i]` to `edges[i + 1]` (no empty part,
    every window within the range): each piece's window, part, first row in its part,
    rows, and first row in its window, windows in order and each one's pieces in order.

    Example:
        >>> edges = np.array([0, 3, 4, 10])
        >>> [a.tolist() for a in pieces(edges, np.array([1, 5]), 4)]
        [[0, 0, 0, 1], [0, 1, 2, 2], [1, 0, 0, 1], [2, 1, 1, 4], [0, 2, 3, 0]]
    """
    starts = np.asarray(starts, np.int64)
    first = np.searchsorted(edges, starts, side="right") - 1
    last = np.searchsorted(edges, starts + (length - 1), side="right") - 1
    counts = last - first + 1
    windows = np.repeat(np.arange(starts.size, dtype=np.int64), counts)
    if windows.size == starts.size:  # no window spans two parts: one piece each
        part = first
        within = starts - edges[part]
        return windows, part, within, np.full(starts.size, length, np.int64), np.zeros_like(within)
    # The k-th piece of a window is in part first + k.
    before = np.cumsum(counts) - counts
    part = first[windows] + (np.arange(windows.size, dtype=np.int64) - before[windows])
    begin = np.maximum(starts[windows], edges[part])
    end = np.minimum(starts[windows] + length, edges[part + 1])
    return windows, part, begin - edges[part], end - begin, begin - starts[windows]


class PartFile(NamedTuple):
    """Where one part's rows are: the file (its name in `/proc/self/maps`; the mapping's
    range there, `lo-hi` in hex, opened through `/proc/self/map_files` first, and its path
    where it has one), its identity (the maps line's device, `MM:mm` in hex, and inode),
    where the part starts in it and the bytes of it the part needs (`end`). Of parts that
    are no `np.memmap`'s, a thousand are made as a stream starts: a tuple each, read
    further only when one is opened (a memmap's is made then: `MemmapPart.place`)."""

    path: str
    mapping: str
    by_path: str
    device: str
    inode: int
    offset: int
    end: int

    @property
    def identity(self) -> tuple[int, int]:
        """(device, inode), as `os.fstat` gives them."""
        major, _, minor = self.device.partition(":")
        return os.makedev(int(major, 16), int(minor, 16)), self.inode

    @property
    def key(self) -> tuple[int, int]:
        """What names this file among a reader's (its identity)."""
        return self.identity

    def open(self) -> int | None:
        """The file opened read-only, checked to be this one and long enough; None where
        it cannot be opened as this file.

        Raises:
            HostViewError: naming the file, where it is shorter than the part needs (it
                was truncated after it was mapped), or where no descriptor is left to open
                it (the process's limit, or the system's: `out_of_descriptors`).
        """
        try:
            identity = self.identity
        except ValueError:
            return None
        # By its path first (a lookup in /proc/self/map_files walks the process's
        # mappings: dear beside a thousand memmaps), the mapping's own name where the
        # path is gone or is another file now.
        for candidate in (self.by_path, "/proc/self/map_files/" + self.mapping):
            try:
                found = _open_same(candidate, identity) if candidate else None
            except OSError as error:  # no descriptor left: the same for any candidate
                raise HostViewError(self.path, *out_of_descriptors(error)) from None
            if found is None:
                continue
            fd, size = found
            if size < self.end:
                os.close(fd)
                raise HostViewError(self.path, *truncated(size, self.end))
            return fd
        return None


class MemmapPart(NamedTuple):
    """Where one part's rows are in the file an `np.memmap` maps, taken from the memmap
    itself (`filename`, `offset`: no read of `/proc/self/maps`, which a thousand shards'
    start would pay for every one), its identity checked when it is opened (`open`): the
    file opened is the one the mapping holds, or nothing is read from it.

    `path` is the memmap's file, `offset` and `end` the bytes of it the part needs,
    `array` the `np.memmap` made over `mapping` (the `mmap.mmap` it lies in), `view` the
    part itself."""

    path: str
    offset: int
    end: int
    array: np.memmap[Any, Any]
    mapping: mmap.mmap
    view: np.ndarray[Any, Any]

    @property
    def key(self) -> tuple[str, int]:
        """What names this file among a reader's (its path and the part's offset)."""
        return self.path, self.offset

    def place(self) -> PartFile | None:
        """The part's file as its mapping holds it now: the mapping's own file's identity
        from `/proc/self/map_files` (a lookup of one mapping, by its exact range), or,
        where that cannot be had (the mapping split or merged, no `/proc`), from the maps
        line holding the part (`described`); None where neither says it is one file at
        the memmap's offset (a memmap whose `offset` was changed is read from nowhere)."""
        array, mapping = self.array, self.mapping
        try:
            low = np.frombuffer(mapping, np.uint8, count=1).ctypes.data
        except ValueError:  # closed
            return None
        if array.__array_interface__["data"][0] - low != array.offset % mmap.ALLOCATIONGRANULARITY:
            return None
        high = low + -(-len(mapping) // mmap.PAGESIZE) * mmap.PAGESIZE
        name = f"{low:x}-{high:x}"
        try:
            info = os.stat("/proc/self/map_files/" + name)
        except OSError:
            start = self.view.__array_interface__["data"][0]
            found = described(self.end - self.offset, start, maps_line(start))
            return found if found is not None and found.offset == self.offset else None
        if not stat.S_ISREG(info.st_mode):
            return None
        device = f"{os.major(info.st_dev):x}:{os.minor(info.st_dev):x}"
        return PartFile(self.path, name, self.path, device, info.st_ino, self.offset, self.end)

    def whole(self) -> bool:
        """Whether the part may be read through its mapping now: the file the mapping
        holds is long enough, asked of the mapping's own descriptor (`mmap.size`, an
        `fstat` of the one Python's `mmap` keeps: nothing opened, and the mapped file
        whatever its path holds now); False where that cannot be asked (the mapping
        closed, no descriptor kept, the memmap's `offset` changed).

        Where the memmap lies in its mapping is asked of their lengths: `np.memmap` maps
        from `offset` rounded down to `mmap.ALLOCATIONGRANULARITY` to the memmap's end,
        so the bytes before it are `len(mapping) - nbytes`, which its `offset` must say
        (their addresses, as `place` asks, cost four times as much: a fresh stream's
        first batch asks this of 32 shards).

        Raises:
            HostViewError: naming the file, where it is shorter than the part needs (read
                through the mapping, the missing pages would kill the process: SIGBUS).
        """
        array, mapping = self.array, self.mapping
        try:
            before = len(mapping) - array.nbytes
            size = mapping.size()
        except (ValueError, OSError):  # closed, or no descriptor kept (trackfd=False)
            return False
        if before != array.offset % mmap.ALLOCATIONGRANULARITY:
            return False
        if size < self.end:
            raise HostViewError(self.path, *truncated(size, self.end))
        return True

    def open(self) -> int | None:
        """The file opened read-only, checked to be the one the mapping holds and long
        enough (`PartFile.open`); None where it cannot be opened as that file.

        Raises:
            HostViewError: naming the file, where it is shorter than the part needs, or
                where no descriptor is left to open it.
        """
        place = self.place()
        return None if place is None else place.open()


_new_tuple = tuple.__new__


def memmap_part(view: np.ndarray[Any, Any]) -> MemmapPart | None:
    """Where `view` lies in the file of the `np.memmap` it is a view of (shared or
    read-only: a copy-on-write memmap's pages may differ from its file's), taken from the
    memmap (about a microsecond: a thousand shards' start pays it for every one); None
    where it is no such view (then the maps say: `described`), and for a view whose bytes
    are not one run in order (reversed, strided): no range of the file is its tokens."""
    mapping: Any = view.base
    # A memmap itself, named by a str or a pathlib path (nanoGPT's shards): no walk, no
    # isinstance of an ABC (`os.PathLike`, a microsecond each: most of a thousand's time).
    if view.__class__ is np.memmap and mapping.__class__ is mmap.mmap and view.mode != "c":
        path: Any = view.filename
        if path.__class__ is not str:
            path = path.__fspath__() if isinstance(path, PurePath) else None
        if path is not None:
            offset = int(view.offset)
            # The tuple made directly: a NamedTuple's own `__new__` is a Python call
            # (0.8 against 0.4 ms a thousand).
            return _new_tuple(MemmapPart, (path, offset, offset + view.nbytes, view, mapping, view))
    if not view.flags.c_contiguous:
        return None
    base: Any = view
    while isinstance(base.base, np.ndarray):
        base = base.base
    mapping = base.base
    if not (isinstance(mapping, mmap.mmap) and isinstance(base, np.memmap) and base.mode != "c"):
        return None
    path = base.filename  # a str or a Path, absolute (None: a file object's without a name)
    if path.__class__ is not str:
        if not isinstance(path, os.PathLike):
            return None
        path = os.fspath(path)
    offset = int(base.offset)
    if base is not view:  # a view of the memmap: where it starts in it
        offset += view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return MemmapPart(path, offset, offset + view.nbytes, base, mapping, view)


class MemmapParts(Sequence[MemmapPart]):
    """Whole 1-D `np.memmap`s as parts (nanoGPT's shards, checked: `memmap_parts`), held
    as the memmaps and their offsets; a part's `MemmapPart` is made when it is asked for
    (`parts[i]`: the few a read opens or copies from), its path a `str` then.

    Why: a thousand shards' start made a record and a path of each (2 ms of a fresh
    stream's first batch, and a garbage collection or two for the thousand tuples), and a
    read asks for a few of them; the offsets, which every read's arithmetic needs, and
    the key a stream's trials remember the files by (`key`) are made from the columns.
    """

    __slots__ = ("_names", "offsets", "views")

    def __init__(
        self, views: list[np.ndarray[Any, Any]], names: list[Any], offsets: list[int]
    ) -> None:
        self.views = views
        self._names = names  # as the memmaps have them: a str, or a pathlib path
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.views)

    @overload
    def __getitem__(self, index: int) -> MemmapPart: ...

    @overload
    def __getitem__(self, index: slice) -> list[MemmapPart]: ...

    def __getitem__(self, index: int | slice) -> MemmapPart | list[MemmapPart]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self.views)))]
        view, name, offset = self.views[index], self._names[index], self.offsets[index]
        path = name if name.__class__ is str else str(name)  # a pathlib path's fspath
        # The tuple made directly: a NamedTuple's own `__new__` is a Python call.
        return _new_tuple(MemmapPart, (path, offset, offset + view.nbytes, view, view.base, view))

    def key(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """What names these files among readers' (each one's path and the part's offset,
        as `MemmapPart.key`), as two tuples rather than a pair a part: a thousand pairs
        are a thousand objects to make and collect."""
        names = self._names
        paths = names if {str} == set(map(type, names)) else list(map(str, names))
        return tuple(paths), tuple(self.offsets)


def memmap_parts(views: list[np.ndarray[Any, Any]]) -> MemmapParts | None:
    """`memmap_part` of every view at once, where each is a 1-D `np.memmap` itself (over
    its own `mmap`, shared or read-only, named by a str or a pathlib path: nanoGPT's
    shards), each part made as it is asked for (`MemmapParts`); None where any is not
    (then `memmap_part` each says).

    Why: a thousand shards' start paid 1.7 us a shard for `memmap_part`'s attribute reads
    in Python; asked as C-level maps over all of them, a third of that. A memmap made
    over its own mapping is contiguous, so a 1-D one needs no look at its flags.
    """
    if {np.memmap} != set(map(type, views)) or {1} != set(map(attrgetter("ndim"), views)):
        return None
    if {mmap.mmap} != set(map(type, map(attrgetter("base"), views))) or "c" in set(
        map(attrgetter("mode"), views)
    ):
        return None
    offsets = list(map(attrgetter("offset"), views))
    names = list(map(attrgetter("filename"), views))
    kinds = set(map(type, names))
    if {int} != set(map(type, offsets)) or not all(issubclass(k, (str, PurePath)) for k in kinds):
        return None
    return MemmapParts(views, names, offsets)


def described(nbytes: int, start: int, fields: list[str] | None) -> PartFile | None:
    """The file of the `nbytes` from address `start`, from the maps line holding that
    byte, where they are all in that one mapping and the file holds what its pages hold
    (read-only or shared: a private writable map may have been written to); else None."""
    if fields is None or len(fields) < 6:  # no path: anonymous memory
        return None
    address, perms, offset, device, inode_text, path = fields
    low, _, high = address.partition("-")
    try:
        lo, hi, inode = int(low, 16), int(high, 16), int(inode_text)
        file_offset = int(offset, 16) + (start - lo)
    except ValueError:
        return None
    if inode == 0 or start + nbytes > hi or (perms[1] == "w" and perms[3] != "s"):
        return None
    by_path = path if path[:1] == "/" and not path.endswith(" (deleted)") else ""
    return PartFile(path, address, by_path, device, inode, file_offset, file_offset + nbytes)


def truncated(size: int, end: int) -> tuple[str, str]:
    """The problem and fix of a file of `size` bytes that an array needs `end` of."""
    return (
        f"the file is {size:,} bytes, and the array mapped from it needs {end:,}: it was "
        "truncated after it was mapped",
        "do not rewrite a token file while a stream reads it; load it again",
    )


def out_of_descriptors(error: OSError) -> tuple[str, str]:
    """The problem and fix of an open that failed for want of a descriptor (EMFILE: every
    one below the process's limit is open; ENFILE: the system's table is full)."""
    if error.errno == errno.ENFILE:
        return (
            "no descriptor left to open the file and read it by position: the system's "
            "table of open files is full (the kernel's fs.file-max)",
            "close files other processes hold, or raise fs.file-max (sysctl)",
        )
    soft, hard, raised = DescriptorLimit.now()
    most = "unlimited" if hard is None else f"{hard:,}"
    return (
        f"no descriptor left to open the file and read it by position: every one below "
        f"this process's limit of {soft:,} is open (RLIMIT_NOFILE; the hard limit {most}); "
        f"each np.memmap holds one of its own, and a stream over shards keeps up to "
        f"{OPEN_MOST} of their files open besides (a group's, for a moment, more)",
        f"raise the limit (`ulimit -n {raised}` before starting Python, or "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({raised}, hard)) in the program), "
        "or hold fewer files open",
    )


def _open_same(path: str, identity: tuple[int, int]) -> tuple[int, int] | None:
    """`path` opened read-only where it is a regular file with this device and inode, and
    its size; else None (never blocking: a FIFO planted where the file was must not hang
    the open).

    Raises:
        OSError: EMFILE or ENFILE (no descriptor left: any other file would fail too).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as error:
        if error.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return None
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == identity:
            # Reads may block again (io_uring fails a non-blocking read of a page not in
            # the cache where a read would wait for it).
            os.set_blocking(fd, True)
            return fd, info.st_size
    except OSError:
        pass
    os.close(fd)
    return None


class Descriptors:
    """The descriptors of several parts' files: opened when a read first needs them (or
    given open), at most `most` kept past `trim` (the least recently used closed first).

    A descriptor is opened or closed and recorded inside `guard()` (the stream's: Ctrl-C
    held back), so an interrupt never leaves one without an owner. One reader, one thread
    at a time: reads in flight must be done before `trim` or `close` (a descriptor closed
    under a queued read would fail it).

    An `np.memmap`'s file is looked up once (`MemmapPart.place`, a `/proc/self/map_files`
    lookup, 40-120 us beside a thousand mappings on a busy host): a mapping's file never
    changes, and of a thousand shards most are opened again every group (only `most`
    stay open), so later opens check the file by path against what was found then.
    """

    __slots__ = ("_guard", "_lru", "_most", "_placed", "fds", "files")

    def __init__(
        self,
        files: Sequence[PartFile | MemmapPart],
        fds: list[int] | np.ndarray[Any, Any],
        most: int = OPEN_MOST,
        guard: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self.files = files
        self.fds = np.asarray(fds, np.int32)  # -1 where closed
        self._most = max(1, most)
        self._guard = guard
        self._placed: dict[int, PartFile] = {}  # a memmap part's file, once looked up
        # The open parts, least recently used first (a hint: `fds` says what is open),
        # found by numpy (a loop over a thousand closed shards is a Python one).
        opened = np.flatnonzero(self.fds >= 0).tolist()
        self._lru: OrderedDict[int, None] = OrderedDict(zip(opened, repeat(None)))

    @property
    def open_count(self) -> int:
        """How many descriptors are open now."""
        return int((self.fds >= 0).sum())

    @property
    def lazy(self) -> bool:
        """Whether reads open files (more files than are kept open: a thousand shards')."""
        return len(self.files) > self._most

    def opened(self, parts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The descriptors of `parts` (an int array), each opened where it was not."""
        fds = self.fds
        if len(fds) == 1:
            if fds[0] < 0:
                with self._guard():
                    self._open(0)
            return np.broadcast_to(self.fds[0], np.shape(parts))
        lru = self._lru
        # Each part once (not `np.unique`: its first call in a process costs 18 ms).
        wanted = list(dict.fromkeys(np.asarray(parts).reshape(-1).tolist()))
        missing = [part for part in wanted if fds[part] < 0]
        for part in wanted:
            lru[part] = lru.pop(part, None)  # the most recently used now
        if missing:
            with self._guard():
                for part in missing:
                    self._open(part)
        found: np.ndarray[Any, Any] = self.fds[parts]
        return found

    def open_first(self, count: int) -> bool:
        """Open the first `count` files (a reader's start: the caller holds Ctrl-C back);
        False, and none of them left open, where one cannot be opened as the file mapped.

        Raises:
            HostViewError: naming the file, where one is shorter than its part needs, or
                where no descriptor is left to open it.
        """
        try:
            for part in range(count):
                if not self._opened_now(part):
                    self.close()
                    return False
        except BaseException:
            self.close()
            raise
        return True

    def _open(self, part: int) -> None:
        if not self._opened_now(part):
            raise HostViewError(
                self.files[part].path,
                "the file this array was mapped from can no longer be opened to read by "
                "position (moved, or its mapping gone)",
                "keep a token file in place while a stream reads it",
            )

    def _opened_now(self, part: int) -> bool:
        """Open `part`'s file and record it; False where it cannot be opened as that file."""
        file = self.files[part]
        if isinstance(file, MemmapPart):
            place = self._placed.get(part)
            if place is None:
                place = file.place()
                if place is not None:
                    self._placed[part] = place
            fd = None if place is None else place.open()
        else:
            fd = file.open()
        if fd is None:
            return False
        self.fds[part] = fd
        self._lru[part] = None
        return True

    def trim(self) -> None:
        """Close the least recently used descriptors past `most`."""
        lru = self._lru
        if len(lru) <= self._most:
            return
        with self._guard():
            fds = self.fds
            while len(lru) > self._most:
                part, _ = lru.popitem(last=False)
                fd, fds[part] = int(fds[part]), -1
                if fd >= 0:
                    os.close(fd)

    def close(self) -> None:
        """Close every descriptor. Safe to call twice."""
        with self._guard():
            self._lru = OrderedDict()
            fds = self.fds
            for part in np.flatnonzero(fds >= 0).tolist():
                fd, fds[part] = int(fds[part]), -1
                os.close(fd)
