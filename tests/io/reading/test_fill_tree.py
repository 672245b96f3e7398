"""`load_file(path, into=tree)` and `save_file(tree, path)`: a model's tree out and back in,
named as `put` names it, placed by the rules written for those names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file as reference_load
from safetensors.numpy import save_file as reference_save
from structlog.testing import capture_logs

import devpolicy

RULES = {
    "version": 1,
    "rules": [
        {"match": "params/dense/*", "device": "cpu:2"},
        {"match": "params/*", "device": "cpu:1"},
    ],
}


def _text(array: jax.Array) -> str:
    return devpolicy.inventory().text(*array.devices())


def _tree() -> dict[str, Any]:
    return {
        "dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3), "bias": np.ones(3)},
        "layers": [{"w": np.full((4,), i, np.int8)} for i in range(3)],
        "step": np.int32(7),
    }


def test_save_file_names_a_trees_leaves_as_put_names_them(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file(_tree(), path)
    assert sorted(reference_load(path)) == [
        "dense/bias",
        "dense/kernel",
        "layers/0/w",
        "layers/1/w",
        "layers/2/w",
        "step",
    ]
    debug = devpolicy.load_policy({"version": 1, "logging": {"level": "debug"}})
    with capture_logs() as events:
        debug.put("params", _tree())
    placed = [e for e in events if e["event"] == "placement"]
    assert sorted(e["name"] for e in placed) == sorted(
        f"params/{key}" for key in reference_load(path)
    )


def test_save_file_keeps_a_mappings_keys_and_lists_of_numbers_as_one_tensor(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file({"model.w": np.ones(2), "ids": [1, 2, 3]}, path)
    loaded = reference_load(path)
    assert sorted(loaded) == ["ids", "model.w"]
    assert loaded["ids"].tolist() == [1, 2, 3]


def test_save_file_refuses_a_leaf_that_is_not_an_array_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.safetensors"
    with pytest.raises(TypeError, match=r"^save_file\(\): leaf 'b/name' is a str, not an array"):
        devpolicy.save_file({"a": {"w": np.ones(2)}, "b": {"name": "x"}}, path)
    assert not path.exists()
    with pytest.raises(TypeError, match=r"a tree whose leaves have names, got one ndarray"):
        devpolicy.save_file(np.ones(2), path)


def test_load_file_into_a_tree_fills_it_placed_by_the_rules_for_puts_names(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ckpt.safetensors"
    devpolicy.save_file(_tree(), path)
    abstract = jax.eval_shape(_tree)
    policy = devpolicy.load_policy(RULES)
    out = devpolicy.load_file(path, into=abstract, prefix="params", policy=policy)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(abstract)
    assert _text(out["dense"]["kernel"]) == "cpu:2"
    assert _text(out["layers"][1]["w"]) == "cpu:1"
    assert all(leaf.committed for leaf in jax.tree_util.tree_leaves(out))
    np.testing.assert_array_equal(out["dense"]["kernel"], _tree()["dense"]["kernel"])
    assert int(out["step"]) == 7
    assert out["layers"][2]["w"].tolist() == [2, 2, 2, 2]
    # The same names `put` gives: the same devices.
    put = policy.put("params", _tree())
    assert jax.tree.map(_text, out) == jax.tree.map(_text, put)


def test_load_file_into_lists_every_difference_at_once_and_loads_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ckpt.safetensors"
    devpolicy.save_file(_tree(), path)
    wrong = {
        "dense": {"kernel": jax.ShapeDtypeStruct((3, 2), jnp.float32), "bias": np.ones(3)},
        "layers": [{"w": np.zeros(4, np.int8)}, {"w": np.zeros(4, np.int16)}],
        "head": np.zeros(2),
    }
    with (
        capture_logs() as events,
        pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught,
    ):
        devpolicy.load_file(path, into=wrong)
    e = caught.value
    assert e.missing == ("head",)
    assert e.unexpected == ("layers/2/w", "step")
    assert e.mismatched == (
        ("dense/kernel", "the file's 'dense/kernel' is float32[2, 3], the leaf is float32[3, 2]"),
        ("layers/1/w", "the file's 'layers/1/w' is int8[4], the leaf is int16[4]"),
    )
    assert str(e).startswith(
        f"{path} does not fit the tree given as into=: 1 leaf has no tensor, "
        "2 tensors have no leaf, 2 leaves differ in shape or dtype\n"
    )
    assert not [event for event in events if event["event"] in ("load_file", "placement")]


def test_load_file_into_with_strict_false_leaves_other_tensors_unread(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    tensors = {"w": np.ones((4, 4), np.float32), "opt/mu": np.zeros((256, 256), np.float32)}
    devpolicy.save_file(tensors, path)
    with pytest.raises(devpolicy.errors.CheckpointMismatchError, match=r"unexpected: 'opt/mu'"):
        devpolicy.load_file(path, into={"w": np.zeros((4, 4), np.float32)})
    with capture_logs() as events:
        out = devpolicy.load_file(path, into={"w": np.zeros((4, 4), np.float32)}, strict=False)
    assert list(out) == ["w"]
    (loaded,) = [e for e in events if e["event"] == "load_file"]
    assert loaded["bytes_read"] == 64
    (skipped,) = [e for e in events if e["event"] == "into_skipped"]
    assert skipped["count"] == 1
    assert skipped["first"] == ["opt/mu"]
    # Missing leaves stay an error: strict only forgives extra tensors.
    with pytest.raises(devpolicy.errors.CheckpointMismatchError, match=r"missing: 'v'"):
        devpolicy.load_file(path, into={"w": np.zeros((4, 4)), "v": np.zeros(1)}, strict=False)


def test_load_file_into_reads_only_the_files_of_a_checkpoint_its_leaves_take(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    reference_save({"w": np.ones(3, np.float32)}, str(folder / "model-00001-of-00002.safetensors"))
    reference_save(
        {"opt/mu": np.zeros(3, np.float32)}, str(folder / "model-00002-of-00002.safetensors")
    )
    with capture_logs() as events:
        out = devpolicy.load_file(folder, into={"w": np.zeros(3, np.float32)}, strict=False)
    assert out["w"].tolist() == [1.0, 1.0, 1.0]
    files = [e["file"] for e in events if e["event"] == "load_file"]
    assert files == [str(folder / "model-00001-of-00002.safetensors")]


def test_load_file_into_matches_dotted_keys_with_a_per_call_separator(tmp_path: Path) -> None:
    path = tmp_path / "llama.safetensors"
    reference_save(
        {
            "model.layers.0.mlp.up_proj.weight": np.ones((4, 2), np.float32),
            "model.embed_tokens.weight": np.ones((8, 2), np.float32),
        },
        str(path),
    )
    tree = {
        "model": {
            "layers": [{"mlp": {"up_proj": {"weight": np.zeros((4, 2), np.float32)}}}],
            "embed_tokens": {"weight": np.zeros((8, 2), np.float32)},
        }
    }
    with pytest.raises(devpolicy.errors.CheckpointMismatchError, match=r"pass separator="):
        devpolicy.load_file(path, into=tree)
    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "llama/model/layers/*", "device": "cpu:3"}]}
    )
    out = devpolicy.load_file(path, into=tree, separator=".", policy=policy)
    assert _text(out["model"]["layers"][0]["mlp"]["up_proj"]["weight"]) == "cpu:3"
    assert _text(out["model"]["embed_tokens"]["weight"]) == "cpu:0"
    # A flat dict of the file's own keys is split the same way, so it fits too.
    flat_tree = {
        "model.layers.0.mlp.up_proj.weight": np.zeros((4, 2), np.float32),
        "model.embed_tokens.weight": np.zeros((8, 2), np.float32),
    }
    filled = devpolicy.load_file(path, into=flat_tree, separator=".", policy=policy)
    assert _text(filled["model.layers.0.mlp.up_proj.weight"]) == "cpu:3"
    # Without into=, the call's separator names tensors for rules alike; keys keep their form.
    flat = devpolicy.load_file(path, separator=".", policy=policy)
    assert _text(flat["model.layers.0.mlp.up_proj.weight"]) == "cpu:3"
    planned = devpolicy.plan(path, separator=".", policy=policy)
    assert sorted(t.name for t in planned.tensors) == [
        "llama/model/embed_tokens/weight",
        "llama/model/layers/0/mlp/up_proj/weight",
    ]


@pytest.mark.parametrize("separator", ["", "ab", "\x00", 7, "*"])
def test_a_separator_that_is_not_one_character_is_refused_naming_the_argument(
    tmp_path: Path, separator: Any
) -> None:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file({"w": np.ones(1)}, path)
    with pytest.raises(ValueError, match=r"^separator= takes one character"):
        devpolicy.load_file(path, separator=separator)


def test_load_file_into_narrows_64_bit_tensors_to_the_32_bit_leaves_jax_holds(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file({"w": np.array([1.5, 2.5]), "n": np.array([3], np.int64)}, path)
    tree = {"w": jax.ShapeDtypeStruct((2,), jnp.float32), "n": np.zeros(1, np.int32)}
    out = devpolicy.load_file(path, into=tree)
    assert out["w"].dtype == jnp.float32
    assert out["w"].tolist() == [1.5, 2.5]
    assert out["n"].tolist() == [3]


def test_load_file_into_a_single_array_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file({"w": np.ones(1)}, path)
    with pytest.raises(TypeError, match=r"^load_file\(into=\.\.\.\) takes a tree whose leaves"):
        devpolicy.load_file(path, into=np.ones(1))


_keys = st.text(alphabet="abcxyz_", min_size=1, max_size=4)
_leaves = st.sampled_from([np.float32, np.int8, np.uint16]).flatmap(
    lambda dtype: st.lists(st.integers(0, 100), min_size=0, max_size=4).map(
        lambda values: np.array(values, dtype)
    )
)
_trees = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.dictionaries(_keys, children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3),
    ),
    max_leaves=8,
).filter(lambda tree: isinstance(tree, dict))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(tree=_trees)
def test_any_tree_saved_comes_back_equal_through_into(tmp_path_factory: Any, tree: Any) -> None:
    path = tmp_path_factory.mktemp("trees") / "t.safetensors"
    devpolicy.save_file(tree, path)
    out = devpolicy.load_file(path, into=jax.eval_shape(lambda: tree))
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
    for got, want in zip(
        jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(tree), strict=True
    ):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)


def test_shardings_of_a_tree_logs_one_summary_not_a_line_per_leaf() -> None:
    policy = devpolicy.load_policy(RULES)
    with capture_logs() as events:
        policy.shardings("params", jax.eval_shape(_tree))
    assert [e["event"] for e in events if e["log_level"] == "info"] == ["shardings"]
    (summary,) = [e for e in events if e["event"] == "shardings"]
    assert summary["leaves"] == 6
    assert summary["devices"] == "cpu:1 16 B (4 leaves), cpu:2 36 B (2 leaves)"
