"""`devpolicy plan` calls a rule what it is (issue 43, item 4): a rule that names a file or
a host device places its tensors there on purpose, so a plan where everything went where
declared exits 0; and the Sharding page lists every exit status `plan` has."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

import devpolicy
from devpolicy._cli import common
from devpolicy._cli.main import main
from tests.conftest import REPO
from tests.helpers import policy_of, write

POD = ["--devices", "tpu=4x16GiB", "--processes", "4", "--slices", "2"]
MESH = {"fsdp": {"axes": {"data": -1}, "devices": "accelerator"}}
SHARD_MODEL = {"match": "model/*", "sharding": {"mesh": "fsdp", "spec": ["data"]}}

# The story's policy for a pod: the token file on the host, the model sharded.
POD_POLICY = """\
version: 1
fallback: [replicate, cpu]
meshes:
  fsdp: {axes: {data: -1}, devices: accelerator}
rules:
  - file: "train*.safetensors"
    device: cpu
    mmap: true
  - match: "*/tokens"
    device: cpu
  - match: "model/*"
    sharding: {mesh: fsdp, spec: [data]}
"""


def _train(folder: Path) -> Path:
    path = folder / "train.safetensors"
    devpolicy.save_file({"tokens": np.zeros(4096, np.int32)}, path)
    return path


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, dict[str, object]]:
    status = main(["plan", *argv])
    text = capsys.readouterr().out
    assert main(["plan", *argv, "--json"]) == status
    return status, text, json.loads(capsys.readouterr().out)


class TestDeclaredPlacementIsNoCatchAll:
    def test_the_story_s_token_file_planned_for_a_pod_exits_0(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`plan train.safetensors --devices tpu=4x16GiB --processes 4 --slices 2` under a
        pod policy: the `file:` rule put the tokens on the host as declared; no
        `not-sharded`, no "catch-all", exit 0."""
        policy = write(tmp_path / "pod.yaml", POD_POLICY)
        train = _train(tmp_path)
        status, text, report = _plan(capsys, str(train), "--policy", str(policy), *POD)
        assert status == 0
        assert "catch-all" not in text
        assert "no tensor is sharded" not in text
        assert report["warnings"] == []
        assert report["sharded_nothing"] is False

    def test_a_file_rule_is_not_a_catch_all(self, tmp_path: Path) -> None:
        """`file: train*.safetensors` alone takes only that file's tensors."""
        document = yaml.safe_load(POD_POLICY.replace("accelerator", "cpu"))
        policy = devpolicy.load_policy(document, environ={})
        plan = devpolicy.plan(_train(tmp_path), policy=policy)
        first = plan.rules[0]
        assert (first.label, first.catch_all) == ("file 'train*.safetensors'", False)

    def test_a_catch_all_to_a_host_device_places_on_purpose(self, tmp_path: Path) -> None:
        """`match: '*'` with `device: cpu` beside sharding rules: the rest is meant for
        the host, not left unsharded by mistake; no `not-sharded`, not sharded-nothing."""
        policy = policy_of(
            meshes=MESH, rules=[SHARD_MODEL, {"match": "*", "device": "cpu"}], fallback=["cpu"]
        )
        plan = devpolicy.plan(
            _train(tmp_path), policy=policy, machine=devpolicy.VirtualMachine(["tpu=4x16GiB"])
        )
        assert plan.warnings == []
        assert not plan.sharded_nothing

    def test_a_catch_all_to_the_accelerator_still_warns_and_exits_3(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`match: '*'` with `device: accelerator` beside sharding rules places whole on
        the chip what the policy means to shard: `not-sharded`, and exit 3."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  fsdp: {axes: {data: -1}, devices: accelerator}\nrules:\n"
            "  - {match: 'model/*', sharding: {mesh: fsdp, spec: [data]}}\n"
            "  - {match: '*', device: accelerator}\n",
        )
        status, text, report = _plan(capsys, str(_train(tmp_path)), "--policy", str(policy), *POD)
        assert status == common.EXIT_NOT_SHARDED == 3
        assert "placed whole by catch-all rule" in text
        assert [w["code"] for w in report["warnings"]] == ["not-sharded"]  # type: ignore[index]

    def test_a_sharding_rule_that_takes_nothing_beside_a_host_catch_all_still_exits_3(
        self, tmp_path: Path
    ) -> None:
        """The host catch-all took names a sharding rule was written for (its pattern
        matches none, no reason found): still sharded-nothing."""
        policy = policy_of(
            meshes=MESH,
            rules=[
                {"match": "train/tok*x", "sharding": {"mesh": "fsdp", "spec": ["data"]}},
                {"match": "*", "device": "cpu"},
            ],
            fallback=["cpu"],
        )
        plan = devpolicy.plan(
            _train(tmp_path), policy=policy, machine=devpolicy.VirtualMachine(["tpu=4x16GiB"])
        )
        assert [code for code, _ in plan.warnings] == ["rule-matched-nothing"]
        assert plan.sharded_nothing


def _documented_plan_statuses() -> dict[int, str]:
    """The exit statuses the Sharding page's `plan` table lists, with what each means."""
    text = (REPO / "docs" / "sharding.md").read_text()
    section = text[text.index("### Exit status of `devpolicy plan`") :]
    rows = re.findall(r"^\| `(\d+)` \| (.+?) \|$", section, flags=re.M)
    return {int(status): meaning for status, meaning in rows}


def _statuses_in_code() -> set[int]:
    """Every exit status `plan` can return: the `EXIT_*` names `plan`'s command and
    `main`'s handlers return (or set as the status), read from the source."""
    names: set[str] = set()
    for module in ("plan", "main", "common"):
        tree = ast.parse((REPO / "devpolicy" / "_cli" / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Return | ast.Assign | ast.Raise) and module != "common":
                names |= {
                    n.id for n in ast.walk(node) if isinstance(n, ast.Name) and "EXIT_" in n.id
                }
    return {getattr(common, name) for name in names}


def test_the_sharding_page_lists_every_exit_status_plan_has() -> None:
    """The doc's table and the code agree: no status undocumented, none made up."""
    documented = _documented_plan_statuses()
    assert set(documented) == _statuses_in_code() == {0, 1, 2, 3}


class TestPlanOfAFolder:
    """`plan DIR` (issue 43, item 5): planned as `load_file(DIR)` loads it, under the names
    it gives, and every file of the folder it leaves out is named with why."""

    def _folder(self, tmp_path: Path) -> Path:
        """The issue's folder: `train.safetensors` and `model.safetensors`, both links."""
        _train(tmp_path)
        devpolicy.save_file(
            {"embed": np.zeros((4, 2), np.float32), "head": np.zeros((2, 4), np.float32)},
            tmp_path / "model.safetensors",
        )
        folder = tmp_path / "run"
        folder.mkdir()
        for name in ("train.safetensors", "model.safetensors"):
            (folder / name).symlink_to(tmp_path / name)
        return folder

    def test_the_file_left_out_is_named_with_why_in_text_and_json(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        folder = self._folder(tmp_path)
        policy = write(tmp_path / "p.yaml", "version: 1\n")
        status, text, report = _plan(capsys, str(folder), "--policy", str(policy))
        assert status == 0
        left = str(folder / "train.safetensors")
        assert re.search(
            rf"^left out: {re.escape(left)}: model\.safetensors is the checkpoint", text, re.M
        ), text
        why = "model.safetensors is the checkpoint (no index): name the file to load it"
        assert report["left_out"] == [{"file": left, "why": why}]

    def test_its_tensors_carry_the_names_load_file_gives(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A rule on the names `load_file(DIR)` gives (`run/*`) takes the same tensors in
        the plan as in the load, and the title says which file of the folder was planned."""
        folder = self._folder(tmp_path)
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "run/*", "device": "cpu:1"}]}, environ={}
        )
        loaded = policy.load_file(folder)
        plan = devpolicy.plan(folder, policy=policy)
        assert [(t.name, t.decision.device_text) for t in plan.tensors if t.decision] == [
            ("run/embed", "cpu:1"),
            ("run/head", "cpu:1"),
        ]
        assert all(a.devices() == {jax.devices("cpu")[1]} for a in loaded.values())
        path = tmp_path / "p.yaml"
        path.write_text("version: 1\n")
        _, text, _ = _plan(capsys, str(folder), "--policy", str(path))
        assert f"{folder}: 2 tensors of model.safetensors" in text
