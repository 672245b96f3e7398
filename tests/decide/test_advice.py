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
    @pytest.mark.parametrize("default", ["cpu", "cpu:1"])
    def test_a_default_written_to_a_device_is_not_warned_about(self, default: str) -> None:
        """`default: cpu` says where unnamed tensors go: a large tensor it decides is
        where it was asked to go, not a rule missing."""
        assert large_by_default(policy_of(default=default), file="/d/train.safetensors") == []

    def test_a_default_from_the_environment_is_not_warned_about(self) -> None:
        """DEVPOLICY_DEFAULT=cpu is as explicit as `default: cpu`."""
        policy = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_DEFAULT": "cpu"})
        assert large_by_default(policy) == []

    @pytest.mark.parametrize("default", [None, "auto"], ids=["unwritten", "auto"])
    def test_jaxs_default_device_still_warns(self, default: str | None) -> None:
        """No `default:`, or `default: auto` (as the shipped policies write it): JAX's
        default device, which differs between machines, decided; that is warned of."""
        fields = {} if default is None else {"default": default}
        (warning,) = large_by_default(policy_of(**fields), file="/d/train.safetensors")
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
