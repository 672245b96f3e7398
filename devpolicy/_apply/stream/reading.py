"""How a stream reads its windows: one record of the read path's settings, checked once
when it is made and passed to the stream, never read from module globals.

`windows(..., reads=...)` takes the record, or a path's name as shorthand. The defaults
are what devpolicy measured (docs/benchmarks.md#the-stream-wings-choices-as-measured);
tests and benchmarks force a path or a threshold by passing a record. No JAX here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

#: The read paths a stream can be held to: "auto" (the rules' first guess, then the
#: fastest of the safe paths, measured), "keep" (gathered from the mapping, its pages
#: kept), "budget" (gathered, its pages given back past `resident_budget`) or "file"
#: (read from the file by position). Tokens in memory are always gathered from memory.
ReadPath: TypeAlias = 'Literal["auto", "keep", "budget", "file"]'
READ_PATHS = ("auto", "keep", "budget", "file")


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a `windows` stream reads the windows of a file mapping (tokens in memory are
    always gathered from memory).

    Attributes:
        path: "auto" (default): the rules' first guess, then, where more than one path is
            safe for the file, the fastest of them timed on the stream's own groups and
            timed again every `recheck_seconds`; or one path held to: "keep" (gathered
            from the mapping, its pages kept), "budget" (gathered, pages given back past
            `resident_budget`), "file" (read by position: one io_uring call a group where
            Linux allows, else a `preadv` a window).
        measure: With "auto", whether to time the safe paths (False: the first guess).
        ahead: Whether the next group is read while the current one is placed.
        io_uring: Whether a file is read through io_uring where Linux allows.
        polled: Whether that ring is polled by a kernel thread (where the host has the
            cores for it), rather than entered by a worker thread.
        resident_budget: Bytes of a mapping's pages a "budget" stream keeps resident.
        keep_of_ram: The largest share of the host's RAM a kept mapping may be.
        keep_share: The largest share of the memory left that a kept mapping's pages not
            yet in the page cache may take.
        warm_share: The least share of a file's pages in the page cache for it to be
            gathered through its mapping (a colder file is read by position).
        low_memory_share: A kept mapping gives its pages back, and the stream reads by
            position, once the memory left falls under this share of the host's RAM.
        keep_check_every: Groups between two looks at the memory left, when kept.
        large_footprint: A random stream reads by position once a window brings in this
            many times what small pages would (the kernel maps large folios).
        trial_groups: Groups each path reads in a row, a turn of a trial.
        trial_rounds: Turns of each path in a trial.
        recheck_seconds: Seconds between two trials of a long stream.

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1})
        >>> reads = devpolicy.ReadOptions(path="file", ahead=False)
        >>> stream = devpolicy.windows(np.arange(100), 4, 2, reads=reads, policy=p)
        >>> next(stream).shape
        (2, 4)
        >>> devpolicy.ReadOptions(warm_share=2)
        Traceback (most recent call last):
        ValueError: ReadOptions warm_share must be a number from 0 to 1, got 2
    """

    path: ReadPath = "auto"
    measure: bool = True
    ahead: bool = True
    io_uring: bool = True
    polled: bool = True
    resident_budget: int = 256 * 2**20
    keep_of_ram: float = 0.75
    keep_share: float = 0.5
    warm_share: float = 0.5
    low_memory_share: float = 0.1
    keep_check_every: int = 256
    large_footprint: float = 4.0
    trial_groups: int = 4
    trial_rounds: int = 2
    recheck_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.path not in READ_PATHS:
            raise ValueError(
                f"ReadOptions path must be one of {', '.join(map(repr, READ_PATHS))}, got "
                f"{self.path!r}"
            )
        for name in ("measure", "ahead", "io_uring", "polled"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"ReadOptions {name} must be True or False, got {value!r}")
        for name in ("resident_budget", "keep_check_every", "trial_groups", "trial_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ReadOptions {name} must be an int >= 1, got {value!r}")
        for name in ("keep_of_ram", "keep_share", "warm_share", "low_memory_share"):
            value = getattr(self, name)
            if not _number(value) or not 0 <= value <= 1:
                raise ValueError(f"ReadOptions {name} must be a number from 0 to 1, got {value!r}")
        for name in ("large_footprint", "recheck_seconds"):
            value = getattr(self, name)
            if not _number(value) or not 0 < value < float("inf"):
                raise ValueError(f"ReadOptions {name} must be a number > 0, got {value!r}")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_options(reads: object) -> ReadOptions:
    """`windows`' `reads=`: a `ReadOptions`, a path's name (the rest default) or None.

    Example:
        >>> read_options("file").path, read_options(None).path
        ('file', 'auto')
    """
    if reads is None:
        return ReadOptions()
    if isinstance(reads, ReadOptions):
        return reads
    if isinstance(reads, str) and reads in READ_PATHS:
        return ReadOptions(path=reads)  # type: ignore[arg-type]
    raise ValueError(
        f"windows reads must be a devpolicy.ReadOptions or one of "
        f"{', '.join(map(repr, READ_PATHS))}, got {reads!r}"
    )
