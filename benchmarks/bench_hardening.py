"""Two loads that used to scale badly, each method in a fresh process, side by side.

    python benchmarks/bench_hardening.py [--rows 1048576] [--counts 100000,200000,400000]
        [--runs 1] [--before-python PYTHON] [--skip-small] [--skip-sharded]

1. A (rows, 4) float32 tensor sharded on its last dimension (`spec: [null, x]`) over 4
   fake CPU devices, against `jax.device_put(safetensors.numpy.load_file(f)["w"],
   NamedSharding(mesh, P(None, "x")))`. Each device's slice is one 4-byte run per row: the
   loader used to read it with one `pread` per row per device; it now reads the covering
   range once, in 8 MiB chunks, and cuts the slices out in memory. Target: within 2x of
   the reference's time, peak RSS within 1.5x of the tensor's bytes.
2. Files of many small float32 tensors (1-64 elements, written by safetensors: offsets
   unaligned, so with `mmap=True` about one tensor in 16 maps and the rest are read in
   runs between them), loaded with `mmap=True`. Finding each run used to copy the rest of
   the file's order (`order[start + 1:]`), quadratic in the count; the time per tensor
   should now stay flat as the count doubles.

`--before-python` runs the devpolicy rows a second time under another interpreter (one
whose environment has the code before the change installed) and prints both with the
ratio. Case 3 times the batching alone (no reading, no placing) with the loader's own
`may_map` and `small_run`, in this process, against the figures recorded before the fix
(below): no copy of the former algorithm is kept to drift from the code it stood for.

Measured once on the 2-core development VM (shared, so loads' absolute times are noisy),
warm page cache, each load after a warm-up load of a small file in the same process:

| case | before | after |
|---|---|---|
| (1M, 4) float32 (16 MiB), `[null, x]` over 4 devices | 40.1 s, peak 91 MiB | 0.081 s, 24 MiB |
| the reference: numpy.load_file + device_put(NamedSharding) | 0.101 s, 32 MiB | |
| load 100,000 small tensors, `mmap=True` | 42.8 s | 38.7 s |
| load 200,000 small tensors, `mmap=True` | 112.4 s | 61.3 s |
| batching alone, 100,000 tensors | 4.38 s | 0.34 s |
| batching alone, 200,000 tensors | 20.4 s | 0.48 s |
| batching alone, 400,000 tensors | 175 s | 0.93 s |

What is left of a small-tensor load is JAX's cost per array (about 300 us each on that
machine under load) and deciding each name, both linear.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import child_env, mib, run_child

CHILD = r"""
import json, sys, time
from benchmarks._common import PeakRise
method, path = sys.argv[1], sys.argv[2]

import jax, numpy as np
import devpolicy, safetensors.numpy
from jax.sharding import NamedSharding, PartitionSpec
quiet = {"level": "error"}
host = devpolicy.load_policy({"version": 1, "default": "cpu", "logging": quiet}, environ={})
columns = devpolicy.load_policy({"version": 1, "logging": quiet,
    "meshes": {"four": {"axes": {"x": 4}, "devices": "cpu"}},
    "rules": [{"match": "*", "sharding": {"mesh": "four", "spec": [None, "x"]}}]}, environ={})
mesh = jax.make_mesh((4,), ("x",), devices=jax.local_devices(backend="cpu"))

def load(path):
    if method == "devpolicy-columns":
        out = devpolicy.load_file(path, policy=columns, progress=False)
    elif method == "reference-columns":
        where = NamedSharding(mesh, PartitionSpec(None, "x"))
        out = {k: jax.device_put(v, where) for k, v in safetensors.numpy.load_file(path).items()}
    elif method == "devpolicy-small-mmap":
        out = devpolicy.load_file(path, policy=host, mmap=True, progress=False)
    for v in out.values():
        v.block_until_ready()
    return out

# Warm up on a small file of the same kind: first-call costs (imports, JAX's set-up) aside.
load(sys.argv[3])
rise = PeakRise()
start = time.perf_counter()
out = load(path)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak": rise(), "tensors": len(out)}))
"""


def run_load(python: str, method: str, path: Path, warm: Path) -> dict[str, float]:
    """One load by `method` in a fresh process of `python` (4 fake CPU devices), after a
    warm-up load of `warm`: its seconds, peak rise and tensor count."""
    # Run from the file's directory: `-c` puts the working directory first on the path, and
    # each interpreter must import its own devpolicy.
    return run_child(
        CHILD,
        method,
        path,
        warm,
        what=f"{method} on {path.name} under {python}",
        python=python,
        env=child_env(cpu_devices=4),
        cwd=path.parent,
    )[-1]


def best(python: str, method: str, path: Path, warm: Path, runs: int) -> dict[str, float]:
    """The fastest of `runs` fresh processes (noise on a shared machine only adds time)."""
    return min(
        (run_load(python, method, path, warm) for _ in range(runs)), key=lambda r: r["seconds"]
    )


#: Case 3 before the fix (`order[start + 1:]` copied the rest of the order per run),
#: measured on the 2-core development VM: seconds for the batching alone, by tensor count.
RECORDED_BEFORE = {100_000: 4.38, 200_000: 20.4, 400_000: 175.0}


def run_finding(path: Path) -> float:
    """Seconds to split a file's tensors into mapped ones and read runs, as `load_file`
    does with `mmap=True` (no reading, no placing: only the batching), with the loader's
    own functions and a real decision."""
    import devpolicy
    from devpolicy._io.format.header import read_header
    from devpolicy._io.reading.buffers import MAP_THRESHOLD as _MAP_THRESHOLD
    from devpolicy._io.reading.map_or_read import may_map as _may_map
    from devpolicy._io.reading.readahead import small_run

    policy = devpolicy.load_policy(
        {"version": 1, "default": "cpu", "logging": {"level": "error"}}, environ={}
    )
    decision = policy.decide("t", nbytes=4, shape=(1,))
    header = read_header(path)
    decisions = [decision] * len(header.tensors)
    order = sorted(range(len(header.tensors)), key=lambda i: header.tensors[i].offset)
    start = time.perf_counter()
    position = 0
    while position < len(order):
        entry = header.tensors[order[position]]
        assert entry.nbytes < _MAP_THRESHOLD  # small tensors only: the path measured here
        if _may_map(entry, decision, True):
            position += 1
            continue
        position += len(small_run(header, decisions, order, position, True, False))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2**20, help="rows of the (rows, 4) tensor")
    parser.add_argument(
        "--counts", default="100000,200000", help="small-tensor counts loaded, comma separated"
    )
    parser.add_argument(
        "--run-counts", default="100000,200000,400000", help="counts for the batching alone"
    )
    parser.add_argument("--runs", type=int, default=1, help="fresh processes per row (best of)")
    parser.add_argument("--before-python", default=None, help="interpreter with the old code")
    parser.add_argument("--skip-small", action="store_true")
    parser.add_argument("--skip-sharded", action="store_true")
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files")
    args = parser.parse_args()

    import numpy as np
    from safetensors.numpy import save_file as plain_save

    pythons = [("after", sys.executable)]
    if args.before_python:
        pythons.insert(0, ("before", args.before_python))

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if not args.skip_sharded:
            path = Path(tmp) / "columns.safetensors"
            w = np.arange(args.rows * 4, dtype=np.float32).reshape(args.rows, 4)
            plain_save({"w": w}, str(path))
            warm = Path(tmp) / "warm-columns.safetensors"
            plain_save({"w": w[:1024]}, str(warm))
            print(f"\n1. ({args.rows}, 4) float32 ({mib(w.nbytes)}), spec [null, x], 4 devices")
            print(f"{'method':52} {'seconds':>9} {'peak RSS':>9} {'x tensor':>9} {'x ref':>7}")
            ref = best(sys.executable, "reference-columns", path, warm, args.runs)
            rows = [("numpy.load_file + device_put(NamedSharding)", ref)]
            for label, python in pythons:
                rows.append(
                    (
                        f"devpolicy.load_file ({label})",
                        best(python, "devpolicy-columns", path, warm, args.runs),
                    )
                )
            for label, r in rows:
                times = "n/a" if r["peak"] is None else f"{r['peak'] / w.nbytes:.2f}"
                print(
                    f"{label:52} {r['seconds']:9.3f} {mib(r['peak']):>9} "
                    f"{times:>9} {r['seconds'] / ref['seconds']:7.2f}"
                )
            del w

        if not args.skip_small:
            rng = np.random.default_rng(0)
            warm = Path(tmp) / "warm-small.safetensors"
            plain_save(
                {f"t{i}": np.full(i % 64 + 1, i, np.float32) for i in range(1000)}, str(warm)
            )
            print("\n2. many small float32 tensors (1-64 elements), mmap=True")
            header = f"{'tensors':>8}"
            for label, _ in pythons:
                header += f" {label + ' s':>10} {'us/tensor':>10}"
            if len(pythons) == 2:
                header += f" {'after/before':>13}"
            print(header)
            for count in (int(c) for c in args.counts.split(",")):
                path = Path(tmp) / f"small-{count}.safetensors"
                sizes = rng.integers(1, 65, size=count)
                plain_save(
                    {f"t{i:07}": np.full(int(n), i, np.float32) for i, n in enumerate(sizes)},
                    str(path),
                )
                line = f"{count:8}"
                seconds = []
                for _, python in pythons:
                    r = best(python, "devpolicy-small-mmap", path, warm, args.runs)
                    assert r["tensors"] == count
                    seconds.append(r["seconds"])
                    line += f" {r['seconds']:10.2f} {r['seconds'] / count * 1e6:10.1f}"
                if len(seconds) == 2:
                    line += f" {seconds[1] / seconds[0]:13.3f}"
                print(line, flush=True)
                path.unlink()

        if not args.skip_runs:
            rng = np.random.default_rng(1)
            print("\n3. the batching alone (which tensors are mapped, which read together)")
            print(
                f"{'tensors':>8} {'now s':>9} {'us/tensor':>10} {'x previous':>11} "
                f"{'before s':>9} {'now/before':>11}"
            )
            previous = None
            for count in (int(c) for c in args.run_counts.split(",")):
                path = Path(tmp) / f"runs-{count}.safetensors"
                sizes = rng.integers(1, 65, size=count)
                plain_save(
                    {f"t{i:07}": np.zeros(int(n), np.float32) for i, n in enumerate(sizes)},
                    str(path),
                )
                now = run_finding(path)
                per = now / count
                # Flat time per tensor as the count grows (1.0) is linear; the copy was not.
                growth = f"{per / previous:11.2f}" if previous else f"{'-':>11}"
                before = RECORDED_BEFORE.get(count)
                then = f"{before:9.2f} {now / before:11.4f}" if before else f"{'-':>9} {'-':>11}"
                print(f"{count:8} {now:9.3f} {per * 1e6:10.2f} {growth} {then}", flush=True)
                previous = per
                path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
