"""Loading with devpolicy.load_file against the two lines a user would write, side by side.

    python benchmarks/bench_load.py [--size 1GiB] [--sharded-sizes 64MiB,1GiB,2GiB]
        [--small-tensors 10000] [--runs 5] [--dir DIR] [--flax]
        [--out benchmarks/results/load.md]

Every method runs in a fresh process (4 fake CPU devices; the page cache warm), `--runs`
times, the runs of all methods of a table interleaved. Each row gives the median time
and its spread (lowest-highest), the median peak RSS over the process's baseline (its
own VmHWM) and the ratio to the table's anchor. The anchors are stable: the naive two
lines (`safetensors.numpy.load_file` + `jax.device_put`) and the fresh-memory floor
(map the file, copy it into fresh anonymous memory: what any load that does not map
pays for page faults and a copy). `safetensors.flax.load_file` (`--flax`) is a footnote
of what the naive recipe costs in memory: its time swings several-fold between runs.

Targets (medians):
1. One large uint16 token tensor (`--size`) to the host: <= 0.5x numpy.load_file +
   device_put, and within 2.5x of the floor.
2. `--small-tensors` float32 tensors of 1-64 KiB (10,000: about 320 MiB) to cpu:0:
   <= 0.5x `safetensors.numpy.load_file` plus a `jax.device_put` per tensor.
3. A tensor of each of `--sharded-sizes` sharded 4 ways over 4 devices: <= 0.5x
   `jax.device_put(safetensors.numpy.load_file(f)[k], NamedSharding)`.

The table and the machine's state (the date, cores, load average before and after,
Python, jax, devices) are written to `--out` as Markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import (
    Report,
    at_least_one,
    child_env,
    gib,
    machine_state,
    markdown_table,
    median_known,
    run_child,
    shown_argv,
)

CHILD = r"""
import json, mmap, os, sys, time
from benchmarks._common import PeakRise, growth, status
method, path = sys.argv[1], sys.argv[2]

import jax, numpy as np
import devpolicy, safetensors.flax, safetensors.numpy
# Imported outside the timed region, as jax and devpolicy are: devpolicy imports structlog
# at its first event, a one-time cost per process (60-170 ms here), not a cost per load.
import structlog
from jax.sharding import NamedSharding, PartitionSpec
cpu = jax.local_devices(backend="cpu")[0]
# Logging as users have it by default (info: one summary event per file, rendered to
# stderr, which the parent keeps only to show a failure).
host = devpolicy.load_policy({"version": 1, "default": "cpu"}, environ={})
sharded = devpolicy.load_policy({"version": 1,
    "meshes": {"four": {"axes": {"data": 4}, "devices": "cpu"}},
    "rules": [{"match": "*", "sharding": {"mesh": "four", "spec": ["data"]}}]}, environ={})
mesh = jax.make_mesh((4,), ("data",), devices=jax.local_devices(backend="cpu"))
anon_before, rise = status("RssAnon"), PeakRise()
start = time.perf_counter()
if method == "floor":
    # Map the file, copy it into fresh anonymous memory: page faults and one copy.
    with open(path, "rb") as f:
        source = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    fresh = mmap.mmap(-1, len(source))
    fresh[:] = source
    out = {"fresh": fresh}
elif method == "devpolicy":
    out = devpolicy.load_file(path, policy=host, mmap=False, progress=False)
elif method == "devpolicy-mmap":
    out = devpolicy.load_file(path, policy=host, mmap=True, progress=False)
elif method == "devpolicy-sharded":
    out = devpolicy.load_file(path, policy=sharded, progress=False)
elif method == "flax":
    with jax.default_device(cpu):
        out = safetensors.flax.load_file(path)
elif method == "numpy":
    out = safetensors.numpy.load_file(path)
elif method == "numpy+device_put":
    out = {k: jax.device_put(v, cpu) for k, v in safetensors.numpy.load_file(path).items()}
elif method == "numpy+device_put(NamedSharding)":
    where = NamedSharding(mesh, PartitionSpec("data"))
    out = {k: jax.device_put(v, where) for k, v in safetensors.numpy.load_file(path).items()}
for v in out.values():
    getattr(v, "block_until_ready", lambda: None)()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "anon_kept": growth(status("RssAnon"), anon_before),
                  "peak": rise()}))
"""


def run_load(method: str, path: Path) -> dict[str, float]:
    """One load by `method` in a fresh process of 4 fake CPU devices: its seconds, the
    anonymous memory it kept and its peak rise (the child's own, `PeakRise`: wait4's
    ru_maxrss can include the parent's resident memory copied at fork, which hides small
    peaks)."""
    return run_child(
        CHILD, method, path, what=f"{method} on {path.name}", env=child_env(cpu_devices=4)
    )[-1]


def cat_seconds(path: Path) -> float:
    start = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run(["cat", str(path)], stdout=null, check=True)
    return time.perf_counter() - start


Row = tuple[str, str, Path]  # label, method, file


def run_table(
    report: Report,
    title: str,
    rows: list[Row],
    runs: int,
    anchors: list[str],
    nbytes: int,
) -> dict[str, list[float]]:
    """Run every row `runs` times, interleaved; report medians, spreads and the ratio to
    each anchor; return each label's seconds."""
    samples: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in rows}
    for _ in range(runs):
        for label, method, path in rows:
            samples[label].append(run_load(method, path))
    seconds = {label: [s["seconds"] for s in runs_] for label, runs_ in samples.items()}
    medians = {label: statistics.median(values) for label, values in seconds.items()}
    report.say(f"\n**{title}**\n")
    heads = ["method", "median s", "best-worst s"]
    heads += [f"x {anchor}" for anchor in anchors]
    heads += ["peak RSS", "x tensor", "anon kept"]
    lines = []
    for label, _, _ in rows:
        peak = median_known(s["peak"] for s in samples[label])
        kept = median_known(s["anon_kept"] for s in samples[label])
        cells = [
            label,
            f"{medians[label]:.3f}",
            f"{min(seconds[label]):.3f}-{max(seconds[label]):.3f}",
        ]
        cells += [f"{medians[label] / medians[anchor]:.2f}" for anchor in anchors]
        cells += [gib(peak), "n/a" if peak is None else f"{peak / nbytes:.2f}", gib(kept)]
        lines.append(cells)
    for line in markdown_table(heads, lines):
        report.say(line)
    return seconds


def devices_in_a_child() -> str:
    """How many devices JAX finds in a child (the fake CPU devices each load runs with)."""
    return subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.device_count())"],
        stdout=subprocess.PIPE,
        env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4"),
        text=True,
        check=True,
    ).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="1GiB", help="the large host tensor's size")
    parser.add_argument(
        "--sharded-sizes", default="64MiB,1GiB,2GiB", help="sizes of the sharded tensor"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write the files (default: a temp dir)"
    )
    parser.add_argument(
        "--small-tensors", type=at_least_one, default=10_000, help="tensors of table 2"
    )
    parser.add_argument("--flax", action="store_true", help="add safetensors.flax (slow)")
    parser.add_argument(
        "--out", type=Path, default=None, help="write the results as Markdown to this file"
    )
    args = parser.parse_args()

    import numpy as np
    from safetensors.numpy import save_file as plain_save

    import devpolicy

    report = Report()
    report.say(f"`python benchmarks/bench_load.py {' '.join(shown_argv(sys.argv[1:]))}`")
    report.say()
    for line in machine_state().lines():
        report.say(line)
    report.say(f"- devices in each child: {devices_in_a_child()} (fake CPU devices)")
    size = devpolicy.sizes.parse_size(args.size)
    sharded_sizes = [devpolicy.sizes.parse_size(s) for s in args.sharded_sizes.split(",") if s]
    verdicts: list[str] = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:

        def token_files(nbytes: int) -> tuple[Path, Path]:
            unaligned = Path(tmp) / f"plain-{nbytes}.safetensors"
            aligned = Path(tmp) / f"aligned-{nbytes}.safetensors"
            tokens = rng.integers(0, 32_000, size=nbytes // 2, dtype=np.uint16)
            plain_save({"tokens": tokens}, str(unaligned))
            devpolicy.save_file({"tokens": tokens}, aligned)
            for path in (unaligned, aligned):
                cat_seconds(path)  # warm the page cache
            return unaligned, aligned

        unaligned, aligned = token_files(size)
        offset = devpolicy.plan(unaligned).tensors[0].offset
        report.say(
            f"- large tensor: {gib(size)} uint16; file from safetensors at data offset "
            f"{offset} ({offset % 64} mod 64), from devpolicy.save_file 0 mod 64; `cat` of "
            f"it, best of 3: {min(cat_seconds(unaligned) for _ in range(3)):.3f} s"
        )
        anchor = "numpy.load_file + device_put"
        large: list[Row] = [
            (anchor, "numpy+device_put", unaligned),
            ("floor", "floor", unaligned),
            ("safetensors.numpy.load_file alone", "numpy", unaligned),
            ("devpolicy.load_file, file from safetensors", "devpolicy", unaligned),
            ("devpolicy.load_file, file from save_file", "devpolicy", aligned),
            ("devpolicy.load_file(mmap=True), file from save_file", "devpolicy-mmap", aligned),
        ]
        if args.flax:
            large.append(("safetensors.flax.load_file in a CPU scope", "flax", unaligned))
        host = run_table(
            report,
            f"1. one {gib(size)} token tensor to the host",
            large,
            args.runs,
            [anchor, "floor"],
            size,
        )
        floor = host["floor"]
        report.say(f"\nfloor: best {min(floor):.3f} s, median {statistics.median(floor):.3f} s")
        ours = statistics.median(host["devpolicy.load_file, file from safetensors"])
        ratio = ours / statistics.median(host[anchor])
        verdicts.append(
            f"large host tensor vs {anchor}: {ratio:.2f}x (target <= 0.5): {_verdict(ratio <= 0.5)}"
        )
        ratio = ours / statistics.median(floor)
        verdicts.append(
            f"large host tensor vs the floor (median): {ratio:.2f}x "
            f"(target <= 2.5): {_verdict(ratio <= 2.5)}"
        )

        many = Path(tmp) / "many.safetensors"
        counts = rng.integers(256, 16_385, size=args.small_tensors)
        small = {
            f"layer{i}/w": rng.standard_normal(int(n)).astype(np.float32)
            for i, n in enumerate(counts)
        }
        plain_save(small, str(many))
        small_bytes = sum(v.nbytes for v in small.values())
        del small
        cat_seconds(many)
        naive = "numpy.load_file + device_put each"
        per_tensor = [
            (naive, "numpy+device_put", many),
            ("devpolicy.load_file", "devpolicy", many),
        ]
        small_seconds = run_table(
            report,
            f"2. {args.small_tensors:,} float32 tensors of 1-64 KiB ({gib(small_bytes)}) to cpu:0",
            per_tensor,
            args.runs,
            [naive],
            small_bytes,
        )
        ratio = statistics.median(small_seconds["devpolicy.load_file"]) / statistics.median(
            small_seconds[naive]
        )
        verdicts.append(
            f"small tensors vs {naive}: {ratio:.2f}x (target <= 0.5): {_verdict(ratio <= 0.5)}"
        )

        put_sharded = "numpy.load_file + device_put(NamedSharding)"
        for nbytes in sharded_sizes:
            if nbytes == size:
                plain, padded = unaligned, aligned
            else:
                plain, padded = token_files(nbytes)
            rows = [
                (put_sharded, "numpy+device_put(NamedSharding)", plain),
                ("devpolicy.load_file, sharded rule", "devpolicy-sharded", plain),
                (
                    "devpolicy.load_file, sharded rule, file from save_file",
                    "devpolicy-sharded",
                    padded,
                ),
            ]
            sharded = run_table(
                report,
                f"3. a {gib(nbytes)} tensor sharded 4 ways over 4 devices",
                rows,
                args.runs,
                [put_sharded],
                nbytes,
            )
            ratio = statistics.median(
                sharded["devpolicy.load_file, sharded rule"]
            ) / statistics.median(sharded[put_sharded])
            verdicts.append(
                f"{gib(nbytes)} sharded vs {put_sharded}: {ratio:.2f}x "
                f"(target <= 0.5): {_verdict(ratio <= 0.5)}"
            )
            if plain != unaligned:
                plain.unlink()
                padded.unlink()

        report.say("\n**Targets**\n")
        for line in verdicts:
            report.say(f"- {line}")
        report.say("\n- load average at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(report.lines) + "\n", encoding="utf-8")
        print(f"\nwritten to {args.out}")
    return 0


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
