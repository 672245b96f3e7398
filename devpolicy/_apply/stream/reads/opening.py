"""The read paths that can serve a stream's source, opened, and the rules' first guess.

Reading by position is always safe for a file mapping. Keeping the mapping is safe where
the tokens fit in the page cache, most of their pages are there (warm), and what they
lack fits the memory left: a cold file's pages faulted in through a mapping wait on the
disk one at a time. The first guess: read by position where a group is one io_uring call
(it outran a kept mapping on an idle host, warm or cold), else keep the mapping where
that is safe; where both are safe, both are opened and the stream times them
(`choosing`). Tokens in memory are gathered from memory; a mapping that cannot be read by
position is gathered within the budget. Why each rule: docs/host-arrays.md ("Which read
path runs, and why"). No JAX here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...._base.sizes import format_size
from ...._machine.capacity import host_total_bytes, memory_headroom
from ...._read.pages import Pager, cached_share, in_numpy_memory, maps_line
from ...._read.positional import FileWindows, mapped_file, mapped_files
from ..interrupts import deferred_interrupts
from ..mixing import MixedViews
from ..reading import ReadOptions
from . import ReadPath
from .budget import BudgetMapping
from .kept import KeptMapping
from .memory import MemoryGather
from .polled import PolledReads
from .positional import PositionalReads
from .uring import RingReads


@dataclass(slots=True)
class Source:
    """What a stream reads from: its first (or only) view and every window of it, a
    mixture's views, the window length, whether its windows are drawn at random, and the
    dtype they are read as."""

    view: np.ndarray[Any, Any]
    windows: np.ndarray[Any, Any]
    mixture: MixedViews | None
    length: int
    random: bool


@dataclass(slots=True)
class Opened:
    """The paths opened for a source (by key), the first to read by, why, and the keys
    the stream may time (one: nothing to time)."""

    paths: dict[str, ReadPath] = field(default_factory=dict)
    first: str = "memory"
    why: str = ""
    candidates: list[str] = field(default_factory=list)
    #: Candidates not opened yet (`open_later` opens each when first timed).
    later: list[str] = field(default_factory=list)


def file_reader(
    source: Source, options: ReadOptions, line: list[str] | None = None
) -> FileWindows | None:
    """A reader of the file the tokens map (of every file, for a mixture), or None;
    `line`, the maps line of the view's first byte where it was read already."""
    ring = {"io_uring": options.io_uring, "polled": options.polled}
    if source.mixture is None:
        return mapped_file(source.view, source.length, line=line, **ring)
    mixture = source.mixture
    # A shard's file is opened (or closed) while the stream reads: with Ctrl-C held back.
    return mapped_files(
        mixture.views, source.length, mixture.edges, guard=deferred_interrupts, **ring
    )


def file_path(reader: FileWindows, source: Source) -> PositionalReads:
    """The path that reads through `reader`: by its ring, polled or entered, or `preadv`."""
    args = (reader, source.windows.shape[1:], source.view.dtype)
    if reader.polled:
        return PolledReads(*args)
    if reader.batched:
        return RingReads(*args)
    return PositionalReads(*args)


def open_paths(source: Source, options: ReadOptions) -> Opened:
    """The paths for `source` by `options` (held to one, or the rules' guess and what is
    safe to time), opened. The caller holds Ctrl-C back: nothing opened is left without
    an owner (what was opened is closed here if opening the rest raises)."""
    opened = Opened()
    try:
        _open(source, options, opened)
    except BaseException:
        for path in opened.paths.values():
            path.close()
        raise
    return opened


def _open(source: Source, options: ReadOptions, opened: Opened) -> None:
    copy: str = options.path
    why = f"held to reads={copy!r}"
    candidates = [copy]
    # The mapping that holds the tokens, read once for the reader and the pager (a read of
    # the whole map costs a millisecond or more where a process has many mappings).
    view = source.view
    line = (
        None
        if source.mixture is not None or in_numpy_memory(view) or not view.size
        else maps_line(view.ctypes.data)
    )
    reader = file_reader(source, options, line) if copy in ("auto", "file") else None
    later: list[str] = []
    if copy == "auto":
        copy, why, candidates = _choose(source, reader, options)
        if not options.measure:
            candidates = [copy]
        elif candidates == ["file", "keep"]:  # reading through a ring
            # Whether the kept mapping is safe (the page cache sampled, the memory left
            # read) and its pager cost a fresh stream's first batch about a millisecond:
            # looked at when it is first timed (`open_later`), not before.
            candidates, later = ["file"], ["keep"]
        if "file" not in candidates and reader is not None:
            reader.close()
            reader = None
    if reader is not None:
        opened.paths["file"] = file_path(reader, source)
    mixture, keep = source.mixture, copy == "keep" or "keep" in candidates
    pager = None
    if mixture is None and (reader is None or "keep" in candidates):
        pager = Pager(source.view, random=source.random, line=line)
    gathered: ReadPath
    if pager is not None and pager.active:
        if copy == "file" and reader is None:  # no file to read by position
            why += "; the file cannot be read by position here: gathered instead"
        if not keep and pager.blind:
            # gVisor: statm sees no file page, and a sweep gives nothing back that the
            # next fault would not map again whole (measured on a TPU VM).
            keep = True
            why += (
                "; this kernel does not count a mapping's pages (/proc/self/statm), so "
                "nothing is measured or given back"
            )
        if keep:
            gathered = _kept(source, pager, reader, options)
        else:
            budget = options.resident_budget if copy == "budget" and source.random else None
            gathered = BudgetMapping(source.windows, pager, budget, source.length, options)
    else:
        if pager is not None:
            pager.close()
        if mixture is not None and (reader is None or keep):
            # No pager watches a mixture's several mappings: their pages are kept.
            if keep:
                gathered = _kept(source, None, reader, options)
            else:
                gathered = MemoryGather(source.windows, mixture)
                why = (
                    "several arrays (a mixture's sources, or shards) that are not all "
                    "files that can be read by position: gathered from each array (a "
                    "mapping's pages kept)"
                )
        else:
            gathered = MemoryGather(source.windows, mixture)
            if reader is None:
                why = "the tokens are in memory, not a file mapping"
    if reader is None or "keep" in candidates or copy != "file":
        opened.paths[gathered.key] = gathered
    opened.why = why
    if copy == "file" and reader is not None:
        opened.first = "file"
    else:
        opened.first = gathered.key
    opened.candidates = [key for key in candidates if key in opened.paths] or [opened.first]
    if later:
        opened.candidates += later
        opened.later = later


def open_later(
    key: str, source: Source, options: ReadOptions, reader: FileWindows
) -> tuple[ReadPath | None, str]:
    """The candidate `key` whose opening `_open` put off (the kept mapping of a file read
    by position through a ring), opened where it is safe now, and None with why where it
    is not. The caller holds Ctrl-C back."""
    if key != "keep":
        raise ValueError(f"no read path {key!r} is opened late (only 'keep')")
    views = [source.view] if source.mixture is None else source.mixture.views
    nbytes = sum(view.nbytes for view in views)
    unsafe = _keep_unsafe(nbytes, _cached(views, nbytes), "not timed against it", options)
    if unsafe is not None:
        return None, f"the kept mapping was not timed: {unsafe}"
    pager = None if source.mixture is not None else Pager(source.view, random=source.random)
    if pager is not None and not pager.active:
        pager.close()
        return None, "the kept mapping was not timed: its pages cannot be watched here"
    return _kept(source, pager, reader, options), ""


def _kept(
    source: Source, pager: Pager | None, reader: FileWindows | None, options: ReadOptions
) -> KeptMapping:
    """The kept mapping, watching its files through `reader` (or a reader of its own, no
    ring, where none is open: a descriptor to `fstat`, never read from)."""
    own = reader is None
    if own:
        reader = file_reader(source, ReadOptions(io_uring=False))
    try:
        return KeptMapping(
            source.windows, source.mixture, pager, source.length, options, reader, own=own
        )
    except BaseException:
        if own and reader is not None:
            reader.close()
        raise


def _choose(
    source: Source, reader: FileWindows | None, options: ReadOptions
) -> tuple[str, str, list[str]]:
    """The rules' first guess for a file mapping, why, and the paths safe for it
    (`reader`: the file opened to read by position, or None where it cannot be)."""
    if reader is None:  # memory (`_open` says so once its pager has looked) or this:
        return (
            "budget",
            "the file this mapping shows cannot be opened to read by position: gathered "
            "from the mapping, its pages given back within the budget",
            ["budget"],
        )
    files = "file" if source.mixture is None else "files"
    by_position = (
        f"read from the {files} by position, a group's windows in one io_uring call"
        if reader.batched
        else f"read from the {files} by position (preadv: no io_uring here)"
    )
    if reader.batched:  # whether keeping the mapping is safe: looked at when it is timed
        why = f"{by_position} (faster on an idle host than a mapping, warm or cold)"
        return "file", why, ["file", "keep"]
    views = [source.view] if source.mixture is None else source.mixture.views
    nbytes = sum(view.nbytes for view in views)
    cached = _cached(views, nbytes)
    unsafe = _keep_unsafe(nbytes, cached, by_position, options)
    if unsafe is not None:
        return "file", unsafe, ["file"]
    known = "" if cached is None else f", {cached:.0%} of their pages in the page cache"
    return (
        "keep",
        f"the tokens ({format_size(nbytes)}{known}) fit in memory and reading by "
        "position is a system call a window here (no io_uring): gathered from the "
        "mapping, its pages kept while memory allows",
        ["keep", "file"],
    )


def _keep_unsafe(
    nbytes: int, cached: float | None, by_position: str, options: ReadOptions
) -> str | None:
    """Why keeping the mapping is not safe for tokens of `nbytes` (`cached` of them in the
    page cache), which are then read `by_position`; None where it is."""
    size = format_size(nbytes)
    total = host_total_bytes()
    if total is not None and nbytes > options.keep_of_ram * total:
        return (
            f"the tokens ({size}) are more than {options.keep_of_ram:.0%} of the host's "
            f"{format_size(total)} of RAM: {by_position}"
        )
    if cached is not None and cached < options.warm_share:
        return f"{cached:.0%} of the tokens' pages ({size}) are in the page cache: {by_position}"
    room = memory_headroom()
    missing = nbytes * (1.0 - (cached or 0.0))
    if room is not None and missing > options.keep_share * room:
        return (
            f"the {format_size(int(missing))} of the tokens not in the page cache are more "
            f"than {options.keep_share:.0%} of the {format_size(room)} this process can "
            f"still use: {by_position}"
        )
    return None


#: Views whose pages in the page cache are sampled, at most (of a thousand shards, a few
#: spread over them: each view's share costs a `mincore` a sampled page).
_CACHE_VIEWS = 16


def _cached(views: list[np.ndarray[Any, Any]], nbytes: int) -> float | None:
    """The share of all the views' pages in the page cache (sampled: of many views, a few
    spread evenly over them, by their bytes), or None where any file's is unknown."""
    if len(views) > _CACHE_VIEWS:
        picked = np.linspace(0, len(views) - 1, _CACHE_VIEWS).astype(np.int64).tolist()
        views = [views[i] for i in picked]
        nbytes = sum(view.nbytes for view in views)
    cached = 0.0
    for view in views:
        share = cached_share(view)
        if share is None:
            return None
        cached += share * view.nbytes / max(1, nbytes)
    return cached
