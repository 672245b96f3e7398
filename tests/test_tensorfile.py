"""The safetensors format: headers validated before any data is touched; aligned writes."""

from __future__ import annotations

import contextlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file as reference_load
from safetensors.numpy import save_file as reference_save

import devpolicy
from devpolicy._tensorfile import DTYPES, read_header, rewrite_aligned, write_file
from tests.helpers import safetensors_bytes


def raw_file(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    path.write_bytes(safetensors_bytes(header, data, length=length))
    return path


CORRUPT = [
    # (header, data, message)
    (
        {"t": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}},
        b"\0",
        r"tensor 't': unknown dtype 'Q8'; supported: BOOL, U8",
    ),
    (
        {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
        b"\0" * 4,
        r"tensor 't': shape \[2\] of F32 needs 8 bytes but data_offsets \[0, 4\] give 4",
    ),
    (
        {"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        b"\0" * 2,
        r"tensor 't': tensors need 4 data bytes but the file has 2: truncated\?",
    ),
    (
        {"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}},
        b"\0\0",
        r": 1 bytes after the last tensor are not described by the header",
    ),
    (
        {
            "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
        },
        b"\0" * 3,
        r"tensor 'b': overlaps 'a'",
    ),
    (
        {"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}},
        b"\0\0",
        r"tensor 'a': starts at data byte 1, leaving a hole at 0",
    ),
    (
        {"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}},
        b"\0",
        r"tensor 't': shape must be a list of non-negative integers, got \[-1\]",
    ),
    (
        {"t": {"dtype": "U8", "shape": [1], "data_offsets": [1, 0]}},
        b"\0",
        r"tensor 't': data_offsets must be \[begin, end\] with begin <= end, got \[1, 0\]",
    ),
    (
        {"t": {"dtype": "U8", "shape": [1]}},
        b"",
        r"tensor 't': entry must be an object with exactly dtype, shape and data_offsets",
    ),
    ({"t": [1, 2]}, b"", r"tensor 't': entry must be an object"),
    ([1, 2], b"", r": header must be a JSON object, got list"),
    ({"__metadata__": {"a": 1}}, b"", r": __metadata__ must map strings to strings"),
    (
        b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
        b"\0",
        r"tensor 't': tensor listed twice in the header",
    ),
    (
        b"{not json",
        b"",
        r": header is not valid JSON: Expecting property name enclosed in double quotes at byte 9",
    ),
    (b"\xff\xfe", b"", r": header is not UTF-8 \(byte 8\)"),
]


class TestReadHeader:
    @pytest.mark.parametrize(("header", "data", "message"), CORRUPT)
    def test_corrupt_headers_name_file_tensor_and_problem(
        self, tmp_path: Path, header: object, data: bytes, message: str
    ) -> None:
        """Every malformed header is a SafetensorsFileError saying what is wrong."""
        path = raw_file(tmp_path / "bad.safetensors", header, data)
        with pytest.raises(devpolicy.SafetensorsFileError, match=message) as info:
            read_header(path)
        assert info.value.file == str(path)

    def test_header_length_larger_than_the_file(self, tmp_path: Path) -> None:
        """A length field pointing past the end is caught before reading."""
        path = raw_file(tmp_path / "x.safetensors", {}, length=10_000)
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"header length 10000 is larger than the rest of the file \(2 bytes\)",
        ):
            read_header(path)

    def test_too_short_for_a_length(self, tmp_path: Path) -> None:
        """Fewer than 8 bytes cannot be a safetensors file."""
        (tmp_path / "x.safetensors").write_bytes(b"abc")
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"file is 3 bytes, too short to hold the 8-byte header length",
        ):
            read_header(tmp_path / "x.safetensors")

    def test_missing_file_and_directory(self, tmp_path: Path) -> None:
        """A missing path or a directory is named as such."""
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=r"nope\.safetensors: no such file$"
        ):
            read_header(tmp_path / "nope.safetensors")
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"is a directory"):
            read_header(tmp_path)

    def test_reference_files_parse(self, tmp_path: Path) -> None:
        """Files written by safetensors itself are read with offsets and metadata."""
        reference_save(
            {"a": np.zeros((2, 3), np.float32), "b": np.ones(5, np.uint16)},
            str(tmp_path / "r.safetensors"),
            metadata={"k": "v"},
        )
        header = read_header(tmp_path / "r.safetensors")
        assert [(t.key, t.dtype_name, t.shape, t.nbytes) for t in header.tensors] == [
            ("a", "F32", (2, 3), 24),
            ("b", "U16", (5,), 10),
        ]
        assert header.metadata == {"k": "v"}

    @settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.binary(max_size=200))
    def test_random_bytes_parse_or_raise_cleanly(self, tmp_path: Path, data: bytes) -> None:
        """No byte string makes the reader raise anything but SafetensorsFileError."""
        (tmp_path / "r.safetensors").write_bytes(data)
        with contextlib.suppress(devpolicy.SafetensorsFileError):
            read_header(tmp_path / "r.safetensors")

    @settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.binary(min_size=1, max_size=100))
    def test_random_headers_after_a_valid_length_raise_cleanly(
        self, tmp_path: Path, header: bytes
    ) -> None:
        """A correct length prefix followed by garbage is still a clean error."""
        raw_file(tmp_path / "r.safetensors", header)
        with contextlib.suppress(devpolicy.SafetensorsFileError):
            read_header(tmp_path / "r.safetensors")


class TestWrite:
    def test_written_files_are_read_by_safetensors_itself(self, tmp_path: Path) -> None:
        """The format is standard: safetensors loads what we write, values intact."""
        tensors = {
            "tokens": np.arange(1000, dtype=np.uint16),
            "w": np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32),
            "bf": np.arange(5).astype(ml_dtypes.bfloat16),
            "flag": np.array([True, False]),
            "scalar": np.array(3, np.int64),
        }
        write_file(tensors, tmp_path / "w.safetensors", metadata={"source": "test"})
        loaded = reference_load(str(tmp_path / "w.safetensors"))
        for key, value in tensors.items():
            assert np.array_equal(loaded[key], value), key
            assert loaded[key].dtype == value.dtype

    def test_largest_tensors_start_aligned(self, tmp_path: Path) -> None:
        """Header padding and order put every tensor whose size is a multiple of 64 on a 64-byte offset."""
        tensors = {
            "small": np.zeros(3, np.uint8),
            "big": np.zeros(4096, np.float32),
            "mid": np.zeros(64, np.uint16),
        }
        write_file(tensors, tmp_path / "a.safetensors")
        offsets = {t.key: t.offset % 64 for t in read_header(tmp_path / "a.safetensors").tensors}
        assert offsets["big"] == offsets["mid"] == 0

    def test_a_failed_write_leaves_nothing(self, tmp_path: Path) -> None:
        """An unsupported dtype stops the write before any file appears."""
        with pytest.raises(ValueError, match=r"dtype complex128 cannot be stored"):
            write_file({"c": np.zeros(2, np.complex128)}, tmp_path / "c.safetensors")
        assert list(tmp_path.iterdir()) == []

    def test_align_rewrites_a_reference_file_streaming(self, tmp_path: Path) -> None:
        """Rewriting an unaligned file aligns it and keeps every value and the metadata."""
        tokens = np.arange(10_000, dtype=np.uint16)
        reference_save(
            {"tokens": tokens, "x": np.ones(3, np.int8)},
            str(tmp_path / "in.safetensors"),
            metadata={"a": "b"},
        )
        assert read_header(tmp_path / "in.safetensors").tensors[0].offset % 64 != 0
        header = rewrite_aligned(tmp_path / "in.safetensors", tmp_path / "out.safetensors")
        assert {t.key: t.offset % 64 for t in header.tensors}["tokens"] == 0
        assert header.metadata == {"a": "b"}
        assert np.array_equal(reference_load(str(tmp_path / "out.safetensors"))["tokens"], tokens)

    def test_every_dtype_round_trips(self, tmp_path: Path) -> None:
        """Each supported dtype writes and reads back."""
        tensors = {name: np.zeros(4, dtype) for name, dtype in DTYPES.items()}
        write_file(tensors, tmp_path / "all.safetensors")
        assert {t.key: t.dtype_name for t in read_header(tmp_path / "all.safetensors").tensors} == {
            n: n for n in DTYPES
        }
