"""Rule accounting that is right: a rule that took nothing is told apart (shadowed by an
earlier rule, held back by its conditions, written for other files or names, or missed by
a slip, which is named with its fix), and only the misses are warnings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._cli.common import EXIT_NOT_SHARDED
from devpolicy._cli.main import main
from devpolicy._decide.rule_use import Placed, rule_label, rule_uses, silent_rules
from devpolicy._document.schema import RuleSpec
from tests.conftest import REPO
from tests.helpers import policy_of, write

DEMO = REPO / "policies" / "dataset-on-host.yaml"
MESH = {"m": {"axes": {"data": -1}, "devices": "cpu"}}


def _warnings(logs: list[dict[str, Any]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for e in logs:
        if e["log_level"] == "warning":
            found.setdefault(e["event"], []).append(str(e.get("message", "")))
    return found


def _model(path: Path, keys: tuple[str, ...] = ("embed", "out")) -> Path:
    devpolicy.save_file({k: np.zeros((4, 2), np.float32) for k in keys}, path)
    return path


class TestTheDemoSaysNothingAboutItsOwnPolicy:
    def test_the_demo_policy_warns_only_about_gpu_fallbacks(self, tmp_path: Path) -> None:
        """The demo's two loads under its own policy: `*/tokens` and `dataset/*` take
        nothing because the `file:` rule took `dataset/tokens` first; that is no warning
        (27 item 1). What is left are the fallbacks of a machine without a GPU."""
        devpolicy.save_file(
            {"tokens": np.arange(4096, dtype=np.uint16)}, tmp_path / "dataset.safetensors"
        )
        _model(tmp_path / "model.safetensors")
        policy = devpolicy.load_policy(DEMO)
        with capture_logs() as logs:
            policy.load_file(tmp_path / "dataset.safetensors")
            policy.load_file(tmp_path / "model.safetensors")
        warnings = _warnings(logs)
        assert "rule_matched_nothing" not in warnings
        assert set(warnings) <= {"placement", "load_file"}  # the GPU fallbacks, if any

    def test_a_shadowed_rule_says_by_which_rule_at_debug(self, tmp_path: Path) -> None:
        devpolicy.save_file(
            {"tokens": np.arange(4096, dtype=np.uint16)}, tmp_path / "dataset.safetensors"
        )
        policy = devpolicy.load_policy(DEMO, overrides={"logging_level": "debug"})
        with capture_logs() as logs:
            policy.load_file(tmp_path / "dataset.safetensors")
        shadowed = [e["message"] for e in logs if e["event"] == "rule_shadowed"]
        assert len(shadowed) == 2
        assert all(e["log_level"] == "debug" for e in logs if e["event"] == "rule_shadowed")
        assert (
            "dataset-on-host.yaml:31 ('*/tokens') took no tensor: shadowed by rule 1 ("
            in (shadowed[0])
        )
        assert "file 'dataset*.safetensors'), which took its 1 name first" in shadowed[0]
        assert "('dataset/*') took no tensor: shadowed by rule 1" in shadowed[1]

    def test_the_plan_gives_each_rule_its_reason(self, tmp_path: Path) -> None:
        devpolicy.save_file(
            {"tokens": np.arange(4096, dtype=np.uint16)}, tmp_path / "dataset.safetensors"
        )
        plan = devpolicy.plan(tmp_path / "dataset.safetensors", policy=devpolicy.load_policy(DEMO))
        assert [u.status for u in plan.rules] == [
            "other-files",
            "took",
            "shadowed",
            "shadowed",
            "other-names",
            "other-names",
            "nothing",
        ]
        assert plan.warnings == []
        assert "'*/tokens': 0 tensors, 0 B (shadowed by rule 1 (" in str(plan)


class TestRulesForAnotherKindOfFile:
    """Issue 51, N11: a rule whose names end in a word no name here holds (`*/tokens` in a
    model's plan) was written for another kind of file: said in the plan, never warned."""

    def test_a_model_plan_under_the_shipped_policy_says_tokens_is_for_other_names(
        self, tmp_path: Path
    ) -> None:
        """An HF checkpoint the default took: `*/tokens` took nothing because no name ends
        in `tokens`, said as its why; the warning left is the real slip (`model/*` and the
        `.` separator)."""
        plan = devpolicy.plan(_hf_llama(tmp_path), policy=devpolicy.load_policy(DEMO))
        tokens = next(u for u in plan.rules if u.label == "'*/tokens'")
        assert (tokens.status, tokens.note, tokens.applies) == (
            "other-names",
            "no name holds its last word 'tokens'",
            False,
        )
        assert not any("'*/tokens'" in message for _, message in plan.warnings)
        assert [m for _, m in plan.warnings if "('model/*') took no tensor" in m]
        assert "'*/tokens': 0 tensors, 0 B (no name holds its last word 'tokens')" in str(plan)

    def test_the_plan_command_shows_why_none(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy plan --json` gives the rule its reason, where it was empty."""
        main(["plan", str(_hf_llama(tmp_path)), "--policy", str(DEMO), "--json"])
        rules = json.loads(capsys.readouterr().out)["rules"]
        (tokens,) = [r for r in rules if r["pattern"] == "'*/tokens'"]
        assert (tokens["status"], tokens["note"]) == (
            "other-names",
            "no name holds its last word 'tokens'",
        )

    @pytest.mark.parametrize(
        ("rule", "why"),
        [
            ("*/kernal", "no name holds its last word 'kernal': did you mean 'kernel'?"),
            ("*/w/kernel", "its pattern matches none of these names"),
            (r"regex:.*/kernal", "no name holds its last word 'kernal': did you mean 'kernel'?"),
        ],
        ids=["misspelt", "held-word", "regex-misspelt"],
    )
    def test_a_rule_whose_last_word_the_names_hold_or_nearly_hold_is_still_warned(
        self, tmp_path: Path, rule: str, why: str
    ) -> None:
        """A last word the names hold, or one a slip away (`kernal`), is a rule meant for
        these names: still a `rule-matched-nothing` warning, with why none said."""
        spec = (
            {"regex": rule.removeprefix("regex:")} if rule.startswith("regex:") else {"match": rule}
        )
        policy = policy_of(rules=[{**spec, "device": "cpu:1"}])
        path = _model(tmp_path / "model.safetensors", ("dense/kernel", "dense/bias"))
        plan = devpolicy.plan(path, policy=policy)
        (use, _) = plan.rules
        assert (use.status, use.note) == ("nothing", why)
        ((code, message),) = plan.warnings
        assert code == "rule-matched-nothing"
        assert (why in message) is (why != "its pattern matches none of these names")


class TestConditionsArePartOfWhatARuleCouldMatch:
    def test_a_scalar_rule_on_a_checkpoint_without_scalars_is_not_wrong(
        self, tmp_path: Path
    ) -> None:
        """`max_elements: 1` beside a catch-all, on a file without scalars: its pattern
        matches every name and its condition none (28 D12): counted, not blamed."""
        policy = policy_of(
            rules=[
                {"match": "*", "max_elements": 1, "device": "cpu:1"},
                {"match": "*", "device": "cpu:0"},
            ]
        )
        path = _model(tmp_path / "model.safetensors")
        with capture_logs() as logs:
            policy.load_file(path)
        assert "rule_matched_nothing" not in _warnings(logs)
        (scalar, _, _) = devpolicy.plan(path, policy=policy).rules
        assert (scalar.label, scalar.status) == ("'*' max_elements 1", "conditions")
        assert scalar.note == (
            "its pattern matches 2 names, none it takes (model/embed: 8 elements > max_elements 1)"
        )

    @pytest.mark.parametrize(
        ("condition", "label"),
        [
            ({"max_elements": 100}, "'modle/*' max_elements 100"),
            ({"ndim": [1, 2]}, "'modle/*' ndim 1 or 2"),
            ({"min_bytes": "16B"}, "'modle/*' min_bytes 16 B"),
        ],
    )
    def test_a_rule_reported_is_named_with_its_condition(
        self, tmp_path: Path, condition: dict[str, object], label: str
    ) -> None:
        policy = policy_of(rules=[{"match": "modle/*", "device": "cpu:1", **condition}])
        plan = devpolicy.plan(_model(tmp_path / "model.safetensors"), policy=policy)
        ((code, message),) = plan.warnings
        assert code == "rule-matched-nothing"
        assert f"({label}) took no tensor" in message

    def test_rule_label_names_every_condition(self) -> None:
        spec = RuleSpec(
            match="w/*", min_bytes=1, max_bytes=2**20, min_elements=2, max_elements=9, device="cpu"
        )
        assert rule_label(spec) == (
            "'w/*' min_bytes 1 B max_bytes 1.0 MiB min_elements 2 max_elements 9"
        )


class TestSlipsAreNamedWithTheirFix:
    def test_a_misspelt_first_word_gets_a_did_you_mean_in_the_load(self, tmp_path: Path) -> None:
        """`modle/*` takes nothing; the load says `model/*` (27 item 7)."""
        policy = policy_of(rules=[{"match": "modle/*", "device": "cpu:1"}])
        with capture_logs() as logs:
            policy.load_file(_model(tmp_path / "model.safetensors"))
        (message,) = _warnings(logs)["rule_matched_nothing"]
        assert "('modle/*') took no tensor but was written for 2 of these names" in message
        assert "which the default placed instead: did you mean 'model/*'?" in message

    def test_rules_for_another_prefix_are_reported_with_the_prefix_to_load_with(
        self, tmp_path: Path
    ) -> None:
        """`params/*` rules, a file loaded without `prefix=` (its names `model/...`): the
        warning names the fix (28 D12); loaded with it, all is quiet."""
        policy = policy_of(
            rules=[
                {"match": "params/*/kernel", "device": "cpu:1"},
                {"match": "params/*", "device": "cpu:2"},
            ]
        )
        path = _model(tmp_path / "model.safetensors", ("dense/kernel", "dense/bias"))
        with capture_logs() as logs:
            policy.load_file(path)
        messages = _warnings(logs)["rule_matched_nothing"]
        assert len(messages) == 2
        assert all(
            "the names start with 'model/', the rule with 'params/': load with prefix='params'" in m
            for m in messages
        )
        with capture_logs() as logs:
            loaded = policy.load_file(path, prefix="params")
        assert _warnings(logs) == {}
        placed = {k: devpolicy.inventory().text(next(iter(v.devices()))) for k, v in loaded.items()}
        assert placed == {"dense/kernel": "cpu:1", "dense/bias": "cpu:2"}

    def test_a_broad_rule_beside_rules_of_other_words_is_not_guessed_at(
        self, tmp_path: Path
    ) -> None:
        """`dataset/*` and `model/*`, a file of neither: any prefix would fit both, so
        neither is a slip; they were written for other files."""
        policy = policy_of(
            rules=[
                {"match": "dataset/*", "device": "cpu:1"},
                {"match": "model/*", "device": "cpu:2"},
            ]
        )
        path = _model(tmp_path / "other.safetensors")
        plan = devpolicy.plan(path, policy=policy)
        assert [u.status for u in plan.rules[:2]] == ["other-names", "other-names"]
        assert plan.warnings == []

    def test_a_rule_written_without_the_names_prefix(self, tmp_path: Path) -> None:
        policy = policy_of(rules=[{"match": "layers/*/kernel", "device": "cpu:1"}])
        path = _model(tmp_path / "model.safetensors", ("layers/0/kernel",))
        ((_, message),) = devpolicy.plan(path, policy=policy).warnings
        assert "the names start with 'model/', the rule without it: load with prefix=''" in (
            message
        )

    def test_a_regex_written_for_search(self, tmp_path: Path) -> None:
        policy = policy_of(rules=[{"regex": "dense/kernel", "device": "cpu:1"}])
        path = _model(tmp_path / "model.safetensors", ("dense/kernel",))
        ((_, message),) = devpolicy.plan(path, policy=policy).warnings
        assert "as `search: 'dense/kernel'` it would find them" in message


def _hf_llama(tmp_path: Path, layers: int = 5) -> Path:
    folder = tmp_path / "llama"
    folder.mkdir()
    devpolicy.save_file(
        {
            f"model.layers.{i}.mlp.up_proj.weight": np.zeros((16, 8), np.float32)
            for i in range(layers)
        },
        folder / "model.safetensors",
    )
    return folder


D4_RULES = [
    {
        "match": "llama/model/layers/*/mlp/up_proj/weight",
        "sharding": {"mesh": "m", "spec": ["data"]},
    },
    {"match": "llama/*", "device": "cpu:1"},
]


class TestAShardingRuleThatTookNothingIsNotSilent:
    """28 D4: a sharding rule written with `/` for a `.`-keyed checkpoint, then a broad
    device rule that takes the tensors: 0 of 5 sharded used to pass in silence."""

    def test_the_load_warns_naming_the_rule_that_placed_them_whole(self, tmp_path: Path) -> None:
        policy = policy_of(meshes=MESH, rules=D4_RULES)
        with capture_logs() as logs:
            loaded = policy.load_file(_hf_llama(tmp_path))
        assert not any(len(a.devices()) > 1 for a in loaded.values())
        (message,) = _warnings(logs)["rule_matched_nothing"]
        assert "'llama/model/layers/*/mlp/up_proj/weight') took no tensor but was written " in (
            message
        )
        assert "for 5 of these names (e.g. 'llama/model.layers.0.mlp.up_proj.weight')" in message
        assert "which rule 1 (<mapping>:rules[1] 'llama/*') placed whole instead" in message
        assert "set the policy's `names: {separator: '.'}`" in message

    def test_plan_exits_3_as_the_porting_page_says(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  m: {axes: {data: -1}, devices: cpu}\nrules:\n"
            "  - match: 'llama/model/layers/*/mlp/up_proj/weight'\n"
            "    sharding: {mesh: m, spec: [data]}\n"
            "  - match: 'llama/*'\n    device: cpu:1\n",
        )
        checkpoint = _hf_llama(tmp_path)
        assert main(["plan", str(checkpoint), "--policy", str(policy)]) == EXIT_NOT_SHARDED
        out = capsys.readouterr().out
        assert "placed whole instead" in out
        assert main(["plan", str(checkpoint), "--policy", str(policy), "--json"]) == 3
        report = json.loads(capsys.readouterr().out)
        assert report["sharded_nothing"] is True
        assert report["rules"][0]["status"] == "near"

    def test_with_the_separator_set_it_shards_and_exits_0(self, tmp_path: Path) -> None:
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nnames: {separator: '.'}\nmeshes:\n  m: {axes: {data: -1}, devices: cpu}\n"
            "rules:\n  - match: 'llama/model/layers/*/mlp/up_proj/weight'\n"
            "    sharding: {mesh: m, spec: [data]}\n  - match: 'llama/*'\n    device: cpu:1\n",
        )
        assert main(["plan", str(_hf_llama(tmp_path)), "--policy", str(policy)]) == 0


class TestRuleUses:
    def test_names_are_counted_per_rule_with_the_default_last(self) -> None:
        policy = policy_of(
            rules=[{"match": "a/*", "device": "cpu"}, {"match": "b/*", "device": "cpu"}]
        )
        uses = rule_uses(
            policy.settings,
            policy.decider.conditions,
            [Placed("a/x", 0, 4), Placed("a/y", 0, 6), Placed("c", None, 1)],
        )
        assert [(u.tensors, u.nbytes, u.status) for u in uses] == [
            (2, 10, "took"),
            (0, 0, "other-names"),
            (1, 1, "took"),
        ]

    def test_an_environment_rule_is_named_by_its_item(self) -> None:
        policy = devpolicy.load_policy(
            {"version": 1}, environ={"DEVPOLICY_RULES": "a/*=cpu:1,b/*=cpu:2"}
        )
        uses = rule_uses(policy.settings, policy.decider.conditions, [Placed("b/x", 1)])
        assert [u.origin for u in uses[:2]] == [
            "env:DEVPOLICY_RULES item 0",
            "env:DEVPOLICY_RULES item 1",
        ]
        assert [u.layer for u in uses] == ["env", "env", "default"]

    def test_quiet_layers_are_left_to_who_says_them(self) -> None:
        policy = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_RULES": "modle/*=cpu:1"})
        uses = rule_uses(policy.settings, policy.decider.conditions, [Placed("model/w", None)])
        assert [code for code, _ in silent_rules(uses)] == ["rule-matched-nothing"]
        assert silent_rules(uses, quiet=("env",)) == []
