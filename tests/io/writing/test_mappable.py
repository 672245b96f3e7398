"""A token file that maps, written without holding it in memory, and a check that says
whether a file's tensors map (issue 43, N1).

`save_chunks` writes one tensor from chunks (or from an array, a `np.memmap` included)
into a file `load_file(..., mmap=True)` maps: checked against the `safetensors`
reference reader, with holes where the data is zero, and with clear errors for bad input
that leave nothing behind. `unmappable` names each tensor a load would read instead of
map, with its offset and the alignment it needs. The full-scale file is in
`tests/scenarios/test_token_file.py`.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file as reference_load
from safetensors.numpy import save_file as reference_save

import devpolicy
from devpolicy._io.format.header import read_header
from tests.conftest import REPO

MiB = 2**20


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own, mounted for the test and unmounted after it: a filesystem
    held in memory, where reading a hole through a mapping takes a page."""
    where = tmp_path / "ram"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'not permitted'}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def read_every_token(path: Path) -> subprocess.CompletedProcess[str]:
    """Load `path` mapped in a new process and read every token (a SIGBUS kills that
    process: a negative return code)."""
    script = (
        "import sys, numpy as np, devpolicy\n"
        "tokens = np.asarray(devpolicy.load_file(sys.argv[1], prefix='', mmap=True)['tokens'])\n"
        "print(int(tokens.astype(np.uint64).sum()))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", script, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def leftovers(directory: Path) -> list[str]:
    """Every file in `directory` (a failed write must add none)."""
    return sorted(p.name for p in directory.iterdir())


class TestSaveChunks:
    def test_chunks_are_one_tensor_the_reference_reader_reads_back_mapped(
        self, tmp_path: Path
    ) -> None:
        """Chunks of any lengths (an empty one too) are one tensor, their concatenation,
        under `key`, its data at a 64-byte offset; the reference reader reads it back and
        `load_file(mmap=True)` maps it."""
        rng = np.random.default_rng(0)
        chunks = [rng.integers(0, 2**16, n, dtype=np.uint16) for n in (5, 0, 1000, 33)]
        path = tmp_path / "train.safetensors"

        devpolicy.save_chunks(iter(chunks), path, metadata={"source": "test"})

        (entry,) = read_header(path).tensors
        assert (entry.key, entry.dtype_name, entry.shape) == ("tokens", "U16", (1038,))
        assert entry.offset % 64 == 0
        np.testing.assert_array_equal(reference_load(path)["tokens"], np.concatenate(chunks))
        with safe_open(path, framework="numpy") as f:
            assert f.metadata() == {"source": "test"}
        policy = devpolicy.load_policy({"version": 1, "rules": [{"match": "*", "device": "cpu"}]})
        tokens = policy.load_file(path, mmap=True)["tokens"]
        assert devpolicy.report().by_device["cpu:0"].file_backed == tokens.nbytes
        assert devpolicy.unmappable(path) == {}

    def test_chunks_of_rank_two_stack_along_the_first_axis(self, tmp_path: Path) -> None:
        """(rows, 1025) chunks make one (total rows, 1025) tensor."""
        chunks = [np.full((r, 3), r, dtype=np.float32) for r in (2, 5)]
        path = tmp_path / "rows.safetensors"

        devpolicy.save_chunks(chunks, path, key="dataset/windows")

        np.testing.assert_array_equal(
            reference_load(path)["dataset/windows"], np.concatenate(chunks)
        )

    def test_chunks_of_either_byte_order_are_one_dtype(self, tmp_path: Path) -> None:
        """A big-endian chunk after a little-endian one is the same dtype, written
        little-endian as the format stores it."""
        chunks = [np.arange(3, dtype="<u2"), np.arange(3, 6, dtype=">u2")]
        path = tmp_path / "t.safetensors"

        devpolicy.save_chunks(chunks, path)

        assert reference_load(path)["tokens"].tolist() == [0, 1, 2, 3, 4, 5]

    def test_an_array_is_written_in_blocks_and_odd_sizes_come_out_exact(
        self, tmp_path: Path
    ) -> None:
        """An array (not an iterable of chunks) is the tensor itself, written block by
        block: a size that is no multiple of the block, non-contiguous, non-native byte
        order, all come out as the reference reader reads them."""
        base = np.arange(3 * 70_001, dtype=">i4").reshape(70_001, 3)
        strided = base[::2]
        path = tmp_path / "a.safetensors"

        devpolicy.save_chunks(strided, path, key="a")

        np.testing.assert_array_equal(reference_load(path)["a"], strided.astype("<i4"))

    def test_zero_runs_stay_holes_and_read_back_as_zeros(self, tmp_path: Path) -> None:
        """Megabytes of zeros are not written: the file is sparse where its data is zero,
        and reads back exact."""
        zeros = np.zeros(16 * MiB, dtype=np.uint16)  # 32 MiB of zeros a chunk
        ones = np.ones(1000, dtype=np.uint16)
        path = tmp_path / "sparse.safetensors"

        devpolicy.save_chunks([ones, zeros, zeros, ones, zeros], path)

        size = path.stat().st_size
        assert size == read_header(path).tensors[0].offset + 2 * (48 * MiB + 2000)
        assert path.stat().st_blocks * 512 < 4 * MiB  # 96 MiB on paper
        back = reference_load(path)["tokens"]
        assert back[:1000].tolist() == [1] * 1000
        assert not back[1000 : 1000 + 32 * MiB].any()
        assert back[1000 + 32 * MiB : 2000 + 32 * MiB].tolist() == [1] * 1000
        assert not back[2000 + 32 * MiB :].any()

    @pytest.mark.slow
    def test_zeros_a_memory_filesystem_cannot_hold_are_refused_not_left_to_kill_the_reader(
        self, small_tmpfs: Path
    ) -> None:
        """64 MiB of mostly zeros to a 16 MiB tmpfs: holes would fit, but reading them
        through the load's mapping takes pages the tmpfs does not have (SIGBUS). The zeros
        are kept as data there, so the save fails, saying why, and leaves nothing."""
        zeros = np.zeros(16 * MiB, dtype=np.uint16)
        path = small_tmpfs / "tokens.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(path))}: cannot write: no space for its 64\.0 MiB of zeros "
            r"\(.* free on tmpfs\): a filesystem held in memory takes a page for each page of "
            r"a hole read through a mapping, so the zeros are written, not left as holes that "
            r"would kill the reader \(SIGBUS\); nothing written$",
        ):
            devpolicy.save_chunks([np.ones(1000, np.uint16), zeros, zeros], path)
        assert leftovers(small_tmpfs) == []

    @pytest.mark.slow
    def test_a_file_on_a_memory_filesystem_reads_every_token_through_its_map(
        self, small_tmpfs: Path
    ) -> None:
        """8 MiB of zeros on the 16 MiB tmpfs: written as data, not holes (the file holds
        its pages), and a mapped load reads every token."""
        path = small_tmpfs / "tokens.safetensors"
        devpolicy.save_chunks(
            [np.ones(1000, np.uint16), np.zeros(4 * MiB, np.uint16), np.ones(5, np.uint16)],
            path,
        )
        assert path.stat().st_blocks * 512 >= 8 * MiB
        result = read_every_token(path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1] == "1005"

    @pytest.mark.slow
    def test_a_memmap_source_is_copied_with_its_pages_given_back(self, tmp_path: Path) -> None:
        """A 512 MiB `np.memmap` is copied without the process holding it: its resident
        memory grows by a block or two (64 MiB each), not by the source's size."""
        source = tmp_path / "source.u16"
        count = 256 * MiB
        mm = np.memmap(source, dtype=np.uint16, mode="w+", shape=(count,))
        for start in range(0, count, 16 * MiB):  # no runs of zeros: every block is written
            mm[start : start + 16 * MiB] = np.arange(start, start + 16 * MiB).astype(np.uint16)
        mm.flush()
        del mm
        script = textwrap.dedent(
            f"""
            import json, numpy as np, devpolicy
            def status(field):
                with open("/proc/self/status") as f:
                    return next(int(x.split()[1]) * 1024 for x in f if x.startswith(field))
            mm = np.memmap({str(source)!r}, dtype=np.uint16, mode="r", shape=({count},))
            devpolicy.save_chunks  # imports what it needs before the baseline
            before = status("VmRSS:")
            devpolicy.save_chunks(mm, "out.safetensors")
            print(json.dumps({{"before": before, "peak": status("VmHWM:")}}))
            """
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        env["PYTHONPATH"] = str(REPO)
        result = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        measured = json.loads(result.stdout.strip().splitlines()[-1])
        grown = measured["peak"] - measured["before"]
        assert grown < 160 * MiB, f"grew {grown / MiB:.0f} MiB copying a 512 MiB memmap"
        with safe_open(tmp_path / "out.safetensors", framework="numpy") as f:
            part = f.get_slice("tokens")
            assert part[count - 5 : count].tolist() == [(count - 5 + i) % 2**16 for i in range(5)]
            assert part[70_000:70_003].tolist() == [70_000 % 2**16 + i for i in range(3)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> _Terminal:
    """stderr as a terminal, what the bar is drawn on (set in the test itself: pytest's
    capture would replace it after a fixture's set-up)."""
    screen = _Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setenv("TERM", "xterm")
    return screen


class TestProgress:
    def test_a_long_write_of_an_array_shows_the_bar_load_file_shows(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An array over 256 MiB (its size known) shows the bar with the file's name, the
        bytes written of the whole and the rate, on a terminal."""
        terminal = on_a_terminal(monkeypatch)
        devpolicy.save_chunks(np.zeros(160 * MiB, np.uint16), tmp_path / "big.safetensors")
        shown = terminal.getvalue()
        assert "big.safetensors" in shown
        assert "320.0 MiB" in shown

    def test_chunks_of_unknown_total_show_the_bar_once_past_256_mib(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A generator's total is unknown: its bar appears once 256 MiB are written, and
        counts on (a few small chunks show none)."""
        terminal = on_a_terminal(monkeypatch)
        devpolicy.save_chunks(
            (np.zeros(MiB, np.uint16) for _ in range(4)), tmp_path / "small.safetensors"
        )
        assert terminal.getvalue() == ""
        devpolicy.save_chunks(
            (np.zeros(16 * MiB, np.uint16) for _ in range(10)), tmp_path / "big.safetensors"
        )
        assert "big.safetensors" in terminal.getvalue()

    def test_progress_false_shows_nothing_and_true_shows_a_small_write(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        terminal = on_a_terminal(monkeypatch)
        devpolicy.save_chunks(
            np.zeros(160 * MiB, np.uint16), tmp_path / "quiet.safetensors", progress=False
        )
        assert terminal.getvalue() == ""
        devpolicy.save_chunks(
            [np.ones(5, np.uint16)], tmp_path / "asked.safetensors", progress=True
        )
        assert "asked.safetensors" in terminal.getvalue()


def _chunks_then(bad: Any) -> Iterator[Any]:
    yield np.arange(10, dtype=np.uint16)
    yield np.zeros(64 * MiB, dtype=np.uint16)  # written before the bad chunk arrives
    yield bad


class TestSaveChunksRefusesBadInput:
    @pytest.mark.parametrize(
        ("bad", "problem"),
        [
            (
                np.arange(4, dtype=np.int32),
                r"chunk 2 is int32 \(I32\), but chunk 0 was uint16 \(U16\): every chunk must "
                r"have one dtype",
            ),
            (
                np.zeros((2, 2), np.uint16),
                r"chunk 2 has shape \(2, 2\) \(2 dimensions\), but chunk 0 had \(10,\) "
                r"\(1 dimension\)",
            ),
            (np.uint16(3), r"chunk 2 is a 0-d array \(a scalar\)"),
            ("text", r"chunk 2 is str, not an array of numbers"),
        ],
    )
    def test_a_bad_chunk_is_named_and_nothing_is_left(
        self, tmp_path: Path, bad: Any, problem: str
    ) -> None:
        """A chunk of another dtype or rank (or not an array) midway is named by its index
        with what the first chunk set; no file, no temporary file is left."""
        path = tmp_path / "t.safetensors"
        where = re.escape(f"{path}: tensor 'tokens': ")
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=rf"^{where}{problem}.*nothing written"
        ):
            devpolicy.save_chunks(_chunks_then(bad), path)
        assert leftovers(tmp_path) == []

    def test_rows_of_another_width_are_named(self, tmp_path: Path) -> None:
        path = tmp_path / "t.safetensors"
        chunks = [np.zeros((2, 3), np.uint8), np.zeros((2, 4), np.uint8)]
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"chunk 1 has shape \(2, 4\), but chunk 0 had \(2, 3\): every chunk must have "
            r"the same shape past the first axis",
        ):
            devpolicy.save_chunks(chunks, path)
        assert leftovers(tmp_path) == []

    def test_an_existing_file_is_kept_unless_overwrite(self, tmp_path: Path) -> None:
        """An existing file is refused, untouched, with the keyword that replaces it; with
        `overwrite=True` it is replaced."""
        path = tmp_path / "train.safetensors"
        path.write_bytes(b"precious")
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"^.*train.safetensors: exists; pass overwrite=True to replace it; "
            "nothing written$",
        ):
            devpolicy.save_chunks([np.ones(3, np.uint16)], path)
        assert path.read_bytes() == b"precious"

        devpolicy.save_chunks([np.ones(3, np.uint16)], path, overwrite=True)
        assert reference_load(path)["tokens"].tolist() == [1, 1, 1]

    def test_a_fifo_is_refused_without_blocking(self, tmp_path: Path) -> None:
        """A FIFO at the path (with or without `overwrite`) is refused at once: it is never
        opened (which would block), and nothing is written beside it."""
        fifo = tmp_path / "pipe.safetensors"
        os.mkfifo(fifo)
        for overwrite in (False, True):
            with pytest.raises(
                devpolicy.SafetensorsFileError,
                match=r"^.*pipe.safetensors: cannot write: it is a FIFO",
            ):
                devpolicy.save_chunks([np.ones(3, np.uint16)], fifo, overwrite=overwrite)
        assert leftovers(tmp_path) == ["pipe.safetensors"]

    def test_no_chunks_at_all_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "t.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"no chunks: the tensor's dtype and shape come from the first one; "
            "nothing written$",
        ):
            devpolicy.save_chunks(iter([]), path)
        assert leftovers(tmp_path) == []

    def test_a_failing_source_leaves_nothing(self, tmp_path: Path) -> None:
        """The caller's generator failing midway (even with an OSError of its own)
        propagates as raised, and what was written so far is gone."""

        def failing() -> Iterator[np.ndarray[Any, Any]]:
            yield np.ones(MiB, np.uint16)
            raise OSError(5, "the source disk failed")

        with pytest.raises(OSError, match="the source disk failed"):
            devpolicy.save_chunks(failing(), tmp_path / "t.safetensors")
        assert leftovers(tmp_path) == []

    def test_a_url_and_a_packed_dtype_are_refused(self, tmp_path: Path) -> None:
        with pytest.raises(devpolicy.SafetensorsFileError, match="cannot write to a URL"):
            devpolicy.save_chunks([np.ones(3, np.uint16)], "s3://bucket/train.safetensors")
        import ml_dtypes

        with pytest.raises(
            devpolicy.SafetensorsFileError, match=r"F4 packs two values a byte.*save_file"
        ):
            devpolicy.save_chunks([np.zeros(4, ml_dtypes.float4_e2m1fn)], tmp_path / "f.st")
        assert leftovers(tmp_path) == []


def unaligned_file(path: Path) -> int:
    """A file as `safetensors.numpy.save_file` lays it out (8-byte header padding), whose
    `b` tensor starts off a 64-byte boundary; returns that offset."""
    reference_save({"a": np.ones(3, np.uint8), "b": np.ones(8, np.float32)}, path)
    return next(t.offset for t in read_header(path).tensors if t.key == "b")


class TestUnmappable:
    def test_an_aligned_file_has_nothing_to_say(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.ones((4, 4), np.float32), "b": np.ones(3, np.int8)}, path)
        assert devpolicy.unmappable(path) == {}

    def test_an_unaligned_tensor_is_named_with_its_offset_and_the_alignment_needed(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "m.safetensors"
        offset = unaligned_file(path)
        assert offset % 64

        found = devpolicy.unmappable(path)

        assert "b" in found
        assert set(found) <= {"a", "b"}
        assert found["b"] == (
            f"its data starts at byte {offset}, {offset % 64} past a 64-byte boundary: a "
            "tensor maps only from a 64-byte-aligned offset"
        )

    def test_a_64_bit_tensor_with_x64_off_and_f4_are_named(self, tmp_path: Path) -> None:
        import ml_dtypes

        path = tmp_path / "m.safetensors"
        devpolicy.save_file(
            {"wide": np.ones(8, np.int64), "f4": np.zeros(128, ml_dtypes.float4_e2m1fn)}, path
        )
        found = devpolicy.unmappable(path)
        assert found["wide"].startswith("I64 is narrowed to 32 bits (x64 is off)")
        assert found["f4"].startswith("F4 is stored two values a byte")

    def test_a_missing_file_is_an_error(self, tmp_path: Path) -> None:
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"nope\.safetensors"):
            devpolicy.unmappable(tmp_path / "nope.safetensors")


class TestAlignCheck:
    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        env["PYTHONPATH"] = str(REPO)
        return subprocess.run(
            [sys.executable, "-m", "devpolicy", "align", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    @pytest.mark.slow
    def test_check_of_an_aligned_file_exits_0(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        devpolicy.save_chunks([np.ones(5, np.uint16)], path)
        result = self.run("--check", str(path))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{path}: 1 of 1 tensors map (64-byte aligned)"

    @pytest.mark.slow
    def test_check_of_an_unaligned_file_names_each_tensor_and_exits_1(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        offset = unaligned_file(path)
        result = self.run("--check", str(path))
        assert result.returncode == 1, result.stderr
        lines = result.stdout.strip().splitlines()
        assert f"{path}: tensor 'b': its data starts at byte {offset}" in result.stdout
        assert lines[-1].startswith(f"{path}: ")
        assert "of the bytes) would be read, not mapped" in lines[-1]

    def test_check_after_align_names_what_cannot_start_aligned_and_exits_0(
        self, tmp_path: Path
    ) -> None:
        """Once aligned, small tensors after one whose size is not a multiple of 64 bytes
        still start off a boundary, and no rewrite can help (the format has no gaps):
        `--check` says so, tells no one to run `align` again, and exits 0."""
        source = tmp_path / "in.safetensors"
        reference_save(
            {
                "big": np.ones(1024, np.float32),
                "a": np.ones(3, np.uint8),
                "b": np.ones(5, np.float32),
                "c": np.ones(7, np.uint8),
            },
            source,
        )
        aligned = tmp_path / "aligned.safetensors"
        assert self.run(str(source), str(aligned)).returncode == 0

        result = self.run("--check", str(aligned))

        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 3
        assert lines[0].startswith(f"{aligned}: tensor 'c': its data starts at byte ")
        assert lines[1].startswith(f"{aligned}: tensor 'a': its data starts at byte ")
        assert lines[2] == (
            f"{aligned}: 2 of 4 tensors (0% of the bytes) would be read, not mapped, and no "
            "rewrite maps them: the format leaves no gap between tensors, so a tensor after "
            "one whose size is not a multiple of 64 bytes cannot start aligned (`devpolicy "
            "align` puts those last, largest first); nothing more to do"
        )
        assert "devpolicy align" not in lines[0] + lines[1]

    def test_check_says_how_many_a_rewrite_would_map_and_exits_1(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        unaligned_file(path)
        result = self.run("--check", str(path))
        assert result.returncode == 1
        assert result.stdout.strip().splitlines()[-1] == (
            f"{path}: 2 of 2 tensors (100% of the bytes) would be read, not mapped; "
            f"`devpolicy align {path} OUT` writes a copy where 1 of them (91% of the bytes) "
            "maps"
        )

    def test_check_and_a_destination_together_are_a_usage_error(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        devpolicy.save_chunks([np.ones(5, np.uint16)], path)
        result = self.run("--check", str(path), str(tmp_path / "out.safetensors"))
        assert result.returncode == 2
        assert "--check takes one file" in result.stderr
        missing = self.run(str(path))
        assert missing.returncode == 2
        assert "a destination" in missing.stderr


def test_header_length_prefix_is_the_padded_header(tmp_path: Path) -> None:
    """The header is reserved before the data (its length unknown until the last chunk)
    and filled in last: the 8-byte length names exactly the bytes before the data."""
    path = tmp_path / "t.safetensors"
    devpolicy.save_chunks([np.ones(7, np.uint8)], path)
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert header["tokens"] == {"dtype": "U8", "shape": [7], "data_offsets": [0, 7]}
    assert (8 + length) % 64 == 0
    assert raw[8 + length :] == b"\x01" * 7
