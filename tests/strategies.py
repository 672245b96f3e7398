"""Hypothesis strategies for rule patterns: small globs and regexes, and names they match."""

from __future__ import annotations

import re

from hypothesis import strategies as st

# A small alphabet, so random patterns and names often meet.
# `0` and `٣` (a Unicode digit Python's `\\d` matches), newline: where models go wrong.
CHARS = "ab/.0\u0663"
NAMES = st.text(alphabet=CHARS + "\n", max_size=8)


GLOB_TOKENS = ["a", "b", "/", ".", "0", "*", "?", "[ab]", "[!a]", "[.-/]", "[0-9]"]
GLOB_TO_REGEX = {
    "*": "(?s:.*)",
    "?": "(?s:.)",
    "[ab]": "[ab]",
    "[!a]": "[^a]",
    "[.-/]": "[.-/]",
    "[0-9]": "[0-9]",
}


@st.composite
def globs(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(GLOB_TOKENS), max_size=6))
    return "".join(parts)


def _regex_atoms() -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            *("a", "b", "/", "0", r"\.", ".", "[ab]", "[^a]", r"\/", "a?", "b+", r"\.*"),
            *(r"\d", r"\D", "[0-9]", r"\s", "(?s:.)", r"\n", r"[\.-/]"),
        ]
    )


@st.composite
def regexes(draw: st.DrawFn) -> str:
    """Small regexes: literals, escapes, classes, groups, alternation, quantifiers."""
    atom = st.recursive(
        _regex_atoms(),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})"),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}{t[1]})"),
            st.tuples(inner, st.sampled_from(["?", "*", "+", "{0,2}", "{1}"])).map(
                lambda t: f"(?:{t[0]}){t[1]}"
            ),
        ),
        max_leaves=4,
    )
    pieces = draw(st.lists(st.tuples(atom, st.sampled_from(["", "", "?", "*", "+"])), max_size=5))
    body = "".join(f"(?:{a}){q}" if q else a for a, q in pieces)
    if draw(st.booleans()):
        body = body + "|" + draw(atom)
    return body


def names_matching(pattern: str, is_regex: bool) -> st.SearchStrategy[str]:
    """Names `pattern` matches in full (globs from `globs()` only)."""
    if not is_regex:
        tokens = re.findall(r"\[[^]]*\]|.", pattern, flags=re.DOTALL)
        pattern = "".join(GLOB_TO_REGEX.get(t, re.escape(t)) for t in tokens)
    return st.from_regex(pattern, fullmatch=True)


PATTERNS = st.one_of(globs().map(lambda g: (g, False)), regexes().map(lambda r: (r, True)))
