"""Windows read by position on a ring a kernel thread polls: `submit` queues a group and
returns, the kernel reads while the caller places the group before it, and `finish`
waits. The kernel thread needs a core of its own (on a busy host it loses its lead: the
stream's trials see it). No JAX here."""

from __future__ import annotations

from typing import Any

import numpy as np

from .uring import RingReads


class PolledReads(RingReads):
    """`RingReads` whose reads a kernel thread makes, the caller never entering the ring."""

    __slots__ = ()

    way = "io_uring polled"
    kernel = True

    def submit(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]]) -> None:
        self.reader.submit_batches(offsets, batches)

    def finish(self) -> None:
        self.reader.finish()
