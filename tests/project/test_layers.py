"""The layers hold: imports go down (import-linter's contracts in pyproject.toml), no import
cycles, docs/development.md's map is the contracts' order and the folders' real modules, and
no module grows past about 600 lines without saying why it is one concept."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from tests.conftest import REPO

PACKAGE = REPO / "devpolicy"
DEVELOPMENT = REPO / "docs" / "development.md"
#: "about 600 lines": a module this long must say in its docstring why it is one concept.
LINE_LIMIT = 650
ONE_CONCEPT = re.compile(r"one concept", re.IGNORECASE)


def _contracts() -> list[dict[str, object]]:
    with (REPO / "pyproject.toml").open("rb") as f:
        contracts: list[dict[str, object]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contracts


def _layer_folders() -> list[str]:
    """The top-level layers, top first, as folder names (`_cli`)."""
    (layers,) = (c for c in _contracts() if c["id"] == "layers")
    return [str(name).removeprefix("devpolicy.") for name in layers["layers"]]  # type: ignore[attr-defined]


def _sub_layer_folders(folder: str) -> list[str]:
    """The sub-folders of a layer folder, top first, as its contract orders them (`_io/reading`);
    siblings of one level (`reading | writing`) in the contract's order."""
    contract = next(
        (
            c
            for c in _contracts()
            if c.get("containers") == [f"devpolicy.{folder.replace('/', '.')}"]
        ),
        None,
    )
    if contract is None:
        return []
    return [
        row
        for level in contract["layers"]  # type: ignore[attr-defined]
        for name in str(level).split("|")
        if (PACKAGE / folder / name.strip() / "__init__.py").exists()
        # A sub-folder's own sub-folders follow it (`_apply/stream/reads`).
        for row in (f"{folder}/{name.strip()}", *_sub_layer_folders(f"{folder}/{name.strip()}"))
    ]


def _page_map() -> list[tuple[str, list[str]]]:
    """(folder, modules) for each row of the page's map table, top first; a sub-folder's row
    (`_io/reading/`) follows its folder's."""
    rows = []
    for line in DEVELOPMENT.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `(_[\w/]+)/` \|.*\| (.*) \|$", line)
        if m:
            rows.append((m.group(1), re.findall(r"`(\w+)`", m.group(2))))
    return rows


def _modules_in(folder: str) -> list[str]:
    return sorted(p.stem for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__")


def test_imports_keep_every_contract_in_pyproject() -> None:
    """`lint-imports` passes: no module imports from a layer above its own, and the policy
    document and the matchers import no JAX. A broken contract fails naming the import."""
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(linter), "--no-cache"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout  # the summary line: "Contracts: N kept, 0 broken."
    assert ", 0 broken." in result.stdout


def test_the_package_has_no_import_cycle() -> None:
    """No module imports, directly or through others, a module that imports it (imports
    inside functions count: grimp reads every import statement)."""
    graph = grimp.build_graph("devpolicy")
    cycles = sorted(
        f"{importer} -> {imported}"
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported != importer
        and not graph.is_module_squashed(imported)
        and graph.chain_exists(importer=imported, imported=importer)
        and not _is_package_of(imported, importer)
        and not _is_package_of(importer, imported)
    )
    assert cycles == []


def _is_package_of(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def test_the_development_page_maps_the_layers_in_the_contracts_order() -> None:
    """docs/development.md's map lists the layer folders top first, in exactly the order the
    `layers` contract checks, so the page cannot drift from what CI enforces."""
    folders = [folder for folder, _ in _page_map()]
    assert folders == [
        row
        for f in _layer_folders()
        if not f.endswith("_api")
        for row in (f, *_sub_layer_folders(f))
    ]


def test_the_development_page_names_every_module_of_each_folder() -> None:
    """Each row of the map names exactly the modules its folder holds."""
    assert {folder: sorted(modules) for folder, modules in _page_map()} == {
        folder: _modules_in(folder) for folder, _ in _page_map()
    }


def test_every_folder_of_the_package_is_a_layer() -> None:
    """No folder of the package sits outside the contracts (a new folder must be placed)."""
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == {f for f in _layer_folders() if not f.endswith("_api")}
    sub_folders = {
        str(p.parent.relative_to(PACKAGE))
        for p in PACKAGE.glob("*/**/__init__.py")
        if p.parent.parent != PACKAGE
    }
    assert sub_folders == {s for f in folders for s in _sub_layer_folders(f)}


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")), ids=str
)
def test_a_long_module_says_why_it_is_one_concept(module: str) -> None:
    """A module over about 600 lines says in its docstring why it is one concept that cannot
    be cut; size is a signal that a file does several jobs."""
    text = (REPO / module).read_text(encoding="utf-8")
    lines = text.count("\n")
    if lines <= LINE_LIMIT:
        return
    docstring = ast.get_docstring(ast.parse(text)) or ""
    assert ONE_CONCEPT.search(docstring), f"{module}: {lines} lines, and no 'one concept' why"


def test_each_module_of_the_stream_wing_has_a_test_file_of_its_own() -> None:
    """The tests mirror the wing: `tests/apply/stream/test_<module>.py` for each module of
    `devpolicy/_apply/stream/`, so a change to one part is tested where it is."""
    wing = PACKAGE / "_apply" / "stream"
    tests = REPO / "tests" / "apply" / "stream"
    missing = [
        module.stem
        for module in sorted(wing.glob("*.py"))
        if module.stem != "__init__" and not (tests / f"test_{module.stem}.py").is_file()
    ]
    assert missing == []
