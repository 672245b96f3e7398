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
