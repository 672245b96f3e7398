"""Name matching: rules' patterns compiled once, first match wins. Never imports JAX."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import re2

from ._prefixes import PrefixIndex
from ._sizes import format_size


@dataclass(frozen=True, slots=True)
class Condition:
    """What one rule asks of a name and a size."""

    pattern: str
    is_regex: bool
    min_bytes: int | None
    max_bytes: int | None
    test: Callable[[str], object]

    @property
    def sized(self) -> bool:
        """Whether the rule has a size condition (and so needs a known size)."""
        return self.min_bytes is not None or self.max_bytes is not None

    def size_problem(self, nbytes: int | None) -> str | None:
        """Why `nbytes` fails the size condition, or None when it passes."""
        if not self.sized:
            return None
        if nbytes is None:
            return "size unknown, and the rule has a size condition"
        if self.min_bytes is not None and nbytes < self.min_bytes:
            return f"{format_size(nbytes)} < min_bytes {format_size(self.min_bytes)}"
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return f"{format_size(nbytes)} > max_bytes {format_size(self.max_bytes)}"
        return None


REGEX_LIMITS = (
    "regexes are matched by RE2, in time linear in the name, so no rule can stall a program "
    "(Python's `re` can take seconds or years on patterns like '(a+)+$'); RE2 has no "
    "backreferences (\\1, (?P=name)), lookaround ((?=...), (?!...), (?<=...), (?<!...)), "
    "atomic groups, possessive repeats, conditionals or \\Z (write \\z or $), repeat counts "
    "above 1000, and \\d, \\w, \\s match ASCII only"
)
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print every rejected pattern to stderr


def compile_regex(pattern: str) -> Callable[[str], object]:
    """Compile a rule's regex for full matching in linear time.

    The pattern must be valid for Python's `re` (the documented syntax, so it means what
    Python users expect) and for RE2 (the engine that matches it, with no backtracking).

    Raises:
        ValueError: saying why the pattern cannot be used, and what RE2 lacks.

    Example:
        >>> compile_regex("(a+)+$")("a" * 10_000 + "b") is None
        True
    """
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regular expression {pattern!r}: {e}") from None
    except OverflowError:
        raise ValueError(
            f"invalid regular expression {pattern!r}: a repeat count is too large"
        ) from None
    except RecursionError:
        raise ValueError(
            f"invalid regular expression {pattern!r}: groups nested too deeply"
        ) from None
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"unsupported regular expression {pattern!r}: {reason}; {REGEX_LIMITS}"
        ) from None
    return compiled.fullmatch  # type: ignore[no-any-return]


def compile_condition(
    pattern: str, is_regex: bool, min_bytes: int | None = None, max_bytes: int | None = None
) -> Condition:
    """Compile a glob (fnmatch, case-sensitive, `*` crosses `/`) or a full-match regex.

    Regexes run on RE2 (linear time, see `compile_regex`); globs on Python's `re`, whose
    fnmatch translations never backtrack catastrophically.
    """
    if is_regex:
        test: Callable[[str], object] = compile_regex(pattern)
    else:
        test = re.compile(fnmatch.translate(pattern)).match
    return Condition(pattern, is_regex, min_bytes, max_bytes, test)


@dataclass(frozen=True, slots=True)
class Step:
    """One rule tried for one name: whether it matched, and why not if it did not."""

    rule: int
    matched: bool
    reason: str


class Matcher:
    """First-match-wins lookup over an ordered list of conditions.

    Uncached: the decider caches whole decisions, so a name reaches the matcher once.

    Example:
        >>> m = Matcher([compile_condition("dataset/*", False), compile_condition("*", False)])
        >>> m.first("dataset/train", None), m.first("model/w", None)
        (0, 1)
    """

    def __init__(self, conditions: Sequence[Condition]) -> None:
        self._conditions = tuple(conditions)
        # Only rules whose literal prefix starts the name can match it: a cold lookup costs
        # in proportion to those, not to every rule.
        self._index = PrefixIndex((c.pattern, c.is_regex) for c in self._conditions)

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """The compiled conditions, in rule order."""
        return self._conditions

    def candidates(self, name: str) -> tuple[int, ...]:
        """Rules whose pattern matches `name`, in order, up to the first unsized one."""
        hits = []
        conditions = self._conditions
        for i in self._index.candidates(name):
            condition = conditions[i]
            if condition.test(name):
                hits.append(i)
                if not condition.sized:
                    break
        return tuple(hits)

    def first(self, name: str, nbytes: int | None) -> int | None:
        """The first rule matching `name` with size `nbytes`, or None."""
        for i in self.candidates(name):
            if self._conditions[i].size_problem(nbytes) is None:
                return i
        return None

    def trace(self, name: str, nbytes: int | None) -> list[Step]:
        """Every rule tried for `name`, in order, up to the one `first` picks."""
        hits = self.candidates(name)
        chosen = self.first(name, nbytes)
        last = len(self._conditions) - 1 if chosen is None else chosen
        steps = []
        for i in range(last + 1):
            condition = self._conditions[i]
            kind = "regex" if condition.is_regex else "glob"
            if i not in hits:
                steps.append(Step(i, False, f"{kind} {condition.pattern!r} does not match"))
            elif i != chosen:
                problem = condition.size_problem(nbytes)
                steps.append(Step(i, False, f"{kind} {condition.pattern!r} matches but {problem}"))
            else:
                steps.append(Step(i, True, f"{kind} {condition.pattern!r} matches"))
        return steps
