"""How soon a fresh stream's first batch is on the device: `windows` against grain's
fastest setting and a hand loop, side by side on the same data.

    python benchmarks/bench_first_batch.py --dir DIR [--tokens 268435456] [--rounds 7]
        [--length 1025] [--batch 32] [--python PYTHON] [--out FILE]

A dense file of `--tokens` uint16 tokens (random tokens in every byte; written once in DIR
and kept, read through once so it is warm) is loaded by `load_file`: mapped
(`mmap=True`), or read into JAX's host memory (`mmap=False`), or that copied into a numpy
array. Each measurement is a fresh process: JAX's backend started and one tiny array placed
first (what every feeder pays once, before any pipeline), the tokens loaded (the loaded
array kept: its unmapping is work JAX's next transfer would wait on), the feeder's module
imported; then the clock runs from making the pipeline to its first batch of random
windows ready on the device (`block_until_ready`). The feeders take turns within each round:

- `hand loop`: `--batch` random slices of the view, `np.stack`, `jax.device_put`;
- `windows`: `devpolicy.windows(tokens, length, batch, order="random")`, its own read path;
- `grain, no read threads` (grain's fastest first batch: nothing started but the caller):
  `MapDataset.range(...).random_map(window).batch(batch)` iterated with
  `ReadOptions(num_threads=0, prefetch_buffer_size=0)`, the batch sent by `device_put`;
- `grain, default read options`: the same with grain's defaults (16 threads, 500 ahead).

`--python` is an interpreter with grain installed (and devpolicy importable); without
grain the grain rows say so. The table gives each feeder's median time to the first
batch (ms), its spread over the rounds, and its ratio to grain's fastest in the same
round (medians). Results and their history: docs/benchmarks.md#the-first-batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import (
    Report,
    dense_tensor_file,
    machine_state,
    markdown_table,
    read_through,
    run_child,
    shown_argv,
)

FEEDERS = ("hand loop", "windows", "grain, no read threads", "grain, default read options")
SOURCES = ("mapped file", "loaded into memory", "numpy memory")

#: One measurement, in a fresh process: JSON {"seconds": ...} or {"missing": why}.
CHILD = r"""
import json, sys, time
path, source, feeder = sys.argv[1:4]
length, batch = map(int, sys.argv[4:6])
import jax, numpy as np
jax.device_put(np.zeros(1)).block_until_ready()  # the backend started, before any pipeline
import devpolicy
policy = devpolicy.load_policy({"version": 1})
mapped = source == "mapped file"
loaded = devpolicy.load_file(path, mmap=mapped, policy=policy)["tokens"]  # kept: freeing
tokens = loaded  # it is JAX's work (an unmapping), which the next transfer would wait on
view = devpolicy.host_view(loaded)
if source == "numpy memory":
    view = np.array(view)
    tokens = view
starts = view.shape[0] - length + 1
if feeder.startswith("grain"):
    try:
        import grain
    except ImportError:
        print(json.dumps({"missing": "grain is not installed in this interpreter"}))
        raise SystemExit(0)
    fastest = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    options = fastest if "no read" in feeder else None
began = time.perf_counter()
if feeder == "hand loop":
    rng = np.random.default_rng(0)
    first = jax.device_put(np.stack([view[s : s + length] for s in rng.integers(0, starts, batch)]))
elif feeder == "windows":
    stream = devpolicy.windows(tokens, length, batch, order="random", seed=0, policy=policy)
    first = next(stream)
else:
    def window(index, rng):
        s = rng.integers(0, starts)
        return view[s : s + length]
    ds = grain.MapDataset.range(2**40).random_map(window, seed=0).batch(batch)
    first = jax.device_put(next(iter(ds.to_iter_dataset(options))))
first.block_until_ready()
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "shape": list(first.shape)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the token file is kept")
    parser.add_argument("--tokens", type=int, default=2**28, help="uint16 tokens in the file")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--length", type=int, default=1025)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--python", default=sys.executable, help="an interpreter with grain")
    parser.add_argument("--out", type=Path, default=None, help="write the report here too")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"dense-{args.tokens}.safetensors"
    if not path.exists():
        dense_tensor_file(path, args.tokens)
    read_through(path)
    report = Report()
    state = machine_state()
    report.say(f"# The first batch of a fresh stream ({state.date})")
    report.say()
    report.say(
        "`bench_first_batch.py "
        f"{' '.join(shown_argv(sys.argv[1:], ('--dir', '--out', '--python')))}`"
    )
    report.say()
    for line in state.lines():
        report.say(line)
    report.say("- the token file warm (read through once before the rounds)")
    report.say()
    for source in SOURCES:
        times: dict[str, list[float]] = {f: [] for f in FEEDERS}
        ratios: dict[str, list[float]] = {f: [] for f in FEEDERS}
        missing: dict[str, str] = {}
        for _ in range(args.rounds):
            this_round: dict[str, float] = {}
            for feeder in FEEDERS:
                if feeder in missing:
                    continue
                (result,) = run_child(
                    CHILD, path, source, feeder, args.length, args.batch,
                    what=f"{feeder} ({source})", python=args.python,
                )  # fmt: skip
                if "missing" in result:
                    missing[feeder] = result["missing"]
                    continue
                this_round[feeder] = result["seconds"]
                times[feeder].append(result["seconds"])
            fastest_grain = this_round.get("grain, no read threads")
            for feeder, seconds in this_round.items():
                if fastest_grain:
                    ratios[feeder].append(seconds / fastest_grain)
        report.say(f"## Tokens: {source}")
        report.say()
        rows = []
        for feeder in FEEDERS:
            if feeder in missing:
                rows.append((feeder, missing[feeder], "", ""))
                continue
            ms = [1000 * s for s in times[feeder]]
            rows.append(
                (
                    feeder,
                    f"{statistics.median(ms):.1f}",
                    f"{min(ms):.1f}-{max(ms):.1f}",
                    f"{statistics.median(ratios[feeder]):.2f}x" if ratios[feeder] else "",
                )
            )
        heads = ("feeder", "first batch, ms (median)", "spread, ms", "/ grain, no read threads")
        for line in markdown_table(heads, rows):
            report.say(line)
        report.say()
    if args.out is not None:
        args.out.write_text("\n".join(report.lines) + "\n")


if __name__ == "__main__":
    main()
