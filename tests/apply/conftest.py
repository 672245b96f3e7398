"""Fixtures the tests of `windows` and of reading windows by position share."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from devpolicy import ReadOptions
from devpolicy._read.uring import BatchReads


def batched_reads_here(*, polled: bool = False) -> bool:
    """Whether io_uring (a polled ring, with `polled`) can be had on this machine."""
    ring = BatchReads.open(polled=polled)
    if ring is None:
        return False
    ring.close()
    return ring.polled or not polled


class ByPosition(NamedTuple):
    """A way of reading by position: the options that hold a stream to it (`reads=`), and
    what `stream_ended` says of it (`reads_with`)."""

    reads: ReadOptions
    way: str


#: Each way of reading by position: (the stream's `reads=`, whether it needs io_uring and
#: a polled ring, what `stream_ended` says of it).
READS = {
    "one read a window": (ReadOptions(path="file", io_uring=False), (False, False), "preadv"),
    "a group in one call of a plain ring, on a worker thread": (
        ReadOptions(path="file", polled=False),
        (True, False),
        "io_uring",
    ),
    "a group read by a polled ring's kernel thread": (
        ReadOptions(path="file"),
        (True, True),
        "io_uring polled",
    ),
}


@pytest.fixture(params=list(READS))
def by_position(request: pytest.FixtureRequest) -> ByPosition:
    """Windows of a file mapping read from the file by position (not gathered from the
    mapping), each way this machine can: one `preadv` a window, or a group in one
    io_uring call (`uring`), read ahead while the group before is placed. It gives the
    `ReadOptions` a test passes as `windows(..., reads=...)`, and the way as
    `stream_ended` names it (`reads_with`)."""
    reads, (batched, polled), way = READS[request.param]
    if batched and not batched_reads_here(polled=polled):
        pytest.skip("io_uring (or a polled ring) cannot be had here")
    return ByPosition(reads, way)
