"""Windows of a file-backed host array read by position from the file (`positional`)."""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply.stream import sampling
from devpolicy._apply.stream.reads import opening
from devpolicy._read import positional
from tests.apply.conftest import ByPosition, batched_reads_here
from tests.apply.streams import TOKEN_RULES, sparse_tokens
from tests.helpers import policy_of

COUNT = 2**20


def token_file(tmp_path: Path, count: int = COUNT) -> tuple[Path, np.ndarray]:
    """A mapped-loadable token file of `count` known uint16 values, and the values."""
    values = (np.arange(count, dtype=np.uint64) * 2654435761 % 65521).astype(np.uint16)
    path = tmp_path / "train.safetensors"
    sparse_tokens(path, count, {0: values})
    return path, values


def expected(values: np.ndarray, seed: int, steps: int, length: int, batch: int) -> np.ndarray:
    """The batches a random stream with `seed` draws: (steps, batch, length)."""
    rows = np.arange(batch, dtype=np.uint64)
    starts = sampling.random_starts(seed, 0, steps, rows, batch, len(values) - length + 1)
    return values[starts[..., None] + np.arange(length)]


def reads_of(logs: list[dict[str, object]]) -> list[object]:
    return [e["reads"] for e in logs if e["event"] == "stream_ended"]


def open_descriptors(path: Path) -> int:
    """Descriptors this process holds open on `path`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # the listing's own descriptor, gone
            continue
    return count


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux's /proc")
class TestReadByPosition:
    def test_windows_of_a_loaded_file_are_read_from_it_exactly(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """A stream over a mapped token file reads its windows from the file: every
        batch holds exactly the windows the seed draws, and the stream says so."""
        path, values = token_file(tmp_path)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        with capture_logs() as logs:
            stream = devpolicy.windows(
                tokens,
                100,
                8,
                order="random",
                seed=5,
                steps=40,
                policy=policy_of(),
                reads=by_position.reads,
            )
            got = np.stack([np.asarray(b) for b in stream])
        np.testing.assert_array_equal(got, expected(values, 5, 40, 100, 8))
        assert reads_of(logs) == ["file"]

    def test_an_np_memmap_is_read_by_position_too(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """Any read-only mapping of a file is read by position, not only load_file's."""
        path, values = token_file(tmp_path)
        start = path.stat().st_size - 2 * COUNT
        mapped = np.memmap(path, np.uint16, mode="r", offset=start, shape=(COUNT,))
        with capture_logs() as logs:
            got = np.stack(
                [
                    np.asarray(b)
                    for b in devpolicy.windows(
                        mapped,
                        64,
                        4,
                        order="random",
                        seed=2,
                        steps=30,
                        policy=policy_of(),
                        reads=by_position.reads,
                    )
                ]
            )
        np.testing.assert_array_equal(got, expected(values, 2, 30, 64, 4))
        assert reads_of(logs) == ["file"]

    def test_a_copy_on_write_mapping_is_copied_from_memory_not_the_file(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """A private writable map (`mode="c"`) may hold what the file does not: its
        windows are copied from memory (nothing read from the file, nothing given back),
        and show the values written into it."""
        path, _ = token_file(tmp_path)
        start = path.stat().st_size - 2 * COUNT
        mapped = np.memmap(path, np.uint16, mode="c", offset=start, shape=(COUNT,))
        mapped[:] = 7  # in this process's pages only
        with capture_logs() as logs:
            batches = list(
                devpolicy.windows(
                    mapped, 16, 2, steps=3, policy=policy_of(), reads=by_position.reads
                )
            )
        assert all((np.asarray(b) == 7).all() for b in batches)
        assert reads_of(logs) == ["memory"]

    def test_a_file_replaced_after_mapping_is_never_read(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """The mapped file renamed over by another (as an atomic writer does): the
        windows are still the mapped file's, never the new file's."""
        path, values = token_file(tmp_path)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        planted = tmp_path / "planted.safetensors"
        sparse_tokens(planted, COUNT, {0: np.full(COUNT, 9, np.uint16)})
        os.replace(planted, path)
        got = np.stack(
            [
                np.asarray(b)
                for b in devpolicy.windows(
                    tokens,
                    32,
                    4,
                    order="random",
                    seed=1,
                    steps=10,
                    policy=policy_of(),
                    reads=by_position.reads,
                )
            ]
        )
        np.testing.assert_array_equal(got, expected(values, 1, 10, 32, 4))

    def test_a_file_truncated_under_the_stream_is_an_error_naming_it(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """A token file cut short while a stream reads it: a clear error naming the file
        and where it ended, not a SIGBUS or short batches."""
        path, _ = token_file(tmp_path)
        start = path.stat().st_size - 2 * COUNT
        mapped = np.memmap(path, np.uint16, mode="r", offset=start, shape=(COUNT,))
        stream = devpolicy.windows(
            mapped, 64, 4, steps=10_000, policy=policy_of(), reads=by_position.reads
        )
        next(stream)
        os.truncate(path, start + 1024)
        with pytest.raises(
            devpolicy.errors.HostViewError, match=r"^.*train\.safetensors: the file ended at byte "
        ):
            for _ in stream:
                pass
        stream.close()

    def test_a_stream_closed_mid_way_closes_its_file_and_yields_nothing_more(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """close() mid-way closes the descriptor the stream opened, and the stream then
        ends."""
        path, _ = token_file(tmp_path)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        before = open_descriptors(path)
        stream = devpolicy.windows(
            tokens, 64, 4, order="random", seed=0, policy=policy_of(), reads=by_position.reads
        )
        next(stream)
        assert open_descriptors(path) == before + 1
        stream.close()
        assert open_descriptors(path) == before
        assert list(stream) == []

    def test_a_stream_dropped_unclosed_closes_its_file(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """A stream read from, then dropped without close(), closes its descriptor (once
        the group its worker thread is reading ahead is read)."""
        path, _ = token_file(tmp_path)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        before = open_descriptors(path)
        stream = devpolicy.windows(
            tokens, 64, 4, order="random", seed=0, policy=policy_of(), reads=by_position.reads
        )
        next(stream)
        del stream
        gc.collect()
        deadline = time.monotonic() + 10
        while open_descriptors(path) != before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert open_descriptors(path) == before

    def test_two_streams_over_one_mapping_each_get_their_own_windows(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """Two streams over the same mapped tokens, interleaved batch by batch, each
        yield exactly the windows of their own seed."""
        path, values = token_file(tmp_path)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        first = devpolicy.windows(
            tokens,
            50,
            4,
            order="random",
            seed=1,
            steps=24,
            policy=policy_of(),
            reads=by_position.reads,
        )
        second = devpolicy.windows(
            tokens,
            70,
            3,
            order="random",
            seed=2,
            steps=24,
            policy=policy_of(),
            reads=by_position.reads,
        )
        got = [(np.asarray(a), np.asarray(b)) for a, b in zip(first, second, strict=True)]
        np.testing.assert_array_equal(np.stack([a for a, _ in got]), expected(values, 1, 24, 50, 4))
        np.testing.assert_array_equal(np.stack([b for _, b in got]), expected(values, 2, 24, 70, 3))

    @pytest.mark.usefixtures("copying_device")
    def test_kept_batches_never_change_while_the_ring_is_reused(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """With the host-buffer ring reused (a device that copies, as an accelerator
        does), every batch kept still holds its own windows after 240 more were read."""
        path, values = token_file(tmp_path)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        held = list(
            devpolicy.windows(
                tokens, 128, 4, order="random", seed=3, steps=240,
                policy=policy_of(rules=TOKEN_RULES),
                reads=by_position.reads,
            )
        )  # fmt: skip
        np.testing.assert_array_equal(
            np.stack([np.asarray(b) for b in held]), expected(values, 3, 240, 128, 4)
        )

    def test_sequential_windows_with_a_stride_are_read_exactly(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """A sequential pass with a stride, its last batch smaller, read from the file."""
        path, values = token_file(tmp_path, 10_000)
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        batches = [
            np.asarray(b)
            for b in devpolicy.windows(
                tokens, 300, 7, stride=250, policy=policy_of(), reads=by_position.reads
            )
        ]
        starts = np.arange(0, 10_000 - 300 + 1, 250)
        np.testing.assert_array_equal(
            np.concatenate(batches), values[starts[:, None] + np.arange(300)]
        )
        assert batches[-1].shape[0] == len(starts) % 7 or batches[-1].shape[0] == 7

    def test_64_bit_tokens_read_from_the_file_are_narrowed_exactly(
        self, tmp_path: Path, by_position: ByPosition
    ) -> None:
        """int64 tokens in a mapped file, x64 off: read by position, then narrowed to
        int32 with the values kept."""
        values = np.arange(50_000, dtype=np.int64) * 3
        path = tmp_path / "wide.bin"
        values.tofile(path)
        mapped = np.memmap(path, np.int64, mode="r", shape=(50_000,))
        batches = list(
            devpolicy.windows(
                mapped,
                40,
                5,
                order="random",
                seed=4,
                steps=12,
                policy=policy_of(),
                reads=by_position.reads,
            )
        )
        assert {np.asarray(b).dtype for b in batches} == {np.dtype(np.int32)}
        np.testing.assert_array_equal(
            np.stack([np.asarray(b) for b in batches]), expected(values, 4, 12, 40, 5)
        )


def test_memory_that_is_not_a_file_is_copied_from_memory() -> None:
    """A numpy array in memory has no file to read: `mapped_file` says so."""
    assert positional.mapped_file(np.arange(100, dtype=np.uint16), 10) is None
    assert opening.mapped_file is positional.mapped_file  # the stream's one way to a file


#: Read by position, a group in one call of a plain ring on the stream's worker thread.
PLAIN_RING = devpolicy.ReadOptions(path="file", polled=False)


@pytest.mark.skipif(not batched_reads_here(), reason="io_uring cannot be had here")
def test_an_interrupt_while_waiting_for_the_group_read_ahead_closes_after_that_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a stream waits for the group its worker thread reads ahead, then the
    stream closed (as a `with` block does): close waits for that read, so the worker never
    finds its ring or its file closed under it (the worker slowed, so the close comes first)."""
    read_batches = positional.FileWindows.read_batches

    def slow_on_the_worker(reader: positional.FileWindows, *args: Any) -> None:
        if threading.current_thread().name.startswith("devpolicy-windows"):
            time.sleep(0.02)  # the interrupt and the close come first
        read_batches(reader, *args)

    monkeypatch.setattr(positional.FileWindows, "read_batches", slow_on_the_worker)
    path, _ = token_file(tmp_path)
    tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
    original = Future.result
    for attempt in range(10):
        stream = devpolicy.windows(
            tokens, 256, 64, order="random", seed=attempt, policy=policy_of(), reads=PLAIN_RING
        )
        next(stream)
        interrupted: list[Future[Any]] = []

        def result(
            future: Future[Any], timeout: float | None = None, interrupted: list[Any] = interrupted
        ) -> Any:
            if not interrupted:
                interrupted.append(future)
                raise KeyboardInterrupt
            return original(future, timeout)

        monkeypatch.setattr(Future, "result", result)
        with pytest.raises(KeyboardInterrupt):
            for _ in stream:
                pass
        monkeypatch.setattr(Future, "result", original)
        stream.close()
        assert interrupted[0].done()  # close waited for it, or took it off the queue
        # Read undisturbed, unless the worker had not yet started it (then never read).
        assert interrupted[0].cancelled() or interrupted[0].exception() is None
