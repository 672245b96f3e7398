"""Fixtures the tests of `windows` and of reading windows by position share."""

from __future__ import annotations

import pytest

from devpolicy._apply.stream import cutting as _windows
from devpolicy._read import positional, uring
from devpolicy._read.uring import BatchReads


def batched_reads_here(*, polled: bool = False) -> bool:
    """Whether io_uring (a polled ring, with `polled`) can be had on this machine."""
    ring = BatchReads.open(polled=polled)
    if ring is None:
        return False
    ring.close()
    return ring.polled or not polled


class PlainReads(BatchReads):
    """Rings that are never polled: their reads done in the call that submits them."""

    __slots__ = ()

    @classmethod
    def open(cls, entries: int = uring.ENTRIES, *, polled: bool = True) -> BatchReads | None:
        return BatchReads.open(entries, polled=False)


#: Each way of reading by position: (batched, polled, what `stream_ended` says of it).
READS = {
    "one read a window": (False, False, "preadv"),
    "a group in one call of a plain ring, on a worker thread": (True, False, "io_uring"),
    "a group read by a polled ring's kernel thread": (True, True, "io_uring polled"),
}


@pytest.fixture(params=list(READS))
def by_position(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Windows of a file mapping read from the file by position (not gathered from the
    mapping, `windows`' default), each way this machine can: one `preadv` a window, or
    a group in one io_uring call (`uring`), read ahead while the group before is
    placed. It gives the way as `stream_ended` names it (`reads_with`)."""
    batched, polled, way = READS[request.param]
    if batched and not batched_reads_here(polled=polled):
        pytest.skip("io_uring (or a polled ring) cannot be had here")
    monkeypatch.setattr(_windows, "MAPPED_COPY", "file")
    monkeypatch.setattr(positional, "BATCHED", batched)
    if batched and not polled:
        monkeypatch.setattr(positional, "BatchReads", PlainReads)
    return way
