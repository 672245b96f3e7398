"""`devpolicy check` says of a fallback what the run says of it (issue 43, item 3): a way the
rule declared is a note in check as it is info in the run; only what the run would warn
about is a warning, and only that fails `--strict`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._cli.main import main
from tests.conftest import REPO
from tests.helpers import policy_of

SHIPPED = sorted((REPO / "policies").glob("*.yaml"))
NO_ACCELERATOR = not {"gpu", "tpu"} & set(devpolicy.inventory().devices)


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    status = main(["check", *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def _placement_levels(policy: devpolicy.Policy, name: str) -> list[str]:
    with capture_logs() as logs:
        policy.resolve(name)
    return [e["log_level"] for e in logs if e["event"] == "placement"]


@pytest.mark.skipif(not NO_ACCELERATOR, reason="needs a machine without an accelerator")
@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_policy_checks_clean_under_strict_on_a_cpu_only_machine(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a laptop every shipped policy's accelerator rules take the fallback they declare:
    no warning, and `check --strict` (a CI gate on a CPU runner) exits 0."""
    for variable in [v for v in os.environ if v.startswith("DEVPOLICY_")]:
        monkeypatch.delenv(variable)
    status, report = _check(capsys, str(path), "--strict")
    findings = report["findings"]
    assert isinstance(findings, list)
    assert [f for f in findings if f["severity"] != "note"] == []
    assert status == 0


class TestFallbackSeverity:
    def test_a_fallback_the_rule_declares_is_a_note_as_it_is_info_in_the_run(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """cpu:9 with the rule's own `fallback: [cpu]`: a note in check, info in the run,
        and `--strict` passes."""
        rules = [{"match": "x", "device": "cpu:9", "fallback": ["cpu"]}]
        (finding,) = devpolicy.lint(policy_of(rules=rules))
        assert (finding.severity, finding.code) == ("note", "missing-device")
        assert str(finding).endswith("here it falls back to cpu [missing-device]")
        assert _placement_levels(policy_of(rules=rules), "x") == ["info"]
        path = tmp_path / "p.yaml"
        path.write_text("version: 1\nrules:\n  - {match: x, device: cpu:9, fallback: [cpu]}\n")
        status, report = _check(capsys, str(path), "--strict")
        assert (status, report["exit"]) == (0, 0)

    def test_a_missing_target_without_a_fallback_of_its_own_still_warns(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """cpu:9 sent down the policy's chain: a warning in check as in the run, and
        `--strict` fails."""
        policy = policy_of(fallback=["cpu"], rules=[{"match": "x", "device": "cpu:9"}])
        (finding,) = devpolicy.lint(policy)
        assert (finding.severity, finding.code) == ("warning", "missing-device")
        assert _placement_levels(policy, "x") == ["warning"]
        path = tmp_path / "p.yaml"
        path.write_text("version: 1\nfallback: [cpu]\nrules:\n  - {match: x, device: cpu:9}\n")
        status, report = _check(capsys, str(path), "--strict")
        assert (status, report["exit"]) == (2, 2)

    def test_a_note_is_printed_as_a_note_and_counted_apart(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """The text report says `note:` and counts notes apart from warnings."""
        path = tmp_path / "p.yaml"
        path.write_text("version: 1\nrules:\n  - {match: x, device: cpu:9, fallback: [cpu]}\n")
        assert main(["check", str(path), "--strict"]) == 0
        out = capsys.readouterr().out
        assert "p.yaml:3: note: rule 0 ('x'): not on this machine" in out
        assert out.rstrip().endswith("0 error(s), 0 warning(s), 1 note(s)")

    @pytest.mark.parametrize(
        ("rules", "fallback"),
        [
            ([{"match": "x", "device": "cpu:9", "fallback": ["cpu:1"]}], []),
            ([{"match": "x", "device": "cpu:9"}], ["cpu:2"]),
            ([{"match": "x", "device": "cpu:9", "fallback": ["cpu:8", "cpu"]}], ["cpu:2"]),
        ],
    )
    def test_check_s_severity_is_the_run_s_level(
        self, rules: list[dict[str, object]], fallback: list[str]
    ) -> None:
        """Whatever the chain, a note where the run logs info, a warning where it warns."""
        policy = policy_of(rules=rules, fallback=fallback)
        (finding,) = devpolicy.lint(policy)
        (level,) = _placement_levels(policy_of(rules=rules, fallback=fallback), "x")
        assert {"info": "note", "warning": "warning"}[level] == finding.severity
