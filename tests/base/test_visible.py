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


HOSTILE = "w\x1b[2J\x1b[31m[red]red\rforged\nline\u202etxt"
# Newlines are counted apart: the renderer makes some of its own.
RAW = ("\x1b", "\r", "\u202e")


def assert_visible(text: str, lines: int = 1) -> None:
    """No raw control character; only the renderer's own line breaks."""
    assert text.count("\n") == lines - 1
    for raw in RAW:
        assert raw not in text
    assert r"w\x1b[2J\x1b[31m[red]red\rforged\nline\u202etxt" in text


class TestUntrustedTextIsVisible:
    """Names and paths from files anyone may have written are shown, never obeyed."""

    def test_a_decision_escapes_control_characters(self) -> None:
        """print and rich.print of a decision: escapes shown, `[red]` kept as written."""
        decision = policy_of(default="cpu:1").decide(HOSTILE)
        assert_visible(str(decision))
        assert_visible(rich_text(decision).rstrip("\n"))

    def test_an_explanation_escapes_control_characters(self) -> None:
        """Every line of an explanation, the name's included, is visible-safe."""
        explanation = policy_of(rules=[{"match": "a/*", "device": "cpu:1"}]).explain(HOSTILE)
        text = str(explanation)
        assert_visible(text, lines=len(text.split("\n")))
        assert text.split("\n")[0] == HOSTILE.encode("unicode_escape").decode("ascii")
        assert rich_text(explanation).rstrip("\n") == text

    def test_a_plan_escapes_tensor_and_file_names(self, tmp_path: Path) -> None:
        """A checkpoint whose file and tensor names hold escape sequences prints them escaped."""
        path = tmp_path / "m\x1b[2J.safetensors"
        devpolicy.save_file({HOSTILE: np.zeros(4, np.float32)}, path)
        plan = policy_of(default="cpu:1").plan(path)
        text = str(plan)
        for raw in RAW:
            assert raw not in text
        assert r"m\x1b[2J.safetensors" in text
        assert len(text.split("\n")) == 3  # the header, the tensor, the device
        assert rich_text(plan).rstrip("\n") == text


class TestPlanShowsWhyNot:
    def test_a_sharding_passed_over_without_fallback_says_why(self, tmp_path: Path) -> None:
        """The reason `explain` gives (does not divide) is on the plan's line too."""
        path = tmp_path / "c.safetensors"
        devpolicy.save_file({"w": np.zeros((10, 4), np.float32)}, path)
        policy = policy_of(
            meshes={"pod": {"axes": {"data": 8}, "devices": "cpu"}},
            rules=[{"match": "c/w", "sharding": {"mesh": "pod", "spec": ["data"]}}],
        )
        lines = str(policy.plan(path, machine=devpolicy.VirtualMachine(["cpu=8"]))).splitlines()
        assert lines[1].startswith(
            "  c/w  F32 10x4  160 B  -> no device: no device for 'pod[data]'"
        )
        assert lines[2] == "    pod[data]: dim 0 of 10 does not divide by axis 'data' (8)"
