"""Sharding rules: meshes in the policy, NamedSharding decisions, fallbacks, shard-local loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.conftest import REPO
from tests.helpers import count_data_reads, needs_cpu_pinned_host, policy_of, write

MESH = {"grid": {"axes": {"data": 2, "model": 2}, "devices": "cpu"}}


def sharded(spec: list[object], match: str = "params/*", **extra: object) -> devpolicy.Policy:
    rule = {"match": match, "sharding": {"mesh": "grid", "spec": spec}, **extra}
    return policy_of(meshes=MESH, rules=[rule], fallback=["cpu:3"])


def run_python(code: str, devices: int, timeout: float = 180) -> dict[str, object]:
    """Run `code` in a fresh interpreter with `devices` fake CPU devices; its last line is JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_FLAGS"))}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


class TestPolicyFormat:
    def test_a_sharding_rule_needs_a_mesh_the_policy_defines(self, tmp_path: Path) -> None:
        """An unknown mesh is a PolicyError at the rule's line, with a did-you-mean."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  grid: {axes: {data: 2}}\nrules:\n"
            "  - match: a\n    sharding: {mesh: gird, spec: [data]}\n",
        )
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^p\.yaml:6: rules\[0\]\.sharding\.mesh: unknown mesh 'gird' \(did you mean 'grid'\?\); meshes: grid$",
        ):
            devpolicy.load_policy(path, environ={})

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "[dat]",
                r"mesh 'grid' has no axis 'dat' \(did you mean 'data'\?\); axes: data, model",
            ),
            ("[data, data]", r"axis 'data' is used twice in one spec"),
            ("[[data, model], model]", r"axis 'model' is used twice in one spec"),
            ("[3]", r"a spec entry is an axis name, null \(not sharded\), or a list of axis names"),
        ],
    )
    def test_a_spec_may_name_only_its_mesh_axes_each_once(
        self, tmp_path: Path, spec: str, message: str
    ) -> None:
        """Specs are checked against their mesh when the policy loads."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  grid: {axes: {data: 2, model: 2}}\nrules:\n"
            f"  - match: a\n    sharding: {{mesh: grid, spec: {spec}}}\n",
        )
        with pytest.raises(
            devpolicy.PolicyError, match=rf"^p\.yaml:6: rules\[0\]\.sharding.*{message}"
        ):
            devpolicy.load_policy(path, environ={})

    @pytest.mark.parametrize(
        ("mesh", "message"),
        [
            ("{axes: {data: -1, model: -1}}", r"only one axis may be -1"),
            ("{axes: {data: 0}}", r"an axis size is a whole number >= 1, or -1"),
            ("{axes: {}}", r"a mesh needs at least one axis"),
            (
                "{axes: {data: 2}, devices: gpuu}",
                r"unknown backend 'gpuu' \(did you mean 'gpu'\?\)",
            ),
            (
                "{axes: {data: 2}, devicez: cpu}",
                r"unknown field 'devicez' \(did you mean 'devices'\?\)",
            ),
            ("{axes: {1st: 2}}", r"not an axis name: '1st'"),
        ],
    )
    def test_bad_meshes_are_located_errors(self, tmp_path: Path, mesh: str, message: str) -> None:
        """Each mesh mistake names the file, line and field."""
        path = write(tmp_path / "p.yaml", f"version: 1\nmeshes:\n  grid: {mesh}\n")
        with pytest.raises(devpolicy.PolicyError, match=rf"^p\.yaml:3: meshes\.grid.*{message}"):
            devpolicy.load_policy(path, environ={})

    def test_a_rule_gives_a_device_or_a_sharding_not_both(self) -> None:
        """Exactly one of the two."""
        rule = {"match": "a", "device": "cpu", "sharding": {"mesh": "grid", "spec": []}}
        with pytest.raises(devpolicy.PolicyError, match=r"give exactly one of `device`"):
            policy_of(meshes=MESH, rules=[rule])

    def test_an_environment_rule_can_name_a_sharding(self) -> None:
        """DEVPOLICY_RULES='pattern=MESH[axis,-]' shards over a mesh of the policy."""
        policy = devpolicy.load_policy(
            {"version": 1, "meshes": MESH},
            environ={"DEVPOLICY_RULES": "params/*=grid[data,-],batch=cpu:1"},
        )
        d = policy.resolve("params/w", nbytes=64, shape=(4, 4))
        assert (d.device_text, d.mesh, d.spec, d.origin) == (
            "grid[data,-]",
            "grid",
            ("data", None),
            "env:DEVPOLICY_RULES",
        )
        assert policy.resolve("batch").device_text == "cpu:1"

    def test_an_environment_sharding_over_an_unknown_mesh_names_the_variable(self) -> None:
        """The mesh must exist in the policy; the error names DEVPOLICY_RULES."""
        with pytest.raises(
            devpolicy.errors.EnvOverrideError, match=r"^DEVPOLICY_RULES=.*unknown mesh 'gird'"
        ):
            devpolicy.load_policy(
                {"version": 1, "meshes": MESH}, environ={"DEVPOLICY_RULES": "a=gird[data]"}
            )

    def test_the_json_schema_knows_meshes_and_shardings(self) -> None:
        """Editors see `meshes` and a rule's `sharding`."""
        schema = devpolicy.policy_schema()
        assert "meshes" in schema["properties"]
        assert "sharding" in schema["$defs"]["RuleSpec"]["properties"]


class TestLint:
    def test_unused_meshes_and_unbuildable_meshes_are_reported(self, tmp_path: Path) -> None:
        """A mesh no rule uses is a warning at its line; a mesh this machine lacks, a
        missing-device warning naming why, falling back."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nfallback: [cpu]\nmeshes:\n  spare: {axes: {data: 2}}\n"
            "  big: {axes: {data: 64}, devices: cpu}\nrules:\n"
            "  - match: a\n    sharding: {mesh: big, spec: [data]}\n",
        )
        findings = {f.code: f for f in devpolicy.lint(devpolicy.load_policy(path, environ={}))}
        assert findings["unused-mesh"].origin == "p.yaml:4"
        assert "mesh 'spare' is used by no rule" in findings["unused-mesh"].message
        assert "needs 64 cpu devices, 4 here" in findings["missing-device"].message
        assert "falls back to cpu" in findings["missing-device"].message

    def test_a_sharding_rule_shadowed_by_an_earlier_rule_is_unreachable(self) -> None:
        """Shadowing works for sharding rules as for any rule."""
        policy = policy_of(
            meshes=MESH,
            fallback=["cpu"],
            rules=[
                {"match": "params/*", "device": "cpu"},
                {"match": "params/w", "sharding": {"mesh": "grid", "spec": ["data"]}},
            ],
        )
        assert [f.code for f in devpolicy.lint(policy)] == ["unreachable-rule"]


class TestDecisions:
    def test_a_sharded_decision_carries_its_named_sharding(self, cpus: list[jax.Device]) -> None:
        """Mesh, spec, sharding, text, and bytes per device."""
        d = sharded(["data", "model"]).resolve("params/w", nbytes=64, shape=(4, 4))
        assert isinstance(d.sharding, jax.sharding.NamedSharding)
        assert d.sharding.spec == jax.sharding.PartitionSpec("data", "model")
        assert (d.device_text, d.mesh, d.shards, d.mesh_devices) == (
            "grid[data,model]",
            "grid",
            4,
            4,
        )
        assert d.bytes_per_device() == 16
        assert d.device in cpus

    def test_a_dimension_that_does_not_divide_falls_back_with_the_reason(
        self, cpus: list[jax.Device]
    ) -> None:
        """Dim 0 of 5 over an axis of 2: the chain's next target, and why."""
        d = sharded(["data"]).resolve("params/w", nbytes=20, shape=(5,))
        assert d.device == cpus[3]
        assert d.fallback_reason == (
            "grid[data]: dim 0 of 5 does not divide by axis 'data' (2); used cpu:3"
        )

    def test_a_spec_longer_than_the_array_falls_back(self, cpus: list[jax.Device]) -> None:
        """A 2-entry spec cannot shard a vector."""
        d = sharded(["data", "model"]).resolve("params/b", nbytes=16, shape=(4,))
        assert d.device == cpus[3]
        assert "has 2 entries but the array has 1 dimensions" in (d.fallback_reason or "")

    def test_a_mesh_this_machine_cannot_build_falls_back(self, cpus: list[jax.Device]) -> None:
        """Too few devices: the reason says how many the mesh needs and how many are here."""
        policy = policy_of(
            meshes={"big": {"axes": {"data": 8}, "devices": "cpu"}},
            rules=[{"match": "*", "sharding": {"mesh": "big", "spec": ["data"]}}],
            fallback=["cpu"],
        )
        d = policy.resolve("w")
        assert d.device == cpus[0]
        assert d.fallback_reason == (
            "big[data]: mesh 'big' (data=8) needs 8 cpu devices, 4 here; used cpu"
        )

    def test_strict_raises_instead_of_falling_back(self) -> None:
        """Under strict the mesh's reason is the error."""
        policy = policy_of(
            strict=True,
            meshes={"big": {"axes": {"data": 8}, "devices": "cpu"}},
            rules=[{"match": "*", "sharding": {"mesh": "big", "spec": ["data"]}}],
        )
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"(?s)no device for 'big\[data\]'.*big\[data\]: mesh 'big' \(data=8\) needs 8 cpu devices, 4 here",
        ):
            policy.resolve("w")

    def test_a_missing_backend_falls_back(self, cpus: list[jax.Device]) -> None:
        """A mesh over gpu on a CPU-only machine: the fallback, and the backend's reason."""
        if "gpu" in devpolicy.inventory().devices:
            pytest.skip("this machine has a GPU")
        policy = policy_of(
            meshes={"g": {"axes": {"data": -1}, "devices": "gpu"}},
            rules=[{"match": "*", "sharding": {"mesh": "g", "spec": ["data"]}}],
            fallback=["cpu"],
        )
        d = policy.resolve("w")
        assert d.device == cpus[0]
        assert (d.fallback_reason or "").startswith("g[data]: mesh 'g': no gpu backend")

    def test_minus_one_takes_the_devices_left(self) -> None:
        """`-1` sizes the axis to the devices there are."""
        policy = policy_of(
            meshes={"m": {"axes": {"data": -1, "model": 2}, "devices": "cpu"}},
            rules=[{"match": "*", "sharding": {"mesh": "m", "spec": ["data"]}}],
        )
        d = policy.resolve("w", shape=(8,))
        assert d.sharding is not None
        assert dict(d.sharding.mesh.shape) == {"data": 2, "model": 2}  # type: ignore[attr-defined]

    def test_fits_judges_each_devices_share(self) -> None:
        """A sharded `fits` rule compares a device's share, not the whole array, to free memory."""
        # cpu:0, the fallback, can hold the whole array; the others only their share of it.
        capacity = devpolicy.StaticCapacity(
            {"cpu:0": 10_000, **{f"cpu:{i}": 1000 for i in (1, 2, 3)}}
        )
        rule = {"match": "*", "sharding": {"mesh": "grid", "spec": ["data", "model"]}, "fits": True}
        policy = devpolicy.load_policy(
            {"version": 1, "meshes": MESH, "rules": [rule], "fallback": ["cpu"], "headroom": 0},
            environ={},
            capacity=capacity,
        )
        assert policy.resolve("small", nbytes=3200, shape=(40, 20)).mesh == "grid"
        big = policy.resolve("big", nbytes=4400, shape=(40, 20))
        assert big.mesh is None
        assert "each device's share: needs 1.1 KiB" in (big.fallback_reason or "")

    def test_module_level_resolve_and_explain_take_a_shape(self) -> None:
        """`devpolicy.resolve(..., shape=)` and `explain` judge divisibility as Policy does."""
        with devpolicy.activate(sharded(["data"])):
            assert devpolicy.resolve("params/w", nbytes=16, shape=(4,)).mesh == "grid"
            e = devpolicy.explain("params/w", nbytes=20, shape=(5,))
        assert e.decision is not None
        assert e.decision.mesh is None

    def test_events_and_explain_show_the_spec_and_bytes_per_device(self) -> None:
        """The placement event and explain say which spec each tensor got."""
        policy = sharded(["data", "model"])
        with capture_logs() as logs:
            policy.resolve("params/w", nbytes=64, shape=(4, 4))
        assert (logs[0]["mesh"], logs[0]["spec"], logs[0]["bytes_per_device"]) == (
            "grid",
            "[data,model]",
            16,
        )
        e = policy.explain("params/w", nbytes=64, shape=(4, 4))
        assert e.decision is not None
        assert e.decision.device_text == "grid[data,model]"


class TestApplying:
    def test_put_gives_each_leaf_its_rules_sharding(self) -> None:
        """A params pytree: each leaf sharded by its rule, values equal to numpy."""
        policy = policy_of(
            meshes=MESH,
            rules=[
                {"match": "params/*/w", "sharding": {"mesh": "grid", "spec": ["data", "model"]}},
                {"match": "params/*/b", "sharding": {"mesh": "grid", "spec": []}},
            ],
        )
        params = {"l0": {"w": np.arange(32.0).reshape(4, 8), "b": np.ones(8)}}
        out = policy.put("params", params)
        w, b = out["l0"]["w"], out["l0"]["b"]
        assert w.sharding.spec == jax.sharding.PartitionSpec("data", "model")
        assert b.sharding.is_fully_replicated
        assert {s.data.nbytes for s in w.addressable_shards} == {w.nbytes // 4}
        np.testing.assert_array_equal(np.asarray(w), params["l0"]["w"])

    def test_place_runs_under_the_mesh_and_commits_to_the_sharding(self) -> None:
        """Inside, the mesh is set; the result comes out sharded by the rule."""
        policy = sharded(["data"])
        seen = []

        @policy.place("params/w")
        def make() -> jax.Array:
            seen.append(dict(jax.sharding.get_abstract_mesh().shape))
            return jnp.ones((4, 2))

        out = make()
        assert seen == [{"data": 2, "model": 2}]
        assert out.sharding.spec == jax.sharding.PartitionSpec("data")
        assert out.committed
        assert dict(jax.sharding.get_abstract_mesh().shape) == {}

    def test_scope_sets_and_restores_the_mesh(self) -> None:
        """A scope for a sharded rule sets the mesh (JAX then makes new arrays over it)."""
        with sharded([]).scope("params/w") as decision:
            assert dict(jax.sharding.get_abstract_mesh().shape) == {"data": 2, "model": 2}
            assert decision.sharding is not None
            assert jnp.zeros(2).devices() == decision.sharding.device_set
        assert dict(jax.sharding.get_abstract_mesh().shape) == {}

    def test_to_and_inputs_move_follow_a_sharding_rule(self, cpus: list[jax.Device]) -> None:
        """Arrays go to the rule's sharding from any device; what cannot divide stays, reported."""
        policy = sharded(["data"], inputs="move")
        on_first = jax.device_put(jnp.ones(4), cpus[0])
        on_second = jax.device_put(jnp.ones(4), cpus[1])
        for x in (on_first, on_second):
            assert policy.to(x, "params/w").sharding.spec == jax.sharding.PartitionSpec("data")
        with capture_logs() as logs:
            odd = policy.to(jax.device_put(jnp.ones(5), cpus[1]), "params/w")
        assert odd.devices() == {cpus[1]}
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["placement_mismatch"]
        seen = []

        @policy.place("params/w")
        def layer(x: jax.Array) -> jax.Array:
            seen.append(x.sharding.spec)
            return x * 2

        layer(on_second)
        assert seen == [jax.sharding.PartitionSpec("data")]

    @needs_cpu_pinned_host
    def test_a_sharding_rule_applies_its_memory_kind(self) -> None:
        """`memory: pinned_host` with a sharding: the NamedSharding carries the memory kind."""
        policy = sharded(["data"], memory="pinned_host")
        d = policy.resolve("params/w", nbytes=16, shape=(4,))
        assert d.sharding is not None
        assert (d.mesh, d.sharding.memory_kind) == ("grid", "pinned_host")
        out = policy.put("params/w", np.arange(4, dtype=np.float32))
        assert out.sharding.memory_kind == "pinned_host"
        assert out.sharding.spec == jax.sharding.PartitionSpec("data")

    def test_prefetch_builds_sharded_batches(self) -> None:
        """Batches are sharded by the rule (in one process: local batch == global batch)."""
        policy = sharded(["data"], match="batch")
        batches = [np.full((4, 3), i, np.float32) for i in range(3)]
        out = list(policy.prefetch(batches))
        assert [b.sharding.spec for b in out] == [jax.sharding.PartitionSpec("data")] * 3
        np.testing.assert_array_equal(np.asarray(out[2]), batches[2])


class TestShardLocalLoading:
    @pytest.mark.parametrize(
        "spec",
        [["data", "model"], ["data"], [None, "model"], [], [["data", "model"]]],
        ids=["2d", "rows", "columns", "replicated", "two-axes"],
    )
    def test_each_distinct_slice_is_read_once_and_values_match(
        self, tmp_path: Path, spec: list[object]
    ) -> None:
        """bytes_read is the tensor's size however many devices share a slice."""
        path = tmp_path / "m.safetensors"
        w = np.arange(8 * 4 * 3, dtype=np.float32).reshape(8, 4, 3)
        devpolicy.save_file({"w": w}, path)
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=sharded(spec, match="m/w"))
        summary = next(e for e in logs if e["event"] == "load_file")
        assert summary["bytes_read"] == w.nbytes
        np.testing.assert_array_equal(np.asarray(out["w"]), w)
        assert out["w"].sharding.spec == jax.sharding.PartitionSpec(*spec)

    def test_only_the_bytes_of_the_held_slices_are_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Counted at the system call: a split on the last dimension reads the covering range
        once, not one run per row per device (it used to take 16 reads here)."""
        path = tmp_path / "m.safetensors"
        w = np.arange(64, dtype=np.int32).reshape(8, 8)
        devpolicy.save_file({"w": w}, path)
        policy = policy_of(
            meshes={"half": {"axes": {"data": 2}, "devices": ["cpu:1", "cpu:2"]}},
            rules=[{"match": "m/w", "sharding": {"mesh": "half", "spec": [None, "data"]}}],
        )
        reads = count_data_reads(monkeypatch, path)
        out = devpolicy.load_file(path, policy=policy)
        assert sum(reads) == w.nbytes  # each byte once, for both devices' halves
        assert len(reads) == 1
        np.testing.assert_array_equal(np.asarray(out["w"]), w)

    def test_a_small_sharded_tensor_beside_small_plain_ones_is_read_by_slice(
        self, tmp_path: Path
    ) -> None:
        """The small-tensor batch never swallows a sharded tensor: it is read slice by slice."""
        path = tmp_path / "m.safetensors"
        a, b = np.arange(16, dtype=np.float32), np.arange(16, 32, dtype=np.float32)
        devpolicy.save_file({"a": a, "b": b}, path)
        policy = policy_of(
            meshes=MESH,
            rules=[
                {"match": "m/b", "sharding": {"mesh": "grid", "spec": ["data"]}},
                {"match": "*", "device": "cpu:1"},
            ],
        )
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=policy)
        assert out["b"].sharding.spec == jax.sharding.PartitionSpec("data")
        np.testing.assert_array_equal(np.asarray(out["b"]), b)
        np.testing.assert_array_equal(np.asarray(out["a"]), a)
        assert next(e for e in logs if e["event"] == "load_file")["bytes_read"] == 128

    def test_a_scalar_under_a_replicating_rule_loads(self, tmp_path: Path) -> None:
        """A 0-d tensor with `spec: []` is replicated over the mesh."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"step": np.array(7, np.int32)}, path)
        out = devpolicy.load_file(path, policy=sharded([], match="m/step"))
        assert out["step"].shape == ()
        assert int(out["step"]) == 7
        assert out["step"].sharding.is_fully_replicated

    def test_a_deeply_nested_index_is_a_file_error(self, tmp_path: Path) -> None:
        """An index nested past the parser's depth is a SafetensorsFileError, not a crash."""
        index = tmp_path / "m.safetensors.index.json"
        index.write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"not a checkpoint index"):
            devpolicy.plan(index, policy=policy_of())

    def test_a_64_bit_sharded_tensor_is_narrowed_only_when_exact(self, tmp_path: Path) -> None:
        """Narrowing applies per slice; a loss in any slice raises naming the tensor."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.array([1, 2, 3, 2**40], np.int64)}, path)
        with pytest.raises(devpolicy.errors.NarrowingError, match=r"tensor 'w'"):
            devpolicy.load_file(path, policy=sharded(["data"], match="m/w"))

    def test_a_checkpoint_index_loads_its_files_as_one(self, tmp_path: Path) -> None:
        """A Hugging Face style index over three files: every tensor, each by its rule."""
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        tensors = {f"layer{i}.w": np.full((4, 2), i, np.float32) for i in range(6)}
        weight_map = {}
        for part in range(3):
            name = f"model-0000{part + 1}-of-00003.safetensors"
            keys = [f"layer{2 * part}.w", f"layer{2 * part + 1}.w"]
            devpolicy.save_file({k: tensors[k] for k in keys}, ckpt / name)
            weight_map.update(dict.fromkeys(keys, name))
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        policy = policy_of(
            meshes=MESH,
            rules=[
                {"match": "ckpt/layer0.w", "device": "cpu:2"},
                {"match": "ckpt/*", "sharding": {"mesh": "grid", "spec": ["data"]}},
            ],
        )
        with capture_logs() as logs:
            out = devpolicy.load_file(ckpt, policy=policy)
        assert list(out) == list(tensors)
        assert devpolicy.inventory().text(next(iter(out["layer0.w"].devices()))) == "cpu:2"
        assert out["layer5.w"].sharding.spec == jax.sharding.PartitionSpec("data")
        for key, value in tensors.items():
            np.testing.assert_array_equal(np.asarray(out[key]), value)
        assert [e["event"] for e in logs] == ["load_file"] * 3
        planned = devpolicy.plan(ckpt / "model.safetensors.index.json", policy=policy)
        assert [t.key for t in planned.tensors] == list(tensors)

    def test_an_index_naming_a_tensor_its_file_lacks_is_an_error(self, tmp_path: Path) -> None:
        """The index and the files must agree."""
        devpolicy.save_file({"a": np.zeros(2)}, tmp_path / "one.safetensors")
        index = tmp_path / "m.safetensors.index.json"
        index.write_text(
            json.dumps({"weight_map": {"a": "one.safetensors", "b": "one.safetensors"}})
        )
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=r"one\.safetensors: .* lacks: 'b'"
        ):
            devpolicy.load_file(index, policy=policy_of())


@pytest.mark.slow
def test_eight_devices_data_by_model_mesh() -> None:
    """On 8 fake devices, a {data: 2, model: 4} mesh: each leaf's sharding, share and values."""
    report = run_python(
        """
        import json, numpy as np, devpolicy
        policy = devpolicy.load_policy({"version": 1,
            "meshes": {"fsdp": {"axes": {"data": 2, "model": 4}, "devices": "cpu"}},
            "rules": [{"match": "params/*/w", "sharding": {"mesh": "fsdp", "spec": ["data", "model"]}},
                      {"match": "params/*/b", "sharding": {"mesh": "fsdp", "spec": ["model"]}}]},
            environ={})
        params = {f"l{i}": {"w": np.random.default_rng(i).standard_normal((8, 16), np.float32),
                            "b": np.arange(16, dtype=np.float32)} for i in range(3)}
        out = policy.put("params", params)
        report = {}
        for layer, leaves in out.items():
            for name, array in leaves.items():
                report[f"{layer}/{name}"] = {
                    "spec": [str(e) for e in array.sharding.spec],
                    "mesh": dict(array.sharding.mesh.shape),
                    "shard_bytes": sorted({s.data.nbytes for s in array.addressable_shards}),
                    "devices": len(array.sharding.device_set),
                    "equal": bool(np.array_equal(np.asarray(array), params[layer][name])),
                }
        print(json.dumps(report))
        """,
        devices=8,
    )
    for layer in ("l0", "l1", "l2"):
        assert report[f"{layer}/w"] == {
            "spec": ["data", "model"],
            "mesh": {"data": 2, "model": 4},
            "shard_bytes": [8 * 16 * 4 // 8],
            "devices": 8,
            "equal": True,
        }
        assert report[f"{layer}/b"] == {
            "spec": ["model"],
            "mesh": {"data": 2, "model": 4},
            "shard_bytes": [16 * 4 // 4],
            "devices": 8,
            "equal": True,
        }


@pytest.mark.slow
def test_the_same_policy_on_one_device_falls_back_and_says_why() -> None:
    """A laptop: the 8-device mesh cannot be built; arrays land on the fallback, with reasons."""
    report = run_python(
        """
        import json, numpy as np, devpolicy
        spec = {"version": 1, "fallback": ["cpu"],
            "meshes": {"fsdp": {"axes": {"data": 2, "model": 4}, "devices": "cpu"}},
            "rules": [{"match": "params/*", "sharding": {"mesh": "fsdp", "spec": ["data", "model"]}}]}
        policy = devpolicy.load_policy(spec, environ={})
        out = policy.put("params", {"w": np.ones((8, 16), np.float32)})
        d = policy.resolve("params/w", nbytes=512, shape=(8, 16))
        try:
            devpolicy.load_policy({**spec, "strict": True}, environ={}).resolve("params/w")
            strict = "no error"
        except devpolicy.DeviceUnavailableError as e:
            strict = str(e)
        print(json.dumps({"device": devpolicy.inventory().text(next(iter(out["w"].devices()))),
                          "reason": d.fallback_reason,
                          "strict": strict}))
        """,
        devices=1,
    )
    assert report["device"] == "cpu:0"
    assert report["reason"] == (
        "fsdp[data,model]: mesh 'fsdp' (data=2 x model=4) needs 8 cpu devices, 1 here; used cpu"
    )
    assert "needs 8 cpu devices, 1 here" in str(report["strict"])
