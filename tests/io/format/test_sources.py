"""The byte-source seam: `LocalFile` reads exactly what it is asked for, or says why not,
naming the file; and a source without a descriptor loads as a file does."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._io.format.header import Header, read_header, read_header_from
from devpolicy._io.format.sources import ByteSource, LocalFile, SourceEndedError
from devpolicy._io.reading import checkpoint_sources as _places
from tests.helpers import policy_of, run_threads

DATA = bytes(range(256)) * 64  # 16 KiB, every byte's value its offset mod 256


def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(DATA)
    return path


class InMemory:
    """A `ByteSource` with no descriptor, as a remote source is: bytes held in memory."""

    def __init__(self, data: bytes, name: str) -> None:
        self._data = data
        self._name = name
        self.reads = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return len(self._data)

    def fileno(self) -> int | None:
        return None

    def read_into(self, offset: int, buffer: memoryview) -> None:
        end = offset + len(buffer)
        if end > len(self._data):
            raise SourceEndedError(self._name, offset, len(buffer), len(self._data))
        buffer[:] = self._data[offset:end]
        self.reads += 1

    def read_many(self, requests: Sequence[tuple[int, memoryview]]) -> None:
        for offset, buffer in requests:
            self.read_into(offset, buffer)

    def close(self) -> None:
        pass


class TestLocalFileReads:
    @pytest.mark.parametrize(
        ("offset", "length"),
        [(0, 1), (0, len(DATA)), (1, 255), (4095, 4097), (len(DATA) - 3, 3), (100, 0)],
    )
    def test_a_read_fills_the_buffer_with_exactly_the_bytes_at_its_offset(
        self, tmp_path: Path, offset: int, length: int
    ) -> None:
        with LocalFile.open(data_file(tmp_path)) as source:
            buffer = bytearray(length)
            source.read_into(offset, memoryview(buffer))
        assert bytes(buffer) == DATA[offset : offset + length]

    def test_name_size_and_descriptor_are_known_at_open(self, tmp_path: Path) -> None:
        path = data_file(tmp_path)
        with LocalFile.open(path) as source:
            assert (source.name, source.size) == (str(path), len(DATA))
            assert os.fstat(source.fileno()).st_size == len(DATA)

    def test_a_read_past_the_end_raises_naming_the_file_and_where_it_ends(
        self, tmp_path: Path
    ) -> None:
        path = data_file(tmp_path)
        with LocalFile.open(path) as source:
            with pytest.raises(
                SourceEndedError,
                match=rf"^{re.escape(str(path))}: ended at byte {len(DATA)}, reading 20 bytes "
                rf"at {len(DATA) - 10}: truncated\?$",
            ) as caught:
                source.read_into(len(DATA) - 10, memoryview(bytearray(20)))
            assert caught.value.end == len(DATA)
            assert isinstance(caught.value, devpolicy.SafetensorsFileError)

    def test_a_read_wholly_out_of_range_raises_naming_the_file(self, tmp_path: Path) -> None:
        path = data_file(tmp_path)
        with (
            LocalFile.open(path) as source,
            pytest.raises(SourceEndedError, match=rf"^{re.escape(str(path))}: ended at byte"),
        ):
            source.read_into(len(DATA) + 100, memoryview(bytearray(1)))

    def test_a_file_truncated_after_open_raises_naming_it_never_a_short_buffer(
        self, tmp_path: Path
    ) -> None:
        path = data_file(tmp_path)
        with LocalFile.open(path) as source:
            os.truncate(path, 1000)
            with pytest.raises(SourceEndedError, match=re.escape(str(path))) as caught:
                source.read_into(0, memoryview(bytearray(4096)))
        assert caught.value.end == 1000

    def test_read_many_fills_every_buffer_in_any_order(self, tmp_path: Path) -> None:
        wanted = [(9000, 7), (0, 16), (300, 0), (5, 4096), (len(DATA) - 1, 1)]
        buffers = [bytearray(n) for _, n in wanted]
        with LocalFile.open(data_file(tmp_path)) as source:
            source.read_many(
                [(o, memoryview(b)) for (o, _), b in zip(wanted, buffers, strict=True)]
            )
        assert [bytes(b) for b in buffers] == [DATA[o : o + n] for o, n in wanted]

    def test_read_many_raises_when_any_request_is_past_the_end(self, tmp_path: Path) -> None:
        path = data_file(tmp_path)
        with LocalFile.open(path) as source, pytest.raises(SourceEndedError, match=r"data\.bin"):
            source.read_many([(0, memoryview(bytearray(8))), (len(DATA), memoryview(bytearray(1)))])

    def test_threads_reading_at_once_each_get_their_own_range(self, tmp_path: Path) -> None:
        """Reads are positional: no shared file offset for threads to race on."""
        results: dict[int, bytes] = {}
        with LocalFile.open(data_file(tmp_path)) as source:

            def reader(offset: int) -> None:
                for _ in range(200):
                    buffer = bytearray(1000)
                    source.read_into(offset, memoryview(buffer))
                    assert bytes(buffer) == DATA[offset : offset + 1000]
                results[offset] = bytes(buffer)

            run_threads(*(lambda o=o: reader(o) for o in (0, 3001, 7002, 12003)))
        assert sorted(results) == [0, 3001, 7002, 12003]

    def test_closing_twice_is_allowed_and_a_closed_file_reads_nothing(self, tmp_path: Path) -> None:
        source = LocalFile.open(data_file(tmp_path))
        source.close()
        source.close()
        with pytest.raises(OSError):
            source.read_into(0, memoryview(bytearray(1)))


class TestLocalFileOpening:
    def test_a_missing_file_is_refused_naming_it(self, tmp_path: Path) -> None:
        missing = tmp_path / "none.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=rf"^{re.escape(str(missing))}: no such file$"
        ):
            LocalFile.open(missing)

    def test_a_fifo_is_refused_at_once_saying_what_it_is(self, tmp_path: Path) -> None:
        fifo = tmp_path / "pipe.safetensors"
        os.mkfifo(fifo)
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"is a FIFO or pipe"):
            LocalFile.open(fifo)


def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Small tensors (read in runs), a 2 MiB one (read whole) and one to shard."""
    tensors = {f"s{i}": np.full(64, i, np.float32) for i in range(20)}
    tensors["big"] = np.arange(2**19, dtype=np.float32)
    tensors["sharded"] = np.arange(4096, dtype=np.int32).reshape(64, 64)
    path = tmp_path / "m.safetensors"
    devpolicy.save_file(tensors, path)
    return path, tensors


class TestASourceWithoutADescriptor:
    def test_its_header_reads_as_the_file_does_without_an_identity(self, tmp_path: Path) -> None:
        path, _ = checkpoint(tmp_path)
        source: ByteSource = InMemory(path.read_bytes(), str(path))
        header: Header = read_header_from(source, path)
        local = read_header(path)
        assert (header.tensors, header.data_start, header.metadata) == (
            local.tensors,
            local.data_start,
            local.metadata,
        )
        assert header.identity == ()

    def test_a_checkpoint_loads_the_same_arrays_every_tensor_read_never_mapped(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Runs, whole tensors and shard slices all read through the source's own reads."""
        path, tensors = checkpoint(tmp_path)
        remote = InMemory(path.read_bytes(), str(path))
        monkeypatch.setattr(_places, "reopen_tensor_file", lambda header: remote)
        policy = policy_of(
            meshes={"four": {"axes": {"data": 4}, "devices": "cpu"}},
            rules=[
                {"match": "m/sharded", "sharding": {"mesh": "four", "spec": ["data"]}},
                {"match": "*", "device": "cpu:1"},
            ],
        )
        with capture_logs() as events:
            out = devpolicy.load_file(path, policy=policy, mmap=True, progress=False)
        assert remote.reads > 0
        assert sorted(out) == sorted(tensors)
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)
        assert len(out["sharded"].sharding.device_set) == 4
        (summary,) = [e for e in events if e["event"] == "load_file"]
        assert summary["mapped"] == 0
        assert summary["bytes_read"] == sum(t.nbytes for t in tensors.values())

    def test_a_truncated_source_names_the_file_and_the_tensor(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path, _ = checkpoint(tmp_path)
        remote = InMemory(path.read_bytes()[:-5000], str(path))
        monkeypatch.setattr(_places, "reopen_tensor_file", lambda header: remote)
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(path))}: tensor '\w+': file ended after \d+ of \d+ bytes",
        ):
            devpolicy.load_file(path, policy=policy_of(), progress=False)
