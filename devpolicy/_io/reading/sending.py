"""Host arrays sent to their devices: many in one `device_put`, several such calls in
flight at once, and a bounded number of host bytes waiting on them.

The loader's one way of handing read (or mapped) tensors to JAX. A `device_put` from the
host returns before an accelerator has the bytes; the host array is held until it does.
Waiting on each call before reading the next tensor (as the loader once did) left the link
idle while the disk was read and the disk idle while the link was busy. Here a call is
waited on only when the host bytes sent but not yet arrived pass `IN_FLIGHT_BYTES`, oldest
first, so reading the next tensors overlaps the transfer of the last ones, and host
staging stays bounded whatever the checkpoint's size. On a CPU device a 64-byte-aligned
array is adopted, not copied: its `device_put` is done when it returns. Each call, and
each wait for one, is a `devpolicy.load_file.transfer` span in the profiler's trace
(`_machine/spans`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..._base.limits import CHUNK_BYTES
from ..._decide.decision import Decision
from ..._machine.spans import LOAD_TRANSFER, span

# Arrays per `device_put`: JAX's per-array cost grows with the list (measured on 10,000
# 16 KiB arrays: 0.23 s in lists of 32-128, 0.30 s in lists of 1,024, 0.60 s one by one).
PUT_BATCH = 128

#: Host bytes handed to `device_put` and not yet known to have reached their device: past
#: this the oldest call is waited for. Eight 64 MiB tensors: a 2 GiB checkpoint keeps an
#: accelerator's link busy while the next ones are read, and host staging stays a bounded
#: fraction of a large checkpoint (never more than the checkpoint itself).
IN_FLIGHT_BYTES = 8 * CHUNK_BYTES


class Sender:
    """Arrays waiting to be sent to their devices, sent together in one `device_put`, and
    the calls sent but not yet waited for.

    One call for many small tensors instead of one each: JAX's per-call cost (~25 us) is
    most of what a small tensor costs. A batch goes when it holds `CHUNK_BYTES` or
    `PUT_BATCH` arrays (a large tensor goes at once); it is waited for only when the host
    bytes in flight pass `in_flight` (oldest first) or at `finish`. `advance(n)` is called
    as `n` bytes are handed over (0 for what was already counted, read or mapped). `file`:
    the file's name, said in the trace's spans.
    """

    __slots__ = (
        "_advance",
        "_arrays",
        "_counted",
        "_destinations",
        "_file",
        "_flying",
        "_flying_bytes",
        "_in_flight",
        "_keys",
        "_nbytes",
        "_out",
    )

    def __init__(
        self,
        out: dict[str, jax.Array],
        advance: Callable[[int], None],
        in_flight: int = IN_FLIGHT_BYTES,
        file: str = "",
    ) -> None:
        self._out = out
        self._file = file
        self._advance = advance
        self._in_flight = in_flight
        self._keys: list[str] = []
        self._arrays: list[np.ndarray[Any, Any]] = []
        self._destinations: list[Any] = []
        self._nbytes = 0  # host bytes in this batch
        self._counted = 0  # bytes this batch moves the progress bar by
        self._flying: deque[tuple[list[jax.Array], int]] = deque()
        self._flying_bytes = 0

    def add(self, key: str, array: np.ndarray[Any, Any], decision: Decision, counted: int) -> None:
        """Queue `array` for `decision`'s destination; `counted`: bytes for the progress
        bar when it is sent (0 when its reading already moved it)."""
        self._keys.append(key)
        self._arrays.append(array)
        self._destinations.append(decision.destination)
        self._nbytes += array.nbytes
        self._counted += counted
        if self._nbytes >= CHUNK_BYTES or len(self._keys) >= PUT_BATCH:
            self.flush()

    def flush(self) -> None:
        """Send the queued arrays in one `device_put`; wait for the oldest calls while the
        host bytes in flight exceed the bound."""
        if not self._keys:
            return
        with span(LOAD_TRANSFER, file=self._file, tensors=len(self._keys), bytes=self._nbytes):
            placed: list[jax.Array] = jax.device_put(self._arrays, self._destinations)
        self._out.update(zip(self._keys, placed, strict=True))
        self._flying.append((placed, self._nbytes))
        self._flying_bytes += self._nbytes
        self._advance(self._counted)
        self._keys, self._arrays, self._destinations = [], [], []
        self._nbytes = self._counted = 0
        while self._flying_bytes > self._in_flight:
            self._land()

    @property
    def in_flight_bytes(self) -> int:
        """Host bytes sent and not yet waited for."""
        return self._flying_bytes

    def finish(self) -> None:
        """Send what is queued and wait until every array has reached its device."""
        self.flush()
        while self._flying:
            self._land()

    def _land(self) -> None:
        placed, nbytes = self._flying.popleft()
        with span(LOAD_TRANSFER, file=self._file, tensors=len(placed), bytes=nbytes, wait=1):
            for array in placed:
                array.block_until_ready()
        self._flying_bytes -= nbytes
