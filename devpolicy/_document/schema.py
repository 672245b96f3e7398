"""The policy document's schema: its pydantic models, the field types they are made of,
and the checks across models that pydantic cannot make field by field.

One concept, kept whole although it runs past 1,100 lines (the house rule: the pydantic
schema in one module, and nothing else in it). What a valid policy document is can only
be read here, and each part is tied to a field:

- each field type (`TargetText`, `ByteCount`, `PoolFraction`, ...) is an `Annotated`
  triple of the type, its `BeforeValidator` and its `WithJsonSchema`: the check and the
  JSON Schema of one field, whose message lists that field's valid forms. Cutting the
  validators away from the models would split every field's definition over two files;
- the `Field(description=...)` texts are what `policy_schema()` (`devpolicy schema`)
  gives editors: the format's reference is the models' own text;
- `sharding_problems` checks a rule's `sharding` and fallbacks against the document's
  `meshes`, in the models' field locations (`rules[3].sharding.spec[0]`), once every
  layer is known (`documents` and `layers` call it); `separator_problem` is the one
  separator rule the model, `load_file(separator=)` and `plan --separator` share, and
  `prefix_problem` the one prefix rule (`names.prefix`, `prefix=`, `--prefix`).

Text-level parsing is not here: targets, sizes, runtime knobs, axis names and patterns
are read by the leaves this module imports (`targets`, `sizes`, `knobs`, `axes`,
`matching`), so what remains is the document's shape. The models validate and
normalise; they never touch JAX. `Policy` turns a validated document into the matcher
and routes the hot path uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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

from .._base.errors import did_you_mean
from .._base.sizes import SIZE_FORMS, SIZE_PATTERN, format_size, parse_size
from .._names.matching import ShapeTest, compile_regex, compile_search, search_as_regex
from .._runtime.knobs import (
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
from .axes import ATTACHED, resolve_axes
from .remote import BY_FIELD as REMOTE_OPTIONS_BY_FIELD
from .targets import (
    ACCELERATOR,
    AXIS_NAME_PATTERN,
    CHAIN_FORMS,
    INDIVISIBLE,
    PLATFORM_ALIASES,
    REJECT,
    REPLICATE,
    SHARDING_PATTERN,
    TARGET_FORMS,
    TARGET_PATTERN,
    check_chain_item,
    check_default,
    parse_sharding,
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
                raise _fail(f"a mesh axis is listed twice in {list(value)!r}")
            return name, axes
    raise _fail(
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
            raise _fail(
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


def _mesh_devices(value: Any) -> Any:
    if isinstance(value, str):
        if value in ("auto", ACCELERATOR) or value in PLATFORM_ALIASES:
            return value
        hint = did_you_mean(value, ["auto", ACCELERATOR, *PLATFORM_ALIASES])
        raise _fail(
            f"unknown backend {value!r}{hint}; accepted: auto, {ACCELERATOR}, "
            f"{', '.join(PLATFORM_ALIASES)}, or a list of targets"
        )
    return value


def _sizes_mapping(what: str, example: str) -> Callable[[Any], Any]:
    """A mesh's `axes` or `dcn`: a mapping of axis name to size, said so when it is not."""

    def validate(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _fail(
                f"{what} is a mapping of axis name to size, e.g. `{example}`; got {value!r}"
            )
        return value

    return validate


class MeshSpec(_Strict):
    """A named device mesh: axis sizes over a backend's devices or listed ones (`dcn`: slices)."""

    axes: Annotated[
        dict[AxisName, AxisSize],
        BeforeValidator(_sizes_mapping("`axes`", "{data: 2, model: -1}")),
    ] = Field(
        description="Axis name to size, in order; one size may be -1 (the devices left). "
        "With `dcn`: the shape of one slice (ICI), each axis's size within a slice."
    )
    dcn: (
        Annotated[
            dict[AxisName, AxisSize],
            BeforeValidator(_sizes_mapping("`dcn` (slices per axis)", "{data: 2}")),
        ]
        | None
    ) = Field(
        None,
        description="A mesh over several slices (DCN, multi-slice): how many slices each "
        "axis of `axes` spans (an axis not listed: 1); one value may be -1 (the slices "
        "left). Each mesh axis is then its `axes` size times its `dcn` size, in the device "
        "order of jax's mesh_utils.create_hybrid_device_mesh: slices by `slice_index` on "
        "TPU, each process a slice on CPU and GPU. MaxText's `dcn_X_parallelism` is "
        "`dcn: {X: ...}`, `ici_X_parallelism` is `axes: {X: ...}`.",
    )
    devices: Annotated[str | list[TargetText], BeforeValidator(_mesh_devices)] = Field(
        "auto",
        description="A backend (every device of it, across all processes of a "
        "jax.distributed job; `auto`: the default backend), or a list of targets.",
    )
    axis_rules: AxisRules | None = Field(
        None,
        description="This mesh's logical axis rules, for rules giving `axes`; else the "
        "policy's `axis_rules`. " + AXIS_RULES_DESCRIPTION,
    )

    @model_validator(mode="after")
    def _axes_make_sense(self) -> MeshSpec:
        if not self.axes:
            raise _fail("a mesh needs at least one axis, e.g. `axes: {data: -1}`")
        if list(self.axes.values()).count(-1) > 1:
            raise _fail("only one axis may be -1 (the devices left over)")
        if isinstance(self.devices, list) and len(set(self.devices)) != len(self.devices):
            raise _fail("a device is listed more than once in `devices`")
        if self.dcn is not None:
            problem = _dcn_problem(self.dcn, self.axes)
            if problem is not None:
                raise _fail(problem)
        return self


def _dcn_problem(dcn: dict[str, int], axes: dict[str, int]) -> str | None:
    """What is wrong with a mesh's `dcn` beside its `axes`, or None."""
    if not dcn:
        return (
            "`dcn` names how many slices each axis spans and needs at least one axis, e.g. "
            f"`dcn: {{{next(iter(axes), 'data')}: 2}}`; leave it out for a mesh of one slice"
        )
    for name in dcn:
        if name not in axes:
            hint = did_you_mean(name, axes)
            return (
                f"`dcn` names axis {name!r}{hint}, which `axes` lacks; axes: "
                f"{', '.join(axes)} (every axis of the mesh is in `axes`, its size in one "
                "slice; 1 for an axis only across slices)"
            )
    if list(dcn.values()).count(-1) > 1:
        return "only one `dcn` size may be -1 (the slices left over)"
    return None


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
    raise _fail(f"`axes` is {AXES_FORMS}; got {value!r}{hint}")


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


class ShardingSpec(_Strict):
    """How a rule shards: a mesh of `meshes`, and one spec entry (or logical axis name)
    per array dimension."""

    mesh: str = Field(description="The name of a mesh in `meshes`.")
    spec: list[SpecEntry] = Field(
        default_factory=list,
        description="Per dimension: an axis, null (not sharded) or a list of axes; "
        "[] replicates over the mesh.",
    )
    axes: LogicalAxes = Field(
        None,
        description="Instead of `spec`: a logical axis name per dimension (null: not sharded), "
        "turned into mesh axes by the mesh's or policy's `axis_rules`; or `attached`: each "
        "leaf's own names as its framework attached them (flax LogicallyPartitioned, nnx "
        "sharding metadata, haliax axes), resolved the same way (flax Partitioned names are "
        "mesh axes: the spec as they are); a leaf that carries none is replicated over the "
        "mesh, with a warning.",
    )
    indivisible: Annotated[
        str,
        BeforeValidator(_choice(INDIVISIBLE, "indivisible")),
        WithJsonSchema({"enum": list(INDIVISIBLE)}),
    ] = Field(
        "fallback",
        description="A dimension that does not divide over its axes: `fallback` passes the "
        "sharding over for the next target of the chain; `replicate` drops only the axes "
        "that do not divide it (that dimension is replicated), keeping the rest of the spec.",
    )

    @model_validator(mode="after")
    def _spec_or_axes(self) -> ShardingSpec:
        if self.axes is not None and "spec" in self.model_fields_set:
            raise _fail(
                "give `spec` (mesh axes) or `axes` (logical names, or `attached`), not both"
            )
        if isinstance(self.axes, list):
            named = [a for a in self.axes if a is not None]
            repeated = sorted({a for a in named if named.count(a) > 1})
            if repeated:
                raise _fail(
                    f"logical axis {repeated[0]!r} names more than one dimension; each "
                    "dimension needs its own name"
                )
        return self


def _ndim(value: Any) -> Any:
    def rank(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if rank(value):
        return [value]
    if isinstance(value, list) and value and all(rank(v) for v in value):
        if len(set(value)) != len(value):
            raise _fail(f"a rank is listed more than once in ndim {value!r}")
        return value
    raise _fail(
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
        raise _fail(f"an element count is a whole number >= 0, got {value!r}")
    return value


ElementCount = Annotated[
    int, BeforeValidator(_element_count), WithJsonSchema({"type": "integer", "minimum": 0})
]


class RuleSpec(_Strict):
    """One rule: names it matches, where they go, and under which conditions."""

    match: str | None = Field(
        None, description="fnmatch glob, case-sensitive; `*` also matches `/`."
    )
    regex: str | None = Field(
        None,
        description="Regular expression that must match the whole name: Python's syntax "
        "and meaning in ASCII mode (re.ASCII), matched by RE2 in linear time (no "
        "backreferences or lookaround).",
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
    fallback: list[ChainText] | None = Field(
        None,
        description="Targets tried in order when `device` or `sharding` cannot be had; else the "
        "policy's. Each is a target, `replicate` (the rule's mesh, replicated) or a sharding "
        "`MESH[axis,-,a+b]`.",
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
    # Names as other systems write them, and conditions on rank and element count.
    search: str | None = Field(
        None,
        description="Regular expression found anywhere in the name (Python's re.search, as "
        "EasyLM and EasyDeL tables are written): Python's syntax and meaning in ASCII mode "
        "(re.ASCII), matched by RE2 in linear time.",
    )
    ndim: NdimChoice | None = Field(
        None,
        description="Match only arrays of this rank, or of one of these ranks (`ndim: 0` for "
        "scalars, `ndim: [1, 2]`); needs a known shape.",
    )
    min_elements: ElementCount | None = Field(
        None,
        description="Match only arrays of at least this many elements (inclusive); needs a "
        "known shape.",
    )
    max_elements: ElementCount | None = Field(
        None,
        description="Match only arrays of at most this many elements (inclusive; 1 takes "
        "scalars and one-element arrays); needs a known shape.",
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
        """The name pattern as a glob or full-match regex, and whether it is a regex: `*`
        for a rule with `file` alone, a `search:` pattern as `search_as_regex` writes it."""
        if self.regex is not None:
            return self.regex, True
        if self.search is not None:
            return search_as_regex(self.search), True
        return ("*" if self.match is None else self.match), False

    @property
    def shape_test(self) -> ShapeTest:
        """The rule's rank and element conditions."""
        ndim = None if self.ndim is None else tuple(sorted(set(self.ndim)))
        return ShapeTest(ndim, self.min_elements, self.max_elements)

    @property
    def label(self) -> str:
        """How messages name the rule: its pattern (`search '...'` for a search pattern),
        and its file glob if any."""
        pattern, _ = self.name_pattern
        shown = f"search {self.search!r}" if self.search is not None else repr(pattern)
        if self.file is None:
            return shown
        if self.match is None and self.regex is None and self.search is None:
            return f"file {self.file!r}"
        return f"{shown} file {self.file!r}"

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

    @field_validator("search")
    @classmethod
    def _search_compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value == "":
            raise _fail("an empty search pattern is found in every name; use match: '*'")
        try:
            compile_search(value)
        except ValueError as e:
            raise _fail(str(e)) from None
        return value

    @model_validator(mode="after")
    def _one_pattern_and_ordered_sizes(self) -> RuleSpec:
        given = [k for k in ("match", "regex", "search") if getattr(self, k) is not None]
        if len(given) > 1:
            raise _fail(
                "give exactly one of `match` (a glob), `regex` (whole name) or `search` "
                f"(anywhere in the name), not {' and '.join(f'`{k}`' for k in given)}"
            )
        if not given and self.file is None:
            raise _fail(
                "give exactly one of `match` (a glob), `regex` or `search` for names, or "
                "`file` (a glob) for the file tensors come from"
            )
        if (
            self.min_elements is not None
            and self.max_elements is not None
            and self.min_elements > self.max_elements
        ):
            raise _fail(
                f"min_elements ({self.min_elements}) is larger than max_elements "
                f"({self.max_elements})"
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


def separator_problem(value: object) -> str | None:
    """Why `value` cannot separate the parts of tensor keys (None: it can). One rule for
    the policy's `names.separator`, `load_file(separator=...)` and `plan --separator`."""
    if isinstance(value, str) and len(value) == 1 and value not in "*?[]\0":
        return None
    return f"one character that is not a glob character, such as '.'; got {value!r}"


def prefix_problem(value: object) -> str | None:
    """Why `value` cannot prefix tensor names (None: it can). One rule for the policy's
    `names.prefix`, the `prefix=` of `load_file` and `plan`, and `--prefix`."""
    if isinstance(value, str) and not value.startswith("/") and not value.endswith("/"):
        return None
    return f"text with no leading or trailing '/', got {value!r}"


def _separator(value: Any) -> str:
    problem = separator_problem(value)
    if problem is not None:
        raise _fail(f"a separator is {problem}")
    return str(value)


Separator = Annotated[
    str,
    BeforeValidator(_separator),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 1}),
]


class NamesSpec(_Strict):
    """How a checkpoint's tensor keys become the names rules see."""

    separator: Separator = Field(
        "/",
        description="The character between the parts of a checkpoint's tensor keys: with "
        "`.`, the key `model.layers.0.mlp.up_proj.weight` is matched as "
        "`<prefix>/model/layers/0/mlp/up_proj/weight` (the keys loaded keep their form).",
    )
    prefix: str | None = Field(
        None,
        description="What checkpoint tensor names start with instead of the file's or "
        'directory\'s name (`""`: nothing, the key alone); a `prefix=` argument wins.',
    )

    @field_validator("prefix")
    @classmethod
    def _prefix_plain(cls, value: str | None) -> str | None:
        if value is not None and prefix_problem(value) is not None:
            raise _fail(f"a prefix has no leading or trailing '/', got {value!r}")
        return value


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


def _remote_check(field: str) -> Callable[[Any], Any]:
    """The check of one `remote:` option, from its table entry (`_document/remote.py`)."""
    option = REMOTE_OPTIONS_BY_FIELD[field]

    def validate(value: Any) -> Any:
        if value is None:
            return None
        try:
            return option.check(value)
        except ValueError as e:
            raise _fail(f"{e}; accepted: {option.accepted}") from None

    return validate


def _remote_schema(field: str) -> dict[str, Any]:
    option = REMOTE_OPTIONS_BY_FIELD[field]
    bounds = {"minimum": option.low, "maximum": option.high}
    schemas: dict[str, dict[str, Any]] = {
        "int": {"type": "integer", **bounds},
        "size": {"anyOf": [{"type": "integer", **bounds},
                           {"type": "string", "pattern": SIZE_PATTERN}]},
        "seconds": {"type": "number", **bounds},
        "path": {"type": "string", "minLength": 1},
    }  # fmt: skip
    return schemas[option.kind]


def _remote(field: str) -> Any:
    option = REMOTE_OPTIONS_BY_FIELD[field]
    return Field(None, description=f"{option.description} ({option.variable})")


# Each field's check and bounds are the option table's (`remote.py`), shared with the
# environment's reading of `DEVPOLICY_REMOTE_*`.
class RemoteSpec(_Strict):
    """How URLs are read (`load_file`, `plan`, `read_metadata` of `s3://`, `gs://`,
    `hf://`, `https://`): every field optional; `DEVPOLICY_REMOTE_*` and a call's
    `remote=` override it."""

    concurrency: Annotated[
        int | None,
        BeforeValidator(_remote_check("concurrency")),
        WithJsonSchema(_remote_schema("concurrency")),
    ] = _remote("concurrency")
    chunk: Annotated[
        int | None,
        BeforeValidator(_remote_check("chunk")),
        WithJsonSchema(_remote_schema("chunk")),
    ] = _remote("chunk")
    inflight: Annotated[
        int | None,
        BeforeValidator(_remote_check("inflight")),
        WithJsonSchema(_remote_schema("inflight")),
    ] = _remote("inflight")
    attempts: Annotated[
        int | None,
        BeforeValidator(_remote_check("attempts")),
        WithJsonSchema(_remote_schema("attempts")),
    ] = _remote("attempts")
    backoff: Annotated[
        float | None,
        BeforeValidator(_remote_check("backoff")),
        WithJsonSchema(_remote_schema("backoff")),
    ] = _remote("backoff")
    backoff_cap: Annotated[
        float | None,
        BeforeValidator(_remote_check("backoff_cap")),
        WithJsonSchema(_remote_schema("backoff_cap")),
    ] = _remote("backoff_cap")
    total_time: Annotated[
        float | None,
        BeforeValidator(_remote_check("total_time")),
        WithJsonSchema(_remote_schema("total_time")),
    ] = _remote("total_time")
    timeout: Annotated[
        float | None,
        BeforeValidator(_remote_check("timeout")),
        WithJsonSchema(_remote_schema("timeout")),
    ] = _remote("timeout")
    cache: Annotated[
        Path | None, BeforeValidator(_remote_check("cache")),
        WithJsonSchema(_remote_schema("cache")),
    ] = _remote("cache")  # fmt: skip

    @model_validator(mode="after")
    def _budget_holds_a_chunk(self) -> RemoteSpec:
        if self.inflight is not None and self.chunk is not None and self.inflight < self.chunk:
            raise _fail(
                f"inflight ({self.inflight}) is smaller than chunk ({self.chunk}): no request "
                "would fit; give inflight at least chunk"
            )
        return self


# `transfers:` (issue 35): what devpolicy does with the placements JAX makes on its own.
TRANSFER_MODES = ("allow", "log", "disallow")
#: The directions a bare `transfers: MODE` sets (`host_local` keeps its own default).
TRANSFER_DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")
#: Every field of `transfers:`, in the order they are shown.
TRANSFER_FIELDS = (*TRANSFER_DIRECTIONS, "host_local")
TransferMode = Annotated[
    str,
    BeforeValidator(_choice(TRANSFER_MODES, "transfer mode")),
    WithJsonSchema({"enum": list(TRANSFER_MODES)}),
]


class TransfersSpec(_Strict):
    """What is done with a transfer JAX makes implicitly, per direction: `allow` (nothing),
    `log` (a `transfer` event, counted in `report()`), `disallow` (TransferRefusedError)."""

    host_to_device: TransferMode | None = Field(
        None, description="numpy, Python scalars and host buffers copied onto an accelerator."
    )
    device_to_device: TransferMode | None = Field(
        None, description="An array copied from the device(s) it is on to others."
    )
    device_to_host: TransferMode | None = Field(
        None, description="An accelerator's array read by the host (`float(x)`, `np.asarray`)."
    )
    host_local: TransferMode | None = Field(
        None,
        description="numpy or a host buffer into a CPU device (JAX calls it host-to-device); "
        "`allow` unless set, so CPU-only jobs are not flooded.",
    )


def _transfers_shorthand(value: Any) -> Any:
    """`transfers: log` is every direction at `log` (`host_local` keeps its default)."""
    if isinstance(value, str):
        mode = _choice(TRANSFER_MODES, "transfer mode")(value)
        return dict.fromkeys(TRANSFER_DIRECTIONS, mode)
    return value


TransfersField = Annotated[
    TransfersSpec | None,
    BeforeValidator(_transfers_shorthand),
    WithJsonSchema(
        {
            "anyOf": [
                {"enum": list(TRANSFER_MODES), "description": "every direction at once"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        name: {
                            "enum": list(TRANSFER_MODES),
                            "description": TransfersSpec.model_fields[name].description,
                        }
                        for name in TRANSFER_FIELDS
                    },
                },
            ],
            "description": "What is done with the transfers JAX makes implicitly.",
        }
    ),
]


class PolicySpec(_Strict):
    """A policy document (`version: 1`)."""

    version: Annotated[int, BeforeValidator(_version), WithJsonSchema({"const": 1})] = Field(
        description="Format version; always 1."
    )
    default: DefaultText = Field(
        "auto", description="Where names no rule matches go; `reject` makes them an error."
    )
    fallback: list[ChainText] = Field(
        default_factory=list,
        description="Targets tried in order when a target cannot be had: targets, `replicate` "
        "(over a sharding rule's mesh; skipped for device rules) or shardings `MESH[axis,-]`.",
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
    axis_rules: AxisRules = Field(
        default_factory=list,
        description="Logical axis rules of every mesh without its own, for sharding rules "
        "giving `axes`. " + AXIS_RULES_DESCRIPTION,
    )
    names: NamesSpec = Field(
        default_factory=NamesSpec,
        description="How checkpoint tensor keys are named for rules (separator, prefix).",
    )
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec,
        description="JAX's process settings (platforms, GPU memory), applied before JAX starts.",
    )
    remote: RemoteSpec = Field(
        default_factory=RemoteSpec,
        description="How URLs are read: concurrency, chunk size, in-flight budget, retries, "
        "the cache directory.",
    )
    transfers: TransfersField = Field(
        None,
        description="What is done with the transfers JAX makes implicitly (a numpy argument "
        "of a jit, an array copied to another device): `allow`, `log` or `disallow`, per "
        "direction or for all at once.",
    )

    @model_validator(mode="after")
    def _meshes_carry_axis_rules(self) -> PolicySpec:
        # Each mesh carries the table its `axes` rules resolve by: its own, else the policy's.
        if self.axis_rules:
            meshes = {
                name: mesh
                if mesh.axis_rules is not None
                else mesh.model_copy(update={"axis_rules": self.axis_rules})
                for name, mesh in self.meshes.items()
            }
            object.__setattr__(self, "meshes", meshes)
        return self


class OverridesSpec(_Strict):
    """Settings given in code to `load_policy(overrides=...)`: every field optional."""

    default: DefaultText | None = None
    fallback: list[ChainText] | None = None
    strict: StrictBool | None = None
    disable: StrictBool | None = None
    headroom: Headroom | None = None
    rules: list[RuleSpec] = Field(default_factory=list)
    logging_level: LogLevel | None = None
    logging_format: LogFormat | None = None
    remote: RemoteSpec | None = None


Source = Literal["code", "env", "policy", "default", "disabled"]


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of a policy document, for editors and validators.

    Example:
        >>> schema = policy_schema()
        >>> schema["required"], sorted(schema["properties"])[:3]
        (['version'], ['axis_rules', 'default', 'fallback'])
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
    """What a rule's `sharding` (or a sharding in its `fallback`) says that its mesh
    contradicts, as (field location, message).

    Checked once every part of a document is known: an unknown mesh, an axis the mesh
    lacks, one axis used twice in a spec, logical `axes` with no `axis_rules` to resolve
    them or resolving to an axis the mesh lacks.
    """
    found: list[tuple[tuple[str | int, ...], str]] = []
    for i, rule in enumerate(rules):
        if rule.sharding is not None:
            found += _sharding_problems(("rules", i, "sharding"), rule.sharding, meshes)
        for j, item in enumerate(rule.fallback or []):
            if "[" in item:
                target = parse_sharding(item)
                entries = [list(e) if isinstance(e, tuple) else e for e in target.spec]
                fallback = ShardingSpec(mesh=target.mesh, spec=entries)
                found += [
                    (("rules", i, "fallback", j), message)
                    for _, message in _sharding_problems((), fallback, meshes)
                ]
    return found


def _sharding_problems(
    where: tuple[str | int, ...], sharding: ShardingSpec, meshes: dict[str, MeshSpec]
) -> list[tuple[tuple[str | int, ...], str]]:
    mesh = meshes.get(sharding.mesh)
    if mesh is None:
        hint = did_you_mean(sharding.mesh, meshes)
        listed = ", ".join(meshes) or "none (add a `meshes:` section)"
        return [((*where, "mesh"), f"unknown mesh {sharding.mesh!r}{hint}; meshes: {listed}")]
    if sharding.axes == ATTACHED:
        # Names are known per leaf: one the table lacks, or resolving to an axis the mesh
        # lacks, is a reason when placing (lint warns about a missing table).
        return []
    if sharding.axes is not None:
        return _logical_problems(where, sharding, mesh)
    found: list[tuple[tuple[str | int, ...], str]] = []
    used: list[str] = []
    for j, entry in enumerate(sharding.spec):
        for axis in [entry] if isinstance(entry, str) else entry or []:
            if axis not in mesh.axes:
                hint = did_you_mean(axis, mesh.axes)
                found.append(
                    (
                        (*where, "spec", j),
                        f"mesh {sharding.mesh!r} has no axis {axis!r}{hint}; "
                        f"axes: {', '.join(mesh.axes)}",
                    )
                )
            elif axis in used:
                found.append(
                    (
                        (*where, "spec", j),
                        f"axis {axis!r} is used twice in one spec; an axis shards one "
                        "dimension at most",
                    )
                )
            used.append(axis)
    return found


def _logical_problems(
    where: tuple[str | int, ...], sharding: ShardingSpec, mesh: MeshSpec
) -> list[tuple[tuple[str | int, ...], str]]:
    """Logical axes need a table, and the table must name only axes the mesh has."""
    assert isinstance(sharding.axes, list)
    if not mesh.axis_rules:
        return [
            (
                (*where, "axes"),
                f"logical axes {sharding.axes} but neither mesh {sharding.mesh!r} nor the policy "
                "has `axis_rules` to turn them into mesh axes, e.g. "
                "`axis_rules: [[embed, fsdp], [mlp, tensor]]`",
            )
        ]
    spec = resolve_axes(sharding.axes, mesh.axis_rules)
    found: list[tuple[tuple[str | int, ...], str]] = []
    for j, entry in enumerate(spec):
        for axis in [entry] if isinstance(entry, str) else entry or []:
            if axis not in mesh.axes:
                hint = did_you_mean(axis, mesh.axes)
                found.append(
                    (
                        (*where, "axes", j),
                        f"logical axis {sharding.axes[j]!r} resolves by axis_rules to mesh axis "
                        f"{axis!r}, which mesh {sharding.mesh!r} lacks{hint}; "
                        f"axes: {', '.join(mesh.axes)}",
                    )
                )
    return found
