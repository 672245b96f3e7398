"""Tensors bound for a device that copies host memory (an accelerator's) are sent from a
view of the file's mapping, at any offset, with no read into host memory first.

The CPU backend adopts aligned host buffers instead of copying them; these tests make
it stand in for a copying device (the `copying_device` fixture: it counts as one, and what
is sent to it is copied first, as an accelerator copies it), so the accelerator's path
runs here through the same code."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import hostview
from devpolicy._io.reading import readahead
from tests.helpers import policy_of

MIB = 2**20


def rchar() -> int:
    """Bytes this process has read with read(2) and its kin (not through a mapping)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def reference_file(path: Path, count: int = 6, nbytes: int = 3 * MIB) -> dict[str, np.ndarray]:
    """Tensors written by the reference writer: its offsets, most not 64-byte aligned."""
    rng = np.random.default_rng(1)
    tensors = {
        f"layer{i}/w": rng.standard_normal(nbytes // 4 + i, dtype=np.float32) for i in range(count)
    }
    tensors["small/b"] = np.arange(7, dtype=np.int16)
    safetensors.numpy.save_file(tensors, str(path))
    return tensors


def aligned_file(path: Path) -> dict[str, np.ndarray]:
    """Tensors written by `devpolicy.save_file` (the large ones at 64-byte-aligned
    offsets, which a CPU device would adopt): one large, one small, one to shard."""
    tensors = {
        "big": np.arange(3 * MIB // 8, dtype=np.int32),
        "small": np.arange(1000, dtype=np.int32) * 3,
        "rows/w": np.arange(64 * 4096, dtype=np.int32).reshape(64, 4096),
    }
    devpolicy.save_file(tensors, path)
    return tensors


def overwrite_in_place(path: Path) -> None:
    """Every data byte of the safetensors file at `path` inverted, in place: the same
    file (inode), the same size, new values, as a writer that reuses the file does."""
    before = path.stat()
    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + length)
        data = np.frombuffer(f.read(), np.uint8)
        f.seek(8 + length)
        f.write((~data).tobytes())
    after = path.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)


def sharded_rows_policy(default: str) -> devpolicy.Policy:
    """`default` for every tensor but `rows/w`, sharded by rows over the 4 devices."""
    return policy_of(
        default=default,
        meshes={"rows": {"axes": {"data": 4}, "devices": "cpu"}},
        rules=[{"match": "*/rows/w", "sharding": {"mesh": "rows", "spec": ["data"]}}],
    )


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="Linux's /proc/self/io")
class TestSentFromTheMap:
    @pytest.mark.usefixtures("copying_device")
    def test_a_reference_checkpoint_is_sent_from_its_map_without_reading_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every tensor of an unaligned checkpoint arrives exact on its device, and the
        load reads (read(2)) little more than the header: no tensor is read into host
        memory first, none goes through the read-ahead."""
        path = tmp_path / "model.safetensors"
        tensors = reference_file(path)
        read: list[str] = []
        original = readahead.read_tensor
        monkeypatch.setattr(
            readahead, "read_tensor", lambda *a: read.append(a[2].key) or original(*a)
        )
        policy = policy_of(default="cpu:1")
        devpolicy.load_file(path, policy=policy, progress=False)  # imports, once-only reads
        before = rchar()
        out = devpolicy.load_file(path, policy=policy, progress=False)
        read_bytes = rchar() - before
        total = sum(t.nbytes for t in tensors.values())
        assert read_bytes < total // 20, read_bytes
        assert read == []
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)
            assert devpolicy.inventory().text(next(iter(out[key].devices()))) == "cpu:1"

    @pytest.mark.usefixtures("copying_device")
    def test_a_checkpoint_of_several_files_is_sent_from_each_files_map(
        self, tmp_path: Path
    ) -> None:
        """A checkpoint of two files and an index: each file's tensors sent from its own
        map, all exact, little read."""
        first = reference_file(tmp_path / "model-00001-of-00002.safetensors", count=3)
        second = {
            "head/w": np.random.default_rng(2).standard_normal(MIB, dtype=np.float32),
        }
        safetensors.numpy.save_file(second, str(tmp_path / "model-00002-of-00002.safetensors"))
        weight_map = dict.fromkeys(first, "model-00001-of-00002.safetensors")
        weight_map |= dict.fromkeys(second, "model-00002-of-00002.safetensors")
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
        devpolicy.load_file(tmp_path, policy=policy_of(default="cpu:2"), progress=False)
        before = rchar()
        out = devpolicy.load_file(tmp_path, policy=policy_of(default="cpu:2"), progress=False)
        total = sum(t.nbytes for t in (first | second).values())
        assert rchar() - before < total // 20
        for key, value in (first | second).items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)

    @pytest.mark.usefixtures("copying_device")
    def test_mmap_false_reads_the_tensors_as_asked(self, tmp_path: Path) -> None:
        """`mmap=False` says not to map the file: the tensors are read, all of them."""
        path = tmp_path / "model.safetensors"
        tensors = reference_file(path)
        before = rchar()
        out = devpolicy.load_file(
            path, policy=policy_of(default="cpu:1"), mmap=False, progress=False
        )
        assert rchar() - before >= sum(t.nbytes for t in tensors.values())
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)

    def test_a_device_that_adopts_host_buffers_still_gets_them_read(self, tmp_path: Path) -> None:
        """On the CPU as it is (it adopts aligned buffers), an unaligned checkpoint is
        read into aligned memory the device adopts, as before: nothing is held as a
        view of a map unless asked."""
        path = tmp_path / "model.safetensors"
        tensors = reference_file(path)
        before = rchar()
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=policy_of(default="cpu:1"), progress=False)
        assert rchar() - before >= sum(t.nbytes for t in tensors.values())
        (summary,) = [e for e in logs if e["event"] == "load_file"]
        assert summary["mapped"] == 0
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)

    @pytest.mark.usefixtures("copying_device")
    def test_64_bit_tensors_narrowed_are_read_not_sent_from_the_map(self, tmp_path: Path) -> None:
        """With x64 off a 64-bit tensor is narrowed on the host, so it is read; the
        values arrive exact as int32."""
        path = tmp_path / "ids.safetensors"
        ids = np.arange(MIB, dtype=np.int64)
        safetensors.numpy.save_file({"ids": ids}, str(path))
        out = devpolicy.load_file(path, policy=policy_of(default="cpu:1"), progress=False)
        assert out["ids"].dtype == np.int32
        np.testing.assert_array_equal(np.asarray(out["ids"]), ids)

    @pytest.mark.usefixtures("copying_device")
    def test_sharded_tensors_are_sent_slice_by_slice_from_the_map(self, tmp_path: Path) -> None:
        """A tensor sharded by rows over 4 devices, from an unaligned reference file:
        each device's slice a view of the map at its own offset, exact, little read."""
        path = tmp_path / "model.safetensors"
        weight = np.random.default_rng(3).standard_normal((64, 4097), dtype=np.float32)
        safetensors.numpy.save_file({"pad": np.arange(3, dtype=np.int8), "w": weight}, str(path))
        policy = policy_of(
            meshes={"rows": {"axes": {"data": 4}, "devices": "cpu"}},
            rules=[{"match": "*/w", "sharding": {"mesh": "rows", "spec": ["data"]}}],
        )
        devpolicy.load_file(path, policy=policy, progress=False)
        before = rchar()
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=policy, progress=False)
        assert rchar() - before < weight.nbytes // 20
        assert len(out["w"].sharding.device_set) == 4
        np.testing.assert_array_equal(np.asarray(out["w"]), weight)
        (summary,) = [e for e in logs if e["event"] == "load_file"]
        assert summary["mapped"] == 0  # sent from the map, not kept as views of it


class TestFileOverwrittenAfterLoading:
    @pytest.mark.usefixtures("copying_device")
    def test_nothing_sent_to_a_copying_device_changes(self, tmp_path: Path) -> None:
        """A tensor sent to a device that copies host memory is the device's own copy,
        whether sent whole or slice by slice: rewriting the file after `load_file`
        returns changes none of it, though each was sent from a view of the file's map."""
        path = tmp_path / "model.safetensors"
        tensors = aligned_file(path)
        out = devpolicy.load_file(path, policy=sharded_rows_policy("cpu:1"), progress=False)
        assert len(out["rows/w"].sharding.device_set) == 4
        overwrite_in_place(path)
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value, err_msg=key)

    def test_a_cpu_only_counted_as_copying_still_aliases_the_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Why `copying_device` copies what is sent: with `ADOPTING` emptied alone (the
        fake before it), the CPU adopts each aligned view of the map it is sent, so the
        tensors change with the file, as no accelerator's copy does."""
        monkeypatch.setattr(hostview, "ADOPTING", frozenset())
        path = tmp_path / "model.safetensors"
        tensors = aligned_file(path)
        out = devpolicy.load_file(path, policy=sharded_rows_policy("cpu:1"), progress=False)
        overwrite_in_place(path)
        for key in ("big", "rows/w"):  # the large ones: at aligned offsets, whole or sliced
            np.testing.assert_array_equal(np.asarray(out[key]), ~tensors[key], err_msg=key)

    def test_a_tensor_kept_mapped_on_the_host_changes_with_its_file(self, tmp_path: Path) -> None:
        """A tensor mapped on a host device is the file's bytes, as documented: rewriting
        the file in place changes it."""
        path = tmp_path / "model.safetensors"
        tensors = aligned_file(path)
        out = devpolicy.load_file(
            path, policy=policy_of(default="cpu:1"), mmap=True, progress=False
        )
        overwrite_in_place(path)
        np.testing.assert_array_equal(np.asarray(out["big"]), ~tensors["big"])
