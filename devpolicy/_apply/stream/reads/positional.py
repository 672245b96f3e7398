"""Windows read from the file by position, a `preadv` a window on the caller's thread:
nothing is mapped, so nothing is left to give back, and a file that shrank is an error
naming it. On other threads the hand-offs cost more than the overlap saves. No JAX here."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...._read.positional import FileWindows
from . import ReadPath


class PositionalReads(ReadPath):
    """Reads through `reader` (the file, or a mixture's files, opened once) windows of
    `window` shape (the length, then a row's) and `dtype`."""

    __slots__ = ("_out", "reader")

    key = "file"
    reads = "file"
    way: str | None = "preadv"

    def __init__(self, reader: FileWindows, window: tuple[int, ...], dtype: Any) -> None:
        self.reader = reader
        self._out = (window, np.dtype(dtype))

    def gather(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        shape, dtype = self._out
        read = np.empty((*offsets.shape, *shape), dtype)
        self.reader.read(offsets, read)
        return read

    def read_into(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]],
                  whole: np.ndarray[Any, Any] | None) -> bool:  # fmt: skip
        self.reader.read_batches(offsets, batches)
        return True

    def read_now(self, offsets: np.ndarray[Any, Any], batches: list[np.ndarray[Any, Any]]) -> bool:
        self.reader.read_batches(offsets, batches, direct=True)
        return True

    @property
    def opens(self) -> bool:
        return self.reader.opens_files

    @property
    def first_now(self) -> bool:
        return self.reader.first_from_mappings

    def settle(self) -> None:
        self.reader.settle()

    def close(self, *, sweep: bool = False) -> None:
        self.reader.close()
