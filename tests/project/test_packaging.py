"""pyproject.toml tells the truth: runtime dependencies are what the library imports, and
every lower bound is one CI's oldest environment installs."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

import pytest

from tests.conftest import REPO

CONSTRAINTS = REPO / ".ci" / "constraints-oldest.txt"


def _project() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lower_bounds(requirements: list[str]) -> dict[str, str]:
    """`name>=1.2,<2` -> {"name": "1.2"} for each requirement with a lower bound."""
    bounds = {}
    for requirement in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*(.*)", requirement)
        assert m is not None, requirement
        lower = re.search(r">=\s*([0-9][^,;\s]*)", m.group(2))
        if lower:
            bounds[_normalised(m.group(1))] = lower.group(1)
    return bounds


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _imported_distributions() -> set[str]:
    """The distributions providing the modules `devpolicy/**/*.py` imports (stdlib left out)."""
    modules: set[str] = set()
    for path in (REPO / "devpolicy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | {"__future__", "devpolicy"}
    providers = importlib.metadata.packages_distributions()
    return {_normalised(dist) for module in modules for dist in providers.get(module, [module])}


@pytest.mark.slow
def test_runtime_dependencies_are_the_distributions_the_library_imports() -> None:
    """Each runtime dependency is imported by devpolicy, and each import is declared (jaxlib
    and pydantic-core come with jax and pydantic, each at the version its partner pins)."""
    declared = {_normalised(r) for r in _lower_bounds(_project()["dependencies"])}  # type: ignore[arg-type]
    assert _imported_distributions() - {"jaxlib", "pydantic-core"} == declared


def test_every_lower_bound_is_pinned_in_the_oldest_environment() -> None:
    """`.ci/constraints-oldest.txt` pins each dependency, each package of the `remote` extra
    and each test tool at exactly its declared lower bound, and pins nothing else: CI's
    oldest environment is the bounds we promise."""
    project = _project()
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    requirements = [
        *project["dependencies"],  # type: ignore[misc]
        *(r for r in extras["test"] if not r.startswith("devpolicy[")),
        # The docs extra too: the test extra includes it (the suite builds the site).
        *extras["docs"],
        # And the remote extra: the test extra includes it (the remote tests read URLs).
        *extras["remote"],
    ]
    assert "devpolicy[docs]" in extras["test"]
    assert "devpolicy[remote]" in extras["test"]
    declared = {name: _release(v) for name, v in _lower_bounds(requirements).items()}
    pinned = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pinned[_normalised(name)] = _release(version)
    assert pinned.pop("jaxlib") == declared["jax"]
    assert pinned == declared
