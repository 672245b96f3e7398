"""DEVPOLICY_* variables: parsed strictly, every bad value named with its accepted forms."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy._document.environment import read_env
from tests.conftest import REPO
from tests.helpers import write
from tests.scenarios.test_story import readme_block

BASE = {"version": 1, "rules": [{"match": "dataset/*", "device": "cpu:0"}]}


class TestValues:
    def test_rules_variable_adds_rules_before_the_policy_rules(self) -> None:
        """DEVPOLICY_RULES='dataset/*=cpu:1' wins over the file's rule for dataset/*."""
        policy = devpolicy.load_policy(BASE, environ={"DEVPOLICY_RULES": "dataset/*=cpu:1"})
        decision = policy.resolve("dataset/train")
        assert (decision.device_text, decision.source, decision.origin, decision.rule) == (
            "cpu:1",
            "env",
            "env:DEVPOLICY_RULES",
            0,
        )

    def test_several_rules_keep_their_order(self) -> None:
        """Items are tried left to right; whitespace around items is ignored."""
        policy = devpolicy.load_policy(
            BASE, environ={"DEVPOLICY_RULES": " model/w = cpu:3 , model/* = cpu:2 "}
        )
        assert policy.resolve("model/w").device_text == "cpu:3"
        assert policy.resolve("model/b").device_text == "cpu:2"
        assert policy.resolve("model/b").rule == 1

    def test_default_variable_moves_unmatched_names(self) -> None:
        """DEVPOLICY_DEFAULT sets the target of names no rule matches."""
        policy = devpolicy.load_policy(BASE, environ={"DEVPOLICY_DEFAULT": "cpu:2"})
        decision = policy.resolve("other")
        assert (decision.device_text, decision.source, decision.origin) == (
            "cpu:2",
            "default",
            "env:DEVPOLICY_DEFAULT",
        )

    @pytest.mark.parametrize(
        ("value", "expected"),
        [("1", True), ("TRUE", True), ("on", True), ("no", False), ("0", False)],
    )
    def test_strict_accepts_common_booleans(self, value: str, expected: bool) -> None:
        """Booleans accept 1/0, true/false, yes/no, on/off in any case."""
        assert devpolicy.load_policy(BASE, environ={"DEVPOLICY_STRICT": value}).strict is expected

    def test_empty_values_count_as_unset(self) -> None:
        """`VAR=` in a shell does not switch anything on."""
        policy = devpolicy.load_policy(
            BASE, environ={"DEVPOLICY_STRICT": "", "DEVPOLICY_RULES": ""}
        )
        assert policy.strict is False
        assert len(policy.rules) == 1

    def test_file_variable_names_the_policy(self, tmp_path: Path) -> None:
        """DEVPOLICY_FILE is used by discovery."""
        write(tmp_path / "elsewhere" / "p.yaml", "version: 1\ndefault: cpu:3\n")
        policy = devpolicy.load_policy(
            environ={"DEVPOLICY_FILE": str(tmp_path / "elsewhere" / "p.yaml")}
        )
        assert policy.resolve("x").device_text == "cpu:3"
        assert policy.found == "DEVPOLICY_FILE"

    def test_log_settings_override_the_policy_logging_section(self) -> None:
        """DEVPOLICY_LOG_LEVEL/FORMAT beat the file's logging section (case-insensitive)."""
        policy = devpolicy.load_policy(
            {**BASE, "logging": {"level": "error", "format": "console"}},
            environ={"DEVPOLICY_LOG_LEVEL": "DEBUG", "DEVPOLICY_LOG_FORMAT": "json"},
        )
        assert (policy.events.level, policy.events.format) == ("debug", "json")


BAD = [
    (
        "DEVPOLICY_RULES",
        "dataset/*",
        r"^DEVPOLICY_RULES='dataset/\*': item 0 \('dataset/\*'\) is not pattern=target; accepted: pattern=target\[",
    ),
    (
        "DEVPOLICY_RULES",
        "a=cpu,,b=cpu",
        r"^DEVPOLICY_RULES='a=cpu,,b=cpu': item 1 \(''\) is not pattern=target",
    ),
    ("DEVPOLICY_RULES", "=cpu", r"item 0 \('=cpu'\) is not pattern=target"),
    ("DEVPOLICY_RULES", "a=", r"item 0 \('a='\) is not pattern=target"),
    (
        "DEVPOLICY_RULES",
        "a=gpuu:1",
        r"^DEVPOLICY_RULES='a=gpuu:1': item 0: unknown platform 'gpuu'.*did you mean 'gpu'\?",
    ),
    ("DEVPOLICY_RULES", "a=cpu:-1", r"item 0: not a target: 'cpu:-1'"),
    (
        "DEVPOLICY_RULES",
        "model/*=cpu;1",
        r"^DEVPOLICY_RULES='model/\*=cpu;1': item 0: not a target: 'cpu;1' \(did you mean "
        r"'cpu:1'\?\); accepted",
    ),
    (
        "DEVPOLICY_DEFAULT",
        "cuda:x",
        r"^DEVPOLICY_DEFAULT='cuda:x': not a target: 'cuda:x'.*; accepted: auto, or cpu",
    ),
    ("DEVPOLICY_DEFAULT", "CPU", r"did you mean 'cpu'\?"),
    (
        "DEVPOLICY_STRICT",
        "maybe",
        r"^DEVPOLICY_STRICT='maybe': not a boolean; accepted: 1, true, yes, on / 0, false, no, off",
    ),
    ("DEVPOLICY_DISABLE", "2", r"^DEVPOLICY_DISABLE='2': not a boolean"),
    (
        "DEVPOLICY_LOG_LEVEL",
        "verbose",
        r"^DEVPOLICY_LOG_LEVEL='verbose': unknown value; accepted: debug, info, warning, error, critical",
    ),
    ("DEVPOLICY_LOG_LEVEL", "warn", r"did you mean 'warning'\?"),
    (
        "DEVPOLICY_LOG_FORMAT",
        "jsonl",
        r"^DEVPOLICY_LOG_FORMAT='jsonl': unknown value \(did you mean 'json'\?\); accepted: auto, console, json, stdlib",
    ),
    (
        "DEVPOLICY_FILE",
        "missing.yaml",
        r"^DEVPOLICY_FILE='missing.yaml': no such file; accepted: the path of a YAML policy file",
    ),
    ("DEVPOLICY_FILE", ".", r"^DEVPOLICY_FILE='.': is a directory"),
    (
        "DEVPOLICY_RULE",
        "a=cpu",
        r"^DEVPOLICY_RULE='a=cpu': unknown devpolicy variable \(did you mean 'DEVPOLICY_RULES'\?\); accepted: DEVPOLICY_FILE",
    ),
]


class TestBadValues:
    @pytest.mark.parametrize(("variable", "value", "message"), BAD)
    def test_bad_values_raise_env_override_error(
        self, variable: str, value: str, message: str
    ) -> None:
        """Each bad value names the variable, the value and what is accepted."""
        with pytest.raises(devpolicy.errors.EnvOverrideError, match=message) as info:
            devpolicy.load_policy(BASE, environ={variable: value})
        assert (info.value.variable, info.value.value) == (variable, value)

    def test_process_environment_is_read_by_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without `environ=`, os.environ is read."""
        monkeypatch.setenv("DEVPOLICY_STRICT", "sure")
        with pytest.raises(devpolicy.errors.EnvOverrideError, match="DEVPOLICY_STRICT"):
            devpolicy.load_policy(BASE)

    @given(st.text(max_size=30))
    def test_any_rules_value_parses_or_raises_env_override_error(self, value: str) -> None:
        """Random DEVPOLICY_RULES values never leak another exception."""
        try:
            read_env({"DEVPOLICY_RULES": value})
        except devpolicy.errors.EnvOverrideError as e:
            variable = e.variable
        else:
            return
        assert variable == "DEVPOLICY_RULES"


class TestMessages:
    def test_accepted_forms_are_listed_once(self) -> None:
        """The parser's own list is not repeated by the variable's."""
        with pytest.raises(devpolicy.errors.EnvOverrideError) as info:
            devpolicy.load_policy(BASE, environ={"DEVPOLICY_DEFAULT": "gpuu"})
        assert str(info.value).count("accepted:") == 1

    def test_semicolons_or_two_equals_in_one_item_are_errors(self) -> None:
        """'a=cpu;b=gpu' is two rules glued together: say so instead of matching nothing."""
        with pytest.raises(
            devpolicy.errors.EnvOverrideError,
            match=r"item 0 \('dataset/\*=cpu:1;model/\*=gpu'\) holds more than one rule; separate rules with ','",
        ):
            devpolicy.load_policy(BASE, environ={"DEVPOLICY_RULES": "dataset/*=cpu:1;model/*=gpu"})

    def test_default_reject_is_suggested(self) -> None:
        """A misspelt `reject` gets a did-you-mean in the environment and in YAML."""
        with pytest.raises(
            devpolicy.errors.EnvOverrideError, match=r"did you mean 'reject'\?.*; or reject"
        ):
            devpolicy.load_policy(BASE, environ={"DEVPOLICY_DEFAULT": "rejct"})
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"default: .*; or reject \(names no rule matches raise\) \(did you mean 'reject'\?\)",
        ):
            devpolicy.load_policy({"version": 1, "default": "rejct"}, environ={})


MESHED = {"version": 1, "meshes": {"pod": {"axes": {"data": 2}}}, "rules": []}


class TestMeshEntryMessages:
    @pytest.mark.parametrize(
        ("rules", "said"),
        [
            (
                "x=pod[data,data]",
                r"^DEVPOLICY_RULES='x=pod\[data,data\]': item 0 \('x=pod\[data,data\]'\): "
                r"axis 'data' is used twice in one spec",
            ),
            (
                "a=cpu, w=pod[nope]",
                r"^DEVPOLICY_RULES='a=cpu, w=pod\[nope\]': item 1 \('w=pod\[nope\]'\): "
                r"mesh 'pod' has no axis 'nope'",
            ),
            (
                "w=pdo[data]",
                r"^DEVPOLICY_RULES='w=pdo\[data\]': item 0 \('w=pdo\[data\]'\): "
                r"unknown mesh 'pdo' \(did you mean 'pod'\?\)",
            ),
        ],
    )
    def test_a_bad_mesh_entry_shows_the_value_and_the_rule(self, rules: str, said: str) -> None:
        """A sharding the policy's meshes contradict names the variable's value, not 'item 0'."""
        with pytest.raises(devpolicy.errors.EnvOverrideError, match=said) as info:
            devpolicy.load_policy(MESHED, environ={"DEVPOLICY_RULES": rules})
        assert info.value.value == rules


STORY = {
    "version": 1,
    "rules": [
        {"file": "train*.safetensors", "device": "cpu", "mmap": True},
        {"match": "dataset/*", "device": "cpu"},
        {"match": "model/*", "device": "cpu:0"},
    ],
}


def _tokens(path: Path) -> Path:
    devpolicy.save_file({"tokens": np.arange(4096, dtype=np.uint16)}, path)
    return path


def _device(array: object) -> str:
    (device,) = array.devices()  # type: ignore[attr-defined]
    return devpolicy.inventory().text(device)


class TestFileItems:
    def test_a_file_item_takes_every_tensor_of_the_files_it_names(self, tmp_path: Path) -> None:
        """`file:GLOB=target` is a `file:` rule from the environment, tried first."""
        policy = devpolicy.load_policy(
            STORY, environ={"DEVPOLICY_RULES": "file:train*.safetensors=cpu:2"}
        )
        (item,) = [r for r in policy.rules if r.source == "env"]
        assert (item.spec.file, item.spec.match, item.spec.device) == (
            "train*.safetensors",
            None,
            "cpu:2",
        )
        loaded = policy.load_file(_tokens(tmp_path / "train.safetensors"))
        assert _device(loaded["tokens"]) == "cpu:2"
        assert policy.resolve("train/tokens").device_text == "cpu:0"  # no file: not taken

    def test_a_file_item_keeps_the_mmap_of_the_file_rule_it_overrides(self, tmp_path: Path) -> None:
        """The story's tokens move to cpu:1 and stay mapped from their file (27 item 2)."""
        policy = devpolicy.load_policy(
            STORY, environ={"DEVPOLICY_RULES": "file:train*.safetensors=cpu:1"}
        )
        assert policy.rules[0].spec.mmap is True
        with capture_logs() as logs:
            tokens = policy.load_file(_tokens(tmp_path / "train.safetensors"))["tokens"]
        (summary,) = [e for e in logs if e["event"] == "load_file"]
        assert (_device(tokens), summary["mapped"], summary["file_backed"]) == ("cpu:1", 1, True)

    def test_a_sharding_item_for_a_file(self) -> None:
        policy = devpolicy.load_policy(
            {"version": 1, "meshes": {"m": {"axes": {"data": -1}, "devices": "cpu"}}},
            environ={"DEVPOLICY_RULES": "file:w*.safetensors=m[data]"},
        )
        (item,) = policy.rules
        assert item.spec.file == "w*.safetensors"
        assert item.spec.sharding is not None

    @pytest.mark.parametrize(
        ("value", "said"),
        [
            (
                "files:train*=cpu:1",
                r"item 0 \('files:train\*=cpu:1'\): 'files:' is no form \(did you mean 'file:'\?\)",
            ),
            ("File:train*=cpu:1", r"'File:' is no form \(did you mean 'file:'\?\)"),
            ("file:=cpu:1", r"item 0: empty file glob matches no file"),
        ],
    )
    def test_a_misspelt_or_empty_file_form_is_refused(self, value: str, said: str) -> None:
        with pytest.raises(devpolicy.errors.EnvOverrideError, match=said) as info:
            read_env({"DEVPOLICY_RULES": value})
        assert "file:GLOB for every tensor of the files GLOB matches" in str(info.value)

    def test_a_name_glob_with_a_colon_is_still_a_name_glob(self) -> None:
        """Only a word close to `file` before the colon is taken for a misspelt form."""
        (rule,) = read_env({"DEVPOLICY_RULES": "ns:w/*=cpu:1"}).rules
        assert rule.match == "ns:w/*"


def _readme_override() -> str:
    """The `DEVPOLICY_RULES` value the README shows for the story."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"`DEVPOLICY_RULES='([^']+)' python train\.py`", text)
    assert len(found) == 1, found
    return found[0]


class TestTheDocumentedOverrideWorks:
    def test_the_readme_override_moves_the_story_tokens_and_keeps_them_mapped(
        self, tmp_path: Path
    ) -> None:
        """The README's policy and override on the story's `train.safetensors`: the tokens
        land on the second CPU device, mapped (27 item 2: `dataset/*=cpu:1` moved nothing)."""
        policy_file = tmp_path / "devpolicy.yaml"
        policy_file.write_text(readme_block("yaml"), encoding="utf-8")
        policy = devpolicy.load_policy(policy_file, environ={"DEVPOLICY_RULES": _readme_override()})
        with capture_logs() as logs:
            tokens = policy.load_file(_tokens(tmp_path / "train.safetensors"))["tokens"]
        (summary,) = [e for e in logs if e["event"] == "load_file"]
        assert _device(tokens) == "cpu:1"
        assert (summary["mapped"], summary["file_backed"]) == (1, True)
        assert not [e for e in logs if e["log_level"] == "warning"]

    def test_the_getting_started_override_is_the_readmes(self) -> None:
        text = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
        shown = rf"`DEVPOLICY_RULES='{re.escape(_readme_override())}'\s+python train\.py`"
        assert re.search(shown, text)
