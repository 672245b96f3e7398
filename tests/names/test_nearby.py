"""The names a rule could have meant: each slip found by rewriting the names and asking
the rule's own test, in order, with the fix to write."""

from __future__ import annotations

import pytest

from devpolicy._names.matching import ShapeTest, compile_condition, search_as_regex
from devpolicy._names.nearby import MetNames, first_word, near_miss


def _facts(*names: str) -> list[tuple[str, None, None, None]]:
    return [(n, None, None, None) for n in names]


@pytest.mark.parametrize(
    ("pattern", "is_regex", "names", "kind", "fix", "hits"),
    [
        (
            "modle/*",
            False,
            ("model/embed", "model/out", "data/x"),
            "typo",
            "did you mean 'model/*'?",
            (0, 1),
        ),
        (
            "model/layrs/*/w",
            False,
            ("model/layers/0/w", "model/layers/1/b"),
            "typo",
            "did you mean 'model/layers/*/w'?",
            (0,),
        ),
        ("bach*", False, ("batch",), "typo", "did you mean 'batch*'?", (0,)),
        (
            "params/dense/kernl",
            False,
            ("params/dense/kernel", "params/dense/bias"),
            "typo",
            "did you mean 'params/dense/kernel'?",
            (0,),
        ),
        (
            "llama/model/layers/*/mlp/up_proj/weight",
            False,
            ("llama/model.layers.0.mlp.up_proj.weight", "llama/lm_head.weight"),
            "separator",
            "the names separate their parts with '.': set the policy's `names: {separator: "
            "'.'}` (or separator='.')",
            (0,),
        ),
        (
            "model/layers/(0|1)/mlp/up_proj/weight",
            True,
            ("llama/model.layers.0.mlp.up_proj.weight",),
            "separator",
            "the names separate their parts with '.' and start with a word the rule does "
            "not: set the policy's `names: {separator: '.', prefix: ''}`",
            (0,),
        ),
        (
            "layers/*/kernel",
            False,
            ("model/layers/0/kernel",),
            "unprefixed",
            "the names start with 'model/', the rule without it: load with prefix='' (or "
            "set the policy's `names: {prefix: ''}`)",
            (0,),
        ),
        (
            "params/*/kernel",
            False,
            ("model/dense/kernel", "model/dense/bias"),
            "prefix",
            "the names start with 'model/', the rule with 'params/': load with "
            "prefix='params' (or set the policy's `names: {prefix: params}`)",
            (0,),
        ),
        (
            "attention/(wq|wk)/kernel",
            True,
            ("params/h/0/attention/wq/kernel",),
            "search",
            "as `search: 'attention/(wq|wk)/kernel'` it would find them (a regex matches "
            "whole names)",
            (0,),
        ),
    ],
)
def test_each_slip_is_found_with_its_fix(
    pattern: str,
    is_regex: bool,
    names: tuple[str, ...],
    kind: str,
    fix: str,
    hits: tuple[int, ...],
) -> None:
    miss = near_miss(compile_condition(pattern, is_regex), _facts(*names))
    assert miss is not None
    assert (miss.kind, miss.fix, miss.indices) == (kind, fix, hits)


def test_a_broad_rule_is_marked_broad() -> None:
    """`params/*` fits any names put under `params`: a guess, marked so."""
    miss = near_miss(compile_condition("params/*", False), _facts("model/w"))
    assert miss is not None
    assert (miss.kind, miss.word, miss.broad) == ("prefix", "params", True)
    narrow = near_miss(compile_condition("params/*/kernel", False), _facts("model/d/kernel"))
    assert narrow is not None
    assert not narrow.broad


def test_the_prefix_slips_rewrite_only_names_no_rule_of_their_own_took() -> None:
    """A name a rule took was meant for that rule: `dataset/*` is no slip for it."""
    facts = _facts("train/tokens")
    assert near_miss(compile_condition("dataset/*", False), MetNames(facts, [False])) is None
    assert near_miss(compile_condition("dataset/*", False), MetNames(facts, [True])) is not None


def test_the_rules_conditions_count_under_a_slip() -> None:
    """A misspelt `max_elements: 1` rule on names without scalars would take nothing even
    spelt right: no slip."""
    facts = [("model/w", 32, (8,), None)]
    assert near_miss(compile_condition("modle/*", False), facts) is not None
    limited = compile_condition("modle/*", False, shape_test=ShapeTest(max_elements=1))
    assert near_miss(limited, facts) is None


def test_a_search_rule_is_tried_as_it_is_matched() -> None:
    condition = compile_condition(search_as_regex("wq/kernel"), True, search="wq/kernel")
    assert near_miss(condition, _facts("params/h/0/attention/wk/kernel")) is None


def test_nothing_close_is_no_slip() -> None:
    assert (
        near_miss(compile_condition("dataset/*", False), MetNames(_facts("model/w"), [False]))
        is None
    )
    assert (
        near_miss(compile_condition("zzz/*", False), MetNames(_facts("model/w"), [False])) is None
    )


def test_first_word() -> None:
    assert [first_word(n) for n in ("a/b/c", "a", "")] == ["a", "a", ""]
