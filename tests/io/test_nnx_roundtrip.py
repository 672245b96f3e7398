"""A flax nnx model placed by rules, saved with `save_file(nnx.state(model))` and restored
with `load_file(path, into=nnx.state(fresh))`: training resumes with bit-identical losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import devpolicy

nnx = pytest.importorskip("flax.nnx")

# The names the docs say an nnx state's leaves get: the attribute path, list indices as
# digits, no `/value`. A mesh of every CPU device; every parameter sharded over it where
# its first dimension divides, replicated where not; the 0-d step counter replicated.
POLICY = {
    "version": 1,
    "meshes": {"fsdp": {"axes": {"data": -1}, "devices": "cpu"}},
    "rules": [
        {"match": "params/step", "ndim": 0, "sharding": {"mesh": "fsdp", "spec": []}},
        {
            "match": "params/*",
            "sharding": {"mesh": "fsdp", "spec": ["data"]},
            "fallback": ["replicate"],
        },
    ],
}


# flax 0.12 holds a list of modules in `nnx.List`; older flax takes a plain list.
_ModuleList: Any = getattr(nnx, "List", list)


class Model(nnx.Module):  # type: ignore[misc]
    def __init__(self, rngs: Any) -> None:
        self.embed = nnx.Linear(4, 8, rngs=rngs)
        self.blocks = _ModuleList([nnx.Linear(8, 8, rngs=rngs) for _ in range(2)])
        self.head = nnx.Linear(8, 1, rngs=rngs)
        self.step = nnx.Variable(jnp.zeros((), jnp.int32))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.embed(x))
        for block in self.blocks:
            x = jax.nn.relu(block(x))
        return self.head(x)


def _value(variable: Any) -> Any:
    # flax 0.12 deprecates `.value`; older flax has no `get_value`.
    return variable.get_value() if hasattr(variable, "get_value") else variable.value


def _batches() -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32))
        for _ in range(6)
    ]


@nnx.jit  # type: ignore[misc]
def _train_step(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
    def loss_fn(m: Model) -> jax.Array:
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - 0.05 * g, params, grads))
    if hasattr(model.step, "set_value"):
        model.step.set_value(_value(model.step) + 1)
    else:
        model.step.value = model.step.value + 1
    return loss


def _placed(model: Model, policy: devpolicy.Policy) -> None:
    nnx.update(model, policy.put("params", nnx.state(model)))


def test_an_nnx_model_saved_and_loaded_into_a_fresh_one_trains_on_bit_identically(
    tmp_path: Path,
) -> None:
    policy = devpolicy.load_policy(POLICY)
    batches = _batches()
    model = Model(nnx.Rngs(0))
    _placed(model, policy)
    for x, y in batches[:3]:
        _train_step(model, x, y)
    path = tmp_path / "ckpt.safetensors"
    devpolicy.save_file(nnx.state(model), path)
    resumed_losses = [float(_train_step(model, x, y)) for x, y in batches[3:]]

    fresh = Model(nnx.Rngs(1))  # other values: all must come from the file
    restored = policy.load_file(path, into=nnx.state(fresh), prefix="params")
    nnx.update(fresh, restored)
    assert int(_value(fresh.step)) == 3
    kernel = _value(fresh.embed.kernel)
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("data")
    assert _value(fresh.step).sharding.spec == jax.sharding.PartitionSpec()
    # The head's (8, 1) kernel divides over the mesh; its (1,) bias does not: replicated.
    assert _value(fresh.head.bias).sharding.spec == jax.sharding.PartitionSpec()
    losses = [float(_train_step(fresh, x, y)) for x, y in batches[3:]]
    assert losses == resumed_losses
    assert int(_value(fresh.step)) == int(_value(model.step)) == 6


def test_the_names_of_an_nnx_state_are_its_attribute_paths(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    devpolicy.save_file(nnx.state(Model(nnx.Rngs(0))), path)
    names = sorted(t.name for t in devpolicy.plan(path, prefix="params").tensors)
    assert names == [
        "params/blocks/0/bias",
        "params/blocks/0/kernel",
        "params/blocks/1/bias",
        "params/blocks/1/kernel",
        "params/embed/bias",
        "params/embed/kernel",
        "params/head/bias",
        "params/head/kernel",
        "params/step",
    ]


def test_a_fresh_nnx_model_with_another_shape_is_told_every_difference(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    devpolicy.save_file(nnx.state(Model(nnx.Rngs(0))), path)

    class Wider(Model):
        def __init__(self, rngs: Any) -> None:
            super().__init__(rngs)
            self.head = nnx.Linear(8, 2, rngs=rngs)

    with pytest.raises(devpolicy.CheckpointMismatchError) as caught:
        devpolicy.load_file(path, into=nnx.state(Wider(nnx.Rngs(0))))
    assert [name for name, _ in caught.value.mismatched] == ["head/bias", "head/kernel"]
