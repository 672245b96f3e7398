"""The policy document's schema: pydantic models and nothing else.

The models validate and normalise; they never touch JAX. `Policy` turns a validated
document into the matcher and routes the hot path uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ._errors import did_you_mean
from ._matching import compile_regex
from ._runtime import (
    ALLOCATORS,
    ALLOCATORS_OF_ANY_JAXLIB,
    ALLOW_FORMS,
    ALLOW_PATTERN,
    ENV_NAME_FORMS,
    ENV_NAME_PATTERN,
    ENV_VARIABLES,
    GIB,
    OWNED_VARIABLES,
    PLATFORMS,
    env_problem,
)
from ._sizes import SIZE_FORMS, SIZE_PATTERN, format_size, parse_size
from ._targets import (
    AXIS_NAME_PATTERN,
    PLATFORM_ALIASES,
    REJECT,
    TARGET_FORMS,
    TARGET_PATTERN,
    check_default,
    parse_target,
)

MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")
INPUTS = ("keep", "move")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("auto", "console", "json", "stdlib")

#: Error type carried by every validation error devpolicy raises itself.
ERROR_TYPE = "devpolicy"


def _fail(message: str) -> PydanticCustomError:
    # The message goes in the context so braces in user input are not format fields.
    return PydanticCustomError(ERROR_TYPE, "{message}", {"message": message})


def _checked(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        try:
            parse(value)
        except ValueError as e:
            raise _fail(str(e)) from None
        return value

    return validate


def _to_size(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise _fail(str(e)) from None


def _choice(choices: tuple[str, ...], what: str) -> Callable[[Any], str]:
    def validate(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        hint = did_you_mean(value, choices)
        raise _fail(f"unknown {what} {value!r}{hint}; accepted: {', '.join(choices)}")

    return validate


TargetText = Annotated[
    str,
    BeforeValidator(_checked(parse_target)),
    WithJsonSchema({"type": "string", "pattern": TARGET_PATTERN, "description": TARGET_FORMS}),
]
ByteCount = Annotated[
    int,
    BeforeValidator(_to_size),
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
        raise _fail(str(e)) from None


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
    BeforeValidator(_choice(MEMORY_KINDS, "memory kind")),
    WithJsonSchema({"enum": list(MEMORY_KINDS)}),
]
InputsChoice = Annotated[
    str,
    BeforeValidator(_choice(INPUTS, "inputs")),
    WithJsonSchema({"enum": list(INPUTS)}),
]
LogLevel = Annotated[
    str,
    BeforeValidator(_choice(LOG_LEVELS, "log level")),
    WithJsonSchema({"enum": list(LOG_LEVELS)}),
]
LogFormat = Annotated[
    str,
    BeforeValidator(_choice(LOG_FORMATS, "log format")),
    WithJsonSchema({"enum": list(LOG_FORMATS)}),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _axis_name(value: Any) -> str:
    if not isinstance(value, str) or re.fullmatch(AXIS_NAME_PATTERN, value) is None:
        raise _fail(
            f"not an axis name: {value!r}; accepted: a letter or _, then letters, digits, _"
        )
    return value


def _axis_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or value == -1):
        raise _fail(f"an axis size is a whole number >= 1, or -1 for the rest; got {value!r}")
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


def _mesh_devices(value: Any) -> Any:
    if isinstance(value, str):
        if value == "auto" or value in PLATFORM_ALIASES:
            return value
        hint = did_you_mean(value, ["auto", *PLATFORM_ALIASES])
        raise _fail(
            f"unknown backend {value!r}{hint}; accepted: auto, {', '.join(PLATFORM_ALIASES)}, "
            "or a list of targets"
        )
    return value


class MeshSpec(_Strict):
    """A named device mesh: axis names and sizes, over a backend's devices or listed ones."""

    axes: dict[AxisName, AxisSize] = Field(
        description="Axis name to size, in order; one size may be -1 (the devices left)."
    )
    devices: Annotated[str | list[TargetText], BeforeValidator(_mesh_devices)] = Field(
        "auto",
        description="A backend (every device of it, across all processes of a "
        "jax.distributed job; `auto`: the default backend), or a list of targets.",
    )

    @model_validator(mode="after")
    def _axes_make_sense(self) -> MeshSpec:
        if not self.axes:
            raise _fail("a mesh needs at least one axis, e.g. `axes: {data: -1}`")
        if list(self.axes.values()).count(-1) > 1:
            raise _fail("only one axis may be -1 (the devices left over)")
        if isinstance(self.devices, list) and len(set(self.devices)) != len(self.devices):
            raise _fail("a device is listed more than once in `devices`")
        return self


def _spec_entry(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value if value is None else _axis_name(value)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [_axis_name(v) for v in value]
    raise _fail(
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


class ShardingSpec(_Strict):
    """How a rule shards: a mesh of `meshes`, and one spec entry per array dimension."""

    mesh: str = Field(description="The name of a mesh in `meshes`.")
    spec: list[SpecEntry] = Field(
        default_factory=list,
        description="Per dimension: an axis, null (not sharded) or a list of axes; "
        "[] replicates over the mesh.",
    )


class RuleSpec(_Strict):
    """One rule: names it matches, where they go, and under which conditions."""

    match: str | None = Field(
        None, description="fnmatch glob, case-sensitive; `*` also matches `/`."
    )
    regex: str | None = Field(
        None,
        description="Regular expression that must match the whole name: Python syntax, "
        "matched by RE2 in linear time (no backreferences or lookaround).",
    )
    file: str | None = Field(
        None,
        description="Glob on the file a tensor comes from (load_file, plan; for a checkpoint, "
        "its member file or the checkpoint's directory or index), tried on the path as "
        "written and as resolved. Without `/` it matches the file's name "
        "(`train*.safetensors`); with `/` the whole path or any tail of it after a `/` "
        "(`data/*.safetensors`). A rule with `file` never matches a name placed without a "
        "file; alone (no `match`/`regex`) it takes every name of the file.",
    )
    device: TargetText | None = Field(
        None, description="Where matching names go (give this or `sharding`)."
    )
    sharding: ShardingSpec | None = Field(
        None,
        description="Shard matching names over a mesh of `meshes` (give this or `device`).",
    )
    fallback: list[TargetText] | None = Field(
        None, description="Targets tried in order when `device` cannot be had; else the policy's."
    )
    min_bytes: ByteCount | None = Field(
        None, description="Match only arrays of at least this size (inclusive); needs a known size."
    )
    max_bytes: ByteCount | None = Field(
        None, description="Match only arrays of at most this size (inclusive); needs a known size."
    )
    memory: MemoryKind | None = Field(None, description="JAX memory kind for put and loaders.")
    commit: StrictBool = Field(
        True, description="Commit results of @place to the decided device so they cannot migrate."
    )
    fits: StrictBool = Field(
        True,
        description="With a known size, use a target only if the bytes fit in its free memory "
        "(minus the policy's headroom); else the next in the fallback chain (the default). "
        "`false` takes the rule's targets without judging memory.",
    )
    mmap: StrictBool = Field(
        False,
        description="Loaders may map a 64-byte-aligned tensor from its file instead of reading it "
        "(zero-copy on the host; the array then stays backed by the file).",
    )
    inputs: InputsChoice = Field(
        "keep",
        description="`move`: @place moves committed array arguments on another device to the "
        "decided device before the call (a model split over devices); `keep` leaves them.",
    )

    @field_validator("match")
    @classmethod
    def _pattern_not_empty(cls, value: str | None) -> str | None:
        if value == "":
            raise _fail("empty pattern matches only the empty name; use '*' to match everything")
        return value

    @field_validator("file")
    @classmethod
    def _file_glob_not_empty(cls, value: str | None) -> str | None:
        if value is not None and value.strip() == "":
            raise _fail("empty file glob matches no file; e.g. 'train*.safetensors'")
        if value is not None and "\0" in value:
            raise _fail(f"a file glob cannot hold a NUL character, got {value!r}")
        return value

    @property
    def name_pattern(self) -> tuple[str, bool]:
        """The name pattern and whether it is a regex: `*` for a rule with `file` alone."""
        if self.regex is not None:
            return self.regex, True
        return ("*" if self.match is None else self.match), False

    @property
    def label(self) -> str:
        """How messages name the rule: its pattern, and its file glob if any."""
        pattern, _ = self.name_pattern
        if self.file is None:
            return repr(pattern)
        if self.match is None and self.regex is None:
            return f"file {self.file!r}"
        return f"{pattern!r} file {self.file!r}"

    @field_validator("regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            compile_regex(value)
        except ValueError as e:
            raise _fail(str(e)) from None
        return value

    @model_validator(mode="after")
    def _one_pattern_and_ordered_sizes(self) -> RuleSpec:
        if self.match is not None and self.regex is not None:
            raise _fail("give exactly one of `match` (a glob) or `regex`, not both")
        if self.match is None and self.regex is None and self.file is None:
            raise _fail(
                "give exactly one of `match` (a glob) or `regex` for names, or `file` (a glob) "
                "for the file tensors come from"
            )
        if (self.device is None) == (self.sharding is None):
            raise _fail(
                "give exactly one of `device` (a target such as cpu or gpu:1) or `sharding` "
                "(a mesh and spec)"
            )
        if (
            self.min_bytes is not None
            and self.max_bytes is not None
            and self.min_bytes > self.max_bytes
        ):
            raise _fail(f"min_bytes ({self.min_bytes}) is larger than max_bytes ({self.max_bytes})")
        return self


class LoggingSpec(_Strict):
    """Where devpolicy's own events go when the application has not configured structlog."""

    level: LogLevel = Field("info", description="Lowest level emitted.")
    format: LogFormat = Field(
        "auto",
        description="auto (the application's structlog if configured, else stdlib logging if "
        "it has handlers, else console), console (stderr), json (stderr) or stdlib (the "
        "`devpolicy` logger).",
    )


def _fraction(value: Any) -> float:
    number: Any = value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1]) / 100
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number < 1:
        raise _fail(f"expected a fraction in [0, 1) or a percentage like '10%', got {value!r}")
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


def _version(value: Any) -> int:
    if value == 1 and not isinstance(value, bool):
        return 1
    if isinstance(value, str) and value.strip() == "1":
        raise _fail(f"version must be the number 1, not the string {value!r}: write `version: 1`")
    raise _fail(f"unsupported policy version {value!r}; accepted: 1")


def _pool_fraction(value: Any) -> float:
    number: Any = value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            number = float(value.strip()[:-1]) / 100
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number <= 1:
        raise _fail(f"expected a fraction in (0, 1] or a percentage like '50%', got {value!r}")
    return float(number)


def _count(minimum: int) -> Callable[[Any], int]:
    def validate(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _fail(f"expected a whole number >= {minimum}, got {value!r}")
        return value

    return validate


def _distinct(what: str) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise _fail(f"an empty list; give at least one {what}")
            repeated = sorted({str(v) for v in value if value.count(v) > 1})
            if repeated:
                raise _fail(f"{what} listed more than once: {', '.join(repeated)}")
        return value

    return validate


def _host_limit(value: Any) -> int:
    nbytes = _to_size(value)
    if nbytes == 0 or nbytes % GIB:
        below, above = max(1, nbytes // GIB), nbytes // GIB + 1
        raise _fail(
            f"the pinned-host pool limit is set in whole GiB, got {value!r} "
            f"({format_size(nbytes)}); write {below}GiB or {above}GiB"
        )
    return nbytes


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or re.fullmatch(ENV_NAME_PATTERN, value) is None:
        raise _fail(f"not a variable runtime.env may set: {value!r}; accepted: {ENV_NAME_FORMS}")
    knob = OWNED_VARIABLES.get(value)
    if knob is not None:
        raise _fail(f"{value} is what `runtime.{knob}` sets: write `{knob}:` instead")
    return value


@dataclass(frozen=True, slots=True)
class _EnvEntry:
    """An `env:` value with its name and the policy's `allow:` list, so that the value's
    check (which depends on both) reports at the entry's own line."""

    name: Any
    value: Any
    allowed: frozenset[str]


def _env_value(entry: Any) -> Any:
    if not isinstance(entry, _EnvEntry):
        return entry
    if not isinstance(entry.name, str) or re.fullmatch(ENV_NAME_PATTERN, entry.name) is None:
        # The name's own error says it; the value is not judged against a wrong name.
        return entry.value if isinstance(entry.value, str | bool | int | float) else ""
    if entry.name in OWNED_VARIABLES:
        return entry.value if isinstance(entry.value, str | bool | int | float) else ""
    problem = env_problem(entry.name, entry.value, entry.allowed)
    if problem is not None:
        raise _fail(problem)
    return entry.value


def _listed_once(value: Any) -> Any:
    return _distinct("variable or flag")(value) if value != [] else value


def _allow_item(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(ALLOW_PATTERN, value):
        return value
    raise _fail(f"not a variable or XLA flag: {value!r}; accepted: {ALLOW_FORMS}")


Platform = Annotated[
    str,
    BeforeValidator(_choice(PLATFORMS, "platform")),
    WithJsonSchema({"enum": list(PLATFORMS)}),
]
Allocator = Annotated[
    str,
    BeforeValidator(_choice(ALLOCATORS, "allocator")),
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


class RuntimeSpec(_Strict):
    """JAX's process settings, read when JAX starts; applied by `bootstrap()` or `devpolicy run`."""

    platforms: Annotated[list[Platform], BeforeValidator(_distinct("platform"))] | None = Field(
        None,
        description="Backends to start, in order; the first present is the default "
        "(JAX_PLATFORMS). `gpu` means the GPU plugins installed.",
    )
    preallocate: StrictBool | None = Field(
        None, description="false: take GPU memory as needed (XLA_PYTHON_CLIENT_PREALLOCATE)."
    )
    memory_fraction: PoolFraction | None = Field(
        None,
        description="Share of GPU memory JAX's pool may use, 0 < f <= 1 (XLA_CLIENT_MEM_FRACTION).",
    )
    allocator: Allocator | None = Field(
        None, description="GPU allocator (XLA_PYTHON_CLIENT_ALLOCATOR)."
    )
    visible_devices: (
        Annotated[list[DeviceIndex], BeforeValidator(_distinct("device index"))] | None
    ) = Field(None, description="GPU indices this process may use (CUDA_VISIBLE_DEVICES).")
    cpu_devices: CpuCount | None = Field(
        None, description="Number of CPU devices (jax_num_cpu_devices)."
    )
    x64: StrictBool | None = Field(None, description="64-bit types (jax_enable_x64).")
    host_memory_limit: HostLimit | None = Field(
        None,
        description="Cap of the pinned-host staging pool, whole GiB "
        "(XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB).",
    )
    allow: Annotated[list[AllowItem], BeforeValidator(_listed_once)] = Field(
        default_factory=list,
        description="Variables of `env` (and XLA flags of its XLA_FLAGS) that name a path, "
        "change results, or that devpolicy does not know: each must be listed here to be set.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="Other variables, set like the knobs above: "
        + ", ".join(sorted(n for n, v in ENV_VARIABLES.items() if v.needs_allow is None))
        + "; any other XLA_*, JAX_* or TF_* variable only when listed in `allow`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _pair_env_with_allow(cls, data: Any) -> Any:
        # Each env value is checked knowing its name and `allow` (see _EnvEntry).
        if not isinstance(data, dict) or not isinstance(data.get("env"), dict):
            return data
        allow = data.get("allow")
        allowed = (
            frozenset(a for a in allow if isinstance(a, str))
            if isinstance(allow, list)
            else frozenset()
        )
        env = {name: _EnvEntry(name, value, allowed) for name, value in data["env"].items()}
        return {**data, "env": env}


class PolicySpec(_Strict):
    """A policy document (`version: 1`)."""

    version: Annotated[int, BeforeValidator(_version), WithJsonSchema({"const": 1})] = Field(
        description="Format version; always 1."
    )
    default: DefaultText = Field(
        "auto", description="Where names no rule matches go; `reject` makes them an error."
    )
    fallback: list[TargetText] = Field(
        default_factory=list, description="Targets tried in order when a target cannot be had."
    )
    strict: StrictBool = Field(False, description="Raise instead of falling back.")
    headroom: Headroom = Field(
        0.1, description="Share of free memory kept free by memory-aware placement (10% or 0.1)."
    )
    rules: list[RuleSpec] = Field(
        default_factory=list, description="Tried in order; first match wins."
    )
    meshes: dict[str, MeshSpec] = Field(
        default_factory=dict, description="Named device meshes that `sharding` rules use."
    )
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec,
        description="JAX's process settings (platforms, GPU memory), applied before JAX starts.",
    )


class OverridesSpec(_Strict):
    """Settings given in code to `load_policy(overrides=...)`: every field optional."""

    default: DefaultText | None = None
    fallback: list[TargetText] | None = None
    strict: StrictBool | None = None
    disable: StrictBool | None = None
    headroom: Headroom | None = None
    rules: list[RuleSpec] = Field(default_factory=list)
    logging_level: LogLevel | None = None
    logging_format: LogFormat | None = None


Source = Literal["code", "env", "policy", "default", "disabled"]


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of a policy document, for editors and validators.

    Example:
        >>> schema = policy_schema()
        >>> schema["required"], sorted(schema["properties"])[:3]
        (['version'], ['default', 'fallback', 'headroom'])
    """
    schema = PolicySpec.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "devpolicy policy",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def sharding_problems(
    rules: list[RuleSpec], meshes: dict[str, MeshSpec]
) -> list[tuple[tuple[str | int, ...], str]]:
    """What a rule's `sharding` says that its mesh contradicts, as (field location, message).

    Checked once every part of a document is known: an unknown mesh, an axis the mesh
    lacks, one axis used twice in a spec.
    """
    found: list[tuple[tuple[str | int, ...], str]] = []
    for i, rule in enumerate(rules):
        if rule.sharding is None:
            continue
        mesh = meshes.get(rule.sharding.mesh)
        if mesh is None:
            hint = did_you_mean(rule.sharding.mesh, meshes)
            listed = ", ".join(meshes) or "none (add a `meshes:` section)"
            found.append(
                (
                    ("rules", i, "sharding", "mesh"),
                    f"unknown mesh {rule.sharding.mesh!r}{hint}; meshes: {listed}",
                )
            )
            continue
        used: list[str] = []
        for j, entry in enumerate(rule.sharding.spec):
            for axis in [entry] if isinstance(entry, str) else entry or []:
                if axis not in mesh.axes:
                    hint = did_you_mean(axis, mesh.axes)
                    found.append(
                        (
                            ("rules", i, "sharding", "spec", j),
                            f"mesh {rule.sharding.mesh!r} has no axis {axis!r}{hint}; "
                            f"axes: {', '.join(mesh.axes)}",
                        )
                    )
                elif axis in used:
                    found.append(
                        (
                            ("rules", i, "sharding", "spec", j),
                            f"axis {axis!r} is used twice in one spec; an axis shards one "
                            "dimension at most",
                        )
                    )
                used.append(axis)
    return found
