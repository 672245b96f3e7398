"""The accelerator benchmarks: loading onto the chip and feeding it windows, devpolicy
against the lines a user would write, side by side in one process.

    python benchmarks/bench_accelerator.py [--size 1GiB] [--steps 300] [--runs 5] [--json]
        [--reads auto|keep|budget|file]

Only one process at a time can hold a TPU, so everything runs in this one, on whatever
accelerator `accelerator` resolves to (a TPU, else a GPU); with none it prints one row
saying so and exits 0. Methods alternate (A, B, A, B, ...) and each row gives the median
of `--runs` and the spread (lowest-highest). Rows:

1. start: seconds from the first JAX call to the devices being listed (the chip's start).
2. load: a file of float32 tensors of 64 MiB each (`--size` in all, in the page cache)
   onto the chip: `devpolicy.load_file` against `safetensors.numpy.load_file` plus a
   `jax.device_put` per tensor (when safetensors is installed), in GiB/s.
3. windows: random batches of 32 windows of 1,025 uint16 tokens from a mapped token file
   (dense: random tokens in every byte) to the chip, `--steps` per run: `devpolicy.windows`
   against a hand loop (`np.stack` of 32 slices and `jax.device_put`), in steps/s; warm
   (the file in the page cache) and cold (dropped from it before every run, where the
   machine allows: the share still cached is in the row's note). Before every run the
   pages the last one mapped are given back, so no run finds another's. `--reads` holds
   the stream to one read path (`devpolicy.ReadOptions(path=...)`; default `auto`, its
   own choice), said in the row's note.

With `--json` each row is printed as one JSON object per line (what
`benchmarks/accelerator_lane.py` reads); otherwise as a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PART = 64 * 2**20
WINDOW, BATCH = 1025, 32


def row(name: str, unit: str, values: dict[str, list[float]], note: str = "") -> dict[str, Any]:
    """A result row: per method its median and spread."""
    return {
        "row": name,
        "unit": unit,
        "methods": {
            m: {"median": statistics.median(v), "low": min(v), "high": max(v), "runs": len(v)}
            for m, v in values.items()
        },
        "note": note,
    }


def alternate(methods: dict[str, Callable[[], float]], runs: int) -> dict[str, list[float]]:
    """Each method `runs` times, interleaved A, B, A, B."""
    out: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(runs):
        for name, method in methods.items():
            out[name].append(method())
    return out


def bench_load(chip: Any, target: str, folder: Path, nbytes: int, runs: int) -> dict[str, Any]:
    import jax

    import devpolicy

    parts = max(1, nbytes // PART)
    path = folder / "weights.safetensors"
    devpolicy.save_file(
        {f"w{i}": np.full(PART // 4, i, np.float32) for i in range(parts)},
        path,
        policy=devpolicy.load_policy({"version": 1}, environ={}),
    )
    total = parts * PART / 2**30
    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "*", "device": target}]}, environ={}
    )

    def with_devpolicy() -> float:
        start = time.perf_counter()
        out = devpolicy.load_file(path, policy=policy)
        jax.block_until_ready(out)
        seconds = time.perf_counter() - start
        assert next(iter(next(iter(out.values())).devices())) == chip
        del out
        return total / seconds

    methods = {"devpolicy.load_file": with_devpolicy}
    try:
        import safetensors.numpy

        def by_hand() -> float:
            start = time.perf_counter()
            out = {k: jax.device_put(v, chip) for k, v in safetensors.numpy.load_file(path).items()}
            jax.block_until_ready(out)
            seconds = time.perf_counter() - start
            del out
            return total / seconds

        methods["safetensors.numpy + device_put"] = by_hand
    except ImportError:
        pass
    note = f"{parts} x 64 MiB float32, {total:.2f} GiB"
    return row("load onto the chip", "GiB/s", alternate(methods, runs), note)


def bench_windows(
    chip: Any, target: str, folder: Path, steps: int, runs: int, *, cold: bool, reads: Any
) -> dict[str, Any]:
    """`devpolicy.windows` (its windows read as `reads`, a `devpolicy.ReadOptions`, says)
    against a hand loop, to the chip."""
    import jax

    import devpolicy
    from devpolicy._read.pages import Pager, cached_share

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._common import drop_from_page_cache

    count = 256 * 2**20  # 512 MiB of uint16 tokens
    path = folder / "train.safetensors"
    tokens = np.random.default_rng(0).integers(0, 32_000, size=count, dtype=np.uint16)
    devpolicy.save_file(
        {"tokens": tokens}, path, policy=devpolicy.load_policy({"version": 1}, environ={})
    )
    del tokens
    policy = devpolicy.load_policy(
        {
            "version": 1,
            "rules": [
                {"match": "train/*", "device": "cpu", "mmap": True},
                {"match": "batch", "device": target},
            ],
        },
        environ={},
    )
    mapped = devpolicy.load_file(path, policy=policy)["tokens"]
    view = devpolicy.host_view(mapped)
    pager = Pager(view, random=False)  # gives the mapping's pages back between runs

    def reset() -> None:
        pager.sweep()
        if cold:
            drop_from_page_cache(path)

    reset()
    share = cached_share(view)
    # A seed per run and per feeder, never reused: no run finds the windows (and pages)
    # of a run before it, as a training run over a large file does not.
    seeds = itertools.count(1)

    def with_devpolicy() -> float:
        stream = devpolicy.windows(
            mapped,
            WINDOW,
            BATCH,
            order="random",
            seed=next(seeds),
            steps=steps,
            policy=policy,
            reads=reads,
        )
        start = time.perf_counter()
        last = None
        for batch in stream:
            last = batch
        assert last is not None
        last.block_until_ready()
        return steps / (time.perf_counter() - start)

    def by_hand() -> float:
        rng = np.random.default_rng(next(seeds))
        start = time.perf_counter()
        last = None
        for _ in range(steps):
            starts = rng.integers(0, count - WINDOW, size=BATCH)
            last = jax.device_put(np.stack([view[s : s + WINDOW] for s in starts]), chip)
        assert last is not None
        last.block_until_ready()
        return steps / (time.perf_counter() - start)

    def after_reset(method: Callable[[], float]) -> Callable[[], float]:
        return lambda: (reset(), method())[1]

    values = alternate(
        {
            "devpolicy.windows": after_reset(with_devpolicy),
            "np.stack + device_put": after_reset(by_hand),
        },
        runs,
    )
    pager.close()
    cached = "not known" if share is None else f"{share:.0%}"
    how = f"cold ({cached} cached after a drop)" if cold else "warm"
    note = (
        f"{BATCH} x {WINDOW} uint16 from a mapped 512 MiB dense file, {how}, {steps} steps "
        f"a run, fresh windows every run, reads={reads.path!r}"
    )
    return row(f"windows to the chip, {how.split()[0]} file", "steps/s", values, note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB", help="bytes to load (default 1GiB)")
    parser.add_argument("--steps", type=int, default=300, help="window batches a run")
    parser.add_argument("--runs", type=int, default=5, help="runs of each method")
    parser.add_argument("--json", action="store_true", help="one JSON row per line")
    parser.add_argument(
        "--reads",
        choices=["auto", "keep", "budget", "file"],
        default="auto",
        help="the read path the windows stream is held to (default auto: its own choice)",
    )
    parser.add_argument(
        "--target",
        default="accelerator",
        help="the device to bench (default accelerator; cpu tries the code where there is none)",
    )
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import jax

    import devpolicy

    jax.devices()
    started = time.perf_counter() - start
    rows: list[dict[str, Any]] = []
    if args.target == "accelerator" and devpolicy.inventory().accelerator is None:
        rows.append({"row": "benchmarks", "skipped": "no accelerator: JAX finds no TPU or GPU"})
    else:
        chip = devpolicy.get_device(args.target)
        rows.append(
            {
                "row": "machine",
                "device": f"{devpolicy.inventory().text(chip)} {chip.device_kind}",
                "jax": jax.__version__,
                "python": sys.version.split()[0],
                "cores": os.cpu_count(),
                "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            }
        )
        rows.append(row("start (import jax to devices listed)", "s", {"jax": [started]}))
        with tempfile.TemporaryDirectory() as folder:
            size = devpolicy.sizes.parse_size(args.size)
            rows.append(bench_load(chip, args.target, Path(folder), size, args.runs))
            reads = devpolicy.ReadOptions(path=args.reads)
            for cold in (False, True):
                rows.append(
                    bench_windows(
                        chip,
                        args.target,
                        Path(folder),
                        args.steps,
                        args.runs,
                        cold=cold,
                        reads=reads,
                    )
                )
    for r in rows:
        print(json.dumps(r) if args.json else format_row(r))
    return 0


def format_row(r: dict[str, Any]) -> str:
    """One row as text: `name: method median unit (low-high), ...`."""
    if "methods" not in r:
        return f"{r['row']}: " + ", ".join(f"{k} {v}" for k, v in r.items() if k != "row")
    parts = [
        f"{m} {v['median']:.3g} {r['unit']} ({v['low']:.3g}-{v['high']:.3g})"
        for m, v in r["methods"].items()
    ]
    note = f" [{r['note']}]" if r.get("note") else ""
    return f"{r['row']}: " + "; ".join(parts) + note


if __name__ == "__main__":
    sys.exit(main())
