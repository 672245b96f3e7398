"""The documentation site builds strictly, every code block in it runs, and its links resolve.

The site is built with `mkdocs build --strict` (the `docs` extra). Code blocks are run in a
small project like the one a reader has after Getting started: the story's policy as
`devpolicy.yaml`, an aligned `train.safetensors` of 2**31 + 2**20 uint16 tokens (sparse on
disk, so windows past 2**31 are real), a `model.safetensors`, and `policies/` and
`examples/` as in this repository. Per page, `python` blocks run in order in one process
(four CPU devices, as in the test suite), after a prelude that stands in for the reader's
own training code (`train_step`, `init_params`); `yaml` blocks load with
`devpolicy.load_policy` (a fragment without `version:` as part of a policy); `bash` blocks
run in `bash -eo pipefail` with this environment's `python` and `devpolicy` first on PATH.
Markers, an HTML comment on the line before a block:

- `<!-- not-run: why -->`: the block cannot run here (it installs packages, or needs a
  second process); kept to a few.
- `<!-- save-as: NAME -->`: the block is also written to NAME in the project before the
  page's blocks run (a policy the page's code loads).
- `<!-- exit: N -->`: the bash block's expected exit status (default 0).
- `<!-- invalid: why -->`: the yaml block is an example of a bad policy: it must raise
  `PolicyError`.
- `<!-- output: above -->` on a shown (text) block: it is what the nearest runnable block
  above it prints (stdout, then stderr); `<!-- output: bash: COMMAND -->`: what COMMAND
  prints, run in the project like a bash block. Each shown line must be a line of the real
  output, in order (an excerpt may leave lines out, never change one), after both are
  normalised: timestamps dropped, the project's directory shown as `/home/me/project`,
  temporary directories as `/tmp/<tmp>`, free memory (`22.4 GiB free`, a table's `free`
  column) and `seconds=` as placeholders, an event's `key='quoted value'` unquoted, a
  CPU's memory kinds as one placeholder, table borders and runs of spaces as one space.
  So a drift between a page and what the code prints fails here.
- `<!-- shown: why -->` on a shown block that is not compared (a synopsis, an excerpt of
  a run that needs another machine); kept to a few.
- `<!-- needs: flax, optax -->` on a python block: the packages it imports that
  `pip install -e .` does not install (the page then says so); a block without it imports
  only the standard library, devpolicy and devpolicy's own dependencies.
"""

from __future__ import annotations

import ast
import difflib
import functools
import html
import html.parser
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from tests.conftest import REPO
from tests.helpers import sparse_tensor_file

DOCS = REPO / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
#: Languages a block may have: the first three run, the others are output or data.
RUN_LANGUAGES = ("python", "yaml", "bash")
SHOWN_LANGUAGES = ("text", "json", "")
#: Blocks that may not run here; each says why. Kept to a few (the sixth: the Loading
#: page's token file read from the Hub, whose steps tests/io/remote run against a local Hub).
MAX_NOT_RUN = 6
TOKENS = 2**31 + 2**20

PRELUDE = '''
import numpy as np


def train_step(params, batch):
    """Stands in for the reader's training step."""
    return 0.0


def init_params():
    """Stands in for the reader's model initialisation."""
    return {"w": np.ones((16, 16), np.float32), "b": np.zeros(16, np.float32)}
'''

#: Printed to stdout and stderr before each block, so each block's own output is known.
SEPARATOR = "\x1e-- block "

RUNNER = f"""
import json, sys
ns = {{"__name__": "__main__"}}
exec(compile(sys.argv[2], "<prelude>", "exec"), ns)
for block in json.loads(open(sys.argv[1], encoding="utf-8").read()):
    for stream in (sys.stdout, sys.stderr):
        print({SEPARATOR!r} + block["where"], file=stream, flush=True)
    exec(compile(block["code"], block["where"], "exec"), ns)
"""


def require_mkdocs() -> None:
    """The docs tests need the `docs` extra; without it they fail, saying how to install it."""
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:
        pytest.fail(
            f"the documentation tests need the docs extra ({e}): pip install -e '.[test]' (it includes the docs extra)",
            pytrace=False,
        )


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    marker: dict[str, str]

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


_FENCE = re.compile(r"^(\s*)(```+)([\w-]*)\s*$")
_MARKER = re.compile(r"^\s*<!-- ([a-z-]+): (.+?) -->\s*$")


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page (indented ones in lists too), each with its markers."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, language = opening.groups()
        marker: dict[str, str] = {}
        j = i - 1
        while j >= 0 and (m := _MARKER.match(lines[j])):
            marker[m.group(1)] = m.group(2)
            j -= 1
        body: list[str] = []
        i += 1
        while not (lines[i].strip() == fence and lines[i].startswith(indent)):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        found.append(Block(page, i - len(body), language, "\n".join(body) + "\n", marker))
        i += 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


def runnable(language: str) -> list[Block]:
    return [b for b in ALL_BLOCKS if b.language == language and "not-run" not in b.marker]


def shown_source(block: Block) -> Block | None:
    """For a shown block marked `output: above`, the runnable block it shows the output
    of: the nearest python or bash block above it on its page."""
    if block.marker.get("output") != "above":
        return None
    above = [
        b
        for b in ALL_BLOCKS
        if b.page == block.page
        and b.line < block.line
        and b.language in ("python", "bash")
        and "not-run" not in b.marker
    ]
    assert above, f"{block.where}: output: above, but no runnable block is above it"
    return above[-1]


def shown_by(source: Block) -> list[Block]:
    """The shown blocks that show `source`'s output."""
    return [b for b in ALL_BLOCKS if shown_source(b) == source]


#: Shown blocks on pages this suite may not mark, each with why it is not compared.
UNMARKED = {
    "trust.md": "the refusal of a policy another account owns: needs a second user",
}
#: Shown blocks not compared (`shown: why`), kept to a few.
MAX_NOT_COMPARED = 5

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z? ?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SIZE = r"\d[\d,]*(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)"
# structlog's console renderer quotes a value with spaces (`found='a b'`) in its newer
# releases and not in the oldest we support (`found=a b`): compared without the quotes
# (double quotes where the value holds a single quote: `note="pip install 'x'"`).
_QUOTED_VALUE = re.compile(r"='([^'\n]*)'" + r'|="([^"\n]*)"')
# A CPU device's memory kinds: `device, pinned_host, unpinned_host` in newer JAX, only
# `unpinned_host` in the oldest we support.
_CPU_MEMORY_KINDS = re.compile(r"\b(?:device, )?(?:pinned_host, )?unpinned_host\b")
_BORDERS = re.compile(r"[\s\u2500-\u257f]+")  # box drawing, and spaces


def normalised(text: str, project: Path | None = None) -> list[str]:
    """The lines of `text` as compared: see the module's docstring."""
    if project is not None:
        text = text.replace(str(project), "/home/me/project")
    text = re.sub(r"/tmp/tmp[\w-]+", "/tmp/<tmp>", _ANSI.sub("", text))
    lines: list[str] = []
    free_column: int | None = None
    for raw in text.splitlines():
        line = _TIMESTAMP.sub("", raw)
        line = re.sub(rf"{_SIZE} free", "<free> free", line)
        line = re.sub(r"seconds=[\d.]+", "seconds=<s>", line)
        # A stream's loop, timed: its figures are this run's.
        line = re.sub(r"\b(batches_per_s|waited_s|waited_share|working_s)=\S+", r"\1=<t>", line)
        line = _QUOTED_VALUE.sub(lambda m: "=" + (m[1] if m[1] is not None else m[2]), line)
        line = _CPU_MEMORY_KINDS.sub("<memory kinds>", line)
        if "\u2503" in line:  # a rich table's header row: where its `free` column is
            cells = [c.strip() for c in line.split("\u2503")]
            free_column = cells.index("free") if "free" in cells else None
        elif "\u2502" in line and free_column is not None:
            cells = line.split("\u2502")
            if free_column < len(cells):
                cells[free_column] = re.sub(_SIZE, "<free>", cells[free_column])
            line = "\u2502".join(cells)
        elif "\u2502" not in line and "\u2500" not in line and "\u2501" not in line:
            free_column = None
        line = _BORDERS.sub(" ", line).strip()
        if line and line != "..." and not line.startswith(">>> "):  # >>>: the input
            lines.append(line)
    return lines


def assert_shows(shown: Block, project: Path | None, *streams: str) -> None:
    """Every line of `shown` is a line of one of `streams` (stdout, stderr), in order
    within its stream, once all are normalised: how the two interleave is not known."""
    real = [normalised(stream, project) for stream in streams]
    positions = [0] * len(real)
    for line in normalised(shown.code):
        for i, lines in enumerate(real):
            if line in lines[positions[i] :]:
                positions[i] = lines.index(line, positions[i]) + 1
                break
        else:
            every = [x for lines in real for x in lines]
            near = difflib.get_close_matches(line, every, n=1, cutoff=0.5)
            pytest.fail(
                f"{shown.where}: this shown line is not in the real output"
                f"{' (in order)' if line in every else ''}:\n  shown: {line}\n"
                f"  real:  {near[0] if near else '(nothing close)'}\n"
                f"the real output, normalised:\n" + "\n".join(every)[-6000:],
                pytrace=False,
            )


def block_outputs(stdout: str, stderr: str) -> dict[str, tuple[str, str]]:
    """Each block's own (stdout, stderr) in a run of RUNNER, by its `where`."""
    parts: dict[str, list[str]] = {}
    for stream in (stdout, stderr):
        for chunk in stream.split(SEPARATOR)[1:]:
            where, _, text = chunk.partition("\n")
            parts.setdefault(where, []).append(text)
    return {where: (texts[0], texts[-1]) for where, texts in parts.items() if len(texts) == 2}


def make_project(path: Path, page: str | None = None) -> Path:
    """The project a reader has after Getting started, plus the files `page` saves."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text('[project]\nname = "demo"\n', encoding="utf-8")
    shutil.copytree(REPO / "policies", path / "policies")
    shutil.copytree(REPO / "examples", path / "examples")
    sparse_tensor_file(path / "train.safetensors", TOKENS)
    rng = np.random.default_rng(0)
    devpolicy.save_file(
        {
            "embed": rng.normal(size=(512, 16)).astype(np.float32),
            "out": rng.normal(size=(16,)).astype(np.float32),
        },
        path / "model.safetensors",
    )
    for block in [b for b in ALL_BLOCKS if "save-as" in b.marker and b.page in ("index.md", page)]:
        (path / block.marker["save-as"]).write_text(block.code, encoding="utf-8")
    return path


def block_env(*, cpu_devices: int | None) -> dict[str, str]:
    """This environment without devpolicy's or JAX's settings; the venv's scripts first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DEVPOLICY_", "JAX_", "XLA_", "CUDA_VISIBLE"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if cpu_devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cpu_devices}"
    return env


def _distribution(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503: `PyYAML` is `pyyaml`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def quick_start_modules() -> frozenset[str]:
    """The top-level modules a reader has after the quick start's `pip install -e .`: the
    standard library, devpolicy and the distributions pyproject.toml lists as devpolicy's
    own dependencies (not an extra's, not one installed only as a dependency's)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = {
        _distribution(m[0]) for d in project["dependencies"] if (m := re.match(r"[\w.-]+", d))
    }
    installed = importlib.metadata.packages_distributions()
    return frozenset(
        {
            *sys.stdlib_module_names,
            "devpolicy",
            *(
                module
                for module, dists in installed.items()
                if any(_distribution(d) in wanted for d in dists)
            ),
        }
    )


def imported_modules(code: str) -> set[str]:
    """The top-level modules a python block imports (`from safetensors import x`: safetensors)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


class TestBlocks:
    def test_every_block_runs_or_says_why_not(self) -> None:
        """Each block is python, yaml or bash (run) or text/json (shown); a block that
        cannot run says why, and such blocks stay few."""
        for block in ALL_BLOCKS:
            assert block.language in RUN_LANGUAGES + SHOWN_LANGUAGES, (
                f"{block.where}: block language {block.language!r}; "
                f"use one of {RUN_LANGUAGES + SHOWN_LANGUAGES}"
            )
            if "not-run" in block.marker:
                assert block.language in RUN_LANGUAGES, f"{block.where}: not-run on shown text"
                assert len(block.marker["not-run"]) > 10, f"{block.where}: say why it cannot run"
        not_run = [b.where for b in ALL_BLOCKS if "not-run" in b.marker]
        assert len(not_run) <= MAX_NOT_RUN, not_run

    def test_the_pages_have_code_of_each_kind(self) -> None:
        """The parser finds the blocks (a broken parser would make every run test vacuous)."""
        assert len(runnable("python")) >= 6
        assert len(runnable("yaml")) >= 4
        assert len(runnable("bash")) >= 8

    @pytest.mark.parametrize("block", runnable("yaml"), ids=lambda b: b.where)
    def test_yaml_block_is_a_valid_policy(self, block: Block, tmp_path: Path) -> None:
        """Every YAML block loads as a policy (a fragment as part of one); one marked
        `invalid` raises PolicyError."""
        text = (
            block.code if re.search(r"^version:", block.code, re.M) else "version: 1\n" + block.code
        )
        path = tmp_path / "policy.yaml"
        path.write_text(text, encoding="utf-8")
        if "invalid" in block.marker:  # an example of the errors: it must be one
            with pytest.raises(devpolicy.PolicyError):
                devpolicy.load_policy(path, environ={})
            return
        devpolicy.load_policy(path, environ={})

    @pytest.mark.parametrize("block", runnable("python"), ids=lambda b: b.where)
    def test_python_block_imports_only_what_the_quick_start_installs(self, block: Block) -> None:
        """A reader who ran `pip install -e .` can run every python block, or the block says
        which other packages it needs (`needs:`) and names only those."""
        needs = {m.strip() for m in block.marker.get("needs", "").split(",") if m.strip()}
        missing = imported_modules(block.code) - quick_start_modules() - needs
        assert not missing, (
            f"{block.where}: imports {sorted(missing)}, which `pip install -e .` does not "
            "install; use devpolicy's own call, or mark the block `<!-- needs: ... -->` and "
            "say on the page how to install it"
        )
        unused = needs - imported_modules(block.code)
        assert not unused, f"{block.where}: `needs:` names {sorted(unused)}, not imported"

    @pytest.mark.slow
    @pytest.mark.parametrize("page", sorted({b.page for b in runnable("python")}), ids=lambda p: p)
    def test_python_blocks_of_page_run(self, page: str, tmp_path: Path) -> None:
        """A page's python blocks run in order, in one process, in the reader's project."""
        project = make_project(tmp_path / "project", page)
        code = [{"code": b.code, "where": b.where} for b in runnable("python") if b.page == page]
        (tmp_path / "blocks.json").write_text(json.dumps(code), encoding="utf-8")
        result = subprocess.run(
            [sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json"), PRELUDE],
            cwd=project,
            env=block_env(cpu_devices=4),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-6000:]
        outputs = block_outputs(result.stdout, result.stderr)
        for block in runnable("python"):
            for shown in shown_by(block) if block.page == page else []:
                assert_shows(shown, project, *outputs.get(block.where, ("", "")))

    @pytest.mark.slow
    @pytest.mark.parametrize("block", runnable("bash"), ids=lambda b: b.where)
    def test_bash_block_runs(self, block: Block, tmp_path: Path) -> None:
        """Every shell block (devpolicy's commands, the demo) exits as the page says."""
        project = make_project(tmp_path / "project", block.page)
        result = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", block.code],
            cwd=project,
            env=block_env(cpu_devices=None),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        expected = int(block.marker.get("exit", "0"))
        assert result.returncode == expected, (
            f"{block.where}: exit {result.returncode}, expected {expected}\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        for shown in shown_by(block):
            assert_shows(shown, project, result.stdout, result.stderr)


SHOWN_COMMANDS = [b for b in ALL_BLOCKS if b.marker.get("output", "").startswith("bash: ")]


class TestShownOutput:
    def test_every_shown_output_is_compared_or_says_why_not(self) -> None:
        """Each text block is the output of a block or command, compared when the pages'
        code runs (`output:`), or says why it is not (`shown:`); those stay few."""
        not_compared = []
        for block in ALL_BLOCKS:
            if block.language not in SHOWN_LANGUAGES or block.page in UNMARKED:
                continue
            if "save-as" in block.marker:  # a file the page's commands read: input, not output
                continue
            assert "output" in block.marker or "shown" in block.marker, (
                f"{block.where}: a shown block says what it is the output of "
                "(<!-- output: above --> or <!-- output: bash: COMMAND -->) or why it is "
                "not compared (<!-- shown: why -->)"
            )
            if "output" in block.marker:
                assert block.marker["output"] == "above" or block.marker["output"].startswith(
                    "bash: "
                ), f"{block.where}: output: {block.marker['output']!r}"
                shown_source(block)
            else:
                assert len(block.marker["shown"]) > 10, f"{block.where}: say why"
                not_compared.append(block.where)
        assert len(not_compared) <= MAX_NOT_COMPARED, not_compared

    def test_a_changed_line_is_caught(self) -> None:
        """The comparison is not vacuous: a shown line the output lacks fails, an excerpt
        and a different free memory, time or table width pass."""
        real = (
            "2026-12-01T22:27:25.334369Z [info     ] runtime   a=1 process_index=0\n"
            "cpu:0: 1 array; 16.0 GiB free (host RAM)\n"
            "\u2503 device \u2503 free     \u2503\n\u2502 cpu:0  \u2502 16.0 GiB \u2502\n"
        )
        ok = (
            "[info ] runtime a=1 process_index=0\ncpu:0: 1 array; 21.9 GiB free (host RAM)\n"
            "\u2503 device \u2503 free \u2503\n\u2502 cpu:0 \u2502 2.0 GiB \u2502\n"
        )
        assert_shows(Block("x.md", 1, "text", ok, {}), None, real)
        assert_shows(
            Block("x.md", 1, "text", "cpu:0: 1 array; 9.9 GiB free (host RAM)\n", {}), None, real
        )
        # A line of stderr shown before one of stdout: how the streams interleave is unknown.
        assert_shows(
            Block("x.md", 1, "text", "warning\nresult\n", {}), None, "result\n", "warning\n"
        )
        with pytest.raises(pytest.fail.Exception, match="not in the real output"):
            assert_shows(Block("x.md", 1, "text", "[info ] runtime a=1\n", {}), None, real)

    @pytest.mark.slow
    @pytest.mark.parametrize("shown", SHOWN_COMMANDS, ids=lambda b: b.where)
    def test_shown_output_is_what_its_command_prints(self, shown: Block, tmp_path: Path) -> None:
        """A shown block marked `output: bash: COMMAND` is what COMMAND prints in the
        reader's project, normalised."""
        project = make_project(tmp_path / "project", shown.page)
        command = shown.marker["output"].removeprefix("bash: ")
        result = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", command],
            cwd=project,
            env=block_env(cpu_devices=None),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert_shows(shown, project, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with `mkdocs build --strict` (warnings are errors)."""
    require_mkdocs()
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site served on 127.0.0.1 at an ephemeral port; yields its base URL."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Links(html.parser.HTMLParser):
    """The ids of a page and the URLs it links to or loads."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"] or "")
        for attribute in ("href", "src"):
            value = found.get(attribute)
            if value and not (tag == "link" and found.get("rel") in ("canonical",)):
                self.links.append(value)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


def page_url(base: str, page: str) -> str:
    """Where mkdocs puts a page (directory URLs): `policies.md` -> `<base>policies/`."""
    return base if page == "index.md" else f"{base}{page.removesuffix('.md')}/"


def crawl(base: str) -> tuple[dict[str, _Links], list[str]]:
    """Every HTML page reachable from the home page; the other internal URLs it found."""
    pages: dict[str, _Links] = {}
    assets: set[str] = set()
    todo = [base]
    while todo:
        url = todo.pop()
        if url in pages:
            continue
        parsed = _Links()
        parsed.feed(fetch(url).decode("utf-8"))
        pages[url] = parsed
        for link in parsed.links:
            target = urllib.parse.urljoin(url, link)
            if not target.startswith(base):
                continue
            target = urllib.parse.urldefrag(target).url
            if target.endswith(("/", ".html")):
                todo.append(target)
            else:
                assets.add(target)
    return pages, sorted(assets)


@pytest.mark.slow  # builds and serves the site with mkdocs
class TestSite:
    def test_the_site_builds_strictly(self, site: Path) -> None:
        """`mkdocs build --strict` makes one HTML page per Markdown page."""
        for page in PAGES:
            built = site / ("index.html" if page == "index.md" else f"{page[:-3]}/index.html")
            assert built.is_file(), page

    def test_every_internal_link_and_anchor_resolves(self, served: str) -> None:
        """Served over HTTP, every internal link (pages, anchors, styles, scripts) resolves,
        and every page of the docs is reachable from the home page."""
        pages, assets = crawl(served)
        for page in PAGES:
            assert page_url(served, page) in pages, f"{page} is not linked from the site"
        for url, parsed in pages.items():
            for link in parsed.links:
                target = urllib.parse.urljoin(url, link)
                if not target.startswith(served):
                    continue
                where, fragment = urllib.parse.urldefrag(target)
                if fragment:
                    assert where in pages, f"{url}: {link} points into a page that is not HTML"
                    assert urllib.parse.unquote(fragment) in pages[where].ids, (
                        f"{url}: {link}: no id {fragment!r} on {where}"
                    )
        for asset in assets:
            try:
                fetch(asset)
            except urllib.error.HTTPError as e:
                pytest.fail(f"{asset}: {e}")

    def test_the_search_index_lists_every_page(self, served: str) -> None:
        """search/search_index.json has an entry for every page, with its text."""
        index = json.loads(fetch(served + "search/search_index.json"))
        locations = {doc["location"] for doc in index["docs"]}
        for page in PAGES:
            location = "" if page == "index.md" else f"{page[:-3]}/"
            assert location in locations, f"{page} is not in the search index"
        texts = " ".join(doc["text"] for doc in index["docs"])
        assert "host_view" in texts
        assert "RESOURCE_EXHAUSTED" in texts


@pytest.mark.slow  # builds the site with mkdocs, as TestSite does
class TestApiReference:
    def test_every_public_name_is_documented_with_its_example(self, site: Path) -> None:
        """Each name of devpolicy.__all__ has its own entry on the API page, and an entry
        whose docstring has an example shows it as code."""
        page = (site / "api" / "index.html").read_text(encoding="utf-8")
        assert "devpolicy.__version__" in page
        starts = {}
        for name in devpolicy.__all__:
            if name == "__version__":
                continue
            found = page.find(f'id="devpolicy.{name}"')
            assert found >= 0, f"devpolicy.{name} is not in the API reference"
            starts[name] = found
        ordered = [*sorted(starts.values()), len(page)]
        for name, start in starts.items():
            entry = page[start : ordered[ordered.index(start) + 1]]
            if ">>>" in (getattr(devpolicy, name).__doc__ or ""):
                assert '<span class="gp">&gt;&gt;&gt; </span>' in entry, (
                    f"devpolicy.{name}: its example is not rendered as code"
                )

    def test_signatures_are_wrapped_to_the_page_and_overloads_differ(self, site: Path) -> None:
        """Each signature is formatted to mkdocs.yml's `line_length` (ruff, from the docs
        extra, wraps it a parameter a line), so none runs off the page; the overloads of a
        function (`load_file` with and without `into=`) show different signatures."""
        config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
        found = re.search(r"^\s*line_length: (\d+)", config, re.M)
        assert found is not None, "mkdocs.yml sets no line_length"
        width = int(found.group(1))
        page = (site / "api" / "index.html").read_text(encoding="utf-8")
        signatures = [
            html.unescape(re.sub(r"<[^>]+>", "", block))
            for block in re.findall(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', page, re.S)
        ]
        assert len(signatures) >= len(devpolicy.__all__) // 2
        for signature in signatures:
            longest = max(signature.splitlines(), key=len)
            assert len(longest) <= width, (
                f"a signature line of {len(longest)} characters (over {width}): {longest!r}; "
                "is ruff installed (the docs extra) to format them?"
            )
        load_file = [s for s in signatures if s.startswith("load_file(")]
        assert len(load_file) >= 2
        assert len(set(load_file)) == len(load_file)
        assert any("into: T" in s for s in load_file)
        assert any("into: None" in s for s in load_file)

    def test_no_page_renders_a_power_as_bold(self, site: Path) -> None:
        """`2**31` written outside code (a page or a docstring) would render as 2 and a
        bold 31: none does."""
        for built in sorted(site.rglob("*.html")):
            text = built.read_text(encoding="utf-8")
            assert not re.search(r"\d<strong>\d", text), built.relative_to(site)
