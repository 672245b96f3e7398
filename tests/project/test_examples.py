"""Every example runs and every ready policy loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import devpolicy
from tests.conftest import REPO

POLICIES = sorted((REPO / "policies").glob("*.yaml"))


def placed_on(report: str) -> dict[str, tuple[str, str]]:
    """From `devpolicy.report()`'s printout: each name placed -> (device, its row)."""
    found: dict[str, tuple[str, str]] = {}
    device = ""
    for line in report.splitlines():
        header = re.match(r"^(\w+:\d+): ", line)
        if header:
            device = header[1]
        elif line.startswith("  "):
            cells = re.split(r" {2,}", line.strip())
            if len(cells) >= 4:  # origin, names, arrays, bytes (unplaced rows have no names)
                for name in cells[1].split(", "):
                    found[name] = (device, line)
    return found


class TestExamples:
    @pytest.mark.slow
    def test_dataset_on_host_demo_runs_and_reports_placements(self) -> None:
        """The Quick start demo runs on this machine and logs every decision."""
        steering = ("DEVPOLICY_", "XLA_PYTHON_CLIENT_PREALLOCATE")
        env = {k: v for k, v in os.environ.items() if not k.startswith(steering)}
        result = subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / "dataset_on_host.py"),
                "--size",
                "1MiB",
                "--steps",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        # The final table is devpolicy.report(): each array under its device and rule.
        assert result.stdout.startswith("live arrays by device (devpolicy.report):\n")
        placed = placed_on(result.stdout)
        device, row = placed["dataset/tokens"]
        assert device.startswith("cpu:"), "the tokens stay on the host"
        assert re.match(r"^  \S*dataset-on-host\.yaml:\d+ ", row), "the rule's file and line"
        assert row.endswith("1 array  1.0 MiB (1.0 MiB file-backed)"), "mapped, not read"
        assert placed["model/embed"][1] == placed["model/out"][1]
        assert re.search(r"  1 array  2\.0 KiB$", placed["batch"][1]), "the last batch: 8 x 128"
        assert re.search(r"^total: \d+ arrays, ", result.stdout, re.M)
        # Then the bars: the device, the tokens' rule, and the stream with its loop.
        bars = result.stdout[result.stdout.index("devices (devpolicy.report, bars):") :]
        assert re.search(r"^cpu:\d+ \(host RAM\): ", bars, re.M)
        assert re.search(r"dataset-on-host\.yaml:\d+ \(1 array, 1\.0 MiB file-backed\)", bars)
        assert re.search(r"^  batch \(ended, on cpu:\d+\): 2 batches, .*waited \d", bars, re.M)
        # bootstrap() applied the policy's runtime: block before JAX started.
        assert "preallocate=False" in result.stderr
        assert "preallocate_source=policy" in result.stderr
        # One summary per file, and a placement event for each name.
        for event in ("load_file", "file_backed=", "name=model/embed", "name=batch"):
            assert event in result.stderr
        # No warning on any machine: on one without an accelerator the rules' own
        # `fallback: [cpu]` is the plan, said at info.
        assert "[warning" not in result.stderr
        accelerator = devpolicy.inventory().accelerator
        if accelerator is None:
            # structlog 25's console renderer quotes the value; 24 writes it bare.
            assert re.search(
                r"fallback_reason='?accelerator: no accelerator \(tpu or gpu backend\) in this process",
                result.stderr,
            )
            assert "does not apply: only a GPU backend reads" in result.stderr
        else:
            assert placed["model/embed"][0] == f"{accelerator}:0"
            assert placed["batch"][0] == f"{accelerator}:0"

    @pytest.mark.slow
    def test_readme_split_variant_puts_the_model_on_the_second_cpu(self) -> None:
        """The Quick start's one-line XLA_FLAGS variant shows the host/accelerator split."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        env["DEVPOLICY_RULES"] = "model/*=cpu:1,batch*=cpu:1"
        result = subprocess.run(
            [sys.executable, str(REPO / "examples" / "dataset_on_host.py"), "--size", "1MiB"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        placed = placed_on(result.stdout)
        assert placed["dataset/tokens"][0] == "cpu:0"
        assert placed["model/embed"][0] == "cpu:1"
        assert placed["batch"][0] == "cpu:1"
        assert placed["model/embed"][1].strip().startswith("env:DEVPOLICY_RULES item 0")
        assert "origin=env:DEVPOLICY_RULES" in result.stderr

    @pytest.mark.slow
    def test_demo_rejects_a_bad_size(self) -> None:
        """A bad --size is a usage error naming the accepted forms."""
        result = subprocess.run(
            [sys.executable, str(REPO / "examples" / "dataset_on_host.py"), "--size", "lots"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 2
        assert "--size: not a size: 'lots'" in result.stderr


class TestPolicies:
    @pytest.mark.parametrize("path", POLICIES, ids=[p.name for p in POLICIES])
    def test_ready_policies_load_and_resolve(self, path: object) -> None:
        """Each file in policies/ is valid and decides a name."""
        policy = devpolicy.load_policy(path, environ={})  # type: ignore[arg-type]
        assert policy.rules
        policy.explain("dataset/train/tokens")
