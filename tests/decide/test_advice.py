"""The warnings that say which rule to write: `large_by_default` (issue 51, N10)."""

from __future__ import annotations

import logging

import pytest
import yaml
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import policy_of

GiB = 2**30


def large_by_default(policy: devpolicy.Policy, **where: str) -> list[dict[str, object]]:
    with capture_logs() as logs:
        policy.resolve("train/tokens", nbytes=2 * GiB, **where)
    return [e for e in logs if e["event"] == "large_by_default"]


class TestLargeByDefault:
    @pytest.mark.parametrize("default", ["cpu", "cpu:1", "auto"])
    def test_an_explicit_default_is_not_warned_about(self, default: str) -> None:
        """`default:` written in the policy says where unnamed tensors go: a large tensor
        it decides is what was asked for, not a rule missing."""
        assert large_by_default(policy_of(default=default), file="/d/train.safetensors") == []

    def test_a_default_from_the_environment_is_not_warned_about(self) -> None:
        """DEVPOLICY_DEFAULT=cpu is as explicit as `default: cpu`."""
        policy = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_DEFAULT": "cpu"})
        assert large_by_default(policy) == []

    def test_the_built_in_default_still_warns(self) -> None:
        """No `default:` anywhere: JAX's default device decided, and that is warned of."""
        (warning,) = large_by_default(policy_of(), file="/d/train.safetensors")
        assert warning["device"] == "cpu:0"

    @pytest.mark.parametrize(
        ("where", "rule"),
        [
            ({"file": "/d/train.safetensors"}, {"file": "train.safetensors", "device": "cpu"}),
            ({}, {"match": "train/tokens", "device": "cpu"}),
        ],
        ids=["file", "name"],
    )
    def test_the_suggested_rule_is_one_line_of_yaml(
        self, where: dict[str, str], rule: dict[str, str]
    ) -> None:
        """The rule to write is one line (a console renders a newline as a literal `\\n`)
        that pastes under `rules:` as written."""
        (warning,) = large_by_default(policy_of(), **where)
        suggested = str(warning["suggested_rule"])
        assert "\n" not in suggested
        assert yaml.safe_load(f"rules:\n  {suggested}\n") == {"rules": [rule]}

    def test_the_console_shows_the_rule_without_an_escaped_newline(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As the console renders it (no logging set up): no `\\n` in the line."""
        monkeypatch.setattr(logging.root, "handlers", [])
        policy_of().resolve("train/tokens", nbytes=2 * GiB, file="/d/train.safetensors")
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "large_by_default" in x]
        assert "\\n" not in line
        assert '- {file: "train.safetensors", device: cpu}' in line
