"""Multi-process runs: `cpu:1` means each process's own second device, arrays stay addressable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devpolicy
from tests.conftest import REPO
from tests.helpers import reports_of, run_job

WORKER = REPO / "tests" / "multiprocess_worker.py"
SHARDED_WORKER = REPO / "tests" / "sharded_worker.py"
HYBRID_WORKER = REPO / "tests" / "hybrid_worker.py"


def run_two(worker: Path, *extra: str) -> list[dict[str, Any]]:
    """Run `worker` as both processes of a jax.distributed job; each prints a JSON report."""
    return reports_of(run_job(worker, [extra, extra], timeout=180))


@pytest.mark.slow
def test_two_processes_each_use_their_own_devices() -> None:
    """Two jax.distributed processes on 127.0.0.1: targets index process-local devices."""
    first, second = run_two(WORKER)
    outputs = [first, second]
    assert first["global_ids"] == second["global_ids"]
    assert len(first["global_ids"]) == 4
    for index, report in enumerate(outputs):
        assert report["process_index"] == index
        assert report["decided_text"] == "cpu:1"
        assert report["decided_id"] == report["local_ids"][1]
        assert report["scoped_id"] == report["local_ids"][1]
        assert report["put_addressable"] is True
        assert report["put_value"] == [index, index + 1, index + 2, index + 3]
        assert report["scoped_value"] == [float(index)] * 2
        assert report["event_process_index"] == [index]
    # What devpolicy avoids: in process 1, JAX's "first CPU device" belongs to process 0.
    assert second["jax_devices_cpu_0"] not in second["local_ids"]


@pytest.mark.slow
def test_two_processes_each_read_only_their_half_of_a_sharded_tensor(tmp_path: Path) -> None:
    """A 256 MiB tensor sharded on its first axis over 2 x 2 devices: each process reads half,
    holds correct shards, and its peak memory rises by well under the file's size."""
    path = tmp_path / "big.safetensors"
    rows = 256 * 2**20 // (4 * 1024)
    tokens = np.arange(rows * 1024, dtype=np.int32).reshape(rows, 1024)
    devpolicy.save_file({"tokens": tokens}, path)
    del tokens
    reports = run_two(SHARDED_WORKER, str(path))
    size = 256 * 2**20
    for index, report in enumerate(reports):
        assert report["process_index"] == index
        assert report["global_shape"] == [rows, 1024]
        assert report["spec"] == ["data"]
        assert report["addressable"] == 2
        assert report["shards_equal"] is True
        assert report["bytes_read"] == size // 2
        assert report["peak_rise"] < 0.75 * size
        # prefetch: each process's (2, 3) batch becomes part of a global (4, 3) batch.
        assert report["batch_shapes"] == [[4, 3], [4, 3]]
        assert report["batch_local"] == [[float(index)], [float(10 + index)]]


@pytest.mark.slow
def test_a_hybrid_mesh_over_two_processes_is_jaxs_hybrid_mesh() -> None:
    """2 processes x 2 CPU devices, each process a slice: the policy's hybrid meshes
    (`dcn` across the processes) equal `create_hybrid_device_mesh(...,
    process_is_granule=True)` device for device, and `put` shards over them correctly."""
    reports = run_two(HYBRID_WORKER)
    assert reports[0]["across"]["devpolicy"] == reports[1]["across"]["devpolicy"]
    first, second = (report["own"] for report in reports)
    for index, report in enumerate(reports):
        assert report["process_index"] == index
        for name, shape in (("across", {"data": 2, "fsdp": 2}), ("both", {"fsdp": 4, "tensor": 1})):
            mesh = report[name]
            assert mesh["shape"] == shape
            assert mesh["jax_shape"] == list(shape.values())
            assert mesh["devpolicy"] == mesh["jax"]
            assert mesh["shards_equal"] is True
            assert mesh["local"] == [d for d in mesh["devpolicy"] if d in report["own"]]
    # data across the slices: the first row is process 0's two devices, the second process 1's.
    assert reports[0]["across"]["devpolicy"] == first + second
