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


def near_miss(
    condition: Condition,
    facts: Sequence[Fact],
    fallen: Callable[[int], bool] | None = None,
) -> NearMiss | None:
    """The first slip (in the module's order) under which `condition` takes some of
    `facts`, or None. Meant for a rule whose pattern matches none of them.

    Args:
        condition: The rule, compiled (`compile_condition`).
        facts: The names it met, each with its size, shape and file.
        fallen: Which names (by position) no rule of their own took (the default, a
            catch-all); the prefix slips rewrite only those. None: every name.

    Example:
        >>> from devpolicy._names.matching import compile_condition
        >>> facts = [("model/embed", None, None, None), ("model/out", None, None, None)]
        >>> miss = near_miss(compile_condition("modle/*", False), facts)
        >>> miss.kind, miss.fix, miss.indices
        ('typo', "did you mean 'model/*'?", (0, 1))
    """
    passes = _passes(condition, facts)
    found = _searched(condition, facts) or _typo(condition, facts, passes)
    if found is None:
        found = _separated(condition, facts, passes)
    if found is None:
        chosen = [i for i in range(len(facts)) if fallen is None or fallen(i)]
        found = _prefixed(condition, facts, passes, chosen)
    return found


def _passes(condition: Condition, facts: Sequence[Fact]) -> Callable[[int, str], bool]:
    """The rule's whole test of fact `i` under another name."""

    def passes(i: int, name: str) -> bool:
        _, nbytes, shape, source = facts[i]
        return bool(condition.test(name)) and condition.problem(nbytes, source, shape) is None

    return passes


def _searched(condition: Condition, facts: Sequence[Fact]) -> NearMiss | None:
    if condition.kind != "regex":
        return None
    found = compile_search(condition.written)  # RE2: linear, whatever the names
    hits = tuple(
        i
        for i, (name, *_) in enumerate(facts)
        if found(name) is not None and _conditions_pass(condition, facts[i])
    )
    if not hits:
        return None
    return NearMiss(
        "search",
        f"as `search: {condition.written!r}` it would find them (a regex matches whole names)",
        hits,
    )


def _conditions_pass(condition: Condition, fact: Fact) -> bool:
    _, nbytes, shape, source = fact
    return condition.problem(nbytes, source, shape) is None


def _typo(
    condition: Condition, facts: Sequence[Fact], passes: Callable[[int, str], bool]
) -> NearMiss | None:
    """The rule's leading whole words (`modle/` of `modle/*`), or its first word when it
    has no `/` before a wildcard (`modle` of `modle*`), spelt close to the names'."""
    lead = literal_prefix(condition.pattern, condition.is_regex)
    if "/" in lead:
        lead = lead[: lead.rindex("/") + 1]
        depth = lead.count("/")
        heads = {
            "/".join(parts[:depth]) + "/"
            for name, *_ in facts
            if len(parts := name.split("/")) > depth
        }
    else:
        heads = {first_word(name) for name, *_ in facts}
    if not lead or lead in heads:
        return None
    for close in difflib.get_close_matches(lead, heads, n=3, cutoff=TYPO_CUTOFF):
        hits = tuple(
            i
            for i, (name, *_) in enumerate(facts)
            if name.startswith(close) and passes(i, lead + name[len(close) :])
        )
        if hits:
            written = condition.written or condition.pattern
            if written.startswith(lead):
                fix = f"did you mean {close + written[len(lead) :]!r}?"
            else:
                fix = f"the names start with {close!r}, the rule with {lead!r}"
            return NearMiss("typo", fix, hits)
    return None


def _separated(
    condition: Condition, facts: Sequence[Fact], passes: Callable[[int, str], bool]
) -> NearMiss | None:
    """Names whose parts are separated by `.`, read with `/`: as they are, then without
    their first word (a checkpoint whose keys the rule names without the file's name)."""
    dotted = [i for i, (name, *_) in enumerate(facts) if "." in name]
    if not dotted:
        return None
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
    condition: Condition,
    facts: Sequence[Fact],
    passes: Callable[[int, str], bool],
    chosen: Sequence[int],
) -> NearMiss | None:
    """The names without their first word (`model/layers/0` read as `layers/0`), else
    with the rule's first word in its place (`model/w` read as `params/w`)."""
    hits = tuple(
        i for i in chosen if "/" in facts[i][0] and passes(i, facts[i][0].split("/", 1)[1])
    )
    if hits:
        names = first_word(facts[hits[0]][0])
        return NearMiss(
            "unprefixed",
            f"the names start with {names + '/'!r}, the rule without it: load with prefix='' "
            "(or set the policy's `names: {prefix: ''}`)",
            hits,
        )
    lead = literal_prefix(condition.pattern, condition.is_regex)
    word = lead.split("/", 1)[0] if "/" in lead else ""
    if not word:
        return None
    hits = tuple(
        i
        for i in chosen
        if "/" in facts[i][0]
        and first_word(facts[i][0]) != word
        and passes(i, word + "/" + facts[i][0].split("/", 1)[1])
    )
    if not hits:
        return None
    names = first_word(facts[hits[0]][0])
    return NearMiss(
        "prefix",
        f"the names start with {names + '/'!r}, the rule with {word + '/'!r}: load with "
        f"prefix={word!r} (or set the policy's `names: {{prefix: {word}}}`)",
        hits,
        word,
        bool(condition.test(f"{word}/{_ANY_REST}")),
    )
