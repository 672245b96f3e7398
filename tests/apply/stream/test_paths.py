"""A stream's read paths (`devpolicy._apply.stream.paths`): opened at the start, the one
in use changed only between groups, by the trials that time the safe ones, or to reading
by position where the path in use gives up; `reads_why` says which and why."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from devpolicy import ReadOptions
from devpolicy._apply.stream.groups import every_window
from devpolicy._apply.stream.paths import StreamPaths
from devpolicy._apply.stream.reads.opening import Source
from tests.apply.conftest import batched_reads_here
from tests.apply.stream.test_opening import LENGTH, mapped, run
from tests.apply.streams import SWITCHING, resident

pytestmark = pytest.mark.skipif(
    __import__("devpolicy._read.pages", fromlist=["_MADVISE"])._MADVISE is None,
    reason="file mappings are Linux's here",
)


class TestPathsOfAStream:
    def test_tokens_in_memory_are_gathered_from_memory_and_nothing_is_timed(self) -> None:
        tokens = np.arange(1000, dtype=np.uint16)
        paths = StreamPaths(Source(tokens, every_window(tokens, 8), None, 8, True), ReadOptions())
        assert (paths.reads, paths.opened) == ("memory", False)
        paths.open()
        assert paths.read is not None
        assert (paths.reads, paths.timing, paths.grouped()) == ("memory", None, False)
        assert "in memory" in paths.reads_why
        paths.next_path(0)  # nothing to change to
        assert paths.reads == "memory"
        paths.close(child=None)
        assert paths.reads_with is None

    def test_a_file_read_by_position_says_how_once_closed(self, tmp_path: Path) -> None:
        tokens = devpolicy.host_view(mapped(tmp_path / "t.safetensors"))
        paths = StreamPaths(
            Source(tokens, every_window(tokens, LENGTH), None, LENGTH, True),
            ReadOptions(path="file", io_uring=False),
        )
        paths.open()
        assert paths.reads == "file"
        paths.close(child=None)
        assert paths.reads_with == "preadv"


class TestChangingPath:
    def test_kept_pages_are_given_back_once_memory_runs_low_and_no_batch_changes(
        self, tmp_path: Path
    ) -> None:
        """Memory looked at every group, and counted low (below all of the host's RAM):
        the stream gives the mapping's pages back and reads by position from then on,
        every batch still its own step's."""
        reads = ReadOptions(measure=False, io_uring=False, keep_check_every=1, low_memory_share=1.0)
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, reads, steps=200)
        assert (ended["reads"], ended["reads_with"]) == ("file", "preadv")
        assert "its pages kept" in ended["reads_why"]
        assert "this process can still use fell to" in ended["reads_why"]
        assert resident(devpolicy.host_view(tokens)) == 0

    @pytest.mark.parametrize("uring", [True, False], ids=["io_uring", "no io_uring"])
    def test_where_both_paths_are_safe_the_stream_times_them_and_says_so(
        self, tmp_path: Path, uring: bool
    ) -> None:
        """Warm tokens that fit, a file that can be read by position: both paths are safe,
        so the stream times them on its own groups, in turns (here a turn of one group and
        a trial every group: it switches path nearly every group), every batch still its
        own step's; `reads_why` says what was measured."""
        if uring and not batched_reads_here():
            pytest.skip("io_uring cannot be had here")
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, replace(SWITCHING, io_uring=uring), steps=2000)
        # Each trial reads a group by each path: its end, a switch at least once.
        trials = re.search(
            r"timed on its own groups \((.+?)\), (\d+) time\(s\)", ended["reads_why"]
        )
        assert trials is not None, ended["reads_why"]
        assert sorted(trials.group(1).split(", ")) == ["file", "keep"]
        assert int(trials.group(2)) >= 10, ended["reads_why"]
        assert "measured: " in ended["reads_why"]


class TestTheKeptMappingOpenedWhenTimed:
    """Through a ring the file is read by position first; whether its kept mapping is
    safe (the page cache sampled, memory read) and its pager are looked at when the
    trials first time it, not before a fresh stream's first batch."""

    def paths(self, tmp_path: Path, reads: ReadOptions) -> StreamPaths:
        if not batched_reads_here():
            pytest.skip("io_uring cannot be had here")
        tokens = devpolicy.host_view(mapped(tmp_path / "t.safetensors"))
        np.asarray(tokens).sum()  # warm: every page read once
        source = Source(tokens, every_window(tokens, LENGTH), None, LENGTH, True)
        return StreamPaths(source, reads)

    def test_a_fresh_stream_opens_only_the_file_read_by_position(self, tmp_path: Path) -> None:
        paths = self.paths(tmp_path, SWITCHING)
        paths.open()
        try:
            assert paths.reads == "file"
            assert paths.timing is not None
            assert paths.timing.candidates == ["file", "keep"]
            assert sorted(paths._paths) == ["file"]
        finally:
            paths.close(child=None)

    def test_the_kept_mapping_is_opened_when_the_trials_first_time_it(self, tmp_path: Path) -> None:
        paths = self.paths(tmp_path, SWITCHING)
        paths.open()
        try:
            seen = []
            for step in range(20):
                paths.next_path(step)
                seen.append(paths.reads)
            assert "mapping" in seen, seen
            assert sorted(paths._paths) == ["file", "keep"]
        finally:
            paths.close(child=None)

    def test_a_kept_mapping_unsafe_by_then_ends_the_trials_saying_why(self, tmp_path: Path) -> None:
        """No room for the mapping once it would be timed (`keep_of_ram=0`: no share of
        the host's RAM may be kept): never opened, the file read by position on."""
        paths = self.paths(tmp_path, replace(SWITCHING, keep_of_ram=0.0))
        paths.open()
        try:
            for step in range(20):
                paths.next_path(step)
                assert paths.reads == "file"
            assert paths.timing is None
            assert sorted(paths._paths) == ["file"]
            assert "the kept mapping was not timed: the tokens" in paths.reads_why
            assert "RAM" in paths.reads_why
        finally:
            paths.close(child=None)
