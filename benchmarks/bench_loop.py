"""The story's loop, measured side by side: `devpolicy.windows` against the loop a user
writes by hand, a double-buffered `device_put` loop, and batches already on the device.

    python benchmarks/bench_loop.py [--rounds 5] [--batches 400] [--steps 100]
        [--tokens 268435456] [--length 1025] [--batch 32] [--dim D] [--vocab 32000]
        [--mapped DIR [--cold] [--sparse] [--depth 64] [--keep]] [--out FILE]

One process, one command, on whatever platform JAX finds (the CPU here, an accelerator
where there is one: nothing in the script names a platform). Tokens: a `--tokens` uint16
array in host memory (2**28 is 512 MiB), random windows of `--length` x `--batch`. With
`--mapped DIR`, a file of `--tokens` uint16 tokens is written in DIR, dense (random tokens
in every byte, as a real token file is; `--sparse` writes zeros as a hole instead, which
reads as no real data does), and mapped read-only instead, every feeder reading the same
mapping: the story's 19.09 GiB file is `--tokens 10248871837`. Warm by default (the file
read through once first); with `--cold`, dropped from the page cache before every run
(the share still cached after the drop is printed: a machine that cannot drop it needs a
file larger than its memory instead).

The feeders, each taking turns with the others in every round (A, B, C, A, B, C...):

- `hand loop`: 32 random slices, `np.stack`, `jax.device_put(batch, device)` each step;
- `double-buffered`: the same, the next batch's `device_put` issued before this one is
  used (one transfer always in flight);
- `devpolicy.windows`: `devpolicy.windows(tokens, length, batch, order="random", ...)`;
- `devpolicy + thread`: the same stream read ahead by a thread into a queue of 4 (does a
  read-ahead thread help, given the GIL?);
- with `--mapped`: `windows, gathered on the stream's thread` (the stream without its
  worker thread that gathers a mapping's next group ahead: what that thread gains),
  `positional reads by hand` (one `os.preadv` per window, nothing mapped), `many reads
  in flight by hand` (the disk's limit: `--depth` positional reads in flight, a pool of
  threads, batches read ahead) and `gather from the mapping, never given back` (one fancy
  index a batch, resident memory growing);
- `pre-placed` (the step only): the batches placed before the clock starts: the ceiling,
  the input fully hidden;
- `the story, shipped policy` (the step only, with `--mapped`): the story as a user runs
  it, everything decided by `policies/dataset-on-host.yaml` unchanged, its events logged:
  the file loaded with `devpolicy.load_file` (the tokens stay on the host, mapped), and
  `devpolicy.windows(tokens, ..., order="random")` placing each `batch` where the policy
  says.

Training data: each option of `windows` against the random stream it builds on, side by
side (the pipeline alone, one device): `order="shuffled"` (windows at `length`, and at
every start), a mixture of the tokens' two halves weighted 0.7/0.3 (random, and
shuffled), of twenty slices weighted 1 to 20 (shuffled: 10x the sources), and the random
stream with segment ids (`separator=`, a token of the data); and in the step, the stream
with segment ids feeding a step that keeps its loss within documents.

Last, the time to the first batch of a random, a shuffled and a mixed stream resumed at
step 1 to 10**9 (`windows(..., start=N)`): the same at every step.

Two measures: the pipeline alone (no step: each batch is waited for, `block_until_ready`,
then dropped), on one device and sharded by rows over every device of the default
platform (4 fake CPU devices here); and the step: a jitted embedding lookup into a
`--vocab` x `--dim` table and a `--dim` x `--dim` matmul, fed by each feeder. `--dim`
defaults to 1,024 on an accelerator and 64 on the CPU (a 1,024-wide step takes about a
second a batch on a 2-core CPU, and would hide any feeder). Medians of `--rounds`, and
the ratio of each feeder to the hand loop in the same rounds.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import mmap
import os
import platform
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

if "jax" not in sys.modules:  # 4 CPU devices for the sharded pipeline (CPU platform only)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=4".strip()

import jax
import jax.numpy as jnp
import numpy as np
import structlog.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import devpolicy
from benchmarks._common import (
    dense_tensor_file,
    drop_from_page_cache,
    file_backed_bytes,
    markdown_table,
    read_through,
    sparse_tensor_file,
    statm_counts_file_pages,
)
from devpolicy._apply.stream import cutting

Feeder = Callable[[int], Iterator[Any]]
POLICIES = Path(__file__).resolve().parent.parent / "policies"

#: Every run of every feeder draws its own windows: a seed is never used twice, so no
#: feeder finds pages that another (or its own last run) left mapped, as in a training
#: run that draws fresh windows from a file far larger than what it has touched.
_seeds = itertools.count(1000)


def fresh_seed() -> int:
    return next(_seeds)


def hand(tokens: np.ndarray, length: int, batch: int, where: Any) -> Feeder:
    """What a user writes: slices, np.stack, device_put, each step."""

    def feed(n: int) -> Iterator[Any]:
        rng = np.random.default_rng(fresh_seed())
        starts = len(tokens) - length + 1
        for _ in range(n):
            offsets = rng.integers(0, starts, size=batch)
            yield jax.device_put(np.stack([tokens[o : o + length] for o in offsets]), where)

    return feed


def double_buffered(tokens: np.ndarray, length: int, batch: int, where: Any) -> Feeder:
    """The hand loop with the next batch's transfer issued before this one is used."""

    def feed(n: int) -> Iterator[Any]:
        rng = np.random.default_rng(fresh_seed())
        starts = len(tokens) - length + 1

        def make() -> Any:
            offsets = rng.integers(0, starts, size=batch)
            return jax.device_put(np.stack([tokens[o : o + length] for o in offsets]), where)

        ahead = make()
        for i in range(n):
            current = ahead
            if i + 1 < n:
                ahead = make()
            yield current

    return feed


def positional(path: Path, offset: int, length: int, batch: int, where: Any) -> Feeder:
    """Reads by hand: one `os.preadv` per window into a fresh batch buffer, nothing mapped."""

    def feed(n: int) -> Iterator[Any]:
        rng = np.random.default_rng(fresh_seed())
        starts = (path.stat().st_size - offset) // 2 - length + 1
        size = length * 2
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(n):
                out = np.empty((batch, length), np.uint16)
                slots = memoryview(out).cast("B")
                for i, o in enumerate(rng.integers(0, starts, size=batch).tolist()):
                    os.preadv(fd, [slots[i * size : (i + 1) * size]], offset + o * 2)
                yield jax.device_put(out, where)
        finally:
            os.close(fd)

    return feed


def in_flight(path: Path, offset: int, length: int, batch: int, where: Any, depth: int) -> Feeder:
    """The disk's limit, by hand: `depth` positional reads in flight (a pool of `depth`
    threads, each `os.preadv` with the GIL released), the next batches' reads started
    before this one is sent."""

    def feed(n: int) -> Iterator[Any]:
        rng = np.random.default_rng(fresh_seed())
        starts = (path.stat().st_size - offset) // 2 - length + 1
        size = length * 2
        fd = os.open(path, os.O_RDONLY)
        pool = ThreadPoolExecutor(depth)

        def start() -> tuple[np.ndarray, list[Future[int]]]:
            out = np.empty((batch, length), np.uint16)
            slots = memoryview(out).cast("B")
            offsets = rng.integers(0, starts, size=batch).tolist()
            return out, [
                pool.submit(os.preadv, fd, [slots[i * size : (i + 1) * size]], offset + o * 2)
                for i, o in enumerate(offsets)
            ]

        try:
            ahead = collections.deque(start() for _ in range(min(n, -(-depth // batch) + 1)))
            for i in range(n):
                out, reads = ahead.popleft()
                if i + len(ahead) + 1 < n:
                    ahead.append(start())
                for read in reads:
                    read.result()
                yield jax.device_put(out, where)
        finally:
            pool.shutdown(cancel_futures=True)
            os.close(fd)

    return feed


def gathered(tokens: np.ndarray, length: int, batch: int, where: Any) -> Feeder:
    """One fancy index of a strided view of every window, from the mapping, its pages
    never given back (resident memory grows with the run): what copying out of the
    mapping could reach were pages given back only in rare sweeps."""
    starts = len(tokens) - length + 1
    every = np.lib.stride_tricks.as_strided(
        tokens, shape=(starts, length), strides=(tokens.strides[0],) * 2, writeable=False
    )

    def feed(n: int) -> Iterator[Any]:
        rng = np.random.default_rng(fresh_seed())
        for _ in range(n):
            yield jax.device_put(every[rng.integers(0, starts, size=batch)], where)

    return feed


def stream(
    tokens: Any,
    length: int,
    batch: int,
    policy: devpolicy.Policy,
    *,
    reads: devpolicy.ReadOptions,
    ahead: bool = True,
    **options: Any,
) -> Feeder:
    """`devpolicy.windows`, random unless `options` say otherwise (the training-data
    options: `order="shuffled"`, a mixture's `weights` with `tokens` a mapping, a
    `separator`), its windows read as `reads` says; with `ahead=False`, a mapping's next
    group is gathered on the stream's own thread instead of a worker's (what the worker
    thread gains)."""
    options = {"order": "random", **options}
    if not ahead:
        reads = dataclasses.replace(reads, ahead=False)

    def feed(n: int) -> Iterator[Any]:
        with devpolicy.windows(
            tokens, length, batch, seed=fresh_seed(), steps=n, policy=policy, reads=reads, **options
        ) as batches:
            yield from batches

    return feed


def story(path: Path, length: int, batch: int, reads: devpolicy.ReadOptions) -> Feeder:
    """The story as a user runs it: `policies/dataset-on-host.yaml` unchanged decides where
    the loaded tokens stay (the host, mapped) and where each `batch` goes; its events are
    logged as they would be."""
    shipped = devpolicy.load_policy(POLICIES / "dataset-on-host.yaml", environ={})
    tokens = devpolicy.load_file(path, policy=shipped)["tokens"]
    return stream(tokens, length, batch, shipped, reads=reads)


def threaded(feeder: Feeder) -> Feeder:
    """`feeder` read ahead by a thread into a queue of 4."""

    def feed(n: int) -> Iterator[Any]:
        ahead: queue.Queue[Any] = queue.Queue(maxsize=4)
        done = object()

        def run() -> None:
            for item in feeder(n):
                ahead.put(item)
            ahead.put(done)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        while (item := ahead.get()) is not done:
            yield item
        thread.join()

    return feed


#: The most file-backed memory (MiB) each feeder's pipeline runs left resident, over what
#: was resident when the run began: what it mapped of the token file and kept.
MAPPED_MOST: dict[Feeder, float] = {}


def pipeline_rate(feeder: Feeder, n: int) -> float:
    """Batches a second, each waited for and dropped; every 20th batch (off the clock),
    what is resident of files is noted (`MAPPED_MOST`)."""
    base = file_backed_bytes()
    most = 0
    paused = 0.0
    start = time.perf_counter()
    for i, b in enumerate(feeder(n)):
        jax.block_until_ready(b)
        if base is not None and i % 20 == 0:
            clock = time.perf_counter()
            most = max(most, (file_backed_bytes() or base) - base)
            paused += time.perf_counter() - clock
    rate = n / (time.perf_counter() - start - paused)
    if base is not None:
        MAPPED_MOST[feeder] = max(MAPPED_MOST.get(feeder, 0.0), most / 2**20)
    return rate


def step_rate(step: Callable[[Any], Any], feeder: Feeder, n: int) -> float:
    """Steps a second of `step` fed by `feeder`; the clock stops when the last is done."""
    start = time.perf_counter()
    loss = None
    for b in feeder(n):
        loss = step(b)
    assert loss is not None
    loss.block_until_ready()
    return n / (time.perf_counter() - start)


def side_by_side(
    feeders: dict[str, Feeder],
    rounds: int,
    measure: Callable[[Feeder], float],
    reset: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Each feeder measured once per round, taking turns; one warm-up round first;
    `reset` before every run, off the clock."""
    for feeder in feeders.values():
        reset()
        measure(feeder)
    rates: dict[str, list[float]] = {name: [] for name in feeders}
    for _ in range(rounds):
        for name, feeder in feeders.items():
            reset()
            rates[name].append(measure(feeder))
    return rates


def ratio(rates: dict[str, list[float]], name: str, base: str) -> float:
    """The median over rounds of `name`'s rate over `base`'s in the same round."""
    return statistics.median(v / b for v, b in zip(rates[name], rates[base], strict=True))


def lowest(rates: dict[str, list[float]], name: str, base: str) -> float:
    """The lowest over rounds of `name`'s rate over `base`'s in the same round."""
    return min(v / b for v, b in zip(rates[name], rates[base], strict=True))


def rates_table(
    title: str,
    unit: str,
    rates: dict[str, list[float]],
    bases: list[str],
    mapped: dict[str, float] | None = None,
) -> list[str]:
    """The rates as Markdown; with `mapped`, a column of the file-backed memory (MiB) each
    feeder left resident at most."""
    heads = ["feeder", f"{unit}, median", *(f"x {b}, median of rounds" for b in bases)]
    heads.append("each round")
    if mapped:
        heads.append("file-backed MiB resident at most")
    rows = []
    for name, values in rates.items():
        cells = [name, f"{statistics.median(values):,.0f}"]
        cells += [f"{ratio(rates, name, b):.2f}" for b in bases]
        cells.append(", ".join(f"{v:,.0f}" for v in values))
        if mapped:
            cells.append(f"{mapped[name]:,.0f}" if name in mapped else "")
        rows.append(cells)
    return [f"**{title}**", "", *markdown_table(heads, rows), ""]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400, help="batches a pipeline run")
    parser.add_argument("--steps", type=int, default=100, help="steps a step run")
    parser.add_argument("--tokens", type=int, default=2**28)
    parser.add_argument("--length", type=int, default=1025)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--dim", type=int, default=None)
    parser.add_argument("--mapped", type=Path, default=None, help="map a dense token file here")
    parser.add_argument("--cold", action="store_true", help="drop the file's pages every run")
    parser.add_argument("--sparse", action="store_true", help="a sparse file (zeros) instead")
    parser.add_argument("--depth", type=int, default=64, help="reads in flight by hand")
    parser.add_argument("--keep", action="store_true", help="keep the file for the next run")
    parser.add_argument("--out", type=Path, default=None, help="write the tables as Markdown")
    parser.add_argument(
        "--json", action="store_true", help="also print each table's ratios as JSON"
    )
    parser.add_argument("--no-sharded", action="store_true", help="skip the sharded pipeline")
    parser.add_argument(
        "--mapped-copy",
        choices=["auto", "keep", "file", "budget"],
        default=None,
        help="the read path every stream is held to, ReadOptions(path=...) (default: auto)",
    )
    args = parser.parse_args()
    if (args.cold or args.sparse or args.keep) and args.mapped is None:
        parser.error("--cold, --sparse and --keep describe the --mapped file: give --mapped DIR")
    if args.depth < 1:
        parser.error(f"--depth is the reads in flight by hand, at least 1, got {args.depth}")
    # Every stream's read path: devpolicy's own choice, or the one `--mapped-copy` holds it to.
    reads = devpolicy.ReadOptions(path=args.mapped_copy or "auto")
    backend = jax.default_backend()
    devices = jax.local_devices(backend=backend)
    dim = args.dim or (64 if backend == "cpu" else 1024)
    device = devices[0]
    mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    target = devpolicy.inventory().text(device)
    quiet = {"level": "warning"}
    single = devpolicy.load_policy(
        {"version": 1, "logging": quiet, "rules": [{"match": "batch", "device": target}]},
        environ={},
    )
    sharded = devpolicy.load_policy(
        {
            "version": 1,
            "logging": quiet,
            "meshes": {"rows": {"axes": {"data": len(devices)}, "devices": backend}},
            "rules": [{"match": "batch", "sharding": {"mesh": "rows", "spec": ["data"]}}],
        },
        environ={},
    )
    if args.mapped is None:
        tokens = np.random.default_rng(0).integers(0, args.vocab, args.tokens, dtype=np.uint16)
        reset = lambda: None  # noqa: E731 - nothing mapped to give back
        held = f"{args.tokens:,} uint16 in host memory ({args.tokens * 2 / 2**20:,.0f} MiB)"
    else:
        from devpolicy._read.pages import cached_share

        args.mapped.mkdir(parents=True, exist_ok=True)
        kind = "sparse" if args.sparse else "dense"
        path = args.mapped / f"bench_loop_tokens_{kind}_{args.tokens}.safetensors"
        if not path.exists():  # written once (with --keep): 19.09 GiB dense takes minutes
            if args.sparse:
                sparse_tensor_file(path, args.tokens)
            else:
                dense_tensor_file(path, args.tokens, vocab=args.vocab)
        start = path.stat().st_size - 2 * args.tokens
        if not args.cold:
            # The warm-up: the whole file read once, so that no case alone pays the page
            # cache's first fill (what a long training run meets; say so in the tables).
            read_through(path)
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        tokens = np.frombuffer(mapping, np.uint16, count=args.tokens, offset=start)

        def reset() -> None:
            # What a run faulted in is given back before the next: no feeder finds pages
            # another left mapped, or pays to give back what another faulted in; cold,
            # the page cache forgets the file too.
            mapping.madvise(mmap.MADV_DONTNEED)
            if args.cold:
                drop_from_page_cache(path)

        reset()
        share = cached_share(tokens)
        cached = "not known" if share is None else f"{share:.0%}"
        how = (
            f"cold: dropped from the page cache before every run ({cached} of it still "
            "cached after a drop)"
            if args.cold
            else "warm: read through once first"
        )
        what = (
            "a sparse file (zeros, a hole: no real data reads so)"
            if args.sparse
            else "a dense file (random tokens in every byte)"
        )
        held = (
            f"{args.tokens:,} uint16 mapped from {what}, {args.tokens / 2**29:,.2f} GiB; "
            f"{how}; none of it mapped in at the start of each run"
            + (
                ""
                if statm_counts_file_pages()
                else "; what each feeder left resident is not measured here (this kernel's "
                "/proc/self/statm does not count a file's mapped pages)"
            )
        )
    length, size = args.length, args.batch
    told = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
    with (
        structlog.testing.capture_logs() as seen,
        devpolicy.windows(
            tokens,
            length,
            size,
            order="random",
            seed=0,
            steps=3 * cutting.GROUP_MAX,
            policy=told,
            reads=reads,
        ) as probe,
    ):
        # Three groups: a random stream may turn to reading by position after its first.
        for _ in probe:
            pass
    ended = next(e for e in seen if e["event"] == "stream_ended")
    taken = ended["reads"]
    held += f"; `devpolicy.windows` copies its windows from: {taken} ({ended['reads_why']})"
    reset()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# The story's loop: devpolicy.windows against a hand loop, side by side",
        "",
        f"`python benchmarks/bench_loop.py --rounds {args.rounds} --batches {args.batches} "
        f"--steps {args.steps} --tokens {args.tokens} --length {length} --batch {size} "
        f"--vocab {args.vocab} --dim {dim}{' --mapped DIR' if args.mapped else ''}"
        f"{' --cold' if args.cold else ''}{' --sparse' if args.sparse else ''}`",
        "",
        f"- platform: {backend}, {len(devices)} devices ({device.device_kind}); "
        f"{os.cpu_count()} host cores; load average at start: {load}",
        f"- Python {platform.python_version()}, jax {jax.__version__}, numpy "
        f"{np.__version__}, {platform.system()} {platform.release()} {platform.machine()}",
        f"- tokens: {held}; batches of {size} random windows of {length} "
        f"({size * length * 2 / 1000:,.1f} KB)",
        "",
    ]
    print("\n".join(lines), flush=True)

    def pipelines(where: Any, policy: devpolicy.Policy) -> dict[str, Feeder]:
        feeders = {
            "hand loop": hand(tokens, length, size, where),
            "double-buffered": double_buffered(tokens, length, size, where),
            "devpolicy.windows": stream(tokens, length, size, policy, reads=reads),
            "devpolicy + thread": threaded(stream(tokens, length, size, policy, reads=reads)),
        }
        if args.mapped is not None:
            feeders["windows, gathered on the stream's thread"] = stream(
                tokens, length, size, policy, reads=reads, ahead=False
            )
            feeders["positional reads by hand"] = positional(path, start, length, size, where)
            feeders[f"many reads in flight by hand ({args.depth})"] = in_flight(
                path, start, length, size, where, args.depth
            )
            feeders["gather from the mapping, never given back"] = gathered(
                tokens, length, size, where
            )
        return feeders

    def run(
        title: str,
        unit: str,
        feeders: dict[str, Feeder],
        measure: Any,
        bases: list[str],
        label: str,
    ) -> None:
        rates = side_by_side(feeders, args.rounds, measure, reset)
        mapped = {name: MAPPED_MOST[f] for name, f in feeders.items() if f in MAPPED_MOST}
        part = rates_table(title, unit, rates, bases, mapped if args.mapped is not None else None)
        print("\n".join(part), flush=True)
        lines.extend(part)
        if args.json:
            where = (
                "memory"
                if args.mapped is None
                else f"a {kind} mapped file, {'cold' if args.cold else 'warm'}, copied from {taken}"
            )
            row: dict[str, Any] = {"row": f"loop from {where}: {label}"}
            row |= {f"windows x {b}": round(ratio(rates, "devpolicy.windows", b), 2) for b in bases}
            row |= {
                f"windows x {b}, lowest round": round(lowest(rates, "devpolicy.windows", b), 2)
                for b in bases
            }
            many = next((name for name in rates if name.startswith("many reads")), None)
            if many is not None:
                row["windows x many in flight"] = round(ratio(rates, "devpolicy.windows", many), 2)
            row[f"windows {unit}"] = round(statistics.median(rates["devpolicy.windows"]))
            if "devpolicy.windows" in mapped and args.mapped is not None:
                row["windows file-backed MiB at most"] = round(mapped["devpolicy.windows"])
            if args.mapped is not None:
                row["why"] = ended["reads_why"]
            if "windows, with segment ids" in rates:
                row["windows with segment ids x windows"] = round(
                    ratio(rates, "windows, with segment ids", "devpolicy.windows"), 2
                )
            if "the story, shipped policy" in rates:
                row |= {
                    f"story x {b}": round(ratio(rates, "the story, shipped policy", b), 2)
                    for b in bases
                }
            print(json.dumps(row), flush=True)

    n = args.batches
    run(
        f"The pipeline alone, one device ({target}): {n} batches a run",
        "batches/s",
        pipelines(device, single),
        lambda f: pipeline_rate(f, n),
        ["hand loop", "double-buffered"],
        "pipeline alone, one device",
    )
    if not args.no_sharded and len(devices) > 1:
        run(
            f"The pipeline alone, sharded by rows over {len(devices)} devices: {n} batches a run",
            "batches/s",
            pipelines(rows, sharded),
            lambda f: pipeline_rate(f, n),
            ["hand loop", "double-buffered"],
            "pipeline alone, sharded",
        )

    # Training data: each option against the random stream it builds on, side by side.
    half = len(tokens) // 2
    two = {"web": tokens[:half], "code": tokens[half:]}
    mix = {"web": 0.7, "code": 0.3}
    slice_rows = len(tokens) // 20  # 10x the sources, weighted 1 to 20
    twenty = {f"s{i}": tokens[i * slice_rows : (i + 1) * slice_rows] for i in range(20)}
    twenty_weights = {f"s{i}": float(i + 1) for i in range(20)}
    separator = int(np.asarray(tokens[:length]).reshape(-1)[0])
    data = {
        "devpolicy.windows": stream(tokens, length, size, single, reads=reads),
        "shuffled": stream(tokens, length, size, single, reads=reads, order="shuffled"),
        "shuffled, every start": stream(
            tokens, length, size, single, reads=reads, order="shuffled", stride=1
        ),
        "mixed, 2 sources (random)": stream(
            two, length, size, single, reads=reads, order="random", weights=mix
        ),
        "mixed, 2 sources (shuffled)": stream(
            two, length, size, single, reads=reads, order="shuffled", weights=mix
        ),
        "mixed, 20 sources (shuffled)": stream(
            twenty, length, size, single, reads=reads, order="shuffled", weights=twenty_weights
        ),
        "random, with segment ids": stream(
            tokens, length, size, single, reads=reads, order="random", separator=separator
        ),
    }
    data_rates = side_by_side(data, args.rounds, lambda f: pipeline_rate(f, n), reset)
    part = rates_table(
        f"Training data, the pipeline alone, one device ({target}): {n} batches a run; "
        f"segment ids from token {separator} (one token in {args.vocab:,} of dense random data)",
        "batches/s",
        data_rates,
        ["devpolicy.windows"],
    )
    print("\n".join(part), flush=True)
    lines.extend(part)
    if args.json:
        where = "memory" if args.mapped is None else f"a {kind} mapped file"
        row = {"row": f"training data from {where}: x the random stream"}
        for name in list(data)[1:]:
            row[name] = round(ratio(data_rates, name, "devpolicy.windows"), 2)
            row[f"{name}, lowest round"] = round(lowest(data_rates, name, "devpolicy.windows"), 2)
        print(json.dumps(row), flush=True)

    keys = jax.random.split(jax.random.key(0))
    table_ = jax.device_put(jax.random.normal(keys[0], (args.vocab, dim), jnp.float32), device)
    weight = jax.device_put(jax.random.normal(keys[1], (dim, dim), jnp.float32), device)

    @jax.jit
    def step(table: Any, weight: Any, batch: Any) -> Any:
        hidden = table[batch[:, :-1].astype(jnp.int32)] @ weight  # lookup, then matmul
        return jnp.mean(hidden * hidden)

    @jax.jit
    def documents_step(table: Any, weight: Any, tokens: Any, ids: Any, positions: Any) -> Any:
        # The same step, its loss kept within documents and scaled by position: what a
        # model does with the segments a stream carries, at next to no cost of its own
        # (the ratio is then the segments' cost, not a larger model's).
        hidden = table[tokens[:, :-1].astype(jnp.int32)] @ weight
        same = (ids[:, :-1] == ids[:, 1:]) * (1.0 + positions[:, :-1] * 1e-6)
        return jnp.mean(hidden * hidden * same[..., None])

    def fed(batch: Any) -> Any:
        if isinstance(batch, dict):
            parts = batch["tokens"], batch["segment_ids"], batch["positions"]
            return documents_step(table_, weight, *parts)
        return step(table_, weight, batch)

    steps = args.steps
    placed = list(hand(tokens, length, size, device)(steps))
    jax.block_until_ready(placed)
    feeders = pipelines(device, single)
    feeders["pre-placed"] = lambda n: iter(placed[:n])
    if args.mapped is not None:
        feeders["the story, shipped policy"] = story(path, length, size, reads)
    feeders["windows, with segment ids"] = data["random, with segment ids"]
    run(
        f"The step (lookup in a {args.vocab:,} x {dim} table, {dim} x {dim} matmul), one "
        f"device: {steps} steps a run",
        "steps/s",
        feeders,
        lambda f: step_rate(fed, f, steps),
        ["hand loop", "pre-placed"],
        f"with a {dim}-wide step",
    )
    # Resuming: the time to a resumed stream's first batch, by the step resumed at. A
    # counter-based draw makes it the same at step 10**9 as at step 1.
    at = [1, 10**3, 10**6, 10**7, 10**9]
    kinds: dict[str, tuple[Any, dict[str, Any]]] = {
        "random": (tokens, {"order": "random"}),
        "shuffled": (tokens, {"order": "shuffled"}),
        "mixed, shuffled": (two, {"order": "shuffled", "weights": mix}),
    }
    waits: dict[tuple[str, int], list[float]] = {(k, n): [] for k in kinds for n in at}
    for _ in range(args.rounds + 1):  # the first round warms up
        for kind_name, (source, options) in kinds.items():
            for n in at:
                start_clock = time.perf_counter()
                with devpolicy.windows(
                    source, length, size, seed=7, start=n, policy=single, reads=reads, **options
                ) as resumed:
                    jax.block_until_ready(next(resumed))
                waits[kind_name, n].append(time.perf_counter() - start_clock)
    part = [
        f"**Resuming: the time to the first batch of `windows(..., start=N)`, one device, "
        f"medians of {args.rounds} rounds (ms)**",
        "",
        "| resumed at step | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for n in at:
        cells = " | ".join(f"{statistics.median(waits[k, n][1:]) * 1000:.2f}" for k in kinds)
        part.append(f"| {n:,} | {cells} |")
    print("\n".join([*part, ""]), flush=True)
    lines.extend([*part, ""])
    if args.json:
        for kind_name in kinds:
            row = {"row": f"resume ({kind_name}): ms to the first batch"}
            row |= {
                f"step {n:.0e}": round(statistics.median(waits[kind_name, n][1:]) * 1000, 2)
                for n in at
            }
            print(json.dumps(row), flush=True)
    if args.mapped is not None and not args.keep:
        del tokens
        path.unlink()
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
