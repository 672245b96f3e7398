"""One range of rows over several parts (`devpolicy._read.parts`): the pieces of a window,
checked against the concatenation for any part sizes, and the parts' descriptors opened
as reads need them, a bounded number kept."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

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


def read_all(reader: positional.FileWindows, starts: np.ndarray, length: int) -> np.ndarray:
    out = np.empty((starts.size, length), np.uint16)
    reader.read(starts, out)
    return out


class TestMemmapShards:
    def test_a_memmaps_file_is_found_without_reading_the_maps(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Shards that are `np.memmap`s (whole files, one at an offset, a slice of one): the
        reader learns each file and offset from the memmap itself, never reading
        `/proc/self/maps`, and reads the concatenation's windows exactly."""
        views = shard_files(tmp_path, 3, 50)
        np.arange(140, 250, dtype=np.uint16).tofile(tmp_path / "at_offset.bin")
        views.append(np.memmap(tmp_path / "at_offset.bin", np.uint16, mode="r", offset=20))
        np.arange(240, 400, dtype=np.uint16).tofile(tmp_path / "sliced.bin")
        views.append(np.memmap(tmp_path / "sliced.bin", np.uint16, mode="r")[10:])

        def no_maps(*_: object) -> None:
            raise AssertionError("the maps were read")

        monkeypatch.setattr(positional, "maps_lines", no_maps)
        monkeypatch.setattr(parts, "maps_line", no_maps)
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        assert all(parts.memmap_part(view) is not None for view in views)
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        starts = np.arange(0, int(edges[-1]) - 8, 7, dtype=np.int64)
        np.testing.assert_array_equal(read_all(reader, starts, 8), starts[:, None] + np.arange(8))
        reader.close()

    @pytest.mark.parametrize("lookup", ["map_files", "maps"])
    def test_a_file_replaced_at_its_path_is_never_read(
        self, lookup: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A shard's file renamed over by another after it was mapped, before the stream
        first opens it: its windows are still the mapped file's, never the new file's,
        whether the mapping's identity comes from `/proc/self/map_files` or (where that
        lookup fails) from its maps line."""
        views = shard_files(tmp_path, 40, 50)
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        if lookup == "maps":
            stat = os.stat

            def no_map_files(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
                if str(path).startswith("/proc/self/map_files/"):
                    raise PermissionError(path)
                return stat(path, *args, **kwargs)

            monkeypatch.setattr(parts.os, "stat", no_map_files)
        planted = tmp_path / "planted.bin"
        np.full(50, 9, np.uint16).tofile(planted)
        os.replace(planted, tmp_path / "shard_0033.bin")
        starts = np.array([33 * 50 + 5, 32 * 50 + 45], np.int64)
        np.testing.assert_array_equal(read_all(reader, starts, 8), starts[:, None] + np.arange(8))
        reader.close()

    def test_a_shards_mapping_is_looked_up_once_and_a_file_renamed_over_it_later_never_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """40 memmap shards read through twice (only `OPEN_MOST` kept open between, so most
        are opened twice): each mapping's file is looked up in `/proc/self/map_files` once,
        and a file renamed over a closed shard's path between its two opens is never
        read."""
        stat, lookups = os.stat, []

        def counted(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            if str(path).startswith("/proc/self/map_files/"):
                lookups.append(path)
            return stat(path, *args, **kwargs)

        monkeypatch.setattr(parts.os, "stat", counted)
        views = shard_files(tmp_path, 40, 50)
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        starts = np.arange(40, dtype=np.int64) * 50 + 5  # one window a shard
        np.testing.assert_array_equal(read_all(reader, starts, 8), starts[:, None] + np.arange(8))
        assert len(lookups) == 40
        assert reader.open_descriptors == parts.OPEN_MOST  # shards 0-7 closed
        planted = tmp_path / "planted.bin"
        np.full(50, 9, np.uint16).tofile(planted)
        os.replace(planted, tmp_path / "shard_0003.bin")
        np.testing.assert_array_equal(read_all(reader, starts, 8), starts[:, None] + np.arange(8))
        assert len(lookups) == 40
        reader.close()

    def test_memmaps_taken_all_at_once_are_each_as_taken_alone(self, tmp_path: Path) -> None:
        """Whole 1-D memmaps (named by a str or a pathlib path, one at an offset): taken in
        one pass, each part is what `memmap_part` makes of it alone; a list with one that
        is not such a memmap (a slice of one, copy-on-write, 2-D, memory) is left to
        `memmap_part`, one by one."""
        views: list[Any] = shard_files(tmp_path, 3, 50)
        views.append(np.memmap(str(tmp_path / "shard_0001.bin"), np.uint16, mode="r"))
        np.arange(140, 250, dtype=np.uint16).tofile(tmp_path / "at_offset.bin")
        views.append(np.memmap(tmp_path / "at_offset.bin", np.uint16, mode="r+", offset=20))
        assert list(parts.memmap_parts(views) or ()) == [parts.memmap_part(view) for view in views]
        others = [
            views[0][10:],
            np.memmap(tmp_path / "shard_0002.bin", np.uint16, mode="c"),
            np.memmap(tmp_path / "shard_0002.bin", np.uint16, mode="r", shape=(5, 10)),
            np.arange(5, dtype=np.uint16),
        ]
        for other in others:
            assert parts.memmap_parts([*views, other]) is None

    def test_a_memmap_whose_offset_was_changed_is_refused_not_misread(self, tmp_path: Path) -> None:
        """A memmap whose `offset` no longer says where it lies in its mapping: its file
        is not opened (an error naming it), never read at the wrong offset."""
        views = shard_files(tmp_path, 40, 50)
        views[33].offset = 6
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        with pytest.raises(HostViewError, match=r"shard_0033\.bin.*can no longer be opened"):
            read_all(reader, np.array([33 * 50 + 5]), 8)
        reader.close()

    def test_a_copy_on_write_memmap_among_shards_is_not_read_from_its_file(
        self, tmp_path: Path
    ) -> None:
        """A shard mapped copy-on-write (`mode="c"`: its pages may differ from its file's)
        makes the list no reader of files (the stream gathers from memory instead)."""
        views = shard_files(tmp_path, 3, 50)
        views[1] = np.memmap(tmp_path / "shard_0001.bin", np.uint16, mode="c")
        views[1][:] = 7
        assert parts.memmap_part(views[1]) is None
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        assert positional.mapped_files(views, 8, edges, io_uring=False) is None

    def test_a_readers_identity_is_its_files_and_offsets_whatever_the_memmap_objects(
        self, tmp_path: Path
    ) -> None:
        """The key a stream's trials remember a source by: two readers of the same shard
        files (mapped twice, named by a str or a pathlib path) share it; a shard mapped
        at another offset, or the files in another order, give another."""
        views = shard_files(tmp_path, 3, 50)
        again = [np.memmap(str(view.filename), np.uint16, mode="r") for view in views]
        offset = [*views[:2], np.memmap(tmp_path / "shard_0002.bin", np.uint16, mode="r", offset=2)]

        def identity(views: list[Any]) -> object:
            edges = np.cumsum([0, *(v.shape[0] for v in views)])
            reader = positional.mapped_files(views, 8, edges, io_uring=False)
            assert reader is not None
            reader.close()
            return reader.identity

        first = identity(views)
        assert identity(again) == first
        assert hash(identity(again)) == hash(first)
        assert identity(offset) != first
        assert identity(views[::-1]) != first

    def test_memmap_shards_parts_are_made_as_reads_ask_for_them(self, tmp_path: Path) -> None:
        """A reader of 100 memmap shards reads the concatenation exactly, each part's
        record (its file and offset) made as a read asks for it: a window of one shard
        reads that shard's file at the shard's offset, at any index of the list."""
        views = shard_files(tmp_path, 100, 50)
        found = parts.memmap_parts(views)
        assert found is not None
        assert len(found) == 100
        assert found[57] == parts.memmap_part(views[57])
        assert found[-1] == parts.memmap_part(views[99])
        assert found[98:] == [parts.memmap_part(views[98]), parts.memmap_part(views[99])]
        edges = np.cumsum([0, *(v.shape[0] for v in views)])
        reader = positional.mapped_files(views, 8, edges, io_uring=False)
        assert reader is not None
        starts = np.array([57 * 50 + 3, 99 * 50 + 42, 12 * 50 + 45], np.int64)
        np.testing.assert_array_equal(read_all(reader, starts, 8), starts[:, None] + np.arange(8))
        reader.close()

    def test_a_memmap_part_is_whole_only_where_its_file_and_its_offset_say_so(
        self, tmp_path: Path
    ) -> None:
        """Before a read through a shard's mapping: a memmap (at offset 0, at an offset
        not a multiple of the page, a slice of one) is whole while its file holds it; one whose
        `offset` was changed, or whose mapping was closed, is not (nothing is read through
        it); one whose file was cut short is an error naming it (never SIGBUS)."""
        data = np.arange(70_000, dtype=np.uint16)
        data.tofile(tmp_path / "a.bin")
        at = np.memmap(tmp_path / "a.bin", np.uint16, mode="r", offset=65_540)
        views = [
            np.memmap(tmp_path / "a.bin", np.uint16, mode="r"),
            at,
            np.memmap(tmp_path / "a.bin", np.uint16, mode="r", offset=6)[100:200],
        ]
        for view in views:
            part = parts.memmap_part(view)
            assert part is not None
            assert part.whole()
        moved = np.memmap(tmp_path / "a.bin", np.uint16, mode="r", offset=8)
        moved.offset = 10
        part = parts.memmap_part(moved)
        assert part is not None
        assert not part.whole()
        closed = np.memmap(tmp_path / "a.bin", np.uint16, mode="r", offset=8)
        part = parts.memmap_part(closed)
        assert part is not None
        closed._mmap.close()  # type: ignore[attr-defined]
        assert not part.whole()
        part = parts.memmap_part(at)
        assert part is not None
        os.truncate(tmp_path / "a.bin", 65_600)
        with pytest.raises(HostViewError, match=r"a\.bin: the file is 65,600 bytes"):
            part.whole()
