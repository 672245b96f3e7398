"""Whether every name one pattern matches is matched by another. Never imports JAX.

Regexes are parsed by `interegular` (Python regex syntax to a language tree: character
groups, repeats, alternatives, the `s` flag); globs are translated here, each bracket by
`fnmatch` itself. Inclusion is then decided on automata built lazily from those trees,
with a budget: interegular's own `to_fsm` determinises eagerly with no bound (measured:
`(a|b)*a(a|b){10}` takes 190 ms, each further `(a|b)` doubles it), and lint must stay fast
whatever a policy holds. Anything that cannot be modelled exactly (Unicode classes such as
`\\w`, anchors, lookarounds, case-insensitive matching, a pattern too large) is
*undecided*, never guessed: a wrong "covers" would be a false error.

The cheap readings of a pattern's text that lint asks of every rule first
(`required_literal`, `guess_example`) are `hints`'; they share this module's automaton
(`NFA`, `shortest`) and its reading of regex syntax (`PUNCTUATION`, `BRACES`).
"""

from __future__ import annotations

import collections
import fnmatch
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import interegular
from interegular import patterns as _ip

from .dialect import ascii_members

# The most NFA states one pattern may have once its counted repeats are written out.
_MAX_NFA_STATES = 2_000
# The most (later, earlier) state-set pairs one inclusion check may visit.
_MAX_PAIRS = 4_000
# The widest character range a regex class may span (each member is a set element).
_MAX_RANGE = 1_024
_UNICODE_END = 0x110000


class UndecidedError(Exception):
    """Inclusion cannot be decided exactly, or not within the budget."""


@dataclass(frozen=True, slots=True)
class _Chars:
    """A set of characters: a membership test plus the code points where it may change."""

    boundaries: frozenset[int]
    contains: Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class _Cat:
    parts: tuple[_Tree, ...]


@dataclass(frozen=True, slots=True)
class _Alt:
    options: tuple[_Tree, ...]


@dataclass(frozen=True, slots=True)
class _Rep:
    body: _Tree
    lo: int
    hi: int | None


# A pattern's language: a set of characters, a sequence, alternatives, or a repeat.
_Tree = _Chars | _Cat | _Alt | _Rep
_EVERY_CHAR = _Chars(frozenset(), lambda c: True)
_ANY_TEXT = _Rep(_EVERY_CHAR, 0, None)


def _points(chars: frozenset[str]) -> frozenset[int]:
    """Where membership in a set of characters changes: each run's start and its end + 1."""
    codes = {ord(c) for c in chars}
    return frozenset(c for c in codes if c - 1 not in codes) | frozenset(
        c + 1 for c in codes if c + 1 not in codes
    )


@functools.lru_cache(maxsize=4096)
def _literal(c: str) -> _Chars:
    return _Chars(frozenset((ord(c), ord(c) + 1)), c.__eq__)


def _bracket(bracket: str) -> _Chars:
    """An fnmatch bracket, tested by fnmatch's own translation."""
    test = re.compile(fnmatch.translate(bracket)).match
    # Ranges start and end at characters of the bracket, so membership can change only
    # at one of them or just after one (not only at runs of them: `[.-/]` omits `-`).
    points = frozenset(p for ch in bracket for p in (ord(ch), ord(ch) + 1))
    return _Chars(points, lambda ch: test(ch) is not None)


def glob_tree(pattern: str) -> _Tree:
    """The language of an fnmatch glob (case-sensitive, `*` and `?` match any character)."""
    parts: list[_Tree] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not parts or parts[-1] is not _ANY_TEXT:
                parts.append(_ANY_TEXT)
        elif c == "?":
            parts.append(_EVERY_CHAR)
        elif c == "[":
            # Where fnmatch.translate ends a bracket; without a closing `]` it is a literal.
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                parts.append(_literal("["))
                continue
            bracket = pattern[i - 1 : j + 1]
            i = j + 1
            # Membership changes only at a character of the bracket or just after one.
            parts.append(_bracket(bracket))
        else:
            parts.append(_literal(c))
    return _Cat(tuple(parts))


# ASCII punctuation: escaped, each is itself (in Python, interegular and RE2 alike).
PUNCTUATION = frozenset(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
_CONTROL_ESCAPES = frozenset("ntrfv")
# Rules mean what Python's `re` means in ASCII mode (see `dialect`): `\d` and `\s` are
# [0-9] and [\t\n\v\f\r ], not Python's Unicode sets, which interegular follows. Outside a
# class interegular returns one shared object per escape, so `_convert` swaps in the
# dialect's set.
_DIALECT_CLASSES = {
    letter: frozenset(map(chr, ascii_members(f"\\{letter}"))) for letter in ("d", "s")
}
_CLASS_ESCAPES = frozenset("dDsS")


def _dialect_class(letter: str) -> _Chars:
    members = _DIALECT_CLASSES[letter.lower()]
    negated = letter.isupper()
    return _Chars(_points(members), lambda ch: (ch in members) != negated)


# A counted repeat: `{m}`, `{m,}`, `{m,n}`, `{,n}` (other braces are literal text).
BRACES = re.compile(r"\{(?:\d+(?:,\d*)?|,\d+)\}")
_FLAG_GROUP = re.compile(r"\(\?[sm]*(?:-[sm]+)?[:)]")
_NAMED_GROUP = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")


def _escape_ok(pattern: str, i: int, in_class: bool = False) -> int:
    """Width of the escape at `i` if interegular reads it as Python does, else raise."""
    c = pattern[i + 1 : i + 2]
    if c in PUNCTUATION or c in _CONTROL_ESCAPES:
        return 2
    if c in _CLASS_ESCAPES and not in_class:
        return 2  # replaced by the dialect's set in _convert
    if c == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", pattern[i + 2 : i + 4]):
        return 4
    raise UndecidedError(f"escape \\{c} is not modelled")


def _check_regex(pattern: str) -> None:
    """Raise UndecidedError unless `pattern` uses only syntax interegular reads as Python does."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += _escape_ok(pattern, i)
            continue
        if c in "^$":
            raise UndecidedError("anchors are not modelled")
        if c == "{":
            m = BRACES.match(pattern, i)
            if m is None:
                raise UndecidedError("a literal brace is read differently")
            i = m.end()
            if pattern[i : i + 1] == "+":
                raise UndecidedError("possessive repeat")
            continue
        if c in "*+?" and pattern[i + 1 : i + 2] == "+":
            raise UndecidedError("possessive repeat")
        if c == "(" and pattern[i + 1 : i + 2] == "?":
            m = _FLAG_GROUP.match(pattern, i) or _NAMED_GROUP.match(pattern, i)
            if m is None and not pattern.startswith("(?:", i):
                raise UndecidedError("lookarounds, other flags and group references")
        if c == "[":
            i = _check_class(pattern, i)
            continue
        i += 1


def _check_class(pattern: str, i: int) -> int:
    """Check the class starting at `i`; return the index after its `]`."""
    j = i + 1
    if pattern[j : j + 1] == "^":
        j += 1
    if pattern[j : j + 1] == "]":
        raise UndecidedError("a leading `]` in a class is read differently")
    previous: str | None = None  # the last single member, a possible range start
    while j < len(pattern) and pattern[j] != "]":
        c = pattern[j]
        if c == "[" or pattern[j : j + 2] in ("--", "&&", "~~", "||"):
            raise UndecidedError("nested set syntax")
        if c == "\\":
            width = _escape_ok(pattern, j, in_class=True)
            member = pattern[j + 1] if width == 2 else chr(int(pattern[j + 2 : j + 4], 16))
            member = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}.get(member, member)
            j += width
        elif c == "-" and previous is not None and pattern[j + 1 : j + 2] not in ("]", ""):
            k = j + 1
            end = pattern[k]
            if end == "\\":
                width = _escape_ok(pattern, k, in_class=True)
                end = pattern[k + 1] if width == 2 else chr(int(pattern[k + 2 : k + 4], 16))
                k += width
            else:
                k += 1
            if ord(end) - ord(previous) > _MAX_RANGE:
                raise UndecidedError("a very wide character range")
            previous, j = None, k
            continue
        else:
            member, j = c, j + 1
        previous = member
    return j + 1


def regex_tree(pattern: str) -> _Tree:
    """The language of a full-match Python regex, or raise UndecidedError."""
    _check_regex(pattern)
    try:
        parsed = interegular.parse_pattern(pattern)
    except Exception as e:  # interegular raises its own and plain errors alike
        raise UndecidedError(f"interegular: {e!r}") from None
    return _convert(parsed, _ip.REFlags(0))


def _convert(node: object, flags: _ip.REFlags) -> _Tree:
    if isinstance(node, _ip.Pattern):
        flags = (flags | node.added_flags) & ~node.removed_flags
        if flags & _ip.REFlags.CASE_INSENSITIVE:
            raise UndecidedError("case-insensitive matching is not modelled")
        return _Alt(tuple(_convert(o, flags) for o in node.options))
    if isinstance(node, _ip._Concatenation):
        return _Cat(tuple(_convert(p, flags) for p in node.parts))
    if isinstance(node, _ip._Repeated):
        return _Rep(_convert(node.base, flags), node.min, node.max)
    for letter in _CLASS_ESCAPES:
        if node is _ip._CHAR_GROUPS[letter]:
            return _dialect_class(letter)
    if isinstance(node, _ip._CharGroup):
        chars, negated = frozenset(node.chars), node.negated
        return _Chars(_points(chars), lambda ch: (ch in chars) != negated)
    if node is _ip._DOT:
        if flags & _ip.REFlags.SINGLE_LINE:
            return _EVERY_CHAR
        return _Chars(frozenset((10, 11)), lambda ch: ch != "\n")
    if node is _ip._EMPTY:
        return _Cat(())
    raise UndecidedError(f"{type(node).__name__} is not modelled")


class NFA:
    """A Thompson automaton: state 0 starts, `final` accepts."""

    def __init__(self, tree: _Tree) -> None:
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[int, int]]] = []
        self.tests: list[_Chars] = []
        start = self._state()
        self.final = self._build(tree, start)

    def _state(self) -> int:
        if len(self.eps) >= _MAX_NFA_STATES:
            raise UndecidedError("the pattern's automaton is too large")
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def _build(self, tree: _Tree, start: int) -> int:
        """Add `tree` from `start`; return its end state."""
        if isinstance(tree, _Chars):
            end = self._state()
            self.tests.append(tree)
            self.moves[start].append((len(self.tests) - 1, end))
            return end
        if isinstance(tree, _Cat):
            for part in tree.parts:
                start = self._build(part, start)
            return start
        if isinstance(tree, _Alt):
            end = self._state()
            for option in tree.options:
                entry = self._state()
                self.eps[start].append(entry)
                self.eps[self._build(option, entry)].append(end)
            return end
        for _ in range(tree.lo):
            start = self._build(tree.body, start)
        if tree.hi is None:
            loop = self._state()
            self.eps[start].append(loop)
            self.eps[self._build(tree.body, loop)].append(loop)
            return loop
        end = self._state()
        for _ in range(tree.hi - tree.lo):
            self.eps[start].append(end)
            start = self._build(tree.body, start)
        self.eps[start].append(end)
        return end

    def closure(self, states: frozenset[int] | set[int]) -> frozenset[int]:
        seen = set(states)
        stack = list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


def shortest(nfa: NFA) -> str | None:
    """A shortest name `nfa` accepts, or None when it accepts none.

    Breadth first over single states (a 0-1 search: ε moves cost nothing), one character
    per transition: linear in the automaton, unlike the subset walk of `counterexample`.
    """
    # A character of each transition's set: the set is constant between boundaries, so
    # one of them (or 0) is in it if anything is.
    reps: list[str | None] = []
    for test in nfa.tests:
        points = sorted({0, *test.boundaries})
        reps.append(
            next((chr(p) for p in points if p < _UNICODE_END and test.contains(chr(p))), None)
        )
    spelled: dict[int, str] = {0: ""}
    queue: collections.deque[int] = collections.deque([0])
    while queue:
        state = queue.popleft()
        text = spelled[state]
        if state == nfa.final:
            return text
        for target in nfa.eps[state]:
            if target not in spelled or len(spelled[target]) > len(text):
                spelled[target] = text
                queue.appendleft(target)
        for tid, target in nfa.moves[state]:
            rep = reps[tid]
            if rep is not None and target not in spelled:
                spelled[target] = text + rep
                queue.append(target)
    return None


class CoverJudge:
    """Decides `later ⊆ earlier` for patterns, caching automata and spending a budget.

    Example:
        >>> d = CoverJudge()
        >>> d.covers(("model/.*", True), ("model/layer1", False))
        True
        >>> d.covers(("model/.*", True), ("model/*", False))  # `.` stops at a newline
        False
        >>> d.counterexample(("model/.*", True), ("model/*", False))
        'model/\\n'
    """

    def __init__(self, budget: int = 400_000) -> None:
        """`budget`: state-set pairs all checks together may visit before giving up."""
        self._budget = budget
        self._nfas: dict[tuple[str, bool], NFA | UndecidedError] = {}

    def _nfa(self, pattern: tuple[str, bool]) -> NFA:
        found = self._nfas.get(pattern)
        if found is None:
            text, is_regex = pattern
            try:
                found = NFA(regex_tree(text) if is_regex else glob_tree(text))
            except UndecidedError as e:
                found = e
            except RecursionError:  # nesting deeper than the stack: not modelled
                found = UndecidedError("nested too deeply")
            self._nfas[pattern] = found
        if isinstance(found, UndecidedError):
            raise found
        return found

    def example(self, pattern: tuple[str, bool]) -> str | None:
        """A shortest name `pattern` matches; None when it matches none or is not modelled.

        A pattern can cover another only if it matches that one's example: lint compares
        a rule on automata only with the earlier rules that do.

        Example:
            >>> CoverJudge().example(("(model|opt)/layer7/[wb]", True))
            'opt/layer7/b'
        """
        try:
            nfa = self._nfa(pattern)
        except UndecidedError:
            return None
        return shortest(nfa)

    def covers(self, earlier: tuple[str, bool], later: tuple[str, bool]) -> bool | None:
        """Whether `earlier` matches every name `later` does; None when undecided."""
        try:
            return self.counterexample(earlier, later) is None
        except UndecidedError:
            return None

    def counterexample(self, earlier: tuple[str, bool], later: tuple[str, bool]) -> str | None:
        """A shortest name `later` matches and `earlier` does not, or None if none exists.

        Raises:
            UndecidedError: A pattern cannot be modelled exactly, or the budget ran out.
        """
        a, b = self._nfa(earlier), self._nfa(later)
        points = sorted({0}.union(*(t.boundaries for t in (*a.tests, *b.tests))))
        symbols = [chr(p) for p in points if p < _UNICODE_END]
        a_table = [[t.contains(s) for s in symbols] for t in a.tests]
        b_table = [[t.contains(s) for s in symbols] for t in b.tests]

        def step(
            nfa: NFA, table: list[list[bool]], states: frozenset[int], k: int
        ) -> frozenset[int]:
            moved = {t for s in states for tid, t in nfa.moves[s] if table[tid][k]}
            return nfa.closure(moved) if moved else frozenset()

        start = (b.closure({0}), a.closure({0}))
        parent: dict[tuple[frozenset[int], frozenset[int]], tuple[object, int] | None] = {
            start: None
        }
        queue = [start]
        for pair in queue:  # breadth first: the first counterexample found is a shortest
            bs, as_ = pair
            if b.final in bs and a.final not in as_:
                return self._spell(parent, pair, symbols)
            for k in range(len(symbols)):
                nb = step(b, b_table, bs, k)
                if not nb:
                    continue
                nxt = (nb, step(a, a_table, as_, k))
                if nxt not in parent:
                    if len(parent) >= _MAX_PAIRS or self._budget <= 0:
                        raise UndecidedError("too many states to compare")
                    self._budget -= 1
                    parent[nxt] = (pair, k)
                    queue.append(nxt)
        return None

    @staticmethod
    def _spell(
        parent: dict[tuple[frozenset[int], frozenset[int]], tuple[object, int] | None],
        pair: tuple[frozenset[int], frozenset[int]],
        symbols: list[str],
    ) -> str:
        out = []
        link = parent[pair]
        while link is not None:
            previous, k = link
            out.append(symbols[k])
            link = parent[previous]  # type: ignore[index]
        return "".join(reversed(out))
