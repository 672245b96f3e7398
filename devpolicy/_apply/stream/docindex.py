"""The documents of a 1-D token array: the spans between separator tokens, found in one
pass over the tokens a chunk at a time (`Finder`; memory stays flat, and no mask of the
whole array is ever made), and the index that holds them (`DocumentIndex`; kept in a
file by `indexfile`).

A document is what `documents` calls one: with `separator_is="eos"` it ends with its
separator (the tokens after the last one are a last document, without it); with "bos" it
starts with it (the tokens before the first one are a first document). A separator alone
(two in a row, or a "bos" last) holds no token of a document: it is no document, and the
index counts it (`alone`) instead of giving every such one a row's place and an id. No
JAX here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._read.pages import in_numpy_memory, maps_line
from .documents import SEPARATOR_KINDS, SeparatorIs
from .shards import Shards

#: Tokens read and searched at once while indexing (8 MiB of uint16).
CHUNK = 1 << 22
#: A document: its start and length, little-endian.
SPAN = np.dtype("<u8")


@dataclass(frozen=True, slots=True)
class TokenFile:
    """Where a 1-D token array lies in a file: the file, the byte offset of its first
    token, the tokens' dtype and their count."""

    path: Path
    offset: int
    dtype: np.dtype[Any]
    count: int


@dataclass(frozen=True, slots=True)
class DocumentIndex:
    """The documents of a token array: `spans` (documents, 2) of uint64 (start, length),
    a mapping of the index file `path` (None: in memory); `alone`, the separators that
    were no document; `longest`, the longest document's tokens; `covered`, the tokens in
    documents."""

    spans: np.ndarray[Any, Any]
    separator: int
    separator_is: SeparatorIs
    tokens: int
    alone: int
    longest: int
    covered: int
    path: Path | None = None
    #: The documents' digest (their (start, length) pairs' bytes, as an index file holds
    #: them): what a packing state is matched against (the same count of other
    #: documents would pack other rows).
    digest: str = ""

    def __len__(self) -> int:
        return int(self.spans.shape[0])


def checked_separator(
    separator: object, separator_is: object, dtype: Any
) -> tuple[int, SeparatorIs]:
    """The separator token and its side, checked against the tokens' dtype.

    Raises:
        ValueError: an unknown side, or a separator no token of `dtype` can be; each
            naming the argument and what it accepts.
        TypeError: a separator that is no int.
    """
    if separator_is not in SEPARATOR_KINDS:
        raise ValueError(
            f"windows separator_is must be one of {SEPARATOR_KINDS}, got {separator_is!r}"
        )
    if isinstance(separator, bool) or not isinstance(separator, (int, np.integer)):
        raise TypeError(f"windows separator must be an int (a token id), got {separator!r}")
    kind = np.dtype(dtype)
    if kind.kind not in "iu":
        raise ValueError(f"windows pack= needs integer token ids, got tokens of {kind}")
    info = np.iinfo(kind)
    if not info.min <= int(separator) <= info.max:
        raise ValueError(
            f"windows separator={int(separator)} cannot occur in tokens of {kind} "
            f"({info.min} to {info.max}): no document would ever end"
        )
    side: SeparatorIs = "bos" if separator_is == "bos" else "eos"
    return int(separator), side


class Finder:
    """The documents of tokens handed in order, chunk by chunk (`add`), then `end`: each
    call's documents as (k, 2) uint64 pairs; the document a chunk's edge cuts is carried.

    A span between two boundaries (each separator's own place with "bos", the place after
    it with "eos") is a document unless it is empty or a separator alone: one token that
    a separator opens ("bos") or closes ("eos").
    """

    def __init__(self, separator: int, separator_is: SeparatorIs) -> None:
        self._separator = separator
        self._eos = separator_is == "eos"
        self._start = 0  # where the document not yet ended starts
        self._opened = False  # whether a separator opens it ("bos")
        self.alone = 0

    def add(self, chunk: np.ndarray[Any, Any], at: int) -> np.ndarray[Any, Any]:
        found = np.flatnonzero(chunk == self._separator).astype(np.int64)
        found += at + 1 if self._eos else at
        if not found.size:
            return pairs(found, found)
        starts = np.concatenate(([self._start], found[:-1]))
        lengths = found - starts
        if self._eos:
            solo = lengths == 1  # every span ends with its separator
        else:
            solo = lengths == 1
            solo[0] &= self._opened  # the tokens before the first BOS: a document
            self._opened = True
        self._start = int(found[-1])
        self.alone += int(solo.sum())
        keep = ~solo & (lengths > 0)
        return pairs(starts[keep], found[keep])

    def end(self, total: int) -> np.ndarray[Any, Any]:
        start = self._start
        none = np.zeros(0, np.int64)
        if start >= total:
            return pairs(none, none)
        if self._opened and total - start == 1:  # a BOS the last token
            self.alone += 1
            return pairs(none, none)
        return pairs(np.asarray([start]), np.asarray([total]))


def pairs(starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    pairs = np.empty((starts.size, 2), SPAN)
    pairs[:, 0] = starts
    pairs[:, 1] = ends - starts
    return pairs


def chunks(tokens: np.ndarray[Any, Any] | Shards) -> Iterator[np.ndarray[Any, Any]]:
    """The tokens a `CHUNK` at most at a time, in order: shards one after another (a
    chunk never spans two: a document that does is carried by the `Finder`)."""
    for view in tokens.views if isinstance(tokens, Shards) else [tokens]:
        for at in range(0, view.shape[0], CHUNK):
            yield view[at : at + CHUNK]


def find_documents(
    tokens: np.ndarray[Any, Any] | Shards, separator: int, separator_is: SeparatorIs
) -> tuple[np.ndarray[Any, Any], int]:
    """The documents of in-memory `tokens` (documents, 2) and the separators alone; of
    shards, those of their concatenation (a document may span shards).

    Example:
        >>> spans, alone = find_documents(np.array([5, 0, 0, 6, 7, 0, 8]), 0, "eos")
        >>> spans.tolist(), alone
        ([[0, 2], [3, 3], [6, 1]], 1)
        >>> shards = Shards([np.array([5, 0, 0, 6]), np.array([7, 0, 8])])
        >>> find_documents(shards, 0, "eos")[0].tolist()
        [[0, 2], [3, 3], [6, 1]]
    """
    finder = Finder(separator, separator_is)
    parts, at = [], 0
    for chunk in chunks(tokens):
        parts.append(finder.add(chunk, at))
        at += chunk.shape[0]
    parts.append(finder.end(tokens.shape[0]))
    return np.concatenate(parts), finder.alone


def in_memory(
    tokens: np.ndarray[Any, Any] | Shards, separator: int, separator_is: SeparatorIs
) -> DocumentIndex:
    """The index of tokens (or shards) in memory, kept in memory."""
    spans, alone = find_documents(tokens, separator, separator_is)
    spans.flags.writeable = False
    digest = hashlib.blake2b(spans.tobytes(), digest_size=16).hexdigest()
    lengths = spans[:, 1]
    return DocumentIndex(
        spans, separator, separator_is, int(tokens.shape[0]), alone,
        int(lengths.max()) if lengths.size else 0, int(lengths.sum()), None, digest,
    )  # fmt: skip


def token_file(view: np.ndarray[Any, Any]) -> TokenFile | None:
    """The file a 1-D token view maps (a `np.memmap`, a mapped `load_file` tensor), or
    None: tokens in memory, or a mapping that is no file's as it is on disk (a private
    writable one may have been written to, a file since removed).

    Example:
        >>> token_file(np.arange(10)) is None
        True
    """
    if not token_file_possible(view):
        return None
    return mapped_file(view, maps_line(view.ctypes.data))


def token_file_possible(view: np.ndarray[Any, Any]) -> bool:
    """Whether a view may be a token file's mapping: 1-D, contiguous, not empty, and not
    in memory numpy allocated."""
    return bool(
        view.ndim == 1 and view.size and view.flags.c_contiguous and not in_numpy_memory(view)
    )


def mapped_file(view: np.ndarray[Any, Any], fields: list[str] | None) -> TokenFile | None:
    """`token_file` of a 1-D, contiguous, non-empty view, from the `/proc/self/maps` line
    holding its first byte (`fields`: read once for many views, `pages.maps_lines`)."""
    if fields is None or len(fields) < 6 or not fields[5].startswith("/"):
        return None
    address, perms, offset, _, inode, path = fields
    if (perms[1:2] == "w" and perms[3:4] != "s") or path.endswith(" (deleted)"):
        return None
    low, _, high = address.partition("-")
    if view.ctypes.data + view.nbytes > int(high, 16):
        return None
    try:
        if os.stat(path).st_ino != int(inode):
            return None
    except OSError:
        return None
    at = int(offset, 16) + view.ctypes.data - int(low, 16)
    return TokenFile(Path(path), at, view.dtype, int(view.shape[0]))
