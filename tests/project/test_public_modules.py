"""What a user sees of the public surface (issue 43, N11): each public class shows the
public module it is reached by, not the private one that defines it; a moved name warns
with a warning Python shows by default, wherever the old spelling is written."""

from __future__ import annotations

import ast
import doctest
import importlib
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import devpolicy
from tests.conftest import REPO

NAMESPACES = (
    "devpolicy.errors",
    "devpolicy",
    "devpolicy.types",
    "devpolicy.sizes",
    "devpolicy.threads",
)


def _home(name: str) -> str:
    """Where a public class lives: `devpolicy.errors` for every error (the top level shares
    the four caught most), else the one namespace that lists it."""
    return next(n for n in NAMESPACES if name in importlib.import_module(n).__all__)


def _public_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type):
                found.setdefault(name, value)
    return found


PUBLIC = _public_classes()


def _defined_in() -> dict[str, str]:
    """Each public name's defining module, as `_api.py` imports it."""
    tree = ast.parse((REPO / "devpolicy" / "_api.py").read_text())
    return {
        alias.name: f"devpolicy.{node.module}"
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_public_class_shows_its_public_module(name: str) -> None:
    """`devpolicy.types.Decision` reprs as `<class 'devpolicy.types.Decision'>` (not its
    private module), and pickles by that spelling."""
    cls = PUBLIC[name]
    home = _home(name)
    assert cls.__module__ == home
    assert repr(cls) == f"<class '{home}.{name}'>"
    assert getattr(importlib.import_module(home), name) is cls
    assert pickle.loads(pickle.dumps(cls)) is cls


def test_every_public_class_s_examples_still_run() -> None:
    """A class shown under its public module is passed by when its defining module's
    doctests are collected: its examples are run here, with that module's names."""
    defined = _defined_in()
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    examples = 0
    for name, cls in sorted(PUBLIC.items()):
        module = importlib.import_module(defined[name])
        for test in finder.find(cls, name, module=False, globs=vars(module)):
            examples += len(test.examples)
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
    assert examples >= 40


@pytest.mark.slow
def test_a_moved_name_warns_with_a_futurewarning_even_from_an_imported_module(
    tmp_path: Path,
) -> None:
    """`devpolicy.Plan` written in a module the program imports: Python's default filters
    hide a DeprecationWarning there, and show this one, at that module's line."""
    (tmp_path / "old_code.py").write_text("import devpolicy\n\nPLAN = devpolicy.Plan\n")
    result = subprocess.run(
        [sys.executable, "-c", "import old_code"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    shown = [line for line in result.stderr.splitlines() if "Warning" in line]
    assert shown == [
        f"{tmp_path / 'old_code.py'}:3: FutureWarning: devpolicy.Plan is deprecated: use "
        "devpolicy.types.Plan"
    ], textwrap.indent(result.stderr, "  ")


def test_moved_names_warn_with_futurewarning() -> None:
    with pytest.warns(FutureWarning, match=r"^devpolicy\.Decision is deprecated"):
        devpolicy.Decision  # noqa: B018
