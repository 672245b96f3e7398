"""JAX's process knobs (`runtime:`): which variable or config option carries each one, and
how a value is checked. Pure data and text checks, no JAX: the policy document validates
`runtime:` with them, and `devpolicy run` prepares a child's environment from them.

Variable names are those of the installed jax/jaxlib (0.10.2: `jax/_src/config.py`,
`jax/_src/xla_bridge.py`, `jaxlib/xla_client.py`; the pinned-host pool limit is read by
XLA's GPU client).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._base.compat import allocators, release

#: `accelerator`: the TPU if libtpu is installed, else the GPU plugins installed.
PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu", "accelerator")
#: What the installed jaxlib's `generate_pjrt_gpu_plugin_options` accepts for
#: XLA_PYTHON_CLIENT_ALLOCATOR (`vmm` from jaxlib 0.10, `address` from 0.11).
ALLOCATORS = allocators(release("jaxlib"))
#: Those of the newest jaxlib: what the published JSON Schema lists, the same on every install.
ALLOCATORS_OF_ANY_JAXLIB = allocators(None)
#: Names the `env:` mapping can ever accept (other knobs of JAX, XLA and TensorFlow's C++
#: runtime); only those in ENV_VARIABLES without `runtime.allow` (see env_problem).
ENV_NAME_PATTERN = r"^(XLA|JAX|TF)_[A-Z0-9_]+$"

PLATFORMS_VAR = "JAX_PLATFORMS"
CPU_DEVICES_VAR = "JAX_NUM_CPU_DEVICES"
X64_VAR = "JAX_ENABLE_X64"
PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEM_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"
OLD_MEM_FRACTION_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # deprecated; jaxlib refuses both
ALLOCATOR_VAR = "XLA_PYTHON_CLIENT_ALLOCATOR"
CUDA_VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"
HIP_VISIBLE_VAR = "HIP_VISIBLE_DEVICES"
HOST_LIMIT_VAR = "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"
XLA_FLAGS_VAR = "XLA_FLAGS"
HOST_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
#: Set by `devpolicy run` in the child: the variables it set from the policy (not the user).
RUNTIME_SET_VAR = "DEVPOLICY_RUNTIME_SET"
GIB = 2**30
# `import jax` itself sets these when unset (jax/__init__.py: os.environ.setdefault), so such
# a value is JAX's default, not a user's choice; a policy may still set it.
JAX_SETS_AT_IMPORT = {"TF_CPP_MIN_LOG_LEVEL": "1"}
FIX = "call devpolicy.bootstrap() before the first JAX computation, or use `devpolicy run`"


@dataclass(frozen=True, slots=True)
class Knob:
    """One `runtime:` field and what carries it to JAX.

    Attributes:
        name: The field in `runtime:`.
        variables: Environment variables that carry it (the first is the one devpolicy
            sets; the others are other spellings a user may have set).
        config: The `jax.config` option, for knobs JAX reads at `import jax`.
        gpu: Whether only a GPU backend reads it.
        live: Whether it can still change after a backend has started.
        doc: What it does.
    """

    name: str
    variables: tuple[str, ...]
    config: str | None
    gpu: bool
    live: bool
    doc: str


KNOBS: tuple[Knob, ...] = (
    Knob(
        "platforms",
        (PLATFORMS_VAR,),
        "jax_platforms",
        False,
        False,
        "backends to start, in order; the first present is the default. `gpu` becomes the "
        "GPU plugins installed (`cuda`, `rocm`), `accelerator` the TPU if libtpu is "
        "installed, else those plugins; a platform not installed is dropped",
    ),
    Knob(
        "cpu_devices",
        (CPU_DEVICES_VAR, XLA_FLAGS_VAR),
        "jax_num_cpu_devices",
        False,
        False,
        f"number of CPU devices (a user's `XLA_FLAGS={HOST_DEVICE_COUNT_FLAG}=N` counts too)",
    ),
    Knob("x64", (X64_VAR,), "jax_enable_x64", False, True, "64-bit types"),
    Knob(
        "preallocate",
        (PREALLOCATE_VAR,),
        None,
        True,
        False,
        "false: take GPU memory as needed instead of a large share at start",
    ),
    Knob(
        "memory_fraction",
        (MEM_FRACTION_VAR, OLD_MEM_FRACTION_VAR),
        None,
        True,
        False,
        "share of GPU memory JAX's pool may use (0 < f <= 1); the spelling the installed "
        "jaxlib reads is set, never both",
    ),
    Knob(
        "allocator", (ALLOCATOR_VAR,), None, True, False, "GPU allocator: " + ", ".join(ALLOCATORS)
    ),
    Knob(
        "visible_devices",
        (CUDA_VISIBLE_VAR, HIP_VISIBLE_VAR),
        None,
        True,
        False,
        "GPU indices the process may use (HIP_VISIBLE_DEVICES when only ROCm is installed)",
    ),
    Knob(
        "host_memory_limit",
        (HOST_LIMIT_VAR,),
        None,
        True,
        False,
        "cap of XLA's pinned-host staging pool, in whole GiB",
    ),
)
KNOB_NAMES = tuple(k.name for k in KNOBS)
KNOB_BY_NAME = {k.name: k for k in KNOBS}
#: Variables a typed knob owns: `env:` may not set them (one knob, one spelling). Besides
#: the knobs' own variables: JAX's other spellings of the same settings.
OWNED_VARIABLES: dict[str, str] = {
    **{v: k.name for k in KNOBS for v in k.variables if v != XLA_FLAGS_VAR},
    "JAX_PLATFORM_NAME": "platforms",  # jax_platform_name, deprecated for jax_platforms
    "JAX_CUDA_VISIBLE_DEVICES": "visible_devices",  # jax_cuda_visible_devices
    "JAX_ROCM_VISIBLE_DEVICES": "visible_devices",  # jax_rocm_visible_devices
}
#: XLA flags a typed knob owns (in `env: {XLA_FLAGS: ...}`).
OWNED_FLAGS: dict[str, str] = {HOST_DEVICE_COUNT_FLAG: "cpu_devices"}


# `runtime.env`: the variables devpolicy knows, each validated --------------------------

#: Why a variable or flag needs `runtime.allow`: it names a path (whoever can write
#: there changes what runs: a compilation cache holds compiled code) or changes results.
NAMES_A_PATH = "names a path: whoever can write there can change what runs, or read what it writes"
CHANGES_RESULTS = "changes what programs compute"
NOT_KNOWN = "is not one devpolicy knows, so it cannot say what it does"
ALLOW_FORMS = (
    "a variable name of runtime.env (JAX_COMPILATION_CACHE_DIR) or an XLA flag (--xla_dump_to)"
)
ALLOW_PATTERN = r"^((XLA|JAX|TF)_[A-Z0-9_]+|--xla_[a-z0-9_]+)$"
# Control characters: C0 (newline, tab, escape...), DEL and C1 (NEL, CSI...), Unicode's
# category Cc. No variable devpolicy knows takes one, and `run --dry-run` would have to
# print them as `$'...'` escapes.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


Check = Callable[[str], str | None]


def _one_of(*choices: str, fold: bool = False) -> Check:
    def check(text: str) -> str | None:
        if (text.upper() if fold else text) in choices:
            return None
        return f"expected one of {', '.join(choices)}"

    return check


def _whole(low: int, high: int | None = None) -> Check:
    def check(text: str) -> str | None:
        digits = text.isascii() and text.isdigit() and len(text) <= 18
        if digits and low <= int(text) <= (high if high is not None else int(text)):
            return None
        upper = f"..{high}" if high is not None else " or more"
        return f"expected a whole number {low}{upper}"

    return check


def _boolean(text: str) -> str | None:
    if text.lower() in ("true", "false", "1", "0"):
        return None
    return "expected true or false"


def _modules(text: str) -> str | None:
    if re.fullmatch(r"[A-Za-z_][\w.]*(,[A-Za-z_][\w.]*)*", text):
        return None
    return "expected module names separated by commas (jax._src.dispatch,jax._src.xla_bridge)"


def _any_text(text: str) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class EnvVariable:
    """A variable `runtime.env` may set.

    Attributes:
        name: The variable.
        check: The problem with a value's text, or None when it is accepted.
        needs_allow: Why it must be named in `runtime.allow` (`NAMES_A_PATH`,
            `CHANGES_RESULTS`), or None.
        doc: What it does.
    """

    name: str
    check: Check
    needs_allow: str | None
    doc: str


_TRANSFER_GUARDS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")
_LOG_LEVELS = ("NOTSET", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ENV_VARIABLES: dict[str, EnvVariable] = {
    v.name: v
    for v in (
        EnvVariable("XLA_FLAGS", _any_text, None, "XLA's flags (each flag is checked)"),
        EnvVariable("TF_CPP_MIN_LOG_LEVEL", _whole(0, 3), None, "C++ log threshold, 0 (all)..3"),
        EnvVariable("TF_CPP_MAX_VLOG_LEVEL", _whole(0, 10), None, "C++ verbose logging level"),
        EnvVariable(
            "JAX_LOGGING_LEVEL", _one_of(*_LOG_LEVELS, fold=True), None, "level of JAX's loggers"
        ),
        EnvVariable("JAX_DEBUG_LOG_MODULES", _modules, None, "modules JAX logs at debug"),
        EnvVariable("JAX_LOG_COMPILES", _boolean, None, "log each compilation"),
        EnvVariable(
            "JAX_TRANSFER_GUARD",
            _one_of(*_TRANSFER_GUARDS),
            None,
            "implicit transfers: log, refuse",
        ),
        EnvVariable(
            "JAX_COMPILATION_CACHE_DIR",
            _any_text,
            NAMES_A_PATH,
            "persistent cache of compiled code",
        ),
        EnvVariable("JAX_DUMP_IR_TO", _any_text, NAMES_A_PATH, "directory JAX writes its IR to"),
        EnvVariable("JAX_DISABLE_JIT", _boolean, CHANGES_RESULTS, "run everything op by op"),
        EnvVariable(
            "JAX_DEFAULT_PRNG_IMPL",
            _one_of(
                "threefry2x32", "threefry4x32", "rbg", "unsafe_rbg", "philox2x32", "philox4x32"
            ),
            CHANGES_RESULTS,
            "random number generator (changes every random stream)",
        ),
        EnvVariable("JAX_THREEFRY_PARTITIONABLE", _boolean, CHANGES_RESULTS, "random streams"),
        EnvVariable("JAX_RANDOM_SEED_OFFSET", _whole(0), CHANGES_RESULTS, "offset of every seed"),
        EnvVariable("JAX_ENABLE_CHECKS", _boolean, CHANGES_RESULTS, "JAX's internal checks"),
        EnvVariable("JAX_DEBUG_NANS", _boolean, CHANGES_RESULTS, "raise at the first NaN"),
        EnvVariable("JAX_DEBUG_INFS", _boolean, CHANGES_RESULTS, "raise at the first inf"),
        EnvVariable("JAX_DEFAULT_MATMUL_PRECISION", _any_text, CHANGES_RESULTS, "matmul precision"),
        EnvVariable(
            "JAX_NUMPY_RANK_PROMOTION",
            _one_of("allow", "warn", "raise"),
            CHANGES_RESULTS,
            "broadcasting",
        ),
        EnvVariable(
            "JAX_NUMPY_DTYPE_PROMOTION",
            _one_of("standard", "strict"),
            CHANGES_RESULTS,
            "type promotion",
        ),
    )
}

ENV_NAME_FORMS = (
    ", ".join(ENV_VARIABLES)
    + "; or another upper-case XLA_*, JAX_* or TF_* variable listed in `runtime.allow`"
)

#: XLA flags devpolicy knows, with the check of their value (the empty text for `--flag`).
XLA_FLAG_CHECKS: dict[str, Check] = {
    "--xla_cpu_multi_thread_eigen": _boolean,
    "--xla_gpu_enable_latency_hiding_scheduler": _boolean,
    "--xla_gpu_memory_limit_slop_factor": _whole(1, 1000),
}
_PATH_FLAG = re.compile(r"dump|_dir$|_to$|_file$|_path$|cache")


def flag_needs_allow(flag: str) -> str | None:
    """Why an XLA flag must be named in `runtime.allow`, or None."""
    if flag in XLA_FLAG_CHECKS:
        return None
    return NAMES_A_PATH if _PATH_FLAG.search(flag) else NOT_KNOWN


def env_needs_allow(name: str, text: str) -> list[tuple[str, str]]:
    """What in `name=text` must be named in `runtime.allow`: (variable or flag, why).

    `text` is assumed valid (`env_problem` says nothing about it).
    """
    known = ENV_VARIABLES.get(name)
    if known is None:
        return [(name, NOT_KNOWN)]
    if name == XLA_FLAGS_VAR:
        out = []
        for flag, _ in _flags(text):
            why = flag_needs_allow(flag)
            if why is not None:
                out.append((flag, why))
        return out
    return [(name, known.needs_allow)] if known.needs_allow else []


def _flags(text: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for token in text.split():
        flag, eq, value = token.partition("=")
        out.append((flag, value if eq else None))
    return out


def env_problem(name: str, value: Any, allowed: set[str] | frozenset[str]) -> str | None:
    """What is wrong with `runtime.env` setting `name` to `value`, or None.

    The value must be one the OS can hold (no NUL, encodable) with no control characters
    (no variable devpolicy knows takes them, and they would forge lines in `run --dry-run`),
    and what that variable accepts; a variable or XLA flag that names a path or changes
    results, or that devpolicy does not know, must be named in `allowed`.
    """
    if isinstance(value, bool):
        text = bool_text(value)
    elif isinstance(value, str | int | float):
        text = str(value)
    else:
        names = {dict: "mapping", list: "list", type(None): "null"}
        kind = names.get(type(value), type(value).__name__)
        return f"expected a string, number or boolean, got a {kind} {value!r}"
    problem = holdable_problem(text)
    if problem is not None:
        return problem
    known = ENV_VARIABLES.get(name)
    if known is not None:
        problem = known.check(text)
        if problem is not None:
            return f"{problem}, got {value!r}"
    if name == XLA_FLAGS_VAR:
        problem = _flags_problem(text)
        if problem is not None:
            return problem
    missing = [(item, why) for item, why in env_needs_allow(name, text) if item not in allowed]
    if missing:
        item, why = missing[0]
        return (
            f"{item} {why}; a policy may set it only when it also says so: add "
            f"`allow: [{item}]` under `runtime:` (devpolicy check then warns about it)"
        )
    return None


def _flags_problem(text: str) -> str | None:
    for flag, value in _flags(text):
        if re.fullmatch(r"--xla_[a-z0-9_]+", flag) is None:
            return f"not an XLA flag: {flag!r}; accepted: --xla_name or --xla_name=value"
        knob = OWNED_FLAGS.get(flag)
        if knob is not None:
            return f"{flag} is what `runtime.{knob}` sets: write `{knob}:` instead"
        check = XLA_FLAG_CHECKS.get(flag)
        if check is not None:
            problem = check(value if value is not None else "")
            if problem is not None:
                return f"{flag}: {problem}, got {value!r}"
    return None


def holdable_problem(text: str) -> str | None:
    """Why an environment value cannot be held by the OS or safely shown, or None.

    Refused: a NUL byte, text the file system encoding cannot encode, and any control
    character (C0, DEL, C1), named by code point and position.

    Example:
        >>> print(holdable_problem("INFO\\x85").split(";")[0])
        contains a control character, U+0085 at position 4 of 'INFO\\x85'
    """
    if "\x00" in text:
        return "contains a NUL byte, which no environment variable can hold"
    try:
        os.fsencode(text)
    except UnicodeError:
        return f"cannot be encoded for the environment: {text!r}"
    control = _CONTROL.search(text)
    if control is not None:
        return (
            f"contains a control character, U+{ord(control.group()):04X} at position "
            f"{control.start()} of {text!r}; control characters (C0 such as newline and tab, "
            "DEL, and C1 such as U+0085) are refused"
        )
    return None


def bool_text(value: bool) -> str:
    return "true" if value else "false"
