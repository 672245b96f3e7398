"""Name matching: rules' patterns compiled once, first match wins. Never imports JAX."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def compile_condition(
    pattern: str, is_regex: bool, min_bytes: int | None = None, max_bytes: int | None = None
) -> Condition:
    """Compile a glob (fnmatch, case-sensitive, `*` crosses `/`) or a full-match regex."""
    if is_regex:
        test: Callable[[str], object] = re.compile(pattern).fullmatch
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

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """The compiled conditions, in rule order."""
        return self._conditions

    def candidates(self, name: str) -> tuple[int, ...]:
        """Rules whose pattern matches `name`, in order, up to the first unsized one."""
        hits = []
        for i, condition in enumerate(self._conditions):
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
