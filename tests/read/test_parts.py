"""One range of rows over several parts (`devpolicy._read.parts`): the pieces of a window,
checked against the concatenation for any part sizes, and the parts' descriptors opened
as reads need them, a bounded number kept."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._read import parts, positional
from devpolicy.errors import HostViewError


@st.composite
def windows_over_parts(draw: st.DrawFn) -> tuple[list[int], int, list[int]]:
    """Part sizes (1 row and up, many shorter than a window), a window length that fits
    the whole range, and window starts within it."""
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=12))
    length = draw(st.integers(1, sum(sizes)))
    starts = draw(st.lists(st.integers(0, sum(sizes) - length), max_size=20))
    return sizes, length, starts


class TestPieces:
    @settings(max_examples=300, deadline=None)
    @given(windows_over_parts())
    def test_the_pieces_of_each_window_are_its_rows_of_the_concatenation(
        self, drawn: tuple[list[int], int, list[int]]
    ) -> None:
        """Any part sizes (length-1 parts, parts shorter than a window): each window's
        pieces, in order, are each within one part and together its `length` rows of the
        concatenated parts, exactly."""
        sizes, length, starts = drawn
        edges = np.cumsum([0, *sizes])
        arrays = [np.arange(lo, hi) for lo, hi in itertools.pairwise(edges)]
        window, part, within, rows, at = parts.pieces(edges, np.array(starts, np.int64), length)
        assert (np.diff(window) >= 0).all()
        assert (rows >= 1).all()
        assert (within + rows <= np.asarray(sizes)[part]).all()
        for w, start in enumerate(starts):
            mine = window == w
            got = np.concatenate(
                [
                    arrays[p][f : f + r]
                    for p, f, r in zip(part[mine], within[mine], rows[mine], strict=True)
                ]
            )
            np.testing.assert_array_equal(got, np.arange(start, start + length))
            assert at[mine].tolist() == np.cumsum([0, *rows[mine][:-1]]).tolist()

    def test_windows_within_one_part_are_one_piece_each(self) -> None:
        window, part, within, rows, at = parts.pieces(np.array([0, 10, 20]), np.array([2, 12]), 5)
        assert (window.tolist(), part.tolist(), within.tolist()) == ([0, 1], [0, 1], [2, 2])
        assert (rows.tolist(), at.tolist()) == ([5, 5], [0, 0])


def shard_files(folder: Path, count: int, rows: int) -> list[np.memmap]:
    """`count` raw uint16 files of `rows` tokens each, mapped: token i of the concatenation
    is i."""
    mapped = []
    for index in range(count):
        path = folder / f"shard_{index:04d}.bin"
        np.arange(index * rows, (index + 1) * rows, dtype=np.uint16).tofile(path)
        mapped.append(np.memmap(path, dtype=np.uint16, mode="r"))
    return mapped


def open_count(folder: Path) -> int:
    """Descriptors this process holds of files in `folder` (each `np.memmap` holds one of
    its own: Python's `mmap` keeps a duplicate)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder))
        except OSError:
            continue
    return found


class TestDescriptors:
    def test_many_files_are_opened_as_reads_need_them_and_few_kept(self, tmp_path: Path) -> None:
        """A reader of 100 files opens one at the start; reads that touch every file leave
        at most `OPEN_MOST` open, and close leaves none."""
        views = shard_files(tmp_path, 100, 50)
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        before = open_count(tmp_path)  # the memmaps' own
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        assert open_count(tmp_path) - before == reader.open_descriptors == 1
        starts = np.arange(0, 5000 - 8, 37, dtype=np.int64)
        out = np.empty((starts.size, 8), np.uint16)
        reader.read(starts, out)
        np.testing.assert_array_equal(out, starts[:, None] + np.arange(8))
        assert open_count(tmp_path) - before == reader.open_descriptors == parts.OPEN_MOST
        reader.close()
        assert open_count(tmp_path) == before

    def test_a_file_truncated_before_it_is_first_opened_is_named(self, tmp_path: Path) -> None:
        """A file past the first, cut short before a read first needs it: the error names
        that file, as the one-file reader's does."""
        views = shard_files(tmp_path, 40, 50)
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        os.truncate(tmp_path / "shard_0033.bin", 10)
        with pytest.raises(HostViewError, match=r"shard_0033\.bin.*truncated after it was mapped"):
            reader.read(np.array([33 * 50 + 5]), np.empty((1, 8), np.uint16))
        reader.close()
