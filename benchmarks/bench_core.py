"""Cost of devpolicy's hot path next to bare JAX, measured side by side in one run.

    python benchmarks/bench_core.py [--repeat 7]

Prints per-call times (best of --repeat runs, after a warm-up) and the ratio of each to
a bare `with jax.default_device(d)`. Target: a repeat `@place` call within 1.5x of it.
Timings on shared machines are noisy: read the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
for name in [n for n in os.environ if n.startswith("DEVPOLICY_")]:
    del os.environ[name]

import jax  # noqa: E402

import devpolicy  # noqa: E402


def per_call(fn: object, number: int, repeat: int) -> float:
    """Best per-call time in microseconds."""
    timer = timeit.Timer(fn)  # type: ignore[arg-type]
    timer.timeit(number // 10 or 1)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()

    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "dataset/*", "device": "cpu:1"}]}, environ={}
    )
    device = devpolicy.get_device("cpu:1")

    def body() -> None:
        return None

    @policy.place("dataset/train")
    def placed() -> None:
        return None

    def bare_with() -> None:
        with jax.default_device(device):
            body()

    def scoped() -> None:
        with policy.scope("dataset/train"):
            body()

    placed()  # first decision: logged at info; every later call is a repeat
    rows = [
        ("plain call", per_call(body, args.number, args.repeat)),
        ("bare `with jax.default_device(d)`", per_call(bare_with, args.number, args.repeat)),
        ("@place repeat call", per_call(placed, args.number, args.repeat)),
        ("scope repeat", per_call(scoped, args.number, args.repeat)),
        (
            "resolve cached",
            per_call(lambda: policy.resolve("dataset/train"), args.number, args.repeat),
        ),
    ]

    rules = [{"match": f"group{i}/*", "device": f"cpu:{i % 4}"} for i in range(199)]
    rules.append({"match": "*", "device": "cpu:0"})
    names = [f"group{i % 250}/tensor{i}" for i in range(10_000)]

    def cold() -> None:
        fresh = devpolicy.load_policy(
            {"version": 1, "rules": rules, "logging": {"level": "error"}}, environ={}
        )
        for name in names:
            fresh.resolve(name)

    cold_total = min(timeit.repeat(cold, repeat=3, number=1)) * 1e6
    bare = rows[1][1]
    print(f"{'case':44} {'us/call':>10} {'x bare with':>12}")
    for label, micros in rows:
        print(f"{label:44} {micros:10.3f} {micros / bare:12.2f}")
    print(
        f"{'resolve 10,000 names x 200 rules, cold':44} {cold_total / 10_000:10.3f} {'':>12}"
        f"  (total {cold_total / 1e6:.3f} s)"
    )
    ratio = rows[2][1] / bare
    print(
        f"\n@place repeat / bare with = {ratio:.2f} (target <= 1.5): "
        f"{'met' if ratio <= 1.5 else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
