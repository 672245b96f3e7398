"""`check --names FILE.json` reads its file as every other input is read (issue 28, D6):
never blocking, never without limit, and each refusal names the file and why."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from devpolicy._cli.main import main
from tests.helpers import within, write

POLICY = "version: 1\nrules:\n  - {match: 'model/*', device: cpu:1}\n"


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write(tmp_path / "p.yaml", POLICY)


def _check(policy: Path, names: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = within(60, lambda: main(["check", str(policy), "--names", str(names)]))
    assert isinstance(status, int)
    return status, capsys.readouterr().err


class TestNamesFileGuards:
    def test_a_fifo_is_refused_not_waited_on(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A FIFO named tree.json (no writer will come) is an input error at once."""
        names = tmp_path / "tree.json"
        os.mkfifo(names)
        status, err = _check(policy, names, capsys)
        assert status == 2
        assert re.search(rf"{re.escape(str(names))}: .*is a FIFO or pipe", err), err

    def test_a_link_to_an_endless_device_is_refused(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A link to /dev/zero is refused as a device, never read until memory runs out."""
        names = tmp_path / "tree.json"
        os.symlink("/dev/zero", names)
        status, err = _check(policy, names, capsys)
        assert status == 2
        assert re.search(rf"{re.escape(str(names))}: .*is a character device", err), err

    def test_a_file_over_the_limit_is_refused_naming_the_limit(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A names file larger than the limit is refused by its size (a sparse file: the
        limit is judged before reading)."""
        names = tmp_path / "tree.json"
        with names.open("wb") as f:
            f.truncate(65 * 2**20)
        status, err = _check(policy, names, capsys)
        assert status == 2
        assert re.search(
            rf"{re.escape(str(names))}: .*is 68157440 bytes; at most 67108864 are accepted", err
        ), err

    def test_json_nested_too_deeply_is_named(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """100,000 nested lists are an input error saying so, not a RecursionError."""
        names = tmp_path / "tree.json"
        names.write_text("[" * 100_000 + "]" * 100_000)
        status, err = _check(policy, names, capsys)
        assert status == 2
        assert re.search(rf"{re.escape(str(names))}: not JSON .*nested too deeply", err), err
        assert "RecursionError" not in err

    def test_bytes_that_are_not_utf8_are_named(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        names = tmp_path / "tree.json"
        names.write_bytes(b'["model/\xff"]')
        status, err = _check(policy, names, capsys)
        assert status == 2
        assert re.search(rf"{re.escape(str(names))}: not JSON .*UTF-8", err), err

    def test_a_missing_file_is_named(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        names = tmp_path / "tree.json"
        status, err = _check(policy, names, capsys)
        assert status == 2
        assert f"{names}: no such file" in err

    def test_a_good_file_is_still_read(
        self, tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        names = write(tmp_path / "tree.json", '["model/w", "other/b"]')
        assert main(["check", str(policy), "--names", str(names)]) == 0
        assert "against 2 names" in capsys.readouterr().out


class TestNoPolicyFound:
    def test_check_strict_fails_when_no_policy_is_found(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`check --strict` where discovery finds no policy exits 2 (a CI gate must not
        pass a project with no policy: issue 51, N5), with the `no-policy` finding naming
        where it looked and the fix."""
        assert main(["check", "--strict"]) == 2
        out = capsys.readouterr().out
        assert "valid, no findings" not in out
        assert re.search(
            rf"discovery: warning: no policy found \(looked for devpolicy\.yaml in "
            rf"{re.escape(str(tmp_path))}[^)]*\): every name goes to JAX's default device.*"
            r"DEVPOLICY_FILE=path/to/devpolicy\.yaml.* \[no-policy\]",
            out,
        ), out
        assert "0 error(s), 1 warning(s)" in out

    def test_check_without_strict_warns_of_no_policy_and_passes(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without --strict the finding is a warning: exit 0, as for other warnings."""
        assert main(["check", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [(f["severity"], f["code"], f["origin"]) for f in report["findings"]] == [
            ("warning", "no-policy", "discovery")
        ]

    def test_a_policy_from_the_environment_is_a_policy(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """DEVPOLICY_RULES with no file is a policy: no `no-policy` finding."""
        monkeypatch.setenv("DEVPOLICY_RULES", "model/*=cpu")
        assert main(["check", "--strict", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["findings"] == []
