"""`DEVPOLICY_RULES` items that miss say so: at once where a slip explains the miss, at
the end of the process where an item moved nothing at all, and when an item stops a
rule's tensors being mapped."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._decide import overrides
from devpolicy._document.schema import RuleSpec
from tests.conftest import REPO
from tests.scenarios.test_story import readme_block

STORY = {
    "version": 1,
    "rules": [
        {"file": "train*.safetensors", "device": "cpu", "mmap": True},
        {"match": "model/*", "device": "cpu:0"},
    ],
}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    train, model = tmp_path / "train.safetensors", tmp_path / "model.safetensors"
    devpolicy.save_file({"tokens": np.arange(4096, dtype=np.uint16)}, train)
    devpolicy.save_file({"embed": np.zeros((4, 2), np.float32), "out": np.zeros(2)}, model)
    return train, model


def _said(logs: list[dict[str, Any]], event: str) -> list[str]:
    return [e["message"] for e in logs if e["event"] == event and e["log_level"] == "warning"]


class TestAMissWithASlipWarnsAtOnce:
    def test_a_misspelt_item_warns_in_the_load_with_a_did_you_mean(self, tmp_path: Path) -> None:
        train, model = _files(tmp_path)
        policy = devpolicy.load_policy(STORY, environ={"DEVPOLICY_RULES": "modle/*=cpu:1"})
        with capture_logs() as logs:
            policy.load_file(train)
            policy.load_file(model)
            policy.load_file(model)
        (message,) = _said(logs, "override_matched_nothing")
        assert message == (
            "DEVPOLICY_RULES item 0 ('modle/*=cpu:1') took none of the 2 names placed from "
            "model.safetensors, but was written for 2 of them (e.g. 'model/embed'): did you "
            "mean 'model/*'?"
        )
        assert not _said(logs, "rule_matched_nothing")  # said once, by the item's warning

    def test_a_put_of_a_tree_is_a_placement_too(self) -> None:
        policy = devpolicy.load_policy(
            {"version": 1}, environ={"DEVPOLICY_RULES": "params/dense/kernl=cpu:1"}
        )
        tree = {"dense": {"kernel": np.zeros(4, np.float32), "bias": np.zeros(4, np.float32)}}
        with capture_logs() as logs:
            policy.put("params", tree)
        (message,) = _said(logs, "override_matched_nothing")
        assert "did you mean 'params/dense/kernel'?" in message

    def test_an_item_that_took_names_before_does_not_warn(self, tmp_path: Path) -> None:
        train, model = _files(tmp_path)
        policy = devpolicy.load_policy(STORY, environ={"DEVPOLICY_RULES": "model/*=cpu:1"})
        with capture_logs() as logs:
            policy.load_file(model)
            policy.load_file(train)
        assert not _said(logs, "override_matched_nothing")


class TestAnItemThatMovedNothingSaysSoWhenTheProcessEnds:
    def test_the_story_with_dataset_names_names_the_file_item(self, tmp_path: Path) -> None:
        """`dataset/*=cpu:1` on the story: nothing is named `dataset/...`; no load can
        know that a later one will not be, so the end of the process says it, naming what
        was placed and the item that moves the tokens."""
        train, model = _files(tmp_path)
        policy = devpolicy.load_policy(
            STORY, environ={"DEVPOLICY_RULES": "dataset/*=cpu:1,batch*=cpu:1"}
        )
        with capture_logs() as logs:
            policy.load_file(train)
            policy.load_file(model)
            policy.put("batch", np.zeros(4, np.float32))
        assert not _said(logs, "override_matched_nothing")
        with capture_logs() as logs:
            overrides.at_exit()
            overrides.at_exit()  # once
        (message,) = [m for m in _said(logs, "override_matched_nothing") if "dataset/*" in m]
        assert message.startswith(
            "DEVPOLICY_RULES item 0 ('dataset/*=cpu:1') took nothing in this process: none of "
            "the names placed matches it (one per rule: 'train/tokens' by <mapping>:rules[0] "
            "(from train.safetensors), 'model/embed' by <mapping>:rules[1] (from "
            "model.safetensors))"
        )
        assert message.endswith(
            "to move the tensors of train.safetensors (rule <mapping>:rules[0], file "
            "'train*.safetensors'), name their file: 'file:train*.safetensors=cpu:1'"
        )
        assert not [m for m in _said(logs, "override_matched_nothing") if "batch*" in m]

    def test_two_policies_of_the_same_items_say_each_message_once(self, tmp_path: Path) -> None:
        """N6: the story with the shipped policy and `dataset/*=cpu:1` printed one
        `override_matched_nothing` twice: one policy live, one collected after a load,
        each of the same items and names."""
        train, _ = _files(tmp_path)
        environ = {"DEVPOLICY_RULES": "dataset/*=cpu:1"}
        live = devpolicy.load_policy(STORY, environ=environ)
        live.load_file(train)
        devpolicy.load_policy(STORY, environ=environ).load_file(train)  # then collected
        gc.collect()
        with capture_logs() as logs:
            overrides.at_exit()
        said = [m for m in _said(logs, "override_matched_nothing") if "dataset/*" in m]
        assert len(said) == 1

    def test_a_policy_that_placed_nothing_says_nothing(self) -> None:
        devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_RULES": "zz/*=cpu:1"})
        with capture_logs() as logs:
            overrides.at_exit()
        assert not [m for m in _said(logs, "override_matched_nothing") if "zz/*" in m]

    @pytest.mark.slow
    def test_a_program_that_moved_nothing_ends_with_the_warning(self, tmp_path: Path) -> None:
        """The README's story run with `DEVPOLICY_RULES='dataset/*=cpu:1'` (27 item 2): the
        run used to end with `cpu:1: 0 arrays` and no word."""
        (tmp_path / "devpolicy.yaml").write_text(readme_block("yaml"), encoding="utf-8")
        _files(tmp_path)
        (tmp_path / "train.py").write_text(
            "import devpolicy\n"
            "devpolicy.bootstrap()\n"
            "tokens = devpolicy.load_file('train.safetensors')['tokens']\n"
            "params = devpolicy.load_file('model.safetensors')\n"
            "print(devpolicy.report())\n",
            encoding="utf-8",
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_"))}
        env |= {
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "DEVPOLICY_RULES": "dataset/*=cpu:1",
            "PYTHONPATH": str(REPO),
        }
        result = subprocess.run(
            [sys.executable, "train.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "cpu:1: 0 arrays" in result.stdout
        assert "override_matched_nothing" in result.stderr
        assert "name their file: 'file:train*.safetensors=cpu:1'" in result.stderr


class TestAnItemThatStopsMappingSaysSo:
    def test_a_name_item_over_a_mapping_file_rule_names_the_file_item(self, tmp_path: Path) -> None:
        """`train/*=cpu:1` takes the tokens from the `file:` rule and reads them: said
        once, with `file:train*.safetensors=cpu:1`, which keeps the map."""
        train, _ = _files(tmp_path)
        policy = devpolicy.load_policy(STORY, environ={"DEVPOLICY_RULES": "train/*=cpu:1"})
        with capture_logs() as logs:
            policy.load_file(train)
            policy.load_file(train)
        (message,) = _said(logs, "override_not_mapped")
        assert message.startswith(
            "DEVPOLICY_RULES item 0 ('train/*=cpu:1') took 'train/tokens' from rule "
            "<mapping>:rules[0] (file 'train*.safetensors', mmap: true) and replaces it"
        )
        assert message.endswith("write 'file:train*.safetensors=cpu:1'")

    def test_the_file_item_keeps_the_map_and_says_nothing(self, tmp_path: Path) -> None:
        train, _ = _files(tmp_path)
        policy = devpolicy.load_policy(
            STORY, environ={"DEVPOLICY_RULES": "file:train*.safetensors=cpu:1"}
        )
        with capture_logs() as logs:
            policy.load_file(train)
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == []


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (RuleSpec(match="a/*", device="cpu:1"), "a/*=cpu:1"),
        (RuleSpec(file="t*.safetensors", device="gpu"), "file:t*.safetensors=gpu"),
        (
            RuleSpec.model_validate(
                {"match": "w", "sharding": {"mesh": "m", "spec": ["data", None, ["a", "b"]]}}
            ),
            "w=m[data,-,a+b]",
        ),
    ],
)
def test_an_item_is_shown_as_it_is_written(spec: RuleSpec, text: str) -> None:
    assert overrides.item_text(spec) == text


class TestACollectedPolicyStillSays:
    def test_an_item_of_a_collected_policy_warns_at_the_end(self, tmp_path: Path) -> None:
        """`load_file(f, policy=load_policy(...))` with an item that took nothing: the policy
        is gone when the process ends, and the item still says it took nothing (once)."""
        import gc

        train, _ = _files(tmp_path)
        devpolicy.load_file(
            train,
            policy=devpolicy.load_policy(STORY, environ={"DEVPOLICY_RULES": "nosuch/*=cpu:1"}),
        )
        gc.collect()
        with capture_logs() as logs:
            overrides.at_exit()
            overrides.at_exit()
        said = [m for m in _said(logs, "override_matched_nothing") if "nosuch/*" in m]
        assert len(said) == 1
        assert said[0].startswith("DEVPOLICY_RULES item 0 ('nosuch/*=cpu:1') took nothing")
