"""The command line: run as a subprocess and as a function call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import devpolicy
from devpolicy._cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    return subprocess.run(
        [sys.executable, "-m", "devpolicy", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


class TestVersionAndUsage:
    def test_version_prints_the_package_version(self) -> None:
        """`devpolicy --version` prints the installed version."""
        result = run_cli("--version")
        assert (result.returncode, result.stdout.strip()) == (
            0,
            f"devpolicy {devpolicy.__version__}",
        )

    def test_unknown_command_is_a_usage_error(self) -> None:
        """A typo exits 2 with the valid commands listed."""
        result = run_cli("devcies")
        assert result.returncode == 2
        assert "invalid choice: 'devcies'" in result.stderr

    def test_no_command_prints_help_and_exits_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Bare `devpolicy` shows the help."""
        assert main([]) == 2
        assert "devices" in capsys.readouterr().out


class TestDevices:
    def test_json_lists_every_device_and_why_backends_are_absent(self) -> None:
        """`devices --json` has each device's target text and each absent backend's reason."""
        result = run_cli("devices", "--json")
        assert result.returncode == 0, result.stderr
        payload = json.loads(result.stdout)
        assert [d["target"] for d in payload["devices"] if d["platform"] == "cpu"] == [
            "cpu:0",
            "cpu:1",
            "cpu:2",
            "cpu:3",
        ]
        assert payload["backends"]["cpu"] == {"available": True, "reason": None}
        if "gpu" not in devpolicy.available_backends():
            assert payload["backends"]["gpu"]["available"] is False
            assert payload["backends"]["gpu"]["reason"].startswith("RuntimeError")

    def test_table_shows_targets_and_memory_kinds(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The table names devices by target text and marks the default."""
        assert main(["devices"]) == 0
        out = capsys.readouterr().out
        assert "cpu:0 (default)" in out
        assert "cpu:3" in out
        assert "pinned_host" in out
