"""What watching costs: a stream's loop watch and the profiler's spans, side by side with
each taken out, and `load_file` with its spans against the same without.

    python benchmarks/bench_watch.py [--rounds 4] [--runs 3] [--batches 2000]
        [--tokens 16777216] [--length 1025] [--batch 32] [--size 256MiB]
        [--reads 3] [--maps 20] [--dir DIR] [--out benchmarks/results/watch.md] [--quick]

A stream (`devpolicy.windows` of `--tokens` random uint16 tokens in memory, random
windows of `--length` x `--batch`, onto one CPU device), four ways, each in a fresh
process of its own, taking turns round by round (the order turned each round):

- `as shipped`: the watch times every pull (`LoopWatch.handed`) and `next()` asks the
  profiler whether a trace is taken (`spans.tracing`), the groups' read and placing each
  a `span` call;
- `no watch`: `LoopWatch.handed` replaced by a function that does nothing (the clock
  read before the pull stays: one `time.perf_counter()`);
- `no spans`: `next()` without its profiler check (`WindowStream.__next__` is the
  hand-out itself) and the cutter's `span` a function that hands back the do-nothing
  context without asking the profiler;
- `neither`: both taken out.

Each process runs `--runs` streams of `--batches` batches (one more first, unmeasured),
each batch waited for (`block_until_ready`) and dropped: the pipeline alone, no step,
where a cost per batch shows most. Its figure is the median rate of its runs; a variant's
ratio is the median over rounds of its rate over `as shipped`'s in the same round, and
the cost, as a share of a batch's time, is `1 - 1/ratio`. The per-call costs are also
timed directly (`timeit`, best of 5) in one more process: a pull's clock read and
`LoopWatch.handed`, `spans.tracing()`, a `span(...)` call, and `with span(...)`; each is
then given as a share of `as shipped`'s median batch time.

`load_file` of a `--size` file of one uint16 tensor (dense random tokens, read through
once: warm), mapped (`mmap=True`, `--maps` loads a process) and read (`mmap=False`,
`--reads` loads a process), with its spans as shipped against its spans' profiler
check taken out (`span` of `load`, `readahead` and `sending` handing back the do-nothing
context without asking), a fresh process each, taking turns round by round; the first
load of each process unmeasured. No trace is taken in any of it: what a run that does not
profile pays.

Targets: the watch and the spans together at most 1% of a batch's time; nothing
measurable on `load_file`. `--quick`: every count at its smallest (seconds, for tests).
The tables and the machine's state (date, cores, load average at the start and the end,
Python, jax) are written to `--out` as Markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import (
    Report,
    at_least_one,
    child_env,
    dense_tensor_file,
    machine_state,
    markdown_table,
    read_through,
    run_child,
    shown_argv,
)

VARIANTS = ("as shipped", "no watch", "no spans", "neither")

CHILD = r"""
import json, logging, statistics, sys, time, timeit
what, variant = sys.argv[1], sys.argv[2]

import jax, numpy as np, structlog
# Warnings only: the events a stream or a load says are the same in every variant.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
import devpolicy
from devpolicy._machine import spans
from devpolicy._apply.stream import cutting, owner, watching
from devpolicy._io.reading import load, readahead, sending

nothing = spans._NOTHING
def unasked(what, /, **metadata):  # the do-nothing context, the profiler never asked
    return nothing

if variant in ("no watch", "neither"):
    watching.LoopWatch.handed = lambda self, began: None
if variant in ("no spans", "neither"):
    owner.WindowStream.__next__ = owner.WindowStream._hand_out
    cutting.span = unasked
if variant == "no spans (load)":
    load.span = readahead.span = sending.span = unasked
assert not spans.tracing()
policy = devpolicy.load_policy({"version": 1, "default": "cpu"}, environ={})

if what == "stream":
    runs, batches, count, length, batch = (int(a) for a in sys.argv[3:8])
    tokens = np.random.default_rng(0).integers(0, 32000, count, dtype=np.uint16)
    rates = []
    for run in range(runs + 1):
        stream = devpolicy.windows(tokens, length, batch, order="random", seed=run,
                                   steps=batches, policy=policy)
        with stream as pulled:
            start = time.perf_counter()
            for b in pulled:
                b.block_until_ready()
            seconds = time.perf_counter() - start
        if run:
            rates.append(batches / seconds)
    print(json.dumps({"rate": statistics.median(rates), "rates": rates}))
elif what == "costs":
    length, batch = int(sys.argv[3]), int(sys.argv[4])
    tokens = np.zeros(length * 64, dtype=np.uint16)
    stream = devpolicy.windows(tokens, length, batch, order="random", seed=0, policy=policy)
    next(stream)  # the tally open: `handed` takes its whole path
    watch = stream._watch
    clock = time.perf_counter
    def best(call, number=200_000):
        return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e9
    def spanned():
        with spans.span(spans.STREAM_READ, reads="file", batches=8):
            pass
    print(json.dumps({
        "watch": best(lambda: watch.handed(clock())),
        "tracing": best(spans.tracing),
        "span": best(lambda: spans.span(spans.STREAM_READ, reads="file", batches=8)),
        "with span": best(spanned),
        "empty call": best(lambda: None),
        "group": stream._cutter._group,  # batches a group: two spans each
    }))
    stream.close()
else:
    path, reads, maps = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    out = {}
    for mode, loads in (("mapped", maps), ("read", reads)):
        times = []
        for i in range(loads + 1):
            start = time.perf_counter()
            got = devpolicy.load_file(path, policy=policy, mmap=mode == "mapped", progress=False)
            for v in got.values():
                v.block_until_ready()
            seconds = time.perf_counter() - start
            del got, v
            if i:
                times.append(seconds)
        out[mode] = statistics.median(times)
    print(json.dumps(out))
"""


def child(*args: object) -> dict[str, Any]:
    """One measuring process (one CPU device): its last JSON line."""
    return run_child(CHILD, *args, what=" ".join(map(str, args[:2])), env=child_env(cpu_devices=1))[
        -1
    ]


def size_arg(text: str) -> int:
    """An argparse type: bytes, as `256MiB`, `1GiB` or a whole number."""
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return at_least_one(text[: -len(unit)]) * factor
    return at_least_one(text)


def turned(items: tuple[str, ...], by: int) -> list[str]:
    """`items` started at `by` (the order each round turns to)."""
    by %= len(items)
    return [*items[by:], *items[:by]]


def spread(values: list[float], scale: float = 1.0, form: str = "{:,.0f}") -> str:
    """The lowest-highest of `values` times `scale`."""
    return f"{form.format(min(values) * scale)}-{form.format(max(values) * scale)}"


def stream_tables(report: Report, args: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    numbers = (args.runs, args.batches, args.tokens, args.length, args.batch)
    for round_ in range(args.rounds):
        for variant in turned(VARIANTS, round_):
            rates[variant].append(child("stream", variant, *numbers)["rate"])
    shipped = rates["as shipped"]
    ratios = {v: [r / s for r, s in zip(rates[v], shipped, strict=True)] for v in VARIANTS}
    batch_us = 1e6 / statistics.median(shipped)
    report.say(
        f"\n**A stream from memory, the pipeline alone: {args.batches:,} batches a run, "
        f"{args.runs} runs a process, {args.rounds} rounds** (batches of {args.batch} "
        f"random windows of {args.length}, uint16, onto cpu:0; a batch takes "
        f"{batch_us:.1f} us as shipped)\n"
    )
    rows = []
    for v in VARIANTS:
        r = statistics.median(ratios[v])
        cost = [1 - 1 / x for x in ratios[v]]
        rows.append(
            [
                v,
                f"{statistics.median(rates[v]):,.0f}",
                f"{r:.3f}",
                "" if v == "as shipped" else f"{statistics.median(cost):+.1%}",
                "" if v == "as shipped" else spread(cost, 100, "{:+.1f}") + "%",
                ", ".join(f"{x:,.0f}" for x in rates[v]),
            ]
        )
    heads = [
        "variant",
        "batches/s, median",
        "x as shipped, median of rounds",
        "cost of what it takes out, share of a batch",
        "that cost, lowest-highest round",
        "each round",
    ]
    for line in markdown_table(heads, rows):
        report.say(line)
    costs = child("costs", "as shipped", args.length, args.batch)
    group = costs.pop("group")
    report.say(
        "\n**Each call, timed directly** (`timeit`, best of 5 runs of 200,000 calls; "
        f"a batch's time: {batch_us:.1f} us, `as shipped`'s median above)\n"
    )
    per_batch = {
        "watch": "once a batch (every pull)",
        "tracing": "once a batch (`next()`)",
        "span": f"twice a group of {group} batches (its read, its placing)",
        "with span": f"twice a group of {group}",
        "empty call": "(a Python call that does nothing, for scale)",
    }
    shown = {
        "watch": "a pull's clock read + `LoopWatch.handed`",
        "tracing": "`spans.tracing()`",
        "span": "`span(...)`, no trace",
        "with span": "`with span(...): pass`, no trace",
        "empty call": "`(lambda: None)()`",
    }
    rows = [
        [shown[k], f"{ns:,.0f}", per_batch[k], f"{ns / 1e3 / batch_us:.2%}"]
        for k, ns in costs.items()
    ]
    each = costs["watch"] + costs["tracing"] + 2 * costs["with span"] / group
    rows.append(
        [
            "**the watch and the spans, a batch**",
            f"{each:,.0f}",
            "watch + `tracing()` + 2 `with span` / group",
            f"**{each / 1e3 / batch_us:.2%}**",
        ]
    )
    for line in markdown_table(["call", "ns", "how often", "share of a batch"], rows):
        report.say(line)


def load_table(report: Report, args: argparse.Namespace, folder: Path) -> None:
    path = dense_tensor_file(folder / "tokens.safetensors", args.size // 2)
    read_through(path)
    sides = ("as shipped", "no spans (load)")
    times: dict[str, dict[str, list[float]]] = {s: {"mapped": [], "read": []} for s in sides}
    for round_ in range(args.rounds):
        for side in turned(sides, round_):
            got = child("load", side, path, args.reads, args.maps)
            for mode in ("mapped", "read"):
                times[side][mode].append(got[mode])
    report.say(
        f"\n**`load_file` of one {args.size / 2**20:,.0f} MiB uint16 tensor, warm (read "
        f"through once after it was written), onto cpu:0: {args.rounds} rounds, the "
        f"median of {args.maps} mapped and {args.reads} read loads a process**\n"
    )
    rows = []
    for mode in ("mapped", "read"):
        shipped, bare = times["as shipped"][mode], times["no spans (load)"][mode]
        ratio = [s / b for s, b in zip(shipped, bare, strict=True)]
        rows.append(
            [
                mode,
                f"{statistics.median(shipped) * 1e3:,.2f} ({spread(shipped, 1e3, '{:,.2f}')})",
                f"{statistics.median(bare) * 1e3:,.2f} ({spread(bare, 1e3, '{:,.2f}')})",
                f"{statistics.median(ratio):.3f} ({spread(ratio, 1, '{:.3f}')})",
            ]
        )
    heads = [
        "load",
        "as shipped, ms (lowest-highest)",
        "spans' check taken out, ms",
        "shipped / taken out, median of rounds (lowest-highest)",
    ]
    for line in markdown_table(heads, rows):
        report.say(line)
    path.unlink()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=at_least_one, default=4)
    parser.add_argument("--runs", type=at_least_one, default=3, help="streams a process")
    parser.add_argument("--batches", type=at_least_one, default=2000, help="batches a stream")
    parser.add_argument("--tokens", type=at_least_one, default=2**24)
    parser.add_argument("--length", type=at_least_one, default=1025)
    parser.add_argument("--batch", type=at_least_one, default=32)
    parser.add_argument("--size", type=size_arg, default=256 * 2**20, help="the file loaded")
    parser.add_argument("--reads", type=at_least_one, default=3, help="read loads a process")
    parser.add_argument("--maps", type=at_least_one, default=20, help="mapped loads a process")
    parser.add_argument("--dir", type=Path, default=None, help="where the file is written")
    parser.add_argument("--out", type=Path, default=None, help="write the tables as Markdown")
    parser.add_argument("--quick", action="store_true", help="every count at its smallest")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.runs, args.batches, args.tokens = 1, 1, 20, 2**16
        args.size, args.reads, args.maps = 2**20, 1, 1
    if args.length > args.tokens:
        parser.error(f"--length {args.length} is longer than --tokens {args.tokens}")
    return args


def main() -> int:
    args = parse_args()
    state = machine_state()
    report = Report()
    command = " ".join(["python benchmarks/bench_watch.py", *shown_argv(sys.argv[1:])])
    report.say(f"`{command}`")
    report.say("")
    for line in state.lines():
        report.say(line)
    stream_tables(report, args)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        load_table(report, args, Path(folder))
    report.say("\n- load average at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.out is not None:
        args.out.write_text("\n".join(report.lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
