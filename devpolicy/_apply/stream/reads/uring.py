"""Windows read by position, a group's reads in one io_uring call entered by a worker
thread with the GIL released, the next group read while this one is placed. No JAX here."""

from __future__ import annotations

from .positional import PositionalReads


class RingReads(PositionalReads):
    """`PositionalReads` through a ring: a group is one system call, read ahead."""

    __slots__ = ()

    way = "io_uring"
    ahead = True
    grouped = True
