"""The benchmark scripts refuse numbers they cannot use, saying which option and why; their
results hold figures and relative names, not the measuring machine's paths."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

WINDOWS = REPO / "benchmarks" / "bench_windows.py"

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


def bench_windows(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`benchmarks/bench_windows.py` with the smallest counts, then ARGV, from the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_"))}
    return subprocess.run(
        [sys.executable, str(WINDOWS), "--dir", str(tmp), *SMALLEST, *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
        check=False,
    )


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


def machine_paths(path: Path, allowed: tuple[str, ...]) -> list[str]:
    """Each `file:line: path` of `path` that names a machine's own folder."""
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
