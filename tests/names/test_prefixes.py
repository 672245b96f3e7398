"""The literal-prefix index: candidates for a name, rules that can share names."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._names.matching import compile_condition
from devpolicy._names.prefixes import PrefixIndex, literal_prefix
from tests.strategies import NAMES, PATTERNS, regexes


class TestLiteralPrefix:
    @pytest.mark.parametrize(
        ("pattern", "is_regex", "prefix"),
        [
            ("model/*", False, "model/"),
            ("model/layer?/w", False, "model/layer"),
            ("model/[ab]", False, "model/"),
            ("x", False, "x"),
            ("*", False, ""),
            ("model/.*", True, "model/"),
            (r"model\.w", True, "model.w"),
            (r"model\/w", True, "model/w"),
            ("model/layers?/w", True, "model/layer"),
            ("model/ab*", True, "model/a"),
            ("model/ab+", True, "model/a"),
            ("model/ab{2}", True, "model/a"),
            ("model/(a|b)", True, "model/"),
            ("model/a|data/b", True, ""),
            ("(?i)model/w", True, ""),
            ("(?s).*", True, ""),
            (r"\d+/w", True, ""),
            (r"model\d", True, "model"),
            (r"a\nb", True, "a"),
            ("[|]x", True, ""),
            ("model/[|]", True, "model/"),
        ],
    )
    def test_prefix_is_the_literal_text_every_name_starts_with(
        self, pattern: str, is_regex: bool, prefix: str
    ) -> None:
        """Globs stop at a wildcard; regexes at syntax, a quantified character or `|`."""
        assert literal_prefix(pattern, is_regex) == prefix

    @given(PATTERNS, NAMES)
    def test_every_name_a_pattern_matches_starts_with_its_prefix(
        self, pattern: tuple[str, bool], name: str
    ) -> None:
        """The prefix is never longer than what matching names share."""
        text, is_regex = pattern
        if compile_condition(text, is_regex).test(name):
            assert name.startswith(literal_prefix(text, is_regex))


class TestPrefixIndex:
    def test_candidates_are_in_rule_order(self) -> None:
        """The catch-all, listed last, comes last; unrelated prefixes are left out."""
        index = PrefixIndex(
            [("*", False), ("model/*", False), ("data/*", False), ("model/layer1/*", False)]
        )
        assert index.candidates("model/layer1/w") == [0, 1, 3]
        assert index.candidates("data/x") == [0, 2]
        assert index.candidates("") == [0]

    def test_overlapping_looks_both_ways_and_only_back(self) -> None:
        """Shorter prefixes of this one, and longer ones that extend it, earlier only."""
        index = PrefixIndex(
            [("abc*", False), ("a*", False), ("x*", False), ("ab[c]", False), ("abcd", False)]
        )
        assert index.overlapping(3) == [0, 1]  # 'abc' extends 'ab'; 'a' starts it
        assert index.overlapping(0) == []
        assert index.overlapping(4) == [0, 1, 3]

    @pytest.mark.slow
    @settings(max_examples=150)
    @given(st.lists(PATTERNS, min_size=1, max_size=8), NAMES)
    def test_every_pattern_matching_a_name_is_a_candidate(
        self, patterns: list[tuple[str, bool]], name: str
    ) -> None:
        """Candidates are a superset of the matches, so the caller may test only them."""
        index = PrefixIndex(patterns)
        matches = [i for i, (p, r) in enumerate(patterns) if compile_condition(p, r).test(name)]
        candidates = index.candidates(name)
        assert set(matches) <= set(candidates)
        assert candidates == sorted(candidates)

    @pytest.mark.slow
    @settings(max_examples=150)
    @given(st.lists(PATTERNS, min_size=2, max_size=8), NAMES)
    def test_rules_sharing_a_name_overlap(
        self, patterns: list[tuple[str, bool]], name: str
    ) -> None:
        """Two rules that both match some name are listed by overlapping (later to earlier)."""
        index = PrefixIndex(patterns)
        matching = [i for i, (p, r) in enumerate(patterns) if compile_condition(p, r).test(name)]
        for n, j in enumerate(matching):
            assert set(matching[:n]) <= set(index.overlapping(j))

    def test_an_index_of_reversed_suffixes_relates_ends(self) -> None:
        """Built from texts as they are, e.g. reversed literal suffixes of `*/w`, `*x/w`, `*/b`."""
        index = PrefixIndex.of_texts(["w/", "w/x", "b/"])
        assert index.overlapping(1) == [0]
        assert index.overlapping(2) == []

    def test_a_lookup_touches_only_the_path_of_the_name(self) -> None:
        """10,000 rules with distinct prefixes: a name meets only its own and the catch-all."""
        patterns = [(f"model/layer{i}/*", False) for i in range(10_000)] + [("*", False)]
        index = PrefixIndex(patterns)
        assert index.candidates("model/layer123/w") == [123, 10_000]
        assert index.overlapping(10_000) == list(range(10_000))  # a catch-all meets all
        assert index.overlapping(123) == []


@given(regexes())
def test_generated_regexes_compile(pattern: str) -> None:
    """The regex strategy yields valid regexes (so the properties above test something)."""
    assert re.compile(pattern)
