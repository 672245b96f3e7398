"""Fallbacks taken: counted by the decider as it decides, read by `report`."""

from __future__ import annotations

import numpy as np
import pytest

import devpolicy
from devpolicy._decide.decider import virtual_decider
from devpolicy._machine import fallbacks as _fallbacks
from devpolicy._machine.fallbacks import count_fallback, fallbacks, forget_fallbacks


@pytest.fixture(autouse=True)
def _fresh() -> None:
    forget_fallbacks()


def _policy(**extra: object) -> devpolicy.Policy:
    return devpolicy.load_policy(
        {
            "version": 1,
            "logging": {"level": "error"},
            "fallback": ["cpu:0"],
            "rules": [{"match": "fb/*", "device": "gpu:7", **extra}],
        }
    )


class TestCounted:
    def test_a_decision_that_falls_back_is_counted_once_per_name(self) -> None:
        """Two names down the chain: two decisions; the same name again, from the cache,
        is not counted again."""
        policy = _policy()
        kept = [policy.put(n, np.zeros(4, np.float32)) for n in ("fb/a", "fb/b", "fb/a")]
        (row,) = fallbacks()
        assert (row.origin, row.rule, row.requested, row.used) == (
            "<mapping>:rules[0]",
            0,
            "gpu:7",
            "cpu:0",
        )
        assert (row.decisions, row.nbytes, row.declared, row.short) == (2, 32, False, False)
        assert row.reason.endswith("used cpu:0")
        assert len(kept) == 3

    def test_the_rules_own_fallback_is_marked_declared(self) -> None:
        """A way the rule wrote itself (`fallback: [cpu:1]`) is counted as declared."""
        policy = _policy(fallback=["cpu:1"])
        kept = policy.put("fb/x", np.zeros(4, np.float32))
        (row,) = fallbacks()
        assert (row.used, row.declared) == ("cpu:1", True)
        assert kept is not None

    def test_a_decision_without_fallback_is_not_counted(self) -> None:
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "ok", "device": "cpu:2"}]}
        )
        kept = policy.put("ok", np.zeros(4, np.float32))
        assert fallbacks() == ()
        assert kept is not None

    def test_a_decider_for_another_machine_counts_nothing(self) -> None:
        """Deciding for a `VirtualMachine` (a plan) is no fallback taken in this process,
        even through `resolve`."""
        policy = devpolicy.load_policy(
            {"version": 1, "fallback": ["cpu"], "rules": [{"match": "fb/*", "device": "gpu"}]}
        )
        machine = devpolicy.VirtualMachine(["cpu=1x1GiB"])
        decider = virtual_decider(policy.decider.settings, machine, "plan")
        assert decider.resolve("fb/planned").fallback_reason is not None
        assert fallbacks() == ()

    def test_the_ledger_holds_the_counts(self) -> None:
        policy = _policy()
        kept = policy.put("fb/l", np.zeros(4, np.float32))
        assert [f.requested for f in devpolicy.report().fallbacks] == ["gpu:7"]
        assert kept is not None


class TestBounded:
    def test_past_the_limit_the_rest_are_counted_under_one_row(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_fallbacks, "_LIMIT", 2)
        for i in range(5):
            count_fallback(f"p:{i}", i, "gpu:0", "cpu:0", False, False, 1, "r")
        rows = fallbacks()
        assert len(rows) == 3
        assert sum(r.decisions for r in rows) == 5
        assert rows[0].origin == "<other rules>"
