"""Rules in the model's vocabulary: leaf names as frameworks print them, checkpoint names
in the model's terms, `search:` patterns, rank and element conditions, and EasyLM's table
pasted as written."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as PS  # noqa: N817 (as EasyLM writes it)

import devpolicy
from devpolicy._apply.leaves import leaf_names
from devpolicy._names.matching import compile_regex, compile_search, search_as_regex
from tests.helpers import policy_of

# --- Stand-ins registered as the frameworks register their classes (neither installed) ---


class Variable:
    """flax.nnx.Variable: a pytree per subclass, one child under GetAttrKey('value')."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __init_subclass__(cls) -> None:
        jax.tree_util.register_pytree_with_keys(
            cls,
            lambda v: (((jax.tree_util.GetAttrKey("value"), v.value),), None),
            lambda _, children: cls(children[0]),
            flatten_func=lambda v: ((v.value,), None),
        )


class Param(Variable):
    pass


class AxisMetadata:
    """flax.core.meta.AxisMetadata, the base of linen's boxes."""


class Partitioned(AxisMetadata):
    """flax.core.meta.Partitioned: a struct dataclass, `value` a child, `names` metadata."""

    def __init__(self, value: Any, names: tuple[str | None, ...]) -> None:
        self.value, self.names = value, names


jax.tree_util.register_pytree_with_keys(
    Partitioned,
    lambda p: (((jax.tree_util.GetAttrKey("value"), p.value),), p.names),
    lambda names, children: Partitioned(children[0], names),
)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class NamedArray:
    """haliax.NamedArray: register_pytree_node_class, one child, so its key is flat index 0."""

    array: Any
    axes: tuple[str, ...]

    def tree_flatten(self) -> tuple[tuple[Any], tuple[str, ...]]:
        return (self.array,), self.axes

    @classmethod
    def tree_unflatten(cls, axes: tuple[str, ...], children: Any) -> NamedArray:
        return cls(children[0], axes)


class Linear:
    """An equinox Module: fields as GetAttrKey children; not a box, so its fields are named."""

    def __init__(self, weight: Any, bias: Any) -> None:
        self.weight, self.bias = weight, bias


jax.tree_util.register_pytree_with_keys(
    Linear,
    lambda m: (
        (
            (jax.tree_util.GetAttrKey("weight"), m.weight),
            (jax.tree_util.GetAttrKey("bias"), m.bias),
        ),
        None,
    ),
    lambda _, children: Linear(*children),
)

for cls, module in (
    (Variable, "flax.nnx.variablelib"),
    (Param, "flax.nnx.variablelib"),
    (AxisMetadata, "flax.core.meta"),
    (Partitioned, "flax.core.meta"),
    (NamedArray, "haliax.core"),
    (Linear, "equinox._module"),
):
    cls.__module__ = module


class TestLeafNames:
    """`put` names each leaf as the framework prints the tree."""

    @pytest.mark.parametrize(
        ("tree", "expected"),
        [
            (
                {"params": {"Dense_0": {"kernel": Partitioned(np.zeros(2), ("embed",))}}},
                ["m/params/Dense_0/kernel"],
            ),
            (
                {"layers": {0: {"linear": {"kernel": Param(np.zeros(2))}}}},
                ["m/layers/0/linear/kernel"],
            ),
            ({"lm_head": {"weight": NamedArray(np.zeros(2), ("vocab",))}}, ["m/lm_head/weight"]),
            (
                {"layers": [Linear(np.zeros(2), np.zeros(1))]},
                ["m/layers/0/weight", "m/layers/0/bias"],
            ),
            (Param(np.zeros(2)), ["m"]),
            ({"w": Partitioned(NamedArray(np.zeros(2), ("a",)), ("a",))}, ["m/w"]),
            ({"w": Param({"a": np.zeros(1), "b": np.zeros(1)})}, ["m/w/a", "m/w/b"]),
        ],
        ids=[
            "linen-boxed",
            "nnx-state",
            "haliax",
            "equinox",
            "box-alone",
            "nested-boxes",
            "box-of-dict",
        ],
    )
    def test_boxes_are_not_part_of_a_name(self, tree: Any, expected: list[str]) -> None:
        """No `/value` for flax and nnx boxes, no `/0` for haliax; equinox fields and nnx
        integer keys as they print."""
        assert leaf_names("m", tree) == expected
        assert len(expected) == len(jax.tree_util.tree_leaves(tree))

    def test_put_places_a_boxed_leaf_by_the_name_users_see(self, cpus: list[jax.Device]) -> None:
        """A rule written with the printed name takes the leaf; the boxes come back."""
        policy = policy_of(
            default="cpu:0",
            rules=[
                {"match": "model/layers/0/kernel", "device": "cpu:1"},
                {"match": "model/lm_head/weight", "device": "cpu:2"},
            ],
        )
        tree = {
            "layers": {0: {"kernel": Param(np.ones(3, np.float32))}},
            "lm_head": {"weight": NamedArray(np.ones(4, np.float32), ("vocab",))},
        }
        out = policy.put("model", tree)
        assert isinstance(out["layers"][0]["kernel"], Param)
        assert out["layers"][0]["kernel"].value.devices() == {cpus[1]}
        assert isinstance(out["lm_head"]["weight"], NamedArray)
        assert out["lm_head"]["weight"].array.devices() == {cpus[2]}

    def test_a_class_named_like_a_box_elsewhere_is_not_unwrapped(self) -> None:
        """Only flax's and haliax's classes are boxes: a user's `Variable` keeps its key."""

        class Mine:
            def __init__(self, value: Any) -> None:
                self.value = value

        Mine.__name__ = "Variable"
        jax.tree_util.register_pytree_with_keys(
            Mine,
            lambda v: (((jax.tree_util.GetAttrKey("value"), v.value),), None),
            lambda _, c: Mine(c[0]),
        )
        assert leaf_names("m", {"w": Mine(np.zeros(1))}) == ["m/w/value"]

    @settings(max_examples=60, deadline=None)
    @given(
        st.recursive(
            st.just(0),
            lambda inner: (
                st.dictionaries(st.sampled_from(["a", "b", "w", "1"]), inner, min_size=1)
                | st.lists(inner, min_size=1, max_size=3)
            ),
            max_leaves=12,
        ),
        st.data(),
    )
    def test_boxing_leaves_never_changes_names(self, shape: Any, data: st.DataObject) -> None:
        """Any leaves wrapped in any boxes: the same names as the plain tree, which are
        the `/`-joined paths JAX gives."""
        plain = jax.tree_util.tree_map(lambda _: np.zeros(1), shape)
        boxes = [Param, lambda x: Partitioned(x, ("a",)), lambda x: NamedArray(x, ("a",))]
        boxed = jax.tree_util.tree_map(
            lambda x: data.draw(st.sampled_from([*boxes, lambda y: y]))(x), plain
        )
        expected = [
            "n/" + jax.tree_util.keystr(p, simple=True, separator="/") if p else "n"
            for p, _ in jax.tree_util.tree_flatten_with_path(plain)[0]
        ]
        assert leaf_names("n", plain) == expected
        assert leaf_names("n", boxed) == expected


def _hf_checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "llama-tiny"
    folder.mkdir()
    devpolicy.save_file(
        {
            "model.layers.0.mlp.up_proj.weight": np.ones((8, 4), np.float32),
            "model.norm.weight": np.ones(4, np.float32),
        },
        folder / "model.safetensors",
    )
    return folder


class TestCheckpointNames:
    """`names:` reads a checkpoint's keys in the model's terms."""

    def test_a_dotted_checkpoint_matches_a_slashed_rule(
        self, tmp_path: Path, cpus: list[jax.Device]
    ) -> None:
        """`names.separator: .`: `model.layers.0.mlp.up_proj.weight` is matched as
        `llama-tiny/model/layers/0/mlp/up_proj/weight`; the keys loaded keep their form."""
        policy = policy_of(
            names={"separator": "."},
            default="cpu:0",
            rules=[{"match": "*/model/layers/*/mlp/up_proj/weight", "device": "cpu:3"}],
        )
        out = policy.load_file(_hf_checkpoint(tmp_path))
        assert out["model.layers.0.mlp.up_proj.weight"].devices() == {cpus[3]}
        assert out["model.norm.weight"].devices() == {cpus[0]}
        names = [t.name for t in policy.plan(tmp_path / "llama-tiny").tensors]
        assert names == [
            "llama-tiny/model/layers/0/mlp/up_proj/weight",
            "llama-tiny/model/norm/weight",
        ]

    def test_the_policy_prefix_replaces_the_folder_and_the_call_prefix_wins(
        self, tmp_path: Path
    ) -> None:
        """`names.prefix: params` names tensors `params/...`; `prefix=` beats it."""
        path = _hf_checkpoint(tmp_path)
        policy = policy_of(names={"separator": ".", "prefix": "params"})
        assert policy.plan(path).tensors[1].name == "params/model/norm/weight"
        assert policy.plan(path, prefix="").tensors[1].name == "model/norm/weight"
        assert policy_of(names={"prefix": ""}).plan(path).tensors[1].name == "model.norm.weight"

    @pytest.mark.parametrize(
        ("names", "message"),
        [
            ({"separator": "ab"}, r"names\.separator: a separator is one character .*got 'ab'"),
            ({"separator": "*"}, r"names\.separator: .*not a glob character.*got '\*'"),
            ({"prefix": "/x"}, r"names\.prefix: a prefix has no leading or trailing '/'"),
            ({"sep": "."}, r"names\.sep: "),
        ],
    )
    def test_bad_names_settings_are_errors_naming_the_field(
        self, names: dict[str, str], message: str
    ) -> None:
        with pytest.raises(devpolicy.PolicyError, match=message):
            policy_of(names=names)


class TestSearchPatterns:
    """`search:` finds its pattern anywhere in a name, as `re.search` does."""

    @pytest.mark.parametrize(
        ("pattern", "name", "found"),
        [
            ("attention/(wq|wk|wv)/kernel", "params/transformer/h/0/attention/wq/kernel", True),
            ("attention/(wq|wk|wv)/kernel", "params/transformer/h/0/attention/wo/kernel", False),
            ("^transformer/", "transformer/wte/embedding", True),
            ("^transformer/", "params/transformer/wte/embedding", False),
            ("kernel$", "params/lm_head/kernel", True),
            ("kernel$", "params/lm_head/kernel/mu", False),
            ("(?i)LM_HEAD", "params/lm_head/kernel", True),
            (".*", "", True),
        ],
    )
    def test_search_finds_what_re_search_finds(self, pattern: str, name: str, found: bool) -> None:
        policy = policy_of(default="cpu:0", rules=[{"search": pattern, "device": "cpu:1"}])
        assert (policy.decide(name).device_text == "cpu:1") is found
        assert (re.search(pattern, name) is not None) is found

    @pytest.mark.slow
    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.sampled_from(["a", "b", "/", ".", ".*", "^", "$", "(a|b)", "[ab]+", "b?", "\\."]),
            min_size=1,
            max_size=6,
        ).map("".join),
        st.text(alphabet="ab/.\n", max_size=8),
    )
    def test_search_and_its_full_match_form_agree_with_re_search(
        self, pattern: str, name: str
    ) -> None:
        """For any pattern and name: `search:`'s RE2 matcher, its full-match form (what the
        prefix index and lint see) and Python's `re.search` agree."""
        # RE2's `$` matches only at the very end; Python's also before a final newline.
        assume(not name.endswith("\n"))
        try:
            re.compile(pattern)
        except re.error:
            return
        expected = re.search(pattern, name) is not None
        assert (compile_search(pattern)(name) is not None) is expected
        assert (compile_regex(search_as_regex(pattern))(name) is not None) is expected

    def test_a_search_with_a_pathological_pattern_runs_in_linear_time(self) -> None:
        """RE2: `(a+)+$` over a long name returns (Python's `re` would take years)."""
        assert compile_search("(a+)+$")("a" * 50_000 + "b") is None

    @pytest.mark.parametrize(
        ("rule", "message"),
        [
            ({"search": "(a"}, r"rules\[0\]\.search: invalid regular expression '\(a'"),
            (
                {"search": "(a)\\1"},
                r"rules\[0\]\.search: unsupported regular expression '\(a\)\\\\1'",
            ),
            ({"search": ""}, r"rules\[0\]\.search: an empty search pattern is found in every name"),
            (
                {"search": "a", "regex": "b"},
                r"rules\[0\]: give exactly one of .* not `regex` and `search`",
            ),
        ],
    )
    def test_bad_search_rules_are_errors_naming_the_field(
        self, rule: dict[str, str], message: str
    ) -> None:
        with pytest.raises(devpolicy.PolicyError, match=message):
            policy_of(rules=[{**rule, "device": "cpu"}])

    def test_explain_shows_the_pattern_as_written(self) -> None:
        policy = policy_of(rules=[{"search": "wo/kernel", "device": "cpu:1"}])
        text = str(policy.explain("params/h/0/attention/wo/kernel"))
        assert "search 'wo/kernel' matches" in text
        assert "(?s:" not in text


class TestRankAndElementConditions:
    """`ndim`, `min_elements`, `max_elements` apply where the shape is known."""

    @pytest.mark.parametrize(
        ("rule", "shape", "taken"),
        [
            ({"ndim": 0}, (), True),
            ({"ndim": 0}, (1,), False),
            ({"ndim": [1, 2]}, (3, 4), True),
            ({"ndim": [1, 2]}, (2, 3, 4), False),
            ({"max_elements": 1}, (1, 1), True),
            ({"max_elements": 1}, (2,), False),
            ({"min_elements": 12}, (3, 4), True),
            ({"min_elements": 13}, (3, 4), False),
            ({"ndim": 2, "min_elements": 10, "max_elements": 12}, (3, 4), True),
        ],
    )
    def test_conditions_on_a_known_shape(
        self, rule: dict[str, object], shape: tuple[int, ...], taken: bool
    ) -> None:
        policy = policy_of(default="cpu:0", rules=[{"match": "*", **rule, "device": "cpu:1"}])
        assert (policy.decide("x", shape=shape).device_text == "cpu:1") is taken

    def test_an_unknown_shape_passes_the_rule_by(self) -> None:
        """Without a shape the rule cannot be judged: the next rule decides, and explain says why."""
        policy = policy_of(default="cpu:0", rules=[{"match": "*", "ndim": 0, "device": "cpu:1"}])
        assert policy.decide("x").device_text == "cpu:0"
        assert "shape unknown, and the rule has a rank or element condition" in str(
            policy.explain("x")
        )
        assert "ndim 1 is not 0" in str(policy.explain("x", shape=(3,)))

    def test_put_judges_each_leaf_by_its_shape(self, cpus: list[jax.Device]) -> None:
        """Scalars replicate first, as EasyLM's and eformer's tables do: here, to cpu:1."""
        policy = policy_of(
            default="cpu:0", rules=[{"match": "*", "max_elements": 1, "device": "cpu:1"}]
        )
        out = policy.put("state", {"step": np.int32(3), "w": np.ones((2, 2), np.float32)})
        assert out["step"].devices() == {cpus[1]}
        assert out["w"].devices() == {cpus[0]}

    @pytest.mark.parametrize(
        ("rule", "message"),
        [
            ({"ndim": -1}, r"rules\[0\]\.ndim: ndim is a rank .*got -1"),
            ({"ndim": [1, 1]}, r"rules\[0\]\.ndim: a rank is listed more than once"),
            ({"ndim": True}, r"rules\[0\]\.ndim: ndim is a rank .*got True"),
            ({"max_elements": -2}, r"rules\[0\]\.max_elements: an element count is a whole number"),
            (
                {"min_elements": 5, "max_elements": 2},
                r"min_elements \(5\) is larger than max_elements \(2\)",
            ),
        ],
    )
    def test_bad_conditions_are_errors_naming_the_field(
        self, rule: dict[str, object], message: str
    ) -> None:
        with pytest.raises(devpolicy.PolicyError, match=message):
            policy_of(rules=[{"match": "*", **rule, "device": "cpu"}])


# --- EasyLM's LLaMA table (EasyLM/models/llama/llama_model.py, get_partition_rules) ---

EASYLM_LLAMA_RULES = [
    ("transformer/wte/embedding", PS(("mp1", "mp2"), None)),
    ("attention/(wq|wk|wv)/kernel", PS(None, ("mp1", "mp2"))),
    ("attention/wo/kernel", PS(("mp1", "mp2"), None)),
    ("feed_forward/w1/kernel", PS(None, ("mp1", "mp2"))),
    ("feed_forward/w2/kernel", PS(("mp1", "mp2"), None)),
    ("feed_forward/w3/kernel", PS(None, ("mp1", "mp2"))),
    ("attention_norm/kernel", PS(None)),
    ("ffn_norm/kernel", PS(None)),
    ("transformer/ln_f/kernel", PS(None)),
    ("lm_head/kernel", PS(None, ("mp1", "mp2"))),
    (".*", PS(None)),
]


def _easylm_spec(name: str, leaf: Any) -> PS:
    """EasyLM's `match_partition_rules` (EasyLM/jax_utils.py): scalars replicated, then
    the first rule `re.search` finds in the `/`-joined path."""
    if len(np.shape(leaf)) == 0 or np.prod(np.shape(leaf)) == 1:
        return PS()
    for rule, spec in EASYLM_LLAMA_RULES:
        if re.search(rule, name) is not None:
            return spec
    raise ValueError(f"Partition rule not found for param: {name}")


def _llama_state(vocab: int = 32, hidden: int = 8, inter: int = 16, layers: int = 2) -> Any:
    """A LLaMA train state as EasyLM's flax linen model names it (small config)."""

    def z(*shape: int) -> np.ndarray[Any, Any]:
        return np.zeros(shape, np.float32)

    block = lambda: {  # noqa: E731
        "attention": {w: {"kernel": z(hidden, hidden)} for w in ("wq", "wk", "wv", "wo")},
        "feed_forward": {
            "w1": {"kernel": z(hidden, inter)},
            "w2": {"kernel": z(inter, hidden)},
            "w3": {"kernel": z(hidden, inter)},
        },
        "attention_norm": {"kernel": z(hidden)},
        "ffn_norm": {"kernel": z(hidden)},
    }
    params = {
        "transformer": {
            "wte": {"embedding": z(vocab, hidden)},
            "h": {str(i): block() for i in range(layers)},
            "ln_f": {"kernel": z(hidden)},
        },
        "lm_head": {"kernel": z(hidden, vocab)},
    }
    return {"params": params, "step": np.zeros((), np.int32)}


def _as_rule(pattern: str, spec: PS) -> dict[str, object]:
    entries = [list(e) if isinstance(e, tuple) else e for e in spec]
    return {"search": pattern, "sharding": {"mesh": "easylm", "spec": entries}}


def _normal(spec: Any) -> tuple[Any, ...]:
    entries = [tuple(e) if isinstance(e, list | tuple) else e for e in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


class TestEasyLMTable:
    """EasyLM's LLaMA table, pasted as written under `search:`, shards exactly as EasyLM."""

    def test_every_parameter_gets_easylms_spec(self) -> None:
        policy = policy_of(
            meshes={"easylm": {"axes": {"dp": 1, "mp1": 2, "mp2": 2}, "devices": "cpu"}},
            rules=[
                # EasyLM's matcher replicates scalars and one-element arrays first.
                {"match": "*", "max_elements": 1, "sharding": {"mesh": "easylm", "spec": []}},
                *(_as_rule(p, s) for p, s in EASYLM_LLAMA_RULES),
            ],
        )
        state = _llama_state()
        theirs = jax.tree_util.tree_flatten_with_path(state)[0]
        placed = jax.tree_util.tree_leaves(policy.put("train_state", state))
        assert len(placed) == len(theirs) == 2 * 9 + 4  # 9 per layer; wte, ln_f, head, step
        for (path, leaf), array in zip(theirs, placed, strict=True):
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            expected = _normal(_easylm_spec(name, leaf))
            decided = policy.decide(f"train_state/{name}", nbytes=leaf.nbytes, shape=leaf.shape)
            assert _normal(decided.spec or ()) == expected, name
            assert _normal(array.sharding.spec) == expected, name

    def test_as_regex_the_table_shards_nothing_and_lint_says_why(self) -> None:
        """The same table under `regex:` matches whole names only: everything but the
        catch-all is passed by, and lint names each rule that reads like a fragment."""
        rules = [
            {"regex": p, "sharding": _as_rule(p, s)["sharding"]} for p, s in EASYLM_LLAMA_RULES
        ]
        policy = policy_of(
            meshes={"easylm": {"axes": {"dp": 1, "mp1": 2, "mp2": 2}, "devices": "cpu"}},
            rules=rules,
        )
        decided = policy.decide(
            "train_state/params/transformer/h/0/attention/wq/kernel", shape=(8, 8)
        )
        assert decided.origin.endswith("rules[10]")
        fragments = [f for f in devpolicy.lint(policy) if f.code == "regex-is-a-fragment"]
        assert len(fragments) == 10
        assert "write `search: 'attention/(wq|wk|wv)/kernel'`" in fragments[1].message


def test_the_docs_easylm_policy_is_the_one_tested() -> None:
    """The docs' "Porting rules from other systems" page shows the table this file checks."""
    import yaml

    from tests.conftest import REPO

    section = (REPO / "docs" / "porting.md").read_text(encoding="utf-8")
    assert section.startswith("# Porting rules from other systems")
    block = section[section.index("```yaml\nversion: 1") + len("```yaml\n") :]
    document = yaml.safe_load(block[: block.index("```")])
    assert document["rules"][0] == {
        "match": "*",
        "max_elements": 1,
        "sharding": {"mesh": "easylm", "spec": []},
    }
    assert document["rules"][1:] == [_as_rule(p, s) for p, s in EASYLM_LLAMA_RULES]
    assert document["meshes"]["easylm"]["axes"] == {"dp": 1, "mp1": 2, "mp2": 2}
    assert (
        devpolicy.load_policy(document, environ={}).rules[1].spec.search == EASYLM_LLAMA_RULES[0][0]
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet="abz019_-", min_size=1, max_size=5), min_size=1, max_size=6),
    st.sampled_from([".", ":", "|"]),
    st.sampled_from(["", "ckpt", "a/b"]),
)
def test_a_separated_key_is_named_as_its_slashed_path(
    parts: list[str], separator: str, prefix: str
) -> None:
    """Any key of parts joined by the policy's separator is matched as the same parts
    joined by `/`, after the prefix; the default `/` leaves keys as they are."""
    from types import SimpleNamespace

    from devpolicy._document.schema import NamesSpec
    from devpolicy._io.reading.naming import tensor_names as _names

    header: Any = SimpleNamespace(tensors=[SimpleNamespace(key=separator.join(parts))])
    slashed = "/".join(parts)
    expected = f"{prefix}/{slashed}" if prefix else slashed
    assert _names(header, prefix, NamesSpec(separator=separator)) == [expected]
    plain = _names(header, prefix, NamesSpec())
    assert plain == [f"{prefix}/{separator.join(parts)}" if prefix else separator.join(parts)]
