"""Names a rule could have meant: when a rule's pattern matches none of the names it
meets, the few slips that explain most such misses. Never imports JAX.

Each slip is tried by rewriting the names and asking the rule's own compiled test (its
`Condition`: pattern, then size, shape and file conditions), never a second copy of the
matcher:

- `search`: a `regex:` pasted from a table written for `re.search` (EasyLM, EasyDeL)
  would be found in the names, not matched in full;
- `typo`: the rule's leading words are spelt unlike every name's (`modle/*` for
  `model/...`): the closest leading words of the names, put in the rule's place;
- `separator`: the checkpoint separates its key's parts with `.` (`model.layers.0`) where
  the rule writes `/` (the policy's `names: {separator: '.'}`), with or without the
  names' first word;
- `unprefixed`: the rule is written without the first word the names carry (`layers/*`
  for `model/layers/...`);
- `prefix`: the names start with another word than the rule (`model/...` for `params/...`
  rules: a file loaded without `prefix=`).

The two prefix slips rewrite only the names no rule of their own took (`fallen`): a name a
rule did take was meant for that rule.
"""

from __future__ import annotations

import difflib
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .matching import Condition, SourceFile, compile_search
from .prefixes import literal_prefix

#: A name as the accounting knows it: the name, its size, its shape, its file.
Fact = tuple[str, int | None, tuple[int, ...] | None, SourceFile | None]

#: How alike two leading words must be to call one a misspelling of the other
#: (`difflib`'s ratio: `modle/` and `model/` 0.83, `params/` and `model/` 0.46).
TYPO_CUTOFF = 0.75
# Text no real name holds: a rule that matches `<word>/` + this takes every name under
# its first word.
_ANY_REST = "\x00\x01"


@dataclass(frozen=True, slots=True)
class NearMiss:
    """The names a rule would take but for one slip, and how to mend it.

    Attributes:
        kind: `search`, `typo`, `separator`, `unprefixed` or `prefix` (see the module).
        fix: Why the names missed it and what to change, as a phrase for messages
            (`did you mean 'model/*'?`).
        indices: The names it would take, as positions in the list it was given.
        word: For `prefix`: the rule's first word (the prefix to load with).
        broad: For `prefix`: the rule takes every name under its first word
            (`params/*`), so any file's names would fit it: a guess to make only where no
            other rule's first word fits as well.
    """

    kind: str
    fix: str
    indices: tuple[int, ...]
    word: str = ""
    broad: bool = False


def first_word(name: str) -> str:
    """The text before a name's first `/` (the whole name when it has none).

    Example:
        >>> first_word("model/layers/0"), first_word("batch")
        ('model', 'batch')
    """
    return name.split("/", 1)[0]


class MetNames:
    """The names a set of rules met, read once for all the rules the slips are tried on:
    sorted (for the names under a prefix), their leading words, those holding a `.`.

    Args:
        facts: Each name with its size, shape and file.
        fallen: Per name, whether no rule of its own took it (the default, a catch-all);
            the prefix slips rewrite only those. None: every name.
    """

    def __init__(self, facts: Sequence[Fact], fallen: Sequence[bool] | None = None) -> None:
        self.facts = facts
        self._fallen = fallen
        self._order: list[int] | None = None
        self._sorted: list[str] = []
        self._heads: dict[int, set[str]] = {}
        self._dotted: list[int] | None = None
        self._chosen: list[int] | None = None

    def starting(self, prefix: str) -> list[int]:
        """The names (positions, in order) that start with `prefix`."""
        if self._order is None:
            facts = self.facts
            self._order = sorted(range(len(facts)), key=lambda k: facts[k][0])
            self._sorted = [facts[k][0] for k in self._order]
        if not prefix:
            return list(range(len(self.facts)))
        found = []
        for j in range(bisect_left(self._sorted, prefix), len(self._sorted)):
            if not self._sorted[j].startswith(prefix):
                break
            found.append(self._order[j])
        return sorted(found)

    def heads(self, depth: int) -> set[str]:
        """The names' first `depth` words, each with its `/` (`model/`); depth 0: each
        name's first word alone."""
        found = self._heads.get(depth)
        if found is None:
            if depth == 0:
                found = {first_word(name) for name, *_ in self.facts}
            else:
                found = {
                    "/".join(parts[:depth]) + "/"
                    for name, *_ in self.facts
                    if len(parts := name.split("/")) > depth
                }
            self._heads[depth] = found
        return found

    def dotted(self) -> list[int]:
        """The names holding a `.`."""
        if self._dotted is None:
            self._dotted = [i for i, (name, *_) in enumerate(self.facts) if "." in name]
        return self._dotted

    def fallen(self) -> list[int]:
        """The names no rule of their own took, with a first word to rewrite."""
        if self._chosen is None:
            fallen = self._fallen
            self._chosen = [
                i
                for i, (name, *_) in enumerate(self.facts)
                if "/" in name and (fallen is None or fallen[i])
            ]
        return self._chosen


def near_miss(condition: Condition, met: MetNames | Sequence[Fact]) -> NearMiss | None:
    """The first slip (in the module's order) under which `condition` takes some of the
    names met, or None. Meant for a rule whose pattern matches none of them.

    Args:
        condition: The rule, compiled (`compile_condition`).
        met: The names it met (a `MetNames`, or the facts: every name counts as fallen).

    Example:
        >>> from devpolicy._names.matching import compile_condition
        >>> facts = [("model/embed", None, None, None), ("model/out", None, None, None)]
        >>> miss = near_miss(compile_condition("modle/*", False), facts)
        >>> miss.kind, miss.fix, miss.indices
        ('typo', "did you mean 'model/*'?", (0, 1))
    """
    names = met if isinstance(met, MetNames) else MetNames(met)
    lead = literal_prefix(condition.pattern, condition.is_regex)
    passes = _passes(condition, names.facts, lead)
    return (
        _searched(condition, names.facts)
        or _typo(condition, names, passes, lead)
        or _separated(names, passes)
        or _prefixed(condition, names, passes, lead)
    )


def _passes(condition: Condition, facts: Sequence[Fact], lead: str) -> Callable[[int, str], bool]:
    """The rule's whole test of fact `i` under another name (a name that does not start
    with the rule's literal prefix is turned away before its pattern is tried)."""

    def passes(i: int, name: str) -> bool:
        if not name.startswith(lead) or not condition.test(name):
            return False
        _, nbytes, shape, source = facts[i]
        return condition.problem(nbytes, source, shape) is None

    return passes


def _searched(condition: Condition, facts: Sequence[Fact]) -> NearMiss | None:
    if condition.kind != "regex":
        return None
    found = compile_search(condition.written)  # RE2: linear, whatever the names
    hits = tuple(
        i
        for i, (name, nbytes, shape, source) in enumerate(facts)
        if found(name) is not None and condition.problem(nbytes, source, shape) is None
    )
    if not hits:
        return None
    return NearMiss(
        "search",
        f"as `search: {condition.written!r}` it would find them (a regex matches whole names)",
        hits,
    )


def _typo(
    condition: Condition, names: MetNames, passes: Callable[[int, str], bool], lead: str
) -> NearMiss | None:
    """The rule's leading whole words (`modle/` of `modle/*`, or `modle` of `modle*`)
    spelt close to the names', else, where the names hold those words, the word the rule
    goes on with (`kernl` of `params/dense/kernl`) close to the word they go on with."""
    words = lead[: lead.rindex("/") + 1] if "/" in lead else lead
    heads = names.heads(words.count("/")) if "/" in lead else names.heads(0)
    written = condition.written or condition.pattern
    facts = names.facts
    if words and words not in heads:
        for close in difflib.get_close_matches(words, heads, n=3, cutoff=TYPO_CUTOFF):
            hits = tuple(
                i for i in names.starting(close) if passes(i, words + facts[i][0][len(close) :])
            )
            if hits:
                return NearMiss("typo", _did_you_mean(written, words, close), hits)
        return None
    partial = lead[len(words) :] if "/" in lead else ""
    if not partial:
        return None
    under = names.starting(words)
    following = {facts[i][0][len(words) :].split("/", 1)[0] for i in under}
    for close in difflib.get_close_matches(partial, following, n=3, cutoff=TYPO_CUTOFF):
        start = words + close
        hits = tuple(
            i
            for i in under
            if facts[i][0].startswith(start)
            and passes(i, words + partial + facts[i][0][len(start) :])
        )
        if hits:
            return NearMiss("typo", _did_you_mean(written, lead, start), hits)
    return None


def _did_you_mean(written: str, lead: str, close: str) -> str:
    """`did you mean ...?` with the rule's `lead` put right, where the rule is written
    with it (a regex's literal prefix may be written with escapes)."""
    if written.startswith(lead):
        return f"did you mean {close + written[len(lead) :]!r}?"
    return f"the names start with {close!r}, the rule with {lead!r}"


def _separated(names: MetNames, passes: Callable[[int, str], bool]) -> NearMiss | None:
    """Names whose parts are separated by `.`, read with `/`: as they are, then without
    their first word (a checkpoint whose keys the rule names without the file's name)."""
    dotted = names.dotted()
    facts = names.facts
    hits = tuple(i for i in dotted if passes(i, facts[i][0].replace(".", "/")))
    if hits:
        return NearMiss(
            "separator",
            "the names separate their parts with '.': set the policy's `names: {separator: "
            "'.'}` (or separator='.')",
            hits,
        )
    hits = tuple(
        i
        for i in dotted
        if "/" in facts[i][0] and passes(i, facts[i][0].split("/", 1)[1].replace(".", "/"))
    )
    if hits:
        return NearMiss(
            "separator",
            "the names separate their parts with '.' and start with a word the rule does "
            "not: set the policy's `names: {separator: '.', prefix: ''}`",
            hits,
        )
    return None


def _prefixed(
    condition: Condition, names: MetNames, passes: Callable[[int, str], bool], lead: str
) -> NearMiss | None:
    """The names without their first word (`model/layers/0` read as `layers/0`), else
    with the rule's first word in its place (`model/w` read as `params/w`)."""
    chosen = names.fallen()
    facts = names.facts
    hits = tuple(i for i in chosen if passes(i, facts[i][0].split("/", 1)[1]))
    if hits:
        first = first_word(facts[hits[0]][0])
        return NearMiss(
            "unprefixed",
            f"the names start with {first + '/'!r}, the rule without it: load with prefix='' "
            "(or set the policy's `names: {prefix: ''}`)",
            hits,
        )
    word = lead.split("/", 1)[0] if "/" in lead else ""
    if not word:
        return None
    hits = tuple(
        i
        for i in chosen
        if first_word(facts[i][0]) != word and passes(i, word + "/" + facts[i][0].split("/", 1)[1])
    )
    if not hits:
        return None
    first = first_word(facts[hits[0]][0])
    return NearMiss(
        "prefix",
        f"the names start with {first + '/'!r}, the rule with {word + '/'!r}: load with "
        f"prefix={word!r} (or set the policy's `names: {{prefix: {word}}}`)",
        hits,
        word,
        bool(condition.test(f"{word}/{_ANY_REST}")),
    )
