"""Huge host arrays: `host_view` (zero-copy numpy views), `windows` (batches cut from
them, placed by the policy), and the warning for arrays JAX cannot index with x64 off."""

from __future__ import annotations

import gc
import json
import mmap
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import hostview as _hostview
from devpolicy._apply.stream import cutting as _windows
from devpolicy._apply.stream import groups as _groups
from devpolicy._apply.stream import sampling as _sampling
from devpolicy._read import pages as _pages
from tests.apply.conftest import ByPosition
from tests.apply.streams import mapping_of, resident, unreadable_by_position
from tests.helpers import policy_of

BATCH_RULES = [
    {"match": "*/tokens", "device": "cpu:0", "mmap": True},
    {"match": "batch", "device": "cpu:1"},
]

# The story's dataset: one uint16 tensor of this many tokens (19.09 GiB).
STORY_TOKENS = 10_248_871_837


def where(x: jax.Array) -> str:
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def sparse_tokens(path: Path, count: int, values: dict[int, np.ndarray]) -> None:
    """A safetensors file of `count` uint16 tokens at a 64-byte-aligned offset, written
    sparse: zeros (holes) except `values` at their token offsets."""
    header = json.dumps(
        {"tokens": {"dtype": "U16", "shape": [count], "data_offsets": [0, 2 * count]}}
    ).encode()
    header += b" " * (-(8 + len(header)) % 64)
    start = 8 + len(header)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(start + 2 * count)
        for offset, data in values.items():
            os.pwrite(f.fileno(), data.astype("<u2").tobytes(), start + 2 * offset)


def peaks_before_each_release(view: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What is resident of `view`'s mapping each time a stream is about to decide whether
    to give pages back (on whichever thread gathers): the peaks, which a look after each
    batch misses (the worker gathers ahead and sweeps in between)."""
    peaks: list[int] = []
    release = _pages.Pager.release_over_budget

    def sampled(pager: _pages.Pager, windows: int, length: int, budget: int) -> None:
        peaks.append(resident(view))
        release(pager, windows, length, budget)

    monkeypatch.setattr(_pages.Pager, "release_over_budget", sampled)
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
    tokens = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
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
    pager = _pages.Pager(view, random=True)
    pager.sweep()
    int(view[len(view) // 2])
    found = resident(view) >= 2**20
    pager.sweep()
    pager.close()
    return found


@pytest.fixture
def unwarned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-process warning not yet given."""
    monkeypatch.setattr(_hostview, "_warned", [])


class TestHostView:
    def test_a_mapped_tensor_is_viewed_without_a_copy(self, tmp_path: Path) -> None:
        """The view of a mapped host tensor is the array's own buffer (the file's pages)."""
        path = tmp_path / "data.safetensors"
        devpolicy.save_file({"tokens": np.arange(5000, dtype=np.uint16)}, path)
        x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        view = devpolicy.host_view(x)
        assert view.ctypes.data == x.unsafe_buffer_pointer()
        assert view[-3:].tolist() == [4997, 4998, 4999]
        assert not view.flags.writeable
        entry = next(
            e for e in devpolicy.report().by_device["cpu:0"].entries if "data/tokens" in e.names
        )
        assert entry.file_backed == entry.nbytes == 10000

    def test_a_numpy_array_is_returned_as_it_is(self) -> None:
        """Host data already in numpy needs no view."""
        a = np.arange(3)
        assert devpolicy.host_view(a) is a

    def test_a_sharded_array_is_refused(self) -> None:
        """An array over several devices is not one buffer: a HostViewError says so."""
        mesh = jax.make_mesh((2,), ("d",), devices=jax.local_devices(backend="cpu")[:2])
        x = jax.device_put(
            np.zeros(4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
        )
        with pytest.raises(
            devpolicy.errors.HostViewError,
            match=r"^float32\[4\] over 2 devices: sharded over 2 devices, so its memory is "
            r"not one buffer; view each shard",
        ):
            devpolicy.host_view(x)

    def test_a_deleted_array_is_refused(self) -> None:
        """A donated or deleted array has no memory to view."""
        x = jnp.zeros(3)
        x.delete()
        with pytest.raises(
            devpolicy.errors.HostViewError, match=r"^float32\[3\]: the array is deleted"
        ):
            devpolicy.host_view(x)

    def test_a_traced_value_is_refused(self) -> None:
        """Inside jit there is no host memory to view."""

        @jax.jit
        def f(x: jax.Array) -> jax.Array:
            devpolicy.host_view(x)
            return x

        with pytest.raises(
            devpolicy.errors.HostViewError, match=r"^traced float32\[2\]: a value inside"
        ):
            f(jnp.zeros(2))

    @pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4, jnp.int2, jnp.float4_e2m1fn])
    def test_a_sub_byte_array_is_refused_saying_why(self, dtype: object) -> None:
        """int4 and other sub-byte types: JAX gives numpy only a copy of those, so there is
        no view; the error says so and how to get the copy, and does not make it."""
        x = jnp.zeros(64, dtype)
        with pytest.raises(
            devpolicy.errors.HostViewError,
            match=rf"^{x.dtype}\[64\] on cpu:0: host_view does not support [24]-bit types: "
            r"JAX gives numpy a sub-byte array only as a copy, never its own buffer, so no "
            r"view of it is zero-copy; np\.asarray\(array\) makes that copy \(64 B, a byte a "
            r"value\); data to be viewed in place is best kept as int8/uint8$",
        ):
            devpolicy.host_view(x)

    def test_one_byte_and_wider_ml_dtypes_are_viewed(self) -> None:
        """float8 and bfloat16 are whole bytes: viewed without a copy."""
        for dtype in (jnp.float8_e4m3fn, jnp.bfloat16):
            x = jax.device_put(np.zeros(64, dtype), jax.local_devices(backend="cpu")[0])
            assert devpolicy.host_view(x).ctypes.data == x.unsafe_buffer_pointer()

    @pytest.mark.parametrize("value", [[1, 2], "tokens", None])
    def test_a_non_array_is_a_type_error(self, value: object) -> None:
        """Lists and other objects are not arrays with host memory."""
        with pytest.raises(TypeError, match=r"^host_view\(\) takes a jax\.Array on a host"):
            devpolicy.host_view(value)


class TestWindows:
    def test_sequential_windows_in_order_the_last_batch_smaller(self) -> None:
        """Non-overlapping windows from the start, `batch` at a time, one pass."""
        tokens = np.arange(10, dtype=np.uint16)
        out = [b.tolist() for b in devpolicy.windows(tokens, 3, 2, policy=policy_of())]
        assert out == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8]]]

    def test_stride_and_steps(self) -> None:
        """`stride` spaces the windows; `steps` stops early."""
        tokens = np.arange(20, dtype=np.int32)
        out = devpolicy.windows(tokens, 4, 2, stride=3, steps=2, policy=policy_of())
        assert [b[:, 0].tolist() for b in out] == [[0, 3], [6, 9]]

    def test_windows_of_a_two_dimensional_array_run_along_rows(self) -> None:
        """Rows are the first dimension: each window keeps the rest of the shape."""
        tokens = np.arange(24, dtype=np.float32).reshape(6, 4)
        (first, _) = devpolicy.windows(tokens, 3, 1, policy=policy_of())
        assert first.shape == (1, 3, 4)
        np.testing.assert_array_equal(first[0], tokens[:3])

    def test_random_windows_are_contiguous_reproducible_and_in_range(self) -> None:
        """Each random window is a run of the array; the same seed gives the same batches."""
        tokens = np.arange(1000, dtype=np.int32)

        def draw(seed: int) -> list[list[list[int]]]:
            stream = devpolicy.windows(
                tokens, 16, 8, order="random", seed=seed, steps=5, policy=policy_of()
            )
            return [b.tolist() for b in stream]

        first = draw(7)
        assert len(first) == 5
        for batch in first:
            for window in batch:
                assert window == list(range(window[0], window[0] + 16))
                assert 0 <= window[0] <= 1000 - 16
        assert draw(7) == first
        assert draw(8) != first

    def test_batches_arrive_on_the_device_decided_for_their_name(self) -> None:
        """Each batch is placed by the batch rule (cpu:1), committed, and logged."""
        tokens = np.arange(100, dtype=np.uint16)
        policy = policy_of(rules=BATCH_RULES)
        with capture_logs() as logs:
            out = list(
                devpolicy.windows(tokens, 10, 4, order="random", seed=0, steps=3, policy=policy)
            )
        assert {where(b) for b in out} == {"cpu:1"}
        assert all(b.committed for b in out)
        assert any(e["event"] == "placement" and e["name"] == "batch" for e in logs)

    def test_the_active_policy_decides_by_default(self) -> None:
        """Without policy=, the active policy decides, as for prefetch."""
        with devpolicy.activate(policy_of(rules=BATCH_RULES)):
            (b,) = devpolicy.windows(np.arange(4), 4, 1)
        assert where(b) == "cpu:1"

    def test_close_ends_the_stream(self) -> None:
        """An endless random stream ends when closed."""
        stream = devpolicy.windows(np.arange(50), 5, 2, order="random", policy=policy_of())
        next(stream)
        stream.close()
        assert list(stream) == []

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"length": 0}, r"^windows length must be an int >= 1, got 0$"),
            ({"batch": 2.0}, r"^windows batch must be an int >= 1, got 2\.0$"),
            ({"stride": -1}, r"^windows stride must be an int >= 1, got -1$"),
            ({"steps": True}, r"^windows steps must be an int >= 1, got True$"),
            (
                {"size": 0},
                r"^windows size must be an int from 1 to 1024 \(the batches placed "
                r"ahead of use\), got 0$",
            ),
            (
                {"order": "shuffle"},
                r"^windows order must be one of \('sequential', 'random', 'shuffled'\), got "
                r"'shuffle'$",
            ),
            (
                {"length": 11},
                r"^windows of length 11 need at least 11 rows along the first dimension; "
                r"the array has 10 \(shape \(10,\)\)$",
            ),
        ],
    )
    def test_bad_arguments_are_refused_at_the_call(
        self, kwargs: dict[str, object], message: str
    ) -> None:
        """Each bad argument is named with its value, before any batch is made."""
        args: dict[str, object] = {"length": 3, "batch": 2, **kwargs}
        with pytest.raises(ValueError, match=message):
            devpolicy.windows(np.arange(10), policy=policy_of(), **args)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            (
                {"order": "random", "stride": 3},
                ValueError,
                r"^windows stride applies to order='sequential' or 'shuffled' only; "
                r"order='random' draws "
                r"every start at random, got stride=3$",
            ),
            (
                {"seed": -1, "order": "random"},
                ValueError,
                r"^windows seed must be an int from 0 to 2\*\*64 - 1, got -1$",
            ),
            ({"seed": 1.5}, TypeError, r"^windows seed must be an int or None, got 1\.5$"),
            ({"seed": True}, TypeError, r"^windows seed must be an int or None, got True$"),
            ({"length": np.bool_(True)}, ValueError, r"^windows length must be an int >= 1"),
            (
                {"steps": np.int64(0)},
                ValueError,
                r"^windows steps must be an int >= 1, got (np\.int64\(0\)|0)$",
            ),
        ],
    )
    def test_arguments_that_would_be_ignored_or_misread_are_refused(
        self, kwargs: dict[str, object], error: type[Exception], message: str
    ) -> None:
        """A stride random order would ignore, a negative seed, and bools are refused,
        each naming the argument."""
        args: dict[str, object] = {"length": 3, "batch": 2, **kwargs}
        with pytest.raises(error, match=message):
            devpolicy.windows(np.arange(10), policy=policy_of(), **args)  # type: ignore[arg-type]

    def test_numpy_integers_are_accepted_as_lengths_and_seeds(self) -> None:
        """`np.int64(3)` and friends (what arithmetic on shapes gives) work like ints."""
        tokens = np.arange(10, dtype=np.uint16)
        out = devpolicy.windows(
            tokens,
            np.int64(3),
            np.int32(2),
            stride=np.uint8(3),
            steps=np.int64(1),
            size=np.int16(1),
            policy=policy_of(),
        )  # type: ignore[arg-type]
        assert [b.tolist() for b in out] == [[[0, 1, 2], [3, 4, 5]]]
        draw = devpolicy.windows(
            tokens, 3, 2, order="random", seed=np.int64(7), steps=1, policy=policy_of()
        )  # type: ignore[arg-type]
        again = devpolicy.windows(tokens, 3, 2, order="random", seed=7, steps=1, policy=policy_of())
        assert [b.tolist() for b in draw] == [b.tolist() for b in again]

    @pytest.mark.parametrize(
        ("order", "stride"), [("random", None), ("sequential", 1)], ids=["random", "sequential"]
    )
    def test_a_batch_larger_than_the_host_is_refused_before_allocating(
        self, order: str, stride: int | None
    ) -> None:
        """`batch=2**40` says how large a batch would be and names batch and length,
        instead of numpy's raw MemoryError (nothing of that size is allocated). In order,
        a batch holds at most every window: 2**26 of them here, 128 GiB."""
        tokens = np.zeros(2**26, np.uint16)
        with pytest.raises(
            ValueError,
            match=r"^windows batch=1099511627776 of length=1025 needs [0-9.]+ [GTP]iB per batch "
            r"\(uint16, 2\.0 KiB a window\), and size=2 holds up to 6 batches at once: "
            r"[0-9.]+ [GTP]iB, more than the [0-9.]+ [MGT]iB this host has available: lower "
            r"size, batch or length$",
        ):
            devpolicy.windows(
                tokens,
                1025,
                2**40,
                order=order,  # type: ignore[arg-type]
                stride=stride,
                policy=policy_of(),
            )

    def test_an_accelerator_array_would_be_copied_and_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Tokens not on a host device: the error says where they are and what to do."""
        monkeypatch.setattr(_hostview, "_HOST_PLATFORMS", frozenset({"tpu"}))
        with pytest.raises(
            devpolicy.errors.HostViewError,
            match=r"^windows tokens, uint16\[8\] on cpu:0: not on a host device: a view would "
            r"first copy "
            r"16 bytes to the host; place it on the host",
        ):
            devpolicy.windows(jnp.zeros(8, jnp.uint16), 2, 2, policy=policy_of())


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

    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
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
    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
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
    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
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
    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
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

    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
    def test_random_windows_of_a_mapped_file_keep_resident_memory_flat(
        self, tmp_path: Path, through_the_mapping: devpolicy.ReadOptions
    ) -> None:
        """300 steps of 32 random windows copied out of a 512 MiB mapping leave under
        16 MiB of it resident (the same run without the advice: the next test)."""
        tokens = mapped_tokens(tmp_path, 2**28)
        with capture_logs() as logs:
            assert self.run(tokens, through_the_mapping) < self.BOUND
        assert [e["reads"] for e in logs if e["event"] == "stream_ended"] == ["mapping"]

    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
    def test_without_the_advice_the_same_run_grows_past_the_bound(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        through_the_mapping: devpolicy.ReadOptions,
    ) -> None:
        """The control: with the kernel's defaults (no advice, nothing given back) the
        same run leaves several times the bound resident, so the bound above holds
        because of the advice, not because the run is too short to show growth."""
        monkeypatch.setattr(_pages, "_MADVISE", None)
        tokens = mapped_tokens(tmp_path, 2**28)
        assert self.run(tokens, through_the_mapping) > 4 * self.BOUND

    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
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

    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
    @pytest.mark.parametrize("sweep_cheaper", [True, False], ids=["sweep", "blocks"])
    def test_a_release_takes_the_way_that_has_cost_less(
        self, tmp_path: Path, sweep_cheaper: bool
    ) -> None:
        """Where a sweep of the view has cost less than a call per window, a release
        gives back the whole view (pages no window came from too); else only the blocks
        the windows lie in, and the other pages stay."""
        tokens = mapped_tokens(tmp_path, 2**22)
        view = devpolicy.host_view(tokens)
        pager = _pages.Pager(view, random=True)
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

    @pytest.mark.skipif(_pages._MADVISE is None, reason="madvise is Linux's")
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
        tokens = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        view = devpolicy.host_view(tokens)
        stream = devpolicy.windows(tokens, 4096, 16, policy=policy_of(), reads="budget")
        for step, batch in enumerate(stream):
            first = step * 16 * 4096
            expected = values[first : first + batch.size].reshape(batch.shape)
            np.testing.assert_array_equal(np.asarray(batch), expected)
        if _pages._MADVISE is not None:
            assert resident(view) < 2**20  # of the 8 MiB read

    def test_anonymous_memory_is_never_given_back(self) -> None:
        """Windows of an array in ordinary memory (no file behind it) are read as they
        are, again and again: giving those pages back would zero them."""
        tokens = np.arange(2**22, dtype=np.uint32)
        pager = _pages.Pager(tokens, random=True)
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
        assert not _pages.Pager(tokens, random=False).active
        batches = devpolicy.windows(tokens, 512, 64, policy=policy_of())
        assert all(bool((np.asarray(b) == 7).all()) for b in batches)

    def test_a_read_only_memmap_is_given_back(self, tmp_path: Path) -> None:
        """`np.memmap(mode="r")` given directly is a file mapping like a loaded tensor."""
        path = tmp_path / "tokens.bin"
        np.zeros(2**20, np.uint16).tofile(path)
        pager = _pages.Pager(np.memmap(path, np.uint16, mode="r"), random=False)
        assert pager.active is (_pages._MADVISE is not None)


class TestHugeArrays:
    def test_the_story_dataset_is_mapped_viewed_and_sampled_past_2_31(
        self, tmp_path: Path, unwarned: None
    ) -> None:
        """10,248,871,837 uint16 tokens (19.09 GiB, sparse): loaded mapped with RSS
        under 1 GiB, viewed past 2**31 and at the end, windows sampled from there arrive
        on the batch device with the values written, and the ledger shows the tokens as
        file-backed on the host."""
        n = STORY_TOKENS
        length = 9
        stride = (n - length) // 4  # windows at 0, 2.56e9, 5.12e9, 7.69e9 and n - 9
        assert (n - length) % 4 == 0
        assert stride > 2**31
        known = {k * stride: np.arange(k * 10, k * 10 + length) for k in range(5)}
        known[2**31 + 5] = np.array([4242])
        path = tmp_path / "train.safetensors"
        sparse_tokens(path, n, known)
        policy = policy_of(rules=BATCH_RULES)
        before = rss_bytes()
        with capture_logs() as logs:
            tokens = devpolicy.load_file(path, policy=policy)["tokens"]
        assert tokens.shape == (n,)
        notes = [e for e in logs if e["event"] == "huge_array_x64_off"]
        # On the host, host_view and windows index it: information, not a warning.
        assert [(e["name"], e["elements"], e["log_level"]) for e in notes] == [
            ("train/tokens", n, "info")
        ]
        assert "devpolicy.host_view" in notes[0]["fix"]
        assert "devpolicy.windows" in notes[0]["fix"]
        assert "runtime: {x64: true}" in notes[0]["fix"]
        assert not [e for e in logs if e["log_level"] == "warning"]
        with pytest.raises(OverflowError):
            tokens[-3:]  # what the view is for: JAX cannot index this with x64 off

        view = devpolicy.host_view(tokens)
        assert view[2**31 + 5] == 4242
        assert view[-length:].tolist() == list(range(40, 40 + length))

        batches = list(devpolicy.windows(tokens, length, 5, stride=stride, policy=policy))
        assert len(batches) == 1
        (batch,) = batches
        assert where(batch) == "cpu:1"
        assert batch.tolist() == [list(range(k * 10, k * 10 + length)) for k in range(5)]
        random = next(iter(devpolicy.windows(tokens, 4, 64, order="random", seed=1, policy=policy)))
        assert random.shape == (64, 4)
        assert where(random) == "cpu:1"

        entry = next(
            e for e in devpolicy.report().by_device["cpu:0"].entries if "train/tokens" in e.names
        )
        assert entry.nbytes == entry.file_backed == 2 * n
        assert rss_bytes() - before < 2**30

    def test_a_huge_array_no_view_can_reach_is_a_warning(
        self, tmp_path: Path, unwarned: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Off the host (an accelerator: here the CPU counted as one) neither host_view nor
        windows can index it, so the load warns, saying to place it on the host."""
        monkeypatch.setattr(_hostview, "_HOST_PLATFORMS", frozenset({"tpu"}))
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        with capture_logs() as logs:
            x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        (warning,) = [e for e in logs if e["event"] == "huge_array_x64_off"]
        assert warning["log_level"] == "warning"
        assert warning["fix"].startswith("place it on a host device (a rule with `device: cpu`")
        del x

    def test_the_event_is_given_once_per_process(self, tmp_path: Path, unwarned: None) -> None:
        """A second huge array says nothing more; a small one never says anything."""
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        small = tmp_path / "small.safetensors"
        devpolicy.save_file({"tokens": np.zeros(2**10, np.uint16)}, small)
        policy = policy_of(rules=BATCH_RULES)
        with capture_logs() as logs:
            kept = [
                policy.load_file(small)["tokens"],
                policy.load_file(path)["tokens"],
                policy.load_file(path, prefix="again")["tokens"],
            ]
        assert [e["name"] for e in logs if e["event"] == "huge_array_x64_off"] == ["big/tokens"]
        assert len(kept) == 3

    def test_no_warning_at_exactly_2_31_elements(self, tmp_path: Path, unwarned: None) -> None:
        """2**31 elements are still indexable (the last index is 2**31 - 1)."""
        path = tmp_path / "edge.safetensors"
        sparse_tokens(path, 2**31, {2**31 - 1: np.array([9])})
        with capture_logs() as logs:
            x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        assert int(x[-1]) == 9
        assert not [e for e in logs if e["event"] == "huge_array_x64_off"]

    def test_no_warning_with_x64_on(self, tmp_path: Path, unwarned: None) -> None:
        """With x64 enabled JAX indexes in 64 bits: nothing to warn about."""
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        jax.config.update("jax_enable_x64", True)
        try:
            with capture_logs() as logs:
                x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        finally:
            jax.config.update("jax_enable_x64", False)
        assert not [e for e in logs if e["event"] == "huge_array_x64_off"]
        del x


def step_by_step(tokens: np.ndarray, length: int, batch: int, seed: int, steps: int) -> list:
    """Random windows drawn one step at a time (`random_starts` of one step each), each
    window sliced and stacked: what a stream must give however it groups its steps."""
    rows = np.arange(batch, dtype=np.uint64)
    out = []
    for step in range(steps):
        (starts,) = _sampling.random_starts(seed, step, 1, rows, batch, len(tokens) - length + 1)
        out.append(np.stack([tokens[s : s + length] for s in starts.tolist()]))
    return out


class TestStream:
    """What is the same for every batch is done once per stream: one decision, one event
    at the end with the counts, the ledger's tally; the batches are cut and sent a group
    at a time, into host buffers never changed under their user."""

    def test_a_seed_gives_the_same_batches_as_one_draw_a_step(self) -> None:
        """Grouping draws several steps' starts at once, and they are the same numbers as
        one draw a step (odd batch sizes too): a step's windows depend on the seed and
        the step alone."""
        tokens = np.arange(5000, dtype=np.int32)
        for batch in (1, 7, 32):
            stream = devpolicy.windows(
                tokens, 33, batch, order="random", seed=3, steps=21, policy=policy_of()
            )
            got = [np.asarray(b) for b in stream]
            expected = step_by_step(tokens, 33, batch, 3, 21)
            assert len(got) == 21
            for a, b in zip(got, expected, strict=True):
                np.testing.assert_array_equal(a, b)

    def test_one_placement_and_one_stream_event_however_many_batches(self) -> None:
        """200 batches at debug level: one `placement` event (the decision), no repeats,
        and one `stream_ended` event with the count, bytes, device and rule."""
        policy = policy_of(rules=BATCH_RULES, logging={"level": "debug"})
        tokens = np.arange(10_000, dtype=np.uint16)
        with capture_logs() as logs:
            for _ in devpolicy.windows(
                tokens, 64, 4, order="random", seed=0, steps=200, policy=policy
            ):
                pass
        batch_events = [e for e in logs if e.get("name") == "batch"]
        assert [e["event"] for e in batch_events] == ["placement", "stream_ended"]
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert (ended["how"], ended["batches"], ended["dropped"]) == ("ended", 200, 0)
        assert (ended["nbytes"], ended["device"]) == (200 * 4 * 64 * 2, "cpu:1")
        assert ended["origin"].endswith("rules[1]")

    def test_closing_says_how_many_batches_were_used_and_dropped(self) -> None:
        """A stream closed early ends with one event: batches handed out, and those in
        flight dropped."""
        policy = policy_of(rules=BATCH_RULES)
        stream = devpolicy.windows(np.arange(1000), 10, 2, order="random", policy=policy)
        with capture_logs() as logs:
            next(stream)
            next(stream)
            stream.close()
            stream.close()
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert (ended["how"], ended["batches"]) == ("closed", 2)
        assert ended["dropped"] >= 1

    def test_the_ledger_counts_a_stream_and_names_its_recent_batches(self) -> None:
        """`streams.streams()` counts the batches a stream placed; `report` finds the
        batches still held under the stream's name."""
        from devpolicy._machine import streams

        policy = policy_of(rules=[{"match": "counted_batch", "device": "cpu:2"}])
        stream = devpolicy.windows(
            np.arange(100, dtype=np.float32), 5, 3, name="counted_batch", policy=policy
        )
        held = list(stream)
        (tally,) = [s for s in streams.streams() if s.name == "counted_batch"]
        assert (tally.batches, tally.device, tally.open) == (7, "cpu:2", False)
        assert tally.nbytes == 6 * 3 * 5 * 4 + 2 * 5 * 4  # the last batch holds two windows
        entries = devpolicy.report().by_device["cpu:2"].entries
        named = [e for e in entries if "counted_batch" in e.names]
        assert sum(e.arrays for e in named) == len(held) == 7

    @pytest.mark.parametrize("adopted", [True, False], ids=["adopted", "copied"])
    def test_batches_never_change_under_their_user(
        self, monkeypatch: pytest.MonkeyPatch, adopted: bool
    ) -> None:
        """With the host-buffer ring in use on the CPU (as on an accelerator): where the
        device adopts the aligned buffers, none is reused (one per group); where it copies
        them (buffers made unaligned here), a few are reused over and over. Either way
        every batch still holds its own windows after 240 more were cut."""
        from devpolicy._apply import hostview as _hostview

        monkeypatch.setattr(_hostview, "ADOPTING", frozenset())
        made: list[int] = []

        def buffer(nbytes: int) -> np.ndarray:
            raw = np.empty(nbytes + 128, np.uint8)
            start = (-raw.ctypes.data) % 64 + (0 if adopted else 16)
            made.append(nbytes)
            return raw[start : start + nbytes]

        monkeypatch.setattr(_groups, "aligned", buffer)
        tokens = np.arange(2**16, dtype=np.uint32)
        stream = devpolicy.windows(
            tokens, 256, 4, order="random", seed=1, steps=240, policy=policy_of(rules=BATCH_RULES)
        )
        held = list(stream)
        groups = 240 // _windows.GROUP_MAX
        assert len(made) == (groups if adopted else 3)
        for batch in held:
            values = np.asarray(batch)
            np.testing.assert_array_equal(values, values[:, :1] + np.arange(256))
        expected = step_by_step(tokens, 256, 4, 1, 240)
        for a, b in zip(held, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)

    @pytest.mark.usefixtures("copying_device")
    def test_bound_for_a_copying_device_the_ring_is_reused_and_batches_hold(self) -> None:
        """Under the honest copying-device fake (each batch the device's own copy, as on an
        accelerator), the stream reuses its few ring buffers, and every batch still holds
        its own windows after 240 more were cut into the same buffers."""
        made: list[int] = []
        aligned = _groups.aligned

        def counted(nbytes: int) -> np.ndarray:
            made.append(nbytes)
            return aligned(nbytes)

        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(_groups, "aligned", counted)
            tokens = np.arange(2**16, dtype=np.uint32)
            stream = devpolicy.windows(
                tokens,
                256,
                4,
                order="random",
                seed=1,
                steps=240,
                policy=policy_of(rules=BATCH_RULES),
            )
            held = list(stream)
        assert len(made) == 3  # the ring, reused
        expected = step_by_step(tokens, 256, 4, 1, 240)
        for a, b in zip(held, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)

    def test_on_the_cpu_a_batch_is_the_buffer_it_was_cut_into(self) -> None:
        """A CPU device adopts the aligned group buffer: no second copy of a batch."""
        (batch,) = devpolicy.windows(np.arange(64, dtype=np.uint16), 64, 1, policy=policy_of())
        assert batch.unsafe_buffer_pointer() % 64 == 0
        assert batch.is_fully_replicated

    def test_batches_are_sharded_over_a_mesh_by_the_rule(self) -> None:
        """A sharded batch rule: each batch split by rows over the 4 devices, values
        exact, the last smaller batch decided for its own shape."""
        mesh = {"grid": {"axes": {"data": 4}, "devices": "cpu"}}
        rule = {"match": "batch", "sharding": {"mesh": "grid", "spec": ["data"]}}
        policy = policy_of(meshes=mesh, rules=[rule], fallback=["cpu:3"])
        tokens = np.arange(40 * 8, dtype=np.int32).reshape(40, 8)
        out = list(devpolicy.windows(tokens, 4, 8, stride=3, policy=policy))
        assert [b.shape for b in out] == [(8, 4, 8)] * 1 + [(5, 4, 8)]
        assert out[0].sharding.spec == jax.sharding.PartitionSpec("data")
        assert len(out[0].sharding.device_set) == 4
        starts = [s for b in out for s in np.asarray(b)[:, 0, 0].tolist()]
        assert starts == [8 * 3 * i for i in range(13)]

    def test_64_bit_tokens_are_narrowed_once_checked_each_batch(self) -> None:
        """int64 tokens with x64 off: every batch is narrowed to int32 and checked; one
        `narrowed` event for the stream; a batch that would change is refused, naming
        the batch; with narrow='lossy' it is narrowed with one warning."""
        tokens = np.arange(1000, dtype=np.int64)
        policy = policy_of(rules=BATCH_RULES)
        with capture_logs() as logs:
            out = list(devpolicy.windows(tokens, 10, 4, steps=20, policy=policy))
        assert {b.dtype for b in out} == {np.dtype(np.int32)}
        assert [e["event"] for e in logs].count("narrowed") == 1
        tokens[500] = 2**40
        with pytest.raises(devpolicy.errors.NarrowingError, match=r"tensor 'batch'"):
            list(devpolicy.windows(tokens, 10, 4, policy=policy))
        with capture_logs() as logs:
            lossy = list(devpolicy.windows(tokens, 10, 4, narrow="lossy", policy=policy))
        assert len(lossy) == 25
        warned = [e for e in logs if e["event"] == "narrowed" and e["log_level"] == "warning"]
        assert len(warned) == 1

    def test_windows_past_2_31_are_gathered_with_64_bit_offsets(self, tmp_path: Path) -> None:
        """A mapped 2**31 + 2**20 token file: sequential windows that start past 2**31
        hold the values written there (one fancy index of the window view)."""
        n = 2**31 + 2**20
        first = 2**31 + 12345
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, n, {first: np.arange(1, 65)})
        tokens = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        (batch,) = devpolicy.windows(tokens, 64, 2, stride=first, policy=policy_of())
        assert np.asarray(batch).tolist() == [[0] * 64, list(range(1, 65))]

    def test_under_devpolicy_disable_batches_are_a_plain_device_put(self) -> None:
        """DEVPOLICY_DISABLE: batches land where `jax.device_put` puts them (the default
        device, uncommitted), as `put` does, values unchanged."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:3"}, environ={"DEVPOLICY_DISABLE": "1"}
        )
        out = list(devpolicy.windows(np.arange(20, dtype=np.int32), 5, 2, policy=policy))
        assert {where(b) for b in out} == {"cpu:0"}
        assert not any(b.committed for b in out)
        assert np.asarray(out[1]).tolist() == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]


class TestHardening:
    """Inputs and endings a hostile or hurried user meets."""

    @pytest.mark.parametrize("stride", [10**20, 2**63, 10_000])
    def test_a_stride_past_the_array_gives_one_window_a_pass(self, stride: int) -> None:
        """A stride longer than the array (10**20 included, past int64) is one window a
        pass, the one at 0, never a raw OverflowError."""
        tokens = np.arange(1000, dtype=np.int32)
        batches = [
            np.asarray(b)
            for b in devpolicy.windows(tokens, 10, 4, stride=stride, policy=policy_of())
        ]
        assert len(batches) == 1
        np.testing.assert_array_equal(batches[0], tokens[None, :10])

    @pytest.mark.slow
    def test_a_stream_left_open_at_exit_prints_nothing(self, tmp_path: Path) -> None:
        """A stream read from and left open when the interpreter exits (a script that
        breaks out of its loop) ends without an "Exception ignored" line on stderr."""
        script = tmp_path / "left_open.py"
        tokens_path = tmp_path / "tokens.bin"
        script.write_text(
            "import numpy as np, devpolicy\n"
            "p = devpolicy.load_policy({'version': 1, 'logging': {'level': 'warning'}}, "
            "environ={})\n"
            "stream = devpolicy.windows(np.arange(10_000), 16, 4, order='random', seed=0, "
            "policy=p)\n"
            "next(stream)\n"
            f"path = {str(tokens_path)!r}\n"
            "np.arange(100_000, dtype=np.uint16).tofile(path)\n"
            "mapped = np.memmap(path, np.uint16, mode='r')\n"
            "from_file = devpolicy.windows(mapped, 16, 4, order='random', seed=0, policy=p)\n"
            "next(from_file)\n"
        )
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "Exception ignored" not in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr

    def test_every_stream_logs_its_end_at_info(self) -> None:
        """A warm-up stream and the real one under the same name: each logs its own
        `stream_ended` at info with its own counts (the second is not demoted to debug)."""
        policy = policy_of(rules=BATCH_RULES)
        tokens = np.arange(10_000, dtype=np.uint16)
        with capture_logs() as logs:
            for steps in (3, 20):
                for _ in devpolicy.windows(
                    tokens, 8, 2, order="random", seed=0, steps=steps, policy=policy
                ):
                    pass
        ended = [e for e in logs if e["event"] == "stream_ended"]
        assert [(e["log_level"], e["batches"]) for e in ended] == [("info", 3), ("info", 20)]


class TestArgumentsRefusedBeforeAnythingOpens:
    """Issue 56's attack findings on `windows`' arguments (H1, M4, N8), each refused at
    the call, naming the argument, before a batch is cut."""

    def test_a_size_past_the_cap_is_refused_naming_size_not_grown_into(self) -> None:
        """H1: `size=10**7` placed ten million batches before the first came, growing
        memory until the process died; now a ValueError names `size` and its range."""
        tokens = np.arange(100_000, dtype=np.int32)
        with pytest.raises(
            ValueError, match=r"^windows size must be an int from 1 to 1024 .*got 10000000$"
        ):
            devpolicy.windows(
                tokens, 8, 4, order="shuffled", seed=1, size=10**7, policy=policy_of()
            )

    def test_batches_ahead_the_host_cannot_hold_are_refused_naming_size(self) -> None:
        """H1: one batch fits the host, `2 * size + 2` of them do not: refused with what
        a batch needs and how many the stream would hold, before anything is allocated."""
        from devpolicy._machine.capacity import host_available_bytes

        available = host_available_bytes()
        if available is None:
            pytest.skip("this host does not say how much memory it has available")
        window = 1000
        batch = available // (10 * window)  # a tenth of what is available, a batch
        tokens = np.zeros(window, np.uint8)
        with pytest.raises(
            ValueError, match=r"size=8 holds up to 18 batches at once: .* lower size, batch"
        ):
            devpolicy.windows(
                tokens, window, batch, order="random", seed=0, size=8, policy=policy_of()
            )

    @pytest.mark.parametrize(
        "tokens",
        [
            np.array(["a", "b", "c", "d"] * 10),
            np.array([object()] * 40),
            np.zeros(40, [("id", np.int32), ("w", np.float32)]),
            np.zeros(40, "datetime64[s]"),
        ],
        ids=["str", "object", "structured", "datetime"],
    )
    def test_tokens_that_are_not_numbers_are_refused_naming_tokens_and_dtype(
        self, tokens: np.ndarray
    ) -> None:
        """M4: such tokens were accepted and the first pull raised numpy's or JAX's
        TypeError, naming neither `windows` nor `tokens`."""
        with pytest.raises(
            TypeError, match=rf"^windows tokens are {re.escape(str(tokens.dtype))}: .*numbers"
        ):
            devpolicy.windows(tokens, 4, 2, policy=policy_of())

    def test_numbers_of_every_kind_jax_takes_are_accepted(self) -> None:
        """The dtype check refuses nothing a stream could place: bool, ints, floats and
        ml_dtypes' bfloat16."""
        import ml_dtypes

        for dtype in (np.bool_, np.uint16, np.int32, np.float16, ml_dtypes.bfloat16):
            (batch,) = devpolicy.windows(np.zeros(8, dtype), 4, 2, steps=1, policy=policy_of())
            assert batch.dtype == np.dtype(dtype)

    @pytest.mark.parametrize(
        ("tokens", "got"), [(list(range(5000)), "list"), (tuple(range(50)), "tuple")]
    )
    def test_a_python_list_of_tokens_is_refused_naming_windows_and_tokens(
        self, tokens: object, got: str
    ) -> None:
        """N8: the error named `host_view()`, a function the user never called."""
        with pytest.raises(
            TypeError,
            match=rf"^windows tokens must be a jax\.Array .*got a {got}: pass np\.asarray",
        ):
            devpolicy.windows(tokens, 10, 2, policy=policy_of())

    def test_a_mixture_source_that_is_a_list_is_named(self) -> None:
        with pytest.raises(TypeError, match=r"^windows tokens\['code'\] must be a jax\.Array"):
            devpolicy.windows(
                {"web": np.arange(100), "code": list(range(100))},
                4,
                2,
                order="random",
                weights={"web": 1, "code": 1},
                policy=policy_of(),
            )


class TestFieldsAndPlacedBytes:
    def test_a_batch_with_segments_is_decided_on_all_the_bytes_it_places(self) -> None:
        """T1: the decision (and its event) counted the tokens' 4,096 bytes where the batch
        places 20,480 with its segment ids and positions: a `min_bytes: 10000` rule missed
        a 20 KB batch, silently."""
        policy = policy_of(
            rules=[
                {"match": "batch", "device": "cpu:1", "min_bytes": 10000},
                {"match": "batch", "device": "cpu:2"},
            ]
        )
        tokens = np.random.default_rng(0).integers(0, 100, 100_000).astype(np.uint16)
        with capture_logs() as logs:
            stream = devpolicy.windows(
                tokens, 1024, 2, order="random", seed=0, separator=0, policy=policy
            )
            batch = next(stream)
            stream.close()
        assert {where(a) for a in batch.values()} == {"cpu:1"}
        placement = next(e for e in logs if e["event"] == "placement")
        assert placement["nbytes"] == 2 * 1024 * (2 + 4 + 4) == 20480
        ended = next(e for e in logs if e["event"] == "stream_ended")
        assert ended["nbytes"] == 20480

    def test_fields_rename_a_batch_for_the_model(self) -> None:
        """T2: flax's lm1b wants inputs, inputs_segmentation and inputs_position."""
        lm1b = {
            "tokens": "inputs",
            "segment_ids": "inputs_segmentation",
            "positions": "inputs_position",
        }
        tokens = np.array([5, 0, 6, 7, 0, 8, 9, 0], np.uint16)
        plain = next(devpolicy.windows(tokens, 4, 2, separator=0, policy=policy_of()))
        renamed = next(
            devpolicy.windows(tokens, 4, 2, separator=0, fields=lm1b, policy=policy_of())
        )
        assert sorted(renamed) == sorted(lm1b.values())
        for ours, theirs in lm1b.items():
            assert np.array_equal(plain[ours], renamed[theirs])

    def test_fields_without_separator_make_each_batch_a_dict_of_the_tokens(self) -> None:
        stream = devpolicy.windows(
            np.arange(8), 4, 2, fields={"tokens": "inputs"}, policy=policy_of()
        )
        (batch,) = list(stream)
        assert list(batch) == ["inputs"]
        assert batch["inputs"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]

    @pytest.mark.parametrize(
        ("fields", "options", "error", "message"),
        [
            (["inputs"], {}, TypeError, r"^windows fields must be a mapping"),
            (
                {"segment_ids": "seg"},
                {},
                ValueError,
                r"^windows fields names a batch's keys: tokens; got 'segment_ids' "
                r"\(segment_ids and positions come with separator= only\)$",
            ),
            ({"token": "inputs"}, {"separator": 0}, ValueError, r"got 'token'$"),
            ({"tokens": ""}, {}, TypeError, r"^windows fields\['tokens'\] must be a non-empty"),
            (
                {"tokens": "x", "positions": "x"},
                {"separator": 0},
                ValueError,
                r"^windows fields would give two of a batch's arrays one key",
            ),
        ],
    )
    def test_bad_fields_are_refused_naming_them(
        self, fields: object, options: dict[str, object], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            devpolicy.windows(
                np.arange(8),
                4,
                2,
                fields=fields,
                policy=policy_of(),
                **options,  # type: ignore[arg-type]
            )
