"""Docstring examples run, the README's commands and references stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re

import pytest

import devpolicy
from tests.conftest import REPO

MODULES = sorted(
    m.name
    for m in pkgutil.iter_modules(devpolicy.__path__, "devpolicy.")
    if m.name != "devpolicy.__main__"
)


class TestDocstrings:
    @pytest.mark.parametrize("module", ["devpolicy", *MODULES])
    def test_examples_in_docstrings_run(self, module: str) -> None:
        """Every `>>>` example in the package is correct."""
        result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0

    def test_every_public_name_is_documented_with_an_example(self) -> None:
        """Public callables have a docstring; functions and classes show an example."""
        for name in devpolicy.__all__:
            obj = getattr(devpolicy, name)
            if name.startswith("__"):
                continue
            assert obj.__doc__, f"{name} has no docstring"
            if (callable(obj) and not isinstance(obj, type)) or name in (
                "Policy",
                "Decision",
                "activate",
            ):
                assert ">>>" in obj.__doc__, f"{name} has no example"


class TestReadme:
    def test_quick_start_is_two_commands(self) -> None:
        """The Quick start block has exactly two commands: the demo and the tests."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        block = re.search(r"## Quick start\n.*?```(?:bash|sh)?\n(.*?)```", readme, re.S)
        assert block is not None
        commands = [
            line
            for line in block.group(1).splitlines()
            if line.strip() and not line.startswith("#")
        ]
        assert len(commands) == 2
        assert "examples/dataset_on_host.py" in commands[0]
        assert "pytest" in commands[1]

    def test_ci_runs_the_readme_test_command(self) -> None:
        """.ci/run ends with the README's test command, verbatim."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        block = re.search(r"## Quick start\n.*?```(?:bash|sh)?\n(.*?)```", readme, re.S)
        assert block is not None
        test_command = next(
            line for line in block.group(1).splitlines() if "pytest" in line
        ).strip()
        assert test_command in (REPO / ".ci" / "run").read_text(encoding="utf-8")

    def test_every_env_variable_is_documented(self) -> None:
        """The README's environment reference names every DEVPOLICY_* variable."""
        from devpolicy._env import VARIABLES

        readme = (REPO / "README.md").read_text(encoding="utf-8")
        for variable in VARIABLES:
            assert f"`{variable}`" in readme


class TestReadmeLinks:
    def test_every_internal_link_has_a_heading(self) -> None:
        """Links like [x](#threads-async-and-multi-process) point at a section that exists."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        slugs = {
            re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", readme, re.M)
        }
        for anchor in re.findall(r"\]\(#([^)]+)\)", readme):
            assert anchor in slugs, anchor
