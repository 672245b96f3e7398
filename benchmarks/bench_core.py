"""Cost of devpolicy's hot path next to bare JAX, measured side by side in one run.

    python benchmarks/bench_core.py [--rounds 15] [--number 20000]

Every case is timed once per round, the rounds interleaved so that a noisy neighbour
hits all cases alike; each row gives the median per-call time, the spread (lowest and
highest round) and the ratio of the medians to its baseline. Read the ratios, not the
absolute numbers: these machines are shared.

Targets (issue 8): a repeat `@place` call returning None or an int <= 1.3x a bare
`with jax.default_device(d)`; returning arrays <= 1.2x the bare `with` plus a
hand-written `jax.device_put(result, d)`; an activated module-level `@place` and a
repeat `scope` <= 1.3x the bare `with`; the same under an application's own structlog.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
for name in [n for n in os.environ if n.startswith("DEVPOLICY_")]:
    del os.environ[name]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import structlog  # noqa: E402

import devpolicy  # noqa: E402

Case = tuple[str, Callable[[], object], str | None, int]  # label, fn, baseline label, number


def measure(cases: list[Case], rounds: int) -> dict[str, list[float]]:
    """Per-call microseconds of each case, one sample per round, rounds interleaved."""
    samples: dict[str, list[float]] = {label: [] for label, *_ in cases}
    timers = [(label, timeit.Timer(fn), number) for label, fn, _, number in cases]
    for _, timer, number in timers:
        timer.timeit(max(1, number // 10))  # warm-up: first decisions, compilation
    for _ in range(rounds):
        for label, timer, number in timers:
            samples[label].append(timer.timeit(number) / number * 1e6)
    return samples


def report(title: str, cases: list[Case], samples: dict[str, list[float]]) -> None:
    print(f"\n{title}")
    print(f"{'case':58} {'median us':>10} {'spread':>17} {'ratio':>7}  baseline")
    medians = {label: statistics.median(values) for label, values in samples.items()}
    for label, _, baseline, _ in cases:
        values = samples[label]
        spread = f"{min(values):.3f}-{max(values):.3f}"
        ratio = f"{medians[label] / medians[baseline]:.2f}" if baseline else ""
        print(f"{label:58} {medians[label]:10.3f} {spread:>17} {ratio:>7}  {baseline or ''}")


def hot_path_cases(policy: devpolicy.Policy, device: jax.Device, number: int) -> list[Case]:
    small = jnp.zeros(4)
    keys = [f"a{i}" for i in range(100)]
    BARE = "bare `with jax.default_device(d)`"  # noqa: N806

    def bare_none() -> None:
        with jax.default_device(device):
            pass

    def bare_array_commit() -> jax.Array:
        with jax.default_device(device):
            out = small + 1
        return jax.device_put(out, device)

    def bare_dict_commit() -> Any:
        with jax.default_device(device):
            out = {k: small + i for i, k in enumerate(keys)}
        return jax.device_put(out, device)

    @policy.place("dataset/train")
    def place_none() -> None:
        return None

    @policy.place("dataset/train")
    def place_int() -> int:
        return 1

    @policy.place("dataset/train")
    def place_array() -> jax.Array:
        return small + 1

    @policy.place("dataset/train")
    def place_dict() -> Any:
        return {k: small + i for i, k in enumerate(keys)}

    @devpolicy.place("dataset/train")
    def active_place_none() -> None:
        return None

    def scope_repeat() -> None:
        with policy.scope("dataset/train"):
            pass

    def active_scope_repeat() -> None:
        with devpolicy.scope("dataset/train"):
            pass

    arrays = max(1, number // 20)
    one = "bare `with` + device_put(one small array)"
    hundred = "bare `with` + device_put(dict of 100 arrays)"
    return [
        ("plain call", lambda: None, BARE, number),
        (BARE, bare_none, None, number),
        ("@place repeat, returns None", place_none, BARE, number),
        ("@place repeat, returns int", place_int, BARE, number),
        ("activated module-level @place, returns None", active_place_none, BARE, number),
        ("scope repeat (Policy.scope)", scope_repeat, BARE, number),
        ("scope repeat (activated devpolicy.scope)", active_scope_repeat, BARE, number),
        ("resolve, cached", lambda: policy.resolve("dataset/train"), BARE, number),
        (one, bare_array_commit, None, arrays),
        ("@place repeat, returns one small array", place_array, one, arrays),
        (hundred, bare_dict_commit, None, arrays // 10),
        ("@place repeat, returns dict of 100 arrays", place_dict, hundred, arrays // 10),
    ]


def cold_and_cache_cases(number: int) -> list[Case]:
    def rules(count: int) -> list[dict[str, str]]:
        made = [{"match": f"group{i}/*", "device": f"cpu:{i % 4}"} for i in range(count - 1)]
        return [*made, {"match": "*", "device": "cpu:0"}]

    quiet = {"level": "error"}
    few = devpolicy.load_policy({"version": 1, "rules": rules(10), "logging": quiet}, environ={})
    lots = devpolicy.load_policy({"version": 1, "rules": rules(2000), "logging": quiet}, environ={})
    counter = iter(range(10**9))

    def cold(policy: devpolicy.Policy) -> Callable[[], object]:
        return lambda: policy.decider.decide(f"other/n{next(counter)}")

    working = devpolicy.load_policy(
        {"version": 1, "rules": rules(10), "logging": quiet}, environ={}
    )
    small_set = [f"group{i % 9}/t{i}" for i in range(1_000)]
    large_set = [f"group{i % 9}/t{i}" for i in range(70_000)]
    positions = {"small": 0, "large": 0}

    def cycle(names: list[str], key: str) -> Callable[[], object]:
        def one() -> object:
            i = positions[key]
            positions[key] = (i + 1) % len(names)
            return working.resolve(names[i])

        return one

    for name in large_set + small_set:  # first pass: every name decided once
        working.resolve(name)
    cold_number = max(1, number // 20)
    ten = "cold resolve, 10 rules, name falls through to `*`"
    thousand = "resolve cycling over 1,000 names"
    return [
        (ten, cold(few), None, cold_number),
        ("cold resolve, 2,000 rules, name falls through to `*`", cold(lots), ten, cold_number),
        (thousand, cycle(small_set, "small"), None, number),
        ("resolve cycling over 70,000 names", cycle(large_set, "large"), thousand, number),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()

    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "dataset/*", "device": "cpu:1"}]}, environ={}
    )
    device = devpolicy.get_device("cpu:1")
    with devpolicy.activate(policy):
        cases = hot_path_cases(policy, device, args.number)
        report(
            "Repeat calls, devpolicy's own output (level info)",
            cases,
            measure(cases, args.rounds),
        )
        # An application that configured structlog itself, filtering at INFO.
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(20),
            logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
        )
        try:
            app_cases = hot_path_cases(policy, device, args.number)[:5]
            report(
                "The same under the application's own structlog (filtering at INFO)",
                app_cases,
                measure(app_cases, args.rounds),
            )
        finally:
            structlog.reset_defaults()
    cache_cases = cold_and_cache_cases(args.number)
    report(
        "Cold decisions and the cache (a fresh name each call; cycling over a working set)",
        cache_cases,
        measure(cache_cases, args.rounds),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
