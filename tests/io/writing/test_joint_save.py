"""The parts of a save from many processes that one process can check: where a slice of a
tensor lies in the file (`slice_runs`), the file several processes write together
(`LocalJointFile`), F4 shards, and the `save_file` event. The whole job runs in
tests/scenarios/test_multiprocess_save.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy._io.format.layout import Slot, plan_layout, slice_runs, slots_of
from devpolicy._io.writing import local_files as writing
from devpolicy._io.writing.joint_save import _runs_of
from devpolicy._io.writing.local_files import LocalJointFile, write_file


@st.composite
def tensors_and_slices(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], tuple[slice, ...]]:
    shape = tuple(draw(st.lists(st.integers(1, 5), max_size=4)))
    whole = np.arange(int(np.prod(shape)), dtype=np.int16).reshape(shape)
    index = []
    for dim in shape:
        start = draw(st.integers(0, dim))
        index.append(slice(start, draw(st.integers(start, dim))))
    return whole, tuple(index)


class TestSliceRuns:
    @given(tensors_and_slices())
    def test_runs_hold_the_slice_in_c_order(
        self, drawn: tuple[np.ndarray[Any, Any], tuple[slice, ...]]
    ) -> None:
        """Run k of a slice holds the slice's bytes [k * run, (k + 1) * run), at its offset
        in the whole tensor's bytes, for any shape and slice (empty ones: no runs)."""
        whole, index = drawn
        bounds = tuple(s.indices(d)[:2] for s, d in zip(index, whole.shape, strict=True))
        offsets, run = slice_runs(whole.shape, whole.dtype.itemsize, bounds)
        data, part = whole.tobytes(), whole[index].tobytes()
        got = b"".join(data[o : o + run] for o in offsets.tolist())
        assert got == part

    def test_a_row_split_is_one_run_and_a_column_split_one_per_row(self) -> None:
        """Whole rows are one run; half of every row is a run per row."""
        assert slice_runs((8, 4), 4, ((4, 8), (0, 4)))[0].tolist() == [64]
        offsets, run = slice_runs((8, 4), 4, ((0, 8), (2, 4)))
        assert (offsets.tolist(), run) == ([8 + 16 * i for i in range(8)], 8)


def layout(tensors: dict[str, np.ndarray[Any, Any]], path: Path) -> tuple[bytes, list[Slot]]:
    return plan_layout(slots_of(tensors, path), None, 64)


class TestLocalJointFile:
    def test_pieces_written_by_two_writers_make_the_file_one_writer_makes(
        self, tmp_path: Path
    ) -> None:
        """Two writers (as two processes would), each its half of every tensor, in any
        order: the published file is byte for byte what `write_file` writes, and no
        temporary file is left."""
        rng = np.random.default_rng(0)
        tensors = {
            "a": rng.normal(size=(6, 10)).astype(np.float32),
            "b": rng.integers(0, 9, size=(5,)).astype(np.int64),
        }
        write_file(tensors, tmp_path / "one.safetensors")
        path = tmp_path / "joint.safetensors"
        header, order = layout(tensors, path)
        size = 8 + len(header) + sum(s.nbytes for s in order)
        joint = LocalJointFile(path)
        token = joint.create(header, size)
        assert (tmp_path / token).stat().st_size == size
        offset, halves = 8 + len(header), [[], []]  # type: list[list[tuple[int, memoryview]]]
        for slot in order:
            flat = tensors[slot.key].reshape(-1).view(np.uint8)
            middle = len(flat) // 2
            halves[0].append((offset, flat[:middle].data))
            halves[1].append((offset + middle, flat[middle:].data))
            offset += slot.nbytes
        assert joint.write(token, reversed(halves[1])) == (
            sum(len(m) for _, m in halves[1]),
            "",
        )
        joint.write(token, iter(halves[0]))
        assert not path.exists()  # nothing at the name until published
        joint.publish(token, ["", ""])
        assert path.read_bytes() == (tmp_path / "one.safetensors").read_bytes()
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "joint.safetensors",
            "one.safetensors",
        ]

    def test_a_relative_path_is_written_and_forgotten_once_published(self, tmp_path: Path) -> None:
        """A path relative to the working directory: published there, and no longer among
        the temporary files a SIGTERM would remove."""
        joint = LocalJointFile("m.safetensors")  # the test runs in tmp_path
        header = b'{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
        header += b" " * (-(8 + len(header)) % 8)
        token = joint.create(header, 8 + len(header) + 2)
        assert writing._in_flight == {str(Path(token))}
        joint.write(token, iter([(8 + len(header), memoryview(b"\x01\x02"))]))
        joint.publish(token, [""])
        assert writing._in_flight == set()
        assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]
        assert devpolicy.load_file(tmp_path / "m.safetensors")["t"].tolist() == [1, 2]

    def test_a_writer_that_cannot_see_the_file_says_the_filesystem_must_be_shared(
        self, tmp_path: Path
    ) -> None:
        """A process whose directory does not hold the file process 0 created (another
        host's local disk) is told every process must see one filesystem."""
        path = tmp_path / "m.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=(
                rf"^{path}: the unfinished file '\.m\.safetensors\.devpolicy-1-x\.tmp' that "
                rf"process 0 created is not in '{tmp_path}' here: every process of a "
                r"multi-process save must see the same filesystem \(one shared between hosts\)$"
            ),
        ):
            LocalJointFile(path).write(".m.safetensors.devpolicy-1-x.tmp", iter([]))

    def test_discard_removes_the_unfinished_file(self, tmp_path: Path) -> None:
        """A failed save's unfinished file is removed; the target never appears."""
        joint = LocalJointFile(tmp_path / "m.safetensors")
        token = joint.create(b"{}      ", 16)
        joint.discard(token)
        joint.discard(token)  # again: nothing to do
        assert list(tmp_path.iterdir()) == []

    def test_a_target_that_is_not_a_regular_file_is_refused_before_anything(
        self, tmp_path: Path
    ) -> None:
        """As a single-process save: a directory at the path is refused, nothing written."""
        (tmp_path / "m.safetensors").mkdir()
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"it is a directory"):
            LocalJointFile(tmp_path / "m.safetensors").create(b"{}      ", 16)
        assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


class TestPackedShards:
    def test_f4_shards_of_whole_bytes_are_packed_in_place(self, tmp_path: Path) -> None:
        """An F4 shard whose rows hold an even number of values is packed two a byte and
        written at half its value offsets."""
        values = np.linspace(-6, 6, 24, dtype=np.float32).astype(ml_dtypes.float4_e2m1fn)
        whole = values.reshape(4, 6)
        (slot,) = slots_of({"c": whole}, tmp_path)
        pieces = list(_runs_of(slot, whole[2:], ((2, 4), (0, 6)), 100, tmp_path))
        assert [(offset, len(data)) for offset, data in pieces] == [(106, 6)]

    def test_an_f4_shard_that_starts_inside_a_byte_is_refused(self, tmp_path: Path) -> None:
        """Columns split so a shard starts mid-byte: refused naming the tensor and the
        fix, before anything is written."""
        whole = np.zeros((4, 6), ml_dtypes.float4_e2m1fn)
        (slot,) = slots_of({"c": whole}, tmp_path)
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=(
                r"^.*: tensor 'c': a shard \(\(0, 4\), \(3, 6\)\) of this F4 tensor starts or "
                r"ends inside a byte \(two values a byte\): shard it so every shard's rows "
                r"hold an even number of values$"
            ),
        ):
            list(_runs_of(slot, whole[:, 3:], ((0, 4), (3, 6)), 0, tmp_path))


class TestSaveEvent:
    def test_one_process_saving_writes_the_whole_file(self, tmp_path: Path) -> None:
        """The `save_file` event: the file, its tensors, their bytes (`nbytes`, as every
        event counts arrays) apart from the file's size (`file_bytes`), the bytes this
        process wrote (all of them, alone) and how many processes wrote it."""
        path = tmp_path / "w.safetensors"
        with capture_logs() as logs:
            devpolicy.save_file({"w": np.ones((4, 4), np.float32), "b": np.zeros(3)}, path)
        (event,) = [e for e in logs if e["event"] == "save_file"]
        size = path.stat().st_size
        assert event["log_level"] == "info"
        assert (event["file"], event["tensors"], event["nbytes"]) == (str(path), 2, 64 + 24)
        assert (event["file_bytes"], event["bytes_written"], event["processes"]) == (size, size, 1)
        assert size > 88

    @pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), True, "5"])
    def test_a_bad_timeout_is_refused_before_anything_is_written(
        self, tmp_path: Path, timeout: Any
    ) -> None:
        """`timeout` must be a positive, finite number of seconds."""
        with pytest.raises(
            ValueError, match=r"^timeout must be a positive number of seconds, got "
        ):
            devpolicy.save_file({"w": np.ones(2)}, tmp_path / "w.safetensors", timeout=timeout)
        assert os.listdir(tmp_path) == []
