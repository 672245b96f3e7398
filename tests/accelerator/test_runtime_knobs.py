"""`runtime:` as it acts on the accelerator: GPU-only knobs on a GPU (a child process each:
GPUs can be shared), and on a TPU said not to apply (in this process: only one process at
a time can hold a TPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

import devpolicy
from tests.helpers import write

pytestmark = pytest.mark.accelerator

STATS = """
    import json, devpolicy, jax
    devpolicy.bootstrap('p.yaml')
    jax.numpy.zeros(1).block_until_ready()
    print(json.dumps(jax.devices('gpu')[0].memory_stats()))
"""


def gpu_stats(tmp_path: Path, runtime: str) -> dict[str, int]:
    """The GPU's memory_stats in a child that bootstrapped a policy with `runtime`."""
    write(tmp_path / "p.yaml", f"version: 1\nruntime:\n{textwrap.indent(runtime, '  ')}\n")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(STATS)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    stats: dict[str, int] = json.loads(result.stdout.strip().splitlines()[-1])
    return stats


class TestOnAGpu:
    @pytest.fixture(autouse=True)
    def _gpu(self, chip: jax.Device) -> None:
        if chip.platform != "gpu":
            pytest.skip(f"GPU-only knobs: the accelerator here is {chip.platform}")

    def test_memory_fraction_sets_the_pool_limit(self, tmp_path: Path) -> None:
        """0.3 gives a bytes_limit about half that of 0.6 (both fractions of one memory)."""
        low = gpu_stats(tmp_path, "platforms: [accelerator, cpu]\nmemory_fraction: 0.3")
        high = gpu_stats(tmp_path, "platforms: [accelerator, cpu]\nmemory_fraction: 0.6")
        assert 0.45 < low["bytes_limit"] / high["bytes_limit"] < 0.55

    def test_no_preallocation_leaves_the_pool_nearly_empty(self, tmp_path: Path) -> None:
        """preallocate false: bytes_in_use stays near zero after start."""
        stats = gpu_stats(tmp_path, "platforms: [accelerator, cpu]\npreallocate: false")
        assert stats["bytes_in_use"] < 64 * 2**20


class TestOffAGpu:
    def test_gpu_only_knobs_are_said_not_to_apply_on_a_tpu(self, chip: jax.Device) -> None:
        """On a TPU, `preallocate` is noted as not applying and inert in the running process."""
        if chip.platform == "gpu":
            pytest.skip("the accelerator here is a GPU, where the knob applies")
        policy = devpolicy.load_policy(
            {"version": 1, "runtime": {"preallocate": False}}, environ={}
        )
        (knob,) = devpolicy.runtime_settings(policy, environ={}).knobs
        assert knob.note.startswith("does not apply: only a GPU backend reads")
        assert knob.state.startswith("inert")

    def test_accelerator_in_platforms_is_the_backend_running(self, chip: jax.Device) -> None:
        """`platforms: [accelerator, cpu]` plans the platform this process runs on first."""
        policy = devpolicy.load_policy(
            {"version": 1, "runtime": {"platforms": ["accelerator", "cpu"]}}, environ={}
        )
        (knob,) = devpolicy.runtime_settings(policy, environ={}).knobs
        first = knob.text.split(",")[0]
        assert ("gpu" if first in ("cuda", "rocm") else first) == chip.platform
