"""Which way a stream copies the windows of a file mapping, chosen by what the file and
the machine are (issue 50): kept mapped where the tokens are warm and fit in the memory
left, read by position where they are larger or cold, given up when memory runs low;
and `stream_ended` says which ran and why."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply.stream import cutting, paging
from tests.helpers import drop_from_page_cache, policy_of

from .streams import TOKEN_RULES, assert_exact, counting_file, resident

COUNT = 2**22  # 16 MiB of uint32 tokens
LENGTH = 257
BATCH = 16
pytestmark = pytest.mark.skipif(paging._MADVISE is None, reason="file mappings are Linux's here")


def mapped(path: Path, *, cold: bool = False) -> Any:
    """Dense tokens (token i == i) loaded mapped from `path`: warm (just written), or cold
    (written to disk, then dropped from the page cache)."""
    counting_file(path, COUNT)
    if cold:
        drop_from_page_cache(path)
    return devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]


def run(tokens: Any, steps: int = 40, seed: int = 3) -> dict[str, Any]:
    """`steps` random batches, each checked against the tokens; the `stream_ended` event."""
    with capture_logs() as logs:
        stream = devpolicy.windows(
            tokens, LENGTH, BATCH, order="random", seed=seed, steps=steps, policy=policy_of()
        )
        for step, batch in enumerate(stream):
            assert_exact(batch, seed, step, LENGTH, COUNT)
    (ended,) = [e for e in logs if e["event"] == "stream_ended"]
    assert ended["batches"] == steps
    return ended


class TestChoice:
    def test_warm_tokens_that_fit_are_gathered_from_the_mapping_their_pages_kept(
        self, tmp_path: Path
    ) -> None:
        """A file just written (in the page cache) and far smaller than the memory left:
        gathered from the mapping, nothing given back, and the event says why."""
        ended = run(mapped(tmp_path / "t.safetensors"))
        assert (ended["reads"], ended["reads_with"]) == ("mapping", None)
        assert "in the page cache" in ended["reads_why"]
        assert "its pages kept while memory allows" in ended["reads_why"]

    def test_cold_tokens_are_read_by_position_many_reads_in_flight(self, tmp_path: Path) -> None:
        """The file dropped from the page cache: faults through a mapping would wait on the
        disk one page at a time, so the stream reads by position, a group at once."""
        tokens = mapped(tmp_path / "t.safetensors", cold=True)
        share = paging.cached_share(devpolicy.host_view(tokens))
        if share is None or share >= cutting.WARM_SHARE:
            pytest.skip(f"this filesystem kept the file cached ({share})")
        ended = run(tokens)
        assert ended["reads"] == "file"
        assert "in the page cache: read from the file by position" in ended["reads_why"]

    def test_tokens_larger_than_the_share_of_memory_left_are_read_by_position(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Tokens that would take more than `KEEP_SHARE` of the memory left (here the share
        made tiny, the memory measured for real) are read by position: nothing mapped."""
        monkeypatch.setattr(cutting, "KEEP_SHARE", 1e-9)
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens)
        assert ended["reads"] == "file"
        assert "this process can still use: read from the file by position" in ended["reads_why"]
        assert resident(devpolicy.host_view(tokens)) == 0

    def test_kept_pages_are_given_back_once_memory_runs_low_and_no_batch_changes(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Memory looked at every group, and counted low (below all of the host's RAM):
        the stream gives the mapping's pages back and reads by position from then on,
        every batch still its own step's."""
        monkeypatch.setattr(cutting, "KEEP_CHECK_EVERY", 1)
        monkeypatch.setattr(cutting, "LOW_MEMORY_SHARE", 1.0)
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, steps=200)
        assert ended["reads"] == "file"
        assert "its pages kept" in ended["reads_why"]
        assert "this process can still use fell to" in ended["reads_why"]
        assert resident(devpolicy.host_view(tokens)) == 0

    def test_a_kernel_that_counts_no_mapped_page_gets_no_sweeps(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where statm counts no file-backed page at all (gVisor's, planted here as a file
        with its numbers), nothing can be measured and a sweep gives nothing back: a
        stream within a budget of one page sweeps never, and says so."""
        statm = tmp_path / "statm"
        statm.write_text("250000 40000 0 100 0 90000 0\n")
        monkeypatch.setattr(paging, "STATM", str(statm))
        monkeypatch.setattr(cutting, "MAPPED_COPY", "budget")
        monkeypatch.setattr(cutting, "RESIDENT_BUDGET", mmap.PAGESIZE)
        swept: list[int] = []
        monkeypatch.setattr(paging.Pager, "sweep", lambda self: swept.append(1))
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens)
        assert ended["reads"] == "mapping"
        assert "does not count a mapping's pages" in ended["reads_why"]
        assert swept == []
        assert resident(devpolicy.host_view(tokens)) > 40 * BATCH * LENGTH * 4 // 2

    def test_tokens_in_memory_say_so(self) -> None:
        """No file behind the tokens: copied from memory, and the event says that."""
        ended = run(np.arange(COUNT, dtype=np.uint32))
        assert ended["reads"] == "memory"
        assert ended["reads_why"].startswith("the tokens are in memory")


class TestFirstBatch:
    def test_the_first_batch_is_read_when_the_stream_is_made(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The first group is read on the stream's worker as soon as `windows` returns,
        so whatever the caller does before its first pull hides that read."""
        read = threading.Event()
        real = cutting.GroupCutter._made_ready

        def noted(cutter: cutting.GroupCutter, *args: Any) -> Any:
            made = real(cutter, *args)
            if threading.current_thread().name.startswith("devpolicy-windows"):
                read.set()
            return made

        monkeypatch.setattr(cutting.GroupCutter, "_made_ready", noted)
        tokens = mapped(tmp_path / "t.safetensors")
        with devpolicy.windows(
            tokens, LENGTH, BATCH, order="random", seed=3, policy=policy_of()
        ) as stream:
            assert read.wait(10), "nothing was read before the first pull"
            assert_exact(next(stream), 3, 0, LENGTH, COUNT)
