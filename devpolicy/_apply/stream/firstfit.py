"""First fit into a bounded number of open rows: the packing's hot loop, one piece at a
time, on plain lists (a few list operations a piece; numpy's per-call cost would be
several times a piece's).

The open rows are kept oldest first. The oldest one a piece fits is found by `bisect` on
the running maximum of their free tokens (nondecreasing: the first place it reaches the
piece is the oldest row with room), which is mended from that row on where the row's free
tokens fell (a row or two, as a rule: the newer rows have more room). A linear scan over
the open rows cost 1.7-2x this at 16 of them. No JAX here.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

#: The sentinels around the open rows' free tokens and running maximum: 0 before the
#: oldest (no piece fits it), this after the newest (above any row's free tokens).
SENTINEL = 1 << 62


def first_fit(
    lengths: list[int],
    q: int,
    want: int,
    length: int,
    most: int,
    rows: list[Any],
    free: list[int],
    top: list[int],
    out: list[list[int]],
) -> int:
    """Pack pieces `lengths[q:]` (their handles: q, q + 1, ...) into rows of `length`
    until `want` rows are closed into `out`; return the next piece.

    The open rows are `rows` (each a list of handles), `free` their free tokens and `top`
    the running maximum of `free`, oldest first, between a sentinel at each end (so that
    neither `bisect` nor the loops that mend `top` need a bound check); all three are
    changed in place. A piece goes into the oldest open row it fits (`bisect_left(top,
    piece)`), closing it where that fills it; where it fits none, a piece of `length`
    goes out alone, any other opens a row, closing the oldest where `most` are open.

    Example:
        >>> rows, free, top, out = [None, None], [0, SENTINEL], [0, SENTINEL], []
        >>> first_fit([3, 4, 2, 1, 5], 0, 9, 5, 2, rows, free, top, out)
        5
        >>> out, rows[1:-1], free[1:-1]
        ([[0, 2], [1, 3], [4]], [], [])
    """
    emit = out.append
    end = len(lengths)
    n = len(free) - 2
    highest = top[-2]
    room = want - len(out)
    while q < end and room:
        piece = lengths[q]
        q += 1
        if piece > highest:  # fits no open row
            if piece == length:
                emit([q - 1])
                room -= 1
                continue
            if n == most:  # the oldest closes to make room
                emit(rows.pop(1))
                room -= 1
                old = free.pop(1)
                top.pop(1)
                n -= 1
                j, v = 1, 0
                while top[j] == old:
                    fj = free[j]
                    if fj > v:
                        v = fj
                    top[j] = v
                    j += 1
            f = length - piece
            rows.insert(-1, [q - 1])
            free.insert(-1, f)
            v = top[-2]
            top.insert(-1, f if f > v else v)
            highest = top[-2]
            n += 1
            continue
        i = bisect_left(top, piece)
        old = free[i]
        f = old - piece
        v = top[i - 1]
        if f:
            free[i] = f
            rows[i].append(q - 1)
            if f > v:
                v = f
            top[i] = v
            j = i + 1
        else:  # full: it closes
            row = rows.pop(i)
            row.append(q - 1)
            emit(row)
            room -= 1
            free.pop(i)
            top.pop(i)
            n -= 1
            j = i
        # The running maximum held `old` (row i's free tokens before) from i on, up to
        # the first row with more: mended there.
        while top[j] == old:
            fj = free[j]
            if fj > v:
                v = fj
            top[j] = v
            j += 1
        highest = top[-2]
    return q
