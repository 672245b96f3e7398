"""Cost of watching implicit transfers (`transfers:`), next to the same code unwatched.

    python benchmarks/bench_transfers.py [--rounds 5] [--number 2000]

Every case is timed once per round, the rounds interleaved (A, B, A, B) so that a noisy
neighbour hits all cases alike; each row gives the median per-call time, the spread
(lowest and highest round) and the ratio of the medians to its baseline; the difference
of the medians is the cost watching adds. Read the ratios and differences, not the
absolute numbers: these machines are shared.

Targets (issue 35): a `with policy.scope(...)` with `transfers:` set <= 5 us over one
without; count mode <= 10 us per event and <= 2 us on a call that moves nothing; the
first event at a site located in <= 5 ms. (Without `transfers:` the repeat `@place`/scope
path is the same code as before: benchmarks/bench_core.py measures it.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit
from collections.abc import Callable

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
for name in [n for n in os.environ if n.startswith("DEVPOLICY_")]:
    del os.environ[name]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import structlog  # noqa: E402

import devpolicy  # noqa: E402
from devpolicy._apply import transfers  # noqa: E402

Case = tuple[str, Callable[[], object], str | None]  # label, fn, baseline label
WATCH = {"host_to_device": "log", "device_to_device": "log", "host_local": "log"}


def measure(cases: list[Case], rounds: int, number: int) -> dict[str, list[float]]:
    """Per-call microseconds of each case, one sample per round, rounds interleaved."""
    samples: dict[str, list[float]] = {label: [] for label, *_ in cases}
    timers = [(label, timeit.Timer(fn)) for label, fn, _ in cases]
    for _, timer in timers:
        timer.timeit(max(1, number // 10))  # warm-up: compilation, first events
    for _ in range(rounds):
        for label, timer in timers:
            samples[label].append(timer.timeit(number) / number * 1e6)
    return samples


def report(title: str, cases: list[Case], samples: dict[str, list[float]]) -> None:
    print(f"\n{title}")
    print(f"{'case':52} {'median us':>10} {'spread':>17} {'ratio':>6} {'+us':>8}  baseline")
    medians = {label: statistics.median(values) for label, values in samples.items()}
    for label, _, baseline in cases:
        values = samples[label]
        spread = f"{min(values):.2f}-{max(values):.2f}"
        ratio = f"{medians[label] / medians[baseline]:.2f}" if baseline else ""
        extra = f"{medians[label] - medians[baseline]:.2f}" if baseline else ""
        print(
            f"{label:52} {medians[label]:10.2f} {spread:>17} {ratio:>6} {extra:>8}  "
            f"{baseline or ''}"
        )


class _Silent(transfers.Watch):
    """A watch that arms JAX's guard as `watch` does but reports nothing (all modes allow)."""

    def __init__(self, watch: transfers.Watch | None) -> None:
        assert watch is not None
        super().__init__({}, watch.events)
        self._levels = watch.levels()


def first_event_ms(policy: devpolicy.Policy, sites: int, rounds: int) -> list[float]:
    """Milliseconds the first event at a new site adds, per round (new code objects, so new
    sites, each compiled before timing; the same code run unwatched is the baseline)."""
    twice = jax.jit(lambda a: a * 2)
    host = np.ones((64, 64), np.float32)
    twice(host)
    out = []
    for r in range(rounds):
        codes = [compile("twice(host)", f"site_{r}_{i}.py", "exec") for i in range(sites)]
        plain = [compile("twice(host)", f"plain_{r}_{i}.py", "exec") for i in range(sites)]
        ns = {"twice": twice, "host": host}
        t0 = timeit.default_timer()
        for code in plain:
            exec(code, ns)
        t1 = timeit.default_timer()
        with devpolicy.activate(policy):
            t2 = timeit.default_timer()
            for code in codes:
                exec(code, ns)
            t3 = timeit.default_timer()
        out.append(((t3 - t2) - (t1 - t0)) / sites * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    # Events go through an application's structlog that drops them: the cost measured is
    # devpolicy's (finding the site, counting, building the event), not a terminal's.
    structlog.configure(
        logger_factory=structlog.ReturnLoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(0),
    )
    plain = devpolicy.load_policy({"version": 1, "default": "cpu:1"}, environ={})
    watched = devpolicy.load_policy(
        {"version": 1, "default": "cpu:1", "transfers": WATCH}, environ={}
    )
    device = jax.devices()[1]
    twice = jax.jit(lambda a: a * 2)
    host = np.ones((64, 64), np.float32)
    placed = jax.device_put(host, device)
    scope_plain, scope_watched = plain.scope("x"), watched.scope("x")
    watch = watched.watch
    assert watch is not None

    def enter_plain() -> None:
        with scope_plain:
            pass

    def enter_watched() -> None:
        with scope_watched:
            pass

    # Ten calls per sample, armed once around them: the arming is the scope's cost above.
    def ten_calls(arg: object, by: transfers.Watch | None) -> Callable[[], object]:
        def run() -> object:
            token = transfers.arm(by) if by is not None else None
            try:
                for _ in range(10):
                    out = twice(arg)
                return out
            finally:
                if token is not None:
                    transfers.disarm(token)

        return run

    # The floor: the same refusal and rerun with nothing reported (a watch whose guard
    # refuses as the real one does, but whose every mode is allow). What an event costs
    # above this is devpolicy's: finding the line, counting, the event.
    silent = _Silent(watched.watch)
    unwatched_event, watched_event = ten_calls(host, None), ten_calls(host, watch)
    refused_unreported = ten_calls(host, silent)
    unwatched_nothing, watched_nothing = ten_calls(placed, None), ten_calls(placed, watch)

    def arm_only() -> None:
        transfers.disarm(transfers.arm(watch))

    def jax_guard_log() -> None:
        with jax.transfer_guard("log"):
            pass

    PLAIN = "with plain.scope('x') (no transfers:)"  # noqa: N806
    cases: list[Case] = [
        (PLAIN, enter_plain, None),
        ("with watched.scope('x') (transfers: set)", enter_watched, PLAIN),
        ("arm + disarm (what a watched scope adds)", arm_only, None),
        ("with jax.transfer_guard('log') (JAX's own)", jax_guard_log, None),
        ("10 x jit(numpy) unwatched", unwatched_event, None),
        ("10 x jit(numpy) watched: an event each", watched_event, "10 x jit(numpy) unwatched"),
        ("10 x jit(numpy) refused, unreported", refused_unreported, "10 x jit(numpy) unwatched"),
        ("10 x jit(placed) unwatched", unwatched_nothing, None),
        ("10 x jit(placed) watched: moves nothing", watched_nothing, "10 x jit(placed) unwatched"),
    ]  # fmt: skip
    samples = measure(cases, args.rounds, args.number)
    report(f"jax {jax.__version__}, {args.rounds} rounds x {args.number} calls", cases, samples)
    first = first_event_ms(watched, 200, args.rounds)
    print(
        f"\nfirst event at a new site: median {statistics.median(first):.3f} ms "
        f"(rounds {', '.join(f'{v:.3f}' for v in first)})"
    )


if __name__ == "__main__":
    main()
