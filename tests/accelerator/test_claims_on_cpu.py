"""The lane's claims that the same code answers for a CPU device, checked on `cpu:1` here
(CI runs no accelerator): the backend name is data, not a branch."""

from __future__ import annotations

from pathlib import Path

import jax

from tests.accelerator import claims


class TestTheLanesClaimsOnACpuDevice:
    def test_a_rule_places_onto_the_device_it_names(self, cpus: list[jax.Device]) -> None:
        """`cpu:1` as the rule's target: the array is there, no fallback."""
        claims.rule_places_onto(cpus[1])

    def test_load_file_is_exact_for_every_dtype(
        self, cpus: list[jax.Device], tmp_path: Path
    ) -> None:
        """Every dtype devpolicy reads lands on cpu:1 with the values written."""
        assert "BF16" in claims.load_file_is_exact_for_every_dtype(cpus[1], tmp_path)

    def test_windows_are_exact_past_2_31(self, cpus: list[jax.Device], tmp_path: Path) -> None:
        """Windows at 2**31 and at the end of a mapped 4 GiB file arrive on cpu:1."""
        claims.windows_exact_past_2_31(cpus[1], tmp_path)
