"""The fallback walk (`_decide/routing.py`): attached axis names read as JAX reads a
`PartitionSpec`."""

from __future__ import annotations

import pytest
from jax.sharding import NamedSharding, PartitionSpec

import devpolicy
from devpolicy._document.axes import Attached
from tests.helpers import policy_of


def attached_policy() -> devpolicy.Policy:
    """One `axes: attached` rule over fsdp=2 x tensor=2, with a fallback to cpu:1."""
    return policy_of(
        meshes={"mt": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
        axis_rules={"embed": "fsdp", "mlp": "tensor", "kv": None},
        rules=[
            {
                "match": "params/*",
                "sharding": {"mesh": "mt", "axes": "attached"},
                "fallback": ["cpu:1"],
            }
        ],
    )


class TestAttachedNamesAsJaxReadsThem:
    @pytest.mark.parametrize(
        ("names", "shape", "spec"),
        [
            (("embed", "mlp"), (8, 4, 2), ("fsdp", "tensor")),
            (("embed",), (8, 4, 2), ("fsdp",)),
            (("mlp", None), (4, 8, 2), ("tensor", None)),
            (("embed", "kv"), (8, 4, 2), ("fsdp", None)),
        ],
    )
    def test_fewer_names_than_dimensions_shard_as_the_partition_spec_of_the_names(
        self, names: tuple[str | None, ...], shape: tuple[int, ...], spec: tuple[str | None, ...]
    ) -> None:
        """The decision's NamedSharding equals JAX's from `PartitionSpec(*resolved names)`:
        the dimensions past the names are unsharded and no fallback is taken."""
        decision = attached_policy().decider.decide(
            "params/w", 4 * 8 * 4 * 2, shape, attached=Attached(names)
        )
        assert decision.fallback_reason is None
        assert decision.sharding is not None
        mesh = decision.sharding.mesh
        assert decision.sharding == NamedSharding(mesh, PartitionSpec(*spec))
        assert decision.spec == spec

    def test_the_spec_is_not_padded_past_the_names(self) -> None:
        """`P('fsdp')` and `P('fsdp', None)` compare unequal in JAX: the decision keeps the
        names' length, so it equals the sharding flax builds from the same names."""
        decision = attached_policy().decider.decide(
            "params/w", 256, (8, 8), attached=Attached(("embed",))
        )
        assert decision.sharding is not None
        padded = NamedSharding(decision.sharding.mesh, PartitionSpec("fsdp", None))
        assert decision.sharding != padded

    def test_more_names_than_dimensions_raise_axis_names_error(self) -> None:
        """Three names on a 2-D array: AxisNamesError with the name, the names and the
        shape, not DeviceUnavailableError, and the fallback is not taken."""
        with pytest.raises(devpolicy.errors.AxisNamesError) as raised:
            attached_policy().decider.decide(
                "params/w", 64, (4, 4), attached=Attached(("embed", "mlp", "kv"))
            )
        error = raised.value
        assert not isinstance(error, devpolicy.DeviceUnavailableError)
        assert (error.name, error.names, error.shape) == (
            "params/w",
            ("embed", "mlp", "kv"),
            (4, 4),
        )
        assert "a naming problem in the model, not a missing device" in str(error)

    def test_a_placement_of_many_returns_the_naming_error_in_its_place(self) -> None:
        """decide_many (plans) keeps going: the leaf named for too many dimensions gets its
        AxisNamesError, the others their decisions."""
        results = attached_policy().decider.decide_many(
            [
                ("params/a", 64, (4, 4), 0, None, Attached(("embed", "mlp", "kv"))),
                ("params/b", 64, (4, 4), 0, None, Attached(("embed", "mlp"))),
            ]
        )
        assert isinstance(results[0], devpolicy.errors.AxisNamesError)
        assert isinstance(results[1], devpolicy.types.Decision)
        assert results[1].spec == ("fsdp", "tensor")

    def test_explain_shows_the_naming_error(self) -> None:
        """explain says what put would raise, without raising."""
        explanation = attached_policy().decider.explain(
            "params/w", 64, (4, 4), attached=Attached(("embed", "mlp", "kv"))
        )
        assert explanation.decision is None
        assert explanation.error is not None
        assert explanation.error.startswith("attached axis names (embed, mlp, kv) of 'params/w'")

    def test_a_0d_leaf_with_names_is_a_naming_error(self) -> None:
        """A scalar has no dimension to name: names on it are more than it has."""
        with pytest.raises(devpolicy.errors.AxisNamesError, match=r"the array has 0: \(\)"):
            attached_policy().decider.decide("params/s", 4, (), attached=Attached(("embed",)))


class TestNamesNotKnownHere:
    def test_explain_without_the_names_says_the_rule_needs_them(self) -> None:
        """A bare name under `axes: attached`: not decided (no guess that it is
        replicated), and the error says how to give the model's names."""
        explanation = attached_policy().explain("params/w", nbytes=64, shape=(4, 4))
        assert explanation.decision is None
        assert explanation.error is not None
        assert explanation.error.startswith(
            "not decided: 'params/w' matches (rule <mapping>:rules[0]), which shards over mesh "
            "'mt' by the axis names the model attaches to each leaf (`axes: attached`)"
        )
        assert "plan(path, into=tree)" in explanation.error
        assert "--tree tree.json" in explanation.error

    def test_explain_with_the_names_decides_by_them(self) -> None:
        """axes=(...) are the leaf's names: the sharding they resolve to."""
        explanation = attached_policy().explain(
            "params/w", nbytes=64, shape=(4, 4), axes=("embed", "mlp")
        )
        assert explanation.decision is not None
        assert explanation.decision.spec == ("fsdp", "tensor")

    def test_explain_with_no_names_is_a_leaf_that_carries_none(self) -> None:
        """axes=() says the leaf carries none: replicated over the mesh, said as a fallback."""
        explanation = attached_policy().explain("params/w", nbytes=64, shape=(4, 4), axes=())
        assert explanation.decision is not None
        assert explanation.decision.device_text == "mt[]"

    def test_a_scalar_needs_no_names(self) -> None:
        """0-d: nothing to name, replicated without asking for names."""
        explanation = attached_policy().explain("params/step", nbytes=4, shape=())
        assert explanation.decision is not None
        assert explanation.decision.device_text == "mt[]"

    def test_other_rules_do_not_need_names(self) -> None:
        """A name no attached rule takes is decided as before."""
        explanation = attached_policy().explain("opt/w", nbytes=64, shape=(4, 4))
        assert explanation.decision is not None
        assert explanation.error is None

    def test_axes_must_be_names(self) -> None:
        """A string is not a sequence of names: TypeError saying the form."""
        with pytest.raises(TypeError, match=r"^axes= takes one axis name \(or None\) per dim"):
            attached_policy().explain("params/w", axes="embed")
