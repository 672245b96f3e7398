"""First fit into a bounded number of open rows (`devpolicy._apply.stream.firstfit`):
the `bisect` on the running maximum picks what a plain scan of the open rows picks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._apply.stream.firstfit import SENTINEL, first_fit


def by_scan(pieces: list[int], length: int, most: int) -> tuple[list[list[int]], list[list[int]]]:
    """The rows closed and left open, by the plainest first fit: scan the open rows."""
    free: list[int] = []
    rows: list[list[int]] = []
    out: list[list[int]] = []
    for q, piece in enumerate(pieces):
        for i, room in enumerate(free):
            if room >= piece:
                rows[i].append(q)
                free[i] -= piece
                if not free[i]:
                    out.append(rows.pop(i))
                    free.pop(i)
                break
        else:
            if piece == length:
                out.append([q])
                continue
            if len(free) == most:
                out.append(rows.pop(0))
                free.pop(0)
            rows.append([q])
            free.append(length - piece)
    return out, rows


def fresh() -> tuple[list, list[int], list[int]]:
    return [None, None], [0, SENTINEL], [0, SENTINEL]


@st.composite
def packings(draw: st.DrawFn) -> tuple[list[int], int, int]:
    length = draw(st.integers(1, 40))
    pieces = draw(st.lists(st.integers(1, length), max_size=300))
    return pieces, length, draw(st.integers(1, 12))


class TestFirstFit:
    @settings(max_examples=300)
    @given(packings())
    def test_the_rows_are_a_plain_scans_first_fit(self, case: tuple[list[int], int, int]) -> None:
        """Every piece goes where a scan of the open rows, oldest first, puts it: the
        oldest row with room; a whole row's piece alone; else a new row, the oldest
        closing first at `most` open; a full row closes."""
        pieces, length, most = case
        rows, free, top = fresh()
        out: list[list[int]] = []
        assert first_fit(pieces, 0, len(pieces) + 1, length, most, rows, free, top, out) == len(
            pieces
        )
        assert (out, rows[1:-1]) == by_scan(pieces, length, most)
        assert len(rows) - 2 <= most
        assert top[1:-1] == [max(free[1 : i + 1]) for i in range(1, len(free) - 1)]
        assert (rows[0], rows[-1], free[0], free[-1], top[0], top[-1]) == (
            None, None, 0, SENTINEL, 0, SENTINEL,
        )  # fmt: skip

    @settings(max_examples=200)
    @given(packings(), st.lists(st.integers(1, 5), min_size=1, max_size=40))
    def test_stopping_at_each_rows_wanted_and_going_on_gives_the_same_rows(
        self, case: tuple[list[int], int, int], wants: list[int]
    ) -> None:
        """Asked for a few rows at a time, it stops right after the piece that closed the
        last one, and goes on from there: the rows are those of one call."""
        pieces, length, most = case
        rows, free, top = fresh()
        out: list[list[int]] = []
        q = 0
        for want in wants:
            before = len(out)
            q = first_fit(pieces, q, before + want, length, most, rows, free, top, out)
            assert len(out) == before + want or q == len(pieces)
        q = first_fit(pieces, q, len(pieces) + 1, length, most, rows, free, top, out)
        assert (out, rows[1:-1]) == by_scan(pieces, length, most)

    def test_no_row_holds_more_than_its_length(self) -> None:
        """Rows of 10 from pieces of 1 to 10: each closed row's pieces sum to at most 10."""
        pieces = [(7 * k) % 10 + 1 for k in range(500)]
        rows, free, top = fresh()
        out: list[list[int]] = []
        first_fit(pieces, 0, 10**6, 10, 4, rows, free, top, out)
        assert all(sum(pieces[q] for q in row) <= 10 for row in out)
        assert sorted(q for row in out + rows[1:-1] for q in row) == list(range(500))
