"""Memory-aware placement: with a size known, a device is used only if the bytes fit."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy._machine.capacity import cgroup_room, pool_of


def with_capacity(document: dict[str, object], free: dict[str, int | str]) -> devpolicy.Policy:
    return devpolicy.load_policy(
        {"version": 1, **document}, environ={}, capacity=devpolicy.StaticCapacity(free)
    )


class TestAuto:
    def test_sized_auto_stays_on_the_default_device_when_it_fits(self) -> None:
        """auto with a known size that fits uses JAX's default device."""
        policy = with_capacity({"fallback": ["cpu:3"]}, {"cpu:0": "10GiB"})
        assert policy.resolve("x", nbytes=2**30).device_text == "cpu:0"

    def test_sized_auto_falls_back_when_it_does_not_fit(self) -> None:
        """19.1 GiB against 17.8 GiB free goes to the next target, and says why."""
        policy = with_capacity({"fallback": ["cpu:3"]}, {"cpu:0": 19_112_000_000})
        with capture_logs() as logs:
            d = policy.resolve("dataset/train", nbytes=20_508_468_838)
        assert d.device_text == "cpu:3"
        assert (
            d.fallback_reason
            == "auto: needs 19.1 GiB, 17.8 GiB free on cpu:0, keeping 10% free; used cpu:3"
        )  # no "no accelerator can hold it": only a host device was passed over
        assert logs[0]["fallback_reason"] == d.fallback_reason

    def test_headroom_is_kept_free(self) -> None:
        """With 10% headroom, 95 bytes do not fit in 100 free; with 0% they do."""
        tight = with_capacity({"fallback": ["cpu:1"]}, {"cpu:0": 100})
        assert tight.resolve("x", nbytes=95).device_text == "cpu:1"
        loose = with_capacity({"fallback": ["cpu:1"], "headroom": "0%"}, {"cpu:0": 100})
        assert loose.resolve("x", nbytes=95).device_text == "cpu:0"

    def test_unsized_auto_is_not_judged(self) -> None:
        """Without a size there is nothing to compare: JAX's default is used."""
        policy = with_capacity({"fallback": ["cpu:3"]}, {"cpu:0": 0})
        assert policy.resolve("x").device_text == "cpu:0"

    def test_capacity_is_asked_again_for_every_sized_decision(self) -> None:
        """Free memory changes as things load, so sized decisions are not cached."""
        free = {"cpu:0": 1000}

        class Shrinking:
            def free_bytes(self, device: jax.Device) -> int | None:
                return free.get(devpolicy.inventory().text(device))

        policy = devpolicy.load_policy(
            {"version": 1, "fallback": ["cpu:2"]}, environ={}, capacity=Shrinking()
        )
        assert policy.resolve("x", nbytes=500).device_text == "cpu:0"
        free["cpu:0"] = 100
        assert policy.resolve("x", nbytes=500).device_text == "cpu:2"

    def test_no_target_is_taken_when_none_can_hold_the_bytes(self) -> None:
        """With nowhere that can hold them, resolving raises before anything is allocated,
        saying each device's free memory (the last target is no longer taken anyway)."""
        policy = with_capacity({}, {"cpu:0": 10})
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"^no device for 'auto' for name 'x' \(default, default\): nothing in the chain "
            r"can hold 1000 B \(no fallback given\)\n  auto: needs 1000 B, 10 B free on cpu:0, "
            r"keeping 10% free\n",
        ):
            policy.resolve("x", nbytes=1000)

    def test_strict_raises_when_it_does_not_fit(self) -> None:
        """strict: a size that does not fit is an error, not a fallback."""
        policy = with_capacity({"strict": True, "fallback": ["cpu:1"]}, {"cpu:0": 10})
        with pytest.raises(
            devpolicy.DeviceUnavailableError, match=r"auto: needs 1000 B, 10 B free on cpu:0"
        ):
            policy.resolve("x", nbytes=1000)


class TestFitsRules:
    def test_fits_rule_walks_its_chain_by_free_memory(self) -> None:
        """A `fits: true` rule skips each target the size does not fit."""
        policy = with_capacity(
            {
                "rules": [
                    {
                        "match": "model/*",
                        "device": "cpu:1",
                        "fallback": ["cpu:2", "cpu:3"],
                        "fits": True,
                    }
                ]
            },
            {"cpu:1": "1KiB", "cpu:2": "1MiB"},
        )
        assert policy.resolve("model/w", nbytes=100).device_text == "cpu:1"
        assert policy.resolve("model/w", nbytes=100_000).device_text == "cpu:2"
        assert (
            policy.resolve("model/w", nbytes=10**7).device_text == "cpu:3"
        )  # cpu:3 unknown: not judged

    def test_rules_without_fits_are_judged_too(self) -> None:
        """Every rule's targets are judged by free memory, `fits` written or not."""
        policy = with_capacity(
            {"rules": [{"match": "*", "device": "cpu:1", "fallback": ["cpu:2"]}]}, {"cpu:1": 1}
        )
        d = policy.resolve("x", nbytes=10**6)
        assert d.device_text == "cpu:2"
        assert (
            d.fallback_reason
            == "cpu:1: needs 976.6 KiB, 1 B free on cpu:1, keeping 10% free; used cpu:2"
        )

    def test_fits_false_takes_the_target_unjudged(self) -> None:
        """`fits: false` is the way out: the rule's target is taken whatever its memory says."""
        policy = with_capacity(
            {"rules": [{"match": "*", "device": "cpu:1", "fits": False, "fallback": ["cpu:2"]}]},
            {"cpu:1": 1},
        )
        assert policy.resolve("x", nbytes=10**6).device_text == "cpu:1"


class TestCapacitySources:
    def test_device_memory_uses_host_ram_for_devices_without_stats(self) -> None:
        """CPU devices report no memory stats; available RAM stands in."""
        free = devpolicy.types.DeviceMemory().free_bytes(devpolicy.get_device("cpu:1"))
        assert free is not None
        assert free > 0

    def test_device_memory_prefers_reported_stats(self) -> None:
        """A device that reports bytes_limit and bytes_in_use is judged by them."""

        class Reporting:
            def memory_stats(self) -> dict[str, int]:
                return {"bytes_limit": 1000, "bytes_in_use": 300}

        assert devpolicy.types.DeviceMemory().free_bytes(Reporting()) == 700  # type: ignore[arg-type]

    def test_static_capacity_validates_its_input(self) -> None:
        """Stated capacities use target text and sizes, checked at once."""
        with pytest.raises(ValueError, match=r"not a size: 'lots'"):
            devpolicy.StaticCapacity({"cpu:0": "lots"})
        with pytest.raises(ValueError, match=r"did you mean 'gpu'\?"):
            devpolicy.StaticCapacity({"gpuu:0": 1})

    def test_bad_headroom_is_a_policy_error(self) -> None:
        """headroom must be a fraction below 1 or a percentage."""
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"headroom: expected a fraction in \[0, 1\) or a percentage like '10%', got 1\.5",
        ):
            devpolicy.load_policy({"version": 1, "headroom": 1.5}, environ={})


class _HostOf1000(devpolicy.types.DeviceMemory):
    """Host RAM as if 1000 bytes were free: CPU devices report no stats, so they share it."""

    def usage(self, device: jax.Device) -> tuple[int | None, int | None]:
        return 1000, None


class TestSharedHostMemory:
    def test_cpu_devices_share_one_pool(self) -> None:
        """Every CPU device draws on the same host RAM; a stated capacity is per device."""
        cpus = [devpolicy.get_device(f"cpu:{i}") for i in range(4)]
        assert len({pool_of(devpolicy.types.DeviceMemory(), d) for d in cpus}) == 1
        static = devpolicy.StaticCapacity({"cpu:0": 10, "cpu:1": 10})
        assert len({pool_of(static, d) for d in cpus}) == 4

    def test_bytes_given_to_one_cpu_count_against_all(self) -> None:
        """600 bytes on cpu:1 leave too little for 600 more on cpu:2: the walk goes on to cpu:3."""
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "headroom": 0,
                "rules": [
                    {"match": "*", "device": "cpu:1", "fits": True, "fallback": ["cpu:2", "cpu:3"]}
                ],
            },
            capacity=_HostOf1000(),
            environ={},
        )
        a, b = policy.decide_many([("a", 600), ("b", 600)])
        assert isinstance(a, devpolicy.types.Decision)
        assert a.device_text == "cpu:1"
        # cpu:3 draws on the same host RAM as cpu:2: nothing in the chain can hold b.
        assert isinstance(b, devpolicy.DeviceUnavailableError)
        assert "cpu:2: needs 600 B, 1000 B free on cpu:2, 600 B of it taken by earlier items" in (
            str(b)
        )
        assert "cpu:3: needs 600 B, 1000 B free on cpu:3, 600 B of it taken by earlier items" in (
            str(b)
        )

    def test_plan_judges_cpu_devices_together(self, tmp_path: Path) -> None:
        """Two CPU devices each under their free memory, together over it: the plan does not fit."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"a": np.zeros(600, np.uint8), "b": np.zeros(600, np.uint8)}, path)
        policy = devpolicy.load_policy(
            {
                "version": 1,
                # `fits: false`: the decisions take their targets unjudged; the plan judges.
                "rules": [
                    {"match": "*/a", "device": "cpu:1", "fits": False},
                    {"match": "*", "device": "cpu:2", "fits": False},
                ],
            },
            capacity=_HostOf1000(),
            environ={},
        )
        plan = policy.plan(path)
        assert [(d.device, d.pool, d.pool_nbytes, d.fits) for d in plan.devices] == [
            ("cpu:1", "host RAM", 1200, False),
            ("cpu:2", "host RAM", 1200, False),
        ]
        assert not plan.fits


class TestCgroupRoom:
    def test_a_v2_limit_less_its_usage_counts_its_page_cache_as_free(self) -> None:
        """memory.max 8 GiB, memory.current 6 GiB of which 4 GiB page cache: 6 GiB room."""
        stat = "anon 2147483648\nfile 4294967296\nkernel 1000\n"
        assert cgroup_room("8589934592\n", "6442450944\n", stat) == 6 * 2**30

    def test_a_v1_limit_counts_cache(self) -> None:
        """v1 names the page cache `cache` in memory.stat."""
        assert cgroup_room("1000", "900", "cache 300\nrss 600\n") == 400

    @pytest.mark.parametrize(
        "limit", ["max\n", "9223372036854771712\n", None, "", "12 GiB"], ids=repr
    )
    def test_no_limit_or_an_unreadable_one_is_no_room_to_speak_of(self, limit: str | None) -> None:
        """v2's `max`, v1's "no limit" near 2**63, a missing or garbled file: None, so the
        host's MemAvailable alone is used."""
        assert cgroup_room(limit, "100", "file 0\n") is None

    @given(
        limit=st.integers(0, 2**61),
        usage=st.integers(0, 2**61),
        cache=st.integers(0, 2**61),
        junk=st.text(alphabet="abc \n0123456789", max_size=40),
    )
    def test_the_room_is_never_negative_and_never_more_than_the_limit_plus_cache(
        self, limit: int, usage: int, cache: int, junk: str
    ) -> None:
        """Whatever the numbers (usage past the limit included) and whatever else the
        stat file holds, the room is a count of bytes from 0 up."""
        room = cgroup_room(str(limit), str(usage), f"{junk}\nfile {cache}\n")
        assert room is not None
        assert 0 <= room <= limit + cache
