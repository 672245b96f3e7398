"""Documents packed whole into rows: padding and packing rate of devpolicy's first fit
(`devpolicy._apply.stream.packing`) against grain's `FirstFitPackIterDataset`, on the same
documents, side by side.

    python benchmarks/bench_packing.py [--documents 200000] [--length 2048] [--batch 32]
        [--open-rows 8,16,32] [--grain-bins 8,16,32,128] [--grain-documents 20000]
        [--rounds 3] [--python PYTHON]
        [--out FILE] [--quick]

The documents' lengths are lognormal (mean `--mean` tokens, sigma `--sigma`, at least 2:
a token and its EOS), drawn once with a fixed seed; their tokens are random ids below
32,000 after each other in one uint16 array, each document ending with its EOS (token 0).
Both packers take the same pieces in the same (the file's) order: a document longer than
`--length` is cut into pieces of `--length` (the last shorter), as `packing` cuts it, and
grain is handed the pieces (it would refuse a document longer than a row). Each
measurement is a fresh process (grain's in `--python`, an interpreter with grain 0.2.x;
without grain its rows say so):

- `devpolicy, layout`: the rows' layouts (spans) of every document once, `--batch` x 8
  rows a call (a stream's group);
- `devpolicy, batches`: the same with each group's rows gathered from the tokens, with
  their segment ids and positions (`packed.gather`, `packed.segments`);
- `grain FirstFitPackIterDataset`: the packed rows (tokens, segment ids, positions) of
  every piece, `shuffle_bins=False`, iterated to the end with no read threads (its
  fastest setting here: its default 16 threads cost 7x the CPU time).

grain packs the first `--grain-documents` of the documents only (about 1,500 rows/s
here: the whole set would take a minute a round). The table gives each packer's padding share
(the rows' tokens that are padding), pieces a row, and its rate (rows/s and batches of
`--batch` rows/s, the median of `--rounds`, CPU time of the process: the 2-core machine
this runs on is shared). Issue 58's target: padding at most 3% at length 2,048 for
lognormal lengths of mean 500, sigma 1.0.
Results and their history: docs/benchmarks.md#documents-kept-whole.
"""

from __future__ import annotations

import argparse
import statistics
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

#: The documents and their tokens, made the same in each child from the lengths saved.
SETUP = r"""
import json, sys, time
import numpy as np
path, length, batch, bins = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lengths = np.load(path)
tokens = np.random.default_rng(1).integers(1, 32000, int(lengths.sum())).astype(np.uint16)
ends = np.cumsum(lengths)
tokens[ends - 1] = 0
starts = ends - lengths
"""

OURS = (
    SETUP
    + r"""
from devpolicy._apply.stream.docindex import in_memory
from devpolicy._apply.stream.packed import gather, segments
from devpolicy._apply.stream.packing import Packer, PackSettings
index = in_memory(tokens, 0, "eos")
settings = PackSettings(length, bins, "sequential", None, 1)
began = time.process_time()
packer = Packer(index, settings)
rows = 0
while (layout := packer.take(batch * 8)).rows:
    rows += layout.rows
layouts = time.process_time() - began
tally = packer.tally
began = time.process_time()
packer = Packer(index, settings)
group = batch * 8
out = np.empty((group, length), np.uint16)
ids = (np.empty((group, length), np.int32), np.empty((group, length), np.int32))
while (layout := packer.take(group)).rows == group:
    gather(tokens, layout, 0, out)
    segments(layout, ids)
batches = time.process_time() - began
print(json.dumps({"rows": rows, "padding": tally.padding_share(length),
                  "per_row": tally.per_row(), "layout": layouts, "batches": batches}))
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
pieces = [
    {"tokens": tokens[s + at : s + min(n, at + length)]}
    for s, n in zip(starts.tolist(), lengths.tolist())
    for at in range(0, n, length)
]
began = time.process_time()
fastest = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)  # its fastest here
ds = grain.MapDataset.source(pieces).to_iter_dataset(fastest)
packed = grain.experimental.FirstFitPackIterDataset(
    ds, length_struct={"tokens": length}, num_packing_bins=bins, shuffle_bins=False
)
rows = used = spans = 0
for row in packed:
    rows += 1
    ids = row["tokens_segment_ids"]
    used += int(np.count_nonzero(ids))
    spans += int(ids.max())
seconds = time.process_time() - began
print(json.dumps({"rows": rows, "padding": 1 - used / (rows * length),
                  "per_row": spans / rows, "layout": seconds, "version": grain.__version__}))
"""
)


def counts(text: str) -> list[int]:
    """An argparse type: numbers of 1 or more, separated by commas."""
    return [at_least_one(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=at_least_one, default=200_000)
    parser.add_argument("--length", type=at_least_one, default=2048)
    parser.add_argument("--batch", type=at_least_one, default=32)
    parser.add_argument("--mean", type=float, default=500.0, help="documents' mean tokens")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    parser.add_argument("--open-rows", type=counts, default=[8, 16, 32])
    parser.add_argument("--grain-bins", type=counts, default=[8, 16, 32, 128])
    parser.add_argument(
        "--grain-documents", type=at_least_one, default=20_000,
        help="the first documents grain packs (it packs about 1,500 rows/s here)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=at_least_one, default=3)
    parser.add_argument("--python", default=sys.executable, help="an interpreter with grain")
    parser.add_argument("--dir", type=Path, default=None, help="where the lengths are kept")
    parser.add_argument("--out", type=Path, default=None, help="write the report here too")
    parser.add_argument("--quick", action="store_true", help="every count at its smallest")
    args = parser.parse_args()
    if args.quick:
        args.documents, args.grain_documents, args.rounds = 2000, 500, 1
        args.open_rows, args.grain_bins = args.open_rows[:1], args.grain_bins[:1]
    import numpy as np

    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        mu = np.log(args.mean) - args.sigma**2 / 2  # the lognormal of that mean
        drawn = np.random.default_rng(0).lognormal(mu, args.sigma, args.documents)
        lengths = np.maximum(2, np.rint(drawn)).astype(np.int64)
        path = Path(folder) / "lengths.npy"
        np.save(path, lengths)
        fewer = Path(folder) / "grain-lengths.npy"
        np.save(fewer, lengths[: args.grain_documents])
        report = Report()
        state = machine_state()
        report.say(f"# Documents kept whole: packing ({state.date})")
        report.say()
        shown = " ".join(shown_argv(sys.argv[1:], ("--dir", "--out", "--python")))
        report.say(f"`bench_packing.py {shown}`".replace(" `", "`"))
        report.say()
        for line in state.lines():
            report.say(line)
        report.say(
            f"- {args.documents:,} documents, lengths lognormal (mean {args.mean:g}, sigma "
            f"{args.sigma:g}): mean {lengths.mean():.1f}, median {np.median(lengths):.0f}, "
            f"{int((lengths > args.length).sum()):,} longer than {args.length:,}; grain "
            f"packs the first {min(args.grain_documents, args.documents):,} of them"
        )
        report.say()
        cases = [("devpolicy", n) for n in args.open_rows] + [("grain", n) for n in args.grain_bins]
        results: dict[tuple[str, int], list[dict[str, float]]] = {case: [] for case in cases}
        missing = ""
        for _ in range(args.rounds):
            for who, bins in cases:
                if who == "grain" and missing:
                    continue
                code, python, given = (
                    (OURS, sys.executable, path)
                    if who == "devpolicy"
                    else (GRAIN, args.python, fewer)
                )
                (result,) = run_child(
                    code, given, args.length, args.batch, bins, what=f"{who} ({bins})",
                    python=python,
                )  # fmt: skip
                if "missing" in result:
                    missing = str(result["missing"])
                    continue
                results[(who, bins)].append(result)
        rows = []
        per_batch = args.batch
        for who, bins in cases:
            got = results[(who, bins)]
            if not got:
                rows.append((f"grain FirstFitPackIterDataset, {bins} bins", missing, "", "", ""))
                continue
            first = got[0]
            packed = first["rows"]
            layout = statistics.median(packed / r["layout"] for r in got)
            name = (
                f"devpolicy first fit, {bins} open rows"
                if who == "devpolicy"
                else f"grain FirstFitPackIterDataset, {bins} bins"
            )
            rate = f"{layout:,.0f} ({layout / per_batch:,.0f})"
            full = ""
            if who == "devpolicy":
                whole = statistics.median(packed / r["batches"] for r in got)
                full = f"{whole:,.0f} ({whole / per_batch:,.0f})"
            rows.append(
                (name, f"{100 * first['padding']:.2f}%", f"{first['per_row']:.2f}", rate, full)
            )
        heads = (
            "packer", "padding", "pieces a row", "rows/s (batches/s), layout",
            "rows/s (batches/s), with tokens, ids, positions",
        )  # fmt: skip
        for line in markdown_table(heads, rows):
            report.say(line)
        report.say()
        report.say(f"(batches of {per_batch} rows; medians of {args.rounds} rounds, CPU time)")
        if args.out is not None:
            args.out.write_text("\n".join(report.lines) + "\n")


if __name__ == "__main__":
    main()
