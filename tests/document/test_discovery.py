"""Discovery: DEVPOLICY_FILE, then devpolicy.yaml upwards, then [tool.devpolicy], then empty."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest

import devpolicy
from devpolicy._document.discovery import discover
from tests.helpers import within, write
from tests.runtime.test_settings import last_json, python


class TestDiscovery:
    def test_no_policy_anywhere_gives_an_empty_policy(self, tmp_path: Path) -> None:
        """Without any policy every name goes to JAX's default device."""
        policy = devpolicy.load_policy(environ={})
        assert policy.rules == ()
        assert policy.resolve("anything").is_auto
        assert policy.found.startswith("no policy file")

    def test_devpolicy_yaml_in_a_parent_directory_is_found(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """devpolicy.yaml is looked for in the working directory and its parents."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        (tmp_path / "a" / "b").mkdir(parents=True)
        monkeypatch.chdir(tmp_path / "a" / "b")
        policy = devpolicy.load_policy(environ={})
        assert policy.resolve("x").device_text == "cpu:2"
        assert policy.resolve("x").origin.endswith("devpolicy.yaml:2")

    def test_pyproject_table_names_the_policy(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """[tool.devpolicy] policy is relative to the pyproject.toml that names it."""
        write(
            tmp_path / "pyproject.toml",
            '[project]\nname = "x"\n[tool.devpolicy]\npolicy = "conf/place.yaml"\n',
        )
        write(tmp_path / "conf" / "place.yaml", "version: 1\ndefault: cpu:3\n")
        (tmp_path / "src").mkdir()
        monkeypatch.chdir(tmp_path / "src")
        assert devpolicy.load_policy(environ={}).resolve("x").device_text == "cpu:3"

    def test_devpolicy_yaml_beats_pyproject(self, tmp_path: Path) -> None:
        """The file is found before the pyproject table."""
        write(tmp_path / "pyproject.toml", '[tool.devpolicy]\npolicy = "p.yaml"\n')
        write(tmp_path / "p.yaml", "version: 1\ndefault: cpu:3\n")
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:1\n")
        assert devpolicy.load_policy(environ={}).resolve("x").device_text == "cpu:1"

    def test_devpolicy_file_beats_everything(self, tmp_path: Path) -> None:
        """DEVPOLICY_FILE is looked at first."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:1\n")
        write(tmp_path / "env.yaml", "version: 1\ndefault: cpu:2\n")
        assert (
            devpolicy.load_policy(environ={"DEVPOLICY_FILE": "env.yaml"}).resolve("x").device_text
            == "cpu:2"
        )

    def test_finding_nothing_records_every_place_looked(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Found.looked: each devpolicy.yaml tried from the working directory up to the
        project root, nearest first, then the root's pyproject.toml."""
        write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
        (tmp_path / "a" / "b").mkdir(parents=True)
        found = discover(None, tmp_path / "a" / "b")
        assert found.path is None
        assert found.looked == (
            tmp_path / "a" / "b" / "devpolicy.yaml",
            tmp_path / "a" / "devpolicy.yaml",
            tmp_path / "devpolicy.yaml",
            tmp_path / "pyproject.toml",
        )
        assert found.looked_text == (
            f"devpolicy.yaml in {tmp_path / 'a' / 'b'}, {tmp_path / 'a'}, {tmp_path}; "
            f"[tool.devpolicy] in {tmp_path / 'pyproject.toml'}"
        )

    def test_pyproject_without_table_gives_an_empty_policy(self, tmp_path: Path) -> None:
        """The nearest pyproject.toml without [tool.devpolicy] means no policy."""
        write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
        assert devpolicy.load_policy(environ={}).rules == ()

    @pytest.mark.parametrize(
        ("pyproject", "message"),
        [
            (
                '[tool.devpolicy]\npolicy = "missing.yaml"\n',
                r"^pyproject\.toml: tool\.devpolicy\.policy: policy file not found: missing\.yaml",
            ),
            (
                "[tool.devpolicy]\npolicy = 3\n",
                r"^pyproject\.toml: tool\.devpolicy\.policy: must be a path to a policy file, got 3",
            ),
            (
                '[tool.devpolicy]\npolcy = "p.yaml"\n',
                r"^pyproject\.toml: tool\.devpolicy\.polcy: unknown key \(did you mean 'policy'\?\); valid keys: policy",
            ),
            ("[tool.devpolicy\n", r"^pyproject\.toml: cannot read pyproject\.toml"),
        ],
    )
    def test_bad_pyproject_tables_are_policy_errors(
        self, tmp_path: Path, pyproject: str, message: str
    ) -> None:
        """Mistakes in [tool.devpolicy] name pyproject.toml and the key."""
        write(tmp_path / "pyproject.toml", pyproject)
        with pytest.raises(devpolicy.PolicyError, match=message):
            devpolicy.load_policy(environ={})


class TestDiscoveryRegressions:
    def test_tool_that_is_not_a_table(self, tmp_path: Path) -> None:
        """`tool = "x"` in pyproject.toml is a PolicyError, not an AttributeError."""
        write(tmp_path / "pyproject.toml", 'tool = "x"\n')
        with pytest.raises(
            devpolicy.PolicyError, match=r"^pyproject\.toml: tool: must be a table$"
        ):
            devpolicy.load_policy(environ={})

    @pytest.mark.parametrize(
        ("make", "match"),
        [
            (lambda p: os.symlink("gone.yaml", p), r"dangling symlink"),
            (lambda p: os.symlink(p.name, p), r"symlink loop"),
            (lambda p: p.mkdir(), r"is a directory, not a policy file"),
            (lambda p: os.mkfifo(p), r"is a FIFO or pipe"),
        ],
        ids=["dangling", "loop", "directory", "fifo"],
    )
    def test_a_broken_devpolicy_yaml_is_an_error_not_skipped(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, match: str
    ) -> None:
        """A ./devpolicy.yaml that cannot be read is reported; the parent's policy is not used."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        (tmp_path / "sub").mkdir()
        make(tmp_path / "sub" / "devpolicy.yaml")
        monkeypatch.chdir(tmp_path / "sub")
        with pytest.raises(devpolicy.PolicyError, match=rf"^devpolicy\.yaml: {match}"):
            within(30, lambda: devpolicy.load_policy(environ={}))

    def test_pyproject_naming_a_fifo_says_so(self, tmp_path: Path) -> None:
        """[tool.devpolicy] policy naming a FIFO says what it is, not "not found"."""
        write(tmp_path / "pyproject.toml", '[tool.devpolicy]\npolicy = "p.yaml"\n')
        os.mkfifo(tmp_path / "p.yaml")
        with pytest.raises(
            devpolicy.PolicyError, match=r"tool\.devpolicy\.policy: is a FIFO or pipe"
        ):
            within(30, lambda: devpolicy.load_policy(environ={}))


# The child enters a directory and removes it (a working directory deleted under a running
# shell or job), then runs `code`; the events it logs and what it prints come back as JSON.
DELETED_CWD = """
import json, os, sys
import jax, structlog
import devpolicy
devpolicy.bootstrap, devpolicy.put, devpolicy.load_policy  # their modules imported
# Deleted after the imports: on Python 3.13.0 no C extension (numpy, pydantic-core)
# imports without a working directory, so plain JAX would not start either.
os.mkdir("gone"); os.chdir("gone"); os.rmdir(os.path.join("..", "gone"))
with structlog.testing.capture_logs() as logs:
    try:
        result = {{"value": {code}}}
    except devpolicy.DevicePolicyError as e:
        result = {{"error": type(e).__name__, "message": str(e)}}
result["events"] = [{{k: str(v) for k, v in e.items()}} for e in logs]
result["jax_default"] = str(jax.devices()[0])
print(json.dumps(result))
"""


def in_deleted_directory(code: str, cwd: Path, **env: str) -> dict[str, Any]:
    result = python(DELETED_CWD.format(code=code), cwd, **env)
    assert result.returncode == 0, result.stderr
    return cast("dict[str, Any]", last_json(result.stdout))


class TestDeletedWorkingDirectory:
    def test_discovery_in_no_working_directory_finds_no_policy(self) -> None:
        """No working directory (it was deleted): no policy here, and the places looked
        say why there were none."""
        found = discover(None, None)
        assert (found.path, found.looked) == (None, ())
        assert found.looked_text == "nowhere: the working directory no longer exists"
        assert "working directory no longer exists" in found.how

    def test_bootstrap_in_a_deleted_working_directory_starts_as_plain_jax(
        self, tmp_path: Path
    ) -> None:
        """bootstrap() where the working directory was deleted starts (issue 51, M4): an
        array goes where plain JAX puts it, and the `no_policy` warning says why nothing
        was looked at."""
        out = in_deleted_directory(
            "[str(d) for d in devpolicy.put('w', jax.numpy.ones(3)).devices()] "
            "if devpolicy.bootstrap() else None",
            tmp_path,
        )
        assert "error" not in out, out
        assert out["value"] == [out["jax_default"]]
        (warning,) = [e for e in out["events"] if e["event"] == "no_policy"]
        assert warning["looked"] == "nowhere: the working directory no longer exists"

    def test_a_named_policy_is_used_in_a_deleted_working_directory(self, tmp_path: Path) -> None:
        """DEVPOLICY_FILE (an absolute path) still names the policy there."""
        write(tmp_path / "p.yaml", "version: 1\ndefault: cpu\n")
        out = in_deleted_directory(
            "devpolicy.load_policy().file",
            tmp_path,
            DEVPOLICY_FILE=str(tmp_path / "p.yaml"),
        )
        assert out["value"] == str(tmp_path / "p.yaml")

    def test_a_required_policy_in_a_deleted_working_directory_says_why_none(
        self, tmp_path: Path
    ) -> None:
        """DEVPOLICY_REQUIRE=1 there: a PolicyError naming the missing working directory."""
        out = in_deleted_directory("devpolicy.load_policy()", tmp_path, DEVPOLICY_REQUIRE="1")
        assert out["error"] == "PolicyError"
        assert out["message"].startswith(
            "DEVPOLICY_REQUIRE: no policy found (looked for nowhere: the working directory "
            "no longer exists)"
        )
