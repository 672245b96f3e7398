"""Saving a sharded state from a 2-process job: devpolicy.save_file against flax's and
orbax's multi-process checkpointing, in the same job.

    python benchmarks/bench_save_multiprocess.py [--size 1GiB] [--runs 3] [--dir DIR]
        [--out benchmarks/results/save_multiprocess.md]

Each run is a fresh `jax.distributed` job on 127.0.0.1: 2 processes of 2 CPU devices each,
a (data=2, model=2) mesh over the 4 devices, and a state of `--size` bytes: float32
kernels of 64 MiB, half sharded by rows and columns (`P("data", "model")`), half by columns
only (`P(None, ("data", "model"))`: a run of the file per row), each with a small
replicated bias. Every process holds half of the state. Methods:

- `devpolicy.save_file(state, path)`: one safetensors file, each process writing its
  replica-0 shards in place; every process syncs its writes.
- `flax save_checkpoint_multiprocess`: flax's own multi-process save (orbax's
  `PyTreeCheckpointHandler` underneath, synchronous; tensorstore OCDBT files).
- `orbax StandardCheckpointer`: orbax's recommended API, saved then
  `wait_until_finished()` (the time until the checkpoint is complete).
- `allgather + safetensors`: what one file costs without devpolicy:
  `multihost_utils.process_allgather(state, tiled=True)` on every process, then
  `safetensors.numpy.save_file` on process 0.

Per method: the median (and spread) of the save's time (both processes start together
after a barrier; the slower process's time counts), each process's peak RSS over its
baseline (VmHWM, reset through /proc/self/clear_refs just before the save), the bytes
each process wrote (`/proc/self/io` wchar) and the size on disk. The runs of all methods
are interleaved. The table and the machine's state go to `--out` as Markdown.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import (  # noqa: E402
    child_code,
    child_env,
    free_port,
    gib,
    machine_state,
    markdown_table,
    median_known,
    shown_argv,
    shown_size,
)
from devpolicy._base.sizes import parse_size  # noqa: E402

METHODS = ["devpolicy", "flax", "orbax", "allgather"]
LABELS = {
    "devpolicy": "devpolicy.save_file (one safetensors file)",
    "flax": "flax save_checkpoint_multiprocess (orbax PyTree, OCDBT)",
    "orbax": "orbax StandardCheckpointer + wait_until_finished",
    "allgather": "process_allgather + safetensors.numpy.save_file on process 0",
}

WORKER = r"""
import json, os, sys, time
port, process_id, method, out_dir, size = sys.argv[1:6]
process_id, size = int(process_id), int(size)
import jax
jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           initialization_timeout=120)
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
import devpolicy, structlog, safetensors.numpy
from flax.training import checkpoints
import orbax.checkpoint as ocp
from benchmarks._common import PeakRise

def wchar():
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("wchar:"))

mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices())
side = 4096  # 64 MiB float32 kernels
state = {}
for i in range(max(1, size // (side * side * 4))):
    spec = P("data", "model") if i % 2 == 0 else P(None, ("data", "model"))
    def kernel(index, i=i):
        rows = range(side)[index[0]]
        cols = range(side)[index[1]]
        rng = np.random.default_rng([i, rows.start, cols.start])
        return rng.random((len(rows), len(cols)), dtype=np.float32)
    state[f"layer{i:02d}"] = {
        "kernel": jax.make_array_from_callback((side, side), NamedSharding(mesh, spec), kernel),
        "bias": jax.make_array_from_callback(
            (side,), NamedSharding(mesh, P()), lambda index: np.full(side, 0.5, np.float32)[index]),
    }
jax.block_until_ready(state)
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}}, environ={})
target = os.path.join(out_dir, "state")
multihost_utils.sync_global_devices("bench: ready")
rise, written = PeakRise(), wchar()  # VmHWM from here on is this save's peak
start = time.perf_counter()
if method == "devpolicy":
    devpolicy.save_file(state, target + ".safetensors", policy=policy)
elif method == "flax":
    checkpoints.save_checkpoint_multiprocess(target, state, step=0)
elif method == "orbax":
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(target, state)
    checkpointer.wait_until_finished()
elif method == "allgather":
    whole = multihost_utils.process_allgather(state, tiled=True)
    if process_id == 0:
        flat = {f"{k}/{n}": v for k, leaves in whole.items() for n, v in leaves.items()}
        safetensors.numpy.save_file(flat, target + ".safetensors")
    multihost_utils.sync_global_devices("bench: written")
seconds = time.perf_counter() - start
report = {"seconds": seconds, "peak": rise(), "written": wchar() - written,
          "state": sum(x.nbytes for x in jax.tree.leaves(state))}
multihost_utils.sync_global_devices("bench: done")
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
"""


def run_job(method: str, directory: Path, size: int) -> list[dict[str, Any]]:
    """One fresh 2-process job saving with `method`; each process's report."""
    port = free_port()
    env = child_env(drop=("XLA_FLAGS",))
    env["PYTHONPATH"] = str(REPO)
    code = child_code(WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(port), str(i), method, str(directory), str(size)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{method}: process exited {proc.returncode}\n{err[-4000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="1GiB", help="the whole state (default 1GiB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a temp dir)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size = parse_size(args.size)
    methods = args.methods.split(",")
    # Not where the files or results go: a path of this machine.
    command = ["python benchmarks/bench_save_multiprocess.py", *shown_argv(sys.argv[1:])]
    lines = [
        f"`{' '.join(command)}`",
        "",
        *machine_state().lines(),
        "- job: 2 processes (jax.distributed on 127.0.0.1) x 2 CPU devices, a (data=2, model=2) "
        "mesh; each process holds half of the state",
    ]
    results: dict[str, list[tuple[list[dict[str, Any]], int]]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        for run in range(args.runs):
            for method in methods:
                directory = Path(scratch) / f"{method}-{run}"
                directory.mkdir()
                reports = run_job(method, directory, size)
                results[method].append((reports, disk_bytes(directory)))
                print(method, run, json.dumps(reports), flush=True)
                for p in sorted(directory.rglob("*"), reverse=True):  # free the disk
                    p.unlink() if p.is_file() else p.rmdir()
    state = results[methods[0]][0][0][0]["state"]
    lines += [f"- state: {gib(state)} of float32 ({args.runs} runs of each method)", ""]
    heads = ["method", "median s", "best-worst s", "x devpolicy", "peak RSS p0 / p1"]
    heads += ["x state held (p0 / p1)", "written p0 / p1", "on disk"]
    rows = []
    anchor = None
    held = state / 2
    for method in methods:
        runs = results[method]
        times = [max(r["seconds"] for r in reports) for reports, _ in runs]
        median = statistics.median(times)
        anchor = anchor if anchor is not None else median
        peaks = [median_known(reports[i]["peak"] for reports, _ in runs) for i in (0, 1)]
        written = [statistics.median(reports[i]["written"] for reports, _ in runs) for i in (0, 1)]
        rows.append(
            [
                LABELS[method],
                f"{median:.3f}",
                f"{min(times):.3f}-{max(times):.3f}",
                f"{median / anchor:.2f}",
                " / ".join(shown_size(p) for p in peaks),
                " / ".join("n/a" if p is None else f"{p / held:.2f}" for p in peaks),
                " / ".join(gib(w) for w in written),
                gib(runs[0][1]),
            ]
        )
    lines += markdown_table(heads, rows)
    lines += [
        "",
        "`written` is the process's `/proc/self/io` wchar over the save: it counts socket "
        "writes too (the all-gather's traffic between the processes).",
        "",
        "- load average at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
