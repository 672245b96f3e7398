"""Layer precedence, in one place: defaults < policy file < environment < code.

Scalar settings take the value of the highest layer that sets them. Rules from every
layer are kept, highest layer first, so that an environment rule is tried before every
rule of the policy file and a rule given in code before both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._base.errors import PolicyError, Problem
from .documents import Document
from .environment import (
    DEFAULT,
    DISABLE,
    LOG_FORMAT,
    LOG_LEVEL,
    RULES,
    STRICT,
    TRANSFERS,
    EnvSettings,
    carried,
)
from .remote import BY_FIELD as REMOTE_OPTIONS_BY_FIELD
from .schema import (
    MeshSpec,
    NamesSpec,
    OverridesSpec,
    PolicySpec,
    RuleSpec,
    Source,
)
from .sharding import sharding_problems
from .yaml_reader import field_path

#: Lowest precedence first.
LAYERS: tuple[str, ...] = ("defaults", "policy", "env", "code")

_DEFAULTS = PolicySpec(version=1)


@dataclass(frozen=True, slots=True)
class RuleEntry:
    """A rule and where it came from.

    Attributes:
        spec: The validated rule.
        index: Its position in its own layer (`rules[index]` of the file, item of the variable).
        origin: `file:line`, `env:DEVPOLICY_RULES` or `code:rules[i]`.
        source: The layer: `policy`, `env` or `code`.
    """

    spec: RuleSpec
    index: int
    origin: str
    source: Source


@dataclass(frozen=True, slots=True)
class Setting:
    """One scalar setting's value, the layer (`source`) and the place that gave it.

    `source` is one of `LAYERS`, the same word rules and decisions use for where they came
    from.
    """

    value: Any
    source: str
    origin: str


@dataclass(frozen=True, slots=True)
class Settings:
    """A policy with every layer applied."""

    default: Setting
    fallback: Setting
    strict: Setting
    headroom: Setting
    disable: Setting
    log_level: Setting
    log_format: Setting
    rules: tuple[RuleEntry, ...]
    file: str | None
    #: The policy's `runtime:` fields by knob (`env.NAME` for its `env:` entries). The
    #: environment layer of these is JAX's own variables, weighed when they are applied.
    runtime: Mapping[str, Setting] = field(default_factory=dict)
    #: The policy's meshes by name (only a policy file or mapping defines meshes).
    meshes: Mapping[str, MeshSpec] = field(default_factory=dict)
    #: Where each mesh was written (`file:line`).
    mesh_origins: Mapping[str, str] = field(default_factory=dict)
    #: How checkpoint tensor keys are named for rules (the policy's `names:`).
    names: NamesSpec = field(default_factory=NamesSpec)
    #: How URLs are read, by `remote:` field: only the fields some layer sets (the rest keep
    #: their defaults); each with its layer and origin (`env:DEVPOLICY_REMOTE_CHUNK`).
    remote: Mapping[str, Setting] = field(default_factory=dict)
    #: What is done with JAX's implicit transfers, by `transfers:` field: only the fields
    #: some layer sets; empty when no layer has `transfers:` (nothing is watched).
    transfers: Mapping[str, Setting] = field(default_factory=dict)

    @property
    def remote_values(self) -> dict[str, Any]:
        """`remote` as plain values by field, as `options_of` takes them."""
        return {name: setting.value for name, setting in self.remote.items()}


def merge(document: Document | None, env: EnvSettings, code: OverridesSpec | None) -> Settings:
    """Apply the layers in `LAYERS` order."""
    code = code or OverridesSpec()
    spec = document.spec if document is not None else None

    def pick(
        field: str, env_value: Any, env_var: str, code_value: Any, doc_loc: tuple[str, ...]
    ) -> Setting:
        chosen = Setting(_default_of(field), "defaults", "default")
        if spec is not None and _is_set(spec, doc_loc):
            assert document is not None
            chosen = Setting(_get(spec, doc_loc), "policy", document.origin(*doc_loc))
        if env_value is not None:
            chosen = Setting(env_value, "env", f"env:{env_var}")
        if code_value is not None:
            chosen = Setting(code_value, "code", f"code:{field}")
        return chosen

    rules: list[RuleEntry] = [
        RuleEntry(rule, i, f"code:rules[{i}]", "code") for i, rule in enumerate(code.rules)
    ]
    # An override of a policy rule keeps how that rule loads (`mmap`...): see `carried`.
    env_rules = carried(env.rules, list(document.spec.rules) if document is not None else [])
    rules += [RuleEntry(rule, i, f"env:{RULES}", "env") for i, rule in enumerate(env_rules)]
    if document is not None:
        rules += [
            RuleEntry(rule, i, document.origin("rules", i), "policy")
            for i, rule in enumerate(document.spec.rules)
        ]
    fallback = None if code.fallback is None else tuple(code.fallback)
    meshes = dict(document.spec.meshes) if document is not None else {}
    _check_meshes_named(env, code.rules, meshes)
    return Settings(
        default=pick("default", env.default, DEFAULT, code.default, ("default",)),
        fallback=pick("fallback", None, "", fallback, ("fallback",)),
        strict=pick("strict", env.strict, STRICT, code.strict, ("strict",)),
        headroom=pick("headroom", None, "", code.headroom, ("headroom",)),
        disable=pick("disable", env.disable, DISABLE, code.disable, ()),
        log_level=pick(
            "log_level", env.log_level, LOG_LEVEL, code.logging_level, ("logging", "level")
        ),
        log_format=pick(
            "log_format", env.log_format, LOG_FORMAT, code.logging_format, ("logging", "format")
        ),
        rules=tuple(rules),
        file=document.file if document is not None else None,
        runtime=_runtime(document),
        meshes=meshes,
        mesh_origins={name: document.origin("meshes", name) for name in meshes}
        if document is not None
        else {},
        names=document.spec.names if document is not None else NamesSpec(),
        remote=_remote(document, env, code),
        transfers=_transfers(document, env),
    )


def _transfers(document: Document | None, env: EnvSettings) -> dict[str, Setting]:
    """`transfers:` by field, each from the highest layer that sets it (the file's
    `transfers:`, then `DEVPOLICY_TRANSFERS`)."""
    out: dict[str, Setting] = {}
    spec = document.spec.transfers if document is not None else None
    if spec is not None:
        assert document is not None
        for name in sorted(spec.model_fields_set):
            value = getattr(spec, name)
            if value is not None:
                # `transfers: log` has no line per field: the section's line is the origin.
                origin = document.origin("transfers", name)
                if origin.endswith(name):
                    origin = document.origin("transfers")
                out[name] = Setting(value, "policy", origin)
    for name, value in env.transfers.items():
        out[name] = Setting(value, "env", f"env:{TRANSFERS}")
    return out


def _remote(document: Document | None, env: EnvSettings, code: OverridesSpec) -> dict[str, Setting]:
    """`remote:` by field, each from the highest layer that sets it (the file's
    `remote:`, then `DEVPOLICY_REMOTE_*`, then `load_policy(overrides={"remote": ...})`)."""
    out: dict[str, Setting] = {}
    if document is not None:
        spec = document.spec.remote
        for name in sorted(spec.model_fields_set):
            if getattr(spec, name) is not None:
                out[name] = Setting(getattr(spec, name), "policy", document.origin("remote", name))
    for name, value in env.remote.items():
        out[name] = Setting(value, "env", f"env:{REMOTE_OPTIONS_BY_FIELD[name].variable}")
    if code.remote is not None:
        for name in sorted(code.remote.model_fields_set):
            if getattr(code.remote, name) is not None:
                out[name] = Setting(getattr(code.remote, name), "code", f"code:remote.{name}")
    return out


def _check_meshes_named(
    env: EnvSettings, code_rules: list[RuleSpec], meshes: dict[str, MeshSpec]
) -> None:
    """Environment and code rules may shard only over meshes the policy defines."""
    for problem in sharding_problems(list(env.rules), meshes)[:1]:
        loc, message = problem
        index = loc[1]
        assert isinstance(index, int)
        raise env.rule_error(index, message, "a sharding over a mesh of the policy's `meshes:`")
    found = sharding_problems(code_rules, meshes)
    if found:
        raise PolicyError(
            [Problem("<overrides>", None, field_path(loc), message) for loc, message in found]
        )


def _runtime(document: Document | None) -> dict[str, Setting]:
    if document is None:
        return {}
    spec = document.spec.runtime
    out = {
        name: Setting(_get(spec, (name,)), "policy", document.origin("runtime", name))
        for name in type(spec).model_fields
        if name != "env" and name in spec.model_fields_set and getattr(spec, name) is not None
    }
    for name, value in spec.env.items():
        out[f"env.{name}"] = Setting(value, "policy", document.origin("runtime", "env", name))
    return out


_DEFAULT_VALUES: dict[str, Any] = {
    "default": _DEFAULTS.default,
    "fallback": tuple(_DEFAULTS.fallback),
    "strict": _DEFAULTS.strict,
    "headroom": _DEFAULTS.headroom,
    "disable": False,
    "log_level": _DEFAULTS.logging.level,
    "log_format": _DEFAULTS.logging.format,
}


def _default_of(field: str) -> Any:
    return _DEFAULT_VALUES[field]


def _is_set(spec: PolicySpec, loc: tuple[str, ...]) -> bool:
    if not loc:
        return False
    model: Any = spec
    for part in loc[:-1]:
        if part not in model.model_fields_set:
            return False
        model = getattr(model, part)
    return loc[-1] in model.model_fields_set


def _get(spec: Any, loc: tuple[str, ...]) -> Any:
    value: Any = spec
    for part in loc:
        value = getattr(value, part)
    return tuple(value) if isinstance(value, list) else value
