"""Document boundaries in a batch of windows: segment ids and positions from a separator
token, so that a model can keep attention within a document.

A window cut from concatenated documents holds the end of one, whole ones, the start of
another. Given the token that separates them (an EOS ends a document, a BOS starts one),
each window's tokens get a segment id, 1 for the first document in the window, 2 for the
next, ... (0 is never used: grain's and MaxText's padding id), and a position, 0 at each
document's first token. Worked out for a whole group of batches at once from where the
separators are (they are rare: a document is hundreds of tokens or more): one comparison,
the separators found, then each segment's id and first position repeated over its
tokens, never a scan over every token with a running state. No JAX here.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np

#: Which side of a document the separator token sits on.
SeparatorIs = Literal["eos", "bos"]
SEPARATOR_KINDS = ("eos", "bos")
#: A batch's keys with segments, in the order they are placed: `windows(fields=...)`
#: renames them to a model's own (flax's lm1b: inputs, inputs_segmentation, ...).
FIELDS = ("tokens", "segment_ids", "positions")
#: The bytes a token's segment id and position add to a batch (two int32).
SEGMENT_BYTES = 8


def segments(
    windows: np.ndarray[Any, Any],
    separator: int,
    separator_is: SeparatorIs,
    out: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The segment ids and positions (int32) of every token of `windows` (..., length),
    written into `out` where given (two int32 arrays of the windows' shape).

    Example:
        >>> w = np.array([[5, 0, 6, 7, 0, 8]])
        >>> [a.tolist() for a in segments(w, 0, "eos")]
        [[[1, 1, 2, 2, 2, 3]], [[0, 1, 0, 1, 2, 0]]]
        >>> [a.tolist() for a in segments(w, 0, "bos")]
        [[[1, 2, 2, 2, 3, 3]], [[0, 0, 1, 2, 0, 1]]]
    """
    length = windows.shape[-1]
    total = windows.size
    flat = windows.reshape(-1)
    found = np.flatnonzero(flat == separator)
    if separator_is == "eos":
        found += 1  # the token after an EOS starts the next document
    # A segment starts at each row's first token, and at each separator within a row.
    rows = np.arange(0, total, length, dtype=np.int64)
    firsts = np.concatenate([rows, found[found % length != 0]])
    firsts.sort()  # distinct: a separator's start is never a row's first token
    lengths = np.diff(firsts, append=total)
    columns = firsts % length
    row_of_first = np.searchsorted(firsts, firsts - columns)
    ids = (np.arange(1, firsts.size + 1) - row_of_first).astype(np.int32)
    if out is None:
        out = (np.empty(windows.shape, np.int32), np.empty(windows.shape, np.int32))
    segment_ids, positions = out
    np.copyto(segment_ids.reshape(-1), np.repeat(ids, lengths))
    starts = np.repeat(columns.astype(np.int32), lengths)
    np.subtract(_columns(length, total // length), starts, out=positions.reshape(-1))
    return segment_ids, positions


@functools.lru_cache(maxsize=4)
def _columns(length: int, rows: int) -> np.ndarray[Any, Any]:
    """0 .. length - 1, `rows` times (int32, read-only): each token's column in its row."""
    columns = np.tile(np.arange(length, dtype=np.int32), rows)
    columns.flags.writeable = False
    return columns
