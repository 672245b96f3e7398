"""Cheap facts read from a pattern's text, for lint to choose the few earlier rules worth
comparing on automata (`cover`): text every name a pattern matches contains
(`required_literal`), and a name it probably matches (`guess_example`). Never imports JAX.

Both are read without building a regex's automaton (lint asks them of every rule), so
they are conservative or unchecked: the caller checks a guessed example with the matcher.
"""

from __future__ import annotations

import re
import re._parser as _sre  # type: ignore[import-not-found]  # Python's own parser (was sre_parse)
from typing import Any

from .cover import BRACES, NFA, PUNCTUATION, glob_tree, shortest
from .prefixes import group_end, top_level_bar

#: The most characters of a literal run `required_literal` keeps: enough to tell `layer12`
#: from `layer13`, few enough that looking a name's substrings up stays cheap.
LITERAL_CHARS = 12
# Inline flags that change what a literal character matches (case, verbose whitespace,
# ASCII/Unicode/locale classes); `s` and `m` change only `.`, `^` and `$`.
_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-[a-zA-Z]*)?[:)]")


def required_literal(pattern: str, is_regex: bool) -> str:
    r"""Text every name `pattern` matches contains: its longest literal run, cut short.

    Read from the pattern's text (no parsing into automata: lint asks this of every
    rule), so it is conservative: a run ends at anything but a plain character, a
    character a quantifier follows is dropped, and a regex with a top-level `|` or a flag
    that changes literals (`(?i)`, `(?x)`) has none. "" when there is none.

    Example:
        >>> required_literal("[a-z]+/layer12/(w|b)", True), required_literal("*/layer3/*", False)
        ('/layer12/', '/layer3/')
        >>> required_literal(r"a\.bc?d", True), required_literal("(?i)model/w", True)
        ('a.b', '')
    """
    if not is_regex:
        runs = []
        for part in re.split(r"[*?]", pattern):
            if "[" in part:  # a bracket is one character of a set: keep what is around it
                head, tail = part[: part.index("[")], part[part.index("[") :]
                runs += [head, tail[tail.rindex("]") + 1 :] if "]" in tail else ""]
            else:
                runs.append(part)
    elif top_level_bar(pattern) or any(
        set(m.group(1)) - set("sm") for m in _FLAGS.finditer(pattern)
    ):
        return ""
    else:
        runs = _regex_runs(pattern)
    return max(runs, key=len)[:LITERAL_CHARS]


def _regex_runs(pattern: str) -> list[str]:
    """The runs of plain characters outside groups and classes, each surely in a match."""
    runs: list[str] = []
    current: list[str] = []

    def end_run() -> None:
        runs.append("".join(current))
        current.clear()

    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i + 1 : i + 2]
            if escaped and escaped in PUNCTUATION:
                current.append(escaped)
                i += 2
                continue
            if not escaped or escaped not in "dDsSwWbBAzZ":
                break  # an escape of several characters (\x41, \N{...}): stop, keep what we have
            end_run()
            i += 2
        elif c in "*+?{":
            if current:
                current.pop()  # `ab?`, `ab*`, `ab{0,2}`: the `b` may be absent or repeated
            end_run()
            counted = BRACES.match(pattern, i) if c == "{" else None
            i = counted.end() if counted else i + 1
        elif c in "([":
            end_run()
            i = group_end(pattern, i)
        elif c in ".^$|)]}":
            end_run()
            i += 1
        else:
            current.append(c)
            i += 1
    end_run()
    return runs


def guess_example(pattern: str, is_regex: bool) -> str | None:
    """A name `pattern` probably matches, cheaply; the caller checks it with the matcher.

    For a regex, read from Python's own parse of it (a tenth of what `interegular` takes);
    for a glob, a shortest name of its automaton.
    None when the pattern holds something this does not spell (a backreference).

    Example:
        >>> guess_example("[a-z]+/layer12/(w|b)", True), guess_example("*/l[0-9]/w", False)
        ('a/layer12/w', '/l0/w')
    """
    if not is_regex:
        nfa = NFA(glob_tree(pattern))
        return shortest(nfa)
    try:
        return _spell_sre(_sre.parse(pattern))
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


# One member of each class Python's parser names: `\d`, `\w`, `\s` and their negations.
_CATEGORY_MEMBERS = {
    "CATEGORY_DIGIT": "0",
    "CATEGORY_NOT_DIGIT": "a",
    "CATEGORY_WORD": "a",
    "CATEGORY_NOT_WORD": " ",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": "a",
}
_TRIES = "a0_/ .-A\x00"


def _spell_sre(parsed: Any) -> str | None:
    out: list[str] = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name in ("NOT_LITERAL", "ANY"):
            out.append("b" if arg == ord("a") else "a")
        elif name == "IN":
            member = _class_member(arg)
            if member is None:
                return None
            out.append(member)
        elif name == "CATEGORY":
            out.append(_CATEGORY_MEMBERS.get(str(arg), "a"))
        elif name == "BRANCH":
            options = [_spell_sre(option) for option in arg[1]]
            spelled = [o for o in options if o is not None]
            if not spelled:
                return None
            out.append(min(spelled, key=len))
        elif name == "SUBPATTERN":
            inner = _spell_sre(arg[-1])
            if inner is None:
                return None
            out.append(inner)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _, body = arg
            inner = _spell_sre(body) if low else ""
            if inner is None:
                return None
            out.append(inner * low)
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue  # takes no characters; the matcher says whether the guess holds
        else:  # a backreference, a conditional: not spelled
            return None
    return "".join(out)


def _class_member(items: list[tuple[Any, Any]]) -> str | None:
    negated = bool(items) and str(items[0][0]) == "NEGATE"
    if not negated:
        op, arg = items[0]
        kind = str(op)
        if kind == "LITERAL":
            return chr(arg)
        if kind == "RANGE":
            return chr(arg[0])
        return _CATEGORY_MEMBERS.get(str(arg)) if kind == "CATEGORY" else None
    excluded: set[str] = set()
    for op, arg in items[1:]:
        kind = str(op)
        if kind == "LITERAL":
            excluded.add(chr(arg))
        elif kind == "RANGE":
            excluded |= {c for c in _TRIES if arg[0] <= ord(c) <= arg[1]}
        elif kind == "CATEGORY":
            excluded |= {c for c in _TRIES if re.fullmatch(_CATEGORY_RE[str(arg)], c)}
    return next((c for c in _TRIES if c not in excluded), None)


_CATEGORY_RE = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
}
