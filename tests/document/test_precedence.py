"""Layer precedence: defaults < policy file < environment < code, for every setting."""

from __future__ import annotations

from pathlib import Path

import pytest

import devpolicy
from devpolicy._document.layers import LAYERS
from tests.helpers import write


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "p.yaml",
        "version: 1\ndefault: cpu:1\nstrict: false\nlogging: {level: warning}\nrules:\n  - {match: 'x/*', device: cpu:1}\n",
    )


class TestPrecedence:
    def test_layers_are_declared_lowest_first(self) -> None:
        """The order is written in one place."""
        assert LAYERS == ("defaults", "policy", "env", "code")

    def test_defaults_apply_when_nothing_is_set(self) -> None:
        """An empty policy defers to JAX (auto), non-strict, info, console."""
        s = devpolicy.load_policy({"version": 1}, environ={}).settings
        assert [
            (x.value, x.source) for x in (s.default, s.strict, s.disable, s.log_level, s.log_format)
        ] == [
            ("auto", "defaults"),
            (False, "defaults"),
            (False, "defaults"),
            ("info", "defaults"),
            ("auto", "defaults"),
        ]

    def test_policy_file_beats_defaults(self, policy_file: Path) -> None:
        """Settings written in the file win over built-in defaults and name their line."""
        s = devpolicy.load_policy(policy_file, environ={}).settings
        assert (s.default.value, s.default.origin, s.log_level.value) == (
            "cpu:1",
            "p.yaml:2",
            "warning",
        )

    def test_environment_beats_policy_file(self, policy_file: Path) -> None:
        """Each DEVPOLICY_* variable wins over the file."""
        env = {
            "DEVPOLICY_DEFAULT": "cpu:2",
            "DEVPOLICY_STRICT": "1",
            "DEVPOLICY_LOG_LEVEL": "error",
        }
        s = devpolicy.load_policy(policy_file, environ=env).settings
        assert (s.default.value, s.default.source, s.strict.value, s.log_level.value) == (
            "cpu:2",
            "env",
            True,
            "error",
        )

    def test_code_beats_environment(self, policy_file: Path) -> None:
        """Overrides given to load_policy win over the environment."""
        env = {"DEVPOLICY_DEFAULT": "cpu:2", "DEVPOLICY_STRICT": "1", "DEVPOLICY_DISABLE": "1"}
        s = devpolicy.load_policy(
            policy_file,
            environ=env,
            overrides={"default": "cpu:3", "strict": False, "disable": False},
        ).settings
        assert [(x.value, x.source) for x in (s.default, s.strict, s.disable)] == [
            ("cpu:3", "code"),
            (False, "code"),
            (False, "code"),
        ]

    def test_rules_are_tried_code_then_env_then_file(self, policy_file: Path) -> None:
        """Rule lists concatenate, highest layer first."""
        policy = devpolicy.load_policy(
            policy_file,
            environ={"DEVPOLICY_RULES": "x/*=cpu:2"},
            overrides={"rules": [{"match": "x/a", "device": "cpu:3"}]},
        )
        assert [r.source for r in policy.rules] == ["code", "env", "policy"]
        assert policy.resolve("x/a").device_text == "cpu:3"
        assert policy.resolve("x/b").device_text == "cpu:2"

    def test_explicit_source_beats_devpolicy_file(self, policy_file: Path, tmp_path: Path) -> None:
        """A path given in code is used even when DEVPOLICY_FILE names another."""
        other = write(tmp_path / "other.yaml", "version: 1\ndefault: cpu:3\n")
        policy = devpolicy.load_policy(policy_file, environ={"DEVPOLICY_FILE": str(other)})
        assert policy.resolve("y").device_text == "cpu:1"

    def test_bad_overrides_are_policy_errors(self) -> None:
        """Overrides are validated like a policy, naming the field."""
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^<overrides>: strictt: unknown field 'strictt' \(did you mean 'strict'\?\)",
        ):
            devpolicy.load_policy({"version": 1}, environ={}, overrides={"strictt": True})
