"""Sharding fallbacks: chains that hold shardings (`replicate`, `MESH[...]`), a rule's
`indivisible: replicate`, and 0-d leaves under a sharding rule."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import structlog
from jax.sharding import NamedSharding, PartitionSpec

import devpolicy

MIB = 2**20
#: LLaMA's vocabulary plus one added token, against 8-way tensor parallelism.
VOCAB, EMBED = 32001, 4096


def policy(rule: dict[str, Any], **extra: Any) -> devpolicy.Policy:
    """A policy with a tp (tensor=4) and a dp (data=4) mesh over the 4 CPU devices."""
    document: dict[str, Any] = {
        "version": 1,
        "meshes": {
            "tp": {"axes": {"fsdp": 1, "tensor": 4}, "devices": "cpu"},
            "dp": {"axes": {"data": 4}, "devices": "cpu"},
        },
        "rules": [rule],
        **extra,
    }
    return devpolicy.load_policy(document)


def on_8_gpus(rule: dict[str, Any], shape: tuple[int, ...]) -> devpolicy.types.Decision[Any]:
    """The decision for a bf16 array of `shape` named `embed`, by `rule` over a tensor=8
    mesh, on a described machine of 8 GPUs (the policy's chain ends at the host)."""
    p = devpolicy.load_policy(
        {
            "version": 1,
            "fallback": ["cpu"],
            "meshes": {"tp": {"axes": {"tensor": 8}, "devices": "gpu"}},
            "rules": [rule],
        }
    )
    vm = devpolicy.VirtualMachine(["gpu=8x80GiB"])
    decision = p.explain("embed", nbytes=int(np.prod(shape)) * 2, shape=shape, machine=vm).decision
    assert decision is not None
    return decision


class TestVocabulary32001:
    def test_replicate_in_the_chain_replicates_over_the_mesh_on_8_gpus(self) -> None:
        """`fallback: [replicate]`: the 250 MiB embedding is replicated over the 8 GPUs of
        the mesh (250 MiB each), not put whole on the host."""
        rule: dict[str, Any] = {
            "match": "embed",
            "sharding": {"mesh": "tp", "spec": ["tensor", None]},
        }
        # Without it, 32,001 does not divide by 8 and the device chain ends at the host.
        assert on_8_gpus(rule, (VOCAB, EMBED)).device_text == "cpu:0"
        decision = on_8_gpus({**rule, "fallback": ["replicate", "cpu"]}, (VOCAB, EMBED))
        assert decision.device_text == "tp[]"
        assert decision.mesh_devices == 8
        assert decision.shards == 1
        assert decision.bytes_per_device() == VOCAB * EMBED * 2 > 250 * MIB
        assert decision.fallback_reason == (
            "tp[tensor,-]: dim 0 of 32001 does not divide by axis 'tensor' (8); used tp[]"
        )

    def test_replicate_in_the_chain_places_a_real_array_over_the_mesh(self) -> None:
        """On 4 CPU devices: the indivisible array is a NamedSharding replicated over all 4,
        with an info event naming the reason once: the rule declared the fallback, so it is
        no warning (a warning on every restore teaches users to ignore warnings)."""
        rule = {
            "match": "params/embed",
            "sharding": {"mesh": "tp", "spec": ["tensor", None]},
            "fallback": ["replicate"],
        }
        p = policy(rule)
        with structlog.testing.capture_logs() as logs:
            out = p.put("params", {"embed": np.ones((33, 8), np.float32)})["embed"]
        assert isinstance(out.sharding, NamedSharding)
        assert out.sharding.spec == PartitionSpec()
        assert len(out.sharding.device_set) == 4
        assert [
            (e["log_level"], e["fallback_reason"]) for e in logs if e["event"] == "placement"
        ] == [("info", "tp[tensor,-]: dim 0 of 33 does not divide by axis 'tensor' (4); used tp[]")]
        assert not [e for e in logs if e["log_level"] == "warning"]

    def test_replicate_from_the_policys_chain_is_a_warning(self) -> None:
        """The same fallback taken by the policy's `fallback:` (the rule wrote none) is
        undeclared for that rule: a warning, once."""
        rule = {"match": "params/embed", "sharding": {"mesh": "tp", "spec": ["tensor", None]}}
        p = policy(rule, fallback=["replicate"])
        with structlog.testing.capture_logs() as logs:
            p.put("params", {"embed": np.ones((33, 8), np.float32)})
            p.put("params", {"embed": np.ones((33, 8), np.float32)})
        assert [(e["event"], e["log_level"]) for e in logs if e["log_level"] != "debug"] == [
            ("placement", "warning"),
        ]
        assert not p.resolve("params/embed", nbytes=33 * 32, shape=(33, 8)).fallback_declared

    def test_a_declared_fallback_is_info_in_a_load_and_its_summary(self, tmp_path: Any) -> None:
        """Restoring a checkpoint whose rule says `fallback: [replicate]`: the placement and
        the file's `load_file` summary are info, the fallback still counted."""
        rule = {
            "match": "ckpt/*",
            "sharding": {"mesh": "tp", "spec": ["tensor", None]},
            "fallback": ["replicate"],
        }
        path = tmp_path / "ckpt.safetensors"
        devpolicy.save_file({"embed": np.ones((33, 8), np.float32)}, path)
        with structlog.testing.capture_logs() as logs:
            policy(rule).load_file(path)
        assert [(e["event"], e["log_level"]) for e in logs] == [
            ("placement", "info"),
            ("load_file", "info"),
        ]
        assert logs[1]["fallbacks"] == 1

    def test_indivisible_replicate_drops_only_the_axis_that_does_not_divide(self) -> None:
        """`indivisible: replicate`: dim 0 gives up `tensor`, dim 1 keeps `fsdp`."""
        p = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"m": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
                "rules": [
                    {
                        "match": "embed",
                        "sharding": {
                            "mesh": "m",
                            "spec": ["tensor", "fsdp"],
                            "indivisible": "replicate",
                        },
                    }
                ],
            }
        )
        decision = p.decide("embed", nbytes=33 * 8 * 4, shape=(33, 8))
        assert decision.device_text == "m[-,fsdp]"
        assert decision.shards == 2
        assert decision.fallback_reason == (
            "m[tensor,fsdp]: dim 0 of 33 does not divide by axis 'tensor' (2); used m[-,fsdp]"
        )
        assert decision.fallback_declared  # the rule wrote `indivisible: replicate`
        assert p.decide("embed", nbytes=32 * 8 * 4, shape=(32, 8)).device_text == "m[tensor,fsdp]"

    def test_indivisible_replicate_keeps_the_leading_axes_that_divide(self) -> None:
        """An entry of several axes keeps its longest leading run that divides."""
        p = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"m": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
                "rules": [
                    {
                        "match": "w",
                        "sharding": {
                            "mesh": "m",
                            "spec": [["fsdp", "tensor"]],
                            "indivisible": "replicate",
                        },
                    }
                ],
            }
        )
        assert p.decide("w", nbytes=24, shape=(6,)).device_text == "m[fsdp]"


class TestChains:
    def test_a_spec_on_another_mesh_is_tried_next(self) -> None:
        """`fallback: [dp[data]]`: where tp cannot cut the array, dp can."""
        rule = {
            "match": "x",
            "sharding": {"mesh": "tp", "spec": [None, "tensor"]},
            "fallback": ["dp[data]", "cpu"],
        }
        decision = policy(rule).decide("x", nbytes=8 * 3 * 4, shape=(8, 3))
        assert decision.device_text == "dp[data]"
        assert decision.mesh == "dp"
        assert decision.shards == 4

    def test_the_policys_fallback_may_hold_shardings(self) -> None:
        """The policy-wide chain holds `replicate` too; a device rule skips it."""
        p = policy(
            {"match": "x", "sharding": {"mesh": "tp", "spec": ["tensor"]}},
            fallback=["replicate", "cpu:1"],
        )
        assert p.decide("x", nbytes=12, shape=(3,)).device_text == "tp[]"
        q = policy({"match": "y", "device": "gpu"}, fallback=["replicate", "cpu:1"])
        assert q.decide("y").device_text == "cpu:1"

    def test_a_sharding_in_a_chain_naming_an_unknown_mesh_is_refused_at_load(self) -> None:
        """A typo in a chain's sharding is a PolicyError, not a silent pass-over."""
        rule = {"match": "x", "device": "gpu", "fallback": ["tq[tensor]"]}
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^<mapping>: rules\[0\]\.fallback\[0\]: unknown mesh 'tq'; meshes: tp, dp$",
        ):
            policy(rule)

    def test_a_bad_chain_item_lists_every_accepted_form(self) -> None:
        """The message names targets, replicate and sharding text."""
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^<mapping>: rules\[0\]\.fallback\[0\]: not a target: 'replicat' \(did you mean "
            r"'replicate'\?\); accepted: auto, .*; replicate \(over the rule's mesh\); or "
            r"MESH\[ENTRY,\.\.\.\]",
        ):
            policy({"match": "x", "device": "cpu", "fallback": ["replicat"]})


class TestScalars:
    def test_a_0d_leaf_under_a_sharding_rule_is_replicated_over_the_mesh(self) -> None:
        """A step counter under `spec: [null]` (the natural catch-all) is replicated over the
        mesh, not sent down the chain with "spec has 1 entries but the array has 0"."""
        rule = {"match": "state/*", "sharding": {"mesh": "dp", "spec": [None]}}
        p = policy(rule, fallback=["cpu:3"])
        with structlog.testing.capture_logs() as logs:
            out = p.put("state", {"step": np.int32(7), "w": np.ones((8,), np.float32)})
        assert isinstance(out["step"].sharding, NamedSharding)
        assert out["step"].sharding.spec == PartitionSpec()
        assert len(out["step"].sharding.device_set) == 4
        assert not [e for e in logs if e["log_level"] == "warning"]
        assert p.decide("state/step", nbytes=4, shape=()).device_text == "dp[]"

    def test_shardings_of_an_abstract_tree_replicate_scalars_and_jit_creates_it(self) -> None:
        """`shardings()` decides a whole abstract state; `jit` creates it sharded."""
        rule = {"match": "state/*", "sharding": {"mesh": "dp", "spec": ["data"]}}
        p = policy(rule)

        def init() -> dict[str, jax.Array]:
            return {"w": jax.numpy.ones((8, 2)), "step": jax.numpy.zeros((), jax.numpy.int32)}

        found = p.shardings("state", jax.eval_shape(init))
        assert found["w"].spec == PartitionSpec("data")
        assert found["step"].spec == PartitionSpec()
        state = jax.jit(init, out_shardings=found)()
        assert state["w"].sharding == found["w"]
        assert state["w"].addressable_shards[0].data.shape == (2, 2)

    def test_shardings_names_leaves_as_put_does(self) -> None:
        """The same rules match: `shardings("p", tree)` and `put("p", tree)` agree leaf by leaf."""
        rules = [
            {"match": "p/a/*", "sharding": {"mesh": "dp", "spec": ["data"]}},
            {"match": "p/b", "device": "cpu:2"},
        ]
        p = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"dp": {"axes": {"data": 4}, "devices": "cpu"}},
                "rules": rules,
            }
        )
        tree = {"a": [np.ones(4, np.float32)], "b": np.ones(3, np.float32)}
        found = p.shardings("p", tree)
        placed = p.put("p", tree)
        assert found["a"][0] == placed["a"][0].sharding
        assert found["b"] == placed["b"].sharding

    def test_shardings_refuses_a_leaf_that_is_not_an_array(self) -> None:
        """A string leaf has no shape: a TypeError naming it."""
        p = devpolicy.load_policy({"version": 1})
        with pytest.raises(TypeError, match=r"^shardings\('p'\): leaf 'p/name' is a str"):
            p.shardings("p", {"name": "x"})


class TestShippedPolicy:
    def test_fsdp_sharded_keeps_an_indivisible_embedding_and_step_counters_on_the_mesh(
        self,
    ) -> None:
        """policies/fsdp-sharded.yaml planned for 8 GPUs: a 32,001-row embedding gives up
        only `data`, a 0-d step counter is replicated, an odd-sized state replicates over
        the mesh; nothing goes to the host."""
        from tests.conftest import REPO

        p = devpolicy.load_policy(REPO / "policies" / "fsdp-sharded.yaml", environ={})
        vm = devpolicy.VirtualMachine(["gpu=8x80GiB"])

        def where(name: str, shape: tuple[int, ...]) -> str:
            nbytes = int(np.prod(shape)) * 2
            decision = p.explain(name, nbytes=nbytes, shape=shape, machine=vm).decision
            assert decision is not None
            return decision.device_text

        assert where("params/embed/embedding", (VOCAB, EMBED)) == "fsdp[-,model]"
        assert where("params/layer0/kernel", (EMBED, EMBED)) == "fsdp[data,model]"
        assert where("train_state/step", ()) == "fsdp[]"
        assert where("train_state/odd", (7,)) == "fsdp[]"

    def test_a_mesh_used_only_by_a_fallback_is_not_reported_unused(self) -> None:
        """`check` counts a chain's sharding as a use of its mesh."""
        p = policy(
            {"match": "x", "sharding": {"mesh": "tp", "spec": ["tensor"]}}, fallback=["dp[data]"]
        )
        assert not [f for f in devpolicy.lint(p) if f.code == "unused-mesh"]
