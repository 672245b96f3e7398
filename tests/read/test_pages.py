"""A mapping's pages given back (`devpolicy._read.pages`): random windows of a mapped file
leave resident memory flat however long the stream runs, read by position or gathered
from the mapping within a budget, and the advice lasts as long as the stream."""

from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._read import pages
from tests.apply.conftest import ByPosition
from tests.apply.streams import (
    TOKEN_RULES,
    mapping_of,
    resident,
    sparse_tokens,
    unreadable_by_position,
)
from tests.helpers import policy_of


def peaks_before_each_release(view: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What is resident of `view`'s mapping each time a stream is about to decide whether
    to give pages back (on whichever thread gathers): the peaks, which a look after each
    batch misses (the worker gathers ahead and sweeps in between)."""
    peaks: list[int] = []
    release = pages.Pager.release_over_budget

    def sampled(pager: pages.Pager, windows: int, length: int, budget: int) -> None:
        peaks.append(resident(view))
        release(pager, windows, length, budget)

    monkeypatch.setattr(pages.Pager, "release_over_budget", sampled)
    return peaks


def mapped_tokens(tmp_path: Path, count: int) -> jax.Array:
    """`count` uint16 tokens in a sparse file, loaded mapped on the host, its pages out
    of the page cache (so every run starts as cold as the first)."""
    path = tmp_path / "train.safetensors"
    sparse_tokens(path, count, {})
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
    assert resident(devpolicy.host_view(tokens)) < 2**20
    return tokens


def warm_mapped_tokens(tmp_path: Path, count: int) -> jax.Array:
    """`mapped_tokens`, then the whole file read through (the page cache warm, as a second
    epoch finds it; a kernel with large folios then holds it in them)."""
    tokens = mapped_tokens(tmp_path, count)
    with open(tmp_path / "train.safetensors", "rb", buffering=0) as f:
        chunk = bytearray(2**24)
        while f.readinto(chunk):
            pass
    return tokens


def maps_large_folios(tokens: jax.Array) -> bool:
    """Whether touching one token of the mapping maps a large folio here (1 MiB or more
    resident), as Linux 6.18 does for a file read through into its page cache."""
    view = devpolicy.host_view(tokens)
    pager = pages.Pager(view, random=True)
    pager.sweep()
    int(view[len(view) // 2])
    found = resident(view) >= 2**20
    pager.sweep()
    pager.close()
    return found


@pytest.fixture
def through_the_mapping(monkeypatch: pytest.MonkeyPatch) -> devpolicy.ReadOptions:
    """Options for streams that copy windows out of the mapping, as where the file cannot
    be read by position (a private writable map): held to reading by position, they find
    no file and gather, the pages then given back (`pages`) group by group."""
    unreadable_by_position(monkeypatch)
    return devpolicy.ReadOptions(path="file")


class TestFlatMemory:
    """Random windows of a mapped file leave the process's resident memory flat however
    long the stream runs (the story's 10,000 steps over 19.09 GiB:
    benchmarks/results/windows.md): read by position from the file, nothing is mapped in;
    copied from the mapping, the pages they came from are given back."""

    STEPS = 300  # 9,600 windows of 1,025 tokens: 19 MiB copied
    BOUND = 16 * 2**20

    def run(self, tokens: jax.Array, reads: devpolicy.ReadOptions) -> int:
        view = devpolicy.host_view(tokens)
        stream = devpolicy.windows(
            tokens,
            1025,
            32,
            order="random",
            seed=0,
            steps=self.STEPS,
            policy=policy_of(),
            reads=reads,
        )
        assert sum(1 for _ in stream) == self.STEPS
        return resident(view)

    def test_random_windows_read_from_the_file_leave_nothing_of_it_resident(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """300 steps of 32 random windows of a 512 MiB mapped file, read by position from
        the file: none of the mapping is faulted in, and `stream_ended` says how it was
        read."""
        tokens = mapped_tokens(tmp_path, 2**28)
        with capture_logs() as logs:
            assert self.run(tokens, by_position.reads) == 0
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert (ended["reads"], ended["reads_with"]) == ("file", by_position.way)

    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_gathered_within_the_budget_what_comes_in_stays_under_it(self, tmp_path: Path) -> None:
        """Windows gathered from the mapping within the budget (`ReadOptions(path="budget")`):
        the view is swept once about the budget may have come in: 300 steps with a 4 MiB
        budget leave under the 16 MiB bound resident, where without sweeps the same run
        leaves over 4 times the bound (the control below)."""
        reads = devpolicy.ReadOptions(path="budget", resident_budget=4 * 2**20)
        tokens = mapped_tokens(tmp_path, 2**28)
        with capture_logs() as logs:
            assert self.run(tokens, reads) < self.BOUND
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert (ended["reads"], ended["reads_with"]) == ("mapping", None)

    @pytest.mark.slow
    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_with_the_page_cache_warm_what_comes_in_stays_under_the_budget(
        self, tmp_path: Path
    ) -> None:
        """The file read through first, as a second epoch finds it: where the kernel then
        holds it in large folios, one 2 KiB window maps a whole folio (2 MiB on Linux
        6.18). Measured after every one of 300 steps, what is resident of the mapping
        stays under the 16 MiB budget; where a window was measured to map a folio, the
        stream reads by position from its second group on (nothing mapped)."""
        reads = devpolicy.ReadOptions(path="budget", resident_budget=16 * 2**20)
        tokens = warm_mapped_tokens(tmp_path, 2**28)
        view = devpolicy.host_view(tokens)
        most = 0
        with (
            capture_logs() as logs,
            devpolicy.windows(
                tokens,
                1025,
                32,
                order="random",
                seed=0,
                steps=self.STEPS,
                policy=policy_of(),
                reads=reads,
            ) as stream,
        ):
            for _ in stream:
                most = max(most, resident(view))
        assert most <= 16 * 2**20
        (reads,) = [e["reads"] for e in logs if e["event"] == "stream_ended"]
        assert reads == ("file" if maps_large_folios(tokens) else "mapping")

    @pytest.mark.slow
    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_gathered_a_few_at_a_time_large_folios_stay_under_the_budget(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same, the stream kept on the mapping (its file not readable by position):
        windows are gathered a few at a time and the view swept by what they measurably
        brought in, so resident memory stays under the budget even where each window
        maps 2 MiB."""
        reads = devpolicy.ReadOptions(path="budget", resident_budget=16 * 2**20)
        unreadable_by_position(monkeypatch)
        tokens = warm_mapped_tokens(tmp_path, 2**28)
        view = devpolicy.host_view(tokens)
        peaks = peaks_before_each_release(view, monkeypatch)
        with devpolicy.windows(
            tokens, 1025, 32, order="random", seed=0, steps=40, policy=policy_of(), reads=reads
        ) as stream:
            for _ in stream:
                pass
        assert 0 < max(peaks) <= 16 * 2**20

    @pytest.mark.slow
    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_another_mapping_given_back_meanwhile_does_not_let_more_in(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """What comes in is measured by the process's file-backed memory: 64 MiB of
        another file mapping given back while the stream runs hides that much growth.
        The windows are also counted at the most one was measured to bring in, so the
        view stays under the budget all the same."""
        reads = devpolicy.ReadOptions(path="budget", resident_budget=16 * 2**20)
        unreadable_by_position(monkeypatch)
        tokens = warm_mapped_tokens(tmp_path, 2**28)
        other_path = tmp_path / "other.bin"
        other_path.write_bytes(b"\1" * 64 * 2**20)
        other = np.memmap(other_path, np.uint8, mode="r")
        int(other[:: mmap.PAGESIZE].sum())  # all of it resident
        view = devpolicy.host_view(tokens)
        peaks = peaks_before_each_release(view, monkeypatch)
        with devpolicy.windows(
            tokens, 1025, 32, order="random", seed=0, steps=40, policy=policy_of(), reads=reads
        ) as stream:
            for step, _ in enumerate(stream):
                if step == 2:
                    other._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[union-attr]
        assert 0 < max(peaks) <= 16 * 2**20

    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_random_windows_of_a_mapped_file_keep_resident_memory_flat(
        self, tmp_path: Path, through_the_mapping: devpolicy.ReadOptions
    ) -> None:
        """300 steps of 32 random windows copied out of a 512 MiB mapping leave under
        16 MiB of it resident (the same run without the advice: the next test)."""
        tokens = mapped_tokens(tmp_path, 2**28)
        with capture_logs() as logs:
            assert self.run(tokens, through_the_mapping) < self.BOUND
        assert [e["reads"] for e in logs if e["event"] == "stream_ended"] == ["mapping"]

    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_without_the_advice_the_same_run_grows_past_the_bound(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        through_the_mapping: devpolicy.ReadOptions,
    ) -> None:
        """The control: with the kernel's defaults (no advice, nothing given back) the
        same run leaves several times the bound resident, so the bound above holds
        because of the advice, not because the run is too short to show growth."""
        monkeypatch.setattr(pages, "_MADVISE", None)
        tokens = mapped_tokens(tmp_path, 2**28)
        assert self.run(tokens, through_the_mapping) > 4 * self.BOUND

    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_random_access_advice_lasts_as_long_as_the_stream(
        self, tmp_path: Path, through_the_mapping: devpolicy.ReadOptions
    ) -> None:
        """While a random stream runs the mapping is advised random (`rr` in smaps: no
        read-ahead); when the last stream over it ends, the kernel's default returns."""
        tokens = mapped_tokens(tmp_path, 2**20)
        view = devpolicy.host_view(tokens)

        def flags() -> set[str]:
            return {f for m in mapping_of(view) for f in m["VmFlags"].split()}

        assert "rr" not in flags()
        reads = through_the_mapping
        first = devpolicy.windows(
            tokens, 8, 4, order="random", seed=0, policy=policy_of(), reads=reads
        )
        second = devpolicy.windows(
            tokens, 8, 4, order="random", seed=1, policy=policy_of(), reads=reads
        )
        next(first)
        next(second)
        assert "rr" in flags()
        first.close()
        assert "rr" in flags()  # the second stream still reads at random
        second.close()
        assert "rr" not in flags()

    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    @pytest.mark.parametrize("sweep_cheaper", [True, False], ids=["sweep", "blocks"])
    def test_a_release_takes_the_way_that_has_cost_less(
        self, tmp_path: Path, sweep_cheaper: bool
    ) -> None:
        """Where a sweep of the view has cost less than a call per window, a release
        gives back the whole view (pages no window came from too); else only the blocks
        the windows lie in, and the other pages stay."""
        tokens = mapped_tokens(tmp_path, 2**22)
        view = devpolicy.host_view(tokens)
        pager = pages.Pager(view, random=True)
        assert int(view[: 2**20].sum()) == 0  # 2 MiB faulted in, far from the windows
        assert int(view[3 * 2**20 :].sum()) == 0
        assert resident(view) >= 2 * 2**20
        pager._per_call, pager._sweep = (1.0, 0.5) if sweep_cheaper else (1e-6, 1.0)
        pager.release(np.arange(3 * 2**20, 4 * 2**20, 2**16).reshape(2, -1), 1024)
        if sweep_cheaper:
            assert resident(view) == 0
        else:
            # 2 MiB at the start stay, and the half of the 2 MiB at the end between the
            # windows' 64 KiB blocks (16 windows, 128 KiB apart).
            assert abs(resident(view) - 3 * 2**20) < 2**16
        pager.close()

    @pytest.mark.skipif(pages._MADVISE is None, reason="madvise is Linux's")
    def test_a_stream_dropped_unclosed_ends_its_advice(
        self, tmp_path: Path, through_the_mapping: devpolicy.ReadOptions
    ) -> None:
        """A random stream that is read, then dropped without `close()`, gives the
        kernel's default read-ahead back when it is collected."""
        tokens = mapped_tokens(tmp_path, 2**20)
        view = devpolicy.host_view(tokens)
        stream = devpolicy.windows(
            tokens, 8, 4, order="random", seed=0, policy=policy_of(), reads=through_the_mapping
        )
        next(stream)
        assert "rr" in {f for m in mapping_of(view) for f in m["VmFlags"].split()}
        del stream
        gc.collect()
        assert "rr" not in {f for m in mapping_of(view) for f in m["VmFlags"].split()}

    def test_sequential_windows_give_their_pages_back_too(self, tmp_path: Path) -> None:
        """A sequential pass over a mapped file gathered within the budget keeps only
        about a batch resident, and every window holds the values written (pages given
        back read back the same)."""
        count = 2**22
        path = tmp_path / "train.safetensors"
        values = np.arange(count, dtype=np.uint32).astype(np.uint16)
        sparse_tokens(path, count, {0: values})
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        view = devpolicy.host_view(tokens)
        stream = devpolicy.windows(tokens, 4096, 16, policy=policy_of(), reads="budget")
        for step, batch in enumerate(stream):
            first = step * 16 * 4096
            expected = values[first : first + batch.size].reshape(batch.shape)
            np.testing.assert_array_equal(np.asarray(batch), expected)
        if pages._MADVISE is not None:
            assert resident(view) < 2**20  # of the 8 MiB read

    def test_anonymous_memory_is_never_given_back(self) -> None:
        """Windows of an array in ordinary memory (no file behind it) are read as they
        are, again and again: giving those pages back would zero them."""
        tokens = np.arange(2**22, dtype=np.uint32)
        pager = pages.Pager(tokens, random=True)
        assert not pager.active
        for batch in devpolicy.windows(
            tokens, 1024, 8, order="random", seed=0, steps=50, policy=policy_of()
        ):
            starts = np.asarray(batch)[:, 0]
            np.testing.assert_array_equal(np.asarray(batch), starts[:, None] + np.arange(1024))

    def test_a_private_writable_map_keeps_its_changes(self, tmp_path: Path) -> None:
        """A copy-on-write memmap (`mode="c"`) holds changes the file does not: its pages
        are never given back, so windows see the changed values."""
        path = tmp_path / "tokens.bin"
        np.zeros(2**20, np.uint16).tofile(path)
        tokens = np.memmap(path, np.uint16, mode="c")
        tokens[:] = 7
        assert not pages.Pager(tokens, random=False).active
        batches = devpolicy.windows(tokens, 512, 64, policy=policy_of())
        assert all(bool((np.asarray(b) == 7).all()) for b in batches)

    def test_a_read_only_memmap_is_given_back(self, tmp_path: Path) -> None:
        """`np.memmap(mode="r")` given directly is a file mapping like a loaded tensor."""
        path = tmp_path / "tokens.bin"
        np.zeros(2**20, np.uint16).tofile(path)
        pager = pages.Pager(np.memmap(path, np.uint16, mode="r"), random=False)
        assert pager.active is (pages._MADVISE is not None)


class TestTheMapReadOnce:
    """Where the stream's opening read the maps line of its tokens already, the pager
    needs no second read of the whole map, and says the same."""

    def test_numpy_memory_is_known_without_reading_the_map(self, tmp_path: Path) -> None:
        path = tmp_path / "t.bin"
        np.arange(4096, dtype=np.uint16).tofile(path)
        mapped = np.memmap(path, dtype=np.uint16, mode="r")
        assert pages.in_numpy_memory(np.arange(10)[3:])
        assert not pages.in_numpy_memory(mapped)
        assert not pages.in_numpy_memory(np.asarray(mapped)[5:])
        assert not pages.in_numpy_memory(np.frombuffer(b"abcd", np.uint8))

    def test_the_range_from_one_line_is_the_range_from_the_whole_map(self, tmp_path: Path) -> None:
        path = tmp_path / "t.bin"
        np.arange(2**20, dtype=np.uint16).tofile(path)
        mapped = np.memmap(path, dtype=np.uint16, mode="r")
        anonymous = np.frombuffer(bytearray(2**16), np.uint8)  # not numpy's own: read
        for view in (mapped, mapped[1000:], anonymous):
            line = pages.maps_line(view.ctypes.data)
            assert pages.releasable_range(view, line) == pages.releasable_range(view)
        assert pages.releasable_range(mapped) is not None
        assert pages.releasable_range(anonymous) is None
