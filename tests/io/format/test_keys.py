"""PRNG key arrays saved and loaded (`_io/format/keys`): written as their key data with the
implementation named in the file's metadata, given back as key arrays; and every leaf that
cannot be saved named with what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file as reference_load
from safetensors.numpy import save_file as reference_save

import devpolicy

KEYS = "devpolicy.prng_keys"


def _same_keys(a: jax.Array, b: jax.Array) -> None:
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b))


class TestKeysRoundTrip:
    def test_a_mapping_of_key_arrays_loads_back_as_key_arrays(self, tmp_path: Path) -> None:
        """A plain load gives back key arrays where the file's metadata names key data."""
        keys = jax.random.split(jax.random.key(3), 4)
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"keys": keys, "w": np.ones(2, np.float32)}, path)
        loaded = devpolicy.load_file(path)
        _same_keys(loaded["keys"], keys)
        assert loaded["w"].dtype == np.float32

    def test_each_implementation_is_named_and_restored(self, tmp_path: Path) -> None:
        """Keys of several implementations in one file each come back as their own kind."""
        fry = jax.random.key(1, impl="threefry2x32")
        rbg = jax.random.key(1, impl="rbg")
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"a": fry, "b": rbg}, path, metadata={"step": "7"})
        assert devpolicy.read_metadata(path) == {
            "step": "7",
            KEYS: json.dumps({"a": "threefry2x32", "b": "rbg"}),
        }
        assert {k: v.shape for k, v in reference_load(path).items()} == {"a": (2,), "b": (4,)}
        loaded = devpolicy.load_file(path)
        _same_keys(loaded["a"], fry)
        _same_keys(loaded["b"], rbg)

    def test_keys_placed_by_a_rule_keep_its_device(self, tmp_path: Path) -> None:
        """The key data is placed by the rule for its name; the keys are where it went."""
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"rng": {"key": jax.random.key(0)}}, path)
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "k/rng/*", "device": "cpu:2"}]}
        )
        (key,) = jax.tree.leaves(policy.load_file(path, into={"rng": {"key": jax.random.key(9)}}))
        assert key.devices() == {devpolicy.get_device("cpu:2")}
        _same_keys(key, jax.random.key(0))

    def test_a_shape_dtype_struct_of_keys_is_filled_with_keys(self, tmp_path: Path) -> None:
        """`jax.eval_shape` trees (no arrays yet) take keys too."""
        keys = jax.random.split(jax.random.key(0), 3)
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"keys": keys}, path)
        shape = jax.eval_shape(lambda: {"keys": jax.random.split(jax.random.key(1), 3)})
        _same_keys(devpolicy.load_file(path, into=shape)["keys"], keys)

    def test_a_leaf_of_raw_uint32_keys_takes_the_data_as_it_is(self, tmp_path: Path) -> None:
        """Old-style keys (`jax.random.PRNGKey`, plain uint32) are filled with the data."""
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"key": jax.random.key(4)}, path)
        raw = devpolicy.load_file(path, into={"key": jax.random.PRNGKey(0)})["key"]
        assert raw.dtype == np.uint32
        np.testing.assert_array_equal(raw, jax.random.key_data(jax.random.key(4)))


class TestKeyMismatches:
    def test_a_key_leaf_and_plain_integers_in_the_file_are_a_mismatch(self, tmp_path: Path) -> None:
        """uint32 data the file does not name as keys never silently becomes keys."""
        path = tmp_path / "k.safetensors"
        reference_save({"key": np.zeros(2, np.uint32)}, str(path))
        with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
            devpolicy.load_file(path, into={"key": jax.random.key(0)})
        ((leaf, why),) = caught.value.mismatched
        assert leaf == "key"
        assert why == (
            "the file's 'key' is uint32[2], the leaf is PRNG keys key<fry>[]: keys load from "
            "key data whose implementation the file's metadata names (as save_file writes them)"
        )

    def test_keys_of_another_implementation_are_a_mismatch(self, tmp_path: Path) -> None:
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"key": jax.random.key(0, impl="rbg")}, path)
        with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
            devpolicy.load_file(path, into={"key": jax.random.key(0)})
        assert list(caught.value.mismatched) == [
            ("key", "the file's 'key' holds rbg keys, the leaf is key<fry>[]")
        ]

    def test_keys_of_another_shape_are_a_mismatch(self, tmp_path: Path) -> None:
        path = tmp_path / "k.safetensors"
        devpolicy.save_file({"key": jax.random.split(jax.random.key(0), 2)}, path)
        with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
            devpolicy.load_file(path, into={"key": jax.random.key(0)})
        assert list(caught.value.mismatched) == [
            (
                "key",
                "the file's 'key' is threefry2x32 key data uint32[2, 2], the leaf key<fry>[] "
                "needs uint32[2]",
            )
        ]

    def test_metadata_naming_keys_badly_is_refused_naming_the_file(self, tmp_path: Path) -> None:
        """The entry must be a JSON object of the file's U32 tensors."""
        path = tmp_path / "k.safetensors"
        reference_save({"w": np.zeros(2, np.float32)}, str(path), metadata={KEYS: "[1]"})
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"__metadata__\['devpolicy\.prng_keys'\] must be a JSON object of tensor keys",
        ):
            devpolicy.load_file(path)
        reference_save({"w": np.zeros(2, np.float32)}, str(path), metadata={KEYS: '{"w": "rbg"}'})
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r": tensor 'w': __metadata__\['devpolicy\.prng_keys'\] names it as PRNG key "
            r"data, a F32: key data is unsigned 32-bit \(U32\)$",
        ):
            devpolicy.load_file(path)

    def test_an_implementation_this_jax_lacks_is_refused_naming_the_tensor(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "k.safetensors"
        reference_save(
            {"k": np.zeros(2, np.uint32)}, str(path), metadata={KEYS: '{"k": "no_such_prng"}'}
        )
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r": tensor 'k': holds PRNG key data of implementation 'no_such_prng'",
        ):
            devpolicy.load_file(path)


class TestUnsaveableLeaves:
    def test_the_metadata_entry_for_keys_is_reserved(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"^metadata key 'devpolicy\.prng_keys' is written"):
            devpolicy.save_file(
                {"k": jax.random.key(0)}, tmp_path / "k.safetensors", metadata={KEYS: "{}"}
            )
        assert not (tmp_path / "k.safetensors").exists()

    def test_a_leaf_that_is_not_an_array_is_named_with_the_fix(self, tmp_path: Path) -> None:
        tree: dict[str, Any] = {"w": np.zeros(2), "opt": {"name": "adam"}}
        with pytest.raises(
            TypeError,
            match=r"^save_file\(\): leaf 'opt/name' is a str, not an array or number; save "
            r"the tree's arrays only: leave that leaf out \(for an nnx model, "
            r"`nnx\.state\(model, nnx\.Param\)` holds its parameters alone\)$",
        ):
            devpolicy.save_file(tree, tmp_path / "t.safetensors")
        assert not (tmp_path / "t.safetensors").exists()

    def test_an_array_of_objects_is_named_with_the_fix(self, tmp_path: Path) -> None:
        with pytest.raises(
            TypeError, match=r"^save_file\(\): 'tags' is an array of Python objects"
        ):
            devpolicy.save_file(
                {"tags": np.array([None, 1], dtype=object)}, tmp_path / "t.safetensors"
            )

    def test_a_dtype_the_format_lacks_is_named_by_its_leaf(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"^save_file\(\): 'meta/label': dtype <U3 cannot"):
            devpolicy.save_file({"meta": {"label": np.array(["abc"])}}, tmp_path / "t.safetensors")

    def test_a_deleted_array_is_named(self, tmp_path: Path) -> None:
        """A donated or deleted leaf: JAX's error, with the leaf it came from."""
        gone = jax.numpy.ones(3)
        gone.delete()
        with pytest.raises(
            ValueError, match=r"^save_file\(\): 'layers/0/w' \(ArrayImpl float32\) cannot be"
        ):
            devpolicy.save_file({"layers": [{"w": gone}]}, tmp_path / "t.safetensors")
