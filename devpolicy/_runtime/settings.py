"""A policy's runtime knobs planned against the environment, and put into effect.

Most knobs are read once, when JAX starts a backend (some already at `import jax`), so
they must be in place before the first JAX computation. This module never imports JAX at
module level: it also runs in `devpolicy run`, which only prepares a child's environment.
JAX is consulted (lazily) only to read or set a backend that is already running.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .._base.errors import PolicyError, RuntimeTooLateError
from .knobs import (
    CPU_DEVICES_VAR,
    FIX,
    GIB,
    HIP_VISIBLE_VAR,
    HOST_DEVICE_COUNT_FLAG,
    JAX_SETS_AT_IMPORT,
    KNOB_BY_NAME,
    KNOBS,
    MEM_FRACTION_VAR,
    OLD_MEM_FRACTION_VAR,
    PLATFORMS_VAR,
    RUNTIME_SET_VAR,
    XLA_FLAGS_VAR,
    Knob,
    bool_text,
    env_needs_allow,
    holdable_problem,
)
from .platforms import Startable, hidden_by, jax_platform, startable, translate_platforms


class Wanted(Protocol):
    """A value from the policy and where it was written (a `_layers.Setting` fits)."""

    @property
    def value(self) -> Any: ...

    @property
    def origin(self) -> str: ...


@dataclass(frozen=True, slots=True)
class RuntimeKnob:
    """One runtime knob's effective value, and where it came from.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "runtime": {"platforms": ["cpu"]}})
        >>> knob = devpolicy.runtime_settings(p, environ={"JAX_PLATFORMS": "tpu"}).knobs[0]
        >>> knob.text, knob.source, knob.origin
        ('tpu', 'env', 'env:JAX_PLATFORMS')

    Attributes:
        knob: The `runtime:` field (`preallocate`), or `env.NAME` for an `env:` entry.
        value: The effective value (the policy's, typed; or the environment's text).
        text: The value as its variable spells it (`false`, `cuda,cpu`).
        source: `policy`, or `env` when a variable the user set wins.
        origin: `file:line` of the policy field, or `env:VARIABLE`.
        variable: The environment variable that carries it.
        config: The `jax.config` option that carries it, if any.
        note: How the policy's value was translated, or what the environment overrode.
        state: Against the running process: `pending` (no backend yet), `in effect`,
            `inert (...)` (no backend reads it), or `differs (running ...)`.
    """

    knob: str
    value: Any
    text: str
    source: str
    origin: str
    variable: str
    config: str | None = None
    note: str = ""
    state: str = "pending"


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """A policy's runtime knobs as they take effect, and conflicts in the environment.

    Attributes:
        knobs: Each knob the policy sets (or the environment overrides), in table order.
        conflicts: Settings in the environment that contradict each other.
        hidden: Accelerators installed here that the policy's `platforms` leaves out.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "runtime": {"allocator": "platform"}})
        >>> devpolicy.runtime_settings(p, environ={}).assignments()
        {'XLA_PYTHON_CLIENT_ALLOCATOR': 'platform'}
    """

    knobs: tuple[RuntimeKnob, ...]
    conflicts: tuple[str, ...]
    #: Accelerators installed here that the policy's `platforms` leaves out, each said
    #: with the policy's `file:line` (a warning: JAX will not use the machine's chip).
    hidden: tuple[str, ...] = ()

    def assignments(self) -> dict[str, str]:
        """The variables devpolicy sets (the policy's knobs the user has not set)."""
        return {k.variable: k.text for k in self.knobs if k.source == "policy"}

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment for a child process: `environ` plus the policy's variables.

        Records which variables came from the policy (`DEVPOLICY_RUNTIME_SET`), so the
        child's own `bootstrap()` reports them as the policy's, not the user's.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "runtime": {"x64": True}})
            >>> devpolicy.runtime_settings(p, environ={}).environment({"HOME": "/h"})
            {'HOME': '/h', 'JAX_ENABLE_X64': 'true', 'DEVPOLICY_RUNTIME_SET': 'JAX_ENABLE_X64'}
        """
        child = dict(environ)
        assignments = self.assignments()
        child.update(assignments)
        previous = set(filter(None, environ.get(RUNTIME_SET_VAR, "").split(",")))
        marked = sorted(previous | set(assignments))
        if marked:
            child[RUNTIME_SET_VAR] = ",".join(marked)
        return child

    def event_fields(self) -> dict[str, Any]:
        """Flat fields of the `runtime` event: each knob's value and source."""
        fields: dict[str, Any] = {}
        for k in self.knobs:
            key = k.knob.removeprefix("env.")
            fields[key] = k.text if isinstance(k.value, tuple | list) else k.value
            fields[f"{key}_source"] = k.source
            if k.note:
                fields[f"{key}_note"] = k.note
            if k.state != "pending":
                fields[f"{key}_state"] = k.state
        if self.conflicts:
            fields["conflicts"] = list(self.conflicts)
        if self.hidden:
            fields["hidden"] = list(self.hidden)
        return fields

    def applied_fields(self, file: str | None, found: str) -> dict[str, Any]:
        """Fields of the `runtime` event of `bootstrap()` and `devpolicy run`: the policy
        file applied, how it was found, every variable set (`NAME=value`), what of it
        needed `runtime.allow`, and each knob's fields (`event_fields`)."""
        opted = [
            item
            for k in self.knobs
            if k.source == "policy" and k.knob.startswith("env.")
            for item, _ in env_needs_allow(k.variable, k.text)
        ]
        fields: dict[str, Any] = {
            "policy": file,
            "found": found,
            "set": [f"{name}={text}" for name, text in self.assignments().items()],
        }
        if opted:
            fields["opted_in"] = opted
        return fields | self.event_fields()


# Reading the installed jax and its plugins, without starting (or importing) JAX ----------


@functools.cache
def memory_fraction_variable() -> str:
    """The memory-fraction spelling the installed jaxlib reads (the new one if it knows it)."""
    try:
        path = importlib.metadata.distribution("jaxlib").locate_file("jaxlib/xla_client.py")
        with open(str(path), encoding="utf-8") as f:
            source = f.read()
    except (importlib.metadata.PackageNotFoundError, OSError, TypeError, UnicodeDecodeError):
        return MEM_FRACTION_VAR  # jaxlib 0.10 reads it; no source to say otherwise
    return MEM_FRACTION_VAR if MEM_FRACTION_VAR in source else OLD_MEM_FRACTION_VAR


# The plan: policy values, the environment, and what wins --------------------------------


def _not_applying(knob: Knob, platform: str) -> str:
    """The note of a GPU-only knob where JAX will not start a GPU."""
    return (
        f"does not apply: only a GPU backend reads {knob.variables[0]}, and JAX will use "
        f"{platform} here"
    )


def _host_device_count(xla_flags: str) -> str | None:
    m = re.search(re.escape(HOST_DEVICE_COUNT_FLAG) + r"=(\S+)", xla_flags)
    return m.group(1) if m else None


def _policy_text(name: str, value: Any, origin: str, machine: Startable) -> tuple[str, str]:
    """The variable text for a policy value, and a note on any translation."""
    if name == "platforms":
        platforms, note = translate_platforms(tuple(value), origin, machine)
        return ",".join(platforms), note
    if isinstance(value, bool):
        return bool_text(value), ""
    if name == "visible_devices":
        return ",".join(str(i) for i in value), ""
    if name == "host_memory_limit":
        return str(value // GIB), ""
    if name == "memory_fraction":
        return repr(float(value)), ""
    return str(value), ""


def plan_runtime(
    wanted: Mapping[str, Wanted],
    environ: Mapping[str, str],
    *,
    gpu_platforms: tuple[str, ...] | None = None,
    tpu: bool | None = None,
    machine: Startable | None = None,
) -> RuntimeSettings:
    """Decide each knob: the policy's value, unless the user set one of its variables.

    `platforms` never leaves JAX without a backend: a platform JAX would not start here
    (`platforms.startable`, the one answer) is dropped with a note saying why; one JAX
    would start that the policy leaves out is in `hidden`. A GPU-only knob is noted as
    not applying where JAX will not start a GPU.

    Args:
        wanted: The policy's `runtime:` fields by knob name (`env.NAME` for `env:` entries).
        environ: The environment as it is now.
        gpu_platforms: The GPU platforms JAX would start (default: `machine`'s).
        tpu: Whether JAX would start a TPU (default: `machine`'s).
        machine: What JAX would start here (default: `startable(environ)`).

    Raises:
        PolicyError: a value the installed JAX cannot take (`platforms: [gpu]` with no
            GPU plugin installed), with file:line.
    """
    machine = startable(environ) if machine is None else machine
    if gpu_platforms is not None or tpu is not None:
        machine = replace(
            machine,
            gpus=machine.gpus if gpu_platforms is None else gpu_platforms,
            tpu=machine.tpu if tpu is None else tpu,
        )
    gpus = machine.gpus
    installed = machine.accelerators

    ours = set(filter(None, environ.get(RUNTIME_SET_VAR, "").split(",")))

    def given(variable: str) -> str | None:
        text = environ.get(variable, "")
        if text == "" or JAX_SETS_AT_IMPORT.get(variable) == text:
            return None
        return text

    knobs: list[RuntimeKnob] = []
    conflicts: list[str] = []
    if given(MEM_FRACTION_VAR) and given(OLD_MEM_FRACTION_VAR):
        conflicts.append(
            f"both {MEM_FRACTION_VAR} and the deprecated {OLD_MEM_FRACTION_VAR} are set; "
            f"jaxlib refuses to start a GPU backend: unset {OLD_MEM_FRACTION_VAR}"
        )
    flags_count = _host_device_count(environ.get(XLA_FLAGS_VAR, ""))
    if given(CPU_DEVICES_VAR) and flags_count is not None:
        conflicts.append(
            f"both {CPU_DEVICES_VAR} and {XLA_FLAGS_VAR} {HOST_DEVICE_COUNT_FLAG} are set; "
            f"{CPU_DEVICES_VAR} wins: drop one"
        )
    using: str | None = None  # the platform JAX will use, once `platforms` is planned
    for knob in KNOBS:
        if knob.name not in wanted:
            continue
        setting = wanted[knob.name]
        text, note = _policy_text(knob.name, setting.value, setting.origin, machine)
        if knob.gpu:
            if using is None:
                platforms = next((k.text for k in knobs if k.knob == "platforms"), None)
                using = jax_platform(platforms or environ.get(PLATFORMS_VAR), installed)
            if using != "gpu":
                note = _not_applying(knob, using)
        variable = knob.variables[0]
        if knob.name == "memory_fraction":
            variable = memory_fraction_variable()
        elif knob.name == "visible_devices" and gpus == ("rocm",):
            variable = HIP_VISIBLE_VAR
        user = _user_value(knob, environ, ours, given, flags_count)
        if user is not None and not (user[0] in ours and user[1] == text):
            var, value = user
            knobs.append(
                RuntimeKnob(
                    knob.name,
                    value,
                    value,
                    "env",
                    f"env:{var}",
                    var,
                    knob.config if var == variable else None,
                    f"the policy's {text} ({setting.origin}) is overridden by {var}",
                )
            )
            continue
        knobs.append(
            RuntimeKnob(
                knob.name,
                setting.value,
                text,
                "policy",
                setting.origin,
                variable,
                knob.config,
                note,
            )
        )
    for key in sorted(k for k in wanted if k.startswith("env.")):
        setting = wanted[key]
        name = key.removeprefix("env.")
        text = bool_text(setting.value) if isinstance(setting.value, bool) else str(setting.value)
        config = name.lower() if name.startswith("JAX_") else None
        current = given(name)
        if current is not None and not (name in ours and current == text):
            note = f"the policy's {text} ({setting.origin}) is overridden by {name}"
            knobs.append(
                RuntimeKnob(key, current, current, "env", f"env:{name}", name, config, note)
            )
        else:
            knobs.append(RuntimeKnob(key, text, text, "policy", setting.origin, name, config))
    hidden: tuple[str, ...] = ()
    chosen = next((k for k in knobs if k.knob == "platforms" and k.source == "policy"), None)
    listed: tuple[str, ...] = tuple(wanted["platforms"].value) if chosen is not None else ()
    # `accelerator` took the one JAX prefers: nothing is hidden that the policy asked for.
    if chosen is not None and "accelerator" not in listed:
        hidden = hidden_by(listed, chosen.text.split(","), chosen.origin, installed)
    return RuntimeSettings(tuple(knobs), tuple(conflicts), hidden)


def _user_value(
    knob: Knob,
    environ: Mapping[str, str],
    ours: set[str],
    given: Any,
    flags_count: str | None,
) -> tuple[str, str] | None:
    for variable in knob.variables:
        if variable == XLA_FLAGS_VAR:
            if flags_count is not None and XLA_FLAGS_VAR not in ours:
                return XLA_FLAGS_VAR, flags_count
            continue
        text = given(variable)
        if text is not None:
            return variable, text
    return None


# The running process ---------------------------------------------------------------------


def _jax_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def _config_value(option: str, text: str) -> Any:
    import jax

    current = getattr(jax.config, option)
    if isinstance(current, bool):
        return text.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    return text


def _set_options(knobs: list[RuntimeKnob]) -> list[tuple[str, Any]]:
    """Set each knob's `jax.config` option, all or none; return what to put back to undo.

    Raises:
        PolicyError: at the line of the first value JAX refuses; the options set before
            it are put back.
    """
    if not knobs:
        return []
    import jax

    applied: list[tuple[str, Any]] = []
    try:
        for k in knobs:
            option = str(k.config)
            before = getattr(jax.config, option)
            try:
                value = _config_value(option, k.text)
                if before != value:
                    _update(option, value)
                    applied.append((option, before))
            except Exception as e:  # a value JAX refuses (not a knob set too late)
                raise _refused(k, e) from None
    except PolicyError:
        _restore_options(applied)
        raise
    return applied


def _restore_options(applied: list[tuple[str, Any]]) -> None:
    for option, before in reversed(applied):
        _update(option, before)


def _check_holdable(plan: RuntimeSettings) -> None:
    """Every value the plan would set can be held by the environment (no NUL...).

    Validation refuses such values when a policy is loaded; this keeps a plan made some
    other way from stopping half-way through setting variables.

    Raises:
        PolicyError: at the knob's line.
    """
    for k in plan.knobs:
        problem = holdable_problem(k.text) if k.source == "policy" else None
        if problem is not None:
            raise _refused(k, ValueError(problem), "cannot be set")


def _set_environ(
    environ: MutableMapping[str, str], new: Mapping[str, str], undo: list[tuple[str, Any]]
) -> None:
    """Set the variables of `new` that differ, all or none (and undo `jax.config` options
    set before them if one fails)."""
    before = {name: environ.get(name) for name in new if environ.get(name) != new[name]}
    try:
        for name in before:
            environ[name] = new[name]
    except BaseException:
        for name, value in before.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        _restore_options(undo)
        raise


def _refused(knob: RuntimeKnob, error: Exception, what: str = "JAX refuses") -> PolicyError:
    """A value jax.config refuses, as a PolicyError at the line that gave it."""
    file, _, line = knob.origin.rpartition(":")
    # `file:line`, or `<mapping>:runtime.x` for a policy given as a mapping.
    where = (file, int(line)) if line.isdigit() else (knob.origin.split(":", 1)[0], None)
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return PolicyError.single(
        where[0], where[1], f"runtime.{knob.knob}", f"{what} {knob.text!r}: {reason}"
    )


def _update(option: str, value: Any) -> None:
    import jax

    jax.config.update(option, value)  # type: ignore[no-untyped-call]


def _is_config_option(option: str | None) -> bool:
    if option is None or "jax" not in sys.modules:
        return False
    import jax

    return option in jax.config._value_holders


def _running_state(knob: RuntimeKnob, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """Compare a knob with the running backends: (state, actual value when it differs)."""
    import jax
    import jax.extend

    backends = list(jax.extend.backend.backends())
    name = knob.knob
    if name == "platforms":
        wanted = knob.text.split(",")
        default = jax.default_backend()
        configured = jax.config.jax_platforms  # type: ignore[attr-defined]
        allowed = None if not configured else set(configured.split(","))
        ok = (
            set(backends) <= set(wanted)
            and default == next((p for p in wanted if p in backends), None)
            and (allowed is None or all(p in allowed or p in backends for p in wanted))
        )
        actual = f"{','.join(backends)} (default {default})"
        return ("in effect", None) if ok else (f"differs (running {actual})", actual)
    if name == "cpu_devices":
        if "cpu" not in backends:
            return "inert (no CPU backend running)", None
        count = str(len(jax.local_devices(backend="cpu")))
        return ("in effect", None) if count == knob.text else (f"differs (running {count})", count)
    if name == "x64":
        now = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
        return ("in effect", None) if bool_text(now) == knob.text else ("applied live", None)
    spec = KNOB_BY_NAME.get(name)
    if spec is not None and spec.gpu and not set(backends) & {"cuda", "rocm", "gpu"}:
        return "inert (no GPU backend running)", None
    if _is_config_option(knob.config):
        now = getattr(jax.config, str(knob.config))
        same = now == _config_value(str(knob.config), knob.text)
        return ("in effect", None) if same else ("applied live", None)
    actual = environ.get(knob.variable, "")
    if actual == knob.text:
        return "in effect", None
    return f"differs (the backend started with {actual or 'it unset'})", actual or "unset"


def with_state(plan: RuntimeSettings, environ: Mapping[str, str]) -> RuntimeSettings:
    """The plan with each knob's state against this process (`pending` before JAX starts)."""
    if not _jax_started():
        return plan
    knobs = tuple(replace(k, state=_running_state(k, environ)[0]) for k in plan.knobs)
    return replace(plan, knobs=knobs)


def apply_runtime(plan: RuntimeSettings, environ: MutableMapping[str, str]) -> RuntimeSettings:
    """Put the plan into effect in this process; return it with each knob's state.

    Before any backend starts: the policy's variables are set in `environ` and, where JAX
    is already imported, the matching `jax.config` options are updated (JAX reads its
    `JAX_*` variables at import). After a backend has started: knobs that can still
    change (`x64`, live `jax.config` options) are applied; any other policy knob that
    differs from the running backend raises, and nothing is changed.

    Raises:
        RuntimeTooLateError: naming each knob, its wanted and its running value.
    """
    _check_holdable(plan)
    if not _jax_started():
        undo: list[tuple[str, Any]] = []
        if "jax" in sys.modules:
            # jax.config first: a value it refuses must leave the environment untouched.
            undo = _set_options(
                [
                    k
                    for k in plan.knobs
                    if _is_config_option(k.config) and k.variable.startswith("JAX_")
                ]
            )
        _set_environ(environ, plan.environment(environ), undo)
        return plan
    late: list[tuple[str, str, str, str]] = []
    live: list[RuntimeKnob] = []
    for k in plan.knobs:
        if k.source != "policy":
            continue
        state, actual = _running_state(k, environ)
        if state == "applied live":
            live.append(k)
        elif actual is not None:
            late.append((k.knob, k.text, actual, k.origin))
    if late:
        raise RuntimeTooLateError(late, FIX)
    undo = _set_options(live)
    if live:
        _set_environ(environ, RuntimeSettings(tuple(live), ()).environment(environ), undo)
    return with_state(plan, environ)
