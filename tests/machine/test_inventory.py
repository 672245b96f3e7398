"""Inventory: which backends exist, why the others do not, targets to devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import devpolicy
from devpolicy._machine import inventory as _inventory
from devpolicy._machine.inventory import missing_reason


class TestInventory:
    def test_available_backends_lists_the_cpu_devices(self, cpus: list[jax.Device]) -> None:
        """The four fake CPU devices are listed in JAX's order."""
        assert _inventory.available_backends()["cpu"] == cpus

    def test_absent_backends_have_a_reason_and_never_raise(self) -> None:
        """On a CPU-only install gpu and tpu are absent, each with a reason a user can act on."""
        inv = devpolicy.inventory()
        if "gpu" in inv.devices:
            pytest.skip("this machine has a GPU")
        assert "gpu" in inv.missing
        assert inv.missing["gpu"].startswith(
            ("no CUDA or ROCm plugin is installed: pip install", "the GPU plugin (")
        )
        assert "tpu" in inv.missing
        assert "gpu" not in devpolicy.inventory().devices

    def test_device_text_is_the_process_local_index(self, cpus: list[jax.Device]) -> None:
        """Devices read as the target text that names them."""
        assert [devpolicy.inventory().text(d) for d in cpus] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


class TestGetDevice:
    @pytest.mark.parametrize(("target", "index"), [("cpu", 0), ("cpu:0", 0), ("cpu:3", 3)])
    def test_targets_resolve_to_local_devices(
        self, cpus: list[jax.Device], target: str, index: int
    ) -> None:
        """`cpu` is the first local CPU device, `cpu:N` the N-th."""
        assert devpolicy.get_device(target) == cpus[index]

    def test_auto_is_the_current_default_device(self, cpus: list[jax.Device]) -> None:
        """`auto` follows JAX's default device, including an enclosing scope."""
        assert devpolicy.get_device("auto") == cpus[0]
        with jax.default_device(cpus[2]):
            assert devpolicy.get_device("auto") == cpus[2]

    def test_index_out_of_range_lists_what_is_available(self) -> None:
        """An index past the last device raises DeviceUnavailableError naming every device."""
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"(?s)^no device for 'cpu:4'\n  cpu:4: index 4 out of range \(4 local cpu devices: cpu:0\.\.cpu:3\)\n  available: cpu:0, cpu:1, cpu:2, cpu:3",
        ):
            devpolicy.get_device("cpu:4")

    def test_missing_backend_says_why(self) -> None:
        """Asking for an absent backend names it and why, with what to install."""
        if "gpu" in devpolicy.inventory().devices:
            pytest.skip("this machine has a GPU")
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"(?s)^no device for 'cuda:1'\n  cuda:1: no gpu backend in this process.*\n  gpu: (no CUDA or ROCm plugin is installed: pip install 'devpolicy\[cuda13\]'|the GPU plugin)",
        ):
            devpolicy.get_device("cuda:1")

    def test_bad_text_is_a_value_error(self) -> None:
        """Target text is checked before any device lookup."""
        with pytest.raises(ValueError, match=r"did you mean 'gpu'\?"):
            devpolicy.get_device("gpuu")


class TestBackendsThatCannotStart:
    @pytest.mark.slow
    @pytest.mark.parametrize(
        ("platforms", "reasons"),
        [
            (
                "cuda",
                {
                    "cpu": "JAX_PLATFORMS=cuda excludes cpu",
                    "gpu": "JAX_PLATFORMS=cuda but no CUDA or ROCm plugin is installed: pip install 'devpolicy[cuda13]'",
                },
            ),
            (
                "tpu",
                {
                    "tpu": "JAX_PLATFORMS=tpu but no TPU runtime (libtpu) is installed: pip install 'jax[tpu]'"
                },
            ),
            (
                "cpuu",
                {"cpu": "JAX_PLATFORMS=cpuu names unknown platform 'cpuu' (did you mean 'cpu'?)"},
            ),
        ],
    )
    def test_devices_explain_and_put_say_why_instead_of_crashing(
        self, platforms: str, reasons: dict[str, str], tmp_path: Path
    ) -> None:
        """With JAX_PLATFORMS naming a backend that cannot start, nothing raises a raw error."""
        if "gpu" in devpolicy.inventory().devices and platforms == "cuda":
            pytest.skip("a CUDA plugin is installed here")
        script = (
            "import json, devpolicy, numpy as np\n"
            "inv = devpolicy.inventory()\n"
            "out = {'missing': inv.missing}\n"
            "try:\n"
            "    devpolicy.load_policy({'version': 1}, environ={}).put('x', np.zeros(2))\n"
            "except devpolicy.DevicePolicyError as e:\n"
            "    out['put'] = type(e).__name__\n"
            "print(json.dumps(out))\n"
        )
        environ = {
            k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "JAX_", "XLA_"))
        }
        environ["JAX_PLATFORMS"] = platforms
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env=environ,
            cwd=tmp_path,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout.strip().splitlines()[-1])
        for platform, reason in reasons.items():
            assert out["missing"][platform].startswith(reason)
        assert "no message" not in json.dumps(out["missing"])
        assert out["put"] == "DeviceUnavailableError"
        for command in (["devices"], ["devices", "--json"], ["explain", "x"]):
            cli = subprocess.run(
                [sys.executable, "-m", "devpolicy", *command],
                capture_output=True,
                text=True,
                timeout=120,
                env=environ,
                cwd=tmp_path,
                check=False,
            )
            assert "Traceback" not in cli.stderr, cli.stderr
            assert cli.returncode in (0, 1, 2)
            assert "JAX_PLATFORMS=" in cli.stdout + cli.stderr

    def test_a_platform_left_out_of_jax_platforms_is_named_so(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The reason says JAX_PLATFORMS excludes it, not JAX's raw text."""
        monkeypatch.setattr(_inventory, "_installed", lambda prefixes: ["jax-cuda12-plugin"])
        assert (
            missing_reason("gpu", RuntimeError("Unknown backend"), {"JAX_PLATFORMS": "cpu"})
            == "JAX_PLATFORMS=cpu excludes gpu"
        )

    @pytest.mark.parametrize(
        ("platform", "said"),
        [
            ("gpu", "no CUDA or ROCm plugin is installed (JAX_PLATFORMS=cpu excludes gpu too): "),
            ("tpu", "no TPU runtime (libtpu) is installed (JAX_PLATFORMS=cpu excludes tpu too): "),
        ],
    )
    def test_a_platform_left_out_without_its_plugin_says_the_plugin_is_missing(
        self, monkeypatch: pytest.MonkeyPatch, platform: str, said: str
    ) -> None:
        """Under `runtime: platforms: [cpu]` the reason that holds without it comes first."""
        monkeypatch.setattr(_inventory, "_installed", lambda prefixes: [])
        reason = missing_reason(platform, RuntimeError("Unknown backend"), {"JAX_PLATFORMS": "cpu"})
        assert reason.startswith(said)
        assert "pip install" in reason

    def test_a_missing_gpu_plugin_gets_the_install_hint(self) -> None:
        """Without JAX_PLATFORMS, an absent GPU says what to install (when no plugin is)."""
        reason = missing_reason("gpu", RuntimeError("Unknown backend: 'gpu' requested"), {})
        assert reason.startswith(
            (
                "no CUDA or ROCm plugin is installed: pip install 'devpolicy[cuda13]'",
                "the GPU plugin (",
            )
        )
