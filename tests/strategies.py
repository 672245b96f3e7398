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


# Each matches exactly one character. Patterns are built so that a quantifier only ever
# applies to one of these, and at most `_MAX_QUANTIFIERS` times per pattern: `st.from_regex`
# checks each draw with Python's backtracking `re`, and a quantifier over a group that can
# itself repeat (`(?:(?:a?)*)+`) takes exponential time on some draws (35 s at 18 characters).
_REGEX_CHARS = (
    *("a", "b", "/", "0", r"\.", ".", "[ab]", "[^a]", r"\/"),
    *(r"\d", r"\D", "[0-9]", r"\s", "(?s:.)", r"\n", r"[\.-/]"),
)
_QUANTIFIERS = ("?", "*", "+", "{0,2}", "{1}")
_MAX_QUANTIFIERS = 3


@st.composite
def regexes(draw: st.DrawFn) -> str:
    """Small regexes: literals, escapes, classes, groups, alternation, quantified characters;
    backtracking on any name is polynomial of low degree (no nested quantifiers, few of them)."""
    quantifiers_left = _MAX_QUANTIFIERS

    def character() -> str:
        nonlocal quantifiers_left
        char = draw(st.sampled_from(_REGEX_CHARS))
        if quantifiers_left == 0 or not draw(st.booleans()):
            return char
        quantifiers_left -= 1
        return char + draw(st.sampled_from(_QUANTIFIERS))

    def group(depth: int) -> str:
        kind = draw(st.sampled_from(["char", "alternation", "sequence"])) if depth else "char"
        if kind == "char":
            return character()
        first, second = group(depth - 1), group(depth - 1)
        return f"({first}|{second})" if kind == "alternation" else f"(?:{first}{second})"

    body = "".join(group(2) for _ in range(draw(st.integers(0, 5))))
    if draw(st.booleans()):
        body = body + "|" + group(2)
    return body


def names_matching(pattern: str, is_regex: bool) -> st.SearchStrategy[str]:
    """Names `pattern` matches in full (globs from `globs()` only)."""
    if not is_regex:
        tokens = re.findall(r"\[[^]]*\]|.", pattern, flags=re.DOTALL)
        pattern = "".join(GLOB_TO_REGEX.get(t, re.escape(t)) for t in tokens)
    return st.from_regex(pattern, fullmatch=True)


PATTERNS = st.one_of(globs().map(lambda g: (g, False)), regexes().map(lambda r: (r, True)))
