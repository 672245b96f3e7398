"""The library's claims on the accelerator JAX finds here (a TPU, else a GPU). Each test
skips, saying why, where there is none; `test_claims_on_cpu.py` checks those the same
code answers for a CPU device."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.accelerator import claims

pytestmark = pytest.mark.accelerator


class TestPlacement:
    def test_a_rule_naming_the_platform_places_onto_the_chip(self, chip: jax.Device) -> None:
        """`tpu:0` (or `gpu:0`) as a rule's device: the array is on the chip, no fallback."""
        claims.rule_places_onto(chip)

    def test_the_neutral_target_resolves_to_the_chip(self, chip: jax.Device) -> None:
        """`accelerator` is the chip, and the placement event says `accelerator:0 -> tpu:0`."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "model/*", "device": "accelerator"}]}, environ={}
        )
        with capture_logs() as logs:
            decision = policy.resolve("model/w")
        assert decision.device == chip
        assert decision.fallback_reason is None
        (event,) = [e for e in logs if e["event"] == "placement"]
        assert event["resolved"] == f"accelerator:0 -> {claims.text(chip)}"

    def test_the_demo_policy_puts_the_model_on_the_chip_and_the_data_on_the_host(
        self, chip: jax.Device
    ) -> None:
        """policies/dataset-on-host.yaml, unchanged: model and batches on the chip, tokens
        on the host, no warning."""
        from tests.conftest import REPO

        policy = devpolicy.load_policy(REPO / "policies" / "dataset-on-host.yaml", environ={})
        with capture_logs() as logs:
            model = policy.resolve("model/embed", nbytes=2**20)
            batch = policy.resolve("batch", nbytes=2**11)
            tokens = policy.resolve("dataset/tokens", nbytes=2**30)
        assert (model.device, batch.device) == (chip, chip)
        assert tokens.device.platform == "cpu"
        assert not [e for e in logs if e["log_level"] == "warning"]

    def test_prefetch_moves_host_batches_to_the_chip(self, chip: jax.Device) -> None:
        """Batches sliced on the host arrive on the chip."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "batch", "device": "accelerator"}]}, environ={}
        )
        batches = list(devpolicy.prefetch((np.full(8, i) for i in range(3)), policy=policy))
        assert {claims.placed_on(b) for b in batches} == {chip}
        assert [int(b[0]) for b in batches] == [0, 1, 2]


class TestMemory:
    def test_more_than_the_chip_holds_goes_to_the_host_with_a_warning(
        self, chip: jax.Device
    ) -> None:
        """A tensor bigger than the chip's free memory (`memory_stats`): plain JAX raises
        RESOURCE_EXHAUSTED making it there; the memory-aware chain decides the host, with
        a warning that says how much was free."""
        free = devpolicy.types.DeviceMemory().free_bytes(chip)
        assert free is not None
        count = (free + 2**30) // 4
        with pytest.raises(Exception, match=r"RESOURCE_EXHAUSTED|[Oo]ut of memory"):
            jnp.zeros((count,), jnp.float32, device=chip).block_until_ready()
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "fallback": ["cpu"],
                "rules": [{"match": "big", "device": "accelerator"}],
            },
            environ={},
        )
        with capture_logs() as logs:
            decision = policy.resolve("big", nbytes=count * 4)
        assert decision.device.platform == "cpu"
        assert f"free on {claims.text(chip)}" in str(decision.fallback_reason)
        (event,) = [e for e in logs if e["event"] == "placement"]
        assert event["log_level"] == "warning"

    def test_free_memory_is_the_chips_own_statistics(self, chip: jax.Device) -> None:
        """DeviceMemory reads `memory_stats`: bytes_limit - bytes_in_use."""
        stats = chip.memory_stats()
        assert stats is not None
        assert devpolicy.types.DeviceMemory().free_bytes(chip) == (
            stats["bytes_limit"] - stats["bytes_in_use"]
        )

    def test_report_agrees_with_memory_stats(self, chip: jax.Device) -> None:
        """`report()` lists what the policy placed on the chip, with its bytes, and free
        memory as `memory_stats` has it."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "model/*", "device": "accelerator"}]}, environ={}
        )
        weights = policy.put("model", {"w": np.ones((1024, 1024), np.float32)})["w"]
        weights.block_until_ready()
        entry = devpolicy.report().by_device[claims.text(chip)]
        stats = chip.memory_stats()
        assert stats is not None
        assert entry.nbytes >= 4 * 2**20
        assert entry.free == stats["bytes_limit"] - stats["bytes_in_use"]
        assert any("model/w" in e.names for e in entry.entries)


class TestLoading:
    def test_load_file_is_exact_onto_the_chip_for_every_dtype(
        self, chip: jax.Device, tmp_path: Path
    ) -> None:
        """Every dtype devpolicy reads lands on the chip with the values written."""
        claims.load_file_is_exact_for_every_dtype(chip, tmp_path)

    def test_windows_are_exact_past_2_31_from_a_mapped_file(
        self, chip: jax.Device, tmp_path: Path
    ) -> None:
        """Windows at 2**31 and at the end of a mapped 4 GiB file arrive on the chip."""
        claims.windows_exact_past_2_31(chip, tmp_path)
