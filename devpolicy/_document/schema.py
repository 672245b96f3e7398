"""The policy document's schema: its pydantic models, and the checks across models that
pydantic cannot make field by field.

What a valid policy document is can only be read here and in the field types it is made of
(`fields`: each type with its check and JSON Schema), and each part is tied to a field:

- the `Field(description=...)` texts are what `policy_schema()` (`devpolicy schema`)
  gives editors: the format's reference is the models' own text;
- the `remote:` fields are made from their table (`remote.OPTIONS`), which the environment
  and the I/O wing read too;
- `separator_problem` is the one separator rule the model, `load_file(separator=)` and
  `plan --separator` share, and `prefix_problem` the one prefix rule (`names.prefix`,
  `prefix=`, `--prefix`); a rule's `sharding` against the document's `meshes` is checked
  once every layer is known (`sharding`).

One concept, the document's shape, kept whole although it runs past 650 lines: the house
rule keeps the pydantic models in one module and nothing else in it. The models validate
and normalise; they never touch JAX. `Policy` turns a validated document into the matcher
and routes the hot path uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from .._base.errors import did_you_mean
from .._names.matching import ShapeTest, compile_regex, compile_search, search_as_regex
from .._runtime.knobs import (
    ENV_VARIABLES,
)
from .fields import (
    AXIS_RULES_DESCRIPTION,
    TRANSFER_DIRECTIONS,
    TRANSFER_FIELDS,
    TRANSFER_MODES,
    Allocator,
    AllowItem,
    AxisName,
    AxisRules,
    AxisSize,
    ByteCount,
    ChainText,
    CpuCount,
    DefaultText,
    DeviceIndex,
    ElementCount,
    EnvEntry,
    EnvName,
    EnvValue,
    Headroom,
    HostLimit,
    InputsChoice,
    LogFormat,
    LogicalAxes,
    LogLevel,
    MemoryKind,
    NdimChoice,
    Platform,
    PoolFraction,
    SpecEntry,
    TargetText,
    TransferMode,
    choice,
    distinct,
    fail,
    listed_once,
    mesh_devices,
    remote_field,
    sizes_mapping,
    version_number,
)
from .remote import OPTIONS as REMOTE_OPTIONS
from .targets import (
    INDIVISIBLE,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MeshSpec(_Strict):
    """A named device mesh: axis sizes over a backend's devices or listed ones (`dcn`: slices)."""

    axes: Annotated[
        dict[AxisName, AxisSize],
        BeforeValidator(sizes_mapping("`axes`", "{data: 2, model: -1}")),
    ] = Field(
        description="Axis name to size, in order; one size may be -1 (the devices left). "
        "With `dcn`: the shape of one slice (ICI), each axis's size within a slice."
    )
    dcn: (
        Annotated[
            dict[AxisName, AxisSize],
            BeforeValidator(sizes_mapping("`dcn` (slices per axis)", "{data: 2}")),
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
    devices: Annotated[str | list[TargetText], BeforeValidator(mesh_devices)] = Field(
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
            raise fail("a mesh needs at least one axis, e.g. `axes: {data: -1}`")
        if list(self.axes.values()).count(-1) > 1:
            raise fail("only one axis may be -1 (the devices left over)")
        if isinstance(self.devices, list) and len(set(self.devices)) != len(self.devices):
            raise fail("a device is listed more than once in `devices`")
        if self.dcn is not None:
            problem = _dcn_problem(self.dcn, self.axes)
            if problem is not None:
                raise fail(problem)
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
        BeforeValidator(choice(INDIVISIBLE, "indivisible")),
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
            raise fail("give `spec` (mesh axes) or `axes` (logical names, or `attached`), not both")
        if isinstance(self.axes, list):
            named = [a for a in self.axes if a is not None]
            repeated = sorted({a for a in named if named.count(a) > 1})
            if repeated:
                raise fail(
                    f"logical axis {repeated[0]!r} names more than one dimension; each "
                    "dimension needs its own name"
                )
        return self


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
            raise fail("empty pattern matches only the empty name; use '*' to match everything")
        return value

    @field_validator("file")
    @classmethod
    def _file_glob_not_empty(cls, value: str | None) -> str | None:
        if value is not None and value.strip() == "":
            raise fail("empty file glob matches no file; e.g. 'train*.safetensors'")
        if value is not None and "\0" in value:
            raise fail(f"a file glob cannot hold a NUL character, got {value!r}")
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
            raise fail(str(e)) from None
        return value

    @field_validator("search")
    @classmethod
    def _search_compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value == "":
            raise fail("an empty search pattern is found in every name; use match: '*'")
        try:
            compile_search(value)
        except ValueError as e:
            raise fail(str(e)) from None
        return value

    @model_validator(mode="after")
    def _one_pattern_and_ordered_sizes(self) -> RuleSpec:
        given = [k for k in ("match", "regex", "search") if getattr(self, k) is not None]
        if len(given) > 1:
            raise fail(
                "give exactly one of `match` (a glob), `regex` (whole name) or `search` "
                f"(anywhere in the name), not {' and '.join(f'`{k}`' for k in given)}"
            )
        if not given and self.file is None:
            raise fail(
                "give exactly one of `match` (a glob), `regex` or `search` for names, or "
                "`file` (a glob) for the file tensors come from"
            )
        if (
            self.min_elements is not None
            and self.max_elements is not None
            and self.min_elements > self.max_elements
        ):
            raise fail(
                f"min_elements ({self.min_elements}) is larger than max_elements "
                f"({self.max_elements})"
            )
        if (self.device is None) == (self.sharding is None):
            raise fail(
                "give exactly one of `device` (a target such as cpu or gpu:1) or `sharding` "
                "(a mesh and spec)"
            )
        if (
            self.min_bytes is not None
            and self.max_bytes is not None
            and self.min_bytes > self.max_bytes
        ):
            raise fail(f"min_bytes ({self.min_bytes}) is larger than max_bytes ({self.max_bytes})")
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
        raise fail(f"a separator is {problem}")
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
            raise fail(f"a prefix has no leading or trailing '/', got {value!r}")
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


class RuntimeSpec(_Strict):
    """JAX's process settings, read when JAX starts; applied by `bootstrap()` or `devpolicy run`."""

    platforms: Annotated[list[Platform], BeforeValidator(distinct("platform"))] | None = Field(
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
        Annotated[list[DeviceIndex], BeforeValidator(distinct("device index"))] | None
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
    allow: Annotated[list[AllowItem], BeforeValidator(listed_once)] = Field(
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
        # Each env value is checked knowing its name and `allow` (see EnvEntry).
        if not isinstance(data, dict) or not isinstance(data.get("env"), dict):
            return data
        allow = data.get("allow")
        allowed = (
            frozenset(a for a in allow if isinstance(a, str))
            if isinstance(allow, list)
            else frozenset()
        )
        env = {name: EnvEntry(name, value, allowed) for name, value in data["env"].items()}
        return {**data, "env": env}


class _RemoteChecks(_Strict):
    """What `remote:` checks across its fields, which are made from their table below."""

    @model_validator(mode="after")
    def _budget_holds_a_chunk(self) -> _RemoteChecks:
        # The fields are the table's (`RemoteSpec`), unknown to this base by name.
        inflight, chunk = self.__dict__["inflight"], self.__dict__["chunk"]
        if inflight is not None and chunk is not None and inflight < chunk:
            raise fail(
                f"inflight ({inflight}) is smaller than chunk ({chunk}): no request "
                "would fit; give inflight at least chunk"
            )
        return self


_REMOTE_DOC = """How URLs are read (`load_file`, `plan`, `read_metadata` of `s3://`, `gs://`,
    `hf://`, `https://`): every field optional; `DEVPOLICY_REMOTE_*` and a call's
    `remote=` override it."""

if TYPE_CHECKING:
    RemoteSpec = _RemoteChecks
else:
    # One field per option of the table (`remote.OPTIONS`), in its order: each one's check,
    # bounds and description are the table's, shared with `DEVPOLICY_REMOTE_*`.
    RemoteSpec = create_model(
        "RemoteSpec",
        __base__=_RemoteChecks,
        __doc__=_REMOTE_DOC,
        **{option.field: remote_field(option) for option in REMOTE_OPTIONS},
    )


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
        mode = choice(TRANSFER_MODES, "transfer mode")(value)
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

    version: Annotated[int, BeforeValidator(version_number), WithJsonSchema({"const": 1})] = Field(
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
