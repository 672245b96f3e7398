"""The field types the policy document's models are made of, each with its check.

Each field type (`TargetText`, `ByteCount`, `PoolFraction`, ...) is an `Annotated` triple of
the type, its `BeforeValidator` and its `WithJsonSchema`: the check and the JSON Schema of
one field, whose message lists that field's valid forms, kept together. The models that use
them (`schema`) hold only the document's shape: which fields, their defaults and
descriptions, and the checks across fields. A check fails with `fail(message)`, a pydantic
error of type `ERROR_TYPE` that `documents` reports at the field's file:line.

Text-level parsing is not here either: targets, sizes, runtime knobs, axis names and
patterns are read by the leaves this module imports (`targets`, `sizes`, `knobs`, `axes`);
no JAX. One concept, the field types of one document, kept in one module although it runs
past 650 lines: split further, a field's check would sit away from its neighbours' (the
runtime's types share their number and list checks, the axes' theirs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from .._base.errors import did_you_mean
from .._base.sizes import SIZE_FORMS, SIZE_PATTERN, format_size, parse_size
from .._runtime.knobs import (
    ALLOCATORS,
    ALLOCATORS_OF_ANY_JAXLIB,
    ALLOW_FORMS,
    ALLOW_PATTERN,
    ENV_NAME_FORMS,
    ENV_NAME_PATTERN,
    GIB,
    OWNED_VARIABLES,
    PLATFORMS,
    env_problem,
)
from .axes import ATTACHED
from .remote import RemoteOption
from .targets import (
    ACCELERATOR,
    AXIS_NAME_PATTERN,
    CHAIN_FORMS,
    PLATFORM_ALIASES,
    REJECT,
    REPLICATE,
    SHARDING_PATTERN,
    TARGET_FORMS,
    TARGET_PATTERN,
    check_chain_item,
    check_default,
    parse_target,
)

MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")
INPUTS = ("keep", "move")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("auto", "console", "json", "stdlib")

#: Error type carried by every validation error devpolicy raises itself.
ERROR_TYPE = "devpolicy"


def fail(message: str) -> PydanticCustomError:
    # The message goes in the context so braces in user input are not format fields.
    return PydanticCustomError(ERROR_TYPE, "{message}", {"message": message})


def _checked(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        try:
            parse(value)
        except ValueError as e:
            raise fail(str(e)) from None
        return value

    return validate


def to_size(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise fail(str(e)) from None


def choice(choices: tuple[str, ...], what: str) -> Callable[[Any], str]:
    def validate(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        hint = did_you_mean(value, choices)
        raise fail(f"unknown {what} {value!r}{hint}; accepted: {', '.join(choices)}")

    return validate


TargetText = Annotated[
    str,
    BeforeValidator(_checked(parse_target)),
    WithJsonSchema({"type": "string", "pattern": TARGET_PATTERN, "description": TARGET_FORMS}),
]
ChainText = Annotated[
    str,
    BeforeValidator(_checked(check_chain_item)),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": TARGET_PATTERN},
                {"const": REPLICATE},
                {"type": "string", "pattern": SHARDING_PATTERN},
            ],
            "description": CHAIN_FORMS,
        }
    ),
]
ByteCount = Annotated[
    int,
    BeforeValidator(to_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": SIZE_PATTERN},
            ],
            "description": SIZE_FORMS,
        }
    ),
]


def _default_target(value: Any) -> Any:
    try:
        return check_default(value)
    except ValueError as e:
        raise fail(str(e)) from None


DefaultText = Annotated[
    str,
    BeforeValidator(_default_target),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": TARGET_PATTERN},
                {"const": REJECT, "description": "names no rule matches raise UnmatchedNameError"},
            ],
            "description": f"{TARGET_FORMS}; or reject",
        }
    ),
]
MemoryKind = Annotated[
    str,
    BeforeValidator(choice(MEMORY_KINDS, "memory kind")),
    WithJsonSchema({"enum": list(MEMORY_KINDS)}),
]
InputsChoice = Annotated[
    str,
    BeforeValidator(choice(INPUTS, "inputs")),
    WithJsonSchema({"enum": list(INPUTS)}),
]
LogLevel = Annotated[
    str,
    BeforeValidator(choice(LOG_LEVELS, "log level")),
    WithJsonSchema({"enum": list(LOG_LEVELS)}),
]
LogFormat = Annotated[
    str,
    BeforeValidator(choice(LOG_FORMATS, "log format")),
    WithJsonSchema({"enum": list(LOG_FORMATS)}),
]


def _axis_name(value: Any) -> str:
    if not isinstance(value, str) or re.fullmatch(AXIS_NAME_PATTERN, value) is None:
        raise fail(f"not an axis name: {value!r}; accepted: a letter or _, then letters, digits, _")
    return value


def _axis_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or value == -1):
        raise fail(f"an axis size is a whole number >= 1, or -1 for the rest; got {value!r}")
    return value


AxisName = Annotated[
    str,
    BeforeValidator(_axis_name),
    WithJsonSchema({"type": "string", "pattern": AXIS_NAME_PATTERN}),
]
AxisSize = Annotated[
    int,
    BeforeValidator(_axis_size),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"const": -1}]}),
]


def _axis_rule(value: Any) -> tuple[str, str | tuple[str, ...] | None]:
    if isinstance(value, list | tuple) and len(value) == 2:
        logical, mesh_axes = value
        name = _axis_name(logical)
        if mesh_axes is None:
            return name, None
        if isinstance(mesh_axes, str):
            return name, _axis_name(mesh_axes)
        if isinstance(mesh_axes, list | tuple) and all(isinstance(a, str) for a in mesh_axes):
            axes = tuple(_axis_name(a) for a in mesh_axes)
            if len(set(axes)) != len(axes):
                raise fail(f"a mesh axis is listed twice in {list(value)!r}")
            return name, axes
    raise fail(
        f"an axis rule is a pair [logical name, mesh axes], the mesh axes an axis, a list of "
        f"axes (sharded over their product), or null/[] (replicated); got {value!r}"
    )


def _axis_rules(value: Any) -> Any:
    """A mapping `{logical: mesh axis or null}` is the pairs in its order; a list value
    there would be ambiguous (product or candidates?), so pairs must say which."""
    if not isinstance(value, dict):
        return value
    for name, mesh_axes in value.items():
        if isinstance(mesh_axes, list | tuple) and len(mesh_axes) > 1:
            a, b = str(mesh_axes[0]), str(mesh_axes[1])
            raise fail(
                f"axis_rules as a mapping takes one mesh axis or null per logical name, got "
                f"{name}: {list(mesh_axes)!r}; write pairs in order: `[{name}, [{a}, {b}]]` "
                f"shards over {a} and {b} together, `[{name}, {a}], [{name}, {b}]` takes {a}, "
                f"or {b} when {a} is taken"
            )
    return [[name, mesh_axes] for name, mesh_axes in value.items()]


_AXIS_RULE_SCHEMA: dict[str, Any] = {
    "type": "array",
    "prefixItems": [
        {"type": "string", "pattern": AXIS_NAME_PATTERN},
        {
            "anyOf": [
                {"type": "string", "pattern": AXIS_NAME_PATTERN},
                {"type": "null"},
                {"type": "array", "items": {"type": "string", "pattern": AXIS_NAME_PATTERN}},
            ]
        },
    ],
    "minItems": 2,
    "maxItems": 2,
}
AxisRule = Annotated[
    tuple[str, str | tuple[str, ...] | None],
    BeforeValidator(_axis_rule),
    WithJsonSchema(_AXIS_RULE_SCHEMA),
]
AxisRules = Annotated[
    list[AxisRule],
    BeforeValidator(_axis_rules),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "array", "items": _AXIS_RULE_SCHEMA},
                {
                    "type": "object",
                    "additionalProperties": {
                        "anyOf": [
                            {"type": "string", "pattern": AXIS_NAME_PATTERN},
                            {"type": "null"},
                        ]
                    },
                },
            ],
            "description": "Logical axis name to mesh axes, tried in order as flax's "
            "logical_to_mesh_axes: [[embed, fsdp], [mlp, [tensor, fsdp]], [kv, null]], or "
            "{embed: fsdp, kv: null}.",
        }
    ),
]
AXIS_RULES_DESCRIPTION = (
    "Pairs [logical name, mesh axes] tried in order (flax's logical_to_mesh_axes): a "
    "dimension takes the first pair for its name whose mesh axes no other dimension uses; "
    "null or [] replicates it. A mapping {name: axis or null} is the pairs in its order."
)


def mesh_devices(value: Any) -> Any:
    if isinstance(value, str):
        if value in ("auto", ACCELERATOR) or value in PLATFORM_ALIASES:
            return value
        hint = did_you_mean(value, ["auto", ACCELERATOR, *PLATFORM_ALIASES])
        raise fail(
            f"unknown backend {value!r}{hint}; accepted: auto, {ACCELERATOR}, "
            f"{', '.join(PLATFORM_ALIASES)}, or a list of targets"
        )
    return value


def sizes_mapping(what: str, example: str) -> Callable[[Any], Any]:
    """A mesh's `axes` or `dcn`: a mapping of axis name to size, said so when it is not."""

    def validate(value: Any) -> Any:
        if not isinstance(value, dict):
            raise fail(f"{what} is a mapping of axis name to size, e.g. `{example}`; got {value!r}")
        return value

    return validate


def _spec_entry(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value if value is None else _axis_name(value)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [_axis_name(v) for v in value]
    raise fail(
        f"a spec entry is an axis name, null (not sharded), or a list of axis names; got {value!r}"
    )


SpecEntry = Annotated[
    str | list[str] | None,
    BeforeValidator(_spec_entry),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
            ]
        }
    ),
]


def _logical_name(value: Any) -> Any:
    return None if value is None else _axis_name(value)


LogicalName = Annotated[
    str | None,
    BeforeValidator(_logical_name),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": AXIS_NAME_PATTERN}, {"type": "null"}]}),
]


AXES_FORMS = (
    "a list of logical axis names, one per dimension (null: not sharded), e.g. "
    "[embed, mlp]; or `attached`: each leaf's own names, as its framework attached them "
    "(flax nn.with_logical_partitioning, nnx sharding metadata, haliax axes)"
)


def _logical_axes(value: Any) -> Any:
    if value is None or isinstance(value, list) or value == ATTACHED:
        return value
    hint = did_you_mean(value, [ATTACHED]) if isinstance(value, str) else ""
    raise fail(f"`axes` is {AXES_FORMS}; got {value!r}{hint}")


LogicalAxes = Annotated[
    list[LogicalName] | Literal["attached"] | None,
    BeforeValidator(_logical_axes),
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "array",
                    "items": {
                        "anyOf": [
                            {"type": "string", "pattern": AXIS_NAME_PATTERN},
                            {"type": "null"},
                        ]
                    },
                },
                {"const": ATTACHED},
                {"type": "null"},
            ]
        }
    ),
]


def _ndim(value: Any) -> Any:
    def rank(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if rank(value):
        return [value]
    if isinstance(value, list) and value and all(rank(v) for v in value):
        if len(set(value)) != len(value):
            raise fail(f"a rank is listed more than once in ndim {value!r}")
        return value
    raise fail(
        f"ndim is a rank (a whole number >= 0, e.g. 0 for scalars) or a list of ranks "
        f"(e.g. [1, 2]); got {value!r}"
    )


NdimChoice = Annotated[
    list[int],
    BeforeValidator(_ndim),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            ]
        }
    ),
]


def _element_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise fail(f"an element count is a whole number >= 0, got {value!r}")
    return value


ElementCount = Annotated[
    int, BeforeValidator(_element_count), WithJsonSchema({"type": "integer", "minimum": 0})
]


def _percentage(value: Any) -> Any:
    """`value`, or the fraction a text like '10%' says (None where it says none)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100
        except ValueError:
            return None
    return value


def _fraction(value: Any) -> float:
    number = _percentage(value)
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number < 1:
        raise fail(f"expected a fraction in [0, 1) or a percentage like '10%', got {value!r}")
    return float(number)


Headroom = Annotated[
    float,
    BeforeValidator(_fraction),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*%\s*$"},
            ]
        }
    ),
]


def version_number(value: Any) -> int:
    if value == 1 and not isinstance(value, bool):
        return 1
    if isinstance(value, str) and value.strip() == "1":
        raise fail(f"version must be the number 1, not the string {value!r}: write `version: 1`")
    raise fail(f"unsupported policy version {value!r}; accepted: 1")


def _pool_fraction(value: Any) -> float:
    number = _percentage(value)
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number <= 1:
        raise fail(f"expected a fraction in (0, 1] or a percentage like '50%', got {value!r}")
    return float(number)


def _count(minimum: int) -> Callable[[Any], int]:
    def validate(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise fail(f"expected a whole number >= {minimum}, got {value!r}")
        return value

    return validate


def distinct(what: str) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise fail(f"an empty list; give at least one {what}")
            repeated = sorted({str(v) for v in value if value.count(v) > 1})
            if repeated:
                raise fail(f"{what} listed more than once: {', '.join(repeated)}")
        return value

    return validate


def _host_limit(value: Any) -> int:
    nbytes = to_size(value)
    if nbytes == 0 or nbytes % GIB:
        below, above = max(1, nbytes // GIB), nbytes // GIB + 1
        raise fail(
            f"the pinned-host pool limit is set in whole GiB, got {value!r} "
            f"({format_size(nbytes)}); write {below}GiB or {above}GiB"
        )
    return nbytes


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or re.fullmatch(ENV_NAME_PATTERN, value) is None:
        raise fail(f"not a variable runtime.env may set: {value!r}; accepted: {ENV_NAME_FORMS}")
    knob = OWNED_VARIABLES.get(value)
    if knob is not None:
        raise fail(f"{value} is what `runtime.{knob}` sets: write `{knob}:` instead")
    return value


@dataclass(frozen=True, slots=True)
class EnvEntry:
    """An `env:` value with its name and the policy's `allow:` list, so that the value's
    check (which depends on both) reports at the entry's own line."""

    name: Any
    value: Any
    allowed: frozenset[str]


def _env_value(entry: Any) -> Any:
    if not isinstance(entry, EnvEntry):
        return entry
    if not isinstance(entry.name, str) or re.fullmatch(ENV_NAME_PATTERN, entry.name) is None:
        # The name's own error says it; the value is not judged against a wrong name.
        return entry.value if isinstance(entry.value, str | bool | int | float) else ""
    if entry.name in OWNED_VARIABLES:
        return entry.value if isinstance(entry.value, str | bool | int | float) else ""
    problem = env_problem(entry.name, entry.value, entry.allowed)
    if problem is not None:
        raise fail(problem)
    return entry.value


def listed_once(value: Any) -> Any:
    return distinct("variable or flag")(value) if value != [] else value


def _allow_item(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(ALLOW_PATTERN, value):
        return value
    raise fail(f"not a variable or XLA flag: {value!r}; accepted: {ALLOW_FORMS}")


Platform = Annotated[
    str,
    BeforeValidator(choice(PLATFORMS, "platform")),
    WithJsonSchema({"enum": list(PLATFORMS)}),
]
Allocator = Annotated[
    str,
    BeforeValidator(choice(ALLOCATORS, "allocator")),
    WithJsonSchema({"enum": list(ALLOCATORS_OF_ANY_JAXLIB)}),
]
PoolFraction = Annotated[
    float,
    BeforeValidator(_pool_fraction),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*%\s*$"},
            ]
        }
    ),
]
DeviceIndex = Annotated[
    int, BeforeValidator(_count(0)), WithJsonSchema({"type": "integer", "minimum": 0})
]
CpuCount = Annotated[
    int, BeforeValidator(_count(1)), WithJsonSchema({"type": "integer", "minimum": 1})
]
HostLimit = Annotated[
    int,
    BeforeValidator(_host_limit),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": GIB, "multipleOf": GIB},
                {"type": "string", "pattern": SIZE_PATTERN},
            ],
            "description": "whole GiB: " + SIZE_FORMS,
        }
    ),
]
EnvName = Annotated[
    str,
    BeforeValidator(_env_name),
    WithJsonSchema({"type": "string", "pattern": ENV_NAME_PATTERN}),
]
EnvValue = Annotated[
    str | bool | int | float,
    BeforeValidator(_env_value),
    WithJsonSchema({"type": ["string", "number", "boolean"]}),
]
AllowItem = Annotated[
    str,
    BeforeValidator(_allow_item),
    WithJsonSchema({"type": "string", "pattern": ALLOW_PATTERN, "description": ALLOW_FORMS}),
]


def remote_field(option: RemoteOption) -> tuple[Any, Any]:
    """One `remote:` field made from its table entry (`remote.OPTIONS`, which the
    environment's `DEVPOLICY_REMOTE_*` and the I/O wing read too): its type with the entry's
    check and JSON Schema, and its default (unset) with the entry's description."""
    kind = {"int": int, "size": int, "seconds": float, "path": Path}[option.kind]
    checked = Annotated[
        kind | None,  # type: ignore[valid-type]
        BeforeValidator(_remote_check(option)),
        WithJsonSchema(_remote_schema(option)),
    ]
    return checked, Field(None, description=f"{option.description} ({option.variable})")


def _remote_check(option: RemoteOption) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        if value is None:
            return None
        try:
            return option.check(value)
        except ValueError as e:
            raise fail(f"{e}; accepted: {option.accepted}") from None

    return validate


def _remote_schema(option: RemoteOption) -> dict[str, Any]:
    bounds = {"minimum": option.low, "maximum": option.high}
    schemas: dict[str, dict[str, Any]] = {
        "int": {"type": "integer", **bounds},
        "size": {"anyOf": [{"type": "integer", **bounds},
                           {"type": "string", "pattern": SIZE_PATTERN}]},
        "seconds": {"type": "number", **bounds},
        "path": {"type": "string", "minLength": 1},
    }  # fmt: skip
    return schemas[option.kind]


# `transfers:` (issue 35): what devpolicy does with the placements JAX makes on its own.
TRANSFER_MODES = ("allow", "log", "disallow")
#: The directions a bare `transfers: MODE` sets (`host_local` keeps its own default).
TRANSFER_DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")
#: Every field of `transfers:`, in the order they are shown.
TRANSFER_FIELDS = (*TRANSFER_DIRECTIONS, "host_local")
TransferMode = Annotated[
    str,
    BeforeValidator(choice(TRANSFER_MODES, "transfer mode")),
    WithJsonSchema({"enum": list(TRANSFER_MODES)}),
]
