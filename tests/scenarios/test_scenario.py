"""The seed scenario: safetensors.flax.load_file under @place lands where the policy says."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.flax import load_file
from safetensors.numpy import save_file
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import write

POLICY = """\
version: 1
default: auto
fallback: [gpu, cpu]
rules:
  - match: "dataset/*"
    device: cpu:2
  - match: "model/*"
    device: gpu:0
"""


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "train.safetensors"
    save_file({"tokens": np.arange(4096, dtype=np.uint16).reshape(32, 128)}, str(path))
    return path


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    return write(tmp_path / "devpolicy.yaml", textwrap.dedent(POLICY))


@devpolicy.place("dataset/train")
def load_train(path: Path) -> dict[str, jax.Array]:
    return load_file(str(path))


class TestDatasetOnHost:
    def test_load_file_lands_on_the_policys_device_index(
        self, dataset: Path, policy_path: Path, cpus: list[jax.Device]
    ) -> None:
        """The discovered policy sends dataset/train to cpu:2, committed, and logs why."""
        with capture_logs() as logs:
            tokens = load_train(dataset)["tokens"]
        assert tokens.devices() == {cpus[2]}
        assert tokens.committed
        assert np.array_equal(np.asarray(tokens), np.arange(4096, dtype=np.uint16).reshape(32, 128))
        assert (logs[0]["name"], logs[0]["device"], logs[0]["origin"]) == (
            "dataset/train",
            "cpu:2",
            "devpolicy.yaml:5",
        )

    def test_env_override_moves_it_without_code_changes(
        self,
        dataset: Path,
        policy_path: Path,
        cpus: list[jax.Device],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """DEVPOLICY_RULES='dataset/*=cpu:1' moves the same call to cpu:1."""
        monkeypatch.setenv("DEVPOLICY_RULES", "dataset/*=cpu:1")
        with capture_logs() as logs:
            tokens = load_train(dataset)["tokens"]
        assert tokens.devices() == {cpus[1]}
        assert (logs[0]["source"], logs[0]["origin"]) == ("env", "env:DEVPOLICY_RULES")

    def test_model_on_missing_gpu_falls_back_with_the_reason(
        self, policy_path: Path, cpus: list[jax.Device]
    ) -> None:
        """model/* asks for gpu:0; without one it goes to cpu and the event says why."""
        if "gpu" in devpolicy.inventory().devices:
            pytest.skip("this machine has a GPU")
        with capture_logs() as logs:
            w = devpolicy.put("model", {"w": np.ones((4, 4), np.float32)})["w"]
        assert w.devices() == {cpus[0]}
        assert logs[0]["fallback_reason"] == "gpu:0, gpu: no gpu backend in this process; used cpu"

    def test_strict_env_turns_the_fallback_into_an_error(
        self, policy_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """DEVPOLICY_STRICT=1 makes the missing GPU an error listing what exists."""
        if "gpu" in devpolicy.inventory().devices:
            pytest.skip("this machine has a GPU")
        monkeypatch.setenv("DEVPOLICY_STRICT", "1")
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"(?s)^no device for 'gpu:0' for name 'model/w'.*available: cpu:0, cpu:1, cpu:2, cpu:3",
        ):
            devpolicy.put("model", {"w": np.ones(2)})
