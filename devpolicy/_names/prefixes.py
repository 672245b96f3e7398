"""Rules indexed by the literal text every name they match starts with. Never imports JAX.

A glob's names all start with the text before its first wildcard; a regex's with its
leading run of literal characters. A name can only match a pattern whose literal prefix
it starts with, so a lookup walks a trie along the name and collects the patterns ending
on the way: its cost follows the name's length and the candidates found, not the number
of rules. The same index tells lint which earlier rules can share names with a later one.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable

_GLOB_WILDCARDS = "*?["
# Characters that end a regex's literal run: syntax, or (`{`) possibly a quantifier.
_REGEX_SPECIAL = frozenset(".^$*+?{}[]|()\\")
_QUANTIFIERS = frozenset("*+?{")


def literal_prefix(pattern: str, is_regex: bool) -> str:
    """The text every name `pattern` matches starts with (conservative: maybe shorter).

    Args:
        pattern: A glob (fnmatch, `*` crosses `/`) or a regex matched in full.
        is_regex: Whether `pattern` is a regex.

    Returns:
        For a glob, the text before its first `*`, `?` or `[`. For a regex, its leading
        literal characters (an escaped punctuation character such as `\\.` counts as
        itself), stopping before anything else and dropping a character a quantifier
        follows; empty when the regex has a top-level `|`.

    Example:
        >>> literal_prefix("model/*/w", False), literal_prefix(r"model\\.layer1?/.*", True)
        ('model/', 'model.layer')
        >>> literal_prefix("a/b|c/d", True)
        ''
    """
    if not is_regex:
        cut = min((pattern.index(c) for c in _GLOB_WILDCARDS if c in pattern), default=None)
        return pattern if cut is None else pattern[:cut]
    if top_level_bar(pattern):
        return ""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i + 1 : i + 2]
            # Only an escaped ASCII punctuation character is surely itself (`\d`, `\1`,
            # `\n`, `\Z`... are classes, references, controls or anchors).
            if not escaped or escaped.isalnum() or not escaped.isascii():
                break
            literal, width = escaped, 2
        elif c in _REGEX_SPECIAL:
            break
        else:
            literal, width = c, 1
        if pattern[i + width : i + width + 1] in _QUANTIFIERS and i + width < len(pattern):
            break  # `ab?`, `ab*`, `ab{0}`: the `b` may be absent
        out.append(literal)
        i += width
    return "".join(out)


# A regex's last word: a run of word characters after a `/` or an escaped `.`, at its end.
_REGEX_LAST_WORD = re.compile(r"(?:/|\\\.)([A-Za-z0-9_-]+)\Z")
# Inline flags that make a regex ignore case: its words are then no literal text.
_IGNORE_CASE = re.compile(r"\(\?[a-zA-Z]*i")


def last_word(pattern: str, is_regex: bool) -> str:
    """The last part every name `pattern` matches ends with, as a whole part (after a `/`
    or `.`), or "" where no such part can be told (conservative).

    Args:
        pattern: A glob (fnmatch, `*` crosses `/`) or a regex matched in full.
        is_regex: Whether `pattern` is a regex.

    Returns:
        For a glob, the literal text after its last wildcard, from its last `/` or `.`
        on (a glob with no wildcard: its last part). For a regex, a trailing run of word
        characters after `/` or `\\.`; "" where the regex has a top-level `|` or ignores
        case.

    Example:
        >>> last_word("*/tokens", False), last_word("*tokens", False), last_word("a.b", False)
        ('tokens', '', 'b')
        >>> last_word(r".*/kernel", True), last_word(r".*\\.kernel", True), last_word("a|b/c", True)
        ('kernel', 'kernel', '')
    """
    if is_regex:
        if top_level_bar(pattern) or _IGNORE_CASE.search(pattern):
            return ""
        found = _REGEX_LAST_WORD.search(pattern)
        return found.group(1) if found is not None else ""
    cut = max((pattern.rfind(c) for c in "*?]"), default=-1)
    tail = pattern[cut + 1 :]
    parts = re.split(r"[/.]", tail)
    # After a wildcard the text must start a part for its last piece to be a whole part.
    return parts[-1] if cut < 0 or len(parts) > 1 else ""


def top_level_bar(pattern: str) -> bool:
    """Whether regex `pattern` has a `|` outside every group and class.

    Example:
        >>> top_level_bar("a/b|c"), top_level_bar("a/(b|c)"), top_level_bar("a[|]")
        (True, False, False)
    """
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "|":
            return True
        i = group_end(pattern, i) if c in "([" else i + (2 if c == "\\" else 1)
    return False


def group_end(pattern: str, i: int) -> int:
    """The index after the group or class of regex `pattern` that starts at `i` (or the
    end of `pattern` when it is not closed). Escapes and classes inside are skipped whole.

    Example:
        >>> group_end("(a(b)[)])c", 0), group_end("[]a]b", 0), group_end("(a", 0)
        (9, 4, 2)
    """
    depth, in_class, n = 0, False, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
                if depth == 0:
                    return i + 1
        elif c == "[":
            in_class = True
            # A `]` right after `[` or `[^` is a member, not the end.
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


class _Node:
    __slots__ = ("children", "here")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.here: list[int] = []  # patterns whose prefix ends at this node, ascending


class PrefixIndex:
    """Patterns indexed by literal prefix, built once; lookups cost per candidate.

    Example:
        >>> index = PrefixIndex([("model/*", False), (r"model/layer\\d+/w", True), ("*", False)])
        >>> index.candidates("model/layer3/w"), index.candidates("data/x")
        ([0, 1, 2], [2])
        >>> index.overlapping(1)
        [0]
    """

    def __init__(self, patterns: Iterable[tuple[str, bool]]) -> None:
        """Index `(pattern, is_regex)` pairs; a pattern's index is its position."""
        self._build(tuple(literal_prefix(p, is_regex) for p, is_regex in patterns))

    @classmethod
    def of_texts(cls, texts: Iterable[str]) -> PrefixIndex:
        """An index over texts taken as the prefixes themselves (e.g. reversed suffixes)."""
        index = cls.__new__(cls)
        index._build(tuple(texts))
        return index

    def _build(self, prefixes: tuple[str, ...]) -> None:
        self._prefixes = prefixes
        self._root = _Node()
        for i, prefix in enumerate(self._prefixes):
            node = self._root
            for c in prefix:
                node = node.children.setdefault(c, _Node())
            node.here.append(i)

    def __len__(self) -> int:
        return len(self._prefixes)

    def prefix(self, index: int) -> str:
        """The literal prefix of pattern `index`."""
        return self._prefixes[index]

    def candidates(self, name: str) -> list[int]:
        """Patterns that may match `name` (their prefix starts it), in pattern order.

        Every pattern that matches `name` is among them; the caller still tests each.
        """
        node = self._root
        found = list(node.here)
        for c in name:
            child = node.children.get(c)
            if child is None:
                break
            node = child
            found += node.here
        found.sort()
        return found

    def overlapping(self, index: int) -> list[int]:
        """Earlier patterns that may share a name with pattern `index`, in order.

        Those whose prefix starts this one's, or starts with it. Any earlier pattern
        that matches a name this one matches is among them.
        """
        node = self._root
        found: list[int] = []
        for c in self._prefixes[index]:
            found += node.here[: bisect_left(node.here, index)]
            node = node.children[c]  # present: this pattern's own prefix was inserted
        stack = [node]
        while stack:
            below = stack.pop()
            found += below.here[: bisect_left(below.here, index)]
            stack.extend(below.children.values())
        found.sort()
        return found
