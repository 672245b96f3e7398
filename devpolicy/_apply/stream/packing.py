"""Documents packed whole into rows of `length` tokens, first-fit into a bounded number of
open rows, as one global sequence of rows that resumes exactly from a small state.

The documents (a `DocumentIndex`) are taken in an order, position after position across
epochs: in the file's order, or shuffled each epoch by `shuffling`'s keyed permutation
(every document once an epoch; any position's document costs what the first one's does).
A document longer than `length` is cut into pieces of `length` (the last one shorter),
each packed as a document. A piece goes into the oldest open row it fits in (first fit);
where it fits none, a whole row's piece goes out as a row of its own, else it opens a row,
closing the oldest open one first where `open_rows` are open already. A row closes when
it is full, or as the oldest one to make room; its rest is padding. Where a finite order
ends (`epochs`), the open rows close oldest first.

Rows are numbered from 0 in the order they close, whatever the number of processes: each
process packs the same rows and takes its own of a step's global batch. The sequence is
a function of the index, the order, its seed, `length` and `open_rows` alone. The state
after any row is small: the place in the order (position and the tokens of its document
already packed) and the open rows as spans (`open_rows` rows of a few spans each); from it
packing goes on exactly, with nothing replayed. The hot loop costs a few list operations a
piece (the oldest row a piece fits is found by `bisect` on the open rows' running maximum
of free tokens); numpy prepares the pieces a block of documents at a time. No JAX here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from itertools import accumulate, chain
from typing import Any

import numpy as np

from ..._base.errors import StreamStateError
from .docindex import DocumentIndex
from .firstfit import SENTINEL, first_fit
from .packed import Layout
from .prefetch import as_int
from .shuffling import shuffled_windows

#: The key that marks a packing state, and its format's version.
PACK_KEY = "devpolicy.pack"
PACK_VERSION = 1
ORDERS = ("sequential", "shuffled")
#: Open rows by default: padding 0.88% at length 2,048 for lognormal documents of mean 500
#: (1.24% at 8, 0.70% at 32; docs/benchmarks.md), at the same speed.
OPEN_ROWS = 16
#: Documents of the order made into pieces at once.
BLOCK = 4096


@dataclass(frozen=True, slots=True)
class PackSettings:
    """What decides a packed stream's rows, beside its documents."""

    length: int
    open_rows: int = OPEN_ROWS
    order: str = "sequential"
    seed: int | None = None
    epochs: int | None = None


def checked_settings(
    length: object, open_rows: object, order: object, seed: object, epochs: object
) -> PackSettings:
    """The packing's arguments, checked, each fault naming its argument and what it takes.

    Raises:
        ValueError: a length or open_rows below 1, an unknown order, epochs below 1, a
            shuffled order without a seed.
    """
    numbers = []
    for name, value in (("length", length), ("open_rows", open_rows)):
        number = as_int(value)
        if number is None or number < 1:
            raise ValueError(f"windows {name} must be an int >= 1, got {value!r}")
        numbers.append(number)
    if order not in ORDERS:
        raise ValueError(f"windows pack= takes order one of {ORDERS}, got {order!r}")
    bound = as_int(epochs)
    if epochs is not None and (bound is None or bound < 1):
        raise ValueError(f"windows epochs must be None or an int >= 1, got {epochs!r}")
    key = as_int(seed)
    if seed is not None and (key is None or not 0 <= key < 2**64):
        raise ValueError(f"windows seed must be None or an int from 0 to 2**64 - 1, got {seed!r}")
    if order == "shuffled" and key is None:
        raise ValueError("windows order='shuffled' packs in an order drawn by a seed: pass seed=")
    return PackSettings(numbers[0], numbers[1], str(order), key, bound)


def checked_pad(pad: object, dtype: Any) -> int:
    """The padding token, checked against the tokens' dtype.

    Raises:
        ValueError: a pad no token of `dtype` can be, naming its range.
    """
    kind = np.dtype(dtype)
    token = as_int(pad)
    if token is None:
        raise ValueError(f"windows pad must be an int (a token id), got {pad!r}")
    if kind.kind not in "iu":
        raise ValueError(f"windows pack= needs integer token ids, got tokens of {kind}")
    info = np.iinfo(kind)
    if not info.min <= token <= info.max:
        raise ValueError(
            f"windows pad={token} does not fit tokens of {kind} ({info.min} to {info.max})"
        )
    return token


@dataclass(slots=True)
class PackTally:
    """What packing has made so far: rows, the tokens of documents in them, and their
    spans (documents, and pieces of documents longer than a row)."""

    rows: int = 0
    tokens: int = 0
    spans: int = 0

    def padding_share(self, length: int) -> float:
        """The share of the rows' tokens that are padding."""
        return 1 - self.tokens / (self.rows * length) if self.rows else 0.0

    def per_row(self) -> float:
        """Documents (and pieces) a row, on average."""
        return self.spans / self.rows if self.rows else 0.0


_FIX = "the saved packing state is damaged: save the stream's state again, or start afresh"


def _open_of(saved: Mapping[str, Any], packer: Packer) -> tuple[int, int, int, list[list[int]]]:
    """A saved packing state read as untrusted: (row, position, offset, open rows' spans),
    each field checked, and the settings and documents it was saved with matched.

    Raises:
        StreamStateError: not a packing state, a field out of range (every one named), or
            other settings or documents (each named, with both values).
    """
    if not isinstance(saved, Mapping) or saved.get(PACK_KEY) != PACK_VERSION:
        raise StreamStateError(
            "resume",
            f"not a packing state of version {PACK_VERSION} (no {PACK_KEY!r}: {PACK_VERSION})",
            "pass the state a packed stream saved",
        )
    settings = asdict(packer.settings)
    differ = [
        f"{name}: saved {saved.get(name)!r}, now {value!r}"
        for name, value in (
            *settings.items(),
            ("documents", packer.documents),
            ("digest", packer.digest),
        )
        if saved.get(name) != value
    ]
    if differ:
        raise StreamStateError(
            "resume", "the packing differs (" + "; ".join(differ) + "): other rows",
            "resume with the documents and arguments the state was saved with",
        )  # fmt: skip
    length, tokens = packer.settings.length, packer.index.tokens
    problems = [name for name in ("row", "position", "offset") if not _whole(saved.get(name))]
    spans: Any = saved.get("open")
    rows_ok = (
        isinstance(spans, list)
        and len(spans) <= packer.settings.open_rows
        and all(_row_ok(row, length, tokens) for row in spans)
    )
    if not rows_ok:
        problems.append("open")
    end = packer._end
    if not problems and (saved["offset"] % length or (end is not None and saved["position"] > end)):
        problems.append("offset" if saved["offset"] % length else "position")
    if problems:
        raise StreamStateError(
            ", ".join(f"resume[{name!r}]" for name in problems),
            f"out of range or of the wrong type: {', '.join(problems)}",
            _FIX,
        )
    return saved["row"], saved["position"], saved["offset"], [list(row) for row in spans]


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _row_ok(row: object, length: int, tokens: int) -> bool:
    """Whether `row` is an open row's spans: (start, count) pairs, in the tokens, fewer
    tokens than a row holds."""
    if not isinstance(row, list) or not row or len(row) % 2:
        return False
    if not all(_whole(v) for v in row):
        return False
    starts, counts = row[::2], row[1::2]
    return (
        all(c >= 1 and s + c <= tokens for s, c in zip(starts, counts, strict=True))
        and sum(counts) < length
    )


class Packer:
    """The packed rows of `index` under `settings`, handed out in order (`take`) from the
    start or from a saved state (`state`). Not thread-safe: one caller at a time."""

    def __init__(
        self,
        index: DocumentIndex,
        settings: PackSettings,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        if not len(index):
            raise ValueError(
                f"windows pack= found no document in {index.tokens:,} tokens (separator="
                f"{index.separator}, separator_is={index.separator_is!r}): nothing to pack"
            )
        self.index = index
        self.settings = settings
        self.documents = len(index)
        self.digest = index.digest
        epochs = settings.epochs
        self._end = None if epochs is None else epochs * self.documents  # positions
        self.tally = PackTally()
        saved = _open_of(state, self) if state is not None else None
        self.row = 0 if saved is None else saved[0]
        position, offset, open_spans = (0, 0, []) if saved is None else saved[1:]
        # The open rows, oldest first, between sentinels: handles into the table below.
        self._rows: list[Any] = [None, None]
        self._free = [0, SENTINEL]
        self._top = [0, SENTINEL]
        table_starts: list[int] = []
        table_counts: list[int] = []
        for spans in open_spans:
            handles = []
            for start, count in zip(spans[::2], spans[1::2], strict=True):
                handles.append(len(table_starts))
                table_starts.append(start)
                table_counts.append(count)
            self._open_row(handles, settings.length - sum(spans[1::2]))
        if offset and offset >= int(self.index.spans[self._documents_at(position, 1)[0], 1]):
            raise StreamStateError(
                "resume['offset']", f"{offset} is past the end of the document it is in", _FIX
            )
        self._load(
            position, offset, np.asarray(table_starts, np.int64), np.asarray(table_counts, np.int64)
        )

    def open_spans(self) -> int:
        """The spans the open rows hold (what a state, or a new block, carries)."""
        return sum(map(len, self._rows[1:-1]))

    def _open_row(self, handles: list[int], free: int) -> None:
        self._rows.insert(-1, handles)
        self._free.insert(-1, free)
        self._top.insert(-1, max(free, self._top[-2]))

    def _load(
        self,
        position: int,
        offset: int,
        carried_starts: np.ndarray[Any, Any],
        carried_counts: np.ndarray[Any, Any],
    ) -> None:
        """The pieces of the documents from `position` on (a block, the first `offset`
        tokens of its first document packed already), after the carried open rows'."""
        length = self.settings.length
        # At least as many documents as the open rows carry spans: carrying them into the
        # new table costs that much, once a block, so a document's cost stays flat however
        # many spans the open rows hold.
        block = max(BLOCK, carried_starts.size)
        count = block if self._end is None else max(0, min(block, self._end - position))
        # `take` along the rows: several times the fancy index's speed on a mapping.
        spans = np.take(self.index.spans, self._documents_at(position, count), axis=0)
        spans = spans.view(np.int64)
        starts, sizes = spans[:, 0].copy(), spans[:, 1].copy()
        if count:
            starts[0] += offset
            sizes[0] -= offset
        pieces = -(-sizes // length)
        owner = np.repeat(np.arange(count), pieces)
        within = np.arange(owner.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        piece_counts = np.minimum(length, sizes[owner] - within * length)
        self._table_starts = np.concatenate((carried_starts, starts[owner] + within * length))
        self._table_counts = np.concatenate((carried_counts, piece_counts))
        carried = carried_starts.size
        self._lengths: list[int] = [0] * carried + piece_counts.tolist()
        self._q = carried  # the next piece
        self._position = position  # of the block's first document
        self._offset = offset
        self._piece_docs = owner
        self._piece_within = within
        self._carried = carried
        self._count = count

    def _documents_at(self, position: int, count: int) -> np.ndarray[Any, Any]:
        """The documents at positions `position` .. of the order, `count` of them."""
        positions = np.arange(position, position + count, dtype=np.uint64)
        if self.settings.order == "shuffled":
            docs, _ = shuffled_windows(self.settings.seed or 0, positions, self.documents)
            return docs
        return (positions % np.uint64(self.documents)).astype(np.int64)

    def _place(self) -> tuple[int, int]:
        """The order's position and the tokens of its document packed, at the next piece."""
        at = self._q - self._carried
        if at >= self._piece_docs.size:
            return self._position + self._count, 0
        doc = int(self._piece_docs[at])
        within = int(self._piece_within[at]) * self.settings.length
        return self._position + doc, within + (self._offset if doc == 0 else 0)

    def _finished(self) -> bool:
        """Whether a finite order has no document left to take (its block used up)."""
        return self._end is not None and self._position + self._count >= self._end

    def take(self, count: int) -> Layout:
        """The next `count` rows (fewer, or none, where a finite order ends)."""
        parts: list[Layout] = []
        first = self.row
        got = 0
        length = self.settings.length
        while got < count:
            out: list[list[int]] = []
            self._q = first_fit(
                self._lengths, self._q, count - got, length, self.settings.open_rows,
                self._rows, self._free, self._top, out,
            )  # fmt: skip
            used_up = self._q >= len(self._lengths)
            if used_up and self._finished():  # the last rows close, oldest first
                while len(self._free) > 2 and len(out) < count - got:
                    out.append(self._rows.pop(1))
                    self._free.pop(1)
                    self._top[:] = [0, *accumulate(self._free[1:-1], max), SENTINEL]
            if out:
                parts.append(self._layout(out))
                got += len(out)
            if got < count and used_up:
                if self._finished():
                    break
                self._next_block()
        self.row += got
        if not parts:
            empty = np.zeros(0, np.int64)
            return Layout(first, length, np.zeros(1, np.int64), empty, empty)
        layout = Layout.joined(parts, first, length)
        self.tally.rows += got
        self.tally.tokens += int(layout.counts.sum())
        self.tally.spans += int(layout.counts.size)
        return layout

    def _layout(self, out: list[list[int]]) -> Layout:
        handles = np.array(list(chain.from_iterable(out)), np.int64)
        bounds = np.zeros(len(out) + 1, np.int64)
        np.cumsum(list(map(len, out)), out=bounds[1:])
        return Layout(
            -1,
            self.settings.length,
            bounds,
            self._table_starts[handles],
            self._table_counts[handles],
        )

    def _next_block(self) -> None:
        """The pieces of the next block, the open rows carried into its table."""
        position, offset = self._place()
        starts, counts = self._open_spans()
        handles = iter(range(starts.size))
        self._rows[1:-1] = [[next(handles) for _ in row] for row in self._rows[1:-1]]
        self._load(position, offset, starts, counts)

    def _open_spans(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        handles = np.array(list(chain.from_iterable(self._rows[1:-1])), np.int64)
        return self._table_starts[handles], self._table_counts[handles]

    def state(self) -> dict[str, Any]:
        """Where packing is, after row `row - 1`, as plain JSON-able values: from it, a
        `Packer` over the same index and settings makes exactly the rows that follow."""
        position, offset = self._place()
        starts, counts = (a.tolist() for a in self._open_spans())
        spans: list[list[int]] = []
        at = 0
        for row in self._rows[1:-1]:
            spans.append([v for k in range(at, at + len(row)) for v in (starts[k], counts[k])])
            at += len(row)
        return {
            PACK_KEY: PACK_VERSION,
            "row": self.row,
            "position": position,
            "offset": offset,
            "epoch": position // self.documents,
            "open": spans,
            "documents": self.documents,
            "digest": self.digest,
            **asdict(self.settings),
        }
