"""The benchmark scripts refuse numbers they cannot use, saying which option and why; their
results hold figures and relative names, not the measuring machine's paths; they share one
`benchmarks/_common.py` (which takes nothing from the tests) and each runs at its smallest
size."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import benchmarks._common as common
from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
COMMON = BENCHMARKS / "_common.py"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p != COMMON)
WINDOWS = BENCHMARKS / "bench_windows.py"

#: Every count at its smallest, so that a check that lets a bad number through costs seconds,
#: not the story's 19 GiB run (the option under test comes after these: argparse keeps it).
SMALLEST = (
    *("--tokens", "4096", "--steps", "1", "--length", "1", "--batch", "1"),
    *("--runs", "1", "--paired-steps", "1", "--paired-rounds", "1", "--variants", "file"),
)


@functools.cache
def script(path: Path) -> ModuleType:
    """A benchmark script imported as a module, once (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What `bench_windows.py`'s command line says, refusing `ARGV` after the smallest counts."""
    with pytest.raises(SystemExit) as exited:
        script(WINDOWS).parse_args([*SMALLEST, *argv])
    assert exited.value.code == 2
    return capsys.readouterr().err


def run_script(name: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`benchmarks/NAME ARGV...` from the checkout, without a shell's policy or XLA flags."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_"))}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        check=False,
    )


def bench_windows(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`benchmarks/bench_windows.py` with the smallest counts, then ARGV, from the checkout."""
    return run_script(WINDOWS.name, "--dir", str(tmp), *SMALLEST, *argv)


class TestBenchWindowsArguments:
    @pytest.mark.parametrize(
        ("argv", "says"),
        [
            (["--paired-rounds", "0"], "argument --paired-rounds: must be at least 1, got 0"),
            (["--paired-steps", "0"], "argument --paired-steps: must be at least 1, got 0"),
            (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
            (["--runs", "0"], "argument --runs: must be at least 1, got 0"),
            (["--length", "-3"], "argument --length: must be at least 1, got -3"),
            (["--batch", "0"], "argument --batch: must be at least 1, got 0"),
            (["--tokens", "0"], "argument --tokens: must be at least 1, got 0"),
            (["--runs", "two"], "argument --runs: must be a whole number, got 'two'"),
        ],
    )
    def test_bench_windows_rejects_a_number_below_its_range_naming_the_option(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
    ) -> None:
        """A number the run cannot use is an argparse error at the start, not a traceback
        after minutes of work (`--paired-rounds 0` ended in `StatisticsError`)."""
        assert says in refusal(capsys, *argv)

    def test_bench_windows_rejects_windows_longer_than_the_tokens(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No window of `--length` tokens fits in fewer tokens: said before any file is written."""
        said = refusal(capsys, "--tokens", "100", "--length", "101")
        assert "--length (101) must be at most --tokens (100)" in said

    def test_bench_windows_rejects_an_unknown_variant_naming_the_choices(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A misspelt variant is refused, with the variants there are, not silently skipped."""
        said = refusal(capsys, "--variants", "file,defualts")
        assert (
            "argument --variants: unknown variant 'defualts'; choose from "
            "defaults, random-only, mapping, budget, keep, file, devpolicy" in said
        )

    def test_bench_windows_rejects_no_variant_at_all(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An empty `--variants` would make an empty table: refused, naming the choices."""
        said = refusal(capsys, "--variants", ",")
        assert "argument --variants: name at least one of defaults, random-only" in said

    @pytest.mark.slow
    def test_bench_windows_runs_with_every_count_at_its_smallest(self, tmp_path: Path) -> None:
        """The smallest accepted numbers make a report, with one variant that is not
        `devpolicy` (its table's columns came from the `devpolicy` variant's samples)."""
        result = bench_windows(tmp_path)
        assert result.returncode == 0, result.stderr
        assert "| read from the file by position |" in result.stdout
        assert "| each group's pages given back |" in result.stdout


class TestBenchLoopArguments:
    @pytest.mark.slow
    @pytest.mark.parametrize(
        ("argv", "said"),
        [
            (["--depth", "0"], "--depth is the reads in flight by hand, at least 1, got 0"),
            (["--cold"], "--cold, --sparse and --keep describe the --mapped file"),
        ],
        ids=["no reads in flight", "cold without a file"],
    )
    def test_bench_loop_refuses_before_it_writes_a_token_file(
        self, argv: list[str], said: str, tmp_path: Path
    ) -> None:
        """A bad option is refused by name (exit 2) before the dense file is written."""
        mapped = [] if argv == ["--cold"] else ["--mapped", str(tmp_path / "tokens")]
        result = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_loop.py"), *mapped, *argv],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
            check=False,
        )
        assert result.returncode == 2
        assert said in result.stderr
        assert not (tmp_path / "tokens").exists()


#: The folders a machine keeps its users', installs' and temporary files in: an absolute
#: path under one of them names the machine a result was measured on, not the result.
MACHINE_ROOTS = (
    "tmp",
    "var",
    "private",
    "home",
    "root",
    "work",
    "Users",
    "opt",
    "mnt",
    "media",
    "srv",
    "scratch",
    "usr",
    "nix",
)
#: An absolute path under one of them, not inside a URL or a longer name (`/proc/self/...`,
#: `/dev/...`, `/sys/...` and a tensor's `/mlp/wo/kernel` are other roots, so never match).
MACHINE_PATH = re.compile(rf"(?<![\w.:/~-])/(?:{'|'.join(MACHINE_ROOTS)})/[^\s`'\")\]]*")
#: The paths the docs teach with, each an example a reader takes for one: the example
#: user's home (`/home/me/...`), and Trust's policy planted in a shared /tmp, the program
#: below it and a world-writable cache folder. A result file has none of them.
EXAMPLES = ("/home/me/", "/tmp/devpolicy.yaml", "/tmp/scratch/", "/srv/cache")
IMAGES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}


def machine_paths(path: Path, allowed: tuple[str, ...]) -> list[str]:
    """Each `file:line: path` of `path` that names a machine's own folder (an image, such
    as the report page's screenshot, is no text to read: its page names no path)."""
    if path.suffix.lower() in IMAGES:
        return []
    found = []
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        for hit in MACHINE_PATH.finditer(line):
            if not hit.group(0).startswith(allowed):
                found.append(f"{path.relative_to(REPO)}:{number}: {hit.group(0)}")
    return found


class TestNoMachinePaths:
    def test_result_files_hold_figures_and_relative_names_not_the_machines_paths(self) -> None:
        """`benchmarks/results/` once quoted log lines holding the measuring machine's temp
        folder (`file=/tmp/tmp.../story/...`) and its install's: a result says what was
        measured, not where a file lay on one machine."""
        results = sorted(p for p in (REPO / "benchmarks" / "results").rglob("*") if p.is_file())
        assert results
        found = [hit for path in results for hit in machine_paths(path, ())]
        assert not found, "\n".join(found)

    def test_docs_name_no_machines_path_but_their_examples(self) -> None:
        """The docs and the README show only the example paths they teach with
        (`/home/me/project`), never a folder of the machine a figure or an output was
        taken on."""
        pages = sorted(p for p in (REPO / "docs").rglob("*") if p.is_file())
        pages.append(REPO / "README.md")
        found = [hit for path in pages for hit in machine_paths(path, EXAMPLES)]
        assert not found, "\n".join(found)

    def test_machine_paths_are_found_where_a_result_would_quote_them(self, tmp_path: Path) -> None:
        """The check finds a log line's temp file, a warning's install path and a home
        folder, and passes the kernel's files, URLs and names with slashes."""
        story = f"{tmp_path}/story/tokens.safetensors"
        text = (
            f"load_file file={story} seconds=0.1\n"
            "/opt/env/jax/_src/cloud_tpu_init.py:88: UserWarning: ...\n"
            "`/home/alice/data`, /mnt/disk/x.md and (/Users/bob/y)\n"
            "/proc/self/statm, /dev/shm, /sys/kernel/mm/x, https://example.org/tmp/x,\n"
            "`model/tmp/kernel`, `/mlp/wo/kernel`, 1,024/s, ~/tmp/x\n"
        )
        assert [hit.group(0) for hit in MACHINE_PATH.finditer(text)] == [
            story,
            "/opt/env/jax/_src/cloud_tpu_init.py:88:",
            "/home/alice/data",
            "/mnt/disk/x.md",
            "/Users/bob/y",
        ]


class TestLaneWritesRelativeNames:
    def test_the_lanes_logs_name_its_files_relative_to_its_folders(self, tmp_path: Path) -> None:
        """The accelerator lane keeps each benchmark's output (`--logs`): the token file is
        named inside the lane's folder, an installed module by its path on the import path,
        anything else by its name, and the kernel's files as they are."""
        lane = script(REPO / "benchmarks" / "accelerator_lane.py")
        roots = [tmp_path, REPO, Path("/opt/env")]
        line = (
            f"file={tmp_path}/story/bench_loop_tokens_dense_3221225472.safetensors "
            f"{REPO}/benchmarks/bench_loop.py /opt/env/jax/_src/cloud_tpu_init.py:88: "
            "/elsewhere/x/tokens.bin /sys/kernel/mm/transparent_hugepage/enabled "
            "https://example.org/a/b 1,024/s"
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lane, "ROOTS", roots)
            said = lane.relative(line)
        assert said == (
            "file=story/bench_loop_tokens_dense_3221225472.safetensors "
            "benchmarks/bench_loop.py jax/_src/cloud_tpu_init.py:88: "
            "tokens.bin /sys/kernel/mm/transparent_hugepage/enabled "
            "https://example.org/a/b 1,024/s"
        )
        assert not MACHINE_PATH.search(said)


def imported(tree: ast.AST) -> set[str]:
    """Every module an `import` anywhere in `tree` names (a function's own imports too),
    and each `from M import N` as `M.N` besides `M`."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def shared_names() -> set[str]:
    """The functions and classes `benchmarks/_common.py` writes for the scripts."""
    tree = ast.parse(COMMON.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.ClassDef)
    return {n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")}


class TestCommonHelpers:
    def test_benchmarks_common_imports_nothing_from_the_tests_and_only_the_standard_library(
        self,
    ) -> None:
        """The tests take their token files from `benchmarks/_common.py`, so it takes
        nothing back from them; a child process imports it to read its own memory before
        what it measures, so importing it loads no numpy, JAX or devpolicy either."""
        named = imported(ast.parse(COMMON.read_text(encoding="utf-8")))
        assert not [m for m in named if m == "tests" or m.startswith("tests.")]
        code = "import json, sys; import benchmarks._common; print(json.dumps(sorted(sys.modules)))"
        loaded = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            check=True,
        )
        heavy = ("tests", "numpy", "jax", "devpolicy")
        assert not [m for m in json.loads(loaded.stdout) if m.split(".")[0] in heavy]

    def test_no_benchmark_script_imports_tests_helpers_or_keeps_a_copy_of_a_shared_helper(
        self,
    ) -> None:
        """The scripts once copied their helpers (a memory reader five times, drifted so
        that only one coped with gVisor) and took token files from `tests.helpers`: now
        each helper is written once, in `_common.py`. A child's code is a string run with
        `python -c`, so the check reads every `def` line, strings included."""
        shared = shared_names()
        assert {"status", "PeakRise", "run_child", "markdown_table", "machine_state"} <= shared
        found = []
        for path in SCRIPTS:
            text = path.read_text(encoding="utf-8")
            named = imported(ast.parse(text))
            if "tests.helpers" in named or re.search(r"(from|import)\s+tests\.helpers", text):
                found.append(f"{path.name} imports tests.helpers")
            for name in re.findall(r"^\s*(?:def|class)\s+(\w+)", text, re.MULTILINE):
                if name in shared:
                    found.append(f"{path.name} defines {name}, which _common.py writes")
        assert not found, "\n".join(found)

    def test_tests_take_the_token_files_from_benchmarks_common(self) -> None:
        """`tests.helpers` keeps the names the tests import, each the one in `_common.py`."""
        import tests.helpers

        for name in ("dense_tensor_file", "sparse_tensor_file", "drop_from_page_cache"):
            assert getattr(tests.helpers, name) is getattr(common, name)
        assert tests.helpers.free_port is common.free_port

    def test_a_status_field_the_kernel_does_not_report_reads_as_none(self) -> None:
        """A field missing from /proc/self/status (gVisor has no VmHWM) is None, shown as
        `n/a`, not a StopIteration after minutes of work."""
        assert common.status("NoSuchField") is None
        assert common.gib(None) == "n/a"
        assert common.mib(None) == "n/a"
        assert common.growth(None, 5) is None
        assert common.median_known([None, 3, 1, None]) == 2
        assert common.median_known([None]) is None

    def test_the_peak_falls_back_to_getrusage_where_the_kernel_keeps_no_vmhwm(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under gVisor (a TPU VM) /proc/self/status has no VmHWM and no meaningful
        VmRSS: the peak is getrusage's ru_maxrss, and a rise is measured from it."""
        real = common.status
        monkeypatch.setattr(
            common, "status", lambda field: None if field in ("VmHWM", "VmRSS") else real(field)
        )
        peak, source = common.peak_rss()
        assert source == "ru_maxrss"
        assert peak is not None
        assert peak > 0
        rise = common.PeakRise()
        assert rise.source == "ru_maxrss"
        held = np.ones(16 * 2**20, np.uint8)
        after = rise()
        assert after is not None
        assert after >= 0
        del held

    @pytest.mark.skipif(common.status("VmHWM") is None, reason="this kernel keeps no VmHWM")
    def test_a_peak_rise_counts_the_memory_touched_after_it_began_not_an_earlier_peak(
        self,
    ) -> None:
        """The rise is the peak over what was resident when it began: an array touched
        after counts; one freed before does not (the high-water mark starts afresh where
        /proc/self/clear_refs may be written)."""
        # Fresh pages from the kernel (an anonymous map, every page written), not memory a
        # long test session's allocator already holds resident (its RSS would not rise).
        earlier = mmap.mmap(-1, 128 * 2**20)
        earlier.write(b"\1" * len(earlier))
        earlier.close()
        rise = common.PeakRise()
        held = mmap.mmap(-1, 32 * 2**20)
        held.write(b"\1" * len(held))
        grown = rise()
        held.close()
        assert grown is not None
        assert grown >= 30 * 2**20
        if os.access("/proc/self/clear_refs", os.W_OK):
            assert grown < 100 * 2**20

    def test_a_markdown_table_has_its_rule_and_leaves_an_empty_cell_blank(self) -> None:
        assert common.markdown_table(["a", "b"], [["1", ""], [2, "x"]]) == [
            "| a | b |",
            "|---|---|",
            "| 1 | |",
            "| 2 | x |",
        ]

    def test_a_command_line_is_shown_without_the_machines_paths(self) -> None:
        """`--dir` and `--out` (where files were written, where results go) are left out of
        the command a results file quotes."""
        argv = ["--runs", "1", "--dir", "/x/y", "--out=z.md", "--size", "1MiB", "--out", "a"]
        assert common.shown_argv(argv) == ["--runs", "1", "--size", "1MiB"]

    def test_the_machines_state_says_when_and_on_what(self) -> None:
        state = common.machine_state()
        lines = state.lines()
        assert re.fullmatch(r"- date: \d{4}-\d\d-\d\d \d\d:\d\d UTC", lines[0])
        assert lines[1].startswith(f"- cores: {os.cpu_count()}; load average (1, 5, 15 min)")
        assert f"jax {importlib.metadata.version('jax')}" in lines[2]


#: Each script whose children read their memory, at its smallest size: (argv, a line of
#: its table that must be there, figures in it). `{tmp}` is the test's folder.
SMALLEST_RUNS = {
    "bench_floor.py": (
        ["--size", "1MiB", "--tensors", "2", "--runs", "1", "--cases", "floor-tree,devpolicy"],
        "| devpolicy.load_file |",
    ),
    "bench_hardening.py": (
        ["--rows", "1024", "--counts", "64", "--run-counts", "64,128", "--runs", "1"],
        "devpolicy.load_file (after)",
    ),
    "bench_load.py": (
        ["--size", "1MiB", "--sharded-sizes", "1MiB", "--small-tensors", "8", "--runs", "1"],
        "| devpolicy.load_file, file from safetensors |",
    ),
    "bench_save_multiprocess.py": (
        ["--size", "1MiB", "--runs", "1", "--methods", "devpolicy"],
        "| devpolicy.save_file (one safetensors file) |",
    ),
}
#: The stream's benchmarks, from a cold dense token file written by `_common.py`.
STREAM = ("--rounds", "1", "--batches", "2", "--tokens", "65536", "--length", "17")
STREAM_RUNS = {
    "bench_loop.py": (
        [*STREAM, "--steps", "2", "--batch", "2", "--no-sharded", "--cold", "--mapped", "{tmp}"],
        "| devpolicy.windows |",
    ),
    "bench_read_paths.py": ([*STREAM, "--batch", "2", "--cold", "--dir", "{tmp}"], "| hand loop |"),
}

#: The scripts with a `--quick` run (every count at its smallest): a line of its table.
QUICK_RUNS = {"bench_watch.py": "| no watch |", "bench_packing.py": "| devpolicy first fit"}


#: The scripts no test below runs (their runs need an accelerator, a base commit, more
#: than seconds): each is at least started.
STARTED_ONLY = [
    p
    for p in SCRIPTS
    if p.name not in {*SMALLEST_RUNS, *STREAM_RUNS, *QUICK_RUNS, "bench_upload.py", WINDOWS.name}
]


class TestEveryBenchmarkRuns:
    @pytest.mark.slow
    @pytest.mark.parametrize("path", STARTED_ONLY, ids=[p.name for p in STARTED_ONLY])
    def test_every_other_benchmark_script_starts_and_explains_its_options(self, path: Path) -> None:
        """Each script imports what it shares (`benchmarks._common`) and parses its
        command line, from the checkout."""
        result = run_script(path.name, "--help", timeout=300)
        assert result.returncode == 0, result.stderr
        assert "usage:" in result.stdout

    @pytest.mark.slow
    @pytest.mark.parametrize("name", sorted(SMALLEST_RUNS))
    def test_each_benchmark_measures_memory_at_its_smallest_size(
        self, name: str, tmp_path: Path
    ) -> None:
        """A fresh child per method reads its own peak (`PeakRise`) and reports it: the
        row is there, with a figure where this kernel keeps one, and no `n/a`."""
        argv, row = SMALLEST_RUNS[name]
        result = run_script(name, *argv, "--dir", str(tmp_path))
        assert result.returncode == 0, result.stderr[-4000:]
        lines = [line for line in result.stdout.splitlines() if row in line]
        assert lines, result.stdout
        if common.status("VmHWM") is not None:
            assert not [line for line in lines if "n/a" in line], lines

    @pytest.mark.slow
    @pytest.mark.parametrize("name", sorted(STREAM_RUNS))
    def test_each_stream_benchmark_runs_at_its_smallest_size(
        self, name: str, tmp_path: Path
    ) -> None:
        """The token file is written and dropped from the page cache by `_common.py`'s
        helpers, and the table is printed."""
        argv, row = STREAM_RUNS[name]
        result = run_script(name, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
        assert result.returncode == 0, result.stderr[-4000:]
        assert row in result.stdout

    @pytest.mark.slow
    @pytest.mark.parametrize("name", sorted(QUICK_RUNS))
    def test_each_quick_benchmark_runs_and_prints_its_table(
        self, name: str, tmp_path: Path
    ) -> None:
        """`--quick` runs every measurement at its smallest, in seconds, and prints the
        table."""
        result = run_script(name, "--quick", "--dir", str(tmp_path))
        assert result.returncode == 0, result.stderr[-4000:]
        assert QUICK_RUNS[name] in result.stdout

    @pytest.mark.slow
    def test_bench_upload_runs_at_its_smallest_size(self) -> None:
        """Each child reads its own peak rise while saving to a local S3 server."""
        from tests.io.remote import servers

        try:
            servers.binary("weed")
        except servers.Missing as e:
            pytest.skip(str(e))
        result = run_script("bench_upload.py", "--size", "1MiB", "--runs", "1")
        assert result.returncode == 0, result.stderr[-4000:]
        rows = [line for line in result.stdout.splitlines() if line.startswith("| devpolicy |")]
        assert rows, result.stdout
        assert "n/a" not in rows[0] or common.status("VmHWM") is None

    def test_bench_versions_writes_and_warms_its_dense_file(self, tmp_path: Path) -> None:
        """The file `bench_versions.py` streams is `_common.py`'s dense token file."""
        path = script(BENCHMARKS / "bench_versions.py").dense_file(tmp_path, 1000)
        tokens = np.memmap(path, np.uint16, mode="r", offset=path.stat().st_size - 2000)
        assert len(tokens) == 1000
        assert tokens.max() < 32_000
        assert len(set(tokens.tolist())) > 900
