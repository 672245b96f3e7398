"""`check --names`: the real names a policy is linted against (a checkpoint's tensors, or
a JSON list or object of names), and the lint by them: rules that take none of them
(and why: shadowed, their conditions, a slip in the pattern), tensors placed whole
beside sharding rules. The findings are `lint`'s `Finding`s.
"""

from __future__ import annotations

import json
import math
import os

from .._base.files import FileRefused, read_capped
from .._base.locations import URLPath, is_url
from .._decide.rule_use import NEAR, NO_MATCH, NOTHING, Placed, RuleUse, rule_uses, silent_rules
from .._io.format.header import DTYPES
from .._io.reading.naming import checkpoint_names
from .._names.matching import SourceFile
from .lint import Finding
from .policy import Policy

#: The largest names file read (as for a checkpoint index): some 600,000 names with shapes.
_MAX_NAMES_BYTES = 64 << 20

NameItem = tuple[str, int | None, tuple[int, ...] | None, SourceFile | None]
NAMES_FORMS = (
    "a safetensors file, checkpoint directory or index (its tensors' names, as load_file "
    "names them), or a .json file: a list of names, or an object of name -> "
    '{"shape": [4096, 32000], "dtype": "bfloat16", "axes": ["embed", null]} (each '
    "optional; dtype a numpy or safetensors name: float32, F32; axes the names the model "
    "attaches, one per dimension, for rules with `axes: attached`)"
)
#: What `plan --tree` and `explain --tree` read: the JSON object form of `NAMES_FORMS`.
TREE_FORMS = (
    'a .json object of name -> {"shape": [...], "dtype": ..., "axes": ["embed", null]} '
    "(names as load_file names the tensors; axes: what the model attaches to each leaf, "
    "[] or left out for a leaf that carries none)"
)


def read_names(
    path: str | os.PathLike[str] | URLPath, policy: Policy, prefix: str | None = None
) -> list[NameItem]:
    """The names `check --names` lints against (see `NAMES_FORMS`).

    Raises:
        ValueError: the file is not a regular file, is over 64 MiB, is not JSON or not one
            of the accepted forms (naming the file, and the entry).
        SafetensorsFileError: the checkpoint cannot be read.
    """
    if isinstance(path, URLPath) or is_url(path):
        return checkpoint_names(path, policy.settings, prefix)
    text = os.fspath(path)
    if not text.endswith(".json") or text.endswith(".safetensors.index.json"):
        return checkpoint_names(path, policy.settings, prefix)
    data = _json(path, NAMES_FORMS)
    if isinstance(data, list) and all(isinstance(n, str) for n in data):
        return [(n, None, None, None) for n in data]
    if not isinstance(data, dict):
        raise ValueError(f"{text}: a {type(data).__name__} of names is not accepted; {NAMES_FORMS}")
    return [item for item, _ in _entries(text, data)]


def read_tree(path: str | os.PathLike[str]) -> dict[str, tuple[NameItem, tuple[str | None, ...]]]:
    """What `plan --tree` and `explain --tree` read (`TREE_FORMS`): by name, the name's
    item (size, shape) and the axis names its leaf carries (`()`: none).

    Raises:
        ValueError: not a JSON object of that form (naming the entry).
    """
    text = os.fspath(path)
    data = _json(path, TREE_FORMS)
    if not isinstance(data, dict):
        raise ValueError(f"{text}: a {type(data).__name__} is not accepted; {TREE_FORMS}")
    return {item[0]: (item, axes) for item, axes in _entries(text, data)}


def _json(path: str | os.PathLike[str], forms: str) -> object:
    """A JSON file of names, read as every other input is: a regular file only (a FIFO
    never waited on, a link to /dev/zero never read), at most `_MAX_NAMES_BYTES`.

    Raises:
        ValueError: naming the file and why (and the accepted `forms`).
    """
    text = os.fspath(path)
    try:
        raw = read_capped(path, _MAX_NAMES_BYTES, "a JSON file of names")
    except FileRefused as e:
        raise ValueError(f"{text}: {e.reason}") from None
    try:
        return json.loads(raw)  # bytes: UTF-8 (or the UTF-16/32 JSON allows)
    except RecursionError:
        raise ValueError(
            f"{text}: not JSON that can be read (nested too deeply); accepted: {forms}"
        ) from None
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{text}: not JSON (not UTF-8 text: {e.reason} at byte {e.start}); accepted: {forms}"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{text}: not JSON ({e}); accepted: {forms}") from None


def _entries(text: str, data: dict[str, object]) -> list[tuple[NameItem, tuple[str | None, ...]]]:
    """Each entry of the object form: its item and its leaf's axis names."""
    items: list[tuple[NameItem, tuple[str | None, ...]]] = []
    for name, info in data.items():
        if info is None:
            info = {}
        if not isinstance(info, dict) or set(info) - {"shape", "dtype", "axes"}:
            raise ValueError(
                f'{text}: entry {name!r}: {info!r} is not {{"shape": [...], "dtype": ..., '
                '"axes": [...]}'
            )
        axes = info.get("axes") or []
        if not isinstance(axes, list) or not all(a is None or isinstance(a, str) for a in axes):
            raise ValueError(
                f"{text}: entry {name!r}: axes {axes!r} is not a list of axis names (or null)"
            )
        shape = info.get("shape")
        if shape is not None and (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ValueError(
                f"{text}: entry {name!r}: shape {shape!r} is not a list of whole numbers >= 0"
            )
        nbytes = None
        if info.get("dtype") is not None:
            itemsize = _itemsize(info["dtype"])
            if itemsize is None:
                raise ValueError(
                    f"{text}: entry {name!r}: unknown dtype {info['dtype']!r}; accepted: "
                    f"numpy names (float32, bfloat16) or safetensors names ({', '.join(DTYPES)})"
                )
            if shape is not None:
                nbytes = itemsize * math.prod(shape)
        items.append(((name, nbytes, None if shape is None else tuple(shape), None), tuple(axes)))
    return items


def _itemsize(dtype: object) -> int | None:
    if not isinstance(dtype, str):
        return None
    if dtype in DTYPES:
        return DTYPES[dtype].itemsize
    import ml_dtypes
    import numpy as np

    found = getattr(ml_dtypes, dtype, None)
    try:
        return int(np.dtype(found if found is not None else dtype).itemsize)
    except TypeError:
        return None


def lint_names(policy: Policy, names: list[NameItem]) -> tuple[list[Finding], tuple[RuleUse, ...]]:
    """Check a policy against real names (a checkpoint's tensors, a dumped tree): every
    rule that takes none of them and was meant to (`rule-matched-nothing`: its first word
    is among the names, or it would take some but for a slip, which is named: a `regex:`
    written for search, a misspelt first word, `.` between the parts, a prefix), and
    tensors placed whole by the default or a catch-all beside sharding rules
    (`not-sharded`). Returns the findings and what each rule took (with why a rule took
    nothing: shadowed by an earlier rule, its conditions, other files or names).

    Only names are matched (with sizes and shapes where known): no device is looked up.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"regex": "attention/wq/kernel", "device": "cpu"}]})
        >>> findings, uses = lint_names(p, [("params/h/0/attention/wq/kernel", 64, (4, 4), None)])
        >>> [f.code for f in findings], [(u.label, u.tensors) for u in uses]
        (['rule-matched-nothing'], [("'attention/wq/kernel'", 0), ('default', 1)])
    """
    decider = policy.decider
    rules = policy.settings.rules
    placed = [
        Placed(n, decider.rule_for(n, nbytes, shape, source), nbytes, shape, source)
        for n, nbytes, shape, source in names
    ]
    sources = list(dict.fromkeys(s for *_, s in names if s is not None))
    uses = rule_uses(policy.settings, decider.conditions, placed, sources)
    findings = []
    count = f"{len(names)} name{'' if len(names) == 1 else 's'}"
    example = names[0][0] if names else ""
    for position, (entry, use) in enumerate(zip(rules, uses, strict=False)):
        if use.status not in (NEAR, NOTHING):
            continue
        hint = f": {use.note}" if use.note and use.note != NO_MATCH else ""
        if use.status == NEAR:
            whole = " whole" if use.shards else ""
            hint = (
                f", but was written for {use.meant} of them (e.g. {use.meant_example!r}), "
                f"which {use.meant_by} takes{whole} instead: {use.note}"
            )
        findings.append(
            Finding(
                "warning",
                entry.origin,
                "rule-matched-nothing",
                f"rule {position} ({use.label}) matches none of the {count} "
                f"(e.g. {example!r}){hint}",
            )
        )
    findings += [
        Finding("warning", policy.settings.default.origin, code, message)
        for code, message in silent_rules(uses)
        if code == "not-sharded"
    ]
    return findings, uses
