"""Resident memory and time per step of random windows from a mapped token file, with the
kernel's defaults and with what devpolicy.windows does, side by side.

    python benchmarks/bench_windows.py [--tokens 10248871837] [--steps 10000]
        [--length 1025] [--batch 32] [--runs 1] [--paired-steps 500] [--paired-rounds 6]
        [--variants defaults,random-only,mapping,budget,keep,file,devpolicy]
        [--dir DIR] [--out benchmarks/results/windows.md]

The story's dataset: one uint16 tensor of `--tokens` tokens (10,248,871,837 is 19.09
GiB), written dense (random tokens in every byte, as a real token file is) at a
64-byte-aligned offset and loaded by `devpolicy.load_file` with a host rule that maps
it, as the README does. Each variant runs in a fresh process
(2 fake CPU devices, batches placed on cpu:1), the file's pages dropped from the page
cache first (`posix_fadvise(DONTNEED)`), and samples `--steps` batches of `--batch`
random windows of `--length` tokens, recording RSS (and its file-backed part) every
tenth of the run and the time per step:

- `kernel defaults`: no advice, nothing given back (devpolicy before the fix);
- `MADV_RANDOM only`: the mapping advised random, nothing given back;
- `copied from the mapping, pages given back a group at a time` (`pages.Pager.release`):
  `MADV_RANDOM`, and each group's 64 KiB blocks given back (`MADV_DONTNEED`) once copied;
- `gathered within the budget` (`reads=ReadOptions(path="budget")`): windows gathered
  from the mapping, the whole view given back in one sweep once what they measurably
  brought in nears `resident_budget` (256 MiB), or read by position where each maps a
  large folio;
- `gathered, pages kept` (`reads=ReadOptions(path="keep")`): nothing given back;
- `read from the file by position` (`reads=ReadOptions(path="file")`,
  `devpolicy/_read/positional.py`): each window read into the batch buffer, nothing of
  the mapping touched;
- `devpolicy.windows`: what it chooses (docs/host-arrays.md, "Which read path runs"):
  read by position where io_uring can be had; else kept mapped where the tokens are warm
  and fit, read by position where not; the table says which it took, and why.

The time the giving back costs is also measured paired: in one process, segments with
and without it take turns (a shared machine's load then weighs on both alike).

Target: each variant within the resident memory docs/host-arrays.md documents for its
path: read by position, 64 MiB (the batch buffers and the process's own); gathered
within the budget, `resident_budget` + 64 MiB; pages kept, the file's size + 64 MiB (page
cache the kernel can reclaim, kept only while memory allows); the kernel's defaults and
`MADV_RANDOM only` have no budget (they show why there is one).
The tables and the machine's state are written to `--out` as Markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

# The story's token file is made the way the tests make theirs (`dense_tensor_file`).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import (
    at_least_one,
    child_env,
    dense_tensor_file,
    machine_state,
    markdown_table,
    median_known,
    run_child,
)

STORY_TOKENS = 10_248_871_837
MiB = 2**20

CHILD = r"""
import json, os, sys, time
from benchmarks._common import growth, status
variant, path, steps, length, batch = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])

import numpy as np
import devpolicy
from devpolicy._read import pages, positional
import devpolicy._apply.stream.cutting

reads = None  # devpolicy: its own choice
if variant in ("file", "budget", "keep"):  # one path, whatever the file
    reads = devpolicy.ReadOptions(path=variant)
elif variant != "devpolicy":  # copied out of the mapping, its pages given back each group:
    reads = devpolicy.ReadOptions(path="file")  # held to the file, found unreadable
    found = positional.mapped_file
    for name, module in list(sys.modules.items()):
        if name.startswith("devpolicy.") and getattr(module, "mapped_file", None) is found:
            module.mapped_file = lambda view, length, **ring: None
if variant == "defaults":
    pages._MADVISE = None  # no advice, nothing given back: the kernel's defaults
elif variant == "random-only":
    pages.Pager.release = lambda self, offsets, length: None  # advice, nothing given back
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}, "rules": [
    {"match": "*/tokens", "device": "cpu:0", "mmap": True},
    {"match": "batch", "device": "cpu:1"}]}, environ={})
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # every variant starts from a cold cache
os.close(fd)
tokens = devpolicy.load_file(path, policy=policy, progress=False)["tokens"]
stream = devpolicy.windows(tokens, length, batch, order="random", seed=0, steps=steps,
                           policy=policy, reads=reads)
rss0, file0 = status("VmRSS"), status("RssFile")
samples, times = [], []
every = max(1, steps // 10)
start = last = time.perf_counter()
for step, b in enumerate(stream, 1):
    assert b.shape == (batch, length)
    if step % every == 0 or step == steps:
        now = time.perf_counter()
        times.append((now - last) / (step - (samples[-1][0] if samples else 0)))
        last = now
        samples.append((step, growth(status("VmRSS"), rss0), growth(status("RssFile"), file0)))
total = time.perf_counter() - start
cutter = stream._cutter
print(json.dumps({"samples": samples, "seconds": total, "step_times": times,
                  "reads": cutter.reads, "why": cutter.reads_why}))
"""

#: One process, the mapping advised random, segments of steps with and without the pages
#: given back taking turns: the time the giving back costs, paired against the same
#: load on a shared machine (separate processes see different moments of it).
PAIRED = r"""
import json, os, statistics, sys, time
path, length, batch, segments, rounds = sys.argv[1], *map(int, sys.argv[2:6])
import devpolicy
from devpolicy._read import pages, positional
import devpolicy._apply.stream.cutting
# The mapping's way, pages given back: held to the file, found unreadable by position.
reads = devpolicy.ReadOptions(path="file")
found = positional.mapped_file
for name, module in list(sys.modules.items()):
    if name.startswith("devpolicy.") and getattr(module, "mapped_file", None) is found:
        module.mapped_file = lambda view, length, **ring: None
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}, "rules": [
    {"match": "*/tokens", "device": "cpu:0", "mmap": True},
    {"match": "batch", "device": "cpu:1"}]}, environ={})
tokens = devpolicy.load_file(path, policy=policy, progress=False)["tokens"]
release = pages.Pager.release
times = {"each group's pages given back": [], "MADV_RANDOM only": []}
for _ in range(rounds):
    for variant in times:
        pages.Pager.release = release if variant == "each group's pages given back" else (
            lambda self, offsets, length: None)
        stream = devpolicy.windows(tokens, length, batch, order="random", steps=segments,
                                   policy=policy, reads=reads)
        start = time.perf_counter()
        for b in stream:
            pass
        times[variant].append((time.perf_counter() - start) / segments * 1000)
print(json.dumps(times))
"""

VARIANTS = {
    "defaults": "kernel defaults",
    "random-only": "MADV_RANDOM only",
    "mapping": "copied from the mapping, pages given back a group at a time",
    "budget": "gathered within the budget",
    "keep": "gathered, pages kept",
    "file": "read from the file by position",
    "devpolicy": "devpolicy.windows (its own choice)",
}


def documented_bound(variant: str, taken: dict[str, object], size: int) -> int | None:
    """The resident growth docs/host-arrays.md allows the path `variant` took (None: no
    promise): the path's own part, and 64 MiB of batch buffers and the process's own."""
    if variant in ("defaults", "random-only"):
        return None
    path = variant
    if variant == "devpolicy":
        kept = "kept" in str(taken["why"])
        path = "keep" if kept else "budget" if taken["reads"] == "mapping" else "file"
    own = {"keep": size, "budget": 256 * MiB, "mapping": 256 * MiB, "file": 0}[path]
    return own + 64 * MiB


def run_variant(variant: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of `variant` over the token file in a fresh process (2 fake CPU devices)."""
    argv = [args.steps, args.length, args.batch]
    env = child_env(cpu_devices=2, drop=("XLA_",))
    return run_child(CHILD, variant, path, *argv, what=variant, env=env)[-1]


def in_mib(n: float | None) -> str:
    """`n` bytes as a figure of MiB, one decimal (`n/a`: not reported)."""
    return "n/a" if n is None else f"{n / MiB:,.1f}"


def variant_list(text: str) -> str:
    """An argparse type: comma-separated names of `VARIANTS`, at least one."""
    names = [name for name in text.split(",") if name]
    for name in names:
        if name not in VARIANTS:
            raise argparse.ArgumentTypeError(
                f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}"
            )
    if not names:
        raise argparse.ArgumentTypeError(f"name at least one of {', '.join(VARIANTS)}")
    return ",".join(names)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, every number checked before any file is written or run started."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=at_least_one, default=STORY_TOKENS)
    parser.add_argument("--steps", type=at_least_one, default=10_000)
    parser.add_argument("--length", type=at_least_one, default=1025)
    parser.add_argument("--batch", type=at_least_one, default=32)
    parser.add_argument(
        "--runs", type=at_least_one, default=1, help="runs of each variant, interleaved"
    )
    parser.add_argument(
        "--variants",
        type=variant_list,
        default=",".join(VARIANTS),
        help=f"which of {','.join(VARIANTS)} to run (the kernel's defaults grow RSS by GiBs)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the token file goes")
    parser.add_argument(
        "--paired-steps", type=at_least_one, default=500, help="steps a paired segment"
    )
    parser.add_argument(
        "--paired-rounds", type=at_least_one, default=6, help="paired segments each way"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the tables as Markdown")
    args = parser.parse_args(argv)
    if args.length > args.tokens:
        parser.error(
            f"--length ({args.length}) must be at most --tokens ({args.tokens}): "
            "a window is that many tokens of the file"
        )
    return args


def main() -> int:
    args = parse_args()
    lines = [
        "# Random windows from a mapped token file: resident memory over steps",
        "",
        f"`python benchmarks/bench_windows.py --tokens {args.tokens} --steps {args.steps} "
        f"--length {args.length} --batch {args.batch} --runs {args.runs} "
        f"--variants {args.variants} "
        f"--paired-steps {args.paired_steps} --paired-rounds {args.paired_rounds}`",
        "",
        *machine_state().lines(),
    ]
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    folder = tempfile.TemporaryDirectory(dir=args.dir)  # one file, written once, for both parts
    path = Path(folder.name) / "train.safetensors"
    try:
        dense_tensor_file(path, args.tokens)
        size = path.stat().st_size
        copied = args.steps * args.batch * args.length * 2
        lines.append(
            f"- token file: {size / 2**30:.2f} GiB of uint16, dense (random tokens in every "
            f"byte), mapped by `load_file`, dropped from the page cache before each run "
            f"(cold); {args.steps:,} steps copy {copied / MiB:,.0f} MiB of windows"
        )
        chosen = [v for v in VARIANTS if v in args.variants.split(",")]
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
        for run in range(args.runs):
            for variant in chosen:
                print(f"run {run + 1}/{args.runs}: {VARIANTS[variant]}", file=sys.stderr)
                results[variant].append(run_variant(variant, path, args))
        lines += ["", "**RSS growth over the run (MiB; the file-backed part in brackets)**", ""]
        steps_seen = [s[0] for s in results[chosen[0]][0]["samples"]]
        lines += markdown_table(
            ["variant", *(f"{s:,}" for s in steps_seen)],
            (
                [
                    VARIANTS[variant],
                    *(f"{in_mib(rss)} ({in_mib(rss_file)})" for _, rss, rss_file in r["samples"]),
                ]
                for variant, runs in results.items()
                for r in runs
            ),
        )
        lines += [
            "",
            "**Time per step (ms; each step: 32 windows drawn, copied, placed on cpu:1)**",
            "",
        ]
        rows = []
        for variant, runs in results.items():
            whole = statistics.median(r["seconds"] for r in runs) / args.steps * 1000
            tenths = [t * 1000 for r in runs for t in r["step_times"]]
            grown = median_known(r["samples"][-1][1] for r in runs)
            taken = runs[-1]
            extra = documented_bound(variant, taken, size)
            if extra is None:
                bound = "none"
            else:
                met = "not measured" if grown is None else "met" if grown <= extra else "NOT met"
                bound = f"{in_mib(extra)} MiB: {met}"
            rows.append(
                [
                    VARIANTS[variant],
                    f"{taken['reads']} ({taken['why']})",
                    f"{whole:.3f}",
                    f"{min(tenths):.3f}-{max(tenths):.3f}",
                    f"{in_mib(grown)} MiB",
                    bound,
                ]
            )
        heads = ["variant", "read path taken (why)", "whole run, median of runs"]
        heads += ["per tenth of the run: fastest-slowest", "RSS growth at the end, median"]
        lines += markdown_table([*heads, "documented bound"], rows)
        sizes = (args.length, args.batch, args.paired_steps, args.paired_rounds)
        env = child_env(cpu_devices=2, drop=("XLA_",))
        paired: dict[str, list[float]] = run_child(
            PAIRED, path, *sizes, what="the paired segments", env=env
        )[-1]
    finally:
        folder.cleanup()
    lines += [
        "",
        f"**Time per step, paired (ms): one process, {args.paired_rounds} rounds of "
        f"{args.paired_steps} steps each way, taking turns**",
        "",
    ]
    lines += markdown_table(
        ["variant", "median", "each round"],
        (
            [variant, f"{statistics.median(times):.3f}", ", ".join(f"{t:.3f}" for t in times)]
            for variant, times in paired.items()
        ),
    )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
