"""Large tensors read one ahead of their transfer, sent in batches with several calls in
flight, the host bytes in flight bounded, every value exact and every byte counted once."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._base.errors import SafetensorsFileError
from devpolicy._io.format.sources import open_tensor_file
from devpolicy._io.reading import checkpoint_sources as places
from devpolicy._io.reading import load, readahead, sending
from devpolicy._io.reading.buffers import MAP_THRESHOLD

MIB = 2**20


def large_file(
    tmp_path: Path, count: int = 4, nbytes: int = 2 * MIB
) -> tuple[Path, dict[str, Any]]:
    """`count` float32 tensors of `nbytes` each (each over `MAP_THRESHOLD`: read whole)."""
    assert nbytes >= MAP_THRESHOLD
    rng = np.random.default_rng(7)
    tensors = {f"w{i}": rng.standard_normal(nbytes // 4, dtype=np.float32) for i in range(count)}
    path = tmp_path / "large.safetensors"
    devpolicy.save_file(tensors, path)
    return path, tensors


def reading_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("devpolicy-read-ahead")]


class TestLargeTensorsReadAhead:
    def test_each_large_tensor_after_the_first_is_read_on_the_read_ahead_thread(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path, tensors = large_file(tmp_path)
        threads: list[str] = []
        read_tensor = readahead.read_tensor

        def spying(*args: Any) -> Any:
            threads.append(threading.current_thread().name)
            return read_tensor(*args)

        monkeypatch.setattr(readahead, "read_tensor", spying)
        policy = devpolicy.load_policy({"version": 1, "default": "cpu:2"}, environ={})
        out = devpolicy.load_file(path, policy=policy, mmap=False, progress=False)
        assert threads[0] == threading.current_thread().name
        assert len(threads) == len(tensors)
        assert all(name.startswith("devpolicy-read-ahead") for name in threads[1:])
        for key, value in tensors.items():
            assert out[key].devices() == {jax.devices("cpu")[2]}
            np.testing.assert_array_equal(np.asarray(out[key]), value)
        assert not reading_threads()

    def test_a_large_tensor_truncated_under_the_read_ahead_is_an_error_and_no_thread_is_left(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path, _ = large_file(tmp_path)
        read_header_from = places.read_header_from

        def then_truncate(f: Any, where: Path) -> Any:
            header = read_header_from(f, where)
            os.truncate(path, path.stat().st_size - 3 * MIB)  # into the third tensor
            return header

        monkeypatch.setattr(places, "read_header_from", then_truncate)
        # The identity check would refuse the shrunk file first; the read is what is tested.
        monkeypatch.setattr(places, "reopen_tensor_file", lambda header: open_tensor_file(path))
        with pytest.raises(SafetensorsFileError, match=r"file ended after .* bytes: truncated"):
            devpolicy.load_file(path, mmap=False, progress=False)
        assert not reading_threads()

    def test_the_progress_bar_counts_every_byte_once_whichever_thread_read_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _, tensors = large_file(tmp_path, count=3)
        small = {f"s{i}": np.full(300, i, np.int32) for i in range(5)}
        mixed = tmp_path / "mixed.safetensors"
        devpolicy.save_file({**tensors, **small}, mixed)
        moved: list[int] = []

        @contextmanager
        def counting(header: Any, total: int, wanted: bool | None) -> Iterator[Any]:
            yield moved.append  # list.append: safe from the reading threads

        monkeypatch.setattr(load, "progress_bar", counting)
        devpolicy.load_file(mixed, mmap=False, progress=False)
        assert sum(moved) == sum(v.nbytes for v in {**tensors, **small}.values())


class TestBatchedTransfers:
    def test_large_tensors_bound_for_one_device_go_in_one_device_put(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Four 2 MiB tensors (8 MiB, under a batch's 64 MiB) in one call, not four."""
        path, tensors = large_file(tmp_path)
        calls: list[int] = []
        device_put = jax.device_put

        def counting(x: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(len(x) if isinstance(x, list) else 1)
            return device_put(x, *args, **kwargs)

        monkeypatch.setattr(sending.jax, "device_put", counting)
        out = devpolicy.load_file(path, mmap=False, progress=False)
        assert calls == [len(tensors)]
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)

    def test_host_bytes_in_flight_never_pass_the_bound_and_all_arrive(self) -> None:
        bound = 3 * MIB
        out: dict[str, jax.Array] = {}
        advanced: list[int] = []
        sender = sending.Sender(out, advanced.append, in_flight=bound)
        device = jax.devices("cpu")[1]
        policy = devpolicy.load_policy({"version": 1, "default": "cpu:1"}, environ={})
        decision = policy.resolve("w")
        values = {f"w{i}": np.full(MIB // 4 * (i % 3 + 1), i, np.float32) for i in range(12)}
        for key, value in values.items():
            sender.add(key, value, decision, value.nbytes)
            sender.flush()  # one call per array: the bound is what holds them back
            assert sender.in_flight_bytes <= bound
        sender.finish()
        assert sender.in_flight_bytes == 0
        assert sum(advanced) == sum(v.nbytes for v in values.values())
        assert list(out) == list(values)
        for key, value in values.items():
            assert out[key].devices() == {device}
            np.testing.assert_array_equal(np.asarray(out[key]), value)


class TestExactness:
    @pytest.mark.parametrize("mmap", [False, True])
    def test_large_and_small_tensors_of_every_width_load_exactly(
        self, tmp_path: Path, mmap: bool
    ) -> None:
        rng = np.random.default_rng(3)
        tensors: dict[str, Any] = {}
        for i, dtype in enumerate([np.float32, np.int8, np.uint16, np.float16, np.int64, np.bool_]):
            large = (2 * MIB) // np.dtype(dtype).itemsize
            for size, tag in ((large, "big"), (100, "small")):
                raw = rng.integers(0, 100, size=size)
                tensors[f"{tag}{i}"] = raw.astype(dtype)
        path = tmp_path / "widths.safetensors"
        devpolicy.save_file(tensors, path)
        with capture_logs() as logs:
            out = devpolicy.load_file(path, mmap=mmap, progress=False)
        for key, value in tensors.items():
            loaded = np.asarray(out[key])
            expected = value.astype(np.int32) if value.dtype == np.int64 else value
            assert loaded.dtype == expected.dtype, key
            np.testing.assert_array_equal(loaded, expected)
        assert [e["event"] for e in logs if e["event"] == "load_file"] == ["load_file"]
