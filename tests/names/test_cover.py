"""Deciding whether one pattern's names include another's: exact, or undecided."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._names.cover import CoverJudge, UndecidedError
from devpolicy._names.hints import required_literal
from devpolicy._names.matching import compile_condition
from tests.strategies import PATTERNS, names_matching

GLOB, REGEX = False, True


class TestDecided:
    @pytest.mark.parametrize(
        ("earlier", "later"),
        [
            (("model/.*", REGEX), ("model/layer1", GLOB)),
            (("model/.*", REGEX), ("model/layer[0-9]+", REGEX)),
            (("model/(w|b)", REGEX), ("model/[wb]", GLOB)),
            (("model/*", GLOB), ("model/(w|b)", REGEX)),
            (("*/w", GLOB), ("model/*/w", GLOB)),
            (("(?s).*", REGEX), ("*", GLOB)),
            (("model/layer\\d+/w", REGEX), ("model/layer[0-9]/w", GLOB)),
            (("a\\sb", REGEX), ("a\\vb", REGEX)),  # the dialect's \s holds \v (RE2's does not)
            (("[.-/]x", GLOB), ("/x", GLOB)),
        ],
    )
    def test_covers(self, earlier: tuple[str, bool], later: tuple[str, bool]) -> None:
        """Every name the later pattern matches, the earlier one matches too."""
        assert CoverJudge().covers(earlier, later) is True

    @pytest.mark.parametrize(
        ("earlier", "later", "witness"),
        [
            (("model/.*", REGEX), ("model/*", GLOB), "model/\n"),  # `.` stops at newlines
            # Rules read \d in ASCII mode: [0-9], so only the 9 tells these apart.
            (("model/[0-8]", REGEX), ("model/\\d", REGEX), "model/9"),
            (("model/*", GLOB), ("model/?|data/x", REGEX), "model"),  # `/` is optional
            (("[.-/]x", GLOB), ("?x", GLOB), "\x00x"),
            (("a{3}", REGEX), ("a+", REGEX), "a"),
        ],
    )
    def test_a_shortest_counterexample_shows_why_not(
        self, earlier: tuple[str, bool], later: tuple[str, bool], witness: str
    ) -> None:
        """Not covered: the decider names a shortest name only the later pattern matches."""
        assert CoverJudge().counterexample(earlier, later) == witness


class TestUndecided:
    @pytest.mark.parametrize(
        "pattern",
        [
            r"\w+",  # Unicode in Python, ASCII in interegular
            "[\\d_]+",  # a Unicode class inside a class
            "(?i)model/.*",
            "(?=m)model/.*",
            "[]a]+",  # `]` first is a member in Python
            "a{}",  # literal braces
            "^model/.*$",
            "(a)\\1",
            "a*+",
            "[a-\U0010ffff]",  # a range too wide to list
            "a{5000}",  # an automaton past the state limit
        ],
    )
    def test_syntax_not_modelled_exactly_is_undecided(self, pattern: str) -> None:
        """Python-only features and oversize patterns give None, never a guess."""
        decider = CoverJudge()
        assert decider.covers((pattern, REGEX), ("x", GLOB)) is None
        assert decider.covers(("*", GLOB), (pattern, REGEX)) is None

    def test_a_state_explosion_stops_at_the_pair_budget(self) -> None:
        """(a|b)*a(a|b){14} has 2**15 states; the check gives up instead of building them."""
        with pytest.raises(UndecidedError, match="too many states"):
            CoverJudge().counterexample(("(a|b)*", REGEX), ("(a|b)*a(a|b){14}", REGEX))

    def test_the_shared_budget_ends_all_checks(self) -> None:
        """Once the budget for a whole lint is spent, further checks are undecided."""
        decider = CoverJudge(budget=3)
        assert decider.covers(("model/.*", REGEX), ("model/layer1", GLOB)) is None
        assert decider.covers(("x", GLOB), ("x", GLOB)) is None


def _matches(pattern: tuple[str, bool], name: str) -> bool:
    return bool(compile_condition(*pattern).test(name))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(PATTERNS, PATTERNS, st.data())
def test_decisions_agree_with_pythons_matching(
    earlier: tuple[str, bool], later: tuple[str, bool], data: st.DataObject
) -> None:
    """A counterexample matches only the later pattern; a cover holds for sampled names."""
    try:
        witness = CoverJudge().counterexample(earlier, later)
    except UndecidedError:
        return
    if witness is not None:
        assert _matches(later, witness)
        assert not _matches(earlier, witness)
        return
    for name in data.draw(st.lists(names_matching(*later), max_size=10)):
        # Names are drawn by Python's semantics (Unicode \s); rules match in ASCII mode.
        if _matches(later, name):
            assert _matches(earlier, name), f"{earlier} said to cover {later}, misses {name!r}"


class TestLintHelpers:
    """What lint asks of every rule before comparing automata: sound, or the filter loses findings."""

    @pytest.mark.slow
    @settings(max_examples=200, deadline=None)
    @given(PATTERNS, st.data())
    def test_the_required_literal_is_in_every_name_matched(
        self, pattern: tuple[str, bool], data: st.DataObject
    ) -> None:
        """`required_literal` never names text a matched name lacks."""
        literal = required_literal(*pattern)
        test = compile_condition(*pattern).test
        for name in data.draw(st.lists(names_matching(*pattern), min_size=1, max_size=10)):
            if test(name):
                assert literal in name, f"{pattern}: {literal!r} not in {name!r}"

    @pytest.mark.slow
    @settings(max_examples=200, deadline=None)
    @given(PATTERNS)
    def test_an_example_is_a_name_the_rule_matches(self, pattern: tuple[str, bool]) -> None:
        """The exact example always matches; a guess, when it matches, is used (else not)."""
        test = compile_condition(*pattern).test
        example = CoverJudge().example(pattern)
        if example is not None:
            assert test(example), example

    @pytest.mark.parametrize(
        ("pattern", "literal"),
        [
            (("[a-z]+/layer12/(w|b)", REGEX), "/layer12/"),
            ((".*/layer3/w", REGEX), "/layer3/w"),
            (("(model|opt)/layer7/w", REGEX), "/layer7/w"),
            (("a|bcd", REGEX), ""),
            (("ab?c", REGEX), "a"),
            (("(?:a){0,2}bc", REGEX), "bc"),
            (("(?i)model", REGEX), ""),
            ((r"\x41bc", REGEX), ""),
            (("a[bc]d", GLOB), "a"),
            (("*/layer3/*", GLOB), "/layer3/"),
            (("model/layer_0123456789/w", GLOB), "model/layer_"),
        ],
    )
    def test_required_literals(self, pattern: tuple[str, bool], literal: str) -> None:
        """The longest run of fixed characters, cut at 12; none where it could mislead."""
        assert required_literal(*pattern) == literal
