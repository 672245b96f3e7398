"""The cost of reading attached axis names: `put` and `shardings` of a 10,000-leaf tree.

    python benchmarks/bench_attached.py [--leaves 10000] [--repeat 5]

Rows: naming the leaves (`leaf_names`) of a plain dict tree and of a tree of flax
`LogicallyPartitioned` boxes; `put` of the plain tree by a device rule; `shardings` of the
boxed tree by a rule with a written spec and (where this checkout has it) by one with
`axes: attached`. Run it once with this checkout and once with an older one on the path
(`PYTHONPATH=../old python benchmarks/bench_attached.py`) and compare the columns: reading
the names rides on the walk that names the leaves, so the rows an older checkout also has
should not move. Medians of --repeat runs (min-max); shared machines are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
for name in [n for n in os.environ if n.startswith("DEVPOLICY_")]:
    del os.environ[name]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import devpolicy  # noqa: E402
from devpolicy._apply import leaves as _leaves  # noqa: E402

try:
    from flax.core.meta import Partitioned  # noqa: F401
    from flax.linen.spmd import LogicallyPartitioned
except ImportError:  # pragma: no cover - flax is in the test extra
    LogicallyPartitioned = None


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float, float]:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), min(runs), max(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.leaves
    plain = {f"layer{i}": {"w": np.zeros((4, 8), np.float32)} for i in range(n)}
    abstract = {f"layer{i}": {"w": jax.ShapeDtypeStruct((4, 8), np.float32)} for i in range(n)}
    boxed = None
    if LogicallyPartitioned is not None:
        boxed = {
            f"layer{i}": {"w": LogicallyPartitioned(abstract[f"layer{i}"]["w"], ("embed", "mlp"))}
            for i in range(n)
        }
    quiet = {"level": "warning"}  # the events are not what is measured
    mesh = {"m": {"axes": {"data": 2, "model": 2}, "devices": "cpu"}}
    written = devpolicy.load_policy(
        {
            "version": 1,
            "logging": quiet,
            "meshes": mesh,
            "rules": [{"match": "p/**", "sharding": {"mesh": "m", "spec": ["data", "model"]}}],
        }
    )
    to_cpu = devpolicy.load_policy(
        {"version": 1, "logging": quiet, "rules": [{"match": "p/**", "device": "cpu"}]}
    )
    rows: list[tuple[str, Callable[[], object]]] = [
        ("leaf_names, plain tree", lambda: _leaves.leaf_names("p", plain)),
        ("put, plain tree, device rule", lambda: to_cpu.put("p", plain)),
        ("shardings, plain abstract tree, spec rule", lambda: written.shardings("p", abstract)),
    ]
    if boxed is not None:
        rows += [
            ("leaf_names, boxed tree", lambda: _leaves.leaf_names("p", boxed)),
            ("shardings, boxed tree, spec rule", lambda: written.shardings("p", boxed)),
        ]
        try:
            attached = devpolicy.load_policy(
                {
                    "version": 1,
                    "logging": quiet,
                    "meshes": mesh,
                    "axis_rules": [["embed", "data"], ["mlp", "model"]],
                    "rules": [{"match": "p/**", "sharding": {"mesh": "m", "axes": "attached"}}],
                }
            )
        except devpolicy.PolicyError:
            attached = None  # an older checkout: no `axes: attached`
        if attached is not None:
            rows.append(
                ("shardings, boxed tree, axes: attached", lambda: attached.shardings("p", boxed))
            )
    # Each row's ratio to the row it should cost the same as (the same work without
    # attached names): reading the names is the difference.
    against = {
        "leaf_names, boxed tree": "leaf_names, plain tree",
        "shardings, boxed tree, spec rule": "shardings, plain abstract tree, spec rule",
        "shardings, boxed tree, axes: attached": "shardings, boxed tree, spec rule",
    }
    print(f"{n} leaves, median of {args.repeat} (min-max), seconds; x: ratio to the row named")
    medians: dict[str, float] = {}
    for label, fn in rows:
        fn()  # warm: the first call compiles and logs
        median, low, high = timed(fn, args.repeat)
        medians[label] = median
        base = against.get(label)
        ratio = f"  {median / medians[base]:5.2f}x {base}" if base in medians else ""
        print(f"{label:<42} {median:7.3f}  ({low:.3f}-{high:.3f}){ratio}")


if __name__ == "__main__":
    main()
