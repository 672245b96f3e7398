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
path is the same code as before: benchmarks/bench_core.py measures it.) Issue 42: a loop
feeding numpy to a CPU device watched by `transfers: log` (host_local left at allow: it
can report nothing) within noise of the same loop unwatched, where the machine has no
accelerator.

Runs on the devices there are: JAX's default platform's first device is the one the
cases place on; a case that needs a second device of that platform (a copy between two)
prints a row saying it was skipped and why.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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
from devpolicy._decide.decision import single_device_sharding  # noqa: E402

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


Row = tuple[str, Callable[[], object], str | None] | tuple[str, None, str]  # or skipped


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
    devices = jax.local_devices()  # the default platform's: a one-chip machine has one
    device = devices[0]
    target = f"{device.platform}:0"
    plain = devpolicy.load_policy({"version": 1, "default": target}, environ={})
    watched = devpolicy.load_policy(
        {"version": 1, "default": target, "transfers": WATCH}, environ={}
    )
    # `transfers: log` as a newcomer writes it: host_local keeps its default, allow.
    logging_only = devpolicy.load_policy({"version": 1, "transfers": "log"}, environ={})
    twice = jax.jit(lambda a: a * 2)
    host = np.ones((64, 64), np.float32)
    placed = jax.device_put(host, device)
    scope_plain, scope_watched = plain.scope("x"), watched.scope("x")
    watch, quiet = watched.watch, logging_only.watch
    assert watch is not None
    assert quiet is not None
    cpu = jax.local_devices(backend="cpu")[0]
    cpu_only = all(d.platform == "cpu" for d in jax.devices())

    def enter_plain() -> None:
        with scope_plain:
            pass

    def enter_watched() -> None:
        with scope_watched:
            pass

    # Ten calls per sample, armed once around them: the arming is the scope's cost above.
    def ten_calls(
        arg: object, by: transfers.Watch | None, fn: Callable[[object], object] = twice
    ) -> Callable[[], object]:
        def run() -> object:
            token = transfers.arm(by) if by is not None else None
            try:
                for _ in range(10):
                    out = fn(arg)
                return out
            finally:
                if token is not None:
                    transfers.disarm(token)

        return run

    def on_cpu(run: Callable[[], object]) -> Callable[[], object]:
        def in_cpu_scope() -> object:
            with jax.default_device(cpu):
                return run()

        return in_cpu_scope

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
    CPU_PLAIN = "10 x jit(numpy) on a cpu device, unwatched"  # noqa: N806
    cpu_watched = "10 x jit(numpy) on a cpu, transfers: log" + (
        "" if cpu_only else " (accelerator here: h2d armed)"
    )
    rows: list[Row] = [
        (PLAIN, enter_plain, None),
        ("with watched.scope('x') (transfers: set)", enter_watched, PLAIN),
        ("arm + disarm (what a watched scope adds)", arm_only, None),
        ("with jax.transfer_guard('log') (JAX's own)", jax_guard_log, None),
        ("10 x jit(numpy) unwatched", unwatched_event, None),
        ("10 x jit(numpy) watched: an event each", watched_event, "10 x jit(numpy) unwatched"),
        ("10 x jit(numpy) refused, unreported", refused_unreported, "10 x jit(numpy) unwatched"),
        ("10 x jit(placed) unwatched", unwatched_nothing, None),
        ("10 x jit(placed) watched: moves nothing", watched_nothing, "10 x jit(placed) unwatched"),
        (CPU_PLAIN, on_cpu(ten_calls(host, None)), None),
        (cpu_watched, on_cpu(ten_calls(host, quiet)), CPU_PLAIN),
        *two_device_rows(devices, host, ten_calls, watch),
    ]  # fmt: skip
    cases: list[Case] = [row for row in rows if row[1] is not None]  # type: ignore[misc]
    samples = measure(cases, args.rounds, args.number)
    report(f"jax {jax.__version__}, {args.rounds} rounds x {args.number} calls", cases, samples)
    for label, fn, why in rows:
        if fn is None:
            print(f"{label:52} skipped: {why}")
    print(f"\n{early_activation(args.rounds, args.number * 5)}")
    first = first_event_ms(watched, 200, args.rounds)
    print(
        f"\nfirst event at a new site: median {statistics.median(first):.3f} ms "
        f"(rounds {', '.join(f'{v:.3f}' for v in first)})"
    )


# A newcomer's loop on a laptop: `transfers: log` activated before JAX has started (so
# which devices exist is not known yet), one CPU device, numpy fed to a jitted step.
EARLY = """
import statistics, sys, time
import numpy as np
import devpolicy, jax
rounds, number = int(sys.argv[1]), int(sys.argv[2])
with devpolicy.activate(devpolicy.load_policy({"version": 1, "transfers": "log"}, environ={})):
    step = jax.jit(lambda b: b * 2)
    batch = np.ones((64, 64), np.float32)
    step(batch)
    plain = devpolicy.load_policy({"version": 1}, environ={})
    watched, unwatched = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            step(batch)
        watched.append((time.perf_counter() - t0) / number * 1e6)
        with devpolicy.activate(plain):  # a policy without transfers: stops the watch
            t0 = time.perf_counter()
            for _ in range(number):
                step(batch)
            unwatched.append((time.perf_counter() - t0) / number * 1e6)
print(statistics.median(watched), statistics.median(unwatched))
"""


def early_activation(rounds: int, number: int) -> str:
    """The line for EARLY, run in a fresh process (JAX not yet started there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    out = subprocess.run(
        [sys.executable, "-c", EARLY, str(rounds), str(number)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    watched, unwatched = (float(v) for v in out.stdout.split())
    return (
        "a fresh process, one cpu device, `transfers: log` activated before JAX started: "
        f"jit(numpy) {watched:.2f} us watched, {unwatched:.2f} us unwatched, ratio "
        f"{watched / unwatched:.2f}"
    )


def two_device_rows(
    devices: list[jax.Device],
    host: np.ndarray,
    ten_calls: Callable[..., Callable[[], object]],
    watch: transfers.Watch,
) -> list[Row]:
    """Rows that copy an array between two devices of the default platform: a skipped row
    saying why where there is one device (a one-chip machine)."""
    label = "10 x jit(array on another device)"
    if len(devices) < 2:
        why = f"needs two {devices[0].platform} devices, this machine has one"
        return [(f"{label} unwatched", None, why), (f"{label} watched", None, why)]
    committed = jax.device_put(host, devices[1])
    onto_first = jax.jit(lambda a: a * 2, in_shardings=single_device_sharding(devices[0]))
    return [
        (f"{label} unwatched", ten_calls(committed, None, onto_first), None),
        (f"{label} watched", ten_calls(committed, watch, onto_first), f"{label} unwatched"),
    ]


if __name__ == "__main__":
    main()
