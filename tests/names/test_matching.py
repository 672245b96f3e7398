"""Matching: ordered rules, first match wins, globs as fnmatchcase, regexes as full matches."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devpolicy._names.matching import Matcher, compile_condition
from tests.helpers import within


def matcher(*patterns: str | tuple[str, int | None, int | None]) -> Matcher:
    conditions = []
    for p in patterns:
        if isinstance(p, tuple):
            conditions.append(compile_condition(p[0], False, p[1], p[2]))
        elif p.startswith("re:"):
            conditions.append(compile_condition(p[3:], True))
        else:
            conditions.append(compile_condition(p, False))
    return Matcher(conditions)


class TestFirstMatch:
    @pytest.mark.parametrize(
        ("name", "expected"),
        [
            ("dataset/train", 0),
            ("dataset/train/tokens", 0),  # `*` crosses `/`, as in fnmatch
            ("Dataset/train", 2),  # case-sensitive
            ("model/w", 1),
            ("model/layer0/w", 2),
            ("other", 2),
        ],
    )
    def test_first_matching_rule_wins(self, name: str, expected: int) -> None:
        """Rules are tried in order; the first whose pattern matches decides."""
        assert matcher("dataset/*", "re:model/[a-z]+", "*").first(name, None) == expected

    def test_regex_must_match_the_whole_name(self) -> None:
        """`regex` is a full match, not a search."""
        m = matcher("re:w")
        assert m.first("w", None) == 0
        assert m.first("layer/w", None) is None

    def test_size_conditions_need_a_known_size(self) -> None:
        """Without a size a sized rule never matches; with one its bounds are inclusive."""
        m = matcher(("*", 100, 200), "*")
        assert m.first("x", None) == 1
        assert [m.first("x", n) for n in (99, 100, 200, 201)] == [1, 0, 0, 1]

    def test_no_match_is_none(self) -> None:
        """A name no rule matches gives None (the policy's default applies)."""
        assert matcher("a/*").first("b", None) is None

    def test_trace_explains_each_rule_until_the_match(self) -> None:
        """The trace says why each earlier rule did not match and stops at the winner."""
        steps = matcher("a/*", ("*", 1000, None), "*", "never").trace("b", 10)
        assert [(s.rule, s.matched, s.reason) for s in steps] == [
            (0, False, "glob 'a/*' does not match"),
            (1, False, "glob '*' matches but 10 B < min_bytes 1000 B"),
            (2, True, "glob '*' matches"),
        ]


names = st.text(alphabet="ab/_.-0", max_size=10)
globs = st.text(alphabet="ab/*?[]!0", max_size=6)


class TestAgainstFnmatch:
    @given(globs, names)
    def test_globs_agree_with_fnmatchcase(self, pattern: str, name: str) -> None:
        """A glob rule matches exactly the names `fnmatch.fnmatchcase` matches."""
        m = matcher(pattern) if pattern else None
        if m is None:
            return
        assert (m.first(name, None) == 0) == fnmatch.fnmatchcase(name, pattern)

    @given(st.lists(globs.filter(bool), min_size=1, max_size=5), names)
    def test_first_is_the_lowest_index_that_matches(self, patterns: list[str], name: str) -> None:
        """first() equals the index of the first pattern fnmatchcase accepts."""
        expected = next((i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(name, p)), None)
        assert matcher(*patterns).first(name, None) == expected


class TestRegexesRunInLinearTime:
    @pytest.mark.parametrize(
        "pattern",
        ["(a+)+$", "(a|a)*", "(a|aa)+", "(.*a){12}", "(\\w+\\s?)+$", "^(([a-z])+.)+[A-Z]([a-z])+$"],
    )
    def test_catastrophic_patterns_answer_at_once(self, pattern: str) -> None:
        """Patterns that backtrack exponentially in Python's `re` return at once on long names.

        With `re`, "(a+)+$" against 27 `a`s and a `b` took 2.8 s and grew 16x per 4 more
        characters; here a name of 100,000 characters is answered (the limit guards the
        hang; it measures nothing).
        """
        test = compile_condition(pattern, True).test
        for name in ["a" * 27 + "b", "a" * 100_000 + "!", "aaaa aaaa " * 5_000 + "!"]:
            within(30, lambda name=name: test(name))

    @pytest.mark.parametrize(
        ("pattern", "name", "expected"),
        [
            ("model/.*", "model/w", True),
            ("model/.*", "xmodel/w", False),
            ("a|ab", "ab", True),  # full match, not "first alternative then anchor"
            ("(?P<n>layer)[0-9]+", "layer12", True),
            ("(?i)DATA/.*", "data/x", True),
            ("é+", "éé", True),
            ("a$", "a", True),
        ],
    )
    def test_rules_still_match_the_whole_name(
        self, pattern: str, name: str, expected: bool
    ) -> None:
        """RE2 keeps full-match semantics and Python's syntax for what both support."""
        assert bool(compile_condition(pattern, True).test(name)) is expected

    def test_unsupported_features_are_named(self) -> None:
        """A backreference is refused with what RE2 lacks, not silently changed."""
        with pytest.raises(
            ValueError, match=r"unsupported regular expression '\(a\)\\\\1'.*no backreferences"
        ):
            compile_condition("(a)\\1", True)

    def test_patterns_python_cannot_parse_are_value_errors(self) -> None:
        """a{4294967296} (OverflowError in `re`) and 1,000 nested groups are ValueErrors."""
        with pytest.raises(ValueError, match=r"repeat count is too large"):
            compile_condition("a{4294967296}", True)
        with pytest.raises(ValueError, match=r"regular expression"):
            compile_condition("(" * 1000 + "a" + ")" * 1000, True)
