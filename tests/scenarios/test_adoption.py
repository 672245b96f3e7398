"""The trainer of docs/adopting.md across 2 processes, end to end: placement by the
policy, a hybrid mesh over the processes, a checkpoint saved from both, restored
shard-local in a fresh job, training resumed bit for bit (tests/adoption_worker.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file as reference_load

from tests.helpers import reports_of, run_job, write

WORKER = Path(__file__).parent.parent / "adoption_worker.py"

# The policy of docs/adopting.md with fsdp across the slices (here a process each), so
# that every parameter is split between the processes and each reads only its half.
TRAINER = """\
version: 1
meshes:
  train:
    axes: {data: 1, fsdp: -1, tensor: 2}
    dcn: {fsdp: -1}
axis_rules:
  - [batch, [data, fsdp]]
  - [vocab, tensor]
  - [embed, fsdp]
  - [mlp, tensor]
rules:
  - {match: "params/*", sharding: {mesh: train, axes: attached}}
  - {match: "opt_state/*", sharding: {mesh: train, axes: attached}}
  - {match: "batch/*", sharding: {mesh: train, axes: [batch]}}
"""


def job(directory: Path, mode: str) -> list[dict[str, Any]]:
    return reports_of(run_job(WORKER, [(str(directory), mode)] * 2, timeout=300))


@pytest.mark.slow
def test_a_trainer_saved_from_two_processes_resumes_bit_for_bit_in_a_fresh_job(
    tmp_path: Path,
) -> None:
    """Two jobs of 2 processes x 2 CPU devices: the first trains 2 steps, saves from both
    processes and trains 2 more; the second restores the file and trains the same 2
    steps with the same losses, bit for bit."""
    write(tmp_path / "trainer.yaml", TRAINER)
    trained = job(tmp_path, "train")
    resumed = job(tmp_path, "resume")

    for reports in (trained, resumed):
        for index, report in enumerate(reports):
            assert report["process_index"] == index
            # The policy's hybrid mesh is JAX's, device for device: fsdp across processes.
            assert report["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2}
            assert report["mesh_devices"] == report["jax_mesh_devices"]
            assert report["mesh_devices"] == trained[0]["own"] + trained[1]["own"]
            assert report["batch_spec"] == [["data", "fsdp"]]
    first_losses = trained[0]["first_losses"]
    assert len(first_losses) == 2
    assert all(math.isfinite(loss) for loss in first_losses)
    # Training resumed in a fresh job is training continued.
    losses = trained[0]["losses"]
    assert losses != first_losses
    assert [r["losses"] for r in trained + resumed] == [losses] * 4

    # One file, each process writing about half of it; nothing written twice (process 0
    # writes the header and the scalar).
    checkpoint = tmp_path / "checkpoint.safetensors"
    size = checkpoint.stat().st_size
    written = [r["saved"]["bytes_written"] for r in trained]
    assert sum(written) == size
    for share in written:
        assert 0.45 * size < share < 0.55 * size
    # The file is the one the same values gathered to one process make, byte for byte,
    # and the reference reader reads it.
    assert checkpoint.read_bytes() == (tmp_path / "gathered.safetensors").read_bytes()
    with safe_open(str(checkpoint), framework="numpy") as opened:
        names = sorted(opened.keys())
    assert names[:2] == ["opt_state/0/count", "opt_state/0/mu/down/kernel"]
    assert len(names) == 3 * 3 + 1  # params, mu, nu; the step count
    assert all(np.isfinite(array).all() for array in reference_load(str(checkpoint)).values())

    # The restore is shard-local: every restored leaf has the sharding the policy
    # declares, and each process read its own slices, not the file. (A kernel split on
    # rows, `up` (embed, mlp), is read as its half; one split on columns, a run of 128
    # bytes per row, is read through its covering range: cheaper than a call per run.)
    for report in resumed:
        assert report["shardings_as_declared"] is True
        assert size / 2 < report["loaded"]["bytes_read"] < 0.9 * size
