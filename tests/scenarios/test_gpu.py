"""GPU-only checks: the same code paths as the CPU tests, on a real accelerator. Skipped without one."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import devpolicy

HAS_GPU = "gpu" in devpolicy.available_backends()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")]


def test_gpu_targets_resolve_without_fallback() -> None:
    """gpu:0 and cuda:0 name the first local GPU."""
    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "m/*", "device": "cuda:0"}]}, environ={}
    )
    decision = policy.resolve("m/w")
    assert decision.device == jax.local_devices(backend="gpu")[0]
    assert decision.fallback_reason is None


def test_load_file_splits_host_and_gpu(tmp_path: Path) -> None:
    """Tokens stay on the host, weights are staged to the GPU, values intact."""
    path = tmp_path / "ckpt.safetensors"
    tokens, w = (
        np.arange(1 << 20, dtype=np.uint16),
        np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32),
    )
    devpolicy.save_file({"tokens": tokens, "w": w}, path)
    policy = devpolicy.load_policy(
        {
            "version": 1,
            "rules": [{"match": "*/tokens", "device": "cpu"}, {"match": "*", "device": "gpu:0"}],
        },
        environ={},
    )
    out = devpolicy.load_file(path, policy=policy)
    assert next(iter(out["tokens"].devices())).platform == "cpu"
    assert next(iter(out["w"].devices())).platform == "gpu"
    assert np.array_equal(np.asarray(out["w"]), w)
    assert np.array_equal(np.asarray(out["tokens"]), tokens)


def test_device_memory_comes_from_the_gpus_own_stats() -> None:
    """A GPU reports bytes_limit and bytes_in_use; free memory is judged from them."""
    gpu = jax.local_devices(backend="gpu")[0]
    stats = gpu.memory_stats()
    assert stats is not None
    assert devpolicy.DeviceMemory().free_bytes(gpu) == stats["bytes_limit"] - stats["bytes_in_use"]


def test_sized_auto_falls_back_to_the_host_when_the_gpu_is_too_small() -> None:
    """An array larger than the GPU's free memory goes to the next target, with the reason."""
    gpu = jax.local_devices(backend="gpu")[0]
    free = devpolicy.DeviceMemory().free_bytes(gpu)
    assert free is not None
    policy = devpolicy.load_policy({"version": 1, "fallback": ["cpu"]}, environ={})
    decision = policy.decide("dataset/train", nbytes=free * 2)
    assert decision.device.platform == "cpu"
    assert decision.fallback_reason is not None
    assert "free on gpu:0" in decision.fallback_reason


def test_prefetch_moves_host_batches_to_the_gpu() -> None:
    """Batches sliced on the host arrive on the GPU."""
    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "batch", "device": "gpu:0"}]}, environ={}
    )
    batches = list(devpolicy.prefetch((np.full(8, i) for i in range(3)), policy=policy))
    assert {next(iter(b.devices())).platform for b in batches} == {"gpu"}
