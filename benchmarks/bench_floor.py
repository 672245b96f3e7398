"""A checkpoint loaded onto the device against the transfer floor, measured in the same run.

    python benchmarks/bench_floor.py [--size 2GiB] [--tensors 32] [--runs 5] [--dir DIR]
        [--out benchmarks/results/load.md]

The device is whatever JAX finds first (`jax.devices()[0]`: a TPU or GPU where there is
one, else `cpu:0`); the same command runs unchanged on an accelerator. The checkpoint is
`--tensors` float32 tensors making `--size` in all (2 GiB: 32 tensors of 64 MiB), written
by `safetensors.numpy.save_file` (as a Hub checkpoint is) and once more by
`devpolicy.save_file` (64-byte-aligned offsets) for the mapped row; the page cache is warm.

Every case runs in a fresh process, `--runs` times, the cases interleaved (A, B, C, A, B,
C, ...). Each row: the median seconds, the spread, GiB/s, the ratio to the floor (the
fastest median of the floor rows), and the process's peak RSS over its baseline (its own
VmHWM; the baseline is taken after the imports, before anything is read or built).

The floor rows send bytes already in host memory (built before the clock starts, and
counted in their peak) to the device by the fastest means JAX offers:
- the whole tree in one `jax.device_put`, its arrays in 64-byte-aligned host buffers (a
  CPU device adopts those without a copy) and in numpy's own buffers (16 mod 64: copied);
- one array of the same total size;
- through `pinned_host` memory (host arrays put into the device's `pinned_host` memory
  kind, then into its default memory), where the device has that memory kind;
- chunked: one `device_put` per 256 MiB of tensors, all in flight before the wait;
- one `device_put` per tensor, each waited for (the naive loop, for comparison).

Against them: `devpolicy.load_file` (logging on, at info, as users have it),
`load_file(mmap=True)` of the aligned file, `safetensors.numpy.load_file` + one
`jax.device_put` of the tree, `safetensors.flax.load_file` in a device scope, the file
read into fresh memory (no transfer), and `devpolicy.put` of the tree in memory beside
the floor row with the same buffers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import Report, child_env, gib, read_through, run_child, shown_argv

CHILD = r"""
import gc, json, mmap, os, sys, time
from benchmarks._common import PeakRise
plain, aligned, runs, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]

import jax, numpy as np
import devpolicy, safetensors, safetensors.flax, safetensors.numpy
import structlog  # devpolicy's first event imports it: a once-per-process cost, not the load's
from devpolicy._decide.decision import single_device_sharding
device = jax.devices()[0]
# The device's own name in a policy: its platform and its index among that platform's.
index = [d.id for d in jax.local_devices(backend=device.platform)].index(device.id)
target = f"{device.platform}:{index}"
policy = devpolicy.load_policy({"version": 1, "default": target}, environ={})
kinds = {m.kind for m in device.addressable_memories()}

def aligned_tree(path):
    # Each tensor read (not mapped: file pages would count in RSS) into its own
    # page-aligned anonymous map: the tree held once.
    out = {}
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for key, info in header.items():
            begin, end = info["data_offsets"]
            region = mmap.mmap(-1, max(end - begin, 1))
            f.seek(8 + length + begin)
            f.readinto(memoryview(region)[: end - begin])
            dtype = {"F32": np.float32}[info["dtype"]]
            out[key] = np.frombuffer(region, dtype, count=(end - begin) // 4).reshape(info["shape"])
    return out

def mapped_views(path):
    # Three lines of numpy: the file mapped, each tensor a view of it (any offset).
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    whole = np.memmap(path, np.uint8, mode="r")
    return {
        key: whole[8 + length + info["data_offsets"][0] : 8 + length + info["data_offsets"][1]]
        .view(np.float32).reshape(info["shape"])
        for key, info in header.items()
    }

def wait(tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        leaf.block_until_ready()

jax.device_put(np.zeros(4, np.float32), device).block_until_ready()  # the backend started
# devpolicy's once-per-process costs (the machine's inventory, the first event's logging
# set-up) paid before the clock, as the backend's start is.
policy.put("warm-up", np.zeros(4, np.float32))

def run(case):
    gc.collect()
    # The peak's rise from here (ru_maxrss's under gVisor, which keeps no VmHWM).
    rise = PeakRise()
    host = None
    if case in ("floor-tree", "floor-pinned", "floor-chunked", "floor-each", "put"):
        host = aligned_tree(plain)
    elif case in ("floor-tree-numpy", "put-numpy"):
        host = safetensors.numpy.load_file(plain)
    elif case == "floor-array":
        host = {"all": np.frombuffer(mmap.mmap(-1, os.path.getsize(plain)), np.uint8)}
        host["all"][...] = 1
    out = None
    start = time.perf_counter()
    if case in ("floor-tree", "floor-tree-numpy", "floor-array"):
        out = jax.device_put(host, device)
    elif case == "floor-mapped":
        out = jax.device_put(mapped_views(plain), device)
    elif case == "floor-pinned":
        if "pinned_host" not in kinds:
            return {"missing": True}
        staged = jax.device_put(host, single_device_sharding(device, "pinned_host"))
        out = jax.device_put(staged, single_device_sharding(device))
    elif case == "floor-chunked":
        out, chunk, nbytes = {}, {}, 0
        for key, value in host.items():
            chunk[key] = value
            nbytes += value.nbytes
            if nbytes >= 256 * 2**20:
                out.update(jax.device_put(chunk, device)); chunk, nbytes = {}, 0
        out.update(jax.device_put(chunk, device))
    elif case == "floor-each":
        out = {}
        for key, value in host.items():
            out[key] = jax.device_put(value, device); out[key].block_until_ready()
    elif case in ("put", "put-numpy"):
        out = policy.put("tree", host)
    elif case == "read":
        # What a load that does not map pays before any transfer: read into fresh memory.
        fresh = mmap.mmap(-1, os.path.getsize(plain))
        with open(plain, "rb", buffering=0) as f:
            f.readinto(fresh)
    elif case == "devpolicy":
        out = devpolicy.load_file(plain, policy=policy, progress=False)
    elif case == "devpolicy-mmap":
        out = devpolicy.load_file(aligned, policy=policy, mmap=True, progress=False)
    elif case == "numpy+device_put":
        out = jax.device_put(safetensors.numpy.load_file(plain), device)
    elif case == "flax":
        with jax.default_device(device):
            out = safetensors.flax.load_file(plain)
    if out is not None:
        wait(out)
    seconds = time.perf_counter() - start
    if out is not None:
        leaves = jax.tree_util.tree_leaves(out)
        assert all(leaf.devices() == {device} for leaf in leaves), case
    return {"seconds": seconds, "peak": rise(), "peak_source": rise.source,
            "platform": device.platform, "device": str(device),
            "kind": getattr(device, "device_kind", "?"), "memories": sorted(kinds)}

for _ in range(runs):
    for case in cases:
        print(json.dumps({"case": case, **run(case)}), flush=True)
"""

#: (label, case, is a floor row): the order rows are printed and run in.
CASES = [
    ("floor: one device_put of the tree (aligned host buffers)", "floor-tree", True),
    ("floor: one device_put of the tree (numpy's own buffers)", "floor-tree-numpy", True),
    ("floor: one array of the same size", "floor-array", True),
    ("floor: views of a np.memmap of the file, one device_put", "floor-mapped", True),
    ("floor: staged through pinned_host", "floor-pinned", True),
    ("floor: one device_put per 256 MiB, all in flight", "floor-chunked", True),
    ("one device_put per tensor, each waited (aligned)", "floor-each", False),
    ("devpolicy.put of the tree (aligned host buffers)", "put", False),
    ("devpolicy.put of the tree (numpy's own buffers)", "put-numpy", False),
    ("file read into fresh memory (no transfer)", "read", False),
    ("devpolicy.load_file", "devpolicy", False),
    ("devpolicy.load_file(mmap=True), aligned file", "devpolicy-mmap", False),
    ("safetensors.numpy.load_file + jax.device_put(tree)", "numpy+device_put", False),
    ("safetensors.flax.load_file in a device scope", "flax", False),
]


#: The caller's JAX_PLATFORMS, for the children: the parent runs on the CPU backend only
#: (writing the files starts a backend), since one process at a time may hold a TPU.
_PLATFORMS = os.environ.get("JAX_PLATFORMS")


def run_cases(cases: list[str], plain: Path, aligned: Path, runs: int) -> list[dict[str, Any]]:
    """`runs` rounds of `cases` in one child process (cases taking turns), a sample each;
    the peak is the child's own (`PeakRise`), not what wait4 says of it."""
    env = child_env(drop=("JAX_PLATFORMS",))
    if _PLATFORMS is not None:
        env["JAX_PLATFORMS"] = _PLATFORMS
    return run_child(CHILD, plain, aligned, runs, *cases, what=" ".join(cases), env=env)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="2GiB", help="the checkpoint's total size")
    parser.add_argument("--tensors", type=int, default=32, help="float32 tensors in it")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files")
    parser.add_argument("--out", type=Path, default=None, help="append the results here")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every case in one process, taking turns (no peak per case: where opening the "
        "device costs seconds a process, as a TPU's does)",
    )
    parser.add_argument("--cases", default=None, help="comma-separated cases to run (default: all)")
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)

    os.environ["JAX_PLATFORMS"] = "cpu"  # the children get the caller's (`_PLATFORMS`)
    import jax
    import numpy as np
    from safetensors.numpy import save_file as plain_save

    import devpolicy

    report = Report()
    say = report.say
    # Not where the files or results go: a path of this machine.
    say(f"`python benchmarks/bench_floor.py {' '.join(shown_argv(sys.argv[1:]))}`")
    say()
    size = devpolicy.sizes.parse_size(args.size)
    per = size // args.tensors // 4
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        plain, aligned = Path(tmp) / "plain.safetensors", Path(tmp) / "aligned.safetensors"
        rng = np.random.default_rng(0)
        tree = {
            f"layer{i:02d}/w": rng.standard_normal(per, dtype=np.float32)
            for i in range(args.tensors)
        }
        plain_save(tree, str(plain))
        devpolicy.save_file(tree, aligned)
        nbytes = sum(v.nbytes for v in tree.values())
        del tree
        for path in (plain, aligned):  # warm the page cache
            read_through(path)
        known = [case for _, case, _ in CASES]
        every = known if args.cases is None else args.cases.split(",")
        unknown = sorted(set(every) - set(known))
        if unknown:
            raise SystemExit(f"unknown --cases {unknown}; choose from {', '.join(known)}")
        samples: dict[str, list[dict[str, Any]]] = {case: [] for case in every}
        load_start = os.getloadavg()
        if args.in_process:
            for sample in run_cases(every, plain, aligned, args.runs):
                samples[sample["case"]].append(sample)
        else:
            for _ in range(args.runs):
                for case in every:
                    samples[case] += run_cases([case], plain, aligned, 1)
        load_end = os.getloadavg()
    first = next(s for case in every for s in samples[case] if "device" in s)
    say(
        f"- device: `jax.devices()[0]` = {first['device']} ({first['kind']}, platform "
        f"{first['platform']}), memory kinds {', '.join(map(str, first['memories']))}"
    )
    say(
        f"- host: {os.cpu_count()} cores, {platform.system()} {platform.machine()}; "
        f"Python {platform.python_version()}, jax {jax.__version__}; load average (1 min) "
        f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at the end"
    )
    how = (
        "one process, cases taking turns (peak RSS not per case: n/a)"
        if args.in_process
        else f"fresh process per case, peak RSS from {first['peak_source']}"
    )
    say(
        f"- checkpoint: {args.tensors} float32 tensors of {gib(per * 4)} ({gib(nbytes)}); "
        f"{how}; {args.runs} runs interleaved, warm page cache; devpolicy logs at info (one "
        "summary event per file), after a warm-up `put` of one small array"
    )
    medians: dict[str, float] = {}
    for case in every:
        times = [float(s["seconds"]) for s in samples[case] if "seconds" in s]
        if times:
            medians[case] = statistics.median(times)
    floors = [c for _, c, f in CASES if f and c in medians]
    floor_case = min(floors or medians, key=medians.__getitem__)
    floor = medians[floor_case]
    say(f"- floor: {next(label for label, c, _ in CASES if c == floor_case)}, {floor:.4f} s")
    say()

    say("| case | median s | best-worst s | GiB/s | x floor | peak RSS | x tree |")
    say("|---|---|---|---|---|---|---|")
    for label, case, _ in CASES:
        if case not in every:
            continue
        if case not in medians:
            say(f"| {label} | n/a (no such memory kind) | | | | | |")
            continue
        times = [float(s["seconds"]) for s in samples[case]]
        peaks = [float(s["peak"]) for s in samples[case] if s.get("peak") is not None]
        peak = statistics.median(peaks) if peaks and not args.in_process else None
        rate = nbytes / 2**30 / medians[case] if medians[case] > 0 else float("inf")
        ratio = medians[case] / floor if floor > 0 else float("inf")
        shown = "n/a" if peak is None else gib(peak)
        times_tree = "n/a" if peak is None else f"{peak / nbytes:.2f}"
        say(
            f"| {label} | {medians[case]:.4f} | {min(times):.4f}-{max(times):.4f} | "
            f"{rate:.2f} | {ratio:.2f} | {shown} | {times_tree} |"
        )
    say()
    summary: dict[str, Any] = {"row": "load: 2 GiB checkpoint", "floor": floor_case}
    if "devpolicy" in medians:
        ours = medians["devpolicy"]
        summary["load_file x floor"] = round(floor / ours, 2)
        line = (
            f"- load_file: {floor / ours:.2f}x the floor's throughput (target >= 0.9 on an "
            "accelerator)"
        )
        for case, what in (
            ("numpy+device_put", "safetensors.numpy + device_put"),
            ("read", "the bare read into fresh memory"),
        ):
            if case in medians:
                line += f"; {medians[case] / ours:.2f}x {what}"
        say(line)
    if {"put", "floor-tree", "put-numpy", "floor-tree-numpy"} <= medians.keys():
        say(
            f"- put of the tree: {medians['put'] / medians['floor-tree']:.2f}x one device_put "
            f"of the same aligned tree, {medians['put-numpy'] / medians['floor-tree-numpy']:.2f}x "
            "with numpy's buffers"
        )
    if args.json:
        summary.update({c: round(nbytes / 2**30 / m, 2) for c, m in medians.items()})
        print(json.dumps(summary), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a", encoding="utf-8") as f:
            f.write("\n".join(report.lines) + "\n")
        print(f"\nappended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
