"""Rule-use accounting: what each rule of a policy took in a load, a plan or a list of
names, why a rule that took nothing did, and what should not pass in silence.

A rule that took none of the names is one of:

- `shadowed`: some names fit it whole (pattern and conditions), but an earlier rule took
  them first (the demo's `*/tokens` after its `file:` rule): said at debug and by
  `check --names`, never a warning;
- `conditions`: its pattern matches names, but none meets its conditions (a
  `max_elements: 1` rule on a checkpoint without scalars): counted, not blamed;
- `other-files`: its `file:` glob matches none of the files;
- `near`: it would take names but for one slip (`nearby`: a regex written for search, a
  misspelt first word, `.` between the parts, a prefix that differs): a warning with the
  fix, whoever took those names instead;
- `other-names`: its first word, or its last, is no part of any name and no slip
  explains it (`dataset/*`, or `*/tokens`, in a model's load): written for other names,
  counted, and said as its why;
- `nothing`: none of the above (a last word a slip away from a part of the names, such as
  `*/kernal`, is one); a warning when the default or a catch-all took names.

A judgement about rules, so it sits beside the decider and reads no file: the I/O wing
hands it the names a load or a plan met (`_io/reading/naming.checkpoint_names` reads them
from a checkpoint) and says its verdicts as each load's events.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from .._base.sizes import format_size
from .._document.layers import RuleEntry, Settings
from .._document.schema import RuleSpec
from .._document.targets import parse_target
from .._names.matching import Condition, SourceFile
from .._names.nearby import TYPO_CUTOFF, MetNames, NearMiss, near_miss
from .._names.prefixes import last_word, literal_prefix
from .decision import Decision

#: Patterns that take every name: a rule written with one is a catch-all.
_CATCH_ALL = {("*", False), (".*", True), ("(?s).*", True), ("(?s:.*)", True)}
_SEARCH_ALL = ("", ".*", "(?s).*", "^", "(?s:.*)")

TOOK = "took"
SHADOWED = "shadowed"
CONDITIONS = "conditions"
OTHER_FILES = "other-files"
NEAR = "near"
OTHER_NAMES = "other-names"
NOTHING = "nothing"
#: The note of a rule that took nothing for no reason found (`nothing`).
NO_MATCH = "its pattern matches none of these names"
#: Why a rule took nothing, in the order they are judged (see the module).
STATUSES = (TOOK, OTHER_FILES, SHADOWED, CONDITIONS, NEAR, OTHER_NAMES, NOTHING)


class Placed(NamedTuple):
    """One name as a load, a plan or a name list met it, and the rule that took it.

    Attributes:
        name: The name rules saw.
        position: Its rule's position in `settings.rules`; None for the default.
        nbytes: Its size, or None when unknown.
        shape: Its shape, or None when unknown.
        source: The file it comes from (for `file:` rules), or None.
        sharded: Whether it was sharded.
    """

    name: str
    position: int | None
    nbytes: int | None = None
    shape: tuple[int, ...] | None = None
    source: SourceFile | None = None
    sharded: bool = False


@dataclass(frozen=True, slots=True)
class RuleUse:
    """How many tensors one rule (or the default) took in a load, a plan or a name list,
    and for a rule that took none, why.

    Attributes:
        origin: Where the rule is written (`policy.yaml:7`, `env:DEVPOLICY_RULES item 0`),
            or the default's origin.
        label: The rule's pattern and conditions (`'model/*'`, `search 'wo/kernel'`,
            `'*' max_elements 1`), or `default`.
        tensors: Tensors it took.
        nbytes: Their bytes.
        shards: Whether it asks for a sharding.
        sharded: Tensors it sharded (a sharding that fell back to a device is not).
        catch_all: Whether it takes every name (`*`, `.*`; the default too); a rule with a
            `file:` glob takes only its files' names, and is none.
        applies: False for a rule written for other files or other names (`other-files`,
            `other-names`): it could not have taken anything here.
        example: The first name it took, or "".
        status: `took`, or why it took nothing (one of `STATUSES`; see the module).
        note: For a rule that took nothing, why, as a phrase: `shadowed by rule 1
            (p.yaml:28 file 'data*.safetensors')`, `its pattern matches 3 names, none
            with max_elements 1`, a slip's fix.
        meant: For `near`: how many names it would take but for the slip.
        meant_example: For `near`: one of them.
        meant_by: For `near`: who took those names instead (`rule p.yaml:9 ('llama/*')`,
            `the default`).
        position: The rule's position in the policy's rules (None for the default).
        layer: Where the rule comes from: `policy`, `env`, `code`; `default`.
        host: Whether its own target is a host device (`device: cpu`): what it places
            whole it places there on purpose, never "left unsharded" by a catch-all.
    """

    origin: str
    label: str
    tensors: int
    nbytes: int
    shards: bool
    sharded: int = 0
    catch_all: bool = False
    applies: bool = True
    example: str = ""
    status: str = TOOK
    note: str = ""
    meant: int = 0
    meant_example: str = ""
    meant_by: str = ""
    position: int | None = None
    layer: str = "default"
    host: bool = False


def _catch_all(spec: RuleSpec) -> bool:
    conditions = (spec.min_bytes, spec.max_bytes, spec.ndim, spec.min_elements, spec.max_elements)
    if spec.file is not None or any(c is not None for c in conditions):
        return False
    if spec.search is not None:
        return spec.search in _SEARCH_ALL
    return spec.name_pattern in _CATCH_ALL


def rule_label(spec: RuleSpec) -> str:
    """How accounting names a rule: its pattern (and file glob), then its conditions.

    Example:
        >>> rule_label(RuleSpec(match="*", max_elements=1, device="cpu"))
        "'*' max_elements 1"
        >>> rule_label(RuleSpec(file="train*", min_bytes="1GiB", ndim=[1, 2], device="cpu"))
        "file 'train*' min_bytes 1.0 GiB ndim 1 or 2"
    """
    conditions = []
    if spec.min_bytes is not None:
        conditions.append(f"min_bytes {format_size(spec.min_bytes)}")
    if spec.max_bytes is not None:
        conditions.append(f"max_bytes {format_size(spec.max_bytes)}")
    if spec.ndim is not None:
        conditions.append("ndim " + " or ".join(map(str, sorted(set(spec.ndim)))))
    if spec.min_elements is not None:
        conditions.append(f"min_elements {spec.min_elements:,}")
    if spec.max_elements is not None:
        conditions.append(f"max_elements {spec.max_elements:,}")
    return " ".join([spec.label, *conditions])


def rule_origin(entry: RuleEntry) -> str:
    """Where a rule is written; an environment rule with its item (they share a variable)."""
    return f"{entry.origin} item {entry.index}" if entry.source == "env" else entry.origin


def rule_uses(
    settings: Settings,
    conditions: Sequence[Condition],
    placed: Sequence[Placed],
    sources: Iterable[SourceFile] = (),
) -> tuple[RuleUse, ...]:
    """Every rule of `settings` in order, then the default, with what it took of `placed`
    and, for a rule that took nothing, why (see the module).

    Args:
        settings: The policy's settings.
        conditions: Each rule compiled, in rule order (`Decider.conditions`).
        placed: Every name met, with the rule that took it.
        sources: The files the names come from (for `file:` rules); none: not judged.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "a/*", "device": "cpu"}, {"match": "*/x", "device": "cpu"}]})
        >>> uses = rule_uses(p.settings, p.decider.conditions, [Placed("a/x", 0, 4)])
        >>> [(u.label, u.tensors, u.status) for u in uses]
        [("'a/*'", 1, 'took'), ("'*/x'", 0, 'shadowed'), ('default', 0, 'nothing')]
        >>> uses[1].note
        "shadowed by rule 0 (<mapping>:rules[0] 'a/*'), which took its 1 name first"
    """
    rules = settings.rules
    files = list(sources)
    tensors = [0] * (len(rules) + 1)
    nbytes = [0] * (len(rules) + 1)
    sharded = [0] * (len(rules) + 1)
    examples = [""] * (len(rules) + 1)
    for name, position, size, _, _, was_sharded in placed:
        i = len(rules) if position is None else position
        if not tensors[i]:
            examples[i] = name
        tensors[i] += 1
        nbytes[i] += size or 0
        sharded[i] += was_sharded
    catch_alls = [_catch_all(entry.spec) for entry in rules]
    reasons = _Reasons(rules, conditions, placed, files, catch_alls)
    uses = []
    for i, entry in enumerate(rules):
        status, note, near = (TOOK, "", None) if tensors[i] else reasons.why(i)
        uses.append(
            RuleUse(
                rule_origin(entry),
                rule_label(entry.spec),
                tensors[i],
                nbytes[i],
                entry.spec.sharding is not None,
                sharded[i],
                catch_alls[i],
                status not in (OTHER_FILES, OTHER_NAMES),
                examples[i],
                status,
                note,
                0 if near is None else len(near.indices),
                "" if near is None else placed[near.indices[0]].name,
                "" if near is None else reasons.taken_by(near.indices),
                i,
                entry.source,
                entry.spec.device is not None and parse_target(entry.spec.device).platform == "cpu",
            )
        )
    # The default is a device target (never a sharding) and takes every name.
    uses.append(
        RuleUse(
            settings.default.origin,
            "default",
            tensors[-1],
            nbytes[-1],
            False,
            catch_all=True,
            example=examples[-1],
            status=TOOK if tensors[-1] else NOTHING,
        )
    )
    return _one_prefix_guess(tuple(uses), reasons)


class _Reasons:
    """Why each rule that took nothing did: the names sorted once for prefix lookups."""

    def __init__(
        self,
        rules: tuple[RuleEntry, ...],
        conditions: Sequence[Condition],
        placed: Sequence[Placed],
        files: list[SourceFile],
        catch_alls: list[bool],
    ) -> None:
        self._rules = rules
        self._conditions = conditions
        self._placed = placed
        self._files = files
        self._catch_alls = catch_alls
        self._met_names: MetNames | None = None  # read on the first rule to explain
        self._name_parts: set[str] | None = None  # likewise
        self._parts_in_order: list[str] | None = None  # likewise
        #: Each `near` rule's slip, for `_one_prefix_guess`.
        self.slips: dict[int, NearMiss] = {}

    @property
    def _parts(self) -> set[str]:
        """Every part of every name, split at `/` and `.`: asked only of a rule that took
        nothing, so never made on a load whose rules all took something."""
        if self._name_parts is None:
            self._name_parts = {
                part for p in self._placed for part in p.name.replace(".", "/").split("/")
            }
        return self._name_parts

    @property
    def _sorted_parts(self) -> list[str]:
        """`_parts` in order (a close match is then the same from run to run)."""
        if self._parts_in_order is None:
            self._parts_in_order = sorted(self._parts)
        return self._parts_in_order

    @property
    def _met(self) -> MetNames:
        if self._met_names is None:
            catch_alls, placed = self._catch_alls, self._placed
            # Names no rule of their own took: the default's, or a catch-all's (a `file:`
            # rule chose its file's names: it is none).
            self._met_names = MetNames(
                [(p.name, p.nbytes, p.shape, p.source) for p in placed],
                [p.position is None or catch_alls[p.position] for p in placed],
            )
        return self._met_names

    def why(self, i: int) -> tuple[str, str, NearMiss | None]:
        """(status, note, slip) of rule `i`, which took nothing."""
        entry, condition = self._rules[i], self._conditions[i]
        glob = entry.spec.file
        if glob is not None and condition.file_test is not None:
            if not self._files:
                return OTHER_FILES, f"file {glob!r}: these names come from no file", None
            if not any(condition.file_test(f) for f in self._files):
                return OTHER_FILES, f"its file glob {glob!r} matches none of the files", None
        matching = self._matching(condition)
        if matching:
            whole = [k for k in matching if self._fits(condition, k)]
            if whole:
                return SHADOWED, self._shadowed(whole), None
            first = self._placed[matching[0]]
            why = condition.problem(first.nbytes, first.source, first.shape)
            return (
                CONDITIONS,
                f"its pattern matches {_names(len(matching))}, none it takes ({first.name}: {why})",
                None,
            )
        slip = near_miss(condition, self._met)
        if slip is not None:
            self.slips[i] = slip
            return NEAR, slip.fix, slip
        # A rule whose names start with a word no name holds (`dataset/*` in a model's
        # load) was written for other names, not misspelt for these.
        literal = literal_prefix(condition.pattern, condition.is_regex)
        lead = re.split(r"[/.]", literal, maxsplit=1)[0]
        if lead and lead not in self._parts:
            return OTHER_NAMES, f"no name holds its first word {lead!r}", None
        # Likewise a rule whose names end in a part no name holds (the shipped policy's
        # `*/tokens` in a model's load): unless a part is a slip away (`*/kernal`), then
        # it was meant for these names, and stays a finding.
        tail = last_word(condition.pattern, condition.is_regex)
        if tail and tail not in self._parts:
            held = difflib.get_close_matches(tail, self._sorted_parts, n=1, cutoff=TYPO_CUTOFF)
            if not held:
                return OTHER_NAMES, f"no name holds its last word {tail!r}", None
            return (
                NOTHING,
                f"no name holds its last word {tail!r}: did you mean {held[0]!r}?",
                None,
            )
        return NOTHING, NO_MATCH, None

    def _matching(self, condition: Condition) -> list[int]:
        """The names (by position) the rule's pattern matches: only those starting with
        its literal prefix are tried."""
        prefix = literal_prefix(condition.pattern, condition.is_regex)
        facts = self._met.facts
        return [k for k in self._met.starting(prefix) if condition.test(facts[k][0])]

    def _fits(self, condition: Condition, k: int) -> bool:
        p = self._placed[k]
        return condition.problem(p.nbytes, p.source, p.shape) is None

    def _shadowed(self, whole: list[int]) -> str:
        return f"shadowed by {self.taken_by(whole)}, which took its {_names(len(whole))} first"

    def _shown(self, position: int) -> str:
        entry = self._rules[position]
        return f"{rule_origin(entry)} {rule_label(entry.spec)}"

    def first_words(self) -> set[str]:
        """The first words the policy's name rules are written with: the word before the
        first `/` of the text every name a rule matches starts with ("" for a rule that
        may match names of any first word, such as `*/tokens`); rules on files (`file:`)
        and on whole words (`batch*`) left out."""
        words = set()
        for entry, condition in zip(self._rules, self._conditions, strict=True):
            if entry.spec.file is not None:
                continue
            lead = literal_prefix(condition.pattern, condition.is_regex)
            if not lead or "/" in lead:
                words.add(lead.split("/", 1)[0])
        return words

    def taken_by(self, indices: Iterable[int]) -> str:
        """Who took these names: `rule p.yaml:9 ('llama/*')`, `the default`."""
        takers = sorted(
            {self._placed[k].position for k in indices}, key=lambda p: -1 if p is None else p
        )
        return " and ".join(
            "the default" if p is None else f"rule {p} ({self._shown(p)})" for p in takers
        )


def _one_prefix_guess(uses: tuple[RuleUse, ...], reasons: _Reasons) -> tuple[RuleUse, ...]:
    """A broad rule (`params/*`) fits any names put under its first word, so a prefix slip
    is named for it only where the policy's name rules all start with that word (a policy
    written for `params/...` names): beside rules with other first words (`dataset/*`
    beside `model/*`, or beside `.*/kernel`, which takes names of any prefix) it was
    written for other names."""
    broad = {i: s for i, s in reasons.slips.items() if s.kind == "prefix" and s.broad}
    if not broad:
        return uses
    words = reasons.first_words()
    out = []
    for i, use in enumerate(uses):
        slip = broad.get(i)
        if slip is not None and words != {slip.word}:
            use = replace(
                use,
                applies=False,
                status=OTHER_NAMES,
                note=f"no name holds its first word {slip.word!r}",
                meant=0,  # no longer a near miss: what it would have meant goes too
                meant_example="",
                meant_by="",
            )
        out.append(use)
    return tuple(out)


def _names(count: int) -> str:
    return f"{count} name{'' if count == 1 else 's'}"


def _took(use: RuleUse) -> str:
    return (
        "the default" if use.label == "default" else f"rule {use.origin} ({use.label})"
    ) + f" took {use.tensors}"


def silent_rules(uses: tuple[RuleUse, ...], quiet: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """What a load, plan or name list should not pass over in silence, as (code, message):

    - `rule-matched-nothing`: a rule took no tensor but would have but for a slip (its fix
      said, and who took those names instead: a sharding rule's names placed whole by a
      later rule included), or took none while the default or a catch-all took some (the
      names it was written for are probably spelled otherwise);
    - `not-sharded`: the policy shards, yet the default or a catch-all device rule placed
      tensors whole (a rule whose own device is a host device places them there on
      purpose: not counted; nor is a `file:` rule, which is no catch-all).

    A rule shadowed by an earlier one, or whose conditions take none of the names its
    pattern matches, or written for other files or names, is not reported; nor is a rule
    of a layer in `quiet` (said elsewhere).

    Example:
        >>> uses = (RuleUse("p.yaml:3", "'model/*'", 0, 0, True, status="nothing"),
        ...         RuleUse("default", "default", 2, 8, False, catch_all=True, example="m/w"))
        >>> [code for code, _ in silent_rules(uses)]
        ['rule-matched-nothing', 'not-sharded']
    """
    fell = [u for u in uses if u.catch_all and u.tensors]
    found: list[tuple[str, str]] = []
    for u in uses:
        if u.layer in quiet:
            continue
        if u.status == NEAR:
            how = " whole" if u.shards else ""
            found.append(
                (
                    "rule-matched-nothing",
                    f"rule {u.origin} ({u.label}) took no tensor but was written for "
                    f"{u.meant} of these names (e.g. {u.meant_example!r}), which "
                    f"{u.meant_by} placed{how} instead: {u.note}",
                )
            )
        elif u.status == NOTHING and fell and not u.catch_all:
            took = " and ".join(_took(f) for f in fell)
            why = f" ({u.note})" if u.note and u.note != NO_MATCH else ""
            found.append(
                (
                    "rule-matched-nothing",
                    f"rule {u.origin} ({u.label}) took no tensor{why}, while {took}; names "
                    f"look like {fell[0].example!r}: check the rule against them "
                    "(devpolicy check --names), or set the policy's `names:` (separator, "
                    "prefix)",
                )
            )
    if any(u.shards for u in uses):
        whole = [u for u in fell if not u.shards and not u.host]
        count = sum(u.tensors for u in whole)
        if count:
            nbytes = sum(u.nbytes for u in whole)
            by = " and ".join(
                "the default" if u.label == "default" else f"catch-all rule {u.origin}"
                for u in whole
            )
            found.append(
                (
                    "not-sharded",
                    f"{count} tensor{'' if count == 1 else 's'} ({format_size(nbytes)}) placed "
                    f"whole by {by} (e.g. {whole[0].example!r}), while the policy shards others",
                )
            )
    return found


def sharded_nothing(uses: tuple[RuleUse, ...]) -> bool:
    """Whether the policy has sharding rules and none of these tensors is sharded,
    although some asked for it (a sharding rule's tensors fell back to a device), fell
    through to the default or a catch-all (one to a host device is a declared place, not a
    fall), or were placed whole by another rule where a sharding rule would have taken
    them but for a slip, or while a sharding rule took none for no reason found (`plan`
    exits 3). A plan whose every tensor went where a rule declared exits 0.

    Example:
        >>> sharded_nothing((RuleUse("p:3", "'a/b'", 0, 0, True, status="near", meant=5),
        ...                  RuleUse("p:4", "'a/*'", 5, 80, False)))
        True
    """
    if not any(u.shards for u in uses) or any(u.sharded for u in uses):
        return False
    fell = any(u.tensors and u.catch_all for u in uses)
    return any(u.tensors and (u.shards or (u.catch_all and not u.host)) for u in uses) or any(
        u.shards and (u.status == NEAR or (u.status == NOTHING and fell)) for u in uses
    )


def shadowed_notes(uses: tuple[RuleUse, ...]) -> list[str]:
    """Each rule that took nothing because earlier rules took its names, as a sentence."""
    return [
        f"rule {u.origin} ({u.label}) took no tensor: {u.note}"
        for u in uses
        if u.status == SHADOWED
    ]


def uses_of_decisions(
    settings: Settings,
    conditions: Sequence[Condition],
    facts: Sequence[tuple[str, int | None, tuple[int, ...] | None, SourceFile | None]],
    decisions: Sequence[Decision | None],
    sources: Iterable[SourceFile],
) -> tuple[RuleUse, ...]:
    """`rule_uses` for decided tensors, each given as (name, bytes, shape, file): one
    without a decision (no device could be had) or decided under DEVPOLICY_DISABLE counts
    for no rule."""
    position = {(e.source, e.index): i for i, e in enumerate(settings.rules)}
    return rule_uses(
        settings,
        conditions,
        [
            Placed(
                name,
                None if d.rule is None else position.get((d.source, d.rule)),
                nbytes,
                shape,
                source,
                d.is_sharded,
            )
            for (name, nbytes, shape, source), d in zip(facts, decisions, strict=True)
            if d is not None and d.source != "disabled"
        ],
        sources,
    )
