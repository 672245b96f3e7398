"""Inventory: which backends exist, why the others do not, targets to devices."""

from __future__ import annotations

import jax
import pytest

import devpolicy


class TestInventory:
    def test_available_backends_lists_the_cpu_devices(self, cpus: list[jax.Device]) -> None:
        """The four fake CPU devices are listed in JAX's order."""
        assert devpolicy.available_backends()["cpu"] == cpus

    def test_absent_backends_have_a_reason_and_never_raise(self) -> None:
        """On a CPU-only install gpu and tpu are absent, each with JAX's reason."""
        inv = devpolicy.inventory()
        if "gpu" in inv.devices:
            pytest.skip("this machine has a GPU")
        assert "gpu" in inv.missing
        assert inv.missing["gpu"].startswith("RuntimeError: ")
        assert "gpu" not in devpolicy.available_backends()

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
        """Asking for an absent backend names it and JAX's reason."""
        if "gpu" in devpolicy.available_backends():
            pytest.skip("this machine has a GPU")
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"(?s)^no device for 'cuda:1'\n  cuda:1: no gpu backend in this process.*\n  gpu: RuntimeError",
        ):
            devpolicy.get_device("cuda:1")

    def test_bad_text_is_a_value_error(self) -> None:
        """Target text is checked before any device lookup."""
        with pytest.raises(ValueError, match=r"did you mean 'gpu'\?"):
            devpolicy.get_device("gpuu")
