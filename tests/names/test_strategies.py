"""The test strategies themselves: patterns whose matching cost stays small."""

from __future__ import annotations

import re._constants as sre
import re._parser as sre_parse
from typing import Any

from hypothesis import given

from tests.strategies import regexes


def _repeats(parsed: Any) -> list[Any]:
    """Every repeat (`?`, `*`, `+`, `{m,n}`) in a parsed pattern, outermost first."""
    found = []
    for op, av in parsed:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            found.append(av[2])
            found.extend(_repeats(av[2]))
        elif op is sre.SUBPATTERN:
            found.extend(_repeats(av[-1]))
        elif op is sre.BRANCH:
            for branch in av[1]:
                found.extend(_repeats(branch))
    return found


@given(regexes())
def test_generated_regexes_repeat_single_characters_only(pattern: str) -> None:
    """Every quantifier in a generated regex repeats one character, and there are at most three:
    `st.from_regex` checks its draws with backtracking `re`, which takes exponential time on a
    quantifier over something that can itself repeat or match several lengths."""
    bodies = _repeats(sre_parse.parse(pattern))
    assert all(body.getwidth() == (1, 1) for body in bodies), pattern
    assert len(bodies) <= 3, pattern
