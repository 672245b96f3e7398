"""The accelerator lane in one command: install what it needs, run its tests, the README's
demo and the accelerator benchmarks on whatever accelerator JAX finds, print one table.

    python benchmarks/accelerator_lane.py [--wheels DIR] [--runs 5] [--out lane.md]
        [--reads auto|keep|budget|file]

Run it from a checkout of the project (its `tests/`, `examples/` and `policies/` are
used). `--wheels DIR`: install devpolicy and the lane's test tools (pytest, hypothesis,
safetensors) from the wheels in DIR, offline (`pip --no-index --find-links DIR`), keeping
the machine's own jax and jaxlib at the versions installed (a constraint pins them).
Without it, what is installed (or the checkout on PYTHONPATH) is used.

Then, one after another (only one process at a time can hold a TPU; this one never
imports JAX):

1. `pytest tests/accelerator`: the lane's tests, each skipped, with the reason, where
   JAX finds no accelerator (the CPU twins of its claims run everywhere);
2. `examples/dataset_on_host.py` with the shipped policy: where the model and batches
   went, and how many warnings it printed (none is the claim);
3. `benchmarks/bench_accelerator.py`: loading onto the chip and windows to it;
4. `benchmarks/bench_loop.py`: the story's loop, from tokens in memory and from the
   story-scale token file (19.09 GiB, dense: random tokens in every byte, warm, mapped;
   `--story-tokens`), fresh windows every run, against the hand loop, the
   double-buffered hand loop, positional reads (one at a time, and many in flight) and
   a gather from the mapping by hand; the lowest round of each ratio, and `windows` from
   the file over `windows` from memory, are rows of their own;
5. `benchmarks/bench_floor.py --in-process`: a 2 GiB checkpoint written by
   `safetensors.numpy.save_file` loaded onto the chip against the transfer floor and
   a mapping's views sent in one `device_put`.

`--reads` holds every `windows` stream of the benchmarks to one read path
(`devpolicy.ReadOptions(path=...)`: bench_accelerator's `--reads`, bench_loop's
`--mapped-copy`); by default each makes its own choice.

The table (and with `--out`, a Markdown copy) says the date, the machine and each
result. The exit status is pytest's (0: passed or skipped), or the demo's if it failed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # last: what is installed is what the lane reports
from benchmarks._common import text_table  # noqa: E402

#: What the lane needs besides devpolicy (and the jax the machine has).
TOOLS = ("pytest", "hypothesis", "safetensors")
#: JAX warns at `import jax` on a TPU v5e whose transparent huge pages are off; the suite
#: turns warnings into errors, and that one would stop the TPU backend from starting.
IGNORED = ("ignore:Transparent hugepages are not enabled:UserWarning",)


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install(wheels: Path) -> None:
    """devpolicy and the lane's tools from `wheels`, offline, jax and jaxlib kept."""
    pins = [f"{n}=={v}" for n in ("jax", "jaxlib") if (v := installed(n)) is not None]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(pins) + "\n")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        str(wheels),
        "--constraint",
        f.name,
        "devpolicy",
        *TOOLS,
    ]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=helper_env())
    os.unlink(f.name)


def helper_env() -> dict[str, str]:
    """The environment of a helper that must not hold the chip: JAX kept on the CPU."""
    return os.environ | {"JAX_PLATFORMS": "cpu"}


def chip_env() -> dict[str, str]:
    """The environment of a step that uses the chip: the checkout first on the path, no
    GPU preallocation (a child of the tests starts its own backend), steering variables of
    this shell left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "JAX_PLATFORMS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def run_tests(folder: Path) -> tuple[int, list[tuple[str, str, str]]]:
    """pytest over tests/accelerator: its exit status and (test, outcome, detail) rows."""
    report = folder / "lane.xml"
    command = [sys.executable, "-m", "pytest", "tests/accelerator", "-q", "-rs"]
    command += [f"-W{w}" for w in IGNORED]
    command += ["-p", "no:cacheprovider", f"--junitxml={report}"]
    print("$", " ".join(command), flush=True)
    status = subprocess.run(command, cwd=REPO, env=chip_env(), check=False).returncode
    rows = []
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            outcome, detail = "passed", ""
            for child in case:
                if child.tag in ("skipped", "failure", "error"):
                    outcome = {"skipped": "skipped", "failure": "FAILED", "error": "ERROR"}[
                        child.tag
                    ]
                    detail = (child.get("message") or "").splitlines()[0][:160]
            rows.append((name, outcome, detail))
    return status, rows


def run_demo() -> tuple[int, list[tuple[str, str, str]]]:
    """The README's demo, unchanged: where model and batch went, and warnings printed."""
    command = [sys.executable, "examples/dataset_on_host.py", "--size", "64MiB"]
    print("$", " ".join(command), flush=True)
    result = subprocess.run(
        command, cwd=REPO, env=chip_env(), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        return result.returncode, [("demo", "FAILED", result.stderr.strip().splitlines()[-1:][0])]
    warnings = [line for line in result.stderr.splitlines() if "[warning" in line]
    device = ""
    found = {}
    for line in result.stdout.splitlines():
        header = re.match(r"^(\w+:\d+): ", line)
        if header:
            device = header[1]
        for name in ("model/embed", "batch", "dataset/tokens"):
            if re.search(rf"\b{re.escape(name)}\b", line) and line.startswith("  "):
                found[name] = device
    placed = ", ".join(f"{n} on {d}" for n, d in found.items())
    return 0, [
        ("demo: placements", "passed" if found else "FAILED", placed or "no report"),
        ("demo: warnings", "passed" if not warnings else "FAILED", f"{len(warnings)} printed"),
    ]


#: Where each benchmark's whole output is kept (`--logs`), if anywhere.
LOGS: list[Path] = []
#: Folders the lane's output names its files relative to: the lane's temporary folder
#: (added once made), the checkout, this interpreter's import paths. A result holds
#: figures and relative names, never this machine's own paths.
ROOTS: list[Path] = [REPO, *(Path(p) for p in sys.path if os.path.isabs(p) and p != "/")]
#: An absolute path of two parts or more (not inside a URL or a longer name).
ABSOLUTE = re.compile(r"(?<![\w.:/~-])/(?:[\w.+@-]+/)+[\w.+@-]+")
#: The kernel's own files, the same on every machine: kept as they are.
KERNEL = ("/proc/", "/dev/", "/sys/", "/etc/")


def relative(text: str) -> str:
    """`text` with each absolute path relative to the first of `ROOTS` it is in (the lane's
    token file is `story/bench_loop_tokens_dense_N.safetensors`), or else its file's name;
    the kernel's files are kept."""

    def named(found: re.Match[str]) -> str:
        path = found.group(0)
        if path.startswith(KERNEL):
            return path
        for root in ROOTS:
            for form in dict.fromkeys((str(root), str(root.resolve()))):
                if path.startswith(form.rstrip("/") + "/"):
                    return path[len(form.rstrip("/")) + 1 :]
        return path.rsplit("/", 1)[1]

    return ABSOLUTE.sub(named, text)


def json_rows(
    command: list[str], what: str, records: list[dict[str, Any]] | None = None
) -> list[tuple[str, str, str]]:
    """Run a benchmark that prints JSON lines; one row of the table per line (each line's
    object also added to `records`, where given)."""
    print("$", " ".join(command), flush=True)
    result = subprocess.run(
        command, cwd=REPO, env=chip_env(), capture_output=True, text=True, check=False
    )
    for folder in LOGS:
        name = re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-")
        text = relative(result.stdout + result.stderr[-4000:])
        (folder / f"{name}.md").write_text(text, encoding="utf-8")
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return [(what, "FAILED", relative(last))]
    rows = []
    for line in result.stdout.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if records is not None:
            records.append(r)
        if "methods" in r:
            cells = [
                f"{m} {v['median']:.3g} ({v['low']:.3g}-{v['high']:.3g})"
                for m, v in r["methods"].items()
            ]
            note = f" [{r['note']}]" if r.get("note") else ""
            rows.append((f"bench: {r['row']}", r["unit"], "; ".join(cells) + note))
        else:
            detail = ", ".join(f"{k} {v}" for k, v in r.items() if k != "row")
            rows.append((f"bench: {r['row']}", "", detail))
    return rows


def run_benchmarks(
    runs: int, story_tokens: int, folder: Path, reads: str = "auto"
) -> list[tuple[str, str, str]]:
    python = sys.executable
    rounds = str(max(3, runs))
    accelerator = [python, "benchmarks/bench_accelerator.py", "--json", "--runs", str(runs)]
    rows = json_rows([*accelerator, "--reads", reads], "bench_accelerator")
    loop = [python, "benchmarks/bench_loop.py", "--json", "--rounds", rounds, "--no-sharded"]
    loop += ["--steps", "600"]  # a stream's start (its first batch) is not a run's cost
    loop += ["--mapped-copy", reads]
    in_memory: list[dict[str, Any]] = []
    rows += json_rows(loop, "bench_loop (memory)", in_memory)
    mapped = [*loop, "--tokens", str(story_tokens), "--mapped", str(folder / "story")]
    from_file: list[dict[str, Any]] = []
    rows += json_rows(mapped, "bench_loop (dense story file, warm)", from_file)
    rows += file_over_memory(from_file, in_memory)
    floor = [python, "benchmarks/bench_floor.py", "--json", "--in-process", "--runs", rounds]
    floor += ["--dir", str(folder / "floor"), "--cases", ",".join(FLOOR_CASES)]
    rows += json_rows(floor, "bench_floor")
    return rows


def file_over_memory(
    from_file: list[dict[str, Any]], in_memory: list[dict[str, Any]]
) -> list[tuple[str, str, str]]:
    """`windows` from the mapped file over `windows` from memory, in each measure both
    runs printed (the pipeline alone, the step): one row each."""
    rows = []
    for record in from_file:
        label = str(record.get("row", "")).rpartition(": ")[2]
        rate = next((k for k in record if k.startswith("windows ") and "/s" in k), None)
        twin = next((r for r in in_memory if str(r.get("row", "")).endswith(f": {label}")), None)
        if rate is None or twin is None or not twin.get(rate):
            continue
        ratio = record[rate] / twin[rate]
        rows.append((f"bench: windows from the file / from memory: {label}", "", f"{ratio:.2f}"))
    return rows


#: The rows of `bench_floor.py` the lane runs (every case would open the chip again).
FLOOR_CASES = (
    "floor-tree",
    "floor-tree-numpy",
    "floor-mapped",
    "floor-chunked",
    "devpolicy",
    "devpolicy-mmap",
    "numpy+device_put",
    "flax",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wheels", type=Path, help="install devpolicy and the tools from here")
    parser.add_argument("--runs", type=int, default=5, help="benchmark runs of each method")
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    parser.add_argument(
        "--story-tokens",
        type=int,
        default=10_248_871_837,
        help="uint16 tokens of the mapped story file bench_loop reads (19.09 GiB)",
    )
    parser.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    parser.add_argument("--logs", type=Path, help="keep each benchmark's whole output here")
    parser.add_argument(
        "--reads",
        choices=["auto", "keep", "budget", "file"],
        default="auto",
        help="the read path every windows stream is held to (default auto: its own choice)",
    )
    args = parser.parse_args(argv)
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
        LOGS.append(args.logs)
    if args.wheels is not None:
        install(args.wheels)
    status, rows = 0, []
    demo_status = 0
    with tempfile.TemporaryDirectory() as folder:
        ROOTS.insert(0, Path(folder))
        if not args.skip_tests:
            status, rows = run_tests(Path(folder))
            demo_status, demo = run_demo()
            rows += demo
        rows += run_benchmarks(args.runs, args.story_tokens, Path(folder), args.reads)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"accelerator lane, {when}: Python {platform.python_version()}, jax "
        f"{installed('jax')}, jaxlib {installed('jaxlib')}, libtpu {installed('libtpu')}, "
        f"devpolicy {installed('devpolicy') or 'from the checkout'}"
    )
    text = f"{head}\n\n{text_table([('what', 'outcome', 'detail'), *rows])}"
    print("\n" + text)
    if args.out is not None:
        args.out.write_text(relative(f"{head}\n\n```\n{text_table(rows)}\n```\n"), encoding="utf-8")
    return status if status not in (0, 5) else demo_status


if __name__ == "__main__":
    sys.exit(main())
