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

`--shards N` measures instead the first batch of `windows` over N shard files against one
file of the same tokens, side by side: the `--tokens` cut into N raw uint16 `.bin` files
(nanoGPT's), each mapped by `np.memmap` (`[np.memmap(p, ...) for p in sorted(...)]`,
timed apart: the caller's opening), and the same tokens as one `.bin` file, mapped; the
files written once in DIR and read through. Each is a fresh process (JAX's backend started,
one tiny stream of memory run to its end first: what every stream pays once, the first
event's logging among it); the clock runs from `windows(...)` to its first batch on the
device, the two taking turns within each round; the ratio is the shards' time over the
one file's in the same round (median).
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


#: One measurement of `--shards`, in a fresh process: JSON {"seconds", "opening"}.
SHARDS_CHILD = r"""
import json, sys, time
from pathlib import Path
folder, kind = sys.argv[1:3]
length, batch = map(int, sys.argv[3:5])
import jax, numpy as np
jax.device_put(np.zeros(1)).block_until_ready()  # the backend started, before any pipeline
import devpolicy
policy = devpolicy.load_policy({"version": 1})
# What the main rounds' `load_file` pays before their clock: the first event's logging.
list(devpolicy.windows(np.zeros(8, np.uint16), 4, 1, steps=1, policy=policy))
opened = time.perf_counter()
if kind == "one file":
    tokens = np.memmap(Path(folder) / "all.bin", dtype=np.uint16, mode="r")
else:
    files = sorted(Path(folder).glob("shard_*.bin"))
    tokens = [np.memmap(p, dtype=np.uint16, mode="r") for p in files]
began = time.perf_counter()
stream = devpolicy.windows(tokens, length, batch, order="random", seed=0, policy=policy)
first = next(stream)
first.block_until_ready()
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "opening": began - opened}))
"""
SHARD_KINDS = ("one file", "shards")


def shard_files(folder: Path, source: Path, tokens: int, count: int) -> None:
    """The tokens of `source` (a dense safetensors file) as one raw `.bin` file and as
    `count` of them, nearly equal (written once)."""
    import numpy as np

    if len(list(folder.glob("shard_*.bin"))) == count and (folder / "all.bin").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("shard_*.bin"):
        old.unlink()
    data = np.fromfile(source, dtype=np.uint8)
    values = data[data.size - 2 * tokens :].view(np.uint16)  # the tensor is last, 64-aligned
    values.tofile(folder / "all.bin")
    for index, part in enumerate(np.array_split(values, count)):
        part.tofile(folder / f"shard_{index:05d}.bin")


def shards_section(args: argparse.Namespace, path: Path, report: Report) -> None:
    """The first batch over `--shards` files against one file of the same tokens."""
    folder = args.dir / f"shards-{args.tokens}-{args.shards}"
    shard_files(folder, path, args.tokens, args.shards)
    for file in sorted(folder.glob("*.bin")):
        read_through(file)
    times: dict[str, list[float]] = {kind: [] for kind in SHARD_KINDS}
    opening: dict[str, list[float]] = {kind: [] for kind in SHARD_KINDS}
    ratios: list[float] = []
    for _ in range(args.rounds):
        this_round = {}
        for kind in SHARD_KINDS:
            (result,) = run_child(
                SHARDS_CHILD, folder, kind, args.length, args.batch, what=f"windows, {kind}"
            )
            this_round[kind] = result["seconds"]
            times[kind].append(result["seconds"])
            opening[kind].append(result["opening"])
        ratios.append(this_round["shards"] / this_round["one file"])
    report.say(f"## `windows` over {args.shards:,} shard files against one file")
    report.say()
    rows = []
    for kind in SHARD_KINDS:
        ms = [1000 * s for s in times[kind]]
        label = "one file" if kind == "one file" else f"{args.shards:,} shard files"
        rows.append(
            (
                label,
                f"{statistics.median(ms):.1f}",
                f"{min(ms):.1f}-{max(ms):.1f}",
                f"{1000 * statistics.median(opening[kind]):.1f}",
                "1.00x" if kind == "one file" else f"{statistics.median(ratios):.2f}x",
            )
        )
    heads = (
        "tokens",
        "first batch, ms (median)",
        "spread, ms",
        "np.memmap opening, ms",
        "/ one file",
    )
    for line in markdown_table(heads, rows):
        report.say(line)
    report.say()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the token file is kept")
    parser.add_argument("--tokens", type=int, default=2**28, help="uint16 tokens in the file")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--length", type=int, default=1025)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--python", default=sys.executable, help="an interpreter with grain")
    parser.add_argument("--out", type=Path, default=None, help="write the report here too")
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help="instead: the first batch over this many shard files against one file",
    )
    args = parser.parse_args()
    if args.shards < 0 or (args.shards and args.tokens < args.shards):
        parser.error(f"--shards must be from 1 to --tokens ({args.tokens}), got {args.shards}")
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
    if args.shards:
        shards_section(args, path, report)
    for source in SOURCES if not args.shards else ():
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
