"""What each `DEVPOLICY_RULES` item took, for one decider, and what it says when an item
misses: an override is set to move something, so one that moves nothing must not pass
in silence.

- In a placement of many names (a load, a `put` of a tree) an item that took none of
  them warns at once, and once, where a slip explains the miss (`nearby`: `modle/*` for
  `model/...`, `.` between the parts, a prefix): the names it could have meant, and the
  fix.
- An item that took no name in the whole process (no load, placement or scope) warns
  when the process ends, naming the names that were placed and the rules that took them
  (its names may well come in a later load: only the end of the process knows that it
  moved nothing).
- An item that took the tensors of a policy rule that maps them (`mmap: true`) but does
  not map them itself warns once: the item replaces that rule (it keeps the fields of a
  rule written with its own glob only), so the tensors are read into memory; the item to
  write instead (`file:GLOB=target`) is named.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Sequence
from typing import Any

from .._base.events import EventLog
from .._document.environment import FILE_FORM, RULES
from .._document.layers import RuleEntry, Settings
from .._document.schema import RuleSpec
from .._document.targets import spec_entry_text
from .._names.matching import Condition, SourceFile
from .._names.nearby import Fact, MetNames, near_miss
from .decision import Decision

#: How many names the end-of-process warning keeps to show (one per rule that took any).
SEEN_RULES = 8


def item_text(spec: RuleSpec) -> str:
    """A `DEVPOLICY_RULES` item as it is written: `pattern=target`.

    Example:
        >>> item_text(RuleSpec(file="train*.safetensors", device="cpu:1"))
        'file:train*.safetensors=cpu:1'
    """
    pattern = f"{FILE_FORM}{spec.file}" if spec.match is None else spec.match
    if spec.sharding is None:
        return f"{pattern}={spec.device}"
    entries = ",".join(spec_entry_text(e) for e in spec.sharding.spec)
    return f"{pattern}={spec.sharding.mesh}[{entries}]"


class Overrides:
    """The `DEVPOLICY_RULES` items of one decider's settings and what each took.

    `decided` is called for each fresh decision (never on the cached path), `placed` once
    per placement of many names; `unused` is asked when the process ends.
    """

    __slots__ = (
        "__weakref__",
        "_conditions",
        "_events",
        "_items",
        "_rules",
        "_seen",
        "_taken",
        "_warned",
    )

    def __init__(
        self, settings: Settings, conditions: Sequence[Condition], events: EventLog
    ) -> None:
        self._rules = settings.rules
        self._conditions = conditions
        self._events = events
        #: Position in the settings' rules of each item, by its index in the variable.
        self._items = {e.index: i for i, e in enumerate(settings.rules) if e.source == "env"}
        self._taken: set[int] = set()
        self._warned: set[tuple[str, int]] = set()
        # A name placed by each rule (origin), with its file: what the end says was placed.
        self._seen: dict[str, tuple[str, SourceFile | None, int | None]] = {}
        _LIVE.add(self)
        _arm_at_exit()
        if self._items:  # collected before the end: what it would have said is kept
            weakref.finalize(self, _collected, self._rules, self._conditions, self._events,
                             self._items, self._taken, self._warned, self._seen)  # fmt: skip

    def decided(self, decision: Decision[Any], source: SourceFile | None) -> None:
        """A fresh decision: which item took it, and a name to show per rule."""
        if decision.source == "env" and decision.rule is not None:
            self._taken.add(decision.rule)
        elif len(self._seen) < SEEN_RULES and decision.origin not in self._seen:
            position = self._position(decision)
            self._seen[decision.origin] = (decision.name, source, position)

    def _position(self, decision: Decision[Any]) -> int | None:
        if decision.rule is None:
            return None
        for i, entry in enumerate(self._rules):
            if entry.source == decision.source and entry.index == decision.rule:
                return i
        return None

    def placed(self, facts: Sequence[Fact], decisions: Sequence[Decision[Any]]) -> None:
        """One placement of many names (a load, a `put` of a tree): each item that took
        none of them but would have but for a slip warns (once); each that took names a
        mapping policy rule would have taken, without mapping them itself, warns (once)."""
        took: dict[int, int] = {}
        for k, d in enumerate(decisions):
            if d.source == "env" and d.rule is not None and d.rule not in took:
                took[d.rule] = k
        for index, position in self._items.items():
            entry = self._rules[position]
            if index in took:
                self._lost_mmap(index, entry, facts[took[index]])
            elif index not in self._taken and ("missed", index) not in self._warned:
                self._missed(index, position, entry, facts, decisions)

    def _missed(
        self,
        index: int,
        position: int,
        entry: RuleEntry,
        facts: Sequence[Fact],
        decisions: Sequence[Decision[Any]],
    ) -> None:
        condition = self._conditions[position]
        slip = near_miss(condition, MetNames(facts, [d.rule is None for d in decisions]))
        if slip is None:
            return
        self._warned.add(("missed", index))
        example = facts[slip.indices[0]][0]
        count = len(slip.indices)
        self._events.emit(
            "warning",
            "override_matched_nothing",
            {
                "variable": RULES,
                "item": index,
                "rule": item_text(entry.spec),
                "message": (
                    f"{RULES} item {index} ({item_text(entry.spec)!r}) took none of the "
                    f"{len(facts)} names placed{_from(facts)}, but was written for {count} of "
                    f"them (e.g. {example!r}): {slip.fix}"
                ),
            },
        )

    def _lost_mmap(self, index: int, entry: RuleEntry, fact: Fact) -> None:
        """The item took `fact`'s name: say so if a policy rule would have mapped it."""
        if entry.spec.mmap or ("mmap", index) in self._warned:
            return
        name, nbytes, shape, source = fact
        for position, rule in enumerate(self._rules):
            if rule.source != "policy":
                continue
            condition = self._conditions[position]
            if not condition.test(name) or condition.problem(nbytes, source, shape) is not None:
                continue
            if rule.spec.mmap:
                self._warned.add(("mmap", index))
                written = _override_for(rule.spec, entry.spec)
                fix = (
                    "no item can name that rule: set the device in the policy"
                    if written is None
                    else f"write {written!r}"
                )
                self._events.emit(
                    "warning",
                    "override_not_mapped",
                    {
                        "variable": RULES,
                        "item": index,
                        "rule": item_text(entry.spec),
                        "message": (
                            f"{RULES} item {index} ({item_text(entry.spec)!r}) took {name!r} "
                            f"from rule {rule.origin} ({rule.spec.label}, mmap: true) and "
                            "replaces it: its tensors are read into memory, not mapped (an "
                            "item keeps the `mmap` of the rule it overrides only where it "
                            f"names that rule's own glob): {fix}"
                        ),
                    },
                )
            return

    def unused(self) -> list[tuple[int, str]]:
        """Each item that took no name at all (and did not already warn), with the
        message that says so; empty when nothing was placed."""
        if not self._seen and not self._taken:
            return []
        out = []
        for index, position in self._items.items():
            if index in self._taken or ("missed", index) in self._warned:
                continue
            entry = self._rules[position]
            out.append((index, self._unused_message(index, position, entry)))
        return out

    def _unused_message(self, index: int, position: int, entry: RuleEntry) -> str:
        seen = list(self._seen.items())
        placed = ", ".join(
            f"{name!r} by {origin}" + ("" if source is None else f" (from {source.names[0]})")
            for origin, (name, source, _) in seen
        )
        message = (
            f"{RULES} item {index} ({item_text(entry.spec)!r}) took nothing in this process: "
            f"none of the names placed matches it (one per rule: {placed})"
        )
        facts: list[Fact] = [(name, None, None, source) for _, (name, source, _) in seen]
        slip = near_miss(self._conditions[position], facts)
        if slip is not None and not (slip.kind == "prefix" and slip.broad):
            return f"{message}; {slip.fix}"
        # Names a policy `file:` rule took are moved by naming their file: likelier meant
        # than a prefix any names would fit (`dataset/*` for `train/tokens`).
        for _, (_, source, rule) in seen:
            if rule is None or source is None:
                continue
            spec = self._rules[rule].spec
            written = _override_for(spec, entry.spec)
            if spec.file is not None and written is not None:
                return (
                    f"{message}; to move the tensors of {source.names[0]} (rule "
                    f"{self._rules[rule].origin}, {spec.label}), name their file: {written!r}"
                )
        return message if slip is None else f"{message}; {slip.fix}"

    def say_unused(self, said: set[str] | None = None) -> None:
        """Warn, once each, about the items that took nothing (at the end of the process);
        a message in `said` (another policy's of the same items) is not said again, and
        each one said is added to it."""
        for index, message in self.unused():
            self._warned.add(("missed", index))
            if said is not None:
                if message in said:
                    continue
                said.add(message)
            self._events.emit(
                "warning",
                "override_matched_nothing",
                {
                    "variable": RULES,
                    "item": index,
                    "rule": item_text(self._rules[self._items[index]].spec),
                    "message": message,
                },
            )


def _from(facts: Sequence[Fact]) -> str:
    """` from FILE` where the names of a placement come from one file (a load)."""
    files = {source.names[0] for *_, source in facts if source is not None}
    return f" from {files.pop()}" if len(files) == 1 else ""


def _override_for(policy_rule: RuleSpec, item: RuleSpec) -> str | None:
    """The item that sends `policy_rule`'s names where `item` sends them and keeps how
    that rule loads them (an item with the rule's own glob: `file:GLOB` for a `file:`
    rule); None for a rule no item can name so (a regex, a name and a file)."""
    target = item_text(item).rpartition("=")[2]
    named = policy_rule.match is not None or policy_rule.regex is not None
    if policy_rule.search is None and not named and policy_rule.file is not None:
        return f"{FILE_FORM}{policy_rule.file}={target}"
    if policy_rule.match is not None and policy_rule.file is None:
        return f"{policy_rule.match}={target}"
    return None


#: Every live decider's overrides: the end of the process asks each what took nothing.
_LIVE: weakref.WeakSet[Overrides] = weakref.WeakSet()
_armed: list[bool] = [False]


def _arm_at_exit() -> None:
    if not _armed[0]:
        _armed[0] = True
        atexit.register(at_exit)


#: What the items of policies collected before the end would say then, by message (at most
#: `MAX_COLLECTED`: a program that makes a policy per step repeats the same few messages).
_COLLECTED: dict[str, tuple[EventLog, dict[str, Any]]] = {}
MAX_COLLECTED = 64


def _collected(
    rules: Any, conditions: Any, events: EventLog, items: Any, taken: Any, warned: Any, seen: Any
) -> None:
    """A decider's overrides were collected (its policy dropped: `load_file(f,
    policy=load_policy(...))`): their items that took nothing are said at the end all the
    same. Its names are final now: no load can use that policy again."""
    ghost = object.__new__(Overrides)
    for name, value in (("_rules", rules), ("_conditions", conditions), ("_events", events),
                        ("_items", items), ("_taken", taken), ("_warned", warned),
                        ("_seen", seen)):  # fmt: skip
        object.__setattr__(ghost, name, value)
    for index, message in ghost.unused():
        if message in _COLLECTED or len(_COLLECTED) >= MAX_COLLECTED:
            continue
        fields = {"variable": RULES, "item": index,
                  "rule": item_text(rules[items[index]].spec), "message": message}  # fmt: skip
        _COLLECTED[message] = (events, fields)


def at_exit() -> None:
    """The end of the process: each item that took nothing says so, of a live policy or of
    one collected before. A process with several policies of the same items (one activated,
    one dropped after a load) says each message once."""
    said: set[str] = set()
    for overrides in list(_LIVE):
        overrides.say_unused(said)
    collected = list(_COLLECTED.items())
    _COLLECTED.clear()
    for message, (events, fields) in collected:
        if message not in said:
            said.add(message)
            events.emit("warning", "override_matched_nothing", fields)
