"""Packed rows read (`devpolicy._apply.stream.packed`): the tokens gathered into their
places, padding only the pad token, segment ids and positions from the layout alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._apply.stream import documents
from devpolicy._apply.stream.packed import Layout, gather, placed, segments
from devpolicy._apply.stream.packing import Packer, PackSettings
from tests.apply.stream.test_packing import SEPARATOR, corpus

PAD = 65_000


@st.composite
def layouts(draw: st.DrawFn) -> tuple[np.ndarray, Layout]:
    lengths = draw(st.lists(st.integers(2, 30), min_size=1, max_size=40))
    tokens, index = corpus(lengths)
    settings_ = PackSettings(draw(st.integers(1, 32)), draw(st.integers(1, 4)), epochs=1)
    return tokens, Packer(index, settings_).take(draw(st.integers(1, 30)))


class TestGathered:
    @settings(max_examples=150)
    @given(layouts())
    def test_each_row_is_its_spans_then_pad_tokens_whose_segment_id_is_0(
        self, case: tuple[np.ndarray, Layout]
    ) -> None:
        """Row r holds its spans' tokens in order from column 0, then `pad` to its end;
        segment ids count the row's documents from 1 and are 0 over the padding (and
        only there); positions start at 0 with each document and are 0 over padding."""
        tokens, layout = case
        rows = gather(tokens.astype(np.int64), layout, PAD)
        ids, positions = segments(layout)
        b = layout.bounds.tolist()
        for r in range(layout.rows):
            expected, id_row, pos_row = [], [], []
            for k in range(b[r], b[r + 1]):
                start, count = int(layout.starts[k]), int(layout.counts[k])
                expected += tokens[start : start + count].tolist()
                id_row += [k - b[r] + 1] * count
                pos_row += list(range(count))
            padding = layout.length - len(expected)
            assert rows[r].tolist() == expected + [PAD] * padding
            assert ids[r].tolist() == id_row + [0] * padding
            assert positions[r].tolist() == pos_row + [0] * padding
        assert ids.dtype == positions.dtype == np.int32

    @settings(max_examples=60)
    @given(layouts())
    def test_the_ids_and_positions_of_the_documents_are_those_the_separators_give(
        self, case: tuple[np.ndarray, Layout]
    ) -> None:
        """Documents kept whole, each ending with its EOS: over a row's documents, the
        layout's ids and positions are `documents.segments`' from the tokens."""
        tokens, layout = case
        rows = gather(tokens, layout, PAD)
        ids, positions = segments(layout)
        by_scan = documents.segments(rows, SEPARATOR, "eos")
        real = ids != 0
        assert np.array_equal(ids[real], by_scan[0][real])
        assert np.array_equal(positions[real], by_scan[1][real])

    def test_each_span_is_placed_after_the_ones_before_it_in_its_row(self) -> None:
        layout = Layout(0, 4, np.array([0, 2, 3]), np.array([10, 0, 5]), np.array([2, 2, 3]))
        starts, counts, places = placed(layout)
        assert (starts.tolist(), counts.tolist(), places.tolist()) == (
            [10, 0, 5],
            [2, 2, 3],
            [0, 2, 4],
        )

    def test_a_processs_rows_are_taken_in_the_order_asked(self) -> None:
        layout = Layout(
            0, 4, np.array([0, 2, 3, 4]), np.array([10, 0, 5, 7]), np.array([2, 2, 3, 1])
        )
        mine = layout.taken(np.array([2, 0]))
        assert (mine.bounds.tolist(), mine.starts.tolist(), mine.counts.tolist()) == (
            [0, 1, 3], [7, 10, 0], [1, 2, 2],
        )  # fmt: skip

    def test_rows_are_written_into_the_buffer_given(self) -> None:
        tokens, index = corpus([3, 4, 5])
        layout = Packer(index, PackSettings(6, 2, epochs=1)).take(9)
        out = np.full((layout.rows, 6), 7, np.int32)
        ids = np.empty((layout.rows, 6), np.int32), np.empty((layout.rows, 6), np.int32)
        assert gather(tokens, layout, -1, out) is out
        assert segments(layout, ids)[0] is ids[0]
        # 3 and 4 tokens do not share a row of 6; at 2 rows open the oldest closes.
        assert out.tolist() == [[1, 1, 0, -1, -1, -1], [2, 2, 2, 0, -1, -1], [3, 3, 3, 3, 0, -1]]
