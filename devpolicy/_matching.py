"""Name matching: rules' patterns compiled once, first match wins. Never imports JAX."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._sizes import format_size

# A training loop may generate names without end; past this the cache starts over.
_CACHE_LIMIT = 65_536


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

    The names each rule's pattern matches are cached per name, so only size conditions
    are checked again on a repeated name.

    Example:
        >>> m = Matcher([compile_condition("dataset/*", False), compile_condition("*", False)])
        >>> m.first("dataset/train", None), m.first("model/w", None)
        (0, 1)
    """

    def __init__(self, conditions: Sequence[Condition]) -> None:
        self._conditions = tuple(conditions)
        self._candidates: dict[str, tuple[int, ...]] = {}

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """The compiled conditions, in rule order."""
        return self._conditions

    def candidates(self, name: str) -> tuple[int, ...]:
        """Rules whose pattern matches `name`, in order, up to the first unsized one."""
        found = self._candidates.get(name)
        if found is None:
            hits = []
            for i, condition in enumerate(self._conditions):
                if condition.test(name):
                    hits.append(i)
                    if not condition.sized:
                        break
            found = tuple(hits)
            if len(self._candidates) >= _CACHE_LIMIT:
                self._candidates.clear()
            self._candidates[name] = found
        return found

    def first(self, name: str, nbytes: int | None) -> int | None:
        """The first rule matching `name` with size `nbytes`, or None."""
        for i in self.candidates(name):
            if self._conditions[i].size_problem(nbytes) is None:
                return i
        return None

    def trace(self, name: str, nbytes: int | None) -> list[Step]:
        """Every rule tried for `name`, in order, until the first match."""
        steps = []
        for i, condition in enumerate(self._conditions):
            kind = "regex" if condition.is_regex else "glob"
            if not condition.test(name):
                steps.append(Step(i, False, f"{kind} {condition.pattern!r} does not match"))
                continue
            problem = condition.size_problem(nbytes)
            if problem is not None:
                steps.append(Step(i, False, f"{kind} {condition.pattern!r} matches but {problem}"))
                continue
            steps.append(Step(i, True, f"{kind} {condition.pattern!r} matches"))
            break
        return steps
