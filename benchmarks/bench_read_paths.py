"""The read path a stream chooses, against every path forced, side by side in one run: is
`windows`' own choice as fast as the best path on this machine, in this state?

    python benchmarks/bench_read_paths.py --dir DIR [--tokens 3221225472] [--rounds 5]
        [--batches 1500] [--length 1025] [--batch 32] [--busy N] [--cold] [--no-io-uring]
        [--through]

A dense file of `--tokens` uint16 tokens (random tokens in every byte, as a real token
file is; written once in DIR and kept) is mapped read-only. Random windows, `--batch` of
`--length` a batch, the pipeline alone (each batch waited for, then dropped), fresh
windows every run. The feeders take turns within each round (A, B, C, A, B, C...):

- `hand loop`: 32 memmap slices, `np.stack`, `jax.device_put` each step;
- `double-buffered`: the same, the next batch's transfer issued before this one is used;
- `64 reads in flight by hand` (with `--cold`): a pool of 64 threads, one `os.preadv`
  a window, batches read ahead;
- `windows, its own choice`: `devpolicy.windows(..., reads="auto")`;
- `windows, read by position` and `windows, mapping kept`: the same stream held to one
  path (`reads="file"`, `reads="keep"`); where io_uring can be had, `windows, read by
  position, ring not polled` too (`ReadOptions(path="file", polled=False)`: a worker
  thread enters the ring, no kernel thread polls it).

The host's state, for the whole run: `--busy N` runs N CPU-bound processes beside it (a
training host's loader, logger and checkpoint writer want the cores too); `--cold` drops
the file from the page cache before every run; `--through` reads the file through once
first, so its pages are large folios in the cache (the default warms it by a first
round); `--no-io-uring` holds every stream to `ReadOptions(io_uring=False)`, as on a host
without io_uring (gVisor, a seccomp profile). The table gives each feeder's batches/s
(median of rounds), its rate over the hand loop's, the double-buffered loop's and the
best forced path's in the same round (medians), and the path the stream's own choice
ended on. Results and their history: docs/benchmarks.md#choosing-the-read-path-by-measurement.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import jax
import numpy as np
import structlog.testing

import devpolicy
from benchmarks._common import (
    dense_tensor_file,
    drop_from_page_cache,
    machine_state,
    markdown_table,
    read_through,
)
from benchmarks.bench_loop import (
    Feeder,
    double_buffered,
    fresh_seed,
    hand,
    in_flight,
    pipeline_rate,
    side_by_side,
)

#: A CPU-bound process: what `--busy` starts beside the run.
BUSY = "while True: pass"


def chosen(tokens: Any, length: int, batch: int, reads: devpolicy.ReadOptions,
           ended: list[str]) -> Feeder:  # fmt: skip
    """`devpolicy.windows` with `reads`; the read path each run ended on goes to `ended`."""
    policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})

    def feed(n: int) -> Any:
        with structlog.testing.capture_logs() as logs, devpolicy.windows(
            tokens, length, batch, order="random", seed=fresh_seed(), steps=n,
            reads=reads, policy=policy,
        ) as batches:  # fmt: skip
            yield from batches
        for event in logs:
            if event["event"] == "stream_ended":
                way = event["reads"]
                ended.append(f"file ({event['reads_with']})" if way == "file" else way)

    return feed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, required=True, help="where the token file is kept")
    parser.add_argument("--tokens", type=int, default=3 * 2**30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=1500, help="batches a run")
    parser.add_argument("--length", type=int, default=1025)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside it")
    parser.add_argument("--cold", action="store_true", help="drop the file every run")
    parser.add_argument("--through", action="store_true", help="read the file through first")
    parser.add_argument("--no-io-uring", action="store_true", help="streams without io_uring")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"read_paths_dense_{args.tokens}.safetensors"
    if not path.exists():
        dense_tensor_file(path, args.tokens)
    size = path.stat().st_size
    offset = size - 2 * args.tokens  # the tensor's data ends the file
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(args.tokens,))
    if args.through:
        read_through(path)
    where = jax.devices()[0]
    io_uring = not args.no_io_uring
    ended: list[str] = []
    feeders: dict[str, Feeder] = {
        "hand loop": hand(tokens, args.length, args.batch, where),
        "double-buffered": double_buffered(tokens, args.length, args.batch, where),
    }
    if args.cold:
        feeders["64 reads in flight by hand"] = in_flight(
            path, offset, args.length, args.batch, where, 64
        )
    feeders["windows, its own choice"] = chosen(
        tokens, args.length, args.batch, devpolicy.ReadOptions(io_uring=io_uring), ended
    )
    forced = {
        "windows, read by position": devpolicy.ReadOptions(path="file", io_uring=io_uring),
        "windows, mapping kept": devpolicy.ReadOptions(path="keep", io_uring=io_uring),
    }
    if io_uring:  # the ring entered by a worker thread, not polled by a kernel thread
        forced["windows, read by position, ring not polled"] = devpolicy.ReadOptions(
            path="file", polled=False
        )
    for name, reads in forced.items():
        feeders[name] = chosen(tokens, args.length, args.batch, reads, [])

    def reset() -> None:
        if args.cold:
            drop_from_page_cache(path)

    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    began = machine_state()
    try:
        rates = side_by_side(
            feeders, args.rounds, lambda feeder: pipeline_rate(feeder, args.batches), reset
        )
    finally:
        for process in busy:
            process.kill()
    state = (
        ("cold (dropped every run)" if args.cold else "warm")
        + (", read through first" if args.through else "")
        + (f", {args.busy} CPU-bound process(es) beside it" if args.busy else ", nothing beside it")
        + (", streams without io_uring" if args.no_io_uring else "")
    )
    load = "not known" if began.load is None else f"{began.load[0]:.1f}"
    print(
        f"{began.date}, {began.machine}, {began.cores} cores, jax {began.jax}, load "
        f"{load} at the start; {args.tokens:,} tokens ({size / 2**30:.1f} GiB), dense, "
        f"{state}; {args.batches} random batches of {args.batch} x {args.length} a run, "
        f"{args.rounds} rounds taking turns\n"
    )
    best = [name for name in feeders if name in forced]
    rows = []
    for name, values in rates.items():
        cells = []
        for base in ("hand loop", "double-buffered"):
            cells.append(statistics.median(v / b for v, b in zip(values, rates[base], strict=True)))
        top = [max(rates[f][i] for f in best) for i in range(len(values))]
        cells.append(statistics.median(v / t for v, t in zip(values, top, strict=True)))
        rows.append([name, f"{statistics.median(values):,.0f}", *(f"{c:.2f}" for c in cells)])
    heads = ["feeder", "batches/s", "x hand loop", "x double-buffered", "x best forced path"]
    print("\n".join(markdown_table(heads, rows)))
    counts = {path: ended.count(path) for path in dict.fromkeys(ended)}
    print(f"\nthe stream's own choice ended on: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
