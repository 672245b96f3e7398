"""What a batch's segment ids and positions cost: `devpolicy.windows` with `separator=`
beside the same stream without, in the pipeline alone.

    python benchmarks/bench_segments.py [--rounds 7] [--batches 6000] [--tokens 268435456]
        [--length 1025] [--batch 32] [--every 65536]
        [--out benchmarks/results/segments.md] [--quick] [--host] [--device]
        [--against DIR]

Each round runs one process per kind, taking turns (tokens, segments, tokens, ...), each
timing the pipeline alone (every array of every batch waited for, then dropped) of a
random stream of `--batches` batches of `--batch` windows of `--length` uint16 tokens from
`--tokens` dense random tokens in memory (below `--every`, at most 2**16: the separator,
7, one token in `--every`; 500 puts a few documents in every row, as web text does), the
seed the round's, after a warm-up stream of 64 batches. Medians of the rounds and of
each round's ratio, of the time and of the CPU time (every thread of the process: what
other processes' load moves least, where the time's rounds spread widely). Then, in one
more process a kind, the bytes handed to JAX to send host-to-device per batch (every numpy
array given to `jax.device_put`, `jax.make_array_from_callback`,
`jax.make_array_from_process_local_data` or the jitted call that places a group on a CPU,
counted).
`--against DIR`: every kind run again on the devpolicy of another checkout (DIR: the
folder holding its `devpolicy/`), in the same rounds, the two checkouts taking turns
(which goes first alternates): a before and after under the same load, each with its
rows and the ratio of their times a batch with segments, round by round.
`--quick`: every count at its smallest (seconds, for tests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import (
    REPO,
    Report,
    at_least_one,
    child_env,
    machine_state,
    markdown_table,
    run_child,
    shown_argv,
)

#: One timed stream, in a process of its own.
PROBE = r"""
import json, sys, time
import numpy as np
import jax
import devpolicy
kind, count, length, batch, batches, seed, bytes_only, every = sys.argv[1:9]
count, length, batch, batches, seed, every = map(int, (count, length, batch, batches, seed,
                                                       every))
tokens = np.random.default_rng(0).integers(0, every, count, dtype=np.uint16)
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}})
options = {"order": "random"}
if kind != "tokens":
    options["separator"] = 7
from devpolicy._apply.stream import groups
if kind == "host-segments":  # the host's ids and positions sent, as a CPU device is
    groups.on_the_device = lambda sharding: False
if kind == "device-segments":  # worked out by the device's code, even a CPU's
    groups.copies_host_memory = lambda decision: True
host_groups = [0]
placed_from_host = groups.placed_from_host
def counted_host(*args, **kwargs):
    host_groups[0] += 1
    return placed_from_host(*args, **kwargs)
groups.placed_from_host = counted_host
def compiled():
    # A stream works its first groups' ids out on the host while the device's code
    # compiles on a thread of its own: the timed run starts once every compile is done.
    for future in list(groups._COMPILING.values()):
        future.result()
def stream(seed, steps):
    return devpolicy.windows(tokens, length, batch, seed=seed, steps=steps, policy=policy,
                             **options)
def drain(batches):
    for b in batches:
        for array in (b.values() if isinstance(b, dict) else (b,)):
            array.block_until_ready()
if bytes_only == "1":
    sent = [0]
    def counted(real):
        def wrapper(x, *args, **kwargs):
            for leaf in jax.tree.leaves(x):
                if isinstance(leaf, np.ndarray):
                    sent[0] += leaf.nbytes
            return real(x, *args, **kwargs)
        return wrapper
    def counted_callback(real):
        def wrapper(shape, sharding, callback, *args, **kwargs):
            def back(index):
                part = callback(index)
                sent[0] += getattr(part, "nbytes", 0)
                return part
            return real(shape, sharding, back, *args, **kwargs)
        return wrapper
    jax.device_put = counted(jax.device_put)
    jax.make_array_from_process_local_data = counted(jax.make_array_from_process_local_data)
    jax.make_array_from_callback = counted_callback(jax.make_array_from_callback)
    # Where the CPU is handed a group's arrays by one jitted call: those arrays too.
    given_calls = {}
    real_given = groups.placed_as_given
    def placed_as_given(*key):
        if key not in given_calls:  # one function a key: its compile is looked up by it
            work = real_given(*key)
            def counted_work(*arrays):
                sent[0] += sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))
                return work(*arrays)
            given_calls[key] = counted_work
        return given_calls[key]
    groups.placed_as_given = placed_as_given
    drain(stream(10**6 + seed, 64))
    compiled()
    sent[0] = 0
    drain(stream(seed, batches))
    print(json.dumps({"bytes": sent[0] / batches}))
else:
    drain(stream(10**6 + seed, 64))
    compiled()
    host_groups[0] = 0
    start, cpu = time.perf_counter(), time.process_time()
    drain(stream(seed, batches))
    print(json.dumps({"rate": batches / (time.perf_counter() - start),
                      "cpu": (time.process_time() - cpu) / batches,
                      "host_groups": host_groups[0]}))
"""

KINDS = ("tokens", "segments")
#: `--host`: also the segments worked out on the host and sent, on any device (the path a
#: CPU device takes; on an accelerator, the one its device code replaced).
HOST_KIND = "host-segments"
#: `--device`: also the segments worked out by the device's code on any device, a CPU too.
DEVICE_KIND = "device-segments"
DEVICE_KINDS = ("segments", DEVICE_KIND)


def probe(
    kind: str,
    args: argparse.Namespace,
    seed: int,
    *,
    bytes_only: bool = False,
    checkout: Path | None = None,
) -> dict[str, float]:
    """One child's figures: batches/s (`rate`) and CPU seconds a batch (`cpu`), or bytes
    handed to JAX a batch (`bytes`); with `checkout`, of the devpolicy in that folder
    (first on the child's import path)."""
    env = None
    if checkout is not None:
        env = child_env()
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")])
    (found,) = run_child(
        PROBE, kind, args.tokens, args.length, args.batch,
        args.batches if not bytes_only else min(args.batches, 256), seed,
        int(bytes_only), args.every, what=f"the {kind} probe", env=env,
    )  # fmt: skip
    if not bytes_only and found["host_groups"] and kind in DEVICE_KINDS and not args.quick:
        print(f"{kind}: {found['host_groups']} groups took the host's path", file=sys.stderr)
    return {key: float(value) for key, value in found.items() if key != "host_groups"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=at_least_one, default=7)
    parser.add_argument("--batches", type=at_least_one, default=6000)
    parser.add_argument("--tokens", type=at_least_one, default=2**28)
    parser.add_argument("--length", type=at_least_one, default=1025)
    parser.add_argument("--batch", type=at_least_one, default=32)
    parser.add_argument(
        "--every", type=at_least_one, default=2**16, help="the separator one token in this"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the report here")
    parser.add_argument("--quick", action="store_true", help="every count at its smallest")
    parser.add_argument("--host", action="store_true", help=f"also the {HOST_KIND!r} kind")
    parser.add_argument("--device", action="store_true", help=f"also the {DEVICE_KIND!r} kind")
    parser.add_argument(
        "--against", type=Path, default=None, help="also another checkout's devpolicy, in turns"
    )
    args = parser.parse_args()
    if not 8 <= args.every <= 2**16:
        parser.error(f"--every must be from 8 to 65536 (uint16 tokens), got: {args.every}")
    if args.against is not None and not (args.against / "devpolicy").is_dir():
        parser.error(f"--against must be a checkout holding devpolicy/, got: {args.against}")
    kinds = (*KINDS, *[HOST_KIND] * args.host, *[DEVICE_KIND] * args.device)
    if args.quick:
        args.rounds, args.batches, args.tokens, args.length, args.batch = 1, 16, 2**16, 65, 4
    # Each checkout's devpolicy first on its children's path where two are compared (else
    # the interpreter's own, as for every benchmark).
    sides: dict[str, Path | None] = {"": None}
    if args.against is not None:
        sides = {"this checkout": REPO, "--against": args.against}
    state = machine_state()
    report = Report()
    report.say("# Segment ids and positions: a batch with them beside one without")
    report.say()
    argv = shown_argv(sys.argv[1:], ("--dir", "--out", "--against"))
    against = " --against OTHER-CHECKOUT" if args.against is not None else ""
    report.say(f"`python benchmarks/bench_segments.py {' '.join(argv)}{against}`")
    report.say()
    for line in state.lines():
        report.say(line)
    rates: dict[tuple[str, str], list[float]] = {(s, k): [] for s in sides for k in kinds}
    cpus: dict[tuple[str, str], list[float]] = {(s, k): [] for s in sides for k in kinds}
    for seed in range(args.rounds):
        order = list(sides) if seed % 2 == 0 else list(reversed(sides))
        for side in order:
            for kind in kinds:
                found = probe(kind, args, seed, checkout=sides[side])
                rates[side, kind].append(found["rate"])
                cpus[side, kind].append(found["cpu"])
    sent = {
        (side, kind): probe(kind, args, 0, bytes_only=True, checkout=sides[side])["bytes"]
        for side in sides
        for kind in kinds
    }
    report.say(f"- load average at the end: {machine_state().load_text()}")
    report.say()
    report.say(
        f"{args.batches:,} batches of {args.batch} x {args.length} uint16 a run, random "
        f"windows of {args.tokens:,} tokens in memory (the separator one in {args.every:,}), "
        f"the pipeline alone; medians of {args.rounds} rounds, taking turns"
    )
    report.say()
    tokens_bytes = args.batch * args.length * 2
    rows = []
    times: dict[tuple[str, str], list[float]] = {}
    for side, kind in rates:
        each = rates[side, kind]
        base = rates[side, "tokens"]
        # A batch's time and CPU time, x the tokens' alone in the same round.
        times[side, kind] = [b / r for b, r in zip(base, each, strict=True)]
        cpu = [c / b for c, b in zip(cpus[side, kind], cpus[side, "tokens"], strict=True)]
        rows.append((
            f"{kind} ({side})" if side else kind,
            f"{statistics.median(each):,.0f}",
            f"{min(each):,.0f}-{max(each):,.0f}",
            f"{statistics.median(times[side, kind]):.2f}x",
            ", ".join(f"{t:.2f}" for t in times[side, kind]),
            f"{statistics.median(cpu):.2f}x ({', '.join(f'{c:.2f}' for c in cpu)})",
            f"{sent[side, kind]:,.0f} ({sent[side, kind] / tokens_bytes:.2f}x)",
        ))  # fmt: skip
    heads = (
        "batch", "batches/s, median", "spread", "time a batch x tokens alone, median",
        "each round", "CPU time a batch x tokens alone, median (each round)",
        "bytes sent host-to-device a batch (x the tokens')",
    )  # fmt: skip
    for line in markdown_table(heads, rows):
        report.say(line)
    if args.against is not None:
        ours, theirs = times["this checkout", "segments"], times["--against", "segments"]
        each = [a / b for a, b in zip(ours, theirs, strict=True)]
        report.say()
        report.say(
            f"A batch with segments, this checkout's time x tokens over the other's, round "
            f"by round: {', '.join(f'{x:.2f}' for x in each)}; median "
            f"{statistics.median(each):.2f}"
        )
    if args.out is not None:
        args.out.write_text("\n".join(report.lines) + "\n")


if __name__ == "__main__":
    main()
