"""The regex dialect of rules: Python's `re` syntax and meaning (ASCII mode), matched by RE2.

Rules' regexes are matched by RE2, in time linear in the name, so no pattern can stall a
program (Python's backtracking `re` takes years on `(a+)+$` against a long name). The two
engines read the same text differently, though: `x{,3}` is up to three `x` to Python and
the text `x{,3}` to RE2; `[[:digit:]]` a set of `[:digt` then `]` to Python and a digit to
RE2; Python's `\\s` holds `\\v` and RE2's does not; Python's `\\w`, `\\b` and `(?i)` are
Unicode-aware and RE2's `\\w`, `\\b` are ASCII while its `(?i)` folds Unicode (the Kelvin
sign `K` is `k`); `\\Z`, `\\u00e9` and `(?x)` are Python's and errors to RE2.

So RE2 never sees a pattern as written. Python's own parser reads it (`re._parser`, the
parse `re.compile` makes, in ASCII mode), and `to_re2` writes the tree out again in RE2
syntax, every character class spelled as explicit code point ranges and every flag
applied by hand. RE2 then matches exactly the names `re.fullmatch(pattern, name,
re.ASCII)` matches (and `re.search` for `search:` rules), with three exceptions, all
documented: `$` matches only at the very end of the name (Python's also before a final
newline); `\\B` matches the empty name (as Python 3.14 and RE2 do; earlier Pythons do
not); and a search tests `\\B` between the bytes of a non-ASCII character too (RE2 works
on UTF-8), so `search: '\\B'` is found in `0é0`, where Python finds no place. What RE2
cannot do at all is refused, naming the construct; so is text the two dialects (or two
Python versions) read differently, with the portable spelling.

A leaf of the name layer: no JAX.
"""

from __future__ import annotations

import re
import re._parser as _sre  # type: ignore[import-not-found]  # Python's own parser (was sre_parse)
import warnings
from typing import Any

# Code points a regex can name.
_TOP = 0x10FFFF
_MAXREPEAT = _sre.MAXREPEAT
#: RE2's largest repeat count (`{1000}`; `{1001}` is an error).
MAX_REPEAT_COUNT = 1000

_IGNORECASE = _sre.SRE_FLAG_IGNORECASE
_MULTILINE = _sre.SRE_FLAG_MULTILINE
_DOTALL = _sre.SRE_FLAG_DOTALL

# A set of code points: sorted, disjoint, non-adjacent inclusive ranges.
_Ranges = list[tuple[int, int]]

REGEX_LIMITS = (
    "regexes are matched by RE2, in time linear in the name, so no rule can stall a program "
    "(Python's `re` can take seconds or years on patterns like '(a+)+$'); RE2 has no "
    "backreferences (\\1, (?P=name)), lookaround ((?=...), (?!...), (?<=...), (?<!...)), "
    "atomic groups ((?>...)), possessive repeats (a*+), conditionals ((?(1)a|b)) or repeat "
    f"counts above {MAX_REPEAT_COUNT}"
)

#: POSIX classes (`[[:digit:]]` in RE2, grep and PCRE) and their spelling in the dialect.
POSIX_CLASSES = {
    "alnum": "[0-9A-Za-z]",
    "alpha": "[A-Za-z]",
    "ascii": "[\\x00-\\x7f]",
    "blank": "[\\t ]",
    "cntrl": "[\\x00-\\x1f\\x7f]",
    "digit": "[0-9] (or \\d)",
    "graph": "[!-~]",
    "lower": "[a-z]",
    "print": "[ -~]",
    "punct": "[!-/:-@[-`{-~]",
    "space": "[\\t\\n\\v\\f\\r ] (or \\s)",
    "upper": "[A-Z]",
    "word": "[0-9A-Za-z_] (or \\w)",
    "xdigit": "[0-9A-Fa-f]",
}
# `[:name:]` whose `[` is not escaped (an even number of backslashes before it).
_POSIX = re.compile(r"(?<!\\)(?:\\\\)*\[:([A-Za-z]+):\]")


class DialectError(ValueError):
    """A pattern the dialect refuses; `reason` says why and what to write instead."""

    def __init__(self, pattern: str, reason: str, *, invalid: bool = False) -> None:
        self.pattern = pattern
        self.reason = reason
        kind = "invalid" if invalid else "unsupported"
        super().__init__(f"{kind} regular expression {pattern!r}: {reason}")


def ascii_members(escape: str) -> frozenset[int]:
    """The ASCII code points Python's `re` puts in a class escape in ASCII mode."""
    test = re.compile(escape, re.ASCII).fullmatch
    return frozenset(c for c in range(128) if test(chr(c)))


# Each category as (its ASCII members, whether every non-ASCII code point is a member).
# Read from Python's own `re`, so `\s` is exactly its set ([\t\n\v\f\r ]), not RE2's.
_CATEGORIES: dict[Any, tuple[frozenset[int], bool]] = {
    _sre.CATEGORY_DIGIT: (ascii_members(r"\d"), False),
    _sre.CATEGORY_NOT_DIGIT: (ascii_members(r"\D"), True),
    _sre.CATEGORY_SPACE: (ascii_members(r"\s"), False),
    _sre.CATEGORY_NOT_SPACE: (ascii_members(r"\S"), True),
    _sre.CATEGORY_WORD: (ascii_members(r"\w"), False),
    _sre.CATEGORY_NOT_WORD: (ascii_members(r"\W"), True),
}


def _merge(ranges: list[tuple[int, int]]) -> _Ranges:
    out: _Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: _Ranges) -> _Ranges:
    out: _Ranges = []
    start = 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _TOP:
        out.append((start, _TOP))
    return out


def _fold(ranges: _Ranges) -> _Ranges:
    """The code points Python's `re` (ASCII mode, `(?i)`) takes for a set: those whose
    ASCII lower case is the lower case of a member (only A-Z and a-z fold)."""
    ascii_part = {c for lo, hi in ranges if lo < 128 for c in range(lo, min(hi, 127) + 1)}
    lowered = {c + 32 if 65 <= c <= 90 else c for c in ascii_part}
    folded = lowered | {c - 32 for c in lowered if 97 <= c <= 122}
    rest = [(max(lo, 128), hi) for lo, hi in ranges if hi >= 128]
    return _merge([(c, c) for c in folded] + rest)


def _set(items: list[tuple[Any, Any]], flags: int, pattern: str) -> _Ranges:
    """The code points of a parsed set (`[...]`, `\\d`...) under `flags`."""
    found: list[tuple[int, int]] = []
    negate = False
    for op, av in items:
        if op is _sre.NEGATE:
            negate = True
        elif op is _sre.LITERAL:
            found.append((av, av))
        elif op is _sre.RANGE:
            found.append(av)
        elif op is _sre.CATEGORY and av in _CATEGORIES:
            members, beyond = _CATEGORIES[av]
            found += [(c, c) for c in members]
            if beyond:
                found.append((128, _TOP))
        else:  # pragma: no cover - the parser makes no other set items
            raise DialectError(pattern, f"a set item Python's parser made that is not known: {op}")
    ranges = _merge(found)
    if flags & _IGNORECASE:
        ranges = _fold(ranges)  # Python folds the members, then negates
    return _complement(ranges) if negate else ranges


def _class(ranges: _Ranges) -> str:
    """A set as an RE2 class of explicit code points."""
    if not ranges:
        return "[^\\x00-\\x{10FFFF}]"  # nothing: an empty set matches no character
    parts = [f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" for lo, hi in ranges]
    return "[" + "".join(parts) + "]"


def _char(code: int, flags: int) -> str:
    """One literal character, case-folded by hand under `(?i)`."""
    if flags & _IGNORECASE and (65 <= code <= 90 or 97 <= code <= 122):
        return _class(_fold([(code, code)]))
    c = chr(code)
    if c.isascii() and (c.isalnum() or c == "_"):
        return c
    if c.isascii() and c.isprintable() and c != " ":
        return "\\" + c  # RE2 takes any escaped punctuation as itself
    return _class([(code, code)])


def _repeat(body: str, low: int, high: int, lazy: bool, pattern: str) -> str:
    for count in (low, high):
        if count != _MAXREPEAT and count > MAX_REPEAT_COUNT:
            raise DialectError(
                pattern, f"a repeat count above {MAX_REPEAT_COUNT} ({count}); {REGEX_LIMITS}"
            )
    if (low, high) == (0, _MAXREPEAT):
        op = "*"
    elif (low, high) == (1, _MAXREPEAT):
        op = "+"
    elif (low, high) == (0, 1):
        op = "?"
    elif high == _MAXREPEAT:
        op = f"{{{low},}}"
    elif low == high:
        op = f"{{{low}}}"
    else:
        op = f"{{{low},{high}}}"
    return f"(?:{body}){op}{'?' if lazy else ''}"


_REFUSED = {
    "GROUPREF": "a backreference (\\1 or (?P=name))",
    "GROUPREF_EXISTS": "a conditional group ((?(1)a|b))",
    "ATOMIC_GROUP": "an atomic group ((?>...))",
    "POSSESSIVE_REPEAT": "a possessive repeat (*+, ++, ?+ or {m,n}+)",
}


def _emit(tree: Any, flags: int, pattern: str) -> str:
    """RE2 syntax for a parsed (sub)pattern under `flags`, meaning what Python's `re`
    (ASCII mode) means by it."""
    out: list[str] = []
    for op, av in tree:
        name = str(op)
        if op is _sre.LITERAL:
            out.append(_char(av, flags))
        elif op is _sre.NOT_LITERAL:
            out.append(_class(_set([(_sre.NEGATE, None), (_sre.LITERAL, av)], flags, pattern)))
        elif op is _sre.IN:
            out.append(_class(_set(av, flags, pattern)))
        elif op is _sre.ANY:
            out.append("(?s:.)" if flags & _DOTALL else "[^\\n]")
        elif op is _sre.BRANCH:
            out.append("(?:" + "|".join(_emit(b, flags, pattern) for b in av[1]) + ")")
        elif op is _sre.SUBPATTERN:
            _, add, remove, body = av
            out.append("(?:" + _emit(body, (flags | add) & ~remove, pattern) + ")")
        elif op is _sre.MAX_REPEAT or op is _sre.MIN_REPEAT:
            low, high, body = av
            inner = _emit(body, flags, pattern)
            out.append(_repeat(inner, low, high, op is _sre.MIN_REPEAT, pattern))
        elif op is _sre.AT:
            out.append(_anchor(av, flags))
        elif op is _sre.ASSERT or op is _sre.ASSERT_NOT:
            ahead = av[0] == 1
            kind = ("a lookahead ((?=...))", "a negative lookahead ((?!...))")
            kind_behind = ("a lookbehind ((?<=...))", "a negative lookbehind ((?<!...))")
            what = (kind if ahead else kind_behind)[op is _sre.ASSERT_NOT]
            raise DialectError(pattern, f"{what}; {REGEX_LIMITS}")
        elif name in _REFUSED:
            raise DialectError(pattern, f"{_REFUSED[name]}; {REGEX_LIMITS}")
        else:  # pragma: no cover - a construct of a newer Python
            raise DialectError(pattern, f"{name.lower()} is not supported; {REGEX_LIMITS}")
    return "".join(out)


def _anchor(code: Any, flags: int) -> str:
    if code is _sre.AT_BEGINNING:
        return "(?m:^)" if flags & _MULTILINE else "\\A"
    if code is _sre.AT_BEGINNING_STRING:
        return "\\A"
    if code is _sre.AT_END:
        # Python's `$` also matches before a final newline; RE2 has no such anchor (it would
        # need a lookahead): the end of the name only, as documented.
        return "(?m:$)" if flags & _MULTILINE else "\\z"
    if code is _sre.AT_END_STRING:
        return "\\z"
    if code is _sre.AT_BOUNDARY:
        return "\\b"  # ASCII word characters on both engines
    if code is _sre.AT_NON_BOUNDARY:
        return "\\B"
    raise ValueError(f"unknown anchor {code}")  # pragma: no cover - the parser makes no other


def _ambiguous(pattern: str) -> str | None:
    """Why `pattern` holds text the dialects read differently, or None."""
    posix = _POSIX.search(pattern)
    if posix is not None:
        name = posix.group(1)
        spelling = POSIX_CLASSES.get(name)
        if spelling is not None:
            return (
                f"[:{name}:] is a POSIX class to RE2, grep and PCRE, but Python's re has "
                f"none and reads the characters of '[:{name}:]' instead; write {spelling}"
            )
    return None


def _parse(pattern: str) -> Any:
    """Python's parse of `pattern` in ASCII mode.

    Raises:
        DialectError: Python refuses it, or warns that a future Python will read it
            differently (a set inside a set, `--`, `&&`, `~~`, `||` in a set).
    """
    # The parser reports future changes of meaning only as warnings. Catching them changes
    # the process's warning filters for a moment (a policy is compiled once, at load).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            tree = _sre.parse(pattern, re.ASCII)
        except re.error as e:
            raise DialectError(pattern, str(e), invalid=True) from None
        except ValueError:  # the flags check: `(?u)` against ASCII mode
            raise DialectError(
                pattern,
                "the u flag: names are matched in ASCII mode (\\w, \\d, \\s, \\b and "
                "(?i) know ASCII letters and digits only); drop (?u)",
            ) from None
        except OverflowError:
            raise DialectError(pattern, "a repeat count is too large", invalid=True) from None
        except RecursionError:
            raise DialectError(pattern, "groups nested too deeply", invalid=True) from None
    for warning in caught:
        text = str(warning.message)
        if issubclass(warning.category, FutureWarning) and text.startswith("Possible "):
            raise DialectError(
                pattern,
                f"Python's re warns: {text} (a future Python reads a set inside a set, and "
                "--, &&, ~~, || in a set, as set operations); escape the characters meant "
                "(\\[, \\-, \\&, \\~, \\|)",
            )
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return tree


def to_re2(pattern: str) -> str:
    """`pattern`, read as Python's `re` reads it in ASCII mode, written in RE2 syntax with
    the same meaning (see the module docstring for the two documented exceptions).

    Raises:
        DialectError: (a ValueError) the pattern is invalid, uses what RE2 cannot match
            in linear time, or reads differently in the two dialects, saying which and
            what to write instead.

    Example:
        >>> to_re2("x{,3}")
        '(?:x){0,3}'
        >>> to_re2("a\\\\sb")
        'a[\\\\x{9}-\\\\x{D}\\\\x{20}]b'
        >>> try:
        ...     to_re2("[[:digit:]]")
        ... except ValueError as e:
        ...     print(str(e).split("; ")[-1])
        write [0-9] (or \\d)
    """
    why = _ambiguous(pattern)
    if why is not None:
        raise DialectError(pattern, why)
    tree = _parse(pattern)
    return _emit(tree, tree.state.flags, pattern)
