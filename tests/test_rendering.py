"""`print` and `rich.print` of Decision, Explanation and Plan: text a user can read."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from rich.console import Console

import devpolicy
from tests.helpers import policy_of


def rich_text(value: object) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(value)
    return buffer.getvalue()


class TestReadableText:
    def test_decision_prints_as_one_line_with_its_fallback(self) -> None:
        """A fallback decision says what was asked for and why it was passed over."""
        policy = policy_of(rules=[{"match": "m/*", "device": "cpu:9", "fallback": ["cpu:1"]}])
        text = str(policy.decide("m/w", nbytes=1024))
        assert text.startswith(
            "m/w (1.0 KiB) -> cpu:1 by <mapping>:rules[0] (policy); asked cpu:9: "
        )
        assert "Decision(" not in text

    def test_explanation_lists_each_rule_and_the_outcome(self) -> None:
        """print(explain(...)) shows every rule tried, not a raw dataclass."""
        policy = policy_of(rules=[{"match": "a/*", "device": "cpu:1"}], default="cpu:3")
        text = str(policy.explain("b/x"))
        assert text.splitlines() == [
            "b/x",
            "  rule <mapping>:rules[0] 'a/*': no: glob 'a/*' does not match",
            "  no rule matched: the default applies",
            "  decision: b/x -> cpu:3 by <mapping>:default (default)",
        ]

    def test_explanation_without_a_device_shows_the_error(self) -> None:
        """No device: the error's lines, indented."""
        text = str(policy_of(default="cpu:9").explain("x"))
        assert "  no device: no device for 'cpu:9'" in text

    def test_plan_prints_tensors_and_devices(self, tmp_path: Path) -> None:
        """A plan that does not fit says so on its first line and on the device's."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros(1024, np.float32)}, path)
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "*", "device": "cpu:2", "fits": False}]},
            capacity=devpolicy.StaticCapacity({"cpu:2": "1KiB"}),
            environ={},
        )
        lines = str(policy.plan(path)).splitlines()
        assert lines[0].endswith("m.safetensors: 1 tensor, DOES NOT FIT")
        assert "cpu:2: 1 tensor, 4.0 KiB, 1.0 KiB free (400%): DOES NOT FIT" in lines
        # Then what each rule took.
        assert lines[lines.index("rules:") + 1] == "  <mapping>:rules[0] '*': 1 tensor, 4.0 KiB"

    def test_rich_renders_the_same_text_without_reading_markup(self) -> None:
        """rich.print of a decision with `[bold]` in its name prints the name literally."""
        decision = policy_of(default="cpu:1").decide("[bold]x")
        assert rich_text(decision).strip() == str(decision)
        explanation = policy_of().explain("[red]y")
        assert rich_text(explanation).rstrip("\n") == str(explanation)
