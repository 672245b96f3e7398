"""A packed stream's rows by global number (`devpolicy._apply.stream.packrows`): a step's
rows the same whatever the number of processes, rows asked again the same, and the state
after any row handed out resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._apply.stream.packed import Layout
from devpolicy._apply.stream.packing import PackSettings
from devpolicy._apply.stream.packrows import PackedRows
from tests.apply.stream.test_packing import corpus, rows_of

LENGTHS = [int(x) for x in np.random.default_rng(3).integers(2, 90, 1500)]
SETTINGS = PackSettings(64, 6, "shuffled", 21)


class TestPackedRows:
    @pytest.mark.parametrize("processes", [1, 2, 4, 8])
    def test_a_steps_rows_are_the_same_whatever_the_number_of_processes(
        self, processes: int
    ) -> None:
        """Each process packs the global rows and takes its own slice of the global batch
        of 16: put together, they are the global batch's rows."""
        _, index = corpus(LENGTHS)
        whole = PackedRows(index, SETTINGS)
        streams = [PackedRows(index, SETTINGS) for _ in range(processes)]
        per = 16 // processes
        for step in range(20):
            mine = [
                rows_of(s.step(step, 16, np.arange(p * per, (p + 1) * per)))
                for p, s in enumerate(streams)
            ]
            assert [row for part in mine for row in part] == rows_of(whole.step(step, 16))

    def test_rows_asked_again_or_skipped_to_are_the_same(self) -> None:
        _, index = corpus(LENGTHS)
        reference = PackedRows(index, SETTINGS).rows(0, 400)
        rows = PackedRows(index, SETTINGS)
        assert rows_of(rows.rows(0, 100)) == rows_of(reference)[:100]
        assert rows_of(rows.rows(250, 50)) == rows_of(reference)[250:300]  # skipped to
        assert rows_of(rows.rows(120, 60)) == rows_of(reference)[120:180]  # asked again
        assert rows_of(rows.rows(300, 100)) == rows_of(reference)[300:400]
        assert rows.tally.rows == 400  # each row counted once

    @settings(max_examples=40)
    @given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.data())
    def test_the_state_at_any_row_handed_out_resumes_to_the_same_rows(
        self, calls: list[int], data: st.DataObject
    ) -> None:
        """Rows asked a group at a time; the state at any row up to the last (a stream
        saves a step behind what it read ahead) resumes to the uninterrupted rows, at a
        global batch of any size."""
        _, index = corpus(LENGTHS)
        reference = rows_of(PackedRows(index, SETTINGS).rows(0, sum(calls) + 50))
        rows = PackedRows(index, SETTINGS)
        at = 0
        for count in calls:
            rows.rows(at, count)
            at += count
        row = data.draw(st.integers(0, at))
        saved = json.loads(json.dumps(rows.state_at(row)))
        resumed = PackedRows(index, SETTINGS, saved)
        batch = data.draw(st.integers(1, 9))
        got = [r for step in range(3) for r in rows_of(resumed.step(step, batch))]
        assert got == reference[row : row + 3 * batch]

    def test_a_row_past_those_packed_or_before_the_notes_has_no_state(self) -> None:
        _, index = corpus(LENGTHS)
        rows = PackedRows(index, SETTINGS)
        for step in range(400):
            rows.step(step, 4)
        with pytest.raises(ValueError, match="row 1601 is past the 1600 rows packed"):
            rows.state_at(1601)
        with pytest.raises(
            ValueError, match=r"row 3 is before the rows whose packing state is kept"
        ):
            rows.state_at(3)
        assert rows.state_at(1500)["row"] == 1500

    def test_an_empty_layout_past_the_end_of_a_finite_order(self) -> None:
        _, index = corpus([5, 6, 7])
        rows = PackedRows(index, PackSettings(8, 2, epochs=1))
        first = rows.rows(0, 10)
        assert first.rows == 3
        after: Layout = rows.rows(3, 4)
        assert (after.rows, after.counts.size) == (0, 0)
