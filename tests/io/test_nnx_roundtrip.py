"""A flax nnx model placed by rules, saved with `save_file(nnx.state(model))` and restored
with `load_file(path, into=nnx.state(fresh))`: training resumes with bit-identical losses."""

from __future__ import annotations

import json
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


@pytest.mark.slow
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

    with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
        devpolicy.load_file(path, into=nnx.state(Wider(nnx.Rngs(0))))
    assert [name for name, _ in caught.value.mismatched] == ["head/bias", "head/kernel"]


class DropoutModel(nnx.Module):  # type: ignore[misc]
    """A model whose state holds PRNG key arrays: `nnx.Dropout`'s RNG stream (its key and
    count; flax 0.10 keeps the whole `Rngs` there, a stream per name)."""

    def __init__(self, rngs: Any) -> None:
        self.embed = nnx.Linear(4, 8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.drop(jax.nn.relu(self.embed(x))))


@nnx.jit  # type: ignore[misc]
def _dropout_step(model: DropoutModel, x: jax.Array, y: jax.Array) -> jax.Array:
    def loss_fn(m: DropoutModel) -> jax.Array:
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - 0.05 * g, params, grads))
    return loss


def _keys(state: Any) -> dict[str, Any]:
    """The state's PRNG key arrays by path."""
    return {
        jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    }


class TestPrngKeys:
    @pytest.mark.slow
    def test_a_model_with_dropout_round_trips_and_trains_on_with_the_same_masks(
        self, tmp_path: Path
    ) -> None:
        """`save_file(nnx.state(model))` of a model with `nnx.Dropout` writes its RNG keys;
        `load_file(path, into=nnx.state(fresh))` gives them back as key arrays, so the
        resumed model draws the same dropout masks: bit-identical losses."""
        policy = devpolicy.load_policy(POLICY)
        batches = _batches()
        model = DropoutModel(nnx.Rngs(0, dropout=1))
        nnx.update(model, policy.put("params", nnx.state(model)))  # placed as it will load
        for x, y in batches[:3]:
            _dropout_step(model, x, y)
        path = tmp_path / "ckpt.safetensors"
        devpolicy.save_file(nnx.state(model), path)
        saved_keys = _keys(nnx.state(model))
        assert saved_keys  # the test means something only if the state holds keys
        resumed_losses = [float(_dropout_step(model, x, y)) for x, y in batches[3:]]

        fresh = DropoutModel(nnx.Rngs(5, dropout=6))  # other keys: all must come from the file
        restored = policy.load_file(path, into=nnx.state(fresh), prefix="params")
        restored_keys = _keys(restored)
        assert restored_keys.keys() == saved_keys.keys()
        for where, key in restored_keys.items():
            assert key.dtype == saved_keys[where].dtype
            np.testing.assert_array_equal(
                jax.random.key_data(key), jax.random.key_data(saved_keys[where])
            )
        nnx.update(fresh, restored)
        assert [float(_dropout_step(fresh, x, y)) for x, y in batches[3:]] == resumed_losses

    def test_the_reference_reader_reads_the_key_data_and_the_metadata_names_the_keys(
        self, tmp_path: Path
    ) -> None:
        """Any safetensors reader sees a key as its uint32 words; the file's metadata names
        the implementation of each key tensor."""
        from safetensors import safe_open

        model = DropoutModel(nnx.Rngs(0, dropout=1))
        path = tmp_path / "ckpt.safetensors"
        devpolicy.save_file(nnx.state(model), path)
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        key_tensors = {
            jax.tree_util.keystr(p, simple=True, separator="/").removesuffix("/value")
            for p, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model))
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        }
        assert json.loads(metadata["devpolicy.prng_keys"]) == dict.fromkeys(
            key_tensors, "threefry2x32"
        )
        for name in key_tensors:
            assert (tensors[name].dtype, tensors[name].shape) == (np.uint32, (2,))
