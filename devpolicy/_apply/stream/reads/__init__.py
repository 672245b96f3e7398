"""The read paths of a stream: each a way of copying a group of windows into host memory,
behind one interface (`ReadPath`), one way a file.

- `memory`: gathered from tokens in memory (one array, or a mixture's arrays);
- `kept`: gathered from a file mapping, its pages kept;
- `budget`: gathered from a file mapping, its pages given back within a budget;
- `positional`: read from the file by position, a `preadv` a window;
- `uring`: the same, a group's reads in one io_uring call, entered by a worker thread;
- `polled`: the same, on a ring a kernel thread polls (the caller never enters it).

`opening` opens the paths that can serve a source and makes the rules' first guess; the
stream (`cutting`) reads each group by one of them, reads ahead, and times them where
more than one is safe (`choosing`). Every path gives the same exact windows. No JAX here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ReadPath:
    """One way of copying a stream's windows: `gather` into fresh memory, or `read_into`
    a group's own buffers where the path can (no copy after).

    Attributes:
        key: The path's name in trials and `reads=`: "memory", "keep", "budget", "file".
        reads: What `stream_ended` says it reads from: "memory", "mapping" or "file".
        way: How a file is read ("preadv", "io_uring", "io_uring polled"), else None.
        ahead: Whether the next group is made ready while this one is placed (a worker
            thread, or a kernel thread where `kernel`).
        kernel: Whether `submit` returns at once, a kernel thread reading meanwhile.
        grouped: Whether a group is one system call (larger groups pay it once).
    """

    __slots__ = ()

    key = "memory"
    reads = "memory"
    way: str | None = None
    ahead = False
    kernel = False
    grouped = False

    def gather(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The windows at `offsets` (any shape) in fresh memory."""
        raise NotImplementedError

    def read_into(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]],
                  whole: np.ndarray[Any, Any] | None) -> bool:  # fmt: skip
        """Fill `batches` (one per row of `offsets`; `whole`: them back to back, or None)
        with their windows, where this path reads straight into them; False where not."""
        return False

    def read_now(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]]) -> bool:
        """`read_into`, on this thread and at once: nothing handed to another thread or
        to the kernel's (a stream's very first batch waits for no thread to be made or
        woken); False where this path does not read straight into batches."""
        return self.read_into(offsets, batches, None)

    @property
    def opens(self) -> bool:
        """Whether reading a group may open files (a thousand shards': a few stay open), so
        that a `kernel` path's `submit` is not the cheap call it is for files held open."""
        return False

    @property
    def first_now(self) -> bool:
        """Whether a fresh stream's first batch is read by `read_now` on the caller's
        thread even where this path reads ahead (it opens nothing then: a thousand
        shards' mappings), not started on the worker thread."""
        return False

    def submit(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]]) -> None:
        """Start reading a group into `batches` (a `kernel` path only)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Wait for the group `submit` started (a `kernel` path only)."""
        raise NotImplementedError

    def given_up(self) -> str | None:
        """Why this path can no longer serve the stream (memory ran low, large folios),
        looked at after each group; None while it can."""
        return None

    def settle(self) -> None:
        """Wait out reads an interrupt left in flight."""

    def close(self, *, sweep: bool = False) -> None:
        """Let go of what the path holds (with `sweep`, a mapping's pages too)."""

    def abandon(self, *, child: bool) -> None:
        """Let go without waiting for anything (a collected stream, or a forked child's
        copy: `child`, whose pages and advice are the parent's)."""
        self.close()
