"""Logical axes: `sharding.axes` resolved by `axis_rules` exactly as flax's
`logical_to_mesh_axes`, checked against MaxText's own table and LLaMA parameter names."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding

import devpolicy
from devpolicy._cli.main import main
from devpolicy._document.axes import resolve_axes

# ---------------------------------------------------------------------------------------
# flax's `_logical_to_mesh_axes` re-implemented from its documented algorithm, written
# independently of devpolicy's: the reference every resolution below is compared against.
_UNASSIGNED = object()


def flax_logical_to_mesh_axes(names: Sequence[str | None], rules: Sequence[Any]) -> list[Any]:
    """PartitionSpec entries as flax computes them (unassigned -> None)."""
    result: list[Any] = [_UNASSIGNED if isinstance(n, str) else n for n in names]
    for rule_name, rule_mesh in rules:
        if rule_name in names:
            pos = list(names).index(rule_name)
            new = set(jax.tree_util.tree_leaves(rule_mesh))
            existing = {
                leaf
                for x in result
                if x is not _UNASSIGNED
                for leaf in jax.tree_util.tree_leaves(x)
            }
            if not (existing & new) and result[pos] is _UNASSIGNED:
                result[pos] = rule_mesh
    return [None if x is _UNASSIGNED else x for x in result]


def canonical(entry: Any) -> Any:
    """One form per meaning: [] and None replicate; a one-axis list is its axis."""
    if entry is None or isinstance(entry, str):
        return entry
    axes = tuple(entry)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def canonical_spec(spec: Sequence[Any], ndim: int) -> tuple[Any, ...]:
    entries = [canonical(e) for e in spec]
    return tuple(entries + [None] * (ndim - len(entries)))


# ---------------------------------------------------------------------------------------
# MaxText's parallelism section as written in MaxText/configs/base.yml (llama2 runs with
# these): its mesh axes and its `logical_axis_rules`, pasted unchanged.
MAXTEXT_BASE_YML = """
mesh_axes: ['data', 'fsdp', 'fsdp_transpose', 'sequence', 'tensor', 'autoregressive']
logical_axis_rules: [
                      ['activation_batch', ['data', 'fsdp', 'fsdp_transpose',]],
                      ['activation_heads', ['tensor','sequence']],
                      ['activation_length', 'sequence'],
                      ['activation_embed', 'tensor'],
                      ['activation_mlp', 'tensor'],
                      ['activation_kv', 'tensor'],
                      ['activation_vocab', ['tensor', 'sequence']],
                      ['activation_vocab', 'tensor'],
                      ['activation_vocab', 'sequence'],
                      ['mlp', ['fsdp_transpose', 'tensor', 'autoregressive']],
                      ['vocab', ['tensor', 'autoregressive']],
                      ['embed', ['fsdp', 'fsdp_transpose', 'sequence']],
                      ['embed', ['fsdp', 'sequence']],
                      ['norm', 'tensor'],
                      ['heads', ['tensor', 'autoregressive']],
                      ['kv', []],
                      ['cache_batch', []],
                      ['cache_heads', ['autoregressive', 'tensor']],
                      ['cache_kv', []],
                      ['cache_sequence', []],
                    ]
"""
MAXTEXT = yaml.safe_load(MAXTEXT_BASE_YML)

#: The logical axis names MaxText's llama2 decoder gives each kind of parameter
#: (Embed, RMSNorm scales, DenseGeneral kernels of attention and MLP, logits_dense).
LLAMA_AXES: dict[str, tuple[str, ...]] = {
    "token_embedder/embedding": ("vocab", "embed"),
    "pre_self_attention_layer_norm/scale": ("norm",),
    "post_self_attention_layer_norm/scale": ("norm",),
    "self_attention/query/kernel": ("embed", "heads", "kv"),
    "self_attention/key/kernel": ("embed", "heads", "kv"),
    "self_attention/value/kernel": ("embed", "heads", "kv"),
    "self_attention/out/kernel": ("heads", "kv", "embed"),
    "mlp/wi_0/kernel": ("embed", "mlp"),
    "mlp/wi_1/kernel": ("embed", "mlp"),
    "mlp/wo/kernel": ("mlp", "embed"),
    "decoder_norm/scale": ("norm",),
    "logits_dense/kernel": ("embed", "vocab"),
}


def llama_tree(
    vocab: int, embed: int, heads: int, head_dim: int, mlp: int, layers: int
) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Each parameter of a MaxText llama2 decoder: its path, shape and logical axes."""
    sizes = {
        "vocab": vocab,
        "embed": embed,
        "heads": heads,
        "kv": head_dim,
        "mlp": mlp,
        "norm": embed,
    }
    tree: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {}

    def add(path: str, kind: str) -> None:
        axes = LLAMA_AXES[kind]
        tree[path] = (tuple(sizes[a] for a in axes), axes)

    add("token_embedder/embedding", "token_embedder/embedding")
    for i in range(layers):
        for kind in LLAMA_AXES:
            if kind.split("/")[0] in (
                "pre_self_attention_layer_norm",
                "self_attention",
                "post_self_attention_layer_norm",
                "mlp",
            ):
                add(f"decoder/layers_{i}/{kind}", kind)
    add("decoder/decoder_norm/scale", "decoder_norm/scale")
    add("decoder/logits_dense/kernel", "logits_dense/kernel")
    return tree


def maxtext_policy(sizes: dict[str, int], devices: str = "cpu") -> dict[str, Any]:
    """MaxText's table as written, and one rule per kind of parameter giving its axes."""
    axes = {name: sizes.get(name, 1) for name in MAXTEXT["mesh_axes"]}
    rules = [
        {"match": f"*{kind}", "sharding": {"mesh": "maxtext", "axes": list(names)}}
        for kind, names in LLAMA_AXES.items()
    ]
    return {
        "version": 1,
        "meshes": {"maxtext": {"axes": axes, "devices": devices}},
        "axis_rules": MAXTEXT["logical_axis_rules"],
        "rules": rules,
    }


class TestResolution:
    def test_flax_docstring_example(self) -> None:
        """flax's documented example: batch->X, heads->Y, features unassigned (X taken)."""
        rules = [("batch", "X"), ("features", "X"), ("heads", "Y"), ("batch", "Z")]
        assert resolve_axes(["batch", "length", "heads", "features"], rules) == (
            "X",
            None,
            "Y",
            None,
        )

    def test_a_null_pair_replicates_and_stops_later_pairs_for_that_name(self) -> None:
        """`[kv, null]` (or []) assigns kv to nothing: a later `[kv, tensor]` does not apply."""
        assert resolve_axes(["kv"], [("kv", None), ("kv", "tensor")]) == (None,)
        assert resolve_axes(["kv"], [("kv", ()), ("kv", "tensor")]) == (None,)

    def test_the_second_pair_for_a_name_applies_when_the_first_axes_are_taken(self) -> None:
        """MaxText's embed pairs: an mlp kernel's embed gets fsdp+sequence, fsdp_transpose
        being taken by mlp."""
        rules = [
            ("mlp", ("fsdp_transpose", "tensor")),
            ("embed", ("fsdp", "fsdp_transpose", "sequence")),
            ("embed", ("fsdp", "sequence")),
        ]
        assert resolve_axes(["embed", "mlp"], rules) == (
            ("fsdp", "sequence"),
            ("fsdp_transpose", "tensor"),
        )

    def test_a_name_on_two_dimensions_is_refused(self) -> None:
        """As flax: one logical name shards one dimension."""
        with pytest.raises(ValueError, match=r"^logical axis 'embed' names more than one"):
            resolve_axes(["embed", "embed"], [("embed", "fsdp")])

    @settings(max_examples=300, deadline=None)
    @given(
        names=st.lists(st.sampled_from(["a", "b", "c", "d", None]), max_size=4).filter(
            lambda ns: len([n for n in ns if n]) == len({n for n in ns if n})
        ),
        rules=st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "c", "d", "e"]),
                st.one_of(
                    st.none(),
                    st.sampled_from(["x", "y", "z"]),
                    st.lists(st.sampled_from(["x", "y", "z", "w"]), max_size=3, unique=True).map(
                        tuple
                    ),
                ),
            ),
            max_size=8,
        ),
    )
    def test_resolution_is_flax_logical_to_mesh_axes(
        self, names: list[str | None], rules: list[Any]
    ) -> None:
        """Any names and any ordered table: the same spec as flax's algorithm."""
        ours = resolve_axes(names, rules)
        assert tuple(canonical(e) for e in ours) == tuple(
            canonical(e) for e in flax_logical_to_mesh_axes(names, rules)
        )


class TestMaxTextPort:
    @pytest.mark.parametrize(
        "sizes",
        [{"fsdp": 4}, {"fsdp": 2, "tensor": 2}, {"tensor": 4}, {"fsdp_transpose": 2, "tensor": 2}],
        ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()),
    )
    def test_every_small_llama_parameter_gets_maxtexts_spec(self, sizes: dict[str, int]) -> None:
        """MaxText's logical_axis_rules as written + its llama2 axis names: `shardings()` on
        a small LLaMA tree gives every parameter flax's spec, over the real mesh."""
        policy = devpolicy.load_policy(maxtext_policy(sizes))
        tree = llama_tree(vocab=256, embed=64, heads=4, head_dim=16, mlp=128, layers=2)
        abstract = {k: jax.ShapeDtypeStruct(shape, np.float32) for k, (shape, _) in tree.items()}
        found = policy.shardings("params", abstract)
        assert len(found) == len(tree) == 3 + 2 * 9
        for path, (shape, axes) in tree.items():
            sharding = found[path]
            assert isinstance(sharding, NamedSharding), path
            assert sharding.mesh.shape == {a: sizes.get(a, 1) for a in MAXTEXT["mesh_axes"]}
            expected = flax_logical_to_mesh_axes(axes, MAXTEXT["logical_axis_rules"])
            assert canonical_spec(sharding.spec, len(shape)) == canonical_spec(
                expected, len(shape)
            ), path

    def test_llama_7b_shapes_plan_with_maxtexts_specs(self, tmp_path: Path) -> None:
        """7B shapes in a header-only checkpoint (sparse), planned for 8 GPUs with
        fsdp=4 x tensor=2: every tensor sharded with flax's spec, none falling back."""
        tree = llama_tree(vocab=32000, embed=4096, heads=32, head_dim=128, mlp=11008, layers=32)
        path = tmp_path / "llama-7b.safetensors"
        size = write_header_only(path, {k: shape for k, (shape, _) in tree.items()})
        assert size > 12 * 2**30
        assert path.stat().st_blocks * 512 < 2**20
        policy = devpolicy.load_policy(maxtext_policy({"fsdp": 4, "tensor": 2}, devices="gpu"))
        machine = devpolicy.VirtualMachine(["gpu=8x80GiB"])
        plan = policy.plan(path, prefix="params", machine=machine)
        assert len(plan.tensors) == len(tree) == 3 + 32 * 9
        for tensor in plan.tensors:
            shape, axes = tree[tensor.key]
            decision = tensor.decision
            assert decision is not None, tensor.error
            assert decision.fallback_reason is None, tensor.name
            assert decision.mesh == "maxtext"
            assert decision.axes == axes
            expected = flax_logical_to_mesh_axes(axes, MAXTEXT["logical_axis_rules"])
            assert canonical_spec(decision.spec or (), len(shape)) == canonical_spec(
                expected, len(shape)
            ), tensor.name
        embedding = next(t for t in plan.tensors if t.key == "token_embedder/embedding")
        assert embedding.decision is not None
        text = "maxtext[tensor+autoregressive,fsdp+fsdp_transpose+sequence]"
        assert embedding.decision.device_text == text
        assert embedding.decision.shards == 8
        assert (
            f"params/token_embedder/embedding  F32 32000x4096  500.0 MiB  -> {text} from axes (vocab, embed) "
            in str(plan)
        )

    def test_plan_on_the_command_line_shows_both_levels(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy plan --json` gives each tensor's logical axes beside its spec."""
        tree = llama_tree(vocab=256, embed=64, heads=4, head_dim=16, mlp=128, layers=1)
        checkpoint = tmp_path / "small.safetensors"
        write_header_only(checkpoint, {k: shape for k, (shape, _) in tree.items()})
        policy = tmp_path / "p.yaml"
        policy.write_text(yaml.safe_dump(maxtext_policy({"fsdp": 4}, devices="gpu")))
        argv = ["plan", str(checkpoint), "--policy", str(policy), "--devices", "gpu=4x1GiB"]
        assert main([*argv, "--json"]) == 0
        rows = {t["name"]: t for t in json.loads(capsys.readouterr().out)["tensors"]}
        wo = rows["small/decoder/layers_0/mlp/wo/kernel"]
        assert wo["axes"] == ["mlp", "embed"]
        assert wo["spec"] == [["fsdp_transpose", "tensor", "autoregressive"], ["fsdp", "sequence"]]


def write_header_only(path: Path, shapes: dict[str, tuple[int, ...]]) -> int:
    """A valid float32 safetensors header, the file truncated (sparse) to its full size."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + offset)
    return os.path.getsize(path)


class TestPolicyForms:
    def test_explain_shows_the_logical_axes_and_the_mesh_spec(self) -> None:
        """Both levels in one line: the spec used and the names it came from."""
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"m": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
                "axis_rules": {"vocab": "tensor", "embed": "fsdp"},
                "rules": [{"match": "emb", "sharding": {"mesh": "m", "axes": ["vocab", "embed"]}}],
            }
        )
        text = str(policy.explain("emb", nbytes=4096, shape=(32, 32)))
        assert "emb (4.0 KiB) -> m[tensor,fsdp] from axes (vocab, embed)" in text

    def test_a_meshs_own_axis_rules_replace_the_policys(self) -> None:
        """`meshes.NAME.axis_rules` wins over the policy's table for rules on that mesh."""
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {
                    "m": {
                        "axes": {"fsdp": 2, "tensor": 2},
                        "devices": "cpu",
                        "axis_rules": [["embed", "tensor"]],
                    }
                },
                "axis_rules": [["embed", "fsdp"]],
                "rules": [{"match": "w", "sharding": {"mesh": "m", "axes": ["embed"]}}],
            }
        )
        assert policy.decide("w", nbytes=32, shape=(8,)).spec == ("tensor",)

    @pytest.mark.parametrize(
        ("document", "message"),
        [
            (
                {"rules": [{"match": "w", "sharding": {"mesh": "m", "axes": ["embed"]}}]},
                r"^<mapping>: rules\[0\]\.sharding\.axes: logical axes \['embed'\] but neither mesh 'm' nor "
                r"the policy has `axis_rules`",
            ),
            (
                {
                    "axis_rules": [["embed", "tesnor"]],
                    "rules": [{"match": "w", "sharding": {"mesh": "m", "axes": ["embed"]}}],
                },
                r"^<mapping>: rules\[0\]\.sharding\.axes\[0\]: logical axis 'embed' resolves by "
                r"axis_rules to mesh axis 'tesnor', which mesh 'm' lacks \(did you mean 'tensor'\?\); "
                r"axes: fsdp, tensor$",
            ),
            (
                {
                    "rules": [
                        {"match": "w", "sharding": {"mesh": "m", "spec": ["fsdp"], "axes": ["e"]}}
                    ]
                },
                r"^<mapping>: rules\[0\]\.sharding: give `spec` \(mesh axes\) or `axes` "
                r"\(logical names, or `attached`\), not both$",
            ),
            (
                {"axis_rules": {"mlp": ["tensor", "fsdp"]}},
                r"^<mapping>: axis_rules: axis_rules as a mapping takes one mesh axis or null per "
                r"logical name, got mlp: \['tensor', 'fsdp'\]; write pairs in order: "
                r"`\[mlp, \[tensor, fsdp\]\]` shards over tensor and fsdp together",
            ),
            (
                {"axis_rules": [["mlp", "tensor", "fsdp"]]},
                r"^<mapping>: axis_rules\[0\]: an axis rule is a pair \[logical name, mesh axes\]",
            ),
            (
                {"rules": [{"match": "w", "sharding": {"mesh": "m", "axes": ["e", "e"]}}]},
                r"^<mapping>: rules\[0\]\.sharding: logical axis 'e' names more than one dimension",
            ),
        ],
        ids=["no-table", "missing-axis", "spec-and-axes", "mapping-list", "triple", "repeat"],
    )
    def test_bad_logical_axes_are_refused_at_load_naming_the_field(
        self, document: dict[str, Any], message: str
    ) -> None:
        """Each mistake is a PolicyError at load naming where it is and what to write."""
        base = {
            "version": 1,
            "meshes": {"m": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
        }
        with pytest.raises(devpolicy.PolicyError, match=message):
            devpolicy.load_policy({**base, **document})

    def test_a_pasted_maxtext_table_loads_from_yaml(self, tmp_path: Path) -> None:
        """MaxText's `logical_axis_rules:` text pasted as written (flow lists, a trailing
        comma, `[]`) under the key `axis_rules:` is a valid policy table."""
        table = MAXTEXT_BASE_YML.split("logical_axis_rules:", 1)[1]
        path = tmp_path / "p.yaml"
        path.write_text(
            "version: 1\n"
            "meshes:\n"
            "  mt: {axes: {data: 1, fsdp: 4, fsdp_transpose: 1, sequence: 1, tensor: 1, "
            "autoregressive: 1}, devices: cpu}\n"
            "rules:\n"
            "  - {match: '*/wo/kernel', sharding: {mesh: mt, axes: [mlp, embed]}}\n"
            f"axis_rules: {table}"
        )
        policy = devpolicy.load_policy(path)
        decision = policy.decide("params/mlp/wo/kernel", nbytes=4 * 64, shape=(8, 8))
        assert decision.spec == (
            ("fsdp_transpose", "tensor", "autoregressive"),
            ("fsdp", "sequence"),
        )
        assert decision.shards == 4
