"""`plan` and `explain` with rules that shard by the model's own names (`axes: attached`):
with the model's tree they decide by its names; without it they say so and decide nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import devpolicy
from devpolicy._cli.main import main
from tests.helpers import policy_of, write

nn = pytest.importorskip("flax.linen")

POLICY = {
    "meshes": {"mt": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
    "axis_rules": {"embed": "fsdp", "mlp": "tensor"},
    "rules": [{"match": "m/*", "sharding": {"mesh": "mt", "axes": "attached"}}],
}
POLICY_YAML = """\
version: 1
meshes:
  mt: {axes: {fsdp: 2, tensor: 2}, devices: cpu}
axis_rules: {embed: fsdp, mlp: tensor}
rules:
  - {match: "m/*", sharding: {mesh: mt, axes: attached}}
"""
TREE = {
    "m/up": {"shape": [16, 32], "dtype": "float32", "axes": ["embed", "mlp"]},
    "m/down": {"shape": [32, 16], "dtype": "float32", "axes": ["mlp", "embed"]},
    "m/step": {"shape": [], "dtype": "int32"},
}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file(
        {
            "up": np.zeros((16, 32), np.float32),
            "down": np.zeros((32, 16), np.float32),
            "step": np.int32(3),
        },
        path,
    )
    return path


def abstract_tree() -> dict[str, Any]:
    """The model's abstract tree, its leaves boxed with their names as flax linen does."""

    def boxed(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        return nn.LogicallyPartitioned(jax.ShapeDtypeStruct(shape, np.float32), names)

    return {
        "up": boxed((16, 32), ("embed", "mlp")),
        "down": boxed((32, 16), ("mlp", "embed")),
        "step": jax.ShapeDtypeStruct((), np.int32),
    }


def by_name(plan: devpolicy.types.Plan) -> dict[str, devpolicy.types.PlannedTensor]:
    return {t.name: t for t in plan.tensors}


class TestPlan:
    def test_without_the_models_names_the_tensors_are_not_decided(self, checkpoint: Path) -> None:
        """A header carries no names: each tensor the attached rule takes is not decided
        (no decision, an error saying how to give the names) and not counted as sharded;
        the scalar needs no names."""
        plan = devpolicy.plan(checkpoint, policy=policy_of(**POLICY))
        tensors = by_name(plan)
        for name in ("m/up", "m/down"):
            assert tensors[name].decision is None
            error = tensors[name].error
            assert error is not None
            assert error.startswith(f"not decided: {name!r} matches (rule <mapping>:rules[0])")
            assert "plan(path, into=tree)" in error
        step = tensors["m/step"].decision
        assert step is not None
        assert step.device_text == "mt[]"
        (rule, _default) = plan.rules
        assert (rule.tensors, rule.sharded) == (1, 1)  # the scalar only, on the mesh
        assert not plan.fits
        assert "-> not decided: 'm/up' matches" in str(plan)

    def test_with_the_abstract_tree_it_decides_by_its_names(self, checkpoint: Path) -> None:
        """into=tree: each tensor by its leaf's names, the shardings load_file(into=) gives."""
        policy = policy_of(**POLICY)
        plan = devpolicy.plan(checkpoint, policy=policy, into=abstract_tree(), prefix="m")
        tensors = by_name(plan)
        up, down = tensors["m/up"].decision, tensors["m/down"].decision
        assert up is not None
        assert down is not None
        assert (up.spec, down.spec) == (("fsdp", "tensor"), ("tensor", "fsdp"))
        assert plan.fits
        loaded = devpolicy.load_file(checkpoint, policy=policy, into=abstract_tree(), prefix="m")
        assert loaded["up"].value.sharding == up.sharding
        assert loaded["up"].value.sharding == NamedSharding(
            up.sharding.mesh, PartitionSpec("fsdp", "tensor")
        )

    def test_a_tree_that_does_not_fit_is_the_error_load_file_gives(self, checkpoint: Path) -> None:
        """A leaf the checkpoint lacks: CheckpointMismatchError before anything is planned."""
        tree = {**abstract_tree(), "extra": jax.ShapeDtypeStruct((2,), np.float32)}
        with pytest.raises(devpolicy.errors.CheckpointMismatchError, match=r"missing: 'extra'"):
            devpolicy.plan(checkpoint, policy=policy_of(**POLICY), into=tree)

    def test_names_by_tensor_name_decide_too(self, checkpoint: Path) -> None:
        """axes={name: names}: the same decisions without the tree; [] carries none."""
        axes = {"m/up": ["embed", "mlp"], "m/down": []}
        tensors = by_name(devpolicy.plan(checkpoint, policy=policy_of(**POLICY), axes=axes))
        up, down = tensors["m/up"].decision, tensors["m/down"].decision
        assert up is not None
        assert up.spec == ("fsdp", "tensor")
        assert down is not None
        assert down.device_text == "mt[]"  # carries none: replicated, said as a fallback


class TestCommands:
    def test_plan_without_tree_exits_1_saying_the_rule_needs_the_names(
        self, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No --tree: the attached tensors are not decided, exit 1, the note says why."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        status = main(["plan", str(checkpoint), "--policy", str(policy), "--json"])
        payload = json.loads(capsys.readouterr().out)
        assert status == 1
        up = next(t for t in payload["tensors"] if t["name"] == "m/up")
        assert up["device"] is None
        assert up["error"].startswith("not decided: 'm/up' matches")
        assert (payload["rules"][0]["tensors"], payload["rules"][0]["sharded"]) == (1, 1)

    def test_plan_with_tree_decides_by_the_trees_names(
        self, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--tree tree.json (the form check --names takes, with axes): specs by name."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        tree = write(tmp_path / "tree.json", json.dumps(TREE))
        status = main(
            ["plan", str(checkpoint), "--policy", str(policy), "--tree", str(tree), "--json"]
        )
        payload = json.loads(capsys.readouterr().out)
        assert status == 0
        specs = {t["name"]: t["spec"] for t in payload["tensors"]}
        assert specs == {"m/up": ["fsdp", "tensor"], "m/down": ["tensor", "fsdp"], "m/step": []}
        assert payload["rules"][0]["sharded"] == 3

    def test_explain_with_tree_takes_names_and_shape_from_it(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """explain NAME --tree: the entry's names, shape and size decide it."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        tree = write(tmp_path / "tree.json", json.dumps(TREE))
        status = main(["explain", "m/up", "--policy", str(policy), "--tree", str(tree), "--json"])
        payload = json.loads(capsys.readouterr().out)
        assert status == 0
        assert payload["decision"]["device"] == "mt[fsdp,tensor]"
        assert payload["nbytes"] == 16 * 32 * 4

    def test_explain_without_tree_says_the_rule_needs_the_names(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No --tree: exit 1, the error says what to give."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        status = main(["explain", "m/up", "--shape", "16,32", "--policy", str(policy)])
        out = capsys.readouterr().out
        assert status == 1
        assert "not decided: 'm/up' matches" in out
        assert "--tree tree.json" in out

    def test_a_name_the_tree_lacks_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """explain m/w --tree without that entry: exit 2 naming the entry."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        tree = write(tmp_path / "tree.json", json.dumps(TREE))
        status = main(["explain", "m/w", "--policy", str(policy), "--tree", str(tree)])
        assert status == 2
        assert "no entry 'm/w'" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("entry", "message"),
        [
            ({"axes": "embed"}, r"axes 'embed' is not a list of axis names \(or null\)"),
            ({"axes": [1]}, r"axes \[1\] is not a list of axis names"),
            ({"names": []}, r"is not \{\"shape\": \[\.\.\.\], \"dtype\": \.\.\., \"axes\""),
        ],
    )
    def test_a_bad_tree_entry_is_named(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        entry: dict[str, object],
        message: str,
    ) -> None:
        """Each malformed entry is a usage error naming the entry and the accepted form."""
        import re

        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        tree = write(tmp_path / "tree.json", json.dumps({"m/up": entry}))
        status = main(["explain", "m/up", "--policy", str(policy), "--tree", str(tree)])
        err = capsys.readouterr().err
        assert status == 2
        assert "entry 'm/up'" in err
        assert re.search(message, err), err
