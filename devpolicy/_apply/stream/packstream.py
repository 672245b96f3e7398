"""A packed stream's groups (`windows(pack="first_fit")`): this process's rows of each
step packed (`packrows`), their documents' spans copied from the tokens with the rest of
each row padding, their segment ids and positions made from the layout (`packed`), and
the three placed as a batch.

Packing and copying run on the stream's thread, as a gather from memory does: both are
Python holding the GIL, and on a worker thread they fought the caller's transfers for it
(0.6x the rate in the pipeline alone, measured: docs/benchmarks.md). The packer changes
with Ctrl-C held back, so an interrupt lands before or after a group's rows were packed,
and a group cut again is packed again from the notes (`packrows`). The last step of a
finite order is filled with rows of padding (segment id 0), so every batch keeps its
shape and every process its rows. A token file's size is looked at before each group is
copied from its mapping (of shards, each memmap's shard the group copies from): a file
truncated between two groups is an error naming it, not SIGBUS. Bound for a device that
copies host memory, a group's ids and positions are worked out there from each row's
span starts (`groups.packed_on_device`), 1.06x the tokens' bytes where the host's were
5x. Measured against the unpacked stream and grain's packing in docs/benchmarks.md
("A packed stream's rate"). No JAX here beyond the placer's and `groups`'.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._base.errors import HostViewError
from ..._machine.spans import STREAM_PLACE, STREAM_READ, span
from ..._read.pages import maps_line
from ..._read.parts import MemmapPart, memmap_part, truncated
from .cutting import GROUP_MAX, batches_a_group
from .documents import FIELDS, SEGMENT_BYTES
from .groups import (
    GroupBuffer,
    SegmentRing,
    packed_on_device,
    placed_packed,
    placed_together,
)
from .interrupts import deferred_interrupts
from .packed import Layout, gather, segments, start_words
from .packrows import PackedRows
from .placing import GroupPlacer
from .shards import Shards
from .state import LAST_STEP


class PackedSteps:
    """The packed rows of each step of a global batch of `per_step` rows (step s's from
    global row `base + s * per_step`), this process's `own` of them, for `steps` steps at
    most (None: until a finite order ends). Thread-safe: a pull packs while another thread
    may ask for the state at a step.

    Example:
        >>> from devpolicy._apply.stream.docindex import in_memory
        >>> from devpolicy._apply.stream.packing import PackSettings
        >>> index = in_memory(np.array([1, 1, 0, 2, 0, 3, 3, 3, 0]), 0, "eos")
        >>> steps = PackedSteps(PackedRows(index, PackSettings(4, epochs=1)), 2, np.arange(2))
        >>> layout = steps.take(0, 5)  # 3 rows, and one of padding to fill the last step
        >>> layout.rows, layout.used.tolist()
        (4, [4, 3, 2, 0])
    """

    __slots__ = ("_base", "_lock", "_own", "_pid", "_rows", "per_step", "steps")

    def __init__(
        self,
        rows: PackedRows,
        per_step: int,
        own: np.ndarray[Any, Any],
        base: int = 0,
        steps: int | None = None,
    ) -> None:
        self._rows = rows
        self.per_step = per_step
        self._own = np.asarray(own, np.int64)
        self._base = base
        self.steps = steps
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def rows(self) -> int:
        """This process's rows of a step."""
        return int(self._own.size)

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():  # a forked child: the parent's worker may hold it
            self._lock = threading.Lock()
            self._pid = os.getpid()
        return self._lock

    def take(self, first: int, most: int) -> Layout | None:
        """This process's rows of steps `first` .. (up to `most` of them, fewer where a
        finite order ends), step after step; None past the last step."""
        last = LAST_STEP if self.steps is None else self.steps
        count = min(most, last - first)
        if count <= 0:
            return None
        per_step = self.per_step
        with self._locked():
            layout = self._rows.rows(self._base + first * per_step, count * per_step)
        got = layout.rows
        if not got:
            return None
        made = -(-got // per_step)  # steps: the last one's missing rows are padding
        bounds = layout.bounds
        if got < made * per_step:
            bounds = np.concatenate((bounds, np.repeat(bounds[-1:], made * per_step - got)))
            layout = Layout(layout.first, layout.length, bounds, layout.starts, layout.counts)
        picked = (np.arange(made, dtype=np.int64)[:, None] * per_step + self._own).reshape(-1)
        return layout.taken(picked)

    def state_at(self, step: int) -> dict[str, Any]:
        """The packing state at step `step`'s first row (see `PackedRows.state_at`); past
        the rows a finite order packed (a stream at its end), the state at its end."""
        with self._locked():
            rows = self._rows
            return rows.state_at(min(self._base + step * self.per_step, rows.packed))

    def tally(self) -> tuple[int, int, int]:
        """Rows packed, their documents' tokens and their documents (or pieces)."""
        with self._locked():
            counted = self._rows.tally
            return counted.rows, counted.tokens, counted.spans


@dataclass(slots=True)
class _Made:
    """A group's `count` batches' tokens (count, rows, length) and the buffer they lie in
    (`tokens_in`: reused once the batches placed from them are ready, where none holds
    it); with either their ids and positions, each as the tokens, and their buffer
    (`segments_in`), or their rows' start words (`packed.start_words`) and the device
    function and stacked sharding that work them out (`groups.packed_on_device`)."""

    count: int
    tokens: np.ndarray[Any, Any]
    tokens_in: GroupBuffer
    ids: np.ndarray[Any, Any] | None = None
    positions: np.ndarray[Any, Any] | None = None
    segments_in: GroupBuffer | None = None
    words: np.ndarray[Any, Any] | None = None
    device: tuple[Any, Any] | None = None


class _Watched:
    """The token file under a mapping, its size looked at before each copy."""

    __slots__ = ("end", "fd", "path")

    def __init__(self, fd: int, path: str, end: int) -> None:
        self.fd = fd
        self.path = path
        self.end = end

    def check(self, layout: Layout) -> None:
        """Raise where the file is shorter now than the mapping needs.

        Raises:
            HostViewError: naming the file.
        """
        size = os.fstat(self.fd).st_size
        if size < self.end:
            raise HostViewError(self.path, *truncated(size, self.end))

    def close(self) -> None:
        os.close(self.fd)


class _ShardsWatched:
    """The shards' files under their `np.memmap`s (`parts.MemmapPart`), each one's size
    asked of its mapping's own descriptor (`mmap.size`: nothing opened, a thousand
    shards or not) before a group copies from it. A shard that is no memmap's (in memory,
    or mapped by `load_file`), or a view of one that is not its bytes in order, is not
    watched: as for any mapping, one truncated under a copy is SIGBUS."""

    __slots__ = ("edges", "ends", "mappings", "paths")

    def __init__(self, edges: np.ndarray[Any, Any], parts: list[MemmapPart | None]) -> None:
        self.edges = edges
        self.mappings = [None if part is None else part.mapping for part in parts]
        self.ends = [0 if part is None else part.end for part in parts]
        self.paths = ["" if part is None else part.path for part in parts]

    def check(self, layout: Layout) -> None:
        """Raise where a shard the spans of `layout` lie in is shorter now than its
        mapping needs.

        Raises:
            HostViewError: naming the shard's file.
        """
        edges = self.edges
        first = np.searchsorted(edges, layout.starts, "right") - 1
        last = np.searchsorted(edges, layout.starts + layout.counts - 1, "right") - 1
        touched = set(first.tolist())
        for low, high in zip(first[first != last].tolist(), last[first != last].tolist(),
                             strict=True):  # fmt: skip
            touched.update(range(low + 1, high + 1))  # a span running on into the next
        mappings, ends = self.mappings, self.ends
        for shard in touched:
            mapping = mappings[shard]
            if mapping is None:
                continue
            try:
                size = mapping.size()
            except (ValueError, OSError):  # closed by its owner: not ours to watch
                continue
            if size < ends[shard]:
                raise HostViewError(self.paths[shard], *truncated(size, ends[shard]))

    def close(self) -> None:
        """Nothing of ours is open: the mappings are their memmaps'."""


def _shards_watched(shards: Shards) -> _ShardsWatched | None:
    """The shards' watch (`_ShardsWatched`), each memmap's shard checked whole now; None
    where no shard is a memmap's."""
    # A view that is not its file's bytes in order (reversed, strided) has no part: not
    # watched.
    parts = [memmap_part(view) for view in shards.views]
    kept = [part if part is not None and part.whole() else None for part in parts]
    return None if kept.count(None) == len(kept) else _ShardsWatched(shards.edges, kept)


def _plain(view: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return view.view(np.ndarray) if isinstance(view, np.memmap) else view


def _watched(view: np.ndarray[Any, Any]) -> _Watched | None:
    """The file `view` maps, opened to be watched (its inode the mapping's), or None for
    tokens in memory (or a file gone: nothing to watch by path)."""
    if not view.size:
        return None
    # The bytes the view spans, whatever its stride's sign (a reversed view starts at
    # its highest address).
    first = view.ctypes.data
    last = first + (view.shape[0] - 1) * view.strides[0]
    low, high = min(first, last), max(first, last) + view.itemsize
    fields = maps_line(low)
    if fields is None or len(fields) < 6 or not fields[5].startswith("/"):
        return None
    address, _, offset, _, inode, path = fields
    if path.endswith(" (deleted)"):
        return None
    with deferred_interrupts():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        if os.fstat(fd).st_ino != int(inode):  # replaced since it was mapped
            os.close(fd)
            return None
        mapped = int(address.partition("-")[0], 16)
        end = int(offset, 16) + high - mapped
        return _Watched(fd, path, end)


class PackedCutter:
    """Cuts a packed stream's groups (`steps`) from `tokens` and places them by `placer`,
    on the stream's thread (one owner, one thread at a time: the stream's lock). `size`
    is the batches the stream places ahead of use; `pad` fills a row's rest."""

    __slots__ = (
        "_cut_before",
        "_fields",
        "_group",
        "_length",
        "_opened",
        "_pad",
        "_segments_ring",
        "_source",
        "_steps",
        "_tokens",
        "_tokens_ring",
        "_watch",
        "placer",
        "reads",
        "reads_why",
        "reads_with",
        "size",
    )

    def __init__(
        self,
        tokens: np.ndarray[Any, Any] | Shards,
        steps: PackedSteps,
        placer: GroupPlacer,
        size: int,
        pad: int,
        length: int,
        fields: tuple[str, str, str] | None,
    ) -> None:
        self._tokens = tokens
        # What `gather` copies from: shards as their plain arrays (a memmap's slices cost
        # a Python object each), once, with where each starts.
        self._source: tuple[Any, np.ndarray[Any, Any] | None] = (
            ([_plain(v) for v in tokens.views], tokens.edges)
            if isinstance(tokens, Shards)
            else (tokens, None)
        )
        self._steps = steps
        self.placer = placer
        self.size = size
        self._pad = pad
        self._length = length
        self._fields = fields or FIELDS
        batch_bytes = steps.rows * length * (placer.dtype.itemsize + SEGMENT_BYTES)
        self._group = batches_a_group(batch_bytes, GROUP_MAX)
        kept = -(-size // self._group) + 2  # groups in flight, in use, being cut
        self._tokens_ring = SegmentRing(kept, 1, placer.dtype)
        self._segments_ring = SegmentRing(kept)
        self._cut_before = False
        self._opened = False
        self._watch: _Watched | _ShardsWatched | None = None
        self.reads = "memory"
        self.reads_why = "packed rows: each document's tokens copied from memory"
        self.reads_with: str | None = None

    def start(self, first: int) -> None:
        """Open the file's watch, where the tokens are mapped (nothing is cut ahead: the
        first pull packs its batch)."""
        if self._opened:
            return
        self._opened = True
        tokens = self._tokens
        if isinstance(tokens, Shards):
            self._watch = _shards_watched(tokens)
            why = (
                "packed rows: each document's tokens copied from its shard's mapping "
                "(a shard's size looked at before a group copies from it)"
            )
        else:
            self._watch = _watched(tokens)
            why = (
                "packed rows: each document's tokens copied from the file's mapping "
                "(its size looked at before each group)"
            )
        if self._watch is not None:
            self.reads, self.reads_why = "mapping", why

    def cut(self, first: int) -> tuple[list[Any], int] | None:
        """The batches of the group from step `first`, packed, copied and placed, and their
        bytes; None past the last step. The first is one batch (the first pull waits for
        no more)."""
        if not self._opened:
            self.start(first)
        most = self._group if self._cut_before else 1
        self._cut_before = True
        with span(STREAM_READ, reads=self.reads, batches=most):
            # The packer is changed in one piece: an interrupt lands before or after.
            with deferred_interrupts():
                layout = self._steps.take(first, most)
            if layout is None:
                return None
            made = self._copied(layout)
        with span(STREAM_PLACE, name=self.placer.name, batches=made.count):
            return self._place(made)

    def _copied(self, layout: Layout) -> _Made:
        """The tokens of `layout`'s rows, copied, with their segment ids and positions."""
        rows, length = self._steps.rows, self._length
        count = layout.rows // rows
        if self._watch is not None:
            self._watch.check(layout)
        placer = self.placer
        target = placer.target
        tokens_in, planes = self._tokens_ring.take(count, (rows, length))
        tokens = planes[0]
        source, edges = self._source
        if target is None:
            gather(source, layout, self._pad, tokens.reshape(count * rows, length), edges)
        else:  # 64-bit tokens, x64 off: narrowed as the stream narrows any batch
            wide = gather(source, layout, self._pad, None, edges)
            for out, batch in zip(tokens, wide.reshape(count, rows, length), strict=True):
                placer._narrowed_into(batch, out, target)
        device = packed_on_device(placer.plan((rows, length)), tokens.shape, tokens.dtype)
        if device is not None:  # the device works the ids out from the starts
            words = start_words(layout).reshape(count, rows, -1)
            return _Made(count, tokens, tokens_in, words=words, device=device)
        segments_in, both = self._segments_ring.take(count, (rows, length))
        ids, positions = both[0], both[1]
        flat = (count * rows, length)
        segments(layout, (ids.reshape(flat), positions.reshape(flat)))
        return _Made(count, tokens, tokens_in, ids, positions, segments_in)

    def _place(self, made: _Made) -> tuple[list[Any], int]:
        count = made.count
        plan = self.placer.plan(made.tokens.shape[1:])
        together: tuple[list[Any], list[Any], list[Any]] | None
        if made.device is not None:
            assert made.words is not None
            together = placed_packed(made.device, made.tokens, made.words)
        else:
            assert made.ids is not None
            assert made.positions is not None
            tokens, ids, positions = list(made.tokens), list(made.ids), list(made.positions)
            together = placed_together(plan, tokens, ids, positions)
            if together is None:
                arrays = plan.place([*tokens, *ids, *positions])
                together = (arrays[:count], arrays[count : 2 * count], arrays[2 * count :])
        assert together is not None
        batches = [
            dict(zip(self._fields, three, strict=True)) for three in zip(*together, strict=True)
        ]
        # Host memory the batches do not hold (a device that copies it, or a call that
        # does) is used again once their transfers are done: fresh memory a group faulted
        # in about 1,000 pages.
        self._tokens_ring.keep(made.tokens_in, together[0])
        if made.segments_in is not None:
            self._segments_ring.keep(made.segments_in, [*together[1], *together[2]])
        return batches, plan.nbytes * count

    def packing(self) -> dict[str, float | int]:
        """What packing made so far (every process's rows, packed ahead included): rows,
        the share of their tokens that is padding and the documents (or pieces) a row."""
        rows, used, spans = self._steps.tally()
        share = 1 - used / (rows * self._length) if rows else 0.0
        return {
            "rows": rows,
            "padding_share": round(share, 6),
            "documents_per_row": round(spans / rows, 4) if rows else 0.0,
        }

    def state_at(self, step: int) -> dict[str, Any]:
        """The packing state at `step` (saved with the stream's)."""
        return self._steps.state_at(step)

    # Ending.

    def settle(self) -> None:
        """Nothing is cut ahead: nothing to wait for."""

    def close(self) -> None:
        """Let go of the rings' memory and close the file's watch. Safe to call twice."""
        self._tokens_ring.clear()
        self._segments_ring.clear()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    def abandon(self, *, child: bool = False) -> None:
        """Let go of the file's watch (a collected stream, or a forked child's copy)."""
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - a finaliser never raises
            self.close()
        except Exception:
            pass
