"""Rule-use accounting: what each rule of a policy took in a load, a plan or a list of
names, and what should not pass in silence (a rule that took nothing while a catch-all
took names; tensors placed whole by a policy that shards).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from .._base.events import EventLog
from .._base.sizes import format_size
from .._decide.decision import Decision
from .._document.layers import RuleEntry, Settings
from .._names.matching import SourceFile, compile_file_glob
from .._names.prefixes import literal_prefix
from .checkpoints import open_checkpoint
from .format import read_header
from .naming import PathLike, name_prefix, source_files, tensor_names

#: Patterns that take every name: a rule written with one is a catch-all.
_CATCH_ALL = {("*", False), (".*", True), ("(?s).*", True), ("(?s:.*)", True)}
_SEARCH_ALL = ("", ".*", "(?s).*", "^", "(?s:.*)")


@dataclass(frozen=True, slots=True)
class RuleUse:
    """How many tensors one rule (or the default) took in a load, a plan or a name list.

    Attributes:
        origin: Where the rule is written (`policy.yaml:7`), or the default's origin.
        label: The rule's pattern (`'model/*'`, `search 'wo/kernel'`), or `default`.
        tensors: Tensors it took.
        nbytes: Their bytes.
        shards: Whether it asks for a sharding.
        sharded: Tensors it sharded (a sharding that fell back to a device is not).
        catch_all: Whether it takes every name (`*`, `.*`; the default too).
        applies: False for a rule that could not have taken anything here: its `file:`
            matches none of the files, or its pattern starts with a word (`dataset` of
            `dataset/*`) that is no part of any name.
        example: The first name it took, or "".
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


def _catch_all(entry: RuleEntry) -> bool:
    spec = entry.spec
    conditions = (spec.min_bytes, spec.max_bytes, spec.ndim, spec.min_elements, spec.max_elements)
    if any(c is not None for c in conditions):
        return False
    if spec.search is not None:
        return spec.search in _SEARCH_ALL
    return spec.name_pattern in _CATCH_ALL


def rule_uses(
    settings: Settings,
    taken: Iterable[tuple[str, int | None, int, bool]],
    sources: Iterable[SourceFile] = (),
) -> tuple[RuleUse, ...]:
    """Every rule of `settings` in order, then the default, with what it took of `taken`:
    (name, position of its rule in `settings.rules` or None for the default, bytes,
    whether it was sharded).

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "a/*", "device": "cpu"}, {"match": "b/*", "device": "cpu"}]})
        >>> [(u.label, u.tensors) for u in rule_uses(p.settings, [("a/x", 0, 4, False)])]
        [("'a/*'", 1), ("'b/*'", 0), ('default', 0)]
    """
    rules = settings.rules
    files = list(sources)
    tensors = [0] * (len(rules) + 1)
    nbytes = [0] * (len(rules) + 1)
    sharded = [0] * (len(rules) + 1)
    examples = [""] * (len(rules) + 1)
    parts: set[str] = set()  # every part of every name, split at `/` and `.`
    for name, position, size, was_sharded in taken:
        parts.update(name.replace(".", "/").split("/"))
        i = len(rules) if position is None else position
        if not tensors[i]:
            examples[i] = name
        tensors[i] += 1
        nbytes[i] += size
        sharded[i] += was_sharded
    uses = []
    for i, entry in enumerate(rules):
        applies = True
        if entry.spec.file is not None and files:
            glob = compile_file_glob(entry.spec.file)
            applies = any(glob(f) for f in files)
        if applies and not tensors[i]:
            # A rule whose names start with a word no name holds (`dataset/*` in a model's
            # load) was written for other names, not misspelt for these.
            lead = re.split(r"[/.]", literal_prefix(*entry.spec.name_pattern), maxsplit=1)[0]
            applies = not lead or lead in parts
        uses.append(
            RuleUse(
                entry.origin,
                entry.spec.label,
                tensors[i],
                nbytes[i],
                entry.spec.sharding is not None,
                sharded[i],
                _catch_all(entry),
                applies,
                examples[i],
            )
        )
    # The default is a device target (never a sharding) and takes every name.
    default = RuleUse(settings.default.origin, "default", tensors[-1], nbytes[-1], False)
    uses.append(replace(default, catch_all=True, example=examples[-1]))
    return tuple(uses)


def silent_rules(uses: tuple[RuleUse, ...]) -> list[tuple[str, str]]:
    """What a load, plan or name list should not pass over in silence, as (code, message):

    - `rule-matched-nothing`: a rule took no tensor while the default or a catch-all took
      some (the names it was written for are probably spelled otherwise);
    - `not-sharded`: the policy shards, yet the default or a catch-all device rule placed
      tensors whole.

    Example:
        >>> uses = (RuleUse("p.yaml:3", "'model/*'", 0, 0, True),
        ...         RuleUse("default", "default", 2, 8, False, catch_all=True, example="m/w"))
        >>> [code for code, _ in silent_rules(uses)]
        ['rule-matched-nothing', 'not-sharded']
    """
    fell = [u for u in uses if u.catch_all and u.tensors]
    found: list[tuple[str, str]] = []
    if fell:
        took = " and ".join(
            f"{'the default' if u.label == 'default' else f'rule {u.origin} ({u.label})'} "
            f"took {u.tensors}"
            for u in fell
        )
        example = fell[0].example
        for u in uses:
            if u.tensors == 0 and u.applies and not u.catch_all:
                found.append(
                    (
                        "rule-matched-nothing",
                        f"rule {u.origin} ({u.label}) took no tensor, while {took}; names "
                        f"look like {example!r}: check the rule against them "
                        "(devpolicy check --names), or set the policy's `names:` (separator, "
                        "prefix)",
                    )
                )
    if any(u.shards for u in uses):
        whole = [u for u in fell if not u.shards]
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


def checkpoint_names(
    path: PathLike, settings: Settings, prefix: str | None = None
) -> list[tuple[str, int | None, tuple[int, ...] | None, SourceFile | None]]:
    """Every tensor of a checkpoint as `load_file` and `plan` name it (prefix, the
    policy's `names:`), with its size, shape and file; only headers are read."""
    checkpoint = open_checkpoint(path)
    headers = [read_header(file) for file in checkpoint.files]
    checkpoint.check(headers)
    stem = name_prefix(checkpoint.stem, prefix, settings.names)
    sources = source_files(checkpoint.files, path)
    return [
        (name, t.nbytes, t.shape, source)
        for header, source in zip(headers, sources, strict=True)
        for name, t in zip(tensor_names(header, stem, settings.names), header.tensors, strict=True)
    ]


def uses_of_decisions(
    settings: Settings,
    names: list[str],
    decisions: list[Decision | None],
    sources: list[SourceFile],
) -> tuple[RuleUse, ...]:
    """`rule_uses` for decided tensors (one without a device counts for no rule)."""
    position = {(e.source, e.index): i for i, e in enumerate(settings.rules)}
    return rule_uses(
        settings,
        (
            (
                name,
                None if d.rule is None else position.get((d.source, d.rule)),
                d.nbytes or 0,
                d.is_sharded,
            )
            for name, d in zip(names, decisions, strict=True)
            if d is not None and d.source != "disabled"
        ),
        sources,
    )


def silent_events(events: EventLog, uses: tuple[RuleUse, ...], path: PathLike) -> None:
    """The warnings of `silent_rules` for one load, as one event each."""
    for code, message in silent_rules(uses):
        events.emit(
            "warning", code.replace("-", "_"), {"checkpoint": os.fspath(path), "message": message}
        )
