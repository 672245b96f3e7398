"""Lints: rules that can never match, targets this machine lacks, chains that end nowhere.

The lint against real names (`check --names`) is `real_names`'s.
"""

from __future__ import annotations

import fnmatch
import os
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._apply.transfers import lint_transfers
from .._base.errors import DeviceUnavailableError
from .._base.files import untrusted
from .._decide.decider import Decider, virtual_decider
from .._decide.routing import Fit, Route
from .._document.axes import ATTACHED, Attached
from .._document.layers import RuleEntry, Setting
from .._document.schema import MeshSpec
from .._document.targets import ShardingTarget
from .._machine.capacity import Capacity
from .._machine.inventory import THIS_PROCESS
from .._machine.machine import D, VirtualMachine
from .._names.cover import CoverJudge
from .._names.hints import guess_example, required_literal
from .._names.matching import NO_SHAPE_TEST, ShapeTest, compile_condition
from .._names.prefixes import PrefixIndex
from .._runtime.knobs import env_needs_allow
from .._runtime.settings import plan_runtime
from .policy import Policy

Severity = Literal["error", "warning", "note"]
_WILDCARDS = "*?["
# `.` stops at newlines unless DOTALL is on, so a bare `.*` is not a catch-all.
_CATCH_ALL_REGEXES = ("(?s).*", "(?s:.*)")


@dataclass(frozen=True, slots=True)
class Finding:
    """One lint finding.

    Attributes:
        severity: `error` (resolving would fail here, or a rule is dead), `warning`, or
            `note`: what the run says at info, never a warning (a fallback the rule
            declared, taken here); `check --strict` fails on errors and warnings only.
        origin: Where: `file:line`, `env:DEVPOLICY_RULES`, ...
        code: A stable short name: `unreachable-rule`, `missing-device`,
            `missing-memory-kind`, `chain-ends-nowhere`, `no-safe-end`, `unused-mesh`,
            `runtime-conflict`, `runtime-env-wins`, `runtime-hides-accelerator`, `runtime-opt-in`,
            `runtime-allow-unused`, `untrusted-policy`, `file-never-matches`,
            `regex-is-a-fragment`, `attached-without-axis-rules`, `transfers-left-to-jax`,
            `transfers-watch-nothing`; against real names (`lint_names`):
            `rule-matched-nothing`, `not-sharded`.
        message: What is wrong and what to do.
    """

    severity: Severity
    origin: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.severity}: {self.message} [{self.code}]"


def lint(policy: Policy, *, machine: VirtualMachine | None = None) -> list[Finding]:
    """Check a loaded policy for mistakes that validation cannot see.

    Chains are judged on `machine` (a `VirtualMachine`, as `plan` and `explain` take), or on
    this one.

    Errors: a rule that can never match because an earlier rule matches every name it
    would (after a catch-all, an identical pattern, or a glob that covers it), and a
    fallback chain none of whose targets exists on the machine. Warnings: a target whose
    backend, index or memory kind the machine lacks (policies travel between machines),
    where the policy's chain takes over (a note where the rule's own `fallback:` is taken:
    the run says that at info, as the plan),
    a non-strict chain that can really end nowhere there (`no-safe-end`: some array shape
    no target of it takes, such as a sharding its dimensions do not divide with no
    `replicate` or device after it; memory aside), a mesh no rule uses, and `runtime:`
    knobs the environment overrides (`runtime-env-wins`) or contradicts
    (`runtime-conflict`).

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "*", "device": "cpu"}, {"match": "model/*", "device": "cpu"}]})
        >>> [f.code for f in devpolicy.lint(p)]
        ['unreachable-rule']
    """
    settings = policy.settings
    decider: Decider[Any] = policy.decider
    capacity: Capacity[Any] = policy.capacity
    if machine is not None:
        decider, capacity = virtual_decider(settings, machine, "lint"), machine
    findings = _unreachable(policy.rules)
    fit = Fit(capacity, settings.headroom.value)
    where = "this machine" if machine is None else f"the machine described ({machine})"
    # Chains that can end nowhere, each with why and the rules using it: one warning per
    # chain, not per rule (five rules sharing a sharding are one concern, not five).
    unsafe: dict[tuple[str, ...], tuple[str, list[tuple[str, str]]]] = {}
    for position, (entry, route) in enumerate(zip(policy.rules, decider.routes, strict=True)):
        label = f"rule {position} ({entry.spec.label})"
        findings += _chain(label, entry.origin, route, fit, unsafe, where, entry.spec.shape_test)
    if decider.default_route is not None:
        findings += _chain(
            "the default", settings.default.origin, decider.default_route, fit, unsafe, where
        )
    findings += [_no_safe_end(chain, why, users, where) for chain, (why, users) in unsafe.items()]
    findings += _file_rules(policy.rules)
    findings += _path_fragments(policy.rules)
    findings += _attached_without_table(policy.rules, settings.meshes)
    findings += _transfers_findings(policy, machine)
    return findings + _unused_meshes(policy) + _runtime_findings(policy)


# A regex that starts and ends with plain text (after any inline flags): a path fragment.
_PLAIN_START = re.compile(r"(?:\(\?[aiLmsux]+\))*[A-Za-z0-9_-]")
_PLAIN_END = re.compile(r"[A-Za-z0-9_-]\Z")


def _path_fragments(rules: tuple[RuleEntry, ...]) -> list[Finding]:
    """`regex:` rules written like a fragment of a path (`attention/(wq|wk)/kernel`): a
    regex must match the whole name, so such a rule takes only names that start and end
    as it does, never `params/h/0/attention/wq/kernel`. Tables from EasyLM or EasyDeL are
    searched (`re.search`): `search:` reads them as written. `^` (or `\\A`) at the start
    says the whole name is meant, and silences this."""
    findings = []
    for position, entry in enumerate(rules):
        regex = entry.spec.regex
        if (
            regex is None
            or "/" not in regex
            or _PLAIN_START.match(regex) is None
            or _PLAIN_END.search(regex) is None
        ):
            continue
        findings.append(
            Finding(
                "warning",
                entry.origin,
                "regex-is-a-fragment",
                f"rule {position} ({entry.spec.label}): a regex matches whole names, so this "
                f"one takes only names that are exactly such a path, not ones with more "
                f"parts before or after (a regex copied from EasyLM or EasyDeL is searched "
                f"for): write `search: {regex!r}` to find it anywhere in a name, or "
                f"`regex: {'^' + regex!r}` if the whole name is meant",
            )
        )
    return findings


def _attached_without_table(
    rules: tuple[RuleEntry, ...], meshes: Mapping[str, MeshSpec]
) -> list[Finding]:
    """`axes: attached` with no `axis_rules` for its mesh: every logical name a leaf
    carries would be left unsharded (only flax `Partitioned` mesh axes would shard)."""
    findings = []
    for position, entry in enumerate(rules):
        sharding = entry.spec.sharding
        if sharding is None or sharding.axes != ATTACHED:
            continue
        mesh = meshes.get(sharding.mesh)
        if mesh is None or mesh.axis_rules:
            continue
        findings.append(
            Finding(
                "warning",
                entry.origin,
                "attached-without-axis-rules",
                f"rule {position} ({entry.spec.label}): `axes: attached` but neither mesh "
                f"{sharding.mesh!r} nor the policy has `axis_rules`, so every logical name a "
                "leaf carries (flax nn.with_logical_partitioning, nnx sharding, haliax axes) "
                "is left unsharded and the leaves are replicated; add the table, e.g. "
                "`axis_rules: [[embed, fsdp], [mlp, tensor]]` (flax `Partitioned` names are "
                "mesh axes and need none)",
            )
        )
    return findings


# How many users of a chain a no-safe-end warning names before "and N more".
_NAMED_IN_WARNING = 8


def _no_safe_end(
    chain: tuple[str, ...], why: str, users: list[tuple[str, str]], where: str
) -> Finding:
    """The one warning about a chain without a safe end, at its first user's origin."""
    (label, origin), *others = users
    if others:
        named = [f"{other} at {where}" for other, where in others[:_NAMED_IN_WARNING]]
        if len(others) > _NAMED_IN_WARNING:
            named.append(f"{len(others) - _NAMED_IN_WARNING} more")
        label += f" (and {', '.join(named)})"
    return Finding(
        "warning",
        origin,
        "no-safe-end",
        f"{label}: the chain ({', '.join(chain)}) can end nowhere on {where}: {why}; "
        "end it in a target that takes any array (`replicate` after a sharding, a device, "
        "`auto`)",
    )


def _pattern(entry: RuleEntry) -> str:
    return entry.spec.name_pattern[0]


def _unreachable(rules: tuple[RuleEntry, ...]) -> list[Finding]:
    patterns = [entry.spec.name_pattern for entry in rules]
    # Only an earlier rule whose literal prefix starts this one's (or starts with it) can
    # match its names: compare those, not every pair.
    index = PrefixIndex(patterns)
    # Likewise for globs' literal suffixes (reversed, so the same index serves): rules
    # like `*/layer{i}/w` share the empty prefix but not their ends. A regex's is empty.
    suffixes = PrefixIndex.of_texts(
        "" if is_regex else _literal_suffix(text)[::-1] for text, is_regex in patterns
    )
    judge = CoverJudge()
    literals = _LiteralIndex(required_literal(text, is_regex) for text, is_regex in patterns)
    tests: dict[int, Callable[[str], object]] = {}

    def matches(i: int, name: str) -> bool:
        test = tests.get(i)
        if test is None:
            test = tests[i] = compile_condition(*patterns[i]).test
        return bool(test(name))

    def matching_example(j: int) -> list[int] | None:
        """Earlier rules that match a name rule `j` matches; None without such a name.

        Only those can cover it: they alone are compared on automata (the costly step),
        and they are found by the literal text each requires, not by trying every one.
        """
        example = guess_example(*patterns[j])
        if example is None or not matches(j, example):
            example = judge.example(patterns[j])  # exact, and ten times the cost
            if example is None or not matches(j, example):
                return None
        return [i for i in literals.within(example, j) if matches(i, example)]

    findings = []
    for j, later in enumerate(rules):
        prefix = index.prefix(j)
        # A rule without a literal prefix (`.*/layer3/w`) shares its prefix with every
        # earlier rule, and some rules share prefix and suffix with many: those are
        # compared only with the rules that match their example, when they have one.
        earlier_ones = _overlapping(j, index, suffixes) if prefix else None
        if earlier_ones is None or len(earlier_ones) > _FEW:
            by_example = matching_example(j)
            if by_example is not None:
                earlier_ones = by_example
            elif earlier_ones is None:
                earlier_ones = _overlapping(j, index, suffixes)
        # A glob with a wildcard right after its prefix has names that leave any longer
        # prefix there: no earlier rule with a longer prefix can cover it.
        later_glob = _pattern(later) if later.spec.regex is None else None
        free = later_glob is not None and later_glob[len(prefix) : len(prefix) + 1] in (
            "*",
            "?",
        )
        for i in earlier_ones:
            if free and len(index.prefix(i)) > len(prefix):
                continue
            earlier = rules[i]
            why = _covers(earlier, later, judge)
            if why is not None:
                findings.append(
                    Finding(
                        "error",
                        later.origin,
                        "unreachable-rule",
                        f"rule {j} ({later.spec.label}) can never match: rule {i} at "
                        f"{earlier.origin} ({earlier.spec.label}) {why}; "
                        "move it earlier or remove it",
                    )
                )
                break
    return findings


def _overlapping(j: int, index: PrefixIndex, suffixes: PrefixIndex) -> list[int]:
    """Earlier rules whose literal prefix and (for globs) suffix may meet rule `j`'s."""
    prefix = index.prefix(j)
    earlier_ones = index.overlapping(j)
    if len(earlier_ones) > _FEW:
        ends = suffixes.overlapping(j)  # keep the shorter list, test the other relation
        if len(ends) < len(earlier_ones):
            earlier_ones = [i for i in ends if _related(index.prefix(i), prefix)]
        else:
            end = suffixes.prefix(j)
            earlier_ones = [i for i in earlier_ones if _related(suffixes.prefix(i), end)]
    return earlier_ones


class _LiteralIndex:
    """Rules by the literal text every name they match contains (`required_literal`)."""

    def __init__(self, literals: Iterable[str]) -> None:
        self._by_literal: dict[str, list[int]] = {}
        # Rules with no literal (`*`, `[a-z]+`): a candidate for any name.
        self._any: list[int] = []
        for i, literal in enumerate(literals):
            if literal:
                self._by_literal.setdefault(literal, []).append(i)
            else:
                self._any.append(i)
        self._lengths = sorted({len(literal) for literal in self._by_literal})

    def within(self, name: str, before: int) -> list[int]:
        """Rules before `before` whose literal occurs in `name` (or that have none), in order.

        Every rule that matches `name` is among them. Costs a lookup per substring of
        `name` of each literal length (at most `LITERAL_CHARS`), not one per rule.
        """
        found = self._any[: bisect_left(self._any, before)]
        for length in self._lengths:
            for start in range(len(name) - length + 1):
                ids = self._by_literal.get(name[start : start + length])
                if ids:
                    found += ids[: bisect_left(ids, before)]
        return sorted(set(found))


# Past this many candidates by prefix, narrow them by suffix too.
_FEW = 16


def _related(a: str, b: str) -> bool:
    return a.startswith(b) or b.startswith(a)


def _covers(earlier: RuleEntry, later: RuleEntry, judge: CoverJudge) -> str | None:
    """Why `earlier` matches every name and size `later` would, or None if not (or unknown)."""
    a, b = earlier.spec, later.spec
    if a.file is not None and a.file != b.file:
        return None  # `earlier` takes only its file's tensors: `later` may take others
    if a.min_bytes is not None or a.max_bytes is not None:
        if b.min_bytes is None and b.max_bytes is None:
            return None  # `later` also matches unsized names, which `earlier` never does
        low_ok = (a.min_bytes or 0) <= (b.min_bytes or 0)
        high_ok = a.max_bytes is None or (b.max_bytes is not None and b.max_bytes <= a.max_bytes)
        if not (low_ok and high_ok):
            return None
    if a.shape_test.active and not _shapes_within(a.shape_test, b.shape_test):
        return None  # `earlier` takes only some shapes (never an unknown one): `later` more
    if (a.match is not None and a.match.strip("*") == "") or a.regex in _CATCH_ALL_REGEXES:
        return "matches every name"
    if (a.match, a.regex) == (b.match, b.regex):
        return "has the same pattern"
    if a.match is not None and b.match is not None:
        why = _glob_covers(a.match, b.match)
        if why is not None or not any(c in b.match for c in _WILDCARDS):
            return why  # exact: a literal name either matches or not
        tail_a, tail_b = _literal_suffix(a.match), _literal_suffix(b.match)
        if not (tail_a.endswith(tail_b) or tail_b.endswith(tail_a)):
            return None  # the names end differently
    # Decided on automata; None when either pattern cannot be modelled exactly in budget.
    earlier_pattern = (_pattern(earlier), a.regex is not None)
    if judge.covers(earlier_pattern, (_pattern(later), b.regex is not None)):
        return "matches every name it matches"
    return None


def _shapes_within(outer: ShapeTest, inner: ShapeTest) -> bool:
    """Whether every shape `inner` admits passes `outer` (False when unsure)."""
    if not inner.active:
        return False  # `inner` also takes arrays of unknown shape, which `outer` never does
    if outer.ndim is not None and (inner.ndim is None or not set(inner.ndim) <= set(outer.ndim)):
        return False
    if outer.min_elements is not None and (inner.min_elements or 0) < outer.min_elements:
        return False
    return outer.max_elements is None or (
        inner.max_elements is not None and inner.max_elements <= outer.max_elements
    )


def _literal_suffix(glob: str) -> str:
    """The text every name `glob` matches ends with (after its last wildcard or bracket)."""
    return glob[max(glob.rfind(c) for c in "*?[]") + 1 :]


def _glob_covers(earlier: str, later: str) -> str | None:
    if not any(c in later for c in _WILDCARDS):
        return "matches it" if fnmatch.fnmatchcase(later, earlier) else None
    prefix, stars = earlier.rstrip("*"), len(earlier) - len(earlier.rstrip("*"))
    if stars and not any(c in prefix for c in _WILDCARDS):
        literal_head = later[
            : min((later.index(c) for c in _WILDCARDS if c in later), default=len(later))
        ]
        if literal_head.startswith(prefix):
            return f"matches every name starting with {prefix!r}"
    suffix, stars = earlier.lstrip("*"), len(earlier) - len(earlier.lstrip("*"))
    if stars and not any(c in suffix for c in _WILDCARDS):
        cut = max((later.rindex(c) for c in "*?]" if c in later), default=-1)
        if later[cut + 1 :].endswith(suffix):
            return f"matches every name ending with {suffix!r}"
    return None


def _chain(
    label: str,
    origin: str,
    route: Route[D],
    fit: Fit[D],
    unsafe: dict[tuple[str, ...], tuple[str, list[tuple[str, str]]]],
    where: str = "this machine",
    shape_test: ShapeTest = NO_SHAPE_TEST,
) -> list[Finding]:
    """Findings about one chain, from the decider's own walk; a chain without a safe end is
    added to `unsafe` instead."""
    findings = []
    # Under `axes: attached` a leaf's names are not known here: walked as a leaf that needs
    # none (0-d, replicated), so the mesh alone is judged, with no note about names.
    walked = route.walk(label, None, fit, shape=() if route.attached is not None else None)
    # A target the chain names twice (a rule's device again in the fallback) is said once.
    missing = list(dict.fromkeys(f"{target} ({why})" for target, why in walked.tried))
    here = None if isinstance(walked, DeviceUnavailableError) else walked.target.text
    targets = list(dict.fromkeys(route.tried_chain))
    texts = [t.text for t in targets]
    if route.attached is not None:
        texts[0] = route.requested  # `mesh[attached]`, as written
    there = "here" if where == "this machine" else "there"
    if missing and not isinstance(walked, DeviceUnavailableError):
        # As the run logs it: a way the rule declared is the plan (info there, a note
        # here); the policy's chain taking over is a warning in both.
        findings.append(
            Finding(
                "note" if walked.declared else "warning",
                origin,
                "missing-device",
                f"{label}: not on {where}: {'; '.join(missing)}; {there} it falls back to {here}",
            )
        )
    if here is None:
        names = ", ".join(texts)
        if route.strict:
            consequence, fix = (
                "strict, so no fallback is tried",
                (f"use a target {where} has, or set `strict: false` to allow the fallback"),
            )
        else:
            consequence, fix = "none of them exists", "add `fallback: [cpu]`"
        findings.append(
            Finding(
                "error",
                origin,
                "chain-ends-nowhere",
                f"{label}: no device for ({names}) on {where} ({consequence}; "
                f"{'; '.join(missing)}): names it decides raise DeviceUnavailableError {there}; "
                f"{fix}",
            )
        )
    elif not route.strict:
        why = _ends_nowhere(label, route, fit, shape_test)
        if why is not None:
            unsafe.setdefault(tuple(texts), (why, []))[1].append((label, origin))
    return findings


# A dimension no mesh axis divides (a prime no axis size is): with 1, the probes' sizes.
_INDIVISIBLE = 65521


def _ends_nowhere(label: str, route: Route[D], fit: Fit[D], shape_test: ShapeTest) -> str | None:
    """An array the chain takes nowhere on its machine, and why; None when every array
    finds a target (memory aside: any chain can be too small for some size).

    Asked of the decider's own walk, with the arrays that pass most targets by, among
    those the rule can take (its `ndim` and element conditions): dimensions no axis
    divides (1, or a prime), of each rank up to one past the longest spec (a spec longer
    than the array), and under `axes: attached` a leaf whose names cannot be had.
    """
    longest = max((len(t.spec) for t in route.chain if isinstance(t, ShardingTarget)), default=0)
    probes: list[tuple[tuple[int, ...], Attached | None]] = list(
        dict.fromkeys(
            ((size,) * rank, None) for rank in range(longest + 2) for size in (1, _INDIVISIBLE)
        )
    )
    if route.attached is not None:
        probes += [((size,), Attached(())) for size in (1, _INDIVISIBLE)]  # no names for it
    for shape, attached in probes:
        if shape_test.problem(shape) is not None:
            continue  # an array the rule never takes
        walked = route.walk(label, None, fit, shape=shape, attached=attached)
        if isinstance(walked, DeviceUnavailableError):
            passed = "; ".join(f"{target} ({why})" for target, why in walked.tried)
            named = " whose axis names cannot be had" if attached is not None else ""
            return f"an array of shape {shape}{named} finds no target ({passed})"
    return None


# Text a path never holds once normalised (as `file:` globs see paths): each with the fix.
_UNNORMAL = (("//", "write one `/`"), ("/./", "drop the `./`"), ("/../", "name the directory"))


def _file_rules(rules: tuple[RuleEntry, ...]) -> list[Finding]:
    """`file:` globs no path can match: paths are matched normalised (no `./`, no `//`,
    no trailing `/`) and with `/` between components."""
    findings = []
    for position, entry in enumerate(rules):
        glob = entry.spec.file
        if glob is None:
            continue
        why = None
        if "\\" in glob:
            why = "it holds `\\`, but paths are matched with `/` between components"
        elif glob.endswith(("/", "/.")):
            why = "it ends in `/`, but paths are matched without a trailing `/`; drop it"
        elif glob.startswith("./"):
            why = "it starts with `./`, but paths are matched normalised; drop the `./`"
        else:
            for text, fix in _UNNORMAL:
                if text in glob.lstrip("./") if text == "/../" else text in glob:
                    why = f"it holds `{text}`, which a normalised path never does; {fix}"
                    break
        if why is not None:
            findings.append(
                Finding(
                    "error",
                    entry.origin,
                    "file-never-matches",
                    f"rule {position} ({entry.spec.label}) can never match a file: {why}",
                )
            )
    return findings


def _runtime_findings(policy: Policy) -> list[Finding]:
    """Runtime knobs this process's environment overrides or contradicts; powerful `env:`
    variables the policy opted into (`runtime.allow`), and opt-ins it does not use; a
    named policy file that fails the trust check."""
    wanted = policy.settings.runtime
    findings = _opt_ins(wanted)
    if policy.file is not None:
        why = untrusted(policy.file)
        if why is not None:
            findings.append(
                Finding(
                    "warning",
                    policy.file,
                    "untrusted-policy",
                    f"{why.reason}: used only because it was named; discovery would refuse "
                    f"it; to trust it, {why.fix}",
                )
            )
    return findings + _runtime_environment(policy)


def _opt_ins(wanted: Mapping[str, Setting]) -> list[Finding]:
    allow = wanted.get("allow")
    used: set[str] = set()
    findings = []
    for key, setting in wanted.items():
        if not key.startswith("env."):
            continue
        name = key.removeprefix("env.")
        value = setting.value
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        for item, why in env_needs_allow(name, text):
            used.add(item)
            findings.append(
                Finding(
                    "warning",
                    setting.origin,
                    "runtime-opt-in",
                    f"runtime.env.{name}: {item} {why}; it is set because `runtime.allow` "
                    "lists it: be sure this policy, and anything it names, is yours",
                )
            )
    for item in allow.value if allow is not None else ():
        if item not in used:
            findings.append(
                Finding(
                    "warning",
                    allow.origin if allow is not None else "",
                    "runtime-allow-unused",
                    f"runtime.allow lists {item}, which runtime.env does not set: remove it",
                )
            )
    return findings


def _runtime_environment(policy: Policy) -> list[Finding]:
    runtime = plan_runtime(policy.settings.runtime, os.environ)
    findings = [Finding("warning", "env", "runtime-conflict", c) for c in runtime.conflicts]
    origin = policy.settings.runtime["platforms"].origin if runtime.hidden else ""
    findings += [
        Finding("warning", origin, "runtime-hides-accelerator", h.removeprefix(f"{origin}: "))
        for h in runtime.hidden
    ]
    findings += [
        Finding(
            "warning",
            k.origin,
            "runtime-env-wins",
            f"runtime.{k.knob.removeprefix('env.')}: {k.note}; the environment wins",
        )
        for k in runtime.knobs
        if k.source == "env"
    ]
    return findings


def _unused_meshes(policy: Policy) -> list[Finding]:
    # A mesh a chain falls back to (`dp[data]`, `replicate`) is used too.
    routes = [*policy.decider.routes, policy.decider.default_route]
    used = {
        t.mesh
        for route in routes
        if route is not None
        for t in route.chain
        if isinstance(t, ShardingTarget)
    }
    return [
        Finding(
            "warning",
            policy.settings.mesh_origins.get(name, policy.file or "<mapping>"),
            "unused-mesh",
            f"mesh {name!r} is used by no rule; give a rule `sharding: {{mesh: {name}, ...}}` "
            "or remove it",
        )
        for name in policy.settings.meshes
        if name not in used
    ]


def _transfers_findings(policy: Policy, machine: VirtualMachine | None) -> list[Finding]:
    """`transfers:` that does not do what it reads as (see `transfers.lint_transfers`)."""
    texts = (machine if machine is not None else THIS_PROCESS).available()
    where = "this machine" if machine is None else f"the machine described ({machine})"
    found = lint_transfers(policy.settings.transfers, texts, where)
    return [Finding("warning", origin, code, message) for origin, code, message in found]
