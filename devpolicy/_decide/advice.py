"""The warnings that tell a user which rule to write: a large tensor the default decided
(`warn_large_by_default`), and leaves of an `axes: attached` rule that carried no axis
names or names its mesh's table lacks (`AttachedRules`).

Each says what happened, how many names it concerns (with a few `EXAMPLES`) and the rule
or table entry that would fix it; the first occurrence is a warning, repeats debug.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .._base.events import EventLog
from .._base.sizes import format_size
from .._document.axes import Attached
from .._document.schema import Source
from .._document.targets import AttachedTarget
from .._names.matching import SourceFile
from .decision import Decision
from .items import Shape

#: How many leaf names a warning about many leaves gives as examples.
EXAMPLES = 3

#: A tensor at least this large decided only by the default gets a warning naming the
#: rule to write: 1 GiB is past what any accelerator holds without noticing, and below
#: a token dataset's size.
LARGE_BY_DEFAULT = 2**30


def _rule_to_write(name: str, source: SourceFile | None) -> str:
    """The rule that would name a tensor's place, by its file where it has one: one line
    of YAML to paste under `rules:` (a console shows a newline in a field as `\\n`).

    Example:
        >>> print(_rule_to_write("cache/kv", None))
        - {match: "cache/kv", device: cpu}
    """
    # A JSON string is a YAML double-quoted scalar: any name pastes as written.
    if source is not None:
        return f"- {{file: {json.dumps(source.names[0], ensure_ascii=False)}, device: cpu}}"
    return f"- {{match: {json.dumps(name, ensure_ascii=False)}, device: cpu}}"


def warn_large_by_default(
    events: EventLog, decision: Decision[Any], source: SourceFile | None
) -> None:
    """Warn, once per tensor (or file), that a large tensor went where no rule said: the
    default, JAX's default device (`auto`), decided it. The caller has checked that it is
    large, and that the default is `auto` (a default written to a device is an answer)."""
    if not events.first_time(("large_by_default", source or decision.name)):
        return
    fields: dict[str, Any] = {
        "name": decision.name,
        "nbytes": decision.nbytes,
        "device": decision.device_text,
        "origin": decision.origin,
    }
    if source is not None:
        fields["file"] = source.shown
    fields["suggested_rule"] = _rule_to_write(decision.name, source)
    fields["hint"] = (
        f"no rule names it, so the default put {format_size(decision.nbytes or 0)} on "
        f"{decision.device_text}, which differs between machines; add this rule "
        "(device: cpu keeps it on the host; gpu:0 if it belongs on the accelerator), or "
        "a `default:` device for every name no rule names"
    )
    events.emit("warning", "large_by_default", fields)


#: A rule as its decisions name it: (source, index in its layer).
RuleKey = tuple[Source, int | None]


class AttachedRules:
    """A policy's rules with `axes: attached` (by `RuleKey`), and the warnings of one
    placement decided by them: the leaves that carried no names (replicated), and each
    logical name a mesh's table lacks (that dimension is not sharded, as flax does).

    Args:
        rules: Each such rule's key, origin (`file:line`) and target.
    """

    __slots__ = ("_origins", "_targets")

    def __init__(self, rules: Iterable[tuple[RuleKey, str, AttachedTarget]]) -> None:
        self._targets: dict[RuleKey, AttachedTarget] = {}
        self._origins: dict[RuleKey, str] = {}
        for key, origin, target in rules:
            self._targets[key] = target
            self._origins[key] = origin

    def __bool__(self) -> bool:
        """Whether the policy has any such rule (else nothing is gathered to report)."""
        return bool(self._targets)

    def report(
        self,
        events: EventLog,
        decisions: list[Decision[Any]],
        carried: list[tuple[Attached | None, Shape | None]],
    ) -> None:
        """Warn of one placement's leaves: `carried` holds what each leaf carried (its
        attached names and shape), in the order of `decisions`."""
        unnamed: dict[RuleKey, list[str]] = {}
        unknown: dict[tuple[RuleKey, str], list[str]] = {}
        for decision, (attached, shape) in zip(decisions, carried, strict=True):
            if not decision.attached:
                continue
            rule = (decision.source, decision.rule)
            if attached is None:
                if shape != ():
                    unnamed.setdefault(rule, []).append(decision.name)
                continue
            if attached.mesh_axes:
                continue
            target = self._targets[rule]
            known = target.known
            for n in attached.names:
                if isinstance(n, str) and n not in known:
                    unknown.setdefault((rule, n), []).append(decision.name)
        for rule, names in unnamed.items():
            target = self._targets[rule]
            origin = self._origins[rule]
            count = len(names)
            level = (
                "warning"
                if events.first_time(("no_attached_axes", origin, count, names[0]))
                else "debug"
            )
            events.emit(
                level,
                "no_attached_axes",
                {
                    "rule": origin,
                    "mesh": target.mesh,
                    "leaves": count,
                    "examples": names[:EXAMPLES],
                    "hint": f"`axes: attached` shards a leaf by the axis names its framework "
                    f"attached to it, and {'this leaf carries' if count == 1 else 'these carry'}"
                    f" none, so {'it is' if count == 1 else 'they are'} replicated over mesh "
                    f"{target.mesh!r}: name the axes in the model (flax "
                    "nn.with_logical_partitioning, nnx.with_partitioning, haliax axes), or give "
                    f"{'it a rule of its own' if count == 1 else 'them a rule of their own'} "
                    "before this one "
                    f'(e.g. `- match: "{names[0]}"` with `sharding: {{mesh: {target.mesh}, '
                    "spec: []}`)",
                },
            )
        for (rule, axis), names in unknown.items():
            target = self._targets[rule]
            origin = self._origins[rule]
            level = (
                "warning" if events.first_time(("unknown_logical_axis", origin, axis)) else "debug"
            )
            listed = ", ".join(sorted(target.known)) or "none"
            events.emit(
                level,
                "unknown_logical_axis",
                {
                    "rule": origin,
                    "axis": axis,
                    "mesh": target.mesh,
                    "leaves": len(names),
                    "examples": names[:EXAMPLES],
                    "axis_rules": listed,
                    "hint": f"logical axis {axis!r} is not in the axis_rules of mesh "
                    f"{target.mesh!r} ({listed}), so that dimension is not sharded (as flax's "
                    f"logical_to_mesh_axes does); add a pair `[{axis}, MESH_AXIS]` to "
                    f"axis_rules, or `[{axis}, null]` to replicate it on purpose",
                },
            )
