"""The safetensors format: headers validated before any data is touched; aligned writes."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file as reference_load
from safetensors.numpy import save_file as reference_save

import devpolicy
from devpolicy._io.format.header import DTYPES, read_header, read_header_from
from devpolicy._io.format.sources import open_tensor_file, os_error
from devpolicy._io.reading.reopening import map_tensor_file
from devpolicy._io.writing.local_files import rewrite_aligned, write_file
from tests.helpers import safetensors_bytes, within


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
        r"tensor 't': entry must be an object with dtype, shape and data_offsets "
        r"\(it lacks data_offsets\)$",
    ),
    ({"t": [1, 2]}, b"", r"tensor 't': entry must be an object"),
    ([1, 2], b"", r": header must be a JSON object, got list"),
    ({"__metadata__": {"a": 1}}, b"", r": __metadata__ must map strings to strings"),
    (
        b'{"t": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
        b"\0",
        r"tensor 't': entry gives 'dtype' more than once$",
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

    @settings(
        max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.binary(max_size=200))
    def test_random_bytes_parse_or_raise_cleanly(self, tmp_path: Path, data: bytes) -> None:
        """No byte string makes the reader raise anything but SafetensorsFileError."""
        (tmp_path / "r.safetensors").write_bytes(data)
        with contextlib.suppress(devpolicy.SafetensorsFileError):
            read_header(tmp_path / "r.safetensors")

    @settings(
        max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
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


def _policy() -> devpolicy.Policy:
    return devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})


class TestHardenedReading:
    def test_load_and_plan_refuse_a_fifo_without_blocking(self, tmp_path: Path) -> None:
        """load_file, plan and read_header on a FIFO say what it is; they used to block forever."""
        os.mkfifo(tmp_path / "f.safetensors")
        path = tmp_path / "f.safetensors"
        for call in (
            lambda: devpolicy.load_file(path, policy=_policy()),
            lambda: devpolicy.plan(path, policy=_policy()),
            lambda: read_header(path),
        ):
            with pytest.raises(
                devpolicy.SafetensorsFileError,
                match=r"is a FIFO or pipe .*, not a safetensors file$",
            ):
                within(30, call)

    def test_an_endless_device_is_refused(self) -> None:
        """/dev/zero is not read: it is a character device."""
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=r"^/dev/zero: is a character device"
        ):
            within(30, lambda: read_header("/dev/zero"))

    def test_a_symlink_loop_is_named(self, tmp_path: Path) -> None:
        """A symlink loop is reported as one, not as a missing file."""
        os.symlink("l.safetensors", tmp_path / "l.safetensors")
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"symlink loop"):
            read_header(tmp_path / "l.safetensors")

    def test_duplicate_metadata_keys_are_accepted_like_the_reference(self, tmp_path: Path) -> None:
        """A key repeated inside __metadata__ loads (last wins), as safetensors itself accepts."""
        raw = b'{"__metadata__": {"a": "1", "a": "2"}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
        (tmp_path / "m.safetensors").write_bytes(safetensors_bytes(raw, b"\x07"))
        assert reference_load(tmp_path / "m.safetensors")["t"].tolist() == [7]
        assert read_header(tmp_path / "m.safetensors").metadata == {"a": "2"}

    def test_a_file_that_shrank_is_refused_before_mapping(self, tmp_path: Path) -> None:
        """A file truncated after its header was read is an error naming it, not a short buffer."""
        path = tmp_path / "s.safetensors"
        write_file({"t": np.zeros(4096, np.float32)}, path)
        with open_tensor_file(path) as f:
            header = read_header_from(f, path)
            os.truncate(path, header.data_start)
            with pytest.raises(
                devpolicy.SafetensorsFileError, match=r"file changed size while loading"
            ):
                map_tensor_file(f, header)
            os.truncate(path, 0)
            with pytest.raises(
                devpolicy.SafetensorsFileError,
                match=r"file changed size while loading \(\d+ bytes when its header was read, 0 now\)",
            ):
                map_tensor_file(f, header)

    def test_os_errors_name_the_file_and_tensor(self) -> None:
        """ENOMEM and EMFILE become SafetensorsFileErrors saying what to do, naming the tensor."""
        e = os_error(
            "m.safetensors", OSError(errno.EMFILE, "Too many open files"), "cannot map", "w"
        )
        assert str(e).startswith("m.safetensors: tensor 'w': cannot map: too many open files")
        e = os_error(
            "m.safetensors", OSError(errno.ENOMEM, "Cannot allocate memory"), "cannot read"
        )
        assert str(e) == "m.safetensors: cannot read: not enough memory or address space"


class TestHardenedWriting:
    @pytest.mark.parametrize("align", [2**40, 2**30, 2**25, 0, 3, -64, 64.0, True, "64"])
    def test_bad_alignments_fail_before_anything_is_built(
        self, tmp_path: Path, align: object
    ) -> None:
        """align must be an int power of two up to 16 MiB; 2**40 used to end in MemoryError."""
        with pytest.raises(
            ValueError, match=r"^align must be a power of two from 1 to 16777216 \(an int\), got "
        ):
            within(
                30,
                lambda: devpolicy.save_file(
                    {"a": np.zeros(2)}, tmp_path / "a.safetensors", align=align
                ),
            )  # type: ignore[arg-type]
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize(
        "url", ["s3://bucket/m.safetensors", "gs://b/m.safetensors", "https://h/m.safetensors"]
    )
    def test_a_url_is_never_taken_as_a_local_folder(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
    ) -> None:
        """`align_file` to a URL, and `save_file` to a URL of a scheme it does not write:
        an error saying what to do; never a write into a local folder named `s3:` or
        `gs:` that happens to exist (`Path` reads `s3://b/m` as `s3:/b/m`)."""
        monkeypatch.chdir(tmp_path)
        (tmp_path / url.split("/")[0] / url.split("/")[2]).mkdir(parents=True)
        reference_save({"t": np.zeros(4, np.float32)}, str(tmp_path / "in.safetensors"))
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{url}: cannot write to a URL: devpolicy reads URLs "
            r"\(load_file, plan, read_metadata\) and saves to s3:// with save_file; "
            r"align a local file and upload it",
        ):
            devpolicy.align_file(tmp_path / "in.safetensors", url)
        if not url.startswith("s3:"):
            policy = devpolicy.load_policy({"version": 1}, environ={})
            with pytest.raises(
                devpolicy.SafetensorsFileError, match=rf"^{url}: cannot write to a \w+:// URL"
            ):
                devpolicy.save_file({"a": np.zeros(2)}, url, policy=policy)
        assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == sorted(
            ["in.safetensors", url.split("/")[0], "/".join(url.split("/")[0:3:2])]
        )

    def test_resaving_keeps_the_files_mode(self, tmp_path: Path) -> None:
        """A 0600 file stays 0600 after save_file and align_file (it used to become 0644)."""
        path = tmp_path / "m.safetensors"
        write_file({"a": np.zeros(2)}, path)
        path.chmod(0o600)
        write_file({"a": np.ones(2)}, path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        rewrite_aligned(path, path, align=128)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def test_saving_through_a_symlink_replaces_its_target(self, tmp_path: Path) -> None:
        """snap/model.safetensors -> ../blobs/abc stays a link; the blob gets the new data."""
        (tmp_path / "blobs").mkdir()
        (tmp_path / "snap").mkdir()
        blob = tmp_path / "blobs" / "abc"
        write_file({"a": np.zeros(2)}, blob)
        link = tmp_path / "snap" / "model.safetensors"
        os.symlink("../blobs/abc", link)
        write_file({"a": np.ones(2, np.float32)}, link)
        assert os.readlink(link) == "../blobs/abc"
        assert reference_load(blob)["a"].tolist() == [1.0, 1.0]
        rewrite_aligned(link, link, align=256)
        assert link.is_symlink()
        assert read_header(blob).tensors[0].offset % 256 == 0
        assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == ["abc"]

    def test_stale_temp_files_are_removed_by_the_next_save(self, tmp_path: Path) -> None:
        """A temp file left by a dead process goes; one of a live process stays."""
        path = tmp_path / "m.safetensors"
        stale = tmp_path / ".m.safetensors.devpolicy-999999999-abc.tmp"  # above any pid_max
        stale.write_bytes(b"x" * 100)
        live = tmp_path / f".m.safetensors.devpolicy-{os.getppid()}-def.tmp"
        live.write_bytes(b"x")
        other = tmp_path / ".other.safetensors.devpolicy-999999999-abc.tmp"
        other.write_bytes(b"x")
        write_file({"a": np.zeros(2)}, path)
        assert not stale.exists()
        assert live.exists()
        assert other.exists()
