"""Lint and cold-resolve cost as rules grow, with and without the literal-prefix index.

    python benchmarks/bench_lint.py [--repeat 5] [--old-max 2000] [--no-prefix-sizes 250,2000]

Table 1: linting a policy of N environment rules (`model/layer{i}/*=cpu:{i%4}`) plus N/10
YAML regex rules (`model/block{i}/(w|b)`), a literal rule each shadows, and a final `*`.
"old" is the pairwise loop lint used before the index (every earlier rule against every
later one, glob checks only); "new" is `_unreachable` today and the whole `lint()`.
"x per doubling" is the new lint's growth from the row above (2.0 is linear).

Table 2: resolving names no specific rule matches (they fall through to `*`), cold, per
name: testing every rule's pattern in order, against testing only the index's candidates.

Table 3: linting N regex rules with no literal prefix (`[a-z]+/layer{i}/(w|b)`, which
share their empty prefix with every rule) plus a copy of rule 7 at the end, which must be
reported. Every rule used to be compared on automata with every earlier one; now only with
the earlier rules that match one of its names. `--no-prefix-only` prints this table alone
(run it with an older checkout's interpreter to compare). Measured on a shared 2-core
machine: 250 rules 0.14 s and 2,000 rules 1.0 s now, both finding the dead rule; comparing
every pair, 250 rules 47 s with the dead rule missed (the automata budget ran out before
it), and 2,000 rules unfinished after half an hour.

Medians of --repeat runs, with the spread (min-max). Shared machines are noisy: read the
ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
for name in [n for n in os.environ if n.startswith("DEVPOLICY_")]:
    del os.environ[name]

import devpolicy  # noqa: E402
from devpolicy._document.layers import RuleEntry  # noqa: E402
from devpolicy._names.matching import compile_condition  # noqa: E402
from devpolicy._names.prefixes import PrefixIndex  # noqa: E402
from devpolicy._policy import lint as _lint  # noqa: E402


def policy_of_size(n: int) -> devpolicy.Policy:
    env = {"DEVPOLICY_RULES": ",".join(f"model/layer{i}/*=cpu:{i % 4}" for i in range(n))}
    rules: list[dict[str, object]] = [
        {"regex": f"model/block{i}/(w|b)", "device": "cpu"} for i in range(n // 10)
    ]
    rules += [
        {"match": "model/layer7/w", "device": "cpu"},
        {"match": "model/block3/w", "device": "cpu"},
    ]
    rules.append({"match": "*", "device": "cpu"})
    return devpolicy.load_policy({"version": 1, "rules": rules}, environ=env)


def old_unreachable(rules: tuple[RuleEntry, ...]) -> int:
    """The loop lint used before the index: every pair, glob checks only. Returns hits."""
    hits = 0
    for j, later in enumerate(rules):
        for i in range(j):
            a, b = rules[i].spec, later.spec
            if (a.match is not None and a.match.strip("*") == "") or (
                a.regex in _lint._CATCH_ALL_REGEXES
            ):
                hits += 1
                break
            if (a.match, a.regex) == (b.match, b.regex):
                hits += 1
                break
            if (
                a.match is not None
                and b.match is not None
                and _lint._glob_covers(a.match, b.match) is not None
            ):
                hits += 1
                break
    return hits


def no_prefix_policy(n: int) -> devpolicy.Policy:
    rules: list[dict[str, object]] = [
        {"regex": f"[a-z]+/layer{i}/(w|b)", "device": "cpu"} for i in range(n)
    ]
    rules.append({"regex": "[a-z]+/layer7/w", "device": "cpu"})
    return devpolicy.load_policy({"version": 1, "rules": rules}, environ={})


def no_prefix_table(sizes: list[int], repeat: int) -> None:
    print("Lint of regex rules without a literal prefix, seconds: median (min-max)")
    print(f"{'rules':>6} {'lint()':>26} {'x per 8x rules':>15} {'dead rule found':>16}")
    previous: float | None = None
    for n in sizes:
        policy = no_prefix_policy(n)
        found = [f for f in devpolicy.lint(policy) if f.code == "unreachable-rule"]
        whole = timed(partial(devpolicy.lint, policy), repeat)
        growth = "" if previous is None else f"{statistics.median(whole) / previous:.1f}"
        previous = statistics.median(whole)
        ok = "yes" if [f.origin for f in found] == [f"<mapping>:rules[{n}]"] else "NO"
        print(f"{len(policy.rules):>6} {show(whole):>26} {growth:>15} {ok:>16}")


def test_every_rule(names: list[str], tests: list[Callable[[str], object]]) -> None:
    for name in names:
        for test in tests:
            if test(name):
                break


def test_candidates(
    names: list[str], tests: list[Callable[[str], object]], index: PrefixIndex
) -> None:
    for name in names:
        for i in index.candidates(name):
            if tests[i](name):
                break


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def show(samples: list[float], scale: float = 1.0) -> str:
    med = statistics.median(samples) * scale
    return f"{med:9.3f} ({min(samples) * scale:.3f}-{max(samples) * scale:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--old-max", type=int, default=2000, help="largest N for the old loop")
    parser.add_argument(
        "--no-prefix-sizes", default="250,2000", help="N for table 3, comma-separated"
    )
    parser.add_argument("--no-prefix-only", action="store_true", help="print table 3 alone")
    args = parser.parse_args()
    sizes = [int(n) for n in args.no_prefix_sizes.split(",")]
    if args.no_prefix_only:
        no_prefix_table(sizes, args.repeat)
        return 0

    print("Lint, seconds: median (min-max)")
    header = ("rules", "old pairwise", "new _unreachable", "new lint()", "x per doubling")
    print(f"{header[0]:>6} {header[1]:>26} {header[2]:>26} {header[3]:>26} {header[4]:>15}")
    previous: float | None = None
    for n in (1000, 2000, 4000):
        policy = policy_of_size(n)
        rules = policy.rules
        old = "-"
        if n <= args.old_max:
            old = show(timed(partial(old_unreachable, rules), args.repeat))
        new = timed(partial(_lint._unreachable, rules), args.repeat)
        whole = timed(partial(devpolicy.lint, policy), args.repeat)
        growth = "" if previous is None else f"{statistics.median(whole) / previous:.2f}"
        previous = statistics.median(whole)
        print(f"{len(rules):>6} {old:>26} {show(new):>26} {show(whole):>26} {growth:>15}")

    print("\nCold resolve of a name that falls through to '*', microseconds per name")
    print(f"{'rules':>6} {'test every rule':>26} {'index candidates':>26} {'ratio':>8}")
    names = [f"data/shard{k}/x" for k in range(2000)]
    for n in (10, 2000):
        patterns = [(f"model/layer{i}/*", False) for i in range(n - 1)] + [("*", False)]
        tests = [compile_condition(p, r).test for p, r in patterns]
        index = PrefixIndex(patterns)
        a = timed(partial(test_every_rule, names, tests), args.repeat)
        b = timed(partial(test_candidates, names, tests, index), args.repeat)
        per = 1e6 / len(names)
        ratio = statistics.median(a) / statistics.median(b)
        print(f"{n:>6} {show(a, per):>26} {show(b, per):>26} {ratio:>7.1f}x")
    print()
    no_prefix_table(sizes, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
