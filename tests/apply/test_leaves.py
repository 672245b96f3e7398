"""`axes: attached`: a sharding rule that shards each leaf by the axis names its framework
attached to it (flax linen `LogicallyPartitioned`/`Partitioned`, nnx sharding metadata,
haliax axes), resolved by `axis_rules` exactly as a written `axes:` list, checked against
flax's own partitioning."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply.leaves import leaf_axes, leaf_names_and_axes
from devpolicy._document.axes import Attached
from devpolicy._document.schema import policy_schema
from tests.helpers import policy_of

flax = pytest.importorskip("flax")
nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

#: MaxText's parameter rules (MaxText/configs/base.yml), on a mesh of its axes that fits the
#: four fake CPU devices: fsdp=2 x tensor=2.
MAXTEXT_RULES = [
    ["mlp", ["fsdp_transpose", "tensor", "autoregressive"]],
    ["vocab", ["tensor", "autoregressive"]],
    ["embed", ["fsdp", "fsdp_transpose", "sequence"]],
    ["embed", ["fsdp", "sequence"]],
    ["norm", "tensor"],
    ["heads", ["tensor", "autoregressive"]],
    ["kv", []],
]
MAXTEXT_AXES = {
    "data": 1,
    "fsdp": 2,
    "fsdp_transpose": 1,
    "sequence": 1,
    "tensor": 2,
    "autoregressive": 1,
}
#: The simple case most tests use: one mesh axis per name, on fsdp=2 x tensor=2.
SIMPLE_RULES = {"embed": "fsdp", "mlp": "tensor", "norm": "tensor"}
MT = {"mt": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}}


# What differs between the flax versions tested (0.10 in the oldest environment, 0.12 in
# the newest): the metadata key nnx keeps the names under, eager sharding (0.12 only: a
# Variable with names made outside a mesh needs it off), `nnx.List`, `get_value`.
_FLAX = tuple(int(part) for part in flax.__version__.split(".")[:2])
NAMES_KEY = (
    "out_sharding" if _FLAX >= (0, 12) else "sharding_names" if _FLAX >= (0, 11) else "sharding"
)
_ModuleList: Any = getattr(nnx, "List", list)


def no_eager_sharding() -> Any:
    off = getattr(nnx, "use_eager_sharding", None)
    return off(False) if off is not None else contextlib.nullcontext()


def value_of(variable: Any) -> Any:
    return variable.get_value() if hasattr(variable, "get_value") else variable.value


def attached_policy(**fields: Any) -> devpolicy.Policy:
    """One rule for every parameter: its own names, by the simple table."""
    document: dict[str, Any] = {
        "meshes": MT,
        "axis_rules": SIMPLE_RULES,
        "rules": [{"match": "params/*", "sharding": {"mesh": "mt", "axes": "attached"}}],
    }
    document.update(fields)
    return policy_of(**document)


def spec_of(sharding: Any) -> tuple[Any, ...]:
    """A sharding's spec, one canonical form per meaning (trailing None dropped)."""
    entries = list(sharding.spec)
    entries = [
        None if e == () else e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in entries
    ]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def logical(init: Any, names: tuple[str | None, ...]) -> Any:
    return nn.with_logical_partitioning(init, names)


class Decoder(nn.Module):
    """A LLaMA-like decoder block with MaxText's logical axis names on every parameter."""

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        normal = nn.initializers.normal(0.02)
        embedding = self.param("embedding", logical(normal, ("vocab", "embed")), (32, 16))
        x = embedding[tokens]
        scale = self.param("scale", logical(nn.initializers.ones, ("norm",)), (16,))
        x = x * scale
        query = self.param("query", logical(normal, ("embed", "heads", "kv")), (16, 4, 8))
        out = self.param("out", logical(normal, ("heads", "kv", "embed")), (4, 8, 16))
        x = x + jnp.einsum("bse,ehk,hkf->bsf", x, query, out)
        wi = self.param("wi_0", logical(normal, ("embed", "mlp")), (16, 32))
        wo = self.param("wo", logical(normal, ("mlp", "embed")), (32, 16))
        x = x + jax.nn.relu(x @ wi) @ wo
        logits = self.param("logits", logical(normal, ("embed", "vocab")), (16, 32))
        return x @ logits


def init_decoder(key: jax.Array) -> Any:
    return Decoder().init(key, jnp.zeros((2, 4), jnp.int32))


@pytest.fixture
def mesh() -> jax.sharding.Mesh:
    """MaxText's axes over the four CPU devices, as flax would be given them."""
    return jax.make_mesh(
        tuple(MAXTEXT_AXES.values()), tuple(MAXTEXT_AXES), devices=jax.devices("cpu")
    )


class TestFlaxLinen:
    def test_shardings_of_an_abstract_tree_are_flaxs_own(self, mesh: jax.sharding.Mesh) -> None:
        """`shardings("params", eval_shape(init))` gives every parameter the spec flax's
        `get_partition_spec` + `logical_to_mesh_sharding` gives with the same table."""
        abstract = jax.eval_shape(init_decoder, jax.random.key(0))
        rules = [
            (name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in MAXTEXT_RULES
        ]
        expected = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
        maxtext = attached_policy(
            meshes={"mt": {"axes": MAXTEXT_AXES, "devices": "cpu"}}, axis_rules=MAXTEXT_RULES
        )
        found = maxtext.shardings("params", abstract)
        flat_expected = jax.tree_util.tree_leaves(expected)
        flat_found = jax.tree_util.tree_leaves(found)
        names = leaf_names_and_axes("params", abstract)[0]
        assert len(flat_found) == len(flat_expected) == 7
        for name, ours, theirs in zip(names, flat_found, flat_expected, strict=True):
            assert spec_of(ours) == spec_of(theirs), name
        by_name = dict(zip(names, map(spec_of, flat_found), strict=True))
        # Spot checks, so the comparison cannot pass with both sides empty.
        assert by_name["params/params/embedding"] == (
            ("tensor", "autoregressive"),
            ("fsdp", "fsdp_transpose", "sequence"),
        )
        # `embed` takes its second pair: `mlp` took fsdp_transpose first.
        assert by_name["params/params/wi_0"] == (
            ("fsdp", "sequence"),
            ("fsdp_transpose", "tensor", "autoregressive"),
        )
        assert by_name["params/params/scale"] == ("tensor",)

    @pytest.mark.slow
    def test_jit_init_with_these_out_shardings_creates_the_params_sharded(self) -> None:
        """The tree `shardings` returns is what `jax.jit(init, out_shardings=...)` takes:
        the parameters are created where the rules put them."""
        abstract = jax.eval_shape(init_decoder, jax.random.key(0))
        shardings = attached_policy().shardings("params", abstract)
        params = jax.jit(init_decoder, out_shardings=shardings)(jax.random.key(0))
        wi = params["params"]["wi_0"].value
        assert isinstance(wi.sharding, NamedSharding)
        assert spec_of(wi.sharding) == ("fsdp", "tensor")
        assert len(wi.addressable_shards) == 4
        assert wi.addressable_shards[0].data.shape == (8, 16)
        # The same values (computed sharded: to rounding).
        np.testing.assert_allclose(
            np.asarray(wi),
            np.asarray(init_decoder(jax.random.key(0))["params"]["wi_0"].value),
            rtol=1e-5,
            atol=1e-7,
        )

    def test_put_of_initialised_boxed_params_shards_each_by_its_names(self) -> None:
        params = init_decoder(jax.random.key(0))
        placed = attached_policy().put("params", params)
        assert spec_of(placed["params"]["out"].value.sharding) == (None, None, "fsdp")
        assert spec_of(placed["params"]["embedding"].value.sharding) == (None, "fsdp")
        assert spec_of(placed["params"]["wo"].value.sharding) == ("tensor", "fsdp")

    def test_partitioned_names_are_mesh_axes_used_as_the_spec(self) -> None:
        """flax `nn.with_partitioning` attaches mesh axes: they are the spec as they are,
        whatever the table says."""

        class Model(nn.Module):
            @nn.compact
            def __call__(self, x: jax.Array) -> jax.Array:
                init = nn.with_partitioning(nn.initializers.zeros, (None, ("fsdp", "tensor")))
                return x @ self.param("w", init, (3, 8))

        abstract = jax.eval_shape(Model().init, jax.random.key(0), jnp.zeros((1, 3)))
        (sharding,) = jax.tree_util.tree_leaves(attached_policy().shardings("params", abstract))
        assert spec_of(sharding) == (None, ("fsdp", "tensor"))
        assert leaf_axes(abstract) == [Attached((None, ("fsdp", "tensor")), mesh_axes=True)]


def nnx_model() -> Any:
    class Mlp(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            kernel = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
            self.up = nnx.Linear(16, 32, kernel_init=kernel, rngs=rngs)
            self.down = nnx.Param(jnp.zeros((32, 16)), **{NAMES_KEY: ("mlp", "embed")})
            self.norm = nnx.Param(jnp.ones((16,)), **{NAMES_KEY: ("norm",)})
            self.layers = _ModuleList(
                [nnx.Param(jnp.zeros((4, 16)), **{NAMES_KEY: (None, "embed")})]
            )

    with no_eager_sharding():
        return Mlp(nnx.Rngs(0))


class TestNnx:
    def test_put_of_nnx_state_shards_by_the_variables_own_names(self) -> None:
        """`put("params", nnx.state(model))` with one rule: every Variable sharded by its
        metadata's names through the table; the bias, which has none, replicated."""
        state = nnx.state(nnx_model())
        with capture_logs() as logs:
            placed = attached_policy().put("params", state)
        specs = {
            name: spec_of(leaf.sharding)
            for name, leaf in zip(
                leaf_names_and_axes("params", placed)[0],
                jax.tree_util.tree_leaves(placed),
                strict=True,
            )
        }
        assert specs == {
            "params/down": ("tensor", "fsdp"),
            "params/layers/0": (None, "fsdp"),
            "params/norm": ("tensor",),
            "params/up/bias": (),
            "params/up/kernel": ("fsdp", "tensor"),
        }
        (warning,) = [e for e in logs if e["event"] == "no_attached_axes"]
        assert warning["examples"] == ["params/up/bias"]

    def test_shardings_of_an_abstract_nnx_state(self) -> None:
        """`nnx.eval_shape` makes Variables of `ShapeDtypeStruct`s: their shardings are
        decided by the same names, nothing created."""
        with no_eager_sharding():
            abstract = nnx.eval_shape(nnx_model)
        shardings = attached_policy().shardings("params", nnx.state(abstract))
        assert spec_of(value_of(shardings["up"]["kernel"])) == ("fsdp", "tensor")
        assert spec_of(value_of(shardings["down"])) == ("tensor", "fsdp")

    def test_a_partitionspec_in_the_metadata_is_read_as_its_entries(self) -> None:
        with no_eager_sharding():
            variable = nnx.Param(jnp.zeros((16, 32)), **{NAMES_KEY: PartitionSpec("embed", "mlp")})
        placed = attached_policy().put("params", {"w": variable})
        assert spec_of(value_of(placed["w"]).sharding) == ("fsdp", "tensor")

    @pytest.mark.parametrize("key", ["out_sharding", "sharding_names", "sharding"])
    def test_each_flax_versions_metadata_key_is_read(self, key: str) -> None:
        """flax 0.12 keeps the names under `out_sharding`, 0.11 `sharding_names`, 0.10
        `sharding`: a Variable-like box with any of them is read."""
        box = OldVariable(np.zeros((16, 32), np.float32), {key: ("embed", "mlp")})
        assert leaf_axes({"w": box}) == [Attached(("embed", "mlp"))]


class OldVariable:
    """An nnx Variable of another flax version: a box by class name and module, its names
    in `get_metadata()`."""

    __module__ = "flax.nnx.variablelib"

    def __init__(self, value: Any, metadata: dict[str, Any]) -> None:
        self.value = value
        self.metadata = metadata

    def get_metadata(self) -> dict[str, Any]:
        return self.metadata


OldVariable.__name__ = OldVariable.__qualname__ = "Variable"
jax.tree_util.register_pytree_with_keys(
    OldVariable,
    lambda v: (((jax.tree_util.GetAttrKey("value"), v.value),), v.metadata),
    lambda metadata, children: OldVariable(children[0], metadata),
)


class Axis(NamedTuple):
    name: str
    size: int


class NamedArray:
    """A stand-in for haliax's `NamedArray` (haliax 1.3 does not import with the JAX these
    tests run: it needs `jax._src.tree_util.BuiltInKeyEntry`): recognised, as the real one
    is, by its class name and module; the array is its one child, the axes its aux data."""

    __module__ = "haliax.core"

    def __init__(self, array: Any, axes: tuple[Axis, ...]) -> None:
        self.array = array
        self.axes = axes


jax.tree_util.register_pytree_node(
    NamedArray, lambda a: ((a.array,), a.axes), lambda axes, children: NamedArray(children[0], axes)
)


class TestHaliax:
    def test_named_arrays_are_sharded_by_their_axis_names(self) -> None:
        """Levanter's two-level form: axes named in the model, one mapping to mesh axes."""
        tree = {
            "mlp": {
                "up": NamedArray(
                    np.ones((16, 32), np.float32), (Axis("embed", 16), Axis("mlp", 32))
                )
            },
            "ln": NamedArray(np.ones((16,), np.float32), (Axis("embed", 16),)),
        }
        policy = attached_policy(axis_rules={"embed": "fsdp", "mlp": "tensor"})
        placed = policy.put("params", tree)
        assert spec_of(placed["mlp"]["up"].array.sharding) == ("fsdp", "tensor")
        assert spec_of(placed["ln"].array.sharding) == ("fsdp",)
        assert leaf_names_and_axes("params", tree) == (
            ["params/ln", "params/mlp/up"],
            [Attached(("embed",)), Attached(("embed", "mlp"))],
        )


@pytest.fixture
def boxes() -> Callable[..., Any]:
    """Boxes as flax linen attaches names, around plain host arrays."""
    return lambda shape, names: nn.LogicallyPartitioned(np.zeros(shape, np.float32), names)


class TestNothingSilent:
    def test_leaves_without_names_are_replicated_with_one_warning_per_rule(
        self, boxes: Any
    ) -> None:
        """Three unnamed leaves: each replicated over the mesh, one `no_attached_axes`
        warning naming the rule, the count, examples and the fix."""
        tree = {
            "a": np.zeros((4, 4), np.float32),
            "b": np.zeros((8,), np.float32),
            "c": np.zeros((2, 2), np.float32),
            "named": boxes((16, 32), ("embed", "mlp")),
        }
        with capture_logs() as logs:
            placed = attached_policy().put("params", tree)
        assert [spec_of(placed[k].sharding) for k in "abc"] == [(), (), ()]
        assert len(placed["a"].sharding.mesh.devices.flat) == 4
        (warning,) = [e for e in logs if e["event"] == "no_attached_axes"]
        assert warning["log_level"] == "warning"
        assert warning["rule"] == "<mapping>:rules[0]"
        assert warning["leaves"] == 3
        assert warning["examples"] == ["params/a", "params/b", "params/c"]
        assert "nn.with_logical_partitioning" in warning["hint"]
        assert "spec: []" in warning["hint"]
        # Said by that warning, not once more as a fallback.
        assert not [e for e in logs if e["event"] == "placement" and e["log_level"] == "warning"]

    def test_a_scalar_without_names_is_replicated_without_a_word(self) -> None:
        with capture_logs() as logs:
            placed = attached_policy().put("params", {"step": np.int32(3), "x": np.zeros(())})
        assert spec_of(placed["step"].sharding) == ()
        assert not [e for e in logs if e["log_level"] == "warning"]

    def test_a_name_resolved_alone_under_attached_warns_as_a_fallback(self) -> None:
        """Outside a placement (a scope's name) there is no per-rule summary: the
        replication is the `placement` warning, with the reason."""
        with capture_logs() as logs:
            decision = attached_policy().resolve("params/w")
        assert decision.device_text == "mt[]"
        (event,) = [e for e in logs if e["event"] == "placement"]
        assert event["log_level"] == "warning"
        assert "the leaf carries no axis names of its own" in event["fallback_reason"]

    def test_a_name_the_table_lacks_is_reported_once_and_not_sharded(self, boxes: Any) -> None:
        tree = {
            "a": boxes((16, 8), ("embed", "experts")),
            "b": boxes((8,), ("experts",)),
        }
        policy = attached_policy()
        with capture_logs() as logs:
            placed = policy.put("params", tree)
            policy.put("params", tree)
        assert spec_of(placed["a"].value.sharding) == ("fsdp",)
        reports = [e for e in logs if e["event"] == "unknown_logical_axis"]
        assert [e["log_level"] for e in reports] == ["warning"]  # the repeat is debug
        assert reports[0]["axis"] == "experts"
        assert reports[0]["leaves"] == 2
        assert "embed" in reports[0]["axis_rules"]
        assert "[experts, MESH_AXIS]" in reports[0]["hint"]

    def test_names_for_fewer_dimensions_shard_as_jax_pads_them(self, boxes: Any) -> None:
        """Two names on a 3-D kernel shard its first two dimensions and leave the third
        whole, as `PartitionSpec('fsdp', 'tensor')` does (no fallback is taken)."""
        policy = attached_policy(
            rules=[
                {
                    "match": "params/*",
                    "sharding": {"mesh": "mt", "axes": "attached"},
                    "fallback": ["cpu:1"],
                }
            ]
        )
        placed = policy.put("params", {"w": boxes((4, 4, 4), ("embed", "mlp"))})
        sharding = placed["w"].value.sharding
        assert sharding == NamedSharding(sharding.mesh, PartitionSpec("fsdp", "tensor"))

    def test_names_for_more_dimensions_are_a_naming_error(self, boxes: Any) -> None:
        """Three names on a 2-D array raise AxisNamesError naming the leaf, the names and
        the shape, before any fallback is tried: the model's naming, not a device."""
        policy = attached_policy(
            rules=[
                {
                    "match": "params/*",
                    "sharding": {"mesh": "mt", "axes": "attached"},
                    "fallback": ["cpu:1"],
                }
            ]
        )
        with pytest.raises(
            devpolicy.errors.AxisNamesError,
            match=r"^attached axis names \(embed, mlp, norm\) of 'params/w' \(rule <mapping>:rules\[0\]\) name 3 dimensions, but the array has 2: \(4, 4\)\n",
        ):
            policy.put("params", {"w": boxes((4, 4), ("embed", "mlp", "norm"))})

    @pytest.mark.parametrize(
        ("attached", "why"),
        [
            (
                Attached(("model", None), mesh_axes=True),
                "mesh axis 'model' is not an axis of the mesh",
            ),
            (Attached(("embed", "embed")), "logical axis 'embed' names more than one dimension"),
            (Attached((("embed", "mlp"), None)), "a dimension holds several names (embed, mlp)"),
        ],
    )
    def test_names_that_cannot_be_had_go_down_the_chain(self, attached: Attached, why: str) -> None:
        policy = attached_policy(fallback=["cpu"])
        decision = policy.decider.decide("params/w", 64, (4, 4), attached=attached)
        assert decision.device_text == "cpu:0"
        assert decision.fallback_reason is not None
        assert why in decision.fallback_reason


class TestDecisions:
    def test_the_same_name_with_other_attached_names_is_decided_again(self) -> None:
        """The cache is keyed by the names too: one name, two sets of names, two specs; the
        same item again is the cached decision."""
        decider = attached_policy().decider
        item = ("params/w", 2048, (16, 32), 0, None, Attached(("embed", "mlp")))
        (first,) = decider.resolve_many([item])
        (other,) = decider.resolve_many([(*item[:5], Attached(("mlp", "embed")))])
        (again,) = decider.resolve_many([item])
        assert first.spec == ("fsdp", "tensor")
        assert other.spec == ("tensor", "fsdp")
        assert again is first

    def test_leaves_of_one_shape_with_other_names_in_one_placement_differ(self) -> None:
        """Leaves of one rule and shape in one placement are each decided by their own
        names (a placement reuses decisions for alike leaves: names make them unalike)."""
        decider = attached_policy().decider
        decisions = decider.resolve_many(
            [
                ("params/a", 2048, (32, 16), 0, None, Attached(("mlp", "embed"))),
                ("params/b", 2048, (32, 16), 0, None, Attached(("embed", "mlp"))),
                ("params/c", 2048, (32, 16), 0, None, None),
            ]
        )
        assert [d.spec for d in decisions] == [("tensor", "fsdp"), ("fsdp", "tensor"), ()]

    def test_older_item_forms_still_decide(self) -> None:
        decider = policy_of(rules=[{"match": "*", "device": "cpu:2"}]).decider
        items: list[Any] = [("a", 8), ("b", 8, (2,)), ("c", 8, (2,), 0), ("d", 8, (2,), 0, None)]
        assert [d.device_text for d in decider.resolve_many(items)] == ["cpu:2"] * 4

    def test_explain_and_the_event_show_the_attached_names(self) -> None:
        decider = attached_policy().decider
        explained = decider.explain("params/w", 2048, (16, 32), attached=Attached(("embed", "mlp")))
        assert "-> mt[fsdp,tensor] from attached axes (embed, mlp)" in str(explained)
        with capture_logs() as logs:
            decider.resolve_many(
                [("params/w", 2048, (16, 32), 0, None, Attached(("embed", "mlp")))]
            )
        (event,) = [e for e in logs if e["event"] == "placement"]
        assert event["axes"] == "(embed, mlp)"
        assert event["attached"] is True
        decision = decider.decide("params/m", 64, (4, 4), attached=Attached(("fsdp", None), True))
        assert decision.described == "mt[fsdp,-] from attached mesh axes"
        assert decision.attached
        assert decision.axes is None

    def test_a_leaf_with_names_under_a_written_spec_keeps_the_spec(self, boxes: Any) -> None:
        """Names attached to a leaf are read only by rules that say `axes: attached`."""
        policy = attached_policy(
            rules=[{"match": "params/*", "sharding": {"mesh": "mt", "spec": [None, "tensor"]}}]
        )
        placed = policy.put("params", {"w": boxes((16, 32), ("embed", "mlp"))})
        assert spec_of(placed["w"].value.sharding) == (None, "tensor")


class TestPolicy:
    def test_other_strings_are_refused_naming_the_field_and_the_forms(self) -> None:
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^<mapping>: rules\[0\]\.sharding\.axes: `axes` is a list of logical axis "
            r"names.*or `attached`.*got 'atached' \(did you mean 'attached'\?\)",
        ):
            attached_policy(rules=[{"match": "x", "sharding": {"mesh": "mt", "axes": "atached"}}])

    def test_spec_and_attached_together_are_refused(self) -> None:
        with pytest.raises(
            devpolicy.PolicyError, match=r"^<mapping>: rules\[0\]\.sharding: give `spec`.*not both"
        ):
            attached_policy(
                rules=[{"match": "x", "sharding": {"mesh": "mt", "axes": "attached", "spec": []}}]
            )

    def test_the_json_schema_takes_attached(self) -> None:
        axes = policy_schema()["$defs"]["ShardingSpec"]["properties"]["axes"]
        assert {"const": "attached"} in axes["anyOf"]

    def test_lint_warns_when_there_is_no_axis_rules_table(self) -> None:
        (finding,) = [
            f for f in devpolicy.lint(attached_policy(axis_rules=[])) if "axis_rules" in f.message
        ]
        assert finding.code == "attached-without-axis-rules"
        assert finding.severity == "warning"
        assert finding.origin == "<mapping>:rules[0]"
        assert "every logical name a leaf carries" in finding.message
        assert "axis_rules" not in str(devpolicy.lint(attached_policy()))


def test_load_file_into_a_linen_tree_shards_each_leaf_by_its_attached_names(
    tmp_path: Any,
) -> None:
    """A checkpoint of boxed linen params, loaded into the abstract boxed tree: each leaf
    sharded by the names its box carries, the boxes kept around the arrays."""
    params = init_decoder(jax.random.key(0))
    path = tmp_path / "decoder.safetensors"
    devpolicy.save_file(params, path)
    abstract = jax.eval_shape(init_decoder, jax.random.key(1))
    policy = attached_policy()
    loaded = policy.load_file(path, into=abstract, prefix="params")
    expected = policy.shardings("params", abstract)
    is_box = lambda node: isinstance(node, nn.LogicallyPartitioned)  # noqa: E731
    got = jax.tree_util.tree_leaves(loaded, is_leaf=is_box)
    assert any(isinstance(leaf, nn.LogicallyPartitioned) for leaf in got)
    for array, want in zip(
        jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(expected), strict=True
    ):
        assert spec_of(array.sharding) == spec_of(want)
    sharded = [a for a in jax.tree_util.tree_leaves(loaded) if spec_of(a.sharding)]
    assert sharded, "some leaf is sharded by its names"
    for array, original in zip(
        jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(array), np.asarray(original))
