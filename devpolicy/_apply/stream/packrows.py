"""A packed stream's rows by their global number: a step's rows of the global batch, and
this process's own of them; the state after any row handed out, for a saved stream.

Packing is a sequence (each row depends on the rows before it), so the rows are made in
order by one `Packer` and every process makes all of a step's rows, taking its own (a
slice of the global batch): the rows of a step are the same whatever the number of
processes. A stream reads ahead of the step it hands out, so the state it saves is of an
earlier row: the packer's state is noted at the first row of a call (`KEPT` notes), once
at least as many pieces as the open rows hold were packed since the last note (a note
costs that many), and the state at a row is made by packing again from the note before
it, that many pieces and a call's rows at most (never from the start). Rows asked again
(a group cut again) come the same way. No JAX here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from .docindex import DocumentIndex
from .packed import Layout
from .packing import Packer, PackSettings, PackTally

#: The notes of where packing was kept: the first rows of this many calls.
KEPT = 32


class PackedRows:
    """The packed rows of `index` under `settings`, from a saved packing state (`state`,
    where packing goes on from its row) or from row 0. Not thread-safe.

    Example:
        >>> from devpolicy._apply.stream.docindex import in_memory
        >>> index = in_memory(np.array([1, 1, 0, 2, 0, 3, 3, 3, 0]), 0, "eos")
        >>> rows = PackedRows(index, PackSettings(4, epochs=1))
        >>> layout = rows.rows(0, 5)  # one epoch: 3 rows
        >>> layout.bounds.tolist(), layout.starts.tolist(), layout.counts.tolist()
        ([0, 1, 2, 3], [5, 0, 3], [4, 3, 2])
    """

    def __init__(
        self,
        index: DocumentIndex,
        settings: PackSettings,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        self._packer = Packer(index, settings, state)
        self._first = self._packer.row  # the first row this stream can give
        self._notes: deque[tuple[int, dict[str, Any]]] = deque(maxlen=KEPT)
        self._noted_at = 0  # the pieces packed at the last note

    @property
    def tally(self) -> PackTally:
        """What packing made so far (each row counted once, however often asked)."""
        return self._packer.tally

    @property
    def first(self) -> int:
        """The first row this stream gives (the saved state's row, or 0)."""
        return self._first

    @property
    def packed(self) -> int:
        """The rows packed so far (from row 0: the first row's number included)."""
        return self._packer.row

    @property
    def settings(self) -> PackSettings:
        return self._packer.settings

    def rows(self, first: int, count: int) -> Layout:
        """Rows `first` .. `first + count - 1` (fewer where a finite order ends first).

        Raises:
            ValueError: rows before the first this stream gives, or before its notes.
        """
        packer = self._packer
        if first >= packer.row:
            if first > packer.row:  # rows no one asked for: packed, and left
                self._note()
                packer.take(first - packer.row)
            self._note()
            return packer.take(count)
        again = self._from_note(first)
        return again.take(count)

    def step(self, step: int, batch: int, own: np.ndarray[Any, Any] | None = None) -> Layout:
        """The rows of `step` of a global batch of `batch` rows from this stream's first
        row, those at `own` of them (this process's, indices into the batch) where given."""
        layout = self.rows(self._first + step * batch, batch)
        return layout if own is None else layout.taken(own)

    def state_at(self, row: int) -> dict[str, Any]:
        """The packing state after rows before `row` were handed out (`row` at most the
        rows packed): from it, the rows from `row` on are the same.

        Raises:
            ValueError: a row past those packed, or before the notes kept.
        """
        if row > self._packer.row:
            raise ValueError(f"row {row} is past the {self._packer.row} rows packed")
        if row == self._packer.row:
            return self._packer.state()
        return self._from_note(row).state()

    def _note(self) -> None:
        """Note where packing is, unless a note is near: a note costs the open rows'
        spans, so one is taken only once at least as many pieces were packed since the
        last (a row asked again is packed again from a note at most that far back)."""
        packer = self._packer
        notes = self._notes
        if notes and (
            notes[-1][0] == packer.row or packer.tally.spans - self._noted_at < packer.open_spans()
        ):
            return
        notes.append((packer.row, packer.state()))
        self._noted_at = packer.tally.spans

    def _from_note(self, row: int) -> Packer:
        """A packer at `row`, packed again from the last note at or before it."""
        noted = [(at, state) for at, state in self._notes if at <= row]
        if not noted:
            raise ValueError(
                f"row {row} is before the rows whose packing state is kept (from "
                f"{self._notes[0][0] if self._notes else self._packer.row})"
            )
        at, state = noted[-1]
        packer = Packer(self._packer.index, self._packer.settings, state)
        if row > at:
            packer.take(row - at)
        return packer
