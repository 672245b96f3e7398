"""`devpolicy.windows` of two versions of devpolicy, side by side in one run: is a change
slower than the code before it?

    python benchmarks/bench_versions.py --base REV [--rounds 6] [--batches 2000]
        [--tokens 536870912] [--length 1025] [--batch 32] [--dir DIR]
        [--kinds random,segments,mixed]

`REV` (a commit, a branch) is checked out into a temporary git worktree; the working tree
is the other version. Each round runs one process per version and per source, taking
turns (base, this, base, this...), each timing the pipeline alone (every batch waited
for, then dropped) of a random stream of `--batches` batches with fresh windows (the seed
is the round's). Kinds: `random` (the story's stream), `segments` (the same with segment
ids and positions from a separator token) and `mixed` (a shuffled mixture of the tokens'
two halves, weighted 70/30). Sources: `--tokens` uint16 tokens in memory, and the same tokens in a
dense file (random tokens in every byte, written once in `--dir`, default a temporary
folder) mapped read-only with `np.memmap`, read through once first (warm). Medians of the
rounds, and this version's rate over the base's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout first on the path
from benchmarks._common import at_least_one, dense_tensor_file, read_through  # noqa: E402

#: One timed stream, in a process of its own (so each version imports its own devpolicy).
PROBE = r"""
import json, os, sys, time
import numpy as np
import devpolicy
source, path, count, length, batch, batches, seed, kind = sys.argv[1:9]
count, length, batch, batches, seed = map(int, (count, length, batch, batches, seed))
if source == "memory":
    tokens = np.random.default_rng(0).integers(0, 2**16, count, dtype=np.uint16)
else:
    start = os.path.getsize(path) - 2 * count  # the tensor's data ends the file
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=start, shape=(count,))
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}})
options = {"order": "random"}
if kind == "segments":
    options["separator"] = 7
elif kind == "mixed":
    half = count // 2
    tokens = {"a": tokens[:half], "b": tokens[half:]}
    options = {"order": "shuffled", "weights": {"a": 0.7, "b": 0.3}}
def stream(seed, steps):
    return devpolicy.windows(tokens, length, batch, seed=seed, steps=steps, policy=policy,
                             **options)
def drain(batches):
    for b in batches:
        for array in (b.values() if isinstance(b, dict) else (b,)):
            array.block_until_ready()
drain(stream(10**6 + seed, 64))
start = time.perf_counter()
drain(stream(seed, batches))
print(json.dumps({"rate": batches / (time.perf_counter() - start)}))
"""


#: What a probe streams (see the docstring).
KINDS = ("random", "segments", "mixed")


def dense_file(folder: Path, count: int) -> Path:
    """`count` random tokens below 32,000 in every byte of a file (`dense_tensor_file`, as the
    other benchmarks write theirs), read through once."""
    path = folder / f"dense-{count}.safetensors"
    if not path.exists():
        dense_tensor_file(path, count)
    read_through(path)
    return path


def run(
    checkout: Path, source: str, kind: str, path: Path, args: argparse.Namespace, seed: int
) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, source, str(path), str(args.tokens), str(args.length),
         str(args.batch), str(args.batches), str(seed), kind],
        env=env, capture_output=True, text=True, check=True, cwd=checkout,
    )  # fmt: skip
    rate: float = json.loads(done.stdout.strip().splitlines()[-1])["rate"]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=at_least_one, default=6)
    parser.add_argument("--batches", type=at_least_one, default=2000)
    parser.add_argument("--tokens", type=at_least_one, default=2**29)
    parser.add_argument("--length", type=at_least_one, default=1025)
    parser.add_argument("--batch", type=at_least_one, default=32)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--kinds", default="random", help="comma-separated: random,segments,mixed")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    for kind in kinds:
        if kind not in KINDS:
            parser.error(f"--kinds takes {', '.join(KINDS)}, got {kind!r}")
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            folder = args.dir or Path(scratch)
            path = dense_file(folder, args.tokens)
            rates: dict[tuple[str, str, str], list[float]] = {}
            for seed in range(args.rounds):
                for kind in kinds:
                    for source in ("memory", "mapped"):
                        for name, checkout in (("base", base), ("this", REPO)):
                            rate = run(checkout, source, kind, path, args, seed)
                            rates.setdefault((kind, source, name), []).append(rate)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                check=False, capture_output=True,
            )  # fmt: skip
    print(
        f"windows, {args.batches} batches of {args.batch} x {args.length} uint16, "
        f"pipeline alone; {args.tokens:,} tokens, dense; medians of {args.rounds} rounds, "
        f"taking turns; base {args.base}\n"
    )
    print(
        "| kind | source | base batches/s | this batches/s | this / base "
        "| each round's this / base |"
    )
    print("|---|---|---|---|---|---|")
    for kind in kinds:
        for source in ("memory", "mapped"):
            base, this = rates[(kind, source, "base")], rates[(kind, source, "this")]
            old, new = statistics.median(base), statistics.median(this)
            each = ", ".join(f"{t / b:.2f}" for b, t in zip(base, this, strict=True))
            print(f"| {kind} | {source} | {old:,.0f} | {new:,.0f} | {new / old:.2f}x | {each} |")


if __name__ == "__main__":
    main()
