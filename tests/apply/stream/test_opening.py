"""Which way a stream copies the windows of a file mapping, chosen by what the file and
the machine are (issue 50): kept mapped where the tokens are warm and fit in the memory
left, read by position where they are larger or cold, given up when memory runs low;
where both are safe, timed on the stream's own groups (issue 57); and `stream_ended` says
which ran and why. The rules' thresholds are a `ReadOptions` passed to `windows`."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy import ReadOptions
from devpolicy._apply.stream import cutting
from devpolicy._read import pages, positional
from tests.apply.conftest import batched_reads_here
from tests.apply.streams import TOKEN_RULES, assert_exact, counting_file, resident
from tests.helpers import drop_from_page_cache, policy_of

COUNT = 2**22  # 16 MiB of uint32 tokens
LENGTH = 257
BATCH = 16
pytestmark = pytest.mark.skipif(pages._MADVISE is None, reason="file mappings are Linux's here")
#: The rules' first guess, held to (not timed against the other safe path).
RULES = ReadOptions(measure=False)
#: The same where reading by position is one `preadv` a window, as where io_uring cannot
#: be had (gVisor, a seccomp profile that refuses it).
NO_IO_URING = ReadOptions(measure=False, io_uring=False)


def mapped(path: Path, *, cold: bool = False) -> Any:
    """Dense tokens (token i == i) loaded mapped from `path`: warm (just written), or cold
    (written to disk, then dropped from the page cache)."""
    counting_file(path, COUNT)
    if cold:
        drop_from_page_cache(path)
    return devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]


def run(tokens: Any, reads: ReadOptions, steps: int = 40, seed: int = 3) -> dict[str, Any]:
    """`steps` random batches read as `reads` says, each checked against the tokens; the
    `stream_ended` event."""
    with capture_logs() as logs:
        stream = devpolicy.windows(
            tokens,
            LENGTH,
            BATCH,
            order="random",
            seed=seed,
            steps=steps,
            policy=policy_of(),
            reads=reads,
        )
        for step, batch in enumerate(stream):
            assert_exact(batch, seed, step, LENGTH, COUNT)
    (ended,) = [e for e in logs if e["event"] == "stream_ended"]
    assert ended["batches"] == steps
    return ended


def read_by_position(
    tokens: Any, cached: tuple[float, float], why: str, reads: ReadOptions = NO_IO_URING
) -> None:
    """With the share of `tokens` in the page cache within `cached` (else the test is
    skipped: the filesystem kept what it was told to drop), a stream given `reads` (no
    io_uring) reads them by position, one `preadv` a window, and `reads_why` says `why`."""
    share = pages.cached_share(devpolicy.host_view(tokens))
    if share is None or not cached[0] <= share < cached[1]:
        pytest.skip(f"this filesystem kept what was dropped from the page cache ({share})")
    ended = run(tokens, reads)
    assert (ended["reads"], ended["reads_with"]) == ("file", "preadv")
    assert why in ended["reads_why"]


class TestChoice:
    def test_warm_tokens_that_fit_are_kept_mapped_where_reads_are_one_call_a_window(
        self, tmp_path: Path
    ) -> None:
        """No io_uring, a file just written (in the page cache) and far smaller than the
        memory left: gathered from the mapping, its pages kept, and the event says why."""
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, NO_IO_URING)
        assert (ended["reads"], ended["reads_with"]) == ("mapping", None)
        assert "100% of their pages in the page cache" in ended["reads_why"]
        assert "no io_uring" in ended["reads_why"]
        assert "its pages kept while memory allows" in ended["reads_why"]
        assert resident(devpolicy.host_view(tokens)) >= 40 * BATCH * LENGTH * 4  # none given back

    def test_warm_tokens_are_read_by_position_where_a_group_is_one_io_uring_call(
        self, tmp_path: Path
    ) -> None:
        """With io_uring, reading a group by position outran gathering from a kept
        mapping, warm as cold: the stream maps nothing."""
        if not batched_reads_here():
            pytest.skip("io_uring cannot be had here")
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, RULES)
        assert ended["reads"] == "file"
        assert ended["reads_with"].startswith("io_uring")
        assert "a group's windows in one io_uring call" in ended["reads_why"]
        assert resident(devpolicy.host_view(tokens)) == 0

    def test_cold_tokens_are_read_by_position(self, tmp_path: Path) -> None:
        """The file dropped from the page cache: faults through a mapping would wait on
        the disk one page at a time, so the stream reads by position."""
        tokens = mapped(tmp_path / "t.safetensors", cold=True)
        warm = ReadOptions().warm_share
        read_by_position(tokens, (0.0, warm), "in the page cache: read from")

    def test_tokens_larger_than_the_page_cache_can_hold_are_read_by_position(
        self, tmp_path: Path
    ) -> None:
        """Without io_uring, tokens more than `keep_of_ram` of the host's RAM (here the
        share made tiny, the RAM measured for real) are read by position: nothing mapped."""
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, ReadOptions(measure=False, io_uring=False, keep_of_ram=1e-9))
        assert (ended["reads"], ended["reads_with"]) == ("file", "preadv")
        assert "of the host's" in ended["reads_why"]
        assert "of RAM: read from the file by position" in ended["reads_why"]
        assert resident(devpolicy.host_view(tokens)) == 0

    def test_tokens_whose_uncached_part_passes_the_memory_left_are_read_by_position(
        self, tmp_path: Path
    ) -> None:
        """Without io_uring, a file partly dropped from the page cache (warm enough),
        whose missing part is more than `keep_share` of the memory left (the share made
        tiny), is read by position; all of it cached, the same share keeps it mapped."""
        reads = ReadOptions(measure=False, io_uring=False, keep_share=1e-9)
        tokens = mapped(tmp_path / "t.safetensors")
        assert run(tokens, reads)["reads"] == "mapping"  # nothing missing: kept
        view = devpolicy.host_view(tokens)
        pages.Pager(view, random=False).sweep()  # what the stream mapped, unmapped
        path = tmp_path / "t.safetensors"
        drop_from_page_cache(path, start=path.stat().st_size * 3 // 4)  # the last quarter
        warm = ReadOptions().warm_share
        read_by_position(tokens, (warm, 1.0), "not in the page cache are more", reads)

    def test_a_kernel_that_counts_no_mapped_page_gets_no_sweeps(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where statm counts no file-backed page at all (gVisor's, planted here as a file
        with its numbers), nothing can be measured and a sweep gives nothing back: a
        stream within a budget of one page sweeps never, and says so."""
        statm = tmp_path / "statm"
        statm.write_text("250000 40000 0 100 0 90000 0\n")
        monkeypatch.setattr(pages, "STATM", str(statm))
        swept: list[int] = []
        monkeypatch.setattr(pages.Pager, "sweep", lambda self: swept.append(1))
        tokens = mapped(tmp_path / "t.safetensors")
        ended = run(tokens, ReadOptions(path="budget", resident_budget=mmap.PAGESIZE))
        assert ended["reads"] == "mapping"
        assert "does not count a mapping's pages" in ended["reads_why"]
        assert swept == []
        assert resident(devpolicy.host_view(tokens)) > 40 * BATCH * LENGTH * 4 // 2

    def test_tokens_in_memory_say_so(self) -> None:
        """No file behind the tokens: copied from memory, and the event says that."""
        ended = run(np.arange(COUNT, dtype=np.uint32), ReadOptions())
        assert ended["reads"] == "memory"
        assert ended["reads_why"].startswith("the tokens are in memory")


class TestFirstBatch:
    def test_the_first_batch_is_read_when_the_stream_is_made(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Gathered from a kept mapping, the first batch starts being read on the stream's
        worker as soon as `windows` returns, so whatever the caller does before its first
        pull hides that read."""
        started = threading.Event()
        real_made = cutting.GroupCutter._made_ready

        def made(cutter: cutting.GroupCutter, *args: Any) -> Any:
            if threading.current_thread().name.startswith("devpolicy-windows"):
                started.set()
            return real_made(cutter, *args)

        monkeypatch.setattr(cutting.GroupCutter, "_made_ready", made)
        tokens = mapped(tmp_path / "t.safetensors")
        with devpolicy.windows(
            tokens, LENGTH, BATCH, order="random", seed=3, policy=policy_of(), reads=NO_IO_URING
        ) as stream:
            assert started.wait(10), "nothing was read before the first pull"
            assert_exact(next(stream), 3, 0, LENGTH, COUNT)

    def test_on_a_polled_ring_the_first_batch_waits_for_no_kernel_thread(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A polled ring's kernel thread, made or woken as the stream opens, may wait for a
        core on a busy host (and a wake may hand it the caller's): the first batch is read
        by `preadv` on the caller's thread at the first pull, with nothing handed to the
        ring before it is placed; the next pull reads its group through the ring."""
        if not batched_reads_here(polled=True):
            pytest.skip("a polled ring cannot be had here")
        calls: list[str] = []
        real_read = positional.FileWindows.read_batches
        real_submit = positional.FileWindows.submit_batches

        def read(reader: positional.FileWindows, *args: Any, direct: bool = False) -> Any:
            calls.append("preadv" if direct else "read")
            return real_read(reader, *args, direct=direct)

        def submitted(reader: positional.FileWindows, *args: Any) -> Any:
            calls.append("ring")
            return real_submit(reader, *args)

        monkeypatch.setattr(positional.FileWindows, "read_batches", read)
        monkeypatch.setattr(positional.FileWindows, "submit_batches", submitted)
        tokens = mapped(tmp_path / "t.safetensors")
        with devpolicy.windows(
            tokens, LENGTH, BATCH, order="random", seed=3, policy=policy_of(), reads=RULES
        ) as stream:
            assert calls == []  # nothing handed to the kernel thread before the first pull
            assert_exact(next(stream), 3, 0, LENGTH, COUNT)
            assert calls == ["preadv"]
            assert_exact(next(stream), 3, 1, LENGTH, COUNT)
            assert calls[:3] == ["preadv", "read", "ring"]  # its group read through the ring
            for step in range(2, 20):
                assert_exact(next(stream), 3, step, LENGTH, COUNT)
