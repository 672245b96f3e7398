"""Resolving names: rules, defaults, fallbacks with reasons, strictness, memory kinds, caching."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import needs_cpu_pinned_host, policy_of, write

NO_GPU = "gpu" not in devpolicy.inventory().devices


class TestResolve:
    def test_decision_carries_name_rule_origin_and_source(
        self, tmp_path: Path, cpus: list[jax.Device]
    ) -> None:
        """A rule's decision names the device, rule index, file:line and source."""
        path = write(
            tmp_path / "p.yaml", "version: 1\nrules:\n  - match: 'dataset/*'\n    device: cpu:2\n"
        )
        d = devpolicy.load_policy(path, environ={}).resolve("dataset/train", nbytes=10)
        assert (
            d.name,
            d.device,
            d.device_text,
            d.requested,
            d.rule,
            d.origin,
            d.source,
            d.fallback_reason,
            d.nbytes,
        ) == (
            "dataset/train",
            cpus[2],
            "cpu:2",
            "cpu:2",
            0,
            "p.yaml:3",
            "policy",
            None,
            10,
        )

    def test_unmatched_names_take_the_default(self, cpus: list[jax.Device]) -> None:
        """The default applies when no rule matches, with source `default`."""
        d = policy_of(default="cpu:1").resolve("x")
        assert (d.device, d.rule, d.source, d.origin) == (
            cpus[1],
            None,
            "default",
            "<mapping>:default",
        )

    def test_auto_defers_to_jax_and_follows_enclosing_scopes(self, cpus: list[jax.Device]) -> None:
        """`auto` is whatever JAX would use now; the decision is not stale inside a scope."""
        policy = policy_of()
        assert policy.resolve("x").device == cpus[0]
        with jax.default_device(cpus[3]):
            assert policy.resolve("x").device == cpus[3]
        assert policy.resolve("x").device == cpus[0]

    def test_size_conditions_route_by_size(self, cpus: list[jax.Device]) -> None:
        """The README's `min_bytes: 4GiB` rule applies only to known, large sizes."""
        policy = policy_of(
            rules=[{"match": "*", "min_bytes": "4GiB", "device": "cpu:3"}], default="cpu:1"
        )
        assert policy.resolve("t", nbytes=5 * 2**30).device == cpus[3]
        assert policy.resolve("t", nbytes=2**30).device == cpus[1]
        assert policy.resolve("t").device == cpus[1]

    @needs_cpu_pinned_host
    def test_memory_kind_is_part_of_the_decision(self) -> None:
        """A rule's memory kind is carried to the decision and its sharding."""
        d = policy_of(rules=[{"match": "*", "device": "cpu:1", "memory": "pinned_host"}]).resolve(
            "x"
        )
        assert (d.memory_kind, d.sharding.memory_kind) == ("pinned_host", "pinned_host")

    @pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
    def test_bad_sizes_are_rejected(self, bad: object) -> None:
        """nbytes must be a non-negative int."""
        with pytest.raises(ValueError, match=r"^nbytes must be None or a non-negative int"):
            policy_of().resolve("x", nbytes=bad)  # type: ignore[arg-type]

    def test_names_must_be_strings(self) -> None:
        """A non-string name is a TypeError that says what was given."""
        with pytest.raises(TypeError, match=r"^a placement name must be a str, got int 3"):
            policy_of().resolve(3)  # type: ignore[arg-type]


class TestFallback:
    @pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
    def test_missing_gpu_falls_back_to_cpu_with_the_reason(self, cpus: list[jax.Device]) -> None:
        """`gpu:0` on a CPU-only machine goes down the policy's fallback chain and says why."""
        policy = policy_of(fallback=["gpu", "cpu"], rules=[{"match": "model/*", "device": "gpu:0"}])
        d = policy.resolve("model/w")
        assert (d.device, d.requested) == (cpus[0], "gpu:0")
        assert d.fallback_reason == "gpu:0, gpu: no gpu backend in this process; used cpu"

    @pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
    def test_targets_passed_over_for_one_reason_are_named_together(
        self, cpus: list[jax.Device]
    ) -> None:
        """Each reason is said once, after every target passed over for it, in the order
        the walk first met it: gpu:0 and gpu (tried third) share one."""
        policy = policy_of(
            fallback=["cpu:9", "gpu", "cpu:2"],
            rules=[{"match": "*", "device": "gpu:0"}],
        )
        d = policy.resolve("x")
        assert d.device == cpus[2]
        assert d.fallback_reason == (
            "gpu:0, gpu: no gpu backend in this process; "
            "cpu:9: index 9 out of range (4 local cpu devices: cpu:0..cpu:3); used cpu:2"
        )

    def test_index_out_of_range_falls_back(self, cpus: list[jax.Device]) -> None:
        """The same code path serves any platform: here cpu:9 falls back to cpu:2."""
        d = policy_of(fallback=["cpu:2"], rules=[{"match": "*", "device": "cpu:9"}]).resolve("x")
        assert d.device == cpus[2]
        assert d.fallback_reason is not None
        assert d.fallback_reason.startswith("cpu:9: index 9 out of range (4 local cpu devices")

    def test_a_rules_own_fallback_replaces_the_policys(self, cpus: list[jax.Device]) -> None:
        """Per-rule `fallback` is used instead of the policy's chain."""
        policy = policy_of(
            fallback=["cpu:1"], rules=[{"match": "*", "device": "cpu:7", "fallback": ["cpu:3"]}]
        )
        assert policy.resolve("x").device == cpus[3]

    def test_a_fallback_the_rule_declared_is_info_once(self) -> None:
        """A rule's own `fallback:` is the plan it wrote: the first decision is info with
        the reason, repeats debug; `fallback_declared` says so."""
        policy = policy_of(rules=[{"match": "*", "device": "cpu:7", "fallback": ["cpu:3"]}])
        with capture_logs() as logs:
            first = policy.resolve("x")
            policy.resolve("y")
        assert first.fallback_declared
        assert [e["log_level"] for e in logs] == ["info", "info"]
        assert logs[0]["fallback_reason"].startswith("cpu:7: index 7 out of range")

    def test_the_policys_chain_taking_over_is_a_warning_once(self) -> None:
        """A rule that wrote no fallback, sent down the policy's chain: a warning the first
        time for that rule and outcome, then info for other names."""
        policy = policy_of(fallback=["cpu:3"], rules=[{"match": "*", "device": "cpu:7"}])
        with capture_logs() as logs:
            first = policy.resolve("x")
            policy.resolve("y")
        assert not first.fallback_declared
        assert [e["log_level"] for e in logs] == ["warning", "info"]

    def test_no_fallback_is_not_declared(self) -> None:
        assert (
            not policy_of(rules=[{"match": "*", "device": "cpu:1"}]).resolve("x").fallback_declared
        )

    def test_fallback_to_auto_always_succeeds(self, cpus: list[jax.Device]) -> None:
        """`auto` at the end of a chain means JAX's default."""
        d = policy_of(
            fallback=["tpu:5", "auto"], rules=[{"match": "*", "device": "cpu:8"}]
        ).resolve("x")
        assert d.device == cpus[0]

    def test_exhausted_chain_raises_listing_every_step(self) -> None:
        """When nothing in the chain can be had the error lists each target and what exists."""
        policy = policy_of(fallback=["cpu:5"], rules=[{"match": "m/*", "device": "cpu:4"}])
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"(?s)^no device for 'cpu:4' for name 'm/w' \(rule <mapping>:rules\[0\]\)\n  cpu:4: index 4 out of range.*\n  cpu:5: index 5 out of range.*\n  available: cpu:0, cpu:1, cpu:2, cpu:3",
        ):
            policy.resolve("m/w")

    @needs_cpu_pinned_host
    def test_memory_kind_the_device_lacks_falls_back(self, cpus: list[jax.Device]) -> None:
        """A device without the asked memory kind counts as unavailable."""
        original = devpolicy._machine.inventory.memory_kinds  # type: ignore[attr-defined]
        try:
            devpolicy._machine.inventory.memory_kinds = lambda d: (
                ("device",) if d == cpus[1] else original(d)
            )  # type: ignore[attr-defined]
            d = policy_of(
                fallback=["cpu:2"],
                rules=[{"match": "*", "device": "cpu:1", "memory": "pinned_host"}],
            ).resolve("x")
        finally:
            devpolicy._machine.inventory.memory_kinds = original  # type: ignore[attr-defined]
        assert d.device == cpus[2]
        assert d.fallback_reason == "cpu:1: no memory kind 'pinned_host' (has: device); used cpu:2"


class TestStrict:
    def test_strict_raises_instead_of_falling_back(self) -> None:
        """`strict: true` ignores the chain and raises at the first unavailable target."""
        policy = policy_of(strict=True, fallback=["cpu"], rules=[{"match": "*", "device": "cpu:6"}])
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"^no device for 'cpu:6' for name 'x' \(rule <mapping>:rules\[0\]\) \(strict: no fallback\)",
        ):
            policy.resolve("x")

    def test_strict_from_the_environment(self) -> None:
        """DEVPOLICY_STRICT=1 turns a falling-back policy strict without editing it."""
        policy = devpolicy.load_policy(
            {"version": 1, "fallback": ["cpu"], "rules": [{"match": "*", "device": "cpu:6"}]},
            environ={"DEVPOLICY_STRICT": "1"},
        )
        with pytest.raises(devpolicy.DeviceUnavailableError):
            policy.resolve("x")

    def test_strict_still_places_what_is_available(self, cpus: list[jax.Device]) -> None:
        """Strictness only matters when a target cannot be had."""
        assert policy_of(strict=True, default="cpu:2").resolve("x").device == cpus[2]


class TestDisabled:
    def test_disabled_decisions_say_so_and_use_jax_default(self, cpus: list[jax.Device]) -> None:
        """Under DEVPOLICY_DISABLE decisions are still made, with source `disabled`."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "*", "device": "cpu:3"}]},
            environ={"DEVPOLICY_DISABLE": "yes"},
        )
        d = policy.resolve("x")
        assert (d.source, d.requested, d.device, d.applies) == ("disabled", "cpu:3", cpus[0], False)

    def test_disabled_reject_policy_fails_nothing(self, cpus: list[jax.Device]) -> None:
        """The kill switch beats `default: reject`: an unmatched name gets JAX's default."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "reject", "rules": [{"match": "a/*", "device": "cpu:3"}]},
            environ={"DEVPOLICY_DISABLE": "1"},
        )
        d = policy.resolve("unmatched")
        assert (d.source, d.device, d.applies) == ("disabled", cpus[0], False)
        with policy.scope("unmatched"):
            pass
        assert policy.put("unmatched", np.zeros(2)).devices() == {cpus[0]}
        assert policy.place("unmatched")(lambda: 1)() == 1
        assert policy.explain("unmatched").error is None


class TestCaching:
    def test_repeated_resolve_returns_the_cached_decision(self) -> None:
        """Resolving a name again is a lookup: the same Decision object comes back."""
        policy = policy_of(rules=[{"match": "*", "device": "cpu:1"}])
        assert policy.resolve("x") is policy.resolve("x")
        assert policy.resolve("x", nbytes=4) is not policy.resolve("x")

    def test_repeated_names_do_not_test_patterns_again(self) -> None:
        """A cached name reaches the matcher once, whatever the number of repeats."""
        policy = policy_of(rules=[{"match": "a*", "device": "cpu:1"}])
        matcher = policy.decider._matcher  # type: ignore[attr-defined]
        calls: list[str] = []
        real = matcher.conditions[0].test
        object.__setattr__(matcher.conditions[0], "test", lambda n: calls.append(n) or real(n))
        for _ in range(3):
            policy.resolve("abc")
        assert calls == ["abc"]

    def test_auto_names_are_cached_while_the_default_device_stays(
        self, cpus: list[jax.Device]
    ) -> None:
        """An unmatched (`auto`) name is decided once, and again when JAX's default moves."""
        policy = policy_of(rules=[{"match": "*a", "device": "cpu:1"}])
        matcher = policy.decider._matcher  # type: ignore[attr-defined]
        calls: list[str] = []
        real = matcher.conditions[0].test
        object.__setattr__(matcher.conditions[0], "test", lambda n: calls.append(n) or real(n))
        first = policy.resolve("zzz")
        assert policy.resolve("zzz") is first
        assert calls == ["zzz"]
        with jax.default_device(cpus[2]):
            assert policy.resolve("zzz").device == cpus[2]
        assert policy.resolve("zzz").device == cpus[0]

    def test_a_working_set_larger_than_one_generation_stays_warm(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Past the cache size nothing falls off a cliff: recently used names are still hits."""
        monkeypatch.setattr(devpolicy._decide.decider, "CACHE_GENERATION", 100)  # type: ignore[attr-defined]
        policy = policy_of(rules=[{"match": "*", "device": "cpu:1"}])
        names = [f"n{i}" for i in range(150)]
        first = {n: policy.resolve(n) for n in names}
        assert all(policy.resolve(n) is first[n] for n in names[-100:])

    def test_a_cache_turnover_never_relogs_at_info(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The first-seen record outlives the cache: a second pass logs nothing at info."""
        monkeypatch.setattr(devpolicy._decide.decider, "CACHE_GENERATION", 10)  # type: ignore[attr-defined]
        policy = policy_of(rules=[{"match": "*", "device": "cpu:1"}])
        names = [f"n{i}" for i in range(50)]
        with capture_logs() as logs:
            for _ in range(3):
                for n in names:
                    policy.resolve(n)
        assert sorted(e["name"] for e in logs) == sorted(names)


class TestExplain:
    def test_explain_shows_every_rule_and_fallback_step(self) -> None:
        """explain() lists each rule tried and the fallback steps, without raising."""
        policy = policy_of(
            fallback=["cpu:1"],
            rules=[{"match": "a/*", "device": "cpu"}, {"match": "*", "device": "cpu:9"}],
        )
        e = policy.explain("b")
        assert [(s.matched, entry.origin) for entry, s in e.steps] == [
            (False, "<mapping>:rules[0]"),
            (True, "<mapping>:rules[1]"),
        ]
        assert e.fallback[0][0] == "cpu:9"
        assert e.decision is not None
        assert e.decision.device_text == "cpu:1"

    def test_explain_reports_an_exhausted_chain_as_text(self) -> None:
        """When resolving would raise, explain() returns the error text instead."""
        e = policy_of(strict=True, default="cpu:9").explain("b")
        assert e.decision is None
        assert e.error is not None
        assert e.error.startswith("no device for 'cpu:9'")
