"""A group of batches placed: its host buffers (a ring where the device copies them), its
windows narrowed where x64 is off and the tokens are 64-bit, the batch decided once per
shape (the first decision is the stream's, for its tally), and sent; where the stream has
a separator, only the tokens are sent, their documents' segment ids and positions worked
out on the device (`groups.place_documents`), yet decided and tallied on all the bytes a
batch then holds there. The cutter hands over the windows, or the buffer they were read
straight into; nothing is read here but through the path it is given."""

from __future__ import annotations

import math
import weakref
from typing import Any

import jax
import numpy as np

from ..._base.errors import NarrowingError
from ..._base.events import EventLog
from ..._decide.decider import Decider
from ..._decide.decision import Decision
from ..._decide.routing import NEVER_MAPPED
from ..narrowing import NARROWER, Narrow, narrow_into, narrowed_event
from .documents import FIELDS, SEGMENT_BYTES, SeparatorIs
from .groups import GroupBuffer, GroupPlan, SegmentRing, place_documents
from .reads import ReadPath
from .sampling import Rows, process_rows


class GroupPlacer:
    """Places a stream's groups of `window`-shaped windows (the length, then a row's) of
    `dtype` as `name`, by `decider`; `buffers` groups of host memory kept in a ring.

    Example:
        >>> import devpolicy
        >>> from devpolicy._apply.stream.groups import every_window
        >>> from devpolicy._apply.stream.reads.memory import MemoryGather
        >>> decider = devpolicy.load_policy({"version": 1}).decider
        >>> placer = GroupPlacer(decider, "batch", "exact", np.dtype(np.int32), (3,))
        >>> path = MemoryGather(every_window(np.arange(10, dtype=np.int32), 3), None)
        >>> placed, nbytes = placer.place(np.array([[0, 7]]), None, path)
        >>> [b.tolist() for b in placed], nbytes
        ([[[0, 1, 2], [7, 8, 9]]], 24)
    """

    __slots__ = (
        "_decider",
        "_fields",
        "_narrow",
        "_narrowed",
        "_ring",
        "_segments",
        "_separator",
        "_shapes",
        "_window",
        "buffers",
        "decided",
        "dtype",
        "name",
        "target",
    )

    def __init__(
        self,
        decider: Decider,
        name: str,
        narrow: Narrow,
        dtype: np.dtype[Any],
        window: tuple[int, ...],
        *,
        separator: tuple[int, SeparatorIs] | None = None,
        fields: tuple[str, str, str] | None = None,
    ) -> None:
        self._decider = decider
        self.name = name
        self._narrow = narrow
        self._window = window
        self._separator = separator  # (token, "eos" or "bos"): segment ids with each batch
        self._fields = fields  # a batch's keys (tokens, segment ids, positions): a dict
        # Narrowed once per batch where x64 is off and the tokens are 64-bit.
        x64 = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
        self.target: np.dtype[Any] | None = None if x64 else NARROWER.get(dtype)
        self.dtype: np.dtype[Any] = self.target or dtype
        self._shapes: dict[tuple[int, ...], GroupPlan] = {}
        self._ring: list[GroupBuffer] = []
        self._segments = SegmentRing()  # where the host works a group's segments out
        self.buffers = 3  # groups kept: in flight, in use, being cut (the cutter sets it)
        self._narrowed: set[bool] = set()  # the exactness already reported
        self.decided: Decision | None = None  # the first batch shape's: the stream's

    @property
    def events(self) -> EventLog:
        """Where the stream's events go (its policy's)."""
        return self._decider.events

    def process_rows(self, batch: int) -> Rows:
        """The rows of a step's global batch this process draws, of `batch` placed here:
        under several processes the rows its devices hold of the global batch, so one
        seed gives every process other windows of one global batch, and a process resumed
        at a step draws the rows it drew."""
        if jax.process_count() == 1:
            return Rows.every(batch)
        plan = self.plan((batch, *self._window))
        if not plan.local:
            return Rows.every(batch)
        assert plan.decision.sharding is not None
        return process_rows(plan.decision.sharding, batch, self._window)

    def plan(self, shape: tuple[int, ...]) -> GroupPlan:
        """What a batch of `shape` is decided and sent as, worked out once (the first
        decision is the stream's: `decided`)."""
        found = self._shapes.get(shape)
        if found is None:
            decider = self._decider
            nbytes = math.prod(shape) * self.dtype.itemsize
            if self._separator is not None:  # placed with the tokens: decided with them
                nbytes += math.prod(shape[:2]) * SEGMENT_BYTES
            # As `put(name, batch)` decides one leaf; a process-local part's shape says
            # nothing of the global one across processes.
            known = None if jax.process_count() > 1 else shape
            (decision,) = decider.resolve_many([(self.name, nbytes, known, NEVER_MAPPED)])
            found = self._shapes[shape] = GroupPlan(decision, nbytes, decider.disabled)
            if self.decided is None:
                self.decided = decision
        return found

    def buffer_for(self, offsets: np.ndarray[Any, Any]) -> GroupBuffer:
        """A group's buffer for windows at `offsets` (k, n) to be read straight into."""
        count, n = offsets.shape
        shape = (n, *self._window)
        return self.buffer(count, shape, self.plan(shape).reuse)

    def buffer(self, count: int, shape: tuple[int, ...], reuse: bool) -> GroupBuffer:
        """Host memory for a group: the ring's oldest buffer once its transfers are done,
        or a new one (always, for a device that adopts host buffers)."""
        ring = self._ring
        if reuse and len(ring) >= self.buffers:
            oldest = ring.pop(0)
            oldest.ready()
            if oldest.shape == (count, *shape):
                return oldest
        return GroupBuffer(count, shape, self.dtype)

    def place(
        self,
        offsets: np.ndarray[Any, Any],
        gathered: np.ndarray[Any, Any] | GroupBuffer | None,
        read: ReadPath,
    ) -> tuple[list[Any], int]:
        """The batches at `offsets` (k, n): read by `read` (straight into their buffer,
        where it can), unless `gathered` already (or read into its buffer); narrowed,
        placed."""
        count, n = offsets.shape
        shape = (n, *self._window)
        plan = self.plan(shape)
        target = self.target
        windows: Any  # the group's windows, each batch as it came from the tokens
        if isinstance(gathered, GroupBuffer):  # read ahead straight into its buffer
            buffer = gathered
            windows = buffer.batches
        else:
            buffer = self.buffer(count, shape, plan.reuse)
            if gathered is not None:  # gathered (or read) ahead on the worker thread
                windows = gathered
            elif target is None and read.read_into(offsets, buffer.batches, buffer.whole()):
                windows = buffer.batches  # read straight into the group's buffer
            else:  # gathered (64-bit tokens: read into memory of their dtype first)
                windows = read.gather(offsets)
        if target is not None:
            for out, batch in zip(buffer.batches, windows, strict=True):
                self._narrowed_into(batch, out, target)
        elif windows is not buffer.batches:
            for out, batch in zip(buffer.batches, windows, strict=True):
                np.copyto(out, batch)
        nbytes = plan.nbytes * count
        if self._separator is not None:
            self._segments.size = self.buffers
            placed, tokens = place_documents(
                plan, buffer, self._separator, self._fields or FIELDS, self._segments
            )
        else:
            placed = tokens = plan.place(buffer.batches)
            if self._fields is not None:
                key = self._fields[0]
                placed = [{key: batch} for batch in tokens]
        if plan.reuse and (buffer.checked or not buffer.held_by(tokens)):
            # Reused once its transfers are done; never if a batch holds it.
            buffer.checked = True
            buffer.placed = [weakref.ref(a) for a in tokens]
            self._ring.append(buffer)
        return placed, nbytes

    def _narrowed_into(
        self, batch: np.ndarray[Any, Any], out: np.ndarray[Any, Any], target: np.dtype[Any]
    ) -> None:
        """Narrow one 64-bit batch into `out`: refused where values would change (exact),
        else one `narrowed` event per stream (and one more the first time a batch loses)."""
        _, problem = narrow_into(batch, out)
        if problem is not None and self._narrow == "exact":
            raise NarrowingError([(self.name, problem)])
        exact = problem is None
        if not self._narrowed or (not exact and False not in self._narrowed):
            narrowed_event(self._decider.events, self.name, batch, target, exact)
            self._narrowed.add(exact)

    def clear(self) -> None:
        """Let go of the ring's buffers (the stream ended)."""
        self._ring.clear()
        self._segments.clear()
