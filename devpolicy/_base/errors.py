"""The error hierarchy: every error devpolicy raises derives from DevicePolicyError.

One concept, kept in one file although it is long: the classes are a table read together
(each says when it is raised and carries where and what), so that one error is never
defined twice and `devpolicy.errors` lists them all from one place.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .locations import URLPath


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """Return ` (did you mean 'x'?)` for a close choice, else an empty string."""
    if not isinstance(value, str):
        return ""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    if value.lower() in lowered and value not in choices:
        return f" (did you mean {lowered[value.lower()]!r}?)"
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# Attributes the built-in bases keep outside `__dict__` (C members), set from a message
# only by their own `__init__`; a subclass may set them itself (`strerror`).
_BUILTIN_FIELDS = {
    OSError: ("errno", "strerror", "filename", "filename2"),
    ImportError: ("msg", "name", "path"),
}


def _rebuilt(
    cls: type[DevicePolicyError], args: tuple[object, ...], held: dict[str, object]
) -> DevicePolicyError:
    """An error unpickled: made from its message by the built-in base's `__init__` (the
    class's own takes its fields, not the message), then given back every field."""
    error = cls.__new__(cls, *args)
    super(DevicePolicyError, error).__init__(*args)
    for name, value in held.items():
        setattr(error, name, value)
    return error


class DevicePolicyError(Exception):
    """Base class of every error devpolicy raises.

    Never raised itself: `except DevicePolicyError` catches every error of `devpolicy.errors`.
    Every one survives pickling with its message and fields, so one raised in a worker
    process (`ProcessPoolExecutor`, `multiprocessing`) reaches the parent as itself.

    Example:
        >>> import devpolicy
        >>> try:
        ...     devpolicy.load_policy({"version": 1, "default": "gpuu"})
        ... except devpolicy.DevicePolicyError as e:
        ...     print(type(e).__name__)
        PolicyError
    """

    def __reduce__(self) -> tuple[object, ...]:
        # Pickle's default calls `type(self)(*self.args)`: the message where each class's
        # `__init__` takes its fields, which fails in the parent and breaks the pool.
        held = dict(vars(self))
        for base, names in _BUILTIN_FIELDS.items():
            if isinstance(self, base):
                # Only those set: OSError's message changes once `filename` is set at all.
                held |= {n: getattr(self, n) for n in names if getattr(self, n) is not None}
        return _rebuilt, (type(self), self.args, held)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy: where it is, and what is wrong.

    Attributes:
        file: The policy file, or `<mapping>` for a policy given as a mapping.
        line: 1-based line in `file`, when known.
        field: Field path such as `rules[2].device`; empty for the whole document.
        message: What is wrong and what is accepted.
    """

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class PolicyError(DevicePolicyError, ValueError):
    """A policy document is malformed or invalid.

    Raised by `load_policy`, `bootstrap` and `devpolicy check` when the document (a file, a
    mapping, `overrides=`) is malformed or invalid, and by discovery that finds no policy when
    one is required (`required=True`, `DEVPOLICY_REQUIRE=1`).

    Every problem found is listed (not just the first); `file`, `line` and `field`
    describe the first one.

    Attributes:
        problems: Each problem with its file, line and field path.
    """

    def __init__(self, problems: Sequence[Problem]) -> None:
        if not problems:
            raise ValueError("PolicyError needs at least one problem")
        self.problems = tuple(problems)
        first = self.problems[0]
        self.file = first.file
        self.line = first.line
        self.field = first.field
        if len(self.problems) == 1:
            text = str(first)
        else:
            listed = "\n".join(f"  {p}" for p in self.problems)
            text = f"{len(self.problems)} problems in {first.file}:\n{listed}"
        super().__init__(text)

    @classmethod
    def single(cls, file: str, line: int | None, field: str, message: str) -> PolicyError:
        """Build an error for one problem."""
        return cls([Problem(file, line, field, message)])


class DeviceUnavailableError(DevicePolicyError, RuntimeError):
    """No device could be had for a target or for a whole fallback chain.

    Raised by `get_device` for a target this process lacks, and wherever a name is decided
    (`resolve`, `scope`, `@place`, `put`, `to`, `load_file`) when no target of its rule's
    fallback chain can be had.

    Attributes:
        requested: The target text that was asked for (for example `gpu:1`).
        tried: Each target tried, with why it could not be had.
        available: Target text of every device this process can use.
    """

    def __init__(
        self,
        requested: str,
        tried: Sequence[tuple[str, str]],
        available: Sequence[str],
        missing: dict[str, str] | None = None,
        context: str = "",
    ) -> None:
        self.requested = requested
        self.tried = tuple(tried)
        self.available = tuple(available)
        lines = [f"no device for {requested!r}{context}"]
        lines += [f"  {target}: {why}" for target, why in self.tried]
        lines.append(f"  available: {', '.join(self.available) or 'none'}")
        for platform, why in (missing or {}).items():
            lines.append(f"  {platform}: {why}")
        super().__init__("\n".join(lines))


class AxisNamesError(DevicePolicyError, ValueError):
    """The axis names a model attached to an array (`axes: attached`) name more dimensions
    than the array has: a question of naming in the model, not of devices.

    Raised wherever a leaf is decided under an `axes: attached` rule (`put`, `shardings`,
    `load_file(into=tree)`) with names for more dimensions than it has.

    Fewer names than dimensions are not an error: the rest are unsharded, as
    `PartitionSpec` pads them.

    Attributes:
        name: The array's placement name.
        names: The attached names, one per dimension named (None: not named).
        shape: The array's shape.

    Example:
        >>> e = AxisNamesError("params/w", ("embed", "mlp", "kv"), (16, 32), " (rule p.yaml:4)")
        >>> e.names, e.shape
        (('embed', 'mlp', 'kv'), (16, 32))
        >>> print(str(e).splitlines()[0])
        attached axis names (embed, mlp, kv) of 'params/w' (rule p.yaml:4) name 3 dimensions, ...
    """

    def __init__(
        self,
        name: str,
        names: Sequence[str | tuple[str, ...] | None],
        shape: Sequence[int],
        context: str = "",
    ) -> None:
        self.name = name
        self.names = tuple(names)
        self.shape = tuple(shape)
        shown = ", ".join(
            "-" if n is None else n if isinstance(n, str) else "+".join(n) for n in self.names
        )
        count = len(self.names)
        super().__init__(
            f"attached axis names ({shown}) of {name!r}{context} name {count} "
            f"dimension{'' if count == 1 else 's'}, but the array has {len(self.shape)}: "
            f"{self.shape}\n"
            "  a naming problem in the model, not a missing device: name one axis (or none) "
            "per dimension (flax nnx.with_partitioning / nn.with_logical_partitioning, haliax "
            "axes); names for fewer dimensions leave the rest unsharded, as PartitionSpec "
            "pads them"
        )


class ValueRefusedError(DevicePolicyError, ValueError):
    """One value given by name (an environment variable, an option, a keyword) that cannot
    be used: the shared form of `EnvOverrideError`, `MachineSpecError` and
    `RemoteOptionError`, never raised itself.

    Attributes:
        value: The value as given.
        accepted: The forms that would be accepted.
    """

    def __init__(self, where: str, value: object, problem: str, accepted: str) -> None:
        self.value = value
        self.accepted = accepted
        super().__init__(f"{where}{value!r}: {problem}; accepted: {accepted}")


class EnvOverrideError(ValueRefusedError):
    """A `DEVPOLICY_*` environment variable holds a value devpolicy cannot use.

    Raised by `load_policy`, `bootstrap` and each loading of a policy, and by URL reads
    (`DEVPOLICY_REMOTE_*`), when a variable they read cannot be used.

    Attributes:
        variable: The variable's name.
        value: Its value.
        accepted: The forms that would be accepted.
    """

    value: str

    def __init__(self, variable: str, value: str, problem: str, accepted: str) -> None:
        self.variable = variable
        super().__init__(f"{variable}=", value, problem, accepted)


class MachineSpecError(ValueRefusedError):
    """A description of a machine to plan for (`gpu=8x80GiB`) that cannot be read.

    Raised by `VirtualMachine(...)` and by `devpolicy plan --devices/--processes/--slices`.

    Attributes:
        option: What held it: `--devices`, `--processes`, or a `VirtualMachine` argument.
        value: The text (or value) as given.
        accepted: The forms that would be accepted.
    """

    def __init__(self, option: str, value: object, problem: str, accepted: str) -> None:
        self.option = option
        super().__init__(f"{option} ", value, problem, accepted)


class UnmatchedNameError(DevicePolicyError, LookupError):
    """A name no rule matches, under a policy whose default is `reject`.

    Raised wherever a name is decided (`resolve`, `scope`, `@place`, `put`, `to`, `load_file`)
    and no rule matches it under `default: reject`.

    Attributes:
        name: The name.
        origin: Where `default: reject` was set.
    """

    def __init__(self, name: str, origin: str, patterns: Sequence[str]) -> None:
        self.name = name
        self.origin = origin
        listed = ", ".join(repr(p) for p in patterns) or "none"
        super().__init__(
            f"no rule matches {name!r} and the default is `reject` ({origin}); "
            f"add a rule for it (rules tried: {listed})"
        )


class ScopeInCoroutineError(DevicePolicyError, RuntimeError):
    """`with devpolicy.scope(...)` was written directly in an `async def` body.

    Raised on entering `devpolicy.scope(...)` (or `Policy.scope`) in a coroutine.

    `jax.default_device` is thread-local, not task-local: held across an `await`, other
    tasks on the event loop would see the device, and the thread could be left on it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"devpolicy.scope({name!r}) cannot be held in a coroutine: JAX's default device is "
            "per thread, so across an `await` other tasks would see it. Decorate the async "
            f"function with @devpolicy.place({name!r}) instead (the scope then applies to each "
            "step and is lifted at every await), or call a plain function that uses the scope, "
            f"or place arrays with devpolicy.put({name!r}, x)."
        )


class NarrowingError(DevicePolicyError, ValueError):
    """64-bit data would change if narrowed to 32 bits (JAX with x64 disabled).

    Raised by `put`, `prefetch`, `windows` and `load_file` with `narrow="exact"` (the default)
    while JAX has x64 disabled.

    Every offending tensor is listed, not only the first; nothing has been placed.

    Attributes:
        problems: Each offending tensor (a file's key, or a `put` leaf's name) with which
            of its values do not survive.
        file: The file, or None for arrays given in code (`put`, `prefetch`).
        tensor: The first offending tensor.
        problem: Its problem.

    Example:
        >>> e = NarrowingError([("a", "values 0..2**40 do not fit int32"), ("b", "...")])
        >>> print(str(e).splitlines()[0])
        2 tensors would change in 32 bits:
    """

    def __init__(self, problems: Sequence[tuple[str, str]], file: str | None = None) -> None:
        if not problems:
            raise ValueError("NarrowingError needs at least one problem")
        self.problems = tuple(problems)
        self.file = file
        self.tensor, self.problem = self.problems[0]
        where = f"{file}: " if file is not None else ""
        way_out = (
            "JAX has x64 disabled, so it would hold {it} in 32 bits and change these values. "
            "Enable x64 before {doing} (jax.config.update('jax_enable_x64', True)), or pass "
            "narrow='lossy' to accept the change."
        )
        doing = "loading" if file is not None else "placing"
        if len(self.problems) == 1:
            text = f"{where}tensor {self.tensor!r}: {self.problem}. " + way_out.format(
                it="this tensor", doing=doing
            )
        else:
            listed = "\n".join(f"  {where}tensor {t!r}: {p}" for t, p in self.problems)
            text = (
                f"{len(self.problems)} tensors would change in 32 bits:\n{listed}\n"
                + way_out.format(it="them", doing=doing)
            )
        super().__init__(text)


class RuntimeTooLateError(DevicePolicyError, RuntimeError):
    """`runtime:` settings came after JAX started a backend, and the backend runs otherwise.

    Raised by `bootstrap` when the policy's `runtime:` differs from what JAX's running backend
    was started with.

    Most runtime knobs are read once, when the first backend starts; changing them later
    would be silently ignored, so devpolicy refuses instead. Nothing has been changed.

    Attributes:
        knobs: Each knob that differs, as (knob, wanted, running, origin).
        fix: What to do instead.

    Example:
        >>> e = RuntimeTooLateError([("cpu_devices", "2", "4", "p.yaml:3")], "bootstrap earlier")
        >>> print(e)
        JAX's backend has already started, so these runtime settings can no longer take effect:
          cpu_devices (p.yaml:3): wanted 2, running 4
        fix: bootstrap earlier
    """

    def __init__(self, knobs: Sequence[tuple[str, str, str, str]], fix: str) -> None:
        self.knobs = tuple(knobs)
        self.fix = fix
        lines = [
            "JAX's backend has already started, so these runtime settings can no longer "
            "take effect:"
        ]
        lines += [
            f"  {knob} ({origin}): wanted {wanted}, running {actual}"
            for knob, wanted, actual, origin in self.knobs
        ]
        lines.append(f"fix: {fix}")
        super().__init__("\n".join(lines))


class SafetensorsFileError(DevicePolicyError, ValueError):
    """A safetensors file is missing, truncated or malformed; nothing was loaded.

    Raised by `load_file`, `plan`, `read_metadata` and `align_file` for a file that is missing,
    truncated or malformed, and by `save_file` for one that cannot be written.

    Attributes:
        file: The file.
        tensor: The tensor concerned, if one is.
        problem: What is wrong.
    """

    def __init__(
        self, file: str | os.PathLike[str] | URLPath, problem: str, tensor: str | None = None
    ) -> None:
        self.file = str(file)  # a URL as shown: never its credentials
        self.tensor = tensor
        self.problem = problem
        where = f"{self.file}: tensor {tensor!r}" if tensor is not None else self.file
        super().__init__(f"{where}: {problem}")


class HostViewError(DevicePolicyError, ValueError):
    """An array cannot be seen as a zero-copy numpy view of host memory (`host_view`).

    Raised by `host_view` (and `windows` over such an array).

    Attributes:
        array: What the array is and where it is (`uint16[10248871837] on gpu:0`).
        problem: Why no view can be had without a copy.
        fix: What to do instead.

    Example:
        >>> e = HostViewError("float32[4] on gpu:0", "not on a host device", "load it to cpu")
        >>> print(e)
        float32[4] on gpu:0: not on a host device; load it to cpu
    """

    def __init__(self, array: str, problem: str, fix: str) -> None:
        self.array = array
        self.problem = problem
        self.fix = fix
        super().__init__(f"{array}: {problem}; {fix}")


class UntrustedPolicyError(PolicyError):
    """A policy file that someone other than you (or root) could have written or put in
    place was found by discovery, and is refused.

    Raised by discovery (`load_policy()` with no source, `bootstrap()`, a module-level verb with
    no policy active) for a file it found that it does not trust.

    Discovery reads files nobody named; a file another user could plant (in a
    world-writable directory above your project, say) must not change your program. This
    is the class of git's CVE-2022-24765, answered the same way: check who owns it.
    Naming the file yourself (`DEVPOLICY_FILE`, `--policy`, `load_policy(path)`) uses it,
    with an `untrusted_policy` warning.

    Attributes:
        reason: Why it is not trusted (who owns it, or who else can write it).
        owner: The uid of the owner concerned.
        owner_name: That user's name, when the system knows it.

    Example:
        >>> e = UntrustedPolicyError("/tmp/devpolicy.yaml", "owned by eve (uid 1001)", 1001, "eve")
        >>> print(str(e).splitlines()[0])
        /tmp/devpolicy.yaml: refused: owned by eve (uid 1001)
    """

    def __init__(
        self, file: str, reason: str, owner: int, owner_name: str | None, fix: str = ""
    ) -> None:
        self.reason = reason
        self.owner = owner
        self.owner_name = owner_name
        message = f"refused: {reason}" + (f"\n{fix}" if fix else "")
        super().__init__([Problem(file, None, "", message)])


class CheckpointMismatchError(DevicePolicyError, ValueError):
    """A checkpoint does not fit the tree given to `load_file(path, into=tree)`.

    Raised by `load_file(path, into=tree)` (and `plan(path, into=tree)`) before anything is
    read.

    Every difference is listed at once (the message shows the first 20 of each kind, the
    attributes hold all); nothing has been loaded.

    Attributes:
        file: The file, directory or index loaded.
        missing: Each leaf name (its path in the tree) that no tensor fills.
        unexpected: Each tensor key no leaf takes (an error only with `strict=True`).
        mismatched: (leaf name, what differs) for each leaf whose tensor has another
            shape or dtype, or that shares its name with another leaf or tensor.

    Example:
        >>> e = CheckpointMismatchError("m.safetensors", missing=["w"], unexpected=["v"])
        >>> e.missing, e.unexpected
        (('w',), ('v',))
        >>> print(str(e).splitlines()[1])
          missing: 'w'
    """

    _SHOWN = 20

    def __init__(
        self,
        file: str | os.PathLike[str],
        *,
        missing: Sequence[str] = (),
        unexpected: Sequence[str] = (),
        mismatched: Sequence[tuple[str, str]] = (),
        hint: str | None = None,
    ) -> None:
        self.file = str(file)
        self.missing = tuple(missing)
        self.unexpected = tuple(unexpected)
        self.mismatched = tuple(mismatched)
        counts = []
        if self.missing:
            counts.append(_counted(len(self.missing), "leaf has", "leaves have") + " no tensor")
        if self.unexpected:
            counts.append(_counted(len(self.unexpected), "tensor has", "tensors have") + " no leaf")
        if self.mismatched:
            counts.append(
                _counted(len(self.mismatched), "leaf differs", "leaves differ")
                + " in shape or dtype"
            )
        lines = [f"{self.file} does not fit the tree given as into=: " + ", ".join(counts)]
        lines += self._listed("missing", [repr(name) for name in self.missing])
        lines += self._listed("unexpected", [repr(key) for key in self.unexpected])
        lines += self._listed("mismatched", [f"{name!r}: {what}" for name, what in self.mismatched])
        if self.unexpected:
            lines.append("  (strict=False leaves tensors no leaf takes unread)")
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))

    @classmethod
    def _listed(cls, kind: str, items: list[str]) -> list[str]:
        shown = [f"  {kind}: {item}" for item in items[: cls._SHOWN]]
        if len(items) > cls._SHOWN:
            shown.append(f"  ...and {len(items) - cls._SHOWN} more {kind}")
        return shown


def _counted(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


class TransferRefusedError(DevicePolicyError, RuntimeError):
    """A transfer JAX would have made implicitly was refused by the policy's `transfers:`.

    Raised while a policy whose `transfers:` says `disallow` is active, in the code that would
    make the transfer.

    Raised where the transfer happened (a jit call, an operation mixing numpy and arrays),
    before anything was copied; chained from JAX's own transfer-guard error.

    Attributes:
        site: `path/file.py:LINE` of the user's code that asked for the transfer.
        direction: `host_to_device`, `device_to_device`, `device_to_host` or `host_local`.
        source: `numpy` (host data) or the device text the array was on (`cpu:0`).
        devices: The destination devices' texts.
        nbytes: The bytes it would have moved, over every destination.
        field: The `transfers:` field that refused it (`host_local` for host data into a
            CPU device, else the direction).
        origin: Where that field was written: the policy's `file:line`, or
            `env:DEVPOLICY_TRANSFERS`.
    """

    def __init__(
        self,
        site: str,
        direction: str,
        source: str,
        devices: tuple[str, ...],
        nbytes: int,
        what: str,
        field: str,
        origin: str,
    ) -> None:
        self.site = site
        self.field = field
        self.direction = direction
        self.source = source
        self.devices = devices
        self.nbytes = nbytes
        self.origin = origin
        super().__init__(
            f"{site}: implicit {direction} transfer of {what} ({nbytes} bytes) from {source} "
            f"to {', '.join(devices)} refused by transfers.{field}: disallow ({origin}). "
            "Fix: jax.device_put it explicitly where it is made (or devpolicy.put / "
            "devpolicy.to), or write a rule that places it where it is used; or set "
            f"transfers.{field} to log or allow"
        )


class StreamStateError(DevicePolicyError, ValueError):
    """A `windows` stream cannot resume from the state given: not a saved state, damaged,
    or saved by a stream with other arguments (which would draw other batches).

    Raised by `windows(..., resume=...)`, before anything is read or placed.

    Attributes:
        field: The argument or state field at fault (`length`, `resume['step']`).
        problem: What is wrong, with the saved and the given value.
        fix: What to do instead.

    Example:
        >>> e = StreamStateError("batch", "the saved stream had batch=32, this one 16", "fix")
        >>> print(e)
        windows resume: batch: the saved stream had batch=32, this one 16; fix
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"windows resume: {field}: {problem}; {fix}")


class StreamEndedError(DevicePolicyError, RuntimeError):
    """A `windows` stream can hand out no more batches: it failed earlier (a file
    truncated under it, a batch that could not be narrowed), or it is a forked child's
    copy of a stream opened in its parent.

    Raised by every pull after the one that raised the stream's error (that error is this
    one's `__cause__`), and by a forked child's first pull and every one after.

    Attributes:
        name: The stream's name (the name its batches are placed as).
        problem: What ended it, and at which step.
        fix: What to do instead.

    Example:
        >>> e = StreamEndedError("batch", "failed at step 7: HostViewError: ...", "fix")
        >>> print(e)
        windows stream 'batch': failed at step 7: HostViewError: ...; fix
    """

    def __init__(self, name: str, problem: str, fix: str) -> None:
        self.name = name
        self.problem = problem
        self.fix = fix
        super().__init__(f"windows stream {name!r}: {problem}; {fix}")


class TransferPlanError(DevicePolicyError, ValueError):
    """A call `plan_transfers` was given cannot be planned, or would itself fail.

    Raised by `plan_transfers` for what is not a jitted call (a function that is not jitted,
    a `policy=` that is not a `Policy`, `args` that is not a tuple, `kwargs` that is not a
    mapping), and where the call it plans would fail: an argument deleted (donated to an
    earlier call), arguments committed to devices one computation cannot span. The call's
    own error, where there is one, is chained.

    Attributes:
        function: The function planned (its name, or the repr of what was given).
        argument: The argument concerned (`args[0]['w']`, `policy`), or None for the call.
        problem: What is wrong, and what would be accepted.

    Example:
        >>> e = TransferPlanError("step", "args", "a numpy.ndarray is not a tuple of arguments")
        >>> print(e)
        plan_transfers(step): args: a numpy.ndarray is not a tuple of arguments
    """

    def __init__(self, function: str, argument: str | None, problem: str) -> None:
        self.function = function
        self.argument = argument
        self.problem = problem
        where = "" if argument is None else f"{argument}: "
        super().__init__(f"plan_transfers({function}): {where}{problem}")
