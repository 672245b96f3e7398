"""Policy documents: read a file or mapping, validate it, and report problems by file:line."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .._base.errors import PolicyError, Problem, did_you_mean
from .._base.files import FileRefused, read_capped
from .fields import ERROR_TYPE
from .schema import (
    LoggingSpec,
    MeshSpec,
    OverridesSpec,
    PolicySpec,
    RuleSpec,
    RuntimeSpec,
    ShardingSpec,
)
from .sharding import sharding_problems
from .yaml_reader import LineMap, field_path, read_yaml

MAPPING_LABEL = "<mapping>"
#: A policy is a page of rules; past this it is something else (and PyYAML would take minutes).
MAX_POLICY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Document:
    """A validated policy document and where each of its fields was written."""

    spec: PolicySpec
    file: str
    lines: LineMap

    def origin(self, *loc: str | int) -> str:
        """`file:line` of a field, or the file alone when the line is unknown."""
        line = _line_for(self.lines, loc)
        if line is not None:
            return f"{self.file}:{line}"
        return f"{self.file}:{field_path(loc)}" if loc else self.file


def display_path(path: Path) -> str:
    """A path as people want to read it: relative to the working directory when inside it."""
    try:
        try:
            resolved = path.resolve()
        except RuntimeError:  # a symlink loop (Python 3.11): place it by its directory
            resolved = path.parent.resolve() / path.name
        return os.path.relpath(path) if resolved.is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError, RuntimeError):
        return str(path)


def read_document(source: str | os.PathLike[str] | Mapping[str, Any]) -> Document:
    """Read and validate a policy from a YAML file or a mapping.

    Raises:
        PolicyError: naming the file, line and field of every problem found.
    """
    if isinstance(source, Mapping):
        return _validate(dict(source), MAPPING_LABEL, {})
    path = Path(source)
    label = display_path(path)
    try:
        raw = read_capped(path, MAX_POLICY_BYTES, "a policy file")
    except FileRefused as e:
        reason = "policy file not found" if e.reason == "no such file" else e.reason
        raise PolicyError.single(label, None, "", reason) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError.single(
            label, text_line(raw, e.start), "", f"not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    data, lines, problems = read_yaml(text, label)
    if data is None and not problems:
        raise PolicyError.single(label, 1, "", "empty policy; a policy needs at least `version: 1`")
    if not isinstance(data, dict):
        problems.append(
            Problem(label, 1, "", f"a policy must be a mapping of fields, got a {_kind(data)}")
        )
        raise PolicyError(problems)
    return _validate(data, label, lines, problems)


def text_line(raw: bytes, offset: int) -> int:
    """1-based line of a byte offset."""
    return raw.count(b"\n", 0, offset) + 1


def validate_overrides(overrides: Mapping[str, Any]) -> OverridesSpec:
    """Validate settings given in code."""
    if not isinstance(overrides, Mapping):
        raise TypeError(f"overrides must be a mapping of settings, got {type(overrides).__name__}")
    try:
        return OverridesSpec.model_validate(dict(overrides))
    except ValidationError as e:
        raise PolicyError(_problems(e, "<overrides>", {}, OverridesSpec)) from None


def _validate(
    data: dict[str, Any], file: str, lines: LineMap, found: Sequence[Problem] = ()
) -> Document:
    """Validate `data`; every problem (those `found` while reading, and these) is raised."""
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as e:
        problems = [*found, *_problems(e, file, lines, PolicySpec)]
        # A value already reported as unusable is also "missing" or "wrong type": say it once.
        reported = {(p.line, p.field) for p in found}
        kept = [p for p in problems if p in found or (p.line, p.field) not in reported]
        raise PolicyError(sorted(kept, key=lambda p: p.line or 0)) from None
    crossed = [
        Problem(file, _line_for(lines, loc), field_path(loc), message)
        for loc, message in sharding_problems(spec.rules, spec.meshes)
    ]
    if found or crossed:
        raise PolicyError(sorted([*found, *crossed], key=lambda p: p.line or 0))
    return Document(spec, file, lines)


def _problems(
    error: ValidationError, file: str, lines: LineMap, root: type[BaseModel]
) -> list[Problem]:
    errors = error.errors(include_url=False)
    # A misspelt field shows up twice: as unknown, and as the real one missing. Say it once.
    misspelt: set[tuple[str | int, ...]] = set()
    for err in errors:
        if err["type"] == "extra_forbidden":
            loc = tuple(err["loc"])
            close = difflib.get_close_matches(
                str(loc[-1]), _fields_at(root, loc[:-1]), n=1, cutoff=0.6
            )
            misspelt.update((*loc[:-1], name) for name in close)
    problems = []
    for err in errors:
        # A bad mapping key (runtime.env) is reported at the key itself.
        loc = tuple(part for part in err["loc"] if part != "[key]")
        if err["type"] == "missing" and loc in misspelt:
            continue
        problems.append(
            Problem(file, _line_for(lines, loc), field_path(loc), _message(err, loc, root))
        )
    return sorted(problems, key=lambda p: p.line if p.line is not None else 0)


def _message(err: Any, loc: tuple[str | int, ...], root: type[BaseModel]) -> str:
    kind = err["type"]
    value = err.get("input")
    if kind == ERROR_TYPE:
        return str(err["ctx"]["message"])
    if kind == "extra_forbidden":
        fields = _fields_at(root, loc[:-1])
        hint = did_you_mean(loc[-1], fields)
        return f"unknown field {loc[-1]!r}{hint}; valid fields: {', '.join(fields)}"
    if kind == "missing":
        return f"missing required field {loc[-1]!r}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false, got {_kind(value)} {value!r}"
    if kind in ("model_type", "dict_type"):
        fields = _fields_at(root, loc)
        return f"expected a mapping with fields {', '.join(fields)}, got {_kind(value)} {value!r}"
    return f"{err['msg']}, got {_kind(value)} {value!r}"


_NESTED: dict[str, type[BaseModel]] = {
    "rules": RuleSpec,
    "sharding": ShardingSpec,
    "meshes": MeshSpec,
    "logging": LoggingSpec,
    "runtime": RuntimeSpec,
}


def _fields_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    model = root
    for part in loc:
        if isinstance(part, str) and part in _NESTED:
            model = _NESTED[part]
    return list(model.model_fields)


def _line_for(lines: LineMap, loc: tuple[str | int, ...]) -> int | None:
    for end in range(len(loc), -1, -1):
        line = lines.get(loc[:end])
        if line is not None:
            return line
    return None


def _kind(value: object) -> str:
    names = {dict: "mapping", list: "list", str: "string", type(None): "null"}
    return names.get(type(value), type(value).__name__)
