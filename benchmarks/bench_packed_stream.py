"""A packed stream's rate: `devpolicy.windows(pack="first_fit")` beside the unpacked stream
(windows with segment ids, and windows alone) and grain's packing, in the pipeline alone.

    python benchmarks/bench_packed_stream.py [--rounds 5] [--batches 3000]
        [--documents 400000] [--length 2048] [--batch 32] [--python PYTHON]
        [--file] [--shards N] [--busy] [--out FILE] [--quick]

One corpus for all: `--documents` documents of lognormal lengths (mean 500 tokens, sigma
1.0, each ended by its EOS, token 0), their tokens random ids below 32,000 in one uint16
array, in memory (with `--file`: written to a file and mapped, its pages warm). Each round
runs one process a kind, taking turns, each timing `--batches` batches of `--batch` rows
of `--length` tokens after a warm-up of 64, every array of every batch waited for, then
dropped:

- `windows, tokens`: `order="shuffled"` windows alone;
- `windows, separator`: the same with their segment ids and positions (`separator=0`);
- `packed`: `pack="first_fit"` rows of shuffled documents (16 open rows), with their ids
  and positions;
- `grain`: grain's `FirstFitPackIterDataset` (16 bins) over the same documents shuffled
  (`MapDataset.shuffle`), batched (`.batch`) and sent by `jax.device_put` (no read
  threads: grain's fastest setting here), in `--python` (an interpreter with grain 0.2.x
  and JAX).

`--shards N`: the same tokens also written as N shard files (raw uint16, `np.memmap`
each), and a packed stream over that list timed beside (`--file` implied).

`--busy`: one process spinning on a core beside each timed one (a loaded machine). The
table gives each kind's batches/s (median of the rounds) and its ratio to the packed
stream's, each round's ratio taken in the round (median). Issue 58's target: packed >=
0.8x the unpacked stream's rate, and ahead of grain's packing. Results and their history:
docs/benchmarks.md#documents-kept-whole.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import (
    Report,
    at_least_one,
    machine_state,
    markdown_table,
    run_child,
    shown_argv,
)

#: The corpus, the same in each process: from the lengths saved, a fixed seed.
SETUP = r"""
import json, sys, time
import numpy as np
kind, path, length, batch, batches, seed, tokens_at = sys.argv[1:8]
length, batch, batches, seed = map(int, (length, batch, batches, seed))
lengths = np.load(path)
if kind == "shards":  # the same tokens as shard files, each mapped
    from pathlib import Path
    files = sorted(Path(tokens_at).parent.glob("shards/*.bin"))
    tokens = [np.memmap(f, np.uint16, "r") for f in files]
elif tokens_at != "-":
    tokens = np.memmap(tokens_at, np.uint16, "r")
else:
    tokens = np.random.default_rng(1).integers(1, 32000, int(lengths.sum())).astype(np.uint16)
    tokens[np.cumsum(lengths) - 1] = 0
"""

OURS = (
    SETUP
    + r"""
import jax
import devpolicy
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}})
options = {"order": "shuffled", "seed": seed, "report_every": None}
if kind in ("separator", "packed", "shards"):
    options["separator"] = 0
if kind in ("packed", "shards"):
    options |= {"pack": "first_fit", "pad": 0}
def run(count):
    stream = devpolicy.windows(tokens, length, batch, policy=policy, **options)
    began = time.perf_counter()
    for _, b in zip(range(count), stream):
        jax.block_until_ready(b)
    seconds = time.perf_counter() - began
    stream.close()
    return seconds
run(64)
# On an accelerator a stream's ids and positions are worked out by a device function
# that compiles on a thread of its own (the host's meanwhile): timed once it is done.
from devpolicy._apply.stream import groups
for compiling in list(groups._COMPILING.values()):
    compiling.result()
print(json.dumps({"seconds": run(batches)}))
"""
)

GRAIN = (
    SETUP
    + r"""
try:
    import grain
except ImportError:
    print(json.dumps({"missing": "grain is not installed in this interpreter"}))
    raise SystemExit(0)
import jax
ends = np.cumsum(lengths)
starts = ends - lengths
class Pieces:
    # The documents by index, each cut into pieces of a row at most, as packing cuts them.
    def __len__(self):
        return len(lengths)
    def __getitem__(self, i):
        s, n = int(starts[i]), int(lengths[i])
        return {"tokens": np.asarray(tokens[s : s + min(n, length)])}
def run(count):
    fastest = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ds = grain.MapDataset.source(Pieces()).shuffle(seed=seed).to_iter_dataset(fastest)
    packed = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct={"tokens": length}, num_packing_bins=16, shuffle_bins=False
    ).batch(batch)
    began = time.perf_counter()
    for _, b in zip(range(count), packed):
        jax.block_until_ready(jax.device_put(b))
    return time.perf_counter() - began
run(64)
print(json.dumps({"seconds": run(batches)}))
"""
)

KINDS = ("tokens", "separator", "packed", "grain")
NAMES = {
    "tokens": "windows, tokens alone",
    "separator": "windows, with segment ids",
    "packed": "packed rows (first fit, 16 open)",
    "grain": "grain FirstFitPackIterDataset (16 bins), batched, device_put",
    "shards": "packed rows from the same tokens as shard files (--shards)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=at_least_one, default=5)
    parser.add_argument("--batches", type=at_least_one, default=3000)
    parser.add_argument("--grain-batches", type=at_least_one, default=200)
    parser.add_argument("--documents", type=at_least_one, default=400_000)
    parser.add_argument("--length", type=at_least_one, default=2048)
    parser.add_argument("--batch", type=at_least_one, default=32)
    parser.add_argument("--python", default=sys.executable, help="an interpreter with grain")
    parser.add_argument("--file", action="store_true", help="tokens mapped from a file")
    parser.add_argument("--busy", action="store_true", help="a core kept busy beside")
    parser.add_argument(
        "--shards", type=at_least_one, default=None, help="also packed from N shard files"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the corpus is kept")
    parser.add_argument("--out", type=Path, default=None, help="write the report here too")
    parser.add_argument("--quick", action="store_true", help="every count at its smallest")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches, args.grain_batches, args.documents = 1, 64, 16, 20_000
    import numpy as np

    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        mu = np.log(500.0) - 0.5  # the lognormal of mean 500, sigma 1
        drawn = np.random.default_rng(0).lognormal(mu, 1.0, args.documents)
        lengths = np.maximum(2, np.rint(drawn)).astype(np.int64)
        path = Path(folder) / "lengths.npy"
        np.save(path, lengths)
        tokens_at = "-"
        if args.shards:
            args.file = True
        if args.file:
            tokens = np.random.default_rng(1).integers(1, 32000, int(lengths.sum()))
            tokens = tokens.astype(np.uint16)
            tokens[np.cumsum(lengths) - 1] = 0
            tokens_at = str(Path(folder) / "tokens.bin")
            tokens.tofile(tokens_at)
            if args.shards:
                (Path(folder) / "shards").mkdir()
                for i, part in enumerate(np.array_split(tokens, args.shards)):
                    part.tofile(Path(folder) / "shards" / f"shard_{i:05d}.bin")
            del tokens
        report = Report()
        state = machine_state()
        report.say(f"# A packed stream's rate ({state.date})")
        report.say()
        shown = " ".join(shown_argv(sys.argv[1:], ("--dir", "--out", "--python")))
        report.say(f"`bench_packed_stream.py {shown}`".replace(" `", "`"))
        report.say()
        for line in state.lines():
            report.say(line)
        report.say(
            f"- {args.documents:,} documents ({int(lengths.sum()):,} tokens, "
            f"{'a warm mapped file' if args.file else 'in memory'}), rows of "
            f"{args.length:,}, batches of {args.batch}; "
            f"{'one core kept busy beside' if args.busy else 'nothing else running'}"
        )
        report.say()
        kinds = (*KINDS, "shards") if args.shards else KINDS
        rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        ratios: dict[str, list[float]] = {kind: [] for kind in kinds}
        missing = ""
        spinner = None
        if args.busy:
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for round_ in range(args.rounds):
                got: dict[str, float] = {}
                for kind in kinds:
                    if kind == "grain" and missing:
                        continue
                    code, python = (GRAIN, args.python) if kind == "grain" else (OURS, None)
                    count = args.grain_batches if kind == "grain" else args.batches
                    (result,) = run_child(
                        code, kind, path, args.length, args.batch, count, round_, tokens_at,
                        what=kind, python=python or sys.executable,
                    )  # fmt: skip
                    if "missing" in result:
                        missing = str(result["missing"])
                        continue
                    got[kind] = count / float(result["seconds"])
                    rates[kind].append(got[kind])
                for kind, rate in got.items():
                    ratios[kind].append(rate / got["packed"])
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        rows = []
        for kind in kinds:
            if not rates[kind]:
                rows.append((NAMES[kind], missing, ""))
                continue
            rate = statistics.median(rates[kind])
            ratio = statistics.median(ratios[kind])
            spread = f"{min(rates[kind]):,.0f}-{max(rates[kind]):,.0f}"
            rows.append((NAMES[kind], f"{rate:,.0f} ({spread})", f"{ratio:.2f}x"))
        for line in markdown_table(("stream", "batches/s (rounds)", "of packed's rate"), rows):
            report.say(line)
        report.say()
        report.say(
            f"(medians of {args.rounds} rounds; the packed stream at >= 0.8x the unpacked "
            "one's rate: each unpacked row's ratio at most 1.25x)"
        )
        if args.out is not None:
            args.out.write_text("\n".join(report.lines) + "\n")


if __name__ == "__main__":
    main()
