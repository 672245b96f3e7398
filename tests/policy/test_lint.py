"""Lints: dead rules, missing devices, chains that end nowhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy._names.matching import compile_condition
from tests.helpers import policy_of, run_threads
from tests.strategies import PATTERNS, names_matching

NO_GPU = "gpu" not in devpolicy.inventory().devices


def codes(**fields: object) -> list[tuple[str, str]]:
    return [(f.code, f.origin) for f in devpolicy.lint(policy_of(**fields))]


def rule(match: str | None = None, device: str = "cpu", **extra: object) -> dict[str, object]:
    spec: dict[str, object] = {"device": device, **extra}
    if match is not None:
        spec["match"] = match
    return spec


def sharded(match: str, spec: list[str | None], **extra: object) -> dict[str, object]:
    return {"match": match, "sharding": {"mesh": "m", "spec": spec}, **extra}


def lint_sharded(rules: list[dict[str, object]], **fields: object) -> list[devpolicy.types.Finding]:
    """Lint rules over a mesh `m` of the 4 CPU devices (`data: 4`)."""
    meshes = {"m": {"axes": {"data": 4}, "devices": "cpu"}}
    return devpolicy.lint(policy_of(meshes=meshes, rules=rules, **fields))


class TestNoSafeEnd:
    """`no-safe-end` only where a chain can really end nowhere on the machine linted for."""

    def test_a_sharding_policy_that_replicates_what_does_not_divide_is_quiet(self) -> None:
        """The docs' nnx policy: a 0-d rule replicated, the rest sharded with `fallback:
        [replicate]`: every array finds a target, nothing to warn about."""
        rules = [
            sharded("params/step", [], ndim=0),
            sharded("params/*", ["data"], fallback=["replicate"]),
        ]
        assert lint_sharded(rules) == []

    @pytest.mark.parametrize(
        "chain",
        [
            {"fallback": ["replicate"]},
            {"fallback": ["cpu:3"]},
            {"fallback": ["auto"]},
            {"sharding": {"mesh": "m", "spec": ["data"], "indivisible": "replicate"}},
        ],
    )
    def test_a_chain_that_takes_any_array_is_safe(self, chain: dict[str, object]) -> None:
        assert lint_sharded([{**sharded("w", ["data"]), **chain}]) == []

    def test_the_policys_chain_counts(self) -> None:
        """A rule with no fallback of its own is safe when the policy's chain is."""
        assert lint_sharded([sharded("w", ["data"])], fallback=["replicate"]) == []

    def test_a_rank_the_rule_never_takes_is_not_held_against_it(self) -> None:
        """`[data, null]` with `indivisible: replicate` takes any 2-d array; a 1-d one it
        cannot shard (the spec is longer): a warning unless the rule takes only `ndim: 2`."""
        spec = {"mesh": "m", "spec": ["data", None], "indivisible": "replicate"}
        (finding,) = lint_sharded([{"match": "k", "sharding": spec}])
        assert finding.code == "no-safe-end"
        assert "an array of shape (1,) finds no target" in finding.message
        assert lint_sharded([{"match": "k", "sharding": spec, "ndim": 2}]) == []

    def test_strict_chains_are_left_to_raise(self) -> None:
        """Under strict, a chain that raises is what was asked for: no warning."""
        assert lint_sharded([sharded("w", ["data"])], strict=True) == []

    def test_a_gpu_mesh_is_judged_on_a_described_machine(self) -> None:
        """On 8 GPUs a GPU mesh with `replicate` after it is safe; with nothing after it,
        an array that does not divide ends nowhere there."""
        meshes = {"g": {"axes": {"data": 8}, "devices": "gpu"}}
        gpus = devpolicy.VirtualMachine(["gpu=8x80GiB"])
        safe = {
            "match": "w",
            "sharding": {"mesh": "g", "spec": ["data"]},
            "fallback": ["replicate"],
        }
        assert devpolicy.lint(policy_of(meshes=meshes, rules=[safe]), machine=gpus) == []
        unsafe = {**safe, "fallback": []}
        findings = devpolicy.lint(policy_of(meshes=meshes, rules=[unsafe]), machine=gpus)
        assert [f.code for f in findings] == ["no-safe-end"]


class TestUnreachable:
    @pytest.mark.parametrize(
        ("earlier", "later"),
        [
            (rule("*"), rule("model/*")),
            (rule("**"), rule("x")),
            (rule(None, regex="(?s).*"), rule("x")),
            (rule("model/*"), rule("model/*")),
            (rule(None, regex="a+"), rule(None, regex="a+")),
            (rule("model/*"), rule("model/layers/*")),
            (rule("model/*"), rule("model/[ab]")),
            (rule("*/w"), rule("model/*/w")),
            (rule("a?c"), rule("abc")),
            (rule("*", min_bytes=1), rule("x", min_bytes=10, max_bytes=20)),
            (rule(None, regex="a.*"), rule("abc")),
            (rule("*", ndim=[0, 1]), rule("x", ndim=1, max_elements=8)),
            (rule("*", max_elements=10), rule("x", min_elements=2, max_elements=10)),
        ],
    )
    def test_rules_an_earlier_rule_covers_are_errors(
        self, earlier: dict[str, object], later: dict[str, object]
    ) -> None:
        """A later rule whose every match an earlier rule takes is reported at the later rule."""
        assert codes(rules=[earlier, later]) == [("unreachable-rule", "<mapping>:rules[1]")]

    @pytest.mark.parametrize(
        ("earlier", "later"),
        [
            (rule("model/*"), rule("data/*")),
            (rule("model/w"), rule("model/*")),
            (rule("*", min_bytes=100), rule("x")),  # the later also matches unsized names
            (rule("*", max_bytes=10), rule("x", max_bytes=20)),
            (rule("*/w"), rule("model/w/*")),
            (rule("a*b*"), rule("a*")),
            (rule(None, regex=".*"), rule(None, regex="a\nb")),  # `.` does not match a newline
            (rule("*", ndim=[0, 1]), rule("x")),  # the later also takes matrices
            (rule("*", ndim=1), rule("x", ndim=[1, 2])),
            (rule("*", max_elements=1), rule("x", ndim=0)),  # exact would say covered: unsure
            (rule("*", min_elements=2), rule("x", max_elements=9)),
            (rule("*", max_elements=10), rule("x", min_elements=2)),
        ],
    )
    def test_rules_that_can_still_match_are_not_reported(
        self, earlier: dict[str, object], later: dict[str, object]
    ) -> None:
        """No false alarms where the later rule still gets names (or it cannot be decided)."""
        assert codes(rules=[earlier, later]) == []


class TestDevices:
    def test_index_this_machine_lacks_warns_and_names_the_fallback(self) -> None:
        """cpu:9 with a fallback is a warning saying where names go here."""
        (finding,) = devpolicy.lint(policy_of(fallback=["cpu"], rules=[rule("x", "cpu:9")]))
        assert (finding.severity, finding.code) == ("warning", "missing-device")
        assert finding.message.endswith("here it falls back to cpu")

    def test_chain_with_nothing_available_is_an_error(self) -> None:
        """A rule none of whose targets exists here would raise: error."""
        findings = devpolicy.lint(policy_of(rules=[rule("x", "cpu:9", fallback=["cpu:8"])]))
        assert [(f.severity, f.code) for f in findings] == [("error", "chain-ends-nowhere")]

    def test_strict_ignores_the_fallback(self) -> None:
        """Under strict only the first target counts."""
        findings = devpolicy.lint(
            policy_of(strict=True, rules=[rule("x", "cpu:9", fallback=["cpu"])])
        )
        assert [f.code for f in findings] == ["chain-ends-nowhere"]
        assert "strict, so no fallback is tried" in findings[0].message

    @pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
    def test_a_chain_is_judged_on_the_machine_linted_for(self) -> None:
        """gpu:0 then cpu:1 ends on cpu:1 here: the missing GPU is said, no `no-safe-end`
        (cpu:1 takes any array). On a described one-CPU machine it ends nowhere: an error."""
        policy = policy_of(rules=[rule("x", "gpu:0", fallback=["cpu:1"])])
        assert [f.code for f in devpolicy.lint(policy)] == ["missing-device"]
        one_cpu = devpolicy.VirtualMachine(["cpu=1x16GiB"])
        assert [f.code for f in devpolicy.lint(policy, machine=one_cpu)] == ["chain-ends-nowhere"]
        gpus = devpolicy.VirtualMachine(["gpu=2x80GiB", "cpu=2x64GiB"])
        assert devpolicy.lint(policy, machine=gpus) == []
        (finding,) = devpolicy.lint(policy, machine=one_cpu)
        assert finding.message.startswith(
            "rule 0 ('x'): no device for (gpu:0, cpu:1) on the machine described "
            "(cpu=1x16GiB; 1 process) (none of them exists; "
        )

    def test_lint_takes_only_a_described_machine(self) -> None:
        with pytest.raises(
            TypeError, match=r"^lint\(machine=\.\.\.\) takes a devpolicy\.VirtualMachine"
        ):
            devpolicy.lint(policy_of(), machine="gpu=8")  # type: ignore[arg-type]

    def test_missing_memory_kind_warns(self) -> None:
        """A memory kind the device lacks here is reported like a missing device."""
        original = devpolicy._machine.inventory.memory_kinds
        try:
            devpolicy._machine.inventory.memory_kinds = lambda d: ("device",)
            findings = devpolicy.lint(
                policy_of(rules=[rule("x", "cpu:1", memory="pinned_host", fallback=["cpu"])])
            )
        finally:
            devpolicy._machine.inventory.memory_kinds = original
        assert "cpu:1 (no memory kind 'pinned_host' (has: device))" in findings[0].message

    def test_reject_default_is_not_a_target(self) -> None:
        """`default: reject` has no chain to lint."""
        assert devpolicy.lint(policy_of(default="reject", rules=[rule("x")])) == []

    def test_findings_read_as_file_line_severity_message(self) -> None:
        """str(Finding) is the line `devpolicy check` prints."""
        (finding,) = devpolicy.lint(policy_of(rules=[rule("*"), rule("x")]))
        assert str(finding).startswith("<mapping>:rules[1]: error: rule 1 ('x') can never match")
        assert str(finding).endswith("[unreachable-rule]")


class TestReject:
    def test_unmatched_names_raise_under_default_reject(self) -> None:
        """`default: reject` makes every unplanned name an error naming the rules tried."""
        policy = policy_of(default="reject", rules=[rule("dataset/*")])
        assert policy.resolve("dataset/x").device_text == "cpu:0"
        with pytest.raises(
            devpolicy.errors.UnmatchedNameError,
            match=r"^no rule matches 'model/w' and the default is `reject` \(<mapping>:default\); add a rule for it \(rules tried: 'dataset/\*'\)$",
        ):
            policy.resolve("model/w")

    def test_reject_from_the_environment(self) -> None:
        """DEVPOLICY_DEFAULT=reject works without editing the policy."""
        policy = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_DEFAULT": "reject"})
        with pytest.raises(devpolicy.errors.UnmatchedNameError):
            policy.resolve("x")
        assert policy.explain("x").error is not None


def test_strict_dead_end_suggests_turning_strict_off() -> None:
    """Under strict, adding a fallback would not help: the advice says so."""
    (finding,) = devpolicy.lint(
        policy_of(strict=True, fallback=["cpu"], rules=[rule("x", "cpu:9")])
    )
    assert "set `strict: false` to allow the fallback" in finding.message
    assert "add `fallback" not in finding.message


class TestIssueCases:
    def test_a_regex_shadows_a_later_glob(self) -> None:
        """`regex: model/.*` before `match: model/layer1`: the glob can never match."""
        findings = devpolicy.lint(
            policy_of(rules=[rule(None, regex="model/.*"), rule("model/layer1")])
        )
        assert [(f.code, f.origin) for f in findings] == [
            ("unreachable-rule", "<mapping>:rules[1]")
        ]
        assert "rule 0 at <mapping>:rules[0] ('model/.*') matches every name it matches" in (
            findings[0].message
        )

    def test_a_regex_shadows_a_later_regex(self) -> None:
        """`model/.*` takes every name of `model/layer[0-9]+/(w|b)`."""
        assert codes(
            rules=[rule(None, regex="model/.*"), rule(None, regex="model/layer[0-9]+/(w|b)")]
        ) == [("unreachable-rule", "<mapping>:rules[1]")]

    def test_the_issues_policy_reports_each_dead_rule(self) -> None:
        """regex model/.*, model/layer1, model/*, model/*: the glob and the duplicate."""
        assert codes(
            rules=[
                rule(None, regex="model/.*"),
                rule("model/layer1"),
                rule("model/*"),  # still gets names with a newline, which `.` skips
                rule("model/*"),
            ]
        ) == [
            ("unreachable-rule", "<mapping>:rules[1]"),
            ("unreachable-rule", "<mapping>:rules[3]"),
        ]

    def test_a_sized_regex_does_not_cover_an_unsized_glob(self) -> None:
        """Size conditions still count: the later rule gets the names of unknown size."""
        assert codes(rules=[rule(None, regex="model/.*", min_bytes=1), rule("model/w")]) == []

    def test_python_only_regex_features_are_never_reported(self) -> None:
        """`\\w` is Unicode in Python: undecided, so no error (never a guess)."""
        assert codes(rules=[rule(None, regex=r"\w+"), rule("x")]) == []

    def test_a_huge_automaton_is_undecided_not_slow(self) -> None:
        """(a|b)*a(a|b){20} would need 2**21 states: lint gives up on it and moves on."""
        found: list[list[tuple[str, str]]] = []
        policy = policy_of(
            rules=[rule(None, regex="(a|b)*"), rule(None, regex="(a|b)*a(a|b){20}"), rule("x")]
        )
        # A hang guard, not a timing assertion: the check must end at all.
        run_threads(lambda: found.append([(f.code, f.origin) for f in devpolicy.lint(policy)]))
        assert found == [[]]

    def test_no_safe_end_is_reported_once_per_chain(self) -> None:
        """Five rules sharding on `data` and two on `[-, data]`, with nothing after: two
        warnings, each naming its rules and an array that finds no target."""
        rules = [sharded(f"r{i}", ["data"]) for i in range(5)] + [
            sharded(f"s{i}", [None, "data"]) for i in range(2)
        ]
        findings = [f for f in lint_sharded(rules) if f.code == "no-safe-end"]
        assert [f.origin for f in findings] == ["<mapping>:rules[0]", "<mapping>:rules[5]"]
        assert findings[0].message.startswith(
            "rule 0 ('r0') (and rule 1 ('r1') at <mapping>:rules[1], "
        )
        assert findings[0].message.endswith(
            "rule 4 ('r4') at <mapping>:rules[4]): the chain (m[data]) can end nowhere on this "
            "machine: an array of shape (1,) finds no target (m[data] (dim 0 of 1 does not "
            "divide by axis 'data' (4))); end it in a target that takes any array (`replicate` "
            "after a sharding, a device, `auto`)"
        )
        assert "an array of shape (1,) finds no target" in findings[1].message

    def test_a_long_list_of_rules_sharing_a_chain_is_cut_short(self) -> None:
        """Twenty rules on one chain: one warning naming eight others and a count."""
        (finding,) = [
            f
            for f in lint_sharded([sharded(f"r{i}", ["data"]) for i in range(20)])
            if f.code == "no-safe-end"
        ]
        assert ", 11 more): the chain (m[data])" in finding.message

    def test_lint_compares_only_rules_whose_prefixes_meet(self) -> None:
        """4,000 distinct-prefix rules and a catch-all: each rule meets only its own kind."""
        rules = [rule(f"model/layer{i}/*", "cpu") for i in range(4000)]
        rules += [rule(None, regex=f"data/shard{i}/(x|y)") for i in range(400)]
        rules += [rule("model/layer7/w"), rule(None, regex="data/shard3/x"), rule("*")]
        # (`data/shard3/x` also reads as a path fragment: `regex-is-a-fragment`, not judged here.)
        assert [c for c in codes(rules=rules) if c[0] != "regex-is-a-fragment"] == [
            ("unreachable-rule", "<mapping>:rules[4400]"),
            ("unreachable-rule", "<mapping>:rules[4401]"),
        ]

    def test_rules_sharing_no_prefix_are_narrowed_by_suffix(self) -> None:
        """`*/layer{i}/w` rules all have the empty prefix; their ends still tell them apart."""
        rules = [rule(f"*/layer{i}/w") for i in range(2000)]
        rules += [rule("*/layer7/w"), rule("model/*/layer9/w"), rule("*/layer9/b")]
        assert codes(rules=rules) == [
            ("unreachable-rule", "<mapping>:rules[2000]"),
            ("unreachable-rule", "<mapping>:rules[2001]"),
        ]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(PATTERNS, PATTERNS, st.data())
def test_a_reported_cover_holds_for_every_sampled_name(
    earlier: tuple[str, bool], later: tuple[str, bool], data: st.DataObject
) -> None:
    """Whenever lint says rule 0 covers rule 1, each sampled name of rule 1 matches rule 0."""

    def spec(pattern: tuple[str, bool]) -> dict[str, object]:
        text, is_regex = pattern
        return rule(None, regex=text) if is_regex else rule(text)

    assume(earlier[0] and later[0])  # an empty pattern is a validation error
    findings = devpolicy.lint(policy_of(rules=[spec(earlier), spec(later)]))
    if not any(f.code == "unreachable-rule" for f in findings):
        return
    test_earlier = compile_condition(*earlier).test
    test_later = compile_condition(*later).test
    for name in data.draw(st.lists(names_matching(*later), min_size=1, max_size=10)):
        # Names are drawn by Python's regex semantics; rules match by RE2's (`\s` is ASCII
        # there): judge only names the later rule really matches.
        if test_later(name):
            assert test_earlier(name), f"{earlier} said to cover {later}, misses {name!r}"


def test_lint_itself_reports_runtime_knobs_the_environment_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not only `devpolicy check`: `lint()` says when a user's variable beats the policy."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    policy = policy_of(runtime={"preallocate": False})
    codes = [(f.code, f.origin) for f in devpolicy.lint(policy)]
    assert ("runtime-env-wins", "env:XLA_PYTHON_CLIENT_PREALLOCATE") in codes


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.lists(PATTERNS, min_size=2, max_size=8))
def test_lint_finds_what_comparing_every_pair_finds(patterns: list[tuple[str, bool]]) -> None:
    """Narrowing by example and literal loses no finding: the same as every earlier rule."""
    from devpolicy._names.cover import CoverJudge
    from devpolicy._policy import lint as _lint

    assume(all(text for text, _ in patterns))
    specs = [rule(None, regex=t) if is_regex else rule(t) for t, is_regex in patterns]
    rules = policy_of(rules=specs).rules
    judge = CoverJudge()
    expected = []
    for j, later in enumerate(rules):
        for i in range(j):
            if _lint._covers(rules[i], later, judge) is not None:
                expected.append((j, i))
                break
    found = [
        (int(f.message.split()[1]), int(f.message.split(": rule ")[1].split()[0]))
        for f in _lint._unreachable(rules)
    ]
    assert found == expected


def test_many_rules_without_a_literal_prefix_still_find_the_dead_one() -> None:
    """300 regex rules that start with a class: the copy of rule 7 at the end is reported."""
    specs = [rule(None, regex=f"[a-z]+/layer{i}/(w|b)") for i in range(300)]
    specs.append(rule(None, regex="[a-z]+/layer7/w"))
    found = [f for f in devpolicy.lint(policy_of(rules=specs)) if f.code == "unreachable-rule"]
    assert [f.message.split(":")[0] for f in found] == [
        "rule 300 ('[a-z]+/layer7/w') can never match"
    ]
    assert "rule 7 at <mapping>:rules[7]" in found[0].message


@pytest.mark.parametrize("verb", ["lint", "plan", "explain"])
def test_a_machine_that_is_not_a_virtual_machine_is_a_type_error_naming_the_call(
    verb: str, tmp_path: Path
) -> None:
    """`machine="gpu=2"` (the CLI's words, not a VirtualMachine) to lint, plan or explain:
    a TypeError naming the call and what it takes."""
    policy = devpolicy.load_policy({"version": 1}, environ={})
    checkpoint = tmp_path / "m.safetensors"
    devpolicy.save_file({"w": np.zeros(2, np.float32)}, checkpoint, policy=policy)
    calls = {
        "lint": lambda: devpolicy.lint(policy, machine="gpu=2"),
        "plan": lambda: devpolicy.plan(checkpoint, policy=policy, machine="gpu=2"),
        "explain": lambda: policy.explain("w", machine="gpu=2"),
    }
    with pytest.raises(
        TypeError,
        match=rf"^{verb}\(machine=\.\.\.\) takes a devpolicy\.VirtualMachine, got str 'gpu=2'$",
    ):
        calls[verb]()
