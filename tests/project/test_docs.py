"""Docstring examples run, the README's commands and references stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import devpolicy
from tests.conftest import REPO

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(devpolicy.__path__, "devpolicy.")
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

    def test_the_demo_installs_the_package_alone(self) -> None:
        """The demo's command installs devpolicy and nothing else (no extra: the test
        servers and the docs toolchain are about 100 packages); the test command installs
        the test extra itself."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        block = re.search(r"## Quick start\n.*?```(?:bash|sh)?\n(.*?)```", readme, re.S)
        assert block is not None
        demo, tests = [line.strip() for line in block.group(1).splitlines() if line.strip()]
        assert demo == "pip install -e . && python examples/dataset_on_host.py"
        assert tests == 'pip install -e ".[test]" && python -m pytest'

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
        """The docs' environment reference (Policies, Environment overrides) names every
        DEVPOLICY_* variable."""
        from devpolicy._document.environment import VARIABLES

        page = (REPO / "docs" / "policies.md").read_text(encoding="utf-8")
        section = re.search(r"^## Environment overrides\n(.*?)(?=^## |\Z)", page, re.S | re.M)
        assert section is not None, "docs/policies.md has no Environment overrides section"
        for variable in VARIABLES:
            assert f"`{variable}`" in section.group(1), variable

    def test_readme_is_the_short_front_door(self) -> None:
        """The README stays under 200 lines; the rest lives in docs/."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        assert len(readme.splitlines()) < 200


def _slugs(markdown: str) -> set[str]:
    """Anchors of a page's headings, as GitHub and mkdocs' toc make them (ASCII headings)."""
    headings = re.findall(r"^#+ (.+)$", _without_fences(markdown), re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _without_fences(markdown: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a block is no heading)."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


class TestReadmeLinks:
    def test_every_internal_link_has_a_heading(self) -> None:
        """Links like [x](#quick-start) point at a section of the README that exists."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        slugs = _slugs(readme)
        for anchor in re.findall(r"\]\(#([^)]+)\)", readme):
            assert anchor in slugs, anchor

    def test_every_link_into_the_docs_resolves(self) -> None:
        """Relative links like [x](docs/loading.md#64-bit-data) name a file that exists
        and, with an anchor, a heading of that page."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        links = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)(?:#([^)\s]+))?\)", readme)
        pages = {path for path, _ in links if path.startswith("docs/")}
        assert len(pages) >= 10, f"the README links to only {sorted(pages)}"
        for path, anchor in links:
            target = REPO / path
            assert target.is_file(), path
            if anchor:
                assert anchor in _slugs(target.read_text(encoding="utf-8")), f"{path}#{anchor}"

    def test_every_docs_page_is_linked_from_the_readme(self) -> None:
        """The README's list reaches every page of the site."""
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        for page in sorted((REPO / "docs").glob("*.md")):
            assert f"(docs/{page.name}" in readme, page.name


#: Pages whose prose a reader copies from: the README and every page of the site.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
KINDS = ("match", "regex", "search", "file")
#: "`search: a/(b|c)` takes `x/a/b`", "`match: m/*` does not take `p/m/w`".
_CLAIM = re.compile("`(" + "|".join(KINDS) + r"): ([^`]+)`\s+(takes|does\s+not\s+take)\s+`([^`]+)`")
#: A pattern said to take or match a name without saying which kind of pattern it is.
_UNSAID = re.compile(r"`([^`:]+)`\s+(takes|matches|does\s+not\s+(?:take|match))\s+`([^`]+)`")


def _prose(path: Path) -> str:
    """The text of a page outside fenced code blocks (where the claims are made)."""
    text = _without_fences(path.read_text(encoding="utf-8"))
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)  # markers for the tests, not shown


def _claims() -> list[tuple[str, str, str, bool, str]]:
    """(page, kind, pattern, takes, name) for each claim the pages make about a pattern."""
    return [
        (path.name, kind, pattern, verb == "takes", name)
        for path in PAGES
        for kind, pattern, verb, name in _CLAIM.findall(_prose(path))
    ]


class TestPatternsShown:
    """A pattern a page shows is copy-pasteable, and takes the names the page says."""

    def test_the_pages_make_claims_of_every_kind(self) -> None:
        """The parser finds the claims (a broken one would make the next test vacuous)."""
        kinds = {kind for _, kind, _, _, _ in _claims()}
        assert kinds == set(KINDS), kinds
        assert {takes for *_, takes, _ in _claims()} == {True, False}

    @pytest.mark.parametrize(
        ("page", "kind", "pattern", "takes", "name"),
        _claims(),
        ids=lambda v: v if isinstance(v, str) else "",
    )
    def test_each_pattern_takes_the_names_its_page_says(
        self, page: str, kind: str, pattern: str, takes: bool, name: str
    ) -> None:
        """`KIND: PATTERN` written into a rule, as pasted from the page, takes NAME (or
        not, as the page says): a file glob judged on a tensor loaded from NAME."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:0", "rules": [{kind: pattern, "device": "cpu:1"}]},
            environ={},
        )
        # A file glob is judged on a tensor loaded from NAME; the others on NAME itself.
        decision = policy.decide("tokens", file=name) if kind == "file" else policy.decide(name)
        assert (decision.rule == 0) is takes, f"{page}: `{kind}: {pattern}` and {name!r}"

    def test_every_pattern_said_to_take_a_name_says_its_kind(self) -> None:
        """ "`X` takes `Y`" without `match:`, `regex:`, `search:` or `file:` cannot be
        checked (a glob and a regex read the same text differently): say which."""
        for path in PAGES:
            for pattern, verb, name in _UNSAID.findall(_prose(path)):
                pytest.fail(
                    f"{path.name}: `{pattern}` {verb} `{name}`: write `match: {pattern}` "
                    "(or regex:, search:, file:) so the docs tests can check it",
                    pytrace=False,
                )

    def test_no_code_in_a_table_holds_a_pipe(self) -> None:
        """A `|` in a table cell's code: GitHub splits the cell there, and escaped (`\\|`)
        mkdocs shows the backslash, so a pasted pattern never matches. Such patterns are
        written outside tables."""
        for path in PAGES:
            for line in _prose(path).splitlines():
                if not line.lstrip().startswith("|"):
                    continue
                assert "\\|" not in line, f"{path.name}: an escaped pipe in a table: {line}"
                for span in re.findall(r"`([^`]*)`", line):
                    assert "|" not in span, f"{path.name}: a table cell's code holds a pipe"

    def test_powers_are_code_not_bold(self) -> None:
        """`2**31 ... 2**31` outside code renders as 2, a bold "31 ... 2" and 31 (the two
        `**` pair up): powers in prose are code spans. (A lone `**` in a paragraph pairs
        with nothing and renders as written.)"""
        for path in PAGES:
            prose = re.sub(r"`[^`]*`", "", _prose(path))
            for paragraph in re.split(r"\n\s*\n|\n(?=\s*\|)", prose):
                if paragraph.count("**") < 2:
                    continue
                found = re.findall(r".{0,30}\d\*\*\d.{0,30}", paragraph)
                assert not found, f"{path.name}: a power outside code: {found}"
